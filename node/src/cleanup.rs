//! `svc-compile cleanup`: takes off the node everything `apply` owns there for one target,
//! and nothing else, then forgets the target's records (the next apply is a first apply).
//!
//! Per family (both, whichever were applied): read the node, ask the target's
//! [`RemovalPlanner`] (`Planner::removal`: owned by the same rules as apply's plans, from
//! the node's read and the documents and snapshots recorded), load its document with the
//! planner's load command (as a loader that holds the lock), read the node back and
//! require that the owned part is the removal's expectation (nothing, or chains a rule we
//! do not own still jumps to), and only then remove `STATE/TARGET-FAMILY/`. The inputs'
//! fingerprint (`STATE/TARGET.inputs`) is forgotten before anything is loaded: the fast
//! path must never take a cleaned node for the last apply's.
//!
//! A refused load or owned state left behind is a failure (exit 2) that keeps the records:
//! cleanup can simply run again. `--dry-run` prints the documents and commands instead.

use crate::apply::{check_netns, need_root, Options};
use crate::proc::{check_tools, first_line, run_loader, shell_line, shell_word};
use crate::rules;
use crate::state::{write_atomic, Records, StateDir};
use crate::Fail;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;
use svc_targets::plan::{Commands, Family, Plan, Planner, Recorded, Removal, RemovalPlanner};
use svc_targets::Target;

/// The target's planner and its removal planner, or the one line that says it has none.
/// (eBPF's cleanup is `crate::ebpf::cleanup`.)
fn removal_of(target: &Target) -> Result<(&'static dyn Planner, RemovalPlanner), Fail> {
    match target.planner.and_then(|p| p.removal().map(|r| (p, r))) {
        Some(found) => Ok(found),
        None => {
            let can: Vec<&str> = svc_targets::TARGETS
                .iter()
                .filter(|t| {
                    t.planner.is_some_and(|p| p.removal().is_some()) || crate::ebpf::applies(t)
                })
                .map(|t| t.name)
                .collect();
            let (last, rest) = can.split_last().expect("some target has a cleanup");
            Err(Fail(format!(
                "cleanup --target {} is not yet supported (it is for --target {} and {last}); remove its state by hand",
                target.name,
                rest.join(", ")
            )))
        }
    }
}

/// What `cleanup` checks before anything is read: that the target can be cleaned up,
/// root, and the `--netns` namespace.
pub fn preflight(target: &Target, args: &Options) -> Result<(), Fail> {
    if !crate::ebpf::applies(target) {
        removal_of(target)?;
    }
    need_root("cleanup needs root: it reads and changes the node's packet filter rules (run it as root, or in a privileged pod with hostNetwork)")?;
    check_netns(args.netns.as_deref())
}

/// `svc-compile cleanup`: 0 removed (or nothing there), `Err` anything else.
pub fn cleanup(target: &'static Target, args: &Options) -> Result<u8, Fail> {
    preflight(target, args)?;
    if crate::ebpf::applies(target) {
        return crate::ebpf::cleanup(args);
    }
    let netns = args.netns.as_deref();
    let state = StateDir::new(args.state_dir.as_deref(), netns);
    // Dry runs change nothing: the lock only if the directory exists.
    let lock = match (args.dry_run, state.exists()) {
        (true, false) => None,
        _ => {
            state.create()?;
            Some(state.lock(args.lock_timeout)?)
        }
    };
    remove(
        target,
        &state,
        netns,
        lock.as_ref(),
        args.dry_run,
        &mut |done| {
            println!(
                "svc-compile: cleanup: {} in {}: {}",
                done.what,
                rules::describe(netns),
                match &done.summary {
                    Some(s) => format!("removed {s}"),
                    None => "nothing of ours there".into(),
                }
            )
        },
    )?;
    Ok(0)
}

/// One family's removal: "nftables ipv4", and what was removed (`None`: nothing of ours
/// was there).
pub(crate) struct Removed {
    pub what: String,
    pub summary: Option<String>,
}

/// Takes off the node everything `target` owns there, family by family, and forgets its
/// records (see the module docs), handing each family's outcome to `done` as soon as it
/// is whole; `dry_run` prints each family's script instead. The caller holds the state
/// directory's lock (`lock`, handed to the loaders): `cleanup`, and `apply` removing the
/// target it switches from.
pub(crate) fn remove(
    target: &'static Target,
    state: &StateDir,
    netns: Option<&str>,
    lock: Option<&File>,
    dry_run: bool,
    done: &mut dyn FnMut(&Removed),
) -> Result<(), Fail> {
    let (planner, remove) = removal_of(target)?;
    let families = [Family::V4, Family::V6];
    for f in families {
        check_tools(planner.tools(f), netns.is_some())?;
    }
    if !dry_run {
        remove_file(&state.inputs(target.name))?;
    }
    for family in families {
        let what = format!("{} {}", target.name, family.as_str());
        let cmds = planner.commands(family);
        let dir = state.records(target.name, target.ext, family.as_str());
        let texts = [
            dir.applied(),
            dir.previous(),
            dir.state(),
            dir.previous_state(),
        ]
        .map(|p| fs::read_to_string(p).ok());
        let recorded = Recorded {
            documents: texts[..2].iter().flatten().map(String::as_str).collect(),
            snapshots: texts[2..].iter().flatten().map(String::as_str).collect(),
        };
        let kernel = rules::read_node(planner, cmds.read.clone(), netns)?;
        let removal = remove(family, &kernel, &recorded)
            .map_err(|e| Fail(format!("cleanup: {what}: {e}")))?;
        for w in &removal.warnings {
            eprintln!("svc-compile: warning: {what}: {w}");
        }
        if dry_run {
            print_dry_run(
                &what,
                netns,
                &removal,
                &cmds,
                &dir,
                &state.inputs(target.name),
            );
            continue;
        }
        if let Some(load) = &removal.load {
            dir.create()?;
            let path = dir.load();
            write_atomic(&path, load)?;
            let argv = rules::on_node(netns, cmds.load.clone(), Some(&path));
            let out = run_loader(&argv, lock, &dir.load_log())?;
            if !out.ok {
                return Err(Fail(format!(
                    "cleanup: {what}: {} refused the removal ({}; see {}); the records are kept: run cleanup again",
                    rules::describe(netns),
                    first_line(&out.stderr),
                    dir.load_log().display()
                )));
            }
        }
        let after = rules::read_node(planner, cmds.read.clone(), netns)?;
        let owned = removal
            .owned(&after)
            .map_err(|e| Fail(format!("cleanup: {what}: {e}")))?;
        if owned != removal.expected {
            return Err(Fail(format!(
                "cleanup: {what}: {} still shows owned state after the removal ({}); the records are kept",
                rules::describe(netns),
                Plan::first_difference(&removal.expected, &owned)
            )));
        }
        forget(&dir)?;
        done(&Removed {
            what,
            summary: removal.load.map(|_| removal.summary),
        });
    }
    Ok(())
}

/// Removes one family's records, `STATE/TARGET-FAMILY/` (applied.*, previous.*, the
/// state, generation and fingerprint files, the last load and scratch files).
pub(crate) fn forget(dir: &Records) -> Result<(), Fail> {
    match fs::remove_dir_all(dir.path()) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(Fail(format!("cannot remove {}: {e}", dir.path().display())))
        }
        _ => Ok(()),
    }
}

fn remove_file(path: &Path) -> Result<(), Fail> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(Fail(format!("cannot remove {}: {e}", path.display())))
        }
        _ => Ok(()),
    }
}

/// `--dry-run`: a shell script with the removal document and the commands cleanup runs.
fn print_dry_run(
    what: &str,
    netns: Option<&str>,
    removal: &Removal,
    cmds: &Commands,
    dir: &Records,
    inputs: &Path,
) {
    let mut out = format!(
        "#!/bin/sh\n# svc-compile cleanup --dry-run: {what} in {}\n",
        rules::describe(netns)
    );
    for w in &removal.warnings {
        out += &format!("# warning: {w}\n");
    }
    let records = shell_word(&dir.path().display().to_string());
    match &removal.load {
        None => out += "# nothing of ours there: nothing to load\n",
        Some(load) => {
            let path = dir.load();
            out += &format!(
                "# removes {}\nset -e\nmkdir -p {records}\ncat > {} <<'SVC_COMPILE_EOF'\n{load}SVC_COMPILE_EOF\n",
                removal.summary,
                shell_word(&path.display().to_string())
            );
            out += &shell_line(&rules::on_node(netns, cmds.load.clone(), Some(&path)));
            out.push('\n');
            out += &format!(
                "# then: {} (nothing owned may remain but what is named above)\n",
                shell_line(&rules::on_node(netns, cmds.read.clone(), None))
            );
        }
    }
    out += &format!(
        "rm -rf {records}\nrm -f {}\n",
        shell_word(&inputs.display().to_string())
    );
    let mut stdout = io::stdout().lock();
    let _ = stdout
        .write_all(out.as_bytes())
        .and_then(|_| stdout.flush());
}
