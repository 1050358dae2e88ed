//! `svc-compile diff OLD NEW`: reads both revisions (paths, or `git:REV:PATH` through
//! `git ls-tree` / `git cat-file`, no checkout), compiles each, and prints the report of
//! `svc_compiler::diff`, with `--rules` the unified diffs of the rulesets (`similar`).
//!
//! Exit codes: 0 no change, 1 changes, 2 anything else — usage, I/O, git, and input
//! errors in either revision (their diagnostics are printed). Input errors are 2, not 1
//! as elsewhere, because CI gates on 1 meaning "changes": a broken revision must never
//! read as a reviewable change.

use crate::cli::{DiffCmd, DiffFormat};
use crate::compile::{filters, suppress};
use crate::config::Config;
use crate::inputs::{read_inputs, Filters};
use crate::report::{output, Emitter, Fail, Outcome};
use std::collections::BTreeSet;
use std::process::Command;
use svc_compiler::diag::Diagnostics;
use svc_compiler::diff::RulesDiff;
use svc_compiler::diff::{diff_modules, diff_nodes, family_name, render_markdown, render_text};
use svc_compiler::ir::NodeView;
use svc_compiler::net::IpFamily;
use svc_compiler::passes::node::{node_view, NodeSelection};
use svc_compiler::source::{FileId, SourceMap};
use svc_compiler::Compilation;
use svc_targets::{Params, Render, Sharing};

/// `svc-compile diff`: `Differs` when the report is not empty.
pub fn run(flags: &DiffCmd) -> Result<Outcome, Fail> {
    let renderer = match flags.rules.map(|t| (t, t.render)) {
        None => None,
        Some((_, Render::Node(new))) => Some(new(&Params::default(), Sharing::One)),
        Some((t, Render::Cluster(_))) => {
            return Err(Fail(format!(
                "--rules: --target {} is not a per-node target",
                t.name
            )))
        }
    };
    let rules_name = flags.rules.map_or("", |t| t.name);
    // The working directory's config file serves both revisions.
    let config = crate::config::load(&flags.config, flags.color)?;
    let config = config.as_ref();
    // The two revisions are independent: compile them side by side.
    let (old, new) = rayon::join(
        || compile_side("OLD", &flags.old, flags, config),
        || compile_side("NEW", &flags.new, flags, config),
    );
    let (old, new) = (old?, new?);
    let mut failed = false;
    let emitter = Emitter::text(flags.color);
    for (side, spec, (sources, comp)) in [("OLD", &flags.old, &old), ("NEW", &flags.new, &new)] {
        if comp.diags.has_errors() {
            emitter.line(&format!("{side} ({spec}) has errors:"));
            emitter.diagnostics(&comp.diags, sources);
            failed = true;
        }
    }
    if failed {
        return Ok(Outcome::InputErrors);
    }
    let (old, new) = (&old.1, &new.1);
    let mut report = diff_modules(&old.module, &new.module);

    let nodes: BTreeSet<String> = if flags.all_nodes {
        old.module
            .nodes
            .iter()
            .chain(&new.module.nodes)
            .map(|n| n.name.clone())
            .collect()
    } else {
        flags.node.iter().cloned().collect()
    };
    let families: BTreeSet<IpFamily> = [old, new]
        .iter()
        .flat_map(|c| c.settings.service_cidrs.iter().map(|c| c.family()))
        .collect();
    let mut text_old = String::new();
    let mut text_new = String::new();
    for name in &nodes {
        let sel = NodeSelection {
            name: name.clone(),
            ips: vec![],
        };
        for &fam in &families {
            let (o, n) = (
                node_view(&old.module, &sel, fam),
                node_view(&new.module, &sel, fam),
            );
            if let (Err(d), Err(_)) = (&o, &n) {
                // Unknown in both revisions: a usage error, said the compiler's way.
                return Err(Fail(format!("--node {name}: {}", d.message)));
            }
            if let (Ok(o), Ok(n)) = (&o, &n) {
                report.nodes.extend(diff_nodes(o, n));
            }
            let Some(r) = &renderer else { continue };
            // A node or family only in one revision diffs against nothing.
            let render = |v: &Result<NodeView, _>, text: &mut String| -> Result<(), Fail> {
                text.clear();
                if let Ok(v) = v {
                    r.check(v)
                        .map_err(|e| Fail(format!("--target {}: {e}", rules_name)))?;
                    if let Some(d) = r.input_errors(v).first() {
                        return Err(Fail(format!("--target {}: {}", rules_name, d.message)));
                    }
                    r.render_into(v, text);
                }
                Ok(())
            };
            render(&o, &mut text_old)?;
            render(&n, &mut text_new)?;
            if text_old != text_new {
                let target = flags.rules.expect("a renderer is made for --rules");
                let file = format!("{name}.{}.{}", family_name(fam), target.ext);
                let diff = similar::TextDiff::from_lines(&text_old, &text_new)
                    .unified_diff()
                    .context_radius(3)
                    .header(&format!("old/{file}"), &format!("new/{file}"))
                    .to_string();
                report.rules.push(RulesDiff {
                    node: name.clone(),
                    family: family_name(fam),
                    target: target.name.to_string(),
                    diff,
                });
            }
        }
    }
    let text = match flags.format {
        DiffFormat::Json => {
            let mut s = serde_json::to_string_pretty(&report).expect("the report serialises");
            s.push('\n');
            s
        }
        DiffFormat::Markdown => render_markdown(&report),
        DiffFormat::Text => render_text(&report),
    };
    output(flags.output.as_deref(), &text)?;
    Ok(if report.is_empty() {
        Outcome::Done
    } else {
        Outcome::Differs
    })
}

/// Read and compile one revision, with the config file's settings and suppressions.
fn compile_side(
    side: &str,
    spec: &str,
    flags: &DiffCmd,
    config: Option<&Config>,
) -> Result<(SourceMap, Compilation), Fail> {
    let mut sources = SourceMap::default();
    let filters = filters(&flags.exclude, &flags.include, config);
    let (files, diags) = match spec.strip_prefix("git:") {
        Some(rest) => read_git(side, rest, &filters, &mut sources)?,
        None => {
            let inputs = read_inputs(&[spec.to_string()], &filters, &mut sources, None)?;
            (inputs.files, inputs.diags)
        }
    };
    if let Some(c) = config {
        // For SVC022's locations, in this revision's own source map.
        let mut c = c.clone();
        c.add_to(&mut sources);
        return Ok(compile_files(sources, files, diags, flags, Some(&c)));
    }
    Ok(compile_files(sources, files, diags, flags, None))
}

fn compile_files(
    sources: SourceMap,
    files: Vec<FileId>,
    diags: Diagnostics,
    flags: &DiffCmd,
    config: Option<&Config>,
) -> (SourceMap, Compilation) {
    let p = config.map(|c| &c.project);
    let opts = svc_compiler::Options {
        allocate: flags.allocate,
        service_cidrs: p.and_then(|p| p.service_cidrs.clone()),
        node_port_range: p.and_then(|p| p.node_port_range),
        cluster_domain: p.and_then(|p| p.cluster_domain.clone()),
        random_fully: p.and_then(|p| p.random_fully),
        nfacct: p.and_then(|p| p.nfacct),
        nft_layout: p.and_then(|p| p.nft_layout),
        topology_keys: p.and_then(|p| p.topology_keys),
        validate: p.and_then(|p| p.validate).unwrap_or_default(),
        lock: None,
        layout: Default::default(),
    };
    let mut comp = svc_compiler::compile(&sources, &files, &opts);
    let mut resort = !diags.items.is_empty();
    comp.diags.extend(diags);
    resort |= suppress(&mut comp.diags, &sources, &files, config);
    if resort {
        comp.diags.sort(&sources);
    }
    (sources, comp)
}

fn git(args: &[&str]) -> Result<Vec<u8>, Fail> {
    let out = Command::new("git")
        .args(args)
        .output()
        .map_err(|e| Fail(format!("cannot run git: {e}")))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(Fail(format!(
            "git {}: {}",
            args.join(" "),
            err.lines().next().unwrap_or("failed")
        )));
    }
    Ok(out.stdout)
}

/// `REV:PATH`: the file PATH at REV, or every *.yaml/*.yml/*.json under the directory
/// PATH (hidden entries skipped, as for directories on disk), in name order. Paths are
/// relative to the working directory, as git takes them.
fn read_git(
    side: &str,
    rest: &str,
    filters: &Filters,
    sources: &mut SourceMap,
) -> Result<(Vec<FileId>, Diagnostics), Fail> {
    let (rev, path) = rest
        .split_once(':')
        .ok_or_else(|| Fail(format!("{side} `git:{rest}`: use git:REV:PATH")))?;
    let path = if path.is_empty() { "." } else { path };
    let listing = git(&[
        "ls-tree",
        "-r",
        "-z",
        "--full-name",
        "--name-only",
        rev,
        "--",
        path,
    ])?;
    let names: Vec<String> = listing
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect();
    if names.is_empty() {
        return Err(Fail(format!("{side} `git:{rest}`: no such path at {rev}")));
    }
    // A single file named exactly is read whatever its extension.
    let single = names.len() == 1 && names[0].ends_with(path.trim_start_matches("./"));
    let mut files = Vec::new();
    let mut diags = Diagnostics::default();
    for name in &names {
        let manifest = [".yaml", ".yml", ".json"].iter().any(|e| name.ends_with(e));
        let hidden = name.split('/').any(|c| c.starts_with('.'));
        if !single && (!manifest || hidden) {
            continue;
        }
        if filters.excluded(name) || !filters.included(name) {
            continue;
        }
        let bytes = git(&["cat-file", "blob", &format!("{rev}:{name}")])?;
        let (id, d) = sources.add_bytes(format!("{rev}:{name}"), bytes);
        diags.items.extend(d);
        files.push(id);
    }
    Ok((files, diags))
}
