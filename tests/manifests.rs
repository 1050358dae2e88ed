//! Structure-aware cluster generator, shared by the `cluster` fuzz target
//! (`fuzz/fuzz_targets/cluster.rs` includes this file) and the seeded property test
//! `checkers` (random bytes from a seed).
//!
//! [`cluster`] turns any byte string into Nodes, a KubeProxyConfiguration, sometimes a
//! ClusterConfig, Services of every type and policy, EndpointSlices over the nodes' pods
//! (ready, serving, terminating, with zone hints or not) and Pods with named ports: valid
//! by construction, so that the back ends are reached; [`Draw`] reads the bytes as
//! choices, and an exhausted input reads as zeros (the plainest choice everywhere).
//!
//! Invariant: pure std, no I/O; the same bytes always give the same text.

use std::fmt::Write as _;

/// Choices read from a byte string.
pub struct Draw<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Draw<'a> {
    pub fn new(data: &'a [u8]) -> Draw<'a> {
        Draw { data, at: 0 }
    }
    fn byte(&mut self) -> u8 {
        let b = self.data.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }
    /// `0..n` (n ≥ 1).
    pub fn below(&mut self, n: u32) -> u32 {
        let v = u32::from(self.byte()) | u32::from(self.byte()) << 8;
        v % n
    }
    /// True once in `n` (never on an exhausted input).
    pub fn chance(&mut self, n: u32) -> bool {
        self.below(n) == n - 1
    }
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u32) as usize]
    }
}

const SERVICE_TYPES: [&str; 5] = [
    "ClusterIP",
    "NodePort",
    "LoadBalancer",
    "headless",
    "ExternalName",
];
const PROTOCOLS: [&str; 3] = ["TCP", "UDP", "SCTP"];
const ZONES: [&str; 3] = ["zone-a", "zone-b", "zone-c"];

/// A cluster as a stream of YAML documents (see the module docs).
pub fn cluster(d: &mut Draw) -> String {
    let mut out = String::new();
    let dual = d.chance(3);
    let nodes = 1 + d.below(3) as usize;
    for n in 1..=nodes {
        let zone = d.pick(&ZONES);
        let _ = write!(
            out,
            "---\napiVersion: v1\nkind: Node\nmetadata:\n  name: node-{n}\n  labels: {{kubernetes.io/hostname: node-{n}, topology.kubernetes.io/zone: {zone}}}\nspec:\n  podCIDRs: [10.244.{n}.0/24{}]\nstatus:\n  addresses:\n  - {{type: InternalIP, address: 192.0.2.{}}}\n",
            if dual { format!(", 'fd00:10:244:{n}::/64'") } else { String::new() },
            9 + n
        );
        if dual {
            let _ = writeln!(
                out,
                "  - {{type: InternalIP, address: 'fd00:192:0:2::{}'}}",
                9 + n
            );
        }
    }

    out += "---\napiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";
    let _ = writeln!(out, "mode: {}", d.pick(&["iptables", "nftables", "ipvs"]));
    let _ = writeln!(
        out,
        "clusterCIDR: {}",
        if dual {
            "10.244.0.0/16,fd00:10:244::/48"
        } else {
            "10.244.0.0/16"
        }
    );
    let mut ipt = Vec::new();
    if d.chance(4) {
        ipt.push("masqueradeAll: true".to_string());
    }
    if d.chance(4) {
        ipt.push("localhostNodePorts: false".to_string());
    }
    if d.chance(6) {
        ipt.push(format!("masqueradeBit: {}", d.below(32)));
    }
    if !ipt.is_empty() {
        let _ = writeln!(out, "iptables: {{{}}}", ipt.join(", "));
    }
    match d.below(6) {
        1 => out += "nodePortAddresses: [primary]\n",
        2 => out += "nodePortAddresses: [192.0.2.0/24]\n",
        3 => out += "detectLocalMode: NodeCIDR\n",
        _ => {}
    }
    // A dual-stack cluster says so in its service range.
    if dual || d.chance(3) {
        out += "---\napiVersion: svc-compile/v1alpha1\nkind: ClusterConfig\n";
        let _ = writeln!(
            out,
            "serviceClusterIPRange: {}",
            if dual {
                "10.96.0.0/16,fd00:96::/112"
            } else {
                "10.96.0.0/16"
            }
        );
        if d.chance(2) {
            out += "serviceNodePortRange: 30000-30999\n";
        }
        if d.chance(3) {
            out += "clusterDomain: example.local\n";
        }
    }

    let services = d.below(7);
    let mut node_ports = std::collections::BTreeSet::new();
    for i in 0..services {
        service(d, &mut out, i, nodes, dual, &mut node_ports);
    }
    out
}

fn service(
    d: &mut Draw,
    out: &mut String,
    i: u32,
    nodes: usize,
    dual: bool,
    node_ports: &mut std::collections::BTreeSet<u16>,
) {
    let ty = d.pick(&SERVICE_TYPES);
    let ns = format!("ns{}", d.below(3));
    let name = format!("svc-{i}");
    let _ = write!(
        out,
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n"
    );
    if ty == "ExternalName" {
        let _ = writeln!(out, "  type: ExternalName\n  externalName: db.example.com");
        return;
    }
    // Families: v4 only, v6 only or both (dual-stack clusters only).
    let fams: &[&str] = match (dual, d.below(3)) {
        (true, 1) => &["IPv6"],
        (true, 2) => &["IPv4", "IPv6"],
        _ => &["IPv4"],
    };
    if dual {
        let policy = if fams.len() == 2 {
            d.pick(&["PreferDualStack", "RequireDualStack"])
        } else {
            "SingleStack"
        };
        let _ = writeln!(
            out,
            "  ipFamilyPolicy: {policy}\n  ipFamilies: [{}]",
            fams.join(", ")
        );
    }
    let node_port_type = ty == "NodePort" || ty == "LoadBalancer";
    match ty {
        "headless" => out.push_str("  clusterIP: None\n"),
        t => {
            let _ = writeln!(out, "  type: {t}");
        }
    }
    if d.chance(2) {
        let _ = writeln!(out, "  selector: {{app: {name}}}");
    }
    if node_port_type && d.chance(2) {
        out.push_str("  externalTrafficPolicy: Local\n");
    }
    if d.chance(4) {
        out.push_str("  internalTrafficPolicy: Local\n");
    }
    if d.chance(4) {
        let _ = writeln!(
            out,
            "  sessionAffinity: ClientIP\n  sessionAffinityConfig: {{clientIP: {{timeoutSeconds: {}}}}}",
            1 + d.below(86400)
        );
    }
    if ty != "headless" && d.chance(5) {
        let _ = writeln!(out, "  externalIPs: [198.18.0.{}]", 1 + d.below(250));
    }
    if ty == "LoadBalancer" && d.chance(3) {
        out.push_str("  loadBalancerSourceRanges: [192.0.2.100/32, 203.0.113.0/24]\n");
    }
    if ty == "LoadBalancer" && d.chance(5) {
        out.push_str("  allocateLoadBalancerNodePorts: false\n");
    }
    if d.chance(6) {
        out.push_str("  publishNotReadyAddresses: true\n");
    }
    if d.chance(6) {
        out.push_str("  trafficDistribution: PreferClose\n");
    }
    // A headless service may have no ports (a StatefulSet's governing service): DNS only.
    let nports = match ty == "headless" && d.chance(4) {
        true => 0,
        false => 1 + d.below(3),
    };
    let mut ports = Vec::new();
    if nports > 0 {
        out.push_str("  ports:\n");
    }
    for p in 0..nports {
        let proto = if d.chance(3) {
            d.pick(&PROTOCOLS)
        } else {
            "TCP"
        };
        let port = 1 + d.below(65535) as u16;
        if ports.iter().any(|&(q, pr, _)| q == port && pr == proto) {
            continue;
        }
        let named = d.chance(4);
        let _ = write!(out, "  - {{name: p{p}, port: {port}, protocol: {proto}");
        match named {
            true => out.push_str(", targetPort: http"),
            false if d.chance(2) => out.push_str(", targetPort: 8080"),
            false => {}
        }
        if node_port_type && ty != "headless" && d.chance(2) {
            let np = 30000 + d.below(1000) as u16;
            if node_ports.insert(np) {
                let _ = write!(out, ", nodePort: {np}");
            }
        }
        out.push_str("}\n");
        ports.push((port, proto, named));
    }
    if ty == "LoadBalancer" && d.chance(2) {
        let _ = writeln!(
            out,
            "status:\n  loadBalancer:\n    ingress: [{{ip: 203.0.113.{}}}]",
            1 + d.below(250)
        );
    }
    for s in 0..d.below(3) {
        let fam = d.pick(fams);
        let _ = write!(
            out,
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}-{s}\n  namespace: {ns}\n  labels: {{kubernetes.io/service-name: {name}}}\naddressType: {fam}\nports:\n"
        );
        for (p, &(port, proto, named)) in ports.iter().enumerate() {
            let target = if named { 8080 } else { port };
            let _ = writeln!(out, "- {{name: p{p}, port: {target}, protocol: {proto}}}");
        }
        out.push_str("endpoints:\n");
        for e in 0..d.below(5) {
            let n = 1 + d.below(nodes as u32);
            // Now and then the address of the first slice's endpoint (a pod listed twice,
            // perhaps on another node: each node serves its own copy).
            let host = match s > 0 && d.chance(6) {
                true => 2 + e,
                false => 2 + s * 10 + e,
            };
            let addr = match fam {
                "IPv6" => format!("'fd00:10:244:{n}::{host:x}'"),
                _ => format!("10.244.{n}.{host}"),
            };
            let _ = writeln!(out, "- addresses: [{addr}]");
            if !d.chance(6) {
                let _ = writeln!(out, "  nodeName: node-{n}");
            }
            if d.chance(3) {
                let _ = writeln!(out, "  zone: {}", d.pick(&ZONES));
            }
            match d.below(5) {
                0 => {}
                1 => {
                    out.push_str("  conditions: {ready: false, serving: true, terminating: true}\n")
                }
                2 => out
                    .push_str("  conditions: {ready: false, serving: false, terminating: true}\n"),
                3 => out.push_str("  conditions: {ready: false}\n"),
                _ => out.push_str("  conditions: {ready: true}\n"),
            }
            if d.chance(4) {
                let _ = writeln!(out, "  hints: {{forZones: [{{name: {}}}]}}", d.pick(&ZONES));
            }
        }
    }
    if (ports.is_empty() || ports.iter().any(|p| p.2)) && d.chance(2) {
        let n = 1 + d.below(nodes as u32);
        let _ = write!(
            out,
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}-pod, namespace: {ns}, labels: {{app: {name}}}}}\nspec:\n  nodeName: node-{n}\n  containers:\n  - name: c\n    ports: [{{name: http, containerPort: 8080}}]\nstatus:\n  podIP: 10.244.{n}.200\n  conditions: [{{type: Ready, status: 'True'}}]\n"
        );
    }
}
