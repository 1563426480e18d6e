//! CPython 3.9–3.12: object creations by rewriting two operands of `_Py_NewReference`.
//!
//! In the shared libpython of these versions `_Py_NewReference` (and 3.12's
//! `_Py_NewReferenceNoTotal`) is a small function, and the only caller of
//! `_PyTraceMalloc_NewReference`:
//!
//! ```text
//! mov  rax, [rip + GOT slot]        ; &_Py_tracemalloc_config (3.12: &_PyRuntime)
//! push rbx ; mov rbx, rdi
//! mov  eax, [rax + offset(tracing)]
//! test eax, eax ; jne L
//! ...
//! L: call _PyTraceMalloc_NewReference   ; 3.9: through the PLT
//! ```
//!
//! We point the first load at a word of our own (near the function, since the operand is a
//! 32-bit displacement) that holds the address of a "flag" always set, and the call at a
//! jump to [`new_reference`]. The interpreter's real flag is not touched, so
//! `tracemalloc.is_tracing()`, `PyTraceMalloc_Track` and finalization behave as without us;
//! when the standard module does trace, [`new_reference`] also makes its call.
//!
//! Every byte is checked against that shape (and the GOT slot against the flag's address)
//! before anything is written; an interpreter built otherwise is left alone. The patch is
//! written with the GIL held: only a thread holding it runs `_Py_NewReference`. `stop()`
//! writes the original operands back.
//!
//! A libpython linked statically with link-time optimisation (3.11 and 3.12) has no such
//! function: its body is copied into every caller. There [`super::inlined`] finds each copy's
//! flag read and call, and the same two rewrites are made at every copy, the reads reading the
//! always-set flag itself.
//!
//! On 3.9 and 3.10 every frame object is created through `_Py_NewReference` too, so while the
//! patch is in place the stack walker may remember depths per frame object
//! (`crate::capture::frame_depths`), told here of each frame created. (Those versions are
//! patched in a shared libpython only: a copy of `_Py_NewReference` that inlined the callee
//! too would go unseen, and a frame created unseen would leave a wrong depth behind.)

use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::OnceLock;

use pyo3::ffi;

use crate::capture::layout;

pub const NAME: &str = "patched";

/// One function to patch, as found and checked.
#[derive(Clone, Copy)]
struct Site {
    /// Address of the load's 32-bit displacement.
    load_disp: usize,
    /// Address of the call's 32-bit displacement.
    call_disp: usize,
}

/// A 32-bit displacement in the interpreter's code to point at our page: where it is, where
/// its instruction ends (the address the processor adds it to), what it was, and the offset in
/// the page it is to reach.
#[derive(Clone, Copy)]
struct Operand {
    at: usize,
    end: usize,
    original: i32,
    to: usize,
}

impl Operand {
    /// The displacement at `at`, of an instruction that ends at `end`.
    unsafe fn new(at: usize, end: usize, to: usize) -> Operand {
        Operand {
            at,
            end,
            original: read_i32(at),
            to,
        }
    }

    /// A displacement that ends its instruction (`mov rax, [rip + d]`, `call d`).
    unsafe fn last(at: usize, to: usize) -> Operand {
        Operand::new(at, at + 4, to)
    }

    /// The displacement that makes the operand reach its place in `page`, if one can.
    fn reaching(&self, page: usize) -> Option<i32> {
        i32::try_from((page + self.to) as isize - self.end as isize).ok()
    }
}

struct Plan {
    /// The flag reads (in a shared libpython, the load of the config's address).
    reads: Vec<Operand>,
    /// The calls of the standard module's function.
    calls: Vec<Operand>,
    /// The interpreter's own `tracing` flag.
    real_flag: usize,
    /// What the call originally reached (the standard module's function, or its PLT stub).
    original_callee: usize,
    /// Our page near the code: the fake config pointer, the always-set flag, a jump to us.
    page: usize,
}

const FAKE_CONFIG_AT: usize = 0;
const ONE_AT: usize = 64;
const STUB_AT: usize = 128;

static PLAN: OnceLock<Option<Plan>> = OnceLock::new();
/// The original callee, for [`new_reference`] (0 until planned).
static ORIGINAL_CALLEE: AtomicUsize = AtomicUsize::new(0);
static REAL_FLAG: AtomicUsize = AtomicUsize::new(0);

/// What `_Py_NewReference` now calls instead of `_PyTraceMalloc_NewReference`.
unsafe extern "C" fn new_reference(op: *mut ffi::PyObject) -> c_int {
    #[cfg(not(Py_3_11))]
    if (*op).ob_type == std::ptr::addr_of_mut!(ffi::PyFrame_Type) {
        crate::capture::frame_depths::created(op as usize);
    }
    // SAFETY: REAL_FLAG is the address of the interpreter's `int tracing`, set before the
    // patch that makes this function reachable.
    if *(REAL_FLAG.load(Relaxed) as *const c_int) != 0 {
        return forward(op);
    }
    super::on_new_object(op)
}

/// The standard module traces too: the object is re-attributed in both tables.
#[cold]
#[inline(never)]
unsafe fn forward(op: *mut ffi::PyObject) -> c_int {
    super::on_new_object(op);
    let callee = ORIGINAL_CALLEE.load(Relaxed);
    // SAFETY: the original target of the patched call, which takes the object.
    std::mem::transmute::<usize, unsafe extern "C" fn(*mut ffi::PyObject) -> c_int>(callee)(op)
}

unsafe fn symbol(name: &CStr) -> usize {
    libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) as usize
}

unsafe fn read_i32(at: usize) -> i32 {
    std::ptr::read_unaligned(at as *const i32)
}

unsafe fn bytes_at(at: usize, expected: &[u8]) -> bool {
    std::slice::from_raw_parts(at as *const u8, expected.len()) == expected
}

/// Checks `function` against the expected shape; returns the site, the GOT slot it reads the
/// config base from, and the call's target.
unsafe fn inspect(function: usize) -> Option<(Site, usize, usize)> {
    // mov rax, [rip + disp32]
    if !bytes_at(function, &[0x48, 0x8b, 0x05]) {
        return None;
    }
    let load_disp = function + 3;
    let slot = (function + 7).wrapping_add_signed(read_i32(load_disp) as isize);
    // push rbx; mov rbx, rdi
    let mut at = function + 7;
    if !bytes_at(at, &[0x53, 0x48, 0x89, 0xfb]) {
        return None;
    }
    at += 4;
    // mov eax, [rax + disp8] or [rax + disp32]: the flag's offset in the config base.
    let offset = if bytes_at(at, &[0x8b, 0x40]) {
        at += 3;
        *((at - 1) as *const u8) as usize
    } else if bytes_at(at, &[0x8b, 0x80]) {
        at += 6;
        read_i32(at - 4) as usize
    } else {
        return None;
    };
    if offset != layout::TRACEMALLOC_TRACING {
        return None;
    }
    // test eax, eax; jne rel8
    if !bytes_at(at, &[0x85, 0xc0, 0x75]) {
        return None;
    }
    at += 4;
    let target = at.wrapping_add_signed(*((at - 1) as *const i8) as isize);
    // call rel32
    if !bytes_at(target, &[0xe8]) {
        return None;
    }
    let call_disp = target + 1;
    let callee = (target + 5).wrapping_add_signed(read_i32(call_disp) as isize);
    Some((
        Site {
            load_disp,
            call_disp,
        },
        slot,
        callee,
    ))
}

/// The config base `_Py_NewReference` should read from the GOT slot.
unsafe fn config_base() -> usize {
    if cfg!(Py_3_12) {
        symbol(c"_PyRuntime")
    } else {
        symbol(c"_Py_tracemalloc_config")
    }
}

/// An anonymous page within ±1 GiB of `near` (so that 32-bit displacements from there reach
/// it), or `None`.
unsafe fn page_near(near: usize) -> Option<usize> {
    const STEP: usize = 1 << 20;
    let base = near & !(STEP - 1);
    for i in 1..1024usize {
        for hint in [base.wrapping_sub(i * STEP), base.wrapping_add(i * STEP)] {
            let got = libc::mmap(
                hint as *mut c_void,
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            );
            if got == libc::MAP_FAILED {
                continue;
            }
            let got = got as usize;
            if got.abs_diff(near) < (1 << 30) {
                return Some(got);
            }
            // An old kernel took the flag for a plain hint and put the page elsewhere.
            libc::munmap(got as *mut c_void, 4096);
        }
    }
    None
}

/// A shared libpython's `_Py_NewReference` (and 3.12's `_Py_NewReferenceNoTotal`).
unsafe fn plan_shared() -> Option<Plan> {
    let mut functions = vec![symbol(c"_Py_NewReference")];
    if cfg!(Py_3_12) {
        functions.push(symbol(c"_Py_NewReferenceNoTotal"));
    }
    let base = config_base();
    if base == 0 || functions.contains(&0) {
        return None;
    }
    let mut sites = Vec::new();
    let mut callee = None;
    for &function in &functions {
        let (site, slot, target) = inspect(function)?;
        if *(slot as *const usize) != base || callee.is_some_and(|c| c != target) {
            return None;
        }
        // Where the standard module's function is exported, the call must reach it (3.9
        // exports it but calls it through a PLT stub, which we cannot check as simply).
        let exported = symbol(c"_PyTraceMalloc_NewReference");
        if cfg!(Py_3_10) && exported != 0 && exported != target {
            return None;
        }
        callee = Some(target);
        sites.push(site);
    }
    let reads = sites
        .iter()
        .map(|s| Operand::last(s.load_disp, FAKE_CONFIG_AT))
        .collect();
    let calls = sites
        .iter()
        .map(|s| Operand::last(s.call_disp, STUB_AT))
        .collect();
    with_page(
        functions[0],
        reads,
        calls,
        base + layout::TRACEMALLOC_TRACING,
        callee?,
    )
}

/// A libpython linked statically with link-time optimisation: `_Py_NewReference`'s copies in
/// the code of the object that holds the flag (see [`super::inlined`]).
#[cfg(Py_3_11)]
unsafe fn plan_inlined() -> Option<Plan> {
    let base = config_base();
    if base == 0 {
        return None;
    }
    let flag = base + layout::TRACEMALLOC_TRACING;
    let mut found = None;
    for (start, len) in code_segments_of(flag) {
        // SAFETY: an executable segment of a loaded object, mapped and readable.
        let code = std::slice::from_raw_parts(start as *const u8, len);
        match super::inlined::find(code, start as u64, flag as u64) {
            Ok(sites) if found.is_none() => found = Some(sites),
            Err(super::inlined::Refusal::NoGuards) => {}
            _ => return None,
        }
    }
    let sites = found?;
    let callee = sites.callee as usize;
    let exported = symbol(c"_PyTraceMalloc_NewReference");
    if exported != 0 && exported != callee {
        return None;
    }
    let reads = sites
        .reads
        .iter()
        .map(|d| Operand::new(d.at as usize, d.end as usize, ONE_AT))
        .collect();
    let calls = sites
        .calls
        .iter()
        .map(|d| Operand::new(d.at as usize, d.end as usize, STUB_AT))
        .collect();
    with_page(callee, reads, calls, flag, callee)
}

#[cfg(not(Py_3_11))]
unsafe fn plan_inlined() -> Option<Plan> {
    None
}

/// The executable segments `(start, length)` of the loaded object that has `address` in one of
/// its segments.
#[cfg(Py_3_11)]
unsafe fn code_segments_of(address: usize) -> Vec<(usize, usize)> {
    struct Search {
        address: usize,
        code: Vec<(usize, usize)>,
    }
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: `dl_iterate_phdr` passes a valid entry and our `Search`.
        let (info, search) = (&*info, &mut *(data as *mut Search));
        if info.dlpi_phdr.is_null() {
            return 0;
        }
        let headers = std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum));
        let bias = info.dlpi_addr as usize;
        let range = |h: &libc::Elf64_Phdr| {
            let start = bias.wrapping_add(h.p_vaddr as usize);
            start..start.wrapping_add(h.p_memsz as usize)
        };
        let loads = || headers.iter().filter(|h| h.p_type == libc::PT_LOAD);
        if !loads().any(|h| range(h).contains(&search.address)) {
            return 0;
        }
        search.code = loads()
            .filter(|h| h.p_flags & libc::PF_X != 0)
            .map(|h| (range(h).start, h.p_memsz as usize))
            .collect();
        1
    }
    let mut search = Search {
        address,
        code: Vec::new(),
    };
    libc::dl_iterate_phdr(Some(visit), &mut search as *mut Search as *mut c_void);
    search.code
}

/// The plan, with our page mapped within reach of every operand (near `near`) and filled:
/// the fake config, the always-set flag, the jump to [`new_reference`].
unsafe fn with_page(
    near: usize,
    reads: Vec<Operand>,
    calls: Vec<Operand>,
    real_flag: usize,
    original_callee: usize,
) -> Option<Plan> {
    let page = page_near(near)?;
    if !reads
        .iter()
        .chain(&calls)
        .all(|o| o.reaching(page).is_some())
    {
        libc::munmap(page as *mut c_void, 4096);
        return None;
    }
    // The fake config: reading its `tracing` field reads the 1 at ONE_AT.
    let fake = (page + ONE_AT).wrapping_sub(layout::TRACEMALLOC_TRACING);
    *((page + FAKE_CONFIG_AT) as *mut usize) = fake;
    *((page + ONE_AT) as *mut c_int) = 1;
    // jmp [rip + 0]; .quad new_reference
    let stub = page + STUB_AT;
    std::ptr::copy_nonoverlapping([0xff_u8, 0x25, 0, 0, 0, 0].as_ptr(), stub as *mut u8, 6);
    *((stub + 6) as *mut usize) =
        new_reference as unsafe extern "C" fn(*mut ffi::PyObject) -> c_int as usize;
    if libc::mprotect(page as *mut c_void, 4096, libc::PROT_READ | libc::PROT_EXEC) != 0 {
        libc::munmap(page as *mut c_void, 4096);
        return None;
    }
    Some(Plan {
        reads,
        calls,
        real_flag,
        original_callee,
        page,
    })
}

unsafe fn plan() -> Option<Plan> {
    plan_shared().or_else(|| plan_inlined())
}

fn planned() -> Option<&'static Plan> {
    // SAFETY: `plan` only reads the interpreter's code and maps a page of our own.
    PLAN.get_or_init(|| unsafe { plan() }).as_ref()
}

/// Writes 32-bit values into the interpreter's code, in order, making a page (two, for a value
/// across a boundary) writable once for each run of writes to it (Debian's 3.11: 487 operands
/// on some 300 pages; `start()` 4.3 -> 2.3 ms, `stop()` 3.4 -> 1.5 ms). The pages stay
/// executable throughout (other threads may be running other code on them).
unsafe fn write_code(writes: impl IntoIterator<Item = (usize, i32)>) -> bool {
    let rwx = libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC;
    let rx = libc::PROT_READ | libc::PROT_EXEC;
    let protect = |(start, end): (usize, usize), prot| {
        libc::mprotect(start as *mut c_void, end - start, prot) == 0
    };
    let mut open: Option<(usize, usize)> = None;
    for (at, value) in writes {
        if !open.is_some_and(|(start, end)| start <= at && at + 4 <= end) {
            if let Some(pages) = open.take() {
                if !protect(pages, rx) {
                    return false;
                }
            }
            let pages = (at & !4095, (at + 4 + 4095) & !4095);
            if !protect(pages, rwx) {
                return false;
            }
            open = Some(pages);
        }
        std::ptr::write_unaligned(at as *mut i32, value);
    }
    open.is_none_or(|pages| protect(pages, rx))
}

pub fn available() -> bool {
    planned().is_some()
}

pub unsafe fn install() -> bool {
    let Some(plan) = planned() else {
        return false;
    };
    REAL_FLAG.store(plan.real_flag, Relaxed);
    ORIGINAL_CALLEE.store(plan.original_callee, Relaxed);
    // Every operand reaches the page: `with_page` checked it.
    let redirected = |o: &Operand| (o.at, o.reaching(plan.page).unwrap_or(o.original));
    // Calls first: until the reads are redirected too, a call is only made when the standard
    // module traces, and then reaches us, who forward to it.
    if !write_code(plan.calls.iter().map(redirected))
        || !write_code(plan.reads.iter().map(redirected))
    {
        restore(plan);
        return false;
    }
    // Every frame creation now reaches `new_reference`.
    #[cfg(not(Py_3_11))]
    crate::capture::frame_depths::activate();
    true
}

unsafe fn restore(plan: &Plan) {
    // Reads first, for the same reason as in `install`.
    let original = |o: &Operand| (o.at, o.original);
    write_code(plan.reads.iter().map(original));
    write_code(plan.calls.iter().map(original));
}

pub unsafe fn uninstall() {
    #[cfg(not(Py_3_11))]
    crate::capture::frame_depths::deactivate();
    if let Some(plan) = planned() {
        restore(plan);
    }
}
