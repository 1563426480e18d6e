//! Snapshot analysis: the interned snapshot model, grouping and diffing, filters and the file
//! format. Plain Rust with no interpreter in sight, so every rule here is unit-tested directly;
//! the pyo3 layer (`crate::py`) only converts to and from Python objects.

pub mod export;
pub mod filter;
pub mod format;
pub mod parallel;
pub mod sampling;
pub mod snapshot;
pub mod stats;
