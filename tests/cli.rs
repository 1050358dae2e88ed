//! The command line as a user meets it: exit codes, stdin, directories, List input.

use crate::support::{root, svc, TempDir};

const SVC: &str = "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  selector: {app: web}\n  ports:\n  - port: 80\n";

#[test]
fn examples_compile_to_ir() {
    let r = svc(&["examples/"], None, &root());
    r.expect(0);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect("IR is JSON");
    assert_eq!(v["irVersion"], 1);
    assert!(v["module"]["services"].as_array().unwrap().len() >= 8);
}

#[test]
fn check_ok_exits_0() {
    let r = svc(&["check", "examples/"], None, &root());
    r.expect(0);
    assert!(r.stdout.contains("ok:"), "{}", r.stdout);
}

#[test]
fn node_port_out_of_range_points_at_it() {
    let t = TempDir::new("np");
    let f = t.path().join("svc.yaml");
    std::fs::write(&f, "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  type: NodePort\n  ports:\n  - port: 80\n    nodePort: 40000\n").unwrap();
    let r = svc(&["check", f.to_str().unwrap()], None, &root());
    r.expect(1);
    let loc = format!("{}:9:15", f.display());
    assert!(r.stdout.contains(&loc), "wanted {loc} in\n{}", r.stdout);
    assert!(r.stdout.contains("error[SVC"), "{}", r.stdout);
}

#[test]
fn stdin_and_list_input() {
    let list = format!(
        "apiVersion: v1\nkind: List\nitems:\n- {}\n",
        SVC.trim_end().replace('\n', "\n  ")
    );
    let r = svc(&["-"], Some(&list), &root());
    r.expect(0);
    assert!(r.stdout.contains("\"name\": \"web\""), "{}", r.stdout);
}

#[test]
fn json_input_matches_yaml_input() {
    let yaml = svc(&["-"], Some(SVC), &root());
    let json = svc(
        &["-"],
        Some(
            r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"web"},"spec":{"selector":{"app":"web"},"ports":[{"port":80}]}}"#,
        ),
        &root(),
    );
    yaml.expect(0);
    json.expect(0);
    assert_eq!(yaml.stdout, json.stdout);
}

#[test]
fn directories_are_read_recursively_in_any_order() {
    let t = TempDir::new("dir");
    std::fs::create_dir_all(t.path().join("a/b")).unwrap();
    std::fs::write(t.path().join("a/b/svc.yml"), SVC).unwrap();
    std::fs::write(t.path().join("notes.txt"), "not yaml").unwrap();
    let r = svc(&[t.path().to_str().unwrap()], None, &root());
    r.expect(0);
    assert!(r.stdout.contains("\"name\": \"web\""));
}

#[test]
fn usage_and_io_errors_exit_2_with_one_line() {
    let r = svc(&["check"], None, &root());
    r.expect(2);
    assert!(r.stderr.starts_with("svc-compile: "), "{}", r.stderr);
    let r = svc(&["check", "does/not/exist.yaml"], None, &root());
    r.expect(2);
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    assert!(r
        .stderr
        .starts_with("svc-compile: cannot read does/not/exist.yaml"));
    let r = svc(&["examples/", "--target", "iptables"], None, &root());
    r.expect(2);
    assert!(r.stderr.contains("--node"), "{}", r.stderr);
    let r = svc(&["examples/", "--frobnicate"], None, &root());
    r.expect(2);
}

#[test]
fn check_json_format() {
    let r = svc(
        &["check", "--format", "json", "-"],
        Some("kind: Service\n"),
        &root(),
    );
    r.expect(1);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v[0]["code"], "SVC006");
    assert_eq!(v[0]["file"], "<stdin>");
    assert_eq!(v[0]["line"], 1);
}

#[test]
fn lock_file_round_trip() {
    let t = TempDir::new("lock");
    let lock = t.path().join("svc.lock.yaml");
    let l = lock.to_str().unwrap();
    let first = svc(&["examples/", "--lock", l, "--write-lock"], None, &root());
    first.expect(0);
    let text = std::fs::read_to_string(&lock).unwrap();
    assert!(text.contains("kind: AllocationLock"), "{text}");
    assert!(text.contains("default/my-service"), "{text}");
    // With another range the lock's addresses no longer fit and are re-allocated; with
    // the same inputs they are reused as they are.
    let again = svc(&["examples/", "--lock", l], None, &root());
    again.expect(0);
    assert_eq!(first.stdout, again.stdout);
}

#[test]
fn no_allocate_leaves_values_missing() {
    let r = svc(&["-", "--no-allocate"], Some(SVC), &root());
    r.expect(0);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(
        v["module"]["services"][0]["clusterIPs"],
        serde_json::json!([])
    );
}

#[test]
fn check_sarif_format() {
    let r = svc(
        &["check", "--format", "sarif", "-"],
        Some("kind: Service\n"),
        &root(),
    );
    r.expect(1);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(v["version"], "2.1.0");
    let res = &v["runs"][0]["results"][0];
    assert_eq!(res["ruleId"], "SVC006");
    assert_eq!(res["level"], "error");
    assert_eq!(
        res["locations"][0]["physicalLocation"]["region"]["startLine"],
        1
    );
}

#[test]
fn all_nodes_writes_one_file_per_node_and_family() {
    let t = TempDir::new("all");
    let out = t.path().join("out");
    let r = svc(
        &[
            "golden/cases/dual-stack-ipv6",
            "--service-cluster-ip-range",
            "10.96.0.0/12,fd00:10:96::/112",
            "--target",
            "iptables",
            "--all-nodes",
            "--out",
            out.to_str().unwrap(),
        ],
        None,
        &root(),
    );
    r.expect(0);
    assert_eq!(
        listing(&out),
        [
            "node-1.ipv4.rules",
            "node-1.ipv6.rules",
            "node-2.ipv4.rules",
            "node-2.ipv6.rules"
        ]
    );
    let one = std::fs::read_to_string(out.join("node-2.ipv6.rules")).unwrap();
    assert!(one.lines().next().unwrap().contains("node-2"), "{one}");
    // The same node compiled alone gives the same text.
    let single = svc(
        &[
            "golden/cases/dual-stack-ipv6",
            "--service-cluster-ip-range",
            "10.96.0.0/12,fd00:10:96::/112",
            "--target",
            "iptables",
            "--node",
            "node-2",
            "--family",
            "ipv6",
        ],
        None,
        &root(),
    );
    single.expect(0);
    assert_eq!(single.stdout, one);
}

#[test]
fn unknown_node_is_an_input_error() {
    let r = svc(
        &["examples/", "--target", "iptables", "--node", "nope"],
        None,
        &root(),
    );
    r.expect(1);
    assert!(r.stderr.contains("SVC401"), "{}", r.stderr);
    let with_ip = svc(
        &[
            "examples/",
            "--target",
            "iptables",
            "--node",
            "nope",
            "--node-ip",
            "172.18.0.9",
        ],
        None,
        &root(),
    );
    with_ip.expect(0);
}

#[test]
fn source_ranges_come_from_the_spec_and_a_zero_prefix_allows_everyone() {
    let lb = |extra: &str| {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: lb\n{extra}spec:\n  type: LoadBalancer\n  clusterIP: 10.96.0.50\n  ports: [{{port: 80, nodePort: 30500}}]\nstatus:\n  loadBalancer: {{ingress: [{{ip: 203.0.113.9}}]}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: lb-1, labels: {{kubernetes.io/service-name: lb}}}}\naddressType: IPv4\nports: [{{port: 80}}]\nendpoints: [{{addresses: [10.244.1.2]}}]\n"
        )
    };
    let rules = |text: &str| {
        let r = svc(
            &[
                "-",
                "--target",
                "iptables",
                "--node",
                "n",
                "--node-ip",
                "192.0.2.10",
            ],
            Some(text),
            &root(),
        );
        r.expect(0);
        r.stdout
    };
    let spec = lb("").replace(
        "  type: LoadBalancer\n",
        "  type: LoadBalancer\n  loadBalancerSourceRanges: [10.0.0.0/8]\n",
    );
    assert!(rules(&spec).contains(":KUBE-FW-"));
    let zero = spec.replace("10.0.0.0/8", "0.0.0.0/0");
    assert!(!rules(&zero).contains(":KUBE-FW-"), "{}", rules(&zero));
    let annotation = lb(
        "  annotations:\n    service.beta.kubernetes.io/load-balancer-source-ranges: 10.0.0.0/8\n",
    );
    assert!(!rules(&annotation).contains(":KUBE-FW-"));
}

#[test]
fn argument_order_changes_nothing_not_even_where_a_duplicate_is_reported() {
    let t = TempDir::new("order");
    let (a, b) = (t.path().join("a.yaml"), t.path().join("b.yaml"));
    std::fs::write(&a, SVC).unwrap();
    std::fs::write(&b, SVC.replace("port: 80", "port: 81")).unwrap();
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let ab = svc(&["check", a, b], None, &root());
    let ba = svc(&["check", b, a], None, &root());
    ab.expect(1);
    assert_eq!(ab.stdout, ba.stdout);
    assert!(ab.stdout.contains("SVC301"), "{}", ab.stdout);
    // The later file in name order is the duplicate; the earlier is "first defined here".
    let dup_at = ab.stdout.lines().find(|l| l.contains("-->")).unwrap();
    assert!(dup_at.contains("b.yaml"), "{}", ab.stdout);
    // Distinct files in either order compile to the same output.
    std::fs::write(
        t.path().join("b.yaml"),
        SVC.replace("name: web", "name: api"),
    )
    .unwrap();
    let one = svc(&["--target", "ir", a, b], None, &root());
    let two = svc(&["--target", "ir", b, a], None, &root());
    one.expect(0);
    assert_eq!(one.stdout, two.stdout);
}

#[test]
fn an_unknown_target_lists_the_registry() {
    let r = svc(&["examples/", "--target", "nope"], None, &root());
    r.expect(2);
    let names: Vec<&str> = svc_targets::TARGETS.iter().map(|t| t.name).collect();
    let first = r.stderr.lines().next().unwrap();
    assert!(
        first.starts_with("svc-compile: unknown target `nope`: use "),
        "{first}"
    );
    for n in &names {
        assert!(first.contains(&format!(" {n}")), "{n} missing: {first}");
    }
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
}

#[test]
fn help_lists_every_target_with_its_line() {
    let r = svc(&["--help"], None, &root());
    r.expect(0);
    for t in svc_targets::TARGETS {
        let line = r
            .stdout
            .lines()
            .find(|l| l.trim_start().starts_with(t.name));
        assert!(
            line.is_some_and(|l| l.ends_with(t.about)),
            "{}: {}",
            t.name,
            r.stdout
        );
    }
}

#[test]
fn completions_and_man_page() {
    for shell in ["bash", "zsh", "fish"] {
        let r = svc(&["completions", shell], None, &root());
        r.expect(0);
        // Subcommands, flags and the registry's targets are all completed.
        for word in ["apply", "node-ip", "all-nodes", "nftables-json"] {
            assert!(r.stdout.contains(word), "{shell}: no {word}");
        }
    }
    let bash = svc(&["completions", "bash"], None, &root());
    assert!(
        bash.stdout.contains("complete -F _svc_compile"),
        "{}",
        bash.stdout
    );
    let r = svc(&["completions", "tcsh"], None, &root());
    r.expect(2);
    let man = svc(&["man"], None, &root());
    man.expect(0);
    assert!(man.stdout.contains(".TH svc-compile 1"), "{}", man.stdout);
    for word in [
        ".SH \"SVC-COMPILE APPLY\"",
        "\\-\\-lock\\-timeout",
        "nftables\\-json",
    ] {
        assert!(man.stdout.contains(word), "no {word} in the man page");
    }
}

#[test]
fn the_default_command_is_compile() {
    let a = svc(
        &["examples/", "--target", "iptables", "--node", "node-a"],
        None,
        &root(),
    );
    let b = svc(
        &[
            "compile",
            "examples/",
            "--target",
            "iptables",
            "--node",
            "node-a",
        ],
        None,
        &root(),
    );
    a.expect(0);
    b.expect(0);
    assert_eq!(a.stdout, b.stdout);
    // Flags before the paths, `--` before a path that looks like a flag, `=` values.
    let c = svc(
        &["--target=iptables", "--node", "node-a", "--", "examples/"],
        None,
        &root(),
    );
    c.expect(0);
    assert_eq!(a.stdout, c.stdout);
}

/// The names in `dir`, sorted.
fn listing(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// `--target dns`: the three zones one after the other on stdout, or a file each with
/// `--out DIR` (the same texts).
#[test]
fn dns_prints_the_zones_or_writes_a_file_each() {
    let r = svc(&["examples/", "--target", "dns"], None, &root());
    r.expect(0);
    let origins: Vec<&str> = r
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("$ORIGIN "))
        .collect();
    assert_eq!(origins, ["cluster.local.", "in-addr.arpa.", "ip6.arpa."]);
    for want in [
        "my-service.default.svc.cluster.local. 5 IN A 10.0.202.231",
        "my-service.prod.svc.cluster.local. 5 IN CNAME my.database.example.com.",
        "231.202.0.10.in-addr.arpa. 5 IN PTR my-service.default.svc.cluster.local.",
    ] {
        assert!(r.stdout.lines().any(|l| l == want), "{want}: {}", r.stdout);
    }
    let t = TempDir::new("dns");
    let out = t.path().join("zones");
    let args = [
        "examples/",
        "--target",
        "dns",
        "--ttl",
        "30",
        "--cluster-domain",
        "k8s.test",
    ];
    let w = svc(
        &[&args[..], &["--out", out.to_str().unwrap()]].concat(),
        None,
        &root(),
    );
    w.expect(0);
    assert_eq!(w.stdout, "");
    assert_eq!(
        listing(&out),
        ["in-addr.arpa.zone", "ip6.arpa.zone", "k8s.test.zone"]
    );
    let printed = svc(&args, None, &root());
    printed.expect(0);
    let read = |n: &str| std::fs::read_to_string(out.join(n)).unwrap();
    assert_eq!(
        printed.stdout,
        read("k8s.test.zone") + &read("in-addr.arpa.zone") + &read("ip6.arpa.zone")
    );
    assert!(read("k8s.test.zone").contains("my-service.default.svc.k8s.test. 30 IN A 10.0.202.231"));
    let bad = svc(
        &["examples/", "--target", "dns", "--ttl", "1h"],
        None,
        &root(),
    );
    bad.expect(2);
    assert!(bad.stderr.contains("--ttl `1h`"), "{}", bad.stderr);
}

/// `--target env --namespace NS` prints NS's variables; without it, every namespace, and
/// with `--out DIR` a file each; `env-json` is JSON.
#[test]
fn env_by_namespace_and_every_namespace() {
    let r = svc(
        &["examples/", "--target", "env", "--namespace", "default"],
        None,
        &root(),
    );
    r.expect(0);
    assert!(
        r.stdout.starts_with("# namespace default\n"),
        "{}",
        r.stdout
    );
    for want in [
        "MY_SERVICE_SERVICE_HOST=10.0.202.231",
        "MY_SERVICE_PORT=tcp://10.0.202.231:80",
        "MY_MULTIPORT_SERVICE_SERVICE_PORT_HTTPS=443",
    ] {
        assert!(r.stdout.lines().any(|l| l == want), "{want}: {}", r.stdout);
    }
    let t = TempDir::new("env");
    let out = t.path().join("env");
    svc(
        &[
            "examples/",
            "--target",
            "env",
            "--out",
            out.to_str().unwrap(),
        ],
        None,
        &root(),
    )
    .expect(0);
    assert_eq!(listing(&out), ["default.env", "prod.env"]);
    assert_eq!(
        std::fs::read_to_string(out.join("default.env")).unwrap(),
        r.stdout
    );
    let json = svc(
        &[
            "examples/",
            "--target",
            "env-json",
            "--namespace",
            "default",
        ],
        None,
        &root(),
    );
    json.expect(0);
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert!(v
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["name"] == "MY_SERVICE_SERVICE_HOST" && e["value"] == "10.0.202.231"));
    let all = svc(&["examples/", "--target", "env-json"], None, &root());
    all.expect(0);
    let all: serde_json::Value = serde_json::from_str(&all.stdout).unwrap();
    assert_eq!(all["default"], v);
}

/// `--target template --template FILE`: the template rendered over the IR view; an error
/// in it is SVC501 at the template's file:line:col, exit 1.
#[test]
fn template_renders_and_its_errors_are_diagnostics() {
    let r = svc(
        &[
            "examples/",
            "--target",
            "template",
            "--template",
            "examples/templates/etc-hosts.j2",
        ],
        None,
        &root(),
    );
    r.expect(0);
    assert!(
        r.stdout
            .lines()
            .any(|l| l == "10.0.202.231\tmy-service.default.svc.cluster.local my-service.default"),
        "{}",
        r.stdout
    );
    let t = TempDir::new("template");
    let bad = t.path().join("bad.j2");
    std::fs::write(
        &bad,
        "{% for s in services %}\n{{ s.nmae }}\n{% endfor %}\n",
    )
    .unwrap();
    let e = svc(
        &[
            "examples/",
            "--target",
            "template",
            "--template",
            bad.to_str().unwrap(),
        ],
        None,
        &root(),
    );
    e.expect(1);
    assert_eq!(e.stdout, "");
    // After the inputs' warnings (examples/named-ports.yaml's topologyKeys, SVC154).
    assert!(
        e.stderr
            .contains("\nerror[SVC501]: template: undefined value"),
        "{}",
        e.stderr
    );
    assert!(
        e.stderr.contains(&format!("--> {}:2:4\n", bad.display())),
        "{}",
        e.stderr
    );
    assert!(e.stderr.contains("2 | {{ s.nmae }}"), "{}", e.stderr);
    // A template file that cannot be read: exit 2, one line.
    let missing = svc(
        &[
            "examples/",
            "--target",
            "template",
            "--template",
            "no/such.j2",
        ],
        None,
        &root(),
    );
    missing.expect(2);
    assert!(
        missing
            .stderr
            .starts_with("svc-compile: cannot read no/such.j2")
            && missing.stderr.lines().count() == 1,
        "{}",
        missing.stderr
    );
    let none = svc(&["examples/", "--target", "template"], None, &root());
    none.expect(2);
    assert!(
        none.stderr.contains("needs --template FILE"),
        "{}",
        none.stderr
    );
    // With nodes and --out, one file per node.
    let out = t.path().join("out");
    svc(
        &[
            "golden/cases/dual-stack-ipv6",
            "--service-cluster-ip-range",
            "10.96.0.0/12,fd00:10:96::/112",
            "--target",
            "template",
            "--template",
            "examples/templates/haproxy.cfg.j2",
            "--all-nodes",
            "--out",
            out.to_str().unwrap(),
        ],
        None,
        &root(),
    )
    .expect(0);
    assert_eq!(listing(&out), ["node-1.haproxy.cfg", "node-2.haproxy.cfg"]);
}

/// `--target ipvs`: the four parts under their headers, in load order; `--part` one alone,
/// exactly the text under its header.
#[test]
fn ipvs_prints_its_parts_and_one_part_alone() {
    let base = ["examples/", "--target", "ipvs", "--node", "node-a"];
    let r = svc(&base, None, &root());
    r.expect(0);
    let headers: Vec<&str> = r
        .stdout
        .lines()
        .filter(|l| l.starts_with("# ==== "))
        .collect();
    let parts = ["ipset", "ipvsadm", "addresses", "iptables"];
    assert_eq!(headers.len(), 4, "{}", r.stdout);
    for (h, p) in headers.iter().zip(parts) {
        assert!(h.starts_with(&format!("# ==== {p}: load with `")), "{h}");
        assert!(h.ends_with("(node node-a, IPv4) ===="), "{h}");
    }
    assert!(r.stdout.starts_with(headers[0]), "{}", r.stdout);
    // The bundle is each part alone, under its header.
    let mut joined = String::new();
    for (h, p) in headers.iter().zip(parts) {
        let one = svc(&[&base[..], &["--part", p]].concat(), None, &root());
        one.expect(0);
        assert!(!one.stdout.contains("# ==== "), "{}", one.stdout);
        assert!(!one.stdout.is_empty(), "{p}");
        joined += &format!("{h}\n{}", one.stdout);
    }
    assert_eq!(joined, r.stdout);
    let one = svc(&[&base[..], &["--part", "ipset"]].concat(), None, &root());
    assert!(
        one.stdout
            .starts_with("create KUBE-LOOP-BACK hash:ip,port,ip family inet"),
        "{}",
        one.stdout
    );
}

/// IPVS mode is deprecated (KEP-5495): `--target ipvs` warns once (SVC321), also when
/// the inputs say `mode: ipvs` too; another target does not.
#[test]
fn ipvs_target_warns_of_its_deprecation_once() {
    let count = |args: &[&str]| {
        let r = svc(args, None, &root());
        r.expect(0);
        r.stderr.matches("SVC321").count()
    };
    let base = ["examples/", "--node", "node-a", "--target"];
    assert_eq!(count(&[&base[..], &["ipvs"]].concat()), 1);
    assert_eq!(count(&[&base[..], &["iptables"]].concat()), 0);
    let with_mode = [
        "golden/cases/ipvs-settings",
        "golden/common/nodes.yaml",
        "--node",
        "node-1",
        "--target",
    ];
    assert_eq!(count(&[&with_mode[..], &["ipvs"]].concat()), 1);
    assert_eq!(count(&[&with_mode[..], &["nftables"]].concat()), 1);
}

/// `--part` is checked against the target's parts before anything is compiled.
#[test]
fn a_bad_part_is_a_usage_error() {
    let r = svc(
        &[
            "examples/",
            "--target",
            "ipvs",
            "--node",
            "node-a",
            "--part",
            "ipvs",
        ],
        None,
        &root(),
    );
    r.expect(2);
    assert_eq!(
        r.stderr,
        "svc-compile: --part `ipvs`: use ipset, ipvsadm, addresses or iptables\n"
    );
    for target in ["iptables", "ir"] {
        let r = svc(
            &[
                "examples/",
                "--target",
                target,
                "--node",
                "node-a",
                "--part",
                "ipset",
            ],
            None,
            &root(),
        );
        r.expect(2);
        assert_eq!(
            r.stderr,
            format!("svc-compile: --part: the output of --target {target} has no parts\n")
        );
    }
    let r = svc(
        &[
            "apply",
            "examples/",
            "--target",
            "iptables",
            "--node",
            "node-a",
            "--part",
            "ipset",
        ],
        None,
        &root(),
    );
    r.expect(2);
    assert!(
        r.stderr
            .contains("--part belongs to `svc-compile compile`, not `apply`"),
        "{}",
        r.stderr
    );
}

/// `--all-nodes --out DIR` with a target that has parts: `NODE.FAMILY.PART.EXT` for every
/// part (or `--part`'s alone), each what `--node NODE --family FAMILY --part PART` prints.
#[test]
fn ipvs_all_nodes_writes_one_file_per_part() {
    let t = TempDir::new("ipvs-all");
    let case = [
        "golden/cases/dual-stack-ipv6",
        "--service-cluster-ip-range",
        "10.96.0.0/12,fd00:10:96::/112",
        "--target",
        "ipvs",
    ];
    let out = t.path().join("out");
    let r = svc(
        &[&case[..], &["--all-nodes", "--out", out.to_str().unwrap()]].concat(),
        None,
        &root(),
    );
    r.expect(0);
    let names = listing(&out);
    let mut want = Vec::new();
    for node in ["node-1", "node-2"] {
        for fam in ["ipv4", "ipv6"] {
            for part in ["addresses", "ipset", "iptables", "ipvsadm"] {
                want.push(format!("{node}.{fam}.{part}.ipvs"));
            }
        }
    }
    assert_eq!(names, want);
    for (node, fam, part) in [
        ("node-2", "ipv6", "ipvsadm"),
        ("node-1", "ipv4", "iptables"),
        ("node-1", "ipv6", "ipset"),
    ] {
        let single = svc(
            &[
                &case[..],
                &["--node", node, "--family", fam, "--part", part],
            ]
            .concat(),
            None,
            &root(),
        );
        single.expect(0);
        let file = std::fs::read_to_string(out.join(format!("{node}.{fam}.{part}.ipvs"))).unwrap();
        assert_eq!(single.stdout, file, "{node}.{fam}.{part}");
    }
    let only = t.path().join("only");
    let r = svc(
        &[
            &case[..],
            &[
                "--all-nodes",
                "--out",
                only.to_str().unwrap(),
                "--part",
                "ipset",
            ],
        ]
        .concat(),
        None,
        &root(),
    );
    r.expect(0);
    assert_eq!(
        listing(&only),
        [
            "node-1.ipv4.ipset.ipvs",
            "node-1.ipv6.ipset.ipvs",
            "node-2.ipv4.ipset.ipvs",
            "node-2.ipv6.ipset.ipvs"
        ]
    );
}

/// `--target ebpf`: the JSON maps by default, the `cilium bpf lb list` table and the
/// bpftool batch file with `--map-format`, all three of the same entries; `--out` files
/// are what `--node` prints.
#[test]
fn ebpf_renders_maps_as_json_table_and_batch() {
    let base = ["examples/", "--target", "ebpf", "--node", "node-a"];
    let run = |extra: &[&str]| {
        let mut a = base.to_vec();
        a.extend(extra);
        let r = svc(&a, None, &root());
        r.expect(0);
        r.stdout.clone()
    };
    let json_text = run(&[]);
    assert_eq!(json_text, run(&["--map-format", "json"]));
    let json: serde_json::Value = serde_json::from_str(&json_text).expect("JSON");
    assert_eq!(json["node"], "node-a");
    let maps = json["maps"].as_array().unwrap();
    let entries = |name: &str| {
        maps.iter()
            .find(|m| m["name"] == name)
            .unwrap_or_else(|| panic!("no {name}"))["entries"]
            .as_array()
            .unwrap()
            .len()
    };
    let services = entries("cilium_lb4_services_v2");
    assert!(services > 10, "{services} service entries");
    assert!(entries("cilium_lb4_backends_v3") > 0);
    assert_eq!(
        entries("cilium_lb4_reverse_nat"),
        json["ids"]["services"].as_object().unwrap().len()
    );
    let total: usize = maps
        .iter()
        .map(|m| m["entries"].as_array().unwrap().len())
        .sum();

    let table = run(&["--map-format", "table"]);
    let mut lines = table.lines();
    let head = lines.next().unwrap();
    assert!(head.starts_with("SERVICE ADDRESS "), "{head}");
    assert!(
        head.ends_with("BACKEND ADDRESS (REVNAT_ID) (SLOT)"),
        "{head}"
    );
    assert_eq!(lines.count(), services, "{table}");

    let batch = run(&["--map-format", "batch", "--pin-dir", "/sys/fs/bpf/t"]);
    let creates = batch
        .lines()
        .filter(|l| l.starts_with("map create /sys/fs/bpf/t/"));
    assert_eq!(creates.count(), maps.len(), "{batch}");
    let updates = batch
        .lines()
        .filter(|l| l.starts_with("map update pinned /sys/fs/bpf/t/"));
    assert_eq!(updates.count(), total, "{batch}");
    assert!(batch.contains("entries 65536 "), "{batch}");
    assert!(run(&["--map-format", "batch", "--max-entries", "4096"]).contains("entries 4096 "));

    // --out: NODE.FAMILY.ebpf in the chosen format, as --node prints it.
    let t = TempDir::new("ebpf-out");
    let out = t.path().join("out");
    let mut a = base.to_vec();
    a.extend(["--map-format", "table", "--out", out.to_str().unwrap()]);
    svc(&a, None, &root()).expect(0);
    assert_eq!(
        std::fs::read_to_string(out.join("node-a.ipv4.ebpf")).unwrap(),
        table
    );
}

/// Maps too small for the node: SVC502 for each map that overflows, exit 1, nothing
/// written (stdout, and with --out no file); `--map-sizes` wins over `--max-entries`
/// for its keys.
#[test]
fn ebpf_maps_too_small_refuse_the_node() {
    let t = TempDir::new("ebpf-small");
    let out = t.path().join("out");
    for extra in [
        &["--map-sizes", "services=8,backends=4"][..],
        &["--max-entries", "4", "--map-sizes", "rev-nat=65536"][..],
        &["--map-sizes", "all=4", "--out", out.to_str().unwrap()][..],
    ] {
        let mut a = vec!["examples/", "--target", "ebpf", "--node", "node-a"];
        a.extend(extra);
        let r = svc(&a, None, &root());
        r.expect(1);
        assert!(r.stdout.is_empty(), "{}", r.stdout);
        assert!(
            r.stderr.contains("error[SVC502]: node node-a (IPv4): ")
                && r.stderr
                    .contains("entries for Cilium's cilium_lb4_services_v2 map, which holds ")
                && r.stderr.contains("--bpf-lb-service-map-max=N"),
            "{}",
            r.stderr
        );
        let rev_nat = r.stderr.contains("cilium_lb4_reverse_nat map");
        assert_eq!(
            rev_nat,
            extra[0] == "--map-sizes" && extra[1] == "all=4",
            "{}",
            r.stderr
        );
        assert!(!out.exists() || std::fs::read_dir(&out).unwrap().next().is_none());
    }
}

/// The ebpf flags' values are checked, each mistake in one line (exit 2); another
/// target does not take them.
#[test]
fn ebpf_flag_mistakes_are_one_line() {
    for (extra, want) in [
        (
            &["--map-format", "yaml"][..],
            "svc-compile: --target ebpf: --map-format `yaml`: use json, batch or table",
        ),
        (
            &["--max-entries", "0"][..],
            "svc-compile: --target ebpf: --max-entries `0`: give a number from 1 to 4294967295",
        ),
        (
            &["--pin-dir", "pins"][..],
            "svc-compile: --target ebpf: --pin-dir `pins`: give an absolute path without blanks (under a bpffs mount)",
        ),
        (
            &["--map-sizes", "services=0"][..],
            "svc-compile: --target ebpf: --map-sizes `services=0`: `services=0`: give a number from 1 to 4294967295",
        ),
        (
            &["--map-sizes", "svc=1"][..],
            "svc-compile: --target ebpf: --map-sizes `svc=1`: unknown map `svc` (use all, services, backends, rev-nat, affinity, source-ranges, maglev, sock-rev)",
        ),
    ] {
        let mut a = vec!["examples/", "--target", "ebpf", "--node", "node-a"];
        a.extend(extra);
        let r = svc(&a, None, &root());
        r.expect(2);
        // After the inputs' warnings (examples/named-ports.yaml's topologyKeys, SVC154).
        assert_eq!(r.stderr.trim_end().lines().last(), Some(want), "{}", r.stderr);
        assert!(!r.stderr.contains("error["), "{}", r.stderr);
        assert!(r.stdout.is_empty(), "{}", r.stdout);
    }
    let r = svc(
        &[
            "examples/",
            "--target",
            "iptables",
            "--node",
            "node-a",
            "--map-format",
            "json",
        ],
        None,
        &root(),
    );
    r.expect(2);
    assert!(
        r.stderr
            .starts_with("svc-compile: --map-format belongs to --target ebpf"),
        "{}",
        r.stderr
    );
}

/// `drift`'s usage errors are one line and exit 2 (1 means drift).
#[test]
fn drift_usage_errors_exit_2() {
    let cases: [(&[&str], &str); 4] = [
        (
            &["drift", "examples/", "--node", "node-a", "--target", "ir"],
            "`svc-compile drift` does not take --target ir: use iptables or nftables",
        ),
        (
            &["drift", "examples/", "--target", "iptables"],
            "drift needs --node NAME",
        ),
        (
            &[
                "drift",
                "examples/",
                "--node",
                "a",
                "--target",
                "iptables",
                "--netns",
                "x",
                "--from-saved",
                "f",
            ],
            "cannot be used with",
        ),
        (
            &[
                "drift",
                "examples/",
                "--node",
                "a",
                "--target",
                "iptables",
                "--all-nodes",
                "--out",
                "d",
            ],
            "--all-nodes belongs to `svc-compile compile`, `diff` and `migrate`, not `drift`",
        ),
    ];
    for (args, msg) in cases {
        let r = svc(args, None, &root());
        r.expect(2);
        assert!(r.stderr.contains(msg), "{args:?}: {}", r.stderr);
        assert!(r.stdout.is_empty());
    }
}

/// `-o FILE` of the node commands: a command that fails (exit 2) leaves no file, nor a
/// partial one beside it; stdout stays empty.
#[test]
fn node_commands_output_file_only_when_they_answer() {
    let t = TempDir::new("node-o");
    let file = t.0.join("report");
    let f = file.to_str().unwrap();
    let netns = "svc-compile-test-no-such-netns";
    let cases: [&[&str]; 3] = [
        &[
            "drift",
            "examples/",
            "--node",
            "node-a",
            "--target",
            "iptables",
            "--netns",
            netns,
            "-o",
            f,
        ],
        &[
            "apply",
            "examples/",
            "--node",
            "node-a",
            "--target",
            "nftables",
            "--dry-run",
            "--netns",
            netns,
            "-o",
            f,
        ],
        &[
            "cleanup",
            "--target",
            "nftables",
            "--dry-run",
            "--netns",
            netns,
            "-o",
            f,
        ],
    ];
    for args in cases {
        let r = svc(args, None, &root());
        r.expect(2);
        assert!(r.stderr.contains(netns), "{args:?}: {}", r.stderr);
        assert_eq!(r.stdout, "", "{args:?}");
        let left: Vec<_> = std::fs::read_dir(&t.0).unwrap().collect();
        assert!(left.is_empty(), "{args:?}: {left:?}");
    }
}

/// `--random-fully` and `--nfacct` (node capabilities kube-proxy detects at runtime), from
/// the flags or the ClusterConfig document; flags win.
#[test]
fn random_fully_and_nfacct_from_flags_and_cluster_config() {
    let base = [
        "golden/cases/nodeport",
        "golden/common/nodes.yaml",
        "golden/common/kube-proxy.yaml",
        "--node",
        "node-1",
        "--target",
        "iptables",
    ];
    let compile = |extra: &[&str], stdin: Option<&str>| {
        let mut args: Vec<&str> = base.to_vec();
        args.extend(extra);
        svc(&args, stdin, &root()).expect(0).stdout.clone()
    };
    const MASQ: &str = "-j MASQUERADE --random-fully\n";
    const LOCALHOST: &str = "-d 127.0.0.0/8 --dport 30080 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j KUBE-EXT-";
    const INVALID: &str =
        "--ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP";
    // Defaults: random-fully on, nfacct off.
    let default = compile(&[], None);
    assert!(default.contains(MASQ) && !default.contains("nfacct"));
    let flags = compile(&["--random-fully", "off", "--nfacct", "on"], None);
    assert!(!flags.contains("--random-fully"), "{flags}");
    assert!(
        flags.contains(LOCALHOST) && flags.contains(INVALID),
        "{flags}"
    );
    // The localhost rule comes just before the node port's general rule (kube-proxy's order).
    let lines: Vec<&str> = flags.lines().collect();
    let at = lines.iter().position(|l| l.contains(LOCALHOST)).unwrap();
    assert!(lines[at + 1].contains("--dport 30080") && !lines[at + 1].contains("127.0.0.0/8"));
    let config =
        "apiVersion: svc-compile/v1alpha1\nkind: ClusterConfig\nrandomFully: false\nnfacct: true\n";
    assert_eq!(compile(&["-"], Some(config)), flags);
    // Flags win over the document.
    let mixed = compile(
        &["-", "--random-fully", "on", "--nfacct", "off"],
        Some(config),
    );
    assert_eq!(mixed, default);
    let r = svc(&["examples/", "--nfacct", "yes"], None, &root());
    r.expect(2);
    assert!(
        r.stderr.contains("--nfacct `yes`: use on or off"),
        "{}",
        r.stderr
    );
}

/// `.pre-commit-hooks.yaml`'s hook runs: its entry with a path, as pre-commit calls it,
/// checks clean manifests (exit 0) and fails on a broken one (exit 1).
#[test]
fn the_pre_commit_hook_runs() {
    let text = std::fs::read_to_string(root().join(".pre-commit-hooks.yaml")).unwrap();
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key}"))
            .trim()
            .to_string()
    };
    let entry = field("entry:");
    let words: Vec<&str> = entry.split(' ').collect();
    assert_eq!(words[0], "svc-compile", "the entry runs our binary");
    assert_eq!(field("pass_filenames:"), "false");
    let mut args: Vec<&str> = words[1..].to_vec();
    args.push("examples/");
    svc(&args, None, &root()).expect(0);
    let dir = TempDir::new("hook");
    std::fs::write(
        dir.path().join("bad.yaml"),
        SVC.replace("port: 80", "port: 70000"),
    )
    .unwrap();
    let mut args: Vec<&str> = words[1..].to_vec();
    args.push(".");
    svc(&args, None, dir.path()).expect(1);
}

/// `--color`: escapes only when asked for (always) or on a terminal (auto); piped output
/// is the plain text, NO_COLOR or not.
#[test]
fn colour_only_when_asked_or_on_a_terminal() {
    let bad = SVC.replace("port: 80", "port: 70000");
    let run = |extra: &[&str]| {
        let mut args = vec!["check", "-"];
        args.extend(extra);
        let r = svc(&args, Some(&bad), &root());
        r.expect(1);
        r.stdout.clone()
    };
    let plain = run(&[]);
    assert!(
        plain.contains("error[") && !plain.contains('\x1b'),
        "{plain}"
    );
    assert_eq!(run(&["--color", "never"]), plain);
    assert_eq!(run(&["--color", "auto"]), plain);
    let colored = run(&["--color", "always"]);
    assert!(colored.contains("\x1b[1;31merror["), "{colored:?}");
    let r = svc(&["check", "-", "--color", "sometimes"], Some(&bad), &root());
    r.expect(2);
    assert!(
        r.stderr
            .contains("--color `sometimes`: use auto, always or never"),
        "{}",
        r.stderr
    );
}

/// `trace --format json`: the verdict as data (backends, probabilities, per-backend
/// masquerade), each step with the rules of `--target`.
#[test]
fn trace_json() {
    let base = [
        "trace",
        "golden/cases/hairpin",
        "golden/common/nodes.yaml",
        "golden/common/kube-proxy.yaml",
        "--node",
        "node-1",
        "--format",
        "json",
    ];
    let run = |extra: &[&str]| -> serde_json::Value {
        let mut a = base.to_vec();
        a.extend(extra);
        let r = svc(&a, None, &root());
        r.expect(0);
        serde_json::from_str(&r.stdout).expect("trace JSON")
    };
    // pod-a to its own service: forwarded to itself, hairpin-masqueraded.
    let v = run(&[
        "--from",
        "10.244.1.2:40000",
        "--to",
        "10.96.0.20:80",
        "--target",
        "iptables",
    ]);
    assert_eq!(v["mode"], "iptables");
    assert_eq!(v["origin"], "pod");
    assert_eq!(v["match"], "cluster-ip");
    assert_eq!(v["packet"]["to"], "10.96.0.20:80");
    let verdict = &v["verdict"];
    assert_eq!(verdict["kind"], "forward");
    assert_eq!(verdict["masquerade"], false);
    let b = verdict["backends"].as_array().unwrap();
    assert_eq!(b.len(), 1);
    assert_eq!(b[0]["addr"], "10.244.1.2:8080");
    assert_eq!(b[0]["probability"], 1.0);
    assert_eq!(b[0]["masquerade"], true, "hairpin");
    let steps = v["steps"].as_array().unwrap();
    let dnat = steps.iter().find(|s| s["rule"] == "endpoints").unwrap();
    assert!(dnat["rules"].as_array().unwrap().iter().any(|l| l
        .as_str()
        .unwrap()
        .contains("-j DNAT --to-destination 10.244.1.2:8080")));
    // Without --target, no rules; a UDP packet to the TCP-only service matches nothing.
    let v = run(&[
        "--from",
        "10.244.1.3",
        "--to",
        "10.96.0.20:80",
        "--proto",
        "udp",
    ]);
    assert_eq!(v["verdict"]["kind"], "no-match");
    assert_eq!(v["verdict"]["local"], false);
    assert!(v["steps"][0].get("rules").is_none());
    // nftables rejects a cluster IP's unknown port.
    let v = run(&[
        "--from",
        "10.244.1.3",
        "--to",
        "10.96.0.20:1",
        "--target",
        "nftables",
    ]);
    assert_eq!(v["mode"], "nftables");
    assert_eq!(v["verdict"]["kind"], "reject");
}

#[test]
fn trace_usage_errors() {
    let case = "golden/cases/hairpin";
    for (args, msg) in [
        (
            vec!["trace", case, "--node", "node-1", "--to", "10.96.0.20:80"],
            "needs --from",
        ),
        (
            vec![
                "trace",
                case,
                "--node",
                "node-1",
                "--from",
                "x",
                "--to",
                "10.96.0.20:80",
            ],
            "--from `x`",
        ),
        (
            vec!["trace", case, "--from", "10.0.0.1", "--to", "10.96.0.20:80"],
            "needs --node",
        ),
        (
            vec![
                "trace",
                case,
                "--node",
                "node-1",
                "--from",
                "10.0.0.1",
                "--to",
                "10.96.0.20",
            ],
            "--to `10.96.0.20`",
        ),
    ] {
        let r = svc(&args, None, &root());
        assert_eq!(r.code, 2, "{args:?}: {}", r.stderr);
        assert!(r.stderr.contains(msg), "{args:?}: {}", r.stderr);
    }
}

/// `--target ebpf --lock FILE --write-lock` keeps the service and backend ids in the lock
/// (per node and family), and a later compile with the lock keeps every id while a new
/// service that sorts first gets fresh ones; without the lock, ids move.
#[test]
fn ebpf_ids_are_kept_by_the_lock_file() {
    let t = TempDir::new("ebpf-lock");
    let lock = t.path().join("svc.lock.yaml");
    let l = lock.to_str().unwrap();
    let ids = |r: &crate::support::Run| -> serde_json::Value {
        r.expect(0);
        serde_json::from_str::<serde_json::Value>(&r.stdout).expect("JSON")["ids"].clone()
    };
    let base = ["--target", "ebpf", "--node", "node-a", "--lock", l];
    let mut args = vec!["examples/"];
    args.extend(base);
    args.push("--write-lock");
    let before = ids(&svc(&args, None, &root()));
    let text = std::fs::read_to_string(&lock).unwrap();
    assert!(
        text.contains("ebpf:\n- node: \"node-a\"\n  family: ipv4\n"),
        "{text}"
    );
    assert!(
        text.contains("{frontend: \"10.0.24.40:80/TCP\", id: 5}"),
        "{text}"
    );

    // A service whose cluster IP sorts before every other, with one endpoint.
    let extra = t.path().join("first.yaml");
    std::fs::write(
        &extra,
        "apiVersion: v1\nkind: Service\nmetadata: {name: first}\nspec:\n  clusterIP: 10.0.0.20\n  ports: [{port: 80}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: first-1\n  labels: {kubernetes.io/service-name: first}\naddressType: IPv4\nports: [{port: 80, protocol: TCP}]\nendpoints:\n- addresses: [\"10.244.0.1\"]\n  nodeName: node-a\n  conditions: {ready: true}\n",
    )
    .unwrap();
    let e = extra.to_str().unwrap();
    let mut args = vec!["examples/", e];
    args.extend(base);
    args.push("--write-lock");
    let kept = ids(&svc(&args, None, &root()));
    for kind in ["services", "backends"] {
        for (k, v) in before[kind].as_object().unwrap() {
            assert_eq!(&kept[kind][k], v, "{kind} {k}");
        }
    }
    assert_eq!(kept["services"]["10.0.0.20:80/TCP"], 20);
    assert_eq!(kept["backends"]["10.244.0.1:80/TCP"], 10);
    // The lock now holds the new ids too; without it the sorted assignment moves ids.
    let text = std::fs::read_to_string(&lock).unwrap();
    assert!(
        text.contains("{frontend: \"10.0.0.20:80/TCP\", id: 20}"),
        "{text}"
    );
    let fresh = ids(&svc(
        &["examples/", e, "--target", "ebpf", "--node", "node-a"],
        None,
        &root(),
    ));
    assert_eq!(fresh["services"]["10.0.0.20:80/TCP"], 5);
    assert_ne!(fresh["services"]["10.0.24.40:80/TCP"], 5);
}

/// `COMPREPLY` of bash's completion function for `words` (the last one being completed),
/// with the script `svc-compile completions bash` prints sourced, as bash-completion
/// calls it.
fn bash_completes(words: &[&str]) -> Vec<String> {
    let exe = env!("CARGO_BIN_EXE_svc-compile");
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let script = format!(
        "source <('{exe}' completions bash) || exit 3\n\
         COMP_WORDS=({words})\n\
         COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1))\n\
         COMP_LINE=\"${{COMP_WORDS[*]}}\"; COMP_POINT=${{#COMP_LINE}}\n\
         f=$(complete -p svc-compile | sed -n 's/.* -F \\([^ ]*\\) .*/\\1/p')\n\
         \"$f\" svc-compile \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"\n\
         printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        words = quoted.join(" ")
    );
    let out = std::process::Command::new("bash")
        .args(["-c", &script])
        .output()
        .expect("run bash");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

/// bash completes flags and values after a subcommand (its states once had other names
/// than the ones it switched to); zsh's and fish's scripts load.
#[test]
fn completions_work_after_a_subcommand() {
    assert_eq!(
        bash_completes(&["svc-compile", "apply", "--ta"]),
        ["--target"]
    );
    let apply: Vec<&str> = svc_targets::TARGETS
        .iter()
        .filter(|t| t.planner.is_some() || svc_node::ebpf::applies(t))
        .map(|t| t.name)
        .collect();
    assert_eq!(
        bash_completes(&["svc-compile", "apply", "--target", ""]),
        apply
    );
    assert_eq!(
        bash_completes(&["svc-compile", "check", "--exc"]),
        ["--exclude"]
    );
    assert_eq!(bash_completes(&["svc-compile", "dri"]), ["drift"]);
    let exe = env!("CARGO_BIN_EXE_svc-compile");
    for (shell, script) in [
        (
            "zsh",
            format!("autoload -U compinit; compinit -u; source <('{exe}' completions zsh)"),
        ),
        ("fish", format!("'{exe}' completions fish | source")),
    ] {
        let out = std::process::Command::new(shell)
            .args(["-c", &script])
            .env("HOME", std::env::temp_dir())
            .output()
            .unwrap_or_else(|e| panic!("{shell} is not installed (.ci/run installs it): {e}"));
        assert!(out.status.success(), "{shell}: {out:?}");
        assert!(out.stderr.is_empty(), "{shell}: {out:?}");
    }
}

/// `svc-compile help CMD` is `svc-compile CMD --help`.
#[test]
fn help_takes_a_subcommand() {
    for sub in ["check", "apply", "trace", "diff"] {
        let help = svc(&["help", sub], None, &root());
        help.expect(0);
        let flag = svc(&[sub, "--help"], None, &root());
        assert_eq!(help.stdout, flag.stdout, "{sub}");
    }
}

/// Each subcommand's help: the targets it takes, its own exit codes.
#[test]
fn help_shows_what_applies() {
    let apply = svc(&["apply", "--help"], None, &root());
    apply.expect(0);
    assert!(!apply.stdout.contains("[default: ir]"), "{}", apply.stdout);
    for t in svc_targets::TARGETS {
        let takes = t.planner.is_some() || svc_node::ebpf::applies(t);
        let line = format!("  {} ", t.name);
        let listed = apply.stdout.lines().any(|l| l.starts_with(&line));
        assert_eq!(listed, takes, "{}: {}", t.name, apply.stdout);
    }
    let drift = svc(&["drift", "--help"], None, &root());
    drift.expect(0);
    for t in svc_targets::TARGETS {
        let takes = t.planner.is_some_and(|p| p.drift());
        let listed = drift
            .stdout
            .lines()
            .any(|l| l.starts_with(&format!("  {} ", t.name)));
        assert_eq!(listed, takes, "{}: {}", t.name, drift.stdout);
    }
    for want in ["  0  no drift", "  1  drift", "input errors"] {
        let text = drift.stdout.replace("errors in the input", "input errors");
        assert!(text.contains(want), "{want}: {}", drift.stdout);
    }
    assert!(!drift.stdout.contains("--all-nodes"), "{}", drift.stdout);
    let check = svc(&["check", "--help"], None, &root());
    assert!(!check.stdout.contains("--target"), "{}", check.stdout);
    assert!(!check.stdout.contains("drift"), "{}", check.stdout);
}

/// `cleanup`: the targets apply takes, its own exit codes, and one line for each mistake
/// (all refused before root is asked for, so they hold for any user).
#[test]
fn cleanup_command_line() {
    let help = svc(&["cleanup", "--help"], None, &root());
    help.expect(0);
    for t in svc_targets::TARGETS {
        let takes = t.planner.is_some() || svc_node::ebpf::applies(t);
        let listed = help
            .stdout
            .lines()
            .any(|l| l.starts_with(&format!("  {} ", t.name)));
        assert_eq!(listed, takes, "{}: {}", t.name, help.stdout);
    }
    for want in [
        "  0  removed, or nothing of ours there",
        "  2  usage, I/O or cleanup failure",
    ] {
        assert!(help.stdout.contains(want), "{want}: {}", help.stdout);
    }
    assert!(!help.stdout.contains("  1  "), "{}", help.stdout);
    let one_line = |args: &[&str], want: &str| {
        let r = svc(args, None, &root());
        r.expect(2);
        assert_eq!(r.stderr, format!("svc-compile: {want}\n"), "{args:?}");
        assert_eq!(r.stdout, "", "{args:?}");
    };
    one_line(
        &["cleanup"],
        "cleanup needs --target iptables, --target nftables, --target ipvs or --target ebpf",
    );
    one_line(
        &["cleanup", "--target", "dns"],
        "`svc-compile cleanup` does not take --target dns: use iptables, nftables, ipvs or ebpf",
    );
    one_line(
        &["cleanup", "--target", "ipvs"],
        "cleanup --target ipvs is not yet supported (it is for --target iptables, nftables and ebpf); remove its state by hand",
    );
    one_line(
        &[
            "cleanup",
            "--target",
            "nftables",
            "--cgroup",
            "/sys/fs/cgroup",
        ],
        "--cgroup is for cleanup --target ebpf",
    );
    one_line(
        &["cleanup", "--target", "iptables", "--lock-timeout", "soon"],
        "--lock-timeout `soon`: give seconds, e.g. 30",
    );
    one_line(
        &["cleanup", "--target", "iptables", "examples/"],
        "unexpected argument `examples/`",
    );
    one_line(
        &["cleanup", "--target", "iptables", "--node", "node-a"],
        "--node belongs to `svc-compile compile`, `apply`, `agent`, `drift`, `trace`, `diff` and `migrate`, not `cleanup`",
    );
    // SAFETY: geteuid cannot fail.
    let want = match unsafe { svc_node::sys::libc::geteuid() } {
        0 => "no network namespace `svc-compile-no-such-ns` (see `ip netns list`)",
        _ => "cleanup needs root: it reads and changes the node's packet filter rules (run it as root, or in a privileged pod with hostNetwork)",
    };
    one_line(
        &[
            "cleanup",
            "--target",
            "iptables",
            "--netns",
            "svc-compile-no-such-ns",
        ],
        want,
    );
}

/// Another subcommand's flag is refused, naming where it belongs; a misspelt flag gets
/// the one meant.
#[test]
fn flags_belong_to_their_subcommand_and_typos_are_named() {
    let one_line = |args: &[&str], want: &str| {
        let r = svc(args, None, &root());
        r.expect(2);
        assert_eq!(r.stderr, format!("svc-compile: {want}\n"), "{args:?}");
    };
    one_line(
        &["check", "examples/", "--node", "x"],
        "--node belongs to `svc-compile compile`, `apply`, `agent`, `drift`, `trace`, `diff` and `migrate`, not `check`",
    );
    one_line(
        &["check", "examples/", "--out", "x"],
        "--out belongs to `svc-compile compile`, not `check`",
    );
    one_line(
        &["check", "examples/", "--target", "iptables"],
        "--target belongs to `svc-compile compile`, `apply`, `agent`, `cleanup`, `drift`, `trace` and `diff`, not `check`",
    );
    one_line(
        &["trace", "examples/", "--dry-run"],
        "--dry-run belongs to `svc-compile apply` and `cleanup`, not `trace`",
    );
    one_line(
        &["check", "examples/", "--fromat", "json"],
        "unknown flag `--fromat`: did you mean `--format`?",
    );
    one_line(
        &["examples/", "--nod", "node-a"],
        "unknown flag `--nod`: did you mean `--node`?",
    );
    one_line(
        &["check", "examples/", "--dry-rn"],
        "unknown flag `--dry-rn`: did you mean `--dry-run`? (--dry-run belongs to `svc-compile apply` and `cleanup`, not `check`)",
    );
    one_line(
        &["examples/", "--frobnicate"],
        "unknown flag `--frobnicate` (see `svc-compile compile --help`)",
    );
}

/// `trace`: a packet has one family (a usage error otherwise), and an IPv6 destination
/// prints in brackets before its port.
#[test]
fn trace_packets_have_one_family_and_ipv6_in_brackets() {
    let base = [
        "trace",
        "golden/cases/dual-stack-ipv6",
        "--service-cluster-ip-range",
        "10.96.0.0/12,fd00:10:96::/112",
        "--node",
        "node-1",
    ];
    let run = |extra: &[&str]| svc(&[&base[..], extra].concat(), None, &root());
    let r = run(&["--from", "10.244.1.1", "--to", "[fd00::10]:80"]);
    r.expect(2);
    assert_eq!(
        r.stderr,
        "svc-compile: --from `10.244.1.1` is IPv4 and --to `[fd00::10]:80` is IPv6: a packet has one family\n"
    );
    assert!(r.stdout.is_empty());
    let r = run(&["--from", "fd00:10:244::5", "--to", "[fd00::10]:80"]);
    r.expect(0);
    let first = r.stdout.lines().next().unwrap();
    assert!(
        first.contains("fd00:10:244::5 -> [fd00::10]:80/tcp on node-1"),
        "{first}"
    );
    let t = TempDir::new("flows");
    let flows = t.path().join("mixed.flows");
    std::fs::write(&flows, "10.244.1.1 10.96.0.1:80\nfd00::1 10.96.0.1:80\n").unwrap();
    let r = run(&["--flows", flows.to_str().unwrap()]);
    r.expect(2);
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    assert!(
        r.stderr.contains("mixed.flows:2: --from `fd00::1` is IPv6"),
        "{}",
        r.stderr
    );
}

/// `trace --color always` colours its diagnostics as every other command does.
#[test]
fn trace_diagnostics_are_coloured_like_the_others() {
    let args = [
        "trace",
        "-",
        "--node",
        "n",
        "--node-ip",
        "192.0.2.1",
        "--from",
        "10.0.0.1",
        "--to",
        "10.96.0.1:80",
        "--color",
        "always",
    ];
    let r = svc(&args, Some("kind: Service\n"), &root());
    r.expect(1);
    assert!(r.stderr.contains("\x1b[1;31merror["), "{:?}", r.stderr);
    let compile = svc(
        &["-", "--color", "always"],
        Some("kind: Service\n"),
        &root(),
    );
    compile.expect(1);
    assert_eq!(r.stderr, compile.stderr);
}

/// `--cluster-domain` is RFC 1123 labels (a trailing dot is dropped): anything else is a
/// usage error before anything is written.
#[test]
fn the_cluster_domain_is_checked() {
    for bad in ["foo..bar", "a-.b", "a_b.c", "Cluster.local", "."] {
        let r = svc(
            &["examples/", "--target", "dns", "--cluster-domain", bad],
            None,
            &root(),
        );
        r.expect(2);
        assert!(r.stdout.is_empty(), "{bad}: {}", r.stdout);
        assert_eq!(r.stderr.lines().count(), 1, "{bad}: {}", r.stderr);
        assert!(
            r.stderr
                .starts_with(&format!("svc-compile: --cluster-domain `{bad}`: ")),
            "{}",
            r.stderr
        );
    }
    let long = ["a"; 127].join(".") + ".bc";
    let r = svc(
        &["check", "examples/", "--cluster-domain", &long],
        None,
        &root(),
    );
    r.expect(2);
    assert!(r.stderr.contains("at most 253"), "{}", r.stderr);
    let dotted = svc(
        &[
            "examples/",
            "--target",
            "dns",
            "--cluster-domain",
            "k8s.test.",
        ],
        None,
        &root(),
    );
    dotted.expect(0);
    assert!(
        dotted.stdout.lines().any(|l| l == "$ORIGIN k8s.test."),
        "{}",
        dotted.stdout
    );
}

/// `check --format github`: one workflow command per diagnostic, with the span's end and
/// the code as title, data escaped as the runner reads it; `-o FILE` writes any format's
/// report to FILE and nothing to stdout.
#[test]
fn check_writes_github_annotations_and_reports_to_a_file() {
    let two = [
        "golden/errors/14-port-out-of-range.yaml",
        "golden/errors/91-endpointslice-v1beta1.yaml",
    ];
    let mut args = vec!["check", "--format", "github"];
    args.extend(two);
    let r = svc(&args, None, &root());
    r.expect(1);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", r.stdout);
    assert_eq!(
        lines[0],
        "::error file=golden/errors/14-port-out-of-range.yaml,line=11,col=11,endLine=11,endColumn=16,title=SVC110::port 80800 is out of range: must be between 1 and 65535"
    );
    assert!(
        lines[2].starts_with("::warning file=golden/errors/91-endpointslice-v1beta1.yaml,line=13,"),
        "{}",
        lines[2]
    );
    // A hint follows on a line of its own, escaped (the runner turns %0A into a newline).
    assert!(
        lines[2].contains("%0Ahelp: use discovery.k8s.io/v1"),
        "{}",
        lines[2]
    );

    let dir = TempDir::new("check-report");
    for format in ["text", "json", "sarif", "github"] {
        let file = dir.path().join(format!("report.{format}"));
        let f = file.to_str().unwrap();
        let mut args = vec!["check", "--format", format, "-o", f];
        args.extend(two);
        let r = svc(&args, None, &root());
        r.expect(1);
        assert_eq!(r.stdout, "", "[{format}] nothing on stdout");
        let written = std::fs::read_to_string(&file).unwrap();
        assert!(written.contains("SVC110"), "[{format}] {written}");
        // The same report as on stdout.
        let mut plain = vec!["check", "--format", format, "--color", "never"];
        plain.extend(two);
        assert_eq!(written, svc(&plain, None, &root()).stdout, "[{format}]");
    }
}

/// `--topology-keys honour|ignore` and ClusterConfig `topologyKeys`: flag over document
/// over the default (honour); `ignore` compiles as a current kube-proxy, which never read
/// the field after Kubernetes 1.22; a bad document value is SVC322.
#[test]
fn topology_keys_from_flag_and_cluster_config() {
    let compile = |extra: &[&str], stdin: Option<&str>| {
        let mut args = vec![
            "golden/cases/topology-keys",
            "golden/common/nodes.yaml",
            "golden/common/kube-proxy.yaml",
            "--node",
            "node-1",
            "--target",
            "iptables",
        ];
        args.extend(extra);
        let r = svc(&args, stdin, &root());
        r.expect(0);
        // The field's warning, whatever is done with it.
        assert!(r.stderr.contains("SVC154"), "{}", r.stderr);
        r.stdout.clone()
    };
    let honour = compile(&[], None);
    // node-1 has a local endpoint: the hostname key keeps only it.
    assert!(!honour.contains("10.244.2.2"), "{honour}");
    assert_eq!(compile(&["--topology-keys", "honour"], None), honour);
    let ignore = compile(&["--topology-keys", "ignore"], None);
    assert!(ignore.contains("10.244.2.2"), "{ignore}");
    let doc = "apiVersion: svc-compile/v1alpha1\nkind: ClusterConfig\ntopologyKeys: ignore\n";
    assert_eq!(compile(&["-"], Some(doc)), ignore);
    assert_eq!(
        compile(&["-", "--topology-keys", "honour"], Some(doc)),
        honour
    );
    let bad = "apiVersion: svc-compile/v1alpha1\nkind: ClusterConfig\ntopologyKeys: skip\n";
    let r = svc(&["check", "-"], Some(bad), &root());
    r.expect(1);
    assert!(
        r.stdout.contains("SVC322") || r.stderr.contains("SVC322"),
        "{}{}",
        r.stdout,
        r.stderr
    );
}

/// examples/agent: the systemd unit passes `systemd-analyze verify`, and the unit's and the
/// DaemonSet's command lines are agent command lines svc-compile takes (run with a network
/// namespace that does not exist, each stops there: exit 2, one line, not a usage error).
#[test]
fn the_agents_unit_and_daemonset_run_as_written() {
    let dir = root().join("examples/agent");
    let unit = std::fs::read_to_string(dir.join("svc-compile-agent.service")).unwrap();
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("ExecStart");
    let unit_args: Vec<String> = exec
        .split_whitespace()
        .skip(1)
        .map(|a| a.replace("%H", "node-a"))
        .collect();
    let ds = std::fs::read_to_string(dir.join("daemonset.yaml")).unwrap();
    let command: Vec<String> = ds
        .lines()
        .skip_while(|l| l.trim() != "command:")
        .skip(1)
        .take_while(|l| l.trim_start().starts_with("- "))
        .map(|l| l.trim_start()[2..].replace("$(NODE_NAME)", "node-a"))
        .collect();
    assert_eq!(command[0], "/usr/local/bin/svc-compile", "{command:?}");
    let missing = format!("svc-compile-test-none-{}", std::process::id());
    for (what, args) in [("unit", unit_args), ("DaemonSet", command[1..].to_vec())] {
        let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
        args.extend(["--netns", &missing]);
        let r = svc(&args, None, &root());
        assert_eq!(r.code, 2, "{what}: {}{}", r.stdout, r.stderr);
        assert_eq!(r.stderr.lines().count(), 1, "{what}: {}", r.stderr);
        assert!(
            r.stderr.contains(&missing) || r.stderr.contains("needs root"),
            "{what}: {}",
            r.stderr
        );
    }
    // The unit as systemd reads it, pointed at this build (.ci/run installs systemd).
    let tmp = TempDir::new("unit");
    let path = tmp.path().join("svc-compile-agent.service");
    std::fs::write(
        &path,
        unit.replace(
            "/usr/local/bin/svc-compile",
            env!("CARGO_BIN_EXE_svc-compile"),
        ),
    )
    .unwrap();
    let out = std::process::Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("systemd-analyze is not installed (.ci/run installs it): {e}"));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "systemd-analyze verify: {said}");
    assert!(
        !said.contains("svc-compile-agent.service"),
        "systemd-analyze verify has something to say about the unit: {said}"
    );
}

/// `svc-compile migrate`: exit 1 with differences, 0 without, 2 for usage errors and for
/// input errors (as diff and drift: 1 must mean differences); the three formats carry the
/// same differences; `-o FILE` writes the report there.
#[test]
fn migrate_exit_codes_and_formats() {
    let base = [
        "migrate",
        "golden/migrate/inputs/mixed.yaml",
        "golden/common/nodes.yaml",
        "golden/common/kube-proxy.yaml",
        "--node",
        "node-1",
    ];
    let with = |extra: &[&str]| {
        let mut a = base.to_vec();
        a.extend(extra);
        svc(&a, None, &root())
    };
    // Differences: exit 1, in every format.
    let text = with(&["--from", "iptables", "--to", "nftables"]);
    text.expect(1);
    assert!(
        text.stdout
            .starts_with("svc-compile migrate: iptables -> nftables\n"),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout.contains("why (localhost-node-port):"),
        "{}",
        text.stdout
    );
    let json = with(&["--from", "iptables", "--to", "nftables", "--format", "json"]);
    json.expect(1);
    let v: serde_json::Value = serde_json::from_str(&json.stdout).expect("JSON");
    assert_eq!(v["from"], "iptables");
    assert_eq!(v["to"], "nftables");
    let diffs = v["nodes"][0]["differences"]
        .as_array()
        .expect("differences");
    assert!(!diffs.is_empty());
    for d in diffs {
        assert!(!d["why"].as_array().unwrap().is_empty(), "{d}");
        assert_ne!(d["before"], d["after"], "{d}");
    }
    let md = with(&[
        "--from", "iptables", "--to", "nftables", "--format", "markdown",
    ]);
    md.expect(1);
    assert!(
        md.stdout
            .starts_with("### svc-compile migrate: `iptables` → `nftables`"),
        "{}",
        md.stdout
    );
    // One table row per difference.
    assert_eq!(
        md.stdout.lines().filter(|l| l.starts_with("| `")).count(),
        diffs.len()
    );
    // No difference: exit 0.
    let same = with(&["--from", "ipvs", "--to", "ipvs"]);
    same.expect(0);
    assert!(same.stdout.contains("no difference in"), "{}", same.stdout);
    // -o FILE: the report there, nothing on stdout.
    let t = TempDir::new("migrate-o");
    let out = t.path().join("report.md");
    let r = with(&[
        "--from",
        "iptables",
        "--to",
        "ipvs",
        "--format",
        "markdown",
        "-o",
        out.to_str().unwrap(),
    ]);
    r.expect(1);
    assert!(r.stdout.is_empty(), "{}", r.stdout);
    let written = std::fs::read_to_string(&out).unwrap();
    assert!(written.contains("local-fallback"), "{written}");
    // Usage errors: 2.
    for (args, msg) in [
        (vec!["--to", "nftables"], "needs --from"),
        (vec!["--from", "iptables"], "needs --to"),
        (
            vec!["--from", "userspace", "--to", "nftables"],
            "--from `userspace`",
        ),
        (
            vec!["--from", "iptables", "--to", "nftables", "--target", "ipvs"],
            "not --target",
        ),
        (
            vec![
                "--from", "iptables", "--to", "nftables", "--format", "sarif",
            ],
            "--format `sarif`",
        ),
        (
            vec!["--from", "iptables", "--to", "nftables", "--local-ip", "x"],
            "--local-ip `x`",
        ),
    ] {
        let r = with(&args);
        assert_eq!(r.code, 2, "{args:?}: {}", r.stderr);
        assert!(r.stderr.contains(msg), "{args:?}: {}", r.stderr);
    }
    let r = svc(
        &[
            "migrate",
            "golden/migrate/inputs/mixed.yaml",
            "--from",
            "iptables",
            "--to",
            "ipvs",
        ],
        None,
        &root(),
    );
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr.contains("--node NAME or --all-nodes"),
        "{}",
        r.stderr
    );
    let r = svc(
        &[
            "migrate", "-", "--node", "node-1", "--from", "iptables", "--to", "ipvs",
        ],
        Some("apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {ports: [{port: 0}]}\n"),
        &root(),
    );
    assert_eq!(
        r.code, 2,
        "input errors are 2 where 1 means differences: {}",
        r.stderr
    );
    assert!(r.stderr.contains("error["), "{}", r.stderr);
    // --all-nodes: one section per node.
    let all = svc(
        &[
            "migrate",
            "golden/migrate/inputs/mixed.yaml",
            "golden/common/nodes.yaml",
            "golden/common/kube-proxy.yaml",
            "--all-nodes",
            "--from",
            "nftables",
            "--to",
            "ebpf",
            "--format",
            "json",
        ],
        None,
        &root(),
    );
    all.expect(1);
    let v: serde_json::Value = serde_json::from_str(&all.stdout).expect("JSON");
    let nodes: Vec<&str> = v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["node"].as_str().unwrap())
        .collect();
    assert_eq!(nodes, ["node-1", "node-2"]);
}

/// action.yml's step (`action/run.sh`) in a git repository of two, then three commits:
/// annotations on stdout, the check and the diff in the job summary, exit 0 with a change
/// and 1 once the manifests have an error.
#[test]
fn the_github_actions_script_checks_diffs_and_writes_the_summary() {
    let action = std::fs::read_to_string(root().join("action.yml")).unwrap();
    assert!(action.contains("action/run.sh"), "{action}");
    let (docs, diags) = svc_compiler::tree::parse_file(svc_compiler::source::FileId(0), &action);
    assert!(
        diags.items.is_empty() && docs.len() == 1,
        "action.yml: {diags:?}"
    );
    let repo = TempDir::new("action");
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "-c",
                "commit.gpgsign=false",
            ])
            .args(args)
            .current_dir(repo.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let m = repo.path().join("m");
    std::fs::create_dir(&m).unwrap();
    for f in ["my-service.yaml", "nodes.yaml"] {
        std::fs::copy(root().join("examples").join(f), m.join(f)).unwrap();
    }
    git(&["init", "-q"]);
    git(&["add", "."]);
    git(&["commit", "-qm", "one"]);
    let base = git(&["rev-parse", "HEAD"]);
    let svc = std::fs::read_to_string(m.join("my-service.yaml")).unwrap();
    std::fs::write(
        m.join("my-service.yaml"),
        svc.replacen("port: 80", "port: 8081", 1),
    )
    .unwrap();
    git(&["commit", "-qam", "two"]);
    let run = |summary: &std::path::Path| {
        std::process::Command::new("bash")
            .arg(root().join("action/run.sh"))
            .current_dir(repo.path())
            .env("SVC_COMPILE", env!("CARGO_BIN_EXE_svc-compile"))
            .env("INPUT_PATHS", "m")
            .env("INPUT_BASE", &base)
            .env("GITHUB_STEP_SUMMARY", summary)
            .output()
            .unwrap()
    };
    let summary = repo.path().join("summary.md");
    let out = run(&summary);
    let said = std::fs::read_to_string(&summary).unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}\n{said}");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("::error"),
        "{out:?}"
    );
    assert!(
        said.contains("## svc-compile check\n\nNo errors."),
        "{said}"
    );
    assert!(said.contains("## svc-compile diff m ("), "{said}");
    assert!(
        said.contains("8081"),
        "the diff does not show the new port: {said}"
    );

    std::fs::write(m.join("broken.yaml"), "kind: Service\nmetadata: {name: [\n").unwrap();
    git(&["add", "."]);
    git(&["commit", "-qm", "three"]);
    let summary = repo.path().join("summary2.md");
    let out = run(&summary);
    let said = std::fs::read_to_string(&summary).unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}\n{said}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("::error file=m/broken.yaml"),
        "{out:?}"
    );
    assert!(said.contains("**Errors**"), "{said}");
}
