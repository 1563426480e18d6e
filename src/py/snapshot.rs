//! `alloctrace._native.SnapshotData`: an immutable, interned snapshot held in Rust, which the
//! Python `Snapshot` class wraps. Grouping, diffing, filtering, dump and load are methods here
//! that delegate to `crate::analysis`; this file only converts between Python objects and the
//! model, and releases the GIL around the heavy parts.
//!
//! Filenames cross the boundary as surrogatepass UTF-8, so any Python `str` (lone surrogates
//! from `surrogateescape`-decoded paths included) survives a round trip unchanged.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use pyo3::exceptions::{PyIndexError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use crate::analysis::export;
use crate::analysis::filter::{
    filename_matches, filter_snapshot, reports_of_kept_sites, FilterSet, FilterSpec,
};
use crate::analysis::format::{self, AttrValue, Attributes, MAX_ATTR_DEPTH};
use crate::analysis::sampling::MAX_INTERVAL;
use crate::analysis::snapshot::{FrameId, Snapshot, SnapshotBuilder, TracebackId};
use crate::analysis::stats::{self, GroupKey, KeyType};
use crate::error::Error;
use crate::platform::allocator;
use crate::platform::fallible;
use crate::platform::machine::{Machine, MAX_HOSTNAME_LEN, MAX_ID_LEN};
use crate::py::objects;
use crate::py::site_reports::{reports_from_py, reports_to_py};
use crate::py::strings::{bytes_str, str_bytes};
use crate::py::Checked;

#[pyclass(name = "SnapshotData", module = "alloctrace._native", frozen)]
pub struct PySnapshotData {
    pub inner: Arc<Snapshot>,
}

impl PySnapshotData {
    pub fn new(snapshot: Snapshot) -> Self {
        Self {
            inner: Arc::new(snapshot),
        }
    }
}

fn int_in<T: TryFrom<i128>>(obj: &Bound<'_, PyAny>, what: impl Fn() -> String) -> PyResult<T> {
    if !obj.is_instance_of::<PyInt>() || obj.is_instance_of::<PyBool>() {
        return Err(crate::py::error::<PyTypeError>(format!(
            "{} must be an int, not {}",
            what(),
            obj.get_type().name()?
        )));
    }
    let v: i128 = obj.extract().map_err(|_| {
        crate::py::error::<PyValueError>(format!(
            "{} is out of range: {}",
            what(),
            obj.repr().map(|r| r.to_string()).unwrap_or_default()
        ))
    })?;
    T::try_from(v)
        .map_err(|_| crate::py::error::<PyValueError>(format!("{} is out of range: {v}", what())))
}

/// Items of a tuple or list, without copying for tuples.
fn items<'py>(
    obj: &Bound<'py, PyAny>,
    what: impl Fn() -> String,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    if let Ok(t) = obj.cast::<PyTuple>() {
        return Ok(t.iter().collect());
    }
    if let Ok(l) = obj.cast::<PyList>() {
        return Ok(l.iter().collect());
    }
    Err(crate::py::error::<PyTypeError>(format!(
        "{} must be a tuple, not {}",
        what(),
        obj.get_type().name()?
    )))
}

/// Builds the model from tracemalloc's raw traces, sharing work between traces that share
/// their frames tuple (as `_get_traces()` results and pickled snapshots do).
fn snapshot_from_raw(traces: &Bound<'_, PyAny>, traceback_limit: u32) -> PyResult<Snapshot> {
    let mut b = SnapshotBuilder::new(traceback_limit);
    let mut by_tuple: HashMap<(usize, Option<u32>), TracebackId> = HashMap::new();
    let mut by_name: HashMap<usize, u32> = HashMap::new();
    let mut frame_ids: Vec<FrameId> = Vec::new();
    // The caches above are keyed by object address; holding a reference to every keyed object
    // keeps its address from being reused by a new object while the caches live (the traces
    // may come from a generator whose tuples would otherwise be freed as we go).
    let mut keep_alive: Vec<Bound<'_, PyAny>> = Vec::new();
    let iter = traces.try_iter().map_err(|_| {
        crate::py::error::<PyTypeError>(format!(
            "traces must be a sequence of trace tuples, not {}",
            traces
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
    })?;
    if let Ok(n) = traces.len() {
        b.reserve_traces(n);
    }
    for (i, trace) in iter.enumerate() {
        let trace = trace?;
        let fields = items(&trace, || format!("traces[{i}]"))?;
        if fields.len() != 3 && fields.len() != 4 {
            return Err(crate::py::error::<PyValueError>(format!(
                "traces[{i}] must be (domain, size, frames) or (domain, size, frames, \
                 total_nframe), got {} items",
                fields.len()
            )));
        }
        let domain: u32 = int_in(&fields[0], || format!("traces[{i}] domain"))?;
        let size: u64 = int_in(&fields[1], || format!("traces[{i}] size"))?;
        let total_nframe: Option<u32> = match fields.get(3) {
            None => None,
            Some(t) if t.is_none() => None,
            Some(t) => Some(int_in(t, || format!("traces[{i}] total_nframe"))?),
        };
        let frames = &fields[2];
        let key = (frames.as_ptr() as usize, total_nframe);
        let tb = match by_tuple.get(&key) {
            Some(&tb) => tb,
            None => {
                frame_ids.clear();
                for (k, frame) in items(frames, || format!("traces[{i}] frames"))?
                    .iter()
                    .enumerate()
                {
                    let pair = items(frame, || format!("traces[{i}] frame {k}"))?;
                    if pair.len() != 2 {
                        return Err(crate::py::error::<PyValueError>(format!(
                            "traces[{i}] frame {k} must be (filename, lineno), got {} items",
                            pair.len()
                        )));
                    }
                    let name = pair[0].cast::<PyString>().map_err(|_| {
                        crate::py::error::<PyTypeError>(format!(
                            "traces[{i}] frame {k}: filename must be a str, not {}",
                            pair[0]
                                .get_type()
                                .name()
                                .map(|n| n.to_string())
                                .unwrap_or_default()
                        ))
                    })?;
                    let name_id = match by_name.get(&(name.as_ptr() as usize)) {
                        Some(&id) => id,
                        None => {
                            let id = b.filename(&str_bytes(name)?);
                            by_name.insert(name.as_ptr() as usize, id);
                            keep_alive.push(name.clone().into_any());
                            id
                        }
                    };
                    let lineno: u32 = int_in(&pair[1], || format!("traces[{i}] frame {k} lineno"))?;
                    frame_ids.push(b.frame(name_id, lineno));
                }
                let tb = b.traceback(&frame_ids, total_nframe);
                by_tuple.insert(key, tb);
                keep_alive.push(frames.clone());
                tb
            }
        };
        b.trace(domain, size, tb);
    }
    drop(keep_alive);
    Ok(b.finish())
}

/// Python objects for one snapshot's tables, made once each and shared: equal tracebacks get
/// the very same frames tuple, as `tracemalloc`'s `_get_traces()` gives them.
struct PyTables<'py, 'a> {
    py: Python<'py>,
    snapshot: &'a Snapshot,
    names: Vec<Option<Bound<'py, PyString>>>,
    frames: Vec<Option<Bound<'py, PyTuple>>>,
    tracebacks: Vec<Option<Bound<'py, PyTuple>>>,
}

impl<'py, 'a> PyTables<'py, 'a> {
    fn new(py: Python<'py>, snapshot: &'a Snapshot) -> PyResult<Self> {
        Ok(Self {
            py,
            snapshot,
            names: fallible::filled(snapshot.filenames.len(), None)?,
            frames: fallible::filled(snapshot.frames.len(), None)?,
            tracebacks: fallible::filled(snapshot.tracebacks.len(), None)?,
        })
    }

    /// Tables that cache nothing, for one trace looked up by index: reserving the caches
    /// would cost a pass over every table of the snapshot per lookup.
    fn uncached(py: Python<'py>, snapshot: &'a Snapshot) -> Self {
        Self {
            py,
            snapshot,
            names: Vec::new(),
            frames: Vec::new(),
            tracebacks: Vec::new(),
        }
    }

    fn name(&mut self, id: u32) -> PyResult<Bound<'py, PyString>> {
        if let Some(Some(s)) = self.names.get(id as usize) {
            return Ok(s.clone());
        }
        let s = bytes_str(self.py, &self.snapshot.filenames[id as usize])?;
        if let Some(slot) = self.names.get_mut(id as usize) {
            *slot = Some(s.clone());
        }
        Ok(s)
    }

    /// `(filename, lineno)`, one tuple per frame id.
    fn frame(&mut self, f: FrameId) -> PyResult<Bound<'py, PyTuple>> {
        if let Some(Some(t)) = self.frames.get(f as usize) {
            return Ok(t.clone());
        }
        let fr = self.snapshot.frames[f as usize];
        let name = self.name(fr.filename)?;
        let t = objects::tuple(
            self.py,
            &[name.into_any(), objects::uint(self.py, fr.lineno.into())?],
        )?;
        if let Some(slot) = self.frames.get_mut(f as usize) {
            *slot = Some(t.clone());
        }
        Ok(t)
    }

    /// A group key as the frames tuple a `Traceback` stores: oldest first.
    fn key(&mut self, key: GroupKey) -> PyResult<Bound<'py, PyTuple>> {
        let py = self.py;
        match key {
            GroupKey::Traceback(t) => {
                let snapshot = self.snapshot;
                let ids = &snapshot.tracebacks[t as usize].frames;
                let mut out = fallible::with_capacity(ids.len())?;
                for &f in ids.iter().rev() {
                    out.push(self.frame(f)?.into_any());
                }
                objects::tuple(py, &out)
            }
            GroupKey::Frame(f) | GroupKey::LineKind(Some(f), _) => {
                objects::tuple(py, &[self.frame(f)?.into_any()])
            }
            GroupKey::Filename(n) => {
                let frame = objects::tuple(py, &[self.name(n)?.into_any(), objects::uint(py, 0)?])?;
                objects::tuple(py, &[frame.into_any()])
            }
            GroupKey::Empty | GroupKey::Kind(_) | GroupKey::LineKind(None, _) => {
                objects::tuple(py, &[])
            }
        }
    }

    /// The kind name a key groups by (`None` for the tracemalloc keys).
    fn kind(&self, key: GroupKey) -> PyResult<Option<Bound<'py, PyString>>> {
        stats::key_kind(self.snapshot, key)
            .map(|name| bytes_str(self.py, name))
            .transpose()
    }

    fn frames(&mut self, tb: TracebackId) -> PyResult<Bound<'py, PyTuple>> {
        if let Some(Some(t)) = self.tracebacks.get(tb as usize) {
            return Ok(t.clone());
        }
        let snapshot = self.snapshot;
        let mut out = fallible::with_capacity(snapshot.tracebacks[tb as usize].frames.len())?;
        for &f in snapshot.tracebacks[tb as usize].frames.iter() {
            out.push(self.frame(f)?.into_any());
        }
        let t = objects::tuple(self.py, &out)?;
        if let Some(slot) = self.tracebacks.get_mut(tb as usize) {
            *slot = Some(t.clone());
        }
        Ok(t)
    }

    fn trace(&mut self, i: usize) -> PyResult<Bound<'py, PyTuple>> {
        let tr = self.snapshot.traces[i];
        let domain = self.snapshot.domains.get(i);
        let frames = self.frames(tr.traceback)?.into_any();
        let py = self.py;
        let domain = objects::uint(py, domain.into())?;
        let size = objects::uint(py, tr.size as u128)?;
        match self.snapshot.tracebacks[tr.traceback as usize].total_nframe {
            Some(n) => objects::tuple(py, &[domain, size, frames, objects::uint(py, n.into())?]),
            None => objects::tuple(py, &[domain, size, frames]),
        }
    }
}

fn key_type(key_type: &Bound<'_, PyAny>, cumulative: bool) -> PyResult<KeyType> {
    match key_type.cast::<PyString>() {
        Ok(s) => Ok(KeyType::parse(s.to_str()?, cumulative)?),
        Err(_) => Err(crate::py::error::<PyValueError>(format!(
            "unknown key_type: {}",
            key_type.repr()?
        ))),
    }
}

pub(crate) fn spec_from_tuple(obj: &Bound<'_, PyAny>, i: usize) -> PyResult<FilterSpec> {
    let fields = items(obj, || format!("filter spec {i}"))?;
    let kind: String = fields
        .first()
        .ok_or_else(|| crate::py::error::<PyValueError>(format!("filter spec {i} is empty")))?
        .extract()?;
    let bool_at = |k: usize| -> PyResult<bool> { fields[k].is_truthy() };
    let opt_u32 = |k: usize, what: &str| -> PyResult<Option<u32>> {
        if fields[k].is_none() {
            Ok(None)
        } else {
            int_in(&fields[k], || format!("filter {i} {what}")).map(Some)
        }
    };
    match (kind.as_str(), fields.len()) {
        ("filename", 6) => Ok(FilterSpec::Filename {
            inclusive: bool_at(1)?,
            pattern: str_bytes(fields[2].cast::<PyString>().map_err(|_| {
                crate::py::error::<PyTypeError>(format!(
                    "filter {i}: filename_pattern must be a str"
                ))
            })?)?,
            lineno: opt_u32(3, "lineno")?,
            all_frames: bool_at(4)?,
            domain: opt_u32(5, "domain")?,
        }),
        ("domain", 3) => Ok(FilterSpec::Domain {
            inclusive: bool_at(1)?,
            domain: int_in(&fields[2], || format!("filter {i} domain"))?,
        }),
        _ => Err(crate::py::error::<PyValueError>(format!(
            "filter spec {i} must be ('filename', inclusive, pattern, lineno, all_frames, \
             domain) or ('domain', inclusive, domain)"
        ))),
    }
}

/// User attributes for a file: names must be str, values plain (see `attr_from_py`).
fn attributes_from_py(attributes: &Bound<'_, PyDict>) -> PyResult<Attributes> {
    let mut attrs: Attributes = Vec::with_capacity(attributes.len());
    for (k, v) in attributes.iter() {
        let name = k
            .cast::<PyString>()
            .map_err(|_| crate::py::error::<PyTypeError>("snapshot attribute names must be str"))?;
        let label = name.to_string_lossy().into_owned();
        let name = str_bytes(name)?;
        let value = attr_from_py(&v, &label, 0)?;
        attrs.push((name, value));
    }
    Ok(attrs)
}

fn attr_from_py(obj: &Bound<'_, PyAny>, name: &str, depth: usize) -> PyResult<AttrValue> {
    if depth > MAX_ATTR_DEPTH {
        return Err(crate::py::error::<PyTypeError>(format!(
            "cannot store snapshot attribute '{name}': its value nests deeper than \
             {MAX_ATTR_DEPTH} levels"
        )));
    }
    let py = obj.py();
    if obj.is_none() {
        return Ok(AttrValue::None);
    }
    if obj.is_exact_instance_of::<PyBool>() {
        return Ok(AttrValue::Bool(obj.is_truthy()?));
    }
    if obj.is_exact_instance_of::<PyInt>() {
        if let Ok(v) = obj.extract::<i64>() {
            return Ok(AttrValue::Int(v));
        }
        let bits: usize = obj.call_method0("bit_length")?.extract()?;
        let len = bits / 8 + 1;
        let kwargs = PyDict::new(py);
        kwargs.set_item("signed", true)?;
        let b = obj.call_method("to_bytes", (len, "little"), Some(&kwargs))?;
        return Ok(AttrValue::BigInt(b.cast::<PyBytes>()?.as_bytes().to_vec()));
    }
    if obj.is_exact_instance_of::<PyFloat>() {
        return Ok(AttrValue::Float(obj.extract()?));
    }
    if let Ok(s) = obj.cast_exact::<PyString>() {
        return Ok(AttrValue::Str(str_bytes(s)?));
    }
    if let Ok(b) = obj.cast_exact::<PyBytes>() {
        return Ok(AttrValue::Bytes(b.as_bytes().to_vec()));
    }
    if let Ok(l) = obj.cast_exact::<PyList>() {
        let v: PyResult<Vec<_>> = l
            .iter()
            .map(|x| attr_from_py(&x, name, depth + 1))
            .collect();
        return Ok(AttrValue::List(v?));
    }
    if let Ok(t) = obj.cast_exact::<PyTuple>() {
        let v: PyResult<Vec<_>> = t
            .iter()
            .map(|x| attr_from_py(&x, name, depth + 1))
            .collect();
        return Ok(AttrValue::Tuple(v?));
    }
    if let Ok(d) = obj.cast_exact::<PyDict>() {
        let mut out = Vec::with_capacity(d.len());
        for (k, v) in d.iter() {
            let k = k.cast_exact::<PyString>().map_err(|_| {
                crate::py::error::<PyTypeError>(format!(
                    "cannot store snapshot attribute '{name}': dict keys must be str, not {}",
                    k.get_type()
                        .name()
                        .map(|n| n.to_string())
                        .unwrap_or_default()
                ))
            })?;
            out.push((str_bytes(k)?, attr_from_py(&v, name, depth + 1)?));
        }
        return Ok(AttrValue::Dict(out));
    }
    Err(crate::py::error::<PyTypeError>(format!(
        "cannot store snapshot attribute '{name}': values of type {} are not supported \
         (supported: None, bool, int, float, str, bytes, and list, tuple or str-keyed dict of \
         those)",
        obj.get_type().name()?
    )))
}

fn attr_to_py<'py>(py: Python<'py>, v: &AttrValue) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        AttrValue::None => py.None().into_bound(py),
        AttrValue::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        AttrValue::Int(i) => i.into_pyobject(py)?.into_any(),
        AttrValue::BigInt(b) => {
            let kwargs = PyDict::new(py);
            kwargs.set_item("signed", true)?;
            py.get_type::<PyInt>().call_method(
                "from_bytes",
                (PyBytes::new(py, b), "little"),
                Some(&kwargs),
            )?
        }
        AttrValue::Float(f) => f.into_pyobject(py)?.into_any(),
        AttrValue::Str(s) => bytes_str(py, s)?.into_any(),
        AttrValue::Bytes(b) => PyBytes::new(py, b).into_any(),
        AttrValue::List(items) => {
            let v: PyResult<Vec<_>> = items.iter().map(|x| attr_to_py(py, x)).collect();
            PyList::new(py, v?)?.into_any()
        }
        AttrValue::Tuple(items) => {
            let v: PyResult<Vec<_>> = items.iter().map(|x| attr_to_py(py, x)).collect();
            PyTuple::new(py, v?)?.into_any()
        }
        AttrValue::Dict(items) => {
            let d = PyDict::new(py);
            for (k, x) in items {
                d.set_item(bytes_str(py, k)?, attr_to_py(py, x)?)?;
            }
            d.into_any()
        }
    })
}

/// Whether two snapshots hold the same traces in the same order, by content.
fn same_traces<'s>(a: &'s Snapshot, b: &'s Snapshot) -> bool {
    if a.traces.len() != b.traces.len() {
        return false;
    }
    // Give every distinct traceback content of both snapshots one shared id.
    let mut ids: HashMap<TracebackContent<'s>, u32> = HashMap::new();
    let ca = canonical_ids(a, &mut ids);
    let cb = canonical_ids(b, &mut ids);
    a.domains == b.domains
        && a.traces
            .iter()
            .zip(&b.traces)
            .all(|(x, y)| x.size == y.size && ca[x.traceback as usize] == cb[y.traceback as usize])
}

type TracebackContent<'s> = (Vec<(&'s [u8], u32)>, Option<u32>);

fn canonical_ids<'s>(s: &'s Snapshot, ids: &mut HashMap<TracebackContent<'s>, u32>) -> Vec<u32> {
    s.tracebacks
        .iter()
        .map(|tb| {
            let frames = tb
                .frames
                .iter()
                .map(|&f| {
                    let fr = s.frames[f as usize];
                    (&s.filenames[fr.filename as usize][..], fr.lineno)
                })
                .collect();
            let next = ids.len() as u32;
            *ids.entry((frames, tb.total_nframe)).or_insert(next)
        })
        .collect()
}

#[pymethods]
impl PySnapshotData {
    /// Builds a snapshot from `tracemalloc`-style raw traces: an iterable of
    /// `(domain, size, frames[, total_nframe])` with frames most recent first.
    /// With `sample_interval` (bytes), the traces are samples taken at that interval.
    /// With `machine` (`(id, hostname)`), the snapshot says it was taken on that machine (a
    /// merge of snapshots of one machine keeps it).
    #[staticmethod]
    #[pyo3(signature = (traces, traceback_limit, sample_interval=None, machine=None))]
    fn from_raw(
        traces: &Bound<'_, PyAny>,
        traceback_limit: &Bound<'_, PyAny>,
        sample_interval: Option<&Bound<'_, PyAny>>,
        machine: Option<(String, String)>,
    ) -> PyResult<Self> {
        let limit: u32 = int_in(traceback_limit, || "traceback_limit".to_string())?;
        let interval = match sample_interval.filter(|i| !i.is_none()) {
            None => None,
            Some(i) => {
                let interval: u64 = int_in(i, || "sample_interval".to_string())?;
                if interval == 0 || interval > MAX_INTERVAL {
                    return Err(crate::py::error::<PyValueError>(format!(
                        "sample_interval must be None or in range [1; {MAX_INTERVAL}], got \
                         {interval}"
                    )));
                }
                Some(interval)
            }
        };
        let mut snapshot = snapshot_from_raw(traces, limit)?;
        snapshot.sample_interval = interval;
        if let Some((id, hostname)) = machine {
            if id.len() > MAX_ID_LEN
                || hostname.len() > MAX_HOSTNAME_LEN
                || (id.clone() + &hostname).contains('\0')
            {
                return Err(crate::py::error::<PyValueError>(format!(
                    "machine must be (id, hostname) of at most {MAX_ID_LEN} and \
                     {MAX_HOSTNAME_LEN} bytes without NUL"
                )));
            }
            snapshot.metadata.machine = Some(Machine { id, hostname });
        }
        Ok(Self::new(snapshot))
    }

    /// One snapshot of the traces of all `snapshots`, with the function names they
    /// recorded (see `analysis::snapshot::merged`); the caller checks that they share their
    /// limit and kind, and that none is a peak snapshot.
    #[staticmethod]
    #[pyo3(signature = (snapshots, traceback_limit, sample_interval=None))]
    fn merge(
        py: Python<'_>,
        snapshots: Vec<PyRef<'_, PySnapshotData>>,
        traceback_limit: u32,
        sample_interval: Option<u64>,
    ) -> PyResult<Self> {
        let inner: Vec<Arc<Snapshot>> = snapshots.iter().map(|s| s.inner.clone()).collect();
        let merged = py.detach(|| {
            let refs: Vec<&Snapshot> = inner.iter().map(|s| &**s).collect();
            crate::analysis::snapshot::merged(&refs, traceback_limit, sample_interval)
        })?;
        Ok(Self::new(merged))
    }

    /// Whether the snapshot records object kinds (taken with `objects=True`).
    #[getter]
    fn has_objects(&self) -> bool {
        self.inner.kinds.is_some()
    }

    /// Whether the snapshot holds retention reports.
    #[getter]
    fn has_retention(&self) -> bool {
        self.inner.retention.is_some()
    }

    /// The retention reports as a list of dicts (see `alloctrace._retention.capture_sites`),
    /// or `None` if none were captured.
    #[getter]
    fn retention<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyList>>> {
        self.inner
            .retention
            .as_deref()
            .map(|r| reports_to_py(py, r))
            .transpose()
    }

    /// A copy of the snapshot holding `reports` (a list of report dicts; `None` for none).
    /// Each report's shape is checked here, so a malformed one never reaches a file.
    fn with_retention(&self, py: Python<'_>, reports: &Bound<'_, PyAny>) -> PyResult<Self> {
        let reports = if reports.is_none() {
            None
        } else {
            Some(reports_from_py(reports)?)
        };
        let snap: &Snapshot = &self.inner;
        Ok(Self::new(py.detach(|| Snapshot {
            retention: reports,
            ..snap.clone()
        })))
    }

    /// A copy of this snapshot with the reports of `source` for the sites it still shows:
    /// what a filter keeps, for a snapshot `source` was filtered into (see
    /// [`reports_of_kept_sites`]).
    fn with_retention_of(&self, py: Python<'_>, source: &PySnapshotData) -> PyResult<Self> {
        let snap: &Snapshot = &self.inner;
        let Some(reports) = source.inner.retention.as_deref() else {
            return Ok(Self {
                inner: self.inner.clone(),
            });
        };
        Ok(Self::new(py.detach(|| {
            let keep = vec![true; snap.traces.len()];
            Snapshot {
                retention: Some(reports_of_kept_sites(snap, reports, &keep)),
                ..snap.clone()
            }
        })))
    }

    #[getter]
    fn traceback_limit(&self) -> Checked<u32> {
        Checked(self.inner.traceback_limit)
    }

    /// `(rss, anon, file, shmem, peak_rss)` in bytes when the snapshot was taken; None when
    /// not recorded.
    #[getter]
    fn process_memory(&self) -> Checked<Option<crate::py::MemoryFigures>> {
        Checked(
            self.inner
                .metadata
                .process_memory
                .map(|pm| (pm.rss, pm.anon, pm.file, pm.shmem, pm.peak_rss)),
        )
    }

    /// `(id, hostname)` of the machine the snapshot was taken on (the id app-specific and
    /// hashed, see `crate::platform::machine`); None when not recorded.
    #[getter]
    fn machine(&self) -> Checked<Option<(String, String)>> {
        Checked(
            self.inner
                .metadata
                .machine
                .as_ref()
                .map(|m| (m.id.clone(), m.hostname.clone())),
        )
    }

    /// This machine's `(id, hostname)` as snapshots taken here record it, or None.
    #[staticmethod]
    fn this_machine() -> Checked<Option<(String, String)>> {
        Checked(crate::platform::machine::current().map(|m| (m.id, m.hostname)))
    }

    /// The sampling interval in bytes of a sampled snapshot, None for an exact one.
    #[getter]
    fn sample_interval(&self) -> Checked<Option<u64>> {
        Checked(self.inner.sample_interval)
    }

    /// `{"python_version": (3, 11, 7) | None, "timestamp": float | None, "pid": int | None,
    /// "argv": [str, ...]}`, a new dict each time.
    #[getter]
    fn metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let md = &self.inner.metadata;
        crate::py::checked_dict(
            py,
            &[
                ("python_version", &md.python_version),
                ("timestamp", &md.timestamp),
                ("pid", &md.pid),
                ("argv", &md.argv),
            ],
        )
    }

    fn __len__(&self) -> usize {
        self.inner.traces.len()
    }

    /// True for a peak snapshot: one trace per traceback, each the total of its blocks.
    #[getter]
    fn is_peak(&self) -> bool {
        self.inner.blocks.is_some()
    }

    /// The peak stored with this snapshot (a dump's), or None.
    #[getter]
    fn peak(&self) -> Option<Self> {
        self.inner
            .peak
            .as_ref()
            .map(|peak| Self::new((**peak).clone()))
    }

    /// A copy of this snapshot carrying `peak` (a peak snapshot) for `dump`.
    fn with_peak(&self, py: Python<'_>, peak: &PySnapshotData) -> PyResult<Self> {
        if self.inner.blocks.is_some() {
            return Err(crate::py::error::<PyValueError>(
                "a peak snapshot cannot carry another peak",
            ));
        }
        if peak.inner.blocks.is_none() {
            return Err(crate::py::error::<PyValueError>(
                "peak must be a peak snapshot (take_snapshot(peak=True))",
            ));
        }
        let (snap, peak): (&Snapshot, &Snapshot) = (&self.inner, &peak.inner);
        Ok(Self::new(py.detach(|| Snapshot {
            peak: Some(Box::new(peak.clone())),
            ..snap.clone()
        })))
    }

    /// Raw tuple of trace `index` (negative indexes count from the end).
    fn trace<'py>(&self, py: Python<'py>, index: isize) -> PyResult<Bound<'py, PyTuple>> {
        let n = self.inner.traces.len() as isize;
        let i = if index < 0 { index + n } else { index };
        if i < 0 || i >= n {
            return Err(crate::py::error::<PyIndexError>("trace index out of range"));
        }
        allocator::guarded(|| PyTables::uncached(py, &self.inner).trace(i as usize))
    }

    /// All raw traces as a new list; traces with the same traceback share one frames tuple.
    fn raw_traces<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        allocator::guarded(|| {
            let mut tables = PyTables::new(py, &self.inner)?;
            let mut out = fallible::with_capacity(self.inner.traces.len())?;
            for i in 0..self.inner.traces.len() {
                out.push(tables.trace(i)?.into_any());
            }
            objects::list(py, &out)
        })
    }

    /// Sorted `[(frames, size, count), ...]`, frames OLDEST first (as `Traceback` stores
    /// them, unlike raw traces).
    #[pyo3(signature = (key_type, cumulative=false))]
    fn statistics<'py>(
        &self,
        py: Python<'py>,
        key_type: &Bound<'py, PyAny>,
        cumulative: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        allocator::guarded(|| {
            let key = self::key_type(key_type, cumulative)?;
            let snap: &Snapshot = &self.inner;
            key.check(snap)?;
            let rows = py.detach(|| stats::statistics(snap, key, cumulative))?;
            let mut tables = PyTables::new(py, snap)?;
            let mut out = fallible::with_capacity(rows.len())?;
            for r in &rows {
                let mut row = vec![
                    tables.key(r.key)?.into_any(),
                    objects::uint(py, r.size)?,
                    objects::uint(py, r.count as u128)?,
                ];
                if key.uses_kinds() {
                    row.push(tables.kind(r.key)?.into_pyobject(py)?.into_any());
                }
                out.push(objects::tuple(py, &row)?.into_any());
            }
            objects::list(py, &out)
        })
    }

    /// Sorted `[(frames, size, size_diff, count, count_diff), ...]` of self against `old`,
    /// frames oldest first.
    #[pyo3(signature = (old, key_type, cumulative=false))]
    fn compare_to<'py>(
        &self,
        py: Python<'py>,
        old: &PySnapshotData,
        key_type: &Bound<'py, PyAny>,
        cumulative: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        allocator::guarded(|| {
            let key = self::key_type(key_type, cumulative)?;
            let (new_s, old_s): (&Snapshot, &Snapshot) = (&self.inner, &old.inner);
            key.check(new_s)?;
            key.check(old_s)?;
            let rows = py.detach(|| stats::compare(new_s, old_s, key, cumulative))?;
            let mut new_tables = PyTables::new(py, new_s)?;
            let mut old_tables = PyTables::new(py, old_s)?;
            let mut out = fallible::with_capacity(rows.len())?;
            for r in &rows {
                let tables = if r.in_new {
                    &mut new_tables
                } else {
                    &mut old_tables
                };
                let mut row = vec![
                    tables.key(r.key)?.into_any(),
                    objects::uint(py, r.size)?,
                    objects::int(py, r.size_diff)?,
                    objects::uint(py, r.count as u128)?,
                    objects::int(py, r.count_diff as i128)?,
                ];
                if key.uses_kinds() {
                    row.push(tables.kind(r.key)?.into_pyobject(py)?.into_any());
                }
                out.push(objects::tuple(py, &row)?.into_any());
            }
            objects::list(py, &out)
        })
    }

    /// A new snapshot with the traces the filters keep. `specs` is a sequence of
    /// `("filename", inclusive, pattern, lineno, all_frames, domain)` and
    /// `("domain", inclusive, domain)` tuples.
    fn filter(&self, py: Python<'_>, specs: &Bound<'_, PyAny>) -> PyResult<Self> {
        allocator::guarded(|| {
            let specs: Vec<FilterSpec> = specs
                .try_iter()?
                .enumerate()
                .map(|(i, s)| spec_from_tuple(&s?, i))
                .collect::<PyResult<_>>()?;
            let set = FilterSet::new(&specs)?;
            let snap: &Snapshot = &self.inner;
            Ok(Self::new(py.detach(|| filter_snapshot(snap, &set))?))
        })
    }

    /// Writes the snapshot and `attributes` (a dict of plain values) to `path` atomically.
    fn dump(&self, py: Python<'_>, path: PathBuf, attributes: &Bound<'_, PyDict>) -> PyResult<()> {
        allocator::guarded(|| {
            let attrs = attributes_from_py(attributes)?;
            let snap: &Snapshot = &self.inner;
            py.detach(|| format::dump(&path, snap, &attrs))?;
            Ok(())
        })
    }

    /// The bytes `dump` would write, without attributes: pickling carries everything a file
    /// does (peak, process memory, metadata, object kinds, retention) by carrying the file.
    fn dumps<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        allocator::guarded(|| {
            let snap: &Snapshot = &self.inner;
            let data = py.detach(|| format::encode(snap, &Vec::new()))?;
            objects::bytes(py, &data)
        })
    }

    /// Decodes the bytes of `dumps` (a whole snapshot file's); errors name `source`.
    #[staticmethod]
    fn loads(py: Python<'_>, data: &[u8], source: PathBuf) -> PyResult<Self> {
        allocator::guarded(|| {
            let (snapshot, _) = py
                .detach(|| format::decode(data))
                .map_err(|reason| reason.at(&source))?;
            Ok(Self::new(snapshot))
        })
    }

    /// Writes a gzipped pprof heap profile to `path` atomically.
    fn to_pprof(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        allocator::guarded(|| {
            let snap: &Snapshot = &self.inner;
            py.detach(|| format::write_atomic(&path, &export::pprof(snap)?))?;
            Ok(())
        })
    }

    /// The pprof profile of the span starting at `time_nanos` and lasting `duration_nanos`,
    /// gzipped if `compress`: what a profile pusher sends (built without the GIL). With
    /// `allocated` (an aggregate snapshot of what was allocated in the span), the profile
    /// also carries `alloc_objects`/`alloc_space`.
    #[pyo3(signature = (time_nanos, duration_nanos, compress, allocated=None))]
    fn pprof_span<'py>(
        &self,
        py: Python<'py>,
        time_nanos: i64,
        duration_nanos: i64,
        compress: bool,
        allocated: Option<&PySnapshotData>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        allocator::guarded(|| {
            let snap: &Snapshot = &self.inner;
            let allocated: Option<&Snapshot> = allocated.map(|a| &*a.inner);
            let data = py.detach(|| {
                export::pprof_span(snap, allocated, time_nanos, duration_nanos, compress)
            })?;
            objects::bytes(py, &data)
        })
    }

    /// Writes folded stacks (`root;...;leaf bytes` lines) to `path` atomically.
    fn to_collapsed(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        allocator::guarded(|| {
            let snap: &Snapshot = &self.inner;
            py.detach(|| format::write_atomic(&path, export::collapsed(snap)?.as_bytes()))?;
            Ok(())
        })
    }

    /// Writes an SVG flamegraph to `path` atomically; differential against `base` if given.
    #[pyo3(signature = (path, base=None, title=None))]
    fn to_flamegraph(
        &self,
        py: Python<'_>,
        path: PathBuf,
        base: Option<&PySnapshotData>,
        title: Option<String>,
    ) -> PyResult<()> {
        allocator::guarded(|| {
            let snap: &Snapshot = &self.inner;
            let base: Option<&Snapshot> = base.map(|b| &*b.inner);
            py.detach(|| {
                let svg = export::flamegraph(snap, base, title.as_deref())?;
                format::write_atomic(&path, &svg)
            })?;
            Ok(())
        })
    }

    /// The flamegraph tree of live memory cut to `budget` nodes, for the HTML report:
    /// `(frames, nodes)`, `frames` a list of `(filename, lineno, function or None)` (or `None`
    /// for stacks without frames), `nodes` flat `[frame index or -1 for the root, bytes,
    /// depth, ...]` depth-first. Built in Rust from the distinct tracebacks, so the report's
    /// cost follows them and not the traces.
    fn flame<'py>(
        &self,
        py: Python<'py>,
        budget: usize,
    ) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyList>)> {
        allocator::guarded(|| {
            let snap: &Snapshot = &self.inner;
            let flame = py.detach(|| export::flame(snap, budget))?;
            let mut tables = PyTables::new(py, snap)?;
            let mut frames = Vec::new();
            for frame in &flame.frames {
                frames.push(match frame {
                    None => py.None().into_bound(py),
                    Some((f, function)) => {
                        let fr = snap.frames[*f as usize];
                        let function = match function {
                            Some(id) => {
                                bytes_str(py, &snap.functions[*id as usize].name)?.into_any()
                            }
                            None => py.None().into_bound(py),
                        };
                        let name = tables.name(fr.filename)?.into_any();
                        let lineno = objects::uint(py, fr.lineno.into())?;
                        objects::tuple(py, &[name, lineno, function])?.into_any()
                    }
                });
            }
            let mut nodes = Vec::new();
            for &(index, bytes, depth) in &flame.nodes {
                let index = match index {
                    Some(i) => objects::uint(py, i.into())?,
                    None => (-1i64).into_pyobject(py)?.into_any(),
                };
                nodes.push(index);
                nodes.push(objects::uint(py, bytes.into())?);
                nodes.push(objects::uint(py, depth.into())?);
            }
            Ok((objects::list(py, &frames)?, objects::list(py, &nodes)?))
        })
    }

    /// Reads a snapshot file: `(SnapshotData, attributes dict)`.
    #[staticmethod]
    fn load<'py>(
        py: Python<'py>,
        path: &Bound<'py, PyAny>,
    ) -> PyResult<Checked<(Py<PyAny>, Py<PyAny>)>> {
        let path = crate::py::path_arg(path)?;
        allocator::guarded(|| {
            // The read runs without the GIL; between chunks it takes the GIL back to run pending
            // signal handlers, and stops with the exception one raises (Ctrl-C).
            let mut raised: Option<PyErr> = None;
            let loaded = py.detach(|| {
                format::load_interruptible(&path, &mut || {
                    Python::attach(|py| py.check_signals()).map_err(|err| {
                        raised = Some(err);
                        Error::Interrupted
                    })
                })
            });
            if let Some(err) = raised {
                return Err(err);
            }
            let (snapshot, attrs) = loaded?;
            // The dict and the pair are made with checked calls (see `Checked`).
            let d = crate::py::checked_dict(py, &[])?;
            for (k, v) in &attrs {
                d.set_item(bytes_str(py, k)?, attr_to_py(py, v)?)?;
            }
            let data = Py::new(py, Self::new(snapshot))?.into_any();
            Ok(Checked((data, d.unbind())))
        })
    }

    /// True if both hold the same traces in the same order (tables may be interned
    /// differently).
    fn traces_equal(&self, py: Python<'_>, other: &PySnapshotData) -> bool {
        let (a, b): (&Snapshot, &Snapshot) = (&self.inner, &other.inner);
        py.detach(|| same_traces(a, b))
    }

    fn __eq__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> bool {
        match other.cast::<PySnapshotData>() {
            Ok(o) => {
                let o = o.get();
                self.inner.traceback_limit == o.inner.traceback_limit
                    && self.inner.sample_interval == o.inner.sample_interval
                    && self.inner.blocks == o.inner.blocks
                    && self.traces_equal(py, o)
            }
            Err(_) => false,
        }
    }

    fn __repr__(&self) -> Checked<String> {
        Checked(format!(
            "<SnapshotData traces={} tracebacks={} traceback_limit={}>",
            self.inner.traces.len(),
            self.inner.tracebacks.len(),
            self.inner.traceback_limit
        ))
    }
}

/// `fnmatch_filename(filename, pattern)`: the filename test of `Filter._match_frame`, done
/// by the same matcher `SnapshotData.filter` uses, so Python-side checks cannot disagree.
#[pyfunction]
fn fnmatch_filename(
    filename: &Bound<'_, PyString>,
    pattern: &Bound<'_, PyString>,
) -> PyResult<bool> {
    Ok(filename_matches(
        &str_bytes(pattern)?,
        &str_bytes(filename)?,
    )?)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySnapshotData>()?;
    m.add_function(wrap_pyfunction!(fnmatch_filename, m)?)
}
