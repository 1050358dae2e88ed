//! A fingerprint of one nf_tables table, read over netlink object by object.
//!
//! `nft list table` asks the kernel for the whole table's rules in one dump, and the kernel
//! walks the table's rules from the first one again for every message of that dump
//! (`__nf_tables_dump_rules`), so the read grows with the square of the rule count (15.7 s
//! for the fast layout of 10k services, docs/performance.md, "Apply"). Asking for one chain's
//! rules at a time keeps each walk to that chain: reading every object of the table this
//! way is linear. What is kept of it is not the kernel's spelling (that is `nft`'s to
//! print) but a hash per object of the attributes the kernel returns, without the ones
//! that change without anyone writing: handles (but a set's, see [`Digest`]), use counts,
//! element counts, counters' and `last`'s state and a quota's consumption, and the elements
//! of sets that traffic fills (dynamic or timeout sets). Two fingerprints of the same table
//! are equal when nobody wrote to it in between; a write that puts back exactly what was
//! there (a set with its handle aside) leaves it equal too. The hashes are std's SipHash:
//! a toolchain that changed it would make every recorded fingerprint differ once (one full
//! load), never equal by mistake.
//!
//! `apply` records one beside a document it did not read back (a first load proven by the
//! nf_tables generation), and compares it with the node's when the generation has moved:
//! the same fingerprint means someone wrote elsewhere, and our table is as we left it.

use crate::nfnl::{cstr, for_each_attr, nested, nla, str_attr, u32_attr, Socket};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::hash::{DefaultHasher, Hasher};
use std::io;
use svc_targets::plan::{Drift, Touched};

const NFT_MSG_GETTABLE: u16 = 1;
const NFT_MSG_GETCHAIN: u16 = 4;
const NFT_MSG_GETRULE: u16 = 7;
const NFT_MSG_GETSET: u16 = 10;
const NFT_MSG_GETSETELEM: u16 = 13;
const NFT_MSG_GETOBJ: u16 = 19;
const NFT_MSG_GETFLOWTABLE: u16 = 23;

/// Attribute types that name the table in each kind of request and answer (all 1), and
/// the object's own name.
const ATTR_TABLE: u16 = 1;
const NFTA_TABLE_NAME: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_SET_NAME: u16 = 2;
const NFTA_SET_FLAGS: u16 = 3;
const NFTA_SET_HANDLE: u16 = 16;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_DATA_VALUE: u16 = 1;
const NLA_F_NESTED: u16 = 0x8000;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_OBJ_NAME: u16 = 2;
const NFTA_FLOWTABLE_NAME: u16 = 2;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_OBJ_TYPE: u16 = 3;
const NFTA_OBJ_DATA: u16 = 4;
const NFTA_SET_ELEM_EXPR: u16 = 7;
const NFTA_SET_ELEM_EXPRESSIONS: u16 = 11;

/// Sets whose elements traffic adds and expires (`NFT_SET_TIMEOUT`, `NFT_SET_EVAL`).
const NFT_SET_TIMEOUT: u32 = 0x10;
const NFT_SET_EVAL: u32 = 0x20;

/// Attributes that change without a write: per message kind, the types left out.
/// Tables: use, handle. Chains: handle, use, counters, id. Rules: handle, position (the
/// previous rule's handle), id. Sets: id, handle, count (elements present). Set elements:
/// expiration. Objects: use, handle (and their data as [`state_free`] says). Flowtables:
/// use, handle.
fn volatile(msg: u16, attr: u16) -> bool {
    match msg {
        NFT_MSG_GETTABLE => matches!(attr, 3 | 4),
        NFT_MSG_GETCHAIN => matches!(attr, 2 | 6 | 8 | 11),
        NFT_MSG_GETRULE => matches!(attr, 3 | 6 | 9),
        NFT_MSG_GETSET => matches!(attr, 10 | 16 | 20),
        NFT_MSG_GETOBJ => matches!(attr, 5 | 6),
        NFT_MSG_GETFLOWTABLE => matches!(attr, 4 | 5),
        _ => false,
    }
}

/// The configuration in a stateful expression's (or object's) data, without the state
/// traffic changes: a counter's packets and bytes and `last`'s time are all state; a quota
/// keeps its bytes and flags, without what it consumed and its depleted bit. Everything
/// else (`limit`, `connlimit`: rate, burst, count, flags) is configuration, hashed whole.
fn state_free(h: &mut DefaultHasher, name: &[u8], data: &[u8]) {
    const NFTA_QUOTA_BYTES: u16 = 1;
    const NFTA_QUOTA_FLAGS: u16 = 2;
    const NFT_QUOTA_F_DEPLETED: u32 = 2;
    match name {
        b"counter" | b"last" => {}
        b"quota" => nested(data, |t, v| match (t, <[u8; 4]>::try_from(v)) {
            (NFTA_QUOTA_FLAGS, Ok(f)) => {
                h.write_u16(t);
                h.write_u32(u32::from_be_bytes(f) & !NFT_QUOTA_F_DEPLETED);
            }
            (NFTA_QUOTA_BYTES, _) => {
                h.write_u16(t);
                h.write(v);
            }
            _ => {}
        }),
        _ => {
            h.write_usize(data.len());
            h.write(data);
        }
    }
}

/// The fingerprint of a table: one hash per object, by (kind, name). Rules count in
/// their chain's hash, in order; elements in their set's, in any order.
#[derive(Clone, Debug, Default, Eq)]
pub(crate) struct Digest {
    /// (hash, the hash of the object's own listing message): the second tells whether an
    /// object a load did not touch is still the one the first describes. For sets it
    /// includes the handle, because an anonymous set a rewritten rule drops and the one
    /// its new rule makes can have the same name (`__map0`).
    objects: BTreeMap<(String, String), (u64, u64)>,
    /// Per set: the sum of its elements' hashes and their count, from which its hash is
    /// made ([`set_hash`]): a load that deletes and adds a few elements changes the sum
    /// by those elements' hashes alone ([`gone_elements`]). Not part of the comparison:
    /// the set's hash holds them.
    sums: BTreeMap<String, (u64, u64)>,
    /// How many touched sets this fingerprint did not list, having asked for the
    /// elements a load wrote by key (not recorded; `SVC_COMPILE_APPLY_TIMES` shows it).
    pub(crate) keyed: usize,
}

/// Fingerprints compare by their objects' hashes (the sums are how a set's was made).
impl PartialEq for Digest {
    fn eq(&self, other: &Digest) -> bool {
        self.objects == other.objects
    }
}

impl Digest {
    /// One line per object, for the state directory.
    pub(crate) fn to_text(&self) -> String {
        let mut out = String::with_capacity(self.objects.len() * 48);
        for ((kind, name), (h, l)) in &self.objects {
            let _ = writeln!(out, "{kind} {h:016x} {l:016x} {name}");
        }
        for (name, (sum, count)) in &self.sums {
            let _ = writeln!(out, "{SUMS} {sum:016x} {count:016x} {name}");
        }
        out
    }

    pub(crate) fn from_text(text: &str) -> Option<Digest> {
        let mut d = Digest::default();
        for l in text.lines() {
            let mut w = l.splitn(4, ' ');
            let (kind, h, listing, name) = (w.next()?, w.next()?, w.next()?, w.next()?);
            let hex = |x: &str| u64::from_str_radix(x, 16).ok();
            let pair = (hex(h)?, hex(listing)?);
            match kind {
                SUMS => d.sums.insert(name.to_string(), pair),
                _ => d.objects.insert((kind.to_string(), name.to_string()), pair),
            };
        }
        Some(d)
    }

    /// How `now` differs from `self` (the record), chain by chain and set by set; `None`
    /// when anything else differs, which only a full load puts back: the table itself, a
    /// named object, a flowtable, or the attributes of a chain or set both have (a chain's
    /// hook, priority or policy, a set's flags, timeout or size, or a set made again: its
    /// handle), which writing the object again would not change back.
    pub(crate) fn drift(&self, now: &Digest) -> Option<Drift> {
        let mut drift = Drift::default();
        for key in self.objects.keys().chain(now.objects.keys()) {
            let (was, is) = (self.objects.get(key), now.objects.get(key));
            let into = match (was, is) {
                _ if was == is => continue,
                (Some((_, then)), Some((_, listing))) if then != listing => return None,
                (Some(_), Some(_)) => &mut drift.changed,
                (None, _) => &mut drift.added,
                (_, None) => &mut drift.gone,
            };
            match key.0.as_str() {
                "chain" => into.chains.push(key.1.clone()),
                "set" => into.sets.push(key.1.clone()),
                _ => return None,
            }
        }
        for t in [&mut drift.changed, &mut drift.added, &mut drift.gone] {
            for list in [&mut t.chains, &mut t.sets] {
                list.sort_unstable();
                list.dedup();
            }
        }
        Some(drift)
    }

    /// The first object in which `self` (the record) and `now` differ, for messages.
    pub(crate) fn first_difference(&self, now: &Digest) -> Option<String> {
        let first = self
            .objects
            .keys()
            .chain(now.objects.keys())
            .filter(|k| self.objects.get(*k) != now.objects.get(*k))
            .min()?;
        let how = match (self.objects.get(first), now.objects.get(first)) {
            (Some(_), None) => "is gone",
            (None, Some(_)) => "was added",
            _ => "changed",
        };
        Some(format!("{} {} {how}", first.0, first.1))
    }
}

/// The fingerprint of table `table` of nf_tables family `family` (`libc::NFPROTO_IPV4`,
/// …) in the namespace `/run/netns/NAME` (`None`: this process's). A missing table is an
/// empty fingerprint.
///
/// `reuse`: `Some((before, touched))` after a load that wrote only the chains and sets
/// `touched` names, when `before` was the table's fingerprint and nobody else wrote since
/// (the generation says so). The contents of untouched chains and sets are then taken from
/// `before` rather than read again: the touched chains are asked for by name (gone:
/// deleted); sets are all listed (no elements), so new ones (an anonymous set of a
/// rewritten rule) are read and deleted ones go.
///
/// A touched set that [`Touched::elements`] says the load only deleted and added elements
/// of is not listed either when `before` has its element sum and [`gone_elements`] found
/// every element it deleted: the elements it added are asked for by key, and its sum
/// is `before`'s less the ones gone and plus those (a set's dump walks the whole set again
/// for every message of it, 0.1–0.3 s at 100k elements; a few keys take a millisecond).
/// Asking for what was added by key also reads back that each is in the kernel.
pub(crate) fn digest(
    netns: Option<&str>,
    family: u8,
    table: &str,
    reuse: Option<Reuse>,
) -> io::Result<Digest> {
    crate::netns::in_named(netns, || read(family, table, reuse))
}

/// What a fingerprint after a partial load takes from before it ([`digest`]).
#[derive(Clone, Copy)]
pub(crate) struct Reuse<'a> {
    /// The table's fingerprint before the load, nobody else having written since.
    pub before: &'a Digest,
    /// What the load wrote.
    pub touched: &'a Touched,
    /// What [`gone_elements`] found before the load.
    pub gone: &'a Gone,
}

/// At most this many elements of one set are asked for one by one (~20 µs a request; a
/// 100k-element set is listed in ~0.1–0.3 s).
const MAX_KEYED: usize = 4096;

/// Per set: the sum of the hashes of the elements a load is about to delete, and how
/// many they are ([`gone_elements`]).
pub(crate) type Gone = BTreeMap<String, (u64, u64)>;

/// Before a load that writes sets element by element ([`Touched::elements`]): the
/// elements it deletes, each asked for by key, summed per set. A set is left out when a
/// key cannot be spelled in the kernel's bytes ([`key_bytes`]) or the kernel does not
/// have it: the fingerprint after the load then lists that set whole.
pub(crate) fn gone_elements(
    netns: Option<&str>,
    family: u8,
    table: &str,
    touched: &Touched,
) -> io::Result<Gone> {
    crate::netns::in_named(netns, || {
        let mut nl = Socket::open()?;
        let mut gone = Gone::new();
        for w in &touched.elements {
            if let Some(sum) = sum_of(&mut nl, family, table, &w.set, &w.key_type, &w.gone)? {
                gone.insert(w.set.clone(), sum);
            }
        }
        Ok(gone)
    })
}

/// The sum of the hashes of the elements of `set` with these keys and their count;
/// `None` when one cannot be spelled or the kernel does not have it.
fn sum_of(
    nl: &mut Socket,
    family: u8,
    table: &str,
    set: &str,
    key_type: &[String],
    keys: &[String],
) -> io::Result<Option<(u64, u64)>> {
    // One request per key: past this many, listing the set is the cheaper read.
    if keys.len() > MAX_KEYED {
        return Ok(None);
    }
    let mut sum = (0u64, 0u64);
    for k in keys {
        let Some(key) = key_bytes(key_type, k) else {
            return Ok(None);
        };
        let elem = nla(
            NLA_F_NESTED | NFTA_LIST_ELEM,
            &nla(
                NLA_F_NESTED | NFTA_SET_ELEM_KEY,
                &nla(NFTA_DATA_VALUE, &key),
            ),
        );
        let mut req = nla(NFTA_SET_ELEM_LIST_TABLE, &cstr(table));
        req.extend(nla(NFTA_SET_ELEM_LIST_SET, &cstr(set)));
        req.extend(nla(NLA_F_NESTED | NFTA_SET_ELEM_LIST_ELEMENTS, &elem));
        let mut one = (0u64, 0u64);
        let flags = libc::NLM_F_ACK as u16;
        // Not there (ENOENT), or a kernel that does not answer such a request: the set
        // is listed instead.
        if let Err(e) = nl.request(NFT_MSG_GETSETELEM, family, flags, &req, |msg| {
            add_elements(&mut one, msg);
            Ok(())
        }) {
            return match e.raw_os_error() {
                Some(_) => Ok(None),
                None => Err(e),
            };
        }
        if one.1 != 1 {
            return Ok(None);
        }
        sum = (sum.0.wrapping_add(one.0), sum.1 + 1);
    }
    Ok(Some(sum))
}

/// A touched set's element sum and count after a load that only deleted and added
/// elements of it ([`Touched::elements`]): `was`, the sum before, less the ones
/// [`gone_elements`] found and plus the added ones, asked for now; `None` when the set is
/// to be listed instead (not written that way, or an element not found).
fn keyed_sum(
    nl: &mut Socket,
    family: u8,
    table: &str,
    set: &str,
    was: (u64, u64),
    reuse: Option<Reuse>,
) -> io::Result<Option<(u64, u64)>> {
    let Some((w, gone)) = reuse.and_then(|r| {
        let w = r.touched.elements.iter().find(|w| w.set == set)?;
        Some((w, *r.gone.get(set)?))
    }) else {
        return Ok(None);
    };
    let Some(added) = sum_of(nl, family, table, set, &w.key_type, &w.added)? else {
        return Ok(None);
    };
    let sum = was.0.wrapping_sub(gone.0).wrapping_add(added.0);
    Ok((was.1 + added.1)
        .checked_sub(gone.1)
        .map(|count| (sum, count)))
}

/// Adds the elements of one `NEWSETELEM` message (a dump's or a get's) to (sum, count).
fn add_elements(sum: &mut (u64, u64), msg: &[u8]) {
    for_each_attr(msg, |t, v| {
        if t == NFTA_SET_ELEM_LIST_ELEMENTS {
            nested(v, |t, e| {
                if t == NFTA_LIST_ELEM {
                    sum.0 = sum.0.wrapping_add(element_hash(e));
                    sum.1 += 1;
                }
            });
        }
    });
}

/// An element's key as the kernel holds it, from its text (`10.0.0.1 . tcp . 80`) and the
/// set's key types: addresses in network order, a protocol as its number (one byte), a
/// port as two bytes in network order; in a concatenation each part takes a multiple of
/// four bytes (nft's registers), zero-padded. `None`: a type or a spelling not handled.
pub(crate) fn key_bytes(key_type: &[String], key: &str) -> Option<Vec<u8>> {
    let parts: Vec<&str> = key.split(" . ").collect();
    if parts.len() != key_type.len() {
        return None;
    }
    let mut out = Vec::with_capacity(16 * parts.len());
    for (t, p) in key_type.iter().zip(parts) {
        let start = out.len();
        match t.as_str() {
            "ipv4_addr" => out.extend(p.parse::<std::net::Ipv4Addr>().ok()?.octets()),
            "ipv6_addr" => out.extend(p.parse::<std::net::Ipv6Addr>().ok()?.octets()),
            "inet_proto" => out.push(match p {
                "tcp" => 6,
                "udp" => 17,
                "sctp" => 132,
                n => n.parse().ok()?,
            }),
            "inet_service" => out.extend(p.parse::<u16>().ok()?.to_be_bytes()),
            _ => return None,
        }
        if key_type.len() > 1 {
            out.resize(start + (out.len() - start).div_ceil(4) * 4, 0);
        }
    }
    Some(out)
}

fn read(family: u8, table: &str, reuse: Option<Reuse>) -> io::Result<Digest> {
    // The hash and element sum `before` holds for a set, listed as then.
    let then = |name: &str, listing: u64| {
        let before = reuse?.before;
        let (h, then) = *before.objects.get(&("set".to_string(), name.to_string()))?;
        (then == listing).then(|| (h, before.sums.get(name).copied()))
    };
    let touched = |name: &str| reuse.is_some_and(|r| r.touched.sets.iter().any(|n| n == name));
    let mut nl = Socket::open()?;
    let mut d = Digest::default();
    let tname = cstr(table);
    let by_table = || nla(ATTR_TABLE, &tname);
    // The table itself (a dump of the family's tables, ours picked out).
    let mut found = false;
    nl.dump(NFT_MSG_GETTABLE, family, &[], |msg| {
        if str_attr(msg, NFTA_TABLE_NAME) == Some(table) {
            found = true;
            let h = object_hash(NFT_MSG_GETTABLE, msg);
            d.add("table", table, h, h);
        }
        Ok(())
    })?;
    if !found {
        return Ok(Digest::default());
    }
    let mut chains = Vec::new();
    let mut chain = |msg: &[u8]| {
        if str_attr(msg, ATTR_TABLE) == Some(table) {
            let name = str_attr(msg, NFTA_CHAIN_NAME)
                .unwrap_or_default()
                .to_string();
            chains.push((name, object_hash(NFT_MSG_GETCHAIN, msg)));
        }
        Ok(())
    };
    match reuse.map(|r| (r.before, r.touched)) {
        // All chains of the family (the kernel does not filter the chain dump by table;
        // the name check above does), in one dump, which the kernel also restarts from
        // the first chain for every message, but chains are few next to rules.
        None => nl.dump(NFT_MSG_GETCHAIN, family, &by_table(), chain)?,
        // Only the touched ones, each by name (at 112k chains the dump is ~1.5 s); the
        // others are as `before` has them. A touched chain that is gone was deleted.
        Some((before, touched)) => {
            for ((kind, name), &(h, listing)) in &before.objects {
                if kind == "chain" && !touched.chains.contains(name) {
                    d.add("chain", name, h, listing);
                }
            }
            for name in &touched.chains {
                let mut req = by_table();
                req.extend(nla(NFTA_CHAIN_NAME, &cstr(name)));
                let flags = libc::NLM_F_ACK as u16;
                match nl.request(NFT_MSG_GETCHAIN, family, flags, &req, &mut chain) {
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                    r => r?,
                }
            }
        }
    }
    // Every chain listed above is read: untouched ones were taken from `before` instead of
    // being listed.
    let rules = |nl: &mut Socket, (name, chain_hash): &(String, u64)| {
        let mut h = DefaultHasher::new();
        h.write_u64(*chain_hash);
        let mut req = by_table();
        req.extend(nla(NFTA_RULE_CHAIN, &cstr(name)));
        nl.dump(NFT_MSG_GETRULE, family, &req, |msg| {
            h.write_u64(object_hash(NFT_MSG_GETRULE, msg));
            Ok(())
        })?;
        Ok(h.finish())
    };
    for ((name, chain_hash), h) in chains.iter().zip(on_two_threads(&chains, rules)?) {
        d.add("chain", name, h, *chain_hash);
    }
    let mut sets = Vec::new();
    nl.dump(NFT_MSG_GETSET, family, &by_table(), |msg| {
        if str_attr(msg, ATTR_TABLE) == Some(table) {
            let name = str_attr(msg, NFTA_SET_NAME).unwrap_or_default().to_string();
            let flags = u32_attr(msg, NFTA_SET_FLAGS).unwrap_or(0);
            let dynamic = flags & (NFT_SET_TIMEOUT | NFT_SET_EVAL) != 0;
            // With its handle (see `Digest::objects`).
            let mut listing = DefaultHasher::new();
            listing.write_u64(object_hash(NFT_MSG_GETSET, msg));
            for_each_attr(msg, |t, v| {
                if t == NFTA_SET_HANDLE {
                    listing.write(v);
                }
            });
            sets.push((name, listing.finish(), dynamic));
        }
        Ok(())
    })?;
    let mut read_sets = Vec::new();
    for (name, set_hash, dynamic) in sets {
        match (then(&name, set_hash), touched(&name)) {
            // Untouched: as before.
            (Some((h, sum)), false) => {
                d.add("set", &name, h, set_hash);
                if let Some(sum) = sum {
                    d.sums.insert(name, sum);
                }
            }
            // Written element by element: before's sum, less what went, plus what came.
            (Some((_, Some(was))), true) => {
                match keyed_sum(&mut nl, family, table, &name, was, reuse)? {
                    Some(sum) => {
                        d.add_set(&name, set_hash, sum);
                        d.keyed += 1;
                    }
                    None => read_sets.push((name, set_hash, dynamic)),
                }
            }
            _ => read_sets.push((name, set_hash, dynamic)),
        }
    }
    let elements = |nl: &mut Socket, (name, _, dynamic): &(String, u64, bool)| {
        let mut sum = (0u64, 0u64);
        if !dynamic {
            let mut req = by_table();
            req.extend(nla(NFTA_SET_ELEM_LIST_SET, &cstr(name)));
            nl.dump(NFT_MSG_GETSETELEM, family, &req, |msg| {
                // Elements come in the set's own order: summed, so any order gives the
                // same hash.
                add_elements(&mut sum, msg);
                Ok(())
            })?;
        }
        Ok(sum)
    };
    for ((name, set_hash, _), sum) in read_sets.iter().zip(on_two_threads(&read_sets, elements)?) {
        d.add_set(name, *set_hash, sum);
    }
    for (kind, msg_kind, name_attr) in [
        ("object", NFT_MSG_GETOBJ, NFTA_OBJ_NAME),
        ("flowtable", NFT_MSG_GETFLOWTABLE, NFTA_FLOWTABLE_NAME),
    ] {
        nl.dump(msg_kind, family, &by_table(), |msg| {
            if str_attr(msg, ATTR_TABLE) == Some(table) {
                let mut name = str_attr(msg, name_attr).unwrap_or_default().to_string();
                // Objects of different types may share a name.
                if msg_kind == NFT_MSG_GETOBJ {
                    name = format!("{} {name}", u32_attr(msg, NFTA_OBJ_TYPE).unwrap_or(0));
                }
                let h = object_hash(msg_kind, msg);
                d.add(kind, &name, h, h);
            }
            Ok(())
        })?;
    }
    Ok(d)
}

impl Digest {
    fn add(&mut self, kind: &str, name: &str, h: u64, listing: u64) {
        self.objects
            .insert((kind.into(), name.into()), (h, listing));
    }

    /// A set's entry from its listing hash and its elements' sum and count.
    fn add_set(&mut self, name: &str, listing: u64, (sum, count): (u64, u64)) {
        self.add("set", name, set_hash(listing, sum, count), listing);
        self.sums.insert(name.into(), (sum, count));
    }
}

/// The `kind` of a [`Digest::to_text`] line that holds a set's element sum and count.
const SUMS: &str = "elements";

/// A set's hash: its listing's, with the sum of its elements' hashes (any order gives the
/// same) and their count.
fn set_hash(listing: u64, sum: u64, count: u64) -> u64 {
    let mut h = DefaultHasher::new();
    h.write_u64(listing);
    h.write_u64(sum);
    h.write_u64(count);
    h.finish()
}

/// `f` over `items`, in order, on two threads when there are many (each with a socket of
/// its own: a netlink socket runs one dump at a time, and the kernel's work of a dump is
/// done in the reading thread's system call). Threads started here stay in the caller's
/// network namespace.
fn on_two_threads<T: Sync, R: Send>(
    items: &[T],
    f: impl Fn(&mut Socket, &T) -> io::Result<R> + Sync,
) -> io::Result<Vec<R>> {
    let part = |part: &[T]| -> io::Result<Vec<R>> {
        let mut nl = Socket::open()?;
        part.iter().map(|x| f(&mut nl, x)).collect()
    };
    if items.len() < 256 {
        return part(items);
    }
    let (a, b) = items.split_at(items.len() / 2);
    std::thread::scope(|s| {
        let second = s.spawn(|| part(b));
        let mut out = part(a)?;
        let rest = second
            .join()
            .map_err(|_| io::Error::other("a fingerprint thread panicked"))??;
        out.extend(rest);
        Ok(out)
    })
}

/// The hash of one object's message: its attributes in order, the volatile ones left out,
/// and a rule's stateful expressions by name only.
fn object_hash(kind: u16, msg: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    h.write_u16(kind);
    for_each_attr(msg, |t, v| {
        if volatile(kind, t) {
            return;
        }
        h.write_u16(t);
        if kind == NFT_MSG_GETRULE && t == NFTA_RULE_EXPRESSIONS {
            expressions_hash(&mut h, v);
        } else if kind == NFT_MSG_GETOBJ && t == NFTA_OBJ_DATA {
            state_free(&mut h, object_type_name(u32_attr(msg, NFTA_OBJ_TYPE)), v);
        } else {
            h.write_usize(v.len());
            h.write(v);
        }
    });
    h.finish()
}

/// A list of expressions (`NFTA_LIST_ELEM` of `NFTA_EXPR_NAME` and `NFTA_EXPR_DATA`).
fn expressions_hash(h: &mut DefaultHasher, list: &[u8]) {
    nested(list, |_, expr| {
        let (mut name, mut data): (&[u8], &[u8]) = (&[], &[]);
        nested(expr, |t, v| match t {
            NFTA_EXPR_NAME => name = v.strip_suffix(&[0]).unwrap_or(v),
            NFTA_EXPR_DATA => data = v,
            _ => {}
        });
        h.write_u8(0xee);
        h.write(name);
        state_free(h, name, data);
    });
}

/// The expression name that a stateful object type shares (`NFT_OBJECT_COUNTER`,
/// `NFT_OBJECT_QUOTA`), for [`state_free`]; other types are configuration only.
fn object_type_name(t: Option<u32>) -> &'static [u8] {
    match t {
        Some(1) => b"counter",
        Some(2) => b"quota",
        _ => b"",
    }
}

/// One set element: its attributes, without its expiration, and its stateful expressions
/// by name only.
fn element_hash(e: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    nested(e, |t, v| match t {
        // NFTA_SET_ELEM_EXPIRATION
        5 => {}
        NFTA_SET_ELEM_EXPR => expressions_hash(&mut h, &nla(NFTA_LIST_ELEM, v)),
        NFTA_SET_ELEM_EXPRESSIONS => expressions_hash(&mut h, v),
        _ => {
            h.write_u16(t);
            h.write_usize(v.len());
            h.write(v);
        }
    });
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nfnl::NFNL_SUBSYS_NFTABLES;

    fn msg(kind: u16, attrs: &[Vec<u8>]) -> Vec<u8> {
        let body: Vec<u8> = attrs.concat();
        let mut m = vec![0u8; 20];
        m[..4].copy_from_slice(&((20 + body.len()) as u32).to_ne_bytes());
        m[4..6].copy_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | kind).to_ne_bytes());
        m.extend(body);
        m
    }

    fn expr(name: &str, data: &[u8]) -> Vec<u8> {
        nla(
            NFTA_LIST_ELEM,
            &[nla(NFTA_EXPR_NAME, &cstr(name)), nla(2, data)].concat(),
        )
    }

    fn rule(handle: u64, counter: u64, verdict: &[u8]) -> Vec<u8> {
        msg(
            NFT_MSG_GETRULE,
            &[
                nla(1, &cstr("kube-proxy")),
                nla(2, &cstr("services")),
                nla(3, &handle.to_be_bytes()),
                nla(
                    NFTA_RULE_EXPRESSIONS,
                    &[
                        expr("counter", &counter.to_be_bytes()),
                        expr("immediate", verdict),
                    ]
                    .concat(),
                ),
                nla(6, &(handle - 1).to_be_bytes()),
            ],
        )
    }

    #[test]
    fn a_rule_hash_ignores_handles_and_counters_but_not_what_it_does() {
        let a = object_hash(NFT_MSG_GETRULE, &rule(10, 0, b"jump a"));
        assert_eq!(a, object_hash(NFT_MSG_GETRULE, &rule(99, 12345, b"jump a")));
        assert_ne!(a, object_hash(NFT_MSG_GETRULE, &rule(10, 0, b"jump b")));
    }

    #[test]
    fn stateful_expressions_keep_their_configuration() {
        let hash = |name: &str, data: &[u8]| {
            let mut h = DefaultHasher::new();
            expressions_hash(&mut h, &expr(name, data));
            h.finish()
        };
        // limit: rate 10 against 1000, both configuration.
        let limit = |rate: u64| [nla(1, &rate.to_be_bytes()), nla(2, &1u64.to_be_bytes())].concat();
        assert_ne!(hash("limit", &limit(10)), hash("limit", &limit(1000)));
        // quota: bytes and the invert flag count; consumed and the depleted bit do not.
        let quota = |bytes: u64, flags: u32, consumed: u64| {
            [
                nla(1, &bytes.to_be_bytes()),
                nla(2, &flags.to_be_bytes()),
                nla(4, &consumed.to_be_bytes()),
            ]
            .concat()
        };
        let q = hash("quota", &quota(100, 0, 0));
        assert_eq!(q, hash("quota", &quota(100, 2, 99)));
        assert_ne!(q, hash("quota", &quota(200, 0, 0)));
        assert_ne!(q, hash("quota", &quota(100, 1, 0)));
        assert_eq!(hash("counter", b"1"), hash("counter", b"2"));
    }

    #[test]
    fn element_hashes_ignore_expiration_only() {
        let e = |key: &[u8], exp: u64| [nla(1, key), nla(5, &exp.to_be_bytes())].concat();
        assert_eq!(element_hash(&e(b"k1", 1)), element_hash(&e(b"k1", 2)));
        assert_ne!(element_hash(&e(b"k1", 1)), element_hash(&e(b"k2", 1)));
    }

    #[test]
    fn keys_are_spelled_as_the_kernel_holds_them() {
        let t = |types: &[&str]| types.iter().map(|t| t.to_string()).collect::<Vec<_>>();
        // A concatenation: each part in four-byte registers, network order.
        assert_eq!(
            key_bytes(
                &t(&["ipv4_addr", "inet_proto", "inet_service"]),
                "10.96.0.1 . tcp . 80"
            ),
            Some(vec![10, 96, 0, 1, 6, 0, 0, 0, 0, 80, 0, 0])
        );
        assert_eq!(
            key_bytes(&t(&["inet_proto", "inet_service"]), "sctp . 30001"),
            Some(vec![132, 0, 0, 0, 0x75, 0x31, 0, 0])
        );
        let v6 = key_bytes(&t(&["ipv6_addr", "ipv6_addr"]), "fd00::1 . fd00::1").unwrap();
        assert_eq!((v6.len(), v6[0], v6[15], v6[31]), (32, 0xfd, 1, 1));
        // One part alone keeps its own length.
        assert_eq!(key_bytes(&t(&["inet_service"]), "53"), Some(vec![0, 53]));
        assert_eq!(
            key_bytes(&t(&["ipv4_addr"]), "10.0.0.1"),
            Some(vec![10, 0, 0, 1])
        );
        // What is not handled is said so (the set is then listed whole).
        assert_eq!(key_bytes(&t(&["ipv4_addr"]), "10.0.0.0/8"), None);
        assert_eq!(key_bytes(&t(&["ether_addr"]), "00:11:22:33:44:55"), None);
        assert_eq!(
            key_bytes(&t(&["ipv4_addr", "inet_service"]), "10.0.0.1"),
            None
        );
    }

    #[test]
    fn digests_round_trip_and_name_the_first_difference() {
        let mut a = Digest::default();
        a.add("chain", "services", 1, 1);
        a.add("set", "cluster-ips", 2, 2);
        assert_eq!(Digest::from_text(&a.to_text()), Some(a.clone()));
        // A set's element sum goes along, and does not count in the comparison.
        let mut s = a.clone();
        s.add_set("hairpin", 5, (0xabc, 3));
        let back = Digest::from_text(&s.to_text()).unwrap();
        assert_eq!(back.sums.get("hairpin"), Some(&(0xabc, 3)));
        assert_eq!(back, s);
        let mut other = s.clone();
        other.sums.clear();
        assert_eq!(other, s);
        let mut b = a.clone();
        b.add("chain", "services", 3, 1);
        assert_eq!(
            a.first_difference(&b).as_deref(),
            Some("chain services changed")
        );
        b = a.clone();
        b.add("chain", "extra", 4, 4);
        assert_eq!(
            a.first_difference(&b).as_deref(),
            Some("chain extra was added")
        );
        assert_eq!(
            b.first_difference(&a).as_deref(),
            Some("chain extra is gone")
        );
        assert_eq!(a.first_difference(&a), None);
    }

    #[test]
    fn a_drift_names_changed_and_gone_chains_and_sets_and_nothing_else() {
        let mut rec = Digest::default();
        rec.add("table", "kube-proxy", 9, 9);
        rec.add("chain", "services", 1, 1);
        rec.add("chain", "endpoint-a", 2, 2);
        rec.add("set", "cluster-ips", 3, 3);
        rec.add("set", "hairpin", 4, 4);
        let mut now = rec.clone();
        assert_eq!(rec.drift(&now), Some(Drift::default()));
        now.add("chain", "services", 5, 1);
        now.add("chain", "theirs", 6, 6);
        now.add("set", "cluster-ips", 7, 3);
        now.objects
            .remove(&("chain".to_string(), "endpoint-a".to_string()));
        now.objects
            .remove(&("set".to_string(), "hairpin".to_string()));
        let d = rec.drift(&now).unwrap();
        assert_eq!(d.changed.chains, ["services"]);
        assert_eq!(d.changed.sets, ["cluster-ips"]);
        assert_eq!(d.added.chains, ["theirs"]);
        assert_eq!(d.gone.chains, ["endpoint-a"]);
        assert_eq!(d.gone.sets, ["hairpin"]);
        // A chain's own attributes (its policy, say) or a set made again (its handle):
        // writing the object again would not put them back.
        let mut a = rec.clone();
        a.add("chain", "services", 1, 8);
        assert_eq!(rec.drift(&a), None);
        // The table itself, or an object of another kind: only a full load mends it.
        let mut t = rec.clone();
        t.add("table", "kube-proxy", 8, 8);
        assert_eq!(rec.drift(&t), None);
        let mut o = rec.clone();
        o.add("object", "1 theirs", 8, 8);
        assert_eq!(rec.drift(&o), None);
    }
}
