//! The config file, `.svc-compile.yaml` (`svc_compiler::project` parses it): found as
//! ruff finds its own, read, and merged under the flags.
//!
//! Discovery: `--config FILE`, else the first `.svc-compile.yaml` in the working directory
//! or a directory above it, up to the file system's root (ruff's rule: a `.git` directory
//! does not stop the search); `--no-config` reads none. Globs in a found file
//! (`exclude`, `include`, `per-path-ignores`) are relative to the file's directory; in a
//! file named by `--config`, to the working directory (ruff's rule too).
//!
//! A config file with errors is a usage error: its diagnostics are printed (located in it)
//! and the command exits 2 before reading anything else.

use crate::cli::{CompileOpts, ConfigChoice};
use crate::report::{Emitter, Fail};
use std::path::{Path, PathBuf};
use svc_compiler::project::{self, Project};
use svc_compiler::source::{FileId, SourceMap};

/// A config file read and parsed.
#[derive(Clone)]
pub(crate) struct Config {
    /// Its name as diagnostics show it (relative to the working directory when it is
    /// there or above).
    pub name: String,
    pub text: String,
    pub project: Project,
    /// What its globs are relative to.
    pub base: PathBuf,
}

/// The config file `choice` names or finds, parsed; `None` without one. Errors in it are
/// printed (text on stderr, coloured as `color` says) and fail the command.
pub(crate) fn load(choice: &ConfigChoice, color: Option<bool>) -> Result<Option<Config>, Fail> {
    let cwd = std::env::current_dir()
        .map_err(|e| Fail(format!("cannot read the working directory: {e}")))?;
    let (path, name, base) = match choice {
        ConfigChoice::Off => return Ok(None),
        ConfigChoice::File(f) => (PathBuf::from(f), f.clone(), cwd.clone()),
        ConfigChoice::Find => match find(&cwd) {
            Some((path, ups)) => {
                let name = format!("{}{}", "../".repeat(ups), project::FILE_NAME);
                let base = path.parent().expect("a file in a directory").to_path_buf();
                (path, name, base)
            }
            None => return Ok(None),
        },
    };
    let text = crate::inputs::read_file(&path)?;
    let mut sources = SourceMap::default();
    let id = sources.add(name.clone(), text.clone());
    let (project, diags) = project::parse(id, &text, &|c| crate::report::code_info(c).is_some());
    if let Some(first) = diags.items.first() {
        Emitter::text(color).diagnostics(&diags, &sources);
        let at = first.span.map_or(name.clone(), |s| sources.location(s));
        return Err(Fail(format!(
            "{at}: {} (the config file has {} error(s): fix them, or run with --no-config)",
            first.message,
            diags.count(svc_compiler::diag::Severity::Error)
        )));
    }
    Ok(Some(Config {
        name,
        text,
        project,
        base,
    }))
}

/// The nearest `.svc-compile.yaml` at or above `dir`, and how many directories up.
fn find(dir: &Path) -> Option<(PathBuf, usize)> {
    dir.ancestors()
        .enumerate()
        .map(|(ups, d)| (d.join(project::FILE_NAME), ups))
        .find(|(p, _)| p.is_file())
}

impl Config {
    /// Adds the file to the run's sources (for SVC022's locations) and moves the spans of
    /// its settings there.
    pub fn add_to(&mut self, sources: &mut SourceMap) -> FileId {
        let id = sources.add(self.name.clone(), self.text.clone());
        self.project.relocate(id);
        id
    }

    /// `path` (a name as an input's) as the config's globs see it: relative to the config
    /// file's directory when it lies below it, else as given.
    pub fn relative(&self, path: &str) -> String {
        crate::inputs::relative_to(&self.base, path)
    }
}

/// The flags, with what they leave unsaid taken from the config file: flags win, then
/// the file, then (in the compiler) a ClusterConfig document among the manifests, then
/// the defaults. `--exclude`/`--include` given on the command line replace the file's.
pub(crate) fn merge(opts: &CompileOpts, config: Option<&Config>) -> CompileOpts {
    let mut o = opts.clone();
    let Some(p) = config.map(|c| &c.project) else {
        return o;
    };
    o.service_cidrs = o.service_cidrs.or_else(|| p.service_cidrs.clone());
    o.node_port_range = o.node_port_range.or(p.node_port_range);
    o.cluster_domain = o.cluster_domain.or_else(|| p.cluster_domain.clone());
    o.random_fully = o.random_fully.or(p.random_fully);
    o.nfacct = o.nfacct.or(p.nfacct);
    o.nft_layout = o.nft_layout.or(p.nft_layout);
    o.topology_keys = o.topology_keys.or(p.topology_keys);
    o.validate = o.validate.or(p.validate);
    o
}
