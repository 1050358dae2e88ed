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

/// The agent's compile ([`svc_compiler::compile_cached`], one cache across syncs) gives
/// what a fresh compile of the same files gives, at every step of random edit sequences:
/// files added, removed, renamed, emptied, broken and mended, documents moved between
/// files. The sources are rebuilt at each step as the command line reads them (names
/// sorted), so file ids shift under the cache as files come and go.
#[test]
fn the_agents_cached_compile_is_a_fresh_compile_at_every_step() {
    let docs = example_documents();
    let opts = Options {
        allocate: true,
        ..Default::default()
    };
    let mut parsed_again = 0;
    let mut reused = 0;
    for seed in 1..=12u64 {
        let mut rng = Rng::new(seed);
        let mut files: std::collections::BTreeMap<String, String> = Default::default();
        for (i, d) in docs.iter().enumerate() {
            let name = format!("d{}/f{}.yaml", i % 3, rng.index(6));
            let f = files.entry(name).or_default();
            if !f.is_empty() {
                f.push_str("---\n");
            }
            f.push_str(d);
        }
        let mut cache = svc_compiler::ReadCache::default();
        for step in 0..30 {
            let names: Vec<String> = files.keys().cloned().collect();
            let pick = |rng: &mut Rng| names[rng.index(names.len())].clone();
            match rng.index(7) {
                // A document appended to another file.
                0 => {
                    let d = rng.pick(&docs).clone();
                    let f = files.entry(pick(&mut rng)).or_default();
                    f.push_str("---\n");
                    f.push_str(&d);
                }
                // A new file, sorting anywhere among the others.
                1 => {
                    let name = format!("d{}/n{step}.yaml", rng.index(4));
                    files.insert(name, random_service(&mut rng, step));
                }
                // A file removed (one stays).
                2 if files.len() > 1 => {
                    files.remove(&pick(&mut rng));
                }
                // A file renamed.
                3 => {
                    let from = pick(&mut rng);
                    let text = files.remove(&from).unwrap();
                    files.insert(format!("a{step}.yaml"), text);
                }
                // A broken file (an error), later mended or removed by other steps.
                4 => {
                    let f = files.get_mut(&pick(&mut rng)).unwrap();
                    f.push_str("---\nkind: Service\nmetadata: {name: [\n");
                }
                // A value changed in place.
                5 => {
                    let name = pick(&mut rng);
                    let f = files.get_mut(&name).unwrap();
                    *f = f.replacen("port: ", "port: 1", 1);
                }
                // Nothing changed: everything comes from the cache.
                _ => {}
            }
            let mut sources = SourceMap::default();
            let ids: Vec<_> = files
                .iter()
                .map(|(n, t)| sources.add(n.clone(), t.clone()))
                .collect();
            let fresh = svc_compiler::compile(&sources, &ids, &opts);
            let cached = svc_compiler::compile_cached(&sources, &ids, &opts, &mut cache);
            let n = cache.take_parsed();
            parsed_again += n;
            reused += ids.len() - n;
            assert_eq!(
                format!("{:?}", cached.diags.items),
                format!("{:?}", fresh.diags.items),
                "seed {seed} step {step}: diagnostics differ"
            );
            let ir = |c: &svc_compiler::Compilation| {
                let mut out = serde_json::to_string(&c.module).unwrap();
                for node in &c.module.nodes {
                    let sel = NodeSelection {
                        name: node.name.clone(),
                        ips: vec![],
                    };
                    if let Ok(v) = node_view(&c.module, &sel, IpFamily::IPv4) {
                        out += &svc_targets::nftables::write_string(&v, &Default::default());
                    }
                }
                out
            };
            assert_eq!(
                ir(&cached),
                ir(&fresh),
                "seed {seed} step {step}: output differs"
            );
        }
    }
    // The cache did its job, and files were parsed again when they had to be.
    assert!(
        reused > parsed_again,
        "{reused} reused, {parsed_again} parsed"
    );
    assert!(parsed_again > 12 * 10, "{parsed_again} parsed again");
}

/// The agent's file cache ([`svc_node::agent::files::FileCache`], what a sync reads its
/// inputs through) gives every file's current bytes at every step of random edits made as
/// fast as they come: same-size rewrites in place (also with the modification time set
/// back), renames over the file with the same or other bytes, appends; and, after the
/// files have been quiet for longer than [`svc_node::agent::files::RACY`], unchanged files
/// are not read again. Once with the kernel's file times, once with them cut to the
/// second (a file system with coarse times: most edits then fall in the tick of the read
/// before, and only the racy rule tells them).
#[test]
fn the_agents_file_cache_never_serves_stale_bytes() {
    for coarse in [false, true] {
        file_cache_case(coarse);
    }
}

fn file_cache_case(coarse: bool) {
    use std::io::Write;
    use std::os::unix::fs::FileExt;
    use svc_node::agent::files::{now_ns, FileCache, Looked, Stat, RACY};
    let dir = crate::support::TempDir::new(&format!("file-cache-{coarse}"));
    let paths: Vec<std::path::PathBuf> = (0..4)
        .map(|i| dir.path().join(format!("f{i}.yaml")))
        .collect();
    // What a sync does: the cache's text, or the file read and kept.
    let sync = |cache: &mut FileCache, step: &str| {
        for p in &paths {
            let read = now_ns();
            let mut stat = Stat::of(&std::fs::metadata(p).unwrap());
            if coarse {
                let second = 1_000_000_000;
                stat.mtime -= stat.mtime.rem_euclid(second);
                stat.ctime -= stat.ctime.rem_euclid(second);
            }
            let text = match cache.look_at(p, stat, read) {
                Looked::Same(text, print) => {
                    assert_eq!(print, svc_compiler::source::fingerprint(&text));
                    text.to_string()
                }
                Looked::Read(stamp) => {
                    let text = std::fs::read_to_string(p).unwrap();
                    let print = svc_compiler::source::fingerprint(&text);
                    cache.keep(p, stamp, std::sync::Arc::new(text.clone()), print);
                    text
                }
            };
            assert_eq!(
                text,
                std::fs::read_to_string(p).unwrap(),
                "{step}: {} served stale",
                p.display()
            );
        }
        cache.sweep()
    };
    let what = if coarse {
        "coarse times"
    } else {
        "the kernel's times"
    };
    let mut rng = Rng::new(7);
    let mut cache = FileCache::default();
    for (i, p) in paths.iter().enumerate() {
        std::fs::write(p, format!("kind: Service # {i} 0000\n")).unwrap();
    }
    let mut edits = 0;
    for round in 0..2 {
        for step in 0..200 {
            let what = format!("{what}: round {round} step {step}");
            let p = rng.pick(&paths).clone();
            let old = std::fs::read(&p).unwrap();
            // The same length, other bytes: the counter at the end of the line.
            let mut same_size = old.clone();
            let n = same_size.len();
            same_size[n - 5..n - 1].copy_from_slice(format!("{:04}", step % 10_000).as_bytes());
            match rng.index(6) {
                0 => {
                    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
                    f.write_all_at(&same_size, 0).unwrap();
                }
                1 => {
                    let before = std::fs::metadata(&p).unwrap();
                    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
                    f.write_all_at(&same_size, 0).unwrap();
                    // `touch -d`: the modification time as it was.
                    f.set_modified(before.modified().unwrap()).unwrap();
                }
                2 => {
                    let tmp = p.with_extension("tmp");
                    std::fs::write(&tmp, &same_size).unwrap();
                    std::fs::rename(&tmp, &p).unwrap();
                }
                3 => {
                    let tmp = p.with_extension("tmp");
                    std::fs::write(&tmp, &old).unwrap();
                    std::fs::rename(&tmp, &p).unwrap();
                }
                4 => {
                    let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
                    f.write_all(b"# 0000\n").unwrap();
                }
                _ => {}
            }
            edits += 1;
            sync(&mut cache, &what);
        }
        // Quiet for longer than RACY: the files settle, and are then taken from the cache.
        std::thread::sleep(RACY + std::time::Duration::from_millis(100));
        sync(&mut cache, &format!("{what}: round {round}: settling"));
        assert_eq!(
            sync(&mut cache, &format!("{what}: round {round}: settled")),
            0
        );
    }
    assert!(edits > 0);
}
