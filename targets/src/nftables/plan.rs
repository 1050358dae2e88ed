//! Planning an nftables apply.
//!
//! Everything we own is the table `kube-proxy` of the family, and `nft -f` commits a whole
//! file as one transaction, so every plan is one atomic step:
//!
//! - **Full**: the compiled document with `add table` + `delete table` in front: the old
//!   table and everything in it is replaced in the same transaction.
//! - **Incremental**: only the difference between the last applied document and the new
//!   one, object by object: new chains and sets are added; a set or map that gains elements
//!   gets them in an `add set|map … { …; elements = { … } }`, one that loses or changes any
//!   is flushed and refilled whole, unless `delete element` is the cheaper (the transaction
//!   deletes anyway, or the refills would write more elements than the table has chains:
//!   the fast layout's hairpin set); chains whose rules changed are flushed and refilled
//!   with their rules inside `add chain … { … }`, and the sets those rules name are declared
//!   again (a no-op). Dynamic (affinity) sets of unchanged endpoints keep their entries.
//!
//! Why these forms: nft 1.0.6 lists every chain of the table before it runs an `add rule`,
//! `add element`, `delete element` or any `delete`, and at 112k chains that listing is
//! 1.4–1.7 s; the forms above run in 0.01–0.1 s on the same table (docs/performance.md,
//! "Apply").
//!
//! Stale chains are therefore emptied (`flush chain`) and left in place, as kube-proxy
//! does; they are deleted in one go once [`DELETE_STALE_AT`] have gathered, or with the
//! first transaction that deletes anyway (a stale set), or by a full load. The kernel then
//! shows them, empty, and the record's snapshot says so; a chain a later document declares
//! again is simply refilled. Empty chains nothing jumps to decide nothing:
//! [`without_leftovers`] is the owned state without them, which `drift` compares.
//!
//! kube-proxy waits a second before deleting a chain that a just-deleted map element
//! pointed to, because kernels before 6.2 notice the dropped reference late; there a
//! transaction deleting such a chain is refused and the CLI loads everything instead,
//! which deletes the table as a whole.
//!
//! Owned state is compared as `nft -j list table` output, normalised: handles dropped,
//! objects sorted by kind and name (rules stay in order within their chain), elements
//! sorted, and the elements of dynamic sets left out (traffic fills them).

use super::names::{HAIRPIN_ENDPOINTS, TABLE};
use crate::plan::{argv, scratch, Commands, Family, Mode, Owned, Plan, Planner, Prepared};
use crate::plan::{
    is_unread, Drift, ElementWrites, Previous, Recorded, Removal, RemovalPlanner, Step, Summary,
    Tool, Touched, UNREAD,
};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::ops::Range;
use std::sync::Arc;

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

/// An element as [`Doc::elements`] lists it: (set index, key, line).
type Element<'a> = (usize, &'a str, &'a str);

/// A compiled document as objects, borrowing its lines (a 10k-service node's document is
/// 58 MB: owned copies of every line cost more than everything else in planning).
#[derive(Debug, Default)]
struct Doc<'a> {
    family: &'a str,
    /// The `add table … { … }` line.
    table: &'a str,
    /// Chains in order: (name, definition line); a name declared twice keeps its first
    /// place and its last line.
    chains: Vec<(&'a str, &'a str)>,
    chain_at: HashMap<&'a str, usize>,
    /// Sets and maps in order, likewise.
    sets: Vec<(&'a str, &'a str)>,
    set_at: HashMap<&'a str, usize>,
    /// Every chain's `add rule` lines, in order, chain after chain: chain `i` has
    /// `rules[rule_start[i]..rule_start[i + 1]]`.
    rules: Vec<&'a str>,
    rule_start: Vec<usize>,
    /// `add element` lines as (set index, key, line), sorted by set index and key, one
    /// per key (the last line given); set `i` has `elements[element_range[i]]`.
    elements: Vec<Element<'a>>,
    element_range: Vec<Range<usize>>,
}

impl<'a> Doc<'a> {
    fn rules(&self, chain: &str) -> &[&'a str] {
        self.chain_at.get(chain).map_or(&[], |&i| {
            &self.rules[self.rule_start[i]..self.rule_start[i + 1]]
        })
    }

    /// A set's elements, sorted by key.
    fn elements(&self, set: &str) -> &[Element<'a>] {
        self.set_at
            .get(set)
            .map_or(&[], |&i| &self.elements[self.element_range[i].clone()])
    }
}

/// The statement lines of a document, trimmed, with their line numbers.
fn statements(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, raw)| (i + 1, raw.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'))
}

/// `add table F kube-proxy` / `delete table F kube-proxy`: the replace prefix of the
/// compiled document; the full load writes its own.
fn replace_prefix(w: &[&str]) -> bool {
    w.len() == 4 && matches!((w[0], w[1]), ("add" | "delete", "table"))
}

fn parse(text: &str) -> Result<Doc<'_>, String> {
    let mut d = Doc::default();
    // (chain index, line), and (set index, key, line), in document order.
    let mut rules: Vec<(usize, &str)> = Vec::new();
    let mut last_chain: Option<(&str, usize)> = None;
    let mut last_set: Option<(&str, usize)> = None;
    for (n, line) in statements(text) {
        let bad = |why: &str| format!("line {n}: `{line}`: {why}");
        let mut w = [""; 6];
        let mut len = 0;
        for (slot, word) in w.iter_mut().zip(line.splitn(6, ' ')) {
            *slot = word;
            len += 1;
        }
        let w = &w[..len];
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
            d.family = family;
        } else if d.family != family {
            return Err(bad("a second family in one document"));
        }
        let name = w.get(4).copied().unwrap_or("");
        match (verb, kind) {
            _ if replace_prefix(w) => continue,
            ("add", "table") => d.table = line,
            ("add", "chain") if !name.is_empty() => match d.chain_at.get(name) {
                Some(&i) => d.chains[i].1 = line,
                None => {
                    d.chain_at.insert(name, d.chains.len());
                    d.chains.push((name, line));
                }
            },
            ("add", "set" | "map") if !name.is_empty() => match d.set_at.get(name) {
                Some(&i) => d.sets[i].1 = line,
                None => {
                    d.set_at.insert(name, d.sets.len());
                    d.sets.push((name, line));
                }
            },
            ("add", "rule") if w.len() == 6 => {
                let Some(c) = index_of(&mut last_chain, &d.chain_at, name) else {
                    return Err(bad("a rule in a chain the document has not added"));
                };
                rules.push((c, line));
            }
            ("add", "element") if w.len() == 6 => {
                let Some(x) = index_of(&mut last_set, &d.set_at, name) else {
                    return Err(bad("an element of a set the document has not added"));
                };
                let key = element_key(w[5]).ok_or_else(|| bad("cannot read the element"))?;
                d.elements.push((x, key, line));
            }
            _ => return Err(bad("not an nft statement svc-compile writes")),
        }
    }
    if d.table.is_empty() {
        return Err("the document adds no kube-proxy table".into());
    }
    // Stable: a chain's rules keep their order.
    rules.sort_by_key(|r| r.0);
    d.rule_start = vec![0; d.chains.len() + 1];
    for r in &rules {
        d.rule_start[r.0 + 1] += 1;
    }
    for i in 0..d.chains.len() {
        d.rule_start[i + 1] += d.rule_start[i];
    }
    d.rules = rules.into_iter().map(|r| r.1).collect();
    // Stable, then the last line of a key wins.
    d.elements.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
    d.elements.dedup_by(|later, kept| {
        let same = later.0 == kept.0 && later.1 == kept.1;
        if same {
            kept.2 = later.2;
        }
        same
    });
    d.element_range = vec![0..0; d.sets.len()];
    let mut at = 0;
    for g in d.elements.chunk_by(|a, b| a.0 == b.0) {
        d.element_range[g[0].0] = at..at + g.len();
        at += g.len();
    }
    Ok(d)
}

/// `name`'s index in `at`: rules and elements come in runs of one chain or set, so the
/// last one found (`last`, updated) is asked first.
fn index_of<'a>(
    last: &mut Option<(&'a str, usize)>,
    at: &HashMap<&'a str, usize>,
    name: &'a str,
) -> Option<usize> {
    match *last {
        Some((n, i)) if n == name => Some(i),
        _ => {
            let i = *at.get(name)?;
            *last = Some((name, i));
            Some(i)
        }
    }
}

/// `{ 10.0.0.1 . tcp . 80 comment "x" : goto c }` → `10.0.0.1 . tcp . 80`. Key parts never
/// contain spaces; the comment and the verdict follow them.
fn element_key(body: &str) -> Option<&str> {
    let inner = body.strip_prefix("{ ")?.strip_suffix(" }")?;
    let mut end = 0;
    for w in inner.split(' ') {
        if matches!(w, "comment" | ":") {
            break;
        }
        end += w.len() + 1;
    }
    (end > 0).then(|| &inner[..end - 1])
}

/// The full load: the table replaced in one transaction, with the document's objects
/// grouped: each chain with all its rules in one `add chain … { … }`, each set with all its
/// elements in one `add set|map … { …; elements = { … } }`, every object after the ones it
/// refers to (the chains a chain's rules jump or go to and the sets they name; the chains a
/// map's elements go to), so that each is written once. nft reads that in about two thirds
/// of the time it takes for one statement per rule and element where elements and rules
/// are many (fast layout, 10k services: 3.2 s against 4.8 s; docs/performance.md, "Apply"), as
/// fast where chains are (kube-proxy's layout), and the kernel ends up with the same table.
/// (Declaring every chain first and filling it later is no faster there: the kernel's
/// second look-up of each of 112k chains in one transaction made it 1.3× slower.) A cycle
/// of references, which nft would refuse anyway, falls back to that declaring order.
/// `len`: the document's size, to reserve room.
fn full_document(d: &Doc, len: usize) -> String {
    let (f, t) = (d.family, TABLE);
    let mut out = String::with_capacity(len / 2 + 256);
    let _ = writeln!(out, "add table {f} {t}\ndelete table {f} {t}\n{}", d.table);
    match dependency_order(d) {
        Some(order) => {
            for o in order {
                match o {
                    Object::Chain(i) => push_chain(&mut out, d, i),
                    Object::Set(i) => push_set(&mut out, d, i),
                }
            }
        }
        None => {
            for (_, def) in &d.chains {
                out.push_str(def);
                out.push('\n');
            }
            (0..d.sets.len()).for_each(|i| push_set(&mut out, d, i));
            (0..d.chains.len()).for_each(|i| push_chain(&mut out, d, i));
        }
    }
    out
}

/// A chain or a set of a [`Doc`], by index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Object {
    Chain(usize),
    Set(usize),
}

/// Chain `i` with its rules (its definition alone when it has none).
fn push_chain(out: &mut String, d: &Doc, i: usize) {
    let def = d.chains[i].1;
    let rules = &d.rules[d.rule_start[i]..d.rule_start[i + 1]];
    if rules.is_empty() {
        out.push_str(def);
        out.push('\n');
    } else {
        push_with_rules(out, def, rules);
    }
}

/// Set `i` with its elements.
fn push_set(out: &mut String, d: &Doc, i: usize) {
    let def = d.sets[i].1;
    let elements = &d.elements[d.element_range[i].clone()];
    if elements.is_empty() || !push_with_elements(out, def, elements) {
        out.push_str(def);
        out.push('\n');
        // Not a definition svc-compile writes: its elements one by one, still right.
        for e in elements {
            out.push_str(e.2);
            out.push('\n');
        }
    }
}

/// Every chain and set of `d`, each after the objects it refers to (depth first, in
/// document order otherwise); `None` on a cycle.
fn dependency_order(d: &Doc) -> Option<Vec<Object>> {
    let refs = |o: Object| -> Vec<Object> {
        let lines: Box<dyn Iterator<Item = &str>> = match o {
            Object::Chain(i) => Box::new(
                d.rules[d.rule_start[i]..d.rule_start[i + 1]]
                    .iter()
                    .copied(),
            ),
            Object::Set(i) => Box::new(d.elements[d.element_range[i].clone()].iter().map(|e| e.2)),
        };
        let mut v = Vec::new();
        for l in lines.filter(|l| l.contains("jump ") || l.contains("goto ") || l.contains('@')) {
            for r in references(l) {
                v.extend(d.chain_at.get(r).map(|&c| Object::Chain(c)));
                v.extend(d.set_at.get(r).map(|&x| Object::Set(x)));
            }
        }
        v
    };
    // Per object (chains, then sets): 0 not yet seen, 1 on the stack, 2 written.
    let slot = |o: Object| match o {
        Object::Chain(i) => i,
        Object::Set(i) => d.chains.len() + i,
    };
    let mut state = vec![0u8; d.chains.len() + d.sets.len()];
    let mut order = Vec::with_capacity(state.len());
    let roots = (0..d.chains.len())
        .map(Object::Chain)
        .chain((0..d.sets.len()).map(Object::Set));
    // (object, its references not yet visited)
    let mut stack: Vec<(Object, Vec<Object>)> = Vec::new();
    for root in roots {
        let mut next = Some(root);
        loop {
            if let Some(o) = next.take() {
                match state[slot(o)] {
                    0 => {
                        state[slot(o)] = 1;
                        let mut r = refs(o);
                        r.reverse();
                        stack.push((o, r));
                    }
                    1 => return None,
                    _ => {}
                }
            }
            let Some((o, pending)) = stack.last_mut() else {
                break;
            };
            match pending.pop() {
                Some(r) => next = Some(r),
                None => {
                    state[slot(*o)] = 2;
                    order.push(*o);
                    stack.pop();
                }
            }
        }
    }
    Some(order)
}

/// The items of `nft -j` output (its `nftables` list); `None` for empty output (nothing
/// listed, e.g. no table). Read as [`normalize`] reads it.
pub(crate) fn nft_items(json: &str) -> Result<Option<Vec<Value>>, String> {
    let mut items = Vec::new();
    Ok(for_each_nft_item(json, |item| items.push(item))?.then_some(items))
}

/// Calls `each` with every item of `nft -j` output's `nftables` list as the parser reaches
/// it, so the listing is never one tree in memory (112 MB of JSON at 10k services, ten
/// times that as a tree). `false` for empty output (nothing listed, e.g. no table).
fn for_each_nft_item(json: &str, mut each: impl FnMut(Value)) -> Result<bool, String> {
    use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

    /// The top-level object: `nftables` visited item by item, anything else skipped.
    struct Top<'f, F>(&'f mut F);
    /// The `nftables` list.
    struct List<'f, F>(&'f mut F);

    impl<'de, F: FnMut(Value)> DeserializeSeed<'de> for Top<'_, F> {
        type Value = bool;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
            d.deserialize_map(self)
        }
    }
    impl<'de, F: FnMut(Value)> Visitor<'de> for Top<'_, F> {
        type Value = bool;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object with an `nftables` list")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
            let mut found = false;
            while let Some(key) = map.next_key::<String>()? {
                if key == "nftables" {
                    if found {
                        return Err(serde::de::Error::duplicate_field("nftables"));
                    }
                    map.next_value_seed(List(&mut *self.0))?;
                    found = true;
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(found)
        }
    }
    impl<'de, F: FnMut(Value)> DeserializeSeed<'de> for List<'_, F> {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_seq(self)
        }
    }
    impl<'de, F: FnMut(Value)> Visitor<'de> for List<'_, F> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("the `nftables` list")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            while let Some(item) = seq.next_element::<Value>()? {
                (self.0)(item);
            }
            Ok(())
        }
    }

    if json.trim().is_empty() {
        return Ok(false);
    }
    let mut de = serde_json::Deserializer::from_str(json);
    let found = Top(&mut each)
        .deserialize(&mut de)
        .and_then(|found| de.end().map(|()| found))
        .map_err(|e| format!("nft -j output: {e}"))?;
    if !found {
        return Err("nft -j output has no `nftables` list".into());
    }
    Ok(true)
}

/// `nft -j list table` output → canonical owned-state text (see the module docs). Empty
/// input (no table) gives empty text.
pub(super) fn normalize(json: &str) -> Result<String, String> {
    let mut tables = Vec::new();
    let mut objects: BTreeMap<(String, String), String> = BTreeMap::new();
    let mut rules: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let listed = for_each_nft_item(json, |item| {
        normalize_item(item, &mut tables, &mut objects, &mut rules)
    })?;
    if !listed {
        return Ok(String::new());
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

/// One item of a listing into its canonical line (see [`normalize`]).
fn normalize_item(
    item: Value,
    tables: &mut Vec<String>,
    objects: &mut BTreeMap<(String, String), String>,
    rules: &mut BTreeMap<String, Vec<String>>,
) {
    let Value::Object(item) = item else {
        return;
    };
    let Some((kind, mut body)) = item.into_iter().next() else {
        return;
    };
    let Some(obj) = body.as_object_mut() else {
        return;
    };
    obj.remove("handle");
    let name = obj
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    match kind.as_str() {
        "metainfo" => {}
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

/// The canonical owned-state text of an `nft -j list table` read (what plans expect and the
/// state directory keeps), for tools and tests that compare kernel states.
pub fn owned_state(kernel: &str) -> Result<String, String> {
    normalize(kernel)
}

/// Owned-state text without the stale chains `apply` leaves emptied (see the module
/// docs): chains that are not base chains, hold no rule, and that no rule or map element
/// jumps or goes to. They decide nothing, so states that differ only by them are the same
/// to traffic; `drift` and the kernel tests compare states this way.
pub fn without_leftovers(owned: &str) -> String {
    const TARGET: &str = "\"target\":\"";
    let mut used: HashSet<&str> = HashSet::new();
    for l in owned.lines() {
        if let Some(rest) = l.strip_prefix("rule ") {
            used.insert(rest.split(' ').next().unwrap_or(""));
        }
        for (at, _) in l.match_indices(TARGET) {
            let rest = &l[at + TARGET.len()..];
            used.insert(&rest[..rest.find('"').unwrap_or(rest.len())]);
        }
    }
    let mut out = String::with_capacity(owned.len());
    for l in owned.lines() {
        let mut w = l.splitn(3, ' ');
        let leftover = match (w.next(), w.next(), w.next()) {
            (Some("chain"), Some(name), Some(body)) => {
                !used.contains(name) && !body.contains("\"hook\"")
            }
            _ => false,
        };
        if !leftover {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

/// Owned state of a kernel read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Owner;

impl Owned for Owner {
    fn owned(&self, kernel: &str) -> Result<String, String> {
        normalize(kernel)
    }
}

/// [`Planner::removal`]: the table `kube-proxy` of the family is all we own, whoever wrote
/// it (kube-proxy's `--cleanup` deletes it the same way); no record is needed.
fn removal(family: Family, kernel: &str, _recorded: &Recorded) -> Result<Removal, String> {
    let there = !normalize(kernel)?.is_empty();
    let table = format!("table {} {TABLE}", nft_family(family));
    Ok(Removal {
        load: there.then(|| format!("delete {table}\n")),
        expected: String::new(),
        summary: match there {
            true => table,
            false => "nothing".into(),
        },
        warnings: Vec::new(),
        owner: Arc::new(Owner),
    })
}

/// Step one's nftables part.
#[derive(Clone, Debug)]
pub(super) struct Prep {
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
    /// Stale chains emptied and left in place (see [`DELETE_STALE_AT`]).
    emptied: Vec<String>,
    /// Changed sets whose scratch copy holds only the elements added, with the elements
    /// that go in a set of their own ([`gone_set`]): see [`scratch_document`].
    partial_sets: Vec<String>,
    /// Chains someone else deleted ([`Planner::prepare_repair`]).
    gone: Vec<String>,
    /// Existing sets whose elements change by `delete element` and `add` only.
    element_writes: Vec<ElementWrites>,
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

    fn removal(&self) -> Option<RemovalPlanner> {
        Some(removal)
    }

    /// The family of a compiled document (its `add table` line).
    /// `--nft-layout fast` declares the hairpin set; kube-proxy's layout does not.
    fn layout_of(&self, doc: &str) -> Option<(&'static str, &'static str)> {
        let fast = doc.lines().any(|l| {
            let mut w = l.split_whitespace();
            matches!(
                (w.next(), w.next(), w.next(), w.next(), w.next()),
                (
                    Some("add"),
                    Some("set"),
                    Some(_),
                    Some(TABLE),
                    Some(HAIRPIN_ENDPOINTS)
                )
            )
        });
        Some(("--nft-layout", if fast { "fast" } else { "kube-proxy" }))
    }

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

    fn prepare_repair(
        &self,
        new_doc: &str,
        family: Family,
        previous: Previous,
        drift: &Drift,
    ) -> Option<Result<Prepared, String>> {
        repair(new_doc, family, previous, drift)
    }

    /// Everything owned is the table `kube-proxy` of the family.
    fn fingerprint(&self, family: Family) -> Option<(u8, &'static str)> {
        // NFPROTO_IPV4, NFPROTO_IPV6
        Some((if family == Family::V6 { 10 } else { 2 }, TABLE))
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
    // The recorded document is parsed beside the new one (30 MB each at 10k services, a
    // tenth of a second apiece); a full load then has no use for it.
    let (new, old) = rayon::join(
        || parse(new_doc),
        || previous.filter(|_| !force_full).map(|p| parse(p.document)),
    );
    let new = of_family(new, family)?;
    let mut summary = Summary {
        rewritten: new.chains.len(),
        deleted: 0,
        jumps: 0,
        elements: new.elements.len(),
        ..Summary::default()
    };
    let mut delta = None;
    let mut delta_scratch = String::new();
    let mode = match previous {
        _ if force_full => Mode::Full("asked for with --full".into()),
        None => Mode::Full("no previous apply recorded".into()),
        Some(p) => {
            // Without a read the kernel is known to show the snapshot: nothing to compare.
            // How the kernel differs, if it does.
            let drift = match kernel {
                None => None,
                // An unread snapshot cannot be compared with a read: the CLI read the
                // node because its fingerprint differs from the record's (or could not
                // be taken).
                Some(_) if is_unread(p.snapshot) => Some(" (by its fingerprint)".to_string()),
                Some(k) => Some(normalize(k)?)
                    .filter(|now| now != p.snapshot)
                    .map(|now| format!(": {}", Plan::first_difference(p.snapshot, &now))),
            };
            if let Some(how) = drift {
                Mode::Full(format!(
                    "the kernel differs from what the last apply left{how}"
                ))
            } else {
                match old.unwrap_or_else(|| parse(p.document)) {
                    Err(_) => Mode::Full("the recorded document cannot be read".into()),
                    Ok(old) => match diff(&old, &new, &leftover_chains(p.snapshot, &old)) {
                        Err(why) => Mode::Full(why),
                        Ok((mut d, s)) => {
                            d.snapshot = p.snapshot.to_string();
                            delta_scratch = scratch_document(&old, &new, &mut d);
                            delta = Some(d);
                            summary = s;
                            Mode::Incremental
                        }
                    },
                }
            }
        }
    };
    // Only a full plan loads (and checks) the whole document: then the scratch document
    // is the load (one copy of it, 58 MB at 10k services).
    let scratch = match &delta {
        Some(_) => delta_scratch,
        None => full_document(&new, new_doc.len()),
    };
    // Our table is all a read shows: an empty read is a node without it.
    let direct = delta.is_none() && kernel.is_some_and(|k| k.trim().is_empty());
    Ok(Prepared {
        mode,
        scratch,
        family,
        direct,
        step: Arc::new(Prep { delta, summary }),
    })
}

/// The new document as parsed, for `family` only.
fn of_family(new: Result<Doc<'_>, String>, family: Family) -> Result<Doc<'_>, String> {
    let new = new.map_err(|e| format!("the document: {e}"))?;
    if new.family != nft_family(family) {
        return Err(format!(
            "the document is for family {}, not {}",
            new.family,
            nft_family(family)
        ));
    }
    Ok(new)
}

/// [`Planner::prepare_repair`]: the incremental plan from an unread record that also puts
/// back what `drift` names; `None` when the record cannot be read or the drift is not one
/// that rewriting objects mends ([`diff_repairing`]).
fn repair(
    new_doc: &str,
    family: Family,
    p: Previous,
    drift: &Drift,
) -> Option<Result<Prepared, String>> {
    if !is_unread(p.snapshot) {
        return None;
    }
    let (new, old) = rayon::join(|| parse(new_doc), || parse(p.document));
    let new = match of_family(new, family) {
        Ok(new) => new,
        Err(e) => return Some(Err(e)),
    };
    let old = old.ok()?;
    let (mut d, summary) =
        diff_repairing(&old, &new, &leftover_chains(p.snapshot, &old), drift).ok()?;
    d.snapshot = p.snapshot.to_string();
    let scratch = scratch_document(&old, &new, &mut d);
    Some(Ok(Prepared {
        mode: Mode::Incremental,
        scratch,
        family,
        direct: false,
        step: Arc::new(Prep {
            delta: Some(d),
            summary,
        }),
    }))
}

/// Stale chains (see the module docs) are deleted once this many wait, or with anything
/// else that makes the transaction delete.
const DELETE_STALE_AT: usize = 1000;

/// Chains a snapshot shows that `old` does not declare: stale chains an earlier apply
/// emptied and left for later. A snapshot lists its chains right after the table, before
/// any rule (canonical order), so the scan stops at the first rule.
fn leftover_chains<'s>(snapshot: &'s str, old: &Doc) -> Vec<&'s str> {
    let mut out = Vec::new();
    for l in snapshot.lines() {
        let mut w = l.splitn(3, ' ');
        match (w.next(), w.next()) {
            (Some("rule"), _) => break,
            (Some("chain"), Some(name)) if !old.chain_at.contains_key(name) => out.push(name),
            _ => {}
        }
    }
    out
}

/// The words after `verb kind family table name` of a statement: a rule's body, an
/// element's `{ … }`.
fn tail(line: &str) -> &str {
    line.splitn(6, ' ').nth(5).unwrap_or("")
}

/// `add set|map … { spec }` with `elements` added to its block, and a newline, at the end
/// of `out`: how nft adds elements without a listing of every chain (`add element` needs
/// one). `false`, with `out` as it was, for a definition without a block or an element
/// svc-compile does not write.
fn push_with_elements(out: &mut String, def: &str, elements: &[Element]) -> bool {
    let Some(open) = def.strip_suffix('}') else {
        return false;
    };
    let mark = out.len();
    out.push_str(open);
    out.push_str("elements = { ");
    for (i, e) in elements.iter().enumerate() {
        let Some(inner) = tail(e.2)
            .strip_prefix("{ ")
            .and_then(|x| x.strip_suffix(" }"))
        else {
            out.truncate(mark);
            return false;
        };
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(inner);
    }
    out.push_str(" } }\n");
    true
}

/// [`push_with_elements`] where it can, else the elements' own `add element` lines (not
/// a definition svc-compile writes; still right, only slower). The set is declared before.
fn push_elements(out: &mut String, def: &str, elements: &[Element]) {
    if !push_with_elements(out, def, elements) {
        for e in elements {
            out.push_str(e.2);
            out.push('\n');
        }
    }
}

/// `add chain … { rules }`, and a newline, at the end of `out`: a chain's rules in its own
/// statement, how nft fills a chain without a listing of every chain (`add rule` needs one).
fn push_with_rules(out: &mut String, def: &str, rules: &[&str]) {
    match def.strip_suffix('}') {
        Some(open) => out.push_str(open),
        None => {
            out.push_str(def);
            out.push_str(" {");
        }
    }
    for r in rules {
        out.push_str("\n\t");
        out.push_str(tail(r));
    }
    out.push_str("\n}\n");
}

/// The data types of a set's key: `add map … { type A . B : verdict ; … }` → `[A, B]`.
fn key_type(def: &str) -> Option<Vec<String>> {
    let (_, rest) = def.split_once("{ type ")?;
    let (spec, _) = rest.split_once(" ;")?;
    let key = spec.split(" : ").next()?;
    Some(key.split(" . ").map(str::to_string).collect())
}

/// Whether a set's lost elements can go by `delete element` (a set without flags);
/// intervals and timeouts are refilled whole.
fn deletable(def: &str) -> bool {
    !def.contains(" flags ")
}

/// What a set's elements change from `before` to `now` (each sorted by key): the lines
/// that go (gone, or replaced by another line for their key) and the elements that come.
fn element_changes<'a>(
    before: &[Element<'a>],
    now: &[Element<'a>],
) -> (Vec<&'a str>, Vec<Element<'a>>) {
    // One walk over both (a set of 100k elements: a few ms, against ~40 for a binary
    // search of each element in the other list).
    let (mut gone, mut added) = (Vec::new(), Vec::new());
    let (mut b, mut n) = (before.iter().peekable(), now.iter().peekable());
    loop {
        match (b.peek(), n.peek()) {
            (Some(x), Some(y)) => match x.1.cmp(y.1) {
                std::cmp::Ordering::Less => gone.push(b.next().unwrap().2),
                std::cmp::Ordering::Greater => added.push(*n.next().unwrap()),
                std::cmp::Ordering::Equal => {
                    let (x, y) = (b.next().unwrap(), n.next().unwrap());
                    if x.2 != y.2 {
                        gone.push(x.2);
                        added.push(*y);
                    }
                }
            },
            (Some(_), None) => gone.push(b.next().unwrap().2),
            (None, Some(_)) => added.push(*n.next().unwrap()),
            (None, None) => return (gone, added),
        }
    }
}

/// `set` or `map`: the kind an `add set|map …` definition declares.
fn set_kind(def: &str) -> &str {
    def.split(' ').nth(1).unwrap_or("set")
}

/// The incremental transaction from `old` to `new` (see the module docs), or why there
/// cannot be one. `leftover` are the emptied stale chains the kernel still has.
fn diff(old: &Doc, new: &Doc, leftover: &[&str]) -> Result<(Delta, Summary), String> {
    diff_repairing(old, new, leftover, &Drift::default())
}

/// [`diff`] on a kernel that shows `old` but for the objects `drift` names (someone else
/// changed their rules or elements, added them, or deleted them): those are written whole
/// as `new` has them, or flushed and deleted when `new` has no such object. Refused: an
/// object someone added under a name `new` declares, and anonymous objects that changed
/// apart from a chain (see below).
fn diff_repairing(
    old: &Doc,
    new: &Doc,
    leftover: &[&str],
    drift: &Drift,
) -> Result<(Delta, Summary), String> {
    if old.family != new.family || old.table != new.table {
        return Err("the table definition changed".into());
    }
    for (kind, o, o_at, n) in [
        ("chain", &old.chains, &old.chain_at, &new.chains),
        ("set", &old.sets, &old.set_at, &new.sets),
    ] {
        // The first in name order, as the message has always named it.
        if let Some(name) = n
            .iter()
            .filter(|(name, def)| o_at.get(name).is_some_and(|&i| o[i].1 != *def))
            .map(|(name, _)| *name)
            .min()
        {
            return Err(format!("the definition of {kind} {name} changed"));
        }
    }
    // Anonymous objects (`__set0`, `__chain0`) belong to a rule: they go and come with their
    // chain's rules, and are never written or deleted by name.
    let anonymous = |x: &&String| x.starts_with("__");
    let named = |lists: &[&Vec<String>]| -> HashSet<String> {
        lists
            .iter()
            .flat_map(|l| l.iter())
            .filter(|x| !anonymous(x))
            .cloned()
            .collect()
    };
    // Present now, not as recorded: changed, or added by someone else.
    let changed_chains = named(&[&drift.changed.chains, &drift.added.chains]);
    let changed_sets = named(&[&drift.changed.sets, &drift.added.sets]);
    let (gone_chains, gone_sets) = (named(&[&drift.gone.chains]), named(&[&drift.gone.sets]));
    // Someone else's object under a name the new document declares would keep their
    // attributes (`add` leaves an existing object's hook, policy or flags as they are).
    if let Some(x) = drift
        .added
        .chains
        .iter()
        .find(|c| new.chain_at.contains_key(c.as_str()))
        .or_else(|| {
            drift
                .added
                .sets
                .iter()
                .find(|x| new.set_at.contains_key(x.as_str()))
        })
    {
        return Err(format!(
            "someone else added {x}, which the document declares"
        ));
    }
    if drift.changed.sets.iter().any(|x| anonymous(&x)) {
        return Err("an anonymous set changed".into());
    }
    let anonymous_only = [&drift.added, &drift.gone]
        .iter()
        .flat_map(|t| t.chains.iter().chain(&t.sets))
        .any(|x| anonymous(&x))
        && changed_chains.is_empty()
        && gone_chains.is_empty();
    if anonymous_only {
        return Err("an anonymous object changed without its chain".into());
    }
    let drifted_chain = |c: &str| changed_chains.contains(c) || gone_chains.contains(c);
    let drifted_set = |x: &str| changed_sets.contains(x) || gone_sets.contains(x);
    let (f, t) = (new.family, TABLE);
    let mut d = Delta::default();
    let mut s = Summary::default();
    let mut out = String::new();
    let line = |out: &mut String, l: &str| {
        out.push_str(l);
        out.push('\n');
    };
    // Chains whose rules change: refilled (flushed first if they have rules) or new.
    let rewrite: Vec<&str> = new
        .chains
        .iter()
        .map(|(c, _)| *c)
        .filter(|c| {
            !old.chain_at.contains_key(c) || old.rules(c) != new.rules(c) || drifted_chain(c)
        })
        .collect();
    // Objects first: everything after may refer to them. New chains (a leftover one is
    // there, empty: `add` leaves it as it is), new sets, and the existing sets the
    // rewritten rules name, declared again (a no-op), which spares nft the listing. A
    // deleted one of ours is new again.
    for (_, def) in new
        .chains
        .iter()
        .filter(|(c, _)| !old.chain_at.contains_key(c) || gone_chains.contains(*c))
    {
        line(&mut out, def);
    }
    let mut declared: HashSet<&str> = HashSet::new();
    for (x, def) in new
        .sets
        .iter()
        .filter(|(x, _)| !old.set_at.contains_key(x) || drifted_set(x))
    {
        line(&mut out, def);
        declared.insert(x);
        // In the expectation even without elements (an affinity set, an empty one).
        d.sets.push(x.to_string());
    }
    for r in rewrite.iter().flat_map(|c| new.rules(c)) {
        for x in references(r) {
            if let Some(&i) = new.set_at.get(x) {
                if declared.insert(new.sets[i].0) {
                    line(&mut out, new.sets[i].1);
                }
            }
        }
    }
    // What is no longer wanted (written last, below), found first: whether this
    // transaction deletes anyway decides how sets lose elements. What someone else
    // deleted is not there to delete; what someone else added to our table goes now (an
    // emptied base chain would still apply its policy).
    let stale: Vec<&str> = old
        .chains
        .iter()
        .map(|(c, _)| *c)
        .filter(|c| !new.chain_at.contains_key(c) && !gone_chains.contains(*c))
        .collect();
    let stale_sets: Vec<(&str, &str)> = old
        .sets
        .iter()
        .filter(|(x, _)| !new.set_at.contains_key(x) && !gone_sets.contains(*x))
        .map(|&(x, def)| (x, set_kind(def)))
        .chain(
            drift
                .added
                .sets
                .iter()
                .filter(|x| changed_sets.contains(*x))
                .map(|x| (x.as_str(), "set")),
        )
        .collect();
    let waiting: Vec<&str> = leftover
        .iter()
        .copied()
        .filter(|c| !new.chain_at.contains_key(c) && !gone_chains.contains(*c))
        .collect();
    let foreign: Vec<&str> = drift
        .added
        .chains
        .iter()
        .filter(|c| changed_chains.contains(*c))
        .map(String::as_str)
        .collect();
    let delete_stale = !stale_sets.is_empty()
        || !foreign.is_empty()
        || stale
            .iter()
            .chain(&waiting)
            .any(|c| changed_chains.contains(*c))
        || stale.len() + waiting.len() >= DELETE_STALE_AT;
    // Elements. A set that loses or changes any is flushed and refilled whole, unless
    // deleting is cheaper: nft lists every chain of the table once for a transaction with
    // any `delete` (~15 µs a chain: 1.75 s at 112k chains), and a refill costs ~7–11 µs
    // an element (0.11 s for 10k, 0.7 s for 100k). So the lost elements are deleted when
    // the transaction deletes anyway or the refills would write more elements than the
    // kernel has chains of ours (the fast layout's hairpin set: 100k elements, 17k chains).
    // Sets with flags (intervals, timeouts) are always refilled. New elements go in the
    // set's own statement either way. A set someone else changed is refilled whole.
    let changed: Vec<(&str, &str, Vec<&str>, Vec<Element>)> = new
        .sets
        .iter()
        .filter(|(set, _)| !drifted_set(set))
        .filter_map(|&(set, def)| {
            let (gone, added) = element_changes(old.elements(set), new.elements(set));
            (!gone.is_empty() || !added.is_empty()).then_some((set, def, gone, added))
        })
        .collect();
    let refill: usize = changed
        .iter()
        .filter(|(_, def, gone, _)| !gone.is_empty() && deletable(def))
        .map(|(set, ..)| new.elements(set).len())
        .sum();
    let by_delete = delete_stale || refill > old.chains.len() + leftover.len();
    for (set, def, gone, added) in &changed {
        let kind = set_kind(def);
        // Keys deleted, when the set is only written element by element.
        let mut deleted: Option<Vec<&str>> = None;
        let load: &[Element] = match (gone.is_empty(), by_delete && deletable(def)) {
            (true, _) => {
                deleted = Some(Vec::new());
                added
            }
            (false, true) => {
                let keys: Option<Vec<&str>> = gone.iter().map(|l| element_key(tail(l))).collect();
                match keys {
                    Some(keys) => {
                        let _ = writeln!(
                            out,
                            "delete element {f} {t} {set} {{ {} }}",
                            keys.join(", ")
                        );
                        deleted = Some(keys);
                        added
                    }
                    // An element svc-compile does not write: refilled, still right.
                    None => {
                        let _ = writeln!(out, "flush {kind} {f} {t} {set}");
                        new.elements(set)
                    }
                }
            }
            (false, false) => {
                let _ = writeln!(out, "flush {kind} {f} {t} {set}");
                new.elements(set)
            }
        };
        if !load.is_empty() {
            push_elements(&mut out, def, load);
        }
        s.elements += gone.len() + added.len();
        if old.set_at.contains_key(set) {
            d.sets.push(set.to_string());
            if let (Some(gone), Some(key_type), true) = (deleted, key_type(def), deletable(def)) {
                d.element_writes.push(ElementWrites {
                    set: set.to_string(),
                    key_type,
                    gone: gone.iter().map(|k| k.to_string()).collect(),
                    added: added.iter().map(|e| e.1.to_string()).collect(),
                });
            }
        }
    }
    // Sets someone else changed or deleted: declared above, emptied, and refilled whole.
    for &(set, def) in new.sets.iter().filter(|(x, _)| drifted_set(x)) {
        if changed_sets.contains(set) {
            let _ = writeln!(out, "flush {} {f} {t} {set}", set_kind(def));
        }
        let load = new.elements(set);
        if !load.is_empty() {
            push_elements(&mut out, def, load);
        }
        s.elements += load.len();
        s.repaired += 1;
    }
    for c in &rewrite {
        let flush =
            (old.chain_at.contains_key(c) && !old.rules(c).is_empty() && !gone_chains.contains(*c))
                || changed_chains.contains(*c);
        if flush {
            let _ = writeln!(out, "flush chain {f} {t} {c}");
        }
        let rules = new.rules(c);
        if !rules.is_empty() {
            push_with_rules(&mut out, new.chains[new.chain_at[c]].1, rules);
        }
        d.chains.push(c.to_string());
        s.rewritten += 1;
        if drifted_chain(c) {
            s.repaired += 1;
        }
    }
    // Then what is no longer wanted. Stale chains are emptied now; deleting them waits
    // until enough have gathered or the transaction deletes anyway. When they go, every
    // one is flushed before any is deleted (they may jump to each other). Stale sets go
    // after the flushes (stale chains' rules may use them) and before the chains (a
    // stale map's elements may go to them: nft refuses deleting a chain still in use).
    for c in &stale {
        if !old.rules(c).is_empty() || changed_chains.contains(*c) {
            let _ = writeln!(out, "flush chain {f} {t} {c}");
        }
    }
    for c in waiting
        .iter()
        .chain(&foreign)
        .filter(|c| changed_chains.contains(**c))
    {
        let _ = writeln!(out, "flush chain {f} {t} {c}");
    }
    for (x, kind) in stale_sets {
        let _ = writeln!(out, "delete {kind} {f} {t} {x}");
        d.stale_sets.push(x.to_string());
        s.deleted += 1;
        if drifted_set(x) {
            s.repaired += 1;
        }
    }
    if delete_stale {
        for c in stale.iter().chain(&waiting).chain(&foreign) {
            let _ = writeln!(out, "delete chain {f} {t} {c}");
            d.stale_chains.push(c.to_string());
            s.deleted += 1;
            if changed_chains.contains(*c) {
                s.repaired += 1;
            }
        }
    } else {
        s.emptied = stale.len();
        d.emptied = stale.iter().map(|c| c.to_string()).collect();
    }
    // Gone stale chains (someone deleted an emptied chain of ours) and sets: no longer
    // in the node, nothing to write.
    s.repaired += gone_chains
        .iter()
        .filter(|c| !new.chain_at.contains_key(c.as_str()))
        .count()
        + gone_sets
            .iter()
            .filter(|x| !new.set_at.contains_key(x.as_str()))
            .count();
    d.gone = gone_chains.into_iter().collect();
    d.gone.sort_unstable();
    d.text = out;
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

/// The name of the set that holds, in the scratch namespace, the elements set `x` loses.
fn gone_set(x: &str) -> String {
    format!("svc-compile-gone.{x}")
}

/// What an incremental plan changes, with every object it refers to, for an empty
/// namespace. Empty when nothing changes.
///
/// A set that exists and changes is not copied whole (10k elements cost the scratch
/// namespace ~0.8 s): it gets only the elements added or changed, and the ones it loses go,
/// old version, into [`gone_set`]; step two learns the kernel's spelling of both and edits
/// the snapshot's set line ([`merge`]). Sets with flags (intervals, which the kernel may
/// merge, or dynamic sets) are copied whole.
fn scratch_document(old: &Doc, new: &Doc, d: &mut Delta) -> String {
    if d.chains.is_empty() && d.sets.is_empty() {
        return String::new();
    }
    let (f, t) = (new.family, TABLE);
    let mut lines: Vec<&str> = Vec::new();
    // Statements written here (the gone sets and their elements).
    let mut own: Vec<String> = Vec::new();
    let mut chains: HashSet<&str> = d.chains.iter().map(String::as_str).collect();
    let mut sets: HashSet<&str> = d.sets.iter().map(String::as_str).collect();
    let mut old_chains: HashSet<&str> = HashSet::new();
    for c in &d.chains {
        lines.extend(new.rules(c));
    }
    for x in &d.sets {
        let def = new.set_at.get(x.as_str()).map(|&i| new.sets[i].1);
        let partial = old.set_at.contains_key(x.as_str())
            && !new.set_at.contains_key(gone_set(x).as_str())
            && def.is_some_and(deletable);
        if !partial {
            lines.extend(new.elements(x).iter().map(|e| e.2));
            continue;
        }
        let (gone, added) = element_changes(old.elements(x), new.elements(x));
        lines.extend(added.iter().map(|e| e.2));
        if !gone.is_empty() {
            let def = def.unwrap_or_default();
            own.push(format!(
                "add {} {f} {t} {} {}",
                set_kind(def),
                gone_set(x),
                tail(def)
            ));
            for l in gone {
                own.push(format!("add element {f} {t} {} {}", gone_set(x), tail(l)));
                for r in references(l) {
                    if new.chain_at.contains_key(r) {
                        chains.insert(r);
                    } else if old.chain_at.contains_key(r) {
                        old_chains.insert(r);
                    }
                }
            }
        }
        d.partial_sets.push(x.clone());
    }
    for l in &lines {
        for r in references(l) {
            if new.chain_at.contains_key(r) {
                chains.insert(r);
            } else if new.set_at.contains_key(r) {
                sets.insert(r);
            }
        }
    }
    let mut out = format!("{}\n", new.table);
    for (_, def) in new.chains.iter().filter(|(c, _)| chains.contains(c)) {
        let _ = writeln!(out, "{def}");
    }
    for (_, def) in old
        .chains
        .iter()
        .filter(|(c, _)| old_chains.contains(c) && !chains.contains(c))
    {
        let _ = writeln!(out, "{def}");
    }
    for (_, def) in new.sets.iter().filter(|(x, _)| sets.contains(x)) {
        let _ = writeln!(out, "{def}");
    }
    for l in lines {
        let _ = writeln!(out, "{l}");
    }
    for l in own {
        let _ = writeln!(out, "{l}");
    }
    out
}

/// A partial set's line in the expected state (see [`scratch_document`]): the snapshot's
/// line with the gone set's elements taken out and the scratch's added, sorted as
/// [`normalize`] sorts them. `None` if the snapshot or the scratch does not show the set.
fn merged_set(
    snapshot: &str,
    kind: &str,
    name: &str,
    scratch: &str,
    gone: Option<&str>,
) -> Option<String> {
    let body =
        |line: &str| -> Option<Value> { serde_json::from_str(line.splitn(3, ' ').nth(2)?).ok() };
    let prefix = format!("{kind} {name} ");
    let before = snapshot
        .lines()
        .take_while(|l| !l.starts_with("rule "))
        .find(|l| l.starts_with(&prefix))?;
    let mut base = body(before)?;
    let added = body(scratch)?;
    let elems = |v: &Value| -> Vec<Value> {
        v.get("elem")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let gone: HashSet<String> = match gone {
        Some(g) => elems(&body(g)?).iter().map(Value::to_string).collect(),
        None => HashSet::new(),
    };
    let mut all: Vec<(String, Value)> = elems(&base)
        .into_iter()
        .chain(elems(&added))
        .map(|e| (e.to_string(), e))
        .filter(|(k, _)| !gone.contains(k))
        .collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    all.dedup_by(|a, b| a.0 == b.0);
    // Where nft puts a key depends on whether the set has elements (`elem` comes before
    // `comment` and `map`; without elements `map` comes before `comment`), so the line is
    // one the kernel printed with elements or, for none, the scratch's without.
    if all.is_empty() {
        return added
            .get("elem")
            .is_none()
            .then(|| format!("{kind} {name} {added}"));
    }
    if added.get("elem").is_some() {
        base = added;
    }
    let list = Value::Array(all.into_iter().map(|(_, e)| e).collect());
    *base.get_mut("elem")? = list;
    Some(format!("{kind} {name} {base}"))
}

/// Normalised text (see [`normalize`]) by object, borrowing its lines: `table` lines;
/// ((kind, name), line) sorted by kind and name, one per name (the last); (chain, rule
/// line) sorted by chain, each chain's rules in order.
type Objects<'a> = (
    Vec<&'a str>,
    Vec<((&'a str, &'a str), &'a str)>,
    Vec<(&'a str, &'a str)>,
);

fn split_normalized(text: &str) -> Objects<'_> {
    let mut o: Objects = Default::default();
    for line in text.lines() {
        let mut w = line.splitn(3, ' ');
        let (kind, name) = (w.next().unwrap_or(""), w.next().unwrap_or(""));
        match kind {
            "table" => o.0.push(line),
            "rule" => o.2.push((name, line)),
            _ => o.1.push(((kind, name), line)),
        }
    }
    // Stable sorts, linear on a snapshot (already in this order).
    o.1.sort_by(|a, b| a.0.cmp(&b.0));
    o.1.dedup_by(|later, kept| {
        let same = later.0 == kept.0;
        if same {
            kept.1 = later.1;
        }
        same
    });
    o.2.sort_by(|a, b| a.0.cmp(b.0));
    o
}

/// The expected state after an incremental load: the snapshot with the changed objects
/// as the scratch namespace shows them and the stale ones gone.
fn merge(d: &Delta, scratch: &str) -> Result<String, String> {
    let (_, s_objects, s_rules) = split_normalized(scratch);
    fn names(v: &[String]) -> HashSet<&str> {
        v.iter().map(String::as_str).collect()
    }
    let (chains, sets) = (names(&d.chains), names(&d.sets));
    let (stale_chains, stale_sets) = (names(&d.stale_chains), names(&d.stale_sets));
    let emptied = names(&d.emptied);
    let is_set = |k: &str| matches!(k, "set" | "map");
    // Sorted by kind and name, and by chain: split_normalized's order.
    let mut changed: Vec<_> = s_objects
        .iter()
        .copied()
        .filter(|((k, n), _)| {
            let changed = if *k == "chain" { &chains } else { &sets };
            changed.contains(n) && (*k == "chain" || is_set(k))
        })
        .collect();
    // Partial sets: the snapshot's line edited by what the scratch shows.
    let partial: Vec<(usize, String)> = changed
        .iter()
        .enumerate()
        .filter(|(_, ((k, n), _))| is_set(k) && d.partial_sets.iter().any(|p| p == n))
        .map(|(i, &((k, n), line))| {
            let gone_name = gone_set(n);
            let gone = s_objects
                .iter()
                .find(|((gk, gn), _)| is_set(gk) && *gn == gone_name)
                .map(|o| o.1);
            merged_set(&d.snapshot, k, n, line, gone)
                .map(|l| (i, l))
                .ok_or_else(|| {
                    format!("the snapshot or the scratch namespace does not show {k} {n}")
                })
        })
        .collect::<Result<_, String>>()?;
    if partial.len() != d.partial_sets.len() {
        return Err("the scratch namespace does not show every changed set".into());
    }
    for (i, l) in &partial {
        changed[*i].1 = l;
    }
    let new_rules: Vec<_> = s_rules
        .into_iter()
        .filter(|(c, _)| chains.contains(c))
        .collect();
    let m = Merge {
        changed: &changed,
        new_rules: &new_rules,
        replaced: changed.iter().map(|o| o.0).collect(),
        stale_chains,
        stale_sets,
        emptied,
        rewritten: chains,
    };
    // A snapshot is in canonical order (normalize and merge write it so): one pass.
    Ok(m.in_order(&d.snapshot)
        .unwrap_or_else(|| m.sorted(&d.snapshot)))
}

/// What [`merge`] puts in and takes out.
struct Merge<'a> {
    /// Objects as the scratch namespace shows them, sorted by (kind, name).
    changed: &'a [((&'a str, &'a str), &'a str)],
    /// The rules of rewritten chains, sorted by chain.
    new_rules: &'a [(&'a str, &'a str)],
    replaced: HashSet<(&'a str, &'a str)>,
    stale_chains: HashSet<&'a str>,
    stale_sets: HashSet<&'a str>,
    /// Stale chains kept, without their rules.
    emptied: HashSet<&'a str>,
    rewritten: HashSet<&'a str>,
}

impl<'a> Merge<'a> {
    fn keeps_object(&self, key @ (k, n): (&str, &str)) -> bool {
        let stale = if k == "chain" {
            &self.stale_chains
        } else {
            &self.stale_sets
        };
        !stale.contains(n) && !self.replaced.contains(&key)
    }

    fn keeps_rules(&self, chain: &str) -> bool {
        !self.stale_chains.contains(chain)
            && !self.emptied.contains(chain)
            && !self.rewritten.contains(chain)
    }

    /// One pass over a snapshot in canonical order (tables, objects by kind and name,
    /// rules by chain); `None` if it is not.
    fn in_order(&self, snapshot: &str) -> Option<String> {
        let mut out = String::with_capacity(snapshot.len() + 4096);
        let line = |out: &mut String, l: &str| {
            out.push_str(l);
            out.push('\n');
        };
        let (mut objects, mut rules) = (self.changed.iter().peekable(), self.new_rules.iter());
        let mut next_rule = rules.next();
        // 0: tables, 1: objects, 2: rules.
        let mut section = 0;
        let mut last_object: Option<(&str, &str)> = None;
        let mut last_chain: Option<&str> = None;
        for l in snapshot.lines() {
            let mut w = l.splitn(3, ' ');
            let (kind, name) = (w.next().unwrap_or(""), w.next().unwrap_or(""));
            match kind {
                "table" if section == 0 => line(&mut out, l),
                "table" => return None,
                "rule" => {
                    if section < 2 {
                        objects.by_ref().for_each(|o| line(&mut out, o.1));
                        section = 2;
                    }
                    if last_chain.is_some_and(|c| c > name) {
                        return None;
                    }
                    last_chain = Some(name);
                    while let Some(r) = next_rule.filter(|r| r.0 < name) {
                        line(&mut out, r.1);
                        next_rule = rules.next();
                    }
                    if self.keeps_rules(name) {
                        line(&mut out, l);
                    }
                }
                _ if section == 2 => return None,
                _ => {
                    section = 1;
                    let key = (kind, name);
                    if last_object.is_some_and(|o| o >= key) {
                        return None;
                    }
                    last_object = Some(key);
                    while let Some(o) = objects.next_if(|o| o.0 <= key) {
                        line(&mut out, o.1);
                    }
                    if self.keeps_object(key) {
                        line(&mut out, l);
                    }
                }
            }
        }
        objects.for_each(|o| line(&mut out, o.1));
        while let Some(r) = next_rule {
            line(&mut out, r.1);
            next_rule = rules.next();
        }
        Some(out)
    }

    /// Any snapshot: by object, sorted.
    fn sorted(&self, snapshot: &str) -> String {
        let (table, objects, rules) = split_normalized(snapshot);
        let mut objects: Vec<_> = objects
            .into_iter()
            .filter(|o| self.keeps_object(o.0))
            .chain(self.changed.iter().copied())
            .collect();
        objects.sort_by(|a, b| a.0.cmp(&b.0));
        let mut rules: Vec<_> = rules
            .into_iter()
            .filter(|(c, _)| self.keeps_rules(c))
            .chain(self.new_rules.iter().copied())
            .collect();
        rules.sort_by(|a, b| a.0.cmp(b.0));
        let mut out = String::with_capacity(snapshot.len() + 4096);
        for l in table
            .iter()
            .chain(objects.iter().map(|o| &o.1))
            .chain(rules.iter().map(|r| &r.1))
        {
            out.push_str(l);
            out.push('\n');
        }
        out
    }
}

impl Step for Prep {
    fn plan(&self, prepared: &Prepared, scratch_output: &str) -> Result<Plan, String> {
        plan(prepared, self, scratch_output)
    }

    /// A full load needs no read to be planned: the expectation is [`UNREAD`].
    fn unread_plan(&self, prepared: &Prepared) -> Option<Plan> {
        if self.delta.is_some() || prepared.scratch.is_empty() {
            return None;
        }
        Some(Plan {
            mode: prepared.mode.clone(),
            load: Some(prepared.scratch.clone()),
            expected: format!("{UNREAD}\n"),
            summary: self.summary.clone(),
            warnings: Vec::new(),
            touched: None,
            owner: Arc::new(Owner),
        })
    }
}

/// The [`UNREAD`] snapshot after an incremental load from an unread one: the stale chains
/// the node holds are those it held, less the ones deleted or declared again, plus the
/// ones emptied now.
fn unread_after(d: &Delta) -> String {
    let gone: HashSet<&str> = d
        .stale_chains
        .iter()
        .chain(&d.chains)
        .chain(&d.gone)
        .map(String::as_str)
        .collect();
    let mut stale: Vec<&str> = d
        .snapshot
        .lines()
        .filter_map(|l| l.strip_prefix("chain "))
        .filter(|c| !gone.contains(c))
        .chain(d.emptied.iter().map(String::as_str))
        .collect();
    stale.sort_unstable();
    stale.dedup();
    let mut out = format!("{UNREAD}\n");
    for c in stale {
        let _ = writeln!(out, "chain {c}");
    }
    out
}

/// Step two (see the module docs of [`super`]).
fn plan(prepared: &Prepared, p: &Prep, scratch_output: &str) -> Result<Plan, String> {
    let scratch = normalize(scratch_output)?;
    let (mode, load, expected, summary) = match (&prepared.mode, &p.delta) {
        // An unread snapshot still loses the stale chains someone else deleted, and gains
        // a chain without rules the new document drops (nothing to flush: left as it is).
        (Mode::Incremental, Some(d)) if d.text.is_empty() => (
            Mode::Unchanged,
            None,
            match is_unread(&d.snapshot) && !(d.gone.is_empty() && d.emptied.is_empty()) {
                true => unread_after(d),
                false => d.snapshot.clone(),
            },
            p.summary.clone(),
        ),
        (Mode::Incremental, Some(d)) => (
            Mode::Incremental,
            Some(d.text.clone()),
            match is_unread(&d.snapshot) {
                true => unread_after(d),
                false => merge(d, &scratch)?,
            },
            p.summary.clone(),
        ),
        (m, _) => {
            if scratch.is_empty() {
                return Err(
                    "the scratch namespace shows no kube-proxy table after loading the document"
                        .into(),
                );
            }
            let load = prepared.scratch.clone();
            (m.clone(), Some(load), scratch, p.summary.clone())
        }
    };
    let touched = p
        .delta
        .as_ref()
        .filter(|_| mode == Mode::Incremental)
        .map(|d| {
            let all = |lists: &[&Vec<String>]| {
                let mut v: Vec<String> = lists.iter().flat_map(|l| l.iter().cloned()).collect();
                v.sort_unstable();
                v.dedup();
                v
            };
            Touched {
                chains: all(&[&d.chains, &d.stale_chains, &d.emptied]),
                sets: all(&[&d.sets, &d.stale_sets, &d.partial_sets]),
                elements: d.element_writes.clone(),
            }
        });
    Ok(Plan {
        mode,
        load,
        expected,
        summary,
        warnings: Vec::new(),
        touched,
        owner: Arc::new(Owner),
    })
}

#[cfg(test)]
mod tests;
