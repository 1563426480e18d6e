//! The live object graph: what the traced blocks are (object kinds) and why they are alive
//! (retention paths, retained sizes). The walk over the interpreter's objects fills a
//! [`graph::HeapGraph`]; the analyses over it are plain Rust.

pub mod graph;
pub mod kinds;
pub mod paths;
pub mod retention;
pub mod walk;
