//! `_native._heap_census()`: the heap walk summarised per type, so the walk can be tested (and
//! looked at) from Python without the snapshot around it.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::heap::walk;

/// Walks the heap (from the collector's objects and `roots`) and returns `(nodes, edges,
/// {type name: (count, size)}, {buffer kind: (count, size)})`.
#[pyfunction]
#[pyo3(signature = (roots = Vec::new()))]
fn _heap_census<'py>(
    py: Python<'py>,
    roots: Vec<Bound<'py, PyAny>>,
) -> PyResult<(usize, usize, Bound<'py, PyDict>, Bound<'py, PyDict>)> {
    let raw: Vec<_> = roots.iter().map(Bound::as_ptr).collect();
    let graph = walk::walk(py, &raw, crate::hooks::tracer::traced_size)?;
    let mut per_type = vec![(0u64, 0u64); graph.type_names().len()];
    for node in 0..graph.len() as u32 {
        let entry = &mut per_type[graph.type_id(node) as usize];
        entry.0 += 1;
        entry.1 += graph.size(node);
    }
    let decode =
        |name: &[u8]| PyBytes::new(py, name).call_method1("decode", ("utf-8", "surrogatepass"));
    let types = PyDict::new(py);
    for (name, counts) in graph.type_names().iter().zip(per_type) {
        types.set_item(decode(name)?, counts)?;
    }
    let buffers = PyDict::new(py);
    for buffer in graph.buffers() {
        let mut name = graph.type_name(buffer.owner).to_vec();
        name.extend_from_slice(format!(" ({})", buffer.label).as_bytes());
        let key = decode(&name)?;
        let (count, size): (u64, u64) = match buffers.get_item(&key)? {
            Some(v) => v.extract()?,
            None => (0, 0),
        };
        buffers.set_item(key, (count + 1, size + buffer.size))?;
    }
    Ok((graph.len(), graph.edge_count(), types, buffers))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_heap_census, m)?)?;
    Ok(())
}
