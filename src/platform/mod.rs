//! Platform helpers: the process and the operating system, with no tracer state. Nothing here (its
//! tests aside) imports another layer, so the hooks, the snapshot code and the analysis may all use
//! them.

pub mod allocator;
pub mod bootstrap_page;
pub mod fallible;
pub mod machine;
pub mod nopark;
pub mod process_memory;
pub mod request_count;
pub mod signal_disposition;
pub mod sigterm_retry;
