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
/// With `lazy`, a slot that still points into its own object also counts as holding `from`:
/// a lazily bound import not called yet holds the address of its PLT stub, which would
/// resolve to `from` on the first call.
pub struct Rule<'a> {
    pub symbol: &'a CStr,
    pub from: Option<usize>,
    pub to: usize,
    pub skip: &'a [usize],
    pub lazy: bool,
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
const R_X86_64_GLOB_DAT: u32 = 6;
const R_X86_64_JUMP_SLOT: u32 = 7;
const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const PT_GNU_RELRO: u32 = 0x6474_e552;

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

unsafe extern "C" fn visit(
    info: *mut libc::dl_phdr_info,
    _size: libc::size_t,
    data: *mut c_void,
) -> c_int {
    let walk = &mut *(data as *mut Walk);
    let info = &*info;
    let base = info.dlpi_addr as usize;
    let phdrs = std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize);
    let contains = |address: usize| {
        phdrs.iter().any(|p| {
            let start = base.wrapping_add(p.p_vaddr as usize);
            p.p_type == PT_LOAD && address >= start && address < start + p.p_memsz as usize
        })
    };
    let Some(dynamic) = phdrs.iter().find(|p| p.p_type == PT_DYNAMIC) else {
        return 0;
    };
    if !info.dlpi_name.is_null() {
        // The vDSO's dynamic section is not relocated and it imports nothing.
        let name = CStr::from_ptr(info.dlpi_name).to_bytes();
        if name.starts_with(b"linux-vdso") || name.starts_with(b"linux-gate") {
            return 0;
        }
    }
    let relro = phdrs.iter().find(|p| p.p_type == PT_GNU_RELRO).map(|p| {
        let start = base + p.p_vaddr as usize;
        let floor = |a: usize| a & !(walk.page - 1);
        (floor(start), floor(start + p.p_memsz as usize))
    });
    let rules: Vec<&Rule> = walk
        .rules
        .iter()
        .filter(|rule| !rule.skip.iter().any(|&a| contains(a)))
        .collect();
    if rules.is_empty() {
        return 0;
    }
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
    let mut entry = (base + dynamic.p_vaddr as usize) as *const Dyn;
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
        return 0;
    }
    let mut tables = vec![(rela, relasz)];
    if pltrel_is_rela {
        tables.push((jmprel, pltrelsz));
    }
    for (table, bytes) in tables {
        if table == 0 {
            continue;
        }
        let relocs =
            std::slice::from_raw_parts(table as *const Rela, bytes / std::mem::size_of::<Rela>());
        for r in relocs {
            let kind = (r.info & 0xffff_ffff) as u32;
            let index = (r.info >> 32) as usize;
            if index == 0 || (kind != R_X86_64_JUMP_SLOT && kind != R_X86_64_GLOB_DAT) {
                continue;
            }
            let sym = &*(symtab as *const Sym).add(index);
            if sym.shndx != 0 {
                continue; // defined here: the object's own function, not an import
            }
            let name = CStr::from_ptr((strtab + sym.name as usize) as *const libc::c_char);
            for rule in &rules {
                if rule.symbol != name {
                    continue;
                }
                let slot = base.wrapping_add(r.offset as usize);
                let cell = &*(slot as *const AtomicUsize);
                let now = cell.load(Ordering::Acquire);
                let wanted = match rule.from {
                    Some(from) => now == from || (rule.lazy && contains(now)),
                    None => now != rule.to,
                };
                if wanted && store(cell, rule.to, relro, walk.page) {
                    walk.rewritten += 1;
                }
            }
        }
    }
    0
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
