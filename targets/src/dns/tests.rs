use super::*;
use crate::testing::module;

const CLUSTER: &str = "apiVersion: svc-compile/v1alpha1\nkind: ClusterConfig\nserviceClusterIPRange: 10.96.0.0/16,fd00:96::/112\nclusterDomain: cluster.local\n";

fn records(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| !l.starts_with(';') && !l.starts_with('$'))
        .map(str::to_string)
        .collect()
}

#[test]
fn names_and_reverse_names() {
    assert_eq!(
        reverse_name(&"10.96.0.1".parse().unwrap()),
        "1.0.96.10.in-addr.arpa."
    );
    assert_eq!(
        reverse_name(&"fd00::1".parse().unwrap()),
        "1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa."
    );
    // CoreDNS's endpointHostname.
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    assert_eq!(endpoint_hostname(&ip("10.0.0.1"), None), "10-0-0-1");
    assert_eq!(endpoint_hostname(&ip("fd00::1"), None), "fd00--1");
    assert_eq!(endpoint_hostname(&ip("fd00::"), None), "fd00--0");
    assert_eq!(endpoint_hostname(&ip("10.0.0.1"), Some("web-0")), "web-0");
}

#[test]
fn cluster_ip_service_gets_a_aaaa_srv_and_ptr() {
    let y = format!("{CLUSTER}---\napiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: prod}}\nspec:\n  ipFamilyPolicy: RequireDualStack\n  clusterIPs: [10.96.0.10, \"fd00:96::a\"]\n  ports:\n  - {{name: http, port: 80}}\n  - {{name: plain, port: 81}}\n  - {{name: dns, port: 53, protocol: UDP}}\n");
    let m = module(&y);
    let z = write_zone(&m, &Options::default());
    let r = records(&z);
    assert!(r.contains(&"web.prod.svc.cluster.local. 5 IN A 10.96.0.10".into()));
    assert!(r.contains(&"web.prod.svc.cluster.local. 5 IN AAAA fd00:96::a".into()));
    assert!(r.contains(
        &"_http._tcp.web.prod.svc.cluster.local. 5 IN SRV 0 100 80 web.prod.svc.cluster.local."
            .into()
    ));
    assert!(r.contains(
        &"_dns._udp.web.prod.svc.cluster.local. 5 IN SRV 0 100 53 web.prod.svc.cluster.local."
            .into()
    ));
    assert_eq!(r.iter().filter(|l| l.contains(" SRV ")).count(), 3);
    assert!(r.contains(&"dns-version.cluster.local. 28800 IN TXT \"1.1.0\"".into()));
    let soa = r.iter().find(|l| l.contains(" SOA ")).unwrap();
    assert!(
        soa.starts_with("cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. ")
    );
    assert!(soa.ends_with(" 7200 1800 86400 5"));
    assert!(r.contains(&"cluster.local. 5 IN NS ns.dns.cluster.local.".into()));
    // No kube-dns service, and kubeadm's DNS address is this service's: the name server
    // gets loopback instead, in each family of the service CIDRs.
    assert!(r.contains(&"ns.dns.cluster.local. 5 IN A 127.0.0.1".into()));
    assert!(r.contains(&"ns.dns.cluster.local. 5 IN AAAA ::1".into()));
    let z = write_zone(
        &m,
        &Options {
            ns_addresses: Some(vec!["192.0.2.53".parse().unwrap()]),
            ..Default::default()
        },
    );
    assert!(z.contains("\nns.dns.cluster.local. 5 IN A 192.0.2.53\n"));
    assert_eq!(z.matches("ns.dns.cluster.local. 5 IN A").count(), 1);
    let v4 = write_reverse_zone(&m, &Options::default(), IpFamily::IPv4);
    assert!(records(&v4)
        .contains(&"10.0.96.10.in-addr.arpa. 5 IN PTR web.prod.svc.cluster.local.".into()));
    let v6 = write_reverse_zone(&m, &Options::default(), IpFamily::IPv6);
    assert_eq!(
        records(&v6).iter().filter(|l| l.contains(" PTR ")).count(),
        1
    );
}

#[test]
fn options_change_domain_ttl_and_serial() {
    let y = format!("{CLUSTER}---\napiVersion: v1\nkind: Service\nmetadata: {{name: web}}\nspec:\n  clusterIP: 10.96.0.10\n  ports: [{{port: 80}}]\n");
    let m = module(&y);
    let opts = Options {
        domain: Some("example.test.".into()),
        ttl: 30,
        serial: Some(42),
        ..Default::default()
    };
    let z = write_zone(&m, &opts);
    assert!(z.contains("$ORIGIN example.test.\n"));
    // An unnamed port has no SRV record.
    assert!(!z.contains(" SRV "));
    assert!(z.contains("web.default.svc.example.test. 30 IN A 10.96.0.10\n"));
    assert!(z.contains("example.test. 30 IN SOA ns.dns.example.test. hostmaster.example.test. 42 7200 1800 86400 30\n"));
    // The SOA's own TTL is capped at 300, as CoreDNS does.
    let z = write_zone(
        &m,
        &Options {
            ttl: 3600,
            ..opts.clone()
        },
    );
    assert!(z.contains("example.test. 300 IN SOA "));
    // The default serial follows the records: same input, same serial; another record,
    // another serial.
    let a = write_zone(&m, &Options::default());
    assert_eq!(a, write_zone(&m, &Options::default()));
    let m2 = module(&y.replace("name: web", "name: web2"));
    let serial = |z: &str| {
        z.lines()
            .find(|l| l.contains(" SOA "))
            .unwrap()
            .split(' ')
            .nth(6)
            .unwrap()
            .to_string()
    };
    assert_ne!(serial(&a), serial(&write_zone(&m2, &Options::default())));
}

/// Without a DNS service the name server `ns.dns.<domain>.` always has an address in
/// the zone (BIND refuses the zone otherwise): kubeadm's cluster DNS address when the
/// range holds a free one, else loopback.
#[test]
fn the_fallback_name_server_always_has_an_address() {
    let svc = |ip: &str| {
        format!("---\napiVersion: v1\nkind: Service\nmetadata: {{name: web}}\nspec:\n  clusterIP: {ip}\n  ports: [{{port: 80}}]\n")
    };
    let ns = |yaml: &str| -> Vec<String> {
        records(&write_zone(&module(yaml), &Options::default()))
            .into_iter()
            .filter(|l| l.starts_with("ns.dns."))
            .collect()
    };
    assert_eq!(
        ns(&format!("{CLUSTER}{}", svc("10.96.0.3"))),
        [
            "ns.dns.cluster.local. 5 IN A 10.96.0.10",
            "ns.dns.cluster.local. 5 IN AAAA fd00:96::a"
        ]
    );
    // A range of 8 addresses has no 10th.
    let small = "apiVersion: svc-compile/v1alpha1\nkind: ClusterConfig\nserviceClusterIPRange: 10.96.0.0/29\n";
    assert_eq!(
        ns(&format!("{small}{}", svc("10.96.0.3"))),
        ["ns.dns.cluster.local. 5 IN A 127.0.0.1"]
    );
    // Given addresses win; an empty list is no choice.
    let m = module(&format!("{small}{}", svc("10.96.0.3")));
    for (given, want) in [(vec![], "127.0.0.1"), (vec!["192.0.2.53"], "192.0.2.53")] {
        let opts = Options {
            ns_addresses: Some(given.iter().map(|a| a.parse().unwrap()).collect()),
            ..Default::default()
        };
        let z = write_zone(&m, &opts);
        assert!(
            z.contains(&format!("\nns.dns.cluster.local. 5 IN A {want}\n")),
            "{z}"
        );
    }
}

#[test]
fn dns_service_is_the_name_server() {
    let y = format!("{CLUSTER}---\napiVersion: v1\nkind: Service\nmetadata: {{name: kube-dns, namespace: kube-system}}\nspec:\n  clusterIP: 10.96.0.10\n  ports: [{{name: dns, port: 53, protocol: UDP}}]\n");
    let z = write_zone(&module(&y), &Options::default());
    assert!(z.contains("cluster.local. 5 IN NS kube-dns.kube-system.svc.cluster.local.\n"));
    assert!(z.contains("kube-dns.kube-system.svc.cluster.local. 5 IN A 10.96.0.10\n"));
    assert!(!z.contains("\nns.dns."));
}

fn pod(name: &str, ip: &str, ready: bool, host: &str) -> String {
    format!("---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, labels: {{app: db}}}}\nspec:\n  {host}nodeName: n1\n  containers: [{{name: c, ports: [{{name: pg, containerPort: 5432}}]}}]\nstatus:\n  podIPs: [{{ip: {ip}}}]\n  conditions: [{{type: Ready, status: \"{}\"}}]\n", if ready { "True" } else { "False" })
}

#[test]
fn headless_service_resolves_to_ready_endpoints_with_hostnames() {
    let y = format!(
        "{CLUSTER}---\napiVersion: v1\nkind: Service\nmetadata: {{name: db}}\nspec:\n  clusterIP: None\n  selector: {{app: db}}\n  ports: [{{name: pg, port: 5432, targetPort: pg}}, {{name: metrics, port: 9000, targetPort: 9000}}]\n{}{}{}{}",
        pod("db-0", "10.244.1.5", true, "hostname: db-0\n  subdomain: db\n  "),
        pod("db-1", "10.244.1.6", true, ""),
        // Another subdomain: the controller leaves the hostname out.
        pod("db-2", "10.244.1.7", true, "hostname: db-2\n  subdomain: other\n  "),
        pod("db-3", "10.244.1.8", false, "hostname: db-3\n  subdomain: db\n  "),
    );
    let m = module(&y);
    let r = records(&write_zone(&m, &Options::default()));
    let base = "db.default.svc.cluster.local.";
    let a: Vec<&String> = r.iter().filter(|l| l.starts_with(base)).collect();
    assert_eq!(
        a,
        [
            &format!("{base} 5 IN A 10.244.1.5"),
            &format!("{base} 5 IN A 10.244.1.6"),
            &format!("{base} 5 IN A 10.244.1.7"),
        ]
    );
    assert!(r.contains(&format!("db-0.{base} 5 IN A 10.244.1.5")));
    assert!(r.contains(&format!("10-244-1-6.{base} 5 IN A 10.244.1.6")));
    assert!(r.contains(&format!("10-244-1-7.{base} 5 IN A 10.244.1.7")));
    // Not ready: nothing.
    assert!(!r
        .iter()
        .any(|l| l.contains("10.244.1.8") || l.contains("db-3")));
    // SRV: one per ready endpoint and named port, with the endpoint's port; 100/3.
    let srv: Vec<&String> = r.iter().filter(|l| l.starts_with("_pg.")).collect();
    assert_eq!(
        srv,
        [
            &format!("_pg._tcp.{base} 5 IN SRV 0 33 5432 10-244-1-6.{base}"),
            &format!("_pg._tcp.{base} 5 IN SRV 0 33 5432 10-244-1-7.{base}"),
            &format!("_pg._tcp.{base} 5 IN SRV 0 33 5432 db-0.{base}"),
        ]
    );
    let v4 = records(&write_reverse_zone(&m, &Options::default(), IpFamily::IPv4));
    assert!(v4.contains(&format!("5.1.244.10.in-addr.arpa. 5 IN PTR db-0.{base}")));
    assert!(v4.contains(&format!(
        "6.1.244.10.in-addr.arpa. 5 IN PTR 10-244-1-6.{base}"
    )));
}

#[test]
fn publish_not_ready_addresses_publishes_unready_pods() {
    let y = format!(
        "{CLUSTER}---\napiVersion: v1\nkind: Service\nmetadata: {{name: db}}\nspec:\n  clusterIP: None\n  publishNotReadyAddresses: true\n  selector: {{app: db}}\n  ports: [{{name: pg, port: 5432, targetPort: pg}}]\n{}",
        pod("db-3", "10.244.1.8", false, "hostname: db-3\n  subdomain: db\n  "),
    );
    let r = records(&write_zone(&module(&y), &Options::default()));
    assert!(r.contains(&"db-3.db.default.svc.cluster.local. 5 IN A 10.244.1.8".into()));
}

#[test]
fn endpoint_slice_and_endpoints_hostnames() {
    let y = format!("{CLUSTER}---\napiVersion: v1\nkind: Service\nmetadata: {{name: h}}\nspec:\n  clusterIP: None\n  ports: [{{name: web, port: 80}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: h-1, labels: {{kubernetes.io/service-name: h}}}}\naddressType: IPv6\nports: [{{name: web, port: 8080}}]\nendpoints:\n- addresses: [\"fd00::5\"]\n  hostname: six\n---\napiVersion: v1\nkind: Service\nmetadata: {{name: e}}\nspec:\n  clusterIP: None\n  ports: [{{name: web, port: 80}}]\n---\napiVersion: v1\nkind: Endpoints\nmetadata: {{name: e}}\nsubsets:\n- addresses: [{{ip: 192.0.2.4, hostname: four}}]\n  ports: [{{name: web, port: 80}}]\n");
    let m = module(&y);
    let r = records(&write_zone(&m, &Options::default()));
    assert!(r.contains(&"six.h.default.svc.cluster.local. 5 IN AAAA fd00::5".into()));
    assert!(r.contains(&"_web._tcp.h.default.svc.cluster.local. 5 IN SRV 0 100 8080 six.h.default.svc.cluster.local.".into()));
    assert!(r.contains(&"four.e.default.svc.cluster.local. 5 IN A 192.0.2.4".into()));
    let v6 = records(&write_reverse_zone(&m, &Options::default(), IpFamily::IPv6));
    assert!(v6
        .iter()
        .any(|l| l.ends_with("d.f.ip6.arpa. 5 IN PTR six.h.default.svc.cluster.local.")));
}

#[test]
fn external_name_is_a_cname() {
    let y = "apiVersion: v1\nkind: Service\nmetadata: {name: my-service, namespace: prod}\nspec:\n  type: ExternalName\n  externalName: my.database.example.com\n";
    let r = records(&write_zone(&module(y), &Options::default()));
    assert!(r.contains(
        &"my-service.prod.svc.cluster.local. 5 IN CNAME my.database.example.com.".into()
    ));
}

/// An externalName that is an IP address gets no record: CoreDNS answers only names, and
/// Kubernetes documents that such a name is not resolved (the compiler warns, SVC126).
#[test]
fn an_external_name_that_is_an_ip_gets_no_record() {
    let y = "apiVersion: v1\nkind: Service\nmetadata: {name: legacy, namespace: prod}\nspec:\n  type: ExternalName\n  externalName: 192.0.2.7\n";
    let r = records(&write_zone(&module(y), &Options::default()));
    assert!(!r.iter().any(|l| l.starts_with("legacy.prod.")), "{r:?}");
}

#[test]
fn zones_come_in_a_fixed_set() {
    let m = module(
        "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec:\n  ports: [{port: 80}]\n",
    );
    let z = write_zones(&m, &Options::default());
    let origins: Vec<&str> = z.iter().map(|z| z.origin.as_str()).collect();
    assert_eq!(origins, ["cluster.local.", "in-addr.arpa.", "ip6.arpa."]);
    assert_eq!(z[0].text, write_zone(&m, &Options::default()));
}

/// `--target dns`: one file per zone, named after its origin; `--ttl` checked.
#[test]
fn the_target_gives_a_file_per_zone() {
    let m = module(&format!("{CLUSTER}---\napiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: shop}}\nspec:\n  clusterIP: 10.96.0.10\n  ports: [{{name: http, port: 80}}]\n"));
    let crate::Render::Cluster(render) = TARGET.render else {
        panic!("dns is cluster-scoped")
    };
    let files = render(&m, &[], &crate::Params::default()).unwrap();
    let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        ["cluster.local.zone", "in-addr.arpa.zone", "ip6.arpa.zone"]
    );
    let zones = write_zones(&m, &Options::default());
    assert!(files.iter().zip(&zones).all(|(f, z)| f.text == z.text));
    let mut p = crate::Params::default();
    p.push("ttl", "60".into());
    let files = render(&m, &[], &p).unwrap();
    assert!(
        files[0]
            .text
            .contains("web.shop.svc.cluster.local. 60 IN A 10.96.0.10"),
        "{}",
        files[0].text
    );
    for bad in ["3601", "-1", "5s", ""] {
        let mut p = crate::Params::default();
        p.push("ttl", bad.into());
        match render(&m, &[], &p) {
            Err(crate::RenderError::Usage(e)) => assert!(e.starts_with("--ttl"), "{e}"),
            other => panic!("--ttl {bad:?}: {other:?}"),
        }
    }
}

#[test]
fn a_headless_service_publishes_only_its_own_families_of_selected_pods() {
    // The EndpointSlice controller makes slices only for the service's families: a
    // headless service the API server defaults to single-stack gets no AAAA from
    // dual-stack pods; with RequireDualStack it gets both.
    let pod = "---\napiVersion: v1\nkind: Pod\nmetadata: {name: db-0, namespace: prod, labels: {app: db}}\nspec: {nodeName: n1}\nstatus:\n  podIPs: [{ip: 10.244.1.5}, {ip: \"fd00:244::5\"}]\n  conditions: [{type: Ready, status: \"True\"}]\n";
    let svc = |policy: &str| {
        format!("---\napiVersion: v1\nkind: Service\nmetadata: {{name: db, namespace: prod}}\nspec:\n  clusterIP: None\n  {policy}selector: {{app: db}}\n  ports: [{{name: pg, port: 5432}}]\n")
    };
    let zone = |policy: &str| {
        records(&write_zone(
            &module(&format!("{CLUSTER}{}{pod}", svc(policy))),
            &Options::default(),
        ))
    };
    let single = zone("");
    assert!(single.contains(&"db.prod.svc.cluster.local. 5 IN A 10.244.1.5".into()));
    assert!(
        !single
            .iter()
            .any(|l| l.starts_with("db.prod.svc.cluster.local. ") && l.contains(" AAAA ")),
        "{single:?}"
    );
    let dual = zone("ipFamilyPolicy: RequireDualStack\n  ");
    assert!(
        dual.contains(&"db.prod.svc.cluster.local. 5 IN AAAA fd00:244::5".into()),
        "{dual:?}"
    );
    let v6 = zone("ipFamilies: [IPv6]\n  ");
    assert!(
        !v6.contains(&"db.prod.svc.cluster.local. 5 IN A 10.244.1.5".into()),
        "{v6:?}"
    );
    assert!(
        v6.contains(&"db.prod.svc.cluster.local. 5 IN AAAA fd00:244::5".into()),
        "{v6:?}"
    );
}

#[test]
fn a_headless_service_without_ports_still_has_its_endpoints_records() {
    // A StatefulSet's governing service often has no ports: CoreDNS still serves the
    // service's and each pod's A records (no SRV). Selected pods and a given slice alike.
    let pod = "---\napiVersion: v1\nkind: Pod\nmetadata: {name: db-0, namespace: prod, labels: {app: db}}\nspec: {nodeName: n1, hostname: db-0, subdomain: db}\nstatus:\n  podIPs: [{ip: 10.244.1.5}]\n  conditions: [{type: Ready, status: \"True\"}]\n";
    let svc = "---\napiVersion: v1\nkind: Service\nmetadata: {name: db, namespace: prod}\nspec: {clusterIP: None, selector: {app: db}}\n";
    let r = records(&write_zone(
        &module(&format!("{CLUSTER}{svc}{pod}")),
        &Options::default(),
    ));
    assert!(
        r.contains(&"db.prod.svc.cluster.local. 5 IN A 10.244.1.5".into()),
        "{r:?}"
    );
    assert!(
        r.contains(&"db-0.db.prod.svc.cluster.local. 5 IN A 10.244.1.5".into()),
        "{r:?}"
    );
    assert!(!r.iter().any(|l| l.contains(" SRV ")), "{r:?}");

    let bare = "---\napiVersion: v1\nkind: Service\nmetadata: {name: ext, namespace: prod}\nspec: {clusterIP: None}\n";
    let slice = "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: ext-1, namespace: prod, labels: {kubernetes.io/service-name: ext}}\naddressType: IPv4\nendpoints:\n- addresses: [192.0.2.7]\n- addresses: [192.0.2.8]\n  conditions: {ready: false}\n";
    let r = records(&write_zone(
        &module(&format!("{CLUSTER}{bare}{slice}")),
        &Options::default(),
    ));
    assert!(
        r.contains(&"ext.prod.svc.cluster.local. 5 IN A 192.0.2.7".into()),
        "{r:?}"
    );
    assert!(
        r.contains(&"192-0-2-7.ext.prod.svc.cluster.local. 5 IN A 192.0.2.7".into()),
        "{r:?}"
    );
    assert!(!r.iter().any(|l| l.contains("192.0.2.8")), "{r:?}");
}

#[test]
fn srv_weights_count_each_address_of_a_dual_stack_endpoint() {
    // CoreDNS weighs an SRV name by its records before dropping duplicate targets: two
    // dual-stack pods are four records, so each target gets 100/4, whether its two
    // addresses share a hostname (one SRV) or not (one per dashed address).
    let slice = |fam: &str, a: &str, b: &str| {
        format!("---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: db-{}, labels: {{kubernetes.io/service-name: db}}}}\naddressType: {fam}\nports: [{{name: pg, port: 5432}}]\nendpoints:\n- addresses: [\"{a}\"]\n  hostname: db-0\n- addresses: [\"{b}\"]\n", fam.to_lowercase())
    };
    let y = format!(
        "{CLUSTER}---\napiVersion: v1\nkind: Service\nmetadata: {{name: db}}\nspec:\n  clusterIP: None\n  ipFamilyPolicy: RequireDualStack\n  ports: [{{name: pg, port: 5432}}]\n{}{}",
        slice("IPv4", "10.244.1.5", "10.244.1.6"),
        slice("IPv6", "fd00::5", "fd00::6"),
    );
    let r = records(&write_zone(&module(&y), &Options::default()));
    let srv: Vec<&String> = r.iter().filter(|l| l.contains(" SRV ")).collect();
    let base = "db.default.svc.cluster.local.";
    assert_eq!(
        srv,
        [
            &format!("_pg._tcp.{base} 5 IN SRV 0 25 5432 10-244-1-6.{base}"),
            &format!("_pg._tcp.{base} 5 IN SRV 0 25 5432 db-0.{base}"),
            &format!("_pg._tcp.{base} 5 IN SRV 0 25 5432 fd00--6.{base}"),
        ]
    );
}

#[test]
fn every_slice_listing_an_address_counts() {
    // Slice `a` lists 10.244.1.5 not ready, slice `b` ready with a hostname: CoreDNS reads
    // both, so the ready copy has its records whichever slice sorts first; and the SRV
    // weight counts each listing (.5 twice, .6, .7: 100/4).
    let slice = |name: &str, eps: &str| {
        format!("---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}, labels: {{kubernetes.io/service-name: db}}}}\naddressType: IPv4\nports: [{{name: pg, port: 5432}}]\nendpoints:\n{eps}")
    };
    let svc = "---\napiVersion: v1\nkind: Service\nmetadata: {name: db}\nspec:\n  clusterIP: None\n  ports: [{name: pg, port: 5432}]\n";
    let y = format!(
        "{CLUSTER}{svc}{}{}",
        slice(
            "a",
            "- addresses: [10.244.1.5]\n  conditions: {ready: false}\n"
        ),
        slice("b", "- addresses: [10.244.1.5]\n  hostname: db-0\n")
    );
    let r = records(&write_zone(&module(&y), &Options::default()));
    let base = "db.default.svc.cluster.local.";
    assert!(r.contains(&format!("{base} 5 IN A 10.244.1.5")), "{r:?}");
    assert!(
        r.contains(&format!("db-0.{base} 5 IN A 10.244.1.5")),
        "{r:?}"
    );
    let y = format!(
        "{CLUSTER}{svc}{}{}",
        slice(
            "a",
            "- addresses: [10.244.1.5]\n- addresses: [10.244.1.6]\n"
        ),
        slice(
            "b",
            "- addresses: [10.244.1.5]\n- addresses: [10.244.1.7]\n"
        )
    );
    let r = records(&write_zone(&module(&y), &Options::default()));
    let srv: Vec<&String> = r.iter().filter(|l| l.contains(" SRV ")).collect();
    assert_eq!(srv.len(), 3, "{srv:?}");
    assert!(srv.iter().all(|l| l.contains(" SRV 0 25 5432 ")), "{srv:?}");
}

// ---- --dns-records coredns ----

fn coredns() -> Options {
    Options {
        records: Some(DnsRecords::Coredns),
        ..Default::default()
    }
}

/// CoreDNS's answers for a cluster IP service with endpoints (kubernetes.go
/// `findServices`, backend_lookup.go `SRV`, reverse.go `serviceRecordForIP`).
#[test]
fn coredns_cluster_ip_service() {
    let y = format!(
        "{CLUSTER}---\napiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: prod}}\nspec:\n  ipFamilyPolicy: RequireDualStack\n  clusterIPs: [10.96.0.20, \"fd00:96::14\"]\n  selector: {{app: db}}\n  ports:\n  - {{name: pg, port: 5432, targetPort: pg}}\n  - {{name: metrics, port: 81, targetPort: 8081}}\n{}{}",
        pod("db-0", "10.244.1.5", true, "hostname: db-0\n  subdomain: web\n  ")
            .replace("{name: db-0,", "{name: db-0, namespace: prod,"),
        pod("db-1", "10.244.1.6", false, "")
            .replace("{name: db-1,", "{name: db-1, namespace: prod,"),
    );
    let m = module(&y);
    let r = records(&write_zone(&m, &coredns()));
    let base = "web.prod.svc.cluster.local.";
    let at = |name: &str| -> Vec<String> {
        r.iter()
            .filter(|l| l.split(' ').next() == Some(name))
            .cloned()
            .collect()
    };
    // Bare SRV: 2 ports x 2 cluster IPs = 4 answers, 25 each, one record per port.
    assert_eq!(
        at(base),
        [
            format!("{base} 5 IN A 10.96.0.20"),
            format!("{base} 5 IN AAAA fd00:96::14"),
            format!("{base} 5 IN SRV 0 25 5432 {base}"),
            format!("{base} 5 IN SRV 0 25 81 {base}"),
        ]
    );
    // One port, two cluster IPs: 50.
    assert_eq!(
        at(&format!("_pg._tcp.{base}")),
        [format!("_pg._tcp.{base} 5 IN SRV 0 50 5432 {base}")]
    );
    // The ready endpoint's name (its hostname), its SRV over both ports; not the
    // unready one.
    assert_eq!(
        at(&format!("db-0.{base}")),
        [
            format!("db-0.{base} 5 IN A 10.244.1.5"),
            format!("db-0.{base} 5 IN SRV 0 50 5432 db-0.{base}"),
            format!("db-0.{base} 5 IN SRV 0 50 8081 db-0.{base}"),
        ]
    );
    assert!(
        !r.iter().any(|l| l.contains(&format!("10-244-1-6.{base}"))),
        "{r:?}"
    );
    // Both Pods have their `pods verified` name, ready or not.
    assert!(r.contains(&"10-244-1-6.prod.pod.cluster.local. 5 IN A 10.244.1.6".into()));
    let v4 = records(&write_reverse_zone(&m, &coredns(), IpFamily::IPv4));
    assert!(!v4.iter().any(|l| l.starts_with("6.1.244.10.")), "{v4:?}");
    assert!(v4.contains(&format!("5.1.244.10.in-addr.arpa. 5 IN PTR db-0.{base}")));
    assert!(v4.contains(&format!("20.0.96.10.in-addr.arpa. 5 IN PTR {base}")));
    // The spec's records are all there too.
    let spec = records(&write_zone(&m, &Options::default()));
    for l in spec
        .iter()
        .filter(|l| !l.contains(" SOA ") && !l.contains(" SRV "))
    {
        assert!(r.contains(l), "{l} missing in coredns mode");
    }
    assert!(!spec.iter().any(|l| l.contains("db-0")));
}

#[test]
fn coredns_headless_services_and_slice_ports() {
    // `db` has ports; `bare` has none, but its slice lists two (one unnamed), and a
    // second slice lists none (CoreDNS's port -1: A records, a weight, no SRV).
    let y = format!(
        "{CLUSTER}---\napiVersion: v1\nkind: Service\nmetadata: {{name: db}}\nspec:\n  clusterIP: None\n  selector: {{app: db}}\n  ports: [{{name: pg, port: 5432, targetPort: pg}}]\n{}{}---\napiVersion: v1\nkind: Service\nmetadata: {{name: bare}}\nspec: {{clusterIP: None}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: bare-1, labels: {{kubernetes.io/service-name: bare}}}}\naddressType: IPv4\nports: [{{name: web, port: 8080}}, {{port: 9090}}]\nendpoints:\n- addresses: [192.0.2.7]\n  hostname: w\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: bare-2, labels: {{kubernetes.io/service-name: bare}}}}\naddressType: IPv4\nendpoints:\n- addresses: [192.0.2.8]\n",
        pod("db-0", "10.244.1.5", true, "hostname: db-0\n  subdomain: db\n  "),
        pod("db-1", "10.244.1.6", true, ""),
    );
    let m = module(&y);
    let r = records(&write_zone(&m, &coredns()));
    let srv = |name: &str| -> Vec<String> {
        r.iter()
            .filter(|l| l.starts_with(&format!("{name} ")) && l.contains(" SRV "))
            .cloned()
            .collect()
    };
    let db = "db.default.svc.cluster.local.";
    assert_eq!(
        srv(db),
        [
            format!("{db} 5 IN SRV 0 50 5432 10-244-1-6.{db}"),
            format!("{db} 5 IN SRV 0 50 5432 db-0.{db}"),
        ]
    );
    let bare = "bare.default.svc.cluster.local.";
    // Answers: .7 on two ports, .8 on the sentinel: 100/3.
    assert_eq!(
        srv(bare),
        [
            format!("{bare} 5 IN SRV 0 33 8080 w.{bare}"),
            format!("{bare} 5 IN SRV 0 33 9090 w.{bare}"),
        ]
    );
    assert_eq!(
        srv(&format!("_web._tcp.{bare}")),
        [format!("_web._tcp.{bare} 5 IN SRV 0 100 8080 w.{bare}")]
    );
    assert!(srv(&format!("192-0-2-8.{bare}")).is_empty());
    assert!(r.contains(&format!("192-0-2-8.{bare} 5 IN A 192.0.2.8")));
    assert!(r.contains(&format!("{bare} 5 IN A 192.0.2.8")));
    // The spec mode has no SRV for a service without ports.
    let spec = write_zone(&m, &Options::default());
    assert!(
        !spec.contains(&format!("IN SRV 0 100 8080 w.{bare}")),
        "{spec}"
    );
}

/// `pods verified`: a name per Pod of the input at its first IP, none for a terminating
/// Pod; namespaces exist without records (NODATA): placeholders where nothing lies below.
#[test]
fn coredns_pods_and_namespaces() {
    let pod = |name: &str, ns: &str, ips: &str, extra: &str| {
        format!("---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}{extra}}}\nspec: {{nodeName: n1}}\nstatus:\n  podIPs: [{ips}]\n")
    };
    let y = format!(
        "{CLUSTER}{}{}{}---\napiVersion: v1\nkind: Service\nmetadata: {{name: gone, namespace: quiet}}\nspec: {{clusterIP: None}}\n",
        pod("a", "shop", "{ip: 10.244.1.5}, {ip: \"fd00:244::5\"}", ""),
        pod("b", "shop", "{ip: \"fd00:244::6\"}", ""),
        pod("c", "shop", "{ip: 10.244.1.7}", ", deletionTimestamp: \"2026-01-01T00:00:00Z\""),
    );
    let m = module(&y);
    let r = records(&write_zone(&m, &coredns()));
    let pods: Vec<&String> = r.iter().filter(|l| l.contains(".pod.")).collect();
    assert_eq!(
        pods,
        [
            "10-244-1-5.shop.pod.cluster.local. 5 IN A 10.244.1.5",
            "fd00-244--6.shop.pod.cluster.local. 5 IN AAAA fd00:244::6",
            "_ent.quiet.pod.cluster.local. 5 IN TXT \"empty non-terminal\"",
        ]
    );
    assert!(r.contains(&"_ent.quiet.svc.cluster.local. 5 IN TXT \"empty non-terminal\"".into()));
    assert!(r.contains(&"_ent.shop.svc.cluster.local. 5 IN TXT \"empty non-terminal\"".into()));
    // No pod and no namespace at all: `svc.` and `pod.` themselves.
    let r = records(&write_zone(&module(CLUSTER), &coredns()));
    assert!(r.contains(&"_ent.svc.cluster.local. 5 IN TXT \"empty non-terminal\"".into()));
    assert!(r.contains(&"_ent.pod.cluster.local. 5 IN TXT \"empty non-terminal\"".into()));
    // CoreDNS serves the schema version too; the spec mode writes no pods.
    assert!(r.contains(&"dns-version.cluster.local. 28800 IN TXT \"1.1.0\"".into()));
    let spec = write_zone(&m, &Options::default());
    assert!(!spec.contains(".pod.") && !spec.contains("_ent."), "{spec}");
}

/// The mode: `--dns-records` wins over the ClusterConfig's `dnsRecords`, default spec.
#[test]
fn dns_records_flag_and_setting() {
    let svc = "---\napiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  clusterIP: 10.96.0.20\n  ports: [{port: 80}]\n";
    let crate::Render::Cluster(render) = TARGET.render else {
        panic!("dns is cluster-scoped")
    };
    let bare_srv = "web.default.svc.cluster.local. 5 IN SRV ";
    let run = |config: &str, flag: Option<&str>| {
        let m = module(&format!("{CLUSTER}{config}{svc}"));
        let mut p = crate::Params::default();
        if let Some(f) = flag {
            p.push("dns-records", f.into());
        }
        render(&m, &[], &p).map(|f| f[0].text.contains(bare_srv))
    };
    assert!(!run("", None).unwrap());
    assert!(run("", Some("coredns")).unwrap());
    assert!(run("dnsRecords: coredns\n", None).unwrap());
    assert!(!run("dnsRecords: coredns\n", Some("spec")).unwrap());
    match run("", Some("CoreDNS")) {
        Err(crate::RenderError::Usage(e)) => assert!(e.starts_with("--dns-records"), "{e}"),
        other => panic!("{other:?}"),
    }
}
