//! `svc-compile drift`: the difference between the owned state a node shows and the one a
//! compiled ruleset gives, grouped by service. Pure: `svc_node::drift` reads the node (or a
//! saved listing), learns the kernel's spelling of the compiled document in a scratch
//! namespace, and hands both owned states here as the canonical text of [`crate::plan`]
//! (`Plan::expected` and `Plan::owned`).
//!
//! Normalised the way kube-proxy's own tests compare rulesets: rule order within a chain
//! is kept (it decides what matches first); the order of chains, sets, maps and set
//! elements is not; counters are dropped ([`strip_counters`]; the planners' canonical text
//! has none). Only what svc-compile owns is compared: the planners already cut that out
//! (iptables: kube-proxy's chains and the jumps to them; nftables: the `kube-proxy` table
//! of the family, [`nft_table`] for a whole `nft -j list ruleset`). nftables chains that are
//! empty, not base chains and not jumped to are left out: `apply` empties stale chains and
//! deletes them later ([`crate::nftables::plan::without_leftovers`]). Which chain is one
//! service's is the back ends' word (`iptables::names`, `nftables::names`), not restated.
//!
//! Invariant: the report is deterministic: items are sorted by service, then place, then
//! position; a clean node gives no items.

use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The syntax of the canonical owned-state text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Syntax {
    /// `iptables-save` syntax (`iptables::plan`'s owned state).
    Iptables,
    /// One JSON object per line (`nftables::plan::owned_state`).
    Nftables,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// In the compiled ruleset, not on the node.
    Missing,
    /// On the node, not in the compiled ruleset.
    Extra,
    /// At the same place in a chain, different text.
    Changed,
}

/// One difference.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Item {
    /// `namespace/name:port` (iptables) or `namespace/name/proto/port` (nftables), or
    /// `node` for what belongs to no service.
    pub service: String,
    /// `TABLE CHAIN` for a rule, `TABLE chains` for chain declarations (iptables);
    /// `chain NAME`, `set NAME` or `objects` (nftables).
    pub place: String,
    /// 1-based position in the chain (compiled side; node side for extra rules); 0 for
    /// unordered places.
    pub position: usize,
    pub kind: Kind,
    pub expected: Option<String>,
    pub actual: Option<String>,
}

/// The differences between `expected` (compiled) and `actual` (node) owned state.
pub fn compare(syntax: Syntax, expected: &str, actual: &str) -> Vec<Item> {
    // Stale chains apply left emptied, for a later apply to delete, are not drift.
    fn settled(syntax: Syntax, s: &str) -> std::borrow::Cow<'_, str> {
        match syntax {
            Syntax::Nftables => crate::nftables::plan::without_leftovers(s).into(),
            Syntax::Iptables => s.into(),
        }
    }
    let (expected, actual) = (settled(syntax, expected), settled(syntax, actual));
    let (e, a) = (groups(syntax, &expected), groups(syntax, &actual));
    // Per-service chain → service, learnt from the rules of both sides (shared chains
    // such as KUBE-SERVICES have none: each of their rules names its own).
    let mut owners: BTreeMap<&str, String> = BTreeMap::new();
    for g in e.values().chain(a.values()) {
        if owners.contains_key(g.place.as_str()) || !per_service(&g.place) {
            continue;
        }
        if let Some(s) = g.service.clone().or_else(|| {
            g.lines
                .iter()
                .find_map(|l| line_service(syntax, &g.place, l))
        }) {
            owners.insert(&g.place, s);
        }
    }
    let empty = Group::default();
    let mut items = Vec::new();
    let places: std::collections::BTreeSet<&String> = e.keys().chain(a.keys()).collect();
    for key in places {
        let ge = e.get(key).unwrap_or(&empty);
        let ga = a.get(key).unwrap_or(&empty);
        // A shared chain's per-service part is keyed `PLACE\0SERVICE`.
        let place = &key.split('\u{0}').next().unwrap_or_default().to_string();
        let ordered = ge.ordered || ga.ordered;
        let sub_service = ge.service.clone().or_else(|| ga.service.clone());
        let service = |line: &str| {
            if let Some(s) = sub_service.clone().filter(|_| key.contains('\u{0}')) {
                return s;
            }
            // A chain declaration (`:KUBE-SEP-…` in `nat chains`) belongs to its chain's
            // service.
            let chain = match (place.strip_suffix(" chains"), line.strip_prefix(':')) {
                (Some(table), Some(name)) => format!("{table} {name}"),
                _ => place.clone(),
            };
            line_service(syntax, place, line)
                .or_else(|| owners.get(chain.as_str()).cloned())
                .unwrap_or_else(|| "node".into())
        };
        let mut push = |pos: usize, kind, exp: Option<&String>, act: Option<&String>| {
            let svc = service(exp.or(act).map_or("", |s| s.as_str()));
            items.push(Item {
                service: svc,
                place: place.clone(),
                position: if ordered { pos } else { 0 },
                kind,
                expected: exp.cloned(),
                actual: act.cloned(),
            });
        };
        if ordered {
            for op in diff_ordered(&ge.lines, &ga.lines) {
                match op {
                    Op::Missing(i) => push(i + 1, Kind::Missing, Some(&ge.lines[i]), None),
                    Op::Extra(j) => push(j + 1, Kind::Extra, None, Some(&ga.lines[j])),
                    Op::Changed(i, j) => {
                        push(i + 1, Kind::Changed, Some(&ge.lines[i]), Some(&ga.lines[j]))
                    }
                }
            }
        } else {
            let mut count: BTreeMap<&String, isize> = BTreeMap::new();
            for l in &ge.lines {
                *count.entry(l).or_default() += 1;
            }
            for l in &ga.lines {
                *count.entry(l).or_default() -= 1;
            }
            for (l, n) in count {
                for _ in 0..n.unsigned_abs() {
                    if n > 0 {
                        push(0, Kind::Missing, Some(l), None);
                    } else {
                        push(0, Kind::Extra, None, Some(l));
                    }
                }
            }
        }
    }
    items.sort();
    items
}

/// The lines of one place (a chain's rules, a set's elements, declarations).
#[derive(Clone, Debug, Default)]
struct Group {
    place: String,
    ordered: bool,
    /// The service the place's name says (nftables' per-service chains).
    service: Option<String>,
    lines: Vec<String>,
}

fn groups(syntax: Syntax, text: &str) -> BTreeMap<String, Group> {
    let mut out: BTreeMap<String, Group> = BTreeMap::new();
    let add_plain =
        |out: &mut BTreeMap<String, Group>, place: String, ordered: bool, line: String| {
            let g = out.entry(place.clone()).or_insert_with(|| Group {
                service: name_service(&place),
                place,
                ordered,
                lines: Vec::new(),
            });
            g.lines.push(line);
        };
    // kube-proxy writes the rules of shared chains (KUBE-SERVICES, KUBE-NODEPORTS, …) in
    // Go map order, one service after another: there, each service's rules are compared
    // as their own sequence, and rules of no service as one more.
    let mut add = |place: String, ordered: bool, line: String| {
        let svc = (ordered && !per_service(&place))
            .then(|| line_service(syntax, &place, &line))
            .flatten();
        match svc {
            Some(svc) => {
                let key = format!("{place}\u{0}{svc}");
                let g = out.entry(key).or_insert_with(|| Group {
                    service: Some(svc),
                    place,
                    ordered,
                    lines: Vec::new(),
                });
                g.lines.push(line);
            }
            None => add_plain(&mut out, place, ordered, line),
        }
    };
    match syntax {
        Syntax::Iptables => {
            let mut table = String::new();
            for l in text.lines().map(str::trim_end) {
                if let Some(t) = l.strip_prefix('*') {
                    table = t.to_string();
                } else if let Some(decl) = l.strip_prefix(':') {
                    let name = decl.split(' ').next().unwrap_or_default();
                    add(format!("{table} chains"), false, format!(":{name}"));
                } else if let Some(rule) = l.strip_prefix("-A ") {
                    let (chain, spec) = rule.split_once(' ').unwrap_or((rule, ""));
                    add(format!("{table} {chain}"), true, spec.to_string());
                }
            }
        }
        Syntax::Nftables => {
            for l in text.lines().filter(|l| !l.trim().is_empty()) {
                let (kind, rest) = l.split_once(' ').unwrap_or((l, ""));
                match kind {
                    "rule" => {
                        let (chain, body) = rest.split_once(' ').unwrap_or((rest, ""));
                        add(format!("chain {chain}"), true, body.to_string());
                    }
                    "set" | "map" => {
                        let (name, body) = rest.split_once(' ').unwrap_or((rest, ""));
                        // Each element on its own: one changed element is one item.
                        match serde_json::from_str::<Value>(body) {
                            Ok(Value::Object(mut obj)) => {
                                if let Some(Value::Array(elems)) = obj.remove("elem") {
                                    for e in elems {
                                        add(format!("{kind} {name}"), false, e.to_string());
                                    }
                                }
                                let obj = Value::Object(obj);
                                add("objects".into(), false, format!("{kind} {name} {obj}"));
                            }
                            _ => add("objects".into(), false, l.to_string()),
                        }
                    }
                    _ => add("objects".into(), false, l.to_string()),
                }
            }
        }
    }
    out
}

/// Whether a place is one service's chain: kube-proxy's per-service iptables chains, or an
/// nftables chain whose name says its service.
fn per_service(place: &str) -> bool {
    let chain = place.split(' ').nth(1).unwrap_or_default();
    crate::iptables::names::is_service_chain(chain) || name_service(place).is_some()
}

/// The service an nftables place's name says: `chain service-HASH-ns/name/proto/port`,
/// `chain endpoint-HASH-ns/name/proto/port__ip/port`, … → `ns/name/proto/port`.
fn name_service(place: &str) -> Option<String> {
    let name = place.strip_prefix("chain ")?;
    crate::nftables::names::port_of(name).map(str::to_string)
}

/// The service a line names in its comment: kube-proxy comments start with
/// `namespace/name:port` (iptables) or are `namespace/name/proto/port` (nftables).
fn line_service(syntax: Syntax, _place: &str, line: &str) -> Option<String> {
    let comment = match syntax {
        Syntax::Iptables => {
            let rest = line.split_once("--comment ")?.1;
            match rest.strip_prefix('"') {
                Some(q) => q.split('"').next()?.to_string(),
                None => rest.split(' ').next()?.to_string(),
            }
        }
        Syntax::Nftables => json_comment(&serde_json::from_str(line).ok()?)?,
    };
    let first = comment.split(' ').next()?;
    first.contains('/').then(|| first.to_string())
}

fn json_comment(v: &Value) -> Option<String> {
    match v {
        Value::Object(o) => o
            .get("comment")
            .and_then(Value::as_str)
            .map(str::to_string)
            .or_else(|| o.values().find_map(json_comment)),
        Value::Array(a) => a.iter().find_map(json_comment),
        _ => None,
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Op {
    Missing(usize),
    Extra(usize),
    /// (expected index, actual index).
    Changed(usize, usize),
}

/// The edit from `e` to `a` keeping the longest common subsequence; in each run of
/// removals and insertions between kept lines, removals and insertions are paired up as
/// changes, in order.
fn diff_ordered(e: &[String], a: &[String]) -> Vec<Op> {
    let pre = e.iter().zip(a).take_while(|(x, y)| x == y).count();
    let suf = e[pre..]
        .iter()
        .rev()
        .zip(a[pre..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let (me, ma) = (&e[pre..e.len() - suf], &a[pre..a.len() - suf]);
    // Kept pairs of the middle part (indices into `me`, `ma`).
    let mut keep: Vec<(usize, usize)> = Vec::new();
    // The table is |me|·|ma|: bounded, beyond that nothing in the middle is kept.
    if !me.is_empty() && !ma.is_empty() && me.len().saturating_mul(ma.len()) <= 16_000_000 {
        let (n, m) = (me.len(), ma.len());
        let mut t = vec![0u32; (n + 1) * (m + 1)];
        for i in (0..n).rev() {
            for j in (0..m).rev() {
                t[i * (m + 1) + j] = if me[i] == ma[j] {
                    t[(i + 1) * (m + 1) + j + 1] + 1
                } else {
                    t[(i + 1) * (m + 1) + j].max(t[i * (m + 1) + j + 1])
                };
            }
        }
        let (mut i, mut j) = (0, 0);
        while i < n && j < m {
            if me[i] == ma[j] {
                keep.push((i, j));
                i += 1;
                j += 1;
            } else if t[(i + 1) * (m + 1) + j] >= t[i * (m + 1) + j + 1] {
                i += 1;
            } else {
                j += 1;
            }
        }
    }
    keep.push((me.len(), ma.len()));
    let mut ops = Vec::new();
    let (mut i, mut j) = (0, 0);
    for (ki, kj) in keep {
        let (gone, new) = ((i..ki).collect::<Vec<_>>(), (j..kj).collect::<Vec<_>>());
        let paired = gone.len().min(new.len());
        for k in 0..paired {
            ops.push(Op::Changed(pre + gone[k], pre + new[k]));
        }
        ops.extend(gone[paired..].iter().map(|&x| Op::Missing(pre + x)));
        ops.extend(new[paired..].iter().map(|&y| Op::Extra(pre + y)));
        (i, j) = (ki + 1, kj + 1);
    }
    ops
}

/// `iptables-save -c` output without its counters (`[p:b] -A …` and the chains'
/// `[p:b]`), which traffic changes and svc-compile does not own.
pub fn strip_counters(save: &str) -> String {
    let mut out = String::with_capacity(save.len());
    for l in save.lines() {
        let l = match l.strip_prefix('[') {
            Some(rest) if rest.split_once("] ").is_some_and(|(c, _)| is_counter(c)) => {
                rest.split_once("] ").map_or(l, |(_, r)| r)
            }
            _ => l,
        };
        let l = match l.rsplit_once(" [") {
            Some((head, c))
                if l.starts_with(':') && c.strip_suffix(']').is_some_and(is_counter) =>
            {
                head
            }
            _ => l,
        };
        out.push_str(l);
        out.push('\n');
    }
    out
}

fn is_counter(c: &str) -> bool {
    c.split_once(':').is_some_and(|(p, b)| {
        !p.is_empty() && !b.is_empty() && (p.to_string() + b).bytes().all(|x| x.is_ascii_digit())
    })
}

/// `nft -j list ruleset` (or `list table`) output cut to the `kube-proxy` table of
/// `family` (`ip`, `ip6`), as `nft -j list table FAMILY kube-proxy` prints it.
pub fn nft_table(json: &str, family: &str) -> Result<String, String> {
    let Some(items) = crate::nftables::plan::nft_items(json)? else {
        return Ok(String::new());
    };
    let ours = |o: &serde_json::Map<String, Value>, name_key: &str| {
        o.get("family").and_then(Value::as_str) == Some(family)
            && o.get(name_key).and_then(Value::as_str) == Some(crate::nftables::names::TABLE)
    };
    let kept: Vec<Value> = items
        .iter()
        .filter(|item| {
            let Some((kind, body)) = item.as_object().and_then(|o| o.iter().next()) else {
                return false;
            };
            let Some(o) = body.as_object() else {
                return false;
            };
            match kind.as_str() {
                "metainfo" => true,
                "table" => ours(o, "name"),
                _ => ours(o, "table"),
            }
        })
        .cloned()
        .collect();
    if !kept.iter().any(|i| i.get("table").is_some()) {
        return Ok(String::new()); // no table of ours: nothing owned
    }
    Ok(serde_json::json!({ "nftables": kept }).to_string())
}

/// A node's listing (read live or saved) made ready for the planners' `owned`: counters
/// dropped from `iptables-save -c` text; JSON from `nft -j` cut to the `kube-proxy`
/// table of `family`.
pub fn node_state(listing: &str, family: crate::plan::Family) -> Result<String, String> {
    if listing.trim_start().starts_with('{') {
        let fam = match family {
            crate::plan::Family::V4 => "ip",
            crate::plan::Family::V6 => "ip6",
        };
        nft_table(listing, fam)
    } else {
        Ok(strip_counters(listing))
    }
}

/// The syntax of a planner's canonical owned-state text (`*table` lines are iptables').
pub fn syntax_of(owned: &str) -> Syntax {
    match owned.trim_start().starts_with('*') || owned.trim().is_empty() {
        true => Syntax::Iptables,
        false => Syntax::Nftables,
    }
}

/// Counts of (missing, extra, changed).
pub fn counts(items: &[Item]) -> (usize, usize, usize) {
    let n = |k| items.iter().filter(|i| i.kind == k).count();
    (n(Kind::Missing), n(Kind::Extra), n(Kind::Changed))
}

/// The report as text: a summary line, then each service's items.
pub fn render(title: &str, items: &[Item]) -> String {
    let (m, e, c) = counts(items);
    let mut out = String::new();
    if items.is_empty() {
        let _ = writeln!(out, "{title}: no drift");
        return out;
    }
    let _ = writeln!(out, "{title}: {m} missing, {e} extra, {c} changed");
    let mut last: Option<&str> = None;
    for i in items {
        if last != Some(i.service.as_str()) {
            let _ = writeln!(out, "{}", i.service);
            last = Some(&i.service);
        }
        let at = match i.position {
            0 => i.place.clone(),
            p => format!("{} #{p}", i.place),
        };
        match i.kind {
            Kind::Missing => {
                let _ = writeln!(
                    out,
                    "  missing  {at}: {}",
                    i.expected.as_deref().unwrap_or("")
                );
            }
            Kind::Extra => {
                let _ = writeln!(
                    out,
                    "  extra    {at}: {}",
                    i.actual.as_deref().unwrap_or("")
                );
            }
            Kind::Changed => {
                let _ = writeln!(out, "  changed  {at}:");
                let _ = writeln!(out, "    - {}", i.expected.as_deref().unwrap_or(""));
                let _ = writeln!(out, "    + {}", i.actual.as_deref().unwrap_or(""));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
