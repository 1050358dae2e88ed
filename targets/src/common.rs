//! Helpers shared by several back ends. Never copy these into a target module.

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, Mutex};
use svc_compiler::ir::{EndpointView, NodeView, PortView, ServiceId};

/// base32(sha256(s)) without padding, upper case (Go's `base32.StdEncoding`).
pub fn sha256_base32(s: &str) -> String {
    let digest = Sha256::digest(s.as_bytes());
    data_encoding::BASE32_NOPAD.encode(&digest)
}

/// kube-proxy iptables: the 16-character hash of `spn + proto` used by
/// KUBE-SVC-/KUBE-SVL-/KUBE-EXT-/KUBE-FW- chains.
pub fn port_proto_hash(spn: &str, proto_lower: &str) -> String {
    chain_hash(&[spn, proto_lower]).to_string()
}

/// kube-proxy iptables: the 16-character hash of a KUBE-SEP- chain,
/// `spn + proto + "ip:port"` (IPv6 bracketed).
pub fn endpoint_hash(spn: &str, proto_lower: &str, addr: &str) -> String {
    chain_hash(&[spn, proto_lower, addr]).to_string()
}

/// The first 16 characters of base32(sha256(concatenated parts)): kube-proxy's iptables
/// chain-name hash, on the stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChainHash([u8; 16]);

pub fn chain_hash(parts: &[&str]) -> ChainHash {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
    }
    // 16 base32 characters are exactly the first 10 bytes (80 bits).
    let mut out = [0u8; 16];
    data_encoding::BASE32_NOPAD.encode_mut(&h.finalize()[..10], &mut out);
    ChainHash(out)
}

impl ChainHash {
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("base32 is ASCII")
    }
}

impl fmt::Display for ChainHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// kube-proxy nftables: `hashAndTruncate(s)` = first 8 base32 chars of sha256(s), `-`, s;
/// cut to 240 characters (237 + `...`).
pub fn hash_and_truncate(s: &str) -> String {
    // 8 base32 characters are exactly the first 5 bytes.
    let mut h = [0u8; 8];
    data_encoding::BASE32_NOPAD.encode_mut(&Sha256::digest(s.as_bytes())[..5], &mut h);
    let mut full = String::with_capacity(9 + s.len());
    full.push_str(std::str::from_utf8(&h).expect("base32 is ASCII"));
    full.push('-');
    full.push_str(s);
    if full.len() > 240 {
        let mut cut = 237;
        while !full.is_char_boundary(cut) {
            cut -= 1;
        }
        format!("{}...", &full[..cut])
    } else {
        full
    }
}

/// A comment string in double quotes, as iptables-restore and nft read it.
pub fn quote(s: &str) -> String {
    Quoted(s).to_string()
}

/// [`quote`] as a `Display` wrapper: `Quoted(format_args!("{spn} cluster IP"))` writes the
/// quoted comment straight into the output.
pub struct Quoted<T>(pub T);

impl<T: fmt::Display> fmt::Display for Quoted<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        /// Escapes `"` in whatever is written through it.
        struct Escape<'a, 'b>(&'a mut fmt::Formatter<'b>);
        impl fmt::Write for Escape<'_, '_> {
            fn write_str(&mut self, s: &str) -> fmt::Result {
                let mut parts = s.split('"');
                self.0.write_str(parts.next().unwrap_or(""))?;
                for part in parts {
                    self.0.write_str("\\\"")?;
                    self.0.write_str(part)?;
                }
                Ok(())
            }
        }
        f.write_str("\"")?;
        fmt::write(&mut Escape(f), format_args!("{}", self.0))?;
        f.write_str("\"")
    }
}

/// Renderings of service ports shared between the nodes of one module. A port renders the
/// same on every node whose view of it is the same (with the same node-level `settings`),
/// which is most ports on most nodes, so each distinct port is rendered once and copied
/// after that. Nodes may render in parallel.
pub struct PortCache<S, R> {
    /// Sharded by service, so that threads rendering different nodes rarely wait.
    shards: Vec<Mutex<Buckets<S, R>>>,
}

const SHARDS: usize = 64;

/// (service, [`bucket`]) → the renderings made so far.
type Buckets<S, R> = HashMap<(ServiceId, u64), Vec<Arc<Cached<S, R>>>>;

/// One rendering and what it was rendered from.
pub struct Cached<S, R> {
    settings: S,
    view: PortView,
    pub rendered: R,
}

impl<S, R> Default for PortCache<S, R> {
    fn default() -> Self {
        PortCache {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }
}

impl<S: PartialEq + Clone, R> PortCache<S, R> {
    /// The rendering of `p` under `settings`: a cached one, or `render()`'s.
    pub fn get_or_render(
        &self,
        settings: &S,
        p: &PortView,
        render: impl FnOnce() -> R,
    ) -> Arc<Cached<S, R>> {
        let hit = |entries: &Vec<Arc<Cached<S, R>>>| {
            entries
                .iter()
                .find(|e| e.settings == *settings && renders_same(&e.view, p))
                .cloned()
        };
        let bucket = (p.service, bucket(p));
        if let Some(e) = self.lock(p.service).get(&bucket).and_then(hit) {
            return e;
        }
        // Rendered outside the lock; if another node got there first, both are the same.
        let e = Arc::new(Cached {
            settings: settings.clone(),
            view: p.clone(),
            rendered: render(),
        });
        self.lock(p.service)
            .entry(bucket)
            .or_default()
            .push(e.clone());
        e
    }

    fn lock(&self, service: ServiceId) -> std::sync::MutexGuard<'_, Buckets<S, R>> {
        self.shards[service as usize % SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

/// A back end that renders a node's service ports one by one, to be driven by
/// [`render_ports`] and [`Renderer`]: the shape the iptables and nftables writers share.
pub trait PortRendering: 'static {
    type Options: Default + Send + Sync;
    /// What every port's rendering depends on besides the port (node-level settings).
    type Settings: PartialEq + Clone + Send + Sync;
    /// The rendering of one port, or of a run of consecutive ports appended together.
    type Part: Default + Send + Sync;
    /// The whole document for `view` into `out` (cleared first); its ports through
    /// [`render_ports`] with `cache`.
    fn render(
        view: &NodeView,
        opts: &Self::Options,
        cache: Option<&PortCache<Self::Settings, Self::Part>>,
        out: &mut String,
    );
}

/// The rendering of some ports: made for this node, or one port's shared with other nodes.
pub enum Piece<S, P> {
    Own(P),
    Shared(Arc<Cached<S, P>>),
}

impl<S, P> Deref for Piece<S, P> {
    type Target = P;
    fn deref(&self) -> &P {
        match self {
            Piece::Own(p) => p,
            Piece::Shared(c) => &c.rendered,
        }
    }
}

/// Every port of `ports` rendered by `write` (which appends the given ports to a part),
/// in order. Without a cache, in parallel: a window of ports at a time, cut into runs each
/// written into one part, so that only a window's text is held twice. With a cache, port
/// by port, each looked up first.
pub fn render_ports<S, P>(
    ports: &[PortView],
    settings: &S,
    cache: Option<&PortCache<S, P>>,
    write: impl Fn(&mut P, &[PortView]) + Sync,
) -> Vec<Piece<S, P>>
where
    S: PartialEq + Clone + Sync,
    P: Default + Send,
{
    const RUN: usize = 64;
    let part = |ports: &[PortView]| {
        let mut part = P::default();
        write(&mut part, ports);
        part
    };
    match cache {
        None => {
            use rayon::prelude::*;
            let mut pieces = Vec::new();
            for window in ports.chunks(RUN * 32) {
                let runs: Vec<P> = window.par_chunks(RUN).map(part).collect();
                pieces.extend(runs.into_iter().map(Piece::Own));
            }
            pieces
        }
        Some(cache) => ports
            .iter()
            .map(|p| {
                Piece::Shared(cache.get_or_render(settings, p, || part(std::slice::from_ref(p))))
            })
            .collect(),
    }
}

/// Writes the documents of a [`PortRendering`] back end. Made for many nodes of one module
/// (`--all-nodes`, [`Renderer::new`]), each distinct service port is rendered once: on most
/// nodes most ports render the same, and nodes may be written in parallel. Made for one
/// node ([`Renderer::single`]), ports are rendered in parallel instead. Either way the
/// output is the back end's `write_string`.
pub struct Renderer<B: PortRendering> {
    opts: B::Options,
    cache: Option<PortCache<B::Settings, B::Part>>,
}

impl<B: PortRendering> Default for Renderer<B> {
    fn default() -> Self {
        Renderer::new(B::Options::default())
    }
}

impl<B: PortRendering> Renderer<B> {
    /// For many nodes: ports shared between them.
    pub fn new(opts: B::Options) -> Self {
        Renderer {
            opts,
            cache: Some(PortCache::default()),
        }
    }

    /// For one node: nothing kept between documents.
    pub fn single(opts: B::Options) -> Self {
        Renderer { opts, cache: None }
    }

    /// For the registry: shared or not.
    pub fn boxed(sharing: crate::Sharing) -> Box<dyn crate::NodeRenderer> {
        Box::new(match sharing {
            crate::Sharing::One => Self::single(B::Options::default()),
            crate::Sharing::Many => Self::default(),
        })
    }

    pub fn write_string(&self, view: &NodeView) -> String {
        let mut text = String::new();
        self.write_into(view, &mut text);
        text
    }

    /// [`Renderer::write_string`] into `out` (cleared first), reusing its memory.
    pub fn write_into(&self, view: &NodeView, out: &mut String) {
        B::render(view, &self.opts, self.cache.as_ref(), out)
    }
}

impl<B: PortRendering> crate::NodeRenderer for Renderer<B> {
    fn render_into(&self, view: &NodeView, out: &mut String) {
        self.write_into(view, out)
    }
}

/// A hash of what most often differs between two nodes' views of a port (which endpoints
/// they use), so that a lookup compares few candidates. Equality is still checked in full.
fn bucket(p: &PortView) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (
        p.port,
        p.protocol,
        p.has_endpoints,
        p.source_ranges_include_node,
    )
        .hash(&mut h);
    p.cluster_endpoints.hash(&mut h);
    p.local_endpoints.hash(&mut h);
    h.finish()
}

/// Whether two port views render the same in every back end: equal in everything except
/// what back ends never read (the per-node endpoint flags, the topology note) and what the
/// IR derives from other fields. Written out field by field, so that a new field has to be
/// placed on one side or the other.
pub fn renders_same(a: &PortView, b: &PortView) -> bool {
    let PortView {
        service,
        namespace,
        name,
        port_name,
        protocol,
        spn,
        cluster_ip,
        port,
        node_port,
        external_ips,
        load_balancer_ips,
        source_ranges,
        source_ranges_include_node,
        health_check_node_port,
        affinity_timeout,
        externally_accessible,
        internal_local,
        external_local,
        has_endpoints,
        has_internal_endpoints,
        has_external_endpoints,
        no_endpoints_verdict,
        uses_external_chain,
        uses_firewall_chain,
        endpoints,
        cluster_endpoints,
        local_endpoints,
        topology: _,
        cilium,
    } = a;
    let same_endpoint = |x: &EndpointView, y: &EndpointView| {
        let EndpointView {
            ip,
            port,
            // The IR defines it as `ip:port`.
            addr: _,
            is_local: _,
            ready: _,
            serving: _,
            terminating: _,
        } = x;
        *ip == y.ip && *port == y.port
    };
    *service == b.service
        && *port == b.port
        && *protocol == b.protocol
        && *has_endpoints == b.has_endpoints
        && *has_internal_endpoints == b.has_internal_endpoints
        && *has_external_endpoints == b.has_external_endpoints
        && *no_endpoints_verdict == b.no_endpoints_verdict
        && *uses_external_chain == b.uses_external_chain
        && *uses_firewall_chain == b.uses_firewall_chain
        && *cluster_endpoints == b.cluster_endpoints
        && *local_endpoints == b.local_endpoints
        && *externally_accessible == b.externally_accessible
        && *internal_local == b.internal_local
        && *external_local == b.external_local
        && *source_ranges_include_node == b.source_ranges_include_node
        && *cluster_ip == b.cluster_ip
        && *node_port == b.node_port
        && *health_check_node_port == b.health_check_node_port
        && *affinity_timeout == b.affinity_timeout
        && *external_ips == b.external_ips
        && *load_balancer_ips == b.load_balancer_ips
        && *source_ranges == b.source_ranges
        && *cilium == b.cilium
        && *namespace == b.namespace
        && *name == b.name
        && *port_name == b.port_name
        && *spn == b.spn
        && endpoints.len() == b.endpoints.len()
        && endpoints
            .iter()
            .zip(&b.endpoints)
            .all(|(x, y)| same_endpoint(x, y))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iptables_hash_vectors() {
        assert_eq!(port_proto_hash("ns1/svc1:p80", "tcp"), "XPGD46QRK7WJZT7O");
        assert_eq!(
            endpoint_hash("ns1/svc1:p80", "tcp", "10.180.0.1:80"),
            "SXIVWICOYRO3J4NJ"
        );
        assert_eq!(port_proto_hash("ns2/svc2:p80", "tcp"), "GNZBNJ2PO5MGZ6GT");
        assert_eq!(
            port_proto_hash("default/kubernetes:https", "tcp"),
            "NPX46M4PTMTKRN6Y"
        );
        assert_eq!(
            port_proto_hash("kube-system/kube-dns:dns", "udp"),
            "TCOU7JCQXEZGVUNU"
        );
        assert_eq!(
            chain_hash(&["ns1/svc1:p80", "tcp", "10.180.0.1:80"]).as_str(),
            &sha256_base32("ns1/svc1:p80tcp10.180.0.1:80")[..16]
        );
    }

    #[test]
    fn quoting() {
        assert_eq!(quote(r#"a "b" c"#), r#""a \"b\" c""#);
        assert_eq!(
            Quoted(format_args!("{}-{}", "x\"", 1)).to_string(),
            r#""x\"-1""#
        );
    }

    #[test]
    fn nftables_hash_vectors() {
        assert_eq!(
            hash_and_truncate("ns1/svc1/tcp/p80"),
            "ULMVA6XW-ns1/svc1/tcp/p80"
        );
        assert_eq!(
            hash_and_truncate("ns1/svc1/tcp/p80__10.180.0.1/80"),
            "5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"
        );
        let long = "x".repeat(300);
        assert_eq!(hash_and_truncate(&long).len(), 240);
        assert!(hash_and_truncate(&long).ends_with("..."));
    }
}
