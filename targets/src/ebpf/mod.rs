//! `ebpf`: one node's services as Cilium's load-balancing BPF maps (`bpf/lib/lb.h`,
//! `pkg/loadbalancer/maps`), the state Cilium's kube-proxy replacement keeps for the
//! same Services, in three renderings of one [`Layout`]:
//! - [`write_json`]: the IR of this target. Every map (name, type, sizes, max_entries,
//!   flags) and every entry as hex key and value (bytes separated by spaces, as bpftool
//!   prints them) plus a decoded form; and the id assignment.
//! - [`write_batch`]: a `bpftool batch file`: `map create` for every map, pinned under
//!   [`Options::pin_dir`], then `map update` lines in Cilium's write order. A compiled
//!   state has no previous generation, so there are no deletes.
//! - [`write_table`]: `cilium bpf lb list` (the services map, one row per entry).
//!
//! Byte order is Cilium's: addresses, ports and rev-NAT ids in network order; slots,
//! counts, backend ids, flags and the affinity timeout in host order (little-endian:
//! the maps are for x86-64 and arm64 nodes).

mod layout;

pub use layout::{
    assign_ids, flags_text, layout, Backend, Entry, Error, Frontend, FrontendKind, Ids, Layout,
    MapId, MapSpec, Scope, DEFAULT_MAX_ENTRIES,
};

use serde_json::{json, Value};
use std::fmt::Write as _;
use svc_compiler::ir::NodeView;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    pub format: Format,
    /// The bpffs directory the batch file pins maps under.
    pub pin_dir: String,
    /// The least max_entries of every map (raised to fit the entries).
    pub max_entries: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Json,
    Batch,
    Table,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            format: Format::Json,
            pin_dir: "/sys/fs/bpf/svc-compile".into(),
            max_entries: DEFAULT_MAX_ENTRIES,
        }
    }
}

/// The rendering [`Options::format`] selects; `previous` ids are kept (the lock file's).
pub fn write_string(
    view: &NodeView,
    previous: Option<&Ids>,
    opts: &Options,
) -> Result<String, Error> {
    let l = layout(view, previous, opts.max_entries)?;
    Ok(match opts.format {
        Format::Json => json_of(&l),
        Format::Batch => batch_of(&l, opts),
        Format::Table => table_of(&l),
    })
}

pub fn write_json(view: &NodeView, opts: &Options) -> Result<String, Error> {
    Ok(json_of(&layout(view, None, opts.max_entries)?))
}

pub fn write_batch(view: &NodeView, opts: &Options) -> Result<String, Error> {
    Ok(batch_of(&layout(view, None, opts.max_entries)?, opts))
}

pub fn write_table(view: &NodeView, opts: &Options) -> Result<String, Error> {
    Ok(table_of(&layout(view, None, opts.max_entries)?))
}

/// `0a 60 00 0a`: bpftool's byte spelling (input after `hex`, and its dumps).
pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 3);
    for (i, b) in bytes.iter().enumerate() {
        if i > 0 {
            s.push(' ');
        }
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn decoded(e: &Entry) -> Value {
    match e {
        Entry::Master {
            frontend,
            count,
            qcount,
            rev_nat,
            flags,
            affinity_timeout,
        } => {
            let mut v = json!({
                "frontend": frontend.to_string(),
                "slot": 0,
                "count": count,
                "qcount": qcount,
                "revNat": rev_nat,
                "flags": format!("{flags:#06x}"),
                "flagsText": flags_text(*flags),
            });
            if let Some(t) = affinity_timeout {
                v["affinityTimeout"] = json!(t);
            }
            v
        }
        Entry::Slot {
            frontend,
            slot,
            backend_id,
            backend,
            rev_nat,
            flags,
        } => json!({
            "frontend": frontend.to_string(),
            "slot": slot,
            "backendId": backend_id,
            "backend": backend.to_string(),
            "revNat": rev_nat,
            "flags": format!("{flags:#06x}"),
        }),
        Entry::Backend {
            id,
            backend,
            terminating,
        } => json!({
            "id": id,
            "backend": backend.to_string(),
            "state": if *terminating { "terminating" } else { "active" },
        }),
        Entry::RevNat { id, frontend } => json!({
            "id": id,
            "address": frontend.addr.to_string(),
        }),
        Entry::AffinityMatch {
            backend_id,
            rev_nat,
        } => json!({ "backendId": backend_id, "revNat": rev_nat }),
        Entry::SourceRange { rev_nat, cidr } => json!({
            "revNat": rev_nat,
            "cidr": cidr.network().to_string(),
        }),
    }
}

fn json_of(l: &Layout) -> String {
    let maps: Vec<Value> = l
        .maps
        .iter()
        .map(|m| {
            let entries: Vec<Value> = l
                .entries
                .iter()
                .filter(|e| e.map() == m.id)
                .map(|e| json!({ "key": hex(&e.key()), "value": hex(&e.value()), "decoded": decoded(e) }))
                .collect();
            json!({
                "name": m.name,
                "type": m.id.kind(),
                "keySize": m.key_size,
                "valueSize": m.value_size,
                "maxEntries": m.max_entries,
                "flags": m.id.flags(),
                "entries": entries,
            })
        })
        .collect();
    let services: serde_json::Map<String, Value> = l
        .ids
        .services
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let backends: serde_json::Map<String, Value> = l
        .ids
        .backends
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let doc = json!({
        "ebpfVersion": 1,
        "node": l.node,
        "family": l.family.as_str(),
        "maps": maps,
        "ids": { "services": services, "backends": backends },
    });
    let mut s = serde_json::to_string_pretty(&doc).expect("JSON serialises");
    s.push('\n');
    s
}

fn batch_of(l: &Layout, opts: &Options) -> String {
    let dir = opts.pin_dir.trim_end_matches('/');
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# svc-compile: Cilium load-balancing maps of node {} ({}).\n# Load with `bpftool batch file FILE`; the pins must not exist yet.",
        l.node,
        l.family.as_str()
    );
    for m in &l.maps {
        // The kernel keeps 15 bytes of a map name; the pin keeps the whole name.
        let _ = write!(
            s,
            "map create {dir}/{} type {} key {} value {} entries {} name {}",
            m.name,
            m.id.kind(),
            m.key_size,
            m.value_size,
            m.max_entries,
            &m.name[..m.name.len().min(15)]
        );
        if m.id.flags() != 0 {
            let _ = write!(s, " flags {}", m.id.flags());
        }
        s.push('\n');
    }
    for e in &l.entries {
        let _ = writeln!(
            s,
            "map update pinned {dir}/{} key hex {} value hex {}",
            e.map().name(l.family),
            hex(&e.key()),
            hex(&e.value())
        );
    }
    s
}

fn table_of(l: &Layout) -> String {
    // Rows by frontend (write order of masters), master first then slots.
    let mut rows: Vec<(String, String)> = Vec::new();
    let any = match l.family {
        svc_compiler::net::IpFamily::IPv4 => "0.0.0.0:0",
        svc_compiler::net::IpFamily::IPv6 => "[::]:0",
    };
    let mut slots: std::collections::HashMap<Frontend, Vec<&Entry>> = Default::default();
    for e in &l.entries {
        if let Entry::Slot { frontend, .. } = e {
            slots.entry(*frontend).or_default().push(e);
        }
    }
    for e in &l.entries {
        if let Entry::Master {
            frontend,
            rev_nat,
            flags,
            ..
        } = e
        {
            rows.push((
                format!("{frontend} (0)"),
                format!("{any} ({rev_nat}) (0) [{}] ", flags_text(*flags)),
            ));
            for s in slots.get(frontend).into_iter().flatten() {
                if let Entry::Slot {
                    slot,
                    backend,
                    rev_nat,
                    ..
                } = s
                {
                    rows.push((
                        format!("{frontend} ({slot})"),
                        format!("{backend} ({rev_nat}) ({slot})"),
                    ));
                }
            }
        }
    }
    // Go's tabwriter as cilium-dbg sets it up: min width 5, padding 3, spaces.
    let head = ("SERVICE ADDRESS", "BACKEND ADDRESS (REVNAT_ID) (SLOT)");
    let width = rows
        .iter()
        .map(|r| r.0.len())
        .chain([head.0.len()])
        .max()
        .unwrap_or(0)
        + 3;
    let width = width.max(5);
    let mut s = String::new();
    for (a, b) in
        std::iter::once((head.0, head.1)).chain(rows.iter().map(|(a, b)| (a.as_str(), b.as_str())))
    {
        let _ = writeln!(s, "{a:<width$}{b}");
    }
    s
}

#[cfg(test)]
mod tests;
