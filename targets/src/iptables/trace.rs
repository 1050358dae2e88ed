//! iptables' side of `svc-compile trace`: a step's lines are the `-A CHAIN` rules of the
//! port's chains as [`super::names`] spells them (see [`crate::trace`]).

use super::names::{PortChains, SepChain, KUBE_MARK_MASQ, KUBE_NODEPORTS, KUBE_SERVICES};
use crate::trace::{ChainSyntax, Chains};
use std::net::IpAddr;
use svc_compiler::ir::PortView;
use svc_compiler::trace::Mode;

/// The iptables target's tracer (`crate::trace::Tracer`, through [`ChainSyntax`]).
pub(crate) struct Iptables;

impl ChainSyntax for Iptables {
    fn mode(&self) -> Mode {
        Mode::Iptables
    }
    fn chains(&self, pv: &PortView, backends: &[String]) -> Chains {
        let proto = pv.protocol.lower();
        let c = PortChains::new(&pv.spn, proto);
        Chains {
            cluster: c.svc,
            local: c.svl,
            external: c.ext,
            firewall: c.fw,
            endpoints: backends
                .iter()
                .map(|a| SepChain::new(&pv.spn, proto, a).to_string())
                .collect(),
        }
    }
    fn chain_lines(&self, doc: &str, chain: &str) -> Vec<String> {
        let head = format!("-A {chain} ");
        doc.lines()
            .filter(|l| l.starts_with(&head))
            .map(str::to_string)
            .collect()
    }
    fn is_service_match(&self, l: &str) -> bool {
        [KUBE_SERVICES, KUBE_NODEPORTS]
            .iter()
            .any(|c| l.starts_with(&format!("-A {c} ")))
            && !l.ends_with("-j REJECT")
            && !l.ends_with("-j DROP")
    }
    fn is_firewall_line(&self, _: &str) -> bool {
        false
    }
    fn masquerade_chain(&self) -> &'static str {
        KUBE_MARK_MASQ
    }
    fn destination(&self, _: &PortView, dst: IpAddr, port: u16) -> (String, String) {
        (
            format!(" -d {dst} --dport {port} "),
            format!(" --dport {port} "),
        )
    }
    fn is_node_port_line(&self, l: &str) -> bool {
        // The node-port jumps, and the REJECTs of KUBE-EXTERNAL-SERVICES for local
        // destinations.
        l.contains(KUBE_NODEPORTS) || l.contains("--dst-type LOCAL")
    }
}
