//! The nftables targets' fast layout (`--nft-layout fast`) in the kernel: every golden
//! case's flows, affinity, the JSON form's loader check, and the packet fates that only
//! the fast layout spells differently (hairpin after DNAT, affinity maps, firewall returns).
//! The kube-proxy layout runs the same flows in `flows.rs`; the differential test compares
//! the two layouts on random manifests.

use super::flows::{affinity_spreads_with, run_target_with};
use super::{require_root, Lab, LabSpec};
use crate::golden::{case_flows, compile_case_with};

pub const FAST: &[&str] = &["--nft-layout", "fast"];

#[test]
fn golden_flows_nftables_fast() {
    run_target_with("nftables", FAST);
}

#[test]
fn affinity_spreads_nftables_fast() {
    affinity_spreads_with("nftables", FAST);
}

/// Every golden case's fast `nftables-json` output is accepted by `nft -c -j -f`.
#[test]
fn golden_fast_json_passes_the_loaders_check() {
    if !require_root("kernel golden loaders' checks (fast layout)") {
        return;
    }
    super::flows::json_passes_nft_check("chkfast", FAST);
}

/// The differential test with the fast layout: on every golden case and the random
/// manifests, iptables and the fast nftables layout send each flow to the same backends
/// with the same masquerade decision, and each agrees with the IR (as the kube-proxy
/// layout must in `iptables_and_nftables_agree`).
#[test]
fn iptables_and_nftables_fast_agree() {
    super::differential::agree(FAST, ["diffipf", "diffnff"]);
}

/// IPv6 session affinity, which no golden case has: the dual-stack case's IPv6 half with
/// `sessionAffinity: ClientIP`, in both layouts (the fast one's text form says
/// `dnat ip6 to ip6 saddr map @…`): every sender sticks to one backend.
#[test]
fn ipv6_affinity_sticks_in_both_layouts() {
    use super::flows::{check_flows, load, parse_flows, BACKEND_PORT};
    use super::Proto;
    use crate::support::{root, svc};
    if !require_root("kernel IPv6 affinity (both nftables layouts)") {
        return;
    }
    let dir = root().join("golden/cases/dual-stack-ipv6");
    let text = std::fs::read_to_string(dir.join("svc.yaml"))
        .unwrap()
        .replace(
            "  type: NodePort\n",
            "  type: NodePort\n  sessionAffinity: ClientIP\n",
        );
    assert!(text.contains("sessionAffinity"));
    let text = text + "---\n" + &std::fs::read_to_string(dir.join("cluster.yaml")).unwrap();
    let flows = parse_flows(
        "pod-b tcp [fd00:10:96::30]:80 sticky pod-a,pod-r1\n\
         client1 tcp [fd00:192:0:2::10]:30100 sticky pod-a,pod-r1\n",
    );
    for layout in ["kube-proxy", "fast"] {
        let r = svc(
            &[
                "-",
                "--target",
                "nftables",
                "--family",
                "ipv6",
                "--service-cluster-ip-range",
                "10.96.0.0/12,fd00:10:96::/112",
                "--node",
                "node-1",
                "--nft-layout",
                layout,
            ],
            Some(&text),
            &root(),
        );
        r.expect(0);
        let mut lab = Lab::new(&format!("aff6{}", &layout[..2]), &LabSpec::default()).expect("lab");
        lab.serve(Proto::Tcp, BACKEND_PORT).expect("serve tcp");
        load(&lab, "nftables", &r.stdout);
        let failures = check_flows(&lab, "nftables", &flows);
        assert!(
            failures.is_empty(),
            "[{layout}] {}\n{}",
            failures.join("\n"),
            r.stdout
        );
    }
}

/// The fast layout's JSON form (affinity as kube-proxy's per-endpoint sets, see
/// `model::Form`) loaded with `nft -j -f`: every golden case's `[nftables]` flows.
#[test]
fn golden_flows_nftables_json_fast() {
    use super::flows::{check_flows, parse_flows, BACKEND_PORT};
    use super::Proto;
    if !require_root("kernel golden flows (nftables-json, fast layout)") {
        return;
    }
    let mut failures = Vec::new();
    for (case, text) in case_flows() {
        let json = compile_case_with(&case, "nftables-json", FAST);
        let mut lab = Lab::new(&format!("njf{}", case.len()), &LabSpec::default()).expect("lab");
        lab.serve(Proto::Tcp, BACKEND_PORT).expect("serve tcp");
        lab.serve(Proto::Udp, BACKEND_PORT).expect("serve udp");
        let out = lab
            .exec("node", "nft", &["-j", "-f", "-"], Some(&json))
            .expect("nft");
        assert!(
            out.status.success(),
            "{case}: nft -j -f: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for f in check_flows(&lab, "nftables", &parse_flows(&text)) {
            failures.push(format!("{case} [nftables-json fast] {f}"));
        }
    }
    assert!(
        failures.is_empty(),
        "kernel disagrees with the IR:\n{}",
        failures.join("\n")
    );
}
