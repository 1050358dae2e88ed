//! nftables' side of `svc-compile trace`: a step's lines are the `add rule` lines of the
//! port's chains and the `add element` lines of the shared maps, as [`super::names`]
//! spells them (see [`crate::trace`]).

use super::names::{EndpointNames, PortChains, FIREWALL_IPS, MARK_MASQ, NO_ENDPOINT_NODEPORTS};
use super::names::{NO_ENDPOINT_SERVICES, SERVICE_NODEPORTS};
use crate::trace::{ChainSyntax, Chains};
use std::net::IpAddr;
use svc_compiler::ir::PortView;
use svc_compiler::trace::Mode;

/// The nftables target's tracer (`crate::trace::Tracer`, through [`ChainSyntax`]).
pub(crate) struct Nftables;

/// The set or map an `add element <family> <table> <set> { … }` line adds to.
fn element_set(l: &str) -> Option<&str> {
    l.strip_prefix("add element ")?.split(' ').nth(2)
}

impl ChainSyntax for Nftables {
    fn mode(&self) -> Mode {
        Mode::Nftables
    }
    fn chains(&self, pv: &PortView, backends: &[String]) -> Chains {
        let c = PortChains::new(pv);
        Chains {
            cluster: c.cluster,
            local: c.local,
            external: c.external,
            firewall: c.firewall,
            // A backend the port does not list has no chain (and no lines).
            endpoints: backends
                .iter()
                .filter_map(|a| pv.endpoints.iter().find(|e| &*e.addr == a))
                .map(|e| EndpointNames::new(pv, e).chain)
                .collect(),
        }
    }
    fn chain_lines(&self, doc: &str, chain: &str) -> Vec<String> {
        // `add rule <family> <table> <chain> ...`
        doc.lines()
            .filter(|l| l.starts_with("add rule ") && l.split(' ').nth(4) == Some(chain))
            .map(str::to_string)
            .collect()
    }
    fn is_service_match(&self, l: &str) -> bool {
        element_set(l).is_some_and(|s| s != NO_ENDPOINT_SERVICES && s != NO_ENDPOINT_NODEPORTS)
    }
    fn is_firewall_line(&self, l: &str) -> bool {
        element_set(l) == Some(FIREWALL_IPS)
    }
    fn masquerade_chain(&self) -> &'static str {
        MARK_MASQ
    }
    fn destination(&self, pv: &PortView, dst: IpAddr, port: u16) -> (String, String) {
        let proto = pv.protocol.lower();
        (
            format!("{{ {dst} . {proto} . {port} "),
            format!("{{ {proto} . {port} "),
        )
    }
    fn is_node_port_line(&self, l: &str) -> bool {
        element_set(l).is_some_and(|s| s == SERVICE_NODEPORTS || s == NO_ENDPOINT_NODEPORTS)
    }
}
