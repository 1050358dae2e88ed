//! svc-compile back ends. Each module has the same small face: an `Options` struct and a
//! `write_string` that turns IR into text; `plan` turns a compiled document and the kernel's
//! current state (as text) into what `svc-compile apply` loads. Nothing here does I/O.
//!
//! Architecture Invariant: targets read `ir::Module` / `ir::NodeView` and never recompute a
//! decision a pass recorded there.

pub mod common;
pub mod iptables;
pub mod ir;
pub mod nftables;
pub mod plan;
