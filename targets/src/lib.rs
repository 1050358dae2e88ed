//! svc-compile back ends. Each target is one module with the same small face: an
//! `Options` struct, a `write_string` that turns IR into text, and a [`Target`] constant
//! that describes it to the CLI (see [`registry`]); `plan` turns a compiled document and
//! the kernel's current state (as text) into what `svc-compile apply` loads. Nothing here
//! does I/O.
//!
//! Architecture Invariant: targets read `ir::Module` / `ir::NodeView` and never recompute a
//! decision a pass recorded there.

pub mod common;
pub mod health;
pub mod plan;
pub mod registry;

pub use registry::{File, Flag, NodeRenderer, Params, Render, RenderError, Sharing, Target};

// The targets: a module each, and one line each in `TARGETS`, in `--help` order.
pub mod dns;
pub mod drift;
pub mod ebpf;
pub mod env;
pub mod iptables;
pub mod ipvs;
pub mod ir;
pub mod nftables;
pub mod template;
pub mod trace;

/// Every target. The CLI, `--help`, `--out`, `apply` and the golden tests read this list.
pub static TARGETS: &[&Target] = &[
    &ir::TARGET,
    &iptables::TARGET,
    &nftables::TARGET,
    &nftables::JSON_TARGET,
    &ipvs::TARGET,
    &ebpf::TARGET,
    &dns::TARGET,
    &env::TARGET,
    &env::JSON_TARGET,
    &template::TARGET,
];

/// The diagnostic codes of the back ends' own inputs, described as
/// `svc_compiler::codes::CODES` describes the compiler's (SARIF's rules and
/// `docs/diagnostics.md` read both).
pub static CODES: &[svc_compiler::codes::Code] = &[svc_compiler::codes::Code {
    code: template::TEMPLATE_ERROR_CODE,
    severity: svc_compiler::diag::Severity::Error,
    summary: "a `--template` file does not parse or render (at the template's line and column)",
}];

#[cfg(test)]
mod testing;

#[cfg(test)]
mod tests {
    use svc_compiler::net::IpFamily;
    use svc_compiler::passes::node::{node_view, NodeSelection};
    use svc_compiler::source::SourceMap;
    use svc_compiler::synth::{generate, Format, Shape};

    /// The renderers that share ports between nodes write what `write_string` writes, for
    /// every node of a cluster with every kind of service (Local policies make ports differ
    /// between nodes), whichever node comes first; with endpoint comments and without
    /// (large-cluster mode).
    #[test]
    fn shared_renderers_match_write_string() {
        for services in [200, 400] {
            check_renderers(Shape {
                services,
                endpoints: 4,
                nodes: 6,
                seed: 11,
            });
        }
    }

    fn check_renderers(shape: Shape) {
        let mut sources = SourceMap::default();
        let f = sources.add("cluster.yaml", generate(&shape, Format::YamlStream));
        let opts = svc_compiler::Options {
            allocate: true,
            ..Default::default()
        };
        let comp = svc_compiler::compile(&sources, &[f], &opts);
        assert!(!comp.diags.has_errors());
        let ipt = crate::iptables::Renderer::default();
        let nft = crate::nftables::Renderer::default();
        for round in 0..2 {
            for n in comp.module.nodes.iter().rev() {
                let sel = NodeSelection {
                    name: n.name.clone(),
                    ips: vec![],
                };
                let v = node_view(&comp.module, &sel, IpFamily::IPv4).unwrap();
                let want = crate::iptables::write_string(&v, &Default::default());
                assert!(
                    ipt.write_string(&v) == want,
                    "iptables, {}, round {round}",
                    n.name
                );
                let want = crate::nftables::write_string(&v, &Default::default());
                // Port by port (parallel, then cached) spells exactly what the whole
                // model, built first and written after, spells.
                assert!(
                    crate::nftables::write_whole(&v, &Default::default()) == want,
                    "nftables port by port vs whole model, {}",
                    n.name
                );
                assert!(
                    nft.write_string(&v) == want,
                    "nftables, {}, round {round}",
                    n.name
                );
            }
        }
    }
}
