//! The discovery targets for real: the `dns` zones served by knot and queried record by
//! record with kdig, and the userspace-proxy template example (HAProxy plus iptables
//! REDIRECT) carrying TCP connections to echo backends in a kernel lab.
//!
//! Both need root and Debian's servers (knot, knot-dnsutils, haproxy). Without them the
//! tests print `skipped: ...`, unless `SVC_KERNEL=require` (CI) makes that a failure.
use svc_node::sys::libc;

use crate::kernel::lab::NODE;
use crate::kernel::sys::run_bounded;
use crate::kernel::{Lab, LabSpec, Outcome, Proto};
use crate::support::{example_manifests, root, svc, TempDir};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};
use svc_compiler::ir::{Module, ServiceType};
use svc_compiler::source::SourceMap;
use svc_targets::dns;

/// Whether the test can run: root and every program present. Otherwise prints why and
/// returns false, or panics when `SVC_KERNEL=require`.
pub(crate) fn ready(test: &str, programs: &[&str]) -> bool {
    crate::kernel::lab::check_svc_kernel();
    // SAFETY: geteuid cannot fail.
    let mut missing: Vec<String> = if unsafe { libc::geteuid() } == 0 {
        vec![]
    } else {
        vec!["root".into()]
    };
    for p in programs {
        let found = ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
            .iter()
            .any(|d| Path::new(d).join(p).exists());
        if !found {
            missing.push(p.to_string());
        }
    }
    if missing.is_empty() {
        return true;
    }
    crate::kernel::lab::skip(test, &format!("needs {}", missing.join(", ")));
    false
}

/// A server process in a lab namespace, killed and reaped on drop (also on panic).
pub(crate) struct Daemon {
    child: Child,
    stderr: std::path::PathBuf,
    program: String,
}

impl Daemon {
    pub(crate) fn start(netns: &str, program: &str, args: &[&str], dir: &Path) -> Daemon {
        let stderr = dir.join(format!("{program}.stderr"));
        let child = Command::new("ip")
            .args(["netns", "exec", netns, program])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("start {program}: {e}"));
        Daemon {
            child,
            stderr,
            program: program.to_string(),
        }
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Fails the test with the server's log if it has exited.
    pub(crate) fn check_alive(&mut self, what: &str) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("{what} exited ({status}):\n{}", self.log());
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Compiles manifest texts (named for diagnostics) and fails on any error.
fn compile(files: &[(String, String)]) -> Module {
    let mut sources = SourceMap::default();
    let ids: Vec<_> = files
        .iter()
        .map(|(n, t)| sources.add(n.clone(), t.clone()))
        .collect();
    let c = svc_compiler::compile(
        &sources,
        &ids,
        &svc_compiler::Options {
            allocate: true,
            ..Default::default()
        },
    );
    assert!(!c.diags.has_errors(), "{:?}", c.diags.items);
    c.module
}

// ---------------------------------------------------------------------------------------
// DNS
// ---------------------------------------------------------------------------------------

/// What the examples lack: the DNS service, a headless StatefulSet-like service with
/// pod hostnames (one pod not ready, one under another subdomain), a headless service
/// over an IPv6 EndpointSlice, and one whose only endpoint is not ready.
pub(crate) const DNS_EXTRA: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system}
spec:
  clusterIP: 10.0.0.10
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
---
apiVersion: v1
kind: Service
metadata: {name: db, namespace: disco}
spec:
  clusterIP: None
  selector: {app: db}
  ports: [{name: pg, port: 5432, targetPort: pg}]
---
apiVersion: v1
kind: Pod
metadata: {name: db-0, namespace: disco, labels: {app: db}}
spec:
  hostname: db-0
  subdomain: db
  containers: [{name: c, ports: [{name: pg, containerPort: 5432}]}]
status:
  podIPs: [{ip: 10.244.1.5}]
  conditions: [{type: Ready, status: "True"}]
---
apiVersion: v1
kind: Pod
metadata: {name: db-1, namespace: disco, labels: {app: db}}
spec:
  hostname: db-1
  subdomain: db
  containers: [{name: c, ports: [{name: pg, containerPort: 5432}]}]
status:
  podIPs: [{ip: 10.244.1.6}]
  conditions: [{type: Ready, status: "False"}]
---
apiVersion: v1
kind: Pod
metadata: {name: other-0, namespace: disco, labels: {app: db}}
spec:
  hostname: other-0
  subdomain: not-db
  containers: [{name: c, ports: [{name: pg, containerPort: 5432}]}]
status:
  podIPs: [{ip: 10.244.1.7}]
  conditions: [{type: Ready, status: "True"}]
---
apiVersion: v1
kind: Service
metadata: {name: six, namespace: disco}
spec:
  clusterIP: None
  ports: [{name: web, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: six-1, namespace: disco, labels: {kubernetes.io/service-name: six}}
addressType: IPv6
ports: [{name: web, port: 8080}]
endpoints:
- addresses: ["fd00:10:244:1::5"]
  hostname: web-0
- addresses: ["fd00:10:244:1::6"]
---
apiVersion: v1
kind: Service
metadata: {name: empty, namespace: disco}
spec:
  clusterIP: None
  ports: [{name: web, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: empty-1, namespace: disco, labels: {kubernetes.io/service-name: empty}}
addressType: IPv4
ports: [{name: web, port: 8080}]
endpoints:
- addresses: [10.244.1.9]
  conditions: {ready: false}
"#;

/// What a query must return: these records (`"<ttl> <type> <data>"`), or NOERROR with
/// no answer (the name exists with other types, or has children), or NXDOMAIN.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    Records(BTreeSet<String>),
    NoData,
    NxDomain,
    /// A name outside every zone the server has.
    Refused,
}

pub(crate) fn records<const N: usize>(rrs: [&str; N]) -> Answer {
    Answer::Records(rrs.iter().map(|s| s.to_string()).collect())
}

/// What the spec says each name must return, from the IR, written apart from the
/// target: spec sections 2.2–2.5 (ready = the endpoint's ready condition).
fn spec_answers(m: &Module, origin: &str, ttl: u32) -> BTreeMap<(String, &'static str), Answer> {
    let mut want: BTreeMap<(String, &'static str), BTreeSet<String>> = BTreeMap::new();
    let mut add = |name: String, kind: &'static str, data: String| {
        want.entry((name, kind))
            .or_default()
            .insert(format!("{ttl} {kind} {data}"));
    };
    let mut nx = Vec::new();
    let family = |ip: &IpAddr| if ip.is_ipv4() { "A" } else { "AAAA" };
    for s in &m.services {
        let base = format!("{}.{}.svc.{origin}", s.name, s.namespace);
        if s.kind == ServiceType::ExternalName {
            let ext = s.external_name.clone().unwrap();
            add(base, "CNAME", format!("{ext}."));
        } else if !s.cluster_ips.is_empty() {
            for ip in &s.cluster_ips {
                add(base.clone(), family(ip), ip.to_string());
                add(dns::reverse_name(ip), "PTR", base.clone());
            }
            for p in s.ports.iter().filter(|p| !p.name.is_empty()) {
                let name = format!("_{}._{}.{base}", p.name, p.protocol.lower());
                add(name, "SRV", format!("0 100 {} {base}", p.port));
            }
        } else if s.headless {
            let ready: Vec<_> = s
                .ports
                .iter()
                .flat_map(|p| p.endpoints.iter().map(move |e| (p, e)))
                .filter(|(_, e)| e.ready)
                .collect();
            if ready.is_empty() {
                nx.push(base.clone());
            }
            let n_per_port = |name: &str| ready.iter().filter(|(p, _)| p.name == name).count();
            for (p, e) in &ready {
                let host = match &e.hostname {
                    Some(h) => h.clone(),
                    None => e.ip.to_string().replace(['.', ':'], "-"),
                };
                let target = format!("{host}.{base}");
                add(base.clone(), family(&e.ip), e.ip.to_string());
                add(target.clone(), family(&e.ip), e.ip.to_string());
                add(dns::reverse_name(&e.ip), "PTR", target.clone());
                if !p.name.is_empty() {
                    let name = format!("_{}._{}.{base}", p.name, p.protocol.lower());
                    let weight = (100 / n_per_port(&p.name)).max(1);
                    add(name, "SRV", format!("0 {weight} {} {target}", e.port));
                }
            }
        }
    }
    let mut out: BTreeMap<(String, &'static str), Answer> = want
        .into_iter()
        .map(|(k, v)| (k, Answer::Records(v)))
        .collect();
    for name in nx {
        out.insert((name.clone(), "A"), Answer::NxDomain);
        out.insert((format!("_web._tcp.{name}"), "SRV"), Answer::NxDomain);
    }
    // A name with records of one family has no data for the other.
    let names: Vec<(String, &str)> = out
        .iter()
        .filter(|(_, a)| matches!(a, Answer::Records(_)))
        .map(|(k, _)| k.clone())
        .collect();
    for (name, kind) in names {
        let other = match kind {
            "A" => "AAAA",
            "AAAA" => "A",
            _ => continue,
        };
        out.entry((name, other)).or_insert(Answer::NoData);
    }
    out
}

/// One query with kdig inside the lab: the status and the answers for `name`/`kind`.
///
/// An answer that should come is waited for up to [`HANG_GUARD`], each attempt a new kdig
/// with a new source port: knotd 3.2 binds one UDP socket per worker (SO_REUSEPORT, two
/// here) and the kernel picks the socket by the 4-tuple, so kdig's own retries, which keep
/// their port, all reach the same worker. Twice, in kernel-suite runs beside a
/// 10k-service nft load in another namespace, one kdig got no answer to 4 tries over 40 s
/// while every other query of the test was answered; the cause is not known. Every unanswered attempt is printed with what the node shows then
/// (knotd alive, its sockets' queues, its log), so a failure carries it.
pub(crate) fn query(
    lab: &Lab,
    knot: &mut Daemon,
    name: &str,
    kind: &str,
) -> (String, BTreeSet<String>) {
    let deadline = Instant::now() + HANG_GUARD;
    loop {
        let started = Instant::now();
        match try_query(lab, name, kind) {
            Ok(answer) => return answer,
            Err(e) => {
                let sockets = lab
                    .exec(NODE, "ss", &["-uanpm"], None)
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                    .unwrap_or_else(|e| e.to_string());
                let alive = match knot.child.try_wait() {
                    Ok(None) => "running".to_string(),
                    other => format!("{other:?}"),
                };
                let report = format!(
                    "kdig {name} {kind} unanswered after {:?} (load {}): {e}\n{server}: {alive}\nsockets:\n{sockets}\n{server} log:\n{}",
                    started.elapsed(),
                    std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
                    knot.log(),
                    server = knot.program,
                );
                println!("{report}");
                assert!(Instant::now() < deadline, "{report}");
            }
        }
    }
}

pub(crate) fn try_query(
    lab: &Lab,
    name: &str,
    kind: &str,
) -> std::io::Result<(String, BTreeSet<String>)> {
    let out = lab.exec_ok(
        NODE,
        "kdig",
        // One try: the callers try again, each with a new port, within their hang guard.
        // On a loaded machine (a 10k-service nft load beside this test) one UDP answer
        // took over 2 s.
        &[
            "@127.0.0.1",
            "+retry=0",
            "+timeout=10",
            "+norec",
            name,
            kind,
        ],
        None,
    )?;
    let status = out
        .split("status: ")
        .nth(1)
        .and_then(|s| s.split(';').next())
        .unwrap_or("?")
        .trim()
        .to_string();
    let mut answers = BTreeSet::new();
    let mut in_answer = false;
    for line in out.lines() {
        if line.starts_with(";; ANSWER SECTION") {
            in_answer = true;
            continue;
        }
        if in_answer {
            if line.trim().is_empty() || line.starts_with(";;") {
                break;
            }
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() >= 5 && f[0].eq_ignore_ascii_case(name) {
                answers.insert(format!("{} {} {}", f[1], f[3], f[4..].join(" ")));
            }
        }
    }
    Ok((status, answers))
}

/// How long a server may take to start answering before the test gives up: a hang guard
/// (the waits poll and go on at the first answer), as long as the kernel labs' own.
pub(crate) const HANG_GUARD: Duration = Duration::from_secs(120);

pub(crate) const KNOT_CONF: &str = r#"server:
    listen: 127.0.0.1@53
    rundir: "DIR"
database:
    storage: "DIR/db"
log:
  - target: stderr
    any: info
template:
  - id: default
    storage: "DIR"
    zonefile-sync: -1
    zonefile-load: whole
    journal-content: none
    semantic-checks: on
acl:
  - id: local
    address: 127.0.0.1
    action: transfer
zone:
  - domain: cluster.local.
    file: cluster.local.zone
    acl: local
  - domain: in-addr.arpa.
    file: in-addr.arpa.zone
    acl: local
  - domain: ip6.arpa.
    file: ip6.arpa.zone
    acl: local
"#;

#[test]
fn dns_zones_are_served_by_knot_as_the_spec_says() {
    if !ready(
        "dns_zones_are_served_by_knot_as_the_spec_says",
        &["knotd", "kdig", "ip"],
    ) {
        return;
    }
    let lab = Lab::new("dns", &LabSpec::bare()).unwrap();

    // Round 1: examples/ and DNS_EXTRA, default options.
    let mut files = example_manifests();
    files.push(("extra.yaml".into(), DNS_EXTRA.into()));
    let m = compile(&files);
    // Written by hand from the spec for DNS_EXTRA, so the table above is checked too.
    let hand: Vec<((&str, &str), Answer)> = vec![
        (
            ("db.disco.svc.cluster.local.", "A"),
            records(["5 A 10.244.1.5", "5 A 10.244.1.7"]),
        ),
        (
            ("db-0.db.disco.svc.cluster.local.", "A"),
            records(["5 A 10.244.1.5"]),
        ),
        (
            ("10-244-1-7.db.disco.svc.cluster.local.", "A"),
            records(["5 A 10.244.1.7"]),
        ),
        (
            ("_pg._tcp.db.disco.svc.cluster.local.", "SRV"),
            records([
                "5 SRV 0 50 5432 db-0.db.disco.svc.cluster.local.",
                "5 SRV 0 50 5432 10-244-1-7.db.disco.svc.cluster.local.",
            ]),
        ),
        (
            ("5.1.244.10.in-addr.arpa.", "PTR"),
            records(["5 PTR db-0.db.disco.svc.cluster.local."]),
        ),
        // Not ready: no name, no address.
        (("db-1.db.disco.svc.cluster.local.", "A"), Answer::NxDomain),
        (("6.1.244.10.in-addr.arpa.", "PTR"), Answer::NxDomain),
        // Hostname outside the subdomain: the dashed address instead.
        (
            ("other-0.db.disco.svc.cluster.local.", "A"),
            Answer::NxDomain,
        ),
        (
            ("six.disco.svc.cluster.local.", "AAAA"),
            records(["5 AAAA fd00:10:244:1::5", "5 AAAA fd00:10:244:1::6"]),
        ),
        (("six.disco.svc.cluster.local.", "A"), Answer::NoData),
        (
            ("web-0.six.disco.svc.cluster.local.", "AAAA"),
            records(["5 AAAA fd00:10:244:1::5"]),
        ),
        (
            ("fd00-10-244-1--6.six.disco.svc.cluster.local.", "AAAA"),
            records(["5 AAAA fd00:10:244:1::6"]),
        ),
        (
            ("_web._tcp.six.disco.svc.cluster.local.", "SRV"),
            records([
                "5 SRV 0 50 8080 web-0.six.disco.svc.cluster.local.",
                "5 SRV 0 50 8080 fd00-10-244-1--6.six.disco.svc.cluster.local.",
            ]),
        ),
        (
            (
                "5.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.0.0.0.4.4.2.0.0.1.0.0.0.0.d.f.ip6.arpa.",
                "PTR",
            ),
            records(["5 PTR web-0.six.disco.svc.cluster.local."]),
        ),
        // No ready endpoint: NXDOMAIN (spec 2.4.1).
        (("empty.disco.svc.cluster.local.", "A"), Answer::NxDomain),
        (
            ("kube-dns.kube-system.svc.cluster.local.", "A"),
            records(["5 A 10.0.0.10"]),
        ),
        (
            ("_dns._udp.kube-dns.kube-system.svc.cluster.local.", "SRV"),
            records(["5 SRV 0 100 53 kube-dns.kube-system.svc.cluster.local."]),
        ),
        (
            ("10.0.0.10.in-addr.arpa.", "PTR"),
            records(["5 PTR kube-dns.kube-system.svc.cluster.local."]),
        ),
        (
            ("my-service.prod.svc.cluster.local.", "CNAME"),
            records(["5 CNAME my.database.example.com."]),
        ),
        // The apex: the DNS service is the name server; the schema version.
        (
            ("cluster.local.", "NS"),
            records(["5 NS kube-dns.kube-system.svc.cluster.local."]),
        ),
        (
            ("dns-version.cluster.local.", "TXT"),
            records(["28800 TXT \"1.1.0\""]),
        ),
        // Names that must not exist, and empty non-terminals (NOERROR, no data).
        (("nope.default.svc.cluster.local.", "A"), Answer::NxDomain),
        (
            ("_nope._tcp.kube-dns.kube-system.svc.cluster.local.", "SRV"),
            Answer::NxDomain,
        ),
        (
            ("kube-dns.kube-system.svc.cluster.local.", "SRV"),
            Answer::NoData,
        ),
        (
            ("_tcp.kube-dns.kube-system.svc.cluster.local.", "SRV"),
            Answer::NoData,
        ),
        (("disco.svc.cluster.local.", "A"), Answer::NoData),
        (("svc.cluster.local.", "A"), Answer::NoData),
        (("nope.svc.cluster.local.", "A"), Answer::NxDomain),
        (("250.255.0.10.in-addr.arpa.", "PTR"), Answer::NxDomain),
        (
            ("10-0-0-1.default.pod.cluster.local.", "A"),
            Answer::NxDomain,
        ),
    ];
    // The examples' headless service selects no pod: NXDOMAIN.
    assert_eq!(
        spec_answers(&m, "cluster.local.", 5).get(&(
            "my-headless-service.default.svc.cluster.local.".to_string(),
            "A"
        )),
        Some(&Answer::NxDomain)
    );
    let n = serve_and_check(&lab, &files, &m, &dns::Options::default(), hand);

    // Round 2: the dual-stack golden case (AAAA and ip6.arpa PTR of cluster IPs), with
    // another domain and TTL.
    let read = |p: &str| std::fs::read_to_string(root().join(p)).unwrap();
    let files = [
        (
            "range.yaml".into(),
            "apiVersion: svc-compile/v1alpha1\nkind: ClusterConfig\nserviceClusterIPRange: 10.96.0.0/12,fd00:10:96::/112\n".into(),
        ),
        ("svc.yaml".into(), read("golden/cases/dual-stack-ipv6/svc.yaml")),
    ];
    let m = compile(&files);
    let opts = dns::Options {
        domain: Some("k8s.test".into()),
        ttl: 30,
        ..Default::default()
    };
    let hand = vec![
        (
            ("web.shop.svc.k8s.test.", "A"),
            records(["30 A 10.96.0.30"]),
        ),
        (
            ("web.shop.svc.k8s.test.", "AAAA"),
            records(["30 AAAA fd00:10:96::30"]),
        ),
        (
            (
                "0.3.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.9.0.0.0.1.0.0.0.0.d.f.ip6.arpa.",
                "PTR",
            ),
            records(["30 PTR web.shop.svc.k8s.test."]),
        ),
        (
            ("30.0.96.10.in-addr.arpa.", "PTR"),
            records(["30 PTR web.shop.svc.k8s.test."]),
        ),
        (("k8s.test.", "NS"), records(["30 NS ns.dns.k8s.test."])),
        // No DNS service in the input: kubeadm's cluster DNS address for the name server.
        (("ns.dns.k8s.test.", "A"), records(["30 A 10.96.0.10"])),
        (
            ("ns.dns.k8s.test.", "AAAA"),
            records(["30 AAAA fd00:10:96::a"]),
        ),
        (
            ("dns-version.k8s.test.", "TXT"),
            records(["28800 TXT \"1.1.0\""]),
        ),
        (("web.shop.svc.cluster.local.", "A"), Answer::Refused),
    ];
    let n2 = serve_and_check(&lab, &files, &m, &opts, hand);
    println!("dns: {n} + {n2} queries answered as the spec says");
}

/// Loads the zones that `svc-compile FILES --target dns --out DIR` writes (`m` is `files`
/// compiled; the zones must be those of `opts`) into a fresh knotd in the lab's node and
/// checks every name the spec implies, plus `hand` (which must agree with the spec table
/// where both speak). Returns the number of queries.
fn serve_and_check(
    lab: &Lab,
    files: &[(String, String)],
    m: &Module,
    opts: &dns::Options,
    hand: Vec<((&str, &str), Answer)>,
) -> usize {
    let zones = dns::write_zones(m, opts);
    let dir = TempDir::new("dns-knot");
    // The CLI writes the zone files knot loads.
    let input = dir.path().join("manifests");
    std::fs::create_dir_all(&input).unwrap();
    for (i, (_, text)) in files.iter().enumerate() {
        std::fs::write(input.join(format!("{i:03}.yaml")), text).unwrap();
    }
    let ttl = opts.ttl.to_string();
    let mut args = vec![
        input.to_str().unwrap(),
        "--target",
        "dns",
        "--ttl",
        &ttl,
        "--out",
        dir.path().to_str().unwrap(),
    ];
    if let Some(d) = &opts.domain {
        args.extend(["--cluster-domain", d]);
    }
    svc(&args, None, &root()).expect(0);
    for z in &zones {
        let written = std::fs::read_to_string(dir.path().join(format!("{}zone", z.origin)));
        assert_eq!(written.unwrap(), z.text, "{}", z.origin);
    }
    std::fs::create_dir_all(dir.path().join("db")).unwrap();
    let conf = dir.path().join("knot.conf");
    let origin = &zones[0].origin;
    std::fs::write(
        &conf,
        KNOT_CONF
            .replace("DIR", &dir.path().display().to_string())
            .replace("cluster.local.", origin),
    )
    .unwrap();
    let mut knot = Daemon::start(
        lab.netns(NODE),
        "knotd",
        &["-c", conf.to_str().unwrap()],
        dir.path(),
    );
    // Bounded wait until every zone answers its SOA.
    let deadline = Instant::now() + HANG_GUARD;
    for z in &zones {
        loop {
            knot.check_alive("knotd");
            let got = try_query(lab, &z.origin, "SOA");
            let status = match got {
                Ok((status, answers)) if status == "NOERROR" && answers.len() == 1 => break,
                Ok((status, _)) => status,
                Err(e) => e.to_string(),
            };
            assert!(
                Instant::now() < deadline,
                "knotd does not serve {} ({status}):\n{}",
                z.origin,
                knot.log()
            );
            thread::sleep(Duration::from_millis(50));
        }
    }
    // Zones loaded without semantic-check complaints.
    let log = knot.log();
    assert!(
        !log.contains("error") && !log.contains("warning"),
        "knotd log:\n{log}"
    );
    let mut want = spec_answers(m, origin, opts.ttl);
    for ((name, kind), answer) in hand {
        if let Some(spec) = want.get(&(name.to_string(), kind)) {
            assert_eq!(
                spec, &answer,
                "the spec table and the hand-written case differ for {name} {kind}"
            );
        }
        want.insert((name.to_string(), kind), answer);
    }
    let mut failures = Vec::new();
    for ((name, kind), answer) in &want {
        let (status, got) = query(lab, &mut knot, name, kind);
        let ok = match answer {
            Answer::Records(rrs) => status == "NOERROR" && &got == rrs,
            Answer::NoData => status == "NOERROR" && got.is_empty(),
            Answer::NxDomain => status == "NXDOMAIN" && got.is_empty(),
            Answer::Refused => status == "REFUSED" && got.is_empty(),
        };
        if !ok {
            failures.push(format!(
                "{name} {kind}: want {answer:?}, got {status} {got:?}"
            ));
        }
    }
    // Nothing more: every record a zone transfer shows is one the spec asked for (the
    // apex SOA and the name server's own records aside).
    for z in &zones {
        let axfr = lab
            .exec_ok(
                NODE,
                "kdig",
                &["@127.0.0.1", "+retry=3", "+timeout=30", &z.origin, "AXFR"],
                None,
            )
            .unwrap_or_else(|e| panic!("AXFR {}: {e}", z.origin));
        let mut seen = 0;
        for line in axfr
            .lines()
            .filter(|l| !l.starts_with(';') && !l.trim().is_empty())
        {
            let f: Vec<&str> = line.split_whitespace().collect();
            assert!(f.len() >= 5, "AXFR line {line:?}");
            let (name, kind) = (f[0].to_ascii_lowercase(), f[3]);
            if kind == "SOA" || name.starts_with("ns.dns.") || (kind == "NS" && name == z.origin) {
                continue;
            }
            let rr = format!("{} {kind} {}", f[1], f[4..].join(" "));
            let wanted = want.iter().any(|((n, k), a)| {
                n == &name && *k == kind && matches!(a, Answer::Records(r) if r.contains(&rr))
            });
            if !wanted {
                failures.push(format!("unexpected record in {}: {line}", z.origin));
            }
            seen += 1;
        }
        assert!(
            z.origin != zones[0].origin || seen > 0,
            "empty AXFR:\n{axfr}"
        );
    }
    assert!(
        failures.is_empty(),
        "{} of {} queries differ:\n{}\n--- zone\n{}",
        failures.len(),
        want.len(),
        failures.join("\n"),
        zones[0].text
    );
    want.len()
}

// ---------------------------------------------------------------------------------------
// The userspace proxy: HAProxy and REDIRECT rules from the template examples
// ---------------------------------------------------------------------------------------

#[test]
fn haproxy_userspace_proxy_serves_real_connections() {
    if !ready(
        "haproxy_userspace_proxy_serves_real_connections",
        &["haproxy", "iptables-restore", "ip"],
    ) {
        return;
    }
    // Two golden cases side by side: shop/web (round robin over pod-a and pod-r1) and the
    // affinity case renamed shop/sticky (ClientIP, four pods).
    let read = |p: &str| std::fs::read_to_string(root().join(p)).unwrap();
    let affinity = read("golden/cases/affinity/svc.yaml")
        .replace("name: web", "name: sticky")
        .replace("service-name: web", "service-name: sticky");
    let m = compile(&[
        (
            "clusterip.yaml".into(),
            read("golden/cases/clusterip/svc.yaml"),
        ),
        ("affinity.yaml".into(), affinity),
    ]);
    let render = |file: &str| {
        svc_targets::template::render(&m, &[], file, &read(&format!("examples/templates/{file}")))
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let cfg = render("haproxy.cfg.j2");
    let rules = render("userspace-iptables.rules.j2");
    let dir = TempDir::new("haproxy");
    let cfg_path = dir.path().join("haproxy.cfg");
    std::fs::write(&cfg_path, &cfg).unwrap();

    let spec = LabSpec {
        ipv6: false,
        ..LabSpec::default()
    };
    let mut lab = Lab::new("haproxy", &spec).unwrap();
    lab.serve(Proto::Tcp, 8080).unwrap();
    let check = run_bounded(
        Command::new("haproxy").args(["-c", "-f", cfg_path.to_str().unwrap()]),
        None,
        HANG_GUARD,
    )
    .unwrap();
    assert!(
        check.status.success(),
        "haproxy -c:\n{}{}\n--- config\n{cfg}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    lab.exec_ok(NODE, "iptables-restore", &["--noflush"], Some(&rules))
        .unwrap_or_else(|e| panic!("{e}\n--- rules\n{rules}"));
    let mut haproxy = Daemon::start(
        lab.netns(NODE),
        "haproxy",
        &["-db", "-f", cfg_path.to_str().unwrap()],
        dir.path(),
    );

    let web = SocketAddr::new("10.96.0.10".parse().unwrap(), 80);
    let sticky = SocketAddr::new("10.96.0.19".parse().unwrap(), 80);
    // Bounded wait for the frontends.
    let deadline = Instant::now() + HANG_GUARD;
    while lab.probe("client1", Proto::Tcp, web).backend().is_none() {
        haproxy.check_alive("haproxy");
        assert!(
            Instant::now() < deadline,
            "haproxy never answered:\n{}",
            haproxy.log()
        );
        thread::sleep(Duration::from_millis(50));
    }

    // Round robin: consecutive connections alternate between the two endpoints, from a
    // LAN client, a pod and the node itself (OUTPUT); the backend sees the proxy's
    // address (the node's address towards it), never the client's.
    let node_towards = |backend: &str| -> IpAddr {
        if backend.starts_with("pod-r") {
            "198.51.100.1".parse().unwrap()
        } else {
            "10.244.1.1".parse().unwrap()
        }
    };
    for from in ["client1", "pod-b", NODE] {
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        let mut last = None;
        for _ in 0..6 {
            let o = lab.probe(from, Proto::Tcp, web);
            let Outcome::Answered {
                backend,
                seen_source,
            } = &o
            else {
                panic!("{from} → {web}: {o:?}\n{}", haproxy.log());
            };
            assert_eq!(*seen_source, node_towards(backend), "{from}: {o:?}");
            assert_ne!(
                last.as_deref(),
                Some(backend.as_str()),
                "{from}: not round robin"
            );
            last = Some(backend.clone());
            *seen.entry(backend.clone()).or_default() += 1;
        }
        assert_eq!(
            seen,
            BTreeMap::from([("pod-a".to_string(), 3), ("pod-r1".to_string(), 3)]),
            "{from}"
        );
    }

    // ClientIP affinity: every connection of one client goes to the same endpoint.
    let mut firsts = BTreeSet::new();
    for from in ["client1", "client2"] {
        let first = lab.probe(from, Proto::Tcp, sticky);
        let b = first
            .backend()
            .unwrap_or_else(|| panic!("{from}: {first:?}"))
            .to_string();
        assert!(["pod-a", "pod-b", "pod-r1", "pod-r2"].contains(&b.as_str()));
        for _ in 0..5 {
            assert_eq!(
                lab.probe(from, Proto::Tcp, sticky).backend(),
                Some(b.as_str()),
                "{from}"
            );
        }
        firsts.insert(b);
    }
    // Round robin still places two new clients on different endpoints.
    assert_eq!(firsts.len(), 2, "{firsts:?}");
    haproxy.check_alive("haproxy");
}

// ---------------------------------------------------------------------------------------
// The /etc/hosts fragment, resolved by glibc
// ---------------------------------------------------------------------------------------

#[test]
fn etc_hosts_fragment_resolves_through_glibc() {
    if !ready(
        "etc_hosts_fragment_resolves_through_glibc",
        &["unshare", "getent", "mount", "ip"],
    ) {
        return;
    }
    let read = |p: &str| std::fs::read_to_string(root().join(p)).unwrap();
    let mut files = example_manifests();
    // The dual-stack case, its IPv4 address moved into the examples' range, and a range
    // of each family.
    let dual = read("golden/cases/dual-stack-ipv6/svc.yaml").replace("10.96.0.30", "10.0.0.30");
    files.push(("dual.yaml".into(), dual));
    files.retain(|(n, _)| !n.ends_with("cluster.yaml"));
    files.push((
        "range.yaml".into(),
        "apiVersion: svc-compile/v1alpha1\nkind: ClusterConfig\nserviceClusterIPRange: 10.0.0.0/16,fd00:10:96::/112\n".into(),
    ));
    let m = compile(&files);
    let hosts = svc_targets::template::render(
        &m,
        &[],
        "etc-hosts.j2",
        &read("examples/templates/etc-hosts.j2"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let dir = TempDir::new("hosts");
    let path = dir.path().join("hosts");
    std::fs::write(&path, format!("127.0.0.1 localhost\n{hosts}")).unwrap();
    // Resolved inside a lab namespace (no way out if glibc ever asked DNS) and a private
    // mount namespace where the fragment is /etc/hosts.
    let lab = Lab::new("hosts", &LabSpec::bare()).unwrap();
    let mut checked = 0;
    for s in m.services.iter().filter(|s| !s.cluster_ips.is_empty()) {
        let want: BTreeSet<String> = s.cluster_ips.iter().map(|ip| ip.to_string()).collect();
        for name in [
            format!("{}.{}.svc.cluster.local", s.name, s.namespace),
            format!("{}.{}", s.name, s.namespace),
        ] {
            let script = format!(
                "mount --bind {} /etc/hosts && getent ahosts {name}",
                path.display()
            );
            let out = lab
                .exec_ok(NODE, "unshare", &["-m", "sh", "-c", &script], None)
                .unwrap_or_else(|e| panic!("{name}: {e}\n--- hosts\n{hosts}"));
            let got: BTreeSet<String> = out
                .lines()
                .filter_map(|l| l.split_whitespace().next())
                .map(str::to_string)
                .collect();
            assert_eq!(got, want, "{name}\n--- hosts\n{hosts}");
            checked += 1;
        }
    }
    assert!(checked >= 10, "only {checked} names");
    println!("etc-hosts: {checked} names resolved");
}
