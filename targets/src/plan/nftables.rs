//! Planning an nftables apply.
//!
//! Everything we own is the table `kube-proxy` of the family, and `nft -f` commits a whole
//! file as one transaction, so every plan is one atomic step:
//!
//! - **Full**: the compiled document with `add table` + `delete table` in front: the old
//!   table and everything in it is replaced in the same transaction.
//! - **Incremental**: only the difference between the last applied document and the new
//!   one, object by object: new chains and sets are added; map and set elements whose line
//!   changed are deleted and added; chains whose rules changed are flushed and refilled;
//!   chains and sets no longer wanted are flushed and deleted after everything that referred
//!   to them. Dynamic (affinity) sets of unchanged endpoints keep their entries.
//!
//! kube-proxy waits a second before deleting a chain that a just-deleted map element
//! pointed to, because kernels before 6.2 notice the dropped reference late; there the
//! incremental transaction fails its `nft -c` check and the CLI falls back to a full load,
//! which deletes the table as a whole.
//!
//! Owned state is compared as `nft -j list table` output, normalised: handles dropped,
//! objects sorted by kind and name (rules stay in order within their chain), elements
//! sorted, and the elements of dynamic sets left out (traffic fills them).

use super::{argv, scratch, Commands, Family, Mode, Owned, Plan, Planner, Prepared};
use super::{Previous, Step, Summary, Tool};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::Arc;

const TABLE: &str = "kube-proxy";

/// The nftables back end's [`Planner`].
pub struct Nftables;

/// What `nft list table` prints on stderr when the table does not exist (yet): an empty
/// state, not an error.
pub const ABSENT: &str = "No such file or directory";

fn nft_family(family: Family) -> &'static str {
    match family {
        Family::V4 => "ip",
        Family::V6 => "ip6",
    }
}

/// A compiled document as objects.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Doc {
    family: String,
    /// The `add table … { … }` line.
    table: String,
    /// Chains in order; name → definition line.
    chain_order: Vec<String>,
    chains: BTreeMap<String, String>,
    /// Sets and maps in order; name → definition line.
    set_order: Vec<String>,
    sets: BTreeMap<String, String>,
    /// Chain → `add rule` lines, in order.
    rules: BTreeMap<String, Vec<String>>,
    /// Set → key → `add element` line.
    elements: BTreeMap<String, BTreeMap<String, String>>,
    /// Every statement line, for the full load.
    body: Vec<String>,
}

impl Doc {
    fn rules(&self, chain: &str) -> &[String] {
        self.rules.get(chain).map_or(&[], Vec::as_slice)
    }
}

fn parse(text: &str) -> Result<Doc, String> {
    let mut d = Doc::default();
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |why: &str| format!("line {n}: `{line}`: {why}");
        let w: Vec<&str> = line.splitn(6, ' ').collect();
        if w.len() < 4 {
            return Err(bad("not an nft statement svc-compile writes"));
        }
        let (verb, kind, family, table) = (w[0], w[1], w[2], w[3]);
        if table != TABLE || !matches!(family, "ip" | "ip6") {
            return Err(bad(
                "apply only writes the table ip kube-proxy or ip6 kube-proxy",
            ));
        }
        if d.family.is_empty() {
            d.family = family.to_string();
        } else if d.family != family {
            return Err(bad("a second family in one document"));
        }
        let name = w.get(4).copied().unwrap_or("");
        match (verb, kind) {
            // The replace prefix of the compiled document; the full load writes its own.
            ("add", "table") | ("delete", "table") if w.len() == 4 => continue,
            ("add", "table") => d.table = line.to_string(),
            ("add", "chain") if !name.is_empty() => {
                if d.chains
                    .insert(name.to_string(), line.to_string())
                    .is_none()
                {
                    d.chain_order.push(name.to_string());
                }
            }
            ("add", "set" | "map") if !name.is_empty() => {
                if d.sets.insert(name.to_string(), line.to_string()).is_none() {
                    d.set_order.push(name.to_string());
                }
            }
            ("add", "rule") if w.len() == 6 => {
                if !d.chains.contains_key(name) {
                    return Err(bad("a rule in a chain the document has not added"));
                }
                d.rules
                    .entry(name.to_string())
                    .or_default()
                    .push(line.to_string());
            }
            ("add", "element") if w.len() == 6 => {
                if !d.sets.contains_key(name) {
                    return Err(bad("an element of a set the document has not added"));
                }
                let key = element_key(w[5]).ok_or_else(|| bad("cannot read the element"))?;
                d.elements
                    .entry(name.to_string())
                    .or_default()
                    .insert(key, line.to_string());
            }
            _ => return Err(bad("not an nft statement svc-compile writes")),
        }
        d.body.push(line.to_string());
    }
    if d.table.is_empty() {
        return Err("the document adds no kube-proxy table".into());
    }
    Ok(d)
}

/// `{ 10.0.0.1 . tcp . 80 comment "x" : goto c }` → `10.0.0.1 . tcp . 80`. Key parts never
/// contain spaces; the comment and the verdict follow them.
fn element_key(body: &str) -> Option<String> {
    let inner = body.strip_prefix("{ ")?.strip_suffix(" }")?;
    let key: Vec<&str> = inner
        .split(' ')
        .take_while(|w| !matches!(*w, "comment" | ":"))
        .collect();
    (!key.is_empty()).then(|| key.join(" "))
}

/// The full load: replace the table in one transaction.
fn full_document(d: &Doc) -> String {
    let mut out = format!(
        "add table {f} {TABLE}\ndelete table {f} {TABLE}\n",
        f = d.family
    );
    for l in &d.body {
        out.push_str(l);
        out.push('\n');
    }
    out
}

/// The items of `nft -j` output (its `nftables` list); `None` for empty output (nothing
/// listed, e.g. no table).
pub(crate) fn nft_items(json: &str) -> Result<Option<Vec<Value>>, String> {
    if json.trim().is_empty() {
        return Ok(None);
    }
    let v: Value = serde_json::from_str(json).map_err(|e| format!("nft -j output: {e}"))?;
    match v {
        Value::Object(mut o) => match o.remove("nftables") {
            Some(Value::Array(items)) => Ok(Some(items)),
            _ => Err("nft -j output has no `nftables` list".into()),
        },
        _ => Err("nft -j output has no `nftables` list".into()),
    }
}

/// `nft -j list table` output → canonical owned-state text (see the module docs). Empty
/// input (no table) gives empty text.
pub(super) fn normalize(json: &str) -> Result<String, String> {
    let Some(items) = nft_items(json)? else {
        return Ok(String::new());
    };
    let mut tables = Vec::new();
    let mut objects: BTreeMap<(String, String), String> = BTreeMap::new();
    let mut rules: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for item in items {
        let Some((kind, body)) = item.as_object().and_then(|o| o.iter().next()) else {
            continue;
        };
        let mut body = body.clone();
        let Some(obj) = body.as_object_mut() else {
            continue;
        };
        obj.remove("handle");
        let name = obj
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        match kind.as_str() {
            "metainfo" => continue,
            "table" => tables.push(format!("table {body}")),
            "rule" => {
                let chain = obj
                    .get("chain")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                rules
                    .entry(chain.to_string())
                    .or_default()
                    .push(format!("rule {chain} {body}"));
            }
            "set" | "map" => {
                let dynamic = obj.get("flags").and_then(Value::as_array).is_some_and(|f| {
                    f.iter()
                        .any(|x| matches!(x.as_str(), Some("dynamic" | "timeout")))
                });
                if dynamic {
                    obj.remove("elem");
                } else if let Some(Value::Array(elems)) = obj.get_mut("elem") {
                    elems.sort_by_cached_key(|e| e.to_string());
                }
                objects.insert(
                    (kind.clone(), name.clone()),
                    format!("{kind} {name} {body}"),
                );
            }
            _ => {
                objects.insert(
                    (kind.clone(), name.clone()),
                    format!("{kind} {name} {body}"),
                );
            }
        }
    }
    let mut out = String::new();
    for l in tables
        .iter()
        .chain(objects.values())
        .chain(rules.values().flatten())
    {
        out.push_str(l);
        out.push('\n');
    }
    Ok(out)
}

/// The canonical owned-state text of an `nft -j list table` read (what plans expect and the
/// state directory keeps), for tools and tests that compare kernel states.
pub fn owned_state(kernel: &str) -> Result<String, String> {
    normalize(kernel)
}

/// Owned state of a kernel read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Owner;

impl Owned for Owner {
    fn owned(&self, kernel: &str) -> Result<String, String> {
        normalize(kernel)
    }
}

/// Step one's nftables part.
#[derive(Clone, Debug)]
pub(super) struct Prep {
    full: String,
    /// The incremental transaction, when there is one.
    delta: Option<Delta>,
    summary: Summary,
}

/// An incremental transaction and what it changes.
#[derive(Clone, Debug, Default)]
struct Delta {
    text: String,
    /// The snapshot it starts from (the kernel shows exactly this).
    snapshot: String,
    /// Chains created or refilled, and sets created or with other elements.
    chains: Vec<String>,
    sets: Vec<String>,
    /// Chains and sets deleted.
    stale_chains: Vec<String>,
    stale_sets: Vec<String>,
}

impl Planner for Nftables {
    fn tools(&self, _family: Family) -> Vec<Tool> {
        vec![Tool {
            program: "nft",
            package: "nftables",
        }]
    }
    fn absent(&self) -> Option<&'static str> {
        Some(ABSENT)
    }
    /// The commands for one family.
    fn commands(&self, family: Family) -> Commands {
        let fam = nft_family(family);
        Commands {
            read: argv(&["nft", "-j", "list", "table", fam, TABLE]),
            check: argv(&["nft", "-c", "-f"]),
            load: argv(&["nft", "-f"]),
            scratch: scratch(&format!("nft -f \"$1\" && nft -j list table {fam} {TABLE}")),
        }
    }

    /// The family of a compiled document (its `add table` line).
    fn family_of(&self, doc: &str) -> Option<Family> {
        doc.lines().find_map(|l| {
            let mut w = l.split_whitespace();
            match (w.next(), w.next(), w.next(), w.next()) {
                (Some("add"), Some("table"), Some("ip"), Some(TABLE)) => Some(Family::V4),
                (Some("add"), Some("table"), Some("ip6"), Some(TABLE)) => Some(Family::V6),
                _ => None,
            }
        })
    }

    /// Step one (see the module docs of [`super`]). `force_full` ignores `previous`.
    ///
    /// The scratch document of a full plan is the full load; that of an incremental plan holds
    /// only what it changes plus what that refers to (empty when nothing changes), and the
    /// expectation is the snapshot with those objects replaced.
    fn prepare(
        &self,
        new_doc: &str,
        family: Family,
        previous: Option<Previous>,
        kernel: &str,
        force_full: bool,
    ) -> Result<Prepared, String> {
        prepare(new_doc, family, previous, Some(kernel), force_full)
    }

    /// The same plan as [`Planner::prepare`] with a kernel read whose owned part is the
    /// snapshot: the comparison is skipped.
    fn prepare_unchanged(
        &self,
        new_doc: &str,
        family: Family,
        previous: Previous,
    ) -> Option<Result<Prepared, String>> {
        Some(prepare(new_doc, family, Some(previous), None, false))
    }

    /// Everything owned is in one nf_tables table.
    fn tracked_by_generation(&self, _family: Family, _kernel: &str) -> bool {
        true
    }

    /// `nft -f` commits a file as one transaction.
    fn transactions(&self, _load: &str) -> Option<u32> {
        Some(1)
    }
}

/// Step one; `kernel` is `None` when the kernel is known to show `previous.snapshot`.
fn prepare(
    new_doc: &str,
    family: Family,
    previous: Option<Previous>,
    kernel: Option<&str>,
    force_full: bool,
) -> Result<Prepared, String> {
    let new = parse(new_doc).map_err(|e| format!("the document: {e}"))?;
    if new.family != nft_family(family) {
        return Err(format!(
            "the document is for family {}, not {}",
            new.family,
            nft_family(family)
        ));
    }
    let full = full_document(&new);
    let mut summary = Summary {
        rewritten: new.chains.len(),
        deleted: 0,
        jumps: 0,
        elements: new.elements.values().map(BTreeMap::len).sum(),
    };
    let mut delta = None;
    let mode = match previous {
        _ if force_full => Mode::Full("asked for with --full".into()),
        None => Mode::Full("no previous apply recorded".into()),
        Some(p) => {
            let now = match kernel {
                Some(k) => normalize(k)?,
                None => p.snapshot.to_string(),
            };
            if now != p.snapshot {
                Mode::Full(format!(
                    "the kernel differs from what the last apply left: {}",
                    Plan::first_difference(p.snapshot, &now)
                ))
            } else {
                match parse(p.document) {
                    Err(_) => Mode::Full("the recorded document cannot be read".into()),
                    Ok(old) => match diff(&old, &new) {
                        Err(why) => Mode::Full(why),
                        Ok((mut d, s)) => {
                            d.snapshot = p.snapshot.to_string();
                            delta = Some(d);
                            summary = s;
                            Mode::Incremental
                        }
                    },
                }
            }
        }
    };
    let scratch = match &delta {
        Some(d) => scratch_document(&new, d),
        None => full.clone(),
    };
    Ok(Prepared {
        mode,
        scratch,
        family,
        step: Arc::new(Prep {
            full,
            delta,
            summary,
        }),
    })
}

/// The incremental transaction from `old` to `new` (see the module docs), or why there
/// cannot be one.
fn diff(old: &Doc, new: &Doc) -> Result<(Delta, Summary), String> {
    if old.family != new.family || old.table != new.table {
        return Err("the table definition changed".into());
    }
    for (kind, o, n) in [
        ("chain", &old.chains, &new.chains),
        ("set", &old.sets, &new.sets),
    ] {
        if let Some(name) = n
            .iter()
            .find(|(name, def)| o.get(*name).is_some_and(|od| od != *def))
            .map(|(name, _)| name)
        {
            return Err(format!("the definition of {kind} {name} changed"));
        }
    }
    let (f, t) = (&new.family, TABLE);
    let mut d = Delta::default();
    let mut s = Summary::default();
    let out = &mut d.text;
    let no_elements = BTreeMap::new();
    // Objects first: everything added later may refer to them.
    for c in new
        .chain_order
        .iter()
        .filter(|c| !old.chains.contains_key(*c))
    {
        let _ = writeln!(out, "{}", new.chains[c]);
    }
    for x in new.set_order.iter().filter(|x| !old.sets.contains_key(*x)) {
        let _ = writeln!(out, "{}", new.sets[x]);
        d.sets.push(x.clone());
    }
    // Elements that go or change, while the chains they point to still exist.
    for (set, elems) in &old.elements {
        if !new.sets.contains_key(set) {
            continue;
        }
        let now = new.elements.get(set).unwrap_or(&no_elements);
        for (key, line) in elems {
            if now.get(key) != Some(line) {
                let _ = writeln!(out, "delete element {f} {t} {set} {{ {key} }}");
                s.elements += 1;
                if !d.sets.contains(set) {
                    d.sets.push(set.clone());
                }
            }
        }
    }
    for c in &new.chain_order {
        let known = old.chains.contains_key(c);
        if known && old.rules(c) == new.rules(c) {
            continue;
        }
        if known {
            let _ = writeln!(out, "flush chain {f} {t} {c}");
        }
        for r in new.rules(c) {
            let _ = writeln!(out, "{r}");
        }
        d.chains.push(c.clone());
        s.rewritten += 1;
    }
    for (set, elems) in &new.elements {
        let before = old.elements.get(set).unwrap_or(&no_elements);
        for (key, line) in elems {
            if before.get(key) != Some(line) {
                let _ = writeln!(out, "{line}");
                s.elements += 1;
                if !d.sets.contains(set) {
                    d.sets.push(set.clone());
                }
            }
        }
    }
    // Then what is no longer wanted: flush every stale chain before deleting any (they may
    // jump to each other), sets last (stale chains' rules may use them).
    d.stale_chains = old
        .chain_order
        .iter()
        .filter(|c| !new.chains.contains_key(*c))
        .cloned()
        .collect();
    for c in &d.stale_chains {
        let _ = writeln!(out, "flush chain {f} {t} {c}");
    }
    for c in &d.stale_chains {
        let _ = writeln!(out, "delete chain {f} {t} {c}");
        s.deleted += 1;
    }
    for x in old.set_order.iter().filter(|x| !new.sets.contains_key(*x)) {
        let kind = old.sets[x].split(' ').nth(1).unwrap_or("set");
        let _ = writeln!(out, "delete {kind} {f} {t} {x}");
        d.stale_sets.push(x.clone());
        s.deleted += 1;
    }
    Ok((d, s))
}

/// Names a statement refers to: chains after `jump`/`goto`, sets as `@name`.
fn references(line: &str) -> impl Iterator<Item = &str> {
    let mut prev = "";
    line.split([' ', ',', '{', '}']).filter_map(move |w| {
        let r = if matches!(prev, "jump" | "goto") {
            Some(w)
        } else {
            w.strip_prefix('@')
        };
        prev = w;
        r.filter(|r| !r.is_empty())
    })
}

/// What an incremental plan changes, with every object it refers to, for an empty
/// namespace. Empty when nothing changes.
fn scratch_document(new: &Doc, d: &Delta) -> String {
    if d.chains.is_empty() && d.sets.is_empty() {
        return String::new();
    }
    let mut lines: Vec<&String> = Vec::new();
    let mut chains: BTreeSet<&str> = d.chains.iter().map(String::as_str).collect();
    let mut sets: BTreeSet<&str> = d.sets.iter().map(String::as_str).collect();
    for c in &d.chains {
        lines.extend(new.rules(c));
    }
    for x in &d.sets {
        lines.extend(new.elements.get(x).into_iter().flat_map(|e| e.values()));
    }
    for l in &lines {
        for r in references(l) {
            if new.chains.contains_key(r) {
                chains.insert(r);
            } else if new.sets.contains_key(r) {
                sets.insert(r);
            }
        }
    }
    let mut out = format!("{}\n", new.table);
    for c in new
        .chain_order
        .iter()
        .filter(|c| chains.contains(c.as_str()))
    {
        let _ = writeln!(out, "{}", new.chains[c]);
    }
    for x in new.set_order.iter().filter(|x| sets.contains(x.as_str())) {
        let _ = writeln!(out, "{}", new.sets[x]);
    }
    for l in lines {
        let _ = writeln!(out, "{l}");
    }
    out
}

/// Normalised text (see [`normalize`]) by object: `table`, (kind, name) → line, chain →
/// rule lines.
type Objects = (
    Vec<String>,
    BTreeMap<(String, String), String>,
    BTreeMap<String, Vec<String>>,
);

fn split_normalized(text: &str) -> Objects {
    let mut o: Objects = Default::default();
    for line in text.lines() {
        let mut w = line.splitn(3, ' ');
        let (kind, name) = (w.next().unwrap_or(""), w.next().unwrap_or(""));
        match kind {
            "table" => o.0.push(line.to_string()),
            "rule" => {
                o.2.entry(name.to_string())
                    .or_default()
                    .push(line.to_string())
            }
            _ => {
                o.1.insert((kind.to_string(), name.to_string()), line.to_string());
            }
        }
    }
    o
}

/// The expected state after an incremental load: the snapshot with the changed objects
/// as the scratch namespace shows them and the stale ones gone.
fn merge(d: &Delta, scratch: &str) -> String {
    let (table, mut objects, mut rules) = split_normalized(&d.snapshot);
    let (_, s_objects, mut s_rules) = split_normalized(scratch);
    let is_set = |k: &str| matches!(k, "set" | "map");
    objects.retain(|(k, n), _| {
        let stale = if k == "chain" {
            &d.stale_chains
        } else {
            &d.stale_sets
        };
        !stale.contains(n)
    });
    for c in &d.stale_chains {
        rules.remove(c);
    }
    for ((k, n), line) in s_objects {
        let changed = if k == "chain" { &d.chains } else { &d.sets };
        if changed.contains(&n) && (k == "chain" || is_set(&k)) {
            objects.insert((k, n), line);
        }
    }
    for c in &d.chains {
        match s_rules.remove(c) {
            Some(r) => rules.insert(c.clone(), r),
            None => rules.remove(c),
        };
    }
    let mut out = String::new();
    for l in table
        .iter()
        .chain(objects.values())
        .chain(rules.values().flatten())
    {
        out.push_str(l);
        out.push('\n');
    }
    out
}

impl Step for Prep {
    fn plan(&self, prepared: &Prepared, scratch_output: &str) -> Result<Plan, String> {
        plan(prepared, self, scratch_output)
    }
}

/// Step two (see the module docs of [`super`]).
fn plan(prepared: &Prepared, p: &Prep, scratch_output: &str) -> Result<Plan, String> {
    let scratch = normalize(scratch_output)?;
    let (mode, load, expected, summary) = match (&prepared.mode, &p.delta) {
        (Mode::Incremental, Some(d)) if d.text.is_empty() => (
            Mode::Unchanged,
            None,
            d.snapshot.clone(),
            Summary::default(),
        ),
        (Mode::Incremental, Some(d)) => (
            Mode::Incremental,
            Some(d.text.clone()),
            merge(d, &scratch),
            p.summary.clone(),
        ),
        (m, _) => {
            if scratch.is_empty() {
                return Err(
                    "the scratch namespace shows no kube-proxy table after loading the document"
                        .into(),
                );
            }
            (m.clone(), Some(p.full.clone()), scratch, p.summary.clone())
        }
    };
    Ok(Plan {
        mode,
        load,
        expected,
        summary,
        warnings: Vec::new(),
        owner: Arc::new(Owner),
    })
}

#[cfg(test)]
mod tests;
