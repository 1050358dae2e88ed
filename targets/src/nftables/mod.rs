//! nftables output at parity with kube-proxy's nftables mode (KEP-3866): the `kube-proxy`
//! table of one family (`ip` or `ip6`) for one node, as `nft -f` text ([`write_string`]) or
//! as `nft -j -f` JSON ([`write_json`], `--target nftables-json`). Both forms carry the same
//! objects in the same order; they are built once as data (`model`) and only spelled here.
//!
//! # Loading and replacing
//!
//! The output is one `nft -f` transaction that *replaces* the whole table:
//!
//! ```text
//! add table ip kube-proxy                                       (so the delete cannot fail)
//! delete table ip kube-proxy                                    (drops every old object)
//! add table ip kube-proxy { comment "rules for kube-proxy" ; }  (then the full definition)
//! ```
//!
//! nft commits a file as a single batch, so the kernel switches from the old table to the new
//! one atomically and no stale chain, set or element can survive a reload. kube-proxy itself
//! diffs elements and deletes stale chains a second later (a pre-6.2 kernel issue with chains
//! still referenced from just-deleted map elements); deleting the table removes elements and
//! chains in one step, so there is no such window. The price: dynamic affinity entries are
//! forgotten on every load, and a reload is a full one. `Options::replace_table = false`
//! leaves out the first two lines (for a fresh table, or to compare with `nft list`).
//!
//! # Object order
//!
//! 1. `#` header naming node and family; the table lines above.
//! 2. Base chains, in kube-proxy's order: `filter-prerouting-pre-dnat`,
//!    `filter-output-pre-dnat` (priority -110), `filter-input`, `filter-forward`,
//!    `filter-output` (0), `nat-prerouting`, `nat-output` (-100), `nat-postrouting` (100).
//! 3. Regular top-level chains: `nodeport-endpoints-check`, `service-endpoints-check`,
//!    `firewall-check`, `services`, `masquerading`, `cluster-ips-check`, `mark-for-masquerade`,
//!    `reject-chain`.
//! 4. Sets and maps: `cluster-ips`, `nodeport-ips` (only with restricted nodeport-addresses),
//!    `no-endpoint-services`, `no-endpoint-nodeports`, `firewall-ips`, `service-ips`,
//!    `service-nodeports`.
//! 5. Jump rules from the base chains, then the fixed rules of the top-level chains.
//! 6. Per service port, in `NodeView::ports` order, after a `# ns/name:port` line: affinity
//!    sets; the `service-`, `local-`, `external-`, `firewall-` and `endpoint-` chains; then
//!    their rules in the same chain order (endpoints in `PortView::endpoints` order).
//! 7. Elements, map by map (`nodeport-ips`, `cluster-ips`, `service-ips`,
//!    `service-nodeports`, `firewall-ips`, `no-endpoint-services`, `no-endpoint-nodeports`),
//!    each sorted by key (address, then protocol TCP < UDP < SCTP, then port). A key two
//!    services claim (e.g. a shared externalIP:port) goes to the first in `NodeView` order.
//!
//! Every object is declared before anything refers to it, which nft requires within a batch.
//!
//! # Departures from kube-proxy
//!
//! - The mark is written `0x00004000` (kube-proxy's `%#08x`); its unit tests inject `0x4000`.
//! - `nodeport-ips` is left out instead of added and deleted when NodePorts match all local
//!   addresses; loopback node IPs are skipped there, as kube-proxy does.
//! - Full-sync form only: no partial syncs, no element diffing, no delayed chain deletion.
//! - A service port without a cluster IP (`--no-allocate`) gets no cluster-IP objects.
//!
//! # The fast layout
//!
//! `NodeView::nft_layout == Fast` (`--nft-layout fast`) keeps the table, the base and
//! top-level chains and the element maps, and changes what is slow to load
//! (docs/performance.md): no endpoint chains and no anonymous sets in per-service rules (endpoints
//! picked by `numgen random mod k 0` rules that DNAT themselves, firewall ranges as
//! `return` rules), one `masquerading` rule over the set `hairpin-endpoints` instead of a
//! hairpin rule per endpoint, and session affinity as one dynamic map per policy chain
//! (text form, IPv4) instead of one set per endpoint (see `model::Form`). Every packet's
//! fate is the kube-proxy layout's; the kernel tests run both.
//!
//! Architecture Invariant: this module reads `NodeView` only and recomputes no decision of
//! the node pass (endpoint sets, masquerading, detector, node-port addresses).

mod json;
mod model;
pub(crate) mod names;
pub mod plan;
mod text;
mod trace;

#[cfg(test)]
mod tests;

use crate::common::{self, render_ports, PortCache, PortRendering};
use crate::{Render, Target};
use model::{Form, Item, Place, PortSettings};
use svc_compiler::ir::NodeView;
use text::Layout;

/// How the ruleset is written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// Start with `add table` + `delete table` so that loading the output replaces any
    /// existing `kube-proxy` table of the family in the same transaction (default: true).
    pub replace_table: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            replace_table: true,
        }
    }
}

/// The ruleset as `nft -f` text.
pub fn write_string(view: &NodeView, opts: &Options) -> String {
    let mut out = String::new();
    Nftables::render(view, opts, None, &mut out);
    out
}

/// The model built whole, then written: what [`write_string`] writes port by port.
#[cfg(test)]
pub(crate) fn write_whole(view: &NodeView, opts: &Options) -> String {
    text::write(&model::build(view, Form::Text), opts)
}

/// The ruleset as `nft -j -f` JSON (`{"nftables": [...]}`), one command per line.
pub fn write_json(view: &NodeView, opts: &Options) -> String {
    json::write(&model::build(view, Form::Json), opts)
}

/// `--target nftables`.
pub const TARGET: Target = Target {
    name: "nftables",
    about: "nft -f input, as kube-proxy's nftables mode loads it",
    ext: "nft",
    render: Render::Node(|_, sharing| Renderer::boxed(sharing)),
    flags: &[],
    planner: Some(&plan::Nftables),
    trace: Some(&trace::Nftables),
    deprecated: None,
};

/// `--target nftables-json`.
pub const JSON_TARGET: Target = Target {
    name: "nftables-json",
    about: "the same as nft -j -f input",
    ext: "json",
    render: Render::Node(|_, _| Box::new(JsonRenderer)),
    flags: &[],
    planner: None,
    trace: None,
    deprecated: None,
};

/// [`write_json`] for the registry: the JSON is built whole, nothing is shared.
struct JsonRenderer;

impl crate::NodeRenderer for JsonRenderer {
    fn render_into(&self, view: &NodeView, out: &mut String) {
        *out = write_json(view, &Options::default());
    }
}

/// Writes the `nft -f` text of many nodes (see [`common::Renderer`]).
pub type Renderer = common::Renderer<Nftables>;

/// The nftables back end, for [`common::Renderer`].
pub struct Nftables;

/// The section of some service ports as text, and their elements, each as its line.
#[derive(Default)]
pub struct PortText {
    text: String,
    /// After the section; `None` when the ports have no objects of their own.
    layout: Option<Layout>,
    /// (place in the output, line).
    elements: Vec<(Place, String)>,
}

impl PortRendering for Nftables {
    type Options = Options;
    type Settings = PortSettings;
    type Part = PortText;

    /// The text of `model::build(view)` as `text::write` spells it, built port by port: the
    /// fixed part, the port sections, then the elements of every map.
    fn render(
        view: &NodeView,
        opts: &Options,
        cache: Option<&PortCache<PortSettings, PortText>>,
        out: &mut String,
    ) {
        let family = view.family;
        let element_line = |e: model::Element| {
            let place = e.place();
            let mut line = String::new();
            text::write_item(&mut line, family, &Item::Element(e));
            (place, line)
        };
        out.clear();
        text::header(out, &view.node_name, family, opts);
        let fixed = model::fixed_part(view);
        let mut layout = Layout::default();
        text::write_items(out, family, &fixed.items, &mut layout);
        let own_elements: Vec<_> = fixed.elements.into_iter().map(element_line).collect();

        let settings = PortSettings::of(view, Form::Text);
        let pieces = render_ports(&view.ports, &settings, cache, |part, ports| {
            for p in ports {
                let items = model::port_part(&settings, p);
                let mut l = Layout::default();
                text::write_items(&mut part.text, family, &items.items, &mut l);
                if !items.items.is_empty() {
                    part.layout = Some(l);
                }
                part.elements
                    .extend(items.elements.into_iter().map(element_line));
            }
        });
        let elements: usize = pieces
            .iter()
            .flat_map(|p| &p.elements)
            .map(|e| e.1.len() + 1)
            .sum();
        out.reserve(pieces.iter().map(|p| p.text.len()).sum::<usize>() + elements + 1);
        for p in &pieces {
            out.push_str(&p.text);
            layout = p.layout.unwrap_or(layout);
        }

        // Every map's elements in place order, the first claim of a place winning (the
        // fixed ones first, then the ports in order): a stable sort, then the first of
        // each run.
        let mut elements: Vec<&(Place, String)> = own_elements
            .iter()
            .chain(pieces.iter().flat_map(|p| &p.elements))
            .collect();
        elements.sort_by_key(|e| e.0);
        elements.dedup_by(|later, first| later.0 == first.0);
        for (_, line) in elements {
            layout.before(out, text::Kind::Element);
            out.push_str(line);
            out.push('\n');
        }
    }
}
