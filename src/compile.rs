//! From the compile options to compiled IR and node views: what `check`, `compile`,
//! `apply`, `drift` and `trace` share.

use crate::cli::{CompileOpts, Nodes, TargetArgs};
use crate::config::Config;
use crate::inputs::{glob_matches, read_file, read_inputs, Filters, Globs, Inputs};
use crate::report::Fail;
use std::path::Path;
use svc_compiler::net::IpFamily;
use svc_compiler::passes::node::NodeSelection;
use svc_compiler::source::{FileId, SourceMap};
use svc_targets::Params;

/// What [`compile_inputs`] read and made of it.
pub(crate) struct Compiled {
    pub sources: SourceMap,
    pub comp: svc_compiler::Compilation,
    /// The input files that were checked (`ok: N file(s) checked`): those read as manifests,
    /// including the ones found not to be Kubernetes objects (each has its note); not the
    /// lock file, nor kustomize patches, which are skipped without being checked.
    pub files: Vec<FileId>,
    /// The target's flags, with the files they name read (and added to `sources`).
    pub params: Params,
}

/// Everything a compile reads, read: the inputs, the lock file (if it exists) and the
/// files the target's flags name, all in `sources`. The compile that follows
/// ([`compile_read`]) reads nothing else, so these bytes and the command decide its output.
pub(crate) struct Read {
    pub sources: SourceMap,
    /// The flags with what they leave unsaid taken from the config file.
    opts: CompileOpts,
    config: Option<Config>,
    inputs: Inputs,
    lock: Option<FileId>,
    params: Params,
    /// The target's deprecation warning (`Target::deprecated`).
    deprecated: Option<fn() -> svc_compiler::diag::Diagnostic>,
}

/// Read the inputs (and the lock file, if it exists) and compile them; read the files the
/// target's flags name.
pub(crate) fn compile_inputs(
    opts: &CompileOpts,
    target: Option<&TargetArgs>,
) -> Result<Compiled, Fail> {
    Ok(compile_read(read_all(opts, target, None)?, None))
}

/// The reading half of [`compile_inputs`]; with the agent's `cache`, the input files that
/// did not change since its last call are not read again.
pub(crate) fn read_all(
    opts: &CompileOpts,
    target: Option<&TargetArgs>,
    cache: Option<&mut svc_node::agent::files::FileCache>,
) -> Result<Read, Fail> {
    let mut config = crate::config::load(&opts.config, opts.color)?;
    let mut sources = SourceMap::default();
    let inputs = read_inputs(
        &opts.paths,
        &filters(&opts.exclude, &opts.include, config.as_ref()),
        &mut sources,
        cache,
    )?;
    // After the inputs, so that their ids do not depend on whether there is a config.
    if let Some(c) = &mut config {
        c.add_to(&mut sources);
    }
    let lock = match &opts.lock {
        Some(p) if Path::new(p).exists() => Some(sources.add(p.clone(), read_file(Path::new(p))?)),
        _ => None,
    };
    let params = match target {
        Some(t) => target_params(t, &mut sources)?,
        None => Params::default(),
    };
    Ok(Read {
        sources,
        opts: crate::config::merge(opts, config.as_ref()),
        config,
        inputs,
        lock,
        params,
        deprecated: target.and_then(|t| t.target.deprecated),
    })
}

/// `--exclude`/`--include` as given, or where none is given the config file's (relative
/// to its directory).
pub(crate) fn filters<'a>(
    exclude: &'a [String],
    include: &'a [String],
    config: Option<&'a Config>,
) -> Filters<'a> {
    let globs = |flags: &'a [String], file: Option<&'a Vec<String>>| match (flags, file) {
        ([], Some(file)) => Globs {
            globs: file,
            base: config.map(|c| c.base.as_path()),
        },
        _ => Globs {
            globs: flags,
            base: None,
        },
    };
    let project = config.map(|c| &c.project);
    Filters {
        exclude: globs(exclude, project.and_then(|p| p.exclude.as_ref())),
        include: globs(include, project.and_then(|p| p.include.as_ref())),
    }
}

/// Takes out what the suppressions say (`# svc-compile:ignore` comments in `files`, the
/// config file's `ignore` and `per-path-ignores`) and warns of those that took nothing
/// out; true when `diags` needs sorting again.
pub(crate) fn suppress(
    diags: &mut svc_compiler::diag::Diagnostics,
    sources: &SourceMap,
    files: &[FileId],
    config: Option<&Config>,
) -> bool {
    let project = config.map(|c| &c.project);
    let path_matches = |f: FileId, glob: &str| {
        let name = sources.name(f);
        // A revision's file (`REV:PATH`, diff) by its path.
        let name = name.split_once(':').map_or(name, |(_, p)| p);
        let rel = config.map_or_else(|| name.to_string(), |c| c.relative(name));
        glob_matches(glob, &rel)
    };
    svc_compiler::suppress::apply(
        diags,
        sources,
        &svc_compiler::suppress::Rules {
            ignore: project.map_or(&[], |p| &p.ignore),
            per_path: project.map_or(&[], |p| &p.per_path_ignores),
            path_matches: &path_matches,
            files,
            known: &|c| crate::report::code_info(c).is_some(),
        },
    )
}

/// The compiling half of [`compile_inputs`]: no I/O. With a `cache` (the agent's), files
/// parsed by an earlier call with the same bytes are not parsed again.
pub(crate) fn compile_read(read: Read, cache: Option<&mut svc_compiler::ReadCache>) -> Compiled {
    let Read {
        sources,
        opts,
        config,
        inputs,
        lock,
        params,
        deprecated,
    } = read;
    let options = svc_compiler::Options {
        service_cidrs: opts.service_cidrs.clone(),
        node_port_range: opts.node_port_range,
        cluster_domain: opts.cluster_domain.clone(),
        allocate: opts.allocate,
        lock,
        random_fully: opts.random_fully,
        nfacct: opts.nfacct,
        nft_layout: opts.nft_layout,
        validate: opts.validate.unwrap_or_default(),
        topology_keys: opts.topology_keys,
        layout: opts
            .layout
            .map(|plain| layout(&inputs, &sources, config.as_ref(), plain))
            .unwrap_or_default(),
    };
    let mut comp = match cache {
        Some(cache) => svc_compiler::compile_cached(&sources, &inputs.files, &options, cache),
        None => svc_compiler::compile(&sources, &inputs.files, &options),
    };
    // Files that could not be read as text, and skipped kustomize patches, report among
    // the others in file order.
    let mut resort = !inputs.diags.items.is_empty();
    comp.diags.extend(inputs.diags);
    // The target's deprecation, once: not again when the inputs said it (`mode: ipvs`).
    if let Some(d) = deprecated.map(|f| f()) {
        if !comp.diags.items.iter().any(|x| x.code == d.code) {
            comp.diags.push(d);
            resort = true;
        }
    }
    resort |= suppress(&mut comp.diags, &sources, &inputs.files, config.as_ref());
    if resort {
        comp.diags.sort(&sources);
    }
    Compiled {
        sources,
        comp,
        files: inputs.files,
        params,
    }
}

/// The inputs' layout ([`svc_compiler::layout`]): the kustomization roots, the clusters
/// the config file names (`clusters:`, globs relative to its directory), the plain files.
fn layout(
    inputs: &Inputs,
    sources: &SourceMap,
    config: Option<&Config>,
    plain: svc_compiler::layout::Plain,
) -> svc_compiler::layout::Layout {
    let configured: Vec<svc_compiler::layout::Configured> = config
        .map_or(&[][..], |c| &c.project.clusters[..])
        .iter()
        .map(|(name, globs)| svc_compiler::layout::Configured {
            name: name.v.clone(),
            files: inputs
                .files
                .iter()
                .copied()
                .filter(|&f| {
                    let name = sources.name(f);
                    let rel = config.map_or_else(|| name.to_string(), |c| c.relative(name));
                    globs.iter().any(|g| glob_matches(&g.v, &rel))
                })
                .collect(),
        })
        .collect();
    let mut layout =
        svc_compiler::layout::layout(&inputs.paths, &inputs.kustomizations, &configured, plain);
    // A kustomization root by its directory relative to the working directory (a plain
    // file's cluster is not named in messages).
    if let Ok(cwd) = std::env::current_dir() {
        for c in &mut layout.clusters {
            if c.origin == svc_compiler::layout::Origin::Kustomization {
                let rel = crate::inputs::relative_to(&cwd, &c.name);
                c.name = if rel.is_empty() { ".".into() } else { rel };
            }
        }
    }
    layout
}

/// The node views a command asks for, as (node, family) pairs: `--node`, or every Node
/// manifest with `--all-nodes`; `--family`, or else every family of the service CIDRs
/// (`every_family`) or only the primary one.
pub(crate) fn node_jobs(
    sel: &Nodes,
    comp: &svc_compiler::Compilation,
    every_family: bool,
) -> Vec<(NodeSelection, IpFamily)> {
    let nodes: Vec<NodeSelection> = if sel.all_nodes {
        comp.module
            .nodes
            .iter()
            .map(|n| NodeSelection {
                name: n.name.clone(),
                ips: vec![],
            })
            .collect()
    } else {
        sel.node
            .iter()
            .map(|n| NodeSelection {
                name: n.clone(),
                ips: sel.node_ips.clone(),
            })
            .collect()
    };
    let families: Vec<IpFamily> = match sel.family {
        Some(f) => vec![f],
        None => comp
            .settings
            .service_cidrs
            .iter()
            .map(|c| c.family())
            .take(if every_family { usize::MAX } else { 1 })
            .collect(),
    };
    nodes
        .into_iter()
        .flat_map(|sel| families.iter().map(move |f| (sel.clone(), *f)))
        .collect()
}

/// [`target_params`] for a command that compiles nothing (`apply --from`, `--rollback`).
pub(crate) fn target_params_of(target: &TargetArgs) -> Result<Params, Fail> {
    target_params(target, &mut SourceMap::default())
}

/// The target's own flags, with the files they name read and added to `sources` (so that
/// a diagnostic of the target can point into them).
fn target_params(target: &TargetArgs, sources: &mut SourceMap) -> Result<Params, Fail> {
    let mut params = Params::default();
    for flag in target.target.flags {
        for v in target.params.all(flag.name) {
            if flag.file {
                let text = read_file(Path::new(v))?;
                let id = sources.add(v.clone(), text.clone());
                params.push_file(flag.name, v.clone(), id, text);
            } else {
                params.push(flag.name, v.clone());
            }
        }
    }
    Ok(params)
}
