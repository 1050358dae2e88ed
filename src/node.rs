//! `apply` and `drift`: the command line's side. The compile happens here (reading,
//! parsing, passes, node views, diagnostics); everything done to the node is `svc_node`'s.

use crate::cli::Command;
use crate::compile::{compile_read, node_jobs, read_all, target_params_of};
use crate::report::{exit_code, print_diagnostics, Fail};
use svc_compiler::passes::node::node_view;
use svc_node::apply::{inputs_key, Compiled, Input, Options};
use svc_node::times::Times;
use svc_targets::plan::Family;

pub fn apply(cmd: &Command) -> u8 {
    let args = cmd.apply.as_ref().expect("an apply command");
    // nftables plans from documents of tens of MB at 10k services: what the compile frees
    // is what planning takes next (see `alloc`). Elsewhere freed memory goes back as in a
    // compile (iptables at 1k: peak RSS 126 MB kept, 85 MB given back, against a compile's
    // 56 MB; the budget is 2×).
    if cmd
        .target
        .planner
        .is_some_and(|p| p.fingerprint(Family::V4).is_some())
    {
        crate::alloc::purge_never();
    }
    let opts = Options {
        netns: args.netns.clone(),
        dry_run: args.dry_run,
        full: args.full,
        read_back: args.read_back,
        state_dir: args.state_dir.clone(),
        lock_timeout: args.lock_timeout,
        cgroup: args.cgroup.clone(),
        family: cmd.family,
    };
    exit_code((|| {
        let params = target_params_of(cmd)?;
        let input = match (args.rollback, &args.from) {
            (true, _) => Input::Rollback,
            (false, Some(from)) => Input::From(from.clone()),
            (false, None) => manifests(cmd)?,
        };
        svc_node::apply::apply(cmd.target, &opts, &params, input)
    })())
}

pub fn drift(cmd: &Command) -> u8 {
    let args = cmd.drift.as_ref().expect("a drift command");
    let opts = Options {
        netns: args.netns.clone(),
        family: cmd.family,
        ..Options::default()
    };
    exit_code((|| {
        let input = manifests(cmd)?;
        svc_node::drift::drift(cmd.target, &opts, args.from_saved.as_deref(), input)
    })())
}

/// The manifests read (the I/O happens now) and fingerprinted; compiled when the node
/// crate asks.
fn manifests(cmd: &Command) -> Result<Input<'_>, Fail> {
    let mut times = Times::default();
    times.mark("");
    let read = read_all(cmd)?;
    times.mark("read the inputs");
    Ok(Input::Manifests {
        key: inputs_key(&read.sources),
        times,
        compile: Box::new(move |times: &mut Times| {
            let mut compiled = compile_read(cmd, read);
            let mut diags = std::mem::take(&mut compiled.comp.diags);
            let mut views = Vec::new();
            if !diags.has_errors() {
                for (sel, f) in node_jobs(cmd, &compiled.comp, true) {
                    match node_view(&compiled.comp.module, &sel, f) {
                        Ok(v) => views.push(v),
                        Err(d) => diags.push(d),
                    }
                }
            }
            print_diagnostics(cmd, &diags, &compiled.sources, compiled.checked);
            if diags.has_errors() {
                return Ok(Err(1));
            }
            times.mark("parse, passes and node views");
            let locked_ids = std::mem::take(&mut compiled.comp.lock.ebpf);
            let params = compiled.params;
            // Only the views are rendered: what the compile built besides them is freed
            // first, and the renderer writes into that memory instead of new pages (apply
            // keeps freed memory, see `alloc`; 10k services: ~90 MB less at the peak).
            drop((compiled.sources, compiled.comp));
            times.mark("free the compile's objects");
            Ok(Ok(Compiled {
                views,
                params,
                node: cmd.node.clone().unwrap_or_default(),
                quiet: diags.items.is_empty(),
                locked_ids,
            }))
        }),
    })
}
