use super::*;

const IPT: &str = "\
*filter
:KUBE-SERVICES - [0:0]
-A INPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES
COMMIT
*nat
:KUBE-SEP-A - [0:0]
:KUBE-SEP-B - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-X - [0:0]
-A KUBE-SERVICES -m comment --comment \"shop/web:http cluster IP\" -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-X
-A KUBE-SVC-X -m comment --comment \"shop/web:http -> 10.244.1.2:8080\" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-A
-A KUBE-SVC-X -m comment --comment \"shop/web:http -> 10.244.2.2:8080\" -j KUBE-SEP-B
-A KUBE-SEP-A -s 10.244.1.2/32 -m comment --comment shop/web:http -j KUBE-MARK-MASQ
-A KUBE-SEP-A -p tcp -m comment --comment shop/web:http -m tcp -j DNAT --to-destination 10.244.1.2:8080
-A KUBE-SEP-B -p tcp -m comment --comment shop/web:http -m tcp -j DNAT --to-destination 10.244.2.2:8080
COMMIT
";

/// `text` with the line starting `from` replaced by `to` (or removed when `to` is empty).
fn edit(text: &str, from: &str, to: &str) -> String {
    let mut hit = 0;
    let out: String = text
        .lines()
        .filter_map(|l| {
            if l.starts_with(from) {
                hit += 1;
                (!to.is_empty()).then(|| format!("{to}\n"))
            } else {
                Some(format!("{l}\n"))
            }
        })
        .collect();
    assert_eq!(hit, 1, "{from} matches one line");
    out
}

#[test]
fn the_same_state_is_clean() {
    assert_eq!(compare(Syntax::Iptables, IPT, IPT), []);
    assert_eq!(render("node-1", &[]), "node-1: no drift\n");
}

/// Chains (and tables) in another order are the same ruleset; rules within a chain in
/// another order are not.
#[test]
fn chain_order_is_ignored_rule_order_is_not() {
    let blocks: Vec<&str> = IPT.split_inclusive("COMMIT\n").collect();
    let mut lines: Vec<&str> = blocks[1].lines().collect();
    // Move KUBE-SEP-B's chain declaration and rule to the front of the table.
    let decl = lines.remove(2);
    lines.insert(1, decl);
    let rule = lines.remove(lines.len() - 2);
    lines.insert(5, rule);
    let moved = lines.join("\n") + "\n";
    let text = format!("{moved}{}", blocks[0]);
    assert_eq!(compare(Syntax::Iptables, IPT, &text), []);

    let swapped = edit(
        &edit(IPT, "-A KUBE-SVC-X -m comment --comment \"shop/web:http -> 10.244.2.2", ""),
        "-A KUBE-SVC-X -m comment --comment \"shop/web:http -> 10.244.1.2",
        "-A KUBE-SVC-X -m comment --comment \"shop/web:http -> 10.244.2.2:8080\" -j KUBE-SEP-B\n-A KUBE-SVC-X -m comment --comment \"shop/web:http -> 10.244.1.2:8080\" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-A",
    );
    assert_eq!(compare(Syntax::Iptables, IPT, &swapped).len(), 2);
}

#[test]
fn one_changed_rule_is_one_item_of_its_service() {
    let changed = edit(
        IPT,
        "-A KUBE-SEP-B -p tcp",
        "-A KUBE-SEP-B -p tcp -m comment --comment shop/web:http -m tcp -j DNAT --to-destination 10.244.2.2:9090",
    );
    let items = compare(Syntax::Iptables, IPT, &changed);
    assert_eq!(items.len(), 1, "{items:?}");
    let i = &items[0];
    assert_eq!(
        (i.kind, i.service.as_str(), i.place.as_str(), i.position),
        (Kind::Changed, "shop/web:http", "nat KUBE-SEP-B", 1)
    );
    assert!(i.actual.as_deref().unwrap().ends_with("10.244.2.2:9090"));
    assert_eq!(
        render("node-1", &items),
        "node-1: 0 missing, 0 extra, 1 changed\nshop/web:http\n  changed  nat KUBE-SEP-B #1:\n    - -p tcp -m comment --comment shop/web:http -m tcp -j DNAT --to-destination 10.244.2.2:8080\n    + -p tcp -m comment --comment shop/web:http -m tcp -j DNAT --to-destination 10.244.2.2:9090\n"
    );
}

#[test]
fn missing_and_extra_rules_and_chains() {
    // A rule deleted by hand; a rule a node added to an owned chain; an extra jump.
    let node = edit(IPT, "-A KUBE-SEP-A -s", "");
    let node = edit(
        &node,
        "-A KUBE-SERVICES -m comment",
        "-A KUBE-SERVICES -m comment --comment \"shop/web:http cluster IP\" -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-X\n-A KUBE-SERVICES -j ACCEPT",
    );
    let items = compare(Syntax::Iptables, IPT, &node);
    let got: Vec<(Kind, &str, &str)> = items
        .iter()
        .map(|i| (i.kind, i.service.as_str(), i.place.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (Kind::Extra, "node", "nat KUBE-SERVICES"),
            (Kind::Missing, "shop/web:http", "nat KUBE-SEP-A"),
        ]
    );
    // A whole service chain gone: its declaration and its rules, all under the service.
    let node = edit(&edit(IPT, ":KUBE-SEP-B", ""), "-A KUBE-SEP-B", "");
    let items = compare(Syntax::Iptables, IPT, &node);
    assert_eq!(counts(&items), (2, 0, 0), "{items:?}");
    assert!(items.iter().all(|i| i.kind == Kind::Missing));
    assert_eq!(items[1].service, "shop/web:http");
}

#[test]
fn counters_are_dropped() {
    let counted = "*nat\n:PREROUTING ACCEPT [12:720]\n:KUBE-SVC-X - [0:0]\n[3:180] -A KUBE-SVC-X -j KUBE-SEP-A\nCOMMIT\n";
    assert_eq!(
        strip_counters(counted),
        "*nat\n:PREROUTING ACCEPT\n:KUBE-SVC-X -\n[3:180] -A KUBE-SVC-X -j KUBE-SEP-A\n"
            .replace("[3:180] ", "")
            + "COMMIT\n"
    );
    // A comment that looks like a counter is not one.
    let rule = "-A X -m comment --comment \"[1:2] x\" -j Y\n";
    assert_eq!(strip_counters(rule), rule);
}

#[test]
fn ordered_diff_pairs_changes() {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(
        diff_ordered(&s(&["a", "b", "c", "d"]), &s(&["a", "x", "c", "d", "e"])),
        [Op::Changed(1, 1), Op::Extra(4)]
    );
    assert_eq!(
        diff_ordered(&s(&["a", "b", "c"]), &s(&["c", "a"])),
        [Op::Missing(0), Op::Missing(1), Op::Extra(1)]
    );
    assert_eq!(diff_ordered(&s(&["a"]), &s(&[])), [Op::Missing(0)]);
    assert_eq!(diff_ordered(&s(&[]), &s(&["a"])), [Op::Extra(0)]);
}

const NFT: &str = r#"table {"family":"ip","name":"kube-proxy","comment":"rules for kube-proxy"}
chain services {"family":"ip","table":"kube-proxy","name":"services"}
chain service-ULMVA6XW-shop/web/tcp/http {"family":"ip","table":"kube-proxy","name":"service-ULMVA6XW-shop/web/tcp/http"}
map service-ips {"family":"ip","table":"kube-proxy","name":"service-ips","elem":[[{"concat":["10.96.0.10","tcp",80]},{"elem":{"val":{"goto":{"target":"service-ULMVA6XW-shop/web/tcp/http"}},"comment":"shop/web/tcp/http"}}],[{"concat":["10.96.0.11","tcp",53]},{"elem":{"val":{"goto":{"target":"service-AAAA-kube-system/dns/tcp/dns"}},"comment":"kube-system/dns/tcp/dns"}}]]}
rule services {"family":"ip","table":"kube-proxy","chain":"services","expr":[{"vmap":"@service-ips"}]}
rule service-ULMVA6XW-shop/web/tcp/http {"family":"ip","table":"kube-proxy","chain":"service-ULMVA6XW-shop/web/tcp/http","expr":[{"jump":"mark-for-masquerade"}]}
rule service-ULMVA6XW-shop/web/tcp/http {"family":"ip","table":"kube-proxy","chain":"service-ULMVA6XW-shop/web/tcp/http","expr":[{"vmap":"numgen"}]}
"#;

#[test]
fn nftables_services_come_from_chain_names_and_comments() {
    assert_eq!(compare(Syntax::Nftables, NFT, NFT), []);
    // One element of a map changed: one missing and one extra element, of its service.
    let node = NFT.replace(r#""10.96.0.11","tcp",53"#, r#""10.96.0.12","tcp",53"#);
    let items = compare(Syntax::Nftables, NFT, &node);
    let got: Vec<(Kind, &str, &str)> = items
        .iter()
        .map(|i| (i.kind, i.service.as_str(), i.place.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (Kind::Missing, "kube-system/dns/tcp/dns", "map service-ips"),
            (Kind::Extra, "kube-system/dns/tcp/dns", "map service-ips"),
        ]
    );
    // A rule of a service chain changed: one item, named after the chain.
    let node = NFT.replace(r#"[{"vmap":"numgen"}]"#, r#"[{"drop":null}]"#);
    let items = compare(Syntax::Nftables, NFT, &node);
    assert_eq!(items.len(), 1, "{items:?}");
    assert_eq!(
        (items[0].kind, items[0].service.as_str(), items[0].position),
        (Kind::Changed, "shop/web/tcp/http", 2)
    );
}

#[test]
fn nft_table_keeps_only_ours() {
    let ruleset = r#"{"nftables":[{"metainfo":{"json_schema_version":1}},
      {"table":{"family":"inet","name":"filter","handle":1}},
      {"chain":{"family":"inet","table":"filter","name":"input","handle":1}},
      {"table":{"family":"ip","name":"kube-proxy","handle":2}},
      {"table":{"family":"ip6","name":"kube-proxy","handle":3}},
      {"chain":{"family":"ip","table":"kube-proxy","name":"services","handle":1}}]}"#;
    let ours = nft_table(ruleset, "ip").unwrap();
    assert_eq!(
        ours,
        r#"{"nftables":[{"metainfo":{"json_schema_version":1}},{"table":{"family":"ip","name":"kube-proxy","handle":2}},{"chain":{"family":"ip","table":"kube-proxy","name":"services","handle":1}}]}"#
    );
    let none = r#"{"nftables":[{"metainfo":{}},{"table":{"family":"inet","name":"filter"}}]}"#;
    assert_eq!(nft_table(none, "ip").unwrap(), "");
    assert!(nft_table("table ip kube-proxy {", "ip").is_err());
}

/// kube-proxy writes a shared chain's rules service by service in Go map order: another
/// service order is the same ruleset; another order within one service's rules is not.
#[test]
fn service_order_in_shared_chains_is_ignored() {
    let two = "*nat\n:KUBE-SERVICES - [0:0]\n\
        -A KUBE-SERVICES -m comment --comment \"a/x:p cluster IP\" -j KUBE-SVC-A\n\
        -A KUBE-SERVICES -m comment --comment \"a/x:p external IP\" -j KUBE-EXT-A\n\
        -A KUBE-SERVICES -m comment --comment \"b/y:q cluster IP\" -j KUBE-SVC-B\n\
        -A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports\" -j KUBE-NODEPORTS\n\
        COMMIT\n";
    let lines: Vec<&str> = two.lines().collect();
    let swapped = [
        lines[0], lines[1], lines[4], lines[2], lines[3], lines[5], lines[6],
    ];
    assert_eq!(
        compare(Syntax::Iptables, two, &(swapped.join("\n") + "\n")),
        []
    );
    let inner = [
        lines[0], lines[1], lines[3], lines[2], lines[4], lines[5], lines[6],
    ];
    let items = compare(Syntax::Iptables, two, &(inner.join("\n") + "\n"));
    assert!(
        !items.is_empty() && items.iter().all(|i| i.service == "a/x:p"),
        "{items:?}"
    );
    assert!(
        items.iter().all(|i| i.place == "nat KUBE-SERVICES"),
        "{items:?}"
    );
}

#[test]
fn emptied_stale_chains_are_not_drift_but_emptied_live_ones_are() {
    // apply leaves a stale chain emptied for a later apply to delete: nothing jumps to it.
    let stale = r#"chain endpoint-OLD-shop/web/tcp/http__10.244.9.9/80 {"family":"ip","table":"kube-proxy","name":"endpoint-OLD-shop/web/tcp/http__10.244.9.9/80"}"#;
    let node = NFT.replacen("chain services", &format!("{stale}\nchain services"), 1);
    assert_eq!(compare(Syntax::Nftables, NFT, &node), []);
    // A chain the service map still goes to, emptied, is drift: its rules are missing.
    let node: String = NFT
        .lines()
        .filter(|l| !l.starts_with("rule service-ULMVA6XW"))
        .map(|l| format!("{l}\n"))
        .collect();
    let items = compare(Syntax::Nftables, NFT, &node);
    assert_eq!(items.len(), 2, "{items:?}");
    assert!(items
        .iter()
        .all(|i| i.kind == Kind::Missing && i.service == "shop/web/tcp/http"));
    // A base chain is never a leftover.
    let base = r#"chain nat-output {"family":"ip","table":"kube-proxy","name":"nat-output","type":"nat","hook":"output","prio":-100,"policy":"accept"}"#;
    let node = NFT.replacen("chain services", &format!("{base}\nchain services"), 1);
    assert_eq!(compare(Syntax::Nftables, NFT, &node).len(), 1);
}
