//! `apply`, `cleanup` and `drift`: the command line's side. The compile happens here (reading,
//! parsing, passes, node views, diagnostics); everything done to the node is `svc_node`'s.

use crate::cli::{
    AgentCmd, ApplyCmd, ApplySource, CleanupCmd, CompileOpts, DriftCmd, Nodes, TargetArgs,
};
use crate::compile::{compile_read, node_jobs, read_all, target_params_of};
use crate::inputs::read_file;
use crate::report::{Emitter, Fail, Outcome};
use std::path::Path;
use svc_compiler::passes::node::node_view;
use svc_node::apply::{inputs_key, Compiled, Input};
use svc_node::times::Times;
use svc_targets::plan::Family;

/// `svc-compile apply`: `svc_node` answers 0 (applied) or 1 (input errors, printed).
pub fn apply(cmd: &ApplyCmd) -> Result<Outcome, Fail> {
    let target = cmd.target.target;
    // nftables plans from documents of tens of MB at 10k services: what the compile frees
    // is what planning takes next (see `alloc`). Elsewhere freed memory goes back as in a
    // compile (iptables at 1k: peak RSS 126 MB kept, 85 MB given back, against a compile's
    // 56 MB; the budget is 2×).
    if target
        .planner
        .is_some_and(|p| p.fingerprint(Family::V4).is_some())
    {
        crate::alloc::purge_never();
    }
    // Refused before anything is read.
    svc_node::apply::preflight(target, &cmd.apply)?;
    let params = target_params_of(&cmd.target)?;
    let input = match &cmd.source {
        ApplySource::Rollback => Input::Rollback,
        ApplySource::From(from) => Input::From {
            path: from.clone(),
            text: read_file(Path::new(from))?,
        },
        ApplySource::Manifests => {
            // Only a planner's apply can skip the compile (by the inputs' fingerprint).
            let keyed = target.planner.is_some() && !svc_node::ebpf::applies(target);
            manifests(&cmd.opts, &cmd.target, &cmd.nodes, keyed, None)?
        }
    };
    Ok(
        match svc_node::apply::apply(target, &cmd.apply, &params, input)? {
            0 => Outcome::Done,
            _ => Outcome::InputErrors,
        },
    )
}

/// `svc-compile agent`: runs until SIGTERM or SIGINT (0); `Err` when it cannot start.
pub fn agent(cmd: &AgentCmd) -> Result<Outcome, Fail> {
    let target = cmd.target.target;
    // Resident: what a sync frees goes back while the agent waits for the next one.
    crate::alloc::purge_later();
    let params = target_params_of(&cmd.target)?;
    let mut source = Watched {
        cmd,
        keyed: target.planner.is_some() && !svc_node::ebpf::applies(target),
        cache: svc_compiler::ReadCache::default(),
    };
    svc_node::agent::run(target, &cmd.agent, &params, &mut source)?;
    Ok(Outcome::Done)
}

/// The agent's manifests: read at every sync; each file parsed again only when its bytes
/// changed.
struct Watched<'a> {
    cmd: &'a AgentCmd,
    keyed: bool,
    cache: svc_compiler::ReadCache,
}

impl svc_node::agent::Source for Watched<'_> {
    fn watched(&self) -> Vec<std::path::PathBuf> {
        let opts = &self.cmd.opts;
        opts.paths
            .iter()
            .chain(&opts.lock)
            .map(std::path::PathBuf::from)
            .collect()
    }

    fn input(&mut self) -> Result<Input<'_>, Fail> {
        let cmd = self.cmd;
        manifests(
            &cmd.opts,
            &cmd.target,
            &cmd.nodes,
            self.keyed,
            Some(&mut self.cache),
        )
    }

    fn parsed(&mut self) -> (usize, usize) {
        (self.cache.take_parsed(), self.cache.files())
    }
}

/// `svc-compile cleanup`: `svc_node` answers 0 (removed, or nothing there) or fails.
pub fn cleanup(cmd: &CleanupCmd) -> Result<Outcome, Fail> {
    svc_node::cleanup::cleanup(cmd.target, &cmd.cleanup)?;
    Ok(Outcome::Done)
}

/// `svc-compile drift`: `svc_node` answers 0 (no drift), 1 (drift, printed) or 2 (input
/// errors, printed).
pub fn drift(cmd: &DriftCmd) -> Result<Outcome, Fail> {
    svc_node::drift::preflight(&cmd.drift)?;
    let saved = match &cmd.from_saved {
        Some(file) => Some((file.as_str(), read_file(Path::new(file))?)),
        None => None,
    };
    let input = manifests(&cmd.opts, &cmd.target, &cmd.nodes, false, None)?;
    let code = svc_node::drift::drift(
        cmd.target.target,
        &cmd.drift,
        saved.as_ref().map(|(f, t)| (*f, t.as_str())),
        input,
    )?;
    Ok(match code {
        0 => Outcome::Done,
        1 => Outcome::Differs,
        _ => Outcome::InputErrors,
    })
}

/// The manifests read (the I/O happens now) and, when `keyed`, fingerprinted; compiled
/// when the node crate asks (with the agent's `cache` of parsed files, if given).
pub(crate) fn manifests<'a>(
    opts: &'a CompileOpts,
    target: &'a TargetArgs,
    nodes: &'a Nodes,
    keyed: bool,
    cache: Option<&'a mut svc_compiler::ReadCache>,
) -> Result<Input<'a>, Fail> {
    let mut times = Times::default();
    times.mark("");
    let read = read_all(opts, Some(target))?;
    times.mark("read the inputs");
    Ok(Input::Manifests {
        key: keyed.then(|| inputs_key(&read.sources)),
        times,
        compile: Box::new(move |times: &mut Times| {
            let mut compiled = compile_read(read, cache);
            let mut diags = std::mem::take(&mut compiled.comp.diags);
            let mut views = Vec::new();
            if !diags.has_errors() {
                for (sel, f) in node_jobs(nodes, &compiled.comp, true) {
                    match node_view(&compiled.comp.module, &sel, f) {
                        Ok(v) => views.push(v),
                        Err(d) => diags.push(d),
                    }
                }
            }
            Emitter::new(opts).diagnostics(&diags, &compiled.sources);
            if diags.has_errors() {
                return Ok(Err(1));
            }
            times.mark("parse, passes and node views");
            let locked_ids = std::mem::take(&mut compiled.comp.lock.ebpf);
            let node = nodes.node.clone().unwrap_or_default();
            let node_eligible = svc_targets::health::node_eligible(
                compiled.comp.module.nodes.iter().find(|n| n.name == node),
            );
            let params = compiled.params;
            // Only the views are rendered: what the compile built besides them is freed
            // first, and the renderer writes into that memory instead of new pages (apply
            // keeps freed memory, see `alloc`; 10k services: ~90 MB less at the peak).
            drop((compiled.sources, compiled.comp));
            times.mark("free the compile's objects");
            Ok(Ok(Compiled {
                views,
                params,
                node,
                quiet: diags.items.is_empty(),
                locked_ids,
                node_eligible,
            }))
        }),
    })
}
