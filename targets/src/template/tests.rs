use super::*;
use crate::testing::module;

const HAPROXY: &str = include_str!("../../../examples/templates/haproxy.cfg.j2");
const REDIRECT: &str = include_str!("../../../examples/templates/userspace-iptables.rules.j2");
const HOSTS: &str = include_str!("../../../examples/templates/etc-hosts.j2");
const COREDNS: &str = include_str!("../../../examples/templates/coredns-hosts.j2");
const BLACKBOX: &str = include_str!("../../../examples/templates/blackbox-targets.json.j2");

/// Two golden cases side by side: `shop/web` (clusterip: 10.96.0.10, named port http,
/// endpoints 10.244.1.2 and 10.244.2.2) and the affinity case renamed `shop/sticky`
/// (10.96.0.19, ClientIP for 300 s, four endpoints).
fn shop() -> Module {
    let clusterip = include_str!("../../../golden/cases/clusterip/svc.yaml");
    let affinity = include_str!("../../../golden/cases/affinity/svc.yaml")
        .replace("name: web", "name: sticky")
        .replace("service-name: web", "service-name: sticky");
    module(&format!("{clusterip}\n---\n{affinity}"))
}

fn render_ok(m: &Module, text: &str) -> String {
    render(m, &[], "t.j2", text).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn the_view_is_versioned_and_follows_the_ir() {
    let m = shop();
    assert_eq!(render_ok(&m, "{{ viewVersion }}\n"), "1\n");
    let t = "{% for s in services %}{{ s.namespace }}/{{ s.name }} {{ s.type }} {{ s.dnsName }} {{ s.clusterIPs|join(',') }} {{ s.sessionAffinityTimeout }}\n{% endfor %}";
    assert_eq!(
        render_ok(&m, t),
        "shop/sticky NodePort sticky.shop.svc.cluster.local 10.96.0.19 300\nshop/web ClusterIP web.shop.svc.cluster.local 10.96.0.10 None\n"
    );
    let t = "{% for p in servicePorts %}{{ p.index }} {{ p.service }} {{ p.name }} {{ p.port }} {{ p.targetPort }} {{ p.endpoints|map(attribute='addr')|join(' ') }}\n{% endfor %}";
    assert_eq!(
        render_ok(&m, t),
        "0 sticky  80 8080 10.244.1.2:8080 10.244.1.3:8080 10.244.2.2:8080 10.244.2.3:8080\n1 web http 80 8080 10.244.1.2:8080 10.244.2.2:8080\n"
    );
    // No node given: no views.
    assert_eq!(render_ok(&m, "{{ node }} {{ views|length }}"), "None 0");
}

#[test]
fn the_node_view_is_there_when_a_node_is_given() {
    use svc_compiler::net::IpFamily;
    use svc_compiler::passes::node::{node_view, NodeSelection};
    let m = shop();
    let sel = NodeSelection {
        name: "node-1".into(),
        ips: vec!["192.0.2.10".parse().unwrap()],
    };
    let v = node_view(&m, &sel, IpFamily::IPv4).unwrap();
    let out = render(
        &m,
        std::slice::from_ref(&v),
        "t.j2",
        "{{ node }} {{ views[0].family }} {% for p in views[0].ports %}{{ p.spn }}={{ p.clusterEndpoints|length }} {% endfor %}",
    )
    .unwrap();
    assert_eq!(out, "node-1 IPv4 shop/sticky=4 shop/web:http=2 ");
}

#[test]
fn errors_carry_the_template_line() {
    let m = shop();
    let e = render(&m, &[], "bad.j2", "ok\n{{ services[0].nope }}\n").unwrap_err();
    assert_eq!((e.name.as_str(), e.line), ("bad.j2", Some(2)));
    assert!(e.message.contains("undefined"), "{e}");
    // As a diagnostic, rendered by the one renderer the CLI uses.
    let mut sources = svc_compiler::source::SourceMap::default();
    let f = sources.add("bad.j2", "ok\n{{ services[0].nope }}\n");
    let d = e.diagnostic(f);
    assert_eq!(d.code, "SVC501");
    let span = d.span.unwrap();
    assert_eq!((span.line, span.col), (2, 4), "{d:?}");
    let mut ds = svc_compiler::diag::Diagnostics::default();
    ds.push(d);
    let text = svc_compiler::diag::render_all(&ds, &sources);
    assert!(text.contains("bad.j2:2:4"), "{text}");
    let e = render(&m, &[], "syntax.j2", "a\nb\n{% for %}\n").unwrap_err();
    assert_eq!(e.line, Some(3));
    assert!(e.message.contains("syntax error"), "{e}");
    assert_eq!(
        e.to_string().split(':').take(2).collect::<Vec<_>>(),
        ["syntax.j2", "3"]
    );
}

#[test]
fn haproxy_example_has_a_frontend_per_port_and_sticks_for_client_ip() {
    let out = render_ok(&shop(), HAPROXY);
    let want = "\
frontend f_shop_sticky_80
    bind :20000
    default_backend b_shop_sticky_80

backend b_shop_sticky_80
    balance roundrobin
    stick-table type ipv6 size 100k expire 300s
    stick on src
    server ep1 10.244.1.2:8080
    server ep2 10.244.1.3:8080
    server ep3 10.244.2.2:8080
    server ep4 10.244.2.3:8080
";
    assert!(out.contains(want), "{out}");
    let want = "\
frontend f_shop_web_http
    bind :20001
    default_backend b_shop_web_http

backend b_shop_web_http
    balance roundrobin
    server ep1 10.244.1.2:8080
    server ep2 10.244.2.2:8080
";
    assert!(out.contains(want), "{out}");
    assert_eq!(out.matches("stick on src").count(), 1);
    let rules = render_ok(&shop(), REDIRECT);
    assert!(rules.contains("-A SVC-USERSPACE -d 10.96.0.19/32 -p tcp -m tcp --dport 80 -m comment --comment \"shop/sticky\" -j REDIRECT --to-ports 20000\n"), "{rules}");
    assert!(rules.contains("-A SVC-USERSPACE -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -m comment --comment \"shop/web:http\" -j REDIRECT --to-ports 20001\n"), "{rules}");
    assert!(rules.ends_with("COMMIT\n"));
}

#[test]
fn hosts_examples_list_every_cluster_ip() {
    let m = shop();
    let hosts = render_ok(&m, HOSTS);
    let lines: Vec<&str> = hosts.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(
        lines,
        [
            "10.96.0.19\tsticky.shop.svc.cluster.local sticky.shop",
            "10.96.0.10\tweb.shop.svc.cluster.local web.shop",
        ]
    );
    let coredns = render_ok(&m, COREDNS);
    assert!(coredns.contains(
        "hosts {\n    10.96.0.19 sticky.shop.svc.cluster.local\n    10.96.0.10 web.shop.svc.cluster.local\n    ttl 5\n    fallthrough\n}\n"
    ), "{coredns}");
}

#[test]
fn blackbox_example_is_a_file_sd_list_with_one_probe_per_tcp_port() {
    let m = module(
        "apiVersion: v1\nkind: Service\nmetadata: {name: dns, namespace: kube-system}\nspec:\n  clusterIP: 10.96.0.53\n  ports: [{name: dns, port: 53, protocol: UDP}, {name: dns-tcp, port: 53}, {name: metrics, port: 9153}]\n---\napiVersion: v1\nkind: Service\nmetadata: {name: db}\nspec:\n  clusterIP: None\n  ports: [{port: 5432}]\n",
    );
    let out = render_ok(&m, BLACKBOX);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}\n{out}"));
    let targets: Vec<(String, String)> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["targets"][0].as_str().unwrap().to_string(),
                t["labels"]["port"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        targets,
        [
            (
                "dns.kube-system.svc.cluster.local:53".to_string(),
                "dns-tcp".to_string()
            ),
            (
                "dns.kube-system.svc.cluster.local:9153".to_string(),
                "metrics".to_string()
            ),
        ]
    );
    assert_eq!(v[0]["labels"]["module"], "tcp_connect");
}

fn run_target(
    m: &Module,
    views: &[NodeView],
    templates: &[(&str, &str)],
) -> Result<Vec<crate::File>, crate::RenderError> {
    let crate::Render::Cluster(render) = TARGET.render else {
        panic!("template is cluster-scoped")
    };
    let mut p = crate::Params::default();
    for (i, (path, text)) in templates.iter().enumerate() {
        p.push_file(
            "template",
            path.to_string(),
            svc_compiler::source::FileId(i as u32 + 7),
            text.to_string(),
        );
    }
    render(m, views, &p)
}

/// `--target template`: a file per template (per node with nodes), named after the
/// template; errors point into the template's file.
#[test]
fn the_target_names_files_after_templates_and_nodes() {
    use svc_compiler::net::IpFamily;
    use svc_compiler::passes::node::{node_view, NodeSelection};
    let m = shop();
    let t = [("dir/hosts.j2", HOSTS), ("x/blackbox.json.jinja", BLACKBOX)];
    let files = run_target(&m, &[], &t).unwrap();
    let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["hosts", "blackbox.json"]);
    assert_eq!(
        files[0].text,
        render(&m, &[], "dir/hosts.j2", HOSTS).unwrap()
    );

    let view = |node: &str, family| {
        let sel = NodeSelection {
            name: node.into(),
            ips: vec!["10.0.0.1".parse().unwrap(), "fd00::1".parse().unwrap()],
        };
        node_view(&m, &sel, family).unwrap()
    };
    let views = [
        view("a", IpFamily::IPv4),
        view("a", IpFamily::IPv6),
        view("b", IpFamily::IPv4),
    ];
    let node = (
        "n.j2",
        "{{ node }}:{% for v in views %} {{ v.family }}{% endfor %}.\n",
    );
    let files = run_target(&m, &views, &[node]).unwrap();
    let got: Vec<(&str, &str)> = files
        .iter()
        .map(|f| (f.name.as_str(), f.text.as_str()))
        .collect();
    assert_eq!(got, [("a.n", "a: IPv4 IPv6.\n"), ("b.n", "b: IPv4.\n")]);

    match run_target(&m, &[], &[("bad.j2", "ok\n{{ nope }}\n")]) {
        Err(crate::RenderError::Input(d)) => {
            assert_eq!(d.code, TEMPLATE_ERROR_CODE);
            let span = d.span.expect("located");
            assert_eq!(span.file, svc_compiler::source::FileId(7));
            assert_eq!(span.line, 2);
        }
        other => panic!("{other:?}"),
    }
    match run_target(&m, &[], &[("a/h.j2", HOSTS), ("b/h.j2", HOSTS)]) {
        Err(crate::RenderError::Usage(e)) => assert!(e.contains("both write h"), "{e}"),
        other => panic!("{other:?}"),
    }
    match run_target(&m, &[], &[]) {
        Err(crate::RenderError::Usage(e)) => assert!(e.contains("--template FILE"), "{e}"),
        other => panic!("{other:?}"),
    }
}

/// The code is listed with the others (compiler/src/codes.rs).
#[test]
fn the_code_is_documented() {
    let codes = include_str!("../../../compiler/src/codes.rs");
    assert!(codes.contains(&format!("//! - {TEMPLATE_ERROR_CODE}, error:")));
}

#[test]
fn a_service_without_ports_shows_its_endpoints() {
    let y = "apiVersion: v1\nkind: Service\nmetadata: {name: db}\nspec: {clusterIP: None}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: db-1, labels: {kubernetes.io/service-name: db}}\naddressType: IPv4\nendpoints:\n- {addresses: [10.244.1.7], hostname: db-0}\n";
    let t = "{% for s in services %}{{ s.ports|length }}{% for e in s.portlessEndpoints %} {{ e.ip }} {{ e.hostname }}{% endfor %}{% endfor %}";
    assert_eq!(render_ok(&module(y), t), "0 10.244.1.7 db-0");
}
