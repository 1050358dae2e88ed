//! The `dns` target's zones in the three authoritative servers Debian ships: every zone
//! it writes (golden cases and the DNS inputs, both `--dns-records` modes) passes BIND's
//! `named-checkzone`, knot's `kzonecheck` and NSD's `nsd-checkzone`; and the
//! `dns-discovery` golden case's zones, served by `named`, `knotd` and `nsd` in turn in a
//! lab namespace, answer kdig's queries as written by hand below: the spec's records,
//! and CoreDNS's (each answer follows the coredns/coredns function named beside it).
//!
//! Needs Debian's bind9, bind9-utils, knot, knot-dnssecutils, knot-dnsutils and nsd (and
//! root for the servers); without them the tests print `skipped: ...`, unless
//! `SVC_KERNEL=require` (CI) makes that a failure.

use crate::discovery::{
    query, ready, records, try_query, Answer, Daemon, DNS_EXTRA, HANG_GUARD, KNOT_CONF,
};
use crate::golden::{case_args, case_dirs};
use crate::kernel::lab::NODE;
use crate::kernel::sys::run_bounded;
use crate::kernel::{Lab, LabSpec};
use crate::support::{example_manifests, root, svc, TempDir};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

const MODES: [&str; 2] = ["spec", "coredns"];

/// A ClusterConfig range too small for kubeadm's DNS address (the 10th), and no DNS
/// service: the fallback name server still needs an address.
const SMALL_RANGE: &str = "apiVersion: svc-compile/v1alpha1\nkind: ClusterConfig\nserviceClusterIPRange: 10.96.0.0/29\n---\napiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec:\n  clusterIP: 10.96.0.3\n  ports: [{name: http, port: 80}]\n";

/// `svc-compile ARGS --target dns --dns-records MODE --out DIR`: the zone files, as
/// (origin without the trailing dot, path).
fn write_zones(args: &[&str], mode: &str, dir: &Path) -> Vec<(String, PathBuf)> {
    std::fs::create_dir_all(dir).unwrap();
    let mut a = args.to_vec();
    let out = dir.to_str().unwrap();
    a.extend(["--target", "dns", "--dns-records", mode, "--out", out]);
    svc(&a, None, &root()).expect(0);
    let mut zones: Vec<(String, PathBuf)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter_map(|p| {
            let origin = p.file_name()?.to_str()?.strip_suffix(".zone")?;
            Some((origin.trim_end_matches('.').to_string(), p.clone()))
        })
        .collect();
    zones.sort();
    assert_eq!(zones.len(), 3, "{args:?}: {zones:?}");
    zones
}

/// Runs a checker; `Err` with its output when it fails (or says "warning").
fn check(program: &str, args: &[&str]) -> Result<(), String> {
    let out = run_bounded(Command::new(program).args(args), None, HANG_GUARD)
        .map_err(|e| format!("{program}: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() || text.to_ascii_lowercase().contains("warning") {
        return Err(format!(
            "{program} {}: {}\n{text}",
            args.join(" "),
            out.status
        ));
    }
    Ok(())
}

#[test]
fn every_zone_passes_bind_knot_and_nsd_checkers() {
    let test = "every_zone_passes_bind_knot_and_nsd_checkers";
    if !ready(test, &["named-checkzone", "kzonecheck", "nsd-checkzone"]) {
        return;
    }
    let dir = TempDir::new("dns-check");
    // The DNS inputs: examples/ with the discovery test's services, and a range too
    // small for kubeadm's DNS address.
    let inputs = dir.path().join("inputs");
    for (name, files) in [
        ("examples", {
            let mut f = example_manifests();
            f.push(("extra.yaml".into(), DNS_EXTRA.into()));
            f
        }),
        ("small-range", vec![("s.yaml".into(), SMALL_RANGE.into())]),
    ] {
        let d = inputs.join(name);
        std::fs::create_dir_all(&d).unwrap();
        for (i, (_, text)) in files.iter().enumerate() {
            std::fs::write(d.join(format!("{i:03}.yaml")), text).unwrap();
        }
    }
    let mut sets: Vec<(String, Vec<String>)> = case_dirs()
        .into_iter()
        .map(|c| {
            let mut a = vec![format!("golden/cases/{c}")];
            a.extend(case_args(&c));
            (c, a)
        })
        .collect();
    for name in ["examples", "small-range"] {
        let path = inputs.join(name).display().to_string();
        sets.push((name.into(), vec![path]));
    }
    let mut failures = Vec::new();
    let mut checked = 0;
    for (name, args) in &sets {
        for mode in MODES {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = dir.path().join(format!("{name}.{mode}"));
            for (origin, path) in write_zones(&args, mode, &out) {
                let file = path.to_str().unwrap();
                let fqdn = format!("{origin}.");
                let strict = [
                    "-i", "full", "-k", "fail", "-m", "fail", "-M", "fail", "-n", "fail", "-r",
                    "fail", "-S", "fail",
                ];
                let mut bind: Vec<&str> = strict.to_vec();
                bind.extend([origin.as_str(), file]);
                for r in [
                    check("named-checkzone", &bind),
                    check("kzonecheck", &["-o", &fqdn, file]),
                    check("nsd-checkzone", &[&origin, file]),
                ] {
                    if let Err(e) = r {
                        failures.push(format!("{name} --dns-records {mode}: {e}"));
                    }
                }
                checked += 1;
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {checked} zones refused:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_eq!(checked, sets.len() * MODES.len() * 3);
    println!("dns: {checked} zones pass named-checkzone, kzonecheck and nsd-checkzone");
}

// ---------------------------------------------------------------------------------------
// The servers
// ---------------------------------------------------------------------------------------

/// The zone files: (origin without the trailing dot, path).
type Zones = [(String, PathBuf)];

/// What each server needs: a configuration in `dir` serving `zones` (origin, file) on
/// 127.0.0.1, its command line, and the log lines that say a zone did not load.
struct Server {
    program: &'static str,
    failed: &'static [&'static str],
    config: fn(&Path, &Zones) -> Vec<String>,
}

fn knot_config(dir: &Path, zones: &Zones) -> Vec<String> {
    std::fs::create_dir_all(dir.join("db")).unwrap();
    // KNOT_CONF names the three zones of cluster.local.; the files are in `dir`.
    assert!(zones.iter().any(|(o, _)| o == "cluster.local"));
    let conf = dir.join("knot.conf");
    std::fs::write(&conf, KNOT_CONF.replace("DIR", &dir.display().to_string())).unwrap();
    vec!["-c".into(), conf.display().to_string()]
}

fn named_config(dir: &Path, zones: &Zones) -> Vec<String> {
    let d = dir.display();
    let mut conf = format!(
        "options {{\n  directory \"{d}\";\n  pid-file \"{d}/named.pid\";\n  session-keyfile \"{d}/session.key\";\n  managed-keys-directory \"{d}\";\n  listen-on port 53 {{ 127.0.0.1; }};\n  listen-on-v6 {{ none; }};\n  recursion no;\n  dnssec-validation no;\n  allow-transfer {{ 127.0.0.1; }};\n}};\ncontrols {{ }};\n"
    );
    for (origin, file) in zones {
        conf += &format!(
            "zone \"{origin}.\" {{ type primary; file \"{}\"; }};\n",
            file.display()
        );
    }
    let path = dir.join("named.conf");
    std::fs::write(&path, conf).unwrap();
    // -g: foreground, log to stderr; no -u: stays root inside the lab.
    vec!["-g".into(), "-c".into(), path.display().to_string()]
}

fn nsd_config(dir: &Path, zones: &Zones) -> Vec<String> {
    let d = dir.display();
    let mut conf = format!(
        "server:\n  ip-address: 127.0.0.1\n  port: 53\n  server-count: 1\n  username: \"\"\n  chroot: \"\"\n  zonesdir: \"{d}\"\n  database: \"\"\n  zonelistfile: \"{d}/zone.list\"\n  xfrdfile: \"{d}/xfrd.state\"\n  xfrdir: \"{d}\"\n  pidfile: \"{d}/nsd.pid\"\n  verbosity: 2\nremote-control:\n  control-enable: no\n"
    );
    for (origin, file) in zones {
        conf += &format!(
            "zone:\n  name: \"{origin}.\"\n  zonefile: \"{}\"\n",
            file.display()
        );
    }
    let path = dir.join("nsd.conf");
    std::fs::write(&path, conf).unwrap();
    // -d: foreground, log to stderr.
    vec!["-d".into(), "-c".into(), path.display().to_string()]
}

const SERVERS: [Server; 3] = [
    Server {
        program: "knotd",
        failed: &["failed to load", "error"],
        config: knot_config,
    },
    Server {
        program: "named",
        failed: &["not loaded due to errors"],
        config: named_config,
    },
    Server {
        program: "nsd",
        failed: &["error", "could not"],
        config: nsd_config,
    },
];

/// Serves `zones` with `server` in the lab's node (a fresh daemon, killed on return or
/// panic) and asks every query of `want`; returns the differences.
fn serve_and_ask(
    lab: &Lab,
    server: &Server,
    dir: &Path,
    zones: &Zones,
    want: &[(&str, &str, Answer)],
) -> Vec<String> {
    let args = (server.config)(dir, zones);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut daemon = Daemon::start(lab.netns(NODE), server.program, &args, dir);
    // Bounded wait until every zone answers its SOA.
    let deadline = Instant::now() + HANG_GUARD;
    for (origin, _) in zones {
        let fqdn = format!("{origin}.");
        loop {
            daemon.check_alive(server.program);
            let log = daemon.log();
            if let Some(f) = server.failed.iter().find(|f| log.contains(**f)) {
                panic!("{}: `{f}` in its log:\n{log}", server.program);
            }
            let status = match try_query(lab, &fqdn, "SOA") {
                Ok((status, answers)) if status == "NOERROR" && answers.len() == 1 => break,
                Ok((status, _)) => status,
                Err(e) => e.to_string(),
            };
            assert!(
                Instant::now() < deadline,
                "{} does not serve {fqdn} ({status}):\n{log}",
                server.program
            );
            thread::sleep(Duration::from_millis(50));
        }
    }
    let mut failures = Vec::new();
    for (name, kind, answer) in want {
        let (status, got) = query(lab, &mut daemon, name, kind);
        let ok = match answer {
            Answer::Records(rrs) => status == "NOERROR" && &got == rrs,
            Answer::NoData => status == "NOERROR" && got.is_empty(),
            Answer::NxDomain => status == "NXDOMAIN" && got.is_empty(),
            Answer::Refused => status == "REFUSED" && got.is_empty(),
        };
        if !ok {
            failures.push(format!(
                "{}: {name} {kind}: want {answer:?}, got {status} {got:?}",
                server.program
            ));
        }
    }
    daemon.check_alive(server.program);
    failures
}

const D: &str = "cluster.local.";

/// Owner names of the `dns-discovery` golden case.
fn n(name: &str) -> String {
    format!("{name}.{D}")
}

/// What both modes answer alike for `dns-discovery`.
fn common_answers() -> Vec<(String, &'static str, Answer)> {
    vec![
        (
            D.into(),
            "NS",
            records(["5 NS kube-dns.kube-system.svc.cluster.local."]),
        ),
        (n("dns-version"), "TXT", records(["28800 TXT \"1.1.0\""])),
        (
            n("db.disco.svc"),
            "A",
            records(["5 A 10.244.1.5", "5 A 10.244.1.7"]),
        ),
        (
            n("_pg._tcp.db.disco.svc"),
            "SRV",
            records([
                "5 SRV 0 50 5432 db-0.db.disco.svc.cluster.local.",
                "5 SRV 0 50 5432 10-244-1-7.db.disco.svc.cluster.local.",
            ]),
        ),
        (n("db-0.db.disco.svc"), "A", records(["5 A 10.244.1.5"])),
        // Not ready: no endpoint name.
        (n("db-1.db.disco.svc"), "A", Answer::NxDomain),
        (
            n("six.disco.svc"),
            "AAAA",
            records(["5 AAAA fd00:10:244:1::5", "5 AAAA fd00:10:244:1::6"]),
        ),
        (n("six.disco.svc"), "A", Answer::NoData),
        (
            n("legacy.disco.svc"),
            "A",
            records(["5 A 192.0.2.30", "5 A 192.0.2.31"]),
        ),
        (n("api.shop.svc"), "A", records(["5 A 10.96.0.40"])),
        (
            n("_http._tcp.api.shop.svc"),
            "SRV",
            records(["5 SRV 0 100 80 api.shop.svc.cluster.local."]),
        ),
        (
            n("billing.shop.svc"),
            "CNAME",
            records(["5 CNAME billing.example.com."]),
        ),
        (n("empty.quiet.svc"), "A", Answer::NxDomain),
        (n("disco.svc"), "A", Answer::NoData),
        (n("svc"), "A", Answer::NoData),
        (n("nope.disco.svc"), "A", Answer::NxDomain),
        (
            "5.1.244.10.in-addr.arpa.".into(),
            "PTR",
            records(["5 PTR db-0.db.disco.svc.cluster.local."]),
        ),
        (
            "40.0.96.10.in-addr.arpa.".into(),
            "PTR",
            records(["5 PTR api.shop.svc.cluster.local."]),
        ),
    ]
}

/// The spec's answers where CoreDNS's differ.
fn spec_answers() -> Vec<(String, &'static str, Answer)> {
    vec![
        // No SRV at the bare name, no names of a cluster IP service's endpoints.
        (n("db.disco.svc"), "SRV", Answer::NoData),
        (n("api-0.api.shop.svc"), "A", Answer::NxDomain),
        ("3.1.244.10.in-addr.arpa.".into(), "PTR", Answer::NxDomain),
        // A service without ports has no SRV.
        (n("legacy.disco.svc"), "SRV", Answer::NoData),
        (n("_ldap._tcp.legacy.disco.svc"), "SRV", Answer::NxDomain),
        // No pod names, no namespace names without records below.
        (n("10-244-1-5.disco.pod"), "A", Answer::NxDomain),
        (n("pod"), "A", Answer::NxDomain),
        (n("quiet.svc"), "A", Answer::NxDomain),
    ]
}

/// CoreDNS's answers (plugin/kubernetes unless said otherwise).
fn coredns_answers() -> Vec<(String, &'static str, Answer)> {
    vec![
        // kubernetes.go findServices, endpoint branch, every port; backend_lookup.go SRV:
        // 100 / 2 answers.
        (
            n("db.disco.svc"),
            "SRV",
            records([
                "5 SRV 0 50 5432 db-0.db.disco.svc.cluster.local.",
                "5 SRV 0 50 5432 10-244-1-7.db.disco.svc.cluster.local.",
            ]),
        ),
        (
            n("db-0.db.disco.svc"),
            "SRV",
            records(["5 SRV 0 100 5432 db-0.db.disco.svc.cluster.local."]),
        ),
        // findServices, ClusterIP branch: (port, cluster IP) answers; kube-dns's two
        // ports are both 53: one record, weight 100 / 2.
        (
            n("kube-dns.kube-system.svc"),
            "SRV",
            records(["5 SRV 0 50 53 kube-dns.kube-system.svc.cluster.local."]),
        ),
        (
            n("api.shop.svc"),
            "SRV",
            records(["5 SRV 0 100 80 api.shop.svc.cluster.local."]),
        ),
        // findServices answers endpoint names of a cluster IP service too
        // (endpointHostname: hostname, else the dashed address); reverse.go
        // serviceRecordForIP names them back.
        (n("api-0.api.shop.svc"), "A", records(["5 A 10.244.1.3"])),
        (
            n("10-244-2-2.api.shop.svc"),
            "A",
            records(["5 A 10.244.2.2"]),
        ),
        (
            "3.1.244.10.in-addr.arpa.".into(),
            "PTR",
            records(["5 PTR api-0.api.shop.svc.cluster.local."]),
        ),
        // object/endpoint.go endpointSliceToEndpoints keeps a slice's ports: a service
        // without ports has SRV from them; the portless slice's address weighs (port -1)
        // without a record: 100 / 3.
        (
            n("legacy.disco.svc"),
            "SRV",
            records([
                "5 SRV 0 33 389 ldap-a.legacy.disco.svc.cluster.local.",
                "5 SRV 0 33 636 ldap-a.legacy.disco.svc.cluster.local.",
            ]),
        ),
        (
            n("_ldap._tcp.legacy.disco.svc"),
            "SRV",
            records(["5 SRV 0 100 389 ldap-a.legacy.disco.svc.cluster.local."]),
        ),
        (n("192-0-2-31.legacy.disco.svc"), "SRV", Answer::NoData),
        (
            n("192-0-2-31.legacy.disco.svc"),
            "A",
            records(["5 A 192.0.2.31"]),
        ),
        // findPods, pods verified: a Pod of that namespace at that IP, ready or not; not
        // a terminating one (object/pod.go ToPod), not in another namespace.
        (n("10-244-1-5.disco.pod"), "A", records(["5 A 10.244.1.5"])),
        (n("10-244-2-6.disco.pod"), "A", records(["5 A 10.244.2.6"])),
        (n("10-244-1-8.disco.pod"), "A", Answer::NxDomain),
        (n("10-244-1-5.shop.pod"), "A", Answer::NxDomain),
        (n("10-244-1-5.disco.pod"), "AAAA", Answer::NoData),
        // parse.go parseRequest: svc. and pod. are NODATA; findServices / findPods: an
        // existing namespace is NODATA, another NXDOMAIN.
        (n("pod"), "A", Answer::NoData),
        (n("quiet.svc"), "A", Answer::NoData),
        (n("quiet.pod"), "A", Answer::NoData),
        (n("shop.pod"), "AAAA", Answer::NoData),
        (n("disco.pod"), "SRV", Answer::NoData),
        (n("nope.pod"), "A", Answer::NxDomain),
        (n("nope.svc"), "A", Answer::NxDomain),
        // kubernetes.go Services, isDefaultNS: ns.go nsAddrs, the DNS service's IPs.
        (n("ns.dns"), "A", records(["5 A 10.96.0.10"])),
    ]
}

#[test]
fn dns_zones_answer_alike_in_named_knotd_and_nsd() {
    let test = "dns_zones_answer_alike_in_named_knotd_and_nsd";
    if !ready(test, &["named", "knotd", "nsd", "kdig", "ip"]) {
        return;
    }
    let lab = Lab::new("dnssrv", &LabSpec::bare()).unwrap();
    let case = "dns-discovery";
    let mut args = vec![format!("golden/cases/{case}")];
    args.extend(case_args(case));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut failures = Vec::new();
    let mut asked = 0;
    for mode in MODES {
        let mut want = common_answers();
        let own = if mode == "spec" {
            spec_answers()
        } else {
            coredns_answers()
        };
        for (name, kind, answer) in own {
            want.retain(|(n, k, _)| !(n == &name && *k == kind));
            want.push((name, kind, answer));
        }
        let want: Vec<(&str, &str, Answer)> = want
            .iter()
            .map(|(n, k, a)| (n.as_str(), *k, a.clone()))
            .collect();
        for server in &SERVERS {
            // A fresh directory per server: each writes its own state beside the zones.
            let dir = TempDir::new(&format!("dns-{}-{mode}", server.program));
            let zones = write_zones(&args, mode, dir.path());
            failures.extend(serve_and_ask(&lab, server, dir.path(), &zones, &want));
            asked += want.len();
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {asked} answers differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
    println!("dns: {asked} answers alike from knotd, named and nsd");
}
