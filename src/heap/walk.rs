//! The heap walk: every object the cyclic collector tracks, everything they refer to, and the
//! blocks the built-in containers own, as a [`HeapGraph`].
//!
//! Where the objects come from: the collector's generation lists (and the permanent generation
//! of `gc.freeze()`), read directly from the interpreter state with the offsets `layout.c`
//! derives from each version's headers. `gc.get_objects()` would allocate a list (which would
//! then be part of the heap being described) and misses frozen objects; reading the lists
//! allocates nothing. Objects that are not tracked (str, int, bytes, untracked tuples and
//! dicts) are reached through the `tp_traverse` of the objects that refer to them, as the
//! collector and `gc.get_referents()` reach them.
//!
//! Why the graph is consistent: the walk holds the GIL and calls nothing that can run Python
//! code, allocate a Python object, release the GIL or start a collection. It reads fields,
//! calls `tp_is_gc`/`tp_traverse` (which the collector itself calls in the middle of
//! collections, so they cannot run code), and keeps its own data in Rust's allocator, which
//! is not PyMem, so none of it is traced. Type names need Python strings encoded, so they are
//! read once per distinct type after the walk, when the graph is complete.
//!
//! What is not found: objects referred to only from C (static variables of an extension, the
//! interpreter's own state) and not from any tracked object, and objects whose owner has no
//! `tp_traverse` for them (an extension type that does not support the collector hides what
//! it holds). A walk started while a collection is running (from a `__del__` method or a
//! `gc.callbacks` callback) is refused: objects are then in the collector's private lists.

use std::collections::HashMap;
use std::ffi::{c_int, c_void, CStr};

use pyo3::ffi;
use pyo3::Python;

use super::graph::{Buffer, GraphBuilder, HeapGraph, NodeId, NO_NODE};
use crate::capture::{Current, Interpreter};
use crate::error::{Error, Result};
use crate::hooks::table::BuildAddressHasher;
use crate::platform::fallible;

#[allow(dead_code)]
mod layout {
    include!(concat!(env!("OUT_DIR"), "/layout.rs"));
}

/// Walks every object the cyclic collector tracks and, transitively through `tp_traverse`,
/// every object they refer to, plus `extra_roots` and what they reach.
///
/// Nodes are numbered in the order they were found: the collector's objects first (youngest
/// generation first, in list order), then `extra_roots`, then what was reached from them,
/// breadth first. Each node's referents are what its `tp_traverse` visits, in order. A node's
/// size is its block's traced size (`traced_size` of the block's address: the tracer's
/// answer, passed in so that the walk knows nothing of the tracer that uses it), else an
/// estimate from `tp_basicsize` and `tp_itemsize` (see [`estimated_size`]), plus the sizes of
/// the buffers attributed to it, sized the same way.
///
/// Needs the GIL (the `py` token proves it); see the module docs for why nothing it does can
/// change the heap under it.
///
/// # Errors
/// [`Error::State`] if a collection is running (called from a finaliser or a gc callback).
pub fn walk(
    py: Python<'_>,
    extra_roots: &[*mut ffi::PyObject],
    traced_size: fn(usize) -> Option<usize>,
) -> Result<HeapGraph> {
    let _ = py;
    // SAFETY: the GIL is held; the interpreter state outlives this call.
    let interp = unsafe { ffi::PyInterpreterState_Get() } as *const u8;
    // SAFETY: the offsets come from this interpreter's headers.
    let collecting = unsafe { *(interp.add(layout::INTERP_GC_COLLECTING) as *const c_int) };
    if collecting != 0 {
        return Err(Error::State(
            "cannot walk the heap while the garbage collector is collecting (from a __del__ \
             method or a gc.callbacks callback): objects are then in the collector's private \
             lists"
                .into(),
        ));
    }
    let mut walker = Walker {
        traced_size,
        builder: GraphBuilder::default(),
        types: Vec::new(),
        type_index: HashMap::default(),
        objects: Vec::new(),
        referents: Vec::new(),
        deque_types: Vec::new(),
    };
    // SAFETY: the GIL is held and nothing below runs Python code, so the lists and the objects
    // on them stay as they are.
    unsafe {
        let generations = (0..layout::GC_NUM_GENERATIONS)
            .map(|g| layout::INTERP_GC_GENERATIONS + g * layout::GC_GENERATION_SIZE)
            .chain(std::iter::once(layout::INTERP_GC_PERMANENT));
        for offset in generations {
            // `struct gc_generation` starts with its list head.
            let head = interp.add(offset);
            let mut gc = *(head.add(layout::GC_HEAD_NEXT) as *const *const u8);
            while !gc.is_null() && gc != head {
                walker.reach(gc.add(layout::GC_HEAD_SIZE) as *mut ffi::PyObject);
                gc = *(gc.add(layout::GC_HEAD_NEXT) as *const *const u8);
            }
        }
        for &root in extra_roots {
            if !root.is_null() {
                walker.reach(root);
            }
        }
        let mut tstate = ffi::PyInterpreterState_ThreadHead(interp as *mut _);
        while !tstate.is_null() {
            walker.reach_stack(tstate);
            tstate = ffi::PyThreadState_Next(tstate);
        }
        walker.traverse_all();
    }
    // The graph is complete; from here on reading names may allocate.
    // SAFETY: the GIL is held; the type objects are kept alive by the walked objects, none of
    // which has been released (no Python code ran).
    let names: Vec<Box<[u8]>> = walker
        .types
        .iter()
        .map(|&tp| unsafe { type_name(tp) }.into_boxed_slice())
        .collect();
    let mut builder = walker.builder;
    builder.name_types(&names);
    builder.try_finish()
}

struct Walker {
    /// The traced size of the block at an address, if it is traced.
    traced_size: fn(usize) -> Option<usize>,
    builder: GraphBuilder,
    /// The distinct type objects met, in order: a node's provisional type is an index here.
    types: Vec<*mut ffi::PyTypeObject>,
    type_index: HashMap<usize, u32, BuildAddressHasher>,
    /// Per type in `types`: whether it is a deque (whose blocks the walk attributes to it).
    deque_types: Vec<bool>,
    /// The objects behind the nodes, by node id (the graph keeps addresses as `usize`).
    objects: Vec<*mut ffi::PyObject>,
    /// Filled by `visit` during one `tp_traverse` call.
    referents: Vec<*mut ffi::PyObject>,
}

impl Walker {
    /// The node of `obj`, adding it (with its size and buffers) if it is new.
    ///
    /// # Safety
    /// `obj` is a live object and the GIL is held.
    unsafe fn reach(&mut self, obj: *mut ffi::PyObject) -> NodeId {
        if let Some(node) = self.builder.node_of(obj as usize) {
            return node;
        }
        if self.builder.out_of_memory() {
            return NO_NODE;
        }
        let tp = (*obj).ob_type;
        let next = self.types.len() as u32;
        let provisional = *self.type_index.entry(tp as usize).or_insert_with(|| {
            self.types.push(tp);
            self.deque_types.push(is_deque(tp));
            next
        });
        let block = Current::object_block(obj);
        let size = (self.traced_size)(block)
            .map(|s| s as u64)
            .unwrap_or_else(|| estimated_size(obj, tp, block));
        let (node, _) = self
            .builder
            .add_node_unnamed(obj as usize, provisional, size);
        if node == NO_NODE {
            return NO_NODE;
        }
        if block != obj as usize {
            self.builder.set_block(node, block);
        }
        if fallible::room_for_one(&mut self.objects).is_err() {
            self.builder.note_out_of_memory();
            return NO_NODE;
        }
        self.objects.push(obj);
        let deque = self.deque_types[provisional as usize];
        for (addr, label, estimate) in owned_buffers(obj, tp).chain(deque_blocks(obj, deque)) {
            let size = (self.traced_size)(addr)
                .map(|s| s as u64)
                .unwrap_or(estimate);
            self.builder.add_buffer(Buffer {
                addr,
                owner: node,
                label,
                size,
            });
        }
        node
    }

    /// Reaches what `tstate`'s running frames hold, recording it as the thread's stack refs.
    /// A running frame is not tracked by the collector (up to 3.10 it is an untracked frame
    /// object, from 3.11 not an object at all), so without this, objects held only by a
    /// running function's locals would be missed. The thread is not running: it waits for
    /// the GIL, or is this one.
    ///
    /// # Safety
    /// As [`Walker::reach`]; `tstate` is a live thread state of this interpreter.
    unsafe fn reach_stack(&mut self, tstate: *mut ffi::PyThreadState) {
        let thread: u64 = field::<u64>(tstate.cast(), layout::TSTATE_THREAD_ID);
        let mut held = StackObjects::default();
        stack_objects(tstate, &mut held);
        for obj in held.objects {
            let node = self.reach(obj);
            self.builder.add_stack_ref(thread, node);
        }
        // A running frame object's traverse does not visit what its frame holds, so the
        // temporaries become edges from it: a search that starts at the frame (a root) finds
        // them and names the frame as the holder.
        for (frame_obj, obj) in held.temporaries {
            let (frame, node) = (self.reach(frame_obj), self.reach(obj));
            self.builder.add_stack_ref(thread, node);
            self.builder.add_edge(frame, node);
        }
    }

    /// Traverses every node in id order, including the ones added on the way.
    ///
    /// # Safety
    /// As [`Walker::reach`].
    unsafe fn traverse_all(&mut self) {
        let mut next = 0;
        while next < self.objects.len() && !self.builder.out_of_memory() {
            let obj = self.objects[next];
            let from = next as NodeId;
            next += 1;
            self.referents.clear();
            if is_gc(obj) {
                if let Some(traverse) = (*(*obj).ob_type).tp_traverse {
                    // Only `visit` can stop a traverse: it could not record a referent.
                    if traverse(obj, visit, (&mut self.referents as *mut Vec<_>).cast()) != 0 {
                        self.builder.note_out_of_memory();
                        break;
                    }
                }
            }
            if untraversed_referents(obj, &mut self.referents).is_err() {
                self.builder.note_out_of_memory();
                break;
            }
            if self.referents.is_empty() {
                continue;
            }
            let referents = std::mem::take(&mut self.referents);
            for &referent in &referents {
                let to = self.reach(referent);
                self.builder.add_edge(from, to);
            }
            self.referents = referents;
        }
    }
}

/// What a thread's running frames hold.
#[derive(Default)]
struct StackObjects {
    objects: Vec<*mut ffi::PyObject>,
    /// `(frame object, object)`: evaluation-stack temporaries of frames that have a frame
    /// object (3.11+ only).
    temporaries: Vec<(*mut ffi::PyObject, *mut ffi::PyObject)>,
}

/// The frame objects of a thread's stack, innermost first. Their value stacks are not read:
/// up to 3.10 a running frame does not store its stack top.
#[cfg(not(Py_3_11))]
unsafe fn stack_objects(tstate: *mut ffi::PyThreadState, out: &mut StackObjects) {
    let mut frame: *mut ffi::PyObject = field(tstate.cast(), layout::TSTATE_FRAME);
    while !frame.is_null() {
        out.objects.push(frame);
        frame = field(frame, layout::FRAME_BACK);
    }
}

/// What a thread's running frames hold, innermost frame first: per frame, its frame object if
/// one was made, its function, its `f_locals` and its fast locals, cells and free variables,
/// then the temporaries on its evaluation stack (`[make(), wait()]` holds `make()`'s result
/// there while `wait()` runs). A frame stores its stack top only while it is suspended in a
/// call to Python code (the interpreter sets `stacktop` to -1 while the frame runs or calls
/// C), so the stack is read only when `stacktop` lies within the code's locals and stack
/// size; otherwise it is not read at all. Shim frames owned by the C stack (3.12+) hold
/// nothing.
#[cfg(Py_3_11)]
unsafe fn stack_objects(tstate: *mut ffi::PyThreadState, out: &mut StackObjects) {
    #[cfg(Py_3_13)]
    let mut frame: *mut ffi::PyObject = field(tstate.cast(), layout::TSTATE_CURRENT_FRAME);
    #[cfg(not(Py_3_13))]
    let mut frame: *mut ffi::PyObject = {
        let cframe: *mut ffi::PyObject = field(tstate.cast(), layout::TSTATE_CFRAME);
        if cframe.is_null() {
            std::ptr::null_mut()
        } else {
            field(cframe, layout::CFRAME_CURRENT_FRAME)
        }
    };
    while !frame.is_null() {
        let owner: u8 = field(frame, layout::IFRAME_OWNER);
        #[cfg(Py_3_12)]
        let on_c_stack = owner == layout::OWNED_BY_CSTACK;
        #[cfg(not(Py_3_12))]
        let on_c_stack = {
            let _ = owner;
            false
        };
        let code: *mut ffi::PyObject = field(frame, layout::IFRAME_CODE);
        if !on_c_stack
            && !code.is_null()
            && (*code).ob_type == std::ptr::addr_of_mut!(ffi::PyCode_Type)
        {
            for offset in [
                layout::IFRAME_FRAME_OBJ,
                layout::IFRAME_FUNC,
                layout::IFRAME_LOCALS,
            ] {
                let obj: *mut ffi::PyObject = field(frame, offset);
                if !obj.is_null() {
                    out.objects.push(obj);
                }
            }
            let n: c_int = field(code, layout::CODE_NLOCALSPLUS);
            let locals =
                (frame as *const u8).add(layout::IFRAME_LOCALSPLUS) as *const *mut ffi::PyObject;
            for i in 0..n.max(0) as usize {
                let obj = *locals.add(i);
                if !obj.is_null() {
                    out.objects.push(obj);
                }
            }
            let top: c_int = field(frame, layout::IFRAME_STACKTOP);
            let depth: c_int = field(code, layout::CODE_STACKSIZE);
            let frame_obj: *mut ffi::PyObject = field(frame, layout::IFRAME_FRAME_OBJ);
            if !frame_obj.is_null() && n >= 0 && top > n && top - n <= depth {
                // Entries may be NULL (a call's absent `self`).
                for i in n as usize..top as usize {
                    let obj = *locals.add(i);
                    if !obj.is_null() {
                        out.temporaries.push((frame_obj, obj));
                    }
                }
            }
        }
        frame = field(frame, layout::IFRAME_PREVIOUS);
    }
}

/// Adds to `out` what `obj` refers to that its `tp_traverse` does not visit: the collector
/// only needs the references that can form cycles, so traverse functions skip strings, bytes
/// and other atomic objects where the container's layout makes that cheap. Without these the
/// objects are never reached and their blocks are reported as `raw`:
/// - a dict's keys when its keys table holds only `str` keys (every version's `dict_traverse`
///   then visits the values alone): module and class namespaces, instance dicts, and any
///   `{f"key-{i}": ...}`;
/// - a code object's constants, names and tables (code is not a container for the
///   collector at all), which is where the literals and identifiers of every module and
///   function compiled while tracing live;
/// - a heap type's `__name__` (`type_traverse` leaves it out).
///
/// # Safety
/// `obj` is a live object and the GIL is held. `PyDict_Next` reads the entries in place: it
/// allocates nothing and runs no code.
unsafe fn untraversed_referents(
    obj: *mut ffi::PyObject,
    out: &mut Vec<*mut ffi::PyObject>,
) -> Result<()> {
    let tp = (*obj).ob_type;
    let flags = (*tp).tp_flags;
    if flags & ffi::Py_TPFLAGS_DICT_SUBCLASS != 0 {
        // Keys already visited (a dict with non-str keys) are not added twice.
        let mut visited = std::collections::HashSet::new();
        visited.try_reserve(out.len())?;
        visited.extend(out.iter().map(|&o| o as usize));
        let (mut pos, mut key, mut value) = (0, std::ptr::null_mut(), std::ptr::null_mut());
        while ffi::PyDict_Next(obj, &mut pos, &mut key, &mut value) != 0 {
            if !key.is_null() && !visited.contains(&(key as usize)) {
                fallible::room_for_one(out)?;
                out.push(key);
            }
        }
    } else if tp == std::ptr::addr_of_mut!(ffi::PyCode_Type) {
        for offset in CODE_FIELDS {
            let field_obj: *mut ffi::PyObject = field(obj, offset);
            if !field_obj.is_null() {
                fallible::room_for_one(out)?;
                out.push(field_obj);
            }
        }
    } else if flags & ffi::Py_TPFLAGS_TYPE_SUBCLASS != 0 && flags & ffi::Py_TPFLAGS_HEAPTYPE != 0 {
        let name: *mut ffi::PyObject = field(obj, layout::HEAPTYPE_NAME);
        if !name.is_null() {
            fallible::room_for_one(out)?;
            out.push(name);
        }
    }
    Ok(())
}

/// The object fields of a code object, per version (see `layout.c`).
#[cfg(Py_3_11)]
const CODE_FIELDS: [usize; 8] = [
    layout::CODE_CONSTS,
    layout::CODE_NAMES,
    layout::CODE_NAME,
    layout::CODE_QUALNAME,
    layout::CODE_LOCALSPLUSNAMES,
    layout::CODE_LOCALSPLUSKINDS,
    layout::CODE_EXCEPTIONTABLE,
    layout::CODE_LINETABLE,
];
#[cfg(not(Py_3_11))]
const CODE_FIELDS: [usize; 8] = [
    layout::CODE_CONSTS,
    layout::CODE_NAMES,
    layout::CODE_NAME,
    layout::CODE_CODE,
    layout::CODE_VARNAMES,
    layout::CODE_FREEVARS,
    layout::CODE_CELLVARS,
    layout::CODE_LINETABLE,
];

/// The collector's test for "has GC links and may be traversed": static types have the GC
/// flag but their `tp_is_gc` says no, and their `tp_traverse` must not be called.
///
/// # Safety
/// `obj` is a live object and the GIL is held.
unsafe fn is_gc(obj: *mut ffi::PyObject) -> bool {
    let tp = (*obj).ob_type;
    if (*tp).tp_flags & ffi::Py_TPFLAGS_HAVE_GC == 0 {
        return false;
    }
    match (*tp).tp_is_gc {
        Some(is_gc) => is_gc(obj.cast()) != 0,
        None => true,
    }
}

/// The `visitproc` handed to `tp_traverse`: records the referent; -1 (which stops the
/// traverse) only when the list of referents cannot grow.
unsafe extern "C" fn visit(obj: *mut ffi::PyObject, arg: *mut c_void) -> c_int {
    if !obj.is_null() {
        let referents = &mut *(arg as *mut Vec<*mut ffi::PyObject>);
        if fallible::room_for_one(referents).is_err() {
            return -1;
        }
        referents.push(obj);
    }
    0
}

/// What an untraced object's block is estimated to take: the pre-header (GC header, managed
/// dict/weakref slots) plus `tp_basicsize`, plus `tp_itemsize` per item for variable-size
/// types (an int's digit count read from its own tag from 3.12). Types whose data is not
/// counted by `ob_size` (str, whose characters follow a fixed header) are underestimated;
/// while tracing, objects allocated after `start()` have their exact traced size instead.
///
/// # Safety
/// `obj` is a live object of type `tp`, holding its block from `block`.
unsafe fn estimated_size(obj: *mut ffi::PyObject, tp: *mut ffi::PyTypeObject, block: usize) -> u64 {
    let basic = (*tp).tp_basicsize.max(0) as u64;
    let itemsize = (*tp).tp_itemsize.max(0) as u64;
    let items = if itemsize == 0 {
        0
    } else if (*tp).tp_flags & ffi::Py_TPFLAGS_LONG_SUBCLASS != 0 {
        long_digits(obj)
    } else {
        (*(obj as *mut ffi::PyVarObject)).ob_size.unsigned_abs() as u64
    };
    (obj as usize - block) as u64 + basic + itemsize * items
}

#[cfg(Py_3_12)]
unsafe fn long_digits(obj: *mut ffi::PyObject) -> u64 {
    let tag = *((obj as *const u8).add(layout::LONG_TAG) as *const usize);
    (tag >> layout::LONG_NON_SIZE_BITS) as u64
}

#[cfg(not(Py_3_12))]
unsafe fn long_digits(obj: *mut ffi::PyObject) -> u64 {
    (*(obj as *mut ffi::PyVarObject)).ob_size.unsigned_abs() as u64
}

/// Reads the pointer stored `offset` bytes into `obj`.
unsafe fn field<T: Copy>(obj: *mut ffi::PyObject, offset: usize) -> T {
    *((obj as *const u8).add(offset) as *const T)
}

/// The separately allocated blocks an object owns, as `(address, label, estimated size)`:
/// a list's item array; a dict's keys table (unless shared by a class's instances: then the
/// class owns it, as its `cached keys`) and its split values array; the attribute values of
/// a 3.11/3.12 instance kept outside any dict (`values`; from 3.13 they are inside the
/// object's own block); a bytearray's buffer; a set's hash table once it outgrows the one
/// inside the object. Subclasses own theirs too. An estimate of 0 means unknown (only traced
/// sizes count then).
///
/// # Safety
/// `obj` is a live object of type `tp` and the GIL is held.
unsafe fn owned_buffers(
    obj: *mut ffi::PyObject,
    tp: *mut ffi::PyTypeObject,
) -> impl Iterator<Item = (usize, &'static str, u64)> {
    let flags = (*tp).tp_flags;
    let word = std::mem::size_of::<usize>() as u64;
    let mut found: [Option<(usize, &'static str, u64)>; 2] = [None, None];
    if flags & ffi::Py_TPFLAGS_LIST_SUBCLASS != 0 {
        let items: usize = field(obj, layout::LIST_ITEMS);
        let allocated: ffi::Py_ssize_t = field(obj, layout::LIST_ALLOCATED);
        found[0] = Some((items, "items", allocated.max(0) as u64 * word));
    } else if flags & ffi::Py_TPFLAGS_DICT_SUBCLASS != 0 {
        let keys: usize = field(obj, layout::DICT_KEYS);
        let values: usize = field(obj, layout::DICT_VALUES);
        if values == 0 {
            found[0] = Some((keys, "keys", 0));
        } else {
            found[0] = values_block(values).map(|block| (block, "values", 0));
        }
    } else if is_subtype(tp, std::ptr::addr_of_mut!(ffi::PyByteArray_Type)) {
        let bytes: usize = field(obj, layout::BYTEARRAY_BYTES);
        let alloc: ffi::Py_ssize_t = field(obj, layout::BYTEARRAY_ALLOC);
        found[0] = Some((bytes, "buffer", alloc.max(0) as u64));
    } else if is_subtype(tp, std::ptr::addr_of_mut!(ffi::PySet_Type))
        || is_subtype(tp, std::ptr::addr_of_mut!(ffi::PyFrozenSet_Type))
    {
        let table: usize = field(obj, layout::SET_TABLE);
        let mask: ffi::Py_ssize_t = field(obj, layout::SET_MASK);
        if table != obj as usize + layout::SET_SMALLTABLE {
            let size = (mask.max(0) as u64 + 1) * layout::SET_ENTRY_SIZE as u64;
            found[0] = Some((table, "table", size));
        }
    } else if flags & ffi::Py_TPFLAGS_TYPE_SUBCLASS != 0 && flags & ffi::Py_TPFLAGS_HEAPTYPE != 0 {
        let keys: usize = field(obj, layout::HEAPTYPE_CACHED_KEYS);
        found[0] = Some((keys, "cached keys", 0));
    }
    if flags & MANAGED_DICT != 0 {
        found[1] = managed_values(obj).map(|block| (block, "values", 0));
    }
    found
        .into_iter()
        .flatten()
        .filter(|&(addr, _, _)| addr != 0)
}

/// The blocks of a `collections.deque` (or subclass): a doubly linked list of fixed-size
/// blocks of 64 item slots, each its own allocation, from `leftblock` to `rightblock`. The
/// deque's struct is private to `_collectionsmodule.c`, but its head and block layout have
/// been the same from 3.9 to 3.13: after the `PyVarObject` header come `leftblock` and
/// `rightblock`; a block is `leftlink`, 64 item pointers, `rightlink`. The walk stops after
/// as many blocks as the item count can fill (plus the two partly used ends), so a deque
/// being changed by no one (the GIL is held) is read in bounded time whatever its state.
/// Spare blocks a deque keeps for reuse (3.12+) are not found: they stay `raw`. Only the
/// static deque type (up to 3.11) is recognised: from 3.12 `_collections` makes its types
/// from specs (heap types), which [`is_deque`] does not trust by name, so their blocks are
/// still `raw` there.
///
/// # Safety
/// `obj` is a live object, a deque if `deque`, and the GIL is held.
unsafe fn deque_blocks(
    obj: *mut ffi::PyObject,
    deque: bool,
) -> impl Iterator<Item = (usize, &'static str, u64)> {
    const BLOCKLEN: usize = 64;
    let word = std::mem::size_of::<usize>();
    let block_size = ((BLOCKLEN + 2) * word) as u64;
    let mut blocks = Vec::new();
    if deque {
        let head = std::mem::size_of::<ffi::PyVarObject>();
        let items = (*(obj as *mut ffi::PyVarObject)).ob_size.max(0) as usize;
        let left: *const u8 = field(obj, head);
        let right: *const u8 = field(obj, head + word);
        let mut block = left;
        let most = items / BLOCKLEN + 2;
        while !block.is_null() && blocks.len() < most {
            blocks.push((block as usize, "blocks", block_size));
            if block == right {
                break;
            }
            block = *(block.add((BLOCKLEN + 1) * word) as *const *const u8);
        }
    }
    blocks.into_iter()
}

/// Whether `tp` is `collections.deque` or a subclass: the static type is found by name along
/// the base chain (`_collections` does not export it).
unsafe fn is_deque(tp: *mut ffi::PyTypeObject) -> bool {
    let mut t = tp;
    while !t.is_null() {
        if (*t).tp_flags & ffi::Py_TPFLAGS_HEAPTYPE == 0 {
            return CStr::from_ptr((*t).tp_name).to_bytes() == b"collections.deque";
        }
        t = (*t).tp_base;
    }
    false
}

/// `Py_TPFLAGS_MANAGED_DICT` (3.11+): the instance keeps its dict (or its attribute values)
/// in the pre-header.
const MANAGED_DICT: std::ffi::c_ulong = 1 << 4;

/// The block holding a dict's split values array (`PyDictValues*`), as the allocator saw it.
/// Up to 3.10 the array is its own block. In 3.11 and 3.12 it is allocated with a prefix
/// whose size is stored in the byte just before the array. From 3.13 the array starts its
/// block, unless it is embedded in the instance that owns it (then it is not a block).
unsafe fn values_block(values: usize) -> Option<usize> {
    if cfg!(Py_3_13) {
        let embedded = *(values as *const u8).add(2);
        (embedded == 0).then_some(values)
    } else if cfg!(Py_3_11) {
        let prefix = *(values as *const u8).sub(1) as usize;
        (prefix != 0).then(|| values - prefix)
    } else {
        Some(values)
    }
}

/// The block of a 3.11/3.12 instance's attribute values kept in its pre-header (when it has
/// no dict object): 3.11 keeps a values pointer four words before the object, 3.12 a tagged
/// dict-or-values pointer three words before it (low bit set: values, stored minus one).
unsafe fn managed_values(obj: *mut ffi::PyObject) -> Option<usize> {
    let word = std::mem::size_of::<usize>();
    let base = obj as *const u8;
    let values = if cfg!(Py_3_13) {
        return None;
    } else if cfg!(Py_3_12) {
        let stored = *(base.sub(3 * word) as *const usize);
        if stored & 1 == 0 {
            return None;
        }
        stored + 1
    } else if cfg!(Py_3_11) {
        *(base.sub(4 * word) as *const usize)
    } else {
        return None;
    };
    if values == 0 {
        return None;
    }
    values_block(values)
}

/// `PyType_IsSubtype` reads the type's MRO tuple (or its base chain); it runs no code.
unsafe fn is_subtype(tp: *mut ffi::PyTypeObject, base: *mut ffi::PyTypeObject) -> bool {
    tp == base || ffi::PyType_IsSubtype(tp, base) != 0
}

/// The qualified name of a type: `module.QualName`, builtins bare (`dict`), as `repr()` of the
/// class names it. Static types have it in `tp_name` already (`collections.deque`); heap
/// types keep their `__qualname__` in the type object and `__module__` in their dict. Read
/// from the fields, not through attribute lookup, so no metaclass code runs.
///
/// # Safety
/// The GIL is held and `tp` is a live type object.
unsafe fn type_name(tp: *mut ffi::PyTypeObject) -> Vec<u8> {
    let static_name = || CStr::from_ptr((*tp).tp_name).to_bytes().to_vec();
    if (*tp).tp_flags & ffi::Py_TPFLAGS_HEAPTYPE == 0 {
        return static_name();
    }
    let qualname: *mut ffi::PyObject = field(tp.cast(), layout::HEAPTYPE_QUALNAME);
    let Some(qualname) = str_bytes(qualname) else {
        return static_name();
    };
    let dict = (*tp).tp_dict;
    if dict.is_null() {
        return qualname;
    }
    let module = ffi::PyDict_GetItemString(dict, c"__module__".as_ptr());
    match str_bytes(module) {
        Some(module) if module != b"builtins" => {
            let mut name = module;
            name.push(b'.');
            name.extend_from_slice(&qualname);
            name
        }
        _ => qualname,
    }
}

/// A `str`'s UTF-8 bytes (surrogates passed through), or `None` if `obj` is not a `str`.
unsafe fn str_bytes(obj: *mut ffi::PyObject) -> Option<Vec<u8>> {
    if obj.is_null() || ffi::PyUnicode_Check(obj) == 0 {
        return None;
    }
    let encoded = ffi::PyUnicode_AsEncodedString(obj, c"utf-8".as_ptr(), c"surrogatepass".as_ptr());
    if encoded.is_null() {
        ffi::PyErr_Clear();
        return None;
    }
    let bytes = std::slice::from_raw_parts(
        ffi::PyBytes_AsString(encoded) as *const u8,
        ffi::PyBytes_Size(encoded) as usize,
    )
    .to_vec();
    ffi::Py_DECREF(encoded);
    Some(bytes)
}
