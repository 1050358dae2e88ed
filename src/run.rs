//! `check`, `compile` and `gen`: compile, render, write the outputs.

use crate::cli::{CheckCmd, CompileCmd, CompileOpts, GenCmd};
use crate::compile::{compile_inputs, node_jobs, Compiled};
use crate::report::{Emitter, Fail, Outcome};
use std::path::Path;
use svc_compiler::ir::NodeView;
use svc_compiler::net::IpFamily;
use svc_compiler::passes::allocate::{write_lock, Lock, NodeIds};
use svc_compiler::passes::node::{check_selection, node_view, NodeSelection};
use svc_targets::{File, NodeRenderer, Params, Render, RenderError, Sharing};

/// `svc-compile gen`: write a synthetic cluster.
pub fn gen(cmd: GenCmd) -> Result<Outcome, Fail> {
    let text = svc_compiler::synth::generate(&cmd.shape, cmd.format);
    crate::report::output(cmd.output.as_deref(), &text).map(|()| Outcome::Done)
}

/// `svc-compile check`: the diagnostics are the product (stdout).
pub fn check(cmd: CheckCmd) -> Result<Outcome, Fail> {
    let Compiled {
        sources,
        comp,
        files,
        ..
    } = compile_inputs(&cmd.opts, None)?;
    let report = Emitter::report(&cmd.opts, cmd.output.as_deref());
    // Kustomize patches (SVC017) and Helm templates (SVC024) skipped were read and
    // judged: a hook that passes only a changed patch or template has checked something.
    let patches = comp
        .diags
        .items
        .iter()
        .any(|d| matches!(d.code, "SVC017" | "SVC024"));
    if files.is_empty() && !patches && !comp.diags.has_errors() {
        // A validator that read nothing must not pass: a glob or an exclude that leaves no
        // file is a mistake in the pipeline, not a clean repository.
        report.diagnostics(&comp.diags, &sources);
        report.finish()?;
        return Err(Fail(format!(
            "nothing to check: no file under {} was read as manifests (check the paths and any --exclude/--include)",
            cmd.opts.paths.join(", ")
        )));
    }
    report.checked(&comp.diags, &sources, &files);
    report.finish()?;
    if comp.diags.has_errors() {
        return Ok(Outcome::InputErrors);
    }
    if cmd.write_lock {
        write_lock_file(&cmd.opts, &comp.lock)?;
    }
    Ok(Outcome::Done)
}

/// `svc-compile compile`.
pub fn compile(cmd: &CompileCmd) -> Result<Outcome, Fail> {
    let Compiled {
        sources,
        mut comp,
        params,
        ..
    } = compile_inputs(&cmd.opts, Some(&cmd.target))?;
    check_part(cmd, &params)?;
    let mut diags = std::mem::take(&mut comp.diags);

    // Node views (per node and family): rendered into `output`, or (with --out, for a
    // per-node target) listed in `per_node` to be rendered file by file.
    let target = cmd.target.target;
    let mut output: Option<Result<Vec<File>, String>> = None;
    let mut per_node: Vec<(NodeSelection, IpFamily)> = Vec::new();
    if !diags.has_errors() {
        let jobs = node_jobs(&cmd.nodes, &comp, cmd.out_dir.is_some());
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
                output = match target.render {
                    Render::Cluster(render) => match render(&comp.module, &views, &params) {
                        Ok(files) => Some(Ok(files)),
                        Err(RenderError::Usage(e)) => Some(Err(e)),
                        // An error in a file the target read (a template): exit 1.
                        Err(RenderError::Input(d)) => {
                            diags.push(*d);
                            None
                        }
                    },
                    Render::Node(new) => {
                        let renderer = new(&params, Sharing::One);
                        let mut text = String::new();
                        let lock = &mut comp.lock;
                        match views.iter().try_for_each(|v| renderer.check(v)) {
                            Err(e) => Some(Err(e)),
                            Ok(()) => {
                                // Limits of the target the input exceeds: reported with
                                // the input's diagnostics, nothing rendered.
                                for v in &views {
                                    renderer
                                        .input_errors(v)
                                        .into_iter()
                                        .for_each(|d| diags.push(d));
                                }
                                (!diags.has_errors()).then(|| {
                                    views
                                        .iter()
                                        .map(|v| {
                                            match &cmd.part {
                                                Some(p) => {
                                                    renderer.render_part_into(v, p, &mut text)
                                                }
                                                None => {
                                                    render_locked(&*renderer, v, lock, &mut text)
                                                }
                                            }
                                            Ok(File {
                                                name: String::new(),
                                                text: std::mem::take(&mut text),
                                            })
                                        })
                                        .collect()
                                })
                            }
                        }
                    }
                };
            }
        }
    }

    Emitter::new(&cmd.opts).diagnostics(&diags, &sources);
    if diags.has_errors() {
        return Ok(Outcome::InputErrors);
    }
    // With --out, the per-node files (and the ids they assign) are made below.
    if cmd.write_lock && !(cmd.out_dir.is_some() && target.per_node()) {
        write_lock_file(&cmd.opts, &comp.lock)?;
    }
    let files = output
        .transpose()
        .map_err(|e| Fail(format!("--target {}: {e}", target.name)))?
        .unwrap_or_default();
    match &cmd.out_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| Fail(format!("cannot create {dir}: {e}")))?;
            if target.per_node() {
                let ids = match write_per_node(
                    cmd,
                    &params,
                    &comp.module,
                    &per_node,
                    Path::new(dir),
                    &comp.lock,
                )? {
                    Ok(ids) => ids,
                    Err(found) => {
                        let mut d = svc_compiler::diag::Diagnostics::default();
                        found.into_iter().for_each(|x| d.push(x));
                        d.sort(&sources);
                        Emitter::new(&cmd.opts).diagnostics(&d, &sources);
                        return Ok(Outcome::InputErrors);
                    }
                };
                comp.lock.ebpf.extend(ids);
                if cmd.write_lock {
                    write_lock_file(&cmd.opts, &comp.lock)?;
                }
            } else {
                // A cluster-wide target's files, each under its own name.
                for f in &files {
                    let p = Path::new(dir).join(&f.name);
                    std::fs::write(&p, &f.text)
                        .map_err(|e| Fail(format!("cannot write {}: {e}", p.display())))?;
                }
            }
        }
        None => {
            let text: String = files.iter().map(|f| f.text.as_str()).collect();
            crate::report::output(cmd.output.as_deref().filter(|s| !s.is_empty()), &text)?
        }
    }
    // The process ends here: freeing the IR piece by piece would only cost time.
    std::mem::forget(comp);
    std::mem::forget(sources);
    Ok(Outcome::Done)
}

fn write_lock_file(opts: &CompileOpts, lock: &Lock) -> Result<(), Fail> {
    let p = opts.lock.as_ref().expect("checked by cli");
    std::fs::write(p, write_lock(lock))
        .map_err(|e| Fail(format!("cannot write lock file {p}: {e}")))
}

/// Renders `view`, keeping the ids the lock holds for its node and family and recording
/// the ones it used (see `NodeRenderer::render_locked`).
fn render_locked(renderer: &dyn NodeRenderer, view: &NodeView, lock: &mut Lock, text: &mut String) {
    let key = NodeIds::key_of(view);
    if let Some(ids) = renderer.render_locked(view, lock.ebpf.get(&key), text) {
        lock.ebpf.insert(key, ids);
    }
}

/// `--part NAME` names one of the parts of the target's renderer (a usage error, before
/// anything is compiled, otherwise).
fn check_part(cmd: &CompileCmd, params: &Params) -> Result<(), Fail> {
    let Some(part) = &cmd.part else {
        return Ok(());
    };
    let target = cmd.target.target;
    let parts = match target.render {
        Render::Node(new) => new(params, Sharing::One).parts(),
        Render::Cluster(_) => &[],
    };
    match parts {
        [] => Err(Fail(format!(
            "--part: the output of --target {} has no parts",
            target.name
        ))),
        _ if parts.contains(&part.as_str()) => Ok(()),
        _ => Err(Fail(format!(
            "--part `{part}`: use {}",
            crate::cli::one_of(parts)
        ))),
    }
}

/// `--out DIR`: every node's view made, rendered and written in parallel, one node at a
/// time per thread, so only a few rulesets are in memory at once. One renderer serves all
/// nodes, so each service port that renders the same on many nodes is rendered once.
/// A renderer with parts writes `NODE.FAMILY.PART.EXT` for each (or for `--part`'s
/// alone), one view per node serving all of them. A node the target's limits refuse
/// ([`NodeRenderer::input_errors`]) is not written; its diagnostics come back as `Err`.
fn write_per_node(
    cmd: &CompileCmd,
    params: &Params,
    module: &svc_compiler::ir::Module,
    jobs: &[(NodeSelection, IpFamily)],
    dir: &Path,
    lock: &Lock,
) -> Result<Result<LockedIds, Vec<svc_compiler::diag::Diagnostic>>, Fail> {
    use rayon::prelude::*;
    let target = cmd.target.target;
    let Render::Node(new) = target.render else {
        unreachable!("only per-node targets write a file per node")
    };
    crate::alloc::purge_later();
    let renderer = new(params, Sharing::Many);
    let parts: Vec<&str> = match &cmd.part {
        Some(p) => vec![p.as_str()],
        None => renderer.parts().to_vec(),
    };
    let write = |p: std::path::PathBuf, text: &str| {
        std::fs::write(&p, text.as_bytes())
            .map_err(|e| Fail(format!("cannot write {}: {e}", p.display())))
    };
    let locked = std::sync::Mutex::new(LockedIds::new());
    let refused = std::sync::Mutex::new(Vec::new());
    // Each thread reuses one text buffer: a fresh one per node would be paged in each time.
    jobs.par_iter()
        .try_for_each_init(String::new, |text, (sel, fam)| {
            let view = node_view(module, sel, *fam).expect("checked before anything was written");
            // A refused view stops the run; files of nodes done before it stay written.
            renderer
                .check(&view)
                .map_err(|e| Fail(format!("--target {}: {e}", target.name)))?;
            let found = renderer.input_errors(&view);
            if !found.is_empty() {
                refused.lock().expect("not poisoned").extend(found);
                return Ok(());
            }
            let fam = match fam {
                IpFamily::IPv4 => "ipv4",
                IpFamily::IPv6 => "ipv6",
            };
            let ext = target.ext;
            if parts.is_empty() {
                let key = NodeIds::key_of(&view);
                if let Some(ids) = renderer.render_locked(&view, lock.ebpf.get(&key), text) {
                    locked.lock().expect("not poisoned").insert(key, ids);
                }
                drop(view);
                return write(dir.join(format!("{}.{fam}.{ext}", sel.name)), text);
            }
            if cmd.part.is_none() {
                // Every part from one computation of the node's state.
                let mut texts = vec![String::new(); parts.len()];
                renderer.render_parts_into(&view, &mut texts);
                for (part, t) in parts.iter().zip(&texts) {
                    write(dir.join(format!("{}.{fam}.{part}.{ext}", sel.name)), t)?;
                }
                return Ok(());
            }
            for part in &parts {
                renderer.render_part_into(&view, part, text);
                write(dir.join(format!("{}.{fam}.{part}.{ext}", sel.name)), text)?;
            }
            Ok(())
        })?;
    let refused = refused.into_inner().expect("not poisoned");
    if !refused.is_empty() {
        return Ok(Err(refused));
    }
    Ok(Ok(locked.into_inner().expect("not poisoned")))
}

/// eBPF ids by (node, family), as the lock keeps them.
type LockedIds = std::collections::BTreeMap<(String, String), NodeIds>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{parse_with, Run};
    use crate::report::exit_code;
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
        trace: None,
        deprecated: None,
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

    fn run_args(args: &[&str]) -> Result<Outcome, Fail> {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        match parse_with(&args, &[&REFUSES]) {
            Ok(Run::Compile(cmd)) => compile(&cmd),
            _ => panic!("not a compile"),
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
            assert_eq!(exit_code(Err(Fail(msg)), false), 2);
        }
        assert!(!file.exists());
        assert_eq!(std::fs::read_dir(&out).map_or(0, |d| d.count()), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
