//! `--nft-layout kube-proxy|fast` and ClusterConfig `nftLayout`: where the layout comes
//! from (flag over document over default), which targets it changes, and SVC320.

use crate::support::{root, svc};

const BASE: [&str; 5] = [
    "golden/cases/affinity",
    "golden/common/nodes.yaml",
    "golden/common/kube-proxy.yaml",
    "--node",
    "node-1",
];

fn compile(target: &str, extra: &[&str], stdin: Option<&str>) -> String {
    let mut args: Vec<&str> = BASE.to_vec();
    args.extend(["--target", target]);
    args.extend(extra);
    svc(&args, stdin, &root()).expect(0).stdout.clone()
}

#[test]
fn nft_layout_from_flag_and_cluster_config() {
    // The fast layout's marks: its hairpin set, no endpoint chains, no anonymous vmap.
    let fast = |t: &str| {
        t.contains("hairpin-endpoints") && !t.contains("add chain ip kube-proxy endpoint-")
    };
    let default = compile("nftables", &[], None);
    assert!(!fast(&default) && default.contains("vmap { 0 : goto endpoint-"));
    assert_eq!(
        compile("nftables", &["--nft-layout", "kube-proxy"], None),
        default
    );
    let flag = compile("nftables", &["--nft-layout", "fast"], None);
    assert!(fast(&flag) && !flag.contains(" vmap { "), "{flag}");
    let doc = "apiVersion: svc-compile/v1alpha1\nkind: ClusterConfig\nnftLayout: fast\n";
    assert_eq!(compile("nftables", &["-"], Some(doc)), flag);
    // The flag wins over the document.
    assert_eq!(
        compile("nftables", &["-", "--nft-layout", "kube-proxy"], Some(doc)),
        default
    );
    // Both nftables targets follow it; the others do not care.
    let json = compile("nftables-json", &["--nft-layout", "fast"], None);
    assert!(json.contains("hairpin-endpoints"), "{json}");
    assert_eq!(
        compile("iptables", &["--nft-layout", "fast"], None),
        compile("iptables", &[], None)
    );
    // The IR shows the layout only when it is not the default.
    assert!(!compile("ir", &[], None).contains("nftLayout"));
    assert!(compile("ir", &["--nft-layout", "fast"], None).contains("\"nftLayout\": \"fast\""));

    let r = svc(&["examples/", "--nft-layout", "quick"], None, &root());
    r.expect(2);
    let bad = "apiVersion: svc-compile/v1alpha1\nkind: ClusterConfig\nnftLayout: quick\n";
    let r = svc(&["check", "-"], Some(bad), &root());
    r.expect(1);
    assert!(
        r.stdout.contains("SVC320") || r.stderr.contains("SVC320"),
        "{}{}",
        r.stdout,
        r.stderr
    );
}
