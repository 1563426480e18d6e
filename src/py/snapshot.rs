//! `alloctrace._native.SnapshotData`: an immutable, interned snapshot held in Rust, which the
//! Python `Snapshot` class wraps. Grouping, diffing, filtering, dump and load are methods here
//! that delegate to `crate::analysis`.

use std::sync::Arc;

use pyo3::prelude::*;

use crate::analysis::snapshot::Snapshot;

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

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySnapshotData>()
}
