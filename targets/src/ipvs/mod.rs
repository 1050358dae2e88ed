//! kube-proxy's IPVS mode (`--proxy-mode=ipvs`) at parity: the whole state its proxier
//! builds on a node for one [`NodeView`], in four parts, each in the native syntax of the
//! tool that loads it (and that dumps it, so each part diffs against a live node):
//!
//! | part | syntax | load with |
//! |---|---|---|
//! | [`Part::Ipvsadm`] | `ipvsadm-save -n` | `ipvsadm-restore` |
//! | [`Part::Ipset`] | `ipset save` | `ipset restore` |
//! | [`Part::Iptables`] | iptables-save (IPVS mode's chains) | `iptables-restore --noflush` |
//! | [`Part::Addresses`] | `ip -batch` (kube-ipvs0 and its addresses; sysctls as comments) | `ip -batch` |
//!
//! A node loads them in the order of [`Part::ALL`]: the sets first (rules name them),
//! then the virtual servers, then the addresses that make their VIPs local (IPVS only
//! sees packets to local addresses, so a VIP never answers before its server exists),
//! then the iptables rules. The two families' `addresses` parts each create kube-ipvs0:
//! load the second with `ip -force -batch` (or skip its first line).
//!
//! `excludeCIDRs` changes nothing here: kube-proxy only spares virtual servers in those
//! ranges when it deletes the ones it no longer wants, so it matters to `apply`, which
//! carries it in [`Options::config`].
//!
//! Facts from `pkg/proxy/ipvs/proxier.go` (`syncProxyRules`, `syncEndpoint`,
//! `writeIptablesRules`), `ipset.go` and ipvsadm's save format; see [`model`] for what is
//! computed and how lists are ordered. What the view cannot know is approximated and
//! documented: node ports listen on the node's own addresses (from its Node object), not
//! on every local address of the machine.
//!
//! Invariant: pure. [`write_string`] = every part in [`Part::ALL`] order, each under a
//! `# ==== PART ====` header line; [`write_part`] = one part alone, loadable as is.

mod addresses;
mod ipset;
mod iptables;
mod ipvsadm;
pub mod model;
pub mod plan;
mod trace;

#[cfg(test)]
mod tests;

use crate::{NodeRenderer, Render, Target};
use std::fmt;
use std::str::FromStr;
use svc_compiler::ir::{IpvsConfig, NodeView, ProxyConfig};

/// `--target ipvs`: every part under its header, or with `--part` one part alone; with
/// `--all-nodes --out DIR`, `DIR/NODE.FAMILY.PART.ipvs` per part (see [`Renderer`]).
pub const TARGET: Target = Target {
    name: "ipvs",
    about:
        "kube-proxy's IPVS mode: parts ipset, ipvsadm, addresses, iptables (--part PART for one)",
    ext: "ipvs",
    render: Render::Node(|_, _| Box::new(Renderer)),
    flags: &[],
    planner: Some(&plan::Ipvs),
    trace: Some(&trace::Ipvs),
    deprecated: Some(svc_compiler::passes::validate::ipvs_deprecated),
};

/// The parts' names in [`Part::ALL`] order, as [`NodeRenderer::parts`] lists them.
const PART_NAMES: [&str; 4] = ["ipset", "ipvsadm", "addresses", "iptables"];

/// The renderer of [`TARGET`]: the view's own IPVS settings (the module's `ipvs` section,
/// which every view carries), other [`Options`] at their defaults. Each call builds the
/// node's state anew; [`NodeRenderer::render_parts_into`] (`--all-nodes --out`) builds it
/// once for all four parts.
pub struct Renderer;

impl NodeRenderer for Renderer {
    fn render_into(&self, view: &NodeView, out: &mut String) {
        out.clear();
        write_into(view, &Options::from_view(view), out);
    }

    fn parts(&self) -> &'static [&'static str] {
        &PART_NAMES
    }

    fn render_part_into(&self, view: &NodeView, part: &str, out: &mut String) {
        let part: Part = part.parse().unwrap_or_else(|e| panic!("ipvs: {e}"));
        out.clear();
        render(
            view,
            &model::build(view),
            part,
            &Options::from_view(view),
            out,
        );
    }

    fn render_parts_into(&self, view: &NodeView, out: &mut [String]) {
        let (st, opts) = (model::build(view), Options::from_view(view));
        for (part, text) in Part::ALL.into_iter().zip(out) {
            text.clear();
            render(view, &st, part, &opts, text);
        }
    }
}

/// The module's IPVS settings and how the output should match a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// `ipvs.scheduler` (rr, wrr, lc, wlc, lblc, lblcr, sh, dh, sed, nq, mh).
    pub scheduler: String,
    /// The rest of the `ipvs` section: timeouts, strictARP, excludeCIDRs.
    pub config: IpvsConfig,
    /// `--random-fully` on the MASQUERADE rule (iptables ≥ 1.6.2, as kube-proxy checks).
    pub random_fully: bool,
    /// Write the chains and the jumps from built-in chains kube-proxy sets up outside its
    /// restore data (as the iptables target does), so the part loads into an empty table.
    pub setup: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            scheduler: "rr".into(),
            config: IpvsConfig::default(),
            random_fully: true,
            setup: true,
        }
    }
}

impl Options {
    /// The settings a module's KubeProxyConfiguration gives, other options at default.
    pub fn from_proxy(proxy: &ProxyConfig) -> Options {
        Options {
            scheduler: proxy.ipvs_scheduler.clone(),
            config: proxy.ipvs.clone(),
            ..Options::default()
        }
    }

    /// The same settings, from the copy a node view carries.
    pub fn from_view(view: &NodeView) -> Options {
        Options {
            scheduler: view.ipvs_scheduler.clone(),
            config: view.ipvs.clone(),
            random_fully: view.random_fully.unwrap_or(Options::default().random_fully),
            ..Options::default()
        }
    }
}

/// One part of the IPVS state (`--part`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Part {
    Ipset,
    Ipvsadm,
    Addresses,
    Iptables,
}

impl Part {
    /// Every part, in the order a node loads them.
    pub const ALL: [Part; 4] = [Part::Ipset, Part::Ipvsadm, Part::Addresses, Part::Iptables];

    /// The `--part` value, also the file suffix of `--all-nodes --out`.
    pub fn name(self) -> &'static str {
        match self {
            Part::Ipvsadm => "ipvsadm",
            Part::Ipset => "ipset",
            Part::Iptables => "iptables",
            Part::Addresses => "addresses",
        }
    }

    /// The command that loads this part (for headers and docs).
    pub fn loader(self) -> &'static str {
        match self {
            Part::Ipvsadm => "ipvsadm-restore",
            Part::Ipset => "ipset restore",
            Part::Iptables => "iptables-restore --noflush",
            Part::Addresses => "ip -batch -",
        }
    }
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Part {
    type Err = String;
    fn from_str(s: &str) -> Result<Part, String> {
        Part::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("unknown part `{s}` (ipvsadm, ipset, iptables, addresses)"))
    }
}

/// All four parts, in load order, each under a `# ==== PART: load with … ====` line.
pub fn write_string(view: &NodeView, opts: &Options) -> String {
    let mut out = String::new();
    write_into(view, opts, &mut out);
    out
}

fn write_into(view: &NodeView, opts: &Options, out: &mut String) {
    let st = model::build(view);
    for part in Part::ALL {
        out.push_str(&format!(
            "# ==== {part}: load with `{}` (node {}, {:?}) ====\n",
            part.loader(),
            view.node_name,
            view.family
        ));
        render(view, &st, part, opts, out);
    }
}

/// One part alone, exactly as its loader reads it.
pub fn write_part(view: &NodeView, part: Part, opts: &Options) -> String {
    let st = model::build(view);
    let mut out = String::new();
    render(view, &st, part, opts, &mut out);
    out
}

fn render(view: &NodeView, st: &model::State, part: Part, opts: &Options, out: &mut String) {
    match part {
        Part::Ipvsadm => ipvsadm::write(st, opts, out),
        Part::Ipset => ipset::write(st, view.family, out),
        Part::Iptables => iptables::write(view, st, opts, out),
        Part::Addresses => addresses::write(st, opts, out),
    }
}
