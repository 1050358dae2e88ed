//! `svc-compile drift`: compiles the node's ruleset, reads what the node shows (live, in
//! `--netns`, or a `--from-saved` listing) and prints what differs, by service
//! (`svc_targets::drift`). Changes nothing on the node.
//!
//! Both sides are compared in the kernel's spelling: the compiled document is loaded into
//! a throwaway network namespace and read back, as `apply` does (so drift needs root, even
//! for a saved listing), and both are cut to the owned part by the target's planner.
//! Exit codes: 0 no drift, 1 drift, 2 anything else (including input errors, so that CI
//! can tell drift from a broken manifest).

use crate::apply::{check_netns, need_root, render, Input, Options};
use crate::proc::check_tools;
use crate::rules;
use crate::state::StateDir;
use crate::Fail;
use svc_targets::drift;
use svc_targets::plan::{self, Family, Planner};
use svc_targets::Target;

/// What `drift` checks before anything is read: root, and the `--netns` namespace.
pub fn preflight(args: &Options) -> Result<(), Fail> {
    need_root("drift needs root: it loads the compiled ruleset into a throwaway network namespace to learn the kernel's spelling (and reads the node's rules)")?;
    check_netns(args.netns.as_deref())
}

/// `svc-compile drift`: 0 no drift, 1 drift, 2 (`Err`, or input errors) anything else.
/// `from_saved`: a saved listing (where it came from, its text, read by the caller)
/// instead of the node's.
pub fn drift(
    target: &'static Target,
    args: &Options,
    from_saved: Option<(&str, &str)>,
    input: Input<'_>,
) -> Result<u8, Fail> {
    let Some(planner) = target.planner else {
        return Err(Fail(format!(
            "drift does not take --target {}",
            target.name
        )));
    };
    preflight(args)?;
    let Input::Manifests {
        mut times, compile, ..
    } = input
    else {
        return Err(Fail(
            "drift compares compiled manifests with the node".into(),
        ));
    };
    let compiled = match compile(&mut times)? {
        Ok(c) => c,
        // Input errors are printed; 1 means drift here.
        Err(_) => return Ok(2),
    };
    let node = compiled.node.clone();
    let docs = render(target, compiled, &|_| 0, &mut times);
    if from_saved.is_some() && docs.len() > 1 {
        return Err(Fail(
            "--from-saved is one family's listing: give --family ipv4 or ipv6".into(),
        ));
    }
    let state = StateDir::new(args.state_dir.as_deref(), args.netns.as_deref());
    let mut drifted = false;
    for (family, doc, _) in &docs {
        if from_saved.is_none() {
            same_layout(planner, target, &state, *family, doc)?;
        }
        check_tools(planner.tools(*family), args.netns.is_some())?;
        let (listing, source) = match from_saved {
            Some((file, text)) => (text.to_string(), file.to_string()),
            None => read_node(planner, *family, args.netns.as_deref())?,
        };
        let kernel =
            drift::node_state(&listing, *family).map_err(|e| Fail(format!("{source}: {e}")))?;
        let prepared = planner
            .prepare(doc, *family, None, &kernel, true)
            .map_err(|e| Fail(format!("{source}: {e}")))?;
        let back = scratch(&prepared, &planner.commands(*family).scratch)?;
        let plan = plan::plan(&prepared, &back).map_err(Fail)?;
        let actual = plan
            .owned(&kernel)
            .map_err(|e| Fail(format!("{source}: {e}")))?;
        let items = drift::compare(drift::syntax_of(&plan.expected), &plan.expected, &actual);
        drifted |= !items.is_empty();
        let title = format!(
            "node {node} ({}, {}) against {source}",
            target.name,
            family.as_str()
        );
        print!("{}", drift::render(&title, &items));
    }
    Ok(u8::from(drifted))
}

/// `Err` when the last apply on this node (its record in `state`) wrote another layout
/// than `doc`'s: every object would differ, so the layouts are named instead.
fn same_layout(
    planner: &dyn Planner,
    target: &Target,
    state: &StateDir,
    family: Family,
    doc: &str,
) -> Result<(), Fail> {
    let applied = state
        .records(target.name, target.ext, family.as_str())
        .applied();
    let Ok(applied_doc) = std::fs::read_to_string(&applied) else {
        return Ok(());
    };
    match (planner.layout_of(&applied_doc), planner.layout_of(doc)) {
        (Some((flag, was)), Some((_, now))) if was != now => Err(Fail(format!(
            "{} {}: the node was applied with {flag} {was} ({}), these manifests compile with {flag} {now}: every object would differ; run drift with {flag} {was}",
            target.name,
            family.as_str(),
            applied.display()
        ))),
        _ => Ok(()),
    }
}

/// The node's listing (`Commands::read`, inside `netns`), and where it came from.
fn read_node(
    planner: &dyn Planner,
    family: Family,
    netns: Option<&str>,
) -> Result<(String, String), Fail> {
    let listing = rules::read_node(planner, planner.commands(family).read, netns)?;
    Ok((listing, rules::describe(netns)))
}

/// The compiled document as the kernel spells it: loaded into a throwaway namespace.
fn scratch(prepared: &plan::Prepared, argv: &[String]) -> Result<String, Fail> {
    if prepared.scratch.is_empty() {
        return Ok(String::new());
    }
    let dir = tempdir()?;
    let path = dir.join("compiled");
    let res = std::fs::write(&path, &prepared.scratch)
        .map_err(|e| Fail(format!("cannot write {}: {e}", path.display())))
        .and_then(|()| rules::load_scratch(argv, &path));
    let _ = std::fs::remove_dir_all(&dir);
    res?.map_err(|e| {
        Fail(format!(
            "the kernel refuses the compiled ruleset (loaded into an empty network namespace): {e}"
        ))
    })
}

/// A fresh private directory for the scratch document.
fn tempdir() -> Result<std::path::PathBuf, Fail> {
    use std::os::unix::fs::DirBuilderExt;
    let base = std::env::temp_dir();
    for n in 0..100u32 {
        let dir = base.join(format!("svc-compile-drift-{}-{n}", std::process::id()));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(Fail(format!("cannot create {}: {e}", dir.display()))),
        }
    }
    Err(Fail("cannot create a temporary directory".into()))
}
