//! The eBPF side of the differential test: every manifest's `--target ebpf` JSON is
//! loaded with `svc-compile apply --from FILE --target ebpf` (incrementally, one
//! manifest after the other, as a node would see them) into a fresh cgroup of a third
//! lab, and every flow the IR implies that a socket load balancer serves is probed from
//! a process in that cgroup: senders on the node (the node itself, its pods) to a cluster
//! IP, a node port on a node address, an external IP or a load-balancer IP. Where the IR
//! expects an answer the socket LB must reach exactly that backend set (or one of it,
//! with session affinity); where it expects none, none may answer. Masquerade is not
//! compared: a socket LB rewrites the destination only, backends see the real client.
//!
//! Not served by a socket LB, so not probed: LAN clients and remote pods (XDP/tc
//! NodePort, another node's programs), `127.0.0.1:nodePort` (kube-proxy's modes differ
//! there), node ports on local addresses that are not the Node object's, and the
//! intended differences between iptables and nftables.
//!
//! The expectation is the compiled maps' (see [`expectation`]): the socket LB must reach
//! exactly the backends the master counts. Where that is not the IR's kube-proxy answer
//! (Cilium's semantics: in-node traffic to an external address follows the internal
//! traffic policy, topology is not read, an endpoint without a node is local, every
//! address of an endpoint is a backend, affinity pins active backends only, source
//! ranges apply to traffic from outside only), the flow is counted in
//! [`Side::policy_differs`]; the layout itself is checked by the golden snapshots.

use super::super::ebpf::{cgroup2_mount, probes, Cgroup, Seen};
use super::super::lab::skip;
use super::{Expect, Flow, Manifest, View};
use crate::support::{root, svc, TempDir};
use serde_json::Value;
use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Senders inside the node (in the cgroup).
const SENDERS: [&str; 3] = ["node", "pod-a", "pod-b"];
/// Destination kinds a socket LB translates.
/// (Not `node port on the pod gateway`: the maps name the node addresses of the Node
/// object, and loopback through the surrogate; another local address is not known
/// when compiling.)
const KINDS: [&str; 4] = ["cluster IP", "node port", "external IP", "load-balancer IP"];

/// A lab, a cgroup and the state directory of its applies; pins and cgroup go on drop.
pub(super) struct Side {
    lab: super::Lab,
    cg: Option<Cgroup>,
    inst: PathBuf,
    tmp: TempDir,
    /// Flows probed, manifests applied, flows whose expectation is not kube-proxy's.
    pub(super) flows: usize,
    pub(super) applied: usize,
    pub(super) policy_differs: usize,
    /// Flows probed by destination kind and answer expected (`kind: answer|no answer`),
    /// and manifests applied by family: [`Side::assert_every_kind`].
    pub(super) kinds: BTreeMap<String, usize>,
}

impl Side {
    /// A lab serving like the other two (every pod, TCP and UDP, on every served port)
    /// and a fresh cgroup; without a cgroup2 mount the eBPF side skips (a failure under
    /// `SVC_KERNEL=require`).
    pub(super) fn new() -> Side {
        let spec = super::LabSpec::default();
        let mut lab = super::Lab::new("diffebpf", &spec).expect("lab");
        for pod in spec.local_pods.iter().chain(&spec.remote_pods) {
            for port in super::SERVED_PORTS {
                for proto in [super::Proto::Tcp, super::Proto::Udp] {
                    lab.serve_as(&pod.name, &format!("{}:{port}", pod.name), proto, port)
                        .expect("serve");
                }
            }
        }
        let cg = match cgroup2_mount() {
            Some(mount) => Some(Cgroup::new(&mount)),
            None => {
                skip(
                    "kernel differential ebpf",
                    "no cgroup2 mount in /proc/mounts",
                );
                None
            }
        };
        let inst = Path::new("/sys/fs/bpf/svc-compile").join(format!(
            "cg-{}",
            cg.as_ref().map_or("none".into(), |c| c
                .0
                .file_name()
                .unwrap()
                .to_string_lossy())
        ));
        Side {
            lab,
            cg,
            inst,
            tmp: TempDir::new("diff-ebpf"),
            flows: 0,
            applied: 0,
            policy_differs: 0,
            kinds: BTreeMap::new(),
        }
    }

    /// Every destination kind a socket LB serves was probed, expecting an answer and
    /// expecting none, and manifests of both families were applied.
    pub(super) fn assert_every_kind(&self) {
        if self.cg.is_none() {
            return; // skipped, which SVC_KERNEL=require made a failure
        }
        let mut want: Vec<String> = KINDS.iter().map(|k| format!("{k}: answer")).collect();
        want.extend(["cluster IP: no answer", "family IPv4", "family IPv6"].map(str::to_string));
        let missing: Vec<&String> = want
            .iter()
            .filter(|k| self.kinds.get(*k).copied().unwrap_or(0) == 0)
            .collect();
        assert!(
            missing.is_empty(),
            "the eBPF side checked nothing of {missing:?} (checked: {:?})",
            self.kinds
        );
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.inst);
        self.cg = None;
    }
}

/// The backends a flow must reach and whether it is sticky; `None`: no answer.
type Want = Option<(BTreeSet<String>, bool)>;

/// What the compiled maps say a socket LB does, read from the target's JSON (its
/// `decoded` entries): per frontend key (`ip:port/PROTO[/i]`) the master's count, flags
/// and rev-NAT id, the slots' backends, and the affinity matches.
struct Maps {
    masters: BTreeMap<String, (u64, u64, u64)>,
    slots: BTreeMap<(String, u64), (String, u64)>,
    matches: BTreeSet<(u64, u64)>,
}

impl Maps {
    fn of(json: &str) -> Maps {
        let v: Value = serde_json::from_str(json).expect("ebpf JSON");
        let mut m = Maps {
            masters: BTreeMap::new(),
            slots: BTreeMap::new(),
            matches: BTreeSet::new(),
        };
        for map in v["maps"].as_array().unwrap() {
            for e in map["entries"].as_array().unwrap() {
                let d = &e["decoded"];
                let num = |f: &str| d[f].as_u64().unwrap_or(0);
                let flags = || {
                    u64::from_str_radix(d["flags"].as_str().unwrap().trim_start_matches("0x"), 16)
                        .unwrap()
                };
                match map["name"].as_str().unwrap() {
                    "cilium_lb4_services_v2" | "cilium_lb6_services_v2"
                        if d["wildcard"] != true =>
                    {
                        let fe = d["frontend"].as_str().unwrap().to_string();
                        if num("slot") == 0 {
                            m.masters.insert(fe, (num("count"), flags(), num("revNat")));
                        } else {
                            let be = d["backend"].as_str().unwrap().to_string();
                            m.slots.insert((fe, num("slot")), (be, num("backendId")));
                        }
                    }
                    "cilium_lb_affinity_match" => {
                        m.matches.insert((num("backendId"), num("revNat")));
                    }
                    _ => {}
                }
            }
        }
        m
    }
}

/// What the socket LB must do with a flow by the compiled maps (the datapath's lookup:
/// the exact key, then the internal scope of a two-scope service): the active slots'
/// backends, sticky when the master asks for affinity and every one of them has its
/// affinity match; `Some(None)` (no answer) for a master that counts nothing. Skipped
/// (outer `None`) when no master answers the key or a backend has no lab server.
fn expectation(f: &Flow, maps: &Maps) -> Option<Want> {
    let proto = match f.proto {
        super::Proto::Tcp => "TCP",
        super::Proto::Udp => "UDP",
    };
    let mut key = format!("{}/{proto}", f.dst);
    let &(mut count, flags, mut rev_nat) = maps.masters.get(&key)?;
    if flags & TWO_SCOPES != 0 {
        key += "/i";
        (count, _, rev_nat) = *maps.masters.get(&key)?;
    }
    if count == 0 {
        return Some(None);
    }
    let mut backends = BTreeSet::new();
    let mut matched = true;
    for slot in 1..=count {
        let (be, id) = maps.slots.get(&(key.clone(), slot))?;
        let addr: SocketAddr = be.split('/').next()?.parse().ok()?;
        backends.insert(lab_name(addr)?);
        matched &= maps.matches.contains(&(*id, rev_nat));
    }
    Some(Some((backends, flags & AFFINITY != 0 && matched)))
}

/// `SVC_FLAG_TWO_SCOPES` (flags2 bit 5) and `SVC_FLAG_AFFINITY` in the decoded flags.
const TWO_SCOPES: u64 = 1 << 13;
const AFFINITY: u64 = 1 << 4;

/// The lab's server at a backend address (`pod:port`), if there is one.
fn lab_name(addr: SocketAddr) -> Option<String> {
    super::SERVED_PORTS.contains(&addr.port()).then_some(())?;
    Some(format!("{}:{}", super::pod_at(addr.ip())?, addr.port()))
}

/// The flows of one manifest a socket LB serves, with what it must do.
fn served<'a>(flows: &'a [Flow], maps: &Maps) -> Vec<(&'a Flow, Want)> {
    flows
        .iter()
        .filter(|f| f.intended.is_none() && !f.dst.ip().is_loopback())
        .filter(|f| SENDERS.contains(&f.from.as_str()) && KINDS.contains(&f.kind.as_str()))
        .filter_map(|f| Some((f, expectation(f, maps)?)))
        .collect()
}

/// Whether the IR's (kube-proxy's) answer differs from the socket LB's expectation.
fn differs(f: &Flow, want: &Want) -> bool {
    match (&f.expect[0], want) {
        (Expect::Answer { backends, .. }, Some((b, _))) => backends != b,
        (Expect::Answer { .. }, None) | (_, Some(_)) => true,
        _ => false,
    }
}

/// The family of a compiled eBPF document (its `family` field, which must be there).
fn family(json: &str) -> super::Family {
    let v: Value = serde_json::from_str(json).expect("ebpf JSON");
    match v.get("family").and_then(Value::as_str) {
        Some("IPv4") => super::Family::V4,
        Some("IPv6") => super::Family::V6,
        f => panic!("the ebpf document's family is {f:?}"),
    }
}

/// Applies `m`'s eBPF maps and probes its flows; the failures, one line each.
pub(super) fn check(side: &mut Side, m: &Manifest, flows: &[Flow], view: &View) -> Vec<String> {
    if side.cg.is_none() {
        return Vec::new();
    }
    let json = m.compile("ebpf");
    let family = family(&json);
    if family != view.family {
        // The document is the node's other family (a dual-stack case's first one): the
        // flows' family is compiled with --family to compare like with like.
        return vec![format!(
            "  ebpf: the document is {family:?}, the flows {:?}",
            view.family
        )];
    }
    *side
        .kinds
        .entry(format!(
            "family {}",
            if family == super::Family::V4 {
                "IPv4"
            } else {
                "IPv6"
            }
        ))
        .or_default() += 1;
    let file = side.tmp.path().join("maps.json");
    std::fs::write(&file, &json).unwrap();
    let cg = side.cg.as_ref().unwrap();
    let r = svc(
        &[
            "apply",
            "--from",
            file.to_str().unwrap(),
            "--target",
            "ebpf",
            "--cgroup",
            cg.0.to_str().unwrap(),
            "--netns",
            side.lab.netns("node"),
            "--state-dir",
            side.tmp.path().join("state").to_str().unwrap(),
        ],
        None,
        &root(),
    );
    if r.code != 0 {
        return vec![format!(
            "  ebpf: `{}` exited {}: {}",
            r.cmdline,
            r.code,
            r.stderr.trim()
        )];
    }
    side.applied += 1;
    let maps = Maps::of(&json);
    let todo = served(flows, &maps);
    side.flows += todo.len();
    side.policy_differs += todo.iter().filter(|(f, w)| differs(f, w)).count();
    for (f, w) in &todo {
        let e = if w.is_some() { "answer" } else { "no answer" };
        *side.kinds.entry(format!("{}: {e}", f.kind)).or_default() += 1;
    }
    // Cilium gives every service with a cluster IP its frontend, endpoints or not: a
    // cluster IP of the manifest without one is a service the maps lost.
    let mut missing: Vec<String> = flows
        .iter()
        .filter(|f| f.kind == "cluster IP" && f.from == "node")
        .filter(|f| !maps.masters.contains_key(&frontend(f)))
        .map(|f| {
            format!(
                "  {}: ebpf: no frontend {} in the maps",
                f.line(),
                frontend(f)
            )
        })
        .collect();
    let failures = Mutex::new(Vec::new());
    let next = AtomicUsize::new(0);
    let lab = &side.lab;
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((f, want)) = todo.get(i) else { break };
                // A disagreement made of timeouts alone is probed once more (a slow answer
                // on a busy machine); the second look keeps what the first one saw.
                let first = observe(lab, cg, f, want.as_ref(), None);
                let bad = match verdict(want.as_ref(), &first) {
                    Some(_) if first.only_timeouts(want.as_ref()) => verdict(
                        want.as_ref(),
                        &observe(lab, cg, f, want.as_ref(), Some(&first)),
                    ),
                    bad => bad,
                };
                if let Some(why) = bad {
                    failures
                        .lock()
                        .unwrap()
                        .push(format!("  {}: ebpf {why}", f.line()));
                }
            });
        }
    });
    missing.extend(failures.into_inner().unwrap());
    missing
}

/// A flow's frontend key in the maps' decoded form (`ip:port/PROTO`).
fn frontend(f: &Flow) -> String {
    let proto = match f.proto {
        super::Proto::Tcp => "TCP",
        super::Proto::Udp => "UDP",
    };
    format!("{}/{proto}", f.dst)
}

/// What the probes of one flow saw: backends that answered at the flow's destination,
/// anything else (an answer from another peer, an errno, an odd failure), and timeouts.
#[derive(Clone, Debug, Default)]
struct Observed {
    got: BTreeSet<String>,
    other: Vec<String>,
    timeouts: usize,
}

impl Observed {
    /// Whether a disagreement could be a slow answer: nothing but timeouts went wrong (no
    /// backend outside the set, no other failure, no answer where none is due).
    fn only_timeouts(&self, want: Option<&(BTreeSet<String>, bool)>) -> bool {
        self.timeouts > 0
            && self.other.is_empty()
            && match want {
                None => self.got.is_empty(),
                Some((backends, _)) => self.got.is_subset(backends),
            }
    }
}

/// A socket's "no answer in time": ETIMEDOUT, EAGAIN (a receive timeout), or the
/// standard library's own timeout error.
fn is_timeout(s: &Seen) -> bool {
    match s {
        Seen::Errno(e) => *e == libc_errno::ETIMEDOUT || *e == libc_errno::EAGAIN,
        Seen::Other(t) => t.contains("timed out") || t.contains("Resource temporarily"),
        Seen::Answer { .. } => false,
    }
}

mod libc_errno {
    pub const EAGAIN: i32 = 11;
    pub const ETIMEDOUT: i32 = 110;
}

/// Probes one flow, adding to `before` (a first look's observation) when given.
fn observe(
    lab: &super::Lab,
    cg: &Cgroup,
    f: &Flow,
    want: Option<&(BTreeSet<String>, bool)>,
    before: Option<&Observed>,
) -> Observed {
    let netns = lab.netns(&f.from);
    // The first look's timeouts are what the second one may take back.
    let mut o = before.map_or_else(Observed::default, |b| Observed {
        timeouts: 0,
        ..b.clone()
    });
    let take = |seen: &[Seen], o: &mut Observed| {
        for s in seen {
            match s {
                Seen::Answer { backend, peer } if *peer == f.dst => {
                    o.got.insert(backend.clone());
                }
                Seen::Answer { backend, peer } => {
                    o.other.push(format!("{backend} with peer {peer}"))
                }
                s if is_timeout(s) => o.timeouts += 1,
                Seen::Errno(e) => o.other.push(format!("errno {e}")),
                Seen::Other(t) => o.other.push(t.clone()),
            }
        }
    };
    match want {
        None => take(&probes(Some(cg), netns, f.proto, f.dst, 1), &mut o),
        Some((backends, sticky)) => {
            let n = if *sticky { 10 } else { 3 * backends.len() + 3 };
            take(&probes(Some(cg), netns, f.proto, f.dst, n), &mut o);
            // Random slots: more probes until every backend has answered (bounded).
            if !*sticky && o.other.is_empty() && o.got != *backends {
                take(&probes(Some(cg), netns, f.proto, f.dst, 60), &mut o);
            }
        }
    }
    o
}

/// `None` when the socket LB did what the maps say.
fn verdict(want: Option<&(BTreeSet<String>, bool)>, o: &Observed) -> Option<String> {
    match want {
        // No answer due: a timeout or an errno (EHOSTUNREACH, ECONNREFUSED) is fine.
        None => (!o.got.is_empty() || o.other.iter().any(|x| x.contains(" with peer ")))
            .then(|| format!("answered {o:?}, the maps say no answer")),
        Some((backends, sticky)) => {
            let reached = if *sticky {
                o.got.len() == 1 && o.got.is_subset(backends)
            } else {
                o.got == *backends
            };
            (!reached || !o.other.is_empty() || o.timeouts > 0).then(|| {
                format!(
                    "reached {:?} (others {:?}, {} timeouts), the maps say {}{backends:?}",
                    o.got,
                    o.other,
                    o.timeouts,
                    if *sticky { "one of " } else { "" }
                )
            })
        }
    }
}
