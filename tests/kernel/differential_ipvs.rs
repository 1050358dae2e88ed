//! The differential test's IPVS side (a child of [`super`], whose flows and checks it
//! reuses): generated manifests through `--target ipvs` in the IPVS VM, every flow checked
//! against the IR's expectation or, where IPVS mode differs, against a named rule read
//! from the compiled parts. Started inside the VM by `kernel::ipvs::golden_flows_ipvs`
//! (one boot for the whole IPVS suite) as [`guest_differential`].
//!
//! Runs [`DEFAULT_CASES`] generated manifests (seeds `SVC_DIFF_SEED` upwards, default 1;
//! `SVC_DIFF_IPVS_CASES=N` for another count, 0 for none). Budget: TCG runs about 20×
//! slower than the host; an apply plus a manifest's flows take 10–75 s there (the
//! iptables/nftables differential covers 150 manifests on the host).
//!
//! Each manifest is applied with `svc-compile apply --target ipvs` to one lab node (the
//! previous manifest's state is there: every load is an incremental or full apply of a
//! different cluster), conntrack is reset as in the other labs ([`Lab::reset_conntrack`]:
//! TCP TIME_WAIT entries stay, see `timewait.rs`), and the flows of
//! [`super::derive_flows`] run.
//!
//! Under TCG on a loaded host the first pass's 250 ms probe timeout is now and then
//! exceeded; the re-check (1 s) decides, and prints to the guest console the node's
//! conntrack counters (drops, insert failures) and the backends' TCP counters (PAWS
//! rejects) to tell a slow answer from a lost packet (seed 22 needed it in two runs,
//! seed 61 in one, there with no drop and no PAWS reject; neither in later runs).
//!
//! The IPVS expectation is iptables mode's ([`Flow::expect`]`[0]`), except where IPVS
//! works differently; each exception is one rule of [`ipvs_expect`], decided from the
//! compiled IPVS parts (never by leaving the flow out), and named in a failure. Where a
//! rule derives the answer itself ([`through_server`]), the backends are the virtual
//! server's real servers (`ipvsadm` part) and the masquerade decision is the `iptables`
//! part's nat rules walked for the flow's first packet (KUBE-SERVICES from PREROUTING or
//! OUTPUT, with its `-m set` matches read against the `ipset` part: KUBE-MARK-MASQ
//! reached or not; KUBE-LOOP-BACK for a pod reaching itself). The rules, first match:
//!
//! - **source-ranges**: a load-balancer IP in KUBE-LOAD-BALANCER-FW from another host
//!   that neither KUBE-LOAD-BALANCER-SOURCE-CIDR (a host-length range is a bare address
//!   there) nor -SOURCE-IP admits: KUBE-SOURCE-RANGES-FIREWALL drops it in filter INPUT,
//!   before IPVS (LOCAL_IN, later priority): timeout. The node's own packet meets IPVS
//!   first (LOCAL_OUT, before filter OUTPUT): refused without real servers
//!   (**no-real-servers**), else dropped by KUBE-IPVS-OUT-FILTER's `-m ipvs` rule for
//!   that virtual server: timeout (seed 5).
//! - **no-server-local**: no virtual server for the destination, which is a local address
//!   (the node's, its pod gateway, 127.0.0.1, a VIP on kube-ipvs0): nothing listens,
//!   refused. (IPVS mode's node ports are on the Node object's addresses only, not on
//!   127.0.0.1 or the pod gateway; a cluster IP's other ports are rejected by
//!   KUBE-IPVS-FILTER.)
//! - **no-server-routed**: no virtual server, not local: routed on, no answer.
//! - **no-real-servers**: a virtual server without real servers (the service has no
//!   usable endpoint at all): IPVS answers ICMP port unreachable (`ip_vs_leave`): refused.
//! - **external-local**: externalTrafficPolicy=Local — the destination is in
//!   KUBE-EXTERNAL-IP-LOCAL, KUBE-LOAD-BALANCER-LOCAL or (a node port on a node address)
//!   KUBE-NODE-PORT-LOCAL-TCP/UDP — and its real servers are local (in KUBE-LOOP-BACK).
//!   iptables mode short-circuits pods' and the node's traffic to such destinations to
//!   the cluster endpoints; IPVS mode has no short-circuit: one virtual server per
//!   address, holding the local endpoints for every source (`syncProxyRules` passes
//!   `ExternalPolicyLocal()` to `syncEndpoint` for external IPs, load-balancer IPs and
//!   node ports). Answered by the real servers. Masquerade: none of the three -LOCAL
//!   matches reaches KUBE-MARK-MASQ (KUBE-EXTERNAL-IP-LOCAL only ACCEPTs,
//!   KUBE-LOAD-BALANCER-LOCAL and KUBE-NODE-PORT-LOCAL-* RETURN before the chain's
//!   KUBE-MARK-MASQ), and masqueradeAll and the clusterCIDR rule match KUBE-CLUSTER-IP
//!   only: sources are kept. A pod's answer is "direct" (its own hairpin excepted:
//!   KUBE-LOOP-BACK); the node's packet to a VIP on kube-ipvs0 leaves from that VIP
//!   (the local route's preferred source), so its backend sees an address that is not
//!   the node's: "masq" to the probe; to a node port on the node's address it is direct.
//! - **local-fallback**: a Local policy whose real servers are all remote (none in
//!   KUBE-LOOP-BACK): the destination is an -LOCAL one as above, or iptables mode drops
//!   the flow (ITP=Local without a local endpoint, the only drop of a service with
//!   endpoints). kube-proxy's IPVS `syncEndpoint` (pkg/proxy/ipvs/proxier.go) uses the
//!   cluster endpoints when a Local policy leaves no local one (kubernetes#97081: "allow
//!   access from local pods even if no local endpoints exist"), and so does the target
//!   (`targets/src/ipvs/model.rs`, `reals`; golden cases etp-local-no-local and
//!   itp-local-no-local). Answered by the real servers, masquerade as the nat rules say;
//!   a reply to a source node2 does not route back (the node's own VIP source, see
//!   above) is lost: those backends time out.
//! - **hairpin-not-local**: a pod reaching itself through a virtual server with a real
//!   server on its own address that KUBE-LOOP-BACK lacks (an endpoint without
//!   `nodeName`: kube-proxy fills KUBE-LOOP-BACK from the endpoints it knows are local,
//!   `IsLocal()` in `syncProxyRules`), and no KUBE-MARK-MASQ either: the packet comes back
//!   to the pod with its own source address and is dropped as martian, so that backend's
//!   probes time out while the other real servers answer (every other real server must
//!   answer, and nothing but timeouts may be missing: the round robin is shared with the
//!   flows of other senders, so a short run may not hit the lost one at all). (iptables
//!   mode masquerades every endpoint's hairpin with its KUBE-SEP `-s EP -j
//!   KUBE-MARK-MASQ` rule, local or not.)
//!   This was seed 3's "sometimes times out": the round robin sent some probes there.
//! - **as-iptables**: any other flow to a virtual server with real servers: iptables
//!   mode's expectation.

use super::{class, derive_flows, generate, ok_vs, parse_view, run_flows, source_ip, Cidr4};
use super::{Expect, Flow, Intended, Manifest, Seen, NODE, SERVED_PORTS};
use crate::kernel::{Lab, LabSpec, Proto};
use crate::support::{root, svc, TempDir};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Generated manifests in the VM when `SVC_DIFF_IPVS_CASES` is unset: about 10 s each
/// there (seeds 1–14 took 8.4–11.4 s), so the VM suite grows by about 75 s.
pub const DEFAULT_CASES: u64 = 8;

/// The result lines the guest writes (`diff-ipvs:seed N`), for the host to expect.
pub fn steps() -> Vec<String> {
    let (first, n) = seeds();
    (first..first + n)
        .map(|s| format!("diff-ipvs:seed {s}"))
        .collect()
}

/// `export` lines that hand the host's knobs to the guest.
pub fn guest_env() -> String {
    let (first, n) = seeds();
    format!("export SVC_DIFF_SEED={first} SVC_DIFF_IPVS_CASES={n}\n")
}

fn seeds() -> (u64, u64) {
    (
        super::env_u64("SVC_DIFF_SEED", 1),
        super::env_u64("SVC_DIFF_IPVS_CASES", DEFAULT_CASES),
    )
}

/// One virtual server of the `ipvsadm` part.
#[derive(Default)]
struct Server {
    /// `-r IP:PORT`, in the part's order.
    reals: Vec<SocketAddr>,
    /// `-p TIMEOUT`: ClientIP affinity.
    persistent: bool,
}

/// What the compiled IPVS parts say about destinations.
#[derive(Default)]
struct Compiled {
    /// `-t IP:PORT` → its virtual server.
    servers: BTreeMap<String, Server>,
    /// kube-ipvs0's addresses.
    bound: BTreeSet<IpAddr>,
    /// Entries of each set.
    sets: BTreeMap<String, BTreeSet<String>>,
    /// Each set's type (`hash:ip,port`, `bitmap:port`, ...).
    set_types: BTreeMap<String, String>,
    /// The `iptables` part's nat rules (`-A` lines), per chain, split into words.
    nat: BTreeMap<String, Vec<Vec<String>>>,
    /// `IP,PROTO:PORT` of each virtual server KUBE-IPVS-OUT-FILTER keeps the node from.
    out_filter: BTreeSet<String>,
}

/// An iptables rule's words; a double-quoted comment is one word.
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line.trim();
    while !rest.is_empty() {
        let (w, r) = match rest.strip_prefix('"') {
            Some(q) => q.split_once('"').unwrap_or((q, "")),
            None => rest.split_once(' ').unwrap_or((rest, "")),
        };
        out.push(w.to_string());
        rest = r.trim_start();
    }
    out
}

fn read_bundle(bundle: &str) -> Compiled {
    let mut c = Compiled::default();
    let (mut part, mut table) = ("", "");
    for l in bundle.lines() {
        if let Some(h) = l.strip_prefix("# ==== ") {
            part = h.split(':').next().unwrap_or("");
            continue;
        }
        let w: Vec<&str> = l.split_whitespace().collect();
        match (part, w.as_slice()) {
            ("ipvsadm", ["-A", flag, svc, rest @ ..]) => {
                c.servers
                    .entry(format!("{flag} {svc}"))
                    .or_default()
                    .persistent = rest.contains(&"-p");
            }
            ("ipvsadm", ["-a", flag, svc, "-r", real, ..]) => c
                .servers
                .entry(format!("{flag} {svc}"))
                .or_default()
                .reals
                .push(real.parse().expect("a real server is IP:PORT")),
            ("addresses", ["address", "add", a, ..]) => {
                if let Ok(ip) = a.split('/').next().unwrap_or("").parse() {
                    c.bound.insert(ip);
                }
            }
            ("ipset", ["create", set, kind, ..]) => {
                c.set_types.insert(set.to_string(), kind.to_string());
            }
            ("ipset", ["add", set, entry]) => {
                c.sets
                    .entry(set.to_string())
                    .or_default()
                    .insert(entry.to_string());
            }
            ("iptables", [t, ..]) if t.starts_with('*') => table = &l[1..],
            ("iptables", ["-A", "KUBE-IPVS-OUT-FILTER", rule @ ..]) => {
                let after = |flag| rule.iter().position(|w| *w == flag).map(|i| rule[i + 1]);
                if let (Some(ip), Some(proto), Some(port)) =
                    (after("--vaddr"), after("--vproto"), after("--vport"))
                {
                    c.out_filter.insert(format!("{ip},{proto}:{port}"));
                }
            }
            // A declared chain may have no rules (KUBE-NODE-PORT without node ports).
            ("iptables", [decl, ..]) if table == "nat" && decl.starts_with(':') => {
                c.nat.entry(decl[1..].to_string()).or_default();
            }
            ("iptables", ["-A", chain, ..]) if table == "nat" => {
                let mut rule = words(l);
                rule.drain(..2);
                c.nat.entry(chain.to_string()).or_default().push(rule);
            }
            _ => {}
        }
    }
    c
}

/// A flow's first packet as the node's nat table sees it.
struct Packet {
    src: IpAddr,
    dst: SocketAddr,
    proto: &'static str,
    /// The interface it came in on (`None`: the node's own, nat OUTPUT).
    iface: Option<String>,
}

impl Compiled {
    fn set(&self, name: &str) -> impl Iterator<Item = &String> {
        self.sets.get(name).into_iter().flatten()
    }

    /// Whether `-m set --match-set NAME FLAGS` matches: each of the set type's
    /// dimensions (`ip`, `port`, `net`) against the packet field its flag names.
    fn set_matches(&self, name: &str, flags: &str, p: &Packet) -> bool {
        let kind = self.set_types.get(name).map_or("", String::as_str);
        let dims: Vec<&str> = kind
            .split_once(':')
            .map_or("", |(_, d)| d)
            .split(',')
            .collect();
        let flags: Vec<&str> = flags.split(',').collect();
        let bitmap = kind.starts_with("bitmap:");
        self.set(name).any(|e| {
            let parts: Vec<&str> = e.split(',').collect();
            parts.len() == dims.len()
                && dims
                    .iter()
                    .zip(&flags)
                    .zip(&parts)
                    .all(|((dim, flag), part)| {
                        let ip = if *flag == "src" { p.src } else { p.dst.ip() };
                        match *dim {
                            "ip" => part.parse() == Ok(ip),
                            "net" => {
                                Cidr4::parse(part).is_some_and(|c| c.contains(ip))
                                    || part.parse() == Ok(ip)
                            }
                            // Only destination ports are matched in IPVS mode's rules.
                            "port" if *flag == "dst" && bitmap => *part == p.dst.port().to_string(),
                            "port" if *flag == "dst" => {
                                *part == format!("{}:{}", p.proto, p.dst.port())
                            }
                            d => panic!("set {name}: cannot match dimension {d} by {flag}"),
                        }
                    })
        })
    }

    /// `--dst-type LOCAL`: the node's addresses, kube-ipvs0's, loopback.
    fn local(&self, ip: IpAddr) -> bool {
        ip.is_loopback()
            || self.bound.contains(&ip)
            || [
                super::super::addr::NODE_LAN,
                super::super::addr::NODE_POD_GW,
                super::super::addr::NODE_LINK,
            ]
            .iter()
            .any(|a| ip == IpAddr::V4(*a))
    }

    /// Whether one rule's matches hold for `p`. Panics on a match it does not know, so
    /// that a new rule in the part is read, not skipped.
    fn rule_matches(&self, rule: &[String], p: &Packet) -> bool {
        let mut i = 0;
        let mut ok = true;
        let w = |i: usize| rule.get(i).map_or("", String::as_str);
        while i < rule.len() && w(i) != "-j" {
            let neg = w(i) == "!";
            if neg {
                i += 1;
            }
            let hit = match (w(i), w(i + 1)) {
                ("-s", cidr) => {
                    i += 2;
                    Cidr4::parse(cidr).map_or(cidr.parse() == Ok(p.src), |c| c.contains(p.src))
                }
                ("-p", proto) => {
                    i += 2;
                    proto == p.proto
                }
                ("-i", name) => {
                    i += 2;
                    let iface = p.iface.as_deref().unwrap_or("");
                    match name.strip_suffix('+') {
                        Some(prefix) => !iface.is_empty() && iface.starts_with(prefix),
                        None => iface == name,
                    }
                }
                ("-m", "comment") => {
                    i += 4;
                    true
                }
                ("-m", "set") => {
                    let n = w(i + 2) == "!";
                    let at = i + 2 + usize::from(n);
                    assert_eq!(w(at), "--match-set", "rule {rule:?}");
                    i = at + 3;
                    self.set_matches(w(at + 1), w(at + 2), p) != n
                }
                ("-m", "addrtype") => {
                    let n = w(i + 2) == "!";
                    let at = i + 2 + usize::from(n);
                    i = at + 2;
                    let local = match w(at) {
                        "--dst-type" => self.local(p.dst.ip()),
                        "--src-type" => p.iface.is_none(),
                        m => panic!("addrtype {m} in {rule:?}"),
                    };
                    assert_eq!(w(at + 1), "LOCAL", "rule {rule:?}");
                    local != n
                }
                // The lab's node has no bridge: nothing comes in on a bridge port.
                ("-m", "physdev") if w(i + 2) == "!" && w(i + 3) == "--physdev-is-in" => {
                    i += 4;
                    true
                }
                (m, v) => panic!("the nat rule reader does not know `{m} {v}` in {rule:?}"),
            };
            ok &= hit != neg;
        }
        ok
    }

    /// Runs `chain` of the nat table for `p`: `Some(())` when a rule ends the walk
    /// (`ACCEPT`), `None` when the chain returns; sets `marked` at KUBE-MARK-MASQ.
    fn walk(&self, chain: &str, p: &Packet, marked: &mut bool) -> Option<()> {
        for rule in self.nat.get(chain).into_iter().flatten() {
            if !self.rule_matches(rule, p) {
                continue;
            }
            let j = rule
                .iter()
                .position(|w| w == "-j")
                .map(|i| rule[i + 1].as_str());
            match j {
                Some("KUBE-MARK-MASQ") => *marked = true,
                Some("ACCEPT") => return Some(()),
                Some("RETURN") => return None,
                Some(c) if self.nat.contains_key(c) => {
                    if self.walk(c, p, marked).is_some() {
                        return Some(());
                    }
                }
                j => panic!("nat target {j:?} in {rule:?}"),
            }
        }
        None
    }

    /// IPVS mode's masquerade decision for a new connection: KUBE-SERVICES (from nat
    /// PREROUTING or OUTPUT) reaches KUBE-MARK-MASQ, and KUBE-POSTROUTING masquerades
    /// what is marked.
    fn marked(&self, p: &Packet) -> bool {
        let mut marked = false;
        self.walk("KUBE-SERVICES", p, &mut marked);
        marked
    }

    /// KUBE-LOOP-BACK (`dst,dst,src` in KUBE-POSTROUTING, after IPVS's DNAT to `real`):
    /// the hairpin masquerade of a pod reaching itself.
    fn loop_back(&self, real: SocketAddr, proto: &str) -> bool {
        self.set("KUBE-LOOP-BACK")
            .any(|e| *e == format!("{},{proto}:{},{}", real.ip(), real.port(), real.ip()))
    }
}

/// What a flow must do under IPVS: `expect` (what [`super::run_flow`] probes for), and the
/// backends among the real servers whose reply never comes back (their probes time out).
#[derive(Clone, Debug, PartialEq)]
struct Want {
    expect: Expect,
    lost: BTreeSet<String>,
}

impl Want {
    fn plain(expect: Expect) -> Want {
        Want {
            expect,
            lost: BTreeSet::new(),
        }
    }

    /// Whether the kernel did it: `expect`, plus timeouts for the lost backends (all
    /// probes, with affinity, when the sticky pick was a lost one). Without affinity a
    /// timeout may or may not show: the scheduler is shared with the other senders'
    /// flows running at the same time, so a few probes may all land on answering ones.
    fn met(&self, from: &str, s: &Seen) -> bool {
        if self.lost.is_empty() || self.expect == Expect::NoAnswer {
            return ok_vs(&self.expect, from, s);
        }
        let timeouts = s.others.iter().all(|o| class(o) == "timeout");
        match &self.expect {
            Expect::Answer { sticky: true, .. } if s.answers.is_empty() => {
                timeouts && !s.others.is_empty()
            }
            Expect::Answer {
                sticky: false,
                backends,
                masq,
            } => {
                let answered = Seen {
                    others: BTreeSet::new(),
                    ..s.clone()
                };
                let e = Expect::Answer {
                    backends: backends.clone(),
                    masq: *masq,
                    sticky: false,
                };
                timeouts && ok_vs(&e, from, &answered)
            }
            e => ok_vs(e, from, s),
        }
    }
}

/// The lab backend (`pod:port`) of a real server, if a lab pod serves it.
fn backend(real: SocketAddr) -> Option<String> {
    let spec = LabSpec::default();
    SERVED_PORTS.contains(&real.port()).then_some(())?;
    spec.local_pods
        .iter()
        .chain(&spec.remote_pods)
        .find(|h| IpAddr::V4(h.ip) == real.ip())
        .map(|h| format!("{}:{}", h.name, real.port()))
}

/// Whether a backend's reply to `src` comes back through the node: local pods route
/// everything via the node; node2 (the remote pods) routes only its own pods, the node's
/// pods, the LAN and its link (see `mod.rs`): a reply to a service address is lost there.
fn reply_returns(real: SocketAddr, src: IpAddr) -> bool {
    use super::super::addr::{LAN_CIDR, NODE_LINK, POD_CIDR, REMOTE_POD_CIDR};
    let cidr = |(a, p): (Ipv4Addr, u8)| Cidr4(a, p);
    if !cidr(REMOTE_POD_CIDR).contains(real.ip()) {
        return true;
    }
    [REMOTE_POD_CIDR, POD_CIDR, LAN_CIDR, (NODE_LINK, 30)]
        .into_iter()
        .any(|c| cidr(c).contains(src))
}

/// The sender's source address as the node's stack picks it: the node itself uses the
/// destination's own address when that is on kube-ipvs0 (a local route's preferred source)
/// and its LAN address otherwise; everyone else their own address.
fn sent_from(f: &Flow, c: &Compiled) -> IpAddr {
    match f.from.as_str() {
        "node" if c.bound.contains(&f.dst.ip()) => f.dst.ip(),
        _ => source_ip(f),
    }
}

/// What the virtual server does with the flow, read from the compiled parts alone: each
/// real server answers, masqueraded when the nat rules mark the flow (else the backend
/// sees the sender's source, which for the node may be a VIP: not its own address, so
/// "masq" to the probe), except where the answer cannot come back: a pod reaching itself
/// unmasqueraded (no mark, no KUBE-LOOP-BACK entry: it drops a packet from its own
/// address as martian), or a remote pod replying to a source node2 does not route.
fn through_server(f: &Flow, c: &Compiled, server: &Server) -> Want {
    let proto = match f.proto {
        Proto::Tcp => "tcp",
        Proto::Udp => "udp",
    };
    let spec = LabSpec::default();
    let iface = match f.from.as_str() {
        "node" => None,
        from => Some(match spec.local_pods.iter().position(|h| h.name == from) {
            Some(i) => format!("{}{i}", super::super::addr::POD_IFACE_PREFIX),
            None => "eth0".to_string(),
        }),
    };
    let src = sent_from(f, c);
    let p = Packet {
        src,
        dst: f.dst,
        proto,
        iface,
    };
    let marked = c.marked(&p);
    let (mut backends, mut lost) = (BTreeSet::new(), BTreeSet::new());
    for &real in &server.reals {
        let Some(name) = backend(real) else {
            return Want::plain(Expect::Unknown);
        };
        let hairpin = real.ip() == src;
        let back = if hairpin {
            marked || c.loop_back(real, proto)
        } else {
            marked || reply_returns(real, src)
        };
        if back {
            backends.insert(name);
        } else {
            lost.insert(name);
        }
    }
    let expect = if backends.is_empty() {
        Expect::NoAnswer
    } else {
        Expect::Answer {
            backends,
            masq: marked || src != source_ip(f),
            sticky: server.persistent,
        }
    };
    Want { expect, lost }
}

/// The IPVS expectation of a flow and the rule that gave it (see the module docs).
fn ipvs_expect(f: &Flow, c: &Compiled) -> (Want, &'static str) {
    let (flag, proto) = match f.proto {
        Proto::Tcp => ("-t", "tcp"),
        Proto::Udp => ("-u", "udp"),
    };
    let dst = format!("{},{proto}:{}", f.dst.ip(), f.dst.port());
    let src = source_ip(f);
    // Another host's packet meets KUBE-SOURCE-RANGES-FIREWALL in filter INPUT, before
    // IPVS (LOCAL_IN); a host-length range is a bare address in KUBE-LOAD-BALANCER-
    // SOURCE-CIDR, as `ipset save` prints it.
    let firewalled = f.from != "node"
        && c.set("KUBE-LOAD-BALANCER-FW").any(|e| *e == dst)
        && !c.set("KUBE-LOAD-BALANCER-SOURCE-CIDR").any(|e| {
            e.strip_prefix(&format!("{dst},")).is_some_and(|net| {
                Cidr4::parse(net).map_or(net.parse() == Ok(src), |cidr| cidr.contains(src))
            })
        })
        && !c
            .set("KUBE-LOAD-BALANCER-SOURCE-IP")
            .any(|e| *e == format!("{dst},{src}"));
    // The node's own packet is scheduled by IPVS in LOCAL_OUT, before any filter chain:
    // without real servers IPVS refuses it; with them KUBE-IPVS-OUT-FILTER (filter
    // OUTPUT, `-m ipvs`) drops it where the source ranges leave the node out.
    let out_filtered = f.from == "node" && c.out_filter.contains(&dst);
    let local = |ip: IpAddr| {
        ip.is_loopback()
            || c.bound.contains(&ip)
            || ip == IpAddr::V4(super::super::addr::NODE_LAN)
            || ip == IpAddr::V4(super::super::addr::NODE_POD_GW)
    };
    let plain = |e: Expect, rule| (Want::plain(e), rule);
    let server = match c.servers.get(&format!("{flag} {}", f.dst)) {
        _ if firewalled => return plain(Expect::Timeout, "source-ranges"),
        None if local(f.dst.ip()) => return plain(Expect::Refused, "no-server-local"),
        None => return plain(Expect::NoAnswer, "no-server-routed"),
        Some(s) if s.reals.is_empty() => return plain(Expect::Refused, "no-real-servers"),
        _ if out_filtered => return plain(Expect::Timeout, "source-ranges"),
        Some(s) => s,
    };
    let want = through_server(f, c, server);
    // A Local policy's destination: in an -LOCAL set (node ports by port, on a node-port
    // virtual server; those are on node addresses, never on kube-ipvs0).
    let external_local = c.set("KUBE-EXTERNAL-IP-LOCAL").any(|e| *e == dst)
        || c.set("KUBE-LOAD-BALANCER-LOCAL").any(|e| *e == dst)
        || (!c.bound.contains(&f.dst.ip())
            && c.set(&format!("KUBE-NODE-PORT-LOCAL-{}", proto.to_uppercase()))
                .any(|e| *e == f.dst.port().to_string()));
    let any_local = server.reals.iter().any(|r| c.loop_back(*r, proto));
    let hairpin_lost = want
        .lost
        .iter()
        .any(|b| b.split(':').next() == Some(f.from.as_str()));
    if external_local && any_local {
        (want, "external-local")
    } else if !any_local && (external_local || f.expect[0] == Expect::Timeout) {
        (want, "local-fallback")
    } else if hairpin_lost {
        (want, "hairpin-not-local")
    } else {
        plain(f.expect[0].clone(), "as-iptables")
    }
}

fn lab() -> Lab {
    super::served_lab("dipvs")
}

/// One manifest: apply it, run its flows; the failures.
fn check(lab: &Lab, state: &Path, inputs: &Path, seed: u64) -> Vec<String> {
    let text = generate(seed);
    let m = Manifest {
        label: format!("seed {seed}"),
        case: None,
        text: Some(text.clone()),
    };
    let spec = LabSpec::default();
    let Some(view) = parse_view(&m.compile("ir"), &spec) else {
        return vec![format!("seed {seed}: no IPv4 node view")];
    };
    let bundle = m.compile("ipvs");
    let compiled = read_bundle(&bundle);
    let file = inputs.join(format!("seed-{seed}.yaml"));
    std::fs::write(&file, &text).unwrap();
    let r = svc(
        &[
            "apply",
            file.to_str().unwrap(),
            "--node",
            NODE,
            "--target",
            "ipvs",
            "--netns",
            lab.netns("node"),
            "--state-dir",
            state.to_str().unwrap(),
        ],
        None,
        &root(),
    );
    if r.code != 0 {
        return vec![format!("`{}` exited {}: {}", r.cmdline, r.code, r.stderr)];
    }
    // Not a flush: a flush forgets the NAT reservations of connections the backends
    // still hold in TIME_WAIT (see timewait.rs), as in the iptables/nftables labs.
    lab.reset_conntrack().expect("conntrack reset");

    let mut flows = derive_flows(&view);
    let mut wants = Vec::new();
    for f in &mut flows {
        let (want, rule) = ipvs_expect(f, &compiled);
        f.expect = [want.expect.clone(), want.expect.clone()];
        f.intended = None::<Intended>;
        wants.push((want, rule));
    }
    let all: Vec<usize> = (0..flows.len()).collect();
    let mut seen: Vec<Seen> = run_flows(lab, 0, &flows, &all, false);
    let bad: Vec<usize> = all
        .iter()
        .copied()
        .filter(|&i| !wants[i].0.met(&flows[i].from, &seen[i]))
        .collect();
    if !bad.is_empty() {
        // Where the first pass's lost packets went: the node's conntrack counters
        // (drops, insert failures, clashes) and the backends' TCP counters.
        let stats = lab
            .exec_ok(crate::kernel::lab::NODE, "conntrack", &["-S"], None)
            .unwrap_or_else(|e| format!("(conntrack -S: {e})"));
        println!(
            "ipvs guest: seed {seed}: node conntrack -S\n{}",
            stats.trim_end()
        );
        for pod in lab.pods() {
            let c = super::super::timewait::counters(lab, pod, &super::BACKEND_COUNTERS);
            println!("ipvs guest: seed {seed}: {pod}: {c:?}");
        }
        let again = run_flows(lab, 0, &flows, &bad, true);
        for &i in &bad {
            // On the guest's console (SVC_IPVS_CONSOLE=1): what needed a second look.
            println!(
                "ipvs guest: seed {seed}: re-checked {}: first {}, then {} (rule {})",
                flows[i].line(),
                seen[i].describe(),
                again[i].describe(),
                wants[i].1
            );
            seen[i] = again[i].clone();
        }
    }
    let mut failures: Vec<String> = bad
        .iter()
        .filter(|&&i| !wants[i].0.met(&flows[i].from, &seen[i]))
        .map(|&i| {
            let (want, rule) = &wants[i];
            let lost = if want.lost.is_empty() {
                String::new()
            } else {
                format!(", lost {:?}", want.lost)
            };
            format!(
                "seed {seed}: {}: IPVS {} (rule {rule}: {:?}{lost})",
                flows[i].line(),
                seen[i].describe(),
                want.expect
            )
        })
        .collect();
    if !failures.is_empty() {
        failures.push(format!("manifest: {text}"));
    }
    failures
}

/// Runs inside the VM: one result line per manifest, appended to `results`.
fn run_guest(results: &Path) {
    let lab = lab();
    let state = TempDir::new("diff-ipvs-state");
    let inputs = TempDir::new("diff-ipvs-in");
    let (first, n) = seeds();
    for seed in first..first + n {
        let start = Instant::now();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            check(&lab, state.path(), inputs.path(), seed)
        }));
        let failures = outcome.unwrap_or_else(|p| {
            vec![p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panicked".into())]
        });
        let verdict = if failures.is_empty() { "ok" } else { "fail" };
        let ms = start.elapsed().as_millis();
        println!("ipvs guest: diff-ipvs:seed {seed}: {verdict} in {ms} ms");
        let msg: Vec<String> = failures
            .iter()
            .map(|f| f.replace('\n', " / ").replace('\t', " "))
            .collect();
        let mut f = OpenOptions::new()
            .append(true)
            .create(true)
            .open(results)
            .unwrap();
        let _ = writeln!(
            f,
            "diff-ipvs:seed {seed}\t{verdict}\t{ms}\t{}",
            msg.join(" | ")
        );
    }
}

/// The guest side, started by `kernel::ipvs::golden_flows_ipvs` in the same boot.
#[test]
#[ignore = "runs inside the IPVS VM, started by golden_flows_ipvs"]
fn guest_differential() {
    let env = crate::kernel::ipvs::GUEST_DIR_ENV;
    let dir = PathBuf::from(
        std::env::var_os(env)
            .unwrap_or_else(|| panic!("{env} unset: this runs inside the IPVS VM")),
    );
    run_guest(&dir.join("results"));
}

#[test]
fn the_rules_read_the_compiled_parts() {
    // The shape of a compiled bundle (headers, sets with their types, IPVS mode's nat
    // rules as the ipvs target writes them), detector 10.244.0.0/16.
    let c = read_bundle(concat!(
        "# ==== ipset: load with `ipset restore` ====\n",
        "create KUBE-LOOP-BACK hash:ip,port,ip family inet\n",
        "add KUBE-LOOP-BACK 10.244.1.3,tcp:8080,10.244.1.3\n",
        "create KUBE-CLUSTER-IP hash:ip,port family inet\n",
        "add KUBE-CLUSTER-IP 10.96.0.1,tcp:80\n",
        "add KUBE-CLUSTER-IP 10.96.0.9,udp:53\n",
        "create KUBE-EXTERNAL-IP-LOCAL hash:ip,port family inet\n",
        "add KUBE-EXTERNAL-IP-LOCAL 198.18.0.5,tcp:80\n",
        "create KUBE-LOAD-BALANCER hash:ip,port family inet\n",
        "add KUBE-LOAD-BALANCER 203.0.113.5,tcp:80\n",
        "add KUBE-LOAD-BALANCER 203.0.113.7,tcp:80\n",
        "create KUBE-LOAD-BALANCER-FW hash:ip,port family inet\n",
        "add KUBE-LOAD-BALANCER-FW 203.0.113.5,tcp:80\n",
        "create KUBE-LOAD-BALANCER-LOCAL hash:ip,port family inet\n",
        "add KUBE-LOAD-BALANCER-LOCAL 203.0.113.7,tcp:80\n",
        "create KUBE-LOAD-BALANCER-SOURCE-CIDR hash:ip,port,net family inet\n",
        "add KUBE-LOAD-BALANCER-FW 203.0.113.6,tcp:80\n",
        "add KUBE-LOAD-BALANCER-FW 203.0.113.8,tcp:80\n",
        "add KUBE-LOAD-BALANCER-SOURCE-CIDR 203.0.113.5,tcp:80,192.0.2.100\n",
        "add KUBE-LOAD-BALANCER-SOURCE-CIDR 203.0.113.6,tcp:80,192.0.2.0/24\n",
        "create KUBE-NODE-PORT-TCP bitmap:port range 0-65535\n",
        "add KUBE-NODE-PORT-TCP 30001\n",
        "add KUBE-NODE-PORT-TCP 30002\n",
        "add KUBE-NODE-PORT-TCP 30003\n",
        "create KUBE-NODE-PORT-LOCAL-TCP bitmap:port range 0-65535\n",
        "add KUBE-NODE-PORT-LOCAL-TCP 30002\n",
        "add KUBE-NODE-PORT-LOCAL-TCP 30003\n",
        "# ==== ipvsadm: load with `ipvsadm-restore` ====\n",
        "-A -t 10.96.0.1:80 -s rr\n",
        "-a -t 10.96.0.1:80 -r 10.244.1.2:9090 -m -w 1\n",
        "-a -t 10.96.0.1:80 -r 10.244.2.3:9090 -m -w 1\n",
        "-A -u 10.96.0.9:53 -s rr -p 10800\n",
        "-a -u 10.96.0.9:53 -r 10.244.2.2:9090 -m -w 1\n",
        "-A -t 192.0.2.10:30001 -s rr\n",
        "-A -t 192.0.2.10:30002 -s rr\n",
        "-a -t 192.0.2.10:30002 -r 10.244.1.3:8080 -m -w 1\n",
        "-A -t 192.0.2.10:30003 -s rr\n",
        "-a -t 192.0.2.10:30003 -r 10.244.2.2:8080 -m -w 1\n",
        "-A -t 198.18.0.5:80 -s rr\n",
        "-a -t 198.18.0.5:80 -r 10.244.2.2:8080 -m -w 1\n",
        "-A -t 203.0.113.6:80 -s rr\n",
        "-a -t 203.0.113.6:80 -r 10.244.1.3:8080 -m -w 1\n",
        "-A -t 203.0.113.8:80 -s rr\n",
        "-A -t 203.0.113.7:80 -s rr\n",
        "-a -t 203.0.113.7:80 -r 10.244.1.3:8080 -m -w 1\n",
        "# ==== addresses: load with `ip -batch -` ====\n",
        "address add 10.96.0.1/32 dev kube-ipvs0\n",
        "address add 10.96.0.9/32 dev kube-ipvs0\n",
        "address add 198.18.0.5/32 dev kube-ipvs0\n",
        "address add 203.0.113.7/32 dev kube-ipvs0\n",
        "# ==== iptables: load with `iptables-restore --noflush` ====\n",
        "*nat\n",
        "-I OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n",
        "COMMIT\n",
        "*nat\n",
        ":KUBE-SERVICES - [0:0]\n",
        "-A KUBE-SERVICES -s 127.0.0.0/8 -j RETURN\n",
        "-A KUBE-POSTROUTING -m comment --comment \"hairpin\" -m set --match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE\n",
        "-A KUBE-SERVICES -m comment --comment \"lb portal\" -m set --match-set KUBE-LOAD-BALANCER dst,dst -j KUBE-LOAD-BALANCER\n",
        "-A KUBE-LOAD-BALANCER -m comment --comment \"local\" -m set --match-set KUBE-LOAD-BALANCER-LOCAL dst,dst -j RETURN\n",
        "-A KUBE-NODE-PORT -p tcp -m comment --comment \"local\" -m set --match-set KUBE-NODE-PORT-LOCAL-TCP dst -j RETURN\n",
        "-A KUBE-NODE-PORT -p tcp -m comment --comment \"masq\" -m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ\n",
        "-A KUBE-SERVICES -m comment --comment \"cluster ip\" -m set --match-set KUBE-CLUSTER-IP dst,dst ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ\n",
        "-A KUBE-SERVICES -m comment --comment \"x\" -m set --match-set KUBE-EXTERNAL-IP-LOCAL dst,dst -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT\n",
        "-A KUBE-SERVICES -m comment --comment \"x\" -m set --match-set KUBE-EXTERNAL-IP-LOCAL dst,dst -m addrtype --dst-type LOCAL -j ACCEPT\n",
        "-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT\n",
        "-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ\n",
        "-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT\n",
        "-A KUBE-SERVICES -m set --match-set KUBE-LOAD-BALANCER dst,dst -j ACCEPT\n",
        "-A KUBE-MARK-MASQ -j MARK --or-mark 0x00004000\n",
        "COMMIT\n",
        "*filter\n",
        "-A KUBE-SOURCE-RANGES-FIREWALL -j DROP\n",
        "-A KUBE-IPVS-OUT-FILTER -s 203.0.113.6 -m ipvs --vaddr 203.0.113.6 --vproto tcp --vport 80 -j DROP\n",
        "-A KUBE-IPVS-OUT-FILTER -s 203.0.113.8 -m ipvs --vaddr 203.0.113.8 --vproto tcp --vport 80 -j DROP\n",
        "COMMIT\n",
    ));
    assert_eq!(c.nat["KUBE-SERVICES"].len(), 8, "{:?}", c.nat);
    let flow = |from: &str, proto: Proto, dst: &str, iptables: Expect| Flow {
        group: String::new(),
        kind: String::new(),
        what: String::new(),
        from: from.into(),
        proto,
        dst: dst.parse().unwrap(),
        expect: [iptables.clone(), iptables],
        intended: None,
        traced: Default::default(),
    };
    let tcp =
        |from: &str, dst: &str| ipvs_expect(&flow(from, Proto::Tcp, dst, Expect::Unknown), &c);
    let rule = |from: &str, dst: &str| tcp(from, dst).1;
    let answer = |b: &[&str], masq: bool| Expect::Answer {
        backends: b.iter().map(|s| s.to_string()).collect(),
        masq,
        sticky: false,
    };
    let want = |e: Expect, lost: &[&str]| Want {
        expect: e,
        lost: lost.iter().map(|s| s.to_string()).collect(),
    };

    assert_eq!(rule("pod-b", "10.96.0.1:80"), "as-iptables");
    assert_eq!(rule("pod-a", "10.96.0.1:1"), "no-server-local");
    assert_eq!(rule("client1", "192.0.2.10:30001"), "no-real-servers");
    assert_eq!(rule("pod-a", "10.244.1.1:30001"), "no-server-local");
    assert_eq!(rule("pod-a", "198.51.100.77:80"), "no-server-routed");
    assert_eq!(rule("client2", "203.0.113.5:80"), "source-ranges");
    // A host-length source range is a bare address in the set.
    assert_eq!(rule("client1", "203.0.113.5:80"), "no-server-routed");
    assert_eq!(rule("client2", "203.0.113.6:80"), "as-iptables");
    // The node meets IPVS before any filter: refused without real servers, else dropped
    // by KUBE-IPVS-OUT-FILTER.
    assert_eq!(rule("node", "203.0.113.6:80"), "source-ranges");
    assert_eq!(tcp("node", "203.0.113.6:80").0, want(Expect::Timeout, &[]));
    assert_eq!(rule("node", "203.0.113.8:80"), "no-real-servers");
    assert_eq!(rule("client1", "203.0.113.8:80"), "source-ranges");

    // ETP=Local: the virtual server's local real servers for every source; the LB's
    // KUBE-LOAD-BALANCER-LOCAL returns before KUBE-MARK-MASQ, so no masquerade; the
    // node's own packet leaves from the VIP (not the node's address: "masq" to the probe).
    assert_eq!(
        tcp("pod-a", "203.0.113.7:80"),
        (want(answer(&["pod-b:8080"], false), &[]), "external-local")
    );
    assert_eq!(
        tcp("node", "203.0.113.7:80"),
        (want(answer(&["pod-b:8080"], true), &[]), "external-local")
    );
    // A node port's KUBE-NODE-PORT-LOCAL-TCP returns too; the node sends from its address.
    assert_eq!(
        tcp("node", "192.0.2.10:30002"),
        (want(answer(&["pod-b:8080"], false), &[]), "external-local")
    );
    // ETP=Local without a local real server: the cluster's (kube-proxy's fallback).
    assert_eq!(
        tcp("client1", "192.0.2.10:30003"),
        (want(answer(&["pod-r1:8080"], false), &[]), "local-fallback")
    );
    // ... whose remote reply to the node's own VIP source never comes back.
    assert_eq!(
        tcp("node", "198.18.0.5:80"),
        (want(Expect::NoAnswer, &["pod-r1:8080"]), "local-fallback")
    );
    // ITP=Local without a local endpoint (iptables mode drops): the cluster's, with the
    // detector's masquerade for sources outside 10.244.0.0/16.
    let udp =
        |from: &str| ipvs_expect(&flow(from, Proto::Udp, "10.96.0.9:53", Expect::Timeout), &c);
    let sticky = |masq| Expect::Answer {
        backends: BTreeSet::from(["pod-r1:9090".to_string()]),
        masq,
        sticky: true,
    };
    assert_eq!(udp("pod-a"), (want(sticky(false), &[]), "local-fallback"));
    assert_eq!(udp("client1"), (want(sticky(true), &[]), "local-fallback"));
    // A real server on pod-a's address without a KUBE-LOOP-BACK entry (no nodeName):
    // pod-a reaching itself is not masqueraded and never answered.
    let hairpin = tcp("pod-a", "10.96.0.1:80");
    assert_eq!(
        hairpin,
        (
            want(answer(&["pod-r2:9090"], false), &["pod-a:9090"]),
            "hairpin-not-local"
        )
    );
    let seen = |answers: &[(&str, bool)], others: &[&str]| Seen {
        answers: answers
            .iter()
            .map(|(b, m)| (b.to_string(), BTreeSet::from([*m])))
            .collect(),
        others: others.iter().map(|s| s.to_string()).collect(),
        probes: 6,
    };
    // Without a detector IPVS mode marks what leaves the node from a VIP (`src,dst`):
    // the node's own packet to a cluster IP, not a pod's.
    let no_detector = read_bundle(concat!(
        "# ==== ipset: load with `ipset restore` ====\n",
        "create KUBE-CLUSTER-IP hash:ip,port family inet\n",
        "add KUBE-CLUSTER-IP 10.96.0.1,tcp:80\n",
        "# ==== addresses: load with `ip -batch -` ====\n",
        "address add 10.96.0.1/32 dev kube-ipvs0\n",
        "# ==== iptables: load with `iptables-restore --noflush` ====\n",
        "*nat\n",
        ":KUBE-NODE-PORT - [0:0]\n",
        "-A KUBE-SERVICES -m comment --comment \"cluster ip\" -m set --match-set KUBE-CLUSTER-IP src,dst -j KUBE-MARK-MASQ\n",
        "-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT\n",
        "-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT\n",
        "COMMIT\n",
    ));
    let to_vip = |from: &str| {
        let f = flow(from, Proto::Tcp, "10.96.0.1:80", Expect::Unknown);
        no_detector.marked(&Packet {
            src: sent_from(&f, &no_detector),
            dst: f.dst,
            proto: "tcp",
            iface: None,
        })
    };
    assert!(to_vip("node"));
    assert!(!to_vip("pod-a"));

    let w = &hairpin.0;
    assert!(w.met("pod-a", &seen(&[("pod-r2:9090", false)], &["timeout"])));
    assert!(w.met("pod-a", &seen(&[("pod-r2:9090", false)], &[])));
    assert!(!w.met("pod-a", &seen(&[("pod-r2:9090", false)], &["refused"])));
    assert!(!w.met("pod-a", &seen(&[("pod-r2:9090", true)], &["timeout"])));
    assert!(!w.met(
        "pod-a",
        &seen(
            &[("pod-r2:9090", false), ("pod-a:9090", true)],
            &["timeout"]
        )
    ));
}
