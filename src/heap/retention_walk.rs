//! A minimal heap walk for retention paths: the collector's objects (from `gc.get_objects()`,
//! called before walking) and everything reachable from them and from `extra_roots` through
//! `tp_traverse`. Type names are the types' `tp_name`; sizes are the object's own struct.

use std::ffi::{c_int, c_void, CStr};

use pyo3::ffi;
use pyo3::prelude::*;

use super::graph::{GraphBuilder, HeapGraph};
use crate::error::{Error, Result};

unsafe extern "C" fn collect(obj: *mut ffi::PyObject, arg: *mut c_void) -> c_int {
    if !obj.is_null() {
        (*(arg as *mut Vec<*mut ffi::PyObject>)).push(obj);
    }
    0
}

unsafe fn own_size(obj: *mut ffi::PyObject) -> u64 {
    let tp = ffi::Py_TYPE(obj);
    let mut size = (*tp).tp_basicsize as u64;
    if (*tp).tp_itemsize != 0 {
        let n = (*(obj as *mut ffi::PyVarObject)).ob_size.unsigned_abs() as u64;
        size += n * (*tp).tp_itemsize as u64;
    }
    size
}

/// Walks every object the collector tracks and what they reach, plus `extra_roots`.
pub fn walk(py: Python<'_>, extra_roots: &[*mut ffi::PyObject]) -> Result<HeapGraph> {
    let objects = py
        .import("gc")
        .and_then(|gc| gc.call_method0("get_objects"))
        .map_err(|e| Error::State(format!("cannot list the collector's objects: {e}")))?;
    let mut stack: Vec<*mut ffi::PyObject> = extra_roots.to_vec();
    if let Ok(list) = objects.cast::<pyo3::types::PyList>() {
        stack.extend(list.iter().map(|o| o.as_ptr()));
    }
    let skip = objects.as_ptr();
    let mut b = GraphBuilder::new();
    let mut children: Vec<*mut ffi::PyObject> = Vec::new();
    let mut expanded: std::collections::HashSet<usize> = std::collections::HashSet::new();
    // SAFETY: the GIL is held and no Python code runs below; every pointer is a live object
    // reached from a live object.
    unsafe {
        while let Some(obj) = stack.pop() {
            if obj == skip || !expanded.insert(obj as usize) {
                continue;
            }
            let tp = ffi::Py_TYPE(obj);
            let name = CStr::from_ptr((*tp).tp_name).to_bytes();
            let node = b.add_node(obj as usize, name, own_size(obj));
            children.clear();
            if let Some(traverse) = (*tp).tp_traverse {
                if ffi::PyObject_IS_GC(obj) != 0 {
                    traverse(obj, collect, &mut children as *mut _ as *mut c_void);
                }
            }
            for &child in &children {
                if child == skip {
                    continue;
                }
                let to = match b.node_of(child as usize) {
                    Some(n) => n,
                    None => {
                        let ctp = ffi::Py_TYPE(child);
                        let n = b.add_node(
                            child as usize,
                            CStr::from_ptr((*ctp).tp_name).to_bytes(),
                            own_size(child),
                        );
                        stack.push(child);
                        n
                    }
                };
                b.add_edge(node, to);
            }
        }
    }
    Ok(b.finish())
}
