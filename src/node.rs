//! `apply`, `cleanup` and `drift`: the command line's side. The compile happens here (reading,
//! parsing, passes, node views, diagnostics); everything done to the node is `svc_node`'s.

use crate::cli::{
    AgentCmd, ApplyCmd, ApplySource, CleanupCmd, CompileOpts, DriftCmd, Nodes, TargetArgs,
};
use crate::compile::{compile_read, node_jobs, read_all, target_params_of};
use crate::inputs::read_file;
use crate::report::{Emitter, Fail, Outcome};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use svc_compiler::net::IpFamily;
use svc_compiler::passes::node::node_view;
use svc_compiler::source::{FileId, SourceMap};
use svc_node::agent::changes::{Kind, Object};
use svc_node::agent::files::FileCache;
use svc_node::apply::{inputs_key, Compiled, Input};
use svc_node::times::Times;
use svc_targets::plan::Family;

/// `svc-compile apply`: `svc_node` answers 0 (applied) or 1 (input errors, printed).
pub fn apply(cmd: &ApplyCmd) -> Result<Outcome, Fail> {
    let out = StdoutTo::file(cmd.output.as_deref())?;
    out.finish(apply_to_stdout(cmd))
}

fn apply_to_stdout(cmd: &ApplyCmd) -> Result<Outcome, Fail> {
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
        cache: AgentCache::default(),
    };
    svc_node::agent::run(target, &cmd.agent, &params, &mut source)?;
    Ok(Outcome::Done)
}

/// The agent's manifests: read at every sync; each file parsed again only when its bytes
/// changed.
struct Watched<'a> {
    cmd: &'a AgentCmd,
    keyed: bool,
    cache: AgentCache,
}

/// What the agent keeps between compiles: each file's parse, and each file's Services and
/// EndpointSlices as the change counters see them (made again only for a file whose
/// fingerprint changed).
#[derive(Default)]
pub(crate) struct AgentCache {
    /// Each input file's text and fingerprint, kept by its `stat`.
    files: FileCache,
    read: svc_compiler::ReadCache,
    objects: HashMap<String, ((u64, u64), Vec<Object>)>,
}

impl AgentCache {
    /// The inputs' Services and EndpointSlices, in file order.
    fn objects(
        &mut self,
        sources: &SourceMap,
        objects: &svc_compiler::k8s::Objects,
    ) -> Vec<Object> {
        let mut by_file: BTreeMap<FileId, Vec<Object>> = BTreeMap::new();
        // A file's objects are made again when its bytes changed since they were made.
        let fresh: HashSet<FileId> = (0..sources.files.len())
            .map(|i| FileId(i as u32))
            .filter(|&f| {
                self.objects
                    .get(sources.name(f))
                    .is_none_or(|(print, _)| *print != sources.print(f))
            })
            .collect();
        let fresh = |f: FileId| fresh.contains(&f);
        for s in objects.services.iter().filter(|s| fresh(s.span.file)) {
            by_file.entry(s.span.file).or_default().push(Object {
                kind: Kind::Service,
                key: format!("{}/{}", s.meta.namespace.v, s.meta.name.v),
                print: print_of(s),
                trigger: None,
            });
        }
        for s in objects.slices.iter().filter(|s| fresh(s.span.file)) {
            let family = match s.address_type.as_ref().map(|a| a.v.as_str()) {
                Some("IPv4") => Some(IpFamily::IPv4),
                Some("IPv6") => Some(IpFamily::IPv6),
                _ => None,
            };
            by_file.entry(s.span.file).or_default().push(Object {
                kind: Kind::Slice(family),
                key: format!("{}/{}", s.meta.namespace.v, s.meta.name.v),
                print: print_of(s),
                trigger: s
                    .meta
                    .annotation("endpoints.kubernetes.io/last-change-trigger-time")
                    .map(|t| t.v.clone()),
            });
        }
        let mut all = Vec::new();
        let mut kept = HashMap::new();
        for (id, f) in sources.files.iter().enumerate() {
            let id = FileId(id as u32);
            let objects = match by_file.remove(&id) {
                Some(new) => new,
                None if fresh(id) => Vec::new(),
                None => self
                    .objects
                    .remove(&f.name)
                    .map(|o| o.1)
                    .unwrap_or_default(),
            };
            all.extend(objects.iter().cloned());
            kept.insert(f.name.clone(), (sources.print(id), objects));
        }
        self.objects = kept;
        all
    }
}

/// An object's content as decoded, without the locations (`Span { … }` in its `Debug`):
/// the same object written elsewhere in its file has the same print.
fn print_of(o: &impl std::fmt::Debug) -> u64 {
    use std::hash::{DefaultHasher, Hasher};
    const SPAN: &str = "Span { file: FileId(";
    let text = format!("{o:?}");
    let mut h = DefaultHasher::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find(SPAN) {
        h.write(&rest.as_bytes()[..i]);
        rest = rest[i..].split_once('}').map_or("", |(_, after)| after);
    }
    h.write(rest.as_bytes());
    h.finish()
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
        (self.cache.read.take_parsed(), self.cache.read.files())
    }
}

/// `svc-compile cleanup`: `svc_node` answers 0 (removed, or nothing there) or fails.
pub fn cleanup(cmd: &CleanupCmd) -> Result<Outcome, Fail> {
    let out = StdoutTo::file(cmd.output.as_deref())?;
    let r = svc_node::cleanup::cleanup(cmd.target, &cmd.cleanup).map(|_| Outcome::Done);
    out.finish(r)
}

/// `svc-compile drift`: `svc_node` answers 0 (no drift), 1 (drift, printed) or 2 (input
/// errors, printed).
pub fn drift(cmd: &DriftCmd) -> Result<Outcome, Fail> {
    let out = StdoutTo::file(cmd.output.as_deref())?;
    out.finish(drift_to_stdout(cmd))
}

fn drift_to_stdout(cmd: &DriftCmd) -> Result<Outcome, Fail> {
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

/// `-o FILE` for `apply`, `cleanup` and `drift`: `svc_node` prints their reports as they
/// happen (a family applied, a script line), so while the command runs the process's
/// standard output is a file beside FILE, renamed to FILE when the command ends with an
/// answer (any exit code but 2) and removed when it fails. Diagnostics stay on stderr.
struct StdoutTo(Option<(OwnedFd, PathBuf, String)>);

impl StdoutTo {
    fn file(path: Option<&str>) -> Result<StdoutTo, Fail> {
        let Some(path) = path else {
            return Ok(StdoutTo(None));
        };
        let fail = |e: std::io::Error| Fail(format!("cannot write {path}: {e}"));
        let part = PathBuf::from(format!("{path}.part-{}", std::process::id()));
        let file = std::fs::File::create(&part).map_err(fail)?;
        std::io::stdout().flush().map_err(fail)?;
        // SAFETY: dup and dup2 on descriptors this process owns; the saved copy is owned
        // by the returned value and closed when it drops.
        let saved = unsafe { libc::dup(1) };
        if saved < 0 || unsafe { libc::dup2(file.as_raw_fd(), 1) } < 0 {
            let _ = std::fs::remove_file(&part);
            return Err(fail(std::io::Error::last_os_error()));
        }
        let saved = unsafe { OwnedFd::from_raw_fd(saved) };
        Ok(StdoutTo(Some((saved, part, path.to_string()))))
    }

    /// The command's end: its report becomes FILE unless it failed.
    fn finish(mut self, r: Result<Outcome, Fail>) -> Result<Outcome, Fail> {
        let Some((saved, part, path)) = self.0.take() else {
            return r;
        };
        restore(&saved);
        match r {
            Ok(o) => std::fs::rename(&part, &path)
                .map(|()| o)
                .map_err(|e| Fail(format!("cannot write {path}: {e}"))),
            Err(e) => {
                let _ = std::fs::remove_file(&part);
                Err(e)
            }
        }
    }
}

/// Standard output back to `saved`, after what was printed to the file is flushed.
fn restore(saved: &OwnedFd) {
    let _ = std::io::stdout().flush();
    // SAFETY: dup2 onto the process's own stdout; `saved` is open for the call.
    unsafe { libc::dup2(saved.as_raw_fd(), 1) };
}

impl Drop for StdoutTo {
    /// A panic on the way: the partial report is removed.
    fn drop(&mut self) {
        if let Some((saved, part, _)) = &self.0 {
            restore(saved);
            let _ = std::fs::remove_file(part);
        }
    }
}

/// The manifests read (the I/O happens now) and, when `keyed`, fingerprinted; compiled
/// when the node crate asks (with the agent's `cache` of parsed files, if given).
pub(crate) fn manifests<'a>(
    opts: &'a CompileOpts,
    target: &'a TargetArgs,
    nodes: &'a Nodes,
    keyed: bool,
    cache: Option<&'a mut AgentCache>,
) -> Result<Input<'a>, Fail> {
    let mut times = Times::default();
    times.mark("");
    let mut cache = cache;
    let read = read_all(opts, Some(target), cache.as_mut().map(|c| &mut c.files))?;
    if let Some(c) = cache.as_mut() {
        c.files.sweep();
    }
    times.mark("read the inputs");
    Ok(Input::Manifests {
        key: keyed.then(|| inputs_key(&read.sources)),
        times,
        compile: Box::new(move |times: &mut Times| {
            let mut compiled = compile_read(read, cache.as_mut().map(|c| &mut c.read));
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
            let objects = match cache {
                Some(c) => c.objects(&compiled.sources, &compiled.comp.objects),
                None => Vec::new(),
            };
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
                objects,
            }))
        }),
    })
}
