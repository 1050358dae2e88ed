//! Input discovery: which files a run reads, and their text.
//!
//! Invariants: every real directory is walked once (a symlink loop or a second link to a
//! walked directory adds nothing), and every real file is read once, under the first of its
//! names in name order. Files are added to the source map in name order whatever the order
//! of the arguments, so even "first defined here" does not depend on how the command was
//! typed. A file that is not text is a located diagnostic for that file; the others are
//! still read.

use crate::report::Fail;
use std::collections::HashSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use svc_compiler::diag::Diagnostics;
use svc_compiler::source::{FileId, SourceMap};
use svc_node::agent::files::{FileCache, Looked, Stamp};

/// `--exclude GLOB` / `--include GLOB` as given, or the config file's `exclude` and
/// `include`, whose globs are relative to a directory (`base`).
#[derive(Debug, Default)]
pub struct Filters<'a> {
    pub exclude: Globs<'a>,
    pub include: Globs<'a>,
}

/// Globs, and the directory paths are made relative to before they are matched (`None`:
/// paths as given).
#[derive(Debug, Default, Clone, Copy)]
pub struct Globs<'a> {
    pub globs: &'a [String],
    pub base: Option<&'a Path>,
}

impl Globs<'_> {
    fn any(&self, path: &str) -> bool {
        if self.globs.is_empty() {
            return false;
        }
        let path = match self.base {
            Some(b) => relative_to(b, path),
            None => path.to_string(),
        };
        self.globs.iter().any(|g| glob_matches(g, &path))
    }
}

impl Filters<'_> {
    /// Excluded: a directory is not walked, a file is not read.
    pub(crate) fn excluded(&self, path: &str) -> bool {
        self.exclude.any(path)
    }
    /// Without `--include`, every file with a manifest extension is read; with it, only
    /// the files one of its globs matches.
    pub(crate) fn included(&self, path: &str) -> bool {
        self.include.globs.is_empty() || self.include.any(path)
    }
}

/// `path` relative to the directory `base` when it lies below it, else as given; `..`
/// taken away as written (a path is not resolved: it may name a revision's file).
pub(crate) fn relative_to(base: &Path, path: &str) -> String {
    let Ok(abs) = std::path::absolute(path) else {
        return path.to_string();
    };
    let mut clean = PathBuf::new();
    for c in abs.components() {
        match c {
            std::path::Component::ParentDir => {
                clean.pop();
            }
            c => clean.push(c),
        }
    }
    clean
        .strip_prefix(base)
        .map(|r| r.display().to_string())
        .unwrap_or_else(|_| path.to_string())
}

/// The files to compile, and the diagnostics of files that could not be read as text.
pub struct Inputs {
    pub files: Vec<FileId>,
    pub diags: Diagnostics,
    /// Each file's absolute path, normalised as written (not standard input).
    pub paths: Vec<(FileId, String)>,
    /// The kustomizations among the inputs and in their directories and above, by
    /// absolute path: [`svc_compiler::layout`] makes clusters of them.
    pub kustomizations: Vec<(String, svc_compiler::kustomize::Kustomization)>,
}

/// Files, directories (recursive, *.yaml/*.yml/*.json, hidden entries skipped) and `-`.
/// With the agent's `cache`, a file whose `stat` shows no change since the last call is
/// taken from it (text and fingerprint), not read.
pub fn read_inputs(
    paths: &[String],
    filters: &Filters,
    sources: &mut SourceMap,
    mut cache: Option<&mut FileCache>,
) -> Result<Inputs, Fail> {
    let mut found: Vec<(String, PathBuf)> = Vec::new();
    let mut stdin: Option<Vec<u8>> = None;
    let mut walked: HashSet<PathBuf> = HashSet::new();
    for p in paths {
        if p == "-" {
            let mut bytes = Vec::new();
            // One byte more than the limit tells a stream over it from one at it.
            std::io::stdin()
                .take(MAX_INPUT_BYTES + 1)
                .read_to_end(&mut bytes)
                .map_err(|e| Fail(format!("cannot read standard input: {e}")))?;
            if bytes.len() as u64 > MAX_INPUT_BYTES {
                return Err(too_large("standard input", None));
            }
            stdin = Some(bytes);
            continue;
        }
        let path = Path::new(p);
        let meta = std::fs::metadata(path)
            .map_err(|e| Fail(format!("cannot read {p}: {e}; check the path")))?;
        // Filters apply to files named on the command line too: a pre-commit hook passes
        // every changed file.
        if filters.excluded(p) || (!meta.is_dir() && !filters.included(p)) {
            continue;
        }
        if meta.is_dir() {
            walk(path, filters, &mut walked, &mut found)?;
        } else {
            found.push((p.clone(), path.to_path_buf()));
        }
    }
    found.sort();
    let kustomizations = kustomizations(&found);
    let patches = kustomize_patches(&kustomizations);
    let mut seen: HashSet<PathBuf> = HashSet::new();
    let mut files: Vec<(String, Got)> = Vec::new();
    let mut skipped: Vec<(String, Vec<u8>, String)> = Vec::new();
    let mut helm: Vec<(String, Vec<u8>, Option<String>)> = Vec::new();
    let mut total = stdin.as_ref().map_or(0, |b| b.len() as u64);
    let read_bytes = |name: &str, path: &Path, total: &mut u64| -> Result<Vec<u8>, Fail> {
        let bytes = read_capped(name, path, MAX_INPUT_BYTES - *total)?;
        *total += bytes.len() as u64;
        Ok(bytes)
    };
    for (name, path) in found {
        // A file reached by two names (a symlink, or named twice) is one file.
        let real = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
        if !seen.insert(real.clone()) {
            continue;
        }
        if let Some((_, by)) = patches.iter().find(|(p, _)| *p == real) {
            skipped.push((
                name.clone(),
                read_bytes(&name, &path, &mut total)?,
                by.clone(),
            ));
            continue;
        }
        let looked = match cache.as_deref_mut() {
            None => None,
            Some(c) => Some(
                c.look(&real)
                    .map_err(|e| Fail(format!("cannot read {}: {e}", path.display())))?,
            ),
        };
        let got = match looked {
            Some(Looked::Same(text, print)) => {
                let size = text.len() as u64;
                if size > MAX_INPUT_BYTES - total {
                    return Err(too_large(&name, Some(size)));
                }
                total += size;
                Got::Kept(text, print)
            }
            Some(Looked::Read(stamp)) => {
                Got::Read(read_bytes(&name, &path, &mut total)?, Some((real, stamp)))
            }
            None => Got::Read(read_bytes(&name, &path, &mut total)?, None),
        };
        // A Helm chart's template (a Chart.yaml may come or go beside an unchanged file).
        let text = match &got {
            Got::Kept(text, _) => text.as_bytes(),
            Got::Read(bytes, _) => bytes,
        };
        match helm_chart(&path, text) {
            Some(chart) => helm.push((name.clone(), text.to_vec(), chart)),
            None => files.push((name.clone(), got)),
        }
    }
    if let Some(bytes) = stdin {
        files.push(("<stdin>".into(), Got::Read(bytes, None)));
    }
    files.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = Inputs {
        files: Vec::with_capacity(files.len()),
        diags: Diagnostics::default(),
        paths: Vec::with_capacity(files.len()),
        kustomizations: kustomizations
            .into_iter()
            .map(|k| (k.path, k.read))
            .collect(),
    };
    for (name, got) in files {
        let abs = (name != "<stdin>").then(|| absolute(Path::new(&name)));
        let id = match got {
            Got::Kept(text, print) => sources.add_shared(name, text, print),
            Got::Read(bytes, stamp) => match sources.add_bytes(name, bytes) {
                (id, None) => {
                    // Text: kept for the next call, with the fingerprint every user of
                    // this source map takes (computed here, once).
                    if let (Some(c), Some((real, stamp))) = (cache.as_deref_mut(), stamp) {
                        c.keep(
                            &real,
                            stamp,
                            sources.file(id).text.clone(),
                            sources.print(id),
                        );
                    }
                    id
                }
                (_, Some(d)) => {
                    out.diags.push(d);
                    continue;
                }
            },
        };
        out.files.push(id);
        out.paths.extend(abs.map(|a| (id, a)));
    }
    // Patches are in the source map (for the note's location) but are not compiled.
    for (name, bytes, by) in skipped {
        let (id, _) = sources.add_bytes(name, bytes);
        out.diags.push(svc_compiler::kustomize::patch_note(id, &by));
    }
    // So are a Helm chart's templates.
    for (name, bytes, chart) in helm {
        let (id, _) = sources.add_bytes(name, bytes);
        out.diags
            .push(svc_compiler::layout::helm_note(id, chart.as_deref()));
    }
    Ok(out)
}

/// An input file: read now (with the stamp to keep it in the agent's cache with), or
/// the cache's text and fingerprint.
enum Got {
    Read(Vec<u8>, Option<(PathBuf, Stamp)>),
    Kept(Arc<String>, (u64, u64)),
}

/// A path made absolute and normalised as written (`.` and `..` taken away, no symlink
/// resolved), `/`-separated: how [`svc_compiler::layout`] compares paths.
fn absolute(p: &Path) -> String {
    let abs = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    svc_compiler::layout::join("/", &abs.display().to_string())
}

/// Whether the file at `path` is a Helm chart's template, which `helm template` renders
/// before anything is applied: a file under a `templates/` directory, with `{{` in it
/// (Helm's actions), or beside a `Chart.yaml` one level up. Returns the chart's
/// `Chart.yaml` where there is one.
fn helm_chart(path: &Path, bytes: &[u8]) -> Option<Option<String>> {
    let templates = path
        .ancestors()
        .skip(1)
        .find(|d| d.file_name().is_some_and(|n| n == "templates"))?;
    let chart = templates
        .parent()
        .map(|c| c.join("Chart.yaml"))
        .filter(|c| c.is_file());
    let actions = bytes.windows(2).any(|w| w == b"{{");
    (actions || chart.is_some()).then(|| chart.map(|c| c.display().to_string()))
}

/// The kustomizations among `found`, and those in their directories and above, each
/// read (by absolute path). A kustomization that cannot be read says nothing (it is
/// reported when it is read as an input).
fn kustomizations(found: &[(String, PathBuf)]) -> Vec<Kustomization> {
    let mut out = Vec::new();
    // The kustomizations among the inputs, and those in their directories and above (up to
    // the repository's root: a directory with `.git`): a pre-commit hook passes a changed
    // patch alone, without the kustomization that makes it one.
    let mut kustomizations: Vec<(String, PathBuf)> = found.to_vec();
    let mut dirs: HashSet<PathBuf> = HashSet::new();
    for (_, path) in found {
        // Absolute without touching the file system (each file is canonicalised once,
        // later); the patch paths themselves are compared canonical.
        let mut dir = std::path::absolute(path)
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf));
        while let Some(d) = dir {
            if !dirs.insert(d.clone()) {
                break;
            }
            for f in svc_compiler::kustomize::FILE_NAMES {
                let k = d.join(f);
                if k.is_file() {
                    kustomizations.push((k.display().to_string(), k));
                }
            }
            if d.join(".git").exists() {
                break;
            }
            dir = d.parent().map(Path::to_path_buf);
        }
    }
    let mut seen: HashSet<String> = HashSet::new();
    for (name, path) in &kustomizations {
        let is_kustomization = path
            .file_name()
            .and_then(|f| f.to_str())
            .is_some_and(|f| svc_compiler::kustomize::FILE_NAMES.contains(&f));
        let Some(text) = is_kustomization
            .then(|| std::fs::read_to_string(path).ok())
            .flatten()
        else {
            continue;
        };
        let abs = absolute(path);
        if seen.insert(abs.clone()) {
            out.push(Kustomization {
                path: abs,
                name: name.clone(),
                read: svc_compiler::kustomize::parse(&text),
            });
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// A kustomization found: its absolute path, its name as found, what it says.
struct Kustomization {
    path: String,
    name: String,
    read: svc_compiler::kustomize::Kustomization,
}

/// The real paths of the files that `kustomizations` name as patches, each with the
/// kustomization that names it.
fn kustomize_patches(kustomizations: &[Kustomization]) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    for k in kustomizations {
        let dir = Path::new(&k.path).parent().unwrap_or(Path::new("/"));
        for p in &k.read.patches {
            if let Ok(real) = std::fs::canonicalize(dir.join(p)) {
                out.push((real, k.name.clone()));
            }
        }
    }
    out
}

/// A file a flag names (a lock file, a template), as text; as large as all inputs at most.
pub(crate) fn read_file(p: &Path) -> Result<String, Fail> {
    let bytes = read_capped(&p.display().to_string(), p, MAX_INPUT_BYTES)?;
    String::from_utf8(bytes).map_err(|_| {
        Fail(format!(
            "cannot read {}: stream did not contain valid UTF-8",
            p.display()
        ))
    })
}

/// The most input one run reads, all files (and standard input) together. Checked before
/// a file is read, so a 1 GB file costs nothing; memory grows with the input (about 12
/// times its size for a real cluster, docs/input.md "Limits"), so this bounds it too. A cluster
/// at Kubernetes' tested limits (10k services) is 22 MB of YAML, 56 MB of JSON.
pub const MAX_INPUT_BYTES: u64 = 256 << 20;

fn too_large(name: &str, size: Option<u64>) -> Fail {
    let size = size.map_or(String::new(), |s| format!(" ({s} bytes)"));
    Fail(format!(
        "{name}{size}: the inputs exceed {} MiB together, svc-compile's limit; not read",
        MAX_INPUT_BYTES >> 20
    ))
}

/// A file's bytes, refused (before reading, by its size) when more than `room` of them.
fn read_capped(name: &str, p: &Path, room: u64) -> Result<Vec<u8>, Fail> {
    let fail = |e: std::io::Error| Fail(format!("cannot read {}: {e}", p.display()));
    let file = std::fs::File::open(p).map_err(fail)?;
    let size = file.metadata().map_err(fail)?.len();
    if size > room {
        return Err(too_large(name, Some(size)));
    }
    // A file that grows while it is read (or a device) stops at the limit all the same.
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(room + 1).read_to_end(&mut bytes).map_err(fail)?;
    if bytes.len() as u64 > room {
        return Err(too_large(name, None));
    }
    Ok(bytes)
}

fn walk(
    dir: &Path,
    filters: &Filters,
    walked: &mut HashSet<PathBuf>,
    out: &mut Vec<(String, PathBuf)>,
) -> Result<(), Fail> {
    let real = std::fs::canonicalize(dir)
        .map_err(|e| Fail(format!("cannot read directory {}: {e}", dir.display())))?;
    if !walked.insert(real) {
        return Ok(());
    }
    let rd = std::fs::read_dir(dir)
        .map_err(|e| Fail(format!("cannot read directory {}: {e}", dir.display())))?;
    for entry in rd {
        let entry =
            entry.map_err(|e| Fail(format!("cannot read directory {}: {e}", dir.display())))?;
        let p = entry.path();
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let name = p.display().to_string();
        if filters.excluded(&name) {
            continue;
        }
        if p.is_dir() {
            walk(&p, filters, walked, out)?;
        } else if matches!(
            p.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml" | "json")
        ) && filters.included(&name)
        {
            out.push((name, p));
        }
    }
    Ok(())
}

/// Does `glob` match `path`, or a trailing part of it that starts at a `/`? So
/// `Chart.yaml`, `templates/**` and `**/values*.yaml` match wherever they sit, and
/// `./deploy/*.json` matches from the start. `*` and `?` stay inside one path component;
/// `**` spans components.
pub fn glob_matches(glob: &str, path: &str) -> bool {
    let glob = glob.strip_prefix("./").unwrap_or(glob);
    let path = path.strip_prefix("./").unwrap_or(path);
    let g: Vec<char> = glob.chars().collect();
    if matches_at(&g, &path.chars().collect::<Vec<_>>()) {
        return true;
    }
    path.match_indices('/')
        .any(|(i, _)| matches_at(&g, &path[i + 1..].chars().collect::<Vec<_>>()))
}

fn matches_at(g: &[char], p: &[char]) -> bool {
    match g.first() {
        None => p.is_empty(),
        Some('*') if g.get(1) == Some(&'*') => {
            // `**/` also matches no directory at all.
            let rest = &g[2..];
            let after_slash = rest.strip_prefix(&['/']).unwrap_or(rest);
            (0..=p.len()).any(|i| matches_at(rest, &p[i..]) || matches_at(after_slash, &p[i..]))
        }
        Some('*') => (0..=p.len())
            .take_while(|&i| i == 0 || p[i - 1] != '/')
            .any(|i| matches_at(&g[1..], &p[i..])),
        Some('?') => p.first().is_some_and(|&c| c != '/') && matches_at(&g[1..], &p[1..]),
        Some(&c) => p.first() == Some(&c) && matches_at(&g[1..], &p[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::glob_matches;

    #[test]
    fn globs() {
        for (glob, path, want) in [
            ("Chart.yaml", "charts/web/Chart.yaml", true),
            ("Chart.yaml", "charts/web/NotChart.yaml", false),
            ("values*.yaml", "web/values-prod.yaml", true),
            ("templates/**", "charts/web/templates/svc.yaml", true),
            ("templates/**", "charts/web/templates/a/b.yaml", true),
            ("templates", "charts/web/templates", true),
            ("**/kustomization.yaml", "kustomization.yaml", true),
            ("**/kustomization.yaml", "a/b/kustomization.yaml", true),
            ("*.json", "dash/board.json", true),
            ("dash/*.json", "./dash/board.json", true),
            ("dash/*.json", "dash/x/board.json", false),
            ("dash/?.json", "dash/b.json", true),
            ("*", "a/b", true),
            ("a*", "b/c", false),
        ] {
            assert_eq!(glob_matches(glob, path), want, "{glob} on {path}");
        }
    }
}
