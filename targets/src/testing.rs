//! Test helpers shared by the discovery targets' unit tests.

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
    ]
    .iter()
    .flat_map(|f| f.split("\n---\n"))
    .filter(|d| d.lines().any(|l| l.starts_with("kind:")))
    .collect();
    let outputs = |docs: &[&str]| {
        let m = module(&docs.join("\n---\n"));
        let mut out: Vec<String> = crate::dns::write_zones(&m, &Default::default())
            .into_iter()
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
    let mut reversed = docs.clone();
    reversed.reverse();
    assert_eq!(outputs(&reversed), want);
    // A rotation too (documents that refer to each other change places).
    let mut rotated = docs.clone();
    rotated.rotate_left(3);
    assert_eq!(outputs(&rotated), want);
}
