//! `svc-compile apply` cleans stale UDP conntrack entries as kube-proxy does: a client that
//! keeps its socket (one 5-tuple, as a resolver does) reaches the service's new endpoint
//! after the old one is replaced, through the cluster IP and through the node port.
//! Without the cleanup the entry the old DNAT made keeps sending it to the old endpoint,
//! which still answers here.

use super::echo::PROBE_TIMEOUT;
use super::sys::in_netns;
use super::{require_root, Lab, LabSpec, Proto};
use crate::support::{root, svc, TempDir};
use std::net::{SocketAddr, UdpSocket};
use std::thread;

const TARGETS: [&str; 2] = ["iptables", "nftables"];
const CLUSTER_IP: &str = "10.96.0.53";
const NODE_PORT: u16 = 30053;
const TARGET_PORT: u16 = 5353;

/// A UDP NodePort service `dns` (10.96.0.53:53, node port 30053 → :5353) whose one
/// endpoint is `ep` (on node-1 when 10.244.1.x).
fn manifests(ep: &str) -> String {
    let node = if ep.starts_with("10.244.1.") {
        "node-1"
    } else {
        "node-2"
    };
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: dns, namespace: shop}}\n\
         spec:\n  type: NodePort\n  clusterIP: {CLUSTER_IP}\n  selector: {{app: dns}}\n  \
         ports:\n  - {{port: 53, protocol: UDP, targetPort: {TARGET_PORT}, nodePort: {NODE_PORT}}}\n---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
         metadata:\n  name: dns-1\n  namespace: shop\n  labels: {{kubernetes.io/service-name: dns}}\n\
         addressType: IPv4\nports:\n- {{port: {TARGET_PORT}, protocol: UDP}}\n\
         endpoints:\n- {{addresses: [{ep}], nodeName: {node}}}\n"
    )
}

/// A UDP socket in `host`'s namespace, bound to `port` and connected to `dst`: every
/// datagram it sends has the same 5-tuple.
fn client(lab: &Lab, host: &str, port: u16, dst: SocketAddr) -> UdpSocket {
    let s = in_netns(lab.netns(host), || {
        let s = UdpSocket::bind(("0.0.0.0", port))?;
        s.connect(dst)?;
        s.set_read_timeout(Some(PROBE_TIMEOUT))?;
        Ok::<_, std::io::Error>(s)
    });
    s.and_then(|s| s)
        .unwrap_or_else(|e| panic!("UDP socket in {host}: {e}"))
}

/// The name of the server that answers a datagram on `s` (a few tries on the same
/// socket, each bounded by [`PROBE_TIMEOUT`]; what each saw is in the panic).
fn ask(s: &UdpSocket, what: &str) -> String {
    let mut seen = Vec::new();
    for _ in 0..3 {
        s.send(b"probe\n")
            .unwrap_or_else(|e| panic!("{what}: send: {e}"));
        let mut buf = [0u8; 512];
        match s.recv(&mut buf) {
            Ok(n) => {
                let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                return text.split_whitespace().next().unwrap_or("").to_string();
            }
            Err(e) => seen.push(e.to_string()),
        }
    }
    panic!("{what}: no answer: {seen:?}");
}

/// The node's UDP conntrack entries, without their timeouts (which count down), sorted.
fn entries(lab: &Lab) -> String {
    let out = match lab.exec("node", "conntrack", &["-L", "-p", "udp"], None) {
        Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
        Err(e) => return e.to_string(),
    };
    let mut lines: Vec<String> = out
        .lines()
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.iter()
                .enumerate()
                .filter(|(i, _)| *i != 2)
                .map(|(_, w)| *w)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    lines.sort();
    lines.iter().map(|l| format!("{l}\n")).collect()
}

#[test]
fn a_udp_client_keeping_its_socket_follows_the_service_to_its_new_endpoint() {
    if !require_root("kernel apply: stale UDP conntrack cleanup") {
        return;
    }
    thread::scope(|s| {
        let jobs: Vec<_> = TARGETS.iter().map(|t| s.spawn(|| moved(t))).collect();
        for j in jobs {
            j.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        }
    });
}

fn moved(target: &str) {
    let mut lab = Lab::new(&format!("ct{}", &target[..3]), &LabSpec::default()).expect("lab");
    for pod in ["pod-a", "pod-r1"] {
        lab.serve_on(pod, Proto::Udp, TARGET_PORT)
            .expect("serve udp");
    }
    let (state, inputs) = (TempDir::new("ct-state"), TempDir::new("ct-in"));
    let apply = |name: &str, ep: &str, extra: &[&str]| {
        let dir = inputs.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("svc.yaml"), manifests(ep)).unwrap();
        let state = state.path().display().to_string();
        let dir = dir.display().to_string();
        let args = [
            "apply",
            "--target",
            target,
            "--netns",
            lab.netns("node"),
            "--state-dir",
            &state,
            &dir,
            "golden/common",
            "--node",
            "node-1",
        ];
        let args: Vec<&str> = args.iter().chain(extra).copied().collect();
        let r = svc(&args, None, &root());
        r.expect(0);
        r
    };
    apply("v1", "10.244.1.2", &[]); // pod-a
    let vip = client(
        &lab,
        "pod-b",
        40053,
        format!("{CLUSTER_IP}:53").parse().unwrap(),
    );
    let node_port = client(
        &lab,
        "client1",
        40054,
        SocketAddr::new(lab.ip("node", super::Family::V4), NODE_PORT),
    );
    assert_eq!(ask(&vip, "cluster IP, v1"), "pod-a", "[{target}]");
    assert_eq!(ask(&node_port, "node port, v1"), "pod-a", "[{target}]");
    let before = entries(&lab);

    // The dry run's script says what would be cleaned, and cleans nothing.
    let r = apply("v2", "10.244.2.2", &["--dry-run"]);
    assert!(
        r.stdout.contains("# then: delete the IPv4 conntrack entries of 1 UDP frontend and 1 node port whose reply source is not a serving endpoint"),
        "[{target}] {}",
        r.stdout
    );
    assert_eq!(
        entries(&lab),
        before,
        "[{target}] the dry run changed conntrack"
    );

    let r = apply("v2", "10.244.2.2", &[]); // pod-r1; pod-a still answers if asked
    let what = format!(
        "[{target}] conntrack before:\n{before}\nafter the apply:\n{}\napply said:\n{}{}",
        entries(&lab),
        r.stdout,
        r.stderr
    );
    assert_eq!(ask(&vip, "cluster IP, v2"), "pod-r1", "{what}");
    assert_eq!(ask(&node_port, "node port, v2"), "pod-r1", "{what}");
    // Both flows' entries were DNATed to pod-a, which no longer serves the service.
    assert!(
        r.stdout.contains("; 2 stale UDP conntrack entries deleted"),
        "{what}"
    );
    assert!(!r.stderr.contains("warning"), "{what}");

    // Applying the same manifests again cleans nothing and says nothing of it.
    let r = apply("v2", "10.244.2.2", &[]);
    assert!(!r.stdout.contains("conntrack"), "[{target}] {}", r.stdout);
}
