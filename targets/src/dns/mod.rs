//! `--target dns`: RFC 1035 zone files for the cluster domain, following the Kubernetes
//! DNS-Based Service Discovery specification (kubernetes/dns `docs/specification.md`),
//! with CoreDNS's kubernetes plugin as the reference for everything the spec leaves open.
//!
//! Three zones, each a separate text, because an authoritative server (knot, nsd, bind)
//! loads one zone per file and ignores or rejects records outside the file's origin:
//! - `<domain>.`: SOA, NS, `dns-version` TXT, and per service A/AAAA, SRV and CNAME;
//! - `in-addr.arpa.` and `ip6.arpa.`: PTR records for cluster IPs and for the ready
//!   endpoints of headless services (CoreDNS serves the same two reverse zones in the
//!   default `kubernetes cluster.local in-addr.arpa ip6.arpa` setup).
//!
//! What each name returns:
//! - a service with cluster IPs: `svc.ns.svc.<domain>` A/AAAA per cluster IP, PTR back;
//!   `_port._proto.svc.ns.svc.<domain>` SRV `0 100 <port> svc.ns.svc.<domain>.` per
//!   named port (unnamed ports have none).
//! - a headless service: one A/AAAA per *ready* endpoint address (the IR's `ready`, which
//!   the EndpointSlice controller already sets for `publishNotReadyAddresses`); per
//!   endpoint `<hostname>.svc.ns.svc.<domain>` A/AAAA, where the hostname is the
//!   endpoint's `hostname` or else CoreDNS's dashed address (`10-0-0-1`, `fd00--1`);
//!   SRV per (ready endpoint, named port) with the endpoint's port, weight
//!   `max(1, 100 / records)` as CoreDNS computes it; PTR from the address to the
//!   hostname name. No ready endpoint: no records, so the name is NXDOMAIN (spec 2.4.1).
//! - ExternalName: CNAME to the external name; none when it is an IP (CoreDNS answers
//!   only names; Kubernetes documents that such an externalName is not resolved).
//! - the apex: SOA `ns.dns.<domain>. hostmaster.<domain>. <serial> 7200 1800 86400 <ttl>`
//!   with TTL `min(ttl, 300)` (CoreDNS's); NS and `dns-version.<domain>.` TXT with
//!   CoreDNS's schema version and TTL 28800. The NS is the DNS service's name
//!   (`kube-dns.kube-system.svc.<domain>.`, whose A records the zone holds) when that
//!   service has cluster IPs, else `ns.dns.<domain>.` (CoreDNS's fallback name) with the
//!   addresses [`ns_addresses`] chooses: so the name server always has an address in the
//!   zone, which BIND requires to load it.
//!
//! Not written in the default mode: CoreDNS's extensions and the deprecated pod records
//! `a-b-c-d.ns.pod.<domain>`. `--dns-records coredns` ([`DnsRecords::Coredns`], or
//! `dnsRecords` in the ClusterConfig) writes what CoreDNS's kubernetes plugin answers
//! instead, `pods verified` and `endpoint_pod_names` off: see `coredns.rs` (and
//! docs/dns.md) for each record and the plugin function it follows.
//!
//! Invariant: pure and deterministic. Services come in the IR's (namespace, name) order,
//! records of one service in a fixed order and deduplicated; PTRs sorted by address. The
//! default serial is derived from the records, so it changes exactly when they do.

use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::fmt::Write;
use std::net::IpAddr;
use svc_compiler::ir::{DnsRecords, Endpoint, Module, Service, ServiceType};
use svc_compiler::net::IpFamily;

/// CoreDNS's `DNSSchemaVersion` (plugin/kubernetes), served as `dns-version.<domain>.`.
pub const SCHEMA_VERSION: &str = "1.1.0";
/// CoreDNS's TTL for the `dns-version` record.
const VERSION_TTL: u32 = 28800;
/// CoreDNS's default TTL for every answer.
pub const DEFAULT_TTL: u32 = 5;

#[derive(Clone, Debug)]
pub struct Options {
    /// The cluster domain without the trailing dot; `None` = the module's `clusterDomain`.
    pub domain: Option<String>,
    /// TTL of every record (CoreDNS: 5, range 0..=3600).
    pub ttl: u32,
    /// SOA serial; `None` = derived from the records (stable for the same records).
    pub serial: Option<u32>,
    /// The service whose cluster IPs the NS name resolves to (CoreDNS's own service).
    pub dns_service: (String, String),
    /// Addresses of `ns.dns.<domain>.` when that service is not in the input; `None` (or
    /// an empty list) = [`ns_addresses`]'s choice.
    pub ns_addresses: Option<Vec<IpAddr>>,
    /// Whose answers the zones give; `None` = the module's (`dnsRecords` in the
    /// ClusterConfig, default [`DnsRecords::Spec`]).
    pub records: Option<DnsRecords>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            domain: None,
            ttl: DEFAULT_TTL,
            serial: None,
            dns_service: ("kube-system".into(), "kube-dns".into()),
            ns_addresses: None,
            records: None,
        }
    }
}

/// `--target dns [--ttl SECONDS] [--dns-records spec|coredns]`: the three zones as
/// `<origin>zone` files (the domain is the module's, `--cluster-domain`).
pub const TARGET: crate::Target = crate::Target {
    name: "dns",
    about: "zone files for the cluster domain and the reverse zones (Kubernetes DNS spec)",
    ext: "zone",
    render: crate::Render::Cluster(|module, _, params| render(module, params)),
    flags: &[
        crate::Flag {
            name: "ttl",
            value_name: "SECONDS",
            help: "dns: the TTL of every record, 0-3600 [default: 5]",
            repeatable: false,
            file: false,
        },
        crate::Flag {
            name: "dns-records",
            value_name: "spec|coredns",
            help: "dns: the records of the Kubernetes DNS spec, or what CoreDNS's kubernetes plugin answers (docs/dns.md) [default: ClusterConfig `dnsRecords`, else spec]",
            repeatable: false,
            file: false,
        },
    ],
    planner: None,
    trace: None,
    deprecated: None,
};

fn render(module: &Module, params: &crate::Params) -> Result<Vec<crate::File>, crate::RenderError> {
    let mut opts = Options::default();
    if let Some(t) = params.get("ttl") {
        // CoreDNS's kubernetes plugin accepts 0..=3600.
        opts.ttl = t
            .parse()
            .ok()
            .filter(|t| *t <= 3600)
            .ok_or_else(|| format!("--ttl `{t}`: give seconds from 0 to 3600"))?;
    }
    if let Some(r) = params.get("dns-records") {
        opts.records = Some(
            DnsRecords::parse(r)
                .ok_or_else(|| format!("--dns-records `{r}`: give spec or coredns"))?,
        );
    }
    Ok(write_zones(module, &opts)
        .into_iter()
        .map(|z| crate::File {
            name: format!("{}zone", z.origin),
            text: z.text,
        })
        .collect())
}

/// One zone: its origin (absolute, with the trailing dot) and its zone-file text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Zone {
    pub origin: String,
    pub text: String,
}

/// The forward zone of the cluster domain.
pub fn write_zone(module: &Module, opts: &Options) -> String {
    let z = Zones::new(module, opts);
    z.forward()
}

/// The reverse zone of one family: `in-addr.arpa.` (IPv4) or `ip6.arpa.` (IPv6).
pub fn write_reverse_zone(module: &Module, opts: &Options, family: IpFamily) -> String {
    let z = Zones::new(module, opts);
    z.reverse(family)
}

/// All three zones, forward first: what `--out DIR` writes as `<origin>zone` files and a
/// server loads as three zones.
pub fn write_zones(module: &Module, opts: &Options) -> Vec<Zone> {
    let z = Zones::new(module, opts);
    vec![
        Zone {
            origin: z.origin.clone(),
            text: z.forward(),
        },
        Zone {
            origin: "in-addr.arpa.".into(),
            text: z.reverse(IpFamily::IPv4),
        },
        Zone {
            origin: "ip6.arpa.".into(),
            text: z.reverse(IpFamily::IPv6),
        },
    ]
}

/// The reverse-lookup name of an address: `4.3.2.1.in-addr.arpa.` or the 32 nibbles of
/// an IPv6 address under `ip6.arpa.`.
pub fn reverse_name(ip: &IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            format!("{}.{}.{}.{}.in-addr.arpa.", o[3], o[2], o[1], o[0])
        }
        IpAddr::V6(v6) => {
            let mut s = String::with_capacity(72);
            for b in v6.octets().iter().rev() {
                let _ = write!(s, "{:x}.{:x}.", b & 0xf, b >> 4);
            }
            s.push_str("ip6.arpa.");
            s
        }
    }
}

/// CoreDNS's `endpointHostname`: the endpoint's hostname, else its address with `.` or
/// `:` replaced by `-` (an IPv6 address ending in `::` gets a trailing `0`).
pub fn endpoint_hostname(ip: &IpAddr, hostname: Option<&str>) -> String {
    if let Some(h) = hostname.filter(|h| !h.is_empty()) {
        return h.to_string();
    }
    match ip {
        IpAddr::V4(_) => ip.to_string().replace('.', "-"),
        IpAddr::V6(_) => {
            let s = ip.to_string().replace(':', "-");
            if s.ends_with('-') {
                s + "0"
            } else {
                s
            }
        }
    }
}

/// The ready endpoints of a headless service as DNS sees them: (hostname, address, and
/// per named port (name, protocol, endpoint port)), sorted by (hostname, address). Every
/// slice's listing counts, as CoreDNS reads them all: an address two slices list has the
/// records of each ready copy (its own hostname), and its ports once per copy.
pub fn headless_endpoints(svc: &Service) -> Vec<HeadlessEndpoint> {
    let mut out: Vec<HeadlessEndpoint> = Vec::new();
    // A service without ports still has its endpoints' A/AAAA records (no SRV).
    let portless = (None, &svc.portless_endpoints);
    let ports = svc.ports.iter().map(|p| (Some(p), &p.endpoints));
    for (p, endpoints) in ports.chain([portless]) {
        let listed = endpoints.iter().flat_map(Endpoint::listings);
        for e in listed.filter(|e| e.ready) {
            let host = endpoint_hostname(&e.ip, e.hostname.as_deref());
            let i = match out.iter().position(|h| h.ip == e.ip && h.hostname == host) {
                Some(i) => i,
                None => {
                    out.push(HeadlessEndpoint {
                        hostname: host,
                        ip: e.ip,
                        ports: vec![],
                    });
                    out.len() - 1
                }
            };
            if let Some(p) = p.filter(|p| !p.name.is_empty()) {
                out[i]
                    .ports
                    .push((p.name.clone(), p.protocol.lower(), e.port));
            }
        }
    }
    out.sort_by(|a, b| (&a.hostname, a.ip).cmp(&(&b.hostname, b.ip)));
    out
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeadlessEndpoint {
    pub hostname: String,
    pub ip: IpAddr,
    /// (port name, lower-case protocol, endpoint port) for each named service port, once
    /// per listing of the address (CoreDNS weighs SRV records by these).
    pub ports: Vec<(String, &'static str, u16)>,
}

/// One resource record, names absolute.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Rr {
    name: String,
    ttl: u32,
    kind: &'static str,
    data: String,
}

fn addr_kind(ip: &IpAddr) -> &'static str {
    match ip {
        IpAddr::V4(_) => "A",
        IpAddr::V6(_) => "AAAA",
    }
}

struct Zones {
    /// `<domain>.`
    origin: String,
    ttl: u32,
    serial: u32,
    ns: String,
    /// Groups of records of the forward zone: a comment and its records.
    groups: Vec<(String, Vec<Rr>)>,
    /// PTR records, sorted by address.
    ptrs: Vec<(IpAddr, Rr)>,
}

impl Zones {
    fn new(module: &Module, opts: &Options) -> Zones {
        let domain = opts
            .domain
            .as_deref()
            .unwrap_or(&module.cluster.cluster_domain)
            .trim_end_matches('.')
            .to_ascii_lowercase();
        let origin = format!("{domain}.");
        let ttl = opts.ttl;
        let mode = opts.records.unwrap_or(module.cluster.dns_records);
        let mut groups = Vec::new();
        let mut ptrs = Vec::new();
        let fallback_ns = format!("ns.dns.{origin}");
        let mut ns = fallback_ns.clone();
        let mut ns_ips: Vec<IpAddr> = Vec::new();
        let cx = coredns::Context::new(module, &origin, ttl);
        let mut with_records: BTreeSet<&str> = BTreeSet::new();
        for svc in &module.services {
            let base = format!("{}.{}.svc.{origin}", svc.name, svc.namespace);
            if !svc.cluster_ips.is_empty()
                && svc.kind != ServiceType::ExternalName
                && (&svc.namespace, &svc.name) == (&opts.dns_service.0, &opts.dns_service.1)
            {
                ns = base.clone();
                ns_ips = svc.cluster_ips.clone();
            }
            let mut rrs = match mode {
                DnsRecords::Spec => spec_records(svc, &base, ttl, &mut ptrs),
                DnsRecords::Coredns => cx.service_records(svc, &base, &mut ptrs),
            };
            // Same (name, type, data) twice is one record; keep first-seen order.
            let mut seen = BTreeSet::new();
            rrs.retain(|r| seen.insert((r.name.clone(), r.kind, r.data.clone())));
            if !rrs.is_empty() {
                with_records.insert(&svc.namespace);
                groups.push((format!("{}/{}", svc.namespace, svc.name), rrs));
            }
        }
        // `ns.dns.<domain>.` needs addresses of its own when it is the name server: a name
        // server inside its zone without an address is refused by BIND ("has no address
        // records") and a lame delegation to knot. CoreDNS also answers the name when
        // its own service exists, with that service's addresses (ns.go `nsAddrs`).
        let ns_name_ips = if ns == fallback_ns {
            match &opts.ns_addresses {
                Some(ips) if !ips.is_empty() => ips.clone(),
                _ => ns_addresses(module),
            }
        } else if mode == DnsRecords::Coredns {
            ns_ips
        } else {
            vec![]
        };
        let rrs: Vec<Rr> = ns_name_ips
            .iter()
            .map(|ip| Rr {
                name: fallback_ns.clone(),
                ttl,
                kind: addr_kind(ip),
                data: ip.to_string(),
            })
            .collect();
        if !rrs.is_empty() {
            groups.insert(0, ("name server".to_string(), rrs));
        }
        if mode == DnsRecords::Coredns {
            groups.extend(cx.pod_and_namespace_records(&with_records));
        }
        ptrs.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        ptrs.dedup();
        let mut z = Zones {
            origin,
            ttl,
            serial: 0,
            ns,
            groups,
            ptrs,
        };
        z.serial = opts.serial.unwrap_or_else(|| z.content_serial());
        z
    }

    /// 31 bits of sha256 over every record (SOA excluded): the same records always give
    /// the same serial, other records almost surely another.
    fn content_serial(&self) -> u32 {
        let mut h = Sha256::new();
        h.update(self.origin.as_bytes());
        h.update(self.ns.as_bytes());
        h.update(self.ttl.to_le_bytes());
        for (_, rrs) in &self.groups {
            for r in rrs {
                h.update(format!("{} {} {}\n", r.name, r.kind, r.data).as_bytes());
            }
        }
        for (_, r) in &self.ptrs {
            h.update(format!("{} {}\n", r.name, r.data).as_bytes());
        }
        let d = h.finalize();
        u32::from_be_bytes([d[0], d[1], d[2], d[3]]) & 0x7fff_ffff
    }

    fn head(&self, out: &mut String, origin: &str) {
        let _ = writeln!(out, "; generated by svc-compile: do not edit");
        let _ = writeln!(out, "$ORIGIN {origin}");
        let _ = writeln!(out, "$TTL {}", self.ttl);
        let soa = Rr {
            name: origin.to_string(),
            ttl: self.ttl.min(300),
            kind: "SOA",
            data: format!(
                "ns.dns.{origin} hostmaster.{origin} {} 7200 1800 86400 {}",
                self.serial, self.ttl
            ),
        };
        line(out, &soa);
        line(
            out,
            &Rr {
                name: origin.to_string(),
                ttl: self.ttl,
                kind: "NS",
                data: self.ns.clone(),
            },
        );
    }

    fn forward(&self) -> String {
        let mut out = String::new();
        self.head(&mut out, &self.origin);
        line(
            &mut out,
            &Rr {
                name: format!("dns-version.{}", self.origin),
                ttl: VERSION_TTL,
                kind: "TXT",
                data: format!("\"{SCHEMA_VERSION}\""),
            },
        );
        for (what, rrs) in &self.groups {
            let _ = writeln!(out, "; {what}");
            for r in rrs {
                line(&mut out, r);
            }
        }
        out
    }

    fn reverse(&self, family: IpFamily) -> String {
        let origin = match family {
            IpFamily::IPv4 => "in-addr.arpa.",
            IpFamily::IPv6 => "ip6.arpa.",
        };
        let mut out = String::new();
        self.head(&mut out, origin);
        for (ip, r) in &self.ptrs {
            if IpFamily::of(ip) == family {
                line(&mut out, r);
            }
        }
        out
    }
}

/// The records of one service the spec asks for (see the module doc), its PTRs pushed
/// to `ptrs`.
fn spec_records(svc: &Service, base: &str, ttl: u32, ptrs: &mut Vec<(IpAddr, Rr)>) -> Vec<Rr> {
    let mut rrs: Vec<Rr> = Vec::new();
    let rr = |name: &str, kind: &'static str, data: String| Rr {
        name: name.to_string(),
        ttl,
        kind,
        data,
    };
    if svc.kind == ServiceType::ExternalName {
        rrs.extend(external_name(svc).map(|ext| rr(base, "CNAME", ext)));
    } else if !svc.cluster_ips.is_empty() {
        for ip in &svc.cluster_ips {
            rrs.push(rr(base, addr_kind(ip), ip.to_string()));
            ptrs.push((*ip, rr(&reverse_name(ip), "PTR", base.to_string())));
        }
        for p in svc.ports.iter().filter(|p| !p.name.is_empty()) {
            rrs.push(rr(
                &format!("_{}._{}.{base}", p.name, p.protocol.lower()),
                "SRV",
                format!("0 100 {} {base}", p.port),
            ));
        }
    } else if svc.headless {
        let eps = headless_endpoints(svc);
        let mut ips: Vec<IpAddr> = eps.iter().map(|e| e.ip).collect();
        ips.sort();
        for ip in ips {
            rrs.push(rr(base, addr_kind(&ip), ip.to_string()));
        }
        let mut srv: Vec<(String, u16, String)> = Vec::new();
        for e in &eps {
            let host = format!("{}.{base}", e.hostname);
            rrs.push(rr(&host, addr_kind(&e.ip), e.ip.to_string()));
            ptrs.push((e.ip, rr(&reverse_name(&e.ip), "PTR", host.clone())));
            for (name, proto, port) in &e.ports {
                srv.push((format!("_{name}._{proto}.{base}"), *port, host.clone()));
            }
        }
        srv.sort();
        // CoreDNS's weight: 100 over the records of the name before it drops
        // duplicate targets, so a dual-stack host counts once per address and an
        // address two slices list counts twice.
        for records in srv.chunk_by(|a, b| a.0 == b.0) {
            let weight = (100 / records.len()).max(1);
            let mut targets = records.to_vec();
            targets.dedup();
            for (name, port, host) in &targets {
                rrs.push(rr(name, "SRV", format!("0 {weight} {port} {host}")));
            }
        }
    }
    rrs
}

/// An ExternalName service's CNAME target, absolute; none when the external name is an
/// IP (CoreDNS answers only names; Kubernetes documents that such a name is not resolved).
fn external_name(svc: &Service) -> Option<String> {
    let ext = svc.external_name.as_deref().filter(|e| !e.is_empty())?;
    ext.parse::<IpAddr>()
        .is_err()
        .then(|| format!("{}.", ext.trim_end_matches('.')))
}

/// The addresses of `ns.dns.<domain>.` when no DNS service names the name server: per
/// service CIDR, kubeadm's cluster DNS address (the 10th of the range, 10.96.0.10 for
/// 10.96.0.0/12: where kubelet's `clusterDNS` sends pods) when the range holds it and no
/// service of the input has it as a cluster IP (a service there means the cluster's DNS
/// is elsewhere); otherwise the family's loopback address.
///
/// Why loopback: CoreDNS answers this name with the addresses it serves on (ns.go
/// `nsAddrs`, when it finds no endpoints of its own); a zone file does not know where it
/// will be served, and loopback is the one address every server that loads it has. The
/// name must have some address: BIND refuses a zone whose in-zone name server has none,
/// and knot warns of missing glue. Never empty.
pub fn ns_addresses(module: &Module) -> Vec<IpAddr> {
    let taken: BTreeSet<IpAddr> = module
        .services
        .iter()
        .flat_map(|s| &s.cluster_ips)
        .copied()
        .collect();
    let mut out: Vec<IpAddr> = module
        .cluster
        .service_cidrs
        .iter()
        .map(|c| {
            let tenth = (c.size() > 10).then(|| c.nth(10));
            match tenth.filter(|ip| !taken.contains(ip)) {
                Some(ip) => ip,
                None if c.addr.is_ipv4() => IpAddr::from([127, 0, 0, 1]),
                None => IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
            }
        })
        .collect();
    if out.is_empty() {
        out.push(IpAddr::from([127, 0, 0, 1]));
    }
    out
}

fn line(out: &mut String, r: &Rr) {
    let _ = writeln!(out, "{} {} IN {} {}", r.name, r.ttl, r.kind, r.data);
}

mod coredns;
#[cfg(test)]
mod tests;
