//! Properties: the order of files and documents never matters; with a lock file, adding
//! services never moves an existing allocation.

use crate::support::{example_manifests, Rng};
use svc_compiler::net::IpFamily;
use svc_compiler::passes::node::{node_view, NodeSelection};
use svc_compiler::source::SourceMap;
use svc_compiler::Options;

/// Every document of examples/ as its own text.
fn example_documents() -> Vec<String> {
    let mut docs = Vec::new();
    for (_, text) in example_manifests() {
        for d in text.split("\n---\n") {
            if d.lines().any(|l| l.starts_with("kind:")) {
                docs.push(d.trim_end().to_string() + "\n");
            }
        }
    }
    docs
}

fn compile_ir(files: &[String], opts: &Options) -> (String, svc_compiler::Compilation) {
    let mut sources = SourceMap::default();
    let ids: Vec<_> = files
        .iter()
        .enumerate()
        .map(|(i, t)| sources.add(format!("f{i}.yaml"), t.clone()))
        .collect();
    let c = svc_compiler::compile(&sources, &ids, opts);
    assert!(!c.diags.has_errors(), "{:?}", c.diags.items);
    // Every node's views and rulesets too, not only the module.
    let mut out = String::new();
    let mut views = Vec::new();
    for node in &c.module.nodes {
        let sel = NodeSelection {
            name: node.name.clone(),
            ips: vec![],
        };
        let v = node_view(&c.module, &sel, IpFamily::IPv4).expect("node view");
        out += &svc_targets::iptables::write_string(&v, &Default::default());
        out += &svc_targets::nftables::write_string(&v, &Default::default());
        views.push(v);
    }
    (svc_targets::ir::write_string(&c.module, &views) + &out, c)
}

#[test]
fn shuffling_files_and_documents_never_changes_the_output() {
    let docs = example_documents();
    let opts = Options {
        allocate: true,
        ..Default::default()
    };
    let (reference, _) = compile_ir(&[docs.join("---\n")], &opts);
    for seed in 1..=25u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut d = docs.clone();
        rng.shuffle(&mut d);
        // Group the shuffled documents into 1..=5 files.
        let n = 1 + rng.index(5);
        let mut files = vec![String::new(); n];
        for doc in d {
            let f = &mut files[rng.index(n)];
            if !f.is_empty() {
                f.push_str("---\n");
            }
            f.push_str(&doc);
        }
        let (out, _) = compile_ir(&files, &opts);
        assert_eq!(out, reference, "seed {seed} changed the output");
    }
}

fn random_service(rng: &mut Rng, i: usize) -> String {
    let ty = ["ClusterIP", "NodePort", "LoadBalancer"][rng.index(3)];
    let etp = if ty == "LoadBalancer" && rng.index(2) == 0 {
        "\n  externalTrafficPolicy: Local"
    } else {
        ""
    };
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: rnd-{i}-{}\n  namespace: ns{}\nspec:\n  type: {ty}{etp}\n  selector: {{app: x}}\n  ports:\n  - name: a\n    port: {}\n  - name: b\n    port: {}\n    protocol: UDP\n",
        rng.next() % 1000,
        rng.index(4),
        1 + rng.index(60000),
        1 + rng.index(60000),
    )
}

#[test]
fn adding_services_with_a_lock_never_moves_existing_allocations() {
    // A small range makes hash collisions (and so probing) common.
    let small = Options {
        allocate: true,
        service_cidrs: Some(vec!["10.96.0.0/24".parse().unwrap()]),
        node_port_range: Some((30000, 30300)),
        ..Default::default()
    };
    for seed in 1..=20u64 {
        let mut rng = Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D));
        let mut files: Vec<String> = (0..30).map(|i| random_service(&mut rng, i)).collect();
        let (_, first) = compile_ir(&files, &small);
        let lock_text = svc_compiler::passes::allocate::write_lock(&first.lock);
        for j in 0..10 {
            files.insert(
                rng.index(files.len() + 1),
                random_service(&mut rng, 100 + j),
            );
        }
        let mut sources = SourceMap::default();
        let mut ids: Vec<_> = files
            .iter()
            .enumerate()
            .map(|(i, t)| sources.add(format!("f{i}.yaml"), t.clone()))
            .collect();
        let lock = sources.add("lock.yaml", lock_text);
        let opts = Options {
            lock: Some(lock),
            ..small.clone()
        };
        ids.retain(|i| *i != lock);
        let second = svc_compiler::compile(&sources, &ids, &opts);
        assert!(!second.diags.has_errors(), "{:?}", second.diags.items);
        for (name, entry) in &first.lock.services {
            assert_eq!(
                second.lock.services.get(name),
                Some(entry),
                "seed {seed}: allocation of {name} moved"
            );
        }
    }
}
