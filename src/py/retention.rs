//! `alloctrace._native` functions behind retention paths: they convert the roots and targets,
//! delegate to [`crate::heap::retention`], and turn addresses back into objects.
//!
//! Addresses become objects (new references) right after the analysis and before anything
//! that could run Python code, so every object returned was alive when it was found: the walk
//! runs no code, and the only interpreter calls in between (resolving allocation sites) may
//! collect unreachable garbage but never an object a root reaches, which is all a path holds.

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple};

use crate::heap::paths::{GroupKey, PatternLine};
use crate::heap::retention::{object_report, site_reports, Analysis};
use crate::hooks::tracer;
use crate::py::strings::{bytes_str, str_bytes};

/// Reference chains as lists of objects.
type Chains = Vec<Vec<Py<PyAny>>>;
/// A pattern key for Python: type name and `(filename, lineno)` where known.
type KeyPy<'py> = (Bound<'py, PyString>, Option<(Bound<'py, PyString>, u32)>);

/// New references to the objects at `paths`' addresses.
fn objects(py: Python<'_>, paths: &[Vec<usize>]) -> Chains {
    paths
        .iter()
        .map(|path| {
            path.iter()
                // SAFETY: see the module docs: each address is an object alive since the walk.
                .map(|&addr| {
                    unsafe { Bound::from_borrowed_ptr(py, addr as *mut ffi::PyObject) }.unbind()
                })
                .collect()
        })
        .collect()
}

fn ptrs(objs: &[Bound<'_, PyAny>]) -> Vec<*mut ffi::PyObject> {
    objs.iter().map(|o| o.as_ptr()).collect()
}

/// Why `obj` is alive: `(paths, own size, retained size, reachable)`, each path a list of
/// objects from a root to `obj`. The first `primary` roots are searched before the others.
#[pyfunction]
fn object_retention<'py>(
    py: Python<'py>,
    roots: Vec<Bound<'py, PyAny>>,
    primary: usize,
    obj: Bound<'py, PyAny>,
    limit: usize,
) -> PyResult<(Chains, u64, u64, bool)> {
    crate::platform::allocator::guarded(|| {
        let analysis = Analysis::new(py, &ptrs(&roots), primary, &[obj.as_ptr()])?;
        let report = object_report(&analysis, obj.as_ptr() as usize, limit)?.ok_or_else(|| {
            crate::py::error::<pyo3::exceptions::PyRuntimeError>(
                "the heap walk did not reach the object",
            )
        })?;
        let paths = objects(py, &report.paths);
        drop(analysis);
        Ok((paths, report.own, report.retained, report.reachable))
    })
}

/// Why the objects allocated at each of `sites` (`(filename, lineno)` of the most recent
/// frame) are alive: per site `None` when no live object of the site was found, else
/// `(count, unreachable, own, retained, paths, pattern)`, the pattern as
/// `(type, site or None, count, held, [(type, site or None, count)])` lines.
#[pyfunction]
fn site_retention<'py>(
    py: Python<'py>,
    roots: Vec<Bound<'py, PyAny>>,
    primary: usize,
    sites: Vec<(Bound<'py, PyString>, u32)>,
    limit: usize,
    max_lines: usize,
) -> PyResult<Bound<'py, PyList>> {
    crate::platform::allocator::guarded(|| {
        let analysis = Analysis::new(py, &ptrs(&roots), primary, &[])?;
        let addrs: Vec<usize> = (0..analysis.graph.len() as u32)
            .map(|n| analysis.graph.addr(n))
            .collect();
        // SAFETY: the GIL is held and no code has run since the walk saw these objects.
        let (node_sites, table) = unsafe { tracer::object_sites(py, &addrs) };
        drop(addrs);
        let mut wanted = Vec::with_capacity(sites.len());
        for (filename, lineno) in &sites {
            let name = str_bytes(filename)?;
            let id = table
                .iter()
                .position(|(f, l)| **f == *name && l == lineno)
                .map_or(u32::MAX, |i| i as u32);
            wanted.push(id);
        }
        let reports = site_reports(&analysis, &node_sites, &wanted, limit, max_lines)?;
        let paths: Vec<_> = reports.iter().map(|r| objects(py, &r.paths)).collect();
        let type_names = analysis.graph.type_names();
        let key_py = |(ty, site): GroupKey| -> PyResult<KeyPy<'py>> {
            let site = match site {
                Some(s) => {
                    let (f, l) = &table[s as usize];
                    Some((bytes_str(py, f)?, *l))
                }
                None => None,
            };
            Ok((bytes_str(py, &type_names[ty as usize])?, site))
        };
        let line_py = |line: &PatternLine| -> PyResult<Bound<'py, PyTuple>> {
            let (ty, site) = key_py(line.key)?;
            let up = line
                .up
                .iter()
                .map(|&(k, count)| {
                    let (t, s) = key_py(k)?;
                    (t, s, count).into_pyobject(py)
                })
                .collect::<PyResult<Vec<_>>>()?;
            (ty, site, line.count, line.held, up).into_pyobject(py)
        };
        let out = PyList::empty(py);
        for (report, paths) in reports.iter().zip(paths) {
            if report.count == 0 {
                out.append(py.None())?;
                continue;
            }
            let pattern = report
                .pattern
                .iter()
                .map(line_py)
                .collect::<PyResult<Vec<_>>>()?;
            out.append((
                report.count,
                report.unreachable,
                report.own,
                report.retained,
                paths,
                pattern,
            ))?;
        }
        Ok(out)
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(object_retention, m)?)?;
    m.add_function(wrap_pyfunction!(site_retention, m)?)?;
    Ok(())
}
