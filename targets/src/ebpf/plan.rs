//! Planning `svc-compile apply --target ebpf`: pure functions from the wanted maps (a
//! [`Layout`], or this target's JSON) and what the pinned maps hold now (`bpftool -j map
//! dump` text) to the writes that move one to the other. `svc_node::ebpf` runs them.
//!
//! Invariants:
//! - Only the configuration maps are planned ([`MapId::configured`]): the runtime maps
//!   (`*_affinity`, `*_reverse_sk`) belong to the datapath, are shared by every
//!   generation and are never written or compared. The Maglev maps are not the socket
//!   load balancer's ([`MapId::in_program`]): apply neither creates nor writes them.
//! - [`diff`] leaves an entry whose bytes are already right alone, and orders the writes
//!   as Cilium's reconciler does, for every frontend at once: backends, slots, affinity
//!   matches, source ranges, rev-NAT, masters (slot 0) last, internal-scope ones before
//!   external ones; then deletes, masters first, backends last. A datapath reading a
//!   master in between finds every slot it counts and the scope it points to.
//! - [`fits`] says when the maps in place cannot take the new state (missing, another
//!   shape, too small): then the CLI builds a new generation instead of writing in place.

use super::layout::{Layout, MapId, MapSizes};
use std::collections::{BTreeMap, HashMap};
use svc_compiler::net::IpFamily;

/// One map as wanted: its shape and its entries in write order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WantedMap {
    pub name: String,
    /// bpftool's spelling: `hash`, `lru_hash`, `lpm_trie`.
    pub kind: String,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub flags: u32,
    pub entries: Vec<(Vec<u8>, Vec<u8>)>,
}

/// Every map the program declares, wanted state of all families of one node (maps of
/// a family without a document are wanted empty).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Wanted {
    /// By name.
    pub maps: BTreeMap<String, WantedMap>,
}

/// One write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Update {
        map: String,
        key: Vec<u8>,
        value: Vec<u8>,
    },
    Delete {
        map: String,
        key: Vec<u8>,
    },
}

/// What a map holds now: key → value.
pub type Contents = HashMap<Vec<u8>, Vec<u8>>;

impl MapId {
    /// Whether svc-compile writes this map (the others are the datapath's, or not the
    /// socket load balancer's at all).
    pub fn configured(self) -> bool {
        !matches!(self, MapId::Affinity | MapId::ReverseSk | MapId::Maglev)
    }

    /// Whether `bpf/sock_lb.c` declares this map. Cilium's socket load balancer selects
    /// at random and never reads a Maglev table (`bpf/bpf_sock.c`), nor does this one.
    pub fn in_program(self) -> bool {
        self != MapId::Maglev
    }
}

/// The name of every map the socket load balancer declares, of both families, and
/// whether it is configured.
pub fn all_maps() -> Vec<(&'static str, bool)> {
    let mut v: Vec<(&'static str, bool)> = Vec::new();
    for fam in [IpFamily::IPv4, IpFamily::IPv6] {
        for id in MapId::ALL.into_iter().filter(|id| id.in_program()) {
            let n = id.name(fam);
            if !v.iter().any(|(m, _)| *m == n) {
                v.push((n, id.configured()));
            }
        }
    }
    v
}

/// The map and family of a map's name.
pub fn id_of(name: &str) -> Option<(MapId, IpFamily)> {
    for fam in [IpFamily::IPv4, IpFamily::IPv6] {
        for id in MapId::ALL {
            if id.name(fam) == name {
                return Some((id, fam));
            }
        }
    }
    None
}

impl Wanted {
    /// The maps of `layouts` (one per family), merged: the shared affinity-match map
    /// takes the entries of both.
    pub fn from_layouts(layouts: &[&Layout]) -> Wanted {
        let mut w = Wanted::default();
        for l in layouts {
            for m in &l.maps {
                if !m.id.configured() {
                    continue;
                }
                let entries: Vec<(Vec<u8>, Vec<u8>)> = l
                    .entries
                    .iter()
                    .filter(|e| e.map() == m.id)
                    .map(|e| (e.key(), e.value()))
                    .collect();
                w.add(WantedMap {
                    name: m.name.to_string(),
                    kind: m.id.kind().to_string(),
                    key_size: m.key_size,
                    value_size: m.value_size,
                    max_entries: m.max_entries,
                    flags: m.id.flags(),
                    entries,
                });
            }
        }
        w
    }

    /// The maps of this target's JSON documents (one per family), merged as
    /// [`Wanted::from_layouts`] does.
    pub fn from_json(docs: &[&str]) -> Result<Wanted, String> {
        let mut w = Wanted::default();
        for doc in docs {
            let v: serde_json::Value =
                serde_json::from_str(doc).map_err(|e| format!("not an ebpf JSON document: {e}"))?;
            if v["ebpfVersion"] != 1 {
                return Err("not an ebpf JSON document (no `ebpfVersion: 1`)".into());
            }
            for m in v["maps"].as_array().ok_or("no `maps` array")? {
                let name = m["name"].as_str().ok_or("a map without a name")?;
                let Some((id, _)) = id_of(name) else {
                    return Err(format!("unknown map `{name}`"));
                };
                if !id.configured() {
                    continue;
                }
                let num = |f: &str| {
                    m[f].as_u64()
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(|| format!("map {name}: no `{f}`"))
                };
                let mut entries = Vec::new();
                for e in m["entries"].as_array().ok_or("a map without entries")? {
                    let bytes = |f: &str| {
                        e[f].as_str()
                            .and_then(parse_hex)
                            .ok_or_else(|| format!("map {name}: an entry's `{f}` is not hex"))
                    };
                    entries.push((bytes("key")?, bytes("value")?));
                }
                let wm = WantedMap {
                    name: name.to_string(),
                    kind: m["type"].as_str().unwrap_or_default().to_string(),
                    key_size: num("keySize")?,
                    value_size: num("valueSize")?,
                    max_entries: num("maxEntries")?,
                    flags: num("flags")?,
                    entries,
                };
                for (k, v) in &wm.entries {
                    if k.len() != wm.key_size as usize || v.len() != wm.value_size as usize {
                        return Err(format!("map {name}: an entry of the wrong size"));
                    }
                }
                w.add(wm);
            }
        }
        Ok(w)
    }

    /// Every configuration map of both families, those no document named wanted empty
    /// (sized by `sizes`): a family that is gone is emptied, not left as it was.
    pub fn complete(mut self, sizes: &MapSizes) -> Wanted {
        for fam in [IpFamily::IPv4, IpFamily::IPv6] {
            for id in MapId::ALL {
                let name = id.name(fam);
                if !id.configured() || self.maps.contains_key(name) {
                    continue;
                }
                let (key_size, value_size) = id.sizes(fam);
                self.add(WantedMap {
                    name: name.to_string(),
                    kind: id.kind().to_string(),
                    key_size,
                    value_size,
                    max_entries: sizes.of(id),
                    flags: id.flags(),
                    entries: Vec::new(),
                });
            }
        }
        self
    }

    fn add(&mut self, m: WantedMap) {
        match self.maps.get_mut(&m.name) {
            Some(have) => {
                let mut seen: std::collections::HashSet<Vec<u8>> =
                    have.entries.iter().map(|(k, _)| k.clone()).collect();
                for e in m.entries {
                    if seen.insert(e.0.clone()) {
                        have.entries.push(e);
                    }
                }
                // A map both families share (affinity matches) holds both's entries,
                // which may not fit (the caller checks).
                have.max_entries = have.max_entries.max(m.max_entries);
            }
            None => {
                self.maps.insert(m.name.clone(), m);
            }
        }
    }

    /// What every configured map must hold afterwards (the read-back's expectation).
    pub fn expected(&self) -> BTreeMap<&str, Contents> {
        self.maps
            .values()
            .map(|m| (m.name.as_str(), m.entries.iter().cloned().collect()))
            .collect()
    }
}

/// `0a 60 00 0a` (or bpftool's `0x0a` words) as bytes.
pub fn parse_hex(s: &str) -> Option<Vec<u8>> {
    s.split_whitespace()
        .map(|w| u8::from_str_radix(w.trim_start_matches("0x"), 16).ok())
        .collect()
}

/// The entries of `bpftool -j map dump` output.
pub fn parse_dump(text: &str) -> Result<Contents, String> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("bpftool's dump is not JSON: {e}"))?;
    let mut out = Contents::new();
    for e in v.as_array().ok_or("bpftool's dump is not a list")? {
        let bytes = |f: &str| -> Result<Vec<u8>, String> {
            e[f].as_array()
                .ok_or_else(|| format!("a dump entry without `{f}`"))?
                .iter()
                .map(|b| {
                    b.as_str()
                        .and_then(|s| u8::from_str_radix(s.trim_start_matches("0x"), 16).ok())
                        .ok_or_else(|| format!("a dump entry's `{f}` is not hex bytes"))
                })
                .collect()
        };
        out.insert(bytes("key")?, bytes("value")?);
    }
    Ok(out)
}

/// The shape of a map in place, as `bpftool -j map show` says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shape {
    pub kind: String,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
}

/// Why the maps in place (`shapes`, by name) cannot take `wanted` by writes in place, or
/// `None` when they can. With their contents (`current`), also the peak of the writes:
/// [`diff`] makes every update before any delete, so a map holds its old and new keys
/// together for a moment.
pub fn fits(
    wanted: &Wanted,
    shapes: &BTreeMap<String, Shape>,
    current: Option<&BTreeMap<String, Contents>>,
) -> Option<String> {
    for m in wanted.maps.values() {
        if let (Some(now), Some(s)) = (current.and_then(|c| c.get(&m.name)), shapes.get(&m.name)) {
            let added = m
                .entries
                .iter()
                .filter(|(k, _)| !now.contains_key(k))
                .count();
            if now.len() + added > s.max_entries as usize {
                return Some(format!(
                    "map {} holds {} entries, the writes in place need {} at once",
                    m.name,
                    s.max_entries,
                    now.len() + added
                ));
            }
        }
        let Some(s) = shapes.get(&m.name) else {
            return Some(format!("map {} is not in place", m.name));
        };
        if s.kind != m.kind || s.key_size != m.key_size || s.value_size != m.value_size {
            return Some(format!("map {} has another shape", m.name));
        }
        if (s.max_entries as usize) < m.entries.len() || s.max_entries < m.max_entries {
            return Some(format!(
                "map {} holds {} entries, {} are wanted",
                m.name, s.max_entries, m.max_entries
            ));
        }
    }
    None
}

/// Write rank of an entry of map `name` (see the module docs); deletes go in reverse.
fn rank(name: &str, key: &[u8]) -> u8 {
    match id_of(name) {
        Some((MapId::Backends, _)) => 0,
        Some((MapId::Services, fam)) => {
            let a = if fam == IpFamily::IPv6 { 16 } else { 4 };
            let slot = u16::from_le_bytes([key[a + 2], key[a + 3]]);
            // Masters last; an internal-scope one before the external one whose
            // `TWO_SCOPES` flag sends connections to it.
            match (slot, key[a + 5]) {
                (0, 1) => 5,
                (0, _) => 6,
                _ => 1,
            }
        }
        Some((MapId::AffinityMatch, _)) => 2,
        Some((MapId::SourceRange, _)) => 3,
        Some((MapId::RevNat, _)) => 4,
        _ => 7,
    }
}

/// The writes that turn `current` (every configured map's contents, by name; a map
/// missing here is empty) into `wanted`; see the module docs for the order. Unchanged
/// entries are not written.
pub fn diff(wanted: &Wanted, current: &BTreeMap<String, Contents>) -> Vec<Op> {
    let empty = Contents::new();
    let mut updates: Vec<(u8, Op)> = Vec::new();
    let mut deletes: Vec<(u8, Op)> = Vec::new();
    for m in wanted.maps.values() {
        let now = current.get(&m.name).unwrap_or(&empty);
        let mut keep: std::collections::HashSet<&[u8]> = Default::default();
        for (k, v) in &m.entries {
            keep.insert(k);
            if now.get(k) != Some(v) {
                updates.push((
                    rank(&m.name, k),
                    Op::Update {
                        map: m.name.clone(),
                        key: k.clone(),
                        value: v.clone(),
                    },
                ));
            }
        }
        // Sorted, so that the plan is the same whatever order the dump had.
        let mut gone: Vec<&Vec<u8>> = now
            .keys()
            .filter(|k| !keep.contains(k.as_slice()))
            .collect();
        gone.sort();
        for k in gone {
            deletes.push((
                rank(&m.name, k),
                Op::Delete {
                    map: m.name.clone(),
                    key: k.clone(),
                },
            ));
        }
    }
    // Stable sorts: within a rank, write order (updates) or map then key (deletes).
    updates.sort_by_key(|(r, _)| *r);
    deletes.sort_by_key(|(r, _)| std::cmp::Reverse(*r));
    updates
        .into_iter()
        .chain(deletes)
        .map(|(_, op)| op)
        .collect()
}

/// The first map whose contents differ from what is wanted, and how (for the read-back's
/// error message).
pub fn first_mismatch(
    wanted: &Wanted,
    current: &BTreeMap<String, Contents>,
) -> Option<(String, String)> {
    diff(wanted, current).into_iter().next().map(|op| match op {
        Op::Update { map, key, value } => {
            let now = current.get(&map).and_then(|c| c.get(&key));
            (
                map,
                format!(
                    "key {} should be {}, the kernel shows {}",
                    super::hex(&key),
                    super::hex(&value),
                    now.map_or("nothing".into(), |v| super::hex(v))
                ),
            )
        }
        Op::Delete { map, key } => (
            map,
            format!("the kernel also shows key {}", super::hex(&key)),
        ),
    })
}

/// `ops` as `bpftool batch file` lines on the maps pinned in `dir` (for `--dry-run`).
pub fn batch_lines(ops: &[Op], dir: &str) -> String {
    let mut s = String::new();
    for op in ops {
        match op {
            Op::Update { map, key, value } => {
                s += &format!(
                    "map update pinned {dir}/{map} key hex {} value hex {}\n",
                    super::hex(key),
                    super::hex(value)
                )
            }
            Op::Delete { map, key } => {
                s += &format!(
                    "map delete pinned {dir}/{map} key hex {}\n",
                    super::hex(key)
                )
            }
        }
    }
    s
}
