//! The `iptables` part: the iptables-restore document of kube-proxy's IPVS mode
//! (`writeIptablesRules` and `createAndLinkKubeChain` in `pkg/proxy/ipvs/proxier.go`).
//!
//! Written with the iptables target's document writer (`iptables::document`): its
//! [`Sections`] collect the chains and rules, [`write_tables`] assembles them (nat first,
//! as IPVS mode writes them), the setup's jumps, the masquerade and forward rules are
//! the shared ones. What stays here is IPVS mode's own: its header line, its chains and
//! jumps, and its rules.
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
use crate::iptables::document::{
    forward_rules, mark_string, masquerade_rules, write_jumps, write_tables, Jump, Sections, Table,
};
use crate::iptables::MarkFormat;
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
/// kube-proxy's `iptablesJumpChain`, in order: (table, from, to, extra match, comment).
#[rustfmt::skip]
const JUMPS: [Jump; 9] = [
    ("nat", "OUTPUT", "KUBE-SERVICES", "", "kubernetes service portals"),
    ("nat", "PREROUTING", "KUBE-SERVICES", "", "kubernetes service portals"),
    ("nat", "POSTROUTING", "KUBE-POSTROUTING", "", "kubernetes postrouting rules"),
    ("filter", "FORWARD", "KUBE-FORWARD", "", "kubernetes forwarding rules"),
    ("filter", "INPUT", "KUBE-NODE-PORT", "", "kubernetes health check rules"),
    ("filter", "INPUT", "KUBE-PROXY-FIREWALL", "", "kube-proxy firewall rules"),
    ("filter", "FORWARD", "KUBE-PROXY-FIREWALL", "", "kube-proxy firewall rules"),
    ("filter", "INPUT", "KUBE-IPVS-FILTER", "", "kubernetes ipvs access filter"),
    ("filter", "OUTPUT", "KUBE-IPVS-OUT-FILTER", "", "kubernetes ipvs access filter"),
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
    let mark = mark_string(view.masquerade_mark, MarkFormat::Padded);
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
        out.push_str(crate::iptables::document::NOFLUSH_TWICE);
        for (table, chains) in [("nat", &NAT_CHAINS[..]), ("filter", &FILTER_CHAINS[..])] {
            let _ = writeln!(out, "*{table}");
            for c in chains {
                let _ = writeln!(out, ":{c} - [0:0]");
            }
            write_jumps(out, table, &JUMPS);
            out.push_str("COMMIT\n");
        }
        out.push_str("# The restore data of a sync.\n");
    }

    let mut doc = Sections::default();
    for c in NAT_CHAINS {
        doc.nat_chain(c);
    }
    for c in FILTER_CHAINS {
        doc.filter_chain(c);
    }
    let lo = match fam {
        IpFamily::IPv4 => "127.0.0.0/8",
        IpFamily::IPv6 => "::1/128",
    };
    doc.nat_rule(format_args!("-A KUBE-SERVICES -s {lo} -j RETURN"));
    for (set, is_nat, from, to, m, proto) in SET_RULES {
        if !has(set) {
            continue;
        }
        let proto = if proto.is_empty() {
            String::new()
        } else {
            format!("-p {proto} ")
        };
        let rule = format_args!(
            "-A {from} {proto}{} -m set --match-set {} {m} -j {to}",
            comment(set),
            name(set)
        );
        if is_nat {
            doc.nat_rule(rule);
        } else {
            doc.filter_rule(rule);
        }
    }
    if has(Set::ClusterIp) {
        let base = format!(
            "-A KUBE-SERVICES {} -m set --match-set {}",
            comment(Set::ClusterIp),
            name(Set::ClusterIp)
        );
        match (&view.local_detector, view.masquerade_all) {
            (_, true) => doc.nat_rule(format_args!("{base} dst,dst -j KUBE-MARK-MASQ")),
            (Some(d), false) => {
                let not_local = match d {
                    LocalDetector::Cidr(c) => format!("! -s {c}"),
                    LocalDetector::BridgeInterface(b) => format!("! -i {b}"),
                    LocalDetector::InterfaceNamePrefix(p) => format!("! -i {p}+"),
                };
                doc.nat_rule(format_args!("{base} dst,dst {not_local} -j KUBE-MARK-MASQ"));
            }
            // No detector: masquerade node-originated traffic whose source is a VIP.
            (None, false) => doc.nat_rule(format_args!("{base} src,dst -j KUBE-MARK-MASQ")),
        }
    }
    // Traffic to external IPs from off the machine, or to a local address, is accepted.
    let external = |doc: &mut Sections, args: &str| {
        doc.nat_rule(format_args!(
            "{args} -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT"
        ));
        doc.nat_rule(format_args!(
            "{args} -m addrtype --dst-type LOCAL -j ACCEPT"
        ));
    };
    if has(Set::ExternalIp) {
        let args = format!(
            "-A KUBE-SERVICES {} -m set --match-set {} dst,dst",
            comment(Set::ExternalIp),
            name(Set::ExternalIp)
        );
        doc.nat_rule(format_args!("{args} -j KUBE-MARK-MASQ"));
        external(&mut doc, &args);
    }
    if has(Set::ExternalIpLocal) {
        let args = format!(
            "-A KUBE-SERVICES {} -m set --match-set {} dst,dst",
            comment(Set::ExternalIpLocal),
            name(Set::ExternalIpLocal)
        );
        external(&mut doc, &args);
    }
    doc.nat_rule(format_args!(
        "-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT"
    ));
    doc.nat_rule(format_args!("-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ"));
    doc.filter_rule(format_args!("-A KUBE-SOURCE-RANGES-FIREWALL -j DROP"));
    for NoNodeAccess { ip, proto, port } in &st.no_node_access {
        doc.filter_rule(format_args!(
            "-A KUBE-IPVS-OUT-FILTER -s {ip} -m ipvs --vaddr {ip} --vproto {} --vport {port} -j DROP",
            proto.lower()
        ));
    }
    for set in [Set::ClusterIp, Set::LoadBalancer] {
        if has(set) {
            doc.nat_rule(format_args!(
                "-A KUBE-SERVICES -m set --match-set {} dst,dst -j ACCEPT",
                name(set)
            ));
        }
    }
    forward_rules(&mut doc, &mark);
    doc.filter_rule(format_args!(
        "-A KUBE-NODE-PORT {} -m set --match-set {} dst -j ACCEPT",
        comment(Set::HealthCheckNodePort),
        name(Set::HealthCheckNodePort)
    ));
    // Keep the host's own ports off the VIPs (kubernetes#72236).
    for (set, m) in [
        (Set::LoadBalancer, "dst,dst"),
        (Set::ClusterIp, "dst,dst"),
        (Set::ExternalIp, "dst,dst"),
        (Set::ExternalIpLocal, "dst,dst"),
        (Set::HealthCheckNodePort, "dst"),
    ] {
        doc.filter_rule(format_args!(
            "-A KUBE-IPVS-FILTER -m set --match-set {} {m} -j RETURN",
            name(set)
        ));
    }
    doc.filter_rule(format_args!(
        "-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set {} dst -j REJECT",
        name(Set::IpvsIps)
    ));
    masquerade_rules(&mut doc, &mark, opts.random_fully);

    // IPVS mode writes nat before filter.
    write_tables(out, &[Table::Nat, Table::Filter], || std::iter::once(&doc));
}
