//! The crate's one error type, converted to a Python exception once, at the pyo3 boundary.
//!
//! Every variant carries what the user needs to fix the problem: the bad value, the file and
//! what was wrong with it. Python sees `ValueError`, `TypeError`, `RuntimeError`, `OSError`,
//! `MemoryError` or `alloctrace.SnapshotFormatError` (a `ValueError` subclass).

use std::fmt;
use std::path::PathBuf;

#[derive(Debug)]
pub enum Error {
    /// An argument out of range or of the wrong form (`ValueError`).
    InvalidArgument(String),
    /// An argument of the wrong type (`TypeError`).
    WrongType(String),
    /// The call does not fit the tracer's state (`RuntimeError`).
    State(String),
    /// A file that is not a readable snapshot (`SnapshotFormatError`).
    Format { path: PathBuf, reason: String },
    /// Memory for a result could not be had (`MemoryError`, as `tracemalloc` raises): paths
    /// whose memory grows with the data reserve it fallibly rather than abort the process.
    OutOfMemory,
    /// A long operation gave up because a signal handler raised (Ctrl-C's
    /// `KeyboardInterrupt`); the pyo3 layer re-raises the handler's own exception.
    Interrupted,
    /// The operating system refused (`OSError`, with errno kept).
    Io {
        path: PathBuf,
        action: &'static str,
        source: std::io::Error,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument(msg) | Error::WrongType(msg) | Error::State(msg) => {
                f.write_str(msg)
            }
            Error::OutOfMemory => f.write_str("out of memory"),
            Error::Interrupted => f.write_str("interrupted by a signal"),
            Error::Format { path, reason } => {
                write!(
                    f,
                    "{} is not a readable alloctrace snapshot: {reason}",
                    path.display()
                )
            }
            Error::Io {
                path,
                action,
                source,
            } => write!(f, "cannot {action} {}: {source}", path.display()),
        }
    }
}

impl std::error::Error for Error {}

impl From<std::collections::TryReserveError> for Error {
    fn from(_: std::collections::TryReserveError) -> Self {
        Error::OutOfMemory
    }
}

impl From<hashbrown::TryReserveError> for Error {
    fn from(_: hashbrown::TryReserveError) -> Self {
        Error::OutOfMemory
    }
}
