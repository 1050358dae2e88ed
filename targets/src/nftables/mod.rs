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
//! Architecture Invariant: this module reads `NodeView` only and recomputes no decision of
//! the node pass (endpoint sets, masquerading, detector, node-port addresses).

mod json;
mod model;
mod text;

#[cfg(test)]
mod tests;

use crate::common::{Cached, PortCache};
use model::{Item, Place, PortSettings};
use std::sync::Arc;
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
    render(view, opts, None, &mut out);
    out
}

/// The model built whole, then written: what [`write_string`] writes port by port.
#[cfg(test)]
pub(crate) fn write_whole(view: &NodeView, opts: &Options) -> String {
    text::write(&model::build(view), opts)
}

/// The ruleset as `nft -j -f` JSON (`{"nftables": [...]}`), one command per line.
pub fn write_json(view: &NodeView, opts: &Options) -> String {
    json::write(&model::build(view), opts)
}

/// Writes the `nft -f` text of many nodes of one module (`--all-nodes`), each distinct
/// service port rendered once: on most nodes most ports render the same. Nodes may be
/// written in parallel. The output is [`write_string`]'s.
#[derive(Default)]
pub struct Renderer {
    opts: Options,
    cache: PortCache<PortSettings, PortText>,
}

/// A service port's section as text, and its elements, each as its line.
struct PortText {
    text: String,
    /// After the section; `None` when the port has no objects of its own.
    layout: Option<Layout>,
    /// (place in the output, line).
    elements: Vec<(Place, String)>,
}

impl Renderer {
    pub fn new(opts: Options) -> Renderer {
        Renderer {
            opts,
            cache: PortCache::default(),
        }
    }

    pub fn write_string(&self, view: &NodeView) -> String {
        let mut text = String::new();
        self.write_into(view, &mut text);
        text
    }

    /// [`Renderer::write_string`] into `out` (cleared first), reusing its memory.
    pub fn write_into(&self, view: &NodeView, out: &mut String) {
        render(view, &self.opts, Some(&self.cache), out)
    }
}

/// The text of `model::build(view)` as `text::write` spells it, built port by port (and
/// with a cache, each port looked up first): the fixed part, the port sections, then the
/// elements of every map.
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
    let mut own_elements: Vec<_> = fixed.elements.into_iter().map(element_line).collect();

    let settings = PortSettings::of(view);
    let mut shared: Vec<Arc<Cached<PortSettings, PortText>>> = Vec::new();
    match cache {
        None => {
            // Ports in parallel: a window of them at a time, cut into runs that are each
            // written into one text, so that only a window's text is held twice.
            use rayon::prelude::*;
            const RUN: usize = 64;
            let endpoints: usize = view.ports.iter().map(|p| p.endpoints.len()).sum();
            // About what a port and an endpoint take, to grow the text rarely.
            out.reserve(view.ports.len() * 1500 + endpoints * 400);
            for window in view.ports.chunks(RUN * 32) {
                let runs: Vec<_> = window
                    .par_chunks(RUN)
                    .map(|ports| {
                        let (mut text, mut run_layout) = (String::new(), None);
                        let mut elements = Vec::new();
                        for p in ports {
                            let part = model::port_part(&settings, p);
                            let mut l = Layout::default();
                            text::write_items(&mut text, family, &part.items, &mut l);
                            if !part.items.is_empty() {
                                run_layout = Some(l);
                            }
                            elements.extend(part.elements.into_iter().map(element_line));
                        }
                        (text, run_layout, elements)
                    })
                    .collect();
                for (text, run_layout, elements) in runs {
                    out.push_str(&text);
                    layout = run_layout.unwrap_or(layout);
                    own_elements.extend(elements);
                }
            }
        }
        Some(cache) => {
            shared = view
                .ports
                .iter()
                .map(|p| {
                    cache.get_or_render(&settings, p, || {
                        let part = model::port_part(&settings, p);
                        let mut port_layout = Layout::default();
                        let mut text = String::new();
                        text::write_items(&mut text, family, &part.items, &mut port_layout);
                        PortText {
                            text,
                            layout: (!part.items.is_empty()).then_some(port_layout),
                            elements: part.elements.into_iter().map(element_line).collect(),
                        }
                    })
                })
                .collect();
            let elements: usize = shared
                .iter()
                .flat_map(|c| &c.rendered.elements)
                .map(|e| e.1.len() + 1)
                .sum();
            out.reserve(shared.iter().map(|c| c.rendered.text.len()).sum::<usize>() + elements + 1);
            for c in &shared {
                out.push_str(&c.rendered.text);
                layout = c.rendered.layout.unwrap_or(layout);
            }
        }
    }

    // Every map's elements in place order, the first claim of a place winning (the fixed
    // ones first, then the ports in order): a stable sort, then the first of each run.
    let mut elements: Vec<&(Place, String)> = own_elements
        .iter()
        .chain(shared.iter().flat_map(|c| &c.rendered.elements))
        .collect();
    elements.sort_by_key(|e| e.0);
    elements.dedup_by(|later, first| later.0 == first.0);
    for (_, line) in elements {
        layout.before(out, text::Kind::Element);
        out.push_str(line);
        out.push('\n');
    }
}
