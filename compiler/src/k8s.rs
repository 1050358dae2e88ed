//! Typed Kubernetes objects as written, with locations.
//!
//! Decoding checks only shapes (types, unknown fields); the API server's value rules live
//! in `passes::validate`. Optional fields stay `Option` so passes can tell "unset" from a
//! written default.

use crate::decode::{Decoder, Fields, IntOrString, Path, Sp};
use crate::diag::{Diagnostic, Diagnostics};
use crate::source::Span;
use crate::tree::{Document, Entry, Node, Part, Value};

#[derive(Clone, Debug, Default)]
pub struct Meta {
    pub name: Sp<String>,
    pub namespace: Sp<String>,
    pub labels: Vec<(Sp<String>, Sp<String>)>,
    pub annotations: Vec<(Sp<String>, Sp<String>)>,
    pub deletion_timestamp: bool,
}

impl Meta {
    pub fn label(&self, k: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(key, _)| key.v == k)
            .map(|(_, v)| v.v.as_str())
    }
    pub fn annotation(&self, k: &str) -> Option<&Sp<String>> {
        self.annotations
            .iter()
            .find(|(key, _)| key.v == k)
            .map(|(_, v)| v)
    }
}

#[derive(Clone, Debug)]
pub struct Service {
    pub span: Span,
    pub meta: Meta,
    pub type_: Option<Sp<String>>,
    pub cluster_ip: Option<Sp<String>>,
    pub cluster_ips: Vec<Sp<String>>,
    pub ip_families: Vec<Sp<String>>,
    pub ip_family_policy: Option<Sp<String>>,
    pub selector: Option<Vec<(Sp<String>, Sp<String>)>>,
    pub selector_span: Option<Span>,
    pub ports: Vec<Port>,
    pub ports_span: Option<Span>,
    pub external_ips: Vec<Sp<String>>,
    pub external_name: Option<Sp<String>>,
    pub load_balancer_ip: Option<Sp<String>>,
    pub load_balancer_source_ranges: Vec<Sp<String>>,
    pub external_traffic_policy: Option<Sp<String>>,
    pub internal_traffic_policy: Option<Sp<String>>,
    pub session_affinity: Option<Sp<String>>,
    pub affinity_timeout: Option<Sp<i64>>,
    pub health_check_node_port: Option<Sp<i64>>,
    pub publish_not_ready_addresses: bool,
    /// `allocateLoadBalancerNodePorts` (a LoadBalancer gets node ports unless false).
    pub allocate_lb_node_ports: bool,
    /// Where `allocateLoadBalancerNodePorts` was written, if it was.
    pub allocate_lb_node_ports_span: Option<Span>,
    pub load_balancer_class: Option<Sp<String>>,
    pub topology_keys: Vec<Sp<String>>,
    pub topology_keys_span: Option<Span>,
    pub traffic_distribution: Option<Sp<String>>,
    pub lb_ingress: Vec<LbIngress>,
}

#[derive(Clone, Debug)]
pub struct Port {
    pub span: Span,
    pub name: Option<Sp<String>>,
    pub protocol: Option<Sp<String>>,
    pub port: Option<Sp<i64>>,
    pub target_port: Option<Sp<IntOrString>>,
    pub node_port: Option<Sp<i64>>,
    pub app_protocol: Option<Sp<String>>,
    /// `port` was written (a value of the wrong type is SVC004, not also "missing").
    pub port_written: bool,
}

#[derive(Clone, Debug)]
pub struct LbIngress {
    pub ip: Option<Sp<String>>,
    pub hostname: Option<Sp<String>>,
    pub ip_mode: Option<Sp<String>>,
}

#[derive(Clone, Debug)]
pub struct EndpointSlice {
    pub span: Span,
    pub meta: Meta,
    pub address_type: Option<Sp<String>>,
    pub endpoints: Vec<SliceEndpoint>,
    pub ports: Vec<SlicePort>,
}

#[derive(Clone, Debug)]
pub struct SliceEndpoint {
    pub span: Span,
    pub addresses: Vec<Sp<String>>,
    pub ready: Option<bool>,
    pub serving: Option<bool>,
    pub terminating: Option<bool>,
    pub node_name: Option<Sp<String>>,
    pub zone: Option<Sp<String>>,
    /// `hostname` (DNS: `<hostname>.<service>.<ns>.svc.<zone>`).
    pub hostname: Option<Sp<String>>,
    pub hint_zones: Vec<String>,
    pub hint_nodes: Vec<String>,
    /// The hints as written, for validation: (`forZones` or `forNodes`, name).
    pub hints_written: Vec<(&'static str, Sp<String>)>,
}

#[derive(Clone, Debug)]
pub struct SlicePort {
    pub span: Span,
    pub name: Option<Sp<String>>,
    pub protocol: Option<Sp<String>>,
    pub port: Option<Sp<i64>>,
    pub app_protocol: Option<Sp<String>>,
    /// `port` was written (a value of the wrong type is SVC004, not also "missing").
    pub port_written: bool,
}

#[derive(Clone, Debug)]
pub struct Endpoints {
    pub span: Span,
    pub meta: Meta,
    pub subsets: Vec<Subset>,
}

#[derive(Clone, Debug)]
pub struct Subset {
    pub addresses: Vec<EpAddress>,
    pub not_ready: Vec<EpAddress>,
    pub ports: Vec<SlicePort>,
}

#[derive(Clone, Debug)]
pub struct EpAddress {
    pub ip: Sp<String>,
    pub node_name: Option<Sp<String>>,
    pub hostname: Option<Sp<String>>,
}

#[derive(Clone, Debug)]
pub struct NodeObj {
    pub span: Span,
    pub meta: Meta,
    pub pod_cidrs: Vec<Sp<String>>,
    /// (type, address)
    pub addresses: Vec<(String, Sp<String>)>,
    /// `spec.taints[].key`, in order.
    pub taints: Vec<String>,
}

#[derive(Clone, Debug)]
pub struct Pod {
    pub span: Span,
    pub meta: Meta,
    pub node_name: Option<Sp<String>>,
    /// `spec.hostname` and `spec.subdomain`: the EndpointSlice controller copies the
    /// hostname into the endpoint when the subdomain names the service.
    pub hostname: Option<Sp<String>>,
    pub subdomain: Option<Sp<String>>,
    pub host_network: bool,
    pub pod_ips: Vec<Sp<String>>,
    pub ready: bool,
    pub phase: Option<String>,
    pub container_ports: Vec<ContainerPort>,
}

#[derive(Clone, Debug)]
pub struct ContainerPort {
    pub name: Option<String>,
    pub port: i64,
    pub protocol: String,
}

/// kube-proxy's own configuration, as users keep it.
#[derive(Clone, Debug, Default)]
pub struct ProxyConfigDoc {
    pub span: Span,
    pub mode: Option<Sp<String>>,
    pub cluster_cidr: Option<Sp<String>>,
    pub detect_local_mode: Option<Sp<String>>,
    pub bridge_interface: Option<Sp<String>>,
    pub interface_name_prefix: Option<Sp<String>>,
    pub node_port_addresses: Vec<Sp<String>>,
    pub masquerade_all: Option<Sp<bool>>,
    /// The masquerade bit kube-proxy uses in the configured mode: `nftables.masqueradeBit`
    /// in nftables mode (iptables' is not read there), `iptables.masqueradeBit` otherwise.
    pub masquerade_bit: Option<Sp<i64>>,
    /// Every masqueradeBit written, with its path: kube-proxy validates them all.
    pub masquerade_bits: Vec<(Sp<i64>, &'static str)>,
    pub localhost_node_ports: Option<Sp<bool>>,
    pub ipvs_scheduler: Option<Sp<String>>,
    /// `ipvs.strictARP`.
    pub ipvs_strict_arp: Option<Sp<bool>>,
    /// `ipvs.tcpTimeout`, `ipvs.tcpFinTimeout`, `ipvs.udpTimeout`: Go durations as written.
    pub ipvs_timeouts: [Option<Sp<String>>; 3],
    /// `ipvs.excludeCIDRs`.
    pub ipvs_exclude_cidrs: Vec<Sp<String>>,
    pub tcp_be_liberal: Option<Sp<bool>>,
    /// `conntrack.maxPerCore`, `conntrack.min`.
    pub conntrack_counts: [Option<Sp<i64>>; 2],
    /// `conntrack.tcpEstablishedTimeout`, `tcpCloseWaitTimeout`, `udpTimeout`,
    /// `udpStreamTimeout`: Go durations as written.
    pub conntrack_timeouts: [Option<Sp<String>>; 4],
}

/// Our own settings document (`kind: ClusterConfig`, apiVersion `svc-compile/v1alpha1`),
/// carrying what kube-apiserver's flags decide.
#[derive(Clone, Debug, Default)]
pub struct ClusterConfigDoc {
    pub span: Span,
    pub service_cluster_ip_range: Option<Sp<String>>,
    pub service_node_port_range: Option<Sp<String>>,
    pub cluster_domain: Option<Sp<String>>,
    /// Node capabilities (see `ir::ClusterConfig`).
    pub random_fully: Option<Sp<bool>>,
    pub nfacct: Option<Sp<bool>>,
    /// `nftLayout`: `kube-proxy` or `fast` (see `ir::NftLayout`).
    pub nft_layout: Option<Sp<String>>,
    /// `topologyKeys`: `honour` or `ignore` (see `ir::TopologyKeys`).
    pub topology_keys: Option<Sp<String>>,
    /// `dnsRecords`: `spec` or `coredns` (see `ir::DnsRecords`).
    pub dns_records: Option<Sp<String>>,
    /// `ebpfMapSizes`: `KEY=N,...` (see `ir::EbpfMapSizes`).
    pub ebpf_map_sizes: Option<Sp<String>>,
    /// `ebpfLbAlgorithm`, `ebpfLbAlgorithmAnnotation`, `ebpfMaglevTableSize`,
    /// `ebpfMaglevHashSeed` (see `ir::EbpfAgent`).
    pub ebpf_lb_algorithm: Option<Sp<String>>,
    pub ebpf_lb_algorithm_annotation: Option<Sp<bool>>,
    pub ebpf_maglev_table_size: Option<Sp<i64>>,
    pub ebpf_maglev_hash_seed: Option<Sp<String>>,
    /// `ebpfServiceTopology` (see `ir::ClusterConfig::ebpf_service_topology`).
    pub ebpf_service_topology: Option<Sp<bool>>,
}

/// A ServiceCIDR (networking.k8s.io, 1.29+): a range the API server allocates from.
#[derive(Clone, Debug)]
pub struct ServiceCidrObj {
    pub span: Span,
    pub name: String,
    pub cidrs: Vec<Sp<String>>,
}

pub const CLUSTER_CONFIG_API: &str = "svc-compile/v1alpha1";

#[derive(Clone, Debug, Default)]
pub struct Objects {
    pub services: Vec<Service>,
    pub slices: Vec<EndpointSlice>,
    pub endpoints: Vec<Endpoints>,
    pub nodes: Vec<NodeObj>,
    pub pods: Vec<Pod>,
    pub proxy_configs: Vec<ProxyConfigDoc>,
    pub cluster_configs: Vec<ClusterConfigDoc>,
    pub service_cidrs: Vec<ServiceCidrObj>,
}

impl Objects {
    pub fn extend(&mut self, o: Objects) {
        self.services.extend(o.services);
        self.slices.extend(o.slices);
        self.endpoints.extend(o.endpoints);
        self.nodes.extend(o.nodes);
        self.pods.extend(o.pods);
        self.proxy_configs.extend(o.proxy_configs);
        self.cluster_configs.extend(o.cluster_configs);
        self.service_cidrs.extend(o.service_cidrs);
    }
}

const META_FIELDS: &[&str] = &[
    "name",
    "namespace",
    "labels",
    "annotations",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "ownerReferences",
    "finalizers",
    "generateName",
    "selfLink",
];

/// Decode every object of a document (a `List` yields its items).
pub fn decode_document(doc: &Document, out: &mut Objects, diags: &mut Diagnostics) {
    let mut d = Decoder { diags };
    decode_object(&doc.root, &Path::ROOT, &mut d, out);
}

/// Decode one part of a file parsed by [`crate::tree::parse_each`]: a whole document, or a
/// run of a `List`'s items (decoded as [`decode_document`] would decode them in the list).
pub fn decode_part(part: &Part<'_>, out: &mut Objects, diags: &mut Diagnostics) {
    let mut d = Decoder { diags };
    match part {
        Part::Document(root) => decode_object(root, &Path::ROOT, &mut d, out),
        Part::Items { list, first, items } => {
            // Decoded as decode_object would in the list's own arm; the list document
            // itself reports a missing apiVersion or kind.
            let api = list.get("apiVersion").and_then(Node::as_str);
            let kind = list.get("kind").and_then(Node::as_str);
            if let (Some(api), Some(kind)) = (api, kind.filter(|k| is_list(k, list))) {
                let list = Path::ROOT.key("items");
                for (i, it) in items.iter().enumerate() {
                    decode_item(api, kind, it, &list.index(first + i), &mut d, out);
                }
            }
        }
    }
}

/// One item of a list of kind `list_kind` (`apiVersion` `api`). The API's own typed lists
/// (`kubectl get --raw /api/v1/services`: a `ServiceList`) leave `apiVersion` and `kind`
/// out of their items, which are then the list's kind without `List`, in its apiVersion.
fn decode_item(
    api: &str,
    list_kind: &str,
    item: &Node,
    path: &Path,
    d: &mut Decoder,
    out: &mut Objects,
) {
    let kind = list_kind.strip_suffix("List").filter(|k| !k.is_empty());
    match (kind, &item.value) {
        (Some(kind), Value::Map(entries))
            if item.get("kind").is_none() && item.get("apiVersion").is_none() =>
        {
            let scalar = |text: &str| Node {
                span: item.span,
                value: Value::Scalar {
                    text: text.into(),
                    plain: true,
                },
            };
            let entry = |key: &str, text: &str| Entry {
                key: key.into(),
                key_span: item.span,
                value: scalar(text),
            };
            let mut typed = vec![entry("apiVersion", api), entry("kind", kind)];
            typed.extend(entries.iter().cloned());
            let item = Node {
                span: item.span,
                value: Value::Map(typed),
            };
            decode_object(&item, path, d, out);
        }
        _ => decode_object(item, path, d, out),
    }
}

/// `kind: List`, or a typed list such as `ServiceList`, whose items are objects.
fn is_list(kind: &str, root: &Node) -> bool {
    kind == "List" || (kind.ends_with("List") && root.get("items").is_some())
}

fn decode_object(root: &Node, path: &Path, d: &mut Decoder, out: &mut Objects) {
    // Only top-level documents may be something else than an object (a kustomization,
    // Helm's Chart.yaml or values.yaml, a dashboard): a `List`'s items and kube-proxy's
    // embedded config.conf must be objects.
    let top = matches!(path, Path::Root(""));
    let Value::Map(entries) = &root.value else {
        if top && matches!(root.value, Value::Seq(_)) {
            d.diags.push(not_an_object(root, "a list"));
            return;
        }
        d.diags.push(
            Diagnostic::error(
                "SVC006",
                format!(
                    "expected a Kubernetes object (a mapping), found a {}",
                    root.kind_name()
                ),
            )
            .at(root.span)
            .hint("each YAML document must be one object with apiVersion and kind"),
        );
        return;
    };
    // `apiVersion` or `kind` again in one mapping: a second object appended without `---`
    // (`kubectl get … -o yaml >> file`). Either object alone would be read wrongly.
    if let Some(again) = entries.iter().enumerate().find_map(|(i, e)| {
        let key = e.key.as_str();
        (matches!(key, "apiVersion" | "kind") && entries[..i].iter().any(|f| f.key == key))
            .then_some(e)
    }) {
        d.diags.push(
            Diagnostic::error(
                "SVC020",
                format!(
                    "two objects in one document: `{}` is written a second time",
                    again.key
                ),
            )
            .at(again.key_span)
            .path(path.key(&again.key).to_string())
            .hint(format!(
                "a `---` line is missing before the second object (line {}?); neither is read until it is there",
                again.key_span.line
            )),
        );
        return;
    }
    // A mapping without `kind` and without `metadata` does not claim to be an object.
    if top && root.get("kind").is_none() && root.get("metadata").is_none() {
        d.diags.push(not_an_object(
            root,
            "a mapping without `kind` or `metadata`",
        ));
        return;
    }
    let api = d.str_(root.get("apiVersion"), &path.key("apiVersion"));
    let kind = d.str_(root.get("kind"), &path.key("kind"));
    let (Some(api), Some(kind)) = (api, kind) else {
        // kubectl: "apiVersion not set" / "Object 'Kind' is missing".
        let (message, hint) = match (
            root.get("apiVersion"),
            root.get("kind").and_then(Node::as_str),
        ) {
            (None, Some(k)) => (
                format!("object of kind `{k}` without `apiVersion`"),
                "add its apiVersion (`v1` for Service, Endpoints, Node and Pod)",
            ),
            (Some(_), None) => (
                "object without `kind`".to_string(),
                "add the kind this object is, e.g. `kind: Service`",
            ),
            _ => (
                "object without `apiVersion` and `kind`".to_string(),
                "add `apiVersion: v1` and `kind: Service` (or the kind this object is)",
            ),
        };
        d.diags.push(
            Diagnostic::error("SVC006", message)
                .at(root.span)
                .hint(hint),
        );
        return;
    };
    let a = api.v.as_str();
    match kind.v.as_str() {
        k if is_list(k, root) => {
            let items_path = path.key("items");
            for (i, it) in d.seq(root.get("items"), &items_path).iter().enumerate() {
                decode_item(a, k, it, &items_path.index(i), d, out);
            }
        }
        "Service" if a == "v1" => {
            if let Some(s) = service(root, path, d) {
                out.services.push(s)
            }
        }
        "Endpoints" if a == "v1" => {
            if let Some(s) = endpoints(root, path, d) {
                out.endpoints.push(s)
            }
        }
        "EndpointSlice" if a == "discovery.k8s.io/v1" || a == "discovery.k8s.io/v1beta1" => {
            if a.ends_with("v1beta1") {
                d.diags.push(
                    Diagnostic::warning(
                        "SVC013",
                        "discovery.k8s.io/v1beta1 EndpointSlices were removed in Kubernetes 1.25",
                    )
                    .at(api.span)
                    .path(path.key("apiVersion").to_string())
                    .hint("use discovery.k8s.io/v1 (topology.kubernetes.io/zone becomes `zone`); API servers since 1.25 reject v1beta1"),
                );
            }
            if let Some(s) = endpoint_slice(root, path, a.ends_with("v1beta1"), d) {
                out.slices.push(s)
            }
        }
        "Node" if a == "v1" => {
            if let Some(s) = node(root, path, d) {
                out.nodes.push(s)
            }
        }
        "Pod" if a == "v1" => {
            if let Some(s) = pod(root, path, d) {
                out.pods.push(s)
            }
        }
        "KubeProxyConfiguration" if a == "kubeproxy.config.k8s.io/v1alpha1" => {
            out.proxy_configs.push(proxy_config(root, path, d));
        }
        "ConfigMap" if a == "v1" && is_kube_proxy_configmap(root) => {
            kube_proxy_configmap(root, path, d, out);
        }
        "ServiceCIDR" if a.starts_with("networking.k8s.io/") => {
            let sp = path.key("spec");
            let cidrs = root
                .get("spec")
                .and_then(|n| d.map(n, &sp, "ServiceCIDR spec", Some(&["cidrs"])))
                .map(|f| d.str_list(f.get("cidrs"), &sp.key("cidrs")))
                .unwrap_or_default();
            out.service_cidrs.push(ServiceCidrObj {
                span: root.span,
                name: object_name(root),
                cidrs,
            });
        }
        // Our own lock file may sit among the manifests: nothing to read here.
        "AllocationLock" if a == CLUSTER_CONFIG_API => {}
        "ClusterConfig" if a == CLUSTER_CONFIG_API => {
            out.cluster_configs.push(cluster_config(root, path, d));
        }
        k @ ("Service"
        | "Endpoints"
        | "EndpointSlice"
        | "Node"
        | "Pod"
        | "KubeProxyConfiguration"
        | "ClusterConfig")
            if group_of(a) == kind_group(k) =>
        {
            // Our kind in another version of its group. The same kind name in another
            // group (Knative's `serving.knative.dev/v1` Service) is another kind: skipped
            // below, as the API server serves it apart.
            d.diags.push(
                Diagnostic::error(
                    "SVC007",
                    format!("unsupported apiVersion `{a}` for kind {k}"),
                )
                .at(api.span)
                .path(path.key("apiVersion").to_string())
                .hint(match k {
                    "EndpointSlice" => "use discovery.k8s.io/v1 (or v1beta1)",
                    "KubeProxyConfiguration" => "use kubeproxy.config.k8s.io/v1alpha1",
                    "ClusterConfig" => "use svc-compile/v1alpha1",
                    _ => "use v1",
                }),
            );
        }
        // (An exact name of ours here is another group's kind: skipped below.)
        k if !KINDS.contains(&k) && KINDS.iter().any(|known| known.eq_ignore_ascii_case(k)) => {
            // The API server's kinds are case-sensitive: kubectl answers "no matches for
            // kind" for `kind: service`.
            let known = KINDS.iter().find(|known| known.eq_ignore_ascii_case(k));
            d.diags.push(
                Diagnostic::error("SVC011", format!("unknown kind `{k}`"))
                    .at(kind.span)
                    .path(path.key("kind").to_string())
                    .hint(format!(
                        "did you mean `{}`? Kinds are case-sensitive",
                        known.expect("matched above")
                    )),
            );
        }
        k => {
            d.diags.push(
                Diagnostic::note(
                    "SVC008",
                    match KINDS.contains(&k) {
                        // Another group's kind of the same name: say which.
                        true => format!(
                            "skipped {k} `{}` of {a}: svc-compile reads {k} of {} only",
                            object_name(root),
                            match kind_group(k) {
                                "" => "v1",
                                g => g,
                            }
                        ),
                        false => format!(
                            "skipped {k} `{}`: svc-compile does not read this kind",
                            object_name(root)
                        ),
                    },
                )
                .at(kind.span)
                .path(path.key("kind").to_string()),
            );
        }
    }
}

/// The kind an SVC008 note says was skipped (its message starts `skipped KIND `), for the
/// notes' summary.
pub fn skipped_kind(d: &Diagnostic) -> Option<&str> {
    let rest = d.message.strip_prefix("skipped ")?;
    (d.code == "SVC008")
        .then(|| rest.split(' ').next())
        .flatten()
}

/// The API group of an apiVersion (`discovery.k8s.io/v1` → `discovery.k8s.io`; the core
/// group's `v1` → ``).
fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(g, _)| g)
}

/// The API group of a kind svc-compile reads.
fn kind_group(kind: &str) -> &'static str {
    match kind {
        "EndpointSlice" => "discovery.k8s.io",
        "KubeProxyConfiguration" => "kubeproxy.config.k8s.io",
        "ClusterConfig" => group_of(CLUSTER_CONFIG_API),
        _ => "",
    }
}

/// The kinds svc-compile reads, for "did you mean" on a wrongly cased kind.
const KINDS: &[&str] = &[
    "Service",
    "Endpoints",
    "EndpointSlice",
    "Node",
    "Pod",
    "List",
    "ServiceList",
    "EndpointsList",
    "EndpointSliceList",
    "NodeList",
    "PodList",
    "KubeProxyConfiguration",
    "ClusterConfig",
];

/// A top-level document that is not a Kubernetes object: skipped with a note, as unknown
/// kinds are, so that `check` can run over a whole repository.
fn not_an_object(root: &Node, what: &str) -> Diagnostic {
    Diagnostic::note(
        "SVC012",
        format!("skipped a document that is not a Kubernetes object ({what})"),
    )
    .at(Span { len: 1, ..root.span })
    .hint("kustomization.yaml, Chart.yaml, values.yaml and dashboards are not read; leave such files out with --exclude GLOB")
}

fn object_name(root: &Node) -> String {
    let m = root.get("metadata");
    let name = m
        .and_then(|m| m.get("name"))
        .and_then(Node::as_str)
        .unwrap_or("?");
    match m.and_then(|m| m.get("namespace")).and_then(Node::as_str) {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    }
}

fn top<'a>(
    root: &'a Node,
    path: &Path,
    what: &str,
    extra: &[&str],
    d: &mut Decoder,
) -> Option<Fields<'a>> {
    let mut known = vec!["apiVersion", "kind", "metadata"];
    known.extend_from_slice(extra);
    d.map(root, path, what, Some(&known))
}

fn meta(root: &Node, path: &Path, what: &str, d: &mut Decoder, namespaced: bool) -> Option<Meta> {
    let mp = path.key("metadata");
    let Some(m) = root
        .get("metadata")
        .and_then(|n| d.map(n, &mp, "metadata", Some(META_FIELDS)))
    else {
        d.diags.push(
            Diagnostic::error("SVC009", format!("{what} without `metadata.name`"))
                .at(root.span)
                .path(mp.to_string())
                .hint("every object needs metadata.name"),
        );
        return None;
    };
    let Some(name) = d.str_(m.get("name"), &mp.key("name")) else {
        d.diags.push(
            Diagnostic::error("SVC009", format!("{what} without `metadata.name`"))
                .at(m.span)
                .path(mp.key("name").to_string())
                .hint("every object needs metadata.name"),
        );
        return None;
    };
    // An empty namespace is an unset one: kubectl fills in the context's (kubectl's
    // `namespace: ""` is no error), so the object lands in `default` here.
    let namespace = d
        .str_(m.get("namespace"), &mp.key("namespace"))
        .filter(|n| !n.v.is_empty())
        .unwrap_or_else(|| {
            Sp::new(
                if namespaced {
                    "default".into()
                } else {
                    String::new()
                },
                name.span,
            )
        });
    Some(Meta {
        labels: d.str_map(m.get("labels"), &mp.key("labels")),
        annotations: d.str_map(m.get("annotations"), &mp.key("annotations")),
        deletion_timestamp: m.get("deletionTimestamp").is_some(),
        name,
        namespace,
    })
}

const SERVICE_SPEC: &[&str] = &[
    "ports",
    "selector",
    "clusterIP",
    "clusterIPs",
    "type",
    "externalIPs",
    "sessionAffinity",
    "loadBalancerIP",
    "loadBalancerSourceRanges",
    "externalName",
    "externalTrafficPolicy",
    "healthCheckNodePort",
    "publishNotReadyAddresses",
    "sessionAffinityConfig",
    "ipFamilies",
    "ipFamilyPolicy",
    "allocateLoadBalancerNodePorts",
    "loadBalancerClass",
    "internalTrafficPolicy",
    "topologyKeys",
    "trafficDistribution",
];
const SERVICE_PORT: &[&str] = &[
    "name",
    "protocol",
    "appProtocol",
    "port",
    "targetPort",
    "nodePort",
];

fn service(root: &Node, path: &Path, d: &mut Decoder) -> Option<Service> {
    let f = top(root, path, "Service", &["spec", "status"], d)?;
    let meta = meta(root, path, "Service", d, true)?;
    let sp = path.key("spec");
    let empty = Node {
        span: root.span,
        value: Value::Map(Vec::new()),
    };
    let spec_node = f.get("spec").unwrap_or(&empty);
    let s = d.map(spec_node, &sp, "Service spec", Some(SERVICE_SPEC))?;
    let p = |k: &'static str| sp.key(k);
    let mut ports = Vec::new();
    let pp = p("ports");
    for (i, n) in d.seq(s.get("ports"), &pp).iter().enumerate() {
        let ip = pp.index(i);
        let Some(pf) = d.map(n, &ip, "Service port", Some(SERVICE_PORT)) else {
            continue;
        };
        ports.push(Port {
            span: n.span,
            name: d.str_(pf.get("name"), &ip.key("name")),
            protocol: d.str_(pf.get("protocol"), &ip.key("protocol")),
            port: d.int(pf.get("port"), &ip.key("port")),
            target_port: d.int_or_string(pf.get("targetPort"), &ip.key("targetPort")),
            node_port: d.int(pf.get("nodePort"), &ip.key("nodePort")),
            app_protocol: d.str_(pf.get("appProtocol"), &ip.key("appProtocol")),
            port_written: pf.get("port").is_some(),
        });
    }
    let (affinity_timeout, _) = {
        let ap = p("sessionAffinityConfig");
        let t = s
            .get("sessionAffinityConfig")
            .and_then(|n| d.map(n, &ap, "sessionAffinityConfig", Some(&["clientIP"])))
            .and_then(|f| f.get("clientIP"))
            .and_then(|n| {
                d.map(
                    n,
                    &ap.key("clientIP"),
                    "clientIP",
                    Some(&["timeoutSeconds"]),
                )
            })
            .and_then(|f| d.int(f.get("timeoutSeconds"), &ap.key("clientIP.timeoutSeconds")));
        (t, ())
    };
    let mut lb_ingress = Vec::new();
    if let Some(st) = f.get("status") {
        let stp = path.key("status");
        if let Some(stf) = d.map(
            st,
            &stp,
            "Service status",
            Some(&["loadBalancer", "conditions"]),
        ) {
            let lbp = stp.key("loadBalancer");
            if let Some(lb) = stf
                .get("loadBalancer")
                .and_then(|n| d.map(n, &lbp, "loadBalancer status", Some(&["ingress"])))
            {
                let ingp = lbp.key("ingress");
                for (i, n) in d.seq(lb.get("ingress"), &ingp).iter().enumerate() {
                    let ip = ingp.index(i);
                    if let Some(g) = d.map(
                        n,
                        &ip,
                        "load balancer ingress",
                        Some(&["ip", "hostname", "ipMode", "ports"]),
                    ) {
                        lb_ingress.push(LbIngress {
                            ip: d.str_(g.get("ip"), &ip.key("ip")),
                            hostname: d.str_(g.get("hostname"), &ip.key("hostname")),
                            ip_mode: d.str_(g.get("ipMode"), &ip.key("ipMode")),
                        });
                    }
                }
            }
        }
    }
    let selector = s
        .get("selector")
        .map(|n| d.str_map(Some(n), &p("selector")));
    let ip_families = d.str_list(s.get("ipFamilies"), &p("ipFamilies"));
    // `ipFamily` (pre-1.20 alpha) is gone: the API server drops it as an unknown field
    // (SVC003 above) and it does not choose the family.
    Some(Service {
        span: root.span,
        type_: d.str_(s.get("type"), &p("type")),
        cluster_ip: d.str_(s.get("clusterIP"), &p("clusterIP")),
        cluster_ips: d.str_list(s.get("clusterIPs"), &p("clusterIPs")),
        ip_families,
        ip_family_policy: d.str_(s.get("ipFamilyPolicy"), &p("ipFamilyPolicy")),
        selector_span: s.get("selector").map(|n| n.span),
        selector,
        ports_span: s.get("ports").map(|n| n.span),
        ports,
        external_ips: d.str_list(s.get("externalIPs"), &p("externalIPs")),
        external_name: d.str_(s.get("externalName"), &p("externalName")),
        load_balancer_ip: d.str_(s.get("loadBalancerIP"), &p("loadBalancerIP")),
        load_balancer_source_ranges: d.str_list(
            s.get("loadBalancerSourceRanges"),
            &p("loadBalancerSourceRanges"),
        ),
        external_traffic_policy: d
            .str_(s.get("externalTrafficPolicy"), &p("externalTrafficPolicy")),
        internal_traffic_policy: d
            .str_(s.get("internalTrafficPolicy"), &p("internalTrafficPolicy")),
        session_affinity: d.str_(s.get("sessionAffinity"), &p("sessionAffinity")),
        affinity_timeout,
        health_check_node_port: d.int(s.get("healthCheckNodePort"), &p("healthCheckNodePort")),
        publish_not_ready_addresses: d
            .bool_(
                s.get("publishNotReadyAddresses"),
                &p("publishNotReadyAddresses"),
            )
            .is_some_and(|b| b.v),
        allocate_lb_node_ports: d
            .bool_(
                s.get("allocateLoadBalancerNodePorts"),
                &p("allocateLoadBalancerNodePorts"),
            )
            .is_none_or(|b| b.v),
        allocate_lb_node_ports_span: s.get("allocateLoadBalancerNodePorts").map(|n| n.span),
        load_balancer_class: d.str_(s.get("loadBalancerClass"), &p("loadBalancerClass")),
        topology_keys_span: s.get("topologyKeys").map(|n| n.span),
        topology_keys: d.str_list(s.get("topologyKeys"), &p("topologyKeys")),
        traffic_distribution: d.str_(s.get("trafficDistribution"), &p("trafficDistribution")),
        lb_ingress,
        meta,
    })
}

const SLICE_TOP: &[&str] = &["addressType", "endpoints", "ports"];
const SLICE_EP: &[&str] = &[
    "addresses",
    "conditions",
    "hostname",
    "targetRef",
    "nodeName",
    "zone",
    "hints",
    "deprecatedTopology",
    "topology",
];

fn slice_ports(items: &[Node], path: &Path, d: &mut Decoder) -> Vec<SlicePort> {
    let mut ports = Vec::new();
    for (i, n) in items.iter().enumerate() {
        let pp = path.index(i);
        if let Some(f) = d.map(
            n,
            &pp,
            "endpoint port",
            Some(&["name", "protocol", "port", "appProtocol"]),
        ) {
            ports.push(SlicePort {
                span: n.span,
                name: d.str_(f.get("name"), &pp.key("name")),
                protocol: d.str_(f.get("protocol"), &pp.key("protocol")),
                port: d.int(f.get("port"), &pp.key("port")),
                app_protocol: d.str_(f.get("appProtocol"), &pp.key("appProtocol")),
                port_written: f.get("port").is_some(),
            });
        }
    }
    ports
}

fn endpoint_slice(root: &Node, path: &Path, beta: bool, d: &mut Decoder) -> Option<EndpointSlice> {
    let f = top(root, path, "EndpointSlice", SLICE_TOP, d)?;
    let meta = meta(root, path, "EndpointSlice", d, true)?;
    let mut endpoints = Vec::new();
    let ep = path.key("endpoints");
    for (i, n) in d.seq(f.get("endpoints"), &ep).iter().enumerate() {
        let p = ep.index(i);
        let Some(e) = d.map(n, &p, "endpoint", Some(SLICE_EP)) else {
            continue;
        };
        let cp = p.key("conditions");
        let (mut ready, mut serving, mut terminating) = (None, None, None);
        if let Some(c) = e.get("conditions").and_then(|n| {
            d.map(
                n,
                &cp,
                "endpoint conditions",
                Some(&["ready", "serving", "terminating"]),
            )
        }) {
            ready = d.bool_(c.get("ready"), &cp.key("ready")).map(|b| b.v);
            serving = d.bool_(c.get("serving"), &cp.key("serving")).map(|b| b.v);
            terminating = d
                .bool_(c.get("terminating"), &cp.key("terminating"))
                .map(|b| b.v);
        }
        let (mut hint_zones, mut hint_nodes) = (Vec::new(), Vec::new());
        let mut hints_written = Vec::new();
        let hp = p.key("hints");
        if let Some(h) = e
            .get("hints")
            .and_then(|n| d.map(n, &hp, "endpoint hints", Some(&["forZones", "forNodes"])))
        {
            for (key, out) in [("forZones", &mut hint_zones), ("forNodes", &mut hint_nodes)] {
                let kp = hp.key(key);
                for (j, z) in d.seq(h.get(key), &kp).iter().enumerate() {
                    let zp = kp.index(j);
                    if let Some(zf) = d.map(z, &zp, "hint", Some(&["name"])) {
                        if let Some(name) = d.str_(zf.get("name"), &zp.key("name")) {
                            out.push(name.v.clone());
                            hints_written.push((key, name));
                        }
                    }
                }
                out.sort();
            }
        }
        let mut node_name = d.str_(e.get("nodeName"), &p.key("nodeName"));
        let mut zone = d.str_(e.get("zone"), &p.key("zone"));
        // v1beta1 kept node and zone in a topology map.
        let topo_key = if beta {
            "topology"
        } else {
            "deprecatedTopology"
        };
        let topo = d.str_map(e.get(topo_key), &p.key(topo_key));
        for (k, v) in topo {
            match k.v.as_str() {
                "kubernetes.io/hostname" if node_name.is_none() => node_name = Some(v),
                "topology.kubernetes.io/zone" if zone.is_none() => zone = Some(v),
                _ => {}
            }
        }
        endpoints.push(SliceEndpoint {
            span: n.span,
            addresses: d.str_list(e.get("addresses"), &p.key("addresses")),
            ready,
            serving,
            terminating,
            node_name,
            zone,
            hostname: d.str_(e.get("hostname"), &p.key("hostname")),
            hint_zones,
            hint_nodes,
            hints_written,
        });
    }
    let pp = path.key("ports");
    let port_nodes = d.seq(f.get("ports"), &pp);
    Some(EndpointSlice {
        span: root.span,
        address_type: d.str_(f.get("addressType"), &path.key("addressType")),
        ports: slice_ports(port_nodes, &pp, d),
        endpoints,
        meta,
    })
}

fn endpoints(root: &Node, path: &Path, d: &mut Decoder) -> Option<Endpoints> {
    let f = top(root, path, "Endpoints", &["subsets"], d)?;
    let meta = meta(root, path, "Endpoints", d, true)?;
    let sp = path.key("subsets");
    let mut subsets = Vec::new();
    for (i, n) in d.seq(f.get("subsets"), &sp).iter().enumerate() {
        let p = sp.index(i);
        let Some(s) = d.map(
            n,
            &p,
            "Endpoints subset",
            Some(&["addresses", "notReadyAddresses", "ports"]),
        ) else {
            continue;
        };
        let addrs = |key: &str, d: &mut Decoder| {
            let ap = p.key(key);
            let mut out = Vec::new();
            for (j, a) in d.seq(s.get(key), &ap).iter().enumerate() {
                let aap = ap.index(j);
                if let Some(af) = d.map(
                    a,
                    &aap,
                    "endpoint address",
                    Some(&["ip", "hostname", "nodeName", "targetRef"]),
                ) {
                    match d.str_(af.get("ip"), &aap.key("ip")) {
                        Some(ip) => out.push(EpAddress {
                            ip,
                            node_name: d.str_(af.get("nodeName"), &aap.key("nodeName")),
                            hostname: d.str_(af.get("hostname"), &aap.key("hostname")),
                        }),
                        None => d.diags.push(
                            Diagnostic::error("SVC010", "endpoint address without `ip`")
                                .at(a.span)
                                .path(aap.to_string()),
                        ),
                    }
                }
            }
            out
        };
        let addresses = addrs("addresses", d);
        let not_ready = addrs("notReadyAddresses", d);
        let pp = p.key("ports");
        let port_nodes = d.seq(s.get("ports"), &pp);
        subsets.push(Subset {
            addresses,
            not_ready,
            ports: slice_ports(port_nodes, &pp, d),
        });
    }
    Some(Endpoints {
        span: root.span,
        meta,
        subsets,
    })
}

fn node(root: &Node, path: &Path, d: &mut Decoder) -> Option<NodeObj> {
    let f = top(root, path, "Node", &["spec", "status"], d)?;
    let meta = meta(root, path, "Node", d, false)?;
    let sp = path.key("spec");
    let mut pod_cidrs = Vec::new();
    let mut taints = Vec::new();
    if let Some(s) = f.get("spec").and_then(|n| {
        d.map(
            n,
            &sp,
            "Node spec",
            Some(&[
                "podCIDR",
                "podCIDRs",
                "providerID",
                "taints",
                "unschedulable",
                "externalID",
                "configSource",
            ]),
        )
    }) {
        pod_cidrs = d.str_list(s.get("podCIDRs"), &sp.key("podCIDRs"));
        if pod_cidrs.is_empty() {
            pod_cidrs.extend(d.str_(s.get("podCIDR"), &sp.key("podCIDR")));
        }
        let tp = sp.key("taints");
        for (i, t) in d.seq(s.get("taints"), &tp).iter().enumerate() {
            let p = tp.index(i);
            if let Some(tf) = d.map(
                t,
                &p,
                "taint",
                Some(&["key", "value", "effect", "timeAdded"]),
            ) {
                taints.extend(d.str_(tf.get("key"), &p.key("key")).map(|k| k.v));
            }
        }
    }
    let mut addresses = Vec::new();
    let stp = path.key("status");
    if let Some(st) = f
        .get("status")
        .and_then(|n| d.map(n, &stp, "Node status", None))
    {
        let ap = stp.key("addresses");
        for (i, a) in d.seq(st.get("addresses"), &ap).iter().enumerate() {
            let p = ap.index(i);
            if let Some(af) = d.map(a, &p, "node address", Some(&["type", "address"])) {
                if let (Some(t), Some(addr)) = (
                    d.str_(af.get("type"), &p.key("type")),
                    d.str_(af.get("address"), &p.key("address")),
                ) {
                    addresses.push((t.v, addr));
                }
            }
        }
    }
    Some(NodeObj {
        span: root.span,
        meta,
        pod_cidrs,
        addresses,
        taints,
    })
}

fn pod(root: &Node, path: &Path, d: &mut Decoder) -> Option<Pod> {
    // Pod specs are large and owned by other tools; read what we need, warn on nothing
    // below spec/status.
    let f = top(root, path, "Pod", &["spec", "status"], d)?;
    let meta = meta(root, path, "Pod", d, true)?;
    let sp = path.key("spec");
    let mut node_name = None;
    let (mut hostname, mut subdomain) = (None, None);
    let mut host_network = false;
    let mut container_ports = Vec::new();
    if let Some(s) = f.get("spec").and_then(|n| d.map(n, &sp, "Pod spec", None)) {
        node_name = d.str_(s.get("nodeName"), &sp.key("nodeName"));
        hostname = d.str_(s.get("hostname"), &sp.key("hostname"));
        subdomain = d.str_(s.get("subdomain"), &sp.key("subdomain"));
        host_network = d
            .bool_(s.get("hostNetwork"), &sp.key("hostNetwork"))
            .is_some_and(|b| b.v);
        // Named ports are looked up in the containers and in the sidecars
        // (initContainers with `restartPolicy: Always`), as the controller's findPort does.
        for list in ["containers", "initContainers"] {
            let cp = sp.key(list);
            for (i, c) in d.seq(s.get(list), &cp).iter().enumerate() {
                let p = cp.index(i);
                let Some(cf) = d.map(c, &p, "container", None) else {
                    continue;
                };
                if list == "initContainers"
                    && cf.get("restartPolicy").and_then(Node::as_str) != Some("Always")
                {
                    continue;
                }
                let pp = p.key("ports");
                for (j, port) in d.seq(cf.get("ports"), &pp).iter().enumerate() {
                    let q = pp.index(j);
                    let Some(pf) = d.map(
                        port,
                        &q,
                        "container port",
                        Some(&["name", "containerPort", "protocol", "hostPort", "hostIP"]),
                    ) else {
                        continue;
                    };
                    if let Some(n) = d.int(pf.get("containerPort"), &q.key("containerPort")) {
                        container_ports.push(ContainerPort {
                            name: d.str_(pf.get("name"), &q.key("name")).map(|s| s.v),
                            port: n.v,
                            protocol: d
                                .str_(pf.get("protocol"), &q.key("protocol"))
                                .map_or("TCP".into(), |s| s.v),
                        });
                    }
                }
            }
        }
    }
    let stp = path.key("status");
    let mut pod_ips = Vec::new();
    let mut ready = false;
    let mut phase = None;
    if let Some(st) = f
        .get("status")
        .and_then(|n| d.map(n, &stp, "Pod status", None))
    {
        let ip = stp.key("podIPs");
        for (i, n) in d.seq(st.get("podIPs"), &ip).iter().enumerate() {
            let p = ip.index(i);
            if let Some(x) = d.map(n, &p, "pod IP", Some(&["ip"])) {
                pod_ips.extend(d.str_(x.get("ip"), &p.key("ip")));
            }
        }
        if pod_ips.is_empty() {
            pod_ips.extend(d.str_(st.get("podIP"), &stp.key("podIP")));
        }
        phase = d.str_(st.get("phase"), &stp.key("phase")).map(|s| s.v);
        let cp = stp.key("conditions");
        for (i, c) in d.seq(st.get("conditions"), &cp).iter().enumerate() {
            let p = cp.index(i);
            if let Some(cf) = d.map(c, &p, "pod condition", None) {
                let t = d.str_(cf.get("type"), &p.key("type"));
                let s = d.str_(cf.get("status"), &p.key("status"));
                if t.is_some_and(|t| t.v == "Ready") {
                    ready = s.is_some_and(|s| s.v == "True");
                }
            }
        }
    }
    Some(Pod {
        span: root.span,
        meta,
        node_name,
        hostname,
        subdomain,
        host_network,
        pod_ips,
        ready,
        phase,
        container_ports,
    })
}

const PROXY_TOP: &[&str] = &[
    "bindAddress",
    "bindAddressHardFail",
    "clientConnection",
    "clusterCIDR",
    "configSyncPeriod",
    "conntrack",
    "detectLocal",
    "detectLocalMode",
    "enableProfiling",
    "featureGates",
    "healthzBindAddress",
    "hostnameOverride",
    "iptables",
    "ipvs",
    "linux",
    "logging",
    "metricsBindAddress",
    "mode",
    "nftables",
    "nodePortAddresses",
    "oomScoreAdj",
    "portRange",
    "showHiddenMetricsForVersion",
    "udpIdleTimeout",
    "winkernel",
    "windowsRunAsService",
];

fn proxy_config(root: &Node, path: &Path, d: &mut Decoder) -> ProxyConfigDoc {
    let mut known = vec!["apiVersion", "kind"];
    known.extend_from_slice(PROXY_TOP);
    let mut out = ProxyConfigDoc {
        span: root.span,
        ..Default::default()
    };
    let Some(f) = d.map(root, path, "KubeProxyConfiguration", Some(&known)) else {
        return out;
    };
    let p = |k: &'static str| path.key(k);
    out.mode = d.str_(f.get("mode"), &p("mode"));
    out.cluster_cidr = d.str_(f.get("clusterCIDR"), &p("clusterCIDR"));
    out.detect_local_mode = d.str_(f.get("detectLocalMode"), &p("detectLocalMode"));
    if let Some(dl) = f.get("detectLocal").and_then(|n| {
        d.map(
            n,
            &p("detectLocal"),
            "detectLocal",
            Some(&["bridgeInterface", "interfaceNamePrefix"]),
        )
    }) {
        out.bridge_interface = d.str_(dl.get("bridgeInterface"), &p("detectLocal.bridgeInterface"));
        out.interface_name_prefix = d.str_(
            dl.get("interfaceNamePrefix"),
            &p("detectLocal.interfaceNamePrefix"),
        );
    }
    out.node_port_addresses = d.str_list(f.get("nodePortAddresses"), &p("nodePortAddresses"));
    let ipt = &[
        "masqueradeAll",
        "masqueradeBit",
        "localhostNodePorts",
        "minSyncPeriod",
        "syncPeriod",
    ];
    if let Some(i) = f
        .get("iptables")
        .and_then(|n| d.map(n, &p("iptables"), "iptables settings", Some(ipt)))
    {
        out.masquerade_all = d.bool_(i.get("masqueradeAll"), &p("iptables.masqueradeAll"));
        out.masquerade_bit = d.int(i.get("masqueradeBit"), &p("iptables.masqueradeBit"));
        out.masquerade_bits.extend(
            out.masquerade_bit
                .clone()
                .map(|b| (b, "iptables.masqueradeBit")),
        );
        out.localhost_node_ports = d.bool_(
            i.get("localhostNodePorts"),
            &p("iptables.localhostNodePorts"),
        );
    }
    // Newer configs keep masqueradeAll under `linux` (and nftables mode under `nftables`).
    if let Some(l) = f.get("linux").and_then(|n| {
        d.map(
            n,
            &p("linux"),
            "linux settings",
            Some(&["conntrack", "masqueradeAll", "oomScoreAdj"]),
        )
    }) {
        if out.masquerade_all.is_none() {
            out.masquerade_all = d.bool_(l.get("masqueradeAll"), &p("linux.masqueradeAll"));
        }
    }
    let mut nftables_bit = None;
    if let Some(n) = f.get("nftables").and_then(|n| {
        d.map(
            n,
            &p("nftables"),
            "nftables settings",
            Some(&[
                "masqueradeAll",
                "masqueradeBit",
                "minSyncPeriod",
                "syncPeriod",
            ]),
        )
    }) {
        let nft_bit = d.int(n.get("masqueradeBit"), &p("nftables.masqueradeBit"));
        out.masquerade_bits
            .extend(nft_bit.clone().map(|b| (b, "nftables.masqueradeBit")));
        if out.mode.as_ref().is_some_and(|m| m.v == "nftables") {
            if let Some(v) = d.bool_(n.get("masqueradeAll"), &p("nftables.masqueradeAll")) {
                out.masquerade_all.get_or_insert(v);
            }
        }
        nftables_bit = nft_bit;
    }
    // kube-proxy's nftables mode passes `NFTables.MasqueradeBit` to its proxier and never
    // looks at `IPTables.MasqueradeBit` (cmd/kube-proxy/app/server_linux.go).
    if out.mode.as_ref().is_some_and(|m| m.v == "nftables") {
        out.masquerade_bit = nftables_bit;
    }
    let ipvs = &[
        "scheduler",
        "excludeCIDRs",
        "strictARP",
        "syncPeriod",
        "minSyncPeriod",
        "tcpTimeout",
        "tcpFinTimeout",
        "udpTimeout",
    ];
    if let Some(i) = f
        .get("ipvs")
        .and_then(|n| d.map(n, &p("ipvs"), "ipvs settings", Some(ipvs)))
    {
        out.ipvs_scheduler = d.str_(i.get("scheduler"), &p("ipvs.scheduler"));
        out.ipvs_strict_arp = d.bool_(i.get("strictARP"), &p("ipvs.strictARP"));
        for (slot, (key, path)) in out.ipvs_timeouts.iter_mut().zip([
            ("tcpTimeout", "ipvs.tcpTimeout"),
            ("tcpFinTimeout", "ipvs.tcpFinTimeout"),
            ("udpTimeout", "ipvs.udpTimeout"),
        ]) {
            *slot = d.str_(i.get(key), &p(path));
        }
        out.ipvs_exclude_cidrs = d.str_list(i.get("excludeCIDRs"), &p("ipvs.excludeCIDRs"));
    }
    let ct = &[
        "maxPerCore",
        "min",
        "tcpEstablishedTimeout",
        "tcpCloseWaitTimeout",
        "tcpBeLiberal",
        "udpTimeout",
        "udpStreamTimeout",
    ];
    if let Some(c) = f
        .get("conntrack")
        .and_then(|n| d.map(n, &p("conntrack"), "conntrack settings", Some(ct)))
    {
        out.tcp_be_liberal = d.bool_(c.get("tcpBeLiberal"), &p("conntrack.tcpBeLiberal"));
        for (slot, (key, path)) in out.conntrack_counts.iter_mut().zip([
            ("maxPerCore", "conntrack.maxPerCore"),
            ("min", "conntrack.min"),
        ]) {
            *slot = d.int(c.get(key), &p(path));
        }
        for (slot, (key, path)) in out.conntrack_timeouts.iter_mut().zip([
            ("tcpEstablishedTimeout", "conntrack.tcpEstablishedTimeout"),
            ("tcpCloseWaitTimeout", "conntrack.tcpCloseWaitTimeout"),
            ("udpTimeout", "conntrack.udpTimeout"),
            ("udpStreamTimeout", "conntrack.udpStreamTimeout"),
        ]) {
            *slot = d.str_(c.get(key), &p(path));
        }
    }
    out
}

fn is_kube_proxy_configmap(root: &Node) -> bool {
    root.get("data")
        .and_then(|d| d.get("config.conf"))
        .is_some()
        && root
            .get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(Node::as_str)
            == Some("kube-proxy")
}

/// kubeadm keeps kube-proxy's configuration in ConfigMap kube-system/kube-proxy under
/// `data["config.conf"]`: parse that embedded YAML, with its lines mapped back to the file.
fn kube_proxy_configmap(root: &Node, _path: &Path, d: &mut Decoder, out: &mut Objects) {
    let Some(conf) = root.get("data").and_then(|n| n.get("config.conf")) else {
        return;
    };
    let Some(text) = conf.as_str() else { return };
    // saphyr's span of a block scalar starts at its first content character, so the
    // embedded text's line 1, column 1 is there (block scalars keep no indentation).
    let (lines, cols) = (conf.span.line - 1, conf.span.col - 1);
    let (docs, diags) = crate::tree::parse_yaml(conf.span.file, text);
    for mut g in diags.items {
        if let Some(s) = g.span.as_mut() {
            s.line += lines;
            s.col += cols;
        }
        d.diags.push(g);
    }
    for doc in docs {
        let mut root = doc.root;
        shift_lines(&mut root, lines, cols);
        let mut sub = Objects::default();
        decode_object(&root, &Path::Root("data[config.conf]"), d, &mut sub);
        out.proxy_configs.extend(sub.proxy_configs);
    }
}

fn shift_lines(n: &mut Node, lines: u32, cols: u32) {
    n.span.line += lines;
    n.span.col += cols;
    match &mut n.value {
        Value::Seq(items) => items.iter_mut().for_each(|i| shift_lines(i, lines, cols)),
        Value::Map(es) => es.iter_mut().for_each(|e| {
            e.key_span.line += lines;
            e.key_span.col += cols;
            shift_lines(&mut e.value, lines, cols)
        }),
        _ => {}
    }
}

fn cluster_config(root: &Node, path: &Path, d: &mut Decoder) -> ClusterConfigDoc {
    let known = [
        "apiVersion",
        "kind",
        "metadata",
        "serviceClusterIPRange",
        "serviceNodePortRange",
        "clusterDomain",
        "randomFully",
        "nfacct",
        "nftLayout",
        "topologyKeys",
        "dnsRecords",
        "ebpfMapSizes",
        "ebpfLbAlgorithm",
        "ebpfLbAlgorithmAnnotation",
        "ebpfMaglevTableSize",
        "ebpfMaglevHashSeed",
        "ebpfServiceTopology",
    ];
    let mut out = ClusterConfigDoc {
        span: root.span,
        ..Default::default()
    };
    if let Some(f) = d.map(root, path, "ClusterConfig", Some(&known)) {
        out.service_cluster_ip_range = d.str_(
            f.get("serviceClusterIPRange"),
            &path.key("serviceClusterIPRange"),
        );
        out.service_node_port_range = d.str_(
            f.get("serviceNodePortRange"),
            &path.key("serviceNodePortRange"),
        );
        out.cluster_domain = d.str_(f.get("clusterDomain"), &path.key("clusterDomain"));
        out.random_fully = d.bool_(f.get("randomFully"), &path.key("randomFully"));
        out.nfacct = d.bool_(f.get("nfacct"), &path.key("nfacct"));
        out.nft_layout = d.str_(f.get("nftLayout"), &path.key("nftLayout"));
        out.topology_keys = d.str_(f.get("topologyKeys"), &path.key("topologyKeys"));
        out.dns_records = d.str_(f.get("dnsRecords"), &path.key("dnsRecords"));
        out.ebpf_map_sizes = d.str_(f.get("ebpfMapSizes"), &path.key("ebpfMapSizes"));
        out.ebpf_lb_algorithm = d.str_(f.get("ebpfLbAlgorithm"), &path.key("ebpfLbAlgorithm"));
        out.ebpf_lb_algorithm_annotation = d.bool_(
            f.get("ebpfLbAlgorithmAnnotation"),
            &path.key("ebpfLbAlgorithmAnnotation"),
        );
        out.ebpf_maglev_table_size = d.int(
            f.get("ebpfMaglevTableSize"),
            &path.key("ebpfMaglevTableSize"),
        );
        out.ebpf_maglev_hash_seed =
            d.str_(f.get("ebpfMaglevHashSeed"), &path.key("ebpfMaglevHashSeed"));
        out.ebpf_service_topology = d.bool_(
            f.get("ebpfServiceTopology"),
            &path.key("ebpfServiceTopology"),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::FileId;

    fn proxy_config(body: &str) -> ProxyConfigDoc {
        let text = format!(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n{body}"
        );
        let (docs, _) = crate::tree::parse_file(FileId(0), &text);
        let (mut objects, mut diags) = (Objects::default(), Diagnostics::default());
        for d in &docs {
            decode_document(d, &mut objects, &mut diags);
        }
        objects
            .proxy_configs
            .pop()
            .expect("one KubeProxyConfiguration")
    }

    fn bit(body: &str) -> Option<i64> {
        proxy_config(body).masquerade_bit.map(|b| b.v)
    }

    #[test]
    fn masquerade_bit_is_the_modes_own() {
        let both = "iptables: {masqueradeBit: 10}\nnftables: {masqueradeBit: 12}\n";
        assert_eq!(bit(both), Some(10));
        assert_eq!(bit(&format!("mode: iptables\n{both}")), Some(10));
        assert_eq!(bit(&format!("mode: nftables\n{both}")), Some(12));
        assert_eq!(bit(&format!("{both}mode: nftables\n")), Some(12));
        // nftables mode never reads iptables' bit: the default applies.
        assert_eq!(bit("mode: nftables\niptables: {masqueradeBit: 10}\n"), None);
        // Both written bits are kept for validation.
        let paths: Vec<_> = proxy_config(&format!("mode: nftables\n{both}"))
            .masquerade_bits
            .into_iter()
            .map(|(b, path)| (b.v, path))
            .collect();
        assert_eq!(
            paths,
            [
                (10, "iptables.masqueradeBit"),
                (12, "nftables.masqueradeBit")
            ]
        );
    }
}
