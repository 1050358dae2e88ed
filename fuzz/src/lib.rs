//! What the fuzz targets share: the invariants every compilation must keep.
//!
//! Invariant: a failed check panics (libFuzzer records the input as a crash); nothing
//! here does I/O.

use svc_compiler::diag::{render_all, to_json, Diagnostics};
use svc_compiler::source::{SourceMap, Span};

/// Every diagnostic (and every related location) points at a line of its file and at a
/// column of that line (one past its last character allowed: "expected ... here"), and
/// renders as text and JSON.
pub fn check_locations(sources: &SourceMap, diags: &Diagnostics) {
    for d in &diags.items {
        let spans = d.span.iter().chain(d.related.iter().map(|r| &r.span));
        for s in spans {
            check_span(sources, *s, &d.code, &d.message);
        }
        let _ = to_json(d, sources);
    }
    let _ = render_all(diags, sources);
}

fn check_span(sources: &SourceMap, s: Span, code: &str, message: &str) {
    assert!(
        (s.file.0 as usize) < sources.files.len(),
        "{code} {message}: file {:?} not in the source map",
        s.file
    );
    let Some(line) = sources.line_text(s.file, s.line) else {
        panic!(
            "{code} {message}: line {} of {} does not exist ({} lines)",
            s.line,
            sources.name(s.file),
            sources.file(s.file).text.split('\n').count()
        );
    };
    let chars = line.chars().count() as u32;
    assert!(
        s.col >= 1 && s.col <= chars + 1,
        "{code} {message}: column {} of line {} ({chars} characters: {line:?})",
        s.col,
        s.line
    );
}

/// A small cluster whose services leave their cluster IPs and node ports to the allocator,
/// so that a lock file or a ClusterConfig beside it decides them.
pub const ALLOCATED: &str = "\
apiVersion: v1
kind: Node
metadata: {name: node-1, labels: {topology.kubernetes.io/zone: zone-a}}
spec: {podCIDRs: [10.244.1.0/24, 'fd00:10:244:1::/64']}
status: {addresses: [{type: InternalIP, address: 192.0.2.10}, {type: InternalIP, address: 'fd00:192:0:2::10'}]}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  type: NodePort
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080}, {name: dns, port: 53, protocol: UDP}]
---
apiVersion: v1
kind: Service
metadata: {name: lb, namespace: shop}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Local
  ipFamilyPolicy: PreferDualStack
  ports: [{port: 443}]
---
apiVersion: v1
kind: Service
metadata: {name: db, namespace: data}
spec:
  ports: [{port: 5432}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}, {name: dns, port: 53, protocol: UDP}]
endpoints: [{addresses: [10.244.1.2], nodeName: node-1}]
";

/// Compile [`ALLOCATED`] with `extra` as a second file (a lock file when `as_lock`) and
/// check the diagnostics' locations; the compilation and its source map.
pub fn compile_with(
    extra: &[u8],
    as_lock: bool,
) -> (SourceMap, svc_compiler::Compilation) {
    let mut sources = SourceMap::default();
    let manifests = sources.add("cluster.yaml", ALLOCATED);
    let (f, bad) = sources.add_bytes("extra.yaml", extra.to_vec());
    let mut opts = svc_compiler::Options {
        allocate: true,
        ..Default::default()
    };
    let inputs = match as_lock {
        true => {
            opts.lock = Some(f);
            vec![manifests]
        }
        false => vec![manifests, f],
    };
    let mut comp = svc_compiler::compile(&sources, &inputs, &opts);
    comp.diags.items.extend(bad);
    check_locations(&sources, &comp.diags);
    (sources, comp)
}

/// Every target of [`svc_targets::TARGETS`], for every node and family the module has
/// (node-scoped targets: each part too; cluster targets: with no flags, a usage error
/// allowed): `(what, text)` in a fixed order. Panics if a renderer does.
pub fn render_all_targets(comp: &svc_compiler::Compilation) -> Vec<(String, String)> {
    use svc_compiler::net::IpFamily;
    use svc_compiler::passes::node::{node_view, NodeSelection};
    use svc_targets::{Params, Render, Sharing};

    let mut views = Vec::new();
    for n in &comp.module.nodes {
        for fam in [IpFamily::IPv4, IpFamily::IPv6] {
            let sel = NodeSelection {
                name: n.name.clone(),
                ips: vec![],
            };
            if let Ok(v) = node_view(&comp.module, &sel, fam) {
                views.push((format!("{}/{fam:?}", n.name), v));
            }
        }
    }
    let params = Params::default();
    let mut out = Vec::new();
    for t in svc_targets::TARGETS {
        match t.render {
            Render::Node(new) => {
                let r = new(&params, Sharing::One);
                let mut text = String::new();
                for (what, v) in &views {
                    if r.check(v).is_err() {
                        continue;
                    }
                    r.render_into(v, &mut text);
                    out.push((format!("{} {what}", t.name), std::mem::take(&mut text)));
                    for part in r.parts() {
                        r.render_part_into(v, part, &mut text);
                        out.push((
                            format!("{} {what} {part}", t.name),
                            std::mem::take(&mut text),
                        ));
                    }
                }
            }
            Render::Cluster(render) => {
                let vs: Vec<_> = views.iter().map(|(_, v)| v.clone()).collect();
                if let Ok(files) = render(&comp.module, &vs, &params) {
                    for f in files {
                        out.push((format!("{} {}", t.name, f.name), f.text));
                    }
                }
            }
        }
    }
    out
}

/// The generator of the `checkers` property test, shared with the `cluster` target.
#[path = "../../tests/manifests.rs"]
pub mod manifests;

/// Compile `docs` (YAML documents) as one file, in this order, with allocation on.
pub fn compile_docs(docs: &[&str]) -> (SourceMap, svc_compiler::Compilation) {
    let mut sources = SourceMap::default();
    let text: String = docs.iter().map(|d| format!("---\n{d}")).collect();
    let f = sources.add("cluster.yaml", text);
    let opts = svc_compiler::Options {
        allocate: true,
        ..Default::default()
    };
    let comp = svc_compiler::compile(&sources, &[f], &opts);
    check_locations(&sources, &comp.diags);
    (sources, comp)
}
