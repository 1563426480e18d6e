//! Where a statically linked libpython inlined `_Py_NewReference` (3.11 and 3.12).
//!
//! Built with link-time optimisation into the executable (Debian's and Ubuntu's
//! `/usr/bin/python3.11`), CPython has no `_Py_NewReference` function for [`super`] to patch:
//! its body is copied into every caller, some 215 places, each with its own test of
//! tracemalloc's `tracing` flag and its own call to `_PyTraceMalloc_NewReference`. Each copy
//! compiles to one of two guards, then straight-line code to the call:
//!
//! ```text
//! cmp dword [rip + tracing], 0      |  mov eax, dword [rip + tracing]
//! je  skip                          |  test eax, eax
//!                                   |  jne L            ; L: a cold block elsewhere
//! mov rdi, rbx                      |  L: mov rdi, rax ; (spills)
//! call _PyTraceMalloc_NewReference  |     call _PyTraceMalloc_NewReference
//! ```
//!
//! [`find`] decodes the machine code (iced-x86) and returns every such guard's flag read and
//! every such call, for [`super`] to point the reads at a word that is always 1 and the calls
//! at alloctrace: the same two rewrites as in a shared libpython, at every copy. The flag's
//! other readers (`tracemalloc.is_tracing()`, `PyTraceMalloc_Track`, start and stop) are not
//! followed by such a path and are left alone, so they see the real flag.
//!
//! A copy missed would leave some object creations unseen, silently, so the search refuses
//! unless it accounts for every branch to the callee: each must be a call reached from a
//! guard. The callee is the function that guarded calls reach and that itself starts by
//! reading the flag, as `_PyTraceMalloc_NewReference` does (a guarded call of any other
//! function is another reader's: `PyTraceMalloc_Untrack` taking tracemalloc's lock); the
//! search refuses if two such functions are called. Only
//! exact shapes count as guards: a read of exactly the flag's four bytes, compared with 0
//! or loaded and tested, nothing that changes the flags between that test and a `je`/`jne`,
//! and only instructions without branches (or unconditional jumps) from there to the call.
//! On Debian's 3.11.2 this finds 272 guards for the 215 calls; its 11 other reads of the flag
//! are tracemalloc's own functions.

use iced_x86::{
    Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, MemorySize,
    Mnemonic, OpAccess, OpKind, Register,
};

/// A 32-bit displacement in the decoded code. The processor adds it to the address of the
/// instruction's end, which is not always where the displacement ends: `cmp dword [rip +
/// flag], 0` has its immediate after it (patching it as if it ended the instruction once made
/// a third of Debian's 3.11 copies read the byte after the always-set flag: never set).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Displacement {
    /// Where its four bytes are.
    pub at: u64,
    /// The end of its instruction.
    pub end: u64,
}

/// What [`find`] found: addresses in the decoded code.
#[derive(Debug, PartialEq, Eq)]
pub struct Sites {
    /// The function every guarded call reaches (`_PyTraceMalloc_NewReference`).
    pub callee: u64,
    /// Each guard's displacement of the flag, sorted.
    pub reads: Vec<Displacement>,
    /// Each guarded call's displacement (the four bytes after its `0xe8`), sorted.
    pub calls: Vec<Displacement>,
}

/// Why [`find`] found nothing it would patch.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No guard reads the flag: not a copy of `_Py_NewReference` in this code.
    NoGuards,
    /// Guards lead to calls of different functions that start by reading the flag.
    CalleesDiffer(u64, u64),
    /// A branch to the callee that no guard leads to, at this address.
    Unguarded(u64),
}

/// How a guard reads the flag.
#[derive(Clone, Copy)]
enum Read {
    /// `cmp dword [flag], 0`: the flags say whether it is set.
    Compared,
    /// `mov r32, dword [flag]`: a `test r32, r32` must follow.
    Loaded(Register),
}

/// Instructions looked at between a guard's read and its conditional branch, and between
/// the branch and the call: enough for the register spills seen before a call (six), few
/// enough that no unrelated path is taken for one.
const TO_BRANCH: usize = 8;
const TO_CALL: usize = 16;

/// The guards and calls of `_Py_NewReference`'s inlined copies in `code`, which is mapped at
/// `ip`, for the tracing flag at `flag`.
pub fn find(code: &[u8], ip: u64, flag: u64) -> Result<Sites, Refusal> {
    let mut walker = Walker::new(code, ip);
    let mut guards = Vec::new();
    let mut sweep = Decoder::with_ip(64, code, ip, DecoderOptions::NONE);
    let mut instr = Instruction::default();
    while sweep.can_decode() {
        sweep.decode_out(&mut instr);
        let Some(read) = flag_read(&instr, flag) else {
            continue;
        };
        let offsets = sweep.get_constant_offsets(&instr);
        if offsets.displacement_size() != 4 {
            continue;
        }
        if let Some((call, callee)) = walker.guarded_call(instr.next_ip(), read) {
            let read = Displacement {
                at: instr.ip() + offsets.displacement_offset() as u64,
                end: instr.next_ip(),
            };
            guards.push((read, call, callee));
        }
    }
    // A guarded call of a function that does not start by reading the flag is another reader
    // (`PyTraceMalloc_Untrack` taking tracemalloc's lock).
    guards.retain(|&(_, _, callee)| {
        walker
            .decode(callee)
            .is_some_and(|first| matches!(flag_read(&first, flag), Some(Read::Loaded(_))))
    });
    let callee = match guards.first() {
        Some(&(_, _, callee)) => callee,
        None => return Err(Refusal::NoGuards),
    };
    if let Some(&(_, _, other)) = guards.iter().find(|g| g.2 != callee) {
        return Err(Refusal::CalleesDiffer(callee, other));
    }
    let mut calls: Vec<u64> = guards.iter().map(|g| g.1).collect();
    calls.sort_unstable();
    calls.dedup();
    // Every branch to the callee must be one of the calls found.
    let mut sweep = Decoder::with_ip(64, code, ip, DecoderOptions::NONE);
    while sweep.can_decode() {
        sweep.decode_out(&mut instr);
        if is_near_branch(&instr)
            && instr.near_branch_target() == callee
            && calls.binary_search(&instr.ip()).is_err()
        {
            return Err(Refusal::Unguarded(instr.ip()));
        }
    }
    let mut reads: Vec<Displacement> = guards.iter().map(|g| g.0).collect();
    reads.sort_unstable();
    reads.dedup();
    Ok(Sites {
        callee,
        reads,
        calls: calls
            .into_iter()
            .map(|call| Displacement {
                at: call + 1,
                end: call + 5,
            })
            .collect(),
    })
}

/// Whether `instr` reads exactly the four bytes of the flag in one of a guard's two ways.
fn flag_read(instr: &Instruction, flag: u64) -> Option<Read> {
    if instr.is_invalid()
        || !instr.is_ip_rel_memory_operand()
        || instr.ip_rel_memory_address() != flag
        || !matches!(instr.memory_size(), MemorySize::UInt32 | MemorySize::Int32)
    {
        return None;
    }
    match (instr.mnemonic(), instr.op0_kind(), instr.op1_kind()) {
        (Mnemonic::Cmp, OpKind::Memory, OpKind::Immediate8to32 | OpKind::Immediate32)
            if instr.immediate(1) == 0 =>
        {
            Some(Read::Compared)
        }
        (Mnemonic::Mov, OpKind::Register, OpKind::Memory) if instr.op0_register().is_gpr32() => {
            Some(Read::Loaded(instr.op0_register()))
        }
        _ => None,
    }
}

fn is_near_branch(instr: &Instruction) -> bool {
    matches!(
        instr.op0_kind(),
        OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64
    )
}

/// Decodes single instructions anywhere in the code.
struct Walker<'a> {
    decoder: Decoder<'a>,
    code: &'a [u8],
    ip: u64,
    info: InstructionInfoFactory,
}

impl<'a> Walker<'a> {
    fn new(code: &'a [u8], ip: u64) -> Self {
        Walker {
            decoder: Decoder::with_ip(64, code, ip, DecoderOptions::NONE),
            code,
            ip,
            info: InstructionInfoFactory::new(),
        }
    }

    /// The instruction at `at`, if `at` is in the code and holds a valid one.
    fn decode(&mut self, at: u64) -> Option<Instruction> {
        let position = usize::try_from(at.checked_sub(self.ip)?).ok()?;
        if position >= self.code.len() {
            return None;
        }
        self.decoder.set_position(position).ok()?;
        self.decoder.set_ip(at);
        let instr = self.decoder.decode();
        (!instr.is_invalid()).then_some(instr)
    }

    /// From just after a read of the flag: the guarded call `(address, callee)`, if the code
    /// has one of the shapes in the module's doc.
    fn guarded_call(&mut self, mut at: u64, read: Read) -> Option<(u64, u64)> {
        let mut tested = matches!(read, Read::Compared);
        for _ in 0..TO_BRANCH {
            let instr = self.decode(at)?;
            match instr.flow_control() {
                FlowControl::ConditionalBranch if tested => {
                    let tracing = match instr.mnemonic() {
                        Mnemonic::Je => instr.next_ip(),
                        Mnemonic::Jne => instr.near_branch_target(),
                        _ => return None,
                    };
                    return self.call_from(tracing);
                }
                FlowControl::Next => match read {
                    Read::Loaded(register) if !tested => {
                        if instr.mnemonic() == Mnemonic::Test
                            && instr.op0_kind() == OpKind::Register
                            && instr.op1_kind() == OpKind::Register
                            && instr.op0_register() == register
                            && instr.op1_register() == register
                        {
                            tested = true;
                        } else if self.writes(&instr, register) {
                            return None;
                        }
                    }
                    // Between the test and the branch nothing may change the flags.
                    _ if instr.rflags_modified() != 0 => return None,
                    _ => {}
                },
                _ => return None,
            }
            at = instr.next_ip();
        }
        None
    }

    /// The direct call that straight-line code from `at` reaches, following unconditional
    /// jumps: `(address, callee)`.
    fn call_from(&mut self, mut at: u64) -> Option<(u64, u64)> {
        for _ in 0..TO_CALL {
            let instr = self.decode(at)?;
            at = match instr.flow_control() {
                FlowControl::Next => instr.next_ip(),
                FlowControl::UnconditionalBranch if is_near_branch(&instr) => {
                    instr.near_branch_target()
                }
                // `call rel32` and nothing else: the displacement to rewrite is at +1.
                FlowControl::Call
                    if is_near_branch(&instr)
                        && instr.len() == 5
                        && self.code[(instr.ip() - self.ip) as usize] == 0xe8 =>
                {
                    return Some((instr.ip(), instr.near_branch_target()));
                }
                _ => return None,
            };
        }
        None
    }

    /// Whether `instr` may write any part of `register`.
    fn writes(&mut self, instr: &Instruction, register: Register) -> bool {
        let full = register.full_register();
        self.info.info(instr).used_registers().iter().any(|used| {
            used.register().full_register() == full
                && !matches!(
                    used.access(),
                    OpAccess::Read | OpAccess::CondRead | OpAccess::None | OpAccess::NoMemAccess
                )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{find, Displacement, Refusal, Sites};

    /// Where the test code is mapped, and the flag it reads.
    const IP: u64 = 0x40_0000;
    const FLAG: u64 = 0x60_0004;

    /// A few x86-64 instructions, assembled by hand at known addresses.
    #[derive(Default)]
    struct Asm(Vec<u8>);

    impl Asm {
        fn here(&self) -> u64 {
            IP + self.0.len() as u64
        }
        fn rel32(&mut self, target: u64) {
            let from = self.here() + 4;
            self.0
                .extend_from_slice(&((target as i64 - from as i64) as i32).to_le_bytes());
        }
        /// `cmp dword [rip + FLAG], 0`; returns its displacement.
        fn cmp_flag(&mut self) -> Displacement {
            self.0.extend_from_slice(&[0x83, 0x3d]);
            let at = self.here();
            let from = self.here() + 5;
            self.0
                .extend_from_slice(&((FLAG as i64 - from as i64) as i32).to_le_bytes());
            self.0.push(0);
            Displacement { at, end: from }
        }
        /// `mov eax, dword [rip + FLAG]`; returns its displacement.
        fn load_flag(&mut self) -> Displacement {
            self.0.extend_from_slice(&[0x8b, 0x05]);
            let at = self.here();
            self.rel32(FLAG);
            Displacement {
                at,
                end: self.here(),
            }
        }
        fn test_eax(&mut self) {
            self.0.extend_from_slice(&[0x85, 0xc0]);
        }
        fn add_eax_1(&mut self) {
            self.0.extend_from_slice(&[0x83, 0xc0, 0x01]);
        }
        fn mov_eax_5(&mut self) {
            self.0.extend_from_slice(&[0xb8, 5, 0, 0, 0]);
        }
        fn mov_rdi_rbx(&mut self) {
            self.0.extend_from_slice(&[0x48, 0x89, 0xdf]);
        }
        /// `je`/`jne rel32` (`0x84`/`0x85`) to `target`.
        fn jcc(&mut self, opcode: u8, target: u64) {
            self.0.extend_from_slice(&[0x0f, opcode]);
            self.rel32(target);
        }
        fn jmp(&mut self, target: u64) {
            self.0.push(0xe9);
            self.rel32(target);
        }
        /// `call rel32`; returns its displacement.
        fn call(&mut self, target: u64) -> Displacement {
            self.0.push(0xe8);
            let at = self.here();
            self.rel32(target);
            Displacement {
                at,
                end: self.here(),
            }
        }
        fn ret(&mut self) {
            self.0.push(0xc3);
        }
        fn nops(&mut self, n: usize) {
            self.0.extend(std::iter::repeat_n(0x90, n));
        }
    }

    /// The callee, at a fixed place after the test's code: it starts by loading the flag.
    const CALLEE: u64 = IP + 0x400;

    fn with_callee(mut asm: Asm) -> Vec<u8> {
        assert!(asm.here() < CALLEE);
        asm.nops((CALLEE - asm.here()) as usize);
        asm.load_flag();
        asm.test_eax();
        asm.ret();
        asm.0
    }

    /// A `cmp`/`je` guard falling through to its call.
    fn compared(asm: &mut Asm) -> (Displacement, Displacement) {
        let read = asm.cmp_flag();
        let skip = asm.here() + 6 + 3 + 5;
        asm.jcc(0x84, skip);
        asm.mov_rdi_rbx();
        let call = asm.call(CALLEE);
        asm.ret();
        (read, call)
    }

    /// A `mov`/`test`/`jne` guard whose call is in a block further on, reached by a jump.
    fn loaded(asm: &mut Asm, between: fn(&mut Asm)) -> (Displacement, Displacement) {
        let read = asm.load_flag();
        between(asm);
        asm.test_eax();
        let cold = asm.here() + 6 + 1;
        asm.jcc(0x85, cold);
        asm.ret();
        let block = asm.here() + 5;
        asm.jmp(block);
        asm.mov_rdi_rbx();
        let call = asm.call(CALLEE);
        asm.ret();
        (read, call)
    }

    #[test]
    fn both_guard_shapes_are_found() {
        let mut asm = Asm::default();
        let (read1, call1) = compared(&mut asm);
        let (read2, call2) = loaded(&mut asm, |_| {});
        let code = with_callee(asm);
        assert_eq!(
            find(&code, IP, FLAG),
            Ok(Sites {
                callee: CALLEE,
                reads: vec![read1, read2],
                calls: vec![call1, call2],
            })
        );
    }

    /// Every displacement found, added to its instruction's end, reaches what the instruction
    /// refers to: the flag for reads, the callee for calls. (`cmp` has an immediate after its
    /// displacement.)
    #[test]
    fn each_displacement_counts_from_its_instructions_end() {
        let mut asm = Asm::default();
        compared(&mut asm);
        loaded(&mut asm, |_| {});
        let code = with_callee(asm);
        let sites = find(&code, IP, FLAG).unwrap();
        let reached = |d: &Displacement| {
            let at = (d.at - IP) as usize;
            let disp = i32::from_le_bytes(code[at..at + 4].try_into().unwrap());
            d.end.wrapping_add_signed(i64::from(disp))
        };
        assert_eq!(
            sites.reads.iter().map(|d| d.end - d.at).collect::<Vec<_>>(),
            [5, 4]
        );
        assert!(sites.reads.iter().all(|d| reached(d) == FLAG));
        assert!(sites.calls.iter().all(|d| reached(d) == CALLEE));
    }

    #[test]
    fn other_readers_of_the_flag_are_left_alone() {
        let mut asm = Asm::default();
        // tracemalloc.is_tracing(): the flag loaded and returned.
        asm.load_flag();
        asm.ret();
        let (read, call) = compared(&mut asm);
        let code = with_callee(asm);
        let sites = find(&code, IP, FLAG).unwrap();
        assert_eq!((sites.reads, sites.calls), (vec![read], vec![call]));
    }

    /// A flag loaded and tested with `between_load` and `between_test` after the load and
    /// after the test, then a `jne` to a call that follows either way; returns the call's
    /// address.
    fn tested(asm: &mut Asm, between_load: fn(&mut Asm), between_test: fn(&mut Asm)) -> u64 {
        asm.load_flag();
        between_load(asm);
        asm.test_eax();
        between_test(asm);
        let at = asm.here() + 6;
        asm.jcc(0x85, at);
        asm.call(CALLEE);
        at
    }

    #[test]
    fn a_call_no_guard_leads_to_is_refused() {
        // (code with a call and what it shows; the code returns the call's address)
        type Before = fn(&mut Asm) -> u64;
        let cases: [(Before, &str); 3] = [
            (
                |asm| {
                    let at = asm.here();
                    asm.call(CALLEE);
                    at
                },
                "a call with no guard at all",
            ),
            (
                |asm| tested(asm, |_| {}, Asm::add_eax_1),
                "the flags changed between the test and the branch",
            ),
            (
                |asm| tested(asm, Asm::mov_eax_5, |_| {}),
                "the loaded register overwritten before its test",
            ),
        ];
        for (before, what) in cases {
            let mut asm = Asm::default();
            let unguarded = before(&mut asm);
            asm.ret();
            compared(&mut asm);
            let code = with_callee(asm);
            assert_eq!(
                find(&code, IP, FLAG),
                Err(Refusal::Unguarded(unguarded)),
                "{what}"
            );
        }
    }

    #[test]
    fn the_callee_is_the_one_function_called_that_reads_the_flag() {
        // A guarded call of a function that does not read the flag (a lock): left alone.
        let mut asm = Asm::default();
        let (read, call) = compared(&mut asm);
        asm.cmp_flag();
        asm.jcc(0x84, asm.here() + 6 + 5);
        asm.call(IP + 0x300);
        asm.ret();
        asm.nops((IP + 0x300 - asm.here()) as usize);
        asm.ret();
        let code = with_callee(asm);
        let sites = find(&code, IP, FLAG).unwrap();
        assert_eq!((sites.reads, sites.calls), (vec![read], vec![call]));

        // Two functions that read the flag, each called from a guard.
        let mut asm = Asm::default();
        compared(&mut asm);
        asm.cmp_flag();
        asm.jcc(0x84, asm.here() + 6 + 5);
        asm.call(IP + 0x300);
        asm.ret();
        asm.nops((IP + 0x300 - asm.here()) as usize);
        asm.load_flag();
        asm.ret();
        let code = with_callee(asm);
        assert_eq!(
            find(&code, IP, FLAG),
            Err(Refusal::CalleesDiffer(CALLEE, IP + 0x300))
        );

        // The callee starts otherwise: no guard of `_Py_NewReference` at all.
        let mut asm = Asm::default();
        compared(&mut asm);
        let mut code = with_callee(asm);
        code[(CALLEE - IP) as usize] = 0x90;
        assert_eq!(find(&code, IP, FLAG), Err(Refusal::NoGuards));

        assert_eq!(find(&[0x90; 64], IP, FLAG), Err(Refusal::NoGuards));
    }
}
