//! Planning an IPVS apply (`--target ipvs`): four tools, one plan.
//!
//! The compiled document is the target's bundle (`# ==== PART: … ====` sections: `ipset`,
//! `ipvsadm`, `addresses`, `iptables`). The node's state is read by one shell script
//! ([`READ`]) that prints `ipset save`, `ipvsadm -S -n`, the IPVS timeouts, kube-ipvs0's
//! addresses of the family and `iptables-save`, each after a `#### SECTION` line. The load
//! document is a POSIX `sh` script: each tool reads its part from a here-document, so
//! `--dry-run` prints exactly what runs and the frame's detached loader (`sh FILE`) runs it
//! to the end even if svc-compile is killed.
//!
//! # Owned
//!
//! - ipsets: the sets the document creates, those the last apply owned, and our own
//!   swap scratch sets ([`TMP_PREFIX`]);
//! - kube-ipvs0's addresses of this family that the document or the last apply bound;
//! - virtual servers (with all their real servers) that the document or the last apply
//!   declared, or whose address is an owned kube-ipvs0 address or in our KUBE-IPVS-IPS set
//!   on the node, or whose port is in our KUBE-NODE-PORT-… sets on the node (so what a
//!   load that was killed before its record left is still ours). A virtual server on any
//!   other address and port (a user's) is never touched;
//! - the IPVS timeouts, only when the document has a `--set` line;
//! - iptables: what the iptables planner owns ([`crate::iptables::plan`], reused for the part).
//!
//! # Order of the load script
//!
//! 1. `ipset restore`: new sets created; a set whose content changes is built beside the
//!    old under a scratch name and switched with `ipset swap` (atomic per set), the scratch
//!    set destroyed;
//! 2. `ipvsadm -R`: timeouts, new virtual servers, changed ones edited (`-E`), real servers
//!    added, edited, removed (`-d`) — a virtual server exists with its real servers before
//!    its address becomes local;
//! 3. the sysctls IPVS mode needs (`net.ipv4.vs.conntrack=1`, …, as the `addresses` part
//!    lists them);
//! 4. `ip -batch`: kube-ipvs0 created if missing, new addresses bound, stale ones removed;
//! 5. `ipvsadm -R`: virtual servers no longer wanted deleted (their address is gone);
//! 6. `iptables-restore --noflush`: the iptables planner's load (rules match the sets,
//!    which hold what they will need from step 1 on);
//! 7. `ipset restore`: sets no longer wanted destroyed (no rule names them any more).
//!
//! Each step is its own kernel transaction at best (per set, per table, per command for
//! ipvsadm and ip): the whole is not atomic. A failed step stops the script (`set -e`;
//! `ipvsadm -R` reports errors only on stderr, so any output there fails the step);
//! [`Plan::revert`] then moves every owned object back to what the node showed before.
//!
//! Changes are always computed against the node's state, in the kernel's spelling learnt
//! from the scratch namespace, so only what differs is touched (a set that holds the same
//! entries is not swapped, an unchanged virtual server is not edited). `Mode` is the
//! iptables planner's (full when there is no record; incremental when its chains drifted,
//! which it mends chain by chain), made full by a drift of the IPVS parts.

use crate::iptables::plan::Iptables;
use crate::plan::{scratch, Commands, Family, Mode, Owned, Plan, Planner};
use crate::plan::{Prepared, Previous, Step, Summary, Tool};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::Arc;

/// Prefix of the sets a swap builds beside the real one (`ipset` names ≤ 31 bytes).
pub const TMP_PREFIX: &str = "SVC-TMP-";

/// The IPVS back end's [`Planner`].
pub struct Ipvs;

const SECTIONS: [&str; 5] = ["ipset", "ipvsadm", "timeout", "addresses", "iptables"];

/// `ipvsadm -S -n` until two reads in a row agree (at most 20). The kernel's table of
/// virtual servers is one for all network namespaces, and a dump resumes each message at
/// a count of all of them: a namespace adding or removing servers meanwhile (another
/// apply's scratch namespace, or its teardown, which the kernel does later) shifts the
/// count, and this namespace's listing repeats or skips a server.
const STABLE_IPVSADM: &str = "a=$(ipvsadm -S -n); n=0
while b=$(ipvsadm -S -n) && [ \"$a\" != \"$b\" ] && [ $n -lt 20 ]; do a=$b; n=$((n + 1)); done
printf '%s\\n' \"$a\"
";

/// The node read, `$F` = `-4`/`-6` and `$S` = `iptables-save`/`ip6tables-save` set first.
const READ: &str = "set -e
echo '#### ipset'; ipset save
echo '#### ipvsadm'
";
const READ_REST: &str = "echo '#### timeout'; ipvsadm -L --timeout
echo '#### addresses'
if ip link show dev kube-ipvs0 >/dev/null 2>&1; then echo 'link kube-ipvs0'; ip -o $F addr show dev kube-ipvs0; fi
echo '#### iptables'; $S
";

fn read_script(family: Family) -> String {
    let (f, s) = match family {
        Family::V4 => ("-4", "iptables-save"),
        Family::V6 => ("-6", "ip6tables-save"),
    };
    format!("F={f}; S={s}\n{READ}{STABLE_IPVSADM}{READ_REST}")
}

fn restore(family: Family) -> &'static str {
    match family {
        Family::V4 => "iptables-restore",
        Family::V6 => "ip6tables-restore",
    }
}

/// Splits text at `marker NAME` lines into (name → text).
fn sections<'a>(text: &'a str, marker: &str) -> BTreeMap<&'a str, String> {
    let mut out: BTreeMap<&str, String> = BTreeMap::new();
    let mut cur: Option<&str> = None;
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix(marker) {
            let name = rest.split_whitespace().next().unwrap_or("");
            let name = name.trim_end_matches(':');
            cur = Some(name);
            out.entry(name).or_default();
            continue;
        }
        if let Some(c) = cur {
            let s = out.get_mut(c).expect("entered above");
            s.push_str(l);
            s.push('\n');
        }
    }
    out
}

/// The compiled bundle's four parts.
fn doc_parts(doc: &str) -> Result<BTreeMap<&str, String>, String> {
    let parts = sections(doc, "# ==== ");
    for p in ["ipset", "ipvsadm", "addresses", "iptables"] {
        if !parts.contains_key(p) {
            return Err(format!(
                "the document has no `# ==== {p}: …` part (apply takes the whole `--target ipvs` output, not one --part)"
            ));
        }
    }
    Ok(parts)
}

/// A node read (or an owned-state text, which has the same sections).
fn read_parts(text: &str) -> Result<BTreeMap<&str, String>, String> {
    let parts = sections(text, "#### ");
    if !text.trim().is_empty() {
        for p in SECTIONS {
            if p != "timeout" && !parts.contains_key(p) {
                return Err(format!("the node read has no `#### {p}` section"));
            }
        }
    }
    Ok(parts)
}

/// One ipset: its `create` line's words after the name (without the kernel's `bucketsize`
/// and random `initval`), and its entries, sorted.
#[derive(Clone, Debug, PartialEq, Eq)]
struct IpSet {
    header: String,
    entries: BTreeSet<String>,
}

impl IpSet {
    fn kind(&self) -> &str {
        self.header.split_whitespace().next().unwrap_or("")
    }
}

fn parse_ipsets(text: &str) -> Result<BTreeMap<String, IpSet>, String> {
    let mut sets: BTreeMap<String, IpSet> = BTreeMap::new();
    for (i, l) in text.lines().enumerate() {
        let l = l.trim_end();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let mut w = l.split_whitespace();
        match (w.next(), w.next()) {
            (Some("create"), Some(name)) => {
                let mut words = Vec::new();
                while let Some(x) = w.next() {
                    if x == "bucketsize" || x == "initval" {
                        w.next();
                    } else {
                        words.push(x);
                    }
                }
                sets.insert(
                    name.to_string(),
                    IpSet {
                        header: words.join(" "),
                        entries: BTreeSet::new(),
                    },
                );
            }
            (Some("add"), Some(name)) => {
                let entry = w.collect::<Vec<_>>().join(" ");
                sets.get_mut(name)
                    .ok_or_else(|| format!("ipset line {}: `{l}` before its set", i + 1))?
                    .entries
                    .insert(entry);
            }
            _ => return Err(format!("ipset line {}: cannot read `{l}`", i + 1)),
        }
    }
    Ok(sets)
}

fn write_set(out: &mut String, name: &str, s: &IpSet) {
    let _ = writeln!(out, "create {name} {}", s.header);
    for e in &s.entries {
        let _ = writeln!(out, "add {name} {e}");
    }
}

/// One virtual server: its `-A` line's words after the service, and its real servers
/// (`-r ADDR` → the words after it).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
struct Virtual {
    opts: String,
    reals: BTreeMap<String, String>,
}

/// Virtual servers by service (`-t 10.0.0.1:80`).
type Servers = BTreeMap<String, Virtual>;

/// `-t 10.0.0.1:80` (the service words of an `ipvsadm -S` line) → its address.
fn service_addr(key: &str) -> String {
    let hp = key.split_whitespace().nth(1).unwrap_or("");
    let host = hp.rsplit_once(':').map_or(hp, |(h, _)| h);
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .to_string()
}

/// `ipvsadm -S -n` (or the ipvsadm part): service key → server. `--set` lines give the
/// timeouts.
fn parse_ipvs(text: &str) -> Result<(Servers, Option<[u32; 3]>), String> {
    let mut vs: BTreeMap<String, Virtual> = BTreeMap::new();
    let mut timeouts = None;
    for (i, l) in text.lines().enumerate() {
        let l = l.trim_end();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let w: Vec<&str> = l.split_whitespace().collect();
        let bad = || format!("ipvsadm line {}: cannot read `{l}`", i + 1);
        if w[0] == "--set" {
            let t: Vec<u32> = w[1..]
                .iter()
                .map(|x| x.parse().map_err(|_| bad()))
                .collect::<Result<_, _>>()?;
            timeouts = Some(t.try_into().map_err(|_| bad())?);
            continue;
        }
        if w.len() < 3 {
            return Err(bad());
        }
        let key = format!("{} {}", w[1], w[2]);
        match w[0] {
            "-A" => {
                vs.entry(key).or_default().opts = w[3..].join(" ");
            }
            "-a" => {
                let r = w.iter().position(|x| *x == "-r").ok_or_else(bad)?;
                let addr = w.get(r + 1).ok_or_else(bad)?;
                let rest: Vec<&str> = w[3..r].iter().chain(&w[r + 2..]).copied().collect();
                vs.get_mut(&key)
                    .ok_or_else(|| format!("ipvsadm line {}: `{l}` before its service", i + 1))?
                    .reals
                    .insert(addr.to_string(), rest.join(" "));
            }
            _ => return Err(bad()),
        }
    }
    Ok((vs, timeouts))
}

/// `Timeout (tcp tcpfin udp): 900 120 300`.
fn parse_timeouts(text: &str) -> Option<[u32; 3]> {
    let v: Vec<u32> = text
        .split_once(':')?
        .1
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    v.try_into().ok()
}

/// kube-ipvs0's addresses in the `ip -o addr` read (`ADDR/LEN`), and whether it exists;
/// for the addresses part, the `address add` lines.
fn parse_addresses(text: &str) -> (bool, BTreeSet<String>) {
    let mut link = false;
    let mut addrs = BTreeSet::new();
    for l in text.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        if l.starts_with("link ") {
            link = true;
        } else if let Some(i) = w.iter().position(|x| *x == "inet" || *x == "inet6") {
            if let Some(a) = w.get(i + 1) {
                addrs.insert(a.to_string());
            }
        } else if w.first() == Some(&"address") && w.get(1) == Some(&"add") {
            if let Some(a) = w.get(2) {
                addrs.insert(a.to_string());
            }
        }
    }
    (link, addrs)
}

/// The IPVS-side state of a node (or of an expectation), cut to what is owned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct State {
    sets: BTreeMap<String, IpSet>,
    servers: Servers,
    timeouts: Option<[u32; 3]>,
    link: bool,
    addrs: BTreeSet<String>,
}

/// What is ours in a node read (see the module docs).
#[derive(Clone, Debug, Default)]
struct Ownership {
    sets: BTreeSet<String>,
    servers: BTreeSet<String>,
    addrs: BTreeSet<String>,
    /// (`-t`/`-u`/`--sctp-service`, port): node ports our sets on the node hold.
    node_ports: BTreeSet<(String, u16)>,
    timeouts: bool,
}

impl Ownership {
    fn owns_set(&self, name: &str) -> bool {
        self.sets.contains(name) || name.starts_with(TMP_PREFIX)
    }
    fn owns_server(&self, key: &str) -> bool {
        let port = key
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse::<u16>().ok());
        let flag = key.split_whitespace().next().unwrap_or("");
        self.servers.contains(key)
            || self.addrs.contains(&host_of(&service_addr(key)))
            || port.is_some_and(|p| self.node_ports.contains(&(flag.to_string(), p)))
    }

    /// What our sets on the node say was loaded, even by a load no record describes (a
    /// SIGKILL between the load and the record; sets are the first step of every load):
    /// KUBE-IPVS-IPS's addresses (kube-ipvs0's VIPs) and the KUBE-NODE-PORT-… sets' ports.
    fn add_from_sets(&mut self, sets: &BTreeMap<String, IpSet>) {
        for (name, set) in sets.iter().filter(|(n, _)| self.sets.contains(*n)) {
            if name.ends_with("-IPVS-IPS") {
                self.addrs.extend(set.entries.iter().map(|e| host_of(e)));
            } else if name.contains("NODE-PORT-") {
                let flag = if name.contains("TCP") {
                    "-t"
                } else if name.contains("UDP") {
                    "-u"
                } else {
                    "--sctp-service"
                };
                for e in &set.entries {
                    // bitmap:port entries are ports; SCTP's hash:ip,port `IP,sctp:PORT`.
                    let port = e.rsplit(':').next().unwrap_or(e);
                    if let Ok(p) = port.parse() {
                        self.node_ports.insert((flag.to_string(), p));
                    }
                }
            }
        }
    }

    fn add(&mut self, st: &State) {
        self.sets.extend(st.sets.keys().cloned());
        self.servers.extend(st.servers.keys().cloned());
        self.addrs.extend(st.addrs.iter().map(|a| host_of(a)));
        self.timeouts |= st.timeouts.is_some();
    }

    /// The owned part of a node read's IPVS sections.
    fn cut(&self, parts: &BTreeMap<&str, String>) -> Result<State, String> {
        let get = |p: &str| parts.get(p).map_or("", String::as_str);
        let mut sets = parse_ipsets(get("ipset"))?;
        sets.retain(|n, _| self.owns_set(n));
        let (mut servers, _) = parse_ipvs(get("ipvsadm"))?;
        servers.retain(|k, _| self.owns_server(k));
        let (link, mut addrs) = parse_addresses(get("addresses"));
        addrs.retain(|a| self.addrs.contains(&host_of(a)));
        let timeouts = if self.timeouts {
            parse_timeouts(get("timeout"))
        } else {
            None
        };
        Ok(State {
            sets,
            servers,
            timeouts,
            link,
            addrs,
        })
    }
}

/// `10.0.0.1/32` → `10.0.0.1`.
fn host_of(a: &str) -> String {
    a.split('/').next().unwrap_or(a).to_string()
}

/// The canonical owned-state text: `#### ipset` (sets by name, entries sorted),
/// `#### ipvsadm` (servers by key, `-A` then `-a` lines), `#### timeout`, `#### addresses`
/// (one address a line; kube-ipvs0 itself is created when missing, never deleted), `#### iptables` (the iptables planner's).
fn format_owned(st: &State, iptables: &str) -> String {
    let mut out = String::from("#### ipset\n");
    for (n, s) in &st.sets {
        write_set(&mut out, n, s);
    }
    out.push_str("#### ipvsadm\n");
    for (k, v) in &st.servers {
        let _ = writeln!(out, "-A {k} {}", v.opts);
        for (r, o) in &v.reals {
            let _ = writeln!(out, "-a {k} -r {r} {o}");
        }
    }
    if let Some([a, b, c]) = st.timeouts {
        let _ = writeln!(out, "#### timeout\nTimeout (tcp tcpfin udp): {a} {b} {c}");
    }
    out.push_str("#### addresses\n");
    for a in &st.addrs {
        let _ = writeln!(out, "inet {a}");
    }
    out.push_str("#### iptables\n");
    out.push_str(iptables);
    out
}

/// A here-document with a delimiter the text does not contain.
fn heredoc(out: &mut String, command: &str, text: &str, tag: &str) {
    let mut delim = format!("SVC_{tag}");
    while text.lines().any(|l| l == delim) {
        delim.push('_');
    }
    let _ = write!(out, "{command} <<'{delim}'\n{text}{delim}\n");
}

/// `ipvsadm -R` with its errors made fatal: it reports them on stderr only.
fn ipvsadm(out: &mut String, text: &str, tag: &str) {
    if text.is_empty() {
        return;
    }
    heredoc(out, "svc_ipvsadm", text, tag);
}

const PRELUDE: &str = "set -e
# ipvsadm -R goes on after a failed line and exits 0: any error output fails the step.
svc_ipvsadm() { e=$(ipvsadm -R 2>&1 >/dev/null) || true; if [ -n \"$e\" ]; then echo \"ipvsadm -R: $e\" >&2; return 1; fi; }
";

/// The sysctls the `addresses` part lists as `#   key=value  (note)` (except those for
/// older kernels), as `sysctl -qw` lines.
fn sysctls(addresses: &str) -> Vec<String> {
    addresses
        .lines()
        .filter_map(|l| l.strip_prefix("#   "))
        .filter(|l| !l.contains("older than"))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|kv| kv.contains('='))
        .map(|kv| format!("sysctl -qw {kv}"))
        .collect()
}

/// The script that moves the owned IPVS state from `now` to `want` (steps 1–5, 7 of the
/// module docs) around `iptables` (step 6, an iptables-restore document, if any), with
/// the count of what it changes.
fn transition(
    now: &State,
    want: &State,
    sysctl: &[String],
    iptables: Option<&str>,
    family: Family,
) -> Result<(String, Summary), String> {
    let mut sum = Summary::default();
    // 1. sets
    let mut sets = String::new();
    let mut destroy = String::new();
    for n in now.sets.keys().filter(|n| n.starts_with(TMP_PREFIX)) {
        let _ = writeln!(sets, "destroy {n}");
    }
    for (n, s) in &want.sets {
        match now.sets.get(n) {
            None => {
                write_set(&mut sets, n, s);
                sum.rewritten += 1;
            }
            Some(old) if old == s => {}
            Some(old) => {
                if old.kind() != s.kind() {
                    return Err(format!(
                        "ipset {n} is {} on the node, the document makes it {}: destroy it first (nothing else uses it?)",
                        old.kind(),
                        s.kind()
                    ));
                }
                let tmp = format!("{TMP_PREFIX}{:016x}", fnv1a(n));
                write_set(&mut sets, &tmp, s);
                let _ = writeln!(sets, "swap {tmp} {n}\ndestroy {tmp}");
                sum.rewritten += 1;
            }
        }
    }
    for n in now
        .sets
        .keys()
        .filter(|n| !want.sets.contains_key(*n) && !n.starts_with(TMP_PREFIX))
    {
        let _ = writeln!(destroy, "destroy {n}");
        sum.deleted += 1;
    }
    // 2. and 5. servers
    let mut add = String::new();
    let mut del = String::new();
    if let (Some(w), n) = (want.timeouts, now.timeouts) {
        if Some(w) != n {
            let _ = writeln!(add, "--set {} {} {}", w[0], w[1], w[2]);
        }
    }
    for (k, v) in &want.servers {
        let old = now.servers.get(k);
        match old {
            None => {
                let _ = writeln!(add, "-A {k} {}", v.opts);
                sum.rewritten += 1;
            }
            Some(o) if o.opts != v.opts => {
                let _ = writeln!(add, "-E {k} {}", v.opts);
                sum.rewritten += 1;
            }
            Some(_) => {}
        }
        let empty = BTreeMap::new();
        let old_reals = old.map_or(&empty, |o| &o.reals);
        for (r, o) in &v.reals {
            match old_reals.get(r) {
                None => {
                    let _ = writeln!(add, "-a {k} -r {r} {o}");
                    sum.elements += 1;
                }
                Some(x) if x != o => {
                    let _ = writeln!(add, "-e {k} -r {r} {o}");
                    sum.elements += 1;
                }
                Some(_) => {}
            }
        }
        for r in old_reals.keys().filter(|r| !v.reals.contains_key(*r)) {
            let _ = writeln!(add, "-d {k} -r {r}");
            sum.elements += 1;
        }
    }
    for k in now
        .servers
        .keys()
        .filter(|k| !want.servers.contains_key(*k))
    {
        let _ = writeln!(del, "-D {k}");
        sum.deleted += 1;
    }
    // 4. addresses
    let mut ip = String::new();
    if want.link && !now.link {
        ip.push_str("link add kube-ipvs0 type dummy\n");
    }
    for a in want.addrs.difference(&now.addrs) {
        let _ = writeln!(ip, "address add {a} dev kube-ipvs0");
        sum.elements += 1;
    }
    for a in now.addrs.difference(&want.addrs) {
        let _ = writeln!(ip, "address del {a} dev kube-ipvs0");
        sum.elements += 1;
    }

    let mut out = String::new();
    if sets.is_empty()
        && add.is_empty()
        && ip.is_empty()
        && del.is_empty()
        && destroy.is_empty()
        && iptables.is_none()
    {
        return Ok((out, sum));
    }
    out.push_str(PRELUDE);
    if !sets.is_empty() {
        out.push_str("# 1. ipsets: new ones created, changed ones built beside and swapped in\n");
        heredoc(&mut out, "ipset restore", &sets, "IPSET");
    }
    if !add.is_empty() {
        out.push_str("# 2. virtual servers added or edited, real servers added, edited, removed\n");
        ipvsadm(&mut out, &add, "IPVSADM");
    }
    if !sysctl.is_empty() {
        out.push_str("# 3. the sysctls IPVS mode needs\n");
        for s in sysctl {
            let _ = writeln!(out, "{s}");
        }
    }
    if !ip.is_empty() {
        out.push_str("# 4. kube-ipvs0's addresses\n");
        heredoc(&mut out, "ip -batch -", &ip, "IP");
    }
    if !del.is_empty() {
        out.push_str("# 5. virtual servers no longer wanted\n");
        ipvsadm(&mut out, &del, "IPVSADM_DEL");
    }
    if let Some(doc) = iptables {
        out.push_str("# 6. the iptables rules\n");
        heredoc(
            &mut out,
            &format!("{} --noflush", restore(family)),
            doc,
            "IPTABLES",
        );
    }
    if !destroy.is_empty() {
        out.push_str("# 7. ipsets no longer wanted\n");
        heredoc(&mut out, "ipset restore", &destroy, "IPSET_DESTROY");
    }
    Ok((out, sum))
}

fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl Planner for Ipvs {
    fn commands(&self, family: Family) -> Commands {
        let read = read_script(family);
        Commands {
            read: crate::plan::argv(&["sh", "-c", &read, "svc-compile-read"]),
            // The load script with `--check`: `sh -n` and the iptables part's `--test`
            // where the node already has the sets it names (see `check_line`).
            check: crate::plan::argv(&["sh", "-c", CHECK, "svc-compile-check"]),
            load: crate::plan::argv(&["sh"]),
            // Its virtual servers are cleared before it exits: the kernel would remove
            // them with the namespace, later, while the node is read (`STABLE_IPVSADM`).
            scratch: scratch(&format!(
                "ip link set lo up && sh \"$1\" && {{ {read}}}; rc=$?; ipvsadm -C; exit $rc"
            )),
        }
    }

    /// ipvsadm (and the read script's `modprobe`) on a kernel without IPVS.
    fn explain(&self, stderr: &str) -> Option<String> {
        let no_ipvs = ["Can't initialize ipvs", "Module ip_vs not found"];
        no_ipvs.iter().any(|m| stderr.contains(m)).then(|| {
            "this kernel has no IPVS (module ip_vs): load it (`modprobe ip_vs`), or apply with --target iptables or nftables (IPVS mode is deprecated upstream)".to_string()
        })
    }

    fn family_of(&self, doc: &str) -> Option<Family> {
        crate::plan::family_in_first_line(doc, "# ==== ", ')')
    }

    fn tools(&self, family: Family) -> Vec<Tool> {
        let tool = |program, package| Tool { program, package };
        let mut t = vec![
            tool("ipset", "ipset"),
            tool("ipvsadm", "ipvsadm"),
            tool("ip", "iproute2"),
            tool("sysctl", "procps"),
        ];
        t.extend(Iptables.tools(family));
        t
    }

    /// Not yet: its owned text has four sections `targets::drift` does not read.
    fn drift(&self) -> bool {
        false
    }

    fn prepare(
        &self,
        new_doc: &str,
        family: Family,
        previous: Option<Previous>,
        kernel: &str,
        force_full: bool,
    ) -> Result<Prepared, String> {
        let parts = doc_parts(new_doc)?;
        let k = read_parts(kernel)?;
        let prev = match previous {
            Some(p) if !force_full => {
                let doc = doc_parts(p.document).ok();
                let snap = read_parts(p.snapshot).ok();
                doc.zip(snap)
            }
            _ => None,
        };
        // The iptables part through the iptables planner, with its slice of the record.
        let prev_ipt = prev.as_ref().map(|(d, s)| {
            (
                d["iptables"].clone(),
                s.get("iptables").cloned().unwrap_or_default(),
            )
        });
        let ipt = Iptables.prepare(
            &parts["iptables"],
            family,
            prev_ipt.as_ref().map(|(d, s)| Previous {
                document: d,
                snapshot: s,
            }),
            k.get("iptables").map_or("", String::as_str),
            force_full,
        )?;

        // What is owned: the document's objects and the last apply's.
        let (_, addrs) = parse_addresses(&parts["addresses"]);
        let (servers, timeouts) = parse_ipvs(&parts["ipvsadm"])?;
        let new = State {
            sets: parse_ipsets(&parts["ipset"])?,
            servers,
            timeouts: None,
            link: true,
            addrs,
        };
        let mut own = Ownership {
            timeouts: timeouts.is_some(),
            ..Ownership::default()
        };
        own.add(&new);
        let mut mode = ipt.mode.clone();
        if let Some((d, s)) = &prev {
            let (_, a) = parse_addresses(&d["addresses"]);
            own.addrs.extend(a.iter().map(|x| host_of(x)));
            let (sv, _) = parse_ipvs(&d["ipvsadm"])?;
            own.servers.extend(sv.into_keys());
            own.sets.extend(parse_ipsets(&d["ipset"])?.into_keys());
            let old = Ownership::default().cut_snapshot(s)?;
            own.add(&old);
            // Drift on the IPVS side also makes this a full apply (for the report).
            if mode == Mode::Incremental {
                let now = own.cut(&k)?;
                if format_owned(&now, "") != format_owned(&old, "") {
                    mode = Mode::Full(
                        "the node's IPVS state differs from what the last apply left".into(),
                    );
                }
            }
        }
        own.add_from_sets(&parse_ipsets(k.get("ipset").map_or("", String::as_str))?);
        let now = own.cut(&k)?;

        // The scratch namespace gets the whole new IPVS state and the iptables planner's
        // scratch document: its read gives the kernel's spelling of all of it.
        let empty = State::default();
        let ipt_scratch = (!ipt.scratch.is_empty()).then_some(ipt.scratch.as_str());
        let (mut scratch_doc, _) = transition(&empty, &new, &[], ipt_scratch, family)?;
        if scratch_doc.is_empty() {
            scratch_doc = "true\n".into();
        }
        Ok(Prepared {
            mode,
            scratch: scratch_doc,
            family,
            direct: false,
            step: Arc::new(Prep {
                ipt,
                own,
                now,
                sysctls: sysctls(&parts["addresses"]),
                timeouts,
            }),
        })
    }
}

/// `sh -n` the load script, then its iptables step under `--test` when every set it
/// names exists on the node (`iptables-restore --test` refuses a rule naming a missing
/// set; the scratch namespace already loaded it with its sets).
const CHECK: &str = r#"set -e
sh -n "$1"
doc=$(awk '/^# 6\. /{on=1; next} on && /^SVC_IPTABLES/{exit} on && !/--noflush <</{print}' "$1")
[ -n "$doc" ] || exit 0
cmd=$(awk '/^# 6\. /{getline; print $1; exit}' "$1")
for s in $(printf '%s\n' "$doc" | grep -o -- '--match-set [^ ]*' | cut -d' ' -f2 | sort -u); do
  ipset list -n | grep -qx -- "$s" || exit 0
done
printf '%s\n' "$doc" | "$cmd" --test --noflush
"#;

impl Ownership {
    /// The ownership a recorded snapshot implies (everything in it).
    fn cut_snapshot(&self, parts: &BTreeMap<&str, String>) -> Result<State, String> {
        let mut own = Ownership {
            timeouts: parts.contains_key("timeout"),
            ..Ownership::default()
        };
        let get = |p: &str| parts.get(p).map_or("", String::as_str);
        own.sets.extend(parse_ipsets(get("ipset"))?.into_keys());
        own.servers
            .extend(parse_ipvs(get("ipvsadm"))?.0.into_keys());
        own.addrs.extend(
            parse_addresses(get("addresses"))
                .1
                .iter()
                .map(|a| host_of(a)),
        );
        own.cut(parts)
    }
}

/// Step one's IPVS part.
#[derive(Debug)]
struct Prep {
    ipt: Prepared,
    own: Ownership,
    /// The owned IPVS state on the node now.
    now: State,
    sysctls: Vec<String>,
    /// The document's `--set` line (0 = keep the node's value).
    timeouts: Option<[u32; 3]>,
}

impl Step for Prep {
    fn plan(&self, prepared: &Prepared, scratch_output: &str) -> Result<Plan, String> {
        let sc = read_parts(scratch_output).map_err(|e| format!("scratch namespace: {e}"))?;
        let ipt = crate::plan::plan(&self.ipt, sc.get("iptables").map_or("", String::as_str))?;
        // The new state in the kernel's spelling: everything the scratch namespace shows
        // (it held nothing else), with the node's timeouts where the document keeps them.
        let mut want = sc_state(&sc)?;
        want.timeouts = self.timeouts.map(|set| {
            let node = self.now.timeouts.unwrap_or([0; 3]);
            [0, 1, 2].map(|i| if set[i] > 0 { set[i] } else { node[i] })
        });
        let (load, mut summary) = transition(
            &self.now,
            &want,
            &self.sysctls,
            ipt.load.as_deref(),
            prepared.family,
        )?;
        summary.rewritten += ipt.summary.rewritten;
        summary.deleted += ipt.summary.deleted;
        summary.jumps += ipt.summary.jumps;
        summary.repaired += ipt.summary.repaired;
        let mode = match (&prepared.mode, load.is_empty()) {
            (Mode::Incremental, true) => Mode::Unchanged,
            (Mode::Incremental | Mode::Unchanged, false) => Mode::Incremental,
            (m, _) => m.clone(),
        };
        let mut own = self.own.clone();
        own.add(&want);
        let expected = format_owned(&want, &ipt.expected);
        Ok(Plan {
            mode,
            load: (!load.is_empty()).then_some(load),
            expected,
            summary,
            warnings: ipt.warnings.clone(),
            touched: None,
            owner: Arc::new(Owner {
                own,
                before: self.now.clone(),
                family: prepared.family,
                ipt,
            }),
        })
    }
}

/// Everything a scratch read shows (all of it is the new state).
fn sc_state(sc: &BTreeMap<&str, String>) -> Result<State, String> {
    let get = |p: &str| sc.get(p).map_or("", String::as_str);
    let (link, addrs) = parse_addresses(get("addresses"));
    Ok(State {
        sets: parse_ipsets(get("ipset"))?,
        servers: parse_ipvs(get("ipvsadm"))?.0,
        timeouts: None,
        link,
        addrs,
    })
}

/// The owned state's reader and the revert of a failed load.
#[derive(Debug)]
struct Owner {
    own: Ownership,
    /// The owned IPVS state before the load.
    before: State,
    family: Family,
    ipt: Plan,
}

impl Owned for Owner {
    fn owned(&self, kernel: &str) -> Result<String, String> {
        let k = read_parts(kernel)?;
        let st = self.own.cut(&k)?;
        let ipt = self
            .ipt
            .owned(k.get("iptables").map_or("", String::as_str))?;
        Ok(format_owned(&st, &ipt))
    }

    /// Every owned object back to what the node showed before: IPVS objects by the same
    /// transition as a load (from now to before), iptables tables by the iptables planner.
    fn revert(&self, after: &str) -> Result<Option<String>, String> {
        let k = read_parts(after)?;
        let now = self.own.cut(&k)?;
        let ipt = self
            .ipt
            .revert(k.get("iptables").map_or("", String::as_str))?;
        let (script, _) = transition(&now, &self.before, &[], ipt.as_deref(), self.family)?;
        Ok((!script.is_empty()).then_some(script))
    }
}

#[cfg(test)]
mod tests;
