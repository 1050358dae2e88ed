//! IPVS' side of `svc-compile trace`: the virtual server at the service-match step and its
//! real servers at the endpoints step, from the `ipvsadm-save` part, spelt as
//! [`super::ipvsadm`] writes them. Its iptables part is not shown; the verdicts are IPVS
//! mode's as `svc_compiler::trace` models them (`Mode::Ipvs`: virtual servers for every
//! sender, the Local policies' fallback, kube-ipvs0's addresses), which the IPVS kernel
//! differential checks from the compiled parts, not from the trace.

use super::ipvsadm::service;
use crate::trace::{backends, Tracer};
use std::net::IpAddr;
use svc_compiler::ir::PortView;
use svc_compiler::trace::{Mode, Rule, Trace};

/// The IPVS target's [`Tracer`].
pub(crate) struct Ipvs;

impl Tracer for Ipvs {
    fn mode(&self) -> Mode {
        Mode::Ipvs
    }
    fn heading(&self) -> &'static str {
        "ipvs rules"
    }
    fn shows(&self, rule: Rule) -> bool {
        matches!(rule, Rule::ServiceMatch | Rule::Endpoints)
    }
    fn rules(
        &self,
        t: &Trace,
        pv: &PortView,
        dst: IpAddr,
        port: u16,
        doc: &str,
    ) -> Vec<Vec<String>> {
        let svc = service(pv.protocol, &dst, port);
        let virtual_server = format!("-A {svc} ");
        let real = format!("-a {svc} -r ");
        let backends = backends(t);
        t.steps
            .iter()
            .map(|s| match s.rule {
                Rule::ServiceMatch => doc
                    .lines()
                    .filter(|l| l.starts_with(&virtual_server))
                    .map(str::to_string)
                    .collect(),
                Rule::Endpoints => doc
                    .lines()
                    .filter(|l| {
                        l.strip_prefix(&real).is_some_and(|r| {
                            backends.iter().any(|b| r.starts_with(&format!("{b} ")))
                        })
                    })
                    .map(str::to_string)
                    .collect(),
                _ => Vec::new(),
            })
            .collect()
    }
}
