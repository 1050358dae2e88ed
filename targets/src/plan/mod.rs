//! Planning `svc-compile apply`: pure functions from (the newly compiled document, what the
//! kernel shows now, what the last apply recorded) to the documents and commands that move
//! the node to the new state. Nothing here runs a process or touches a file; `svc_node::apply`
//! runs the plan.
//!
//! Every back end that can be applied has a [`Planner`] (named in its registry entry,
//! [`crate::Target::planner`]); the CLI calls nothing else. Planning takes two steps because
//! the kernel's own spelling of a rule (`iptables-save`, `nft -j list`) is not ours and is
//! only learnt by loading it:
//!
//! 1. [`Planner::prepare`]`(new, previous, kernel, force_full)` parses everything, decides
//!    the mode and returns a [`Prepared`] whose [`Prepared::scratch`] document the CLI loads
//!    into a throwaway network namespace and reads back ([`Commands::scratch`]).
//! 2. [`plan`]`(prepared, scratch_output)` returns the [`Plan`]: the document to check and
//!    load, what the kernel's owned state must look like afterwards, and (iptables) the
//!    document that undoes a partly committed load.
//!
//! This module is the shared face; each planner lives in its target's own module
//! (`iptables::plan`, `nftables::plan`, `ipvs::plan`): it builds [`Prepared`] with its
//! `Step` and [`Plan`] with its `Owned` (crate-visible), and may use `argv` and
//! `scratch` for its [`Commands`].
//!
//! # What is owned
//!
//! iptables: the chains the compiled document declares (it flushes and rewrites them), the
//! per-service chains of kube-proxy's layout (`KUBE-SVC-`, `KUBE-SVL-`, `KUBE-EXT-`,
//! `KUBE-FW-`, `KUBE-SEP-`) and chains an earlier apply declared, and the jump rules from
//! built-in chains, identified by their exact `iptables-save` text. nftables: the table
//! `kube-proxy` of the family. ipvs: see [`crate::ipvs::plan`] (sets, servers and
//! addresses it wrote, plus the iptables ownership for its iptables part). Nothing else is
//! ever written, flushed or deleted.
//!
//! # Modes
//!
//! - **Unchanged**: the kernel shows exactly what the last apply left and the document is
//!   the same: nothing is loaded.
//! - **Incremental**: only objects whose compiled text differs between the old and the new
//!   document are rewritten, created or deleted, plus the objects someone else changed
//!   since the last apply (the owned part of a read compared with the snapshot taken then,
//!   chain by chain; or, for an unread nftables record, its fingerprint object by object:
//!   [`Planner::prepare_repair`]).
//! - **Full**: anything else (first apply, nothing of ours left, a drift a rewrite would
//!   not undo, `--full`): every owned object is rewritten. Both give the same kernel state;
//!   the kernel tests check it.
//!
//! Architecture Invariant: no I/O here; the CLI hands in text and runs what comes out.

// Each planner lives with its back end (`iptables/plan.rs`, `nftables/plan.rs`,
// `ipvs/plan.rs`, `ebpf/plan.rs`). These two paths stay because code outside the crate
// (the kernel tests) names them.
pub use crate::iptables::plan as iptables;
pub use crate::nftables::plan as nftables;

/// Apply's cleanup of stale UDP conntrack entries after a load (not a back end's: the
/// same for every planner).
pub mod conntrack;
pub mod sysctls;

use std::fmt;
use std::sync::Arc;

/// One back end's side of `svc-compile apply`: its commands, how to recognise its
/// documents, the programs it needs, and step one of planning. Step two belongs to what
/// step one returns (`Step`), so the CLI never names a back end.
pub trait Planner: Sync {
    /// Its commands for one family.
    fn commands(&self, family: Family) -> Commands;
    /// The family a compiled document is for, when the document says.
    fn family_of(&self, doc: &str) -> Option<Family>;
    /// The programs [`Planner::commands`] run (the scratch namespace's `unshare` and `sh`
    /// are the CLI's own).
    fn tools(&self, family: Family) -> Vec<Tool>;
    /// Text in the error output of a failed [`Commands::read`] that means nothing of ours
    /// is there yet: an empty state, not an error.
    fn absent(&self) -> Option<&'static str> {
        None
    }
    /// The layout a document of this back end is written in, as its option spells it
    /// (nftables: `--nft-layout kube-proxy|fast`), where the back end has several; `None`
    /// (the default): one. `drift` refuses to compare documents of two layouts.
    fn layout_of(&self, _doc: &str) -> Option<(&'static str, &'static str)> {
        None
    }
    /// What to do when a command of this back end failed with `stderr`, where the back end
    /// knows the cause (a kernel without the module it needs): one line for the user
    /// instead of the tool's output. Default: none.
    fn explain(&self, _stderr: &str) -> Option<String> {
        None
    }
    /// The sysctls a node running `doc` needs, as (`/proc/sys` path below `net/`, value):
    /// `apply` writes those that differ once the document is loaded (kube-proxy sets them
    /// at start-up). Default: none.
    fn sysctls(&self, _doc: &str) -> Vec<(&'static str, &'static str)> {
        Vec::new()
    }
    /// Whether `svc-compile drift` can compare this planner's owned-state text
    /// (`targets::drift` reads iptables-save and nft JSON lines only).
    fn drift(&self) -> bool {
        true
    }
    /// Step one (see the module docs). `force_full` ignores `previous`.
    fn prepare(
        &self,
        new_doc: &str,
        family: Family,
        previous: Option<Previous>,
        kernel: &str,
        force_full: bool,
    ) -> Result<Prepared, String>;
    /// Step one when the kernel provably still shows `previous.snapshot` (nothing was
    /// committed since the apply that recorded it: the nf_tables generation is the one
    /// recorded then), without reading the node. `None` (the default): this planner
    /// needs the read; the CLI reads the node and calls [`Planner::prepare`].
    fn prepare_unchanged(
        &self,
        _new_doc: &str,
        _family: Family,
        _previous: Previous,
    ) -> Option<Result<Prepared, String>> {
        None
    }
    /// Step one for an [`UNREAD`] record whose fingerprint the node no longer matches in
    /// the objects `drift` names only: the kernel shows `previous` but for those. The plan
    /// rewrites them whole (and deletes those the new document does not declare) along
    /// with what the new document changes, in one transaction. `None` (the default, or a
    /// drift it cannot mend this way): the CLI reads the node and loads everything.
    fn prepare_repair(
        &self,
        _new_doc: &str,
        _family: Family,
        _previous: Previous,
        _drift: &Drift,
    ) -> Option<Result<Prepared, String>> {
        None
    }
    /// The nf_tables table that holds everything this back end owns, as (nfproto family,
    /// name), when the CLI may know it by a fingerprint instead of a read ([`UNREAD`]).
    fn fingerprint(&self, _family: Family) -> Option<(u8, &'static str)> {
        None
    }
    /// Whether the nf_tables generation id tracks every change of this back end's state
    /// as the read `kernel` shows it (nftables; iptables-nft but not iptables-legacy).
    /// `false` (the default): the CLI always reads the node.
    fn tracked_by_generation(&self, _family: Family, _kernel: &str) -> bool {
        false
    }
    /// How many transactions loading `load` commits, each all or nothing (`nft -f`: one;
    /// `iptables-restore`: one per table). One: the CLI loads without checking first (a
    /// refused load changes nothing). Through nf_tables, a generation advanced by exactly
    /// that many from a state the CLI knows proves that only this load changed the node.
    /// `None` (the default): unknown.
    fn transactions(&self, _load: &str) -> Option<u32> {
        None
    }
    /// Whether a load into a node that shows nothing owned needs no check on the node
    /// (`Commands::check`) after the scratch namespace took the scratch document: true
    /// where that document holds everything the load writes except what any node
    /// accepts. Default false.
    fn scratch_proves_first_load(&self) -> bool {
        false
    }
    /// How `svc-compile cleanup` takes off a node everything this back end owns there (see
    /// [`Removal`]); `None` (the default): this back end cannot do it yet.
    fn removal(&self) -> Option<RemovalPlanner> {
        None
    }
}

/// A back end's removal planner ([`Planner::removal`]): from one family's read of the node
/// (`Commands::read` output; empty when [`Planner::absent`] says nothing is there) and
/// what the state directory recorded of earlier applies, the [`Removal`].
pub type RemovalPlanner = fn(Family, &str, &Recorded) -> Result<Removal, String>;

/// What the state directory holds of earlier applies of one family, for
/// [`Planner::removal`]: the documents they loaded (`applied.*`, `previous.*`) and the
/// owned states recorded after them (`applied.state`, `previous.state`; headers are
/// comments). A text that cannot be read is passed over: it owns nothing more.
#[derive(Clone, Debug, Default)]
pub struct Recorded<'a> {
    pub documents: Vec<&'a str>,
    pub snapshots: Vec<&'a str>,
}

/// What `svc-compile cleanup` loads to take off the node everything a back end owns there
/// (and nothing else: the same ownership as [`Plan::owned`]), and what must be left after.
#[derive(Clone, Debug)]
pub struct Removal {
    /// The document for [`Commands::load`]; `None`: nothing owned is there.
    pub load: Option<String>,
    /// The owned state the kernel must show once `load` is in (compare with
    /// [`Removal::owned`] of a fresh read): empty, unless a rule we do not own still jumps
    /// to an owned chain (then it stays, with its rules, and a warning says so).
    pub expected: String,
    /// What the load removes, for the report ("3 chain(s), 2 jump(s)").
    pub summary: String,
    pub warnings: Vec<String>,
    pub(crate) owner: Arc<dyn Owned>,
}

impl Removal {
    /// The owned part of a kernel read, in the canonical text [`Removal::expected`] uses.
    pub fn owned(&self, kernel: &str) -> Result<String, String> {
        self.owner.owned(kernel)
    }
}

/// A program a plan runs, and the Debian package that has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tool {
    pub program: &'static str,
    pub package: &'static str,
}

/// Step two of one back end, kept in [`Prepared`] by its step one.
pub(crate) trait Step: fmt::Debug + Send + Sync {
    fn plan(&self, prepared: &Prepared, scratch_output: &str) -> Result<Plan, String>;
    /// See [`Prepared::direct_view`]. Default: `None`, the read itself (the owned part is
    /// all it shows: an nftables table).
    fn direct_view(&self, _after: &str) -> Result<Option<String>, String> {
        Ok(None)
    }
    /// See [`Prepared::direct_revert`]. Default: nothing (one transaction commits all or
    /// nothing).
    fn direct_revert(&self, _after: &str) -> Result<Option<String>, String> {
        Ok(None)
    }
    /// See [`Prepared::unread_plan`]. Default: none (the node is read back).
    fn unread_plan(&self, _prepared: &Prepared) -> Option<Plan> {
        None
    }
}

/// The first line of a snapshot that is not a read of the node: the load it follows was
/// proven by the nf_tables generation alone (nobody else committed), and the node's state
/// is known by the fingerprint recorded beside it ([`Planner::fingerprint`]) rather than in
/// the kernel's spelling. The lines after it name the stale chains the node still holds
/// (`chain NAME`), as a read snapshot's chain lines do.
pub const UNREAD: &str = "# not read back: the load was proven by the nf_tables generation";

/// Whether `snapshot` is an [`UNREAD`] one.
pub fn is_unread(snapshot: &str) -> bool {
    snapshot.starts_with(UNREAD)
}

/// How a back end cuts its owned part out of a kernel read, kept in [`Plan`].
pub(crate) trait Owned: fmt::Debug + Send + Sync {
    fn owned(&self, kernel: &str) -> Result<String, String>;
    /// See [`Plan::revert`]; only back ends that commit table by table need one.
    fn revert(&self, _after: &str) -> Result<Option<String>, String> {
        Ok(None)
    }
}

/// How much of the owned state a plan rewrites.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Nothing to load.
    Unchanged,
    /// Only what changed since the last apply.
    Incremental,
    /// Everything owned, with the reason a smaller load was not possible.
    Full(String),
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mode::Unchanged => f.write_str("unchanged"),
            Mode::Incremental => f.write_str("incremental"),
            Mode::Full(why) => write!(f, "full ({why})"),
        }
    }
}

/// What the last successful apply recorded in the state directory.
#[derive(Clone, Copy, Debug)]
pub struct Previous<'a> {
    /// The compiled document it loaded.
    pub document: &'a str,
    /// The owned state the kernel showed right after ([`Plan::owned`] of that moment).
    pub snapshot: &'a str,
}

/// The IP family of a document, which picks `iptables` or `ip6tables`, `ip` or `ip6`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn as_str(self) -> &'static str {
        match self {
            Family::V4 => "ipv4",
            Family::V6 => "ipv6",
        }
    }
}

/// The commands of one back end for one family, as argument vectors (no shell, no
/// network namespace: the CLI prefixes `ip netns exec NAME` when asked to).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Commands {
    /// Prints the kernel's current state on stdout.
    pub read: Vec<String>,
    /// Checks the document at the path appended last, without changing anything.
    pub check: Vec<String>,
    /// Loads the document at the path appended last, as one transaction per table
    /// (iptables) or one transaction (nftables).
    pub load: Vec<String>,
    /// Loads the document at the path appended last into a new, empty network namespace
    /// and prints what the kernel shows there (the `read` output).
    pub scratch: Vec<String>,
}

/// The family a compiled document's first line names, for [`Planner::family_of`]: the line
/// starts with `prefix` and says `IPv6` or `IPv4` followed by `end`.
pub(crate) fn family_in_first_line(doc: &str, prefix: &str, end: char) -> Option<Family> {
    let first = doc.lines().next()?;
    if !first.starts_with(prefix) {
        None
    } else if first.contains(&format!(", IPv6{end}")) {
        Some(Family::V6)
    } else if first.contains(&format!(", IPv4{end}")) {
        Some(Family::V4)
    } else {
        None
    }
}

pub(crate) fn argv(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| w.to_string()).collect()
}

/// [`Commands::scratch`] for a shell `script` that loads the file `$1` and prints the
/// state: run in a network namespace of its own, gone when it ends.
pub(crate) fn scratch(script: &str) -> Vec<String> {
    argv(&[
        "unshare",
        "--net",
        "--",
        "sh",
        "-c",
        script,
        "svc-compile-scratch",
    ])
}

/// What a plan changes, for the one-line report and `--dry-run`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Chains created or rewritten.
    pub rewritten: usize,
    /// Chains (and nftables sets) deleted.
    pub deleted: usize,
    /// Jump rules added to (or removed from) built-in chains.
    pub jumps: usize,
    /// nftables map and set elements added or deleted.
    pub elements: usize,
    /// nftables chains no longer wanted, emptied now and deleted by a later apply (a
    /// delete costs `nft` a listing of every chain; see `nftables::plan`).
    pub emptied: usize,
    /// Objects someone else changed, added or deleted, put back as the document has them
    /// ([`Planner::prepare_repair`]); also counted above.
    pub repaired: usize,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} chain(s) written, {} deleted, {} jump(s), {} element(s)",
            self.rewritten, self.deleted, self.jumps, self.elements
        )?;
        if self.emptied > 0 {
            write!(f, ", {} emptied (deleted later)", self.emptied)?;
        }
        if self.repaired > 0 {
            write!(f, ", {} repaired", self.repaired)?;
        }
        Ok(())
    }
}

/// The result of planning: everything the CLI needs to move the node to the new state.
#[derive(Clone, Debug)]
pub struct Plan {
    pub mode: Mode,
    /// The document to check and load; `None` when nothing has to change.
    pub load: Option<String>,
    /// The owned state the kernel must show once `load` is in (compare with
    /// [`Plan::owned`] of a fresh read).
    pub expected: String,
    pub summary: Summary,
    /// Things the operator should know (e.g. a stale chain kept because a foreign rule
    /// still jumps to it).
    pub warnings: Vec<String>,
    /// What the load writes when that is only part of the owned state (an incremental
    /// nftables load), for the CLI's fingerprint ([`Planner::fingerprint`]): it reads again
    /// only these objects. `None`: everything.
    pub touched: Option<Touched>,
    pub(crate) owner: Arc<dyn Owned>,
}

/// The nftables chains and sets a load creates, changes or deletes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Touched {
    pub chains: Vec<String>,
    pub sets: Vec<String>,
    /// Of `sets`: the ones the load neither created, flushed nor deleted, only deleted
    /// some elements of and added others (by key, in [`ElementWrites`]), so that the
    /// CLI can ask the kernel for those elements alone instead of listing the whole set
    /// (a set dump walks the set again for every message: 0.1–0.3 s for 100k elements).
    pub elements: Vec<ElementWrites>,
}

/// One set's element writes in a load ([`Touched::elements`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ElementWrites {
    pub set: String,
    /// The key's data types in order, as the set declares them (`ipv4_addr`,
    /// `inet_proto`, `inet_service`, …; several: a concatenation).
    pub key_type: Vec<String>,
    /// The keys of the elements the load deletes: gone, or given another value (then in
    /// `added` too). The set had each of them before the load.
    pub gone: Vec<String>,
    /// The keys of the elements the load adds.
    pub added: Vec<String>,
}

/// How an nftables table differs from what the last apply left, object by object (the
/// CLI's fingerprint against the recorded one; [`Planner::prepare_repair`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Drift {
    /// Objects the record has and the node too, with other rules or elements (their own
    /// attributes as recorded: a change to those is no drift a rewrite mends).
    pub changed: Touched,
    /// Objects the node has and the record does not: someone else's.
    pub added: Touched,
    /// Objects the record has and the node no longer does.
    pub gone: Touched,
}

impl Plan {
    /// The owned part of a kernel read (`Commands::read` output), in the canonical text
    /// [`Plan::expected`] uses and the state directory keeps.
    pub fn owned(&self, kernel: &str) -> Result<String, String> {
        self.owner.owned(kernel)
    }

    /// After a failed load: the document that puts back what the kernel showed before,
    /// for the tables the failed load did commit (`after` is a fresh read). iptables
    /// commits table by table, so a load can fail halfway; nftables never needs this.
    pub fn revert(&self, after: &str) -> Result<Option<String>, String> {
        self.owner.revert(after)
    }

    /// The first line where `expected` and `actual` owned states differ, for error messages.
    pub fn first_difference(expected: &str, actual: &str) -> String {
        let (mut e, mut a) = (expected.lines(), actual.lines());
        loop {
            match (e.next(), a.next()) {
                (None, None) => return "no difference".into(),
                (x, y) if x == y => continue,
                (Some(x), Some(y)) => return format!("expected `{x}`, the kernel shows `{y}`"),
                (Some(x), None) => return format!("expected `{x}`, the kernel shows nothing more"),
                (None, Some(y)) => return format!("the kernel also shows `{y}`"),
            }
        }
    }
}

/// Step one of planning (see the module docs).
#[derive(Clone, Debug)]
pub struct Prepared {
    pub mode: Mode,
    /// Load this into an empty network namespace and hand the read-back to `plan`; when
    /// it is empty, hand over empty text instead.
    pub scratch: String,
    pub family: Family,
    /// A full load into a node that shows nothing owned, whose scratch document is the
    /// load itself: loading it on the node proves it as the scratch namespace would (the
    /// kernel accepts it or refuses it the same way), so the CLI may load it there
    /// directly, once, and plan from the node's read-back ([`Prepared::direct_view`]).
    pub direct: bool,
    pub(crate) step: Arc<dyn Step>,
}

impl Prepared {
    /// After a direct load (see [`Prepared::direct`]) that nobody else's commit followed:
    /// the node's read, cut to what the scratch namespace would show for the scratch
    /// document, for [`plan`]; `None` when that is the read itself.
    pub fn direct_view(&self, after: &str) -> Result<Option<String>, String> {
        self.step.direct_view(after)
    }

    /// After a direct load that failed: the document that takes off the node what the
    /// load did commit (iptables commits table by table), given a fresh read; `None` when
    /// nothing of it is there.
    pub fn direct_revert(&self, after: &str) -> Result<Option<String>, String> {
        self.step.direct_revert(after)
    }

    /// After a direct load (see [`Prepared::direct`]) that the nf_tables generation proved
    /// (it advanced by exactly the load's transactions): the plan without a read of the
    /// node, whose expectation is [`UNREAD`]. `None`: this back end reads the node back.
    pub fn unread_plan(&self) -> Option<Plan> {
        self.step.unread_plan(self)
    }
}

/// Step two of planning, for any back end.
pub fn plan(prepared: &Prepared, scratch_output: &str) -> Result<Plan, String> {
    prepared.step.plan(prepared, scratch_output)
}
