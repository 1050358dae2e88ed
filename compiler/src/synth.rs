//! A synthetic cluster for benchmarks and load tests: `services` Services with `endpoints`
//! endpoints each, spread over `nodes` Nodes, as `kubectl get svc,endpointslices,nodes -A`
//! would print it (plus kube-proxy's configuration and a ClusterConfig).
//!
//! The mix, per 100 services: 62 ClusterIP, 8 headless, 15 NodePort, 15 LoadBalancer (with
//! an ingress IP; 40 % of them with loadBalancerSourceRanges, half with
//! `externalTrafficPolicy: Local`); a quarter have two ports (http/https over TCP, or DNS
//! over UDP and TCP), one-port services are 10 % UDP; 5 % have ClientIP affinity. Endpoints
//! land on random nodes (three zones), 2 % terminating and 1 % not ready, in EndpointSlices
//! of at most 100 endpoints. Cluster IPs and node ports are left to the allocator, as in a
//! GitOps repository.
//!
//! Invariant: pure and deterministic. The same [`Shape`] and [`Format`] give the same bytes
//! on every machine, and each service draws from its own random stream, so the first N
//! services of a larger cluster are those of the smaller one (only node choice depends on
//! `nodes`).

use std::fmt::Write as _;
use std::net::Ipv4Addr;

/// What to generate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub services: usize,
    /// Endpoints per service.
    pub endpoints: usize,
    /// At least 1, at most [`MAX_NODES`].
    pub nodes: usize,
    pub seed: u64,
}

pub const MAX_NODES: usize = 16_384;

/// How to write it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// One `kind: List` document, as `kubectl get ... -o yaml` prints it.
    YamlList,
    /// One YAML document per object, separated by `---` (a manifests repository).
    YamlStream,
    /// One `kind: List` object, as `kubectl get ... -o json` prints it.
    Json,
}

/// EndpointSlice controller's `maxEndpointsPerSlice` default.
const MAX_PER_SLICE: usize = 100;
const ZONES: [&str; 3] = ["zone-a", "zone-b", "zone-c"];
const WORDS: [&str; 10] = [
    "api", "web", "cache", "db", "auth", "search", "billing", "queue", "metrics", "gateway",
];
/// Pod IPs: `10.128.0.0/9`, split evenly between nodes.
const POD_NET: u32 = 0x0a80_0000;
const POD_PREFIX: u32 = 9;
const SERVICES_PER_NAMESPACE: usize = 50;

/// The cluster as text (see the module docs).
pub fn generate(shape: &Shape, format: Format) -> String {
    let mut items = Vec::new();
    let mut pods = PodIps::new(shape.nodes.clamp(1, MAX_NODES));
    let mut slices = Vec::new();
    let mut node_ports = 0;
    for i in 0..shape.services {
        let svc = ServiceDraw::new(shape.seed, i);
        node_ports += svc.node_port_count();
        items.push(svc.service());
        svc.slices(shape.endpoints, &mut pods, &mut slices);
    }
    items.append(&mut slices);
    for k in 0..pods.nodes {
        items.push(node(k, &pods));
    }
    items.push(proxy_config());
    items.push(cluster_config(node_ports));

    let mut out = String::with_capacity(shape.services * (shape.endpoints + 8) * 200);
    match format {
        Format::YamlList | Format::Json => {
            let list = V::map([
                ("apiVersion", V::s("v1")),
                ("items", V::List(items)),
                ("kind", V::s("List")),
                ("metadata", V::map([("resourceVersion", V::s(""))])),
            ]);
            if format == Format::Json {
                json(&mut out, &list, 0);
                out.push('\n');
            } else {
                yaml_root(&mut out, &list);
            }
        }
        Format::YamlStream => {
            for it in &items {
                out.push_str("---\n");
                yaml_root(&mut out, it);
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Drawing the objects
// ---------------------------------------------------------------------------------------

/// splitmix64: tiny, fast, and good enough to pick a mix.
struct Rng(u64);

impl Rng {
    fn new(seed: u64, stream: u64) -> Rng {
        let mut r = Rng(seed ^ stream.wrapping_mul(0xa076_1d64_78bd_642f));
        r.next();
        r
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn percent(&mut self, p: usize) -> bool {
        self.below(100) < p
    }
    /// A name suffix like the API server's `generateName` (lower-case letters and digits).
    fn suffix(&mut self) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        (0..5)
            .map(|_| ALPHABET[self.below(ALPHABET.len())] as char)
            .collect()
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    ClusterIP,
    Headless,
    NodePort,
    LoadBalancer,
}

struct PortDraw {
    name: &'static str,
    protocol: &'static str,
    port: u16,
    target: u16,
    /// Refer to the target port by name (`targetPort: http`).
    named_target: bool,
}

/// Everything random about one service, drawn up front from its own stream.
struct ServiceDraw {
    index: usize,
    rng: Rng,
    name: String,
    namespace: String,
    kind: Kind,
    ports: Vec<PortDraw>,
    local_policy: bool,
    source_ranges: bool,
    affinity: Option<Option<u32>>,
}

impl ServiceDraw {
    fn new(seed: u64, index: usize) -> ServiceDraw {
        let mut rng = Rng::new(seed, index as u64);
        let kind = match rng.below(100) {
            0..62 => Kind::ClusterIP,
            62..70 => Kind::Headless,
            70..85 => Kind::NodePort,
            _ => Kind::LoadBalancer,
        };
        let ports = if rng.percent(25) {
            if rng.percent(50) {
                vec![
                    port("http", "TCP", 80, 8080, false),
                    port("https", "TCP", 443, 8443, false),
                ]
            } else {
                vec![
                    port("dns", "UDP", 53, 5353, false),
                    port("dns-tcp", "TCP", 53, 5353, false),
                ]
            }
        } else {
            let protocol = if rng.percent(10) { "UDP" } else { "TCP" };
            let target = [8080, 9090, 3000, 5432, 6379][rng.below(5)];
            vec![port("http", protocol, 80, target, rng.percent(10))]
        };
        let external = matches!(kind, Kind::NodePort | Kind::LoadBalancer);
        let local_policy = (kind == Kind::LoadBalancer && rng.percent(50))
            || (kind == Kind::NodePort && rng.percent(10));
        let source_ranges = kind == Kind::LoadBalancer && rng.percent(40);
        let affinity =
            (kind != Kind::Headless && rng.percent(5)).then(|| rng.percent(50).then_some(3600));
        debug_assert!(!local_policy || external);
        ServiceDraw {
            index,
            name: format!("{}-{index}", WORDS[rng.below(WORDS.len())]),
            namespace: format!("ns-{}", index / SERVICES_PER_NAMESPACE),
            rng,
            kind,
            ports,
            local_policy,
            source_ranges,
            affinity,
        }
    }

    fn node_port_count(&self) -> usize {
        match self.kind {
            Kind::NodePort => self.ports.len(),
            Kind::LoadBalancer => self.ports.len() + usize::from(self.local_policy),
            _ => 0,
        }
    }

    fn meta(&self, name: &str, labels: V) -> V {
        V::map([
            ("labels", labels),
            ("name", V::S(name.to_string())),
            ("namespace", V::S(self.namespace.clone())),
        ])
    }

    fn service(&self) -> V {
        let app = V::map([("app", V::S(self.name.clone()))]);
        let mut spec = Vec::new();
        if self.kind == Kind::Headless {
            spec.push(("clusterIP", V::s("None")));
        }
        if self.local_policy {
            spec.push(("externalTrafficPolicy", V::s("Local")));
        }
        if self.source_ranges {
            spec.push((
                "loadBalancerSourceRanges",
                V::List(vec![V::s("203.0.113.0/24"), V::s("198.51.100.0/25")]),
            ));
        }
        let ports = self
            .ports
            .iter()
            .map(|p| {
                V::map([
                    ("name", V::s(p.name)),
                    ("port", V::I(p.port.into())),
                    ("protocol", V::s(p.protocol)),
                    (
                        "targetPort",
                        if p.named_target {
                            V::s(p.name)
                        } else {
                            V::I(p.target.into())
                        },
                    ),
                ])
            })
            .collect();
        spec.push(("ports", V::List(ports)));
        spec.push(("selector", app.clone()));
        if let Some(timeout) = self.affinity {
            spec.push(("sessionAffinity", V::s("ClientIP")));
            if let Some(t) = timeout {
                spec.push((
                    "sessionAffinityConfig",
                    V::map([("clientIP", V::map([("timeoutSeconds", V::I(t.into()))]))]),
                ));
            }
        }
        spec.push((
            "type",
            V::s(match self.kind {
                Kind::ClusterIP | Kind::Headless => "ClusterIP",
                Kind::NodePort => "NodePort",
                Kind::LoadBalancer => "LoadBalancer",
            }),
        ));
        let status = if self.kind == Kind::LoadBalancer {
            // 198.18.0.0/15, the benchmarking range: one ingress IP per service.
            let ip = Ipv4Addr::from(0xc612_0000u32 + (self.index as u32 % (1 << 17)));
            V::map([(
                "loadBalancer",
                V::map([(
                    "ingress",
                    V::List(vec![V::map([
                        ("ip", V::S(ip.to_string())),
                        ("ipMode", V::s("VIP")),
                    ])]),
                )]),
            )])
        } else {
            V::map([("loadBalancer", V::Map(vec![]))])
        };
        V::map([
            ("apiVersion", V::s("v1")),
            ("kind", V::s("Service")),
            ("metadata", self.meta(&self.name, app)),
            ("spec", V::Map(spec)),
            ("status", status),
        ])
    }

    fn slices(&self, count: usize, pods: &mut PodIps, out: &mut Vec<V>) {
        let mut rng = Rng::new(self.rng.0, 2);
        let slice_ports: Vec<V> = self
            .ports
            .iter()
            .map(|p| {
                V::map([
                    ("name", V::s(p.name)),
                    ("port", V::I(p.target.into())),
                    ("protocol", V::s(p.protocol)),
                ])
            })
            .collect();
        let mut left = count;
        while left > 0 {
            let n = left.min(MAX_PER_SLICE);
            left -= n;
            let endpoints = (0..n).map(|_| self.endpoint(&mut rng, pods)).collect();
            let name = format!("{}-{}", self.name, rng.suffix());
            let labels = V::map([
                (
                    "endpointslice.kubernetes.io/managed-by",
                    V::s("endpointslice-controller.k8s.io"),
                ),
                ("kubernetes.io/service-name", V::S(self.name.clone())),
            ]);
            out.push(V::map([
                ("addressType", V::s("IPv4")),
                ("apiVersion", V::s("discovery.k8s.io/v1")),
                ("endpoints", V::List(endpoints)),
                ("kind", V::s("EndpointSlice")),
                ("metadata", self.meta(&name, labels)),
                ("ports", V::List(slice_ports.clone())),
            ]));
        }
    }

    fn endpoint(&self, rng: &mut Rng, pods: &mut PodIps) -> V {
        let node = rng.below(pods.nodes);
        let (ready, serving, terminating) = match rng.below(100) {
            0 => (false, false, false),
            1 | 2 => (false, rng.percent(50), true),
            _ => (true, true, false),
        };
        V::map([
            (
                "addresses",
                V::List(vec![V::S(pods.next(node).to_string())]),
            ),
            (
                "conditions",
                V::map([
                    ("ready", V::B(ready)),
                    ("serving", V::B(serving)),
                    ("terminating", V::B(terminating)),
                ]),
            ),
            ("nodeName", V::S(node_name(node))),
            ("zone", V::s(ZONES[node % ZONES.len()])),
        ])
    }
}

fn port(
    name: &'static str,
    protocol: &'static str,
    port: u16,
    target: u16,
    named: bool,
) -> PortDraw {
    PortDraw {
        name,
        protocol,
        port,
        target,
        named_target: named,
    }
}

fn node_name(k: usize) -> String {
    format!("node-{k:03}")
}

/// Pod IPs per node: node `k` owns the `k`-th block of `10.128.0.0/9`.
struct PodIps {
    nodes: usize,
    prefix: u32,
    used: Vec<u32>,
}

impl PodIps {
    fn new(nodes: usize) -> PodIps {
        let prefix = POD_PREFIX + (nodes as u32).next_power_of_two().trailing_zeros();
        PodIps {
            nodes,
            prefix,
            used: vec![0; nodes],
        }
    }
    fn block(&self, k: usize) -> u32 {
        POD_NET + ((k as u32) << (32 - self.prefix))
    }
    fn next(&mut self, k: usize) -> Ipv4Addr {
        // Skip the network address; wrap (reusing addresses) only if a node overflows.
        let size = 1u32 << (32 - self.prefix);
        self.used[k] = self.used[k] % (size - 2) + 1;
        Ipv4Addr::from(self.block(k) + self.used[k])
    }
}

fn node(k: usize, pods: &PodIps) -> V {
    let name = node_name(k);
    let cidr = format!("{}/{}", Ipv4Addr::from(pods.block(k)), pods.prefix);
    let ip = Ipv4Addr::from(0xc0a8_0000u32 + k as u32 + 1);
    V::map([
        ("apiVersion", V::s("v1")),
        ("kind", V::s("Node")),
        (
            "metadata",
            V::map([
                (
                    "labels",
                    V::map([
                        ("kubernetes.io/hostname", V::S(name.clone())),
                        ("kubernetes.io/os", V::s("linux")),
                        ("topology.kubernetes.io/zone", V::s(ZONES[k % ZONES.len()])),
                    ]),
                ),
                ("name", V::S(name.clone())),
            ]),
        ),
        (
            "spec",
            V::map([
                ("podCIDR", V::S(cidr.clone())),
                ("podCIDRs", V::List(vec![V::S(cidr)])),
            ]),
        ),
        (
            "status",
            V::map([(
                "addresses",
                V::List(vec![
                    V::map([
                        ("address", V::S(ip.to_string())),
                        ("type", V::s("InternalIP")),
                    ]),
                    V::map([("address", V::S(name)), ("type", V::s("Hostname"))]),
                ]),
            )]),
        ),
    ])
}

fn proxy_config() -> V {
    V::map([
        ("apiVersion", V::s("kubeproxy.config.k8s.io/v1alpha1")),
        ("clusterCIDR", V::s("10.128.0.0/9")),
        ("kind", V::s("KubeProxyConfiguration")),
        ("mode", V::s("iptables")),
    ])
}

/// The apiserver's ranges. The node-port range is widened (as large clusters do) so that
/// it stays at most half full.
fn cluster_config(node_ports: usize) -> V {
    let mut fields = vec![
        ("apiVersion", V::s(crate::k8s::CLUSTER_CONFIG_API)),
        ("kind", V::s("ClusterConfig")),
        ("serviceClusterIPRange", V::s("10.96.0.0/12")),
    ];
    if node_ports * 2 > 2768 {
        let hi = (30_000 + node_ports * 2).min(65_535);
        fields.push(("serviceNodePortRange", V::S(format!("30000-{hi}"))));
    }
    V::Map(fields)
}

// ---------------------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------------------

/// A value to write. Keys are written in the order given (sorted, as kubectl prints them).
#[derive(Clone)]
enum V {
    S(String),
    Static(&'static str),
    I(i64),
    B(bool),
    Map(Vec<(&'static str, V)>),
    List(Vec<V>),
}

impl V {
    fn s(s: &'static str) -> V {
        V::Static(s)
    }
    fn map<const N: usize>(entries: [(&'static str, V); N]) -> V {
        V::Map(entries.into())
    }
}

fn pad(out: &mut String, n: usize) {
    out.extend(std::iter::repeat_n(' ', n));
}

fn yaml_root(out: &mut String, v: &V) {
    match v {
        V::Map(es) => yaml_map(out, es, 0, false),
        _ => unreachable!("documents are mappings"),
    }
}

/// Block style as kubectl writes it: sequences at their key's indentation.
fn yaml_map(out: &mut String, entries: &[(&str, V)], indent: usize, first_inline: bool) {
    for (n, (k, v)) in entries.iter().enumerate() {
        if n > 0 || !first_inline {
            pad(out, indent);
        }
        out.push_str(k);
        out.push(':');
        match v {
            V::Map(es) if !es.is_empty() => {
                out.push('\n');
                yaml_map(out, es, indent + 2, false);
            }
            V::List(items) if !items.is_empty() => {
                out.push('\n');
                for it in items {
                    pad(out, indent);
                    out.push_str("- ");
                    match it {
                        V::Map(es) if !es.is_empty() => yaml_map(out, es, indent + 2, true),
                        _ => {
                            yaml_scalar(out, it);
                            out.push('\n');
                        }
                    }
                }
            }
            _ => {
                out.push(' ');
                yaml_scalar(out, v);
                out.push('\n');
            }
        }
    }
}

fn yaml_scalar(out: &mut String, v: &V) {
    match v {
        V::S(s) => yaml_str(out, s),
        V::Static(s) => yaml_str(out, s),
        V::I(n) => {
            let _ = write!(out, "{n}");
        }
        V::B(b) => out.push_str(if *b { "true" } else { "false" }),
        V::Map(_) => out.push_str("{}"),
        V::List(_) => out.push_str("[]"),
    }
}

/// Plain when YAML reads it back as the same string; single-quoted otherwise.
fn yaml_str(out: &mut String, s: &str) {
    let plain = !s.is_empty()
        && !crate::tree::is_plain_number(s)
        && !crate::tree::is_plain_bool(s)
        && !matches!(s, "~" | "null" | "Null" | "NULL")
        && !s.starts_with(|c: char| "-?:,[]{}#&*!|>'\"%@` ".contains(c))
        && !s.contains(": ")
        && !s.contains(" #");
    if plain {
        out.push_str(s);
    } else {
        let _ = write!(out, "'{}'", s.replace('\'', "''"));
    }
}

/// Pretty JSON with 4-space indentation, as kubectl writes it.
fn json(out: &mut String, v: &V, indent: usize) {
    match v {
        V::S(s) => json_str(out, s),
        V::Static(s) => json_str(out, s),
        V::I(n) => {
            let _ = write!(out, "{n}");
        }
        V::B(b) => out.push_str(if *b { "true" } else { "false" }),
        V::Map(es) if es.is_empty() => out.push_str("{}"),
        V::List(items) if items.is_empty() => out.push_str("[]"),
        V::Map(es) => {
            out.push_str("{\n");
            for (n, (k, v)) in es.iter().enumerate() {
                pad(out, indent + 4);
                json_str(out, k);
                out.push_str(": ");
                json(out, v, indent + 4);
                out.push_str(if n + 1 < es.len() { ",\n" } else { "\n" });
            }
            pad(out, indent);
            out.push('}');
        }
        V::List(items) => {
            out.push_str("[\n");
            for (n, it) in items.iter().enumerate() {
                pad(out, indent + 4);
                json(out, it, indent + 4);
                out.push_str(if n + 1 < items.len() { ",\n" } else { "\n" });
            }
            pad(out, indent);
            out.push(']');
        }
    }
}

fn json_str(out: &mut String, s: &str) {
    // Every string drawn here is plain ASCII without quotes or backslashes.
    debug_assert!(!s.contains(['"', '\\']) && s.is_ascii());
    out.push('"');
    out.push_str(s);
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::SourceMap;

    fn shape(services: usize) -> Shape {
        Shape {
            services,
            endpoints: 10,
            nodes: 4,
            seed: 1,
        }
    }

    #[test]
    fn deterministic_and_prefix_stable() {
        let a = generate(&shape(40), Format::YamlStream);
        assert_eq!(a, generate(&shape(40), Format::YamlStream));
        // The first services of a larger cluster are the same services.
        let big = generate(&shape(80), Format::YamlStream);
        let first_service = a.split("---\n").nth(1).unwrap();
        assert!(big.contains(first_service));
    }

    /// The three formats compile to the same IR, without a single diagnostic.
    #[test]
    fn formats_agree_and_compile_cleanly() {
        let mut irs = Vec::new();
        for format in [Format::YamlList, Format::YamlStream, Format::Json] {
            let mut sources = SourceMap::default();
            let f = sources.add("gen", generate(&shape(300), format));
            let c = crate::compile(
                &sources,
                &[f],
                &crate::Options {
                    allocate: true,
                    ..Default::default()
                },
            );
            assert!(c.diags.items.is_empty(), "{format:?}: {:?}", c.diags.items);
            assert_eq!(c.module.services.len(), 300);
            assert_eq!(c.module.nodes.len(), 4);
            let eps: usize = c
                .module
                .services
                .iter()
                .flat_map(|s| &s.ports)
                .map(|p| p.endpoints.len())
                .max()
                .unwrap();
            assert_eq!(eps, 10);
            irs.push(format!("{:?}", c.module));
        }
        assert_eq!(irs[0], irs[1]);
        assert_eq!(irs[0], irs[2]);
    }

    #[test]
    fn slices_hold_at_most_100_endpoints() {
        let text = generate(
            &Shape {
                services: 1,
                endpoints: 250,
                nodes: 3,
                seed: 7,
            },
            Format::YamlStream,
        );
        assert_eq!(text.matches("kind: EndpointSlice").count(), 3);
    }
}
