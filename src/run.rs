//! Running a command: the only place that reads files, writes files and prints.

use crate::cli::{Command, GenCommand};
use crate::compile::{compile_inputs, node_jobs, target_params};
use crate::report::{exit_code, print_diagnostics, Fail};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use svc_compiler::ir::NodeView;
use svc_compiler::net::IpFamily;
use svc_compiler::passes::allocate::write_lock;
use svc_compiler::passes::node::{check_selection, node_view, NodeSelection};
use svc_compiler::source::{FileId, SourceMap};
use svc_targets::{Params, Render, Sharing};

/// `svc-compile check` and `svc-compile compile`.
pub fn run(cmd: Command) -> u8 {
    exit_code(run_inner(&cmd))
}

/// `svc-compile gen`: write a synthetic cluster.
pub fn gen(cmd: GenCommand) -> u8 {
    let text = svc_compiler::synth::generate(&cmd.shape, cmd.format);
    exit_code(write_output(cmd.output.as_deref(), &text).map(|()| 0))
}

fn run_inner(cmd: &Command) -> Result<u8, Fail> {
    let params = target_params(cmd)?;
    let (sources, mut comp) = compile_inputs(cmd)?;
    let mut diags = std::mem::take(&mut comp.diags);

    // Node views (per node and family), when the command asks for them: rendered into
    // `output`, or (with --out, for a per-node target) listed in `per_node` to be rendered
    // file by file.
    let target = cmd.target;
    let mut output: Option<Result<String, String>> = None;
    let mut per_node: Vec<(NodeSelection, IpFamily)> = Vec::new();
    if !cmd.check && !diags.has_errors() {
        let jobs = node_jobs(cmd, &comp, cmd.out_dir.is_some());
        if cmd.out_dir.is_some() && target.per_node() {
            // One file per job, made and written in parallel after the checks below.
            for (sel, fam) in &jobs {
                if let Err(d) = check_selection(&comp.module, sel, *fam) {
                    diags.push(d);
                }
            }
            per_node = jobs;
        } else {
            let mut views: Vec<NodeView> = Vec::new();
            for (sel, fam) in &jobs {
                match node_view(&comp.module, sel, *fam) {
                    Ok(v) => views.push(v),
                    Err(d) => diags.push(d),
                }
            }
            if !diags.has_errors() {
                output = Some(match target.render {
                    Render::Cluster(render) => render(&comp.module, &views, &params),
                    Render::Node(new) => {
                        let renderer = new(&params, Sharing::One);
                        let mut text = String::new();
                        views
                            .iter()
                            .map(|v| {
                                renderer.check(v)?;
                                renderer.render_into(v, &mut text);
                                Ok(std::mem::take(&mut text))
                            })
                            .collect()
                    }
                });
            }
        }
    }

    print_diagnostics(cmd, &diags, &sources);
    if diags.has_errors() {
        return Ok(1);
    }
    if cmd.write_lock {
        let p = cmd.lock.as_ref().expect("checked by cli");
        std::fs::write(p, write_lock(&comp.lock))
            .map_err(|e| Fail(format!("cannot write lock file {p}: {e}")))?;
    }
    if cmd.check {
        return Ok(0);
    }
    match &cmd.out_dir {
        Some(dir) if target.per_node() => {
            std::fs::create_dir_all(dir).map_err(|e| Fail(format!("cannot create {dir}: {e}")))?;
            write_per_node(cmd, &params, &comp.module, &per_node, Path::new(dir))?;
        }
        // A cluster-wide target prints its one document, --out or not.
        _ => {
            let text = output
                .transpose()
                .map_err(|e| Fail(format!("--target {}: {e}", target.name)))?;
            write_output(
                cmd.output.as_deref().filter(|s| !s.is_empty()),
                text.as_deref().unwrap_or_default(),
            )?
        }
    }
    // The process ends here: freeing the IR piece by piece would only cost time.
    std::mem::forget(comp);
    std::mem::forget(sources);
    Ok(0)
}

/// `--out DIR`: every node's view made, rendered and written in parallel, one node at a
/// time per thread, so only a few rulesets are in memory at once. One renderer serves all
/// nodes, so each service port that renders the same on many nodes is rendered once.
fn write_per_node(
    cmd: &Command,
    params: &Params,
    module: &svc_compiler::ir::Module,
    jobs: &[(NodeSelection, IpFamily)],
    dir: &Path,
) -> Result<(), Fail> {
    use rayon::prelude::*;
    let Render::Node(new) = cmd.target.render else {
        unreachable!("only per-node targets write a file per node")
    };
    crate::alloc::purge_later();
    let renderer = new(params, Sharing::Many);
    // Each thread reuses one text buffer: a fresh one per node would be paged in each time.
    jobs.par_iter()
        .try_for_each_init(String::new, |text, (sel, fam)| {
            let view = node_view(module, sel, *fam).expect("checked before anything was written");
            // A refused view stops the run; files of nodes done before it stay written.
            renderer
                .check(&view)
                .map_err(|e| Fail(format!("--target {}: {e}", cmd.target.name)))?;
            renderer.render_into(&view, text);
            drop(view);
            let fam = match fam {
                IpFamily::IPv4 => "ipv4",
                IpFamily::IPv6 => "ipv6",
            };
            let p = dir.join(format!("{}.{fam}.{}", sel.name, cmd.target.ext));
            std::fs::write(&p, text.as_bytes())
                .map_err(|e| Fail(format!("cannot write {}: {e}", p.display())))
        })
}

fn write_output(path: Option<&str>, text: &str) -> Result<(), Fail> {
    match path {
        Some(p) => std::fs::write(p, text).map_err(|e| Fail(format!("cannot write {p}: {e}"))),
        None => {
            let mut out = std::io::stdout().lock();
            match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
                // A closed pipe (`| head`) is not an error.
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                    Err(Fail(format!("cannot write output: {e}")))
                }
                _ => Ok(()),
            }
        }
    }
}

pub(crate) fn read_file(p: &Path) -> Result<String, Fail> {
    std::fs::read_to_string(p).map_err(|e| Fail(format!("cannot read {}: {e}", p.display())))
}

/// Files, directories (recursive, *.yaml/*.yml/*.json, hidden entries skipped) and `-`.
/// Files are added in name order, whatever the order of the arguments, so that even
/// "first defined here" in a diagnostic does not depend on how the command was typed.
pub(crate) fn read_inputs(paths: &[String], sources: &mut SourceMap) -> Result<Vec<FileId>, Fail> {
    let mut files: Vec<(String, String)> = Vec::new();
    for p in paths {
        if p == "-" {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| Fail(format!("cannot read standard input: {e}")))?;
            files.push(("<stdin>".into(), text));
            continue;
        }
        let path = Path::new(p);
        let meta = std::fs::metadata(path)
            .map_err(|e| Fail(format!("cannot read {p}: {e}; check the path")))?;
        if meta.is_dir() {
            let mut found = Vec::new();
            walk(path, &mut found)?;
            for f in found {
                let text = read_file(&f)?;
                files.push((f.display().to_string(), text));
            }
        } else {
            files.push((p.clone(), read_file(path)?));
        }
    }
    files.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(files
        .into_iter()
        .map(|(name, text)| sources.add(name, text))
        .collect())
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), Fail> {
    let rd = std::fs::read_dir(dir)
        .map_err(|e| Fail(format!("cannot read directory {}: {e}", dir.display())))?;
    for entry in rd {
        let entry =
            entry.map_err(|e| Fail(format!("cannot read directory {}: {e}", dir.display())))?;
        let p = entry.path();
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        if p.is_dir() {
            walk(&p, out)?;
        } else if matches!(
            p.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml" | "json")
        ) {
            out.push(p);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{parse_with, Parsed};
    use svc_targets::{NodeRenderer, Target};

    /// A per-node target that can render no view (as `ebpf` refuses a node with more
    /// frontends than its ids can name).
    const REFUSES: Target = Target {
        name: "refuses",
        about: "a target that refuses every view",
        ext: "txt",
        render: Render::Node(|_, _| Box::new(Refuses)),
        flags: &[],
        planner: None,
    };

    struct Refuses;

    impl NodeRenderer for Refuses {
        fn check(&self, view: &NodeView) -> Result<(), String> {
            Err(format!("node {}: too big", view.node_name))
        }
        fn render_into(&self, _: &NodeView, _: &mut String) {
            panic!("rendered a refused view")
        }
    }

    fn run_args(args: &[&str]) -> Result<u8, Fail> {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        match parse_with(&args, &[&REFUSES]) {
            Ok(Parsed::Run(cmd)) => run_inner(&cmd),
            _ => panic!("not a run"),
        }
    }

    /// A refused view is a usage failure (exit 2) naming the target and the node, and
    /// nothing is written: not with -o, not with --out.
    #[test]
    fn a_refused_view_is_one_line_and_writes_nothing() {
        let dir = std::env::temp_dir().join(format!("svc-compile-refuse-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let file = dir.join("out.txt");
        let out = dir.join("out");
        for args in [
            vec!["-o", file.to_str().unwrap()],
            vec!["--out", out.to_str().unwrap()],
        ] {
            let mut a = vec!["examples/", "--target", "refuses", "--node", "node-a"];
            a.extend(args);
            let Err(Fail(msg)) = run_args(&a) else {
                panic!("{a:?} was rendered")
            };
            assert_eq!(msg, "--target refuses: node node-a: too big");
            assert_eq!(exit_code(Err(Fail(msg))), 2);
        }
        assert!(!file.exists());
        assert_eq!(std::fs::read_dir(&out).map_or(0, |d| d.count()), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
