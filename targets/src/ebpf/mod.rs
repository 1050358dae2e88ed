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
//! `--target ebpf` ([`TARGET`]) picks the rendering with `--map-format` (JSON by default)
//! and refuses, before rendering, a node with more frontends than Cilium's 16-bit service
//! ids can name ([`check`]) and one whose entries overflow a map at the sizes
//! `--map-sizes` and the ClusterConfig give ([`map_full`], SVC502). Which Cilium it
//! follows and how that differs from kube-proxy: docs/ebpf.md. Ids are kept across runs by the `--lock` file (its `ebpf:`
//! section, per node and family, through [`NodeRenderer::render_locked`]) and, for
//! `apply`, by the last applied document.
//!
//! Byte order is Cilium's: addresses, ports and rev-NAT ids in network order; slots,
//! counts, backend ids, flags and the affinity timeout in host order (little-endian:
//! the maps are for x86-64 and arm64 nodes).

mod layout;
pub mod maglev;
pub mod plan;

pub use layout::{
    assign_ids, flags_text, frontend_count, layout, layout_with, occupancy, parse_backend,
    parse_frontend, state_flag, Agent, Backend, Entry, Error, Frontend, FrontendKind, Ids, Layout,
    MapId, MapSizes, MapSpec, Scope, DEFAULT_MAX_ENTRIES, MAX_FRONTENDS,
};

use crate::{Flag, NodeRenderer, Params, Render, Target};
use std::fmt::Write as _;
use std::net::SocketAddr;
use svc_compiler::diag::Diagnostic;
use svc_compiler::ir::{BackendState, EbpfAgent, EbpfMapSizes, LbAlgorithm, NodeView};
use svc_compiler::passes::allocate::NodeIds;

/// The diagnostic for a node whose entries overflow a map ([`NodeRenderer::input_errors`]).
pub const MAP_FULL_CODE: &str = "SVC502";

/// `--target ebpf`.
pub const TARGET: Target = Target {
    name: "ebpf",
    about: "Cilium's load-balancing BPF maps (JSON, a bpftool batch file or a table)",
    // Not `json`: with `--out DIR` the files are in the `--map-format` chosen.
    ext: "ebpf",
    render: Render::Node(|params, _| {
        Box::new(Renderer {
            opts: options(params),
        })
    }),
    flags: &[
        Flag {
            name: "map-format",
            value_name: "json|batch|table",
            help: "ebpf: the maps as JSON (default), `bpftool batch file` input or `cilium bpf lb list`",
            repeatable: false,
            file: false,
        },
        Flag {
            name: "pin-dir",
            value_name: "DIR",
            help: "ebpf: where the batch file pins the maps [default: /sys/fs/bpf/svc-compile]",
            repeatable: false,
            file: false,
        },
        Flag {
            name: "max-entries",
            value_name: "N",
            help: "ebpf: the size of every map, Cilium's --bpf-lb-map-max [default: ClusterConfig ebpfMapSizes, else 65536]",
            repeatable: false,
            file: false,
        },
        Flag {
            name: "map-sizes",
            value_name: "KEY=N,...",
            help: "ebpf: map sizes as Cilium's --bpf-lb-*-map-max set them (all, services, backends, rev-nat, affinity, source-ranges, maglev, sock-rev) [default: ClusterConfig ebpfMapSizes]",
            repeatable: false,
            file: false,
        },
        Flag {
            name: "lb-algorithm",
            value_name: "random|maglev",
            help: "ebpf: Cilium's --bpf-lb-algorithm: maglev writes the cilium_lb{4,6}_maglev tables [default: ClusterConfig ebpfLbAlgorithm, else random]",
            repeatable: false,
            file: false,
        },
        Flag {
            name: "lb-algorithm-annotation",
            value_name: "on|off",
            help: "ebpf: Cilium's --bpf-lb-algorithm-annotation: honour service.cilium.io/lb-algorithm [default: ClusterConfig ebpfLbAlgorithmAnnotation, else off]",
            repeatable: false,
            file: false,
        },
        Flag {
            name: "maglev-table-size",
            value_name: "M",
            help: "ebpf: Cilium's --bpf-lb-maglev-table-size, a prime from 251 to 131071 [default: ClusterConfig ebpfMaglevTableSize, else 16381]",
            repeatable: false,
            file: false,
        },
        Flag {
            name: "maglev-hash-seed",
            value_name: "BASE64",
            help: "ebpf: Cilium's --bpf-lb-maglev-hash-seed, base64 of 12 bytes [default: ClusterConfig ebpfMaglevHashSeed, else JLfvgnHc2kaSUFaI]",
            repeatable: false,
            file: false,
        },
    ],
    planner: None,
    trace: None,
    deprecated: None,
};

/// [`Options`] from the target's flags; an `Err` is a one-line usage error.
pub fn options(params: &Params) -> Result<Options, String> {
    let mut o = Options::default();
    if let Some(f) = params.get("map-format") {
        o.format = match f {
            "json" => Format::Json,
            "batch" => Format::Batch,
            "table" => Format::Table,
            _ => return Err(format!("--map-format `{f}`: use json, batch or table")),
        };
    }
    if let Some(d) = params.get("pin-dir") {
        // A batch line is split at blanks, and bpftool pins only absolute paths.
        if !d.starts_with('/') || d.contains(char::is_whitespace) {
            return Err(format!(
                "--pin-dir `{d}`: give an absolute path without blanks (under a bpffs mount)"
            ));
        }
        o.pin_dir = d.to_string();
    }
    if let Some(m) = params.get("map-sizes") {
        o.sizes = EbpfMapSizes::parse(m).map_err(|e| format!("--map-sizes `{m}`: {e}"))?;
    }
    if let Some(n) = params.get("max-entries") {
        o.sizes.all =
            Some(n.parse().ok().filter(|&n| n > 0).ok_or_else(|| {
                format!("--max-entries `{n}`: give a number from 1 to 4294967295")
            })?);
    }
    if let Some(a) = params.get("lb-algorithm") {
        o.agent.lb_algorithm =
            Some(EbpfAgent::parse_algorithm(a).map_err(|e| format!("--lb-algorithm {e}"))?);
    }
    if let Some(a) = params.get("lb-algorithm-annotation") {
        o.agent.lb_algorithm_annotation = Some(match a {
            "on" => true,
            "off" => false,
            _ => return Err(format!("--lb-algorithm-annotation `{a}`: use on or off")),
        });
    }
    if let Some(m) = params.get("maglev-table-size") {
        o.agent.maglev_table_size =
            Some(EbpfAgent::parse_table_size(m).map_err(|e| format!("--maglev-table-size {e}"))?);
    }
    if let Some(h) = params.get("maglev-hash-seed") {
        EbpfAgent::murmur_seed(h).map_err(|e| format!("--maglev-hash-seed {e}"))?;
        o.agent.maglev_hash_seed = Some(h.to_string());
    }
    Ok(o)
}

/// The largest Maglev table a `bpftool batch` line can write: bpftool splits a line into a
/// bounded number of words (`BATCH_ARG_NB_MAX`), and a table of M entries is 4M hex
/// words (509 entries load, 1021 do not: "too many arguments").
pub const BATCH_MAX_TABLE_SIZE: u32 = 509;

/// [`TARGET`]'s renderer: one node at a time, nothing shared between nodes (the ids of
/// one node's maps depend on all of its frontends).
struct Renderer {
    opts: Result<Options, String>,
}

impl NodeRenderer for Renderer {
    fn check(&self, view: &NodeView) -> Result<(), String> {
        let opts = self.opts.as_ref().map_err(Clone::clone)?;
        let agent = opts.agent_for(view);
        if opts.format == Format::Batch
            && agent.maglev_declared()
            && agent.table_size > BATCH_MAX_TABLE_SIZE
        {
            return Err(format!(
                "--map-format batch: a Maglev table of {} entries is one value of {} bytes, more words than a `bpftool batch` line takes (tables of up to {BATCH_MAX_TABLE_SIZE} entries fit); use --map-format json, or --maglev-table-size {BATCH_MAX_TABLE_SIZE} or less",
                agent.table_size,
                4 * agent.table_size
            ));
        }
        check(view).map_err(|e| format!("node {} ({}): {e}", view.node_name, view.family.as_str()))
    }

    fn input_errors(&self, view: &NodeView) -> Vec<Diagnostic> {
        let opts = self
            .opts
            .as_ref()
            .expect("NodeRenderer::check refuses bad flags first");
        map_full(view, &opts.sizes_for(view), &opts.agent_for(view))
    }

    fn render_into(&self, view: &NodeView, out: &mut String) {
        let opts = self
            .opts
            .as_ref()
            .expect("NodeRenderer::check refuses bad flags first");
        *out = write_string(view, None, opts)
            .expect("NodeRenderer::check and input_errors counted the frontends and entries");
    }

    fn render_locked(
        &self,
        view: &NodeView,
        locked: Option<&NodeIds>,
        out: &mut String,
    ) -> Option<NodeIds> {
        let opts = self
            .opts
            .as_ref()
            .expect("NodeRenderer::check refuses bad flags first");
        let previous = locked.map(Ids::from_lock);
        let l = layout_with(
            view,
            previous.as_ref(),
            &opts.sizes_for(view),
            &opts.agent_for(view),
        )
        .expect("NodeRenderer::check and input_errors counted the frontends and entries");
        *out = render(&l, opts);
        Some(l.ids.to_lock())
    }
}

/// `l` in the rendering [`Options::format`] selects.
pub fn render(l: &Layout, opts: &Options) -> String {
    match opts.format {
        Format::Json => json_of(l),
        Format::Batch => batch_of(l, opts),
        Format::Table => table_of(l),
    }
}

/// Whether `view` fits Cilium's maps: at most [`MAX_FRONTENDS`] frontends, so that every
/// one gets a service id. [`layout`] fails exactly when this does.
pub fn check(view: &NodeView) -> Result<(), Error> {
    check_at_most(view, MAX_FRONTENDS)
}

/// [`check`] with another limit (tests: a small one).
fn check_at_most(view: &NodeView, max: usize) -> Result<(), Error> {
    match frontend_count(view) {
        n if n > max => Err(Error::TooManyFrontends(n)),
        _ => Ok(()),
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    pub format: Format,
    /// The bpffs directory the batch file pins maps under.
    pub pin_dir: String,
    /// Map sizes the flags set (`--map-sizes`, `--max-entries` for `all`); each key set
    /// wins over the ClusterConfig's `ebpfMapSizes` ([`Options::sizes_for`]).
    pub sizes: EbpfMapSizes,
    /// Agent options the flags set (`--lb-algorithm`, ...); each one set wins over the
    /// ClusterConfig's ([`Options::agent_for`]).
    pub agent: EbpfAgent,
}

impl Options {
    /// The map sizes for `view`: the ClusterConfig's, overridden key by key by the flags.
    pub fn sizes_for(&self, view: &NodeView) -> MapSizes {
        MapSizes(view.ebpf_map_sizes.overridden_by(&self.sizes))
    }

    /// The agent options for `view`: the ClusterConfig's, overridden by the flags.
    pub fn agent_for(&self, view: &NodeView) -> Agent {
        Agent::of(&view.ebpf_agent.overridden_by(&self.agent))
    }
}

/// One [`MAP_FULL_CODE`] diagnostic per map `view`'s entries do not fit in at `sizes`
/// (the reconciler's updates would fail with E2BIG); none when everything fits.
pub fn map_full(view: &NodeView, sizes: &MapSizes, agent: &Agent) -> Vec<Diagnostic> {
    occupancy(view, agent)
        .into_iter()
        .filter(|&(id, n)| n > sizes.of(id) as usize)
        .map(|(id, n)| {
            let key = MapSizes::key(id);
            let option = MapSizes::option(id);
            Diagnostic::error(
                MAP_FULL_CODE,
                format!(
                    "node {} ({}): {n} entries for Cilium's {} map, which holds {}",
                    view.node_name,
                    view.family.as_str(),
                    id.name(view.family),
                    sizes.of(id)
                ),
            )
            .hint(format!(
                "give the map room: --map-sizes {key}=N (or `ebpfMapSizes: {key}=N` in the ClusterConfig), as the node's cilium-agent must with {option}=N (or --bpf-lb-map-max=N for every map)"
            ))
        })
        .collect()
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
            sizes: EbpfMapSizes::default(),
            agent: EbpfAgent::default(),
        }
    }
}

/// The rendering [`Options::format`] selects; `previous` ids are kept (the lock file's).
pub fn write_string(
    view: &NodeView,
    previous: Option<&Ids>,
    opts: &Options,
) -> Result<String, Error> {
    Ok(render(&layout_of(view, previous, opts)?, opts))
}

/// `view` laid out with the sizes and agent options of `opts` over the ClusterConfig's.
pub fn layout_of(view: &NodeView, previous: Option<&Ids>, opts: &Options) -> Result<Layout, Error> {
    layout_with(view, previous, &opts.sizes_for(view), &opts.agent_for(view))
}

pub fn write_json(view: &NodeView, opts: &Options) -> Result<String, Error> {
    Ok(json_of(&layout_of(view, None, opts)?))
}

pub fn write_batch(view: &NodeView, opts: &Options) -> Result<String, Error> {
    Ok(batch_of(&layout_of(view, None, opts)?, opts))
}

pub fn write_table(view: &NodeView, opts: &Options) -> Result<String, Error> {
    Ok(table_of(&layout_of(view, None, opts)?))
}

/// `0a 60 00 0a`: bpftool's byte spelling (input after `hex`, and its dumps).
pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 3);
    push_hex(&mut s, bytes);
    s
}

/// Appends `bytes` as [`hex`] does.
fn push_hex(s: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, b) in bytes.iter().enumerate() {
        if i > 0 {
            s.push(' ');
        }
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
}

/// The decoded form of an entry as a one-line JSON object. Every string in it is an
/// address, a number or a fixed word: nothing needs escaping.
fn push_decoded(s: &mut String, e: &Entry) {
    match e {
        Entry::Master {
            frontend,
            count,
            qcount,
            rev_nat,
            flags,
            affinity_timeout,
            algorithm,
        } => {
            let _ = write!(
                s,
                r#"{{"frontend": "{frontend}", "slot": 0, "count": {count}, "qcount": {qcount}, "revNat": {rev_nat}, "flags": "{flags:#06x}", "flagsText": "{}""#,
                flags_text(*flags)
            );
            if let Some(t) = affinity_timeout {
                let _ = write!(s, r#", "affinityTimeout": {t}"#);
            }
            if let Some(a) = algorithm {
                let _ = write!(s, r#", "lbAlgorithm": "{}""#, algorithm_name(*a));
            }
            s.push('}');
        }
        Entry::Slot {
            frontend,
            slot,
            backend_id,
            backend,
            rev_nat,
            flags,
        } => {
            let _ = write!(
                s,
                r#"{{"frontend": "{frontend}", "slot": {slot}, "backendId": {backend_id}, "backend": "{backend}", "revNat": {rev_nat}, "flags": "{flags:#06x}"}}"#
            );
        }
        Entry::Backend { id, backend, state } => {
            // The agent's state; the value's flag byte says terminating for both
            // terminating states.
            let state = match state {
                BackendState::Active => "active",
                BackendState::Terminating => "terminating",
                BackendState::TerminatingNotServing => "terminating-not-serving",
                BackendState::Maintenance => "maintenance",
            };
            let _ = write!(
                s,
                r#"{{"id": {id}, "backend": "{backend}", "state": "{state}"}}"#
            );
        }
        Entry::Wildcard { addr, flags } => {
            let _ = write!(
                s,
                r#"{{"frontend": "{}/ANY", "slot": 0, "wildcard": true, "count": 0, "revNat": 0, "flags": "{flags:#06x}", "flagsText": "{}"}}"#,
                SocketAddr::new(*addr, 0),
                flags_text(*flags)
            );
        }
        Entry::RevNat { id, frontend } => {
            let _ = write!(s, r#"{{"id": {id}, "address": "{}"}}"#, frontend.addr);
        }
        Entry::AffinityMatch {
            backend_id,
            rev_nat,
        } => {
            let _ = write!(s, r#"{{"backendId": {backend_id}, "revNat": {rev_nat}}}"#);
        }
        Entry::SourceRange { rev_nat, cidr } => {
            let _ = write!(
                s,
                r#"{{"revNat": {rev_nat}, "cidr": "{}"}}"#,
                cidr.network()
            );
        }
        Entry::Maglev {
            frontend,
            rev_nat,
            table,
        } => {
            let _ = write!(
                s,
                r#"{{"revNat": {rev_nat}, "frontend": "{frontend}", "inner": "{}"}}"#,
                table_counts(table)
            );
        }
    }
}

fn algorithm_name(a: LbAlgorithm) -> &'static str {
    match a {
        LbAlgorithm::Random => "random",
        LbAlgorithm::Maglev => "maglev",
    }
}

/// How often each backend id fills a Maglev table, ids ascending: `1(5461), 2(5460)`, as
/// Cilium's `lb/maps-dump` prints a table (`MAGLEV: ID=.. INNER=[...]`).
pub fn table_counts(table: &[u32]) -> String {
    let mut counts: std::collections::BTreeMap<u32, usize> = Default::default();
    for id in table {
        *counts.entry(*id).or_default() += 1;
    }
    let each: Vec<String> = counts.iter().map(|(id, n)| format!("{id}({n})")).collect();
    each.join(", ")
}

/// Written by hand (one entry a line): a generic JSON value tree of 10,000 services'
/// maps costs ten times as long.
fn json_of(l: &Layout) -> String {
    let mut s = String::with_capacity(l.entries.len() * 200);
    let _ = write!(
        s,
        "{{\n  \"ebpfVersion\": 1,\n  \"node\": {},\n  \"family\": \"{}\",\n  \"maps\": [",
        serde_json::to_string(&l.node).expect("a string serialises"),
        l.family.as_str()
    );
    for (mi, m) in l.maps.iter().enumerate() {
        let _ = write!(
            s,
            "{}\n    {{\n      \"name\": \"{}\",\n      \"type\": \"{}\",\n      \"keySize\": {},\n      \"valueSize\": {},\n      \"maxEntries\": {},\n      \"flags\": {},\n      \"entries\": [",
            if mi > 0 { "," } else { "" },
            m.name,
            m.id.kind(),
            m.key_size,
            m.value_size,
            m.max_entries,
            m.id.flags()
        );
        // A hash of maps: its entries are written as their inner map's contents.
        if let Some(v) = m.inner_value_size {
            s.truncate(s.len() - "\"entries\": [".len());
            let _ = write!(
                s,
                "\"inner\": {{\"type\": \"array\", \"keySize\": 4, \"valueSize\": {v}, \"maxEntries\": 1}},\n      \"entries\": ["
            );
        }
        let mut first = true;
        for e in l.entries.iter().filter(|e| e.map() == m.id) {
            s.push_str(if first { "\n        " } else { ",\n        " });
            first = false;
            s.push_str(r#"{"key": ""#);
            push_hex(&mut s, &e.key());
            s.push_str(if m.inner_value_size.is_some() {
                r#"", "innerKey": "00 00 00 00", "innerValue": ""#
            } else {
                r#"", "value": ""#
            });
            push_hex(&mut s, &e.value());
            s.push_str(r#"", "decoded": "#);
            push_decoded(&mut s, e);
            s.push('}');
        }
        s.push_str(if first {
            "]\n    }"
        } else {
            "\n      ]\n    }"
        });
    }
    s.push_str("\n  ],\n  \"ids\": {\n    \"services\": {");
    let ids = |s: &mut String, it: &mut dyn Iterator<Item = (String, u64)>| {
        let mut first = true;
        for (k, v) in it {
            s.push_str(if first { "\n      " } else { ",\n      " });
            first = false;
            let _ = write!(s, "\"{k}\": {v}");
        }
        s.push_str(if first { "}" } else { "\n    }" });
    };
    ids(
        &mut s,
        &mut l
            .ids
            .services
            .iter()
            .map(|(k, v)| (k.to_string(), *v as u64)),
    );
    s.push_str(",\n    \"backends\": {");
    ids(
        &mut s,
        &mut l
            .ids
            .backends
            .iter()
            .map(|(k, v)| (k.to_string(), *v as u64)),
    );
    s.push_str("\n  }\n}\n");
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
    // The kernel keeps 15 bytes of a map name; the pin keeps the whole name.
    let short = |name: &str| name[..name.len().min(15)].to_string();
    for m in &l.maps {
        // A hash of maps is created with an inner map of the shape every value has.
        if let Some(v) = m.inner_value_size {
            let _ = writeln!(
                s,
                "map create {dir}/{}_inner type array key 4 value {v} entries 1 name {}",
                m.name,
                short(m.name)
            );
        }
        let _ = write!(
            s,
            "map create {dir}/{} type {} key {} value {} entries {} name {}",
            m.name,
            m.id.kind(),
            m.key_size,
            m.value_size,
            m.max_entries,
            short(m.name)
        );
        if m.id.flags() != 0 {
            let _ = write!(s, " flags {}", m.id.flags());
        }
        if m.inner_value_size.is_some() {
            let _ = write!(s, " inner_map pinned {dir}/{}_inner", m.name);
        }
        s.push('\n');
    }
    for e in &l.entries {
        let map = e.map().name(l.family);
        if let Entry::Maglev { rev_nat, .. } = e {
            // Cilium's inner maps are not pinned; here each is, so that the batch can
            // name it in the outer map's update.
            let inner = format!("{dir}/{map}_inner_{rev_nat}");
            let _ = writeln!(
                s,
                "map create {inner} type array key 4 value {} entries 1 name {}\nmap update pinned {inner} key hex 00 00 00 00 value hex {}\nmap update pinned {dir}/{map} key hex {} value pinned {inner}",
                4 * l.agent.table_size,
                short(map),
                hex(&e.value()),
                hex(&e.key())
            );
            continue;
        }
        let _ = writeln!(
            s,
            "map update pinned {dir}/{map} key hex {} value hex {}",
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
        // A wildcard key prints protocol 0 as ANY (`u8proto.U8proto.String`).
        if let Entry::Wildcard { addr, flags } = e {
            rows.push((
                format!("{}/ANY (0)", SocketAddr::new(*addr, 0)),
                format!("{any} (0) (0) [{}] ", flags_text(*flags)),
            ));
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

#[cfg(test)]
mod write_order_tests;
