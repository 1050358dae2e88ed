//! Cases rebuilt from kubelet's own tests: `pkg/kubelet/envvars/envvars_test.go`
//! (TestFromServices) and `pkg/kubelet/kubelet_pods_test.go` (TestMakeEnvironmentVariables),
//! as manifests, expecting the same variables (sorted by name, as those tests compare).

use super::*;
use crate::testing::module;

const CLUSTER: &str = "apiVersion: svc-compile/v1alpha1\nkind: ClusterConfig\nserviceClusterIPRange: 0.0.0.0/4,2001::/16\n";

fn svc(ns: &str, name: &str, cluster_ip: &str, ports: &str) -> String {
    format!("---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  selector: {{bar: baz}}\n  clusterIP: \"{cluster_ip}\"\n  ports: {ports}\n")
}

fn sorted(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    v.sort();
    v
}

#[test]
fn from_services_like_kubelet() {
    let y = [
        CLUSTER.to_string(),
        svc("default", "foo-bar", "1.2.3.4", "[{port: 8080, protocol: TCP}]"),
        svc(
            "default",
            "abc-123",
            "5.6.7.8",
            "[{name: u-d-p, port: 8081, protocol: UDP}, {name: t-c-p, port: 8081, protocol: TCP}]",
        ),
        // kubelet's test leaves the first port unnamed and names the second "8083";
        // today's API wants every port of a multi-port service named, with a letter:
        // "p8082" and "p8083" (one more variable, the same mangling).
        svc(
            "default",
            "q-u-u-x",
            "9.8.7.6",
            "[{name: p8082, port: 8082, protocol: TCP}, {name: p8083, port: 8083, protocol: TCP}]",
        ),
        svc("default", "svrc-clusterip-none", "None", "[{port: 8082, protocol: TCP}]"),
        svc(
            "default",
            "super-ipv6",
            "2001:db8::",
            "[{name: u-d-p, port: 8084, protocol: UDP}, {name: t-c-p, port: 8084, protocol: TCP}]",
        )
        .replace("  selector", "  ipFamilies: [IPv6]\n  selector"),
        svc("default", "sctp-1", "1.2.3.4", "[{port: 777, protocol: SCTP}]")
            .replace("1.2.3.4", "1.2.3.5"),
        // ExternalName: no cluster IP, no variables.
        "---\napiVersion: v1\nkind: Service\nmetadata: {name: ext}\nspec: {type: ExternalName, externalName: example.com}\n".into(),
    ]
    .concat();
    let m = module(&y);
    let got = variables(&m, "default", &Options::default());
    let want = sorted(&[
        ("FOO_BAR_SERVICE_HOST", "1.2.3.4"),
        ("FOO_BAR_SERVICE_PORT", "8080"),
        ("FOO_BAR_PORT", "tcp://1.2.3.4:8080"),
        ("FOO_BAR_PORT_8080_TCP", "tcp://1.2.3.4:8080"),
        ("FOO_BAR_PORT_8080_TCP_PROTO", "tcp"),
        ("FOO_BAR_PORT_8080_TCP_PORT", "8080"),
        ("FOO_BAR_PORT_8080_TCP_ADDR", "1.2.3.4"),
        ("ABC_123_SERVICE_HOST", "5.6.7.8"),
        ("ABC_123_SERVICE_PORT", "8081"),
        ("ABC_123_SERVICE_PORT_U_D_P", "8081"),
        ("ABC_123_SERVICE_PORT_T_C_P", "8081"),
        ("ABC_123_PORT", "udp://5.6.7.8:8081"),
        ("ABC_123_PORT_8081_UDP", "udp://5.6.7.8:8081"),
        ("ABC_123_PORT_8081_UDP_PROTO", "udp"),
        ("ABC_123_PORT_8081_UDP_PORT", "8081"),
        ("ABC_123_PORT_8081_UDP_ADDR", "5.6.7.8"),
        ("ABC_123_PORT_8081_TCP", "tcp://5.6.7.8:8081"),
        ("ABC_123_PORT_8081_TCP_PROTO", "tcp"),
        ("ABC_123_PORT_8081_TCP_PORT", "8081"),
        ("ABC_123_PORT_8081_TCP_ADDR", "5.6.7.8"),
        ("Q_U_U_X_SERVICE_HOST", "9.8.7.6"),
        ("Q_U_U_X_SERVICE_PORT", "8082"),
        ("Q_U_U_X_SERVICE_PORT_P8082", "8082"),
        ("Q_U_U_X_SERVICE_PORT_P8083", "8083"),
        ("Q_U_U_X_PORT", "tcp://9.8.7.6:8082"),
        ("Q_U_U_X_PORT_8082_TCP", "tcp://9.8.7.6:8082"),
        ("Q_U_U_X_PORT_8082_TCP_PROTO", "tcp"),
        ("Q_U_U_X_PORT_8082_TCP_PORT", "8082"),
        ("Q_U_U_X_PORT_8082_TCP_ADDR", "9.8.7.6"),
        ("Q_U_U_X_PORT_8083_TCP", "tcp://9.8.7.6:8083"),
        ("Q_U_U_X_PORT_8083_TCP_PROTO", "tcp"),
        ("Q_U_U_X_PORT_8083_TCP_PORT", "8083"),
        ("Q_U_U_X_PORT_8083_TCP_ADDR", "9.8.7.6"),
        // kubelet writes the IP as the API holds it; the IR holds the canonical form.
        ("SUPER_IPV6_SERVICE_HOST", "2001:db8::"),
        ("SUPER_IPV6_SERVICE_PORT", "8084"),
        ("SUPER_IPV6_SERVICE_PORT_U_D_P", "8084"),
        ("SUPER_IPV6_SERVICE_PORT_T_C_P", "8084"),
        ("SUPER_IPV6_PORT", "udp://[2001:db8::]:8084"),
        ("SUPER_IPV6_PORT_8084_UDP", "udp://[2001:db8::]:8084"),
        ("SUPER_IPV6_PORT_8084_UDP_PROTO", "udp"),
        ("SUPER_IPV6_PORT_8084_UDP_PORT", "8084"),
        ("SUPER_IPV6_PORT_8084_UDP_ADDR", "2001:db8::"),
        ("SUPER_IPV6_PORT_8084_TCP", "tcp://[2001:db8::]:8084"),
        ("SUPER_IPV6_PORT_8084_TCP_PROTO", "tcp"),
        ("SUPER_IPV6_PORT_8084_TCP_PORT", "8084"),
        ("SUPER_IPV6_PORT_8084_TCP_ADDR", "2001:db8::"),
        ("SCTP_1_SERVICE_HOST", "1.2.3.5"),
        ("SCTP_1_SERVICE_PORT", "777"),
        ("SCTP_1_PORT", "sctp://1.2.3.5:777"),
        ("SCTP_1_PORT_777_SCTP", "sctp://1.2.3.5:777"),
        ("SCTP_1_PORT_777_SCTP_PROTO", "sctp"),
        ("SCTP_1_PORT_777_SCTP_PORT", "777"),
        ("SCTP_1_PORT_777_SCTP_ADDR", "1.2.3.5"),
    ]);
    assert_eq!(got, want);
}

/// The Docker-link and service variables of one single-port TCP service.
fn one(prefix: &str, ip: &str, port: &str) -> Vec<(String, String)> {
    let url = format!("tcp://{ip}:{port}");
    [
        ("_SERVICE_HOST", ip),
        ("_SERVICE_PORT", port),
        ("_PORT", &url),
        (&format!("_PORT_{port}_TCP"), &url),
        (&format!("_PORT_{port}_TCP_PROTO"), "tcp"),
        (&format!("_PORT_{port}_TCP_PORT"), port),
        (&format!("_PORT_{port}_TCP_ADDR"), ip),
    ]
    .iter()
    .map(|(k, v)| (format!("{prefix}{k}"), v.to_string()))
    .collect()
}

#[test]
fn make_environment_variables_like_kubelet() {
    // TestMakeEnvironmentVariables' services (the duplicates with clusterIP None and ""
    // are other objects of the same name there; here one name is one object, and the
    // headless and unallocated ones are separate services that must give nothing).
    let y = [
        CLUSTER.to_string(),
        svc("default", "kubernetes", "1.2.3.1", "[{port: 8081}]"),
        svc("test1", "test", "1.2.3.3", "[{port: 8083}]"),
        svc("test2", "kubernetes", "1.2.3.4", "[{port: 8084}]"),
        svc("test2", "test", "1.2.3.5", "[{port: 8085}]"),
        svc("test2", "test-none", "None", "[{port: 8085}]"),
        svc("kubernetes", "kubernetes", "1.2.3.6", "[{port: 8086}]"),
        svc("kubernetes", "not-special", "1.2.3.8", "[{port: 8088}]"),
        svc("default", "not-special", "1.2.3.9", "[{port: 8088}]"),
    ]
    .concat();
    let m = module(&y);
    let links = |on: bool| Options {
        enable_service_links: on,
    };
    let cat = |parts: Vec<Vec<(String, String)>>| {
        let mut v: Vec<(String, String)> = parts.concat();
        v.sort();
        v
    };
    let master = one("KUBERNETES", "1.2.3.1", "8081");
    // "api server = N; kubelet = Y": links off, only the master service.
    assert_eq!(
        variables(&m, "test1", &links(false)),
        cat(vec![master.clone()])
    );
    // "... service env vars": links on, the namespace's services too.
    assert_eq!(
        variables(&m, "test1", &links(true)),
        cat(vec![one("TEST", "1.2.3.3", "8083"), master.clone()])
    );
    // "master service in pod ns": links off keeps default/kubernetes.
    assert_eq!(
        variables(&m, "test2", &links(false)),
        cat(vec![master.clone()])
    );
    // "master service in pod ns, service env vars": the namespace's kubernetes wins.
    assert_eq!(
        variables(&m, "test2", &links(true)),
        cat(vec![
            one("TEST", "1.2.3.5", "8085"),
            one("KUBERNETES", "1.2.3.4", "8084"),
        ])
    );
    // "pod in master service ns": links off, only kubernetes.
    assert_eq!(
        variables(&m, "default", &links(false)),
        cat(vec![master.clone()])
    );
    // "pod in master service ns, service env vars".
    assert_eq!(
        variables(&m, "default", &links(true)),
        cat(vec![one("NOT_SPECIAL", "1.2.3.9", "8088"), master.clone()])
    );
    // A namespace called "kubernetes" is nothing special.
    assert_eq!(
        variables(&m, "kubernetes", &links(true)),
        cat(vec![
            one("KUBERNETES", "1.2.3.6", "8086"),
            one("NOT_SPECIAL", "1.2.3.8", "8088"),
        ])
    );
    assert_eq!(namespaces(&m), ["default", "kubernetes", "test1", "test2"]);
}

#[test]
fn env_file_and_json() {
    let y = [
        CLUSTER.to_string(),
        svc(
            "default",
            "kubernetes",
            "1.2.3.1",
            "[{name: https, port: 443}]",
        ),
    ]
    .concat();
    let m = module(&y);
    let env = write_env(&m, "other");
    assert_eq!(
        env,
        "KUBERNETES_PORT=tcp://1.2.3.1:443\nKUBERNETES_PORT_443_TCP=tcp://1.2.3.1:443\nKUBERNETES_PORT_443_TCP_ADDR=1.2.3.1\nKUBERNETES_PORT_443_TCP_PORT=443\nKUBERNETES_PORT_443_TCP_PROTO=tcp\nKUBERNETES_SERVICE_HOST=1.2.3.1\nKUBERNETES_SERVICE_PORT=443\nKUBERNETES_SERVICE_PORT_HTTPS=443\n"
    );
    let json: serde_json::Value = serde_json::from_str(&write_json(&m, "other")).unwrap();
    let arr = json.as_array().unwrap();
    assert_eq!(arr.len(), 8);
    assert_eq!(arr[0]["name"], "KUBERNETES_PORT");
    assert_eq!(arr[0]["value"], "tcp://1.2.3.1:443");
}

fn run(t: &crate::Target, m: &Module, ns: Option<&str>) -> Result<Vec<crate::File>, String> {
    let crate::Render::Cluster(render) = t.render else {
        panic!("env is cluster-scoped")
    };
    let mut p = crate::Params::default();
    if let Some(ns) = ns {
        p.push("namespace", ns.into());
    }
    render(m, &[], &p).map_err(|e| match e {
        crate::RenderError::Usage(e) => e,
        crate::RenderError::Input(d) => panic!("{d:?}"),
    })
}

/// `--target env`/`env-json`: `--namespace NS` gives NS's file; without it, every
/// namespace that has services (env: a file each; env-json: one object by namespace).
#[test]
fn the_targets_by_namespace() {
    let y = [
        CLUSTER.to_string(),
        svc(
            "default",
            "kubernetes",
            "1.0.0.1",
            "[{name: https, port: 443}]",
        ),
        svc("shop", "web", "1.0.0.2", "[{port: 80}]"),
    ]
    .concat();
    let m = module(&y);
    let files = run(&TARGET, &m, Some("shop")).unwrap();
    assert_eq!(files.len(), 1);
    assert_eq!(files[0].name, "shop.env");
    assert_eq!(
        files[0].text,
        format!("# namespace shop\n{}", write_env(&m, "shop"))
    );
    assert!(files[0].text.contains("\nWEB_SERVICE_HOST=1.0.0.2\n"));
    // A namespace without services still gets default/kubernetes.
    let other = run(&TARGET, &m, Some("empty")).unwrap();
    assert_eq!(other[0].name, "empty.env");
    assert!(other[0].text.contains("KUBERNETES_SERVICE_HOST=1.0.0.1"));
    assert!(!other[0].text.contains("WEB_"));
    let all = run(&TARGET, &m, None).unwrap();
    let names: Vec<&str> = all.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["default.env", "shop.env"]);
    assert_eq!(all[1], files[0]);

    let json = run(&JSON_TARGET, &m, Some("shop")).unwrap();
    assert_eq!(json[0].name, "shop.json");
    assert_eq!(json[0].text, write_json(&m, "shop"));
    let all = run(&JSON_TARGET, &m, None).unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].name, "env.json");
    let v: serde_json::Value = serde_json::from_str(&all[0].text).unwrap();
    let shop: serde_json::Value = serde_json::from_str(&write_json(&m, "shop")).unwrap();
    assert_eq!(v["shop"], shop);
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["default", "shop"]);

    // A namespace is a DNS label (and stays inside --out DIR).
    for bad in ["../x", "Shop", "", "-a", "a/b"] {
        for t in [&TARGET, &JSON_TARGET] {
            let e = run(t, &m, Some(bad)).unwrap_err();
            assert!(e.starts_with("--namespace"), "{e}");
        }
    }
}
