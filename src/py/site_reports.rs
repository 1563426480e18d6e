//! Retention reports between Python and [`SiteRetention`]: Python builds them as dicts
//! (`alloctrace._retention.capture_sites`) and reads them back as dicts, so the shape of a
//! report is checked here, once, when it enters the model.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use crate::analysis::snapshot::SiteRetention;
use crate::py::strings::{bytes_str, str_bytes};

/// The keys of a report dict, in the order they are written back.
const FIELDS: [&str; 8] = [
    "filename",
    "lineno",
    "count",
    "unreachable",
    "size",
    "retained",
    "paths",
    "pattern",
];

fn field<'py>(d: &Bound<'py, PyDict>, i: usize, name: &str) -> PyResult<Bound<'py, PyAny>> {
    d.get_item(name)?.ok_or_else(|| {
        crate::py::error::<PyValueError>(format!("retention report {i} has no '{name}' field"))
    })
}

fn uint<T: TryFrom<u64>>(d: &Bound<'_, PyDict>, i: usize, name: &str) -> PyResult<T> {
    let v = field(d, i, name)?;
    if v.is_instance_of::<pyo3::types::PyBool>() {
        return Err(crate::py::error::<PyTypeError>(format!(
            "retention report {i}: {name} must be an int, not bool"
        )));
    }
    let bad = || {
        crate::py::error::<PyValueError>(format!(
            "retention report {i}: {name} must be a non-negative int in range, not {}",
            v.repr().map(|r| r.to_string()).unwrap_or_default()
        ))
    };
    let n: u64 = v.extract().map_err(|_| bad())?;
    T::try_from(n).map_err(|_| bad())
}

fn strs(d: &Bound<'_, PyDict>, i: usize, name: &str) -> PyResult<Vec<Box<[u8]>>> {
    let v = field(d, i, name)?;
    let list = v.cast::<PyList>().map_err(|_| {
        crate::py::error::<PyTypeError>(format!(
            "retention report {i}: {name} must be a list of str"
        ))
    })?;
    list.iter()
        .map(|s| {
            let s = s.cast_into::<PyString>().map_err(|_| {
                crate::py::error::<PyTypeError>(format!(
                    "retention report {i}: {name} must be a list of str"
                ))
            })?;
            Ok(str_bytes(&s)?.into_boxed_slice())
        })
        .collect()
}

/// A list of report dicts (exactly the [`FIELDS`]) as the model holds them.
pub(crate) fn reports_from_py(reports: &Bound<'_, PyAny>) -> PyResult<Vec<SiteRetention>> {
    let list = reports.cast::<PyList>().map_err(|_| {
        crate::py::error::<PyTypeError>(format!(
            "retention reports must be a list of dicts, not {}",
            reports
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
    })?;
    let mut out = Vec::with_capacity(list.len());
    for (i, item) in list.iter().enumerate() {
        let d = item.cast::<PyDict>().map_err(|_| {
            crate::py::error::<PyTypeError>(format!("retention report {i} is not a dict"))
        })?;
        for key in d.keys() {
            let known = key
                .cast::<PyString>()
                .ok()
                .and_then(|k| k.to_str().ok().map(|k| FIELDS.contains(&k)))
                .unwrap_or(false);
            if !known {
                return Err(crate::py::error::<PyValueError>(format!(
                    "retention report {i} has an unknown field {}",
                    key.repr()?
                )));
            }
        }
        let filename = field(d, i, "filename")?;
        let filename = filename.cast::<PyString>().map_err(|_| {
            crate::py::error::<PyTypeError>(format!("retention report {i}: filename must be a str"))
        })?;
        let report = SiteRetention {
            filename: str_bytes(filename)?.into_boxed_slice(),
            lineno: uint(d, i, "lineno")?,
            count: uint(d, i, "count")?,
            unreachable: uint(d, i, "unreachable")?,
            size: uint(d, i, "size")?,
            retained: uint(d, i, "retained")?,
            paths: strs(d, i, "paths")?,
            pattern: strs(d, i, "pattern")?,
        };
        if report.unreachable > report.count {
            return Err(crate::py::error::<PyValueError>(format!(
                "retention report {i} counts {} unreachable objects of {}",
                report.unreachable, report.count
            )));
        }
        out.push(report);
    }
    Ok(out)
}

/// The reports as dicts with the [`FIELDS`], the shape `reports_from_py` takes.
pub(crate) fn reports_to_py<'py>(
    py: Python<'py>,
    reports: &[SiteRetention],
) -> PyResult<Bound<'py, PyList>> {
    let strs = |lines: &[Box<[u8]>]| -> PyResult<Bound<'py, PyList>> {
        let items = lines
            .iter()
            .map(|s| bytes_str(py, s))
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, items)
    };
    let out = PyList::empty(py);
    for r in reports {
        let d = PyDict::new(py);
        d.set_item("filename", bytes_str(py, &r.filename)?)?;
        d.set_item("lineno", r.lineno)?;
        d.set_item("count", r.count)?;
        d.set_item("unreachable", r.unreachable)?;
        d.set_item("size", r.size)?;
        d.set_item("retained", r.retained)?;
        d.set_item("paths", strs(&r.paths)?)?;
        d.set_item("pattern", strs(&r.pattern)?)?;
        out.append(d)?;
    }
    Ok(out)
}
