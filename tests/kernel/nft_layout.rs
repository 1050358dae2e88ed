//! The nftables targets' fast layout (`--nft-layout fast`) in the kernel: every golden
//! case's flows, affinity, the JSON form's loader check, and the packet fates that only
//! the fast layout spells differently (hairpin after DNAT, affinity maps, firewall returns).
//! The kube-proxy layout runs the same flows in `flows.rs`; the differential test compares
//! the two layouts on random manifests.

use super::flows::{affinity_spreads_with, run_target_with};
use super::{require_root, Lab, LabSpec};
use crate::golden::{case_dirs, compile_case_with};

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
    let lab = Lab::new("chkfast", &LabSpec::default()).expect("lab");
    let mut failures = Vec::new();
    for case in case_dirs() {
        let json = compile_case_with(&case, "nftables-json", FAST);
        let out = lab
            .exec("node", "nft", &["-c", "-j", "-f", "-"], Some(&json))
            .expect("nft");
        if !out.status.success() {
            failures.push(format!(
                "{case}: nft -c -j: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The differential test with the fast layout: on every golden case and the random
/// manifests, iptables and the fast nftables layout send each flow to the same backends
/// with the same masquerade decision, and each agrees with the IR (as the kube-proxy
/// layout must in `iptables_and_nftables_agree`).
#[test]
fn iptables_and_nftables_fast_agree() {
    super::differential::agree(FAST, ["diffipf", "diffnff"]);
}
