//! `svc-compile apply`: runs the plans `svc_targets::plan` makes. The only code that runs
//! iptables or nft, and the only writer of the state directory.
//!
//! One apply, per family:
//!
//! 1. take the lock (`flock` on `STATE/lock`, bounded wait);
//! 2. read the node (`iptables-save` / `nft -j list table`) and the last apply's record —
//!    unless the node's nf_tables generation id is the one recorded with it (the fast path,
//!    see [`crate::nfgen`]): then nothing was committed since, and the record is the node;
//! 3. plan step one; load its scratch document into a new, empty network namespace
//!    (`unshare --net`) and read it back: that refuses a document the kernel rejects before
//!    the node is touched, and gives the kernel's spelling of the rules (only what the
//!    plan writes; a read-back already seen this boot is reused, `scratch.out`);
//! 4. plan step two; check the load document on the node (`--test` / `nft -c`), unless
//!    it is one transaction ([`Planner::transactions`]): refused, it changes nothing;
//! 5. load it, in a child that holds the lock and runs in its own process group, from a
//!    file: if this process dies, the load still completes and the next apply waits for it;
//! 6. read the node back and compare the owned part with the plan's expectation — on the
//!    fast path, the generation advanced by exactly the load's transactions proves that
//!    only this load changed the node, and the expectation is the new state;
//! 7. record the document and that owned state (`applied.*`, the one before moved to
//!    `previous.*` for `--rollback`), and the generation it holds at (`applied.gen`);
//! 8. after a load of a changed document compiled from manifests, delete the family's
//!    stale UDP conntrack entries, as kube-proxy does after a sync
//!    ([`crate::conntrack`], decided by `svc_targets::plan::conntrack`). `--from` and
//!    `--rollback` have no views to tell the services' endpoints by, so they clean
//!    nothing; a cleanup that fails is a warning, the load stands.
//!
//! Once every family is in: an iptables or nftables apply that finds another proxy mode's
//! records in the state directory takes that mode's rules off ([`crate::cleanup::remove`],
//! under this apply's lock); a removal that fails is a warning, this apply stands.
//!
//! What comes next at each point (the fast paths, a repair, a retry in full after a
//! refusal, a read back, a restart) is `decide::Decider`'s choice; this module carries
//! out the steps it names.
//!
//! A failed load leaves the previous state: nftables loads one transaction; iptables
//! commits table by table, so tables a failed load did commit are put back from what the
//! node showed before (`Plan::revert`).
//!
//! State directory, per network namespace: `lock`, and per target and family
//! (`iptables-ipv4/`, …) `applied.{rules,nft}` + `applied.state`, `previous.*`, the
//! last `load.*` document and `load.log` (the loader's output). A `.state` file starts with
//! the hash of the document it belongs to; a pair that does not match (a kill between the
//! two writes) counts as no record, so the next apply loads everything.

mod decide;

use crate::conntrack;
use crate::nfgen::{self, Generation};
use crate::nftdigest::{self, Digest};
use crate::proc::{
    check_tools, first_line, run_captured, run_loader, shell_line, shell_word, tools_identity,
};
use crate::rules;
use crate::state::{write_atomic, write_atomic_parts, NextDocument, Records, StateDir};
use crate::sysctl;
use crate::times::Times;
use crate::Fail;
use decide::{By, Decider, Failure, Note, Outcome, PlanFrom, Planned, Seen, Setup, Step};
use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process;
use std::time::Instant;
use svc_compiler::ir::NodeView;
use svc_compiler::net::IpFamily;
use svc_compiler::passes::allocate::NodeIds;
use svc_compiler::source::SourceMap;
use svc_targets::plan::conntrack::Spec;
use svc_targets::plan::{self, Commands, Family, Mode, Plan, Planner, Prepared, Previous};
use svc_targets::{Params, Render, Sharing, Target};

/// Where and how `apply` (and `drift`) run on the node: the flags that concern the node.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// `--netns NS`: the node is the named network namespace.
    pub netns: Option<String>,
    pub dry_run: bool,
    pub full: bool,
    /// `--read-back`: read the node after a first load even where the generation proves it.
    pub read_back: bool,
    pub state_dir: Option<String>,
    pub lock_timeout: Option<f64>,
    /// `--cgroup` (ebpf only).
    pub cgroup: Option<String>,
    /// `--family`: that family only.
    pub family: Option<IpFamily>,
}

/// What to apply.
pub enum Input<'a> {
    /// The manifests, read but not yet compiled: `key` fingerprints every byte the compile
    /// reads ([`inputs_key`]); `compile` compiles them (printing the diagnostics), and is
    /// not called when the key and the node show that the last apply's state stands.
    Manifests {
        /// `None`: the caller's target has no fast path before the compile.
        key: Option<String>,
        /// The reading's times; the compile and the render add theirs.
        times: Times,
        compile: Box<dyn FnOnce(&mut Times) -> Compile + 'a>,
    },
    /// `--from FILE`: a compiled document, read by the caller (within its input limits):
    /// where it came from, its text. No views: no stale UDP conntrack entries are cleaned
    /// after its load (which endpoints serve is not known from a document).
    From { path: String, text: String },
    /// `--rollback`: the previous documents of the state directory. As for `From`, no
    /// conntrack cleanup.
    Rollback,
}

/// What [`Input::Manifests`]' compile gives: `Ok(Err(code))` when the input has errors.
pub type Compile = Result<Result<Compiled, u8>, Fail>;

/// The node's views as the caller compiled them (diagnostics already printed; what the
/// compile built besides the views already freed).
pub struct Compiled {
    /// One per family, in family order.
    pub views: Vec<NodeView>,
    /// The target's flags.
    pub params: Params,
    /// The node's name (`--node`).
    pub node: String,
    /// No diagnostic was printed.
    pub quiet: bool,
    /// eBPF service and backend ids the `--lock` file holds, by (node, family).
    pub locked_ids: BTreeMap<(String, String), NodeIds>,
    /// The node may take load-balancer traffic (`svc_targets::health::node_eligible`: its
    /// Node manifest is among the inputs, not being deleted nor tainted for deletion); the
    /// agent's `/healthz` says so, as kube-proxy's does.
    pub node_eligible: bool,
    /// The Services and EndpointSlices of the inputs, for the agent's change counters
    /// (empty unless the caller was asked for them).
    pub objects: Vec<crate::agent::changes::Object>,
}

/// The report's words for the fast path (tests look for them).
const BY_GENERATION: &str = "node state known by its nf_tables generation, not read";
/// The report's words when nf_tables changed but our table's fingerprint is the record's.
const BY_FINGERPRINT: &str =
    "node state known by its fingerprint, not read: nf_tables changed elsewhere";
/// The report's words when our table's fingerprint differed in some chains and sets only,
/// and those were written again (with the rest of the plan) instead of everything.
const BY_REPAIR: &str =
    "node state known by its fingerprint, not read: what differed from the record was mended";

/// A document to apply: its family, its text, where it came from.
pub(crate) type Document = (Family, String, String);

/// Where and how this apply runs.
struct Ctx<'a> {
    args: &'a Options,
    target: &'static Target,
    planner: &'static dyn Planner,
    state: StateDir,
    lock: Option<File>,
}

/// `svc-compile apply`: 0 applied (or nothing to do), 1 the input has errors (printed by
/// the compile), `Err` anything else.
pub fn apply(
    target: &'static Target,
    args: &Options,
    params: &Params,
    input: Input<'_>,
) -> Result<u8, Fail> {
    // The socket load balancer is loaded in-process, not by a planner's commands.
    if crate::ebpf::applies(target) {
        return crate::ebpf::apply(target, args, params, input);
    }
    let Some(planner) = target.planner else {
        return Err(Fail(format!(
            "apply does not take --target {}",
            target.name
        )));
    };
    need_root("apply needs root: it reads and loads the node's packet filter rules (run it as root, or in a privileged pod with hostNetwork)")?;
    check_netns(args.netns.as_deref())?;
    let mut ctx = Ctx {
        args,
        target,
        planner,
        state: StateDir::new(args.state_dir.as_deref(), args.netns.as_deref()),
        lock: None,
    };

    // The inputs are read and fingerprinted: the same inputs as the last apply's, with the
    // node's nf_tables generation still the one it left, need no compile.
    let rollback = matches!(input, Input::Rollback);
    let (mut key, compile, input_from) = match input {
        Input::Manifests {
            key,
            times,
            compile,
        } => (
            key.filter(|_| !args.full && !args.dry_run),
            Some((times, compile)),
            None,
        ),
        Input::From { path, text } => (None, None, Some((path, text))),
        Input::Rollback => (None, None, None),
    };
    if let Some(key) = &key {
        if ctx.state.exists() {
            ctx.lock = Some(ctx.state.lock(args.lock_timeout)?);
            if ctx.unchanged_inputs(key)? {
                return Ok(0);
            }
        }
    }

    // The stale UDP conntrack entries to clean after each family's load, from the views
    // (`--from` and `--rollback` have none: nothing is cleaned).
    let mut cleanups: Vec<(Family, Spec)> = Vec::new();
    // KubeProxyConfiguration's conntrack sysctls, from the views (none for `--from`).
    let mut conntrack_sysctls = None;
    // What to apply: (family, document, where it came from).
    let docs: Vec<Document> = match (&input_from, compile) {
        (_, _) if rollback => Vec::new(), // read under the lock
        (Some((from, doc)), _) => {
            let doc = doc.clone();
            let family = match (args.family, planner.family_of(&doc)) {
                (Some(f), _) => family_of_ip(f),
                (None, Some(f)) => f,
                (None, None) => {
                    return Err(Fail(format!(
                        "cannot tell the IP family of {from}: give --family ipv4 or ipv6"
                    )))
                }
            };
            vec![(family, doc, from.clone())]
        }
        (None, Some((mut times, compile))) => {
            // The last applied document's size, and some room to grow.
            let size = |f: Family| {
                let applied = ctx.dir(f).applied();
                fs::metadata(applied).map_or(0, |m| m.len() as usize + m.len() as usize / 16)
            };
            let compiled = match compile(&mut times)? {
                Ok(c) => c,
                Err(code) => return Ok(code),
            };
            // A fast path would not show the diagnostics again: only a quiet compile is
            // fingerprinted.
            if !compiled.quiet {
                key = None;
            }
            cleanups = compiled
                .views
                .iter()
                .map(|v| (family_of_ip(v.family), plan::conntrack::spec(v)))
                .collect();
            conntrack_sysctls = compiled
                .views
                .first()
                .map(|v| plan::sysctls::conntrack(&v.conntrack, sysctl::cpus()));
            let docs = render(target, compiled, &size, &mut times);
            times.print("compile");
            docs
        }
        (None, None) => Vec::new(),
    };
    let families: Vec<Family> = if rollback {
        match args.family {
            Some(f) => vec![family_of_ip(f)],
            None => vec![Family::V4, Family::V6],
        }
    } else {
        docs.iter().map(|d| d.0).collect()
    };
    for f in &families {
        check_tools(planner.tools(*f), args.netns.is_some())?;
    }

    // Dry runs change nothing: no state directory is created, the lock is taken only if
    // one exists.
    if ctx.lock.is_none() && (!args.dry_run || ctx.state.exists()) {
        ctx.state.create()?;
        ctx.lock = Some(ctx.state.lock(args.lock_timeout)?);
    }

    let docs = if rollback {
        let mut docs = Vec::new();
        for f in families {
            // A family without a previous document stays as it is.
            if let Some((p, doc, _)) = ctx.dir(f).rollback_document(false) {
                docs.push((f, doc, p.display().to_string()));
            }
        }
        if docs.is_empty() {
            return Err(Fail(format!(
                "nothing to roll back to: no earlier {} apply recorded in {}",
                target.name,
                ctx.state.path().display()
            )));
        }
        docs
    } else {
        docs
    };
    // `previous` is what the last apply replaced, in every family: when an apply changes
    // one family, every other recorded family (left as it was, or not applied at all)
    // gets its current document as `previous`, so that a rollback gives the pair the node
    // had before this apply rather than an older apply's document.
    let applied_path = |f: Family| ctx.dir(f).applied();
    let changed: Vec<Family> = docs
        .iter()
        .filter(|(f, doc, _)| !holds(&applied_path(*f), doc))
        .map(|(f, ..)| *f)
        .collect();
    let mut ends = Vec::new();
    for (family, doc, source) in &docs {
        let cleanup = cleanups.iter().find(|c| c.0 == *family).map(|c| &c.1);
        ends.push(ctx.apply_one(*family, doc, source, cleanup)?);
        // Once its rules are in (the martian rule before route_localnet opens 127/8).
        if !args.dry_run {
            let what = format!("{} {}", target.name, family.as_str());
            for s in sysctl::ensure(args.netns.as_deref(), &planner.sysctls(doc))? {
                eprintln!("svc-compile: note: {what}: set {s}, which its rules need");
            }
        }
    }
    // As kube-proxy at its start, in every mode; a failure is said, not fatal: the rules
    // are loaded.
    if let (false, Some(c)) = (args.dry_run, &conntrack_sysctls) {
        let what = target.name;
        match sysctl::ensure_conntrack(args.netns.as_deref(), c) {
            Ok((set, left)) => {
                // What was left is said with what was set: once per node, not every apply.
                if let Some(l) = left.filter(|_| !set.is_empty()) {
                    eprintln!("svc-compile: note: {what}: {l}");
                }
                for s in set {
                    eprintln!(
                        "svc-compile: note: {what}: set {s} (KubeProxyConfiguration conntrack)"
                    );
                }
            }
            Err(Fail(e)) => eprintln!("svc-compile: warning: {what}: {e}"),
        }
    }
    if !args.dry_run && !changed.is_empty() {
        for f in [Family::V4, Family::V6]
            .into_iter()
            .filter(|f| !changed.contains(f))
        {
            if let Ok(doc) = fs::read_to_string(applied_path(f)) {
                write_atomic(&ctx.dir(f).previous(), &doc)?;
            }
        }
    }
    if let Some(key) = &key {
        ctx.record_inputs(key, &docs, &ends)?;
    }
    ctx.switch_from_others();
    Ok(0)
}

/// The proxy modes: one node runs one of them, as kube-proxy does. An apply of the first
/// two takes off what an apply of another left ([`Ctx::switch_from_others`]); an IPVS
/// apply does not, since its iptables part is in the chains an iptables apply recorded
/// (the removal would take them).
const PROXY_MODES: [&str; 3] = ["iptables", "nftables", "ipvs"];
const SWITCHES_MODE: [&str; 2] = ["iptables", "nftables"];

/// Whether the file holds exactly `text`; read only when the sizes agree (the applied
/// document of a 10k-service node is 58 MB, and a changed one rarely keeps its size).
fn holds(path: &Path, text: &str) -> bool {
    fs::metadata(path).is_ok_and(|m| m.len() == text.len() as u64)
        && fs::read(path).is_ok_and(|b| b == text.as_bytes())
}

pub(crate) fn family_of_ip(f: IpFamily) -> Family {
    match f {
        IpFamily::IPv4 => Family::V4,
        IpFamily::IPv6 => Family::V6,
    }
}

/// The node's documents, one per family of `compiled`'s views, rendered by `target`.
/// `capacity` guesses a family's document size (the last one applied): a 58 MB document
/// grown by doubling copies itself and touches twice the memory.
pub(crate) fn render(
    target: &Target,
    compiled: Compiled,
    capacity: &dyn Fn(Family) -> usize,
    times: &mut Times,
) -> Vec<Document> {
    let Render::Node(new) = target.render else {
        unreachable!("targets with a planner render per node")
    };
    let what = format!("the manifests for node {}", compiled.node);
    let renderer = new(&compiled.params, Sharing::One);
    let docs = compiled
        .views
        .iter()
        .map(|v| {
            let family = family_of_ip(v.family);
            let mut doc = String::with_capacity(capacity(family));
            renderer.render_into(v, &mut doc);
            (family, doc, what.clone())
        })
        .collect();
    times.mark("render");
    docs
}

/// What `apply` checks before anything is read: root, and the `--netns` namespace. The
/// caller runs it before reading the inputs, so that a refusal costs nothing.
pub fn preflight(target: &Target, args: &Options) -> Result<(), Fail> {
    if crate::ebpf::applies(target) {
        need_root(
            "apply needs root: it loads BPF programs and maps and attaches them to a cgroup",
        )?;
    } else {
        need_root("apply needs root: it reads and loads the node's packet filter rules (run it as root, or in a privileged pod with hostNetwork)")?;
    }
    check_netns(args.netns.as_deref())
}

/// `Err` with `why` unless this process is root.
pub(crate) fn need_root(why: &str) -> Result<(), Fail> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Fail(why.into()));
    }
    Ok(())
}

/// `Err` unless `ip netns` knows the network namespace `ns`.
pub(crate) fn check_netns(ns: Option<&str>) -> Result<(), Fail> {
    match ns {
        Some(ns) if !Path::new("/run/netns").join(ns).exists() => Err(Fail(format!(
            "no network namespace `{ns}` (see `ip netns list`)"
        ))),
        _ => Ok(()),
    }
}

impl Ctx<'_> {
    /// This target's records for `family`.
    fn dir(&self, family: Family) -> Records {
        self.state
            .records(self.target.name, self.target.ext, family.as_str())
    }

    /// `argv` inside the node's network namespace.
    fn on_node(&self, argv: Vec<String>, file: Option<&Path>) -> Vec<String> {
        rules::on_node(self.args.netns.as_deref(), argv, file)
    }

    fn where_(&self) -> String {
        rules::describe(self.args.netns.as_deref())
    }

    /// After this apply's rules are loaded and verified: another proxy mode's records in
    /// the state directory mean its rules are on the node too, and both would DNAT the
    /// same services. They are taken off as `svc-compile cleanup` does, under the lock
    /// this apply holds. A removal that fails is a warning: this apply stands.
    fn switch_from_others(&self) {
        if !SWITCHES_MODE.contains(&self.target.name) {
            return;
        }
        let netns = self.args.netns.as_deref();
        let now = self.target.name;
        for other in svc_targets::TARGETS
            .iter()
            .copied()
            .filter(|t| t.name != now && PROXY_MODES.contains(&t.name))
        {
            let recorded = [Family::V4, Family::V6].into_iter().any(|f| {
                self.state
                    .records(other.name, other.ext, f.as_str())
                    .applied()
                    .exists()
            });
            if !recorded {
                continue;
            }
            let mut cmd = vec!["svc-compile", "cleanup", "--target", other.name]
                .into_iter()
                .map(String::from)
                .collect::<Vec<_>>();
            if let Some(ns) = netns {
                cmd.extend(["--netns".into(), ns.into()]);
            }
            if let Some(dir) = &self.args.state_dir {
                cmd.extend(["--state-dir".into(), dir.clone()]);
            }
            let cmd = shell_line(&cmd);
            let switching = format!("switching to {now}");
            if other.planner.and_then(|p| p.removal()).is_none() {
                eprintln!(
                    "svc-compile: warning: {}: the {} rules of the last apply are still in place ({switching}) and svc-compile cannot remove them yet: remove them by hand",
                    self.where_(),
                    other.name
                );
                continue;
            }
            if self.args.dry_run {
                println!(
                    "# then: remove the {} rules of the last apply ({switching}), as `{cmd}` does",
                    other.name
                );
                continue;
            }
            let mut removed = false;
            let lock = self.lock.as_ref();
            let done = &mut |d: &crate::cleanup::Removed| removed |= d.summary.is_some();
            match crate::cleanup::remove(other, &self.state, netns, lock, false, done) {
                Ok(()) if !removed => eprintln!(
                    "svc-compile: note: {}: forgot the records of the last {} apply, whose rules were gone already ({switching})",
                    self.where_(),
                    other.name
                ),
                Ok(()) => eprintln!(
                    "svc-compile: note: {}: removed the {} rules of the last apply ({switching})",
                    self.where_(),
                    other.name
                ),
                Err(Fail(e)) => eprintln!(
                    "svc-compile: warning: {}: {now} is applied, but the {} rules of the last apply are still in place and both answer the same services ({e}); run `{cmd}`",
                    self.where_(),
                    other.name
                ),
            }
        }
    }

    /// The record of the last apply's inputs: `STATE/TARGET.inputs`.
    fn inputs_file(&self) -> PathBuf {
        self.state.inputs(self.target.name)
    }

    /// The fast path before compiling: the inputs fingerprint as the last apply recorded
    /// it, and the node's nf_tables generation still the one that apply ended at (so
    /// nothing was committed since, and every family is as that apply verified it).
    /// Prints each family's report and returns true; false: compile and apply as usual.
    /// Err: a tool the target loads with is missing.
    fn unchanged_inputs(&self, key: &str) -> Result<bool, Fail> {
        let start = Instant::now();
        let Ok(text) = fs::read_to_string(self.inputs_file()) else {
            return Ok(false);
        };
        let Some(rec) = InputsRecord::parse(&text) else {
            return Ok(false);
        };
        if rec.key != key || nfgen::generation(self.args.netns.as_deref()) != Some(rec.generation) {
            return Ok(false);
        }
        // Nothing to load, but a node without its tools is broken all the same: said now,
        // not at the next change.
        for f in &rec.families {
            check_tools(self.planner.tools(*f), self.args.netns.is_some())?;
        }
        for f in rec.families {
            println!(
                "svc-compile: {} {} unchanged in {}: {}: {}; verified in {} ms ({BY_GENERATION}); {NOT_COMPILED}",
                self.target.name,
                f.as_str(),
                self.where_(),
                Mode::Unchanged,
                plan::Summary::default(),
                start.elapsed().as_millis(),
            );
        }
        Ok(true)
    }

    /// After every family applied: records the inputs fingerprint with the generation
    /// they all ended at, if each was verified at that same generation (a family whose
    /// state nf_tables does not track, or one verified before a later family's load,
    /// leaves no record: the next apply compiles). Any other outcome removes the record.
    fn record_inputs(
        &self,
        key: &str,
        docs: &[Document],
        ends: &[Option<Generation>],
    ) -> Result<(), Fail> {
        let path = self.inputs_file();
        let last = ends.last().cloned().flatten();
        match last {
            Some(g) if ends.iter().all(|e| e.as_ref() == Some(&g)) => {
                let rec = InputsRecord {
                    key: key.to_string(),
                    families: docs.iter().map(|d| d.0).collect(),
                    generation: g,
                };
                write_atomic(&path, &rec.to_text())
            }
            _ => {
                let _ = fs::remove_file(&path);
                Ok(())
            }
        }
    }

    /// The fingerprint of `family`'s owned table, taken at generation `at` (`reuse`: after
    /// a load that wrote only part of it, see [`nftdigest::digest`]): `None` when the back
    /// end has none, it cannot be read, or nf_tables is no longer at `at` after it (then
    /// the caller reads the node, as without one).
    fn fingerprint(
        &self,
        family: Family,
        at: Option<&Generation>,
        reuse: Option<nftdigest::Reuse>,
    ) -> Option<Digest> {
        let (proto, table) = self.planner.fingerprint(family)?;
        let netns = self.args.netns.as_deref();
        let d = nftdigest::digest(netns, proto, table, reuse).ok()?;
        (at.is_some() && nfgen::generation(netns).as_ref() == at).then_some(d)
    }

    /// [`nftdigest::gone_elements`] for `family`'s table; empty when there is no
    /// fingerprint or netlink refuses (the fingerprint after the load then lists those
    /// sets whole).
    fn gone_elements(&self, family: Family, touched: &plan::Touched) -> nftdigest::Gone {
        let Some((proto, table)) = self.planner.fingerprint(family) else {
            return nftdigest::Gone::new();
        };
        nftdigest::gone_elements(self.args.netns.as_deref(), proto, table, touched)
            .unwrap_or_default()
    }

    /// The node's current state (`Commands::read`).
    fn read_node(&self, cmds: &Commands) -> Result<String, Fail> {
        rules::read_node(self.planner, cmds.read.clone(), self.args.netns.as_deref())
    }

    /// Applies one family's document, and after a load of a changed document cleans the
    /// stale UDP conntrack entries `cleanup` names. `Some(generation)`: the node's
    /// nf_tables generation when this apply ended, with everything owned verified at it
    /// (by the fast path or a read), for [`Ctx::record_inputs`].
    fn apply_one(
        &self,
        family: Family,
        doc: &str,
        source: &str,
        cleanup: Option<&Spec>,
    ) -> Result<Option<Generation>, Fail> {
        loop {
            if let Some(end) = self.apply_once(family, doc, source, cleanup)? {
                return Ok(end);
            }
        }
    }

    /// One pass of [`Ctx::apply_one`]: carries out the steps [`Decider`] names, and feeds
    /// back what each found. `None`: start again ([`Step::Restart`]).
    fn apply_once(
        &self,
        family: Family,
        doc: &str,
        source: &str,
        cleanup: Option<&Spec>,
    ) -> Result<Option<Option<Generation>>, Fail> {
        let start = Instant::now();
        let mut times = Times::default();
        times.family = Some(family);
        let cmds = self.planner.commands(family);
        let dir = self.dir(family);
        let ext = self.target.ext;
        let what = format!("{} {}", self.target.name, family.as_str());
        let netns = self.args.netns.as_deref();

        // Before anything is read: a read taken after this and verified can be recorded
        // with it only if nothing was committed in between (the id is the same after).
        let gen_start = nfgen::generation(netns);
        let applied_doc = fs::read_to_string(dir.applied()).ok();
        // Only a changed document can have moved a service's endpoints: the conntrack
        // cleanup runs after its load (kube-proxy's: after a sync that changed a UDP
        // service's endpoints, `ConntrackCleanupRequired`).
        let cleanup = cleanup.filter(|_| applied_doc.as_deref() != Some(doc));
        // A new document is written to disk (and synced) while this apply plans and
        // loads; the record takes it by rename ([`Ctx::record`]).
        let mut written = (!self.args.dry_run && applied_doc.as_deref() != Some(doc))
            .then(|| NextDocument::start(&dir.next(), doc));
        let applied_state = fs::read_to_string(dir.state()).ok();
        // Hashed once (58 MB on a 10k-service node): the state and the generation name it.
        let applied_header = applied_doc.as_deref().map(record_header);
        // The two files are written one after the other: only a snapshot that names this
        // document's hash belongs to it (a kill between the writes leaves them apart).
        let previous = match (&applied_doc, &applied_state, &applied_header) {
            (Some(d), Some(s), Some(h)) => snapshot_of(s, h).map(|snapshot| Previous {
                document: d,
                snapshot,
            }),
            _ => None,
        };
        if previous.is_none() && applied_doc.is_some() && applied_state.is_some() {
            eprintln!(
                "svc-compile: note: {what}: the record in {} is from an interrupted apply; loading everything",
                dir.path().display()
            );
        }
        // The generation recorded with the snapshot: while it is still the node's, nothing
        // was committed since and the snapshot is what the node shows.
        let recorded_gen = match (&applied_header, previous) {
            (Some(h), Some(_)) => fs::read_to_string(dir.generation())
                .ok()
                .and_then(|g| generation_of(&g, h)),
            _ => None,
        };
        times.mark("start");
        // A record that is not a read ([`plan::UNREAD`]) comes with the fingerprint of our
        // table at that moment. nf_tables moved since: the same fingerprint now means the
        // writes were elsewhere, and the record still holds, at the generation of now.
        let unread = previous.is_some_and(|p| plan::is_unread(p.snapshot));
        // It names the document and the snapshot it belongs to: a kill between writing it
        // and the state after a load of the same document leaves it with the snapshot before.
        let recorded_digest = match (unread, &applied_header, previous) {
            (true, Some(h), Some(p)) => fs::read_to_string(dir.digest()).ok().and_then(|t| {
                t.strip_prefix(h.as_str())?
                    .strip_prefix(&digest_line(p.snapshot))
                    .and_then(Digest::from_text)
            }),
            _ => None,
        };
        let mut decider = Decider::new(Setup {
            dry_run: self.args.dry_run,
            full: self.args.full,
            gen_start: gen_start.clone(),
            record: previous.map(|p| decide::Record {
                same_document: p.document == doc,
                generation: recorded_gen.clone(),
                fingerprint: recorded_digest.is_some(),
            }),
            scratch_proves_first_load: self.planner.scratch_proves_first_load(),
        });

        // What the steps produce. The node's read, to plan from.
        let mut kernel: Option<String> = None;
        // The fingerprint the record's objects are known by (after a load, what it did not
        // touch keeps its hash from here), and how the node differs from the record when it
        // does in chains and sets only.
        let mut base_digest = recorded_digest.clone();
        let mut drift: Option<plan::Drift> = None;
        let mut prep: Option<Prepared> = None;
        let mut plan: Option<Plan> = None;
        let mut load_path: Option<PathBuf> = None;
        // The node's fingerprint once this apply's load is in, for an unread record.
        let mut digest_now: Option<Digest> = None;
        // Before a partial load: what it deletes of the sets it writes element by element
        // ([`nftdigest::gone_elements`]).
        let mut gone_before = nftdigest::Gone::new();
        // The owned part of the read back, when the node was read back.
        let mut owned: Option<String> = None;
        // The last command the node refused: its command line and the first line it said.
        let mut refusal = (String::new(), String::new());
        // What putting back a failed load did.
        let mut undone = String::new();

        let mut seen = Seen::Done;
        loop {
            let step = decider.next(seen);
            seen = match step {
                Step::Fingerprint => {
                    let rec = recorded_digest
                        .as_ref()
                        .expect("a record with a fingerprint");
                    let f = match self.fingerprint(family, gen_start.as_ref(), None) {
                        Some(now) if &now == rec => {
                            // The same hashes; its sets' element sums too, which an older
                            // record may not have.
                            base_digest = Some(now);
                            decide::Fingerprint::Same
                        }
                        Some(now) => {
                            if let Some(changed) = rec.first_difference(&now) {
                                eprintln!(
                                    "svc-compile: note: {what}: {changed} since the last apply"
                                );
                            }
                            drift = rec.drift(&now);
                            base_digest = Some(now);
                            decide::Fingerprint::Differs {
                                mendable: drift.is_some(),
                            }
                        }
                        None => {
                            eprintln!(
                                "svc-compile: note: {what}: the node's fingerprint could not be taken (nf_tables changed while it was read, or netlink refused); reading the node"
                            );
                            decide::Fingerprint::Untaken
                        }
                    };
                    times.kernel("fingerprint the node");
                    Seen::Fingerprint(f)
                }
                Step::RecordGeneration(g) => {
                    if let Some(h) = &applied_header {
                        write_atomic(&dir.generation(), &format!("{h}{}\n", g.to_line()))?;
                    }
                    Seen::Done
                }
                Step::ReadNode => {
                    kernel = Some(self.read_node(&cmds)?);
                    times.kernel("read the node");
                    Seen::Done
                }
                Step::Prepare(from) => {
                    let record =
                        || previous.expect("the decider plans from a record only if one exists");
                    let prepared = match from {
                        PlanFrom::Record => self.planner.prepare_unchanged(doc, family, record()),
                        PlanFrom::Repair => self.planner.prepare_repair(
                            doc,
                            family,
                            record(),
                            drift.as_ref().expect("a repair has its drift"),
                        ),
                        PlanFrom::Read { full } => Some(self.planner.prepare(
                            doc,
                            family,
                            previous,
                            kernel.as_deref().unwrap_or(""),
                            full,
                        )),
                    };
                    match prepared {
                        None => Seen::Prepared(false),
                        Some(p) => {
                            prep =
                                Some(p.map_err(|e| Fail(format!("cannot apply {source}: {e}")))?);
                            times.plan("plan");
                            Seen::Prepared(true)
                        }
                    }
                }
                Step::LoadDirect => {
                    let p = prep.as_ref().expect("prepared");
                    Seen::Direct(match self.load_direct(p, kernel.as_deref(), &cmds, &dir)? {
                        DirectLoad::Skipped => decide::Direct::Skipped,
                        DirectLoad::Done(done, path, g, digest) => {
                            times.kernel(match digest {
                                Some(_) => "load and fingerprint",
                                None => "load and read back",
                            });
                            let facts = self.planned(&done);
                            plan = Some(*done);
                            load_path = Some(path);
                            digest_now = digest;
                            decide::Direct::Done { at: g, plan: facts }
                        }
                        DirectLoad::Reread(after) => {
                            times.kernel("load and read back");
                            kernel = Some(after);
                            decide::Direct::Reread
                        }
                    })
                }
                Step::Unrecord => {
                    // The record no longer describes the node: until this apply records
                    // again, the next one reads the node and loads everything.
                    let _ = fs::remove_file(dir.state());
                    Seen::Done
                }
                Step::Scratch => {
                    let p = prep.as_ref().expect("prepared");
                    let canonical = self
                        .scratch(p, &cmds, ext, source)
                        .map_err(|f| Fail(format!("{}{}", f.0, unrecorded(decider.reread()))))?;
                    times.kernel("scratch namespace");
                    let new = plan::plan(p, &canonical)
                        .map_err(|e| Fail(format!("cannot plan {what}: {e}")))?;
                    times.plan("plan step two");
                    let facts = self.planned(&new);
                    plan = Some(new);
                    load_path = None;
                    Seen::Planned(facts)
                }
                Step::OwnsNothing => {
                    let p = plan.as_ref().expect("planned");
                    Seen::OwnsNothing(
                        kernel
                            .as_deref()
                            .is_some_and(|k| p.owned(k).is_ok_and(|o| o.trim().is_empty())),
                    )
                }
                Step::WriteLoad { gone } => {
                    let p = plan.as_ref().expect("planned");
                    dir.create()?;
                    let path = dir.load();
                    write_atomic(&path, p.load.as_deref().unwrap_or(""))?;
                    load_path = Some(path);
                    // The elements the load deletes from sets it writes element by element,
                    // read while the record is still the node's: the fingerprint after it
                    // needs their hashes, not a listing of those sets.
                    gone_before = match (&p.touched, gone) {
                        (Some(t), true) => {
                            let gone = self.gone_elements(family, t);
                            times.kernel("read what goes");
                            gone
                        }
                        _ => nftdigest::Gone::new(),
                    };
                    Seen::Done
                }
                Step::Check | Step::Load => {
                    let (argv, out) = if step == Step::Check {
                        let argv = self.on_node(cmds.check.clone(), load_path.as_deref());
                        let out = run_captured(&argv)?;
                        times.kernel("check on the node");
                        (argv, out)
                    } else {
                        let argv = self.on_node(cmds.load.clone(), load_path.as_deref());
                        let out = run_loader(&argv, self.lock.as_ref(), &dir.load_log())?;
                        times.kernel("load");
                        (argv, out)
                    };
                    if !out.ok {
                        refusal = (shell_line(&argv), first_line(&out.stderr));
                    }
                    Seen::Accepted(out.ok)
                }
                Step::Note(note) => {
                    match note {
                        Note::RepairRefused => eprintln!(
                            "svc-compile: note: {what}: rewriting what differs was refused ({}); reading the node",
                            refusal.1
                        ),
                        Note::IncrementalRefused => eprintln!(
                            "svc-compile: note: {what}: the incremental load was refused ({}); loading everything instead",
                            refusal.1
                        ),
                    }
                    Seen::Done
                }
                Step::Warn => {
                    for w in &plan.as_ref().expect("planned").warnings {
                        eprintln!("svc-compile: warning: {what}: {w}");
                    }
                    Seen::Done
                }
                Step::Undo => {
                    // Without a read, the record is what the node showed before.
                    let before = match (&kernel, previous) {
                        (Some(k), _) => k.as_str(),
                        (None, Some(p)) => p.snapshot,
                        (None, None) => "",
                    };
                    let p = plan.as_ref().expect("planned");
                    undone = self.undo(p, &cmds, before, &dir)?;
                    Seen::Done
                }
                Step::Generation => Seen::Generation(nfgen::generation(netns)),
                Step::Refingerprint(at) => {
                    let p = plan.as_ref().expect("planned");
                    digest_now = match &p.load {
                        None => base_digest.clone(),
                        Some(_) => {
                            let reuse = base_digest.as_ref().zip(p.touched.as_ref()).map(
                                |(before, touched)| nftdigest::Reuse {
                                    before,
                                    touched,
                                    gone: &gone_before,
                                },
                            );
                            self.fingerprint(family, at.as_ref(), reuse)
                        }
                    };
                    times.kernel("fingerprint the node");
                    if let Some(n) = digest_now.as_ref().map(|d| d.keyed).filter(|n| *n > 0) {
                        times
                            .notes
                            .push(format!("{n} set(s) fingerprinted by key, not listed"));
                    }
                    Seen::Done
                }
                Step::ReadBack { reuse } => {
                    let p = plan.as_ref().expect("planned");
                    let (g, after) = match (reuse, kernel.take()) {
                        (true, Some(k)) => (gen_start.clone(), k),
                        _ => (nfgen::generation(netns), self.read_node(&cmds)?),
                    };
                    times.kernel("read back");
                    let read = p
                        .owned(&after)
                        .map_err(|e| Fail(format!("{what}: cannot read the node back: {e}")))?;
                    let tracked = self.planner.tracked_by_generation(family, &after);
                    let g = g.filter(|g| tracked && nfgen::generation(netns).as_ref() == Some(g));
                    let same = read == p.expected;
                    owned = Some(read);
                    Seen::ReadBack { at: g, same }
                }
                Step::Record { at, rewrite } => {
                    let p = plan.as_ref().expect("planned");
                    let owned = owned.as_deref().unwrap_or(&p.expected);
                    times.plan("compare");
                    let same_doc = applied_doc.as_deref() == Some(doc);
                    let header = match &applied_header {
                        Some(h) if same_doc => h.clone(),
                        _ => record_header(doc),
                    };
                    // After a reread the record was removed (the direct load made it stale):
                    // written again even when this apply found the node as it says.
                    let same_record =
                        !rewrite && same_doc && previous.is_some_and(|p| p.snapshot == owned);
                    // An unread record needs its fingerprint, written first: a kill between
                    // the two leaves the old state (a read one ignores it) or one of the same
                    // document.
                    let digest_file = dir.digest();
                    match (&digest_now, plan::is_unread(&p.expected)) {
                        (Some(d), true) if !same_record || recorded_digest.as_ref() != Some(d) => {
                            dir.create()?;
                            write_atomic_parts(
                                &digest_file,
                                &[&header, &digest_line(owned), &d.to_text()],
                            )?
                        }
                        (Some(_), true) => {}
                        _ => {
                            let _ = fs::remove_file(&digest_file);
                        }
                    }
                    if !same_record {
                        self.record(
                            &dir,
                            doc,
                            &header,
                            owned,
                            applied_doc.as_deref(),
                            written.take(),
                        )?;
                    }
                    let gen_file = dir.generation();
                    match &at {
                        Some(g) if recorded_gen.as_ref() != Some(g) || !same_record => {
                            write_atomic(&gen_file, &format!("{header}{}\n", g.to_line()))?
                        }
                        Some(_) => {}
                        None => {
                            let _ = fs::remove_file(&gen_file);
                        }
                    }
                    times.mark("record");
                    Seen::Done
                }
                Step::Restart => {
                    // Loaded from an unread record, but someone else committed too: nothing
                    // to compare a read with. The record goes, and everything is loaded (the
                    // usual way, which reads the node) now.
                    for f in [dir.state(), dir.digest()] {
                        let _ = fs::remove_file(f);
                    }
                    eprintln!(
                        "svc-compile: note: {what}: nf_tables changed during the load and the last apply's state was not read back; loading everything"
                    );
                    // The document's file is written again by the next pass: this one first
                    // ends.
                    if let Some(w) = written.take() {
                        let _ = w.finish();
                    }
                    return Ok(None);
                }
                Step::Done(Outcome::DryRun { check }) => {
                    let p = plan.as_ref().expect("planned");
                    self.print_dry_run(&what, p, &cmds, &dir, check, cleanup);
                    return Ok(Some(None));
                }
                Step::Done(Outcome::Unchanged { by, at }) => {
                    println!(
                        "svc-compile: {what} unchanged in {}: {}: {}; verified in {} ms ({})",
                        self.where_(),
                        Mode::Unchanged,
                        plan::Summary::default(),
                        start.elapsed().as_millis(),
                        by_words(by)
                    );
                    times.plan("compare with the record");
                    times.notes.insert(0, Mode::Unchanged.to_string());
                    times.print(&what);
                    return Ok(Some(at));
                }
                Step::Done(Outcome::Applied {
                    loaded,
                    by,
                    at,
                    refused_incremental,
                }) => {
                    if refused_incremental {
                        eprintln!(
                            "svc-compile: note: {what}: the incremental load was refused ({}); loaded everything instead",
                            refusal.1
                        );
                    }
                    let p = plan.as_ref().expect("planned");
                    let verified = start.elapsed().as_millis();
                    // The recorded document loaded again: what someone else changed in
                    // our rules was put back.
                    times.repaired = loaded && applied_doc.as_deref() == Some(doc);
                    let cleaned = match cleanup {
                        Some(spec) if loaded && !self.args.dry_run => {
                            self.clean_conntrack(&what, spec, &mut times)
                        }
                        _ => String::new(),
                    };
                    println!(
                        "svc-compile: {what} {} in {}: {}: {}; verified in {verified} ms ({}){cleaned}",
                        if loaded { "applied" } else { "unchanged" },
                        self.where_(),
                        p.mode,
                        p.summary,
                        by_words(by)
                    );
                    times.notes.insert(0, format!("{}: {}", p.mode, p.summary));
                    times.print(&what);
                    return Ok(Some(at));
                }
                Step::Fail(failure) => {
                    return Err(Fail(match failure {
                        Failure::Refused { reread, .. } => format!(
                            "{what}: the node refuses the ruleset (`{}`): {}; nothing was changed{}",
                            refusal.0,
                            refusal.1,
                            unrecorded(reread)
                        ),
                        Failure::LoadFailed { reread } => format!(
                            "{what}: loading failed (`{}`): {}; {undone}{}",
                            refusal.0,
                            refusal.1,
                            unrecorded(reread)
                        ),
                        Failure::NotAsLoaded => {
                            let p = plan.as_ref().expect("planned");
                            let _ = fs::remove_file(dir.state());
                            let _ = fs::remove_file(dir.scratch_out());
                            format!(
                                "{what}: after loading, the node does not show what was loaded: {}; the next apply will load everything",
                                Plan::first_difference(&p.expected, owned.as_deref().unwrap_or(""))
                            )
                        }
                    }));
                }
            };
        }
    }

    /// kube-proxy's stale UDP conntrack cleanup after a load ([`crate::conntrack`]): the
    /// words the report line ends with when entries were deleted. A failure is a warning:
    /// the load stands.
    fn clean_conntrack(&self, what: &str, spec: &Spec, times: &mut Times) -> String {
        let start = Instant::now();
        let cleaned = conntrack::clean(self.args.netns.as_deref(), spec);
        times.kernel("conntrack cleanup");
        let took = start.elapsed();
        match cleaned {
            Ok(c) => {
                times.conntrack = Some((took, c.deleted as u64));
                if let Some((n, e)) = c.failed {
                    eprintln!(
                        "svc-compile: warning: {what}: {n} stale UDP conntrack {} could not be deleted ({e}); clients may keep reaching an old endpoint until {} out (`conntrack -D -p udp` deletes them)",
                        if n == 1 { "entry" } else { "entries" },
                        if n == 1 { "it times" } else { "they time" },
                    );
                }
                match c.deleted {
                    0 => String::new(),
                    1 => "; 1 stale UDP conntrack entry deleted".into(),
                    n => format!("; {n} stale UDP conntrack entries deleted"),
                }
            }
            Err(e) => {
                eprintln!(
                    "svc-compile: warning: {what}: stale UDP conntrack entries were not deleted: the conntrack table could not be read ({e}); clients may keep reaching an old endpoint until their entries time out"
                );
                String::new()
            }
        }
    }

    /// What the decider needs to know of a plan.
    fn planned(&self, plan: &Plan) -> Planned {
        Planned {
            loads: plan.load.is_some(),
            transactions: plan
                .load
                .as_deref()
                .and_then(|l| self.planner.transactions(l)),
            incremental: plan.mode == Mode::Incremental,
            unread: plan::is_unread(&plan.expected),
            elements: plan
                .touched
                .as_ref()
                .is_some_and(|t| !t.elements.is_empty()),
        }
    }

    /// A first load into a node that shows nothing of ours, where the scratch document is
    /// the load ([`Prepared::direct`]): loading it on the node proves it as the scratch
    /// namespace would, so it is loaded there, once, and read back. The read stands for
    /// the scratch namespace's (cut by [`Prepared::direct_view`]) when the generation
    /// advanced by exactly this load's transactions (nobody else wrote in between).
    fn load_direct(
        &self,
        prep: &Prepared,
        kernel: Option<&str>,
        cmds: &Commands,
        dir: &Records,
    ) -> Result<DirectLoad, Fail> {
        let netns = self.args.netns.as_deref();
        // An empty read (no table at all) cannot say whether iptables is iptables-nft; the
        // read after the load does, and a load the generation cannot prove is planned again.
        let tracked = kernel.is_some_and(|k| {
            k.trim().is_empty() || self.planner.tracked_by_generation(prep.family, k)
        });
        let n = self.planner.transactions(&prep.scratch);
        if self.args.dry_run || !prep.direct || !matches!(prep.mode, Mode::Full(_)) || !tracked {
            return Ok(DirectLoad::Skipped);
        }
        let (Some(n), Some(before)) = (n, nfgen::generation(netns)) else {
            return Ok(DirectLoad::Skipped);
        };
        dir.create()?;
        let path = dir.load();
        write_atomic(&path, &prep.scratch)?;
        let argv = self.on_node(cmds.load.clone(), Some(&path));
        let out = run_loader(&argv, self.lock.as_ref(), &dir.load_log())?;
        if !out.ok && n <= 1 {
            // One transaction changed nothing: the usual way (the scratch namespace) says
            // why.
            return Ok(DirectLoad::Skipped);
        }
        if !out.ok {
            // Several may have committed some tables, which come off again. Then the
            // usual way says why.
            let now = self.read_node(cmds)?;
            let revert = prep
                .direct_revert(&now)
                .map_err(|e| Fail(format!("cannot plan the revert: {e}")))?;
            if let Some(revert) = revert {
                let rpath = dir.revert();
                write_atomic(&rpath, &revert)?;
                let rargv = self.on_node(cmds.load.clone(), Some(&rpath));
                let rout = run_loader(&rargv, self.lock.as_ref(), &dir.revert_log())?;
                let again = self.read_node(cmds)?;
                let clean = prep.direct_revert(&again).is_ok_and(|r| r.is_none());
                if !rout.ok || !clean {
                    let _ = fs::remove_file(dir.state());
                    return Err(Fail(format!(
                        "{} {}: loading failed (`{}`): {}; taking off the tables it had committed failed too ({}; see {}); the next apply will load everything",
                        self.target.name,
                        prep.family.as_str(),
                        shell_line(&argv),
                        first_line(&out.stderr),
                        first_line(&rout.stderr),
                        rpath.display()
                    )));
                }
            }
            return Ok(DirectLoad::Skipped);
        }
        // Proven by the generation alone (nobody else committed): a fingerprint of our table
        // instead of a read, which `nft` does in time growing with the square of the rules.
        let g = before.after(n);
        if !self.args.read_back && nfgen::generation(netns).as_ref() == Some(&g) {
            if let Some(plan) = prep.unread_plan() {
                if let Some(d) = self.fingerprint(prep.family, Some(&g), None) {
                    return Ok(DirectLoad::Done(Box::new(plan), path, g, Some(d)));
                }
            }
        }
        let after = self.read_node(cmds)?;
        let proven = nfgen::generation(netns).as_ref() == Some(&g)
            && self.planner.tracked_by_generation(prep.family, &after);
        if !proven {
            return Ok(DirectLoad::Reread(after));
        }
        let view = prep
            .direct_view(&after)
            .map_err(|e| Fail(format!("cannot read the node back: {e}")))?;
        let plan = plan::plan(prep, view.as_deref().unwrap_or(&after))
            .map_err(|e| Fail(format!("cannot plan: {e}")))?;
        if plan.load.as_deref() != Some(prep.scratch.as_str()) {
            return Ok(DirectLoad::Reread(after));
        }
        Ok(DirectLoad::Done(Box::new(plan), path, g, None))
    }

    /// Loads the scratch document into an empty namespace; returns its read-back. A
    /// document the kernel refuses stops here, before the node is touched.
    fn scratch(
        &self,
        prep: &Prepared,
        cmds: &Commands,
        ext: &str,
        source: &str,
    ) -> Result<String, Fail> {
        if prep.scratch.is_empty() {
            return Ok(String::new());
        }
        // In the state directory (overwritten next time), unless this is a dry run.
        let path = if self.args.dry_run {
            std::env::temp_dir().join(format!("svc-compile-scratch-{}.{ext}", process::id()))
        } else {
            let dir = self.dir(prep.family);
            dir.create()?;
            dir.scratch()
        };
        // The read-back of a document depends on nothing but the document, the commands,
        // the tools that run them and the running kernel: one already seen this boot with
        // the same tools is not loaded again (a full reload of an unchanged document, with
        // `--full`, costs one load, not two). A read-back the node then disagrees with is
        // dropped (see `apply_one`).
        let cache = self.dir(prep.family).scratch_out();
        let key = crate::netns::boot_id()
            .filter(|_| !self.args.dry_run)
            .map(|boot| {
                let what = format!(
                    "{}\n{}\n{}",
                    tools_identity(
                        &self.planner.tools(prep.family),
                        &std::env::var_os("PATH").unwrap_or_default()
                    ),
                    cmds.scratch.join(" "),
                    prep.scratch
                );
                format!(
                    "# svc-compile scratch read-back of {:016x} on boot {}\n",
                    fnv1a(&what),
                    boot
                )
            });
        if let Some(key) = &key {
            if let Some(out) = fs::read_to_string(&cache)
                .ok()
                .and_then(|c| c.strip_prefix(key.as_str()).map(str::to_string))
            {
                return Ok(out);
            }
        }
        write_atomic(&path, &prep.scratch)?;
        let out = rules::load_scratch(&cmds.scratch, &path);
        if self.args.dry_run {
            let _ = fs::remove_file(&path);
        }
        let out = out?.map_err(|e| {
            Fail(format!(
                "the kernel refuses {source} (loaded into an empty network namespace first): {e}; nothing was changed"
            ))
        })?;
        if let Some(key) = key {
            write_atomic(&cache, &format!("{key}{}", out))?;
        }
        Ok(out)
    }

    /// After a failed load: put back the tables it committed. Returns what happened.
    fn undo(
        &self,
        plan: &Plan,
        cmds: &Commands,
        before: &str,
        dir: &Records,
    ) -> Result<String, Fail> {
        let now = self.read_node(cmds)?;
        let revert = plan
            .revert(&now)
            .map_err(|e| Fail(format!("cannot plan the revert: {e}")))?;
        let Some(revert) = revert else {
            return Ok("nothing was changed".into());
        };
        let path = dir.revert();
        write_atomic(&path, &revert)?;
        let argv = self.on_node(cmds.load.clone(), Some(&path));
        let out = run_loader(&argv, self.lock.as_ref(), &dir.revert_log())?;
        let now = self.read_node(cmds)?;
        let restored =
            out.ok && matches!((plan.owned(&now), plan.owned(before)), (Ok(a), Ok(b)) if a == b);
        if restored {
            Ok("the tables it had committed were put back; the previous state is in place".into())
        } else {
            let _ = fs::remove_file(dir.state());
            Ok(format!(
                "putting back the tables it had committed failed too ({}; see {}); the next apply will load everything",
                first_line(&out.stderr),
                path.display()
            ))
        }
    }

    /// The new record; the old one becomes `previous` when the document changed.
    fn record(
        &self,
        dir: &Records,
        doc: &str,
        header: &str,
        owned: &str,
        applied_doc: Option<&str>,
        written: Option<NextDocument>,
    ) -> Result<(), Fail> {
        dir.create()?;
        let applied = dir.applied();
        let state = dir.state();
        // The old record becomes `previous` by rename, not by writing it again (a 10k-service
        // node's record is 180 MB). A kill between the steps leaves no `applied.{ext}` or a
        // document whose hash the state does not name: no record, the next apply loads
        // everything; `previous.{ext}` is always a whole document.
        if applied_doc.is_some_and(|old| old != doc) {
            let moved = |from: &Path, to: &Path| {
                fs::rename(from, to)
                    .map_err(|e| Fail(format!("cannot move {}: {e}", from.display())))
            };
            moved(&applied, &dir.previous())?;
            if state.exists() {
                moved(&state, &dir.previous_state())?;
            }
        }
        if applied_doc != Some(doc) {
            match written.map(NextDocument::finish) {
                Some(Some(next)) => fs::rename(&next, &applied)
                    .map_err(|e| Fail(format!("cannot move {}: {e}", next.display())))?,
                _ => write_atomic(&applied, doc)?,
            }
        }
        write_atomic_parts(&state, &[header, owned])
    }

    /// `--dry-run`: a shell script with the exact documents and commands.
    /// The dry run's script: the commands apply would run, `check` saying whether that
    /// includes the check on the node, and the conntrack cleanup after the load.
    fn print_dry_run(
        &self,
        what: &str,
        plan: &Plan,
        cmds: &Commands,
        dir: &Records,
        check: bool,
        cleanup: Option<&Spec>,
    ) {
        let mut out = format!(
            "#!/bin/sh\n# svc-compile apply --dry-run: {what} in {}: {}\n# {}\n",
            self.where_(),
            plan.mode,
            plan.summary
        );
        for w in &plan.warnings {
            out += &format!("# warning: {w}\n");
        }
        match &plan.load {
            None => out += "# nothing to load: the node already shows this state\n",
            Some(load) => {
                let path = dir.load();
                out += &format!(
                    "set -e\nmkdir -p {}\ncat > {} <<'SVC_COMPILE_EOF'\n{load}SVC_COMPILE_EOF\n",
                    shell_word(&dir.path().display().to_string()),
                    shell_word(&path.display().to_string())
                );
                if check {
                    out += &shell_line(&self.on_node(cmds.check.clone(), Some(&path)));
                    out.push('\n');
                }
                out += &shell_line(&self.on_node(cmds.load.clone(), Some(&path)));
                out.push('\n');
                out += &format!(
                    "# then: {} (its owned part must be the plan's expectation)\n",
                    shell_line(&self.on_node(cmds.read.clone(), None))
                );
                if let Some(spec) = cleanup.filter(|s| !s.is_empty()) {
                    out += &format!(
                        "# then: delete the {} conntrack entries of {} whose reply source is not a serving endpoint (kube-proxy's stale UDP cleanup, over netlink)\n",
                        spec.family().as_str(),
                        spec.describe()
                    );
                }
            }
        }
        let mut stdout = io::stdout().lock();
        let _ = stdout
            .write_all(out.as_bytes())
            .and_then(|_| stdout.flush());
    }
}

/// What [`Ctx::load_direct`] did.
enum DirectLoad {
    /// Nothing loaded (or a failed load taken off again): take the usual way.
    Skipped,
    /// Loaded and proven: the plan, the load's path, the generation after it, and the
    /// node's fingerprint when the plan is not a read ([`plan::UNREAD`]).
    Done(Box<Plan>, PathBuf, Generation, Option<Digest>),
    /// Loaded, not proven: the node's read after it, to plan from.
    Reread(String),
}

/// The report's words for how the state after an apply is known.
fn by_words(by: By) -> &'static str {
    match by {
        By::Generation => BY_GENERATION,
        By::Fingerprint => BY_FINGERPRINT,
        By::Repair => BY_REPAIR,
        By::Read => "node state read",
    }
}

/// Said after a failure when a direct first load went in unproven ([`Decider::reread`]).
fn unrecorded(reread: bool) -> &'static str {
    match reread {
        true => "; the first load made before it is in place, not recorded: the next apply reads the node and loads everything",
        false => "",
    }
}

/// The first line of a snapshot file: which document it was taken for.
fn record_header(doc: &str) -> String {
    format!("# svc-compile snapshot of document {:016x}\n", fnv1a(doc))
}

/// The generation in an `applied.gen` file if it was recorded for the document whose
/// [`record_header`] is `header`.
fn generation_of(file: &str, header: &str) -> Option<Generation> {
    Generation::from_line(file.strip_prefix(header)?.trim_end())
}

/// The snapshot in `state` if it was taken for the document whose [`record_header`] is
/// `header`.
fn snapshot_of<'a>(state: &'a str, header: &str) -> Option<&'a str> {
    state.strip_prefix(header)
}

/// The report's words when the inputs were not compiled (see [`Ctx::unchanged_inputs`]).
const NOT_COMPILED: &str = "the inputs are the last apply's: not compiled";

/// The fingerprint of what decides an apply's documents: this executable (its size,
/// modification time and inode: a rebuilt or upgraded binary may compile differently), the
/// command line, and every file the compile reads, by name, length and
/// [`svc_compiler::source::fingerprint`] (each file's, computed once per source map or
/// given with it: the agent's files come with the fingerprint it keeps by their `stat`).
/// 128 bits from two differently prefixed SipHash runs; a fingerprint, not a defence
/// against someone crafting collisions in their own manifests.
pub fn inputs_key(sources: &SourceMap) -> String {
    use std::hash::{DefaultHasher, Hasher};
    use std::os::unix::fs::MetadataExt;
    let exe = fs::metadata("/proc/self/exe")
        .map(|m| format!("{} {} {} {}", m.len(), m.mtime(), m.mtime_nsec(), m.ino()))
        .unwrap_or_default();
    let args: Vec<String> = std::env::args().collect();
    let hash = |seed: u8| {
        let mut h = DefaultHasher::new();
        h.write_u8(seed);
        h.write(exe.as_bytes());
        for a in &args {
            h.write(a.as_bytes());
            h.write_u8(0);
        }
        for (i, f) in sources.files.iter().enumerate() {
            let (a, b) = sources.print(svc_compiler::source::FileId(i as u32));
            h.write(f.name.as_bytes());
            h.write_u8(0);
            h.write_usize(f.text.len());
            h.write_u64(a);
            h.write_u64(b);
        }
        h.finish()
    };
    format!("{:016x}{:016x}", hash(1), hash(2))
}

/// `STATE/TARGET.inputs`: the last apply's inputs fingerprint, its families, and the
/// nf_tables generation at which all of them were verified.
#[derive(Debug, PartialEq)]
struct InputsRecord {
    key: String,
    families: Vec<Family>,
    generation: Generation,
}

impl InputsRecord {
    const HEADER: &'static str =
        "# svc-compile: the inputs of the last apply and the generation it left\n";

    fn to_text(&self) -> String {
        let families: Vec<&str> = self.families.iter().map(|f| f.as_str()).collect();
        format!(
            "{}key {}\nfamilies {}\ngeneration {}\n",
            Self::HEADER,
            self.key,
            families.join(" "),
            self.generation.to_line()
        )
    }

    fn parse(text: &str) -> Option<InputsRecord> {
        let mut lines = text.strip_prefix(Self::HEADER)?.lines();
        let key = lines.next()?.strip_prefix("key ")?.to_string();
        let families = lines
            .next()?
            .strip_prefix("families ")?
            .split(' ')
            .map(|f| {
                [Family::V4, Family::V6]
                    .into_iter()
                    .find(|x| x.as_str() == f)
            })
            .collect::<Option<Vec<Family>>>()?;
        let generation = Generation::from_line(lines.next()?.strip_prefix("generation ")?)?;
        (!families.is_empty()).then_some(InputsRecord {
            key,
            families,
            generation,
        })
    }
}

/// The line of `applied.digest` after the document's header: the snapshot it goes with.
fn digest_line(snapshot: &str) -> String {
    format!("snapshot {:016x}\n", fnv1a(snapshot))
}

/// FNV-1a, 64 bits: a stable fingerprint to pair files, not a defence against tampering.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_inputs_record_round_trips_and_refuses_anything_else() {
        let rec = InputsRecord {
            key: "00ff".into(),
            families: vec![Family::V4, Family::V6],
            generation: Generation {
                boot: "b0".into(),
                netns: 4097,
                id: 12,
            },
        };
        let text = rec.to_text();
        assert_eq!(InputsRecord::parse(&text), Some(rec));
        // A cut-off write, a missing header, an unknown family: no record.
        assert_eq!(InputsRecord::parse(&text[..text.len() - 8]), None);
        assert_eq!(InputsRecord::parse(text.split_once('\n').unwrap().1), None);
        assert_eq!(
            InputsRecord::parse(&text.replace("families ipv4 ipv6", "families ipv5")),
            None
        );
        assert_eq!(
            InputsRecord::parse(&text.replace("families ipv4 ipv6", "families ")),
            None
        );
    }

    #[test]
    fn holds_compares_the_whole_text_not_only_the_size() {
        let p = std::env::temp_dir().join(format!("svc-compile-holds-{}", process::id()));
        fs::write(&p, "abc\n").unwrap();
        assert!(holds(&p, "abc\n"));
        assert!(!holds(&p, "abd\n"));
        assert!(!holds(&p, "abc"));
        fs::remove_file(&p).unwrap();
        assert!(!holds(&p, "abc\n"));
    }

    #[test]
    fn the_inputs_key_changes_with_any_byte_or_name_and_only_then() {
        let map = |files: &[(&str, &str)]| {
            let mut m = SourceMap::default();
            for (n, t) in files {
                m.add(*n, *t);
            }
            m
        };
        let base = inputs_key(&map(&[("a.yaml", "kind: Service\n"), ("b.yaml", "x")]));
        assert_eq!(
            base,
            inputs_key(&map(&[("a.yaml", "kind: Service\n"), ("b.yaml", "x")]))
        );
        assert_eq!(base.len(), 32);
        for other in [
            map(&[("a.yaml", "kind: Service \n"), ("b.yaml", "x")]),
            map(&[("a.yml", "kind: Service\n"), ("b.yaml", "x")]),
            map(&[("a.yaml", "kind: Service\n")]),
            // The boundary between name and text moves: still another key.
            map(&[("a.yaml", "kind: Service\nb.yaml"), ("", "x")]),
        ] {
            assert_ne!(base, inputs_key(&other));
        }
    }
}
