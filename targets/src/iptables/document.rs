//! The iptables-restore document, apart from the service ports' rules: the header line,
//! kube-proxy's setup (canary chains and jumps from the built-in chains), the `filter` and
//! `nat` tables with their chain declarations, rule lines and `COMMIT`, and the static
//! chains every node has. Rules are collected in [`Sections`] (declarations and rules per
//! table) and the document is assembled by [`write_document`]. kube-proxy's IPVS mode
//! (`crate::ipvs`) writes the same kind of document with its own chains: it reuses
//! [`Sections`], [`write_tables`] (nat first there), [`write_jumps`] for its setup, and the
//! rules both modes share ([`masquerade_rules`], [`forward_rules`]).

use super::names::{KUBE_EXTERNAL_SERVICES, KUBE_FIREWALL, KUBE_FORWARD, KUBE_MARK_MASQ};
use super::names::{KUBE_NODEPORTS, KUBE_POSTROUTING, KUBE_PROXY_CANARY, KUBE_PROXY_FIREWALL};
use super::names::{KUBE_SERVICES, MARTIAN_COMMENT};
use super::{MarkFormat, Options};
use crate::common::quote;
use std::fmt::{self, Display, Write as _};
use svc_compiler::ir::{NodePortAddresses, NodeView};
use svc_compiler::net::IpFamily;

/// The header line (the iptables planner reads the family from it), kube-proxy's
/// setup when asked for, then the tables, each with the declarations of every section
/// before their rules. `sections` gives the parts in order, as often as it is called.
pub(super) fn write_document<'s, I>(
    text: &mut String,
    view: &NodeView,
    mode: &str,
    setup: bool,
    sections: impl Fn() -> I,
) where
    I: Iterator<Item = &'s Sections>,
{
    let (tool, v) = match view.family {
        IpFamily::IPv4 => ("iptables-restore", "IPv4"),
        IpFamily::IPv6 => ("ip6tables-restore", "IPv6"),
    };
    text.clear();
    let _ = writeln!(
        text,
        "# svc-compile: kube-proxy ({mode} mode) rules for node {}, {v}; load with `{tool} --noflush`",
        view.node_name
    );
    if setup {
        write_setup(text);
        text.push_str("# The restore data of a full sync.\n");
    }
    write_tables(text, &[Table::Filter, Table::Nat], sections);
}

/// A table of the restore data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Table {
    Filter,
    Nat,
}

/// `tables` in this order, each as `*TABLE`, the declarations of every section, their
/// rules, `COMMIT`; appended to `text`.
pub(crate) fn write_tables<'s, I>(text: &mut String, tables: &[Table], sections: impl Fn() -> I)
where
    I: Iterator<Item = &'s Sections>,
{
    // Sized first, so the document is copied together once.
    text.reserve(sections().map(Sections::len).sum::<usize>() + 64);
    for table in tables {
        let (name, chains, rules) = match table {
            Table::Filter => (
                "filter",
                Sections::filter_chains as Part,
                Sections::filter_rules as Part,
            ),
            Table::Nat => (
                "nat",
                Sections::nat_chains as Part,
                Sections::nat_rules as Part,
            ),
        };
        let _ = writeln!(text, "*{name}");
        sections().for_each(|s| text.push_str(chains(s)));
        sections().for_each(|s| text.push_str(rules(s)));
        text.push_str("COMMIT\n");
    }
}

/// A section of [`Sections`].
type Part = fn(&Sections) -> &str;

/// A jump kube-proxy ensures from a built-in chain: (table, from, to, extra match, comment).
pub(crate) type Jump = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
);

/// kube-proxy's jump rules, in the order it ensures them (its own list, then the copy of
/// kubelet's KUBE-FIREWALL jumps): (table, from, to, extra match, comment).
#[rustfmt::skip]
const JUMPS: &[Jump] = &[
    ("filter", "INPUT", KUBE_EXTERNAL_SERVICES, CT_NEW, "kubernetes externally-visible service portals"),
    ("filter", "FORWARD", KUBE_EXTERNAL_SERVICES, CT_NEW, "kubernetes externally-visible service portals"),
    ("filter", "INPUT", KUBE_NODEPORTS, "", "kubernetes health check service ports"),
    ("filter", "FORWARD", KUBE_SERVICES, CT_NEW, "kubernetes service portals"),
    ("filter", "OUTPUT", KUBE_SERVICES, CT_NEW, "kubernetes service portals"),
    ("filter", "FORWARD", KUBE_FORWARD, "", "kubernetes forwarding rules"),
    ("filter", "INPUT", KUBE_PROXY_FIREWALL, CT_NEW, "kubernetes load balancer firewall"),
    ("filter", "OUTPUT", KUBE_PROXY_FIREWALL, CT_NEW, "kubernetes load balancer firewall"),
    ("filter", "FORWARD", KUBE_PROXY_FIREWALL, CT_NEW, "kubernetes load balancer firewall"),
    ("nat", "OUTPUT", KUBE_SERVICES, "", "kubernetes service portals"),
    ("nat", "PREROUTING", KUBE_SERVICES, "", "kubernetes service portals"),
    ("nat", "POSTROUTING", KUBE_POSTROUTING, "", "kubernetes postrouting rules"),
    ("filter", "INPUT", KUBE_FIREWALL, "", ""),
    ("filter", "OUTPUT", KUBE_FIREWALL, "", ""),
];

const CT_NEW: &str = "-m conntrack --ctstate NEW";

/// Said in the setup's comment: the jumps are `-I` lines, which `iptables-restore
/// --noflush` inserts again on every load of the same document; `apply` adds a jump only
/// where it is missing.
pub(crate) const NOFLUSH_TWICE: &str =
    "# Loading this twice with `--noflush` inserts these jumps twice: \
     `svc-compile apply` loads it without duplicates.\n";

/// The canary chains and the jumps. Each jump is prepended, so later entries end up above
/// earlier ones, exactly as kube-proxy's `EnsureRule(Prepend)` calls leave them.
pub(super) fn write_setup(out: &mut String) {
    out.push_str(
        "# Set up outside the restore data: canary chains and jumps (iptables -N / -I).\n",
    );
    out.push_str(NOFLUSH_TWICE);
    let _ = writeln!(out, "*mangle\n:{KUBE_PROXY_CANARY} - [0:0]\nCOMMIT");
    for table in ["filter", "nat"] {
        let _ = writeln!(out, "*{table}\n:{KUBE_PROXY_CANARY} - [0:0]");
        let mut created: Vec<&str> = Vec::new();
        for &(t, _, to, _, _) in JUMPS {
            if t == table && !created.contains(&to) {
                created.push(to);
                let _ = writeln!(out, ":{to} - [0:0]");
            }
        }
        write_jumps(out, table, JUMPS);
        out.push_str("COMMIT\n");
    }
}

/// The `-I` lines of `jumps` in `table`, in order (each prepended: later ones end up above).
pub(crate) fn write_jumps(out: &mut String, table: &str, jumps: &[Jump]) {
    for &(_, from, to, extra, comment) in jumps.iter().filter(|j| j.0 == table) {
        let _ = write!(out, "-I {from}");
        if !extra.is_empty() {
            let _ = write!(out, " {extra}");
        }
        if !comment.is_empty() {
            let _ = write!(out, " -m comment --comment {}", quote(comment));
        }
        let _ = writeln!(out, " -j {to}");
    }
}

/// The masquerade mark as `opts.mark` spells it.
pub(crate) fn mark_string(mark: u32, format: MarkFormat) -> String {
    match format {
        MarkFormat::Padded => format!("{mark:#010x}"),
        MarkFormat::Short => format!("{mark:#x}"),
    }
}

/// KUBE-POSTROUTING (masquerade what KUBE-MARK-MASQ marked) and KUBE-MARK-MASQ itself, the
/// same in iptables and IPVS mode.
pub(crate) fn masquerade_rules(out: &mut Sections, mark: &str, random_fully: bool) {
    out.nat_rule(format_args!(
        "-A {KUBE_POSTROUTING} -m mark ! --mark {mark}/{mark} -j RETURN"
    ));
    // Clear the mark so a packet that goes through the stack again is not masqueraded twice.
    out.nat_rule(format_args!(
        "-A {KUBE_POSTROUTING} -j MARK --xor-mark {mark}"
    ));
    out.nat_rule(format_args!("-A {KUBE_POSTROUTING} -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE{}",
        if random_fully { " --random-fully" } else { "" }));
    out.nat_rule(format_args!("-A {KUBE_MARK_MASQ} -j MARK --or-mark {mark}"));
}

/// KUBE-FORWARD's accept rules (marked traffic, then its established flows), the same in
/// iptables and IPVS mode.
pub(crate) fn forward_rules(out: &mut Sections, mark: &str) {
    out.filter_rule(format_args!("-A {KUBE_FORWARD} -m comment --comment \"kubernetes forwarding rules\" -m mark --mark {mark}/{mark} -j ACCEPT"));
    out.filter_rule(format_args!("-A {KUBE_FORWARD} -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"));
}

const NFACCT_INVALID: &str = "ct_state_invalid_dropped_pkts";

/// The restore data, section by section, each a growing String: the chain declarations
/// and the rules of `filter` and `nat`.
#[derive(Default)]
pub struct Sections {
    filter_chains: String,
    filter_rules: String,
    nat_chains: String,
    nat_rules: String,
}

impl Sections {
    /// Declares a chain of `filter`.
    pub(crate) fn filter_chain(&mut self, name: impl Display) {
        let _ = writeln!(self.filter_chains, ":{name} - [0:0]");
    }
    /// Declares a chain of `nat`.
    pub(crate) fn nat_chain(&mut self, name: impl Display) {
        let _ = writeln!(self.nat_chains, ":{name} - [0:0]");
    }
    /// One rule line of `filter` (`-A CHAIN ...`).
    pub(crate) fn filter_rule(&mut self, rule: fmt::Arguments) {
        let _ = self.filter_rules.write_fmt(rule);
        self.filter_rules.push('\n');
    }
    /// One rule line of `nat`.
    pub(crate) fn nat_rule(&mut self, rule: fmt::Arguments) {
        let _ = self.nat_rules.write_fmt(rule);
        self.nat_rules.push('\n');
    }
    fn filter_chains(&self) -> &str {
        &self.filter_chains
    }
    fn filter_rules(&self) -> &str {
        &self.filter_rules
    }
    fn nat_chains(&self) -> &str {
        &self.nat_chains
    }
    fn nat_rules(&self) -> &str {
        &self.nat_rules
    }
    fn len(&self) -> usize {
        self.filter_chains.len()
            + self.filter_rules.len()
            + self.nat_chains.len()
            + self.nat_rules.len()
    }
}

/// The rules that do not belong to a service port: kube-proxy's static chains.
pub(super) struct StaticRules<'a> {
    view: &'a NodeView,
    opts: &'a Options,
    mark: String,
}

impl<'a> StaticRules<'a> {
    pub(super) fn new(view: &'a NodeView, opts: &'a Options) -> Self {
        let mark = mark_string(view.masquerade_mark, opts.mark);
        StaticRules { view, opts, mark }
    }

    /// Chains and rules before the service ports.
    pub(super) fn head(&self, out: &mut Sections) {
        for chain in [
            KUBE_SERVICES,
            KUBE_EXTERNAL_SERVICES,
            KUBE_FORWARD,
            KUBE_NODEPORTS,
            KUBE_PROXY_FIREWALL,
        ] {
            out.filter_chain(chain);
        }
        for chain in [
            KUBE_SERVICES,
            KUBE_NODEPORTS,
            KUBE_POSTROUTING,
            KUBE_MARK_MASQ,
        ] {
            out.nat_chain(chain);
        }

        masquerade_rules(out, &self.mark, self.opts.random_fully);

        if self.view.martian_rule {
            // route_localnet (needed for localhost node ports) lets remote hosts reach
            // 127.0.0.0/8; this closes that hole (a copy of kubelet's rule).
            out.filter_chain(KUBE_FIREWALL);
            out.filter_rule(format_args!("-A {KUBE_FIREWALL} -m comment --comment \"{MARTIAN_COMMENT}\" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP"));
        }
    }

    /// Rules after the service ports.
    pub(super) fn tail(&self, out: &mut Sections) {
        self.write_nodeports_tail(out);

        if self.view.drop_invalid {
            // INVALID packets would otherwise reach the pod un-NATed and reset connections.
            let nfacct = if self.opts.nfacct {
                format!(" -m nfacct --nfacct-name {NFACCT_INVALID}")
            } else {
                String::new()
            };
            out.filter_rule(format_args!(
                "-A {KUBE_FORWARD} -m conntrack --ctstate INVALID{nfacct} -j DROP"
            ));
        }
        forward_rules(out, &self.mark);
    }

    /// The jump to KUBE-NODEPORTS; it must stay the last rule of nat KUBE-SERVICES.
    fn write_nodeports_tail(&self, out: &mut Sections) {
        let comment =
            "-m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\"";
        match &self.view.node_port_addresses {
            NodePortAddresses::All => {
                // Localhost node ports never work on IPv6, and on IPv4 only with
                // route_localnet, which kube-proxy sets only when they are on.
                let not_loopback = match self.view.family {
                    IpFamily::IPv6 => " ! -d ::1/128",
                    IpFamily::IPv4 if !self.view.localhost_node_ports => " ! -d 127.0.0.0/8",
                    IpFamily::IPv4 => "",
                };
                out.nat_rule(format_args!("-A {KUBE_SERVICES} {comment} -m addrtype --dst-type LOCAL{not_loopback} -j {KUBE_NODEPORTS}"));
            }
            NodePortAddresses::Ips(ips) => {
                for ip in ips {
                    out.nat_rule(format_args!(
                        "-A {KUBE_SERVICES} {comment} -d {ip} -j {KUBE_NODEPORTS}"
                    ));
                }
            }
        }
    }
}
