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
                        Ok(views
                            .iter()
                            .map(|v| {
                                renderer.render_into(v, &mut text);
                                std::mem::take(&mut text)
                            })
                            .collect())
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
