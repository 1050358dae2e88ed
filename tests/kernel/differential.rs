//! Differential test (issue 4): the iptables and nftables back ends, rendered from the
//! same per-node IR, must send every flow to the same set of endpoints with the same
//! masquerade decision — in the real kernel.
//!
//! Manifests: every golden case (`golden/cases/*`), then `SVC_DIFF_CASES` generated
//! ones (default [`DEFAULT_CASES`]), seeds `SVC_DIFF_SEED` (default 1) upwards; see
//! [`generate`]. For each manifest both targets are compiled through the CLI; the flows
//! and what they should do come from a node view ([`derive_flows`]): for a generated
//! manifest the test's own ([`model`]: kube-proxy's endpoint selection computed from what
//! the generator wrote, never by the compiler), for a golden case the IR's (`--target ir
//! --node node-1`; its IPv4 view, or the IPv6 one of an IPv6-only case, run in the lab's
//! IPv6). One lab per target is reused: the ruleset is replaced
//! ([`reload`]) and conntrack flushed between manifests. Both labs run the same flows at
//! the same time; within a lab flows run in parallel, except that the flows of one
//! sender to a port view with session affinity run in order (they share its state).
//!
//! Per flow and target we record which backends answered (each pod serves TCP and UDP
//! on 8080 and 9090 and answers `<pod>:<port>`), whether each saw the sender's address
//! (`direct`) or another (`masq`), and the probes that got no answer (`refused`,
//! `timeout`, `failed: ...`). The targets must agree exactly (for session affinity:
//! both sticky), and each must match what the IR decided whenever that is unambiguous
//! ([`Expect`]). Probes use a short timeout first; a flow that disagrees is probed
//! again with a longer timeout and more probes before it counts as a failure, so a slow
//! answer on a busy machine is not a finding; the re-check takes back timeouts only
//! ([`forgive_timeouts`]: a wrong backend or masquerade seen once stays). The full run
//! must have checked flows of every destination kind, expectation and intended
//! difference, from every source of expectations ([`Stats::assert_every_kind`]), and the
//! IR is read strictly (a missing key fails).
//!
//! Intended differences ([`Intended`]), exempt from the comparison and checked per
//! target instead:
//! - kube-proxy's nftables mode rejects traffic to a cluster IP on a port the service
//!   does not have; iptables lets it through (routed to the node's default gateway,
//!   which the lab does not have, so no answer).
//! - localhost NodePorts (`127.0.0.1:nodePort` from the node) exist only in iptables
//!   mode; nftables refuses them (nothing listens there).
//!
//! A failing manifest is printed with its seed and text. Knobs (environment):
//! - `SVC_DIFF_CASES`: generated manifests (default [`DEFAULT_CASES`]);
//! - `SVC_DIFF_SEED`: the first seed (default 1);
//! - `SVC_DIFF_GOLDEN=0`: leave out the golden cases;
//! - `SVC_DIFF_FILE=path`: only this manifest (with its own Nodes and
//!   KubeProxyConfiguration; compiled with `--node node-1`).
//!
//! Reproduce one seed with
//! `SVC_DIFF_SEED=<seed> SVC_DIFF_CASES=1 SVC_DIFF_GOLDEN=0 cargo test differential -- --nocapture`.

#[path = "differential_ipvs.rs"]
pub(super) mod ipvs;

use super::echo::{probe_in, Outcome, Proto};
use super::flows::reload;
use super::{require_root, Family, Lab, LabSpec};
use crate::golden::{case_dirs, compile_case_with};
use crate::support::{root, svc, Rng};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

/// The eBPF side: the socket load balancer on the flows it serves.
mod ebpf;

/// `svc-compile migrate`'s claims against the two labs.
mod migrate;

/// The expected endpoint sets of generated manifests, computed here.
pub(super) mod model;

/// Generated manifests when `SVC_DIFF_CASES` is unset (sized for about two minutes).
pub const DEFAULT_CASES: u64 = 150;

/// The targets compared, in this order everywhere.
const TARGETS: [&str; 2] = ["iptables", "nftables"];

/// Ports every pod serves, TCP and UDP; the answer names the pod and the port.
const SERVED_PORTS: [u16; 2] = [8080, 9090];

/// Probe timeout of the first, fast pass. An answer in the lab takes well under a
/// millisecond; a flow that disagrees is probed again ([`RECHECK_TIMEOUT`]) before it
/// counts.
const FAST_TIMEOUT: Duration = Duration::from_millis(250);

/// Probe timeout of the re-check: long enough for a slow answer on a busy machine, and for
/// TCP's first SYN retransmission (1 s): an ICMP error that reaches a connecting socket
/// while `connect` still holds it is only a soft error (`tcp_v6_err`, `tcp_v4_err`), so a
/// rejected connection may be refused only on the retransmitted SYN. Over IPv6 the
/// ICMPv6 error comes back that fast now and then (the IPv6 golden cases' unknown
/// cluster-IP ports under nftables). (A first SYN "lost" now and then was a new
/// connection NATed onto a 4-tuple a backend held in TIME_WAIT after a conntrack flush;
/// the labs now keep TIME_WAIT entries between manifests: see timewait.rs.)
const RECHECK_TIMEOUT: Duration = Duration::from_millis(2500);

/// The backends' TCP counters a failure report shows (see timewait.rs).
const BACKEND_COUNTERS: [&str; 5] = [
    "TcpExtPAWSTimewait",
    "TcpExtTW",
    "TcpOutRsts",
    "TcpExtListenOverflows",
    "TcpExtListenDrops",
];

/// Parallel flow groups per lab.
const WORKERS: usize = 8;

/// The node the manifests are compiled for (the lab's `node`).
const NODE: &str = "node-1";

// ---------------------------------------------------------------------------------------
// Generator
// ---------------------------------------------------------------------------------------

/// A manifest that fits the lab (see `mod.rs`): the lab's two Node objects, a
/// KubeProxyConfiguration with clusterCIDR 10.244.0.0/16 (sometimes masqueradeAll,
/// localhostNodePorts off or restricted nodePortAddresses) and 3 to 6 services in namespace `diff<seed>`
/// (unique per seed, so no chain name survives from one manifest to the next):
/// ClusterIP, NodePort and LoadBalancer (ingress IPs in 203.0.113.0/24, sometimes
/// loadBalancerSourceRanges allowing only client1), sometimes externalIPs in
/// 198.18.0.0/24, both traffic policies, sometimes ClientIP affinity or topologyKeys;
/// one or two TCP/UDP ports each, with explicit cluster IPs and node ports;
/// EndpointSlices (one or two per service, sometimes none) over the lab's pods, on and
/// off the node, ready, not ready, terminating and serving or not, sometimes with zone
/// hints.
///
/// Returns the text and what it says as data, for the test's own oracle ([`model`]).
fn generate(seed: u64) -> (String, model::Cluster) {
    let mut r = Rng::new(seed);
    let ns = format!("diff{seed}");
    let mut cluster = model::Cluster {
        namespace: ns.clone(),
        localhost_node_ports: true,
        ..model::Cluster::default()
    };
    let mut out = format!("# svc-compile differential test, seed {seed}\n");
    out += &std::fs::read_to_string(root().join("golden/common/nodes.yaml")).unwrap();
    out += "---\napiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
            clusterCIDR: 10.244.0.0/16\n";
    let mut iptables = Vec::new();
    if r.chance(10) {
        iptables.push("masqueradeAll: true");
        cluster.masquerade_all = true;
    }
    if r.chance(5) {
        iptables.push("localhostNodePorts: false");
        cluster.localhost_node_ports = false;
    }
    if !iptables.is_empty() {
        out += &format!("iptables: {{{}}}\n", iptables.join(", "));
    }
    let addresses = match r.below(10) {
        0 => Some("primary"),
        1 => Some("192.0.2.0/24"),
        _ => None,
    };
    if let Some(a) = addresses {
        out += &format!("nodePortAddresses: [{a}]\n");
        cluster.node_port_addresses = true;
    }

    let spec = LabSpec::default();
    let pods: Vec<(String, Ipv4Addr, &str)> = spec
        .local_pods
        .iter()
        .map(|h| (h.name.clone(), h.ip, "node-1"))
        .chain(
            spec.remote_pods
                .iter()
                .map(|h| (h.name.clone(), h.ip, "node-2")),
        )
        .collect();

    let mut cluster_ips = BTreeSet::new();
    let mut node_ports = BTreeSet::new();
    let mut next_external = 1 + r.below(100) as u8;
    let mut next_lb = 1 + r.below(100) as u8;
    let mut node_port = |r: &mut Rng| loop {
        let p = 30000 + r.below(2768) as u16;
        if node_ports.insert(p) {
            return p;
        }
    };

    for i in 0..3 + r.below(4) {
        let name = format!("s{i}");
        let kind = *r.pick(&[
            "ClusterIP",
            "ClusterIP",
            "NodePort",
            "NodePort",
            "LoadBalancer",
        ]);
        let cluster_ip = loop {
            let ip = Ipv4Addr::new(
                10,
                96 + r.below(16) as u8,
                r.below(256) as u8,
                2 + r.below(253) as u8,
            );
            if cluster_ips.insert(ip) {
                break ip;
            }
        };
        let external_ips = r.chance(20);
        let externally = kind != "ClusterIP" || external_ips;
        let etp_local = externally && r.chance(40);
        let itp_local = r.chance(25);
        let affinity = r.chance(15);
        let mut m = model::Svc {
            name: name.clone(),
            kind: kind.to_string(),
            cluster_ip: Some(cluster_ip),
            etp_local,
            itp_local,
            affinity,
            ..model::Svc::default()
        };

        let mut s = format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {ns}}}\n\
             spec:\n  type: {kind}\n  clusterIP: {cluster_ip}\n  selector: {{app: {name}}}\n"
        );
        if external_ips {
            s += &format!("  externalIPs: [198.18.0.{next_external}]\n");
            m.external_ips
                .push(Ipv4Addr::new(198, 18, 0, next_external));
            next_external += 1;
        }
        if etp_local {
            s += "  externalTrafficPolicy: Local\n";
            if kind == "LoadBalancer" {
                s += &format!("  healthCheckNodePort: {}\n", node_port(&mut r));
            }
        }
        if itp_local {
            s += "  internalTrafficPolicy: Local\n";
        }
        if !etp_local && !itp_local && r.chance(8) {
            let keys = *r.pick(&[
                &["kubernetes.io/hostname"][..],
                &["kubernetes.io/hostname", "*"][..],
                &["topology.kubernetes.io/zone", "*"][..],
            ]);
            let quoted: Vec<String> = keys
                .iter()
                .map(|k| match *k {
                    "*" => "\"*\"".to_string(),
                    k => k.to_string(),
                })
                .collect();
            s += &format!("  topologyKeys: [{}]\n", quoted.join(", "));
            m.topology_keys = keys.iter().map(|k| k.to_string()).collect();
        }
        if affinity {
            s += "  sessionAffinity: ClientIP\n";
            if r.chance(50) {
                s += "  sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}\n";
            }
        }
        let mut lb_ips = Vec::new();
        if kind == "LoadBalancer" && !r.chance(10) {
            for _ in 0..if r.chance(20) { 2 } else { 1 } {
                lb_ips.push(format!("203.0.113.{next_lb}"));
                m.lb_ips.push(Ipv4Addr::new(203, 0, 113, next_lb));
                next_lb += 1;
            }
            if r.chance(35) {
                s += "  loadBalancerSourceRanges: [192.0.2.100/32]\n";
                m.source_ranges
                    .push(Cidr(Ipv4Addr::new(192, 0, 2, 100).into(), 32));
            }
        }

        // Ports: (name, protocol, port, target port).
        let mut ports: Vec<(String, &str, u16, u16)> = Vec::new();
        let nports = if r.chance(30) { 2 } else { 1 };
        while ports.len() < nports {
            let proto = if r.chance(30) { "UDP" } else { "TCP" };
            let port = *r.pick(&[80u16, 443, 53, 8000, 5000, 9000]);
            if ports.iter().any(|p| p.1 == proto && p.2 == port) {
                continue;
            }
            let pname = if nports > 1 || r.chance(50) {
                format!("p{}", ports.len())
            } else {
                String::new()
            };
            ports.push((pname, proto, port, *r.pick(&SERVED_PORTS)));
        }
        s += "  ports:\n";
        for (pname, proto, port, target) in &ports {
            s += "  - {";
            if !pname.is_empty() {
                s += &format!("name: {pname}, ");
            }
            s += &format!("protocol: {proto}, port: {port}, targetPort: {target}");
            let mut np = None;
            if kind != "ClusterIP" {
                let p = node_port(&mut r);
                s += &format!(", nodePort: {p}");
                np = Some(p);
            }
            s += "}\n";
            m.ports.push(model::Port {
                name: pname.clone(),
                udp: *proto == "UDP",
                port: *port,
                target: *target,
                node_port: np,
            });
        }
        if !lb_ips.is_empty() {
            let ingress: Vec<String> = lb_ips.iter().map(|ip| format!("{{ip: {ip}}}")).collect();
            s += &format!(
                "status:\n  loadBalancer:\n    ingress: [{}]\n",
                ingress.join(", ")
            );
        }
        out += &s;

        if r.chance(10) {
            cluster.services.push(m);
            continue; // no EndpointSlice at all
        }
        let slices = if r.chance(20) { 2 } else { 1 };
        let hints = r.chance(10);
        let mut eps: Vec<Vec<String>> = vec![Vec::new(); slices];
        let mut written: Vec<Vec<model::Ep>> = vec![Vec::new(); slices];
        for (pod, ip, node) in &pods {
            if !r.chance(55) {
                continue;
            }
            let mut me = model::Ep {
                pod: pod.clone(),
                ip: *ip,
                node: None,
                zone_hint: None,
                ready: false,
                serving: false,
                terminating: false,
            };
            let mut e = format!("- addresses: [{ip}]\n");
            if !r.chance(5) {
                e += &format!("  nodeName: {node}\n");
                me.node = Some(node.to_string());
            }
            if hints {
                let zone = r.pick(&["zone-a", "zone-b"]);
                e += &format!("  hints: {{forZones: [{{name: {zone}}}]}}\n");
                me.zone_hint = Some(zone.to_string());
            }
            // (ready, serving, terminating) as kube-proxy reads them: an absent
            // condition is ready / serving, not terminating.
            let (text, cond) = match r.below(100) {
                0..=34 => ("", (true, true, false)),
                35..=69 => ("  conditions: {ready: true}\n", (true, true, false)),
                70..=79 => (
                    "  conditions: {ready: false, serving: false, terminating: false}\n",
                    (false, false, false),
                ),
                80..=91 => (
                    "  conditions: {ready: false, serving: true, terminating: true}\n",
                    (false, true, true),
                ),
                _ => (
                    "  conditions: {ready: false, serving: false, terminating: true}\n",
                    (false, false, true),
                ),
            };
            e += text;
            (me.ready, me.serving, me.terminating) = cond;
            let slice = r.below(slices as u64) as usize;
            eps[slice].push(e);
            written[slice].push(me);
        }
        m.endpoints = written.into_iter().flatten().collect();
        cluster.services.push(m);
        for (j, list) in eps.iter().enumerate() {
            out += &format!(
                "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  \
                 name: {name}-{j}\n  namespace: {ns}\n  labels: {{kubernetes.io/service-name: {name}}}\n\
                 addressType: IPv4\nports:\n"
            );
            for (pname, proto, _, target) in &ports {
                out += "- {";
                if !pname.is_empty() {
                    out += &format!("name: {pname}, ");
                }
                out += &format!("port: {target}, protocol: {proto}}}\n");
            }
            if list.is_empty() {
                out += "endpoints: []\n";
            } else {
                out += "endpoints:\n";
                for e in list {
                    out += e;
                }
            }
        }
    }
    (out, cluster)
}

// ---------------------------------------------------------------------------------------
// The IR: what the flows are and what they should do
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq)]
struct Cidr(IpAddr, u8);

impl Cidr {
    fn parse(s: &str) -> Option<Cidr> {
        let (a, p) = s.split_once('/')?;
        Some(Cidr(a.parse().ok()?, p.parse().ok()?))
    }
    fn contains(&self, ip: IpAddr) -> bool {
        match (self.0, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.1)).unwrap_or(0);
                u32::from(ip) & mask == u32::from(net) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.1)).unwrap_or(0);
                u128::from(ip) & mask == u128::from(net) & mask
            }
            _ => false,
        }
    }
}

/// A lab host's address in `family`: a pod's or a client's, anything else the node's LAN
/// address.
fn host_ip(host: &str, family: Family) -> IpAddr {
    let spec = LabSpec::default();
    let ip = spec
        .local_pods
        .iter()
        .chain(&spec.remote_pods)
        .chain(&spec.clients)
        .find(|h| h.name == host)
        .map_or(super::addr::NODE_LAN, |h| h.ip);
    super::addr::of(ip, family)
}

/// The lab pod that has `ip` (in either family).
fn pod_at(ip: IpAddr) -> Option<String> {
    let spec = LabSpec::default();
    spec.local_pods
        .iter()
        .chain(&spec.remote_pods)
        .find(|h| {
            [Family::V4, Family::V6]
                .map(|f| super::addr::of(h.ip, f))
                .contains(&ip)
        })
        .map(|h| h.name.clone())
}

/// The family of an address.
fn family_of(ip: IpAddr) -> Family {
    match ip {
        IpAddr::V4(_) => Family::V4,
        IpAddr::V6(_) => Family::V6,
    }
}

/// The per-node decisions the flows need, read from `--target ir` output or computed by
/// [`model::view`].
struct View {
    /// The family of every address below and of the flows.
    family: Family,
    masquerade_all: bool,
    /// `None`: no detector; `Some(None)`: one that is not a CIDR (not modelled here).
    detector: Option<Option<Cidr>>,
    localhost_node_ports: bool,
    /// Where clients reach node ports (`None`: not on the lab node's LAN address).
    node_port_ip: Option<IpAddr>,
    /// Node ports are open on every local address (no `nodePortAddresses`).
    node_ports_everywhere: bool,
    ports: Vec<PortInfo>,
}

struct PortInfo {
    spn: String,
    proto: Option<Proto>,
    cluster_ip: Option<IpAddr>,
    port: u16,
    node_port: Option<u16>,
    external_ips: Vec<IpAddr>,
    lb_ips: Vec<IpAddr>,
    source_ranges: Vec<Cidr>,
    affinity: bool,
    internal_local: bool,
    external_local: bool,
    has_endpoints: bool,
    /// Backend name (`pod:port`) per endpoint; `None` when no lab server answers for it.
    endpoints: Vec<Option<String>>,
    cluster: Vec<usize>,
    local: Vec<usize>,
    /// The addresses of the endpoints on this node (`isLocal`).
    local_endpoint_ips: Vec<IpAddr>,
}

/// `v[key]`, which the IR always writes (null included): a renamed or missing key is a
/// failure, never an empty list that silently yields no flows.
fn field<'a>(v: &'a Value, key: &str) -> &'a Value {
    v.get(key)
        .unwrap_or_else(|| panic!("the IR has no `{key}` in {}", short(v)))
}

fn short(v: &Value) -> String {
    let t = v.to_string();
    t.chars().take(300).collect()
}

/// A list of addresses (strict: every element parses).
fn ips(v: &Value) -> Vec<IpAddr> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list of addresses: {}", short(v)))
        .iter()
        .map(|x| {
            x.as_str()
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("not an address: {x}"))
        })
        .collect()
}

fn indices(v: &Value) -> Vec<usize> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list of indices: {}", short(v)))
        .iter()
        .map(|x| x.as_u64().unwrap_or_else(|| panic!("not an index: {x}")) as usize)
        .collect()
}

/// The node view of the IR: its IPv4 one, or the IPv6 one of an IPv6-only case (the lab
/// is dual-stack; a dual-stack case's IPv6 half is the golden flows' and the IPv6 case's
/// business). Every key read must be there.
fn parse_view(ir: &str) -> View {
    let doc: Value = serde_json::from_str(ir).expect("IR is JSON");
    let views = field(&doc, "nodeViews").as_array().expect("nodeViews");
    let family_of_view = |v: &Value| match field(v, "family").as_str() {
        Some("IPv4") => Family::V4,
        Some("IPv6") => Family::V6,
        f => panic!("node view family {f:?}"),
    };
    let v = views
        .iter()
        .find(|v| family_of_view(v) == Family::V4)
        .or_else(|| views.first())
        .expect("the IR has a node view");
    let family = family_of_view(v);
    let node_ips = ips(field(v, "nodeIPs"));
    let lab_node = super::addr::of(super::addr::NODE_LAN, family);
    let npa = field(v, "nodePortAddresses");
    let node_port_ip = match field(npa, "kind").as_str() {
        Some("All") => Some(lab_node),
        _ => ips(field(npa, "ips"))
            .into_iter()
            .find(|ip| *ip == lab_node),
    }
    .filter(|_| node_ips.contains(&lab_node));
    let detector = match field(v, "localDetector") {
        Value::Null => None,
        d if d["kind"] == "Cidr" => Some(d["value"].as_str().and_then(Cidr::parse)),
        _ => Some(None),
    };
    let flag = |v: &Value, key: &str| {
        field(v, key)
            .as_bool()
            .unwrap_or_else(|| panic!("`{key}` is not a boolean"))
    };
    let ports = field(v, "ports")
        .as_array()
        .expect("ports")
        .iter()
        .map(|p| {
            let endpoints = field(p, "endpoints").as_array().expect("endpoints");
            PortInfo {
                spn: field(p, "spn").as_str().expect("spn").to_string(),
                proto: match field(p, "protocol").as_str() {
                    Some("TCP") => Some(Proto::Tcp),
                    Some("UDP") => Some(Proto::Udp),
                    _ => None,
                },
                cluster_ip: field(p, "clusterIP")
                    .as_str()
                    .map(|s| s.parse().unwrap_or_else(|_| panic!("clusterIP {s:?}"))),
                port: field(p, "port").as_u64().expect("port") as u16,
                node_port: field(p, "nodePort").as_u64().map(|n| n as u16),
                external_ips: ips(field(p, "externalIPs")),
                lb_ips: ips(field(p, "loadBalancerIPs")),
                source_ranges: field(p, "sourceRanges")
                    .as_array()
                    .expect("sourceRanges")
                    .iter()
                    .map(|c| {
                        c.as_str()
                            .and_then(Cidr::parse)
                            .unwrap_or_else(|| panic!("source range {c}"))
                    })
                    .collect(),
                affinity: !field(p, "affinityTimeout").is_null(),
                internal_local: flag(p, "internalLocal"),
                external_local: flag(p, "externalLocal"),
                has_endpoints: flag(p, "hasEndpoints"),
                endpoints: endpoints
                    .iter()
                    .map(|e| {
                        let ip: IpAddr = field(e, "ip").as_str()?.parse().ok()?;
                        let port = field(e, "port").as_u64()? as u16;
                        SERVED_PORTS.contains(&port).then_some(())?;
                        Some(format!("{}:{port}", pod_at(ip)?))
                    })
                    .collect(),
                cluster: indices(field(p, "clusterEndpoints")),
                local: indices(field(p, "localEndpoints")),
                local_endpoint_ips: endpoints
                    .iter()
                    .filter(|e| flag(e, "isLocal"))
                    .filter_map(|e| e["ip"].as_str()?.parse().ok())
                    .collect(),
            }
        })
        .collect();
    View {
        family,
        masquerade_all: flag(v, "masqueradeAll"),
        detector,
        localhost_node_ports: flag(v, "localhostNodePorts"),
        node_port_ip,
        node_ports_everywhere: field(npa, "kind") == "All",
        ports,
    }
}

/// What one flow should do, by the IR.
#[derive(Clone, Debug, PartialEq)]
enum Expect {
    /// Every probe answered by a backend of the set; all of them answer (or, `sticky`,
    /// all probes reach the same one). Each answer masqueraded as `masq` says, except
    /// that a pod reaching itself (hairpin) is always masqueraded.
    Answer {
        backends: BTreeSet<String>,
        masq: bool,
        sticky: bool,
    },
    /// Rejected (TCP RST or ICMP port unreachable).
    Refused,
    /// Dropped.
    Timeout,
    /// Not answered and not refused: dropped, or routed where nobody is.
    NoAnswer,
    /// The IR does not decide it unambiguously: only compared between the targets.
    Unknown,
}

/// An intended difference between the targets: the flow is not compared; each target
/// has its own expectation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Intended {
    /// nftables rejects a cluster IP's unknown ports; iptables lets them through.
    UnknownPort,
    /// `127.0.0.1:nodePort` works only in iptables mode.
    LocalhostNodePort,
    /// A load-balancer IP with source ranges and no endpoints, from outside the ranges:
    /// kube-proxy's iptables mode writes no KUBE-FW chain without endpoints, so the
    /// no-endpoints REJECT answers; its nftables mode keeps the firewall (pre-DNAT
    /// filter), which drops first.
    FirewallWithoutEndpoints,
    /// The node itself to an external or load-balancer IP of a service without
    /// endpoints: iptables mode REJECTs in KUBE-EXTERNAL-SERVICES, reached only from
    /// INPUT and FORWARD, so the node's own packet leaves unanswered; nftables mode's
    /// service-endpoints-check also runs in filter-output and rejects it.
    NoEndpointsFromHost,
    /// A node port on an address that does not accept node ports (nodePortAddresses,
    /// localhostNodePorts off), ETP=Local without local endpoints: iptables mode's DROP
    /// matches `--dst-type LOCAL` (every node address), nftables mode's
    /// no-endpoint-nodeports only the node-port addresses, so nothing listens: refused.
    NodePortDropEverywhere,
}

#[derive(Clone, Debug)]
struct Flow {
    /// Flows of one group run in order: the flows of one sender to a port view with
    /// session affinity (they share its affinity state for that sender); any other flow
    /// is a group of its own.
    group: String,
    /// The kind of destination (`cluster IP`, `node port`, ...).
    kind: String,
    /// `<service port> <kind>`.
    what: String,
    from: String,
    proto: Proto,
    dst: SocketAddr,
    /// What the IR says, for each target (the same unless `intended`).
    expect: [Expect; 2],
    intended: Option<Intended>,
    /// What `svc-compile trace` says, per target (filled after the flows are derived).
    traced: [Traced; 2],
    /// The service port of the view it goes to (its index in `View::ports`).
    port: Option<usize>,
}

impl Flow {
    fn line(&self) -> String {
        format!(
            "{} {:?} {} ({})",
            self.from, self.proto, self.dst, self.what
        )
    }
}

/// The backends of an endpoint set, or `None` when some endpoint has no lab server.
fn names(p: &PortInfo, set: &[usize]) -> Option<BTreeSet<String>> {
    set.iter()
        .map(|&i| p.endpoints.get(i).cloned().flatten())
        .collect()
}

/// The flows of one node view:
/// - cluster IP from pod-a, pod-b, the node and client1;
/// - node port (on the node's LAN address), each load-balancer IP and external IP from
///   client1, client2, pod-a and the node;
/// - node port on the local pods' gateway address (10.244.1.1) from pod-a;
/// - `127.0.0.1:nodePort` from the node (intended difference when the IR enables
///   localhost node ports);
/// - once per manifest, an unknown port of a cluster IP from pod-a (intended difference).
fn derive_flows(view: &View) -> Vec<Flow> {
    let mut flows = Vec::new();
    let family = view.family;
    let lab_ip = |host: &str| host_ip(host, family);
    let is_pod = |host: &str| host.starts_with("pod-");
    // Masquerade of cluster-IP traffic: masqueradeAll, or a source the detector does
    // not call local. A detector that is not a CIDR is not modelled.
    let cluster_masq = |from: &str| -> Option<bool> {
        if view.masquerade_all {
            return Some(true);
        }
        match view.detector {
            None => Some(false),
            Some(Some(c)) => Some(!c.contains(lab_ip(from))),
            Some(None) => None,
        }
    };
    // No endpoints at all: REJECT; endpoints elsewhere but none for this traffic: DROP.
    let empty = |p: &PortInfo| {
        if p.has_endpoints {
            Expect::Timeout
        } else {
            Expect::Refused
        }
    };
    let answer = |p: &PortInfo, set: &[usize], masq: Option<bool>| -> Expect {
        if set.is_empty() {
            return empty(p);
        }
        match (names(p, set), masq) {
            (Some(backends), Some(masq)) => Expect::Answer {
                backends,
                masq,
                sticky: p.affinity,
            },
            _ => Expect::Unknown,
        }
    };

    for (g, p) in view.ports.iter().enumerate() {
        let Some(proto) = p.proto else { continue };
        let mut add = |what: String, from: &str, dst: SocketAddr, e: [Expect; 2], i| {
            flows.push(Flow {
                group: if p.affinity {
                    format!("{g} {from}")
                } else {
                    format!("flow {}", flows.len())
                },
                what: format!("{} {what}", p.spn),
                kind: what,
                from: from.to_string(),
                proto,
                dst,
                expect: e,
                intended: i,
                traced: Default::default(),
                port: Some(g),
            })
        };
        let both = |e: Expect| [e.clone(), e];

        if let Some(ip) = p.cluster_ip {
            let set = if p.internal_local {
                &p.local
            } else {
                &p.cluster
            };
            for from in ["pod-a", "pod-b", "node", "client1"] {
                let e = answer(p, set, cluster_masq(from));
                add(
                    "cluster IP".into(),
                    from,
                    (ip, p.port).into(),
                    both(e),
                    None,
                );
            }
        }

        // External destinations. From a client: the external policy's set (ETP=Local:
        // the local endpoints, source kept; Cluster: masqueraded). From a local pod:
        // short-circuited to the cluster endpoints (masqueraded unless ETP=Local).
        let external = |from: &str, source_ranges: &[Cidr]| -> Expect {
            if !source_ranges.is_empty() && !source_ranges.iter().any(|c| c.contains(lab_ip(from)))
            {
                // Dropped by the firewall; without endpoints the IR does not say
                // whether the firewall or the no-endpoints REJECT comes first.
                return if p.has_endpoints {
                    Expect::Timeout
                } else {
                    Expect::Unknown
                };
            }
            if from == "node" {
                // Host traffic: masqueraded, to the cluster endpoints (ETP=Local
                // short-circuits it too).
                return if p.has_endpoints {
                    answer(p, &p.cluster, Some(true))
                } else {
                    Expect::Refused
                };
            }
            if is_pod(from) {
                // The short-circuit needs a detector that calls the pod local.
                let local = matches!(view.detector, Some(Some(c)) if c.contains(lab_ip(from)));
                if p.external_local && !local {
                    return Expect::Unknown;
                }
                answer(p, &p.cluster, Some(!p.external_local))
            } else if p.external_local {
                answer(p, &p.local, Some(false))
            } else {
                answer(p, &p.cluster, Some(true))
            }
        };
        let mut external_dsts: Vec<(String, IpAddr, u16, &[Cidr])> = Vec::new();
        if let (Some(np), Some(ip)) = (p.node_port, view.node_port_ip) {
            external_dsts.push(("node port".into(), ip, np, &[][..]));
        }
        for ip in &p.lb_ips {
            external_dsts.push(("load-balancer IP".into(), *ip, p.port, &p.source_ranges));
        }
        for ip in &p.external_ips {
            external_dsts.push(("external IP".into(), *ip, p.port, &[][..]));
        }
        let blocked = |from: &str, ranges: &[Cidr]| {
            !ranges.is_empty() && !ranges.iter().any(|c| c.contains(lab_ip(from)))
        };
        for (what, ip, port, ranges) in external_dsts {
            for from in ["client1", "client2", "pod-a", "node"] {
                let routed = what != "node port";
                let (e, i) = if !p.has_endpoints && routed && from == "node" {
                    let nft = if blocked(from, ranges) {
                        Expect::Timeout
                    } else {
                        Expect::Refused
                    };
                    ([Expect::NoAnswer, nft], Some(Intended::NoEndpointsFromHost))
                } else if !p.has_endpoints && blocked(from, ranges) {
                    (
                        [Expect::Refused, Expect::Timeout],
                        Some(Intended::FirewallWithoutEndpoints),
                    )
                } else {
                    (both(external(from, ranges)), None)
                };
                add(what.clone(), from, (ip, port).into(), e, i);
            }
        }
        // ETP=Local without local endpoints: iptables drops the node port on every node
        // address, nftables only on the node-port addresses.
        let dropped_everywhere = p.external_local && p.has_endpoints && p.local.is_empty();
        // The node port on another node address, the local pods' gateway: a node port
        // only when nodePortAddresses leaves it open, else nothing listens there.
        if let Some(np) = p.node_port {
            let (e, i) = if view.node_ports_everywhere {
                (both(external("pod-a", &[])), None)
            } else if dropped_everywhere {
                (
                    [Expect::Timeout, Expect::Refused],
                    Some(Intended::NodePortDropEverywhere),
                )
            } else {
                (both(Expect::Refused), None)
            };
            let dst = (super::addr::of(super::addr::NODE_POD_GW, family), np).into();
            add("node port on the pod gateway".into(), "pod-a", dst, e, i);
        }

        if let Some(np) = p.node_port {
            let loopback: IpAddr = match family {
                Family::V4 => Ipv4Addr::LOCALHOST.into(),
                Family::V6 => std::net::Ipv6Addr::LOCALHOST.into(),
            };
            let dst: SocketAddr = (loopback, np).into();
            if view.localhost_node_ports {
                // iptables: like host traffic to any node port.
                let ipt = external("node", &[]);
                add(
                    "localhost node port".into(),
                    "node",
                    dst,
                    [ipt, Expect::Refused],
                    Some(Intended::LocalhostNodePort),
                );
            } else if dropped_everywhere {
                add(
                    "localhost node port (off)".into(),
                    "node",
                    dst,
                    [Expect::Timeout, Expect::Refused],
                    Some(Intended::NodePortDropEverywhere),
                );
            } else {
                add(
                    "localhost node port (off)".into(),
                    "node",
                    dst,
                    both(Expect::Refused),
                    None,
                );
            }
        }
    }

    // One unknown port of one cluster IP (port 1: no case or generated service uses it).
    if let Some(p) = view.ports.iter().find(|p| p.cluster_ip.is_some()) {
        flows.push(Flow {
            group: format!("flow {}", flows.len()),
            what: format!("{} cluster IP, unknown port", p.spn),
            kind: "cluster IP, unknown port".into(),
            from: "pod-a".into(),
            proto: Proto::Tcp,
            dst: (p.cluster_ip.unwrap(), 1).into(),
            expect: [Expect::NoAnswer, Expect::Refused],
            intended: Some(Intended::UnknownPort),
            traced: Default::default(),
            port: None,
        });
    }
    flows
}

// ---------------------------------------------------------------------------------------
// `svc-compile trace`: an independent answer for every flow
// ---------------------------------------------------------------------------------------

/// What `svc-compile trace --format json` answered for a flow, in lab terms. It is
/// computed by the library's `trace` from the node view (not from [`derive_flows`]'s
/// reasoning), and the kernel must agree with it on every flow.
#[derive(Clone, Debug, Default, PartialEq)]
enum Traced {
    /// Not traced yet (a bug in the test if it stays).
    #[default]
    Missing,
    /// Forwarded: backend (`pod:port`) → masqueraded; `sticky` with session affinity.
    Forward {
        backends: BTreeMap<String, bool>,
        sticky: bool,
    },
    /// A backend the lab does not serve: the kernel cannot show it; not compared.
    Unservable,
    Reject,
    Drop,
    /// No service rule: `local` = the node's own stack answers (nothing listens: refused),
    /// else routed on (no answer).
    NoMatch {
        local: bool,
    },
}

/// The sender's address as the node sees it (loopback for the node's own loopback flows).
fn source_ip(f: &Flow) -> IpAddr {
    if f.dst.ip().is_loopback() {
        return f.dst.ip();
    }
    host_ip(&f.from, family_of(f.dst.ip()))
}

/// Trace every flow through the CLI, once per target (`--flows`, JSON), and record the
/// answers in the flows. Returns how many flows got an answer the kernel can show.
fn trace_flows(m: &Manifest, flows: &mut [Flow]) -> usize {
    let file = std::env::temp_dir().join(format!(
        "svc-diff-trace-{}-{}.flows",
        std::process::id(),
        m.label.replace(' ', "-")
    ));
    let text: String = flows
        .iter()
        .map(|f| {
            let proto = match f.proto {
                Proto::Tcp => "tcp",
                Proto::Udp => "udp",
            };
            format!("{} {} {proto}\n", source_ip(f), f.dst)
        })
        .collect();
    std::fs::write(&file, text).expect("write flows file");
    let family = flows.first().map_or(Family::V4, |f| family_of(f.dst.ip()));
    let mut comparable = 0;
    for (t, target) in TARGETS.iter().enumerate() {
        let out = m.trace(target, file.to_str().unwrap(), family);
        let answers: Value = serde_json::from_str(&out).expect("trace JSON");
        let answers = answers.as_array().expect("an array with --flows");
        assert_eq!(
            answers.len(),
            flows.len(),
            "{}: one trace per flow",
            m.label
        );
        for (f, a) in flows.iter_mut().zip(answers) {
            let v = &a["verdict"];
            f.traced[t] = match v["kind"].as_str() {
                Some("forward") => {
                    let backends: Option<BTreeMap<String, bool>> = v["backends"]
                        .as_array()
                        .expect("backends")
                        .iter()
                        .map(|b| {
                            let addr: SocketAddr = b["addr"].as_str()?.parse().ok()?;
                            let port = addr.port();
                            SERVED_PORTS.contains(&port).then_some(())?;
                            Some((
                                format!("{}:{port}", pod_at(addr.ip())?),
                                b["masquerade"] == true,
                            ))
                        })
                        .collect();
                    match backends {
                        Some(backends) => Traced::Forward {
                            backends,
                            sticky: !v["affinity_seconds"].is_null(),
                        },
                        None => Traced::Unservable,
                    }
                }
                Some("reject") => Traced::Reject,
                Some("drop") => Traced::Drop,
                Some("no-match") => Traced::NoMatch {
                    local: v["local"] == true,
                },
                k => panic!("{}: trace verdict {k:?}", m.label),
            };
            if f.traced[t] != Traced::Unservable {
                comparable += 1;
            }
        }
    }
    let _ = std::fs::remove_file(&file);
    comparable
}

/// Whether what the kernel did (`s`) is what the trace said.
fn trace_agrees(t: &Traced, s: &Seen) -> bool {
    let unanswered = |allowed: &dyn Fn(&str) -> bool| {
        s.answers.is_empty() && !s.others.is_empty() && s.others.iter().all(|o| allowed(class(o)))
    };
    match t {
        Traced::Missing => false,
        Traced::Unservable => true,
        Traced::Forward { backends, sticky } => {
            let reached = if *sticky {
                s.answers.len() == 1
            } else {
                s.answers.len() == backends.len()
            };
            s.others.is_empty()
                && reached
                && s.answers.iter().all(|(b, m)| {
                    backends
                        .get(b)
                        .is_some_and(|masq| *m == BTreeSet::from([*masq]))
                })
        }
        Traced::Reject | Traced::NoMatch { local: true } => unanswered(&|o| o == "refused"),
        Traced::Drop => unanswered(&|o| o == "timeout"),
        Traced::NoMatch { local: false } => unanswered(&|o| o != "refused"),
    }
}

// ---------------------------------------------------------------------------------------
// Probing and comparing
// ---------------------------------------------------------------------------------------

/// What one flow did on one target.
#[derive(Clone, Debug, Default, PartialEq)]
struct Seen {
    /// Backend → masquerade flags seen (`true`: it saw an address other than the sender's).
    answers: BTreeMap<String, BTreeSet<bool>>,
    /// Probes without an answer: `refused`, `timeout`, `failed: <error>`.
    others: BTreeSet<String>,
    probes: usize,
}

impl Seen {
    fn describe(&self) -> String {
        let mut parts: Vec<String> = self
            .answers
            .iter()
            .map(|(b, m)| {
                let m: Vec<&str> = m
                    .iter()
                    .map(|&m| if m { "masq" } else { "direct" })
                    .collect();
                format!("{b} {}", m.join("+"))
            })
            .collect();
        parts.extend(self.others.iter().cloned());
        format!("[{}] in {} probes", parts.join(", "), self.probes)
    }
}

/// The class of an unanswered probe that the comparison uses: `timeout` also stands
/// for "no route to host", which is what a packet routed to the lab node's absent
/// default gateway gets instead once the neighbour entry has failed — the same fate.
fn class(other: &str) -> &str {
    if other.contains("os error 113") {
        "timeout"
    } else {
        other
    }
}

/// A flow's first pass and its re-check as one observation. The re-check is there for
/// slow answers only: it may take back the first pass's timeouts, nothing else. Every
/// answer either pass saw stays (a wrong backend or a wrong masquerade seen once is a
/// finding), and so does every unanswered probe that was not a timeout (a refusal, an
/// error).
fn forgive_timeouts(first: &Seen, again: &Seen) -> Seen {
    let mut m = again.clone();
    for (backend, masq) in &first.answers {
        m.answers
            .entry(backend.clone())
            .or_default()
            .extend(masq.iter().copied());
    }
    m.others.extend(
        first
            .others
            .iter()
            .filter(|o| class(o) != "timeout")
            .cloned(),
    );
    m.probes += first.probes;
    m
}

fn hairpin(from: &str, backend: &str) -> bool {
    backend.split(':').next() == Some(from)
}

fn ok_vs(e: &Expect, from: &str, s: &Seen) -> bool {
    let unanswered = |allowed: &dyn Fn(&str) -> bool| {
        s.answers.is_empty() && !s.others.is_empty() && s.others.iter().all(|o| allowed(class(o)))
    };
    match e {
        Expect::Answer {
            backends,
            masq,
            sticky,
        } => {
            let set: BTreeSet<&String> = s.answers.keys().collect();
            let reached = if *sticky {
                set.len() == 1 && set.iter().all(|b| backends.contains(*b))
            } else {
                set == backends.iter().collect()
            };
            s.others.is_empty()
                && reached
                && s.answers
                    .iter()
                    .all(|(b, m)| *m == BTreeSet::from([*masq || hairpin(from, b)]))
        }
        Expect::Refused => unanswered(&|o| o == "refused"),
        Expect::Timeout => unanswered(&|o| o == "timeout"),
        Expect::NoAnswer => unanswered(&|o| o != "refused"),
        Expect::Unknown => true,
    }
}

/// What is compared between the targets. With session affinity the backend itself is
/// chance: then only "sticky" (and the masquerade rule) is compared.
fn key(f: &Flow, s: &Seen) -> String {
    let others: BTreeSet<&str> = s.others.iter().map(|o| class(o)).collect();
    if let Expect::Answer {
        masq, sticky: true, ..
    } = &f.expect[0]
    {
        let masq_ok = s
            .answers
            .iter()
            .all(|(b, m)| *m == BTreeSet::from([*masq || hairpin(&f.from, b)]));
        return format!(
            "sticky={} masq-as-IR={masq_ok} others={others:?}",
            s.answers.len() == 1
        );
    }
    format!("{:?} others={others:?}", s.answers)
}

/// Probe one flow: enough to see every expected backend (and stickiness), few probes
/// for refusals and drops. `careful`: longer timeout and more probes (the re-check).
fn run_flow(lab: &Lab, f: &Flow, e: &Expect, careful: bool) -> Seen {
    let timeout = if careful {
        RECHECK_TIMEOUT
    } else {
        FAST_TIMEOUT
    };
    let (min, max) = match e {
        Expect::Answer { sticky: true, .. } => (10, 10),
        Expect::Answer { backends, .. } => ((3 * backends.len()).max(6), 60),
        Expect::Refused => (2, 2),
        Expect::Timeout | Expect::NoAnswer => (1, 1),
        Expect::Unknown => (16, 40),
    };
    let (min, max) = if careful {
        (min.max(3) * 2, max.max(3) * 2)
    } else {
        (min, max)
    };
    let own = if f.dst.ip().is_loopback() {
        f.dst.ip()
    } else {
        lab.ip(&f.from, family_of(f.dst.ip()))
    };
    let mut s = Seen::default();
    let mut unanswered = 0;
    for i in 1..=max {
        s.probes = i;
        match probe_in(lab.netns(&f.from), f.proto, f.dst, timeout) {
            Outcome::Answered {
                backend,
                seen_source,
            } => {
                s.answers
                    .entry(backend)
                    .or_default()
                    .insert(seen_source != own);
            }
            other => {
                unanswered += 1;
                s.others.insert(match other {
                    Outcome::Refused => "refused".into(),
                    Outcome::TimedOut => "timeout".into(),
                    Outcome::Failed(m) => format!("failed: {m}"),
                    Outcome::Answered { .. } => unreachable!(),
                });
            }
        }
        // Nothing answers: more probes (each a timeout, maybe) say nothing new. The
        // re-check only has to rule out a slow answer: one long probe does.
        if s.answers.is_empty() && unanswered >= if careful { 1 } else { 2 } {
            break;
        }
        if i < min {
            continue;
        }
        let done = match e {
            Expect::Answer {
                backends,
                sticky: false,
                ..
            } => backends.iter().all(|b| s.answers.contains_key(b)),
            Expect::Unknown => false,
            _ => true,
        };
        if done {
            break;
        }
    }
    s
}

/// Run `flows` (the indices given) on one lab: groups in parallel, a group in order.
fn run_flows(lab: &Lab, t: usize, flows: &[Flow], which: &[usize], careful: bool) -> Vec<Seen> {
    let mut groups: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for &i in which {
        groups.entry(&flows[i].group).or_default().push(i);
    }
    // Groups that may wait for timeouts first: they are the long ones.
    let mut groups: Vec<Vec<usize>> = groups.into_values().collect();
    groups.sort_by_key(|g| {
        let waits = |i: &usize| matches!(flows[*i].expect[t], Expect::Timeout | Expect::NoAnswer);
        std::cmp::Reverse(g.iter().filter(|i| waits(i)).count())
    });
    let results = Mutex::new(vec![Seen::default(); flows.len()]);
    let next = AtomicUsize::new(0);
    thread::scope(|s| {
        for _ in 0..WORKERS.min(groups.len()) {
            s.spawn(|| loop {
                let g = next.fetch_add(1, Ordering::Relaxed);
                let Some(group) = groups.get(g) else { break };
                for &i in group {
                    let seen = run_flow(lab, &flows[i], &flows[i].expect[t], careful);
                    results.lock().unwrap()[i] = seen;
                }
            });
        }
    });
    results.into_inner().unwrap()
}

/// Why a flow is wrong (empty: fine), from what both targets saw.
fn judge(f: &Flow, seen: &[Seen; 2]) -> Vec<String> {
    let mut why = Vec::new();
    if f.intended.is_none() && key(f, &seen[0]) != key(f, &seen[1]) {
        why.push("the targets differ".to_string());
    }
    for t in 0..2 {
        if !trace_agrees(&f.traced[t], &seen[t]) {
            why.push(format!(
                "{} disagrees with `svc-compile trace` ({:?})",
                TARGETS[t], f.traced[t]
            ));
        }
        if !ok_vs(&f.expect[t], &f.from, &seen[t]) {
            why.push(format!(
                "{} disagrees with the expectation ({:?})",
                TARGETS[t], f.expect[t]
            ));
        }
    }
    why
}

// ---------------------------------------------------------------------------------------
// Driver
// ---------------------------------------------------------------------------------------

struct Manifest {
    /// `golden NAME` or `seed N`.
    label: String,
    case: Option<String>,
    text: Option<String>,
    /// What a generated manifest says, for the test's own expectations ([`model`]).
    model: Option<model::Cluster>,
}

impl Manifest {
    /// Generated manifest `seed`.
    fn generated(seed: u64) -> Manifest {
        let (text, model) = generate(seed);
        Manifest {
            label: format!("seed {seed}"),
            case: None,
            text: Some(text),
            model: Some(model),
        }
    }

    /// The view the flows and their expectations come from: for a generated manifest the
    /// test's own model of kube-proxy ([`model::view`]), never the compiler's; for a golden
    /// case or a file of one's own, `--target ir`'s (their expectations are reviewed as
    /// snapshots and their golden flows).
    fn view(&self) -> View {
        match &self.model {
            Some(c) => model::view(c),
            None => parse_view(&self.compile("ir")),
        }
    }
}

impl Manifest {
    /// `svc-compile trace --flows FILE --format json` for this manifest and target; the
    /// lab node's pod gateway is a local address (node ports answer there too).
    /// The lab node's own addresses in `family`, for `trace` and `migrate`
    /// (`--local-ip`): the pod gateway, and the LAN address also where the Node object
    /// lacks it (a case whose node has no address of the family).
    fn local_ips(family: Family) -> [String; 2] {
        [super::addr::NODE_POD_GW, super::addr::NODE_LAN]
            .map(|ip| super::addr::of(ip, family).to_string())
    }

    fn trace(&self, target: &str, flows: &str, family: Family) -> String {
        let [gw, lan] = Manifest::local_ips(family);
        let mut a: Vec<String> = vec!["trace".into()];
        match &self.case {
            Some(case) => {
                a.push(format!("golden/cases/{case}"));
                a.extend(crate::golden::case_args(case));
            }
            None => a.extend(["-".into(), "--node".into(), NODE.into()]),
        }
        let tail = [
            "--target",
            target,
            "--format",
            "json",
            "--flows",
            flows,
            "--local-ip",
            &gw,
            "--local-ip",
            &lan,
        ];
        a.extend(tail.iter().map(|s| s.to_string()));
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let r = svc(&a, self.text.as_deref(), &root());
        assert_eq!(
            r.code, 0,
            "{}: `{}` exited {}\n{}",
            self.label, r.cmdline, r.code, r.stderr
        );
        r.stdout
    }

    fn compile(&self, target: &str) -> String {
        self.compile_with(target, &[])
    }

    /// [`Manifest::compile`] with more flags (the nftables layout).
    fn compile_with(&self, target: &str, extra: &[&str]) -> String {
        if let Some(case) = &self.case {
            return compile_case_with(case, target, extra);
        }
        let text = self.text.as_deref().unwrap();
        let mut a = vec!["-", "--target", target, "--node", NODE];
        a.extend(extra);
        let r = svc(&a, Some(text), &root());
        assert_eq!(
            r.code, 0,
            "{}: `{}` exited {}\n{}\n--- manifest\n{text}",
            self.label, r.cmdline, r.code, r.stderr
        );
        r.stdout
    }
}

#[derive(Default)]
struct Stats {
    manifests: usize,
    flows: usize,
    /// (flow, target) pairs whose `svc-compile trace` answer was checked against the kernel.
    traced: usize,
    probes: usize,
    rechecked: usize,
    /// Wall time: compiling, loading, probing (first pass), re-checking.
    phases: [Duration; 4],
    /// Intended differences seen: kind → flows where the targets did differ.
    intended: BTreeMap<String, usize>,
    /// Failing flows by signature (sender, destination kind, protocol, what each target
    /// did): how many, and the first manifest that showed it.
    signatures: BTreeMap<String, (usize, String)>,
    /// Its lab, made on first use.
    ebpf: Option<ebpf::Side>,
    /// `svc-compile migrate`'s claims checked.
    migrate: migrate::Counts,
    /// Flows checked, by destination kind, by what was expected of them (per target) and
    /// by intended difference; manifests by where their expectations came from and by
    /// family: [`Stats::assert_every_kind`] requires some of each.
    kinds: BTreeMap<String, usize>,
    expected: BTreeMap<&'static str, usize>,
    intended_flows: BTreeMap<String, usize>,
    sources: BTreeMap<&'static str, usize>,
}

/// The destination kinds of [`derive_flows`].
const FLOW_KINDS: [&str; 8] = [
    "cluster IP",
    "node port",
    "load-balancer IP",
    "external IP",
    "node port on the pod gateway",
    "localhost node port",
    "localhost node port (off)",
    "cluster IP, unknown port",
];

impl Stats {
    fn count(&mut self, m: &Manifest, view: &View, flows: &[Flow]) {
        let source = match (&m.model, view.family) {
            (Some(_), _) => "generated (own model)",
            (None, Family::V4) => "IR, IPv4",
            (None, Family::V6) => "IR, IPv6",
        };
        *self.sources.entry(source).or_default() += 1;
        for f in flows {
            *self.kinds.entry(f.kind.clone()).or_default() += 1;
            if let Some(i) = f.intended {
                *self.intended_flows.entry(format!("{i:?}")).or_default() += 1;
            }
            for e in &f.expect {
                let k = match e {
                    Expect::Answer { sticky: true, .. } => "answer (sticky)",
                    Expect::Answer { .. } => "answer",
                    Expect::Refused => "refused",
                    Expect::Timeout => "timeout",
                    Expect::NoAnswer => "no answer",
                    Expect::Unknown => "unknown",
                };
                *self.expected.entry(k).or_default() += 1;
            }
        }
    }

    /// A run over the golden cases and generated manifests must have checked flows of
    /// every kind: a renamed IR key, a generator change or a view that yields nothing is a
    /// failure, not a quiet pass.
    fn assert_every_kind(&self) {
        let mut missing: Vec<String> = Vec::new();
        for k in FLOW_KINDS {
            if self.kinds.get(k).copied().unwrap_or(0) == 0 {
                missing.push(format!("flows to {k}"));
            }
        }
        for k in [
            "answer",
            "answer (sticky)",
            "refused",
            "timeout",
            "no answer",
        ] {
            if self.expected.get(k).copied().unwrap_or(0) == 0 {
                missing.push(format!("flows expected to get `{k}`"));
            }
        }
        for k in [
            Intended::UnknownPort,
            Intended::LocalhostNodePort,
            Intended::FirewallWithoutEndpoints,
            Intended::NoEndpointsFromHost,
            Intended::NodePortDropEverywhere,
        ] {
            if self
                .intended_flows
                .get(&format!("{k:?}"))
                .copied()
                .unwrap_or(0)
                == 0
            {
                missing.push(format!("flows of the intended difference {k:?}"));
            }
        }
        for k in ["IR, IPv4", "IR, IPv6", "generated (own model)"] {
            if self.sources.get(k).copied().unwrap_or(0) == 0 {
                missing.push(format!("manifests with expectations from {k}"));
            }
        }
        if self.traced == 0 {
            missing.push("flows traced by `svc-compile trace`".into());
        }
        assert!(
            missing.is_empty(),
            "the differential checked nothing of: {}\n(kinds {:?}, expected {:?}, intended {:?}, \
             manifests {:?})",
            missing.join(", "),
            self.kinds,
            self.expected,
            self.intended_flows,
            self.sources
        );
    }
}

/// What a target did with a flow, in a word or two: `answered`, `refused`, `timeout`.
fn brief(s: &Seen) -> String {
    let mut v: BTreeSet<&str> = s.others.iter().map(|o| class(o)).collect();
    if !s.answers.is_empty() {
        v.insert("answered");
    }
    v.into_iter().collect::<Vec<_>>().join("+")
}

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

/// Load one manifest in both labs, run its flows, re-check what disagrees; returns the
/// failures as text.
fn check_manifest(
    labs: &[Lab; 2],
    m: &Manifest,
    stats: &mut Stats,
    nft: &[&str],
) -> Option<String> {
    let t0 = Instant::now();
    let view = m.view();
    let rules = TARGETS.map(|t| m.compile_with(t, if t == "nftables" { nft } else { &[] }));
    let mut flows = derive_flows(&view);
    stats.count(m, &view, &flows);
    stats.traced += trace_flows(m, &mut flows);
    let claims = migrate::claims(m, view.family);
    let t1 = Instant::now();
    thread::scope(|s| {
        for t in 0..2 {
            let (lab, rules) = (&labs[t], &rules[t]);
            s.spawn(move || {
                reload(lab, TARGETS[t], rules);
                // Not a flush: see Lab::reset_conntrack.
                lab.reset_conntrack().expect("conntrack reset");
            });
        }
    });

    let t2 = Instant::now();
    let all: Vec<usize> = (0..flows.len()).collect();
    let run = |which: &[usize], careful: bool| -> [Vec<Seen>; 2] {
        thread::scope(|s| {
            let h: Vec<_> = (0..2)
                .map(|t| {
                    let flows = &flows;
                    let lab = &labs[t];
                    s.spawn(move || run_flows(lab, t, flows, which, careful))
                })
                .collect();
            let mut h = h.into_iter().map(|h| h.join().unwrap());
            [h.next().unwrap(), h.next().unwrap()]
        })
    };
    let [a, b] = run(&all, false);
    let t3 = Instant::now();
    let mut seen: Vec<[Seen; 2]> = a.into_iter().zip(b).map(|(a, b)| [a, b]).collect();
    stats.manifests += 1;
    stats.flows += flows.len();
    stats.probes += seen
        .iter()
        .map(|s| s[0].probes + s[1].probes)
        .sum::<usize>();

    let bad: Vec<usize> = all
        .iter()
        .copied()
        .filter(|&i| !judge(&flows[i], &seen[i]).is_empty())
        .collect();
    if !bad.is_empty() {
        stats.rechecked += bad.len();
        let [a, b] = run(&bad, true);
        for &i in &bad {
            seen[i] = [
                forgive_timeouts(&seen[i][0], &a[i]),
                forgive_timeouts(&seen[i][1], &b[i]),
            ];
            stats.probes += a[i].probes + b[i].probes;
        }
    }
    for (acc, d) in stats
        .phases
        .iter_mut()
        .zip([t1 - t0, t2 - t1, t3 - t2, t3.elapsed()])
    {
        *acc += d;
    }

    let mut failures = Vec::new();
    for (f, s) in flows.iter().zip(&seen) {
        if let Some(kind) = f.intended {
            if key(f, &s[0]) != key(f, &s[1]) {
                *stats.intended.entry(format!("{kind:?}")).or_default() += 1;
            }
        }
        let why = judge(f, s);
        if !why.is_empty() {
            let sig = format!(
                "{} -> {} ({:?}): iptables {}, nftables {}",
                f.from,
                f.kind,
                f.proto,
                brief(&s[0]),
                brief(&s[1])
            );
            stats
                .signatures
                .entry(sig)
                .or_insert((0, m.label.clone()))
                .0 += 1;
            failures.push(format!(
                "  {}: {}\n    iptables: {}\n    nftables: {}",
                f.line(),
                why.join("; "),
                s[0].describe(),
                s[1].describe()
            ));
        }
    }
    failures.extend(migrate::check(
        &claims,
        &flows,
        &seen,
        &view,
        &mut stats.migrate,
    ));
    // The socket load balancer does not depend on the nftables layout: one run checks it.
    if nft.is_empty() {
        let side = stats.ebpf.get_or_insert_with(ebpf::Side::new);
        failures.extend(ebpf::check(side, m, &flows, &view));
    }
    if failures.is_empty() {
        return None;
    }
    let mut text = format!(
        "{}: {} flow(s) wrong\n{}",
        m.label,
        failures.len(),
        failures.join("\n")
    );
    // What the node's conntrack counted (drops, insert failures, clashes), in both labs:
    // a flow that times out in one target but not the other is first a question of where
    // its packets went.
    for (t, lab) in labs.iter().enumerate() {
        let stats = lab
            .exec_ok(super::lab::NODE, "conntrack", &["-S"], None)
            .unwrap_or_else(|e| format!("(conntrack -S: {e})"));
        text += &format!(
            "\n--- node conntrack -S, {} lab\n{}",
            TARGETS[t],
            stats.trim_end()
        );
    }
    for (t, lab) in labs.iter().enumerate() {
        text += &format!("\n--- backends' TCP counters, {} lab", TARGETS[t]);
        for pod in lab.pods() {
            let c = super::timewait::counters(lab, pod, &BACKEND_COUNTERS);
            let c: Vec<String> = BACKEND_COUNTERS
                .iter()
                .zip(c)
                .map(|(n, v)| format!("{n} {v}"))
                .collect();
            text += &format!("\n{pod}: {}", c.join(", "));
        }
    }
    if let Some(t) = &m.text {
        text += &format!("\n--- manifest ({})\n{t}", m.label);
    }
    Some(text)
}

/// A lab tagged `tag` whose every pod answers on every [`SERVED_PORTS`] port, TCP and UDP,
/// naming itself.
fn served_lab(tag: &str) -> Lab {
    let spec = LabSpec::default();
    let mut lab = Lab::new(tag, &spec).expect("lab");
    for pod in spec.local_pods.iter().chain(&spec.remote_pods) {
        for port in SERVED_PORTS {
            for proto in [Proto::Tcp, Proto::Udp] {
                lab.serve_as(&pod.name, &format!("{}:{port}", pod.name), proto, port)
                    .expect("serve");
            }
        }
    }
    lab
}

#[test]
fn iptables_and_nftables_agree() {
    agree(&[], ["diffipt", "diffnft"]);
}

/// The differential run, the nftables target compiled with `nft` added to its flags
/// (`--nft-layout fast`: see `nft_layout.rs`), in labs tagged `tags`.
pub fn agree(nft: &[&str], tags: [&str; 2]) {
    if !require_root(&format!("kernel differential iptables/nftables {nft:?}")) {
        return;
    }
    let start = Instant::now();
    let cases = env_u64("SVC_DIFF_CASES", DEFAULT_CASES);
    let first = env_u64("SVC_DIFF_SEED", 1);
    let golden = env_u64("SVC_DIFF_GOLDEN", 1) != 0;

    let labs = tags.map(served_lab);

    let mut manifests: Vec<Manifest> = Vec::new();
    if let Ok(path) = std::env::var("SVC_DIFF_FILE") {
        // One manifest of your own (compiled with `--node node-1`), nothing else.
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        manifests.push(Manifest {
            label: format!("file {path}"),
            case: None,
            text: Some(text),
            model: None,
        });
    } else {
        if golden {
            manifests.extend(case_dirs().into_iter().map(|c| Manifest {
                label: format!("golden {c}"),
                case: Some(c),
                text: None,
                model: None,
            }));
        }
        manifests.extend((first..first + cases).map(Manifest::generated));
    }

    let mut stats = Stats::default();
    let mut failures = Vec::new();
    for m in &manifests {
        if let Some(f) = check_manifest(&labs, m, &mut stats, nft) {
            eprintln!("{f}\n");
            failures.push(f);
        }
    }
    // SYNs that met a backend's TIME_WAIT and failed its PAWS check (a new connection NATed
    // onto an old 4-tuple; see timewait.rs): each costs a reset and a SYN retransmission.
    let paws: Vec<u64> = labs
        .iter()
        .map(|lab| {
            lab.pods()
                .iter()
                .map(|p| super::timewait::counters(lab, p, &["TcpExtPAWSTimewait"])[0])
                .sum()
        })
        .collect();
    println!(
        "differential: backends' TcpExtPAWSTimewait: iptables lab {}, nftables lab {}",
        paws[0], paws[1]
    );
    let generated = manifests
        .iter()
        .filter(|m| m.label.starts_with("seed"))
        .count() as u64;
    println!(
        "differential {nft:?}: {} manifests ({generated} generated, seeds {first}..{}), {} flows, \
         {} (flow, target) answers of `svc-compile trace` checked against the kernel, {} probes, \
         {} flows re-checked, intended differences seen: {:?}, {:.1} s \
         (compile {:.1}, load {:.1}, probe {:.1}, re-check {:.1})",
        stats.manifests,
        first + generated,
        stats.flows,
        stats.traced,
        stats.probes,
        stats.rechecked,
        stats.intended,
        start.elapsed().as_secs_f64(),
        stats.phases[0].as_secs_f64(),
        stats.phases[1].as_secs_f64(),
        stats.phases[2].as_secs_f64(),
        stats.phases[3].as_secs_f64(),
    );
    println!(
        "differential migrate: {} flows matched to `svc-compile migrate`'s, {} reported and seen \
         differing, reported but not observable in the lab (by reason): {:?}",
        stats.migrate.checked, stats.migrate.differing, stats.migrate.unobservable
    );
    if let Some(e) = &stats.ebpf {
        println!(
            "differential ebpf: {} manifests applied, {} flows probed ({} where Cilium's expectation is not kube-proxy's)",
            e.applied, e.flows, e.policy_differs
        );
    }
    let kinds: Vec<String> = stats
        .signatures
        .iter()
        .map(|(sig, (n, first))| format!("  {n:>4} x {sig} (first: {first})"))
        .collect();
    assert!(
        failures.is_empty(),
        "iptables and nftables disagree (or with the expectation) on {} manifest(s) \
         (each printed above with its flows and text): {}\nFailing flows by kind:\n{}",
        failures.len(),
        failures
            .iter()
            .map(|f| f.split(':').next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join(", "),
        kinds.join("\n")
    );
    // The full run (every golden case and at least the default generated manifests, as
    // CI runs it) must reach every kind; a shorter one, to reproduce a seed, anything.
    if std::env::var_os("SVC_DIFF_FILE").is_none() && golden && generated >= DEFAULT_CASES {
        stats.assert_every_kind();
        if let Some(e) = &stats.ebpf {
            e.assert_every_kind();
        }
    } else {
        assert!(stats.flows > 0, "the differential checked no flow at all");
    }
}

/// The re-check forgives timeouts only: a wrong backend, a wrong masquerade or a refusal
/// seen in the first pass stays a failure whatever the second pass sees.
#[test]
fn the_recheck_forgives_only_timeouts() {
    let seen = |answers: &[(&str, bool)], others: &[&str]| Seen {
        answers: answers
            .iter()
            .map(|(b, m)| (b.to_string(), BTreeSet::from([*m])))
            .collect(),
        others: others.iter().map(|s| s.to_string()).collect(),
        probes: 4,
    };
    let expect = Expect::Answer {
        backends: BTreeSet::from(["pod-a:8080".to_string(), "pod-r1:8080".to_string()]),
        masq: true,
        sticky: false,
    };
    let good = seen(&[("pod-a:8080", true), ("pod-r1:8080", true)], &[]);
    let ok = |first: &Seen| ok_vs(&expect, "client1", &forgive_timeouts(first, &good));
    // Slow: a timeout in the first pass, all answers in the second.
    assert!(ok(&seen(&[("pod-a:8080", true)], &["timeout"])));
    assert!(ok(&seen(&[], &["failed: os error 113"])));
    // Wrong backend, wrong masquerade, a refusal: the second pass does not undo them.
    assert!(!ok(&seen(&[("pod-b:8080", true)], &[])));
    assert!(!ok(&seen(&[("pod-a:8080", false)], &["timeout"])));
    assert!(!ok(&seen(&[("pod-a:8080", true)], &["refused"])));
    // A flow that must time out: an answer in the first pass stays.
    let first = seen(&[("pod-a:8080", true)], &[]);
    let again = seen(&[], &["timeout"]);
    assert!(!ok_vs(
        &Expect::Timeout,
        "client1",
        &forgive_timeouts(&first, &again)
    ));
}

/// The model of kube-proxy's endpoint selection and the compiler's node pass, on the
/// generated manifests the kernel run uses (a quick look without root; the kernel decides
/// who is right when they differ): the same service ports, endpoint sets and policies.
#[test]
fn the_model_and_the_ir_agree_on_generated_manifests() {
    let first = env_u64("SVC_DIFF_SEED", 1);
    let cases = env_u64("SVC_DIFF_CASES", DEFAULT_CASES);
    let mut differ = Vec::new();
    for seed in first..first + cases {
        let m = Manifest::generated(seed);
        let model = m.view();
        let ir = parse_view(&m.compile("ir"));
        let sets = |v: &View| -> Vec<String> {
            let set = |p: &PortInfo, s: &[usize]| names(p, s).unwrap_or_default();
            let mut out: Vec<String> = v
                .ports
                .iter()
                .map(|p| {
                    format!(
                        "{} {:?} {:?}:{} np {:?} ext {:?} lb {:?} ranges {:?} aff {} itp {} etp {} \
                         any {} cluster {:?} local {:?} local ips {:?}",
                        p.spn,
                        p.proto,
                        p.cluster_ip,
                        p.port,
                        p.node_port,
                        p.external_ips,
                        p.lb_ips,
                        p.source_ranges.len(),
                        p.affinity,
                        p.internal_local,
                        p.external_local,
                        p.has_endpoints,
                        set(p, &p.cluster),
                        set(p, &p.local),
                        p.local_endpoint_ips.iter().collect::<BTreeSet<_>>(),
                    )
                })
                .collect();
            out.sort();
            out.push(format!(
                "masqueradeAll {} localhost {} node port ip {:?} everywhere {}",
                v.masquerade_all, v.localhost_node_ports, v.node_port_ip, v.node_ports_everywhere
            ));
            out
        };
        let (a, b) = (sets(&model), sets(&ir));
        if a != b {
            let only = |x: &[String], y: &[String]| -> Vec<String> {
                x.iter().filter(|l| !y.contains(l)).cloned().collect()
            };
            differ.push(format!(
                "seed {seed}:\n  model: {:#?}\n  IR:    {:#?}",
                only(&a, &b),
                only(&b, &a)
            ));
        }
    }
    assert!(differ.is_empty(), "{}", differ.join("\n"));
}

/// A full run that reached no flow of some kind fails, naming what it missed.
#[test]
fn every_kind_is_required() {
    let mut stats = Stats {
        traced: 1,
        ..Stats::default()
    };
    for k in FLOW_KINDS {
        stats.kinds.insert(k.to_string(), 1);
    }
    for k in [
        "answer",
        "answer (sticky)",
        "refused",
        "timeout",
        "no answer",
    ] {
        stats.expected.insert(k, 1);
    }
    for k in [
        "UnknownPort",
        "LocalhostNodePort",
        "FirewallWithoutEndpoints",
        "NoEndpointsFromHost",
        "NodePortDropEverywhere",
    ] {
        stats.intended_flows.insert(k.to_string(), 1);
    }
    for k in ["IR, IPv4", "IR, IPv6", "generated (own model)"] {
        stats.sources.insert(k, 1);
    }
    stats.assert_every_kind();
    let missing = |f: &dyn Fn(&mut Stats)| {
        let mut s = Stats {
            traced: stats.traced,
            kinds: stats.kinds.clone(),
            expected: stats.expected.clone(),
            intended_flows: stats.intended_flows.clone(),
            sources: stats.sources.clone(),
            ..Stats::default()
        };
        f(&mut s);
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.assert_every_kind()))
            .expect_err("a missing kind passed")
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default()
    };
    assert!(missing(&|s| {
        s.kinds.remove("external IP");
    })
    .contains("flows to external IP"));
    assert!(missing(&|s| {
        s.sources.remove("IR, IPv6");
    })
    .contains("manifests with expectations from IR, IPv6"));
    assert!(missing(&|s| {
        s.expected.remove("refused");
    })
    .contains("`refused`"));
}
