//! What the crate's unit tests share: snapshots of exact output, and the skip rule of the
//! tests that load rulesets into a throwaway network namespace. The IR they render comes
//! from `svc_compiler::testing`, or (the discovery targets, which read whole manifests)
//! from [`module`].

/// Checks `text` against the snapshot `targets/snapshots/<name>.snap` (review changes with
/// `cargo insta review`). One directory whatever the source layout, so that moving a test
/// never orphans its snapshot.
pub fn snapshot(name: &str, text: &str) {
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path(concat!(env!("CARGO_MANIFEST_DIR"), "/snapshots"));
    s.set_prepend_module_to_snapshot(false);
    s.set_omit_expression(true);
    s.bind(|| insta::assert_snapshot!(name, text));
}

// Kernel tests skip where a namespace cannot be made (not root, a tool missing), unless
// `SVC_KERNEL=require` (set by CI), which turns every skip into a failure. The
// integration tests' `tests/kernel/lab.rs` reads the variable the same way.

/// Skips the kernel test `test` because of `why` (prints `skipped: …`), or panics when
/// `SVC_KERNEL=require`.
pub fn skip(test: &str, why: &str) {
    let value = std::env::var("SVC_KERNEL").ok();
    if required(value.as_deref()) {
        panic!("{test}: {why}, and SVC_KERNEL=require forbids skipping kernel tests");
    }
    println!("skipped: {test}: {why}");
}

/// Unset or empty: skip; `require`: fail. Anything else is a typo, not a quiet default.
fn required(value: Option<&str>) -> bool {
    match value {
        None | Some("") => false,
        Some("require") => true,
        Some(other) => panic!("SVC_KERNEL={other:?}: the only value is `require`"),
    }
}

#[test]
fn svc_kernel_values() {
    assert!(!required(None));
    assert!(!required(Some("")));
    assert!(required(Some("require")));
    assert!(std::panic::catch_unwind(|| required(Some("yes"))).is_err());
}

use svc_compiler::ir::Module;
use svc_compiler::source::SourceMap;

/// Compiles manifests (with allocation) and fails the test on any error diagnostic.
pub fn module(yaml: &str) -> Module {
    let mut sources = SourceMap::default();
    let f = sources.add("t.yaml", yaml);
    let c = svc_compiler::compile(
        &sources,
        &[f],
        &svc_compiler::Options {
            allocate: true,
            ..Default::default()
        },
    );
    assert!(!c.diags.has_errors(), "{:?}", c.diags.items);
    c.module
}

/// The discovery targets give byte-identical output whatever the order of the documents.
#[test]
fn discovery_outputs_do_not_depend_on_document_order() {
    let affinity =
        include_str!("../../golden/cases/affinity/svc.yaml").replace("10.96.0.19", "10.0.0.19");
    let docs: Vec<&str> = [
        include_str!("../../examples/cluster.yaml"),
        include_str!("../../examples/my-service.yaml"),
        include_str!("../../examples/external-name.yaml"),
        include_str!("../../examples/multi-port.yaml"),
        include_str!("../../examples/headless.yaml"),
        // The golden case's 10.96.0.19 is outside examples/cluster.yaml's range.
        affinity.as_str(),
        "apiVersion: v1\nkind: Service\nmetadata: {name: db, namespace: shop}\nspec:\n  clusterIP: None\n  ports: [{name: pg, port: 5432}]\n",
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: db-1, namespace: shop, labels: {kubernetes.io/service-name: db}}\naddressType: IPv4\nports: [{name: pg, port: 5432}]\nendpoints:\n- addresses: [10.244.1.9]\n  hostname: db-0\n- addresses: [10.244.1.8]\n",
        // Pods (coredns mode's pod names) and a service without ports whose slices list
        // ports, in two slices.
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p1, namespace: shop}\nstatus: {podIP: 10.244.1.9}\n",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p0, namespace: web}\nstatus: {podIP: \"fd00::9\"}\n",
        "apiVersion: v1\nkind: Service\nmetadata: {name: ldap, namespace: shop}\nspec: {clusterIP: None}\n",
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: ldap-2, namespace: shop, labels: {kubernetes.io/service-name: ldap}}\naddressType: IPv4\nports: [{name: ldaps, port: 636}, {name: ldap, port: 389}]\nendpoints:\n- addresses: [192.0.2.8]\n",
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: ldap-1, namespace: shop, labels: {kubernetes.io/service-name: ldap}}\naddressType: IPv4\nports: [{name: ldap, port: 1389}]\nendpoints:\n- addresses: [192.0.2.7]\n",
    ]
    .iter()
    .flat_map(|f| f.split("\n---\n"))
    .filter(|d| d.lines().any(|l| l.starts_with("kind:")))
    .collect();
    let outputs = |docs: &[&str]| {
        let m = module(&docs.join("\n---\n"));
        let coredns = crate::dns::Options {
            records: Some(svc_compiler::ir::DnsRecords::Coredns),
            ..Default::default()
        };
        let mut out: Vec<String> = [Default::default(), coredns]
            .iter()
            .flat_map(|o| crate::dns::write_zones(&m, o))
            .map(|z| z.text)
            .collect();
        for ns in crate::env::namespaces(&m) {
            out.push(crate::env::write_env(&m, &ns));
            out.push(crate::env::write_json(&m, &ns));
        }
        let t = include_str!("../../examples/templates/haproxy.cfg.j2");
        out.push(crate::template::render(&m, &[], "t", t).unwrap());
        out
    };
    let want = outputs(&docs);
    assert!(want[0].contains("db-0.db.shop.svc"), "{}", want[0]);
    assert!(want[3].contains("_ldap._tcp.ldap.shop.svc"), "{}", want[3]);
    assert!(want[3].contains("fd00--9.web.pod."), "{}", want[3]);
    let mut reversed = docs.clone();
    reversed.reverse();
    assert_eq!(outputs(&reversed), want);
    // A rotation too (documents that refer to each other change places).
    let mut rotated = docs.clone();
    rotated.rotate_left(3);
    assert_eq!(outputs(&rotated), want);
}
