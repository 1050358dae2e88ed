//! svc-node: everything svc-compile does to a node. The binary compiles and prints; this
//! crate runs the tools a plan names, keeps the state directory, talks netlink and bpf(2),
//! and carries out `apply`, `drift` and `cleanup`.
//!
//! Architecture Invariant: this is the only crate of the workspace that touches a node
//! (processes, network namespaces, nf_tables, BPF objects, the state directory) and the
//! only one that depends on `libc` and `aya`. It decides nothing a planner
//! (`svc_targets::plan`, `svc_targets::ebpf::plan`) decides: it reads, runs and records.
//! Arrows: `svc-compile` → `svc-node` → `svc-targets` → `svc-compiler`, nothing back.

pub mod agent;
pub mod apply;
pub mod cleanup;
mod conntrack;
pub mod drift;
pub mod ebpf;
mod netns;
mod nfgen;
mod nfnl;
mod nftdigest;
mod proc;
mod rules;
pub mod serve;
mod state;
mod sysctl;
pub mod times;

/// A failure that is not the input's (exit 2): one line that says what to do.
#[derive(Debug)]
pub struct Fail(pub String);

/// The system interfaces this crate is built on, for the kernel tests' own loaders and
/// namespaces (so that no other crate depends on them directly).
pub mod sys {
    pub use aya;
    pub use libc;
}
