//! `svc-compile apply` cleans stale UDP conntrack entries as kube-proxy does: a client that
//! keeps its socket (one 5-tuple, as a resolver does) reaches the service's new endpoint
//! after the old one is replaced, through the cluster IP and through the node port, in both
//! families.
//! Without the cleanup the entry the old DNAT made keeps sending it to the old endpoint,
//! which still answers here.

use super::echo::PROBE_TIMEOUT;
use super::sys::in_netns;
use super::{addr, require_root, Family, Lab, LabSpec, Proto};
use crate::support::{root, svc, TempDir};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::thread;

const TARGETS: [&str; 2] = ["iptables", "nftables"];
const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 53);
const NODE_PORT: u16 = 30053;
const TARGET_PORT: u16 = 5353;

/// A dual-stack UDP NodePort service `dns` (10.96.0.53 and fd00:10:96::53, port 53, node
/// port 30053 → :5353) whose one endpoint per family is `ep` (10.244.x.y, and its twin
/// fd00:10:244:x::y; on node-1 when 10.244.1.y).
pub(super) fn manifests(ep: Ipv4Addr) -> String {
    let node = if ep.octets()[2] == 1 {
        "node-1"
    } else {
        "node-2"
    };
    let mut out = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: dns, namespace: shop}}\n\
         spec:\n  type: NodePort\n  ipFamilyPolicy: RequireDualStack\n  ipFamilies: [IPv4, IPv6]\n  \
         clusterIPs: [{CLUSTER_IP}, \"{}\"]\n  selector: {{app: dns}}\n  \
         ports:\n  - {{port: 53, protocol: UDP, targetPort: {TARGET_PORT}, nodePort: {NODE_PORT}}}\n",
        addr::v6(CLUSTER_IP)
    );
    for (family, ip) in [("IPv4", ep.to_string()), ("IPv6", addr::v6(ep).to_string())] {
        out += &format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata:\n  name: dns-{}\n  namespace: shop\n  labels: {{kubernetes.io/service-name: dns}}\n\
             addressType: {family}\nports:\n- {{port: {TARGET_PORT}, protocol: UDP}}\n\
             endpoints:\n- {{addresses: [\"{ip}\"], nodeName: {node}}}\n",
            family.to_lowercase()
        );
    }
    out
}

/// A UDP socket in `host`'s namespace, bound to `port` and connected to `dst`: every
/// datagram it sends has the same 5-tuple.
pub(super) fn client(lab: &Lab, host: &str, port: u16, dst: SocketAddr) -> UdpSocket {
    let any: SocketAddr = match dst {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, port).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, port).into(),
    };
    let s = in_netns(lab.netns(host), || {
        let s = UdpSocket::bind(any)?;
        s.connect(dst)?;
        s.set_read_timeout(Some(PROBE_TIMEOUT))?;
        Ok::<_, std::io::Error>(s)
    });
    s.and_then(|s| s)
        .unwrap_or_else(|e| panic!("UDP socket in {host}: {e}"))
}

/// The name of the server that answers a datagram on `s` (a few tries on the same
/// socket, each bounded by [`PROBE_TIMEOUT`]; what each saw is in the panic).
pub(super) fn ask(s: &UdpSocket, what: &str) -> String {
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
    let cluster = root().join("golden/cases/dual-stack-ipv6/cluster.yaml");
    let apply = |name: &str, ep: Ipv4Addr, extra: &[&str]| {
        let dir = inputs.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("svc.yaml"), manifests(ep)).unwrap();
        std::fs::copy(&cluster, dir.join("cluster.yaml")).unwrap();
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
            "--node",
            "node-1",
            "--service-cluster-ip-range",
            "10.96.0.0/12,fd00:10:96::/112",
        ];
        let args: Vec<&str> = args.iter().chain(extra).copied().collect();
        let r = svc(&args, None, &root());
        r.expect(0);
        r
    };
    let (pod_a, pod_r1) = (Ipv4Addr::new(10, 244, 1, 2), Ipv4Addr::new(10, 244, 2, 2));
    apply("v1", pod_a, &[]);
    // Per family: pod-b to the cluster IP, client1 to the node port, each from a port of
    // its own.
    let clients: Vec<(String, UdpSocket)> = [Family::V4, Family::V6]
        .into_iter()
        .enumerate()
        .flat_map(|(i, f)| {
            let vip = SocketAddr::new(addr::of(CLUSTER_IP, f), 53);
            let np = SocketAddr::new(lab.ip("node", f), NODE_PORT);
            let port = 40053 + 2 * i as u16;
            [
                (format!("pod-b to {vip}"), client(&lab, "pod-b", port, vip)),
                (
                    format!("client1 to {np}"),
                    client(&lab, "client1", port + 1, np),
                ),
            ]
        })
        .collect();
    for (what, c) in &clients {
        assert_eq!(ask(c, what), "pod-a", "[{target}] {what}, v1");
    }
    let before = entries(&lab);

    // The dry run's script says what would be cleaned, and cleans nothing.
    let r = apply("v2", pod_r1, &["--dry-run"]);
    for family in ["IPv4", "IPv6"] {
        assert!(
            r.stdout.contains(&format!("# then: delete the {family} conntrack entries of 1 UDP frontend and 1 node port whose reply source is not a serving endpoint")),
            "[{target}] {}",
            r.stdout
        );
    }
    assert_eq!(
        entries(&lab),
        before,
        "[{target}] the dry run changed conntrack"
    );

    let r = apply("v2", pod_r1, &[]); // pod-a still answers if asked
    let said = format!(
        "[{target}] conntrack before:\n{before}\nafter the apply:\n{}\napply said:\n{}{}",
        entries(&lab),
        r.stdout,
        r.stderr
    );
    // Every flow, so that a failure shows which of them stayed on pod-a.
    let answers: Vec<String> = clients
        .iter()
        .map(|(what, c)| format!("{what}: {}", ask(c, what)))
        .collect();
    let want: Vec<String> = clients
        .iter()
        .map(|(what, _)| format!("{what}: pod-r1"))
        .collect();
    assert_eq!(answers, want, "{said}");
    // Each family's two entries were DNATed to pod-a, which no longer serves the service.
    for family in ["ipv4", "ipv6"] {
        assert!(
            r.stdout
                .lines()
                .any(|l| l.contains(&format!(" {family} applied "))
                    && l.ends_with("; 2 stale UDP conntrack entries deleted")),
            "{said}"
        );
    }
    assert!(!r.stderr.contains("warning"), "{said}");

    // Applying the same manifests again cleans nothing and says nothing of it.
    let r = apply("v2", pod_r1, &[]);
    assert!(!r.stdout.contains("conntrack"), "[{target}] {}", r.stdout);
}
