//! Each part against upstream's expectations (`pkg/proxy/ipvs/proxier_test.go`: which
//! virtual servers, real servers, set entries and rules a service gives), on manifests
//! compiled for one node.

use super::{write_part, write_string, Options, Part};
use svc_compiler::ir::NodeView;
use svc_compiler::net::IpFamily;
use svc_compiler::passes::node::{node_view, NodeSelection};
use svc_compiler::source::SourceMap;

const NODES: &str = "
apiVersion: v1
kind: Node
metadata: {name: node-1, labels: {kubernetes.io/hostname: node-1}}
spec: {podCIDRs: [10.244.1.0/24, 'fd00:244:1::/64']}
status: {addresses: [{type: InternalIP, address: 192.0.2.10}, {type: InternalIP, address: 'fd00::10'}]}
---
apiVersion: v1
kind: Node
metadata: {name: node-2, labels: {kubernetes.io/hostname: node-2}}
spec: {podCIDRs: [10.244.2.0/24]}
status: {addresses: [{type: InternalIP, address: 198.51.100.2}]}
---
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: ipvs
clusterCIDR: 10.244.0.0/16
";

/// A service `ns/web` with endpoints 10.244.1.2 (node-1, local) and 10.244.2.2 (node-2),
/// port 80 → 8080 (unless `spec` names its own ports); `spec` is spliced into the
/// Service's spec.
fn service(spec: &str, status: &str) -> String {
    let ports = if spec.contains("ports:") {
        ""
    } else {
        "  ports: [{name: http, port: 80, targetPort: 8080}]\n"
    };
    format!(
        "{NODES}---
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: ns}}
spec:
  selector: {{app: web}}
{ports}{spec}
status: {{{status}}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: web-1, namespace: ns, labels: {{kubernetes.io/service-name: web}}}}
addressType: IPv4
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints:
- {{addresses: [10.244.1.2], nodeName: node-1}}
- {{addresses: [10.244.2.2], nodeName: node-2}}
"
    )
}

fn compile(text: &str, family: IpFamily) -> (NodeView, Options) {
    let mut sources = SourceMap::default();
    let f = sources.add("in.yaml", text.to_string());
    let comp = svc_compiler::compile(
        &sources,
        &[f],
        &svc_compiler::Options {
            allocate: true,
            service_cidrs: Some(vec![
                "10.96.0.0/12".parse().unwrap(),
                "fd00:96::/112".parse().unwrap(),
            ]),
            ..Default::default()
        },
    );
    assert!(!comp.diags.has_errors(), "{:?}", comp.diags);
    let sel = NodeSelection {
        name: "node-1".into(),
        ips: vec![],
    };
    let v = node_view(&comp.module, &sel, family).unwrap();
    (v, Options::from_proxy(&comp.module.proxy))
}

fn part(text: &str, p: Part) -> String {
    let (v, o) = compile(text, IpFamily::IPv4);
    write_part(&v, p, &o)
}

fn has(out: &str, line: &str) -> bool {
    out.lines().any(|l| l == line)
}

#[track_caller]
fn check(out: &str, want: &[&str], not: &[&str]) {
    for l in want {
        assert!(has(out, l), "missing `{l}` in:\n{out}");
    }
    for l in not {
        assert!(!has(out, l), "unexpected `{l}` in:\n{out}");
    }
}

/// TestClusterIP: one virtual server per cluster IP:port, rr, masquerading real servers
/// of weight 1; the cluster IP bound to kube-ipvs0 and in KUBE-CLUSTER-IP.
#[test]
fn cluster_ip() {
    let t = service("  clusterIP: 10.96.0.10", "");
    check(
        &part(&t, Part::Ipvsadm),
        &[
            "-A -t 10.96.0.10:80 -s rr",
            "-a -t 10.96.0.10:80 -r 10.244.1.2:8080 -m -w 1",
            "-a -t 10.96.0.10:80 -r 10.244.2.2:8080 -m -w 1",
        ],
        &[],
    );
    check(
        &part(&t, Part::Ipset),
        &[
            "create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536",
            "add KUBE-CLUSTER-IP 10.96.0.10,tcp:80",
            "add KUBE-LOOP-BACK 10.244.1.2,tcp:8080,10.244.1.2",
            "add KUBE-IPVS-IPS 10.96.0.10",
            "create KUBE-NODE-PORT-TCP bitmap:port range 0-65535",
        ],
        // Only local endpoints hairpin.
        &["add KUBE-LOOP-BACK 10.244.2.2,tcp:8080,10.244.2.2"],
    );
    check(
        &part(&t, Part::Addresses),
        &[
            "link add kube-ipvs0 type dummy",
            "address add 10.96.0.10/32 dev kube-ipvs0",
        ],
        &[],
    );
    let ipt = part(&t, Part::Iptables);
    check(
        &ipt,
        &[
            "-A KUBE-SERVICES -s 127.0.0.0/8 -j RETURN",
            "-A KUBE-SERVICES -m comment --comment \"Kubernetes service cluster ip + port for masquerade purpose\" -m set --match-set KUBE-CLUSTER-IP dst,dst ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ",
            "-A KUBE-POSTROUTING -m comment --comment \"Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose\" -m set --match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE",
            "-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT",
            "-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT",
            "-A KUBE-MARK-MASQ -j MARK --or-mark 0x00004000",
            "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully",
            "-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT",
            "-I PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
            "-I OUTPUT -m comment --comment \"kubernetes ipvs access filter\" -j KUBE-IPVS-OUT-FILTER",
        ],
        // Rules of empty sets are left out.
        &["-A KUBE-SERVICES -m set --match-set KUBE-LOAD-BALANCER dst,dst -j ACCEPT"],
    );
    // nat before filter, each committed.
    let nat = ipt.rfind("*nat").unwrap();
    assert!(nat < ipt.rfind("*filter").unwrap());
}

/// TestNodePort / TestOnlyLocalNodePorts: a virtual server per node IP and node port;
/// the port in the bitmap set (and the -LOCAL one with ETP=Local); ETP=Local uses the
/// local endpoints only.
#[test]
fn node_port_local() {
    let t = service(
        "  type: LoadBalancer\n  clusterIP: 10.96.0.11\n  externalTrafficPolicy: Local\n  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30080}]\n  healthCheckNodePort: 30500",
        "",
    );
    check(
        &part(&t, Part::Ipvsadm),
        &[
            "-A -t 192.0.2.10:30080 -s rr",
            "-a -t 192.0.2.10:30080 -r 10.244.1.2:8080 -m -w 1",
            "-a -t 10.96.0.11:80 -r 10.244.2.2:8080 -m -w 1",
        ],
        &["-a -t 192.0.2.10:30080 -r 10.244.2.2:8080 -m -w 1"],
    );
    check(
        &part(&t, Part::Ipset),
        &[
            "add KUBE-NODE-PORT-TCP 30080",
            "add KUBE-NODE-PORT-LOCAL-TCP 30080",
            "add KUBE-HEALTH-CHECK-NODE-PORT 30500",
        ],
        // Node IPs are never bound to kube-ipvs0.
        &["add KUBE-IPVS-IPS 192.0.2.10"],
    );
    check(
        &part(&t, Part::Iptables),
        &[
            "-A KUBE-NODE-PORT -p tcp -m comment --comment \"Kubernetes nodeport TCP port with externalTrafficPolicy=local\" -m set --match-set KUBE-NODE-PORT-LOCAL-TCP dst -j RETURN",
            "-A KUBE-NODE-PORT -p tcp -m comment --comment \"Kubernetes nodeport TCP port for masquerade purpose\" -m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ",
            "-A KUBE-NODE-PORT -m comment --comment \"Kubernetes health check node port\" -m set --match-set KUBE-HEALTH-CHECK-NODE-PORT dst -j ACCEPT",
        ],
        &[],
    );
}

/// `syncProxyRules` (`pkg/proxy/ipvs/proxier.go`): a node port with no node IP of the
/// family (`if len(nodeIPs) == 0 { continue }`) skips the service port's health-check
/// node port too; with an address of the family the entry is there.
#[test]
fn health_check_node_port_needs_a_node_ip_of_the_family() {
    let t = service(
        "  type: LoadBalancer\n  ipFamilyPolicy: PreferDualStack\n  ipFamilies: [IPv4, IPv6]\n  externalTrafficPolicy: Local\n  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30080}]\n  healthCheckNodePort: 30500",
        "",
    );
    let hc = "add KUBE-6-HEALTH-CHECK-NODE-PORT 30500";
    let ipset6 = |t: &str| {
        let (v, o) = compile(t, IpFamily::IPv6);
        write_part(&v, Part::Ipset, &o)
    };
    check(&ipset6(&t), &[hc], &[]);
    let no_v6 = t.replace(", {type: InternalIP, address: 'fd00::10'}", "");
    assert_ne!(no_v6, t);
    check(
        &ipset6(&no_v6),
        &[],
        &[hc, "add KUBE-6-NODE-PORT-TCP 30080"],
    );
}

/// ETP=Local with no local endpoint falls back to the cluster endpoints (kubernetes#97081).
#[test]
fn local_policy_without_local_endpoints_uses_cluster_endpoints() {
    let t = service(
        "  type: NodePort\n  clusterIP: 10.96.0.12\n  externalTrafficPolicy: Local\n  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30081}]",
        "",
    )
    .replace("- {addresses: [10.244.1.2], nodeName: node-1}\n", "");
    check(
        &part(&t, Part::Ipvsadm),
        &["-a -t 192.0.2.10:30081 -r 10.244.2.2:8080 -m -w 1"],
        &[],
    );
}

/// TestLoadBalancerSourceRanges / TestOnlyLocalLoadBalancing: LB IP in the LB sets, the
/// firewall sets, the out-filter drop when the ranges leave the node out.
#[test]
fn load_balancer_source_ranges() {
    let t = service(
        "  type: LoadBalancer\n  clusterIP: 10.96.0.13\n  externalTrafficPolicy: Local\n  loadBalancerSourceRanges: [203.0.113.0/25]\n  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30082}]\n  healthCheckNodePort: 30501",
        "loadBalancer: {ingress: [{ip: 198.51.100.50}]}",
    );
    check(
        &part(&t, Part::Ipset),
        &[
            "add KUBE-LOAD-BALANCER 198.51.100.50,tcp:80",
            "add KUBE-LOAD-BALANCER-LOCAL 198.51.100.50,tcp:80",
            "add KUBE-LOAD-BALANCER-FW 198.51.100.50,tcp:80",
            "add KUBE-LOAD-BALANCER-SOURCE-CIDR 198.51.100.50,tcp:80,203.0.113.0/25",
            "add KUBE-IPVS-IPS 198.51.100.50",
        ],
        &["add KUBE-LOAD-BALANCER-SOURCE-IP 198.51.100.50,tcp:80,198.51.100.50"],
    );
    check(
        &part(&t, Part::Iptables),
        &[
            "-A KUBE-SERVICES -m comment --comment \"Kubernetes service lb portal\" -m set --match-set KUBE-LOAD-BALANCER dst,dst -j KUBE-LOAD-BALANCER",
            "-A KUBE-LOAD-BALANCER -m comment --comment \"Kubernetes service load balancer ip + port with externalTrafficPolicy=local\" -m set --match-set KUBE-LOAD-BALANCER-LOCAL dst,dst -j RETURN",
            "-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ",
            "-A KUBE-PROXY-FIREWALL -m comment --comment \"Kubernetes service load balancer ip + port for load balancer with sourceRange\" -m set --match-set KUBE-LOAD-BALANCER-FW dst,dst -j KUBE-SOURCE-RANGES-FIREWALL",
            "-A KUBE-SOURCE-RANGES-FIREWALL -m comment --comment \"Kubernetes service load balancer ip + port + source cidr for packet filter purpose\" -m set --match-set KUBE-LOAD-BALANCER-SOURCE-CIDR dst,dst,src -j RETURN",
            "-A KUBE-SOURCE-RANGES-FIREWALL -j DROP",
            "-A KUBE-IPVS-OUT-FILTER -s 198.51.100.50 -m ipvs --vaddr 198.51.100.50 --vproto tcp --vport 80 -j DROP",
            "-A KUBE-SERVICES -m set --match-set KUBE-LOAD-BALANCER dst,dst -j ACCEPT",
        ],
        &[],
    );
    // A range holding the node IP lets the node in instead.
    let t = t.replace("203.0.113.0/25", "192.0.2.0/24");
    check(
        &part(&t, Part::Ipset),
        &["add KUBE-LOAD-BALANCER-SOURCE-IP 198.51.100.50,tcp:80,198.51.100.50"],
        &[],
    );
    assert!(!part(&t, Part::Iptables).contains("-m ipvs"));
    // A host-length range is spelled as ipset prints it back: the bare address.
    let t = t.replace("192.0.2.0/24", "192.0.2.100/32");
    check(
        &part(&t, Part::Ipset),
        &["add KUBE-LOAD-BALANCER-SOURCE-CIDR 198.51.100.50,tcp:80,192.0.2.100"],
        &[],
    );
}

/// TestExternalIPs: externalIPs in KUBE-EXTERNAL-IP with the masquerade and accept rules;
/// with ETP=Local in the -LOCAL set, without the masquerade. An externalIP the node has
/// on an interface is not bound to kube-ipvs0.
#[test]
fn external_ips() {
    let t = service(
        "  clusterIP: 10.96.0.14\n  externalIPs: [203.0.113.7, 192.0.2.10]",
        "",
    );
    let set = "-A KUBE-SERVICES -m comment --comment \"Kubernetes service external ip + port for masquerade and filter purpose\" -m set --match-set KUBE-EXTERNAL-IP dst,dst";
    check(
        &part(&t, Part::Iptables),
        &[
            &format!("{set} -j KUBE-MARK-MASQ"),
            &format!("{set} -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT"),
            &format!("{set} -m addrtype --dst-type LOCAL -j ACCEPT"),
        ],
        &[],
    );
    check(
        &part(&t, Part::Addresses),
        &["address add 203.0.113.7/32 dev kube-ipvs0"],
        &["address add 192.0.2.10/32 dev kube-ipvs0"],
    );
    check(
        &part(&t, Part::Ipvsadm),
        &["-A -t 203.0.113.7:80 -s rr", "-A -t 192.0.2.10:80 -s rr"],
        &[],
    );
}

/// Session affinity: persistence with the affinity timeout. The scheduler and the
/// timeouts come from the `ipvs` section; mh adds its flag.
#[test]
fn affinity_scheduler_and_timeouts() {
    let t = service(
        "  clusterIP: 10.96.0.15\n  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}",
        "",
    );
    check(
        &part(&t, Part::Ipvsadm),
        &["-A -t 10.96.0.15:80 -s rr -p 60"],
        &[],
    );
    let t = t.replace(
        "clusterCIDR: 10.244.0.0/16\n",
        "clusterCIDR: 10.244.0.0/16\nipvs: {scheduler: mh, strictARP: true, tcpTimeout: 15m, udpTimeout: 30s}\n",
    );
    let out = part(&t, Part::Ipvsadm);
    assert_eq!(out.lines().next(), Some("--set 900 0 30"), "{out}");
    check(&out, &["-A -t 10.96.0.15:80 -s mh -p 60 -b mh-port"], &[]);
    check(
        &part(&t, Part::Addresses),
        &[
            "#   net.ipv4.conf.all.arp_ignore=1  (strictARP)",
            "#   net.ipv4.conf.all.arp_announce=2  (strictARP)",
        ],
        &[],
    );
}

/// masqueradeAll masquerades all cluster-IP traffic; without a detector, only traffic
/// whose source is a VIP (`src,dst`).
#[test]
fn masquerade_modes() {
    let rule = "-A KUBE-SERVICES -m comment --comment \"Kubernetes service cluster ip + port for masquerade purpose\" -m set --match-set KUBE-CLUSTER-IP";
    let t = service("  clusterIP: 10.96.0.16", "");
    let all = t.replace(
        "mode: ipvs\n",
        "mode: ipvs\niptables: {masqueradeAll: true}\n",
    );
    check(
        &part(&all, Part::Iptables),
        &[&format!("{rule} dst,dst -j KUBE-MARK-MASQ")],
        &[],
    );
    let none = t.replace("clusterCIDR: 10.244.0.0/16\n", "");
    check(
        &part(&none, Part::Iptables),
        &[&format!("{rule} src,dst -j KUBE-MARK-MASQ")],
        &[],
    );
}

/// IPv6: KUBE-6- set names (cut to 31 characters), bracketed ipvsadm addresses, /128
/// bound addresses, ip6tables header and loopback.
#[test]
fn ipv6() {
    let t = format!(
        "{NODES}---
apiVersion: v1
kind: Service
metadata: {{name: web6, namespace: ns}}
spec:
  type: LoadBalancer
  ipFamilies: [IPv6]
  clusterIP: 'fd00:96::10'
  loadBalancerSourceRanges: ['2001:db8::/64']
  selector: {{app: web}}
  ports: [{{port: 80, targetPort: 8080, nodePort: 30090}}]
status: {{loadBalancer: {{ingress: [{{ip: '2001:db8:1::1'}}]}}}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: web6-1, namespace: ns, labels: {{kubernetes.io/service-name: web6}}}}
addressType: IPv6
ports: [{{port: 8080, protocol: TCP}}]
endpoints:
- {{addresses: ['fd00:244:1::2'], nodeName: node-1}}
"
    );
    let (v, o) = compile(&t, IpFamily::IPv6);
    check(
        &write_part(&v, Part::Ipvsadm, &o),
        &[
            "-A -t [fd00:96::10]:80 -s rr",
            "-a -t [fd00:96::10]:80 -r [fd00:244:1::2]:8080 -m -w 1",
            "-A -t [fd00::10]:30090 -s rr",
        ],
        &[],
    );
    check(
        &write_part(&v, Part::Ipset, &o),
        &[
            "create KUBE-6-CLUSTER-IP hash:ip,port family inet6 hashsize 1024 maxelem 65536",
            "add KUBE-6-CLUSTER-IP fd00:96::10,tcp:80",
            "create KUBE-6-LOAD-BALANCER-SOURCE-CID hash:ip,port,net family inet6 hashsize 1024 maxelem 65536",
            "add KUBE-6-LOAD-BALANCER-SOURCE-CID 2001:db8:1::1,tcp:80,2001:db8::/64",
            "create KUBE-6-NODE-PORT-TCP bitmap:port range 0-65535",
        ],
        &[],
    );
    check(
        &write_part(&v, Part::Addresses, &o),
        &["address add fd00:96::10/128 dev kube-ipvs0"],
        &[],
    );
    let ipt = write_part(&v, Part::Iptables, &o);
    assert!(ipt.lines().next().unwrap().contains("IPv6"));
    check(&ipt, &["-A KUBE-SERVICES -s ::1/128 -j RETURN"], &[]);
}

/// No endpoints: the virtual server stays, with no real servers (and no REJECT rule).
#[test]
fn no_endpoints_keeps_the_virtual_server() {
    let t = service("  clusterIP: 10.96.0.17", "");
    let t = t
        .split("---\napiVersion: discovery.k8s.io/v1")
        .next()
        .unwrap();
    let out = part(t, Part::Ipvsadm);
    assert_eq!(out, "-A -t 10.96.0.17:80 -s rr\n");
}

/// The bundle is the four parts in load order under headers; parts are deterministic.
#[test]
fn bundle_and_parts() {
    let t = service("  clusterIP: 10.96.0.18", "");
    let (v, o) = compile(&t, IpFamily::IPv4);
    let all = write_string(&v, &o);
    let headers: Vec<&str> = all.lines().filter(|l| l.starts_with("# ==== ")).collect();
    assert_eq!(headers.len(), 4, "{all}");
    for (h, p) in headers.iter().zip(Part::ALL) {
        assert!(h.starts_with(&format!("# ==== {p}: load with `{}`", p.loader())));
    }
    let mut joined = String::new();
    for p in Part::ALL {
        joined.push_str(&write_part(&v, p, &o));
    }
    let body: String = all
        .lines()
        .filter(|l| !l.starts_with("# ==== "))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(body, joined);
    for p in Part::ALL {
        assert_eq!(p.name().parse::<Part>(), Ok(p));
    }
    assert!("iptable".parse::<Part>().is_err());
}

/// `ipvsadm-save` order (checked against the kernel by the VM suite): protocol, then the
/// address read as a signed 32-bit number (192.0.2.10 before 10.96.0.19), then the port.
#[test]
fn ipvsadm_save_order() {
    let t = service(
        "  type: NodePort\n  clusterIP: 10.96.0.19\n  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30089}, {name: dns, port: 53, targetPort: 8080, nodePort: 30053, protocol: UDP}]",
        "",
    );
    let services: Vec<String> = part(&t, Part::Ipvsadm)
        .lines()
        .filter(|l| l.starts_with("-A "))
        .map(String::from)
        .collect();
    assert_eq!(
        services,
        [
            "-A -t 192.0.2.10:30089 -s rr",
            "-A -t 10.96.0.19:80 -s rr",
            "-A -u 192.0.2.10:30053 -s rr",
            "-A -u 10.96.0.19:53 -s rr",
        ]
    );
}

/// SCTP: `--sctp-service`, and node ports in the hash:ip,port set, one entry per node IP,
/// matched `dst,dst`.
#[test]
fn sctp_node_port() {
    let t = service(
        "  type: NodePort\n  clusterIP: 10.96.0.20\n  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30094, protocol: SCTP}]",
        "",
    )
    .replace("protocol: TCP}]", "protocol: SCTP}]");
    check(
        &part(&t, Part::Ipvsadm),
        &[
            "-A --sctp-service 10.96.0.20:80 -s rr",
            "-a --sctp-service 192.0.2.10:30094 -r 10.244.2.2:8080 -m -w 1",
        ],
        &[],
    );
    check(
        &part(&t, Part::Ipset),
        &["add KUBE-NODE-PORT-SCTP-HASH 192.0.2.10,sctp:30094"],
        &[],
    );
    check(
        &part(&t, Part::Iptables),
        &["-A KUBE-NODE-PORT -p sctp -m comment --comment \"Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'\" -m set --match-set KUBE-NODE-PORT-SCTP-HASH dst,dst -j KUBE-MARK-MASQ"],
        &[],
    );
}

/// Options come from the module's KubeProxyConfiguration.
#[test]
fn options_from_the_proxy_config() {
    let t = service("  clusterIP: 10.96.0.21", "").replace(
        "clusterCIDR: 10.244.0.0/16\n",
        "clusterCIDR: 10.244.0.0/16\nipvs: {scheduler: wlc, excludeCIDRs: [10.0.0.0/8], tcpFinTimeout: 2m}\n",
    );
    let (_, o) = compile(&t, IpFamily::IPv4);
    assert_eq!(o.scheduler, "wlc");
    assert_eq!(o.config.tcp_fin_timeout, 120);
    assert_eq!(o.config.exclude_cidrs.len(), 1);
    assert!(!o.config.strict_arp);
    let (v, d) = compile(&service("  clusterIP: 10.96.0.21", ""), IpFamily::IPv4);
    assert_eq!(d, Options::default());
    assert_eq!(Options::from_view(&v), d);
    // The view carries the module's settings (what the registry's renderer reads).
    let (v, o) = compile(&t, IpFamily::IPv4);
    assert_eq!(Options::from_view(&v), o);
}

/// The registry's renderer: `render_into` is the bundle, `parts` are `Part::ALL` in load
/// order, `render_part_into` is one part alone, with the view's own settings.
#[test]
fn renderer_parts() {
    use crate::NodeRenderer;
    let t = service("  clusterIP: 10.96.0.21", "").replace(
        "clusterCIDR: 10.244.0.0/16\n",
        "clusterCIDR: 10.244.0.0/16\nipvs: {scheduler: sh, udpTimeout: 30s}\n",
    );
    let (v, o) = compile(&t, IpFamily::IPv4);
    let r = super::Renderer;
    let names: Vec<&str> = Part::ALL.iter().map(|p| p.name()).collect();
    assert_eq!(r.parts(), names);
    let mut out = String::from("stale");
    r.render_into(&v, &mut out);
    assert_eq!(out, write_string(&v, &o));
    assert!(out.contains("-A -t 10.96.0.21:80 -s sh"), "{out}");
    for p in Part::ALL {
        r.render_part_into(&v, p.name(), &mut out);
        assert_eq!(out, write_part(&v, p, &o), "{p}");
    }
}

/// `--all-nodes --out` renders all parts from one model: the same text as each part alone.
#[test]
fn all_parts_at_once_equal_each_part_alone() {
    use crate::NodeRenderer;
    let t = service(
        "  type: LoadBalancer\n  clusterIP: 10.96.0.10\n  externalIPs: [80.11.12.10]",
        "loadBalancer: {ingress: [{ip: 146.148.47.155}]}",
    );
    for family in [IpFamily::IPv4, IpFamily::IPv6] {
        let (v, _) = compile(&t, family);
        let r = super::Renderer;
        let mut all = vec![String::from("stale"); r.parts().len()];
        r.render_parts_into(&v, &mut all);
        for (name, text) in r.parts().iter().zip(&all) {
            let mut one = String::new();
            r.render_part_into(&v, name, &mut one);
            assert_eq!(text, &one, "{name} ({family:?})");
        }
        assert!(all.iter().all(|t| !t.starts_with("stale")));
    }
}
