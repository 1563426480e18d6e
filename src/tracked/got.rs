//! Rewriting shared objects' import tables (GOT slots) by symbol name, on Linux x86-64.
//!
//! An extension module calls `PyTraceMalloc_Track` through a slot of its global offset table
//! that the dynamic loader filled with the function's address. Writing another address into
//! that slot redirects the extension's calls without touching the interpreter's code, and
//! writing the original back undoes it. The slots are found the way the loader finds them:
//! each loaded object's dynamic section names its relocation tables (`DT_JMPREL` for PLT
//! calls, `DT_RELA` for address loads with `-fno-plt`), and each `JUMP_SLOT`/`GLOB_DAT`
//! relocation names its symbol.
//!
//! A rule may also reach a function's address stored in an object's *data*: an `R_X86_64_64`
//! relocation in `DT_RELA` against the symbol, addend 0, is a pointer variable the loader
//! filled with the function's address (libxml2's `xmlMalloc = malloc`, statically linked
//! into lxml, or any table of allocator hooks). Such a word is rewritten like a slot, with
//! three more conditions, each because a word that fails it is not a plain pointer to the
//! function: a non-zero addend (an address computed from the function's), a word outside the
//! object's writable segments (a text relocation: its page is code) and a word not 8-byte
//! aligned (a packed structure's field; it could not be stored atomically). Symbol-less
//! relocations (`R_X86_64_RELATIVE`) name no function and are never touched.
//!
//! Every rewrite runs inside a `dl_iterate_phdr` callback, which holds the loader's lock: an
//! object cannot be unloaded (`dlclose`) while its slots are read or written, and an object
//! no longer listed is never touched. No record of patched objects is kept: undoing scans
//! again and restores exactly the slots that still hold our address, so a library closed and
//! reopened in between, or one loaded at a recycled address, cannot be written by mistake.
//!
//! A slot is one aligned 8-byte word, written atomically: a thread calling through it
//! concurrently reaches either the old or the new function, both valid. Slots under full
//! RELRO are read-only after loading; their page is made writable for the store and read-only
//! again right after, exactly the range the loader protected (`PT_GNU_RELRO`, page-rounded
//! down at both ends as glibc does).

use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

/// One rewrite: every undefined-symbol slot named `symbol` whose value is not `to` (or is
/// `from`, when given) gets `to`, in every object that contains none of `skip` (the
/// addresses of code whose own calls must not be redirected: ours, and the symbol's definer).
///
/// With `lazy`, an import slot that still points into its own object also counts as holding
/// `from`: a lazily bound import not called yet holds the address of its PLT stub, which
/// would resolve to `from` on the first call. Data words are bound at load time: `lazy` never
/// applies to them.
///
/// With `data`, the rule also applies to data words relocated against `symbol` (see the
/// module docs), not only to import slots.
pub struct Rule<'a> {
    pub symbol: &'a CStr,
    pub from: Option<usize>,
    pub to: usize,
    pub skip: &'a [usize],
    pub lazy: bool,
    pub data: bool,
}

/// What a symbol-named relocation's word is, for a rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Word {
    /// A `JUMP_SLOT` or `GLOB_DAT` slot of the import table.
    Import,
    /// A pointer variable the loader filled with the symbol's address (`R_X86_64_64`).
    Data,
}

/// Which relocations name a word a rule may rewrite: `kind` and `addend` are the
/// relocation's, `defined` whether its symbol is defined in the object itself, `data` whether
/// data words are wanted at all, `aligned` whether the word is 8-byte aligned and `writable`
/// whether it lies whole in one of the object's writable segments (asked last: it walks the
/// program headers, and most data relocations fail sooner, such as the interpreter's
/// thousands against its own type objects). `None` for every other relocation.
fn select(
    kind: u32,
    addend: i64,
    defined: bool,
    data: bool,
    aligned: bool,
    writable: impl FnOnce() -> bool,
) -> Option<Word> {
    let word = word_kind(kind, addend, data)?;
    // A defined symbol is the object's own function, not an import; the other two are words
    // that cannot be stored safely.
    (!defined && aligned && writable()).then_some(word)
}

/// The part of [`select`] a relocation alone decides (its kind and addend), which the scan
/// asks before reading the relocation's symbol.
fn word_kind(kind: u32, addend: i64, data: bool) -> Option<Word> {
    match kind {
        R_X86_64_JUMP_SLOT | R_X86_64_GLOB_DAT => Some(Word::Import),
        R_X86_64_64 if data && addend == 0 => Some(Word::Data),
        _ => None,
    }
}

#[repr(C)]
struct Dyn {
    tag: i64,
    val: u64,
}

#[repr(C)]
struct Rela {
    offset: u64,
    info: u64,
    addend: i64,
}

#[repr(C)]
struct Sym {
    name: u32,
    info: u8,
    other: u8,
    shndx: u16,
    value: u64,
    size: u64,
}

const DT_NULL: i64 = 0;
const DT_PLTRELSZ: i64 = 2;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_RELA: i64 = 7;
const DT_RELASZ: i64 = 8;
const DT_PLTREL: i64 = 20;
const DT_JMPREL: i64 = 23;
const R_X86_64_64: u32 = 1;
const R_X86_64_GLOB_DAT: u32 = 6;
const R_X86_64_JUMP_SLOT: u32 = 7;
const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const PT_GNU_RELRO: u32 = 0x6474_e552;
const PF_W: u32 = 2;

struct Walk<'a> {
    rules: &'a [Rule<'a>],
    rewritten: usize,
    page: usize,
}

/// Applies `rules` to every loaded object; returns how many slots were written.
///
/// # Safety
/// Each rule's `to` is the address of a function with the ABI of the symbol it replaces.
pub unsafe fn rewrite(rules: &[Rule<'_>]) -> usize {
    let mut walk = Walk {
        rules,
        rewritten: 0,
        page: page_size(),
    };
    libc::dl_iterate_phdr(Some(visit), (&mut walk as *mut Walk).cast());
    walk.rewritten
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as usize,
        _ => 4096,
    }
}

/// One loaded object as `dl_iterate_phdr` reports it, and the imports its dynamic section
/// names: the one reader of those structures, for rewriting slots and for reading them.
struct Object<'a> {
    base: usize,
    phdrs: &'a [libc::Elf64_Phdr],
    dynamic: &'a libc::Elf64_Phdr,
}

impl<'a> Object<'a> {
    /// The object, or `None` for one without a dynamic section, or the vDSO (whose dynamic
    /// section is not relocated and which imports nothing).
    unsafe fn of(info: &'a libc::dl_phdr_info) -> Option<Self> {
        let phdrs = std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize);
        let dynamic = phdrs.iter().find(|p| p.p_type == PT_DYNAMIC)?;
        if !info.dlpi_name.is_null() {
            let name = CStr::from_ptr(info.dlpi_name).to_bytes();
            if name.starts_with(b"linux-vdso") || name.starts_with(b"linux-gate") {
                return None;
            }
        }
        Some(Object {
            base: info.dlpi_addr as usize,
            phdrs,
            dynamic,
        })
    }

    /// Whether `address` lies in one of the object's loaded segments.
    fn contains(&self, address: usize) -> bool {
        self.phdrs.iter().any(|p| {
            let start = self.base.wrapping_add(p.p_vaddr as usize);
            p.p_type == PT_LOAD && address >= start && address < start + p.p_memsz as usize
        })
    }

    /// Whether the 8-byte word at `address` lies whole in one of the object's writable
    /// segments (a RELRO range is part of one: the loader wrote it there).
    fn writable(&self, address: usize) -> bool {
        self.phdrs.iter().any(|p| {
            let start = self.base.wrapping_add(p.p_vaddr as usize);
            p.p_type == PT_LOAD
                && p.p_flags & PF_W != 0
                && address >= start
                && address.saturating_add(8) <= start + p.p_memsz as usize
        })
    }

    /// The page-rounded range the loader made read-only after relocating (`PT_GNU_RELRO`).
    fn relro(&self, page: usize) -> Option<(usize, usize)> {
        self.phdrs
            .iter()
            .find(|p| p.p_type == PT_GNU_RELRO)
            .map(|p| {
                let start = self.base + p.p_vaddr as usize;
                let floor = |a: usize| a & !(page - 1);
                (floor(start), floor(start + p.p_memsz as usize))
            })
    }

    /// Calls `each` with the name, slot and kind of every word [`select`] picks: the
    /// `JUMP_SLOT`/`GLOB_DAT` relocations of undefined symbols (imports), and the data words
    /// relocated against them.
    /// `data` says whether data words are wanted.
    unsafe fn imports(&self, data: bool, mut each: impl FnMut(&CStr, &AtomicUsize, Word)) {
        let base = self.base;
        // The loader rewrites the dynamic section's pointers to absolute addresses in place on
        // x86-64; a value below the base is still relative (objects it did not relocate).
        let absolute = |v: u64| {
            let v = v as usize;
            if v < base {
                v + base
            } else {
                v
            }
        };
        let (mut symtab, mut strtab, mut jmprel, mut pltrelsz, mut rela, mut relasz) =
            (0, 0, 0, 0, 0, 0);
        let mut pltrel_is_rela = true;
        let mut entry = (base + self.dynamic.p_vaddr as usize) as *const Dyn;
        while (*entry).tag != DT_NULL {
            let Dyn { tag, val } = *entry;
            match tag {
                DT_SYMTAB => symtab = absolute(val),
                DT_STRTAB => strtab = absolute(val),
                DT_JMPREL => jmprel = absolute(val),
                DT_PLTRELSZ => pltrelsz = val as usize,
                DT_RELA => rela = absolute(val),
                DT_RELASZ => relasz = val as usize,
                DT_PLTREL => pltrel_is_rela = val == DT_RELA as u64,
                _ => {}
            }
            entry = entry.add(1);
        }
        if symtab == 0 || strtab == 0 {
            return;
        }
        let mut tables = vec![(rela, relasz)];
        if pltrel_is_rela {
            tables.push((jmprel, pltrelsz));
        }
        for (table, bytes) in tables {
            if table == 0 {
                continue;
            }
            let relocs = std::slice::from_raw_parts(
                table as *const Rela,
                bytes / std::mem::size_of::<Rela>(),
            );
            for r in relocs {
                let kind = (r.info & 0xffff_ffff) as u32;
                let index = (r.info >> 32) as usize;
                if index == 0 || word_kind(kind, r.addend, data).is_none() {
                    // No symbol (RELATIVE), a kind no rule rewrites, or a data word `select`
                    // refuses anyway: skipped before reading the symbol (the interpreter has
                    // thousands of data relocations against its own objects).
                    continue;
                }
                let sym = &*(symtab as *const Sym).add(index);
                let slot = base.wrapping_add(r.offset as usize);
                let aligned = slot % std::mem::align_of::<AtomicUsize>() == 0;
                let defined = sym.shndx != 0;
                let writable = || self.writable(slot);
                let Some(word) = select(kind, r.addend, defined, data, aligned, writable) else {
                    continue;
                };
                let name = CStr::from_ptr((strtab + sym.name as usize) as *const libc::c_char);
                each(name, &*(slot as *const AtomicUsize), word);
            }
        }
    }
}

unsafe extern "C" fn visit(
    info: *mut libc::dl_phdr_info,
    _size: libc::size_t,
    data: *mut c_void,
) -> c_int {
    let walk = &mut *(data as *mut Walk);
    let Some(object) = Object::of(&*info) else {
        return 0;
    };
    let rules: Vec<&Rule> = walk
        .rules
        .iter()
        .filter(|rule| !rule.skip.iter().any(|&a| object.contains(a)))
        .collect();
    if rules.is_empty() {
        return 0;
    }
    let relro = object.relro(walk.page);
    let page = walk.page;
    let mut rewritten = 0;
    let data = rules.iter().any(|rule| rule.data);
    object.imports(data, |name, cell, word| {
        for rule in &rules {
            if rule.symbol != name || (word == Word::Data && !rule.data) {
                continue;
            }
            let now = cell.load(Ordering::Acquire);
            let lazy = rule.lazy && word == Word::Import;
            let wanted = match rule.from {
                Some(from) => now == from || (lazy && object.contains(now)),
                None => now != rule.to,
            };
            if wanted && store(cell, rule.to, relro, page) {
                rewritten += 1;
            }
        }
    });
    walk.rewritten += rewritten;
    0
}

/// What the import slot of `symbol` holds in the loaded object that contains `within`, if it
/// has one: the function its calls reach (a slot bound at load time).
///
/// # Safety
/// No other precondition than `dl_iterate_phdr`'s.
pub unsafe fn import_value(symbol: &CStr, within: usize) -> Option<usize> {
    struct Lookup<'a> {
        symbol: &'a CStr,
        within: usize,
        found: Option<usize>,
    }
    unsafe extern "C" fn look(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut c_void,
    ) -> c_int {
        let lookup = &mut *(data as *mut Lookup);
        let Some(object) = Object::of(&*info) else {
            return 0;
        };
        if !object.contains(lookup.within) {
            return 0;
        }
        object.imports(false, |name, cell, _| {
            if lookup.found.is_none() && name == lookup.symbol {
                lookup.found = Some(cell.load(Ordering::Acquire));
            }
        });
        1 // the object was found: stop walking
    }
    let mut lookup = Lookup {
        symbol,
        within,
        found: None,
    };
    libc::dl_iterate_phdr(Some(look), (&mut lookup as *mut Lookup).cast());
    lookup.found
}

/// Stores `value` in a slot, lifting the loader's read-only protection around the store
/// when the slot lies in the object's RELRO range. `false` if the page could not be made
/// writable (the slot is then left as it was).
unsafe fn store(
    cell: &AtomicUsize,
    value: usize,
    relro: Option<(usize, usize)>,
    page: usize,
) -> bool {
    let slot = cell as *const AtomicUsize as usize;
    let protected = relro.is_some_and(|(start, end)| slot >= start && slot < end);
    let page_start = (slot & !(page - 1)) as *mut c_void;
    if protected && libc::mprotect(page_start, page, libc::PROT_READ | libc::PROT_WRITE) != 0 {
        return false;
    }
    cell.store(value, Ordering::Release);
    if protected {
        libc::mprotect(page_start, page, libc::PROT_READ);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn select_cases() {
        const RELATIVE: u32 = 8;
        const PC32: u32 = 2;
        let (imp, data) = (Some(Word::Import), Some(Word::Data));
        // (kind, addend, defined, data wanted, aligned, writable, expected)
        let cases = [
            (R_X86_64_JUMP_SLOT, 0, false, true, true, true, imp),
            (R_X86_64_GLOB_DAT, 0, false, true, true, true, imp),
            (R_X86_64_64, 0, false, true, true, true, data),
            // Import slots only (tracked domains' rules, the executable's binding).
            (R_X86_64_64, 0, false, false, true, true, None),
            (R_X86_64_GLOB_DAT, 0, false, false, true, true, imp),
            // An address computed from the function's, not a pointer to it.
            (R_X86_64_64, 16, false, true, true, true, None),
            (R_X86_64_64, -8, false, true, true, true, None),
            // The object's own definition.
            (R_X86_64_64, 0, true, true, true, true, None),
            (R_X86_64_GLOB_DAT, 0, true, true, true, true, None),
            // A packed field, a text relocation.
            (R_X86_64_64, 0, false, true, false, true, None),
            (R_X86_64_64, 0, false, true, true, false, None),
            (R_X86_64_JUMP_SLOT, 0, false, true, true, false, None),
            // Kinds that name no pointer-sized word holding the symbol.
            (RELATIVE, 0, false, true, true, true, None),
            (PC32, 0, false, true, true, true, None),
        ];
        for (kind, addend, defined, wanted, aligned, writable, want) in cases {
            let asked = std::cell::Cell::new(false);
            let got = select(kind, addend, defined, wanted, aligned, || {
                asked.set(true);
                writable
            });
            let case = format!("{kind} {addend} {defined} {wanted} {aligned} {writable}");
            assert_eq!(got, want, "{case}");
            // The segment walk only for a word every other test selected.
            let candidate = matches!(kind, R_X86_64_JUMP_SLOT | R_X86_64_GLOB_DAT)
                || (kind == R_X86_64_64 && wanted && addend == 0);
            assert_eq!(asked.get(), candidate && !defined && aligned, "{case}");
        }
    }

    fn phdr(p_type: u32, p_flags: u32, p_vaddr: u64, p_memsz: u64) -> libc::Elf64_Phdr {
        libc::Elf64_Phdr {
            p_type,
            p_flags,
            p_offset: 0,
            p_vaddr,
            p_paddr: p_vaddr,
            p_filesz: p_memsz,
            p_memsz,
            p_align: 0x1000,
        }
    }

    #[test]
    fn writable_words() {
        const PF_R: u32 = 4;
        const PF_X: u32 = 1;
        let phdrs = [
            phdr(PT_LOAD, PF_R | PF_X, 0, 0x1000),
            phdr(PT_LOAD, PF_R | PF_W, 0x2000, 0x100),
            phdr(PT_GNU_RELRO, PF_R, 0x2000, 0x40),
            phdr(PT_DYNAMIC, PF_R | PF_W, 0x2080, 0x20),
        ];
        let object = Object {
            base: 0x7f00_0000_0000,
            phdrs: &phdrs,
            dynamic: &phdrs[3],
        };
        let at = |offset: usize| object.writable(0x7f00_0000_0000 + offset);
        for (offset, want) in [
            (0x0, false),    // code
            (0xff8, false),  // code, last word
            (0x1800, false), // between segments
            (0x2000, true),  // first word, in the RELRO range
            (0x2040, true),
            (0x20f8, true),  // last whole word
            (0x20f9, false), // runs past the segment's end
            (0x2100, false),
        ] {
            assert_eq!(at(offset), want, "{offset:#x}");
        }
    }
}
