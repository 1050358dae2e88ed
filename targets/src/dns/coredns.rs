//! `--dns-records coredns`: the records with which CoreDNS's kubernetes plugin answers,
//! in its default setup (`kubernetes cluster.local in-addr.arpa ip6.arpa`) with
//! `pods verified` and `endpoint_pod_names` off. Each point follows a function of
//! coredns/coredns (`plugin/kubernetes/` unless said otherwise):
//!
//! - SRV at the bare service name (`svc.ns.svc.<domain>` SRV), not only at
//!   `_port._proto.svc...`: `parse.go` `parseRequest` leaves port and protocol empty,
//!   which `kubernetes.go` `matchPortAndProtocol` takes as every port (unnamed ones
//!   too). A cluster IP gives one answer per (port, cluster IP) (`findServices`, its
//!   ClusterIP branch), a headless service one per (ready address, port) of each
//!   EndpointSlice (its endpoint branch).
//! - SRV weights: `plugin/backend_lookup.go` `SRV` gives every answer of the name the
//!   weight `floor(100 / answers)` (at least 1) and then drops duplicate (target, port)
//!   records: a dual-stack service's `_port._proto` SRV has weight 50, kube-dns's bare
//!   SRV 33 (three ports, UDP and TCP 53 one record).
//! - Endpoint names for every service with endpoints, cluster IP ones too:
//!   `findServices` answers `endpoint.svc.ns.svc` from the endpoints whenever the name
//!   has an endpoint label, not only for headless services. The label is
//!   `kubernetes.go` `endpointHostname` (the endpoint's `hostname`, else its address
//!   with dashes; `endpoint_pod_names` off). Their A/AAAA records, SRV records at them
//!   (every port), and the PTRs back (`reverse.go` `serviceRecordForIP`: an address
//!   that is some service's cluster IP answers only with that service's name; any other
//!   address with every endpoint name that lists it).
//! - A headless service's SRV records come from its EndpointSlices' ports
//!   (`object/endpoint.go` `endpointSliceToEndpoints` keeps the slice's ports; the
//!   endpoint branch of `findServices` reads them), so a service without ports still
//!   has SRV records when its slices list ports. A slice without ports gets CoreDNS's
//!   port -1 sentinel: its addresses have A/AAAA records and count toward SRV weights,
//!   but give no SRV (`backend_lookup.go` `SRV` skips port -1).
//! - Ready means the endpoint's `ready` condition, unset counting as ready
//!   (`object/endpoint.go` `endpointsliceReady`), as the IR's `ready`.
//! - Pods: `a-b-c-d.ns.pod.<domain>` (IPv6: the address with `:` as `-`) A/AAAA for every
//!   Pod of the input at its `status.podIP` (`kubernetes.go` `findPods`, `pods verified`:
//!   a Pod of that namespace must have that IP; `object/pod.go` `ToPod` keeps only
//!   `status.podIP` and drops terminating Pods). No PTR (`serviceRecordForIP` reads only
//!   services and endpoints).
//! - Names that exist without data (NODATA, not NXDOMAIN): `svc.<domain>` and
//!   `pod.<domain>` (`parseRequest` returns an empty request for them), and
//!   `ns.svc.<domain>` and `ns.pod.<domain>` for every namespace that exists
//!   (`findServices` and `findPods` with an empty name, `namespace.go`
//!   `namespaceExposed`). Here a namespace exists when a Service or Pod of the input is in
//!   it. A zone file holds a name without records only above a record, so where no record
//!   lies below such a name one is added for it: `_ent.<name>` TXT "empty non-terminal",
//!   the one name these zones answer otherwise than CoreDNS (which answers NXDOMAIN
//!   there: `findServices`/`findPods` know no `_ent`).
//! - `ns.dns.<domain>` A/AAAA always (`kubernetes.go` `Services`, `isDefaultNS`:
//!   `ns.go` `nsAddrs` gives the DNS service's cluster IPs, or the server's own
//!   addresses without it; here [`super::ns_addresses`]).
//! - `dns-version.<domain>` TXT stays: `kubernetes.go` `Services` answers it in the
//!   TXT case (`DNSSchemaVersion`, TTL 28800).
//!
//! What a zone file cannot say as CoreDNS does: a CNAME answers every type (CoreDNS gives
//! an ExternalName service no SRV, `Services` drops CNAME answers there), and
//! `dns-version` answers other types with NODATA (CoreDNS: NXDOMAIN, `parseRequest`
//! refuses the label). CoreDNS's wildcards are gone from the plugin (`match` in
//! `kubernetes.go` compares names exactly), so there are none here either.

use super::{addr_kind, endpoint_hostname, external_name, reverse_name, Rr};
use std::collections::{BTreeSet, HashSet};
use std::net::IpAddr;
use svc_compiler::ir::{Endpoint, Module, Service, ServiceType};

/// What the whole module contributes to each service's records.
pub(super) struct Context<'a> {
    module: &'a Module,
    origin: &'a str,
    ttl: u32,
    /// Every service's cluster IPs: an address among them has no endpoint PTR.
    cluster_ips: HashSet<IpAddr>,
}

/// One answer of `findServices`' endpoint branch: a ready address of a slice and one of
/// that slice's ports (`None`: the slice lists none, CoreDNS's port -1).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Answer<'a> {
    /// `endpointHostname`.
    host: String,
    ip: IpAddr,
    /// (name, lower-case protocol, port).
    port: Option<(&'a str, &'static str, u16)>,
}

/// The label of a Pod's name: what `findPods` turns back into its IP.
fn pod_label(ip: &IpAddr) -> String {
    match ip {
        IpAddr::V4(_) => ip.to_string().replace('.', "-"),
        IpAddr::V6(_) => ip.to_string().replace(':', "-"),
    }
}

/// The placeholder below a name that exists without records (see the module doc).
const ENT_LABEL: &str = "_ent";

impl<'a> Context<'a> {
    pub(super) fn new(module: &'a Module, origin: &'a str, ttl: u32) -> Context<'a> {
        Context {
            module,
            origin,
            ttl,
            cluster_ips: module
                .services
                .iter()
                .flat_map(|s| &s.cluster_ips)
                .copied()
                .collect(),
        }
    }

    fn rr(&self, name: &str, kind: &'static str, data: String) -> Rr {
        Rr {
            name: name.to_string(),
            ttl: self.ttl,
            kind,
            data,
        }
    }

    /// One service's records, its PTRs pushed to `ptrs`. Order: the name's A/AAAA, its
    /// bare SRV, the endpoint names' A/AAAA, `_port._proto` SRVs, SRVs at endpoint names.
    pub(super) fn service_records(
        &self,
        svc: &Service,
        base: &str,
        ptrs: &mut Vec<(IpAddr, Rr)>,
    ) -> Vec<Rr> {
        let mut rrs = Vec::new();
        if svc.kind == ServiceType::ExternalName {
            rrs.extend(external_name(svc).map(|ext| self.rr(base, "CNAME", ext)));
            return rrs;
        }
        let answers = answers(svc);
        let mut hosts: Vec<&str> = answers.iter().map(|a| a.host.as_str()).collect();
        hosts.dedup();
        if !svc.cluster_ips.is_empty() {
            for ip in &svc.cluster_ips {
                rrs.push(self.rr(base, addr_kind(ip), ip.to_string()));
                ptrs.push((*ip, self.rr(&reverse_name(ip), "PTR", base.to_string())));
            }
            // One answer per (port, cluster IP), every port.
            let per_ip: Vec<u16> = svc.ports.iter().map(|p| p.port).collect();
            rrs.extend(self.cluster_ip_srv(base, base, &per_ip, svc.cluster_ips.len()));
        } else if svc.headless {
            let ips: BTreeSet<IpAddr> = answers.iter().map(|a| a.ip).collect();
            for ip in ips {
                rrs.push(self.rr(base, addr_kind(&ip), ip.to_string()));
            }
            rrs.extend(self.endpoint_srv(base, base, answers.iter()));
        } else {
            return rrs;
        }
        for host in &hosts {
            let name = format!("{host}.{base}");
            let ips: BTreeSet<IpAddr> = answers
                .iter()
                .filter(|a| a.host == *host)
                .map(|a| a.ip)
                .collect();
            for ip in ips {
                rrs.push(self.rr(&name, addr_kind(&ip), ip.to_string()));
                if !self.cluster_ips.contains(&ip) {
                    ptrs.push((ip, self.rr(&reverse_name(&ip), "PTR", name.clone())));
                }
            }
        }
        if !svc.cluster_ips.is_empty() {
            for p in svc.ports.iter().filter(|p| !p.name.is_empty()) {
                let name = format!("_{}._{}.{base}", p.name, p.protocol.lower());
                rrs.extend(self.cluster_ip_srv(&name, base, &[p.port], svc.cluster_ips.len()));
            }
        } else {
            let mut named: Vec<(&str, &str)> = answers
                .iter()
                .filter_map(|a| a.port)
                .filter(|(name, ..)| !name.is_empty())
                .map(|(name, proto, _)| (name, proto))
                .collect();
            named.sort();
            named.dedup();
            for (pname, proto) in named {
                let name = format!("_{pname}._{proto}.{base}");
                let matching = answers
                    .iter()
                    .filter(|a| a.port.is_some_and(|(n, p, _)| (n, p) == (pname, proto)));
                rrs.extend(self.endpoint_srv(&name, base, matching));
            }
        }
        for host in &hosts {
            let name = format!("{host}.{base}");
            rrs.extend(self.endpoint_srv(&name, base, answers.iter().filter(|a| a.host == *host)));
        }
        rrs
    }

    /// SRV at `name` for a cluster IP: `ips` answers per port, all with target `base`.
    fn cluster_ip_srv(&self, name: &str, base: &str, ports: &[u16], ips: usize) -> Vec<Rr> {
        let n = ports.len() * ips;
        if n == 0 {
            return vec![];
        }
        let weight = (100 / n).max(1);
        let mut seen = BTreeSet::new();
        ports
            .iter()
            .filter(|p| seen.insert(**p))
            .map(|p| self.rr(name, "SRV", format!("0 {weight} {p} {base}")))
            .collect()
    }

    /// SRV at `name` from endpoint answers: every answer weighs, one record per
    /// (target, port) with a port.
    fn endpoint_srv<'b>(
        &self,
        name: &str,
        base: &str,
        answers: impl Iterator<Item = &'b Answer<'b>>,
    ) -> Vec<Rr> {
        let answers: Vec<&Answer> = answers.collect();
        if answers.is_empty() {
            return vec![];
        }
        let weight = (100 / answers.len()).max(1);
        let mut targets: Vec<(u16, String)> = answers
            .iter()
            .filter_map(|a| Some((a.port?.2, format!("{}.{base}", a.host))))
            .collect();
        targets.sort();
        targets.dedup();
        targets
            .into_iter()
            .map(|(port, target)| self.rr(name, "SRV", format!("0 {weight} {port} {target}")))
            .collect()
    }

    /// The Pods' records, and the placeholders that keep each namespace's `ns.svc` and
    /// `ns.pod` names (and `svc.`, `pod.`) in the zone. `with_records`: the namespaces
    /// whose services have records.
    pub(super) fn pod_and_namespace_records(
        &self,
        with_records: &BTreeSet<&str>,
    ) -> Vec<(String, Vec<Rr>)> {
        let origin = self.origin;
        let mut groups = Vec::new();
        let mut namespaces: BTreeSet<&str> = BTreeSet::new();
        namespaces.extend(self.module.services.iter().map(|s| s.namespace.as_str()));
        namespaces.extend(self.module.pods.iter().map(|p| p.namespace.as_str()));
        let mut with_pods: BTreeSet<&str> = BTreeSet::new();
        // Pods come sorted by (namespace, name).
        for pods in self.module.pods.chunk_by(|a, b| a.namespace == b.namespace) {
            let ns = pods[0].namespace.as_str();
            let mut named: Vec<(String, IpAddr)> = pods
                .iter()
                .filter(|p| !p.terminating)
                .filter_map(|p| Some((pod_label(p.ip.as_ref()?), p.ip?)))
                // An address starting or ending in `::` would start or end its label
                // with `-`: no host name, which BIND's check-names refuses.
                .filter(|(label, _)| !label.starts_with('-') && !label.ends_with('-'))
                .collect();
            named.sort();
            named.dedup();
            if named.is_empty() {
                continue;
            }
            with_pods.insert(ns);
            let rrs = named
                .into_iter()
                .map(|(label, ip)| {
                    let name = format!("{label}.{ns}.pod.{origin}");
                    self.rr(&name, addr_kind(&ip), ip.to_string())
                })
                .collect();
            groups.push((format!("pods in {ns}"), rrs));
        }
        let ent = |above: &str| {
            self.rr(
                &format!("{ENT_LABEL}.{above}"),
                "TXT",
                "\"empty non-terminal\"".into(),
            )
        };
        let mut placeholders = Vec::new();
        for ns in &namespaces {
            if !with_records.contains(ns) {
                placeholders.push(ent(&format!("{ns}.svc.{origin}")));
            }
            if !with_pods.contains(ns) {
                placeholders.push(ent(&format!("{ns}.pod.{origin}")));
            }
        }
        if namespaces.is_empty() {
            placeholders.push(ent(&format!("svc.{origin}")));
            placeholders.push(ent(&format!("pod.{origin}")));
        }
        if !placeholders.is_empty() {
            groups.push(("names that exist without records".into(), placeholders));
        }
        groups
    }
}

/// Every ready listing of the endpoints (each slice's copy of an address).
fn ready(eps: &[Endpoint]) -> impl Iterator<Item = &Endpoint> {
    eps.iter().flat_map(Endpoint::listings).filter(|e| e.ready)
}

/// Every answer of `findServices`' endpoint branch for `svc`, sorted: per ready listing
/// of an address (each slice's), one per port of its slice.
fn answers(svc: &Service) -> Vec<Answer<'_>> {
    let answer = |e: &Endpoint, port| Answer {
        host: endpoint_hostname(&e.ip, e.hostname.as_deref()),
        ip: e.ip,
        port,
    };
    let mut out = Vec::new();
    for p in &svc.ports {
        for e in ready(&p.endpoints) {
            out.push(answer(
                e,
                Some((p.name.as_str(), p.protocol.lower(), e.port)),
            ));
        }
    }
    // A service without ports: its slices' own ports, and the port -1 sentinel for
    // the listings of slices without any.
    let mut with_ports: HashSet<(IpAddr, &str)> = HashSet::new();
    for p in &svc.portless_slice_ports {
        for e in ready(&p.endpoints) {
            with_ports.insert((e.ip, &e.source));
            out.push(answer(
                e,
                Some((p.name.as_str(), p.protocol.lower(), e.port)),
            ));
        }
    }
    for e in ready(&svc.portless_endpoints) {
        if !with_ports.contains(&(e.ip, &*e.source)) {
            out.push(answer(e, None));
        }
    }
    out.sort();
    out
}
