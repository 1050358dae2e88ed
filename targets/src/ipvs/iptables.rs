//! The `iptables` part: the iptables-restore document of kube-proxy's IPVS mode
//! (`writeIptablesRules` and `createAndLinkKubeChain` in `pkg/proxy/ipvs/proxier.go`).
//!
//! Written by its own small line writer for now; this file is the only one that knows
//! iptables-restore syntax, so it can move onto the shared iptables document writer.
//!
//! Layout: a header comment naming node and family (the first line says `IPv6` for
//! ip6tables), then, as in the iptables target, what kube-proxy sets up outside the
//! restore data (its chains and the jumps from built-in chains it prepends with
//! `EnsureRule`, as `-I` lines in its order), then the restore data of a sync: `*nat`
//! (chains, rules) then `*filter`. Load with `iptables-restore --noflush`. Rules that
//! match a set are written only when that set has entries, except the KUBE-IPVS-FILTER
//! and health-check rules, which kube-proxy always writes.

use super::model::{NoNodeAccess, Set, State};
use super::Options;
use std::fmt::Write as _;
use svc_compiler::ir::{LocalDetector, NodeView};
use svc_compiler::net::IpFamily;

const NAT_CHAINS: [&str; 5] = [
    "KUBE-SERVICES",
    "KUBE-POSTROUTING",
    "KUBE-NODE-PORT",
    "KUBE-LOAD-BALANCER",
    "KUBE-MARK-MASQ",
];
const FILTER_CHAINS: [&str; 6] = [
    "KUBE-FORWARD",
    "KUBE-NODE-PORT",
    "KUBE-PROXY-FIREWALL",
    "KUBE-SOURCE-RANGES-FIREWALL",
    "KUBE-IPVS-FILTER",
    "KUBE-IPVS-OUT-FILTER",
];
/// (nat?, from, to, comment): kube-proxy's `iptablesJumpChain`, in order.
const JUMPS: [(bool, &str, &str, &str); 9] = [
    (
        true,
        "OUTPUT",
        "KUBE-SERVICES",
        "kubernetes service portals",
    ),
    (
        true,
        "PREROUTING",
        "KUBE-SERVICES",
        "kubernetes service portals",
    ),
    (
        true,
        "POSTROUTING",
        "KUBE-POSTROUTING",
        "kubernetes postrouting rules",
    ),
    (
        false,
        "FORWARD",
        "KUBE-FORWARD",
        "kubernetes forwarding rules",
    ),
    (
        false,
        "INPUT",
        "KUBE-NODE-PORT",
        "kubernetes health check rules",
    ),
    (
        false,
        "INPUT",
        "KUBE-PROXY-FIREWALL",
        "kube-proxy firewall rules",
    ),
    (
        false,
        "FORWARD",
        "KUBE-PROXY-FIREWALL",
        "kube-proxy firewall rules",
    ),
    (
        false,
        "INPUT",
        "KUBE-IPVS-FILTER",
        "kubernetes ipvs access filter",
    ),
    (
        false,
        "OUTPUT",
        "KUBE-IPVS-OUT-FILTER",
        "kubernetes ipvs access filter",
    ),
];

/// (set, nat?, from chain, target, match, `-p`): kube-proxy's `ipsetWithIptablesChain`.
const SET_RULES: [(Set, bool, &str, &str, &str, &str); 12] = [
    (
        Set::LoopBack,
        true,
        "KUBE-POSTROUTING",
        "MASQUERADE",
        "dst,dst,src",
        "",
    ),
    (
        Set::LoadBalancer,
        true,
        "KUBE-SERVICES",
        "KUBE-LOAD-BALANCER",
        "dst,dst",
        "",
    ),
    (
        Set::LoadBalancerLocal,
        true,
        "KUBE-LOAD-BALANCER",
        "RETURN",
        "dst,dst",
        "",
    ),
    (
        Set::NodePortLocalTcp,
        true,
        "KUBE-NODE-PORT",
        "RETURN",
        "dst",
        "tcp",
    ),
    (
        Set::NodePortTcp,
        true,
        "KUBE-NODE-PORT",
        "KUBE-MARK-MASQ",
        "dst",
        "tcp",
    ),
    (
        Set::NodePortLocalUdp,
        true,
        "KUBE-NODE-PORT",
        "RETURN",
        "dst",
        "udp",
    ),
    (
        Set::NodePortUdp,
        true,
        "KUBE-NODE-PORT",
        "KUBE-MARK-MASQ",
        "dst",
        "udp",
    ),
    (
        Set::NodePortLocalSctp,
        true,
        "KUBE-NODE-PORT",
        "RETURN",
        "dst,dst",
        "sctp",
    ),
    (
        Set::NodePortSctp,
        true,
        "KUBE-NODE-PORT",
        "KUBE-MARK-MASQ",
        "dst,dst",
        "sctp",
    ),
    (
        Set::LoadBalancerFw,
        false,
        "KUBE-PROXY-FIREWALL",
        "KUBE-SOURCE-RANGES-FIREWALL",
        "dst,dst",
        "",
    ),
    (
        Set::LoadBalancerSourceCidr,
        false,
        "KUBE-SOURCE-RANGES-FIREWALL",
        "RETURN",
        "dst,dst,src",
        "",
    ),
    (
        Set::LoadBalancerSourceIp,
        false,
        "KUBE-SOURCE-RANGES-FIREWALL",
        "RETURN",
        "dst,dst,src",
        "",
    ),
];

pub(super) fn write(view: &NodeView, st: &State, opts: &Options, out: &mut String) {
    let fam = view.family;
    let name = |s: Set| s.name(fam);
    let has = |s: Set| !st.set(s).is_empty();
    let comment = |s: Set| format!("-m comment --comment \"{}\"", s.comment());
    let mark = format!("{:#010x}", view.masquerade_mark);
    let (tool, fam_name) = match fam {
        IpFamily::IPv4 => ("iptables", "IPv4"),
        IpFamily::IPv6 => ("ip6tables", "IPv6"),
    };
    let _ = writeln!(
        out,
        "# svc-compile: kube-proxy (ipvs mode) {tool} rules for node {}, {fam_name}; load with `{tool}-restore --noflush`",
        view.node_name
    );
    if opts.setup {
        out.push_str("# Set up outside the restore data: chains and jumps (iptables -N / -I).\n");
        for (nat, table, chains) in [
            (true, "nat", &NAT_CHAINS[..]),
            (false, "filter", &FILTER_CHAINS[..]),
        ] {
            let _ = writeln!(out, "*{table}");
            for c in chains {
                let _ = writeln!(out, ":{c} - [0:0]");
            }
            for (_, from, to, cmt) in JUMPS.iter().filter(|j| j.0 == nat) {
                let _ = writeln!(out, "-I {from} -m comment --comment \"{cmt}\" -j {to}");
            }
            out.push_str("COMMIT\n");
        }
        out.push_str("# The restore data of a sync.\n");
    }

    let mut nat = String::new();
    let mut filter = String::new();
    let lo = match fam {
        IpFamily::IPv4 => "127.0.0.0/8",
        IpFamily::IPv6 => "::1/128",
    };
    let _ = writeln!(nat, "-A KUBE-SERVICES -s {lo} -j RETURN");
    for (set, is_nat, from, to, m, proto) in SET_RULES {
        if !has(set) {
            continue;
        }
        let rules = if is_nat { &mut nat } else { &mut filter };
        let _ = write!(rules, "-A {from} ");
        if !proto.is_empty() {
            let _ = write!(rules, "-p {proto} ");
        }
        let _ = writeln!(
            rules,
            "{} -m set --match-set {} {m} -j {to}",
            comment(set),
            name(set)
        );
    }
    if has(Set::ClusterIp) {
        let base = format!(
            "-A KUBE-SERVICES {} -m set --match-set {}",
            comment(Set::ClusterIp),
            name(Set::ClusterIp)
        );
        match (&view.local_detector, view.masquerade_all) {
            (_, true) => {
                let _ = writeln!(nat, "{base} dst,dst -j KUBE-MARK-MASQ");
            }
            (Some(d), false) => {
                let not_local = match d {
                    LocalDetector::Cidr(c) => format!("! -s {c}"),
                    LocalDetector::BridgeInterface(b) => format!("! -i {b}"),
                    LocalDetector::InterfaceNamePrefix(p) => format!("! -i {p}+"),
                };
                let _ = writeln!(nat, "{base} dst,dst {not_local} -j KUBE-MARK-MASQ");
            }
            // No detector: masquerade node-originated traffic whose source is a VIP.
            (None, false) => {
                let _ = writeln!(nat, "{base} src,dst -j KUBE-MARK-MASQ");
            }
        }
    }
    // Traffic to external IPs from off the machine, or to a local address, is accepted.
    let external = |nat: &mut String, args: &str| {
        let _ = writeln!(
            nat,
            "{args} -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT"
        );
        let _ = writeln!(nat, "{args} -m addrtype --dst-type LOCAL -j ACCEPT");
    };
    if has(Set::ExternalIp) {
        let args = format!(
            "-A KUBE-SERVICES {} -m set --match-set {} dst,dst",
            comment(Set::ExternalIp),
            name(Set::ExternalIp)
        );
        let _ = writeln!(nat, "{args} -j KUBE-MARK-MASQ");
        external(&mut nat, &args);
    }
    if has(Set::ExternalIpLocal) {
        let args = format!(
            "-A KUBE-SERVICES {} -m set --match-set {} dst,dst",
            comment(Set::ExternalIpLocal),
            name(Set::ExternalIpLocal)
        );
        external(&mut nat, &args);
    }
    nat.push_str("-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT\n");
    nat.push_str("-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ\n");
    filter.push_str("-A KUBE-SOURCE-RANGES-FIREWALL -j DROP\n");
    for NoNodeAccess { ip, proto, port } in &st.no_node_access {
        let _ = writeln!(
            filter,
            "-A KUBE-IPVS-OUT-FILTER -s {ip} -m ipvs --vaddr {ip} --vproto {} --vport {port} -j DROP",
            proto.lower()
        );
    }
    for set in [Set::ClusterIp, Set::LoadBalancer] {
        if has(set) {
            let _ = writeln!(
                nat,
                "-A KUBE-SERVICES -m set --match-set {} dst,dst -j ACCEPT",
                name(set)
            );
        }
    }
    let _ = writeln!(
        filter,
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark {mark}/{mark} -j ACCEPT"
    );
    filter.push_str("-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n");
    let _ = writeln!(
        filter,
        "-A KUBE-NODE-PORT {} -m set --match-set {} dst -j ACCEPT",
        comment(Set::HealthCheckNodePort),
        name(Set::HealthCheckNodePort)
    );
    // Keep the host's own ports off the VIPs (kubernetes#72236).
    for (set, m) in [
        (Set::LoadBalancer, "dst,dst"),
        (Set::ClusterIp, "dst,dst"),
        (Set::ExternalIp, "dst,dst"),
        (Set::ExternalIpLocal, "dst,dst"),
        (Set::HealthCheckNodePort, "dst"),
    ] {
        let _ = writeln!(
            filter,
            "-A KUBE-IPVS-FILTER -m set --match-set {} {m} -j RETURN",
            name(set)
        );
    }
    let _ = writeln!(
        filter,
        "-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set {} dst -j REJECT",
        name(Set::IpvsIps)
    );
    let _ = writeln!(
        nat,
        "-A KUBE-POSTROUTING -m mark ! --mark {mark}/{mark} -j RETURN"
    );
    let _ = writeln!(nat, "-A KUBE-POSTROUTING -j MARK --xor-mark {mark}");
    let _ = writeln!(
        nat,
        "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE{}",
        if opts.random_fully { " --random-fully" } else { "" }
    );
    let _ = writeln!(nat, "-A KUBE-MARK-MASQ -j MARK --or-mark {mark}");

    out.push_str("*nat\n");
    for c in NAT_CHAINS {
        let _ = writeln!(out, ":{c} - [0:0]");
    }
    out.push_str(&nat);
    out.push_str("COMMIT\n*filter\n");
    for c in FILTER_CHAINS {
        let _ = writeln!(out, ":{c} - [0:0]");
    }
    out.push_str(&filter);
    out.push_str("COMMIT\n");
}
