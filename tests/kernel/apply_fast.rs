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
    // And a service with 40 endpoints no flow goes to: the hairpin set (every endpoint)
    // then holds more elements than the table has chains, so a lost endpoint is deleted
    // from it rather than the set refilled (the planner's cost rule).
    let many: Vec<String> = (1..=40).map(|i| format!("10.244.3.{i}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    for v in [&v1, &v2] {
        let text = service("many", "10.96.0.14", None, BACKEND_PORT, &many);
        std::fs::write(std::path::Path::new(v).join("many.yaml"), text).unwrap();
    }
    let listing = || nft_objects(&node.exec("nft", &["-a", "list", "table", "ip", "kube-proxy"]));

    // Read back (not only fingerprinted), so that the incremental record below is the
    // snapshot edited by the change, compared with a full load's read.
    let r = node.apply(&v1, &["--nft-layout", "fast", "--read-back"]);
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
    let load = node.loaded();
    assert!(
        load.contains(
            "delete element ip kube-proxy hairpin-endpoints { 10.244.1.3 . 10.244.1.3 }\n"
        ),
        "{load}"
    );
    assert!(!load.contains("flush set"), "{load}");
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

/// An endpoint added to a service with ClientIP affinity, in each layout: kube-proxy's
/// gets a new affinity set for the endpoint, the fast one a new affinity map (named after
/// the endpoints) in place of the old. Both are new sets without elements; the incremental
/// apply's record must show them as the node does (it is not read back: the generation
/// proves the load), and equal what a full load records.
#[test]
fn affinity_sets_made_by_an_incremental_apply_are_recorded() {
    if !require_root("kernel apply: new affinity sets recorded") {
        return;
    }
    let lab = lab("apaff");
    let node = Node::new(&lab, "nftables");
    let affinity = |name: &str, chat: &[&str]| {
        let dir = node.version(name, V1_API, chat);
        with_affinity(&dir, "chat");
        dir
    };
    let v1 = affinity("v1", CHAT);
    let v2 = affinity("v2", CHAT_MORE);
    for layout in [&[][..], FAST] {
        let full: Vec<&str> = ["--full"].iter().chain(layout).copied().collect();
        // Read back: the incremental record below edits a read snapshot.
        let first: Vec<&str> = full.iter().chain(&["--read-back"]).copied().collect();
        node.apply(&v1, &first).expect(0);
        let r = node.apply(&v2, layout);
        r.expect(0).says(": incremental:");
        let load = node.loaded();
        assert!(load.contains("affinity"), "no new affinity set: {load}");
        let recorded = node.recorded();
        assert_eq!(
            recorded,
            node.owned(),
            "{layout:?}: the record is not the node"
        );
        node.apply(&v2, &full).expect(0);
        assert_eq!(node.recorded(), recorded, "{layout:?}: incremental != full");
    }
}
