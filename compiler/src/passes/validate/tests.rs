//! One check per rule: YAML in, codes out. A good manifest yields nothing.

use super::validate;
use crate::diag::{Diagnostic, Diagnostics, Severity};
use crate::k8s::Objects;
use crate::passes::Settings;
use crate::source::FileId;

fn run_with(text: &str, settings: &Settings) -> Vec<Diagnostic> {
    let (docs, mut diags): (_, Diagnostics) = crate::tree::parse_file(FileId(0), text);
    let mut objects = Objects::default();
    for d in &docs {
        crate::k8s::decode_document(d, &mut objects, &mut diags);
    }
    validate(&objects, settings, &mut diags);
    diags.items
}

fn run(text: &str) -> Vec<Diagnostic> {
    run_with(text, &Settings::default())
}

/// Codes of errors and warnings, sorted, without repeats.
fn codes_of(items: &[Diagnostic]) -> Vec<&'static str> {
    let mut c: Vec<_> = items
        .iter()
        .filter(|d| d.severity != Severity::Note)
        .map(|d| d.code)
        .collect();
    c.sort_unstable();
    c.dedup();
    c
}

fn codes(text: &str) -> Vec<&'static str> {
    codes_of(&run(text))
}

fn indent(text: &str, by: usize) -> String {
    text.lines()
        .map(|l| format!("{}{l}\n", " ".repeat(by)))
        .collect()
}

/// Service `default/web` with `spec` (written without indentation).
fn svc(spec: &str) -> String {
    svc_named("web", spec)
}

fn svc_named(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\nspec:\n{}",
        indent(spec, 2)
    )
}

/// A Service with the common first lines, for specs that only add a field.
fn svc_port(extra: &str) -> String {
    svc(&format!(
        "selector: {{app: web}}\nports:\n- port: 80\n{extra}"
    ))
}

const GOOD: &str = r#"
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: shop
  labels: {app.kubernetes.io/name: web, tier: ""}
  annotations: {example.com/owner: team-a}
spec:
  selector: {app: web}
  ipFamilyPolicy: SingleStack
  ipFamilies: [IPv4]
  clusterIP: 10.96.0.20
  clusterIPs: [10.96.0.20]
  internalTrafficPolicy: Cluster
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}
  trafficDistribution: PreferClose
  ports:
  - {name: http, port: 80, targetPort: http}
  - {name: https, port: 443, targetPort: 8443, protocol: TCP}
  - {name: dns, port: 53, protocol: UDP}
---
apiVersion: v1
kind: Service
metadata: {name: edge, namespace: shop}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Local
  healthCheckNodePort: 32000
  loadBalancerSourceRanges: [203.0.113.0/24, " 198.51.100.0/24"]
  topologyKeys: []
  ports:
  - {name: http, port: 80, nodePort: 30080}
  - {name: http-udp, port: 80, protocol: UDP, nodePort: 30080}
status:
  loadBalancer:
    ingress:
    - {ip: 203.0.113.7, ipMode: Proxy}
    - {hostname: lb.example.com}
---
apiVersion: v1
kind: Service
metadata: {name: zoned, namespace: shop}
spec:
  externalIPs: [198.51.100.9]
  externalTrafficPolicy: Cluster
  ports: [{port: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: db, namespace: shop}
spec: {clusterIP: None, selector: {app: db}}
---
apiVersion: v1
kind: Service
metadata: {name: ext, namespace: shop}
spec: {type: ExternalName, externalName: db.example.com.}
---
apiVersion: v1
kind: Endpoints
metadata: {name: web, namespace: shop}
subsets:
- addresses: [{ip: 10.244.1.5, nodeName: node-a}]
  notReadyAddresses: [{ip: "fd00::5"}]
  ports: [{name: http, port: 8080}, {name: dns, port: 53, protocol: UDP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-abc12
  namespace: shop
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
endpoints:
- addresses: [10.244.1.5]
  conditions: {ready: true}
  nodeName: node-a
  zone: zone-a
ports:
- {name: http, port: 8080, protocol: TCP}
- {name: https, port: 8443}
- {name: dns, port: 53, protocol: UDP}
---
apiVersion: v1
kind: Node
metadata: {name: node-a, labels: {topology.kubernetes.io/zone: zone-a}}
spec: {podCIDRs: [10.244.1.0/24, "fd00:10:244:1::/64"]}
status:
  addresses:
  - {type: InternalIP, address: 192.168.1.10}
  - {type: Hostname, address: node-a}
---
apiVersion: v1
kind: Pod
metadata: {name: web-1, namespace: shop, labels: {app: web}}
spec:
  nodeName: node-a
  containers: [{name: web, ports: [{name: http, containerPort: 8080}]}]
status:
  podIPs: [{ip: 10.244.1.5}, {ip: "fd00:10:244:1::5"}]
---
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
# Not ipvs: IPVS mode is deprecated (SVC321, a warning); its section is checked anyway.
mode: iptables
clusterCIDR: 10.244.0.0/16,fd00:10:244::/56
detectLocalMode: ClusterCIDR
nodePortAddresses: [primary]
iptables: {masqueradeBit: 14}
ipvs: {scheduler: rr}
---
apiVersion: svc-compile/v1alpha1
kind: ClusterConfig
serviceClusterIPRange: 10.96.0.0/12
serviceNodePortRange: 30000-32767
clusterDomain: cluster.local
"#;

#[test]
fn good_manifests_are_clean() {
    let d = run(GOOD);
    assert!(d.is_empty(), "{d:#?}");
}

// ---- metadata ----

#[test]
fn service_name_dns1035() {
    assert_eq!(codes(&svc_named("1web", "ports: [{port: 80}]")), ["SVC101"]);
    let d = run(&svc_named("My_Web", "ports: [{port: 80}]"));
    assert_eq!(d[0].path.as_deref(), Some("metadata.name"));
    assert!(d[0].hint.as_deref().unwrap().contains("`my-web`"));
}

#[test]
fn namespace_dns1123_label() {
    let y = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: Prod.EU}\nspec: {ports: [{port: 80}]}\n";
    assert_eq!(codes(y), ["SVC102"]);
}

#[test]
fn label_and_selector_keys_and_values() {
    let y = "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  labels: {\"bad key!\": x}\nspec: {ports: [{port: 80}]}\n";
    assert_eq!(codes(y), ["SVC103"]);
    assert_eq!(
        codes(&svc_port("").replace("app: web", "app: -web")),
        ["SVC104"]
    );
    let long = "v".repeat(64);
    assert_eq!(
        codes(&svc_port("").replace("app: web", &format!("app: {long}"))),
        ["SVC104"]
    );
    let d = run(&svc_port("").replace("{app: web}", "{\"/x\": web}"));
    assert_eq!(d[0].code, "SVC103");
    assert_eq!(d[0].path.as_deref(), Some("spec.selector[/x]"));
}

#[test]
fn annotation_keys() {
    let y = "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  annotations: {\"a/b/c\": x}\nspec: {ports: [{port: 80}]}\n";
    assert_eq!(codes(y), ["SVC103"]);
}

// ---- Service ----

#[test]
fn service_type() {
    assert_eq!(codes(&svc_port("type: Nodeport")), ["SVC105"]);
    let d = run(&svc_port("type: Nodeport"));
    assert!(d[0].hint.as_deref().unwrap().contains("`NodePort`"));
}

#[test]
fn ports_required() {
    assert_eq!(codes(&svc("selector: {app: web}")), ["SVC106"]);
    assert_eq!(codes(&svc("clusterIP: None")), Vec::<&str>::new());
    assert_eq!(
        codes(&svc("type: ExternalName\nexternalName: a.example.com")),
        Vec::<&str>::new()
    );
}

#[test]
fn port_names() {
    assert_eq!(
        codes(&svc("ports: [{port: 80}, {name: b, port: 81}]")),
        ["SVC107"]
    );
    assert_eq!(codes(&svc("ports: [{name: HTTP, port: 80}]")), ["SVC108"]);
    assert_eq!(
        codes(&svc("ports: [{name: a, port: 80}, {name: a, port: 81}]")),
        ["SVC109"]
    );
}

#[test]
fn port_numbers_and_duplicates() {
    assert_eq!(codes(&svc("ports: [{port: 0}]")), ["SVC110"]);
    assert_eq!(codes(&svc("ports: [{port: 70000}]")), ["SVC110"]);
    assert_eq!(codes(&svc("ports: [{targetPort: 80}]")), ["SVC110"]);
    assert_eq!(
        codes(&svc(
            "ports: [{name: a, port: 80}, {name: b, port: 80, protocol: TCP}]"
        )),
        ["SVC111"]
    );
    assert_eq!(
        codes(&svc(
            "ports: [{name: a, port: 80}, {name: b, port: 80, protocol: UDP}]"
        )),
        Vec::<&str>::new()
    );
}

#[test]
fn protocols() {
    assert_eq!(
        codes(&svc("ports: [{port: 80, protocol: tcp}]")),
        ["SVC112"]
    );
    assert_eq!(
        codes(&svc("ports: [{port: 80, protocol: HTTP}]")),
        ["SVC112"]
    );
}

#[test]
fn target_ports() {
    assert_eq!(
        codes(&svc("ports: [{port: 80, targetPort: 65536}]")),
        ["SVC113"]
    );
    assert_eq!(
        codes(&svc("ports: [{port: 80, targetPort: 0}]")),
        Vec::<&str>::new()
    );
    assert_eq!(
        codes(&svc("ports: [{port: 80, targetPort: http_alt}]")),
        ["SVC114"]
    );
    let d = run(&svc("ports: [{port: 80, targetPort: \"8080\"}]"));
    assert_eq!(codes_of(&d), ["SVC114"]);
    assert!(d[0].hint.as_deref().unwrap().contains("without quotes"));
}

#[test]
fn node_port_type_and_range() {
    assert_eq!(
        codes(&svc("ports: [{port: 80, nodePort: 30001}]")),
        ["SVC115"]
    );
    let y = svc("type: NodePort\nports:\n- port: 80\n  nodePort: 40000");
    assert_eq!(codes(&y), ["SVC116"]);
    let d = run(&y);
    let s = d[0].span.unwrap();
    assert_eq!((s.line, s.col), (9, 15));
    assert_eq!(d[0].path.as_deref(), Some("spec.ports[0].nodePort"));
    assert!(d[0].message.contains("30000-32767"));
    // The range comes from the settings.
    let settings = Settings {
        node_port_range: (20000, 40000),
        ..Settings::default()
    };
    assert!(codes_of(&run_with(&y, &settings)).is_empty());
}

#[test]
fn node_port_duplicate_in_service() {
    let y = svc("type: NodePort\nports:\n- {name: a, port: 80, nodePort: 30001}\n- {name: b, port: 81, nodePort: 30001}");
    assert_eq!(codes(&y), ["SVC117"]);
    let y = svc("type: NodePort\nports:\n- {name: a, port: 80, nodePort: 30001}\n- {name: b, port: 80, protocol: UDP, nodePort: 30001}");
    assert!(codes(&y).is_empty());
}

#[test]
fn cluster_ip_values() {
    assert_eq!(codes(&svc_port("clusterIP: 10.96.0.300")), ["SVC118"]);
    let d = run(&svc_port("clusterIP: none"));
    assert_eq!(codes_of(&d), ["SVC118"]);
    assert!(d[0].hint.as_deref().unwrap().contains("capital N"));
    assert_eq!(codes(&svc_port("clusterIP: 10.0.0.10")), ["SVC119"]);
    assert_eq!(codes(&svc_port("clusterIP: \"fd00::10\"")), ["SVC119"]);
    assert_eq!(codes(&svc_port("clusterIP: 10.96.0.0")), ["SVC119"]);
    assert_eq!(codes(&svc_port("clusterIP: 10.111.255.255")), ["SVC119"]);
    assert!(codes(&svc_port("clusterIP: 10.111.255.254")).is_empty());
    assert_eq!(
        codes(&svc_port("clusterIP: 10.96.0.10\nclusterIPs: [10.96.0.11]")),
        ["SVC120"]
    );
}

#[test]
fn cluster_ips_shape() {
    assert_eq!(
        codes(&svc_port("clusterIPs: [None, 10.96.0.1]")),
        ["SVC121"]
    );
    assert_eq!(
        codes(&svc_port(
            "ipFamilyPolicy: PreferDualStack\nclusterIPs: [10.96.0.1, 10.96.0.2]"
        )),
        ["SVC121"]
    );
    assert_eq!(
        codes(&svc_port("clusterIPs: [10.96.0.1, 10.96.0.2, 10.96.0.3]")),
        ["SVC121"]
    );
}

#[test]
fn ip_families_and_policy() {
    assert_eq!(codes(&svc_port("ipFamilies: [ipv4]")), ["SVC122"]);
    assert_eq!(
        codes(&svc_port(
            "ipFamilyPolicy: PreferDualStack\nipFamilies: [IPv4, IPv4]"
        )),
        ["SVC122"]
    );
    assert_eq!(codes(&svc_port("ipFamilyPolicy: DualStack")), ["SVC123"]);
}

#[test]
fn family_consistency() {
    let dual = Settings {
        service_cidrs: vec![
            "10.96.0.0/12".parse().unwrap(),
            "fd00:10:96::/112".parse().unwrap(),
        ],
        ..Settings::default()
    };
    let c = |y: &str| codes_of(&run_with(&svc_port(y), &dual));
    assert_eq!(
        c("ipFamilyPolicy: RequireDualStack\nipFamilies: [IPv6, IPv4]\nclusterIPs: [10.96.0.1, \"fd00:10:96::1\"]"),
        ["SVC124"]
    );
    assert_eq!(
        c("ipFamilyPolicy: SingleStack\nipFamilies: [IPv4, IPv6]"),
        ["SVC124"]
    );
    assert!(c("ipFamilyPolicy: RequireDualStack\nipFamilies: [IPv6, IPv4]").is_empty());
    // Single-stack cluster (the default settings).
    assert_eq!(
        codes(&svc_port("ipFamilyPolicy: RequireDualStack")),
        ["SVC124"]
    );
    assert_eq!(codes(&svc_port("ipFamilies: [IPv6]")), ["SVC124"]);
    assert!(codes(&svc_port("ipFamilyPolicy: PreferDualStack")).is_empty());
}

#[test]
fn external_name() {
    assert_eq!(codes(&svc("type: ExternalName")), ["SVC125"]);
    assert_eq!(
        codes(&svc("type: ExternalName\nexternalName: Db_Host")),
        ["SVC125"]
    );
    assert_eq!(
        codes(&svc("type: ExternalName\nexternalName: \"2001:db8::1\"")),
        ["SVC125"]
    );
    let d = run(&svc("type: ExternalName\nexternalName: 192.0.2.10"));
    assert_eq!(codes_of(&d), ["SVC126"]);
    assert_eq!(d[0].severity, Severity::Warning);
    assert_eq!(
        codes(&svc(
            "type: ExternalName\nexternalName: a.example.com\nclusterIP: 10.96.0.5"
        )),
        ["SVC127"]
    );
    assert_eq!(
        codes(&svc(
            "type: ExternalName\nexternalName: a.example.com\nipFamilyPolicy: SingleStack"
        )),
        ["SVC127"]
    );
}

#[test]
fn headless_node_port() {
    assert_eq!(
        codes(&svc_port("type: NodePort\nclusterIP: None")),
        ["SVC128"]
    );
    assert_eq!(
        codes(&svc_port("type: LoadBalancer\nclusterIPs: [None]")),
        ["SVC128"]
    );
}

#[test]
fn external_traffic_policy() {
    assert_eq!(
        codes(&svc_port("type: NodePort\nexternalTrafficPolicy: local")),
        ["SVC129"]
    );
    assert_eq!(codes(&svc_port("externalTrafficPolicy: Local")), ["SVC130"]);
    assert!(codes(&svc_port(
        "externalIPs: [198.51.100.1]\nexternalTrafficPolicy: Local"
    ))
    .is_empty());
    assert_eq!(codes(&svc_port("internalTrafficPolicy: Node")), ["SVC131"]);
}

#[test]
fn health_check_node_port() {
    assert_eq!(
        codes(&svc_port("type: LoadBalancer\nhealthCheckNodePort: 30500")),
        ["SVC132"]
    );
    assert_eq!(
        codes(&svc_port(
            "type: LoadBalancer\nexternalTrafficPolicy: Local\nhealthCheckNodePort: 80"
        )),
        ["SVC133"]
    );
}

#[test]
fn session_affinity() {
    assert_eq!(codes(&svc_port("sessionAffinity: Sticky")), ["SVC134"]);
    assert_eq!(
        codes(&svc_port(
            "sessionAffinity: ClientIP\nsessionAffinityConfig: {clientIP: {timeoutSeconds: 86401}}"
        )),
        ["SVC135"]
    );
    assert_eq!(
        codes(&svc_port(
            "sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}"
        )),
        ["SVC136"]
    );
}

#[test]
fn external_ips() {
    assert_eq!(
        codes(&svc_port("externalIPs: [198.51.100.0/24]")),
        ["SVC137"]
    );
    assert_eq!(codes(&svc_port("externalIPs: [127.0.0.1]")), ["SVC138"]);
    assert_eq!(codes(&svc_port("externalIPs: [169.254.1.1]")), ["SVC138"]);
    assert_eq!(codes(&svc_port("externalIPs: [\"fe80::1\"]")), ["SVC138"]);
    assert_eq!(codes(&svc_port("externalIPs: [224.0.0.5]")), ["SVC138"]);
    assert_eq!(codes(&svc_port("externalIPs: [0.0.0.0]")), ["SVC138"]);
}

#[test]
fn source_ranges() {
    assert_eq!(
        codes(&svc_port(
            "type: LoadBalancer\nloadBalancerSourceRanges: [10.0.0.1]"
        )),
        ["SVC139"]
    );
    assert_eq!(
        codes(&svc_port("loadBalancerSourceRanges: [10.0.0.0/8]")),
        ["SVC140"]
    );
    let y = "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  annotations:\n    service.beta.kubernetes.io/load-balancer-source-ranges: \"10.0.0.0/8, 300.0.0.0/8\"\nspec: {type: LoadBalancer, ports: [{port: 80}]}\n";
    assert_eq!(codes(y), ["SVC139"]);
    assert_eq!(
        codes(
            &y.replace("type: LoadBalancer, ", "")
                .replace(", 300.0.0.0/8", "")
        ),
        ["SVC140"]
    );
}

#[test]
fn load_balancer_status() {
    let st = |ing: &str| {
        format!(
            "{}status: {{loadBalancer: {{ingress: [{ing}]}}}}\n",
            svc_port("type: LoadBalancer")
        )
    };
    assert_eq!(codes(&st("{ip: 203.0.113.300}")), ["SVC141"]);
    assert_eq!(codes(&st("{hostname: 203.0.113.3}")), ["SVC141"]);
    assert_eq!(codes(&st("{ip: 203.0.113.3, ipMode: Direct}")), ["SVC142"]);
    assert_eq!(
        codes(&st("{hostname: lb.example.com, ipMode: VIP}")),
        ["SVC142"]
    );
    let y = format!(
        "{}status: {{loadBalancer: {{ingress: [{{ip: 203.0.113.3}}]}}}}\n",
        svc_port("")
    );
    assert_eq!(codes(&y), ["SVC143"]);
}

#[test]
fn topology_keys() {
    // Valid keys: only the warning that the field is gone (removed in 1.22), at the field.
    let d = run(&svc_port(
        "topologyKeys: [kubernetes.io/hostname, topology.kubernetes.io/zone, \"*\"]",
    ));
    assert_eq!(codes_of(&d), ["SVC154"]);
    assert_eq!(d[0].severity, Severity::Warning);
    assert_eq!(d[0].path.as_deref(), Some("spec.topologyKeys"));
    assert!(d[0].message.contains("1.22"), "{}", d[0].message);
    assert!(codes(&svc_port("topologyKeys: []")).is_empty());
    let keys: Vec<String> = (0..17).map(|i| format!("k{i}")).collect();
    assert_eq!(
        codes(&svc_port(&format!("topologyKeys: [{}]", keys.join(", ")))),
        ["SVC144", "SVC154"]
    );
    assert_eq!(
        codes(&svc_port("topologyKeys: [\"zone!\"]")),
        ["SVC145", "SVC154"]
    );
    assert_eq!(
        codes(&svc_port(
            "topologyKeys: [kubernetes.io/hostname, kubernetes.io/hostname]"
        )),
        ["SVC146", "SVC154"]
    );
    assert_eq!(
        codes(&svc_port(
            "topologyKeys: [\"*\", topology.kubernetes.io/zone]"
        )),
        ["SVC147", "SVC154"]
    );
    assert_eq!(
        codes(&svc_port(
            "type: NodePort\nexternalTrafficPolicy: Local\ntopologyKeys: [kubernetes.io/hostname]"
        )),
        ["SVC148", "SVC154"]
    );
}

#[test]
fn traffic_distribution() {
    assert_eq!(
        codes(&svc_port("trafficDistribution: PreferZone")),
        ["SVC149"]
    );
    assert!(codes(&svc_port("trafficDistribution: PreferSameNode")).is_empty());
}

// ---- Endpoints, EndpointSlice, Node, Pod ----

/// An EndpointSlice of the Service of [`svc_port`]; it serves that Service's port unless
/// `body` writes `ports` of its own (else its endpoints would serve no port: SVC325).
fn slice(body: &str) -> String {
    let ports = if body.contains("ports:") {
        ""
    } else {
        "ports: [{port: 80}]\n"
    };
    format!(
        "{}---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-1\n  labels: {{kubernetes.io/service-name: web}}\n{ports}{body}",
        svc_port("")
    )
}

fn endpoints(body: &str) -> String {
    format!(
        "{}---\napiVersion: v1\nkind: Endpoints\nmetadata: {{name: web}}\n{body}",
        svc_port("")
    )
}

#[test]
fn object_names() {
    let y = "apiVersion: v1\nkind: Node\nmetadata: {name: Node_A}\n";
    assert_eq!(codes(y), ["SVC201"]);
    assert_eq!(
        codes(&slice("addressType: IPv4\n").replace("name: web-1", "name: web..1")),
        ["SVC201"]
    );
}

#[test]
fn slice_address_type() {
    assert_eq!(codes(&slice("endpoints: []\n")), ["SVC202"]);
    assert_eq!(codes(&slice("addressType: IP\n")), ["SVC202"]);
}

#[test]
fn slice_addresses() {
    assert_eq!(
        codes(&slice(
            "addressType: IPv4\nendpoints: [{addresses: [\"fd00::1\"]}]\n"
        )),
        ["SVC203"]
    );
    assert_eq!(
        codes(&slice(
            "addressType: IPv4\nendpoints: [{addresses: [10.1.1]}]\n"
        )),
        ["SVC203"]
    );
    assert_eq!(
        codes(&slice(
            "addressType: FQDN\nendpoints: [{addresses: [localhost]}]\n"
        )),
        ["SVC203"]
    );
    assert_eq!(
        codes(&slice(
            "addressType: IPv4\nendpoints: [{addresses: [127.0.0.1]}]\n"
        )),
        ["SVC204"]
    );
    assert_eq!(
        codes(&slice(
            "addressType: IPv6\nendpoints: [{addresses: [\"ff02::1\"]}]\n"
        )),
        ["SVC204"]
    );
    assert_eq!(
        codes(&slice("addressType: IPv4\nendpoints: [{addresses: []}]\n")),
        ["SVC209"]
    );
    assert_eq!(
        codes(&slice(
            "addressType: IPv4\nendpoints: [{addresses: [10.1.1.1], nodeName: Node_A}]\n"
        )),
        ["SVC211"]
    );
}

#[test]
fn slice_ports() {
    let c = |p: &str| codes(&slice(&format!("addressType: IPv4\nports: [{p}]\n")));
    assert_eq!(c("{name: http, port: 0}"), ["SVC205"]);
    assert_eq!(c("{name: http, port: 80, protocol: ICMP}"), ["SVC206"]);
    assert_eq!(c("{name: Http, port: 80}"), ["SVC207"]);
    assert_eq!(c("{port: 80}, {port: 81}"), ["SVC207"]);
    assert!(c("{name: http}").is_empty());
}

#[test]
fn slice_limits() {
    let eps: Vec<String> = (0..1001)
        .map(|i| format!("- addresses: [10.1.{}.{}]", i / 250, i % 250 + 1))
        .collect();
    let y = slice(&format!(
        "addressType: IPv4\nendpoints:\n{}\n",
        eps.join("\n")
    ));
    assert_eq!(codes(&y), ["SVC208"]);
    let ports: Vec<String> = (0..101)
        .map(|i| format!("{{name: p{i}, port: {}}}", 1000 + i))
        .collect();
    let y = slice(&format!(
        "addressType: IPv4\nports: [{}]\n",
        ports.join(", ")
    ));
    assert_eq!(codes(&y), ["SVC208"]);
}

#[test]
fn slice_service_name_label() {
    let y = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: orphan}\naddressType: IPv4\n";
    let d = run(y);
    assert_eq!(codes_of(&d), ["SVC210"]);
    assert_eq!(d[0].severity, Severity::Warning);
}

#[test]
fn endpoints_rules() {
    assert_eq!(
        codes(&endpoints("subsets: [{ports: [{port: 80}]}]\n")),
        ["SVC209"]
    );
    assert_eq!(
        codes(&endpoints(
            "subsets: [{addresses: [{ip: 10.1.1.1}], ports: [{port: 80}, {port: 81}]}]\n"
        )),
        ["SVC207"]
    );
    assert_eq!(
        codes(&endpoints(
            "subsets: [{addresses: [{ip: 169.254.169.254}], ports: [{port: 80}]}]\n"
        )),
        ["SVC204"]
    );
    assert_eq!(
        codes(&endpoints(
            "subsets: [{addresses: [{ip: 10.1.1.1}], ports: [{name: x}]}]\n"
        )),
        ["SVC205"]
    );
    assert_eq!(
        codes(&endpoints(
            "subsets: [{addresses: [{ip: 10.1.1.1}], ports: [{port: 80, protocol: tcp}]}]\n"
        )),
        ["SVC206"]
    );
    assert_eq!(
        codes(&endpoints(
            "subsets: [{addresses: [{ip: web-1}], ports: [{port: 80}]}]\n"
        )),
        ["SVC203"]
    );
}

#[test]
fn node_rules() {
    let node = |spec: &str| format!("apiVersion: v1\nkind: Node\nmetadata: {{name: n1}}\n{spec}");
    assert_eq!(codes(&node("spec: {podCIDR: 10.244.1.0/33}\n")), ["SVC212"]);
    assert_eq!(
        codes(&node("spec: {podCIDRs: [10.244.1.0/24, 10.244.2.0/24]}\n")),
        ["SVC213"]
    );
    assert_eq!(
        codes(&node(
            "status: {addresses: [{type: InternalIP, address: node-1}]}\n"
        )),
        ["SVC214"]
    );
}

#[test]
fn pod_rules() {
    let pod =
        |st: &str| format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: p1}}\nstatus: {st}\n");
    assert_eq!(codes(&pod("{podIP: 10.244.1}")), ["SVC215"]);
    assert_eq!(
        codes(&pod("{podIPs: [{ip: 10.244.1.5}, {ip: 10.244.1.5}]}")),
        ["SVC216"]
    );
}

// ---- cross-object ----

#[test]
fn duplicate_objects() {
    let one = svc_port("");
    let d = run(&format!("{one}---\n{one}"));
    assert_eq!(codes_of(&d), ["SVC301"]);
    assert_eq!(d[0].span.unwrap().line, 13);
    assert_eq!(d[0].related[0].span.line, 4);
    // Same name in another namespace is fine.
    let other = one.replace("name: web", "name: web\n  namespace: other");
    assert!(codes(&format!("{one}---\n{other}")).is_empty());
}

#[test]
fn node_port_collisions() {
    let a = svc_named("a", "type: NodePort\nports: [{port: 80, nodePort: 30080}]");
    let b = svc_named(
        "b",
        "type: NodePort\nports: [{port: 53, protocol: UDP, nodePort: 30080}]",
    );
    let d = run(&format!("{a}---\n{b}"));
    assert_eq!(codes_of(&d), ["SVC302"]);
    assert!(d[0].message.contains("`default/a`"), "{}", d[0].message);
    // Health-check port against a node port of another Service.
    let c = svc_named(
        "c",
        "type: LoadBalancer\nexternalTrafficPolicy: Local\nhealthCheckNodePort: 30080\nports: [{port: 80}]",
    );
    assert_eq!(codes(&format!("{a}---\n{c}")), ["SVC302"]);
}

#[test]
fn cluster_ip_collisions() {
    let a = svc_named("a", "clusterIP: 10.96.0.10\nports: [{port: 80}]");
    let b = svc_named("b", "clusterIPs: [10.96.0.10]\nports: [{port: 80}]");
    let d = run(&format!("{a}---\n{b}"));
    assert_eq!(codes_of(&d), ["SVC303"]);
    assert_eq!(d[0].path.as_deref(), Some("spec.clusterIPs[0]"));
    assert_eq!(d[0].related.len(), 1);
}

#[test]
fn endpoint_on_cluster_ip() {
    let y = format!(
        "{}---\n{}",
        svc_named("dns", "clusterIP: 10.96.0.10\nports: [{port: 53}]"),
        slice("addressType: IPv4\nendpoints: [{addresses: [10.96.0.10]}]\n")
    );
    assert_eq!(codes(&y), ["SVC304"]);
}

#[test]
fn missing_service_references() {
    let y = "apiVersion: v1\nkind: Endpoints\nmetadata: {name: gone}\nsubsets: [{addresses: [{ip: 10.1.1.1}]}]\n";
    let d = run(y);
    assert_eq!(codes_of(&d), ["SVC305"]);
    assert!(d[0].message.contains("gone"));
    let y = slice("addressType: IPv4\n").replace("service-name: web", "service-name: wbe");
    let d = run(&y);
    assert_eq!(codes_of(&d), ["SVC305"]);
    assert_eq!(
        d[0].path.as_deref(),
        Some("metadata.labels[kubernetes.io/service-name]")
    );
}

/// kube-proxy pairs slice ports with Service ports by (name, protocol): a Service port
/// no port of its endpoints matches gets none (SVC325, a warning); wherever kube-proxy
/// finds endpoints, nothing.
#[test]
fn service_ports_match_their_endpoints_by_name() {
    let service = |spec: &str| svc_named("web", spec);
    let slice_of = |name: &str, body: &str| {
        format!("---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}\n  labels: {{kubernetes.io/service-name: web}}\naddressType: IPv4\n{body}")
    };
    let eps = "endpoints: [{addresses: [10.244.1.5]}]\n";
    let http = "ports:\n- {name: http, port: 80, targetPort: 8080}\n";
    // A typo: located at the slice's port, the Service port related.
    let y = format!(
        "{}{}",
        service(http),
        slice_of(
            "web-1",
            &format!("ports: [{{name: htp, port: 8080}}]\n{eps}")
        )
    );
    let d = run(&y);
    assert_eq!(codes_of(&d), ["SVC325"]);
    assert_eq!(d[0].severity, Severity::Warning);
    assert!(
        d[0].message.contains("`http` (80/TCP)") && d[0].message.contains("`htp` (8080/TCP)"),
        "{}",
        d[0].message
    );
    assert_eq!(d[0].span.map(|s| (s.line, s.col)), Some((15, 16)));
    assert_eq!(d[0].path.as_deref(), Some("ports[0].name"));
    assert_eq!(d[0].related[0].span.line, 7);
    assert!(d[0].hint.as_deref().unwrap().contains("to `http`"));
    // The number does not matter (kube-proxy never reads targetPort), the name does.
    let other_number = format!("ports: [{{name: http, port: 9090}}]\n{eps}");
    assert!(codes(&format!(
        "{}{}",
        service(http),
        slice_of("web-1", &other_number)
    ))
    .is_empty());
    // One unnamed port: "" on both sides.
    let unnamed = "ports: [{port: 80, targetPort: 8080}]\n";
    let y = format!(
        "{}{}",
        service(unnamed),
        slice_of("web-1", &format!("ports: [{{port: 8080}}]\n{eps}"))
    );
    assert!(codes(&y).is_empty());
    let y = format!(
        "{}{}",
        service(unnamed),
        slice_of(
            "web-1",
            &format!("ports: [{{name: \"\", port: 8080}}]\n{eps}")
        )
    );
    assert!(codes(&y).is_empty());
    let y = format!(
        "{}{}",
        service(unnamed),
        slice_of(
            "web-1",
            &format!("ports: [{{name: http, port: 8080}}]\n{eps}")
        )
    );
    assert_eq!(codes(&y), ["SVC325"]);
    // The protocol is part of the pair.
    let y = format!(
        "{}{}",
        service("ports: [{name: dns, port: 53, protocol: UDP}]\n"),
        slice_of("web-1", &format!("ports: [{{name: dns, port: 53}}]\n{eps}"))
    );
    let d = run(&y);
    assert_eq!(codes_of(&d), ["SVC325"]);
    assert!(
        d[0].hint.as_deref().unwrap().contains("to UDP"),
        "{:?}",
        d[0].hint
    );
    // Several ports, several slices: each port is looked for in all of them.
    let two = "ports:\n- {name: http, port: 80}\n- {name: grpc, port: 81}\n";
    let both = format!(
        "{}{}{}",
        service(two),
        slice_of(
            "web-1",
            &format!("ports: [{{name: http, port: 80}}]\n{eps}")
        ),
        slice_of(
            "web-2",
            &format!("ports: [{{name: grpc, port: 81}}]\n{eps}")
        )
    );
    assert!(codes(&both).is_empty());
    let d = run(&format!(
        "{}{}",
        service(two),
        slice_of(
            "web-1",
            &format!("ports: [{{name: http, port: 80}}]\n{eps}")
        )
    ));
    assert_eq!(codes_of(&d), ["SVC325"]);
    assert_eq!(d.len(), 1);
    assert!(d[0].message.contains("`grpc`"));
    // A slice with endpoints but no ports: located at the Service port.
    let d = run(&format!("{}{}", service(http), slice_of("web-1", eps)));
    assert_eq!(codes_of(&d), ["SVC325"]);
    assert_eq!(d[0].path.as_deref(), Some("spec.ports[0].name"));
    // No endpoints (the controller's placeholder), an FQDN slice, a headless or an
    // ExternalName Service: not kube-proxy's endpoints, nothing to say.
    let typo = "ports: [{name: htp, port: 8080}]\n";
    assert!(codes(&format!("{}{}", service(http), slice_of("web-1", typo))).is_empty());
    let fqdn = format!(
        "{}{}",
        service(http),
        slice_of(
            "web-1",
            &format!("{typo}endpoints: [{{addresses: [db.example.com]}}]\n")
        )
        .replace("IPv4", "FQDN")
    );
    assert!(codes(&fqdn).is_empty());
    let headless = format!("clusterIP: None\n{http}");
    assert!(codes(&format!(
        "{}{}",
        service(&headless),
        slice_of("web-1", &format!("{typo}{eps}"))
    ))
    .is_empty());
    // Endpoints: mirrored (and so read) only for a Service without a selector.
    let endpoints = |port: &str| {
        format!("---\napiVersion: v1\nkind: Endpoints\nmetadata: {{name: web}}\nsubsets:\n- addresses: [{{ip: 10.244.1.5}}]\n  ports: [{port}]\n")
    };
    let d = run(&format!(
        "{}{}",
        service(http),
        endpoints("{name: htp, port: 8080}")
    ));
    assert_eq!(codes_of(&d), ["SVC325"]);
    assert_eq!(d[0].path.as_deref(), Some("subsets[0].ports[0].name"));
    assert!(codes(&format!(
        "{}{}",
        service(http),
        endpoints("{name: http, port: 8080}")
    ))
    .is_empty());
    let selected = format!("selector: {{app: web}}\n{http}");
    assert!(codes(&format!(
        "{}{}",
        service(&selected),
        endpoints("{name: htp, port: 8080}")
    ))
    .is_empty());
    let skip = endpoints("{name: htp, port: 8080}").replace(
        "metadata: {name: web}",
        "metadata: {name: web, labels: {endpointslice.kubernetes.io/skip-mirror: \"true\"}}",
    );
    assert!(codes(&format!("{}{}", service(http), skip)).is_empty());
}

// ---- configuration documents ----

fn kpc(body: &str) -> String {
    format!("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n{body}")
}

fn cc(body: &str) -> String {
    format!("apiVersion: svc-compile/v1alpha1\nkind: ClusterConfig\n{body}")
}

#[test]
fn config_documents_once() {
    let k = kpc("mode: iptables\n");
    assert_eq!(codes(&format!("{k}---\n{k}")), ["SVC306"]);
    let c = cc("clusterDomain: cluster.local\n");
    assert_eq!(codes(&format!("{c}---\n{c}")), ["SVC307"]);
}

#[test]
fn kube_proxy_configuration() {
    assert_eq!(codes(&kpc("mode: userspace\n")), ["SVC308"]);
    // IPVS mode is deprecated (KEP-5495): a warning at the field, once.
    let ipvs = run(&kpc("mode: ipvs\n"));
    assert_eq!(ipvs.iter().map(|d| d.code).collect::<Vec<_>>(), ["SVC321"]);
    assert_eq!(ipvs[0].severity, Severity::Warning);
    assert_eq!(ipvs[0].path.as_deref(), Some("mode"));
    assert!(ipvs[0].message.contains("1.35") && ipvs[0].message.contains("1.46"));
    assert!(codes(&kpc("mode: nftables\n")).is_empty());
    assert_eq!(codes(&kpc("iptables: {masqueradeBit: 32}\n")), ["SVC309"]);
    // The path names the section the value came from.
    let path_309 = |body: &str| {
        run(&kpc(body))
            .into_iter()
            .find(|d| d.code == "SVC309")
            .and_then(|d| d.path)
    };
    assert_eq!(
        path_309("iptables: {masqueradeBit: 32}\n").as_deref(),
        Some("iptables.masqueradeBit")
    );
    assert_eq!(
        path_309("mode: nftables\nnftables: {masqueradeBit: 40}\n").as_deref(),
        Some("nftables.masqueradeBit")
    );
    // Every written bit is checked, also the one the mode does not read.
    assert_eq!(
        path_309("mode: nftables\niptables: {masqueradeBit: 33}\n").as_deref(),
        Some("iptables.masqueradeBit")
    );
    assert_eq!(
        codes(&kpc("clusterCIDR: 10.244.0.0/16,10.245.0.0/16\n")),
        ["SVC310"]
    );
    assert_eq!(codes(&kpc("clusterCIDR: 10.244.0.0\n")), ["SVC310"]);
    assert_eq!(codes(&kpc("detectLocalMode: PodCIDR\n")), ["SVC311"]);
    assert_eq!(
        codes(&kpc("detectLocalMode: BridgeInterface\n")),
        ["SVC312"]
    );
    assert_eq!(
        codes(&kpc(
            "detectLocalMode: InterfaceNamePrefix\ndetectLocal: {bridgeInterface: cbr0}\n"
        )),
        ["SVC312"]
    );
    assert!(codes(&kpc(
        "detectLocalMode: InterfaceNamePrefix\ndetectLocal: {interfaceNamePrefix: veth}\n"
    ))
    .is_empty());
    assert_eq!(codes(&kpc("detectLocalMode: ClusterCIDR\n")), ["SVC313"]);
    assert_eq!(
        codes(&kpc("nodePortAddresses: [primary, 10.0.0.0/8]\n")),
        ["SVC314"]
    );
    assert_eq!(codes(&kpc("nodePortAddresses: [10.0.0.1]\n")), ["SVC314"]);
    assert_eq!(codes(&kpc("ipvs: {scheduler: roundrobin}\n")), ["SVC315"]);
    assert_eq!(codes(&kpc("ipvs: {tcpTimeout: 900}\n")), ["SVC319"]);
    assert_eq!(codes(&kpc("conntrack: {udpTimeout: '30'}\n")), ["SVC330"]);
    assert_eq!(codes(&kpc("conntrack: {maxPerCore: -1}\n")), ["SVC330"]);
    assert!(codes(&kpc(
        "conntrack: {udpTimeout: 30s, tcpEstablishedTimeout: 2h0m0s, maxPerCore: 0, min: 0}\n"
    ))
    .is_empty());
    assert_eq!(codes(&kpc("ipvs: {tcpTimeout: 15min}\n")), ["SVC319"]);
    assert_eq!(codes(&kpc("ipvs: {udpTimeout: -1s}\n")), ["SVC319"]);
    assert_eq!(
        codes(&kpc("ipvs: {excludeCIDRs: [10.0.0.0]}\n")),
        ["SVC319"]
    );
    assert!(codes(&kpc(
        "ipvs: {strictARP: true, tcpTimeout: 15m, tcpFinTimeout: 30s, udpTimeout: 0s, excludeCIDRs: [10.0.0.0/8]}\n"
    ))
    .is_empty());
}

#[test]
fn cluster_config() {
    assert_eq!(
        codes(&cc("serviceClusterIPRange: 10.96.0.0/12,10.112.0.0/12\n")),
        ["SVC316"]
    );
    assert_eq!(
        codes(&cc("serviceNodePortRange: 32767-30000\n")),
        ["SVC317"]
    );
    assert_eq!(
        codes(&cc("serviceNodePortRange: 30000:32767\n")),
        ["SVC317"]
    );
    assert!(codes(&cc("serviceNodePortRange: 30000+2767\n")).is_empty());
    assert_eq!(codes(&cc("clusterDomain: Cluster_Local\n")), ["SVC318"]);
    assert_eq!(codes(&cc("topologyKeys: honor\n")), ["SVC322"]);
    assert!(codes(&cc("topologyKeys: ignore\n")).is_empty());
    assert!(codes(&cc("topologyKeys: honour\n")).is_empty());
    assert_eq!(codes(&cc("dnsRecords: CoreDNS\n")), ["SVC323"]);
    assert!(codes(&cc("dnsRecords: coredns\n")).is_empty());
    assert!(codes(&cc("dnsRecords: spec\n")).is_empty());
}

// ---- many problems at once ----

#[test]
fn all_problems_are_reported() {
    let y = svc_named(
        "Web",
        "type: NodePort\nports:\n- {port: 0, nodePort: 1, protocol: tcp}\n- {port: 0}\nsessionAffinity: sticky",
    );
    assert_eq!(
        codes(&y),
        ["SVC101", "SVC107", "SVC110", "SVC112", "SVC116", "SVC134"]
    );
}

// ---- the code table and the golden corpus ----

const SOURCES: &[&str] = &[
    include_str!("../validate.rs"),
    include_str!("service.rs"),
    include_str!("endpoints.rs"),
    include_str!("nodes.rs"),
    include_str!("config.rs"),
    include_str!("cross.rs"),
];

fn table_codes() -> Vec<String> {
    SOURCES[0]
        .lines()
        .filter_map(|l| l.strip_prefix("//! | SVC"))
        .map(|l| format!("SVC{}", &l[..3]))
        .collect()
}

#[test]
fn code_table_lists_every_code() {
    let mut used: Vec<String> = Vec::new();
    for src in SOURCES {
        for (i, _) in src.match_indices("\"SVC") {
            let code = &src[i + 1..i + 7];
            if code[3..].bytes().all(|b| b.is_ascii_digit()) {
                used.push(code.to_string());
            }
        }
    }
    used.sort();
    used.dedup();
    let mut table = table_codes();
    let n = table.len();
    table.sort();
    table.dedup();
    assert_eq!(n, table.len(), "a code is listed twice");
    assert_eq!(
        used, table,
        "codes used vs. codes in the table of validate.rs"
    );
}

/// The codes `svc-compile check` reports for `text`: the whole pipeline, allocation
/// included (a full node-port range is found there).
fn codes_compiled(text: &str) -> Vec<&'static str> {
    let mut sources = crate::source::SourceMap::default();
    let f = sources.add("t.yaml", text);
    let opts = crate::Options {
        allocate: true,
        ..Default::default()
    };
    codes_of(&crate::compile(&sources, &[f], &opts).diags.items)
}

/// Every file of `golden/errors/` yields at least one error or warning, and exactly the
/// codes its `# expect:` first line names.
#[test]
fn golden_errors_corpus() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../golden/errors");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("golden/errors exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 35, "only {} files", files.len());
    let mut all: Vec<&'static str> = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let got = codes_compiled(&text);
        assert!(!got.is_empty(), "{}: no error or warning", f.display());
        let expect: Vec<&str> = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# expect:"))
            .unwrap_or_else(|| panic!("{}: first line must be `# expect: SVCnnn`", f.display()))
            .split_whitespace()
            .collect();
        assert_eq!(got, expect, "{}", f.display());
        all.extend(got);
    }
    all.sort_unstable();
    all.dedup();
    assert!(
        all.len() >= 30,
        "only {} distinct codes: {all:?}",
        all.len()
    );
}

/// ValidateAnnotationsSize: keys and values of all annotations together, at most 256 KiB.
#[test]
fn annotations_at_most_256_kib() {
    let with = |bytes: usize| {
        let meta = format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  annotations:\n    a: \"{}\"\n    b: \"{}\"\n",
            "x".repeat(bytes / 2),
            "y".repeat(bytes - bytes / 2 - 2)
        );
        codes(&format!(
            "{meta}spec:\n  selector: {{app: web}}\n  ports:\n  - port: 80\n"
        ))
    };
    assert_eq!(with(256 * 1024), Vec::<&str>::new());
    assert_eq!(with(256 * 1024 + 1), ["SVC152"]);
}

/// The allocator's special case: a headless Service without a selector may ask for both
/// families on a single-stack cluster; with a selector it may not.
#[test]
fn selectorless_headless_may_require_dual_stack() {
    let spec = "clusterIP: None\nipFamilyPolicy: RequireDualStack\nports:\n- port: 80\n";
    assert_eq!(codes(&svc(spec)), Vec::<&str>::new());
    let both = "clusterIP: None\nipFamilies: [IPv4, IPv6]\nipFamilyPolicy: RequireDualStack\n";
    assert_eq!(codes(&svc(both)), Vec::<&str>::new());
    assert_eq!(
        codes(&svc(&format!("{spec}selector: {{app: web}}\n"))),
        ["SVC124"]
    );
}

/// Files 0..n, each a text; the layout of `kustomizations` (path, text) over them, files
/// at `/r/NAME` by their names.
fn run_layout(files: &[(&str, &str)], kustomizations: &[(&str, &str)]) -> Vec<Diagnostic> {
    let mut objects = Objects::default();
    let mut diags = Diagnostics::default();
    let mut paths = Vec::new();
    for (i, (name, text)) in files.iter().enumerate() {
        let f = FileId(i as u32);
        let (docs, d) = crate::tree::parse_file(f, text);
        diags.extend(d);
        for doc in &docs {
            crate::k8s::decode_document(doc, &mut objects, &mut diags);
        }
        paths.push((f, format!("/r/{name}")));
    }
    let kusts: Vec<_> = kustomizations
        .iter()
        .map(|(p, t)| (format!("/r/{p}"), crate::kustomize::parse(t)))
        .collect();
    let layout = crate::layout::layout(&paths, &kusts, &[], crate::layout::Plain::EachFile);
    super::validate_in(&objects, &Settings::default(), &layout, &mut diags);
    diags.items
}

#[test]
fn cross_object_rules_run_within_each_cluster() {
    let web = "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  clusterIP: 10.96.0.10\n  ports:\n  - port: 80\n";
    // Install variants side by side: each file is applied alone.
    let d = run_layout(
        &[("install.yaml", web), ("namespace-install.yaml", web)],
        &[],
    );
    assert_eq!(codes_of(&d), Vec::<&str>::new());
    // Two overlays of one base: one cluster each, no clash.
    let overlay = |ns: &str| format!("resources: [../../base]\nnamespace: {ns}\n");
    let (prod, dev) = (overlay("prod"), overlay("dev"));
    let base = "resources: [web.yaml]\n";
    let k = [
        ("base/kustomization.yaml", base),
        ("overlays/prod/kustomization.yaml", prod.as_str()),
        ("overlays/dev/kustomization.yaml", dev.as_str()),
    ];
    let d = run_layout(&[("base/web.yaml", web)], &k);
    assert_eq!(codes_of(&d), Vec::<&str>::new());
    // Within one build, a clash is an error; a namePrefix on one of two bases' copies
    // makes the names distinct (the cluster IP still clashes).
    let two = "resources: [a, b]\n";
    let d = run_layout(
        &[("a/web.yaml", web), ("b/web.yaml", web)],
        &[
            ("kustomization.yaml", two),
            ("a/kustomization.yaml", base),
            ("b/kustomization.yaml", base),
        ],
    );
    assert_eq!(codes_of(&d), ["SVC301", "SVC303"]);
    // One cluster in the input, nothing renamed: the message names none.
    assert_eq!(d[0].message, "duplicate Service `default/web`");
    let d = run_layout(
        &[("a/web.yaml", web), ("b/web.yaml", web)],
        &[
            ("kustomization.yaml", two),
            ("a/kustomization.yaml", base),
            (
                "b/kustomization.yaml",
                "resources: [web.yaml]\nnamePrefix: b-\n",
            ),
        ],
    );
    assert_eq!(codes_of(&d), ["SVC303"]);
}

#[test]
fn a_prefix_leaves_a_slice_without_its_service() {
    // kustomize renames the slice and the Service, not the Service its label names.
    let web =
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  ports:\n  - port: 80\n";
    let slice = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-1\n  labels:\n    kubernetes.io/service-name: web\naddressType: IPv4\nendpoints: []\n";
    let files = [("web.yaml", web), ("slice.yaml", slice)];
    let plain = run_layout(&files, &[]);
    assert_eq!(
        codes_of(&plain),
        Vec::<&str>::new(),
        "sibling plain files relate"
    );
    let k = [(
        "kustomization.yaml",
        "resources: [web.yaml, slice.yaml]\nnamePrefix: p-\n",
    )];
    let d = run_layout(&files, &k);
    assert_eq!(codes_of(&d), ["SVC305"]);
    assert!(d[0].message.contains("in cluster `/r`"), "{}", d[0].message);
}
