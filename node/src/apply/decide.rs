//! What one family's apply does next, decided without I/O: [`Decider::next`] takes what the
//! last [`Step`] found ([`Seen`]) and names the next step. `Ctx::apply_once` carries the
//! steps out (it runs the planner, the loaders and the reads, and writes the record) and
//! holds the data they produce (reads, plans, fingerprints); the decider holds what is
//! needed to choose: the record's facts, the nf_tables generations, and what has
//! happened so far (a refusal, a direct load that could not be proven, …).
//!
//! Invariants:
//! - A plan from the record (by generation, by fingerprint, or a repair) is only loaded
//!   while the record is known to be the node's state; any refusal of it sends the apply
//!   back to reading the node, never to a failure.
//! - An incremental plan the node refuses is retried once as a full plan from a read;
//!   a full plan refused is the failure ([`Failure::Refused`]).
//! - The verdict "known by its generation/fingerprint/repair" ([`By`]) is only given when
//!   nf_tables' generation proves that nothing but this apply's load was committed since
//!   the state it planned from; otherwise the node is read back and compared.
//! - A load planned from an unread record that the generation does not prove is not
//!   recorded: the apply starts again, reading the node ([`Step::Restart`]).
//! - Dry runs load and record nothing: the only steps before [`Outcome::DryRun`] are
//!   fingerprints, reads and plans.

use crate::nfgen::Generation;

/// What the decider is told before the first step.
#[derive(Clone, Debug, Default)]
pub struct Setup {
    /// `--dry-run`.
    pub dry_run: bool,
    /// `--full`: ignore the record, load everything.
    pub full: bool,
    /// nf_tables' generation when this apply started, before anything was read.
    pub gen_start: Option<Generation>,
    /// The last apply's record (`applied.*`), when whole.
    pub record: Option<Record>,
    /// [`svc_targets::plan::Planner::scratch_proves_first_load`].
    pub scratch_proves_first_load: bool,
}

/// The facts of a whole record.
#[derive(Clone, Debug, Default)]
pub struct Record {
    /// It holds the document this apply applies.
    pub same_document: bool,
    /// The generation recorded with it (`applied.gen`): the node showed the record then.
    pub generation: Option<Generation>,
    /// It is an unread one ([`svc_targets::plan::UNREAD`]) with the fingerprint of our
    /// table beside it (`applied.digest`).
    pub fingerprint: bool,
}

/// Where step one of planning starts from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanFrom {
    /// The record stands for the node (`Planner::prepare_unchanged`).
    Record,
    /// The record but for the objects the fingerprint named (`Planner::prepare_repair`).
    Repair,
    /// The node's read (`Planner::prepare`), `full`: everything (`force_full`).
    Read { full: bool },
}

/// What a planner's plan is, as far as choosing goes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Planned {
    /// There is something to load (`Plan::load`).
    pub loads: bool,
    /// `Planner::transactions` of the load.
    pub transactions: Option<u32>,
    /// The mode is incremental.
    pub incremental: bool,
    /// Its expectation is [`svc_targets::plan::UNREAD`].
    pub unread: bool,
    /// It writes some sets element by element (`Touched::elements` is not empty).
    pub elements: bool,
}

/// Which of the node's commands refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Check,
    Load,
}

/// What to do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Take our table's fingerprint at the start generation and compare it with the
    /// record's: [`Seen::Fingerprint`].
    Fingerprint,
    /// Write `applied.gen` with this generation (the record is known again, by its
    /// fingerprint, at a later generation): [`Seen::Done`].
    RecordGeneration(Generation),
    /// Read the node (`Commands::read`), to plan from: [`Seen::Done`].
    ReadNode,
    /// Step one of planning: [`Seen::Prepared`].
    Prepare(PlanFrom),
    /// A first load straight onto the node (`Prepared::direct`), when the prepared plan
    /// is one: [`Seen::Direct`].
    LoadDirect,
    /// Remove `applied.state`: the node no longer shows the record (a direct load went
    /// in): [`Seen::Done`].
    Unrecord,
    /// Load the scratch document into an empty namespace and plan step two:
    /// [`Seen::Planned`].
    Scratch,
    /// Does the node's read show nothing the plan owns (a first load the scratch
    /// namespace proved, needing no check)? [`Seen::OwnsNothing`].
    OwnsNothing,
    /// Write the load document (`load.EXT`); `gone`: first read the elements it deletes
    /// from sets it writes element by element: [`Seen::Done`].
    WriteLoad { gone: bool },
    /// Check the load on the node (`Commands::check`): [`Seen::Accepted`].
    Check,
    /// Load it (`Commands::load`): [`Seen::Accepted`].
    Load,
    /// Say why the plan changes: [`Seen::Done`].
    Note(Note),
    /// The plan is final: print its warnings. [`Seen::Done`].
    Warn,
    /// After a failed load: put back what it committed (`Plan::revert`): [`Seen::Done`].
    Undo,
    /// Read nf_tables' generation now: [`Seen::Generation`].
    Generation,
    /// Fingerprint our table after the load (what it did not touch keeps the hash it had
    /// before; nothing loaded: the fingerprint planned from), taken at this generation:
    /// [`Seen::Done`].
    Refingerprint(Option<Generation>),
    /// Read the node back (`reuse`: nothing was loaded, the read before stands, at the
    /// start generation) and compare its owned part with the plan's expectation:
    /// [`Seen::ReadBack`].
    ReadBack { reuse: bool },
    /// Write the record: `applied.digest`, the document and `applied.state`, `applied.gen`
    /// (this generation, or none). `rewrite`: even when it says what the node shows (a
    /// direct load removed it). [`Seen::Done`].
    Record {
        at: Option<Generation>,
        rewrite: bool,
    },
    /// nf_tables changed during a load planned from an unread record: remove the record
    /// and apply again from the start (which reads the node). Last step.
    Restart,
    /// The apply of this family ended. Last step.
    Done(Outcome),
    /// The apply of this family failed. Last step.
    Fail(Failure),
}

/// A note on stderr that a plan changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Note {
    /// The node refused the repair planned from the fingerprint: reading the node.
    RepairRefused,
    /// The node refused the incremental load: loading everything.
    IncrementalRefused,
}

/// How the node's state after this apply is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum By {
    /// nf_tables' generation: nothing was committed but this apply's load.
    Generation,
    /// The record's fingerprint is the node's (nf_tables changed elsewhere).
    Fingerprint,
    /// The fingerprint differed in some chains and sets, which were written again.
    Repair,
    /// A read of the node.
    Read,
}

/// How an apply ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// `--dry-run`: print the script; `check`: with the check on the node.
    DryRun { check: bool },
    /// The record is the node's and holds the document: nothing planned or loaded.
    Unchanged { by: By, at: Option<Generation> },
    /// Planned, loaded if there was something to load, verified and recorded.
    Applied {
        /// Something was loaded (`applied`), or nothing was (`unchanged`).
        loaded: bool,
        by: By,
        /// The generation everything was verified at.
        at: Option<Generation>,
        /// The incremental load was refused and everything was loaded instead (said once
        /// that load is in).
        refused_incremental: bool,
    },
}

/// Why an apply failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The node refused the full ruleset; nothing was changed. `reread`: a direct first
    /// load is in place, unrecorded.
    Refused { by: Command, reread: bool },
    /// The load failed; [`Step::Undo`] ran.
    LoadFailed { reread: bool },
    /// The node's read-back is not the plan's expectation.
    NotAsLoaded,
}

/// What a step found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// Nothing yet (the first call), or the step is done and has nothing to say.
    Done,
    /// [`Step::Fingerprint`].
    Fingerprint(Fingerprint),
    /// [`Step::Prepare`]: `false` when the planner cannot plan from the record (then
    /// the node is read).
    Prepared(bool),
    /// [`Step::LoadDirect`].
    Direct(Direct),
    /// [`Step::Scratch`].
    Planned(Planned),
    /// [`Step::OwnsNothing`].
    OwnsNothing(bool),
    /// [`Step::Check`], [`Step::Load`]: the node took it.
    Accepted(bool),
    /// [`Step::Generation`].
    Generation(Option<Generation>),
    /// [`Step::ReadBack`]: the read's generation if nothing was committed after it and
    /// nf_tables tracks the state it shows; whether its owned part is the expectation.
    ReadBack { at: Option<Generation>, same: bool },
}

/// Our table's fingerprint against the record's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fingerprint {
    Same,
    /// Different; `mendable`: in chains' rules and sets' elements only (`Digest::drift`).
    Differs {
        mendable: bool,
    },
    /// Not taken (nf_tables changed while it was read, or netlink refused).
    Untaken,
}

/// What [`Step::LoadDirect`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Direct {
    /// Nothing loaded (not a direct plan, or a failed load taken off again).
    Skipped,
    /// Loaded and proven at `at`, with this plan.
    Done { at: Generation, plan: Planned },
    /// Loaded, not proven: the read after it is the node's read, to plan from again.
    Reread,
}

/// One family's apply, step by step (see the module docs).
#[derive(Debug)]
pub struct Decider {
    setup: Setup,
    /// The step whose answer is awaited (`None`: none yet).
    last: Option<Step>,
    /// The record stands for the node.
    known: bool,
    by_fingerprint: bool,
    /// Plan from the record and the fingerprint's drift.
    repair: bool,
    /// The generation at which the record is known to be the node's state.
    base_gen: Option<Generation>,
    full: bool,
    /// The node has been read (for planning).
    read: bool,
    /// A direct first load went in unproven: planned again from the read after it.
    reread: bool,
    /// The generation right after a direct first load that was proven.
    direct: Option<Generation>,
    /// The plan's load is in.
    loaded: bool,
    /// The plan is final ([`Step::Warn`] given).
    settled: bool,
    refused_incremental: bool,
    plan: Planned,
    /// How the state after the load is known, once it is.
    by: By,
    at: Option<Generation>,
}

impl Decider {
    pub fn new(setup: Setup) -> Decider {
        let recorded = setup.record.as_ref().and_then(|r| r.generation.clone());
        let known = !setup.full && recorded.is_some() && recorded == setup.gen_start;
        Decider {
            known,
            by_fingerprint: false,
            repair: false,
            base_gen: recorded,
            full: setup.full,
            read: false,
            reread: false,
            direct: None,
            loaded: false,
            settled: false,
            refused_incremental: false,
            plan: Planned::default(),
            by: By::Read,
            at: None,
            last: None,
            setup,
        }
    }

    /// A direct first load is in place, unrecorded (messages say so).
    pub fn reread(&self) -> bool {
        self.reread
    }

    /// The next step, given what the last one found ([`Seen::Done`] for the first).
    pub fn next(&mut self, seen: Seen) -> Step {
        let step = self.decide(seen);
        self.last = Some(step.clone());
        step
    }

    fn decide(&mut self, seen: Seen) -> Step {
        let Some(last) = self.last.clone() else {
            return self.start();
        };
        match (last, seen) {
            (Step::Fingerprint, Seen::Fingerprint(f)) => {
                match f {
                    Fingerprint::Same => {
                        self.known = true;
                        self.by_fingerprint = true;
                        self.base_gen = self.setup.gen_start.clone();
                    }
                    Fingerprint::Differs { mendable } => self.repair = mendable,
                    Fingerprint::Untaken => {}
                }
                self.known_or_plan()
            }
            (Step::RecordGeneration(g), Seen::Done) => Step::Done(Outcome::Unchanged {
                by: By::Fingerprint,
                at: Some(g),
            }),
            (Step::ReadNode, Seen::Done) => {
                self.read = true;
                self.prepare()
            }
            (Step::Prepare(_), Seen::Prepared(ok)) => {
                if !ok {
                    // Only a plan from the record can be declined: from a read now.
                    self.known = false;
                    return self.prepare();
                }
                if self.reread || self.setup.dry_run {
                    Step::Scratch
                } else {
                    Step::LoadDirect
                }
            }
            (Step::LoadDirect, Seen::Direct(d)) => match d {
                Direct::Skipped => Step::Scratch,
                Direct::Done { at, plan } => {
                    self.plan = plan;
                    self.direct = Some(at);
                    self.loaded = true;
                    self.settle()
                }
                Direct::Reread => {
                    self.read = true;
                    self.reread = true;
                    Step::Unrecord
                }
            },
            (Step::Unrecord, Seen::Done) => self.prepare(),
            (Step::Scratch, Seen::Planned(plan)) => {
                self.plan = plan;
                let checked = self.plan.loads && self.plan.transactions != Some(1);
                if self.setup.dry_run {
                    if checked && self.first_load_candidate() {
                        return Step::OwnsNothing;
                    }
                    return Step::Done(Outcome::DryRun { check: checked });
                }
                if !self.plan.loads {
                    return self.settle();
                }
                Step::WriteLoad {
                    gone: self.plan.elements && self.known && self.plan.unread,
                }
            }
            (Step::WriteLoad { .. }, Seen::Done) => {
                if self.plan.transactions == Some(1) {
                    Step::Load
                } else if self.first_load_candidate() {
                    Step::OwnsNothing
                } else {
                    Step::Check
                }
            }
            (Step::OwnsNothing, Seen::OwnsNothing(nothing)) => match () {
                _ if self.setup.dry_run => Step::Done(Outcome::DryRun { check: !nothing }),
                _ if nothing => self.settle(),
                _ => Step::Check,
            },
            (Step::Check, Seen::Accepted(true)) => self.settle(),
            (Step::Check, Seen::Accepted(false)) => {
                if self.known {
                    // Planned from the record: plan again from what the node shows.
                    self.known = false;
                    self.repair = false;
                    self.prepare()
                } else if self.plan.incremental && !self.full {
                    self.full = true;
                    Step::Note(Note::IncrementalRefused)
                } else {
                    self.refused(Command::Check)
                }
            }
            (Step::Load, Seen::Accepted(true)) if !self.settled => {
                self.loaded = true;
                self.settle()
            }
            (Step::Load, Seen::Accepted(false)) if !self.settled => {
                // One transaction, refused: nothing changed.
                if self.known {
                    self.known = false;
                    if std::mem::take(&mut self.repair) {
                        return Step::Note(Note::RepairRefused);
                    }
                    self.prepare()
                } else if self.plan.incremental && !self.full {
                    // Said once the full load is in: if it is refused too, its error says why.
                    self.refused_incremental = true;
                    self.full = true;
                    self.prepare()
                } else {
                    self.refused(Command::Load)
                }
            }
            (Step::Note(_), Seen::Done) => self.prepare(),
            (Step::Warn, Seen::Done) => {
                if self.plan.loads && !self.loaded {
                    Step::Load
                } else {
                    self.prove()
                }
            }
            (Step::Load, Seen::Accepted(true)) => self.prove(),
            (Step::Load, Seen::Accepted(false)) => Step::Undo,
            (Step::Undo, Seen::Done) => Step::Fail(Failure::LoadFailed {
                reread: self.reread,
            }),
            (Step::Generation, Seen::Generation(now)) => {
                let after = self.after_load();
                let proven = after.filter(|a| now.as_ref() == Some(a));
                match proven {
                    Some(g) => self.proven(Some(g)),
                    None => self.unproven(),
                }
            }
            (Step::Refingerprint(_), Seen::Done) => self.record(),
            (Step::ReadBack { .. }, Seen::ReadBack { at, same }) => {
                if !same {
                    return Step::Fail(Failure::NotAsLoaded);
                }
                self.by = By::Read;
                self.at = at;
                self.record()
            }
            (Step::Record { .. }, Seen::Done) => Step::Done(Outcome::Applied {
                loaded: self.plan.loads || self.direct.is_some() || self.reread,
                by: self.by,
                at: self.at.clone(),
                refused_incremental: self.refused_incremental,
            }),
            (last, seen) => unreachable!("{seen:?} does not answer {last:?}"),
        }
    }

    fn start(&mut self) -> Step {
        let fingerprinted = self.setup.record.as_ref().is_some_and(|r| r.fingerprint);
        if !self.known && !self.full && fingerprinted {
            return Step::Fingerprint;
        }
        self.known_or_plan()
    }

    /// Known and the same document: nothing to plan, load or record. Else plan.
    fn known_or_plan(&mut self) -> Step {
        let same = self.setup.record.as_ref().is_some_and(|r| r.same_document);
        if self.known && !self.setup.dry_run && same {
            return match (self.by_fingerprint, &self.base_gen) {
                (true, Some(g)) => Step::RecordGeneration(g.clone()),
                _ => Step::Done(Outcome::Unchanged {
                    by: match self.by_fingerprint {
                        true => By::Fingerprint,
                        false => By::Generation,
                    },
                    at: self.base_gen.clone(),
                }),
            };
        }
        // A repair plans from the record and the drift, both as of the generation of now.
        if self.repair {
            self.known = true;
            self.base_gen = self.setup.gen_start.clone();
        }
        self.prepare()
    }

    /// Step one: from the record while it is known, else from a read.
    fn prepare(&mut self) -> Step {
        if self.known && self.setup.record.is_some() {
            return Step::Prepare(match self.repair {
                true => PlanFrom::Repair,
                false => PlanFrom::Record,
            });
        }
        self.known = false;
        if !self.read {
            return Step::ReadNode;
        }
        Step::Prepare(PlanFrom::Read { full: self.full })
    }

    /// A first load (the node read shows nothing owned) that the scratch namespace proved
    /// whole needs no check on the node, if the planner says so.
    fn first_load_candidate(&self) -> bool {
        !self.known && self.setup.scratch_proves_first_load && self.read
    }

    fn settle(&mut self) -> Step {
        self.settled = true;
        Step::Warn
    }

    fn refused(&self, by: Command) -> Step {
        Step::Fail(Failure::Refused {
            by,
            reread: self.reread,
        })
    }

    /// The generation the load leads to from the known state, if nobody else commits.
    fn after_load(&self) -> Option<Generation> {
        let n = self.plan.transactions?;
        Some(self.base_gen.as_ref()?.after(n))
    }

    /// What the kernel shows now must be what was meant. Known path: the generation
    /// advanced by exactly this load's transactions (nobody else committed), and what it
    /// wrote was read back in the scratch namespace. Otherwise a read.
    fn prove(&mut self) -> Step {
        if !self.known {
            return self.unproven();
        }
        if !self.plan.loads {
            return self.proven(self.base_gen.clone());
        }
        match self.after_load() {
            Some(_) => Step::Generation,
            None => self.unproven(),
        }
    }

    /// How the record's state is known, when the generation proves it.
    fn by_generation(&self) -> By {
        match () {
            _ if self.repair => By::Repair,
            _ if self.by_fingerprint => By::Fingerprint,
            _ => By::Generation,
        }
    }

    fn proven(&mut self, at: Option<Generation>) -> Step {
        self.by = self.by_generation();
        self.at = at.clone();
        if self.plan.unread {
            // The record's fingerprint still holds for what the load did not touch.
            return Step::Refingerprint(at);
        }
        self.record()
    }

    fn unproven(&mut self) -> Step {
        match self.direct.clone() {
            // Loaded from an unread record, but someone else committed too: nothing to
            // compare a read with.
            None if self.plan.unread => Step::Restart,
            // A direct first load the generation proved: fingerprinted instead of read,
            // or planned from the read taken right after it.
            Some(g) => {
                self.by = match self.plan.unread {
                    true => self.by_generation(),
                    false => By::Read,
                };
                self.at = Some(g);
                self.record()
            }
            None => Step::ReadBack {
                reuse: !self.plan.loads && self.read,
            },
        }
    }

    fn record(&mut self) -> Step {
        Step::Record {
            at: self.at.clone(),
            rewrite: self.reread,
        }
    }
}

#[cfg(test)]
mod tests;
