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
        }
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
                    "cilium_lb4_services_v2" if d["wildcard"] != true => {
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
    let spec = super::LabSpec::default();
    let ip = match addr.ip() {
        std::net::IpAddr::V4(ip) => ip,
        _ => return None,
    };
    super::SERVED_PORTS.contains(&addr.port()).then_some(())?;
    spec.local_pods
        .iter()
        .chain(&spec.remote_pods)
        .find(|h| h.ip == ip)
        .map(|h| format!("{}:{}", h.name, addr.port()))
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

/// Applies `m`'s eBPF maps and probes its flows; the failures, one line each.
pub(super) fn check(side: &mut Side, m: &Manifest, flows: &[Flow], _view: &View) -> Vec<String> {
    if side.cg.is_none() {
        return Vec::new();
    }
    let json = m.compile("ebpf");
    if !json.contains("\"family\": \"IPv4\"") {
        return Vec::new(); // the differential is IPv4
    }
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
    let todo = served(flows, &Maps::of(&json));
    side.flows += todo.len();
    side.policy_differs += todo.iter().filter(|(f, w)| differs(f, w)).count();
    let failures = Mutex::new(Vec::new());
    let next = AtomicUsize::new(0);
    let lab = &side.lab;
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((f, want)) = todo.get(i) else { break };
                // A disagreement is probed once more (a slow answer on a busy machine).
                let bad =
                    probe(lab, cg, f, want.as_ref()).and_then(|_| probe(lab, cg, f, want.as_ref()));
                if let Some(why) = bad {
                    failures
                        .lock()
                        .unwrap()
                        .push(format!("  {}: ebpf {why}", f.line()));
                }
            });
        }
    });
    failures.into_inner().unwrap()
}

/// One flow: `None` when the socket LB did what the IR says.
fn probe(
    lab: &super::Lab,
    cg: &Cgroup,
    f: &Flow,
    want: Option<&(BTreeSet<String>, bool)>,
) -> Option<String> {
    let netns = lab.netns(&f.from);
    let answers = |seen: &[Seen]| -> (BTreeSet<String>, Vec<String>) {
        let mut got = BTreeSet::new();
        let mut other = Vec::new();
        for s in seen {
            match s {
                Seen::Answer { backend, peer } if *peer == f.dst => {
                    got.insert(backend.clone());
                }
                Seen::Answer { backend, peer } => other.push(format!("{backend} with peer {peer}")),
                Seen::Errno(e) => other.push(format!("errno {e}")),
                Seen::Other(t) => other.push(t.clone()),
            }
        }
        (got, other)
    };
    match want {
        None => {
            let seen = probes(Some(cg), netns, f.proto, f.dst, 1);
            let (got, _) = answers(&seen);
            let any = seen.iter().any(|s| matches!(s, Seen::Answer { .. }));
            (any || !got.is_empty()).then(|| format!("answered {seen:?}, the IR says no answer"))
        }
        Some((backends, sticky)) => {
            let n = if *sticky { 10 } else { 3 * backends.len() + 3 };
            let seen = probes(Some(cg), netns, f.proto, f.dst, n);
            let (mut got, mut other) = answers(&seen);
            // Random slots: more probes until every backend has answered (bounded).
            if !*sticky && other.is_empty() && got != *backends {
                let more = probes(Some(cg), netns, f.proto, f.dst, 60);
                let (g, o) = answers(&more);
                got.extend(g);
                other.extend(o);
            }
            let reached = if *sticky {
                got.len() == 1 && got.is_subset(backends)
            } else {
                got == *backends
            };
            (!reached || !other.is_empty()).then(|| {
                format!(
                    "reached {got:?} (others {other:?}), the IR says {}{backends:?}",
                    if *sticky { "one of " } else { "" }
                )
            })
        }
    }
}
