//! Planning an iptables apply.
//!
//! Input: the compiled document (`iptables::write_string`, with or without the setup part),
//! `iptables-save` output of the node, and optionally what the last apply recorded. Output:
//! one `iptables-restore --noflush` document with one `*table … COMMIT` block per table that
//! changes, in which
//!
//! - every rewritten chain is declared (`:CHAIN - [0:0]`, which creates or flushes it) and
//!   gets its rules (`-A`);
//! - missing jump rules from built-in chains are inserted (`-I`, in the document's order,
//!   so they end up in kube-proxy's order) and owned jumps no longer wanted are deleted;
//! - owned chains no longer wanted are declared (flushed) and deleted (`-X`) after
//!   everything that jumped to them is gone — unless a rule we do not own still jumps to
//!   one: then it is only flushed, and a warning says so.
//!
//! iptables-restore commits each `*table` block as one transaction (legacy: one table
//! replace; nf_tables: one netlink batch per `COMMIT`, see iptables' `xtables-restore.c`),
//! so a failed load can leave an earlier table committed: [`Plan::revert`] builds the
//! document that puts such tables back from the `iptables-save` text read before the load.
//!
//! Owned rules are compared in `iptables-save`'s spelling, learnt by loading the rewritten
//! chains into an empty network namespace (the `scratch` document): the kernel's rule text
//! is canonical, ours is not (`-m tcp -p tcp` reads back as `-p tcp -m tcp`, addresses get
//! `/32`, …).

use super::names::{is_service_chain, MARTIAN_COMMENT};
use crate::plan::{argv, scratch, Commands, Family, Mode, Owned, Plan, Planner, Prepared};
use crate::plan::{Previous, Recorded, Removal, RemovalPlanner, Step, Summary, Tool};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::Arc;

/// The order tables are written in; others follow alphabetically.
const TABLE_ORDER: [&str; 5] = ["raw", "mangle", "filter", "nat", "security"];

/// The iptables back end's [`Planner`].
pub struct Iptables;

/// One table of a restore document or of `iptables-save` output.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Table {
    /// Declared chains in order of first declaration.
    order: Vec<String>,
    /// Chain → policy (`-` for user-defined chains).
    policy: BTreeMap<String, String>,
    /// Chain → rule specifications (the text after `-A CHAIN `), in order.
    rules: BTreeMap<String, Vec<String>>,
    /// `-I CHAIN SPEC` lines of a document: (chain, spec), in order.
    inserts: Vec<(String, String)>,
}

impl Table {
    fn declares(&self, chain: &str) -> bool {
        self.policy.contains_key(chain)
    }
    fn is_user(&self, chain: &str) -> bool {
        self.policy.get(chain).is_some_and(|p| p == "-")
    }
    fn rules(&self, chain: &str) -> &[String] {
        self.rules.get(chain).map_or(&[], Vec::as_slice)
    }
    fn user_chains(&self) -> impl Iterator<Item = &String> {
        self.order.iter().filter(|c| self.is_user(c))
    }
}

type Tables = BTreeMap<String, Table>;

fn table_order(names: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut v: Vec<String> = names
        .into_iter()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    v.sort_by_key(|t| {
        (
            TABLE_ORDER
                .iter()
                .position(|x| x == t)
                .unwrap_or(TABLE_ORDER.len()),
            t.clone(),
        )
    });
    v
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    /// A compiled document: user chains, `-A` into them, `-I` into built-in chains.
    Document,
    /// `iptables-save` output (or a snapshot in the same syntax).
    Save,
}

fn parse(text: &str, source: Source) -> Result<Tables, String> {
    let mut tables = Tables::new();
    let mut current: Option<String> = None;
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let line = raw.trim_end();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('*') {
            if let Some(t) = &current {
                return Err(format!(
                    "line {n}: table {t} is not committed before `{line}`"
                ));
            }
            current = Some(name.to_string());
            tables.entry(name.to_string()).or_default();
            continue;
        }
        let Some(tname) = current.clone() else {
            return Err(format!("line {n}: `{line}` outside a table"));
        };
        if line == "COMMIT" {
            current = None;
            continue;
        }
        let table = tables.get_mut(&tname).expect("entered above");
        if let Some(decl) = line.strip_prefix(':') {
            let mut w = decl.split_whitespace();
            let (Some(chain), Some(policy)) = (w.next(), w.next()) else {
                return Err(format!("line {n}: cannot read chain line `{line}`"));
            };
            if source == Source::Document && policy != "-" {
                return Err(format!(
                    "line {n}: `{line}` sets the policy of a built-in chain; apply only writes user-defined chains"
                ));
            }
            if !table.declares(chain) {
                table.order.push(chain.to_string());
                table.policy.insert(chain.to_string(), policy.to_string());
            }
            continue;
        }
        let (op, rest) = line.split_at(line.find(' ').unwrap_or(line.len()));
        if !matches!(op, "-A" | "-I") || (op == "-I" && source == Source::Save) {
            return Err(format!(
                "line {n}: `{line}` is not supported here (apply documents declare chains, append to them and insert jumps into built-in chains)"
            ));
        }
        let rest = rest.trim_start();
        let (chain, spec) = rest.split_at(rest.find(' ').unwrap_or(rest.len()));
        let spec = spec.trim_start();
        // `iptables -A INPUT` (no match, no target: an accounting rule) saves as a bare
        // `-A INPUT`; only a document must say what its rules do.
        if chain.is_empty() || (spec.is_empty() && source == Source::Document) {
            return Err(format!("line {n}: cannot read `{line}`"));
        }
        match (op, source) {
            ("-A", Source::Save) => {}
            ("-A", Source::Document) if table.is_user(chain) => {}
            ("-A", Source::Document) => {
                return Err(format!(
                    "line {n}: `{line}` appends to a chain the document does not declare; apply only appends to its own chains"
                ))
            }
            ("-I", Source::Document) if !table.declares(chain) => {
                if spec.split_whitespace().next().is_some_and(|w| w.parse::<u32>().is_ok()) {
                    return Err(format!("line {n}: `{line}`: -I with a position is not supported"));
                }
                table.inserts.push((chain.to_string(), spec.to_string()));
                continue;
            }
            _ => {
                return Err(format!(
                    "line {n}: `{line}` is not supported here (apply documents declare chains, append to them and insert jumps into built-in chains)"
                ))
            }
        }
        table
            .rules
            .entry(chain.to_string())
            .or_default()
            .push(spec.to_string());
    }
    if let Some(t) = current {
        return Err(format!("table {t} has no COMMIT"));
    }
    Ok(tables)
}

/// Chains a rule specification jumps or goes to.
fn targets(spec: &str) -> impl Iterator<Item = &str> {
    let mut words = spec.split_whitespace();
    std::iter::from_fn(move || loop {
        let w = words.next()?;
        if matches!(w, "-j" | "--jump" | "-g" | "--goto") {
            return words.next();
        }
    })
}

/// Which objects of a kernel read are ours.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Owner {
    /// Per table: chains owned by name (per-service chains are owned by prefix anyway).
    chains: BTreeMap<String, BTreeSet<String>>,
    /// Per table and built-in chain: the `iptables-save` text of our jump rules.
    jumps: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
    /// What a failed load must undo.
    undo: Undo,
}

/// The changes a load makes, remembered so they can be undone table by table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Undo {
    /// The kernel before the load.
    before: Tables,
    tables: BTreeMap<String, TableUndo>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct TableUndo {
    /// Chains the load declares (rewritten, created or flushed for deletion).
    declared: Vec<String>,
    /// Jumps the load inserts: (built-in chain, save text).
    inserted: Vec<(String, String)>,
    /// Jumps the load deletes: (built-in chain, save text).
    removed: Vec<(String, String)>,
}

impl Owner {
    /// Reads an owned-state text (see [`format_owned`]) back into the ownership it records.
    fn from_snapshot(snapshot: &Tables) -> Owner {
        let mut o = Owner::default();
        for (t, table) in snapshot {
            o.chains
                .insert(t.clone(), table.order.iter().cloned().collect());
            for (chain, rules) in &table.rules {
                if !table.declares(chain) {
                    o.jumps
                        .entry(t.clone())
                        .or_default()
                        .insert(chain.clone(), rules.iter().cloned().collect());
                }
            }
        }
        o
    }

    fn owns_chain(&self, table: &str, chain: &str) -> bool {
        is_service_chain(chain) || self.chains.get(table).is_some_and(|s| s.contains(chain))
    }

    fn owns_jump(&self, table: &str, chain: &str, spec: &str) -> bool {
        self.jumps
            .get(table)
            .and_then(|m| m.get(chain))
            .is_some_and(|s| s.contains(spec))
    }

    /// The owned part of parsed `iptables-save` output.
    fn extract(&self, kernel: &Tables) -> Tables {
        let mut out = Tables::new();
        for (t, table) in kernel {
            let mut owned = Table::default();
            // A snapshot does not declare the built-in chains of its jumps (a read does):
            // cut them too, so that a snapshot's owned part is the snapshot.
            let undeclared = table.rules.keys().filter(|c| !table.declares(c));
            for chain in table.order.iter().chain(undeclared) {
                if table.is_user(chain) {
                    if self.owns_chain(t, chain) {
                        owned.order.push(chain.clone());
                        owned.policy.insert(chain.clone(), "-".into());
                        owned
                            .rules
                            .insert(chain.clone(), table.rules(chain).to_vec());
                    }
                } else {
                    let jumps: Vec<String> = table
                        .rules(chain)
                        .iter()
                        .filter(|r| self.owns_jump(t, chain, r))
                        .cloned()
                        .collect();
                    if !jumps.is_empty() {
                        owned.rules.insert(chain.clone(), jumps);
                    }
                }
            }
            if !owned.rules.is_empty() || !owned.order.is_empty() {
                out.insert(t.clone(), owned);
            }
        }
        out
    }
}

impl Owned for Owner {
    fn owned(&self, kernel: &str) -> Result<String, String> {
        let k = parse(kernel, Source::Save).map_err(|e| format!("iptables-save output: {e}"))?;
        Ok(format_owned(&self.extract(&k)))
    }

    fn revert(&self, after: &str) -> Result<Option<String>, String> {
        let after = parse(after, Source::Save).map_err(|e| format!("iptables-save output: {e}"))?;
        let empty = Table::default();
        let mut out = String::new();
        for (t, u) in &self.undo.tables {
            let before = self.undo.before.get(t).unwrap_or(&empty);
            let now = after.get(t).unwrap_or(&empty);
            // Did this table's transaction commit? Compare everything it touches.
            let same =
                |c: &str| before.declares(c) == now.declares(c) && before.rules(c) == now.rules(c);
            let builtins: BTreeSet<&str> = u
                .inserted
                .iter()
                .chain(&u.removed)
                .map(|(c, _)| c.as_str())
                .collect();
            if u.declared.iter().all(|c| same(c)) && builtins.iter().all(|c| same(c)) {
                continue;
            }
            let _ = writeln!(out, "*{t}");
            for c in &u.declared {
                let _ = writeln!(out, ":{c} - [0:0]");
            }
            for (c, spec) in &u.inserted {
                if now.rules(c).contains(spec) {
                    let _ = writeln!(out, "-D {c} {spec}");
                }
            }
            // Removed jumps go back where they were: with the inserted ones deleted the
            // chain is `before` without them, so inserting each at its old position, first
            // to last, rebuilds `before` (foreign rules around them included).
            for c in builtins {
                let mut gone: Vec<&String> = u
                    .removed
                    .iter()
                    .filter(|(rc, spec)| rc == c && !now.rules(c).contains(spec))
                    .map(|(_, spec)| spec)
                    .collect();
                for (i, r) in before.rules(c).iter().enumerate() {
                    if let Some(at) = gone.iter().position(|g| *g == r) {
                        gone.remove(at);
                        let _ = writeln!(out, "-I {c} {} {r}", i + 1);
                    }
                }
            }
            for c in u.declared.iter().filter(|c| before.is_user(c)) {
                for r in before.rules(c) {
                    let _ = writeln!(out, "-A {c} {r}");
                }
            }
            for c in u.declared.iter().filter(|c| !before.declares(c)) {
                let _ = writeln!(out, "-X {c}");
            }
            out.push_str("COMMIT\n");
        }
        Ok((!out.is_empty()).then_some(out))
    }
}

/// The canonical owned-state text: per table, owned chains (sorted) declared, then the
/// owned jumps of each built-in chain (chains sorted, rules in kernel order), then the
/// rules of each owned chain. It is `iptables-save` syntax, and parses back with
/// [`Owner::from_snapshot`].
fn format_owned(owned: &Tables) -> String {
    let mut out = String::new();
    for t in table_order(owned.keys().cloned()) {
        let table = &owned[&t];
        let _ = writeln!(out, "*{t}");
        let chains: BTreeSet<&String> = table.order.iter().collect();
        for c in &chains {
            let _ = writeln!(out, ":{c} - [0:0]");
        }
        for (c, rules) in table.rules.iter().filter(|(c, _)| !table.declares(c)) {
            for r in rules {
                let _ = writeln!(out, "-A {c} {r}");
            }
        }
        for c in &chains {
            for r in table.rules(c) {
                let _ = writeln!(out, "-A {c} {r}");
            }
        }
        out.push_str("COMMIT\n");
    }
    out
}

/// Step one's iptables part.
#[derive(Clone, Debug)]
pub(super) struct Prep {
    new: Tables,
    kernel: Tables,
    /// Per table: the chains this apply declares and rewrites.
    rewrite: BTreeMap<String, BTreeSet<String>>,
    /// Per table: chains an earlier apply owned by name (deleted when no longer wanted).
    old_chains: BTreeMap<String, BTreeSet<String>>,
    /// Jumps an earlier apply owned (removed when no longer wanted).
    old_jumps: Owner,
    /// Per table, the chains someone else changed (see `drifted_chains`), and the first
    /// difference, for the warning when the load writes any of them again.
    drifted: BTreeMap<String, BTreeSet<String>>,
    first_drift: Option<String>,
}

impl Planner for Iptables {
    fn tools(&self, family: Family) -> Vec<Tool> {
        let (save, restore) = match family {
            Family::V4 => ("iptables-save", "iptables-restore"),
            Family::V6 => ("ip6tables-save", "ip6tables-restore"),
        };
        [save, restore]
            .map(|program| Tool {
                program,
                package: "iptables",
            })
            .to_vec()
    }
    /// The commands for one family.
    fn commands(&self, family: Family) -> Commands {
        let (save, restore) = match family {
            Family::V4 => ("iptables-save", "iptables-restore"),
            Family::V6 => ("ip6tables-save", "ip6tables-restore"),
        };
        Commands {
            read: argv(&[save]),
            check: argv(&[restore, "--test", "--noflush"]),
            load: argv(&[restore, "--noflush"]),
            scratch: scratch(&format!("{restore} --noflush \"$1\" && {save}")),
        }
    }

    /// The family a compiled document names in its first line, if any.
    /// Localhost node ports (the martian rule is their mark, see `names::MARTIAN_COMMENT`)
    /// need `route_localnet`, as kube-proxy's iptables mode sets it (`NewProxier`).
    fn sysctls(&self, doc: &str) -> Vec<(&'static str, &'static str)> {
        let martian = format!("--comment \"{MARTIAN_COMMENT}\"");
        match doc
            .lines()
            .any(|l| l.starts_with("-A ") && l.contains(&martian))
        {
            true => vec![("ipv4/conf/all/route_localnet", "1")],
            false => Vec::new(),
        }
    }

    fn family_of(&self, doc: &str) -> Option<Family> {
        crate::plan::family_in_first_line(doc, "# svc-compile:", ';')
    }

    /// The snapshot holds every owned chain and jump, so it can stand in for the read;
    /// foreign rules it lacks only matter when one jumps to a chain this plan deletes,
    /// and then the check on the node fails and the CLI plans again from a read. A
    /// document that inserts a jump the last one did not is planned from a read: a
    /// foreign rule of the same text would already provide it (and be taken for ours),
    /// which only the node shows.
    fn prepare_unchanged(
        &self,
        new_doc: &str,
        family: Family,
        previous: Previous,
    ) -> Option<Result<Prepared, String>> {
        // Each text parsed once (they were parsed again by `prepare`: 7 parses of 5 MB
        // documents at 1k services, ~250 ms), the three side by side.
        let (new, (doc, snap)) = rayon::join(
            || parse(new_doc, Source::Document),
            || {
                rayon::join(
                    || parse(previous.document, Source::Document),
                    || parse(previous.snapshot, Source::Save),
                )
            },
        );
        let (new, doc, snap) = (new.ok()?, doc.ok()?, snap.ok()?);
        let inserts = |tables: &Tables| -> BTreeSet<(String, String, String)> {
            tables
                .iter()
                .flat_map(|(t, table)| {
                    table
                        .inserts
                        .iter()
                        .map(move |(c, spec)| (t.clone(), c.clone(), spec.clone()))
                })
                .collect()
        };
        if !inserts(&new).is_subset(&inserts(&doc)) {
            return None;
        }
        let kernel = parse(&kernel_of_snapshot(&snap), Source::Save).ok()?;
        Some(prepare_parsed(
            new,
            family,
            Some((previous, Some((doc, snap)))),
            kernel,
            false,
        ))
    }

    /// iptables-nft writes through nf_tables; iptables-legacy does not.
    fn tracked_by_generation(&self, _family: Family, kernel: &str) -> bool {
        kernel
            .lines()
            .take_while(|l| l.starts_with('#'))
            .any(|l| l.starts_with("# Generated by") && l.contains("(nf_tables)"))
    }

    /// iptables-restore commits each table block as one transaction.
    fn transactions(&self, load: &str) -> Option<u32> {
        u32::try_from(load.lines().filter(|l| l.starts_with('*')).count()).ok()
    }

    /// A full load into a node without any owned chain writes the scratch document's
    /// chains plus jumps inserted at the top of built-in chains (which every namespace
    /// has) to those chains; nothing is deleted, and no rule of the node can refer to a
    /// chain that does not exist yet. An empty namespace of the same kernel that took the
    /// chains stands for `iptables-restore --test` on the node: the first apply is two
    /// full `iptables-restore` runs, not three.
    fn scratch_proves_first_load(&self) -> bool {
        true
    }

    fn removal(&self) -> Option<RemovalPlanner> {
        Some(removal)
    }

    /// Step one (see the module docs of [`super`]). `force_full` plans a full load;
    /// `previous` still says what the last apply owned.
    fn prepare(
        &self,
        new_doc: &str,
        family: Family,
        previous: Option<Previous>,
        kernel: &str,
        force_full: bool,
    ) -> Result<Prepared, String> {
        let new = parse(new_doc, Source::Document).map_err(|e| format!("the document: {e}"))?;
        let kernel =
            parse(kernel, Source::Save).map_err(|e| format!("iptables-save output: {e}"))?;
        let previous = previous.map(|p| {
            let parsed = match (
                parse(p.document, Source::Document),
                parse(p.snapshot, Source::Save),
            ) {
                (Ok(doc), Ok(snap)) => Some((doc, snap)),
                _ => None,
            };
            (p, parsed)
        });
        prepare_parsed(new, family, previous, kernel, force_full)
    }
}

/// [`Planner::removal`]: what apply owns on the node, taken off. Owned is what `plan`
/// owns: the per-service chains by prefix, the chains the recorded documents and snapshots
/// declare, and the recorded snapshots' jumps from built-in chains by their exact
/// `iptables-save` text (so without a record only per-service chains are owned, as an
/// apply without one would take them). One block per table: owned chains flushed (`:C`),
/// owned jumps deleted (`-D` with the saved text), owned chains deleted (`-X`). An owned
/// chain a rule we do not own still jumps to (directly, or through other such chains) is
/// left as it is, with a warning: deleting it would fail the table, flushing it would
/// change what that rule does.
fn removal(_family: Family, kernel: &str, recorded: &Recorded) -> Result<Removal, String> {
    let k = parse(kernel, Source::Save).map_err(|e| format!("iptables-save output: {e}"))?;
    let mut owner = Owner::default();
    for doc in &recorded.documents {
        if let Ok(tables) = parse(doc, Source::Document) {
            for (t, table) in &tables {
                owner
                    .chains
                    .entry(t.clone())
                    .or_default()
                    .extend(table.user_chains().cloned());
            }
        }
    }
    for snap in &recorded.snapshots {
        if let Ok(tables) = parse(snap, Source::Save) {
            let o = Owner::from_snapshot(&tables);
            for (t, chains) in o.chains {
                owner.chains.entry(t).or_default().extend(chains);
            }
            for (t, by_chain) in o.jumps {
                let mine = owner.jumps.entry(t).or_default();
                for (c, rules) in by_chain {
                    mine.entry(c).or_default().extend(rules);
                }
            }
        }
    }
    let (mut load, mut expected) = (String::new(), Tables::new());
    let (mut chains, mut jumps) = (0, 0);
    let mut warnings = Vec::new();
    for t in table_order(k.keys().cloned()) {
        let table = &k[&t];
        let owned: BTreeSet<&str> = table
            .user_chains()
            .filter(|c| owner.owns_chain(&t, c))
            .map(String::as_str)
            .collect();
        let ours: Vec<(&String, &String)> = table
            .order
            .iter()
            .filter(|c| !table.is_user(c))
            .flat_map(|c| {
                table
                    .rules(c)
                    .iter()
                    .filter(|r| owner.owns_jump(&t, c, r))
                    .map(move |r| (c, r))
            })
            .collect();
        // Owned chains that rules staying behind reach.
        let mut kept: BTreeSet<&str> = BTreeSet::new();
        let mut reached: Vec<&str> = Vec::new();
        for c in table.order.iter().filter(|c| !owned.contains(c.as_str())) {
            for r in table.rules(c) {
                if !table.is_user(c) && owner.owns_jump(&t, c, r) {
                    continue;
                }
                reached.extend(targets(r).filter(|x| owned.contains(x)));
            }
        }
        while let Some(c) = reached.pop() {
            if kept.insert(c) {
                let rules = table.rules(c).iter();
                reached.extend(rules.flat_map(|r| targets(r)).filter(|x| owned.contains(x)));
            }
        }
        if !kept.is_empty() {
            let names: Vec<&str> = kept.iter().copied().collect();
            warnings.push(format!(
                "{t}: {} left in place: a rule svc-compile did not write jumps to it",
                names.join(", ")
            ));
            let mut exp = Table::default();
            for c in table.user_chains().filter(|c| kept.contains(c.as_str())) {
                exp.order.push(c.clone());
                exp.policy.insert(c.clone(), "-".into());
                exp.rules.insert(c.clone(), table.rules(c).to_vec());
            }
            expected.insert(t.clone(), exp);
        }
        let gone: Vec<&String> = table
            .user_chains()
            .filter(|c| owned.contains(c.as_str()) && !kept.contains(c.as_str()))
            .collect();
        if gone.is_empty() && ours.is_empty() {
            continue;
        }
        let _ = writeln!(load, "*{t}");
        for c in &gone {
            let _ = writeln!(load, ":{c} - [0:0]");
        }
        for (c, r) in &ours {
            let _ = writeln!(load, "-D {c} {r}");
        }
        for c in &gone {
            let _ = writeln!(load, "-X {c}");
        }
        load.push_str("COMMIT\n");
        chains += gone.len();
        jumps += ours.len();
    }
    Ok(Removal {
        load: (!load.is_empty()).then_some(load),
        expected: format_owned(&expected),
        summary: format!("{chains} chain(s), {jumps} jump(s)"),
        warnings,
        owner: Arc::new(owner),
    })
}

/// [`Planner::prepare`] of documents already parsed: the new one, the last apply's
/// (`None` beside it: its document or snapshot cannot be read) and the kernel's read.
fn prepare_parsed(
    new: Tables,
    family: Family,
    previous: Option<(Previous, Option<(Tables, Tables)>)>,
    kernel: Tables,
    force_full: bool,
) -> Result<Prepared, String> {
    if new.values().all(|t| t.order.is_empty()) {
        return Err("the document declares no chains".into());
    }

    let mut old_chains: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut old_jumps = Owner::default();
    let mut old_doc = None;
    let mut mode = Mode::Incremental;
    // Per table: owned chains (and built-in chains with our jumps) the kernel shows
    // otherwise than the last apply left them: rewritten as the document has them.
    let mut drifted: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut first_drift = None;
    match previous {
        None if force_full => mode = Mode::Full("asked for with --full".into()),
        None => mode = Mode::Full("no previous apply recorded".into()),
        Some((p, parsed)) => match parsed {
            // `--full` still takes what the last apply owned, to remove what the new
            // document no longer has.
            Some((doc, snap)) => {
                let owner = Owner::from_snapshot(&snap);
                let owned_now = owner.extract(&kernel);
                let now = format_owned(&owned_now);
                if force_full {
                    mode = Mode::Full("asked for with --full".into());
                } else if now != p.snapshot && owned_now.is_empty() {
                    // Nothing of ours left: one full load, straight to the node.
                    mode = Mode::Full(format!(
                        "the kernel differs from what the last apply left: {}",
                        Plan::first_difference(p.snapshot, &now)
                    ));
                } else if now != p.snapshot {
                    // Mended chain by chain: what is not rewritten stays as the kernel
                    // shows it, and the plan takes jumps, stale chains and the
                    // expectation from the kernel read, not from the record.
                    drifted = drifted_chains(&snap, &owned_now);
                    first_drift = Some(Plan::first_difference(p.snapshot, &now));
                }
                for (t, table) in doc.iter().chain(&snap) {
                    old_chains
                        .entry(t.clone())
                        .or_default()
                        .extend(table.user_chains().cloned());
                }
                old_jumps = owner;
                old_doc = Some(doc);
            }
            _ if force_full => mode = Mode::Full("asked for with --full".into()),
            _ => mode = Mode::Full("the recorded state cannot be read".into()),
        },
    }

    let mut rewrite: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let empty = Table::default();
    for (t, table) in &new {
        let k = kernel.get(t).unwrap_or(&empty);
        let old = old_doc.as_ref().and_then(|d| d.get(t)).unwrap_or(&empty);
        let set: BTreeSet<String> = table
            .user_chains()
            .filter(|c| {
                mode != Mode::Incremental
                    || !k.is_user(c)
                    || !old.is_user(c)
                    || old.rules(c) != table.rules(c)
                    || drifted.get(t).is_some_and(|d| d.contains(*c))
            })
            .cloned()
            .collect();
        rewrite.insert(t.clone(), set);
    }

    let scratch = scratch_document(&new, &rewrite);
    // A full load into a node that shows no chain or jump this apply or an earlier one
    // owns writes exactly the scratch document: every chain is new, every jump missing,
    // nothing stale (see `plan`).
    let direct = matches!(mode, Mode::Full(_))
        && kernel.iter().all(|(t, table)| {
            let owned = |c: &String| {
                is_service_chain(c)
                    || new.get(t).is_some_and(|n| n.declares(c))
                    || old_chains.get(t).is_some_and(|o| o.contains(c))
            };
            !table.user_chains().any(owned)
                && table
                    .rules
                    .iter()
                    .all(|(c, rules)| rules.iter().all(|r| !old_jumps.owns_jump(t, c, r)))
        })
        // Self-contained: a jump to a chain of the node's that the document does not
        // declare is refused by an empty namespace and accepted here (a `--from`
        // document could hold one; compiled ones do not).
        && new.iter().all(|(t, table)| {
            let k = kernel.get(t);
            let specs = table.rules.values().flatten();
            specs
                .chain(table.inserts.iter().map(|(_, spec)| spec))
                .flat_map(|r| targets(r))
                .all(|x| table.declares(x) || !k.is_some_and(|k| k.is_user(x)))
        });
    Ok(Prepared {
        mode,
        scratch,
        family,
        direct,
        step: Arc::new(Prep {
            new,
            kernel,
            rewrite,
            old_chains,
            old_jumps,
            drifted,
            first_drift,
        }),
    })
}

/// Per table, the chains whose owned part differs between the last apply's snapshot and
/// the kernel's owned part now: an owned chain changed, gone or new, or our jumps in a
/// built-in chain.
fn drifted_chains(snap: &Tables, now: &Tables) -> BTreeMap<String, BTreeSet<String>> {
    let empty = Table::default();
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for t in snap.keys().chain(now.keys()) {
        let (a, b) = (snap.get(t).unwrap_or(&empty), now.get(t).unwrap_or(&empty));
        let chains = a
            .order
            .iter()
            .chain(&b.order)
            .chain(a.rules.keys())
            .chain(b.rules.keys());
        for c in chains {
            if a.rules(c) != b.rules(c) || a.is_user(c) != b.is_user(c) {
                out.entry(t.clone()).or_default().insert(c.clone());
            }
        }
    }
    out
}

/// An owned-state snapshot as an `iptables-save` read of a node that shows nothing else:
/// the built-in chains its jumps are in declared (the snapshot leaves them out).
fn kernel_of_snapshot(tables: &Tables) -> String {
    let mut out = String::new();
    for t in table_order(tables.keys().cloned()) {
        let table = &tables[&t];
        let _ = writeln!(out, "*{t}");
        for c in table.rules.keys().filter(|c| !table.declares(c)) {
            let _ = writeln!(out, ":{c} ACCEPT [0:0]");
        }
        for c in &table.order {
            let _ = writeln!(out, ":{c} {} [0:0]", table.policy[c]);
        }
        for (c, rules) in table.rules.iter().filter(|(c, _)| !table.declares(c)) {
            for r in rules {
                let _ = writeln!(out, "-A {c} {r}");
            }
        }
        for c in &table.order {
            for r in table.rules(c) {
                let _ = writeln!(out, "-A {c} {r}");
            }
        }
        out.push_str("COMMIT\n");
    }
    out
}

/// The rewritten chains and the jumps, with every chain they refer to declared, for an
/// empty namespace: its `iptables-save` gives their canonical text.
fn scratch_document(new: &Tables, rewrite: &BTreeMap<String, BTreeSet<String>>) -> String {
    let mut out = String::new();
    for t in table_order(new.keys().cloned()) {
        let table = &new[&t];
        let rw = &rewrite[&t];
        let mut needed: BTreeSet<&str> = rw.iter().map(String::as_str).collect();
        for c in rw {
            needed.extend(table.rules(c).iter().flat_map(|r| targets(r)));
        }
        needed.extend(table.inserts.iter().flat_map(|(_, s)| targets(s)));
        if rw.is_empty() && table.inserts.is_empty() {
            continue;
        }
        let _ = writeln!(out, "*{t}");
        for c in table.user_chains().filter(|c| needed.contains(c.as_str())) {
            let _ = writeln!(out, ":{c} - [0:0]");
        }
        for (c, spec) in &table.inserts {
            let _ = writeln!(out, "-I {c} {spec}");
        }
        for c in table.user_chains().filter(|c| rw.contains(*c)) {
            for r in table.rules(c) {
                let _ = writeln!(out, "-A {c} {r}");
            }
        }
        out.push_str("COMMIT\n");
    }
    out
}

/// A table no read shows.
static EMPTY: Table = Table {
    order: Vec::new(),
    policy: BTreeMap::new(),
    rules: BTreeMap::new(),
    inserts: Vec::new(),
};

impl Prep {
    /// Per table the document writes, in load order: its name, the document's table, the
    /// node's (`after`), and the document's user chains the node shows.
    fn on_node<'a>(
        &'a self,
        after: &'a Tables,
    ) -> impl Iterator<Item = (String, &'a Table, &'a Table, Vec<&'a String>)> + 'a {
        table_order(self.new.keys().cloned())
            .into_iter()
            .map(move |t| {
                let new = &self.new[&t];
                let now = after.get(&t).unwrap_or(&EMPTY);
                let chains = new.user_chains().filter(|c| now.is_user(c)).collect();
                (t, new, now, chains)
            })
    }
}

impl Step for Prep {
    fn plan(&self, prepared: &Prepared, scratch_output: &str) -> Result<Plan, String> {
        plan(prepared, self, scratch_output)
    }

    /// The node after a direct load shows, per table the document writes, its chains and,
    /// at the top of each built-in chain, the jumps it inserted (`-I` puts them before
    /// anyone's rules): cut to those, the read is what the scratch namespace would show.
    /// Only sound when nobody else committed in between, which the CLI proves by the
    /// nf_tables generation before it asks.
    fn direct_view(&self, after: &str) -> Result<Option<String>, String> {
        let after = parse(after, Source::Save).map_err(|e| format!("iptables-save output: {e}"))?;
        let mut out = String::new();
        for (t, new, now, chains) in self.on_node(&after) {
            let mut inserts: BTreeMap<&str, usize> = BTreeMap::new();
            for (c, _) in &new.inserts {
                *inserts.entry(c).or_default() += 1;
            }
            if chains.is_empty() && inserts.is_empty() {
                continue;
            }
            let _ = writeln!(out, "*{t}");
            for c in inserts.keys() {
                let policy = now.policy.get(*c).map_or("ACCEPT", String::as_str);
                let _ = writeln!(out, ":{c} {policy} [0:0]");
            }
            for c in &chains {
                let _ = writeln!(out, ":{c} - [0:0]");
            }
            for (c, n) in &inserts {
                for r in now.rules(c).iter().take(*n) {
                    let _ = writeln!(out, "-A {c} {r}");
                }
            }
            for c in &chains {
                for r in now.rules(c) {
                    let _ = writeln!(out, "-A {c} {r}");
                }
            }
            out.push_str("COMMIT\n");
        }
        Ok(Some(out))
    }

    /// A direct load commits table by table; a table whose chains are on the node now
    /// committed (the node showed none of them before). Taking it off: its chains flushed,
    /// its jumps deleted (by the document's own text: `-D` matches a rule, not a
    /// spelling), its chains deleted.
    fn direct_revert(&self, after: &str) -> Result<Option<String>, String> {
        let after = parse(after, Source::Save).map_err(|e| format!("iptables-save output: {e}"))?;
        let mut out = String::new();
        for (t, new, _, chains) in self.on_node(&after) {
            if chains.is_empty() {
                continue;
            }
            let _ = writeln!(out, "*{t}");
            for c in &chains {
                let _ = writeln!(out, ":{c} - [0:0]");
            }
            for (c, spec) in &new.inserts {
                let _ = writeln!(out, "-D {c} {spec}");
            }
            for c in &chains {
                let _ = writeln!(out, "-X {c}");
            }
            out.push_str("COMMIT\n");
        }
        Ok((!out.is_empty()).then_some(out))
    }
}

/// Step two (see the module docs of [`super`]).
fn plan(prepared: &Prepared, p: &Prep, scratch_output: &str) -> Result<Plan, String> {
    let scratch =
        parse(scratch_output, Source::Save).map_err(|e| format!("scratch namespace: {e}"))?;
    let empty = Table::default();
    let mut load = String::new();
    let mut expected = Tables::new();
    let mut owner = Owner::default();
    let mut summary = Summary::default();
    let mut warnings = Vec::new();
    owner.undo.before = p.kernel.clone();

    let tables = table_order(p.new.keys().chain(p.kernel.keys()).cloned());
    for t in &tables {
        let new = p.new.get(t).unwrap_or(&empty);
        let k = p.kernel.get(t).unwrap_or(&empty);
        let sc = scratch.get(t).unwrap_or(&empty);
        let rewrite = p.rewrite.get(t).cloned().unwrap_or_default();
        let old_chains = p.old_chains.get(t).cloned().unwrap_or_default();

        // The save text of each jump: `-I` prepends, so the scratch namespace shows a
        // built-in chain's jumps in the reverse of the document's order.
        let mut wanted: Vec<(String, String, String)> = Vec::new(); // (chain, spec, save)
        let mut by_chain: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (c, spec) in &new.inserts {
            by_chain.entry(c).or_default().push(spec);
        }
        for (c, specs) in &by_chain {
            let saved = sc.rules(c);
            if saved.len() != specs.len() {
                return Err(format!(
                    "the scratch namespace shows {} rule(s) in {t} {c}, the document inserts {}",
                    saved.len(),
                    specs.len()
                ));
            }
            for (spec, save) in specs.iter().zip(saved.iter().rev()) {
                wanted.push((c.to_string(), spec.to_string(), save.clone()));
            }
        }
        // Keep the document's order for inserting.
        wanted.sort_by_key(|(c, spec, _)| {
            new.inserts
                .iter()
                .position(|(ic, is)| ic == c && is == spec)
        });
        for (c, _, save) in &wanted {
            owner
                .jumps
                .entry(t.clone())
                .or_default()
                .entry(c.clone())
                .or_default()
                .insert(save.clone());
        }
        let missing: Vec<&(String, String, String)> = wanted
            .iter()
            .filter(|(c, _, save)| !k.rules(c).contains(save))
            .collect();
        let mut unwanted: Vec<(String, String)> = Vec::new();
        for c in k.order.iter().filter(|c| !k.is_user(c)) {
            for r in k.rules(c) {
                if p.old_jumps.owns_jump(t, c, r) && !owner.owns_jump(t, c, r) {
                    unwanted.push((c.clone(), r.clone()));
                }
            }
        }

        // Owned chains no longer wanted.
        let stale: Vec<&String> = k
            .user_chains()
            .filter(|c| !new.declares(c) && (is_service_chain(c) || old_chains.contains(*c)))
            .collect();
        let stale_set: BTreeSet<&str> = stale.iter().map(|c| c.as_str()).collect();
        // Who else jumps to them: rules that stay after this load.
        let mut referenced: BTreeSet<&str> = BTreeSet::new();
        for c in &k.order {
            let goes = rewrite.contains(c) || stale_set.contains(c.as_str());
            if goes {
                continue;
            }
            for r in k.rules(c) {
                if unwanted.iter().any(|(uc, ur)| uc == c && ur == r) {
                    continue;
                }
                referenced.extend(targets(r).filter(|x| stale_set.contains(x)));
            }
        }
        for c in &stale {
            if referenced.contains(c.as_str()) && !k.rules(c).is_empty() {
                warnings.push(format!(
                    "{t} {c} is no longer wanted but a rule svc-compile did not write jumps to it: flushed, not deleted"
                ));
            }
        }

        // The load block.
        let mut block = String::new();
        let mut undo = TableUndo::default();
        for c in new.user_chains().filter(|c| rewrite.contains(*c)) {
            let _ = writeln!(block, ":{c} - [0:0]");
            undo.declared.push(c.clone());
        }
        // A stale chain someone else still jumps to is flushed once and then left alone
        // (declaring it again would flush it again: an apply that never ends unchanged).
        for c in stale
            .iter()
            .filter(|c| !referenced.contains(c.as_str()) || !k.rules(c).is_empty())
        {
            let _ = writeln!(block, ":{c} - [0:0]");
            undo.declared.push(c.to_string());
        }
        for (c, r) in &unwanted {
            let _ = writeln!(block, "-D {c} {r}");
            undo.removed.push((c.clone(), r.clone()));
        }
        for (c, spec, save) in &missing {
            let _ = writeln!(block, "-I {c} {spec}");
            undo.inserted.push((c.clone(), save.clone()));
        }
        for c in new.user_chains().filter(|c| rewrite.contains(*c)) {
            for r in new.rules(c) {
                let _ = writeln!(block, "-A {c} {r}");
            }
        }
        let mut deleted = 0;
        for c in stale.iter().filter(|c| !referenced.contains(c.as_str())) {
            let _ = writeln!(block, "-X {c}");
            deleted += 1;
        }
        // Chains someone else changed that this load writes: declared (rewritten or
        // flushed), or a built-in chain whose jumps it puts back or takes out.
        if let Some(drifted) = p.drifted.get(t) {
            let declared: BTreeSet<&str> = undo.declared.iter().map(String::as_str).collect();
            let jumps_of = |c: &str| {
                missing.iter().any(|(mc, _, _)| mc == c) || unwanted.iter().any(|(uc, _)| uc == c)
            };
            summary.repaired += drifted
                .iter()
                .filter(|c| declared.contains(c.as_str()) || jumps_of(c))
                .count();
        }
        if !block.is_empty() {
            let _ = write!(load, "*{t}\n{block}COMMIT\n");
            owner.undo.tables.insert(t.clone(), undo);
        }
        summary.rewritten += rewrite.len();
        summary.deleted += deleted;
        summary.jumps += missing.len() + unwanted.len();

        // What the kernel must show afterwards.
        let mut exp = Table::default();
        let mut names: BTreeSet<String> = BTreeSet::new();
        for c in new.user_chains() {
            let rules = if rewrite.contains(c) {
                sc.rules(c).to_vec()
            } else {
                k.rules(c).to_vec()
            };
            exp.order.push(c.clone());
            exp.policy.insert(c.clone(), "-".into());
            exp.rules.insert(c.clone(), rules);
            names.insert(c.clone());
        }
        for c in stale.iter().filter(|c| referenced.contains(c.as_str())) {
            exp.order.push(c.to_string());
            exp.policy.insert(c.to_string(), "-".into());
            exp.rules.insert(c.to_string(), Vec::new());
            names.insert(c.to_string());
        }
        for c in k.order.iter().filter(|c| !k.is_user(c)) {
            let mut jumps: Vec<String> = missing
                .iter()
                .rev()
                .filter(|(mc, _, _)| mc == c)
                .map(|(_, _, save)| save.clone())
                .collect();
            jumps.extend(
                k.rules(c)
                    .iter()
                    .filter(|r| owner.owns_jump(t, c, r))
                    .cloned(),
            );
            if !jumps.is_empty() {
                exp.rules.insert(c.clone(), jumps);
            }
        }
        // Built-in chains the kernel does not show yet (a table nobody used).
        for (c, _, _) in missing.iter().rev() {
            if !k.declares(c) {
                let save: Vec<String> = missing
                    .iter()
                    .rev()
                    .filter(|(mc, _, _)| mc == c)
                    .map(|(_, _, s)| s.clone())
                    .collect();
                exp.rules.insert(c.clone(), save);
            }
        }
        if !exp.order.is_empty() || !exp.rules.is_empty() {
            expected.insert(t.clone(), exp);
        }
        owner.chains.insert(t.clone(), names);
    }

    let mode = match &prepared.mode {
        Mode::Incremental if load.is_empty() => Mode::Unchanged,
        m => m.clone(),
    };
    if mode != Mode::Unchanged && summary.repaired > 0 {
        warnings.push(format!(
            "the kernel differs from what the last apply left ({}): {} chain(s) written again",
            p.first_drift.as_deref().unwrap_or(""),
            summary.repaired
        ));
    }
    Ok(Plan {
        mode,
        load: (!load.is_empty()).then_some(load),
        expected: format_owned(&expected),
        summary,
        warnings,
        touched: None,
        owner: Arc::new(owner),
    })
}

#[cfg(test)]
mod tests;
