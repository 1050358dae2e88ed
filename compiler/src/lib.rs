//! svc-compile's compiler: source files, diagnostics, the front end, the IR and the passes.
//!
//! Architecture Invariant: nothing in this crate touches the file system, runs a process
//! or reads the environment. Inputs arrive as a [`source::SourceMap`]; outputs are data.

pub mod decode;
pub mod diag;
pub mod ir;
pub mod k8s;
pub mod net;
pub mod passes;
pub mod source;
pub mod tree;
