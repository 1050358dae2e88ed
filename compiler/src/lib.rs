//! svc-compile's compiler: source files, diagnostics, the front end, the IR and the passes.
//!
//! Architecture Invariant: nothing in this crate touches the file system, runs a process
//! or reads the environment. Inputs arrive as a [`source::SourceMap`]; outputs are data.
//!
//! Pipeline ([`compile`]): parse (files in parallel) → decode → validate → resolve →
//! allocate → lower → [`ir::Module`]. Per node and family, [`passes::node::node_view`]
//! then gives the [`ir::NodeView`] the back ends render.

pub mod codes;
pub mod decode;
pub mod diag;
pub mod diff;
pub mod ir;
pub mod k8s;
pub mod kustomize;
pub mod layout;
pub mod migrate;
pub mod net;
pub mod passes;
pub mod project;
pub mod source;
pub mod suppress;
pub mod synth;
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod testing;
pub mod trace;
pub mod tree;

use diag::Diagnostics;
use k8s::Objects;
use net::Cidr;
use passes::allocate::Lock;
use passes::Settings;
use source::{FileId, SourceMap, Span};

/// Settings that come from the command line. `None` = not given (the ClusterConfig
/// document, then the default, applies).
#[derive(Clone, Debug, Default)]
pub struct Options {
    pub service_cidrs: Option<Vec<Cidr>>,
    pub node_port_range: Option<(u16, u16)>,
    pub cluster_domain: Option<String>,
    /// `--no-allocate` sets this to false: compile objects exactly as given.
    pub allocate: bool,
    /// The lock file, already added to the source map.
    pub lock: Option<FileId>,
    /// `--random-fully on|off`, `--nfacct on|off`.
    pub random_fully: Option<bool>,
    pub nfacct: Option<bool>,
    /// `--nft-layout`.
    pub nft_layout: Option<ir::NftLayout>,
    /// `--topology-keys`.
    pub topology_keys: Option<ir::TopologyKeys>,
    /// `--validate`: how unknown fields (SVC003) are reported.
    pub validate: Validate,
    /// Which files are one cluster, and the names kustomize gives their objects there: the
    /// cross-object rules run within each cluster (the default: all files, one cluster).
    pub layout: layout::Layout,
}

/// How unknown fields in a kind svc-compile reads are reported, as kubectl's
/// `--validate`: `strict` (kubectl's default: the API server refuses the object, so an
/// error), `warn` (for those who apply with `--validate=false`, where the API server drops
/// the field), `ignore`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Validate {
    #[default]
    Strict,
    Warn,
    Ignore,
}

pub struct Compilation {
    pub module: ir::Module,
    pub objects: Objects,
    pub settings: Settings,
    /// The allocations to write back with `--write-lock`.
    pub lock: Lock,
    /// Sorted.
    pub diags: Diagnostics,
}

/// Compile the manifests in `inputs` (files of `sources`). Never fails: problems are
/// diagnostics; the module is built from whatever was valid.
pub fn compile(sources: &SourceMap, inputs: &[FileId], opts: &Options) -> Compilation {
    let (objects, diags) = read(sources, inputs);
    compile_read(sources, inputs, opts, objects, diags)
}

/// [`compile`] with the files' parse results kept in `cache` between calls: a file with
/// the name, [`FileId`] and bytes of a file of the last call is not parsed again. The
/// result is [`compile`]'s, always (the agent's property test checks it).
pub fn compile_cached(
    sources: &SourceMap,
    inputs: &[FileId],
    opts: &Options,
    cache: &mut ReadCache,
) -> Compilation {
    let (objects, diags) = cache.read(sources, inputs);
    compile_read(sources, inputs, opts, objects, diags)
}

/// The passes of [`compile`], after the files were read.
fn compile_read(
    sources: &SourceMap,
    inputs: &[FileId],
    opts: &Options,
    objects: Objects,
    mut diags: Diagnostics,
) -> Compilation {
    unknown_fields(&mut diags, opts.validate);
    let mut settings = settings(&objects, opts);
    let config = objects.cluster_configs.first();
    let range_given = opts.service_cidrs.is_some()
        || config.is_some_and(|c| c.service_cluster_ip_range.is_some());
    let ports_given = opts.node_port_range.is_some()
        || config.is_some_and(|c| c.service_node_port_range.is_some());
    // A dump's own ranges beat defaults that are only right for some clusters.
    if !opts.allocate && !range_given {
        if let Some((cidrs, note)) = passes::infer::service_cidrs(&objects) {
            settings.service_cidrs = cidrs;
            diags.push(note);
        }
    }
    if !opts.allocate && !ports_given {
        let default = settings.node_port_range;
        if let Some((range, note)) = passes::infer::node_port_range(&objects, default) {
            settings.node_port_range = range;
            diags.push(note);
        }
    }
    passes::validate::validate_in(&objects, &settings, &opts.layout, &mut diags);
    let lock = match opts.lock {
        Some(f) => {
            let (docs, d) = tree::parse_file(f, &sources.file(f).text);
            diags.extend(d);
            docs.first()
                .map(|doc| passes::allocate::read_lock(&doc.root, &mut diags))
                .unwrap_or_default()
        }
        None => Lock::default(),
    };
    let resolved = passes::resolve::resolve(&objects);
    let (allocs, mut new_lock) =
        passes::allocate::allocate(&objects, &settings, &lock, opts.allocate, &mut diags);
    // eBPF ids are assigned by that back end per node: carried over, updated by the CLI.
    new_lock.ebpf = lock.ebpf;
    let module = passes::lower::lower(&objects, &settings, resolved, allocs);
    template_notes(sources, inputs, &mut diags);
    diags.sort(sources);
    Compilation {
        module,
        objects,
        settings,
        lock: new_lock,
        diags,
    }
}

/// Unknown fields (SVC003, decoded as warnings) as `--validate` says.
fn unknown_fields(diags: &mut Diagnostics, validate: Validate) {
    match validate {
        Validate::Warn => {}
        Validate::Strict => diags
            .items
            .iter_mut()
            .filter(|d| d.code == "SVC003")
            .for_each(|d| d.severity = diag::Severity::Error),
        Validate::Ignore => diags.items.retain(|d| d.code != "SVC003"),
    }
}

/// Parse and decode the manifests in `inputs`: files in parallel, and large files in
/// parallel pieces. Each piece is decoded right after it is parsed, on the same thread, so
/// the located tree of a large file never exists whole. Objects come in input order.
pub fn read(sources: &SourceMap, inputs: &[FileId]) -> (Objects, Diagnostics) {
    use rayon::prelude::*;
    let parsed: Vec<(Objects, Diagnostics)> = inputs
        .par_iter()
        .map(|&f| read_file(f, &sources.file(f).text))
        .collect();
    let mut objects = Objects::default();
    let mut diags = Diagnostics::default();
    for (o, d) in parsed {
        objects.extend(o);
        diags.extend(d);
    }
    (objects, diags)
}

/// One file's objects and diagnostics, in document order.
fn read_file(f: FileId, text: &str) -> (Objects, Diagnostics) {
    let mut objects = Objects::default();
    let mut diags = Diagnostics::default();
    if let Some(d) = tree::too_many_documents(f, text) {
        diags.push(d);
        return (objects, diags);
    }
    let (parts, d) = tree::parse_each(f, text, |part| {
        let mut objs = Objects::default();
        let mut d = Diagnostics::default();
        k8s::decode_part(&part, &mut objs, &mut d);
        (objs, d)
    });
    diags.extend(d);
    for (o, d) in parts {
        objects.extend(o);
        diags.extend(d);
    }
    (objects, diags)
}

/// Each input file's parse result from the last [`compile_cached`], by name. An entry
/// stands while the file has the same [`FileId`] (the spans in its objects name it) and
/// the same bytes (compared by [`source::fingerprint`] and the length); files gone from the
/// inputs are forgotten, so the cache holds one result per input file.
#[derive(Default)]
pub struct ReadCache {
    files: std::collections::HashMap<String, Cached>,
    parsed: usize,
}

struct Cached {
    id: FileId,
    len: usize,
    print: (u64, u64),
    read: (Objects, Diagnostics),
}

impl ReadCache {
    /// [`read`], parsing only the files not cached.
    fn read(&mut self, sources: &SourceMap, inputs: &[FileId]) -> (Objects, Diagnostics) {
        use rayon::prelude::*;
        // Files added with their fingerprint (the agent's) are not hashed again.
        let prints: Vec<(u64, u64)> = inputs.par_iter().map(|&f| sources.print(f)).collect();
        let stale: Vec<(FileId, (u64, u64))> = inputs
            .iter()
            .zip(&prints)
            .filter(|(&f, &p)| {
                let file = sources.file(f);
                !self
                    .files
                    .get(&file.name)
                    .is_some_and(|c| c.id == f && c.len == file.text.len() && c.print == p)
            })
            .map(|(&f, &p)| (f, p))
            .collect();
        let parsed: Vec<Cached> = stale
            .par_iter()
            .map(|&(f, print)| {
                let text = &sources.file(f).text;
                Cached {
                    id: f,
                    len: text.len(),
                    print,
                    read: read_file(f, text),
                }
            })
            .collect();
        self.parsed += parsed.len();
        for c in parsed {
            self.files.insert(sources.name(c.id).to_string(), c);
        }
        let names: std::collections::HashSet<&str> =
            inputs.iter().map(|&f| sources.name(f)).collect();
        self.files.retain(|n, _| names.contains(n.as_str()));
        let mut objects = Objects::default();
        let mut diags = Diagnostics::default();
        for &f in inputs {
            let (o, d) = &self.files[sources.name(f)].read;
            objects.extend(o.clone());
            diags.extend(d.clone());
        }
        (objects, diags)
    }

    /// How many files the cache holds (the last compile's inputs).
    pub fn files(&self) -> usize {
        self.files.len()
    }

    /// How many files the [`compile_cached`] calls since the last call of this parsed
    /// (the others came from the cache).
    pub fn take_parsed(&mut self) -> usize {
        std::mem::take(&mut self.parsed)
    }
}

/// A file that holds `{{`, `${NAME` or `{NAME}` and does not parse, or has an error on a line with
/// such a marker, was most likely never rendered: say so once, at that marker, so the
/// errors it caused are read in that light. (Markers in valid values, such as a
/// dashboard's `{{instance}}`, say nothing.)
fn template_notes(sources: &SourceMap, inputs: &[FileId], diags: &mut Diagnostics) {
    // Per file: whether it failed to parse, and the lines with errors.
    let mut errors: std::collections::HashMap<FileId, (bool, Vec<u32>)> = Default::default();
    for d in diags
        .items
        .iter()
        .filter(|d| d.severity == diag::Severity::Error)
    {
        if let Some(s) = d.span {
            let e = errors.entry(s.file).or_default();
            e.0 |= matches!(d.code, "SVC001" | "SVC002");
            e.1.push(s.line);
        }
    }
    for &f in inputs {
        let Some((unparsed, lines)) = errors.get_mut(&f) else {
            continue;
        };
        let marker = if *unparsed {
            tree::template_marker(f, &sources.file(f).text)
        } else {
            lines.sort_unstable();
            lines.iter().find_map(|&l| {
                let (span, what) = tree::template_marker(f, sources.line_text(f, l)?)?;
                Some((Span { line: l, ..span }, what))
            })
        };
        if let Some((span, what)) = marker {
            diags.push(
                diag::Diagnostic::note(
                    "SVC014",
                    format!("this file looks like an unrendered {what} template"),
                )
                .at(span)
                .hint(match what {
                    "Helm" => "check what `helm template` renders, or leave the chart's templates out with --exclude GLOB",
                    "placeholder" => "check the file once its `{NAME}` placeholders are filled in (by your script), or leave it out with --exclude GLOB",
                    _ => "check the file after `envsubst` (or your templating tool), or leave it out with --exclude GLOB",
                }),
            );
        }
    }
}

/// Merge the ClusterConfig document (if any) with the flags; flags win. Invalid values in
/// the document were reported by validation (SVC316, SVC317, SVC320, SVC322, SVC323,
/// SVC324); they leave the default.
/// Public for the benchmarks, which run the passes one by one.
pub fn settings(objects: &Objects, opts: &Options) -> Settings {
    let mut s = Settings::default();
    if let Some(doc) = objects.cluster_configs.first() {
        if let Some(c) = doc
            .service_cluster_ip_range
            .as_ref()
            .and_then(|r| passes::parse_service_cidrs(&r.v).ok())
        {
            s.service_cidrs = c;
        }
        if let Some(p) = doc
            .service_node_port_range
            .as_ref()
            .and_then(|r| passes::parse_port_range(&r.v).ok())
        {
            s.node_port_range = p;
        }
        if let Some(d) = &doc.cluster_domain {
            s.cluster_domain = d.v.clone();
        }
        s.random_fully = doc.random_fully.as_ref().map(|b| b.v);
        s.nfacct = doc.nfacct.as_ref().map(|b| b.v);
        if let Some(l) = doc
            .nft_layout
            .as_ref()
            .and_then(|l| ir::NftLayout::parse(&l.v))
        {
            s.nft_layout = l;
        }
        if let Some(t) = doc
            .topology_keys
            .as_ref()
            .and_then(|t| ir::TopologyKeys::parse(&t.v))
        {
            s.topology_keys = t;
        }
        if let Some(r) = doc
            .dns_records
            .as_ref()
            .and_then(|r| ir::DnsRecords::parse(&r.v))
        {
            s.dns_records = r;
        }
        if let Some(m) = doc
            .ebpf_map_sizes
            .as_ref()
            .and_then(|m| ir::EbpfMapSizes::parse(&m.v).ok())
        {
            s.ebpf_map_sizes = m;
        }
        let agent = &mut s.ebpf_agent;
        if let Some(a) = &doc.ebpf_lb_algorithm {
            agent.lb_algorithm = ir::LbAlgorithm::parse(&a.v);
        }
        agent.lb_algorithm_annotation = doc.ebpf_lb_algorithm_annotation.as_ref().map(|b| b.v);
        if let Some(m) = &doc.ebpf_maglev_table_size {
            agent.maglev_table_size = ir::EbpfAgent::parse_table_size(&m.v.to_string()).ok();
        }
        if let Some(t) = &doc.ebpf_service_topology {
            s.ebpf_service_topology = t.v;
        }
        if let Some(h) = &doc.ebpf_maglev_hash_seed {
            agent.maglev_hash_seed = ir::EbpfAgent::murmur_seed(&h.v).ok().map(|_| h.v.clone());
        }
    }
    if let Some(l) = opts.nft_layout {
        s.nft_layout = l;
    }
    if let Some(t) = opts.topology_keys {
        s.topology_keys = t;
    }
    if opts.random_fully.is_some() {
        s.random_fully = opts.random_fully;
    }
    if opts.nfacct.is_some() {
        s.nfacct = opts.nfacct;
    }
    if let Some(c) = &opts.service_cidrs {
        s.service_cidrs = c.clone();
    }
    if let Some(r) = opts.node_port_range {
        s.node_port_range = r;
    }
    if let Some(d) = &opts.cluster_domain {
        s.cluster_domain = d.clone();
    }
    s
}
