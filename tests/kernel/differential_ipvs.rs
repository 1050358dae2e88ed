//! The differential test's IPVS side (a child of [`super`], whose flows and checks it
//! reuses): generated manifests through `--target ipvs` in the IPVS VM, every flow checked
//! against the manifests' expectation (the test's own model, [`super::model`]: never the
//! compiler's IR) or, where IPVS mode differs, against a named rule. Started inside the VM by `kernel::ipvs::golden_flows_ipvs`
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
//! The IPVS expectation is iptables mode's ([`Flow::expect`]`[0]`, by the model), except
//! where IPVS works differently; each exception is one rule of [`ipvs_expect`], decided
//! from the flow's [`Frontend`] by the manifests (never by leaving the flow out), and named
//! in a failure. Where a rule derives the answer itself ([`through_server`]), the backends
//! are the endpoints kube-proxy's IPVS `syncEndpoint` takes from the model's sets, the
//! masquerade decision is IPVS mode's nat rules applied to the manifests (see
//! [`frontend`]), KUBE-LOOP-BACK the model's local endpoints. The compiled parts are only
//! what is checked: a frontend of the manifests without its virtual server
//! (**missing-virtual-server**), a virtual server where the manifests have no frontend
//! (**unexpected-virtual-server**) and real servers or persistence other than the
//! manifests' (**real-servers-differ**) fail whatever the kernel then does, so a target
//! that drops a whole service fails even where its absence looks like "no endpoints".
//! The rules, first match:
//!
//! - **source-ranges**: a load-balancer IP with source ranges, from another host outside
//!   them: KUBE-SOURCE-RANGES-FIREWALL drops it in filter INPUT,
//!   before IPVS (LOCAL_IN, later priority): timeout. The node's own packet meets IPVS
//!   first (LOCAL_OUT, before filter OUTPUT): refused without real servers
//!   (**no-real-servers**), else dropped by KUBE-IPVS-OUT-FILTER's `-m ipvs` rule for
//!   that virtual server: timeout (seed 5).
//! - **no-server-local**: no virtual server for the destination, which is no frontend of
//!   the manifests and a local address
//!   (the node's, its pod gateway, 127.0.0.1, a VIP on kube-ipvs0): nothing listens,
//!   refused. (IPVS mode's node ports are on the Node object's addresses only, not on
//!   127.0.0.1 or the pod gateway; a cluster IP's other ports are rejected by
//!   KUBE-IPVS-FILTER.)
//! - **no-server-routed**: no virtual server, no frontend, not local: routed on, no answer.
//! - **no-real-servers**: a virtual server without real servers, the manifests giving the
//!   service no usable endpoint at all: IPVS answers ICMP port unreachable (`ip_vs_leave`): refused.
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

use super::{class, derive_flows, forgive_timeouts, names, ok_vs, run_flows, source_ip, Cidr};
use super::{Expect, Flow, Intended, Manifest, Seen, View, NODE, SERVED_PORTS};
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

/// The result lines the guest writes (`diff-ipvs:seed N`, then `diff-ipvs:kinds`: every
/// kind was checked), for the host to expect.
pub fn steps() -> Vec<String> {
    let (first, n) = seeds();
    let mut steps: Vec<String> = (first..first + n)
        .map(|s| format!("diff-ipvs:seed {s}"))
        .collect();
    if n > 0 {
        steps.push(KINDS_STEP.into());
    }
    steps
}

/// The guest's last result line: the flows of every kind and rule were checked.
const KINDS_STEP: &str = "diff-ipvs:kinds";

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

/// What the compiled IPVS parts say about destinations: the parts checked, never an
/// expectation.
#[derive(Default)]
struct Compiled {
    /// `-t IP:PORT` → its virtual server.
    servers: BTreeMap<String, Server>,
    /// kube-ipvs0's addresses.
    bound: BTreeSet<IpAddr>,
}

fn read_bundle(bundle: &str) -> Compiled {
    let mut c = Compiled::default();
    let mut part = "";
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
            _ => {}
        }
    }
    c
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
    let cidr = |(a, p): (Ipv4Addr, u8)| Cidr(a.into(), p);
    if !cidr(REMOTE_POD_CIDR).contains(real.ip()) {
        return true;
    }
    [REMOTE_POD_CIDR, POD_CIDR, LAN_CIDR, (NODE_LINK, 30)]
        .into_iter()
        .any(|c| cidr(c).contains(src))
}

/// What the manifests say IPVS mode does at a flow's destination, when it is a frontend
/// of theirs (a cluster IP, a node port on a node address, a load-balancer or external
/// IP): never read from the compiled parts being checked.
#[derive(Clone, Debug, Default, PartialEq)]
struct Frontend {
    /// The backends (`pod:port`) its virtual server must hold: kube-proxy's IPVS
    /// `syncEndpoint` (pkg/proxy/ipvs/proxier.go) takes a Local policy's local endpoints,
    /// or the cluster endpoints when none is local (kubernetes#97081), else the cluster
    /// endpoints; the sets are the test's own ([`super::model`]).
    reals: BTreeSet<String>,
    /// The pods among them on this node (IPVS mode's KUBE-LOOP-BACK: every local endpoint,
    /// `IsLocal()` in `syncProxyRules`).
    local: BTreeSet<String>,
    /// The flow's first packet gets KUBE-MARK-MASQ (see [`frontend`]).
    marked: bool,
    /// ClientIP affinity: a persistent virtual server.
    persistent: bool,
    /// A load-balancer IP's source ranges.
    ranges: Vec<Cidr>,
    /// A Local external policy's destination (KUBE-*-LOCAL).
    external_local: bool,
}

/// The lab address of a backend's pod (the IPVS differential is IPv4).
fn pod_ip(backend: &str) -> IpAddr {
    let pod = backend.split(':').next().unwrap_or("");
    super::host_ip(pod, crate::kernel::Family::V4)
}

/// The sender's source as the node's stack picks it, by the manifests: the node itself
/// sends to an address on kube-ipvs0 (a cluster, load-balancer or external IP: IPVS mode
/// binds every one of them) from that address, else from its LAN address.
fn model_sent_from(f: &Flow) -> IpAddr {
    match (f.from.as_str(), f.kind.as_str()) {
        ("node", "cluster IP" | "load-balancer IP" | "external IP") => f.dst.ip(),
        _ => source_ip(f),
    }
}

/// The flow's [`Frontend`] by the manifests' view, `None` when the destination is none.
/// Masquerade (IPVS mode's nat rules, `writeIptablesRules` in pkg/proxy/ipvs/proxier.go):
/// to a cluster IP, masqueradeAll or a source outside the local detector's range (without
/// a detector, a source that is a cluster IP: the node's own); to an external
/// destination, always, except with externalTrafficPolicy=Local (the -LOCAL sets RETURN
/// or ACCEPT before KUBE-MARK-MASQ).
fn frontend(f: &Flow, view: &View) -> Option<Frontend> {
    let p = &view.ports[f.port?];
    let (local_policy, marked) = match f.kind.as_str() {
        "cluster IP" => {
            let src = model_sent_from(f);
            let outside = match view.detector {
                Some(Some(c)) => !c.contains(src),
                Some(None) => panic!("a detector that is not a CIDR is not modelled"),
                None => f.from == "node",
            };
            (p.internal_local, view.masquerade_all || outside)
        }
        "node port" | "load-balancer IP" | "external IP" => (p.external_local, !p.external_local),
        _ => return None,
    };
    let set = if local_policy && !p.local.is_empty() {
        &p.local
    } else {
        &p.cluster
    };
    let reals = names(p, set).expect("every endpoint of a generated manifest is served");
    let local = reals
        .iter()
        .filter(|b| p.local_endpoint_ips.contains(&pod_ip(b)))
        .cloned()
        .collect();
    Some(Frontend {
        reals,
        local,
        marked,
        persistent: p.affinity,
        ranges: if f.kind == "load-balancer IP" {
            p.source_ranges.clone()
        } else {
            Vec::new()
        },
        external_local: f.kind != "cluster IP" && p.external_local,
    })
}

/// What the virtual server does with the flow, by the manifests: each of its real servers
/// answers, masqueraded when marked (else the backend sees the sender's source, which for
/// the node may be a VIP: not its own address, so "masq" to the probe), except where the
/// answer cannot come back: a pod reaching itself unmasqueraded (no mark, not in
/// KUBE-LOOP-BACK: it drops a packet from its own address as martian), or a remote pod
/// replying to a source node2 does not route.
fn through_server(f: &Flow, fe: &Frontend) -> Want {
    let src = model_sent_from(f);
    let (mut backends, mut lost) = (BTreeSet::new(), BTreeSet::new());
    for name in &fe.reals {
        let port: u16 = name.rsplit(':').next().unwrap().parse().unwrap();
        let real = SocketAddr::new(pod_ip(name), port);
        let back = if real.ip() == src {
            fe.marked || fe.local.contains(name)
        } else {
            fe.marked || reply_returns(real, src)
        };
        if back {
            backends.insert(name.clone());
        } else {
            lost.insert(name.clone());
        }
    }
    let expect = if backends.is_empty() {
        Expect::NoAnswer
    } else {
        Expect::Answer {
            backends,
            masq: fe.marked || src != source_ip(f),
            sticky: fe.persistent,
        }
    };
    Want { expect, lost }
}

/// The rules whose expectation is a failure of the compiled parts, whatever the kernel
/// does: the manifests' frontend has no virtual server, a virtual server that is no
/// frontend of theirs, or real servers that are not the manifests' endpoints.
const STRUCTURAL: [&str; 3] = [
    "missing-virtual-server",
    "unexpected-virtual-server",
    "real-servers-differ",
];

/// The IPVS expectation of a flow and the rule that gave it (see the module docs), from
/// the flow's [`Frontend`] by the manifests (`fe`) and iptables mode's expectation; the
/// compiled parts only say whether a virtual server is there, and with which real
/// servers, which must be the manifests'.
fn ipvs_expect(f: &Flow, c: &Compiled, fe: Option<&Frontend>) -> (Want, &'static str) {
    let flag = match f.proto {
        Proto::Tcp => "-t",
        Proto::Udp => "-u",
    };
    let src = source_ip(f);
    let plain = |e: Expect, rule| (Want::plain(e), rule);
    // Another host's packet meets KUBE-SOURCE-RANGES-FIREWALL in filter INPUT, before
    // IPVS (LOCAL_IN).
    let outside = |fe: &Frontend, src: IpAddr| {
        !fe.ranges.is_empty() && !fe.ranges.iter().any(|r| r.contains(src))
    };
    if let Some(fe) = fe {
        if f.from != "node" && outside(fe, src) {
            return plain(Expect::Timeout, "source-ranges");
        }
    }
    let local = |ip: IpAddr| {
        ip.is_loopback()
            || c.bound.contains(&ip)
            || ip == IpAddr::V4(super::super::addr::NODE_LAN)
            || ip == IpAddr::V4(super::super::addr::NODE_POD_GW)
    };
    let server = c.servers.get(&format!("{flag} {}", f.dst));
    let (server, fe) = match (server, fe) {
        (None, Some(_)) => return plain(f.expect[0].clone(), "missing-virtual-server"),
        (Some(_), None) => return plain(f.expect[0].clone(), "unexpected-virtual-server"),
        (None, None) if local(f.dst.ip()) => return plain(Expect::Refused, "no-server-local"),
        (None, None) => return plain(Expect::NoAnswer, "no-server-routed"),
        (Some(s), Some(fe)) => (s, fe),
    };
    let compiled: Option<BTreeSet<String>> = server.reals.iter().map(|r| backend(*r)).collect();
    if compiled.as_ref() != Some(&fe.reals) || server.persistent != fe.persistent {
        return plain(f.expect[0].clone(), "real-servers-differ");
    }
    if fe.reals.is_empty() {
        // The service has no usable endpoint at all: IPVS answers ICMP port unreachable.
        return plain(Expect::Refused, "no-real-servers");
    }
    // The node's own packet is scheduled by IPVS in LOCAL_OUT, before any filter chain;
    // KUBE-IPVS-OUT-FILTER (filter OUTPUT, `-m ipvs`) drops it where the source ranges
    // leave the node's source (the VIP) out.
    if f.from == "node" && outside(fe, model_sent_from(f)) {
        return plain(Expect::Timeout, "source-ranges");
    }
    let want = through_server(f, fe);
    let any_local = !fe.local.is_empty();
    let hairpin_lost = want
        .lost
        .iter()
        .any(|b| b.split(':').next() == Some(f.from.as_str()));
    if fe.external_local && any_local {
        (want, "external-local")
    } else if !any_local && (fe.external_local || f.expect[0] == Expect::Timeout) {
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

/// One manifest: apply it, run its flows; the failures. `kinds` counts the flows checked
/// by destination kind and by rule.
fn check(
    lab: &Lab,
    state: &Path,
    inputs: &Path,
    seed: u64,
    kinds: &mut BTreeMap<String, usize>,
) -> Vec<String> {
    let m = Manifest::generated(seed);
    let text = m.text.clone().unwrap();
    // The manifests' view, by the test's own model: never the compiler's.
    let view = m.view();
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
    let mut structural = Vec::new();
    for f in &mut flows {
        let fe = frontend(f, &view);
        let (want, rule) = ipvs_expect(f, &compiled, fe.as_ref());
        *kinds.entry(format!("kind {}", f.kind)).or_default() += 1;
        *kinds.entry(format!("rule {rule}")).or_default() += 1;
        if STRUCTURAL.contains(&rule) {
            structural.push(format!(
                "seed {seed}: {}: {rule}: the manifests say {fe:?}, the ipvsadm part {:?}",
                f.line(),
                compiled
                    .servers
                    .get(&format!(
                        "{} {}",
                        if f.proto == Proto::Tcp { "-t" } else { "-u" },
                        f.dst
                    ))
                    .map(|s| &s.reals)
            ));
        }
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
            seen[i] = forgive_timeouts(&seen[i], &again[i]);
        }
    }
    let mut failures: Vec<String> = structural;
    failures.extend(
        bad.iter()
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
            }),
    );
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
    let mut kinds = BTreeMap::new();
    for seed in first..first + n {
        let start = Instant::now();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            check(&lab, state.path(), inputs.path(), seed, &mut kinds)
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
    if n > 0 {
        // Some flows of every kind IPVS serves, and of the rules every manifest meets.
        let missing: Vec<&str> = REQUIRED_KINDS
            .iter()
            .copied()
            .filter(|k| kinds.get(*k).copied().unwrap_or(0) == 0)
            .collect();
        let verdict = if missing.is_empty() { "ok" } else { "fail" };
        println!("ipvs guest: {KINDS_STEP}: {verdict}: {kinds:?}");
        let mut f = OpenOptions::new()
            .append(true)
            .create(true)
            .open(results)
            .unwrap();
        let _ = writeln!(
            f,
            "{KINDS_STEP}\t{verdict}\t0\tnothing checked of {missing:?} (checked {kinds:?})"
        );
    }
}

/// What every IPVS differential run must have checked some flows of.
const REQUIRED_KINDS: [&str; 7] = [
    "kind cluster IP",
    "kind node port",
    "kind load-balancer IP",
    "kind external IP",
    "rule as-iptables",
    "rule no-server-local",
    "rule external-local",
];

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
fn the_rules_follow_the_manifests() {
    // The compiled parts only say which virtual servers exist, with which real servers.
    let c = read_bundle(concat!(
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
        "address add 203.0.113.6/32 dev kube-ipvs0\n",
        "address add 203.0.113.7/32 dev kube-ipvs0\n",
        "address add 203.0.113.8/32 dev kube-ipvs0\n",
    ));
    let flow = |from: &str, proto: Proto, dst: &str, kind: &str, iptables: Expect| Flow {
        group: String::new(),
        kind: kind.into(),
        what: String::new(),
        from: from.into(),
        proto,
        dst: dst.parse().unwrap(),
        expect: [iptables.clone(), iptables],
        intended: None,
        traced: Default::default(),
        port: None,
    };
    let set = |b: &[&str]| -> BTreeSet<String> { b.iter().map(|s| s.to_string()).collect() };
    let fe = |reals: &[&str], local: &[&str], marked: bool| Frontend {
        reals: set(reals),
        local: set(local),
        marked,
        ..Frontend::default()
    };
    let answer = |b: &[&str], masq: bool| Expect::Answer {
        backends: set(b),
        masq,
        sticky: false,
    };
    let want = |e: Expect, lost: &[&str]| Want {
        expect: e,
        lost: set(lost),
    };
    let tcp = |from: &str, dst: &str, kind: &str, fe: Option<&Frontend>| {
        ipvs_expect(&flow(from, Proto::Tcp, dst, kind, Expect::Unknown), &c, fe)
    };
    let rule =
        |from: &str, dst: &str, kind: &str, fe: Option<&Frontend>| tcp(from, dst, kind, fe).1;
    let web = fe(&["pod-a:9090", "pod-r2:9090"], &["pod-a:9090"], false);

    assert_eq!(
        rule("pod-b", "10.96.0.1:80", "cluster IP", Some(&web)),
        "as-iptables"
    );
    // Destinations that are no frontend: nothing listens on a local address, anything
    // else is routed on.
    assert_eq!(
        rule("pod-a", "10.96.0.1:1", "cluster IP, unknown port", None),
        "no-server-local"
    );
    assert_eq!(
        rule(
            "pod-a",
            "10.244.1.1:30001",
            "node port on the pod gateway",
            None
        ),
        "no-server-local"
    );
    assert_eq!(
        rule("pod-a", "198.51.100.77:80", "external IP", None),
        "no-server-routed"
    );
    // The manifests' frontend without a virtual server, a virtual server of no
    // frontend, real servers other than the manifests' endpoints: structural failures,
    // whatever the kernel then does.
    assert_eq!(
        rule("client1", "192.0.2.10:30009", "node port", Some(&web)),
        "missing-virtual-server"
    );
    assert_eq!(
        rule(
            "client1",
            "192.0.2.10:30001",
            "node port on the pod gateway",
            None
        ),
        "unexpected-virtual-server"
    );
    assert_eq!(
        rule(
            "pod-b",
            "10.96.0.1:80",
            "cluster IP",
            Some(&fe(&["pod-a:9090"], &[], false))
        ),
        "real-servers-differ"
    );
    let mut sticky = web.clone();
    sticky.persistent = true;
    assert_eq!(
        rule("pod-b", "10.96.0.1:80", "cluster IP", Some(&sticky)),
        "real-servers-differ"
    );
    // No usable endpoint at all, by the manifests: refused.
    let none = fe(&[], &[], true);
    assert_eq!(
        tcp("client1", "192.0.2.10:30001", "node port", Some(&none)),
        (want(Expect::Refused, &[]), "no-real-servers")
    );
    // Source ranges: other hosts are dropped before IPVS; the node meets IPVS first
    // (refused without real servers, else dropped by KUBE-IPVS-OUT-FILTER).
    let mut ranged = fe(&["pod-b:8080"], &["pod-b:8080"], true);
    ranged.ranges = vec![Cidr::parse("192.0.2.100/32").unwrap()];
    assert_eq!(
        rule(
            "client2",
            "203.0.113.6:80",
            "load-balancer IP",
            Some(&ranged)
        ),
        "source-ranges"
    );
    assert_eq!(
        rule(
            "client1",
            "203.0.113.6:80",
            "load-balancer IP",
            Some(&ranged)
        ),
        "as-iptables"
    );
    assert_eq!(
        tcp("node", "203.0.113.6:80", "load-balancer IP", Some(&ranged)).0,
        want(Expect::Timeout, &[])
    );
    let mut ranged_empty = none.clone();
    ranged_empty.ranges = ranged.ranges.clone();
    assert_eq!(
        rule(
            "node",
            "203.0.113.8:80",
            "load-balancer IP",
            Some(&ranged_empty)
        ),
        "no-real-servers"
    );
    assert_eq!(
        rule(
            "client1",
            "203.0.113.8:80",
            "load-balancer IP",
            Some(&ranged_empty)
        ),
        "no-real-servers"
    );

    // ETP=Local: the local real servers for every source, not masqueraded; the node's
    // own packet leaves from the VIP (not the node's address: "masq" to the probe).
    let mut etp = fe(&["pod-b:8080"], &["pod-b:8080"], false);
    etp.external_local = true;
    assert_eq!(
        tcp("pod-a", "203.0.113.7:80", "load-balancer IP", Some(&etp)),
        (want(answer(&["pod-b:8080"], false), &[]), "external-local")
    );
    assert_eq!(
        tcp("node", "203.0.113.7:80", "load-balancer IP", Some(&etp)),
        (want(answer(&["pod-b:8080"], true), &[]), "external-local")
    );
    // A node port: the node sends from its own address.
    assert_eq!(
        tcp("node", "192.0.2.10:30002", "node port", Some(&etp)),
        (want(answer(&["pod-b:8080"], false), &[]), "external-local")
    );
    // ETP=Local without a local endpoint: the cluster's (kube-proxy's fallback) ...
    let mut fallback = fe(&["pod-r1:8080"], &[], false);
    fallback.external_local = true;
    assert_eq!(
        tcp("client1", "192.0.2.10:30003", "node port", Some(&fallback)),
        (want(answer(&["pod-r1:8080"], false), &[]), "local-fallback")
    );
    // ... whose remote reply to the node's own VIP source never comes back.
    assert_eq!(
        tcp("node", "198.18.0.5:80", "external IP", Some(&fallback)),
        (want(Expect::NoAnswer, &["pod-r1:8080"]), "local-fallback")
    );
    // ITP=Local without a local endpoint (iptables mode drops): the cluster's, with the
    // masquerade the manifests give.
    let mut itp = fe(&["pod-r1:9090"], &[], false);
    itp.persistent = true;
    let udp = |from: &str, fe: &Frontend| {
        ipvs_expect(
            &flow(
                from,
                Proto::Udp,
                "10.96.0.9:53",
                "cluster IP",
                Expect::Timeout,
            ),
            &c,
            Some(fe),
        )
    };
    let sticky = |masq| Expect::Answer {
        backends: set(&["pod-r1:9090"]),
        masq,
        sticky: true,
    };
    assert_eq!(
        udp("pod-a", &itp),
        (want(sticky(false), &[]), "local-fallback")
    );
    itp.marked = true;
    assert_eq!(
        udp("client1", &itp),
        (want(sticky(true), &[]), "local-fallback")
    );
    // A real server on pod-a's address that is not local (no nodeName): pod-a reaching
    // itself is not masqueraded and never answered.
    let stray = fe(&["pod-a:9090", "pod-r2:9090"], &[], false);
    let hairpin = tcp("pod-a", "10.96.0.1:80", "cluster IP", Some(&stray));
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
