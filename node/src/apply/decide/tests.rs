//! The decider driven against a model of the node: its nf_tables generation counter, who
//! else commits, what the planner plans from where, which loads the kernel refuses and
//! whether the read back shows the plan's expectation. Each case asserts the whole
//! sequence of steps, the outcome last; `every_step_kind_has_a_case` checks that the
//! cases together take every kind of step, outcome and failure.
use super::*;
use std::collections::BTreeSet;

fn g(id: u32) -> Generation {
    Generation {
        boot: "b0".into(),
        netns: 4097,
        id,
    }
}

/// What [`Step::LoadDirect`] does on the model.
#[derive(Clone, Copy, Debug, PartialEq)]
enum DirectIs {
    /// Not a direct plan (or the loader refused it): nothing loaded.
    Skipped,
    /// Loaded, nobody else committed; `unread`: fingerprinted, not read back.
    Proven { unread: bool },
    /// Loaded, but someone else committed at the same time.
    Unproven,
}

/// The node and the planner, as far as the decider can tell them apart.
#[derive(Clone, Debug)]
struct Node {
    /// nf_tables' generation id now.
    gen: u32,
    fingerprint: Fingerprint,
    /// The planner cannot plan from the record (`prepare_unchanged` gives `None`).
    declines_record: bool,
    direct: DirectIs,
    /// Transactions of every load (nftables 1, iptables-nft one per table).
    transactions: Option<u32>,
    /// Plans from the record (or a direct first load) expect an UNREAD state (nftables).
    unread_record: bool,
    /// The document differs from the record's: a plan loads something.
    changes: bool,
    /// The node refuses (check or one-transaction load) a plan made from this.
    refuses: fn(&PlanFrom) -> bool,
    /// A load the node's check took fails all the same.
    load_fails: bool,
    /// Someone else commits during every load.
    foreign: bool,
    /// The read back shows the plan's expectation.
    same: bool,
    /// The node read shows nothing owned.
    owns_nothing: bool,
    /// What the last prepare started from.
    from: Option<PlanFrom>,
    /// A direct load is in place: a plan from the read loads nothing more, unless
    /// `more_after_direct`.
    in_place: bool,
    more_after_direct: bool,
    /// No record: a plan from the read is a full one.
    first_apply: bool,
    /// The generation the apply started at (the read taken then is reused after a load
    /// that loaded nothing more: it stands only while nothing was committed since).
    start: Option<u32>,
}

impl Node {
    /// nftables on a node with nothing but us.
    fn nft() -> Node {
        Node {
            gen: 10,
            fingerprint: Fingerprint::Same,
            declines_record: false,
            direct: DirectIs::Skipped,
            transactions: Some(1),
            unread_record: true,
            changes: true,
            refuses: |_| false,
            load_fails: false,
            foreign: false,
            same: true,
            owns_nothing: false,
            from: None,
            in_place: false,
            more_after_direct: false,
            first_apply: false,
            start: None,
        }
    }

    /// iptables-nft: two tables, checked before loading; always read back.
    fn iptables() -> Node {
        Node {
            transactions: Some(2),
            unread_record: false,
            ..Node::nft()
        }
    }

    fn plan(&self) -> Planned {
        let from = self.from.clone().expect("prepared");
        let from_record = matches!(from, PlanFrom::Record | PlanFrom::Repair);
        Planned {
            loads: match from {
                PlanFrom::Repair => true,
                _ => self.changes && (!self.in_place || self.more_after_direct),
            },
            transactions: self.transactions,
            incremental: !self.first_apply && !matches!(from, PlanFrom::Read { full: true }),
            unread: from_record && self.unread_record,
            elements: from_record,
        }
    }

    /// A load goes in: the generation advances by its transactions (and by one more
    /// when someone else commits too).
    fn commit(&mut self) {
        self.gen += self.transactions.unwrap_or(1) + u32::from(self.foreign);
    }

    fn answer(&mut self, step: &Step) -> Seen {
        match step {
            Step::Fingerprint => Seen::Fingerprint(self.fingerprint),
            Step::Prepare(from) => {
                if *from == PlanFrom::Record && self.declines_record {
                    return Seen::Prepared(false);
                }
                self.from = Some(from.clone());
                Seen::Prepared(true)
            }
            Step::LoadDirect => Seen::Direct(match self.direct {
                DirectIs::Skipped => Direct::Skipped,
                DirectIs::Proven { unread } => {
                    self.commit();
                    self.in_place = true;
                    Direct::Done {
                        at: g(self.gen),
                        plan: Planned {
                            unread,
                            ..self.plan()
                        },
                    }
                }
                DirectIs::Unproven => {
                    self.foreign = true;
                    self.commit();
                    self.foreign = false;
                    self.in_place = true;
                    Direct::Reread
                }
            }),
            Step::Scratch => Seen::Planned(self.plan()),
            Step::OwnsNothing => Seen::OwnsNothing(self.owns_nothing),
            Step::Check => Seen::Accepted(!(self.refuses)(self.from.as_ref().unwrap())),
            Step::Load => {
                let one = self.transactions == Some(1);
                let refused = one && (self.refuses)(self.from.as_ref().unwrap());
                if refused || self.load_fails {
                    return Seen::Accepted(false);
                }
                self.commit();
                Seen::Accepted(true)
            }
            Step::Generation => Seen::Generation(Some(g(self.gen))),
            Step::ReadBack { reuse: true } => Seen::ReadBack {
                at: self.start.filter(|s| *s == self.gen).map(g),
                same: self.same,
            },
            Step::ReadBack { reuse: false } => Seen::ReadBack {
                at: Some(g(self.gen)),
                same: self.same,
            },
            Step::RecordGeneration(_)
            | Step::ReadNode
            | Step::Unrecord
            | Step::WriteLoad { .. }
            | Step::Note(_)
            | Step::Warn
            | Step::Undo
            | Step::Refingerprint(_)
            | Step::Record { .. } => Seen::Done,
            Step::Restart | Step::Done(_) | Step::Fail(_) => unreachable!("a last step"),
        }
    }
}

/// No record: a first apply, at generation 10.
fn first() -> Setup {
    Setup {
        gen_start: Some(g(10)),
        ..Setup::default()
    }
}

/// A record of another document, recorded at generation `at` (`None`: none recorded).
fn recorded(at: Option<u32>, fingerprint: bool) -> Setup {
    Setup {
        gen_start: Some(g(10)),
        record: Some(Record {
            same_document: false,
            generation: at.map(g),
            fingerprint,
        }),
        ..Setup::default()
    }
}

/// The same, holding the document this apply applies.
fn recorded_same(at: Option<u32>, fingerprint: bool) -> Setup {
    let mut s = recorded(at, fingerprint);
    s.record.as_mut().unwrap().same_document = true;
    s
}

struct Case {
    setup: Setup,
    node: Node,
    steps: Vec<Step>,
}

/// Drives a decider with the model's answers until a last step.
fn run(setup: Setup, mut node: Node) -> Vec<Step> {
    node.start = setup.gen_start.as_ref().map(|g| g.id);
    let mut d = Decider::new(setup);
    let mut steps = Vec::new();
    let mut seen = Seen::Done;
    loop {
        let step = d.next(seen);
        steps.push(step.clone());
        if matches!(step, Step::Restart | Step::Done(_) | Step::Fail(_)) {
            return steps;
        }
        assert!(steps.len() < 64, "no end: {steps:#?}");
        seen = node.answer(&step);
    }
}

fn check(case: Case) {
    assert_eq!(run(case.setup, case.node), case.steps);
}

fn applied(by: By, at: u32) -> Step {
    Step::Done(Outcome::Applied {
        loaded: true,
        by,
        at: Some(g(at)),
        refused_incremental: false,
    })
}

fn record(at: u32) -> Step {
    Step::Record {
        at: Some(g(at)),
        rewrite: false,
    }
}

const READ: Step = Step::Prepare(PlanFrom::Read { full: false });
const READ_FULL: Step = Step::Prepare(PlanFrom::Read { full: true });

// First applies.

fn first_apply_direct_load_read_back() -> Case {
    Case {
        setup: first(),
        node: Node {
            direct: DirectIs::Proven { unread: false },
            ..Node::iptables()
        },
        steps: vec![
            Step::ReadNode,
            READ,
            Step::LoadDirect,
            Step::Warn,
            record(12),
            applied(By::Read, 12),
        ],
    }
}

fn first_apply_direct_load_fingerprinted() -> Case {
    Case {
        setup: first(),
        node: Node {
            direct: DirectIs::Proven { unread: true },
            ..Node::nft()
        },
        steps: vec![
            Step::ReadNode,
            READ,
            Step::LoadDirect,
            Step::Warn,
            record(11),
            applied(By::Generation, 11),
        ],
    }
}

/// Someone else committed during the direct load: the record goes, the node is planned
/// again from the read after it (which shows the load in place: nothing more to load),
/// and the record is written again.
fn first_apply_direct_load_unproven_rereads() -> Case {
    Case {
        setup: first(),
        node: Node {
            direct: DirectIs::Unproven,
            ..Node::nft()
        },
        steps: vec![
            Step::ReadNode,
            READ,
            Step::LoadDirect,
            Step::Unrecord,
            READ,
            Step::Scratch,
            Step::Warn,
            Step::ReadBack { reuse: true },
            // The read after the direct load stands for the read back, but the
            // generation it is known at is the start's, which the load moved on: none.
            Step::Record {
                at: None,
                rewrite: true,
            },
            Step::Done(Outcome::Applied {
                loaded: true,
                by: By::Read,
                at: None,
                refused_incremental: false,
            }),
        ],
    }
}

/// A checked load (iptables) into a node that shows nothing owned, proven by the
/// scratch namespace: no check on the node.
fn first_apply_scratch_proves_no_check() -> Case {
    Case {
        setup: Setup {
            scratch_proves_first_load: true,
            ..first()
        },
        node: Node {
            owns_nothing: true,
            ..Node::iptables()
        },
        steps: vec![
            Step::ReadNode,
            READ,
            Step::LoadDirect,
            Step::Scratch,
            Step::WriteLoad { gone: false },
            Step::OwnsNothing,
            Step::Warn,
            Step::Load,
            Step::ReadBack { reuse: false },
            record(12),
            applied(By::Read, 12),
        ],
    }
}

fn first_apply_node_owns_something_checks() -> Case {
    Case {
        setup: Setup {
            scratch_proves_first_load: true,
            ..first()
        },
        node: Node::iptables(),
        steps: vec![
            Step::ReadNode,
            READ,
            Step::LoadDirect,
            Step::Scratch,
            Step::WriteLoad { gone: false },
            Step::OwnsNothing,
            Step::Check,
            Step::Warn,
            Step::Load,
            Step::ReadBack { reuse: false },
            record(12),
            applied(By::Read, 12),
        ],
    }
}

// The known fast paths.

fn unchanged_by_generation() -> Case {
    Case {
        setup: recorded_same(Some(10), true),
        node: Node::nft(),
        steps: vec![Step::Done(Outcome::Unchanged {
            by: By::Generation,
            at: Some(g(10)),
        })],
    }
}

/// nf_tables moved since the record, our table's fingerprint did not: the generation of
/// now is recorded, nothing else.
fn unchanged_by_fingerprint() -> Case {
    Case {
        setup: recorded_same(Some(7), true),
        node: Node::nft(),
        steps: vec![
            Step::Fingerprint,
            Step::RecordGeneration(g(10)),
            Step::Done(Outcome::Unchanged {
                by: By::Fingerprint,
                at: Some(g(10)),
            }),
        ],
    }
}

/// A new document on a node known by its generation: planned from the record, one
/// transaction (no check), proven by the generation, fingerprinted.
fn incremental_from_the_record() -> Case {
    Case {
        setup: recorded(Some(10), true),
        node: Node::nft(),
        steps: vec![
            Step::Prepare(PlanFrom::Record),
            Step::LoadDirect,
            Step::Scratch,
            Step::WriteLoad { gone: true },
            Step::Load,
            Step::Warn,
            Step::Generation,
            Step::Refingerprint(Some(g(11))),
            record(11),
            applied(By::Generation, 11),
        ],
    }
}

fn incremental_by_fingerprint() -> Case {
    Case {
        setup: recorded(Some(7), true),
        node: Node::nft(),
        steps: vec![
            Step::Fingerprint,
            Step::Prepare(PlanFrom::Record),
            Step::LoadDirect,
            Step::Scratch,
            Step::WriteLoad { gone: true },
            Step::Load,
            Step::Warn,
            Step::Generation,
            Step::Refingerprint(Some(g(11))),
            record(11),
            applied(By::Fingerprint, 11),
        ],
    }
}

/// iptables-nft from a record known by its generation: checked, loaded, proven by the
/// generation (two transactions), recorded without a read.
fn checked_load_from_the_record_proven() -> Case {
    Case {
        setup: recorded(Some(10), false),
        node: Node::iptables(),
        steps: vec![
            Step::Prepare(PlanFrom::Record),
            Step::LoadDirect,
            Step::Scratch,
            Step::WriteLoad { gone: false },
            Step::Check,
            Step::Warn,
            Step::Load,
            Step::Generation,
            record(12),
            applied(By::Generation, 12),
        ],
    }
}

/// The record is known, but the plan from it loads nothing: proven at the record's
/// generation, the fingerprint it was known by kept.
fn known_nothing_to_load() -> Case {
    Case {
        setup: recorded(Some(10), true),
        node: Node {
            changes: false,
            ..Node::nft()
        },
        steps: vec![
            Step::Prepare(PlanFrom::Record),
            Step::LoadDirect,
            Step::Scratch,
            Step::Warn,
            Step::Refingerprint(Some(g(10))),
            record(10),
            Step::Done(Outcome::Applied {
                loaded: false,
                by: By::Generation,
                at: Some(g(10)),
                refused_incremental: false,
            }),
        ],
    }
}

/// The planner cannot plan from the record: the node is read.
fn the_planner_declines_the_record() -> Case {
    Case {
        setup: recorded(Some(10), false),
        node: Node {
            declines_record: true,
            ..Node::iptables()
        },
        steps: vec![
            Step::Prepare(PlanFrom::Record),
            Step::ReadNode,
            READ,
            Step::LoadDirect,
            Step::Scratch,
            Step::WriteLoad { gone: false },
            Step::Check,
            Step::Warn,
            Step::Load,
            Step::ReadBack { reuse: false },
            record(12),
            applied(By::Read, 12),
        ],
    }
}

// Repairs and fingerprints that differ.

fn repair() -> Case {
    Case {
        setup: recorded_same(Some(7), true),
        node: Node {
            fingerprint: Fingerprint::Differs { mendable: true },
            ..Node::nft()
        },
        steps: vec![
            Step::Fingerprint,
            Step::Prepare(PlanFrom::Repair),
            Step::LoadDirect,
            Step::Scratch,
            Step::WriteLoad { gone: true },
            Step::Load,
            Step::Warn,
            Step::Generation,
            Step::Refingerprint(Some(g(11))),
            record(11),
            applied(By::Repair, 11),
        ],
    }
}

/// The node refuses the repair: said, then the node is read and planned from.
fn repair_refused_reads_the_node() -> Case {
    Case {
        setup: recorded_same(Some(7), true),
        node: Node {
            fingerprint: Fingerprint::Differs { mendable: true },
            refuses: |from| *from == PlanFrom::Repair,
            ..Node::nft()
        },
        steps: vec![
            Step::Fingerprint,
            Step::Prepare(PlanFrom::Repair),
            Step::LoadDirect,
            Step::Scratch,
            Step::WriteLoad { gone: true },
            Step::Load,
            Step::Note(Note::RepairRefused),
            Step::ReadNode,
            READ,
            Step::LoadDirect,
            Step::Scratch,
            Step::WriteLoad { gone: false },
            Step::Load,
            Step::Warn,
            Step::ReadBack { reuse: false },
            record(11),
            applied(By::Read, 11),
        ],
    }
}

/// A difference in attributes (not mendable object by object), or no fingerprint at all:
/// the node is read.
fn fingerprint_differs_or_untaken_reads_the_node() -> [Case; 2] {
    let steps = vec![
        Step::Fingerprint,
        Step::ReadNode,
        READ,
        Step::LoadDirect,
        Step::Scratch,
        Step::WriteLoad { gone: false },
        Step::Load,
        Step::Warn,
        Step::ReadBack { reuse: false },
        record(11),
        applied(By::Read, 11),
    ];
    [
        Fingerprint::Differs { mendable: false },
        Fingerprint::Untaken,
    ]
    .map(|fingerprint| Case {
        setup: recorded_same(Some(7), true),
        node: Node {
            fingerprint,
            ..Node::nft()
        },
        steps: steps.clone(),
    })
}

// Refusals.

/// One transaction, refused as an incremental load: loaded in full instead, which the
/// outcome says.
fn incremental_load_refused_loads_everything() -> Case {
    Case {
        setup: recorded(None, false),
        node: Node {
            refuses: |from| *from == PlanFrom::Read { full: false },
            ..Node::nft()
        },
        steps: vec![
            Step::ReadNode,
            READ,
            Step::LoadDirect,
            Step::Scratch,
            Step::WriteLoad { gone: false },
            Step::Load,
            READ_FULL,
            Step::LoadDirect,
            Step::Scratch,
            Step::WriteLoad { gone: false },
            Step::Load,
            Step::Warn,
            Step::ReadBack { reuse: false },
            record(11),
            Step::Done(Outcome::Applied {
                loaded: true,
                by: By::Read,
                at: Some(g(11)),
                refused_incremental: true,
            }),
        ],
    }
}

/// Checked (iptables), refused as an incremental load: said at once, then in full.
fn incremental_check_refused_loads_everything() -> Case {
    Case {
        setup: recorded(None, false),
        node: Node {
            refuses: |from| *from == PlanFrom::Read { full: false },
            ..Node::iptables()
        },
        steps: vec![
            Step::ReadNode,
            READ,
            Step::LoadDirect,
            Step::Scratch,
            Step::WriteLoad { gone: false },
            Step::Check,
            Step::Note(Note::IncrementalRefused),
            READ_FULL,
            Step::LoadDirect,
            Step::Scratch,
            Step::WriteLoad { gone: false },
            Step::Check,
            Step::Warn,
            Step::Load,
            Step::ReadBack { reuse: false },
            record(12),
            applied(By::Read, 12),
        ],
    }
}

fn full_load_refused_fails() -> Case {
    Case {
        setup: Setup {
            full: true,
            ..recorded(Some(10), false)
        },
        node: Node {
            refuses: |_| true,
            ..Node::nft()
        },
        steps: vec![
            Step::ReadNode,
            READ_FULL,
            Step::LoadDirect,
            Step::Scratch,
            Step::WriteLoad { gone: false },
            Step::Load,
            Step::Fail(Failure::Refused {
                by: Command::Load,
                reread: false,
            }),
        ],
    }
}

/// A first apply whose direct load went in unproven, planned again from the read after
/// it (which the node shows otherwise: there is more to load), refused by the check:
/// the failure says the first load is in place.
fn full_check_refused_after_a_reread_fails() -> Case {
    Case {
        setup: first(),
        node: Node {
            refuses: |_| true,
            direct: DirectIs::Unproven,
            first_apply: true,
            more_after_direct: true,
            ..Node::iptables()
        },
        steps: vec![
            Step::ReadNode,
            READ,
            Step::LoadDirect,
            Step::Unrecord,
            READ,
            Step::Scratch,
            Step::WriteLoad { gone: false },
            Step::Check,
            Step::Fail(Failure::Refused {
                by: Command::Check,
                reread: true,
            }),
        ],
    }
}

/// A plan from the record that the node's check refuses: planned again from a read,
/// without a note.
fn check_refused_on_a_plan_from_the_record_reads_the_node() -> Case {
    Case {
        setup: recorded(Some(10), false),
        node: Node {
            refuses: |from| *from == PlanFrom::Record,
            ..Node::iptables()
        },
        steps: vec![
            Step::Prepare(PlanFrom::Record),
            Step::LoadDirect,
            Step::Scratch,
            Step::WriteLoad { gone: false },
            Step::Check,
            Step::ReadNode,
            READ,
            Step::LoadDirect,
            Step::Scratch,
            Step::WriteLoad { gone: false },
            Step::Check,
            Step::Warn,
            Step::Load,
            Step::ReadBack { reuse: false },
            record(12),
            applied(By::Read, 12),
        ],
    }
}

/// The check took it, the load failed: what it committed is put back.
fn load_failure_undoes() -> Case {
    Case {
        setup: recorded(None, false),
        node: Node {
            load_fails: true,
            ..Node::iptables()
        },
        steps: vec![
            Step::ReadNode,
            READ,
            Step::LoadDirect,
            Step::Scratch,
            Step::WriteLoad { gone: false },
            Step::Check,
            Step::Warn,
            Step::Load,
            Step::Undo,
            Step::Fail(Failure::LoadFailed { reread: false }),
        ],
    }
}

fn read_back_mismatch_fails() -> Case {
    Case {
        setup: recorded(None, false),
        node: Node {
            same: false,
            ..Node::nft()
        },
        steps: vec![
            Step::ReadNode,
            READ,
            Step::LoadDirect,
            Step::Scratch,
            Step::WriteLoad { gone: false },
            Step::Load,
            Step::Warn,
            Step::ReadBack { reuse: false },
            Step::Fail(Failure::NotAsLoaded),
        ],
    }
}

/// Loaded from an unread record while someone else committed: nothing to compare a read
/// with, so the apply starts again.
fn foreign_commit_during_an_unread_load_restarts() -> Case {
    Case {
        setup: recorded(Some(10), true),
        node: Node {
            foreign: true,
            ..Node::nft()
        },
        steps: vec![
            Step::Prepare(PlanFrom::Record),
            Step::LoadDirect,
            Step::Scratch,
            Step::WriteLoad { gone: true },
            Step::Load,
            Step::Warn,
            Step::Generation,
            Step::Restart,
        ],
    }
}

/// The same with a read record (iptables-nft): the node is read back instead.
fn foreign_commit_during_a_read_load_reads_back() -> Case {
    Case {
        setup: recorded(Some(10), false),
        node: Node {
            foreign: true,
            ..Node::iptables()
        },
        steps: vec![
            Step::Prepare(PlanFrom::Record),
            Step::LoadDirect,
            Step::Scratch,
            Step::WriteLoad { gone: false },
            Step::Check,
            Step::Warn,
            Step::Load,
            Step::Generation,
            Step::ReadBack { reuse: false },
            record(13),
            applied(By::Read, 13),
        ],
    }
}

/// Read, nothing to load: the read before stands for the read back.
fn read_nothing_to_load() -> Case {
    Case {
        setup: recorded(None, false),
        node: Node {
            changes: false,
            ..Node::nft()
        },
        steps: vec![
            Step::ReadNode,
            READ,
            Step::LoadDirect,
            Step::Scratch,
            Step::Warn,
            Step::ReadBack { reuse: true },
            record(10),
            Step::Done(Outcome::Applied {
                loaded: false,
                by: By::Read,
                at: Some(g(10)),
                refused_incremental: false,
            }),
        ],
    }
}

// Dry runs: no direct load, no write, no load; the same document is planned anyway.

fn dry_run(node: Node, setup: Setup, check: bool, owns: bool) -> Case {
    let mut steps = vec![Step::ReadNode, READ, Step::Scratch];
    if owns {
        steps.push(Step::OwnsNothing);
    }
    steps.push(Step::Done(Outcome::DryRun { check }));
    Case {
        setup: Setup {
            dry_run: true,
            ..setup
        },
        node,
        steps,
    }
}

fn dry_runs() -> [Case; 4] {
    let proves = Setup {
        scratch_proves_first_load: true,
        ..first()
    };
    [
        // One transaction: no check.
        dry_run(Node::nft(), first(), false, false),
        dry_run(Node::iptables(), first(), true, false),
        // A first load the scratch namespace proves: no check.
        dry_run(
            Node {
                owns_nothing: true,
                ..Node::iptables()
            },
            proves.clone(),
            false,
            true,
        ),
        dry_run(Node::iptables(), proves, true, true),
    ]
}

#[test]
fn dry_run_known_and_unchanged_still_plans() {
    // The same document at the recorded generation: a dry run prints the plan from the
    // record instead of the report.
    let setup = Setup {
        dry_run: true,
        ..recorded_same(Some(10), true)
    };
    let node = Node {
        changes: false,
        ..Node::nft()
    };
    assert_eq!(
        run(setup, node),
        vec![
            Step::Prepare(PlanFrom::Record),
            Step::Scratch,
            Step::Done(Outcome::DryRun { check: false })
        ]
    );
}

fn all_cases() -> Vec<Case> {
    let mut all = vec![
        first_apply_direct_load_read_back(),
        first_apply_direct_load_fingerprinted(),
        first_apply_direct_load_unproven_rereads(),
        first_apply_scratch_proves_no_check(),
        first_apply_node_owns_something_checks(),
        unchanged_by_generation(),
        unchanged_by_fingerprint(),
        incremental_from_the_record(),
        incremental_by_fingerprint(),
        checked_load_from_the_record_proven(),
        known_nothing_to_load(),
        the_planner_declines_the_record(),
        repair(),
        repair_refused_reads_the_node(),
        incremental_load_refused_loads_everything(),
        incremental_check_refused_loads_everything(),
        full_load_refused_fails(),
        full_check_refused_after_a_reread_fails(),
        check_refused_on_a_plan_from_the_record_reads_the_node(),
        load_failure_undoes(),
        read_back_mismatch_fails(),
        foreign_commit_during_an_unread_load_restarts(),
        foreign_commit_during_a_read_load_reads_back(),
        read_nothing_to_load(),
    ];
    all.extend(fingerprint_differs_or_untaken_reads_the_node());
    all.extend(dry_runs());
    all
}

macro_rules! cases {
    ($($name:ident),* $(,)?) => {
        $(#[test]
        fn $name() {
            check(super::$name());
        })*
    };
}

mod case {
    use super::check;
    cases!(
        first_apply_direct_load_read_back,
        first_apply_direct_load_fingerprinted,
        first_apply_direct_load_unproven_rereads,
        first_apply_scratch_proves_no_check,
        first_apply_node_owns_something_checks,
        unchanged_by_generation,
        unchanged_by_fingerprint,
        incremental_from_the_record,
        incremental_by_fingerprint,
        checked_load_from_the_record_proven,
        known_nothing_to_load,
        the_planner_declines_the_record,
        repair,
        repair_refused_reads_the_node,
        incremental_load_refused_loads_everything,
        incremental_check_refused_loads_everything,
        full_load_refused_fails,
        full_check_refused_after_a_reread_fails,
        check_refused_on_a_plan_from_the_record_reads_the_node,
        load_failure_undoes,
        read_back_mismatch_fails,
        foreign_commit_during_an_unread_load_restarts,
        foreign_commit_during_a_read_load_reads_back,
        read_nothing_to_load,
    );

    #[test]
    fn fingerprint_differs_or_untaken_reads_the_node() {
        super::fingerprint_differs_or_untaken_reads_the_node()
            .into_iter()
            .for_each(check);
    }

    #[test]
    fn dry_runs() {
        super::dry_runs().into_iter().for_each(check);
    }
}

/// Every kind of step, outcome and failure, by name: the match is exhaustive, so a new
/// kind fails to compile here until it is listed (and then needs a case).
fn kind(step: &Step) -> &'static str {
    match step {
        Step::Fingerprint => "Fingerprint",
        Step::RecordGeneration(_) => "RecordGeneration",
        Step::ReadNode => "ReadNode",
        Step::Prepare(PlanFrom::Record) => "Prepare(Record)",
        Step::Prepare(PlanFrom::Repair) => "Prepare(Repair)",
        Step::Prepare(PlanFrom::Read { .. }) => "Prepare(Read)",
        Step::LoadDirect => "LoadDirect",
        Step::Unrecord => "Unrecord",
        Step::Scratch => "Scratch",
        Step::OwnsNothing => "OwnsNothing",
        Step::WriteLoad { .. } => "WriteLoad",
        Step::Check => "Check",
        Step::Load => "Load",
        Step::Note(Note::RepairRefused) => "Note(RepairRefused)",
        Step::Note(Note::IncrementalRefused) => "Note(IncrementalRefused)",
        Step::Warn => "Warn",
        Step::Undo => "Undo",
        Step::Generation => "Generation",
        Step::Refingerprint(_) => "Refingerprint",
        Step::ReadBack { .. } => "ReadBack",
        Step::Record { .. } => "Record",
        Step::Restart => "Restart",
        Step::Done(Outcome::DryRun { .. }) => "Done(DryRun)",
        Step::Done(Outcome::Unchanged { .. }) => "Done(Unchanged)",
        Step::Done(Outcome::Applied { .. }) => "Done(Applied)",
        Step::Fail(Failure::Refused { .. }) => "Fail(Refused)",
        Step::Fail(Failure::LoadFailed { .. }) => "Fail(LoadFailed)",
        Step::Fail(Failure::NotAsLoaded) => "Fail(NotAsLoaded)",
    }
}

const KINDS: &[&str] = &[
    "Fingerprint",
    "RecordGeneration",
    "ReadNode",
    "Prepare(Record)",
    "Prepare(Repair)",
    "Prepare(Read)",
    "LoadDirect",
    "Unrecord",
    "Scratch",
    "OwnsNothing",
    "WriteLoad",
    "Check",
    "Load",
    "Note(RepairRefused)",
    "Note(IncrementalRefused)",
    "Warn",
    "Undo",
    "Generation",
    "Refingerprint",
    "ReadBack",
    "Record",
    "Restart",
    "Done(DryRun)",
    "Done(Unchanged)",
    "Done(Applied)",
    "Fail(Refused)",
    "Fail(LoadFailed)",
    "Fail(NotAsLoaded)",
];

#[test]
fn every_step_kind_has_a_case() {
    let taken: BTreeSet<&str> = all_cases()
        .iter()
        .flat_map(|c| c.steps.iter().map(kind))
        .collect();
    let missing: Vec<&&str> = KINDS.iter().filter(|k| !taken.contains(**k)).collect();
    assert!(missing.is_empty(), "no case takes {missing:?}");
    assert_eq!(taken.len(), KINDS.len(), "KINDS lists every kind once");
}

#[test]
fn every_by_has_a_case() {
    let taken: BTreeSet<String> = all_cases()
        .iter()
        .filter_map(|c| match c.steps.last() {
            Some(Step::Done(Outcome::Applied { by, .. } | Outcome::Unchanged { by, .. })) => {
                Some(format!("{by:?}"))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        taken.into_iter().collect::<Vec<_>>(),
        ["Fingerprint", "Generation", "Read", "Repair"]
    );
}
