//! `svc-compile apply --nft-layout fast` on a lab node (a child of `apply.rs`, whose lab
//! helpers it uses): the first apply, an incremental change that touches only the changed
//! service's objects, incremental = full, and switching layouts both ways with traffic
//! checked after every step.

use super::*;

const FAST: &[&str] = &["--nft-layout", "fast"];

#[test]
fn apply_fast_layout_incremental_and_switching_layouts() {
    if !require_root("kernel apply --nft-layout fast") {
        return;
    }
    let lab = lab("apfast");
    install_foreign(&lab);
    let node = Node::new(&lab, "nftables");
    let foreign_before = node.foreign();
    let v1 = node.version("v1", V1_API, CHAT);
    let v2 = node.version("v2", V2_API, CHAT);
    let listing = || nft_objects(&node.exec("nft", &["-a", "list", "table", "ip", "kube-proxy"]));

    let r = node.apply(&v1, FAST);
    r.expect(0);
    assert!(
        r.stdout.contains("full (no previous apply recorded)"),
        "{}",
        r.stdout
    );
    node.flows(FLOWS_V1);
    assert!(
        listing().contains_key("set hairpin-endpoints"),
        "not the fast layout"
    );

    // api's endpoints change: its chain and the shared hairpin set change, nothing else
    // (handles show rewritten rules).
    let before = listing();
    let r = node.apply(&v2, FAST);
    r.expect(0);
    assert!(r.stdout.contains(": incremental:"), "{}", r.stdout);
    // One chain refilled (api's: its rules DNAT themselves), the hairpin set's elements.
    assert!(
        r.stdout
            .contains("incremental: 1 chain(s) written, 0 deleted"),
        "{}",
        r.stdout
    );
    let diff = changed(&before, &listing());
    assert!(!diff.is_empty());
    for n in &diff {
        assert!(
            n.contains("shop/api") || n == "set hairpin-endpoints",
            "{n} changed:\n{}",
            r.stdout
        );
    }
    node.flows(FLOWS_V2);

    // Incremental equals full.
    let incremental = node.recorded();
    let owned = node.owned();
    node.apply(&v2, &["--full", "--nft-layout", "fast"])
        .expect(0);
    assert_eq!(node.recorded(), incremental, "incremental != full");
    assert_eq!(node.owned(), owned);

    // Switching layouts, both ways, each equal to a full load of that layout.
    for (layout, full) in [
        (&[][..], &["--full"][..]),
        (FAST, &["--full", "--nft-layout", "fast"][..]),
    ] {
        let r = node.apply(&v2, layout);
        r.expect(0);
        node.flows(FLOWS_V2);
        let owned = node.owned();
        assert_eq!(
            listing().contains_key("set hairpin-endpoints"),
            layout == FAST,
            "{}",
            r.stdout
        );
        node.apply(&v2, full).expect(0);
        assert_eq!(node.owned(), owned, "switch to {layout:?} != a full load");
        node.flows(FLOWS_V2);
    }
    assert_eq!(node.foreign(), foreign_before, "foreign rules changed");
}
