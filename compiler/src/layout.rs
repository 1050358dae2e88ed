//! Which input files are one cluster: what a repository's layout says about the files that
//! are applied together, and the names kustomize gives their objects there.
//!
//! A repository is rarely one cluster. It holds kustomize bases and the overlays built from
//! them, install variants side by side (`install.yaml`, `namespace-install.yaml`,
//! `ha/install.yaml`), examples and test fixtures. The cross-object rules (an object
//! defined twice, a cluster IP or node port written on two Services, an EndpointSlice
//! naming a Service that is not there) only make sense among the objects of one cluster,
//! under the names they get there. A [`Layout`] says, per file, which clusters it is in
//! and under which [`Transform`]:
//!
//! - each kustomization root (a kustomization no other one in the inputs names as a
//!   resource, base or component) is a cluster: the files its resources reach, directly or
//!   through other kustomizations, each with the `namespace`, `namePrefix` and `nameSuffix`
//!   kustomize gives it on the way (a base used by two overlays is in both, named twice);
//! - each cluster of the config file (`clusters:`) is one: the files its globs match;
//! - the other files (plain manifests) are one cluster each ([`Plain::EachFile`], for
//!   `check`: a repository keeps variants and examples side by side, each applied alone) or
//!   one together ([`Plain::Together`], for `compile`, which builds one cluster).
//!
//! Pure: the CLI finds and reads the kustomizations, and says which files a glob matches.
//!
//! Invariant: the default layout (no kustomization, no configured cluster, plain files
//! together) puts every file in one cluster under its own names, so a caller that knows
//! nothing of layouts gets the rules as they were.

use crate::diag::Diagnostic;
use crate::kustomize::Kustomization;
use crate::source::{FileId, Span};
use std::collections::{BTreeMap, HashMap, HashSet};

/// What kustomize does to the identity of the objects of a file on its way to a root:
/// `namePrefix` and `nameSuffix` around every name, `namespace` set on every namespaced
/// object (the outermost kustomization that sets one wins).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Transform {
    pub namespace: Option<String>,
    pub prefix: String,
    pub suffix: String,
}

impl Transform {
    pub fn is_identity(&self) -> bool {
        self.namespace.is_none() && self.prefix.is_empty() && self.suffix.is_empty()
    }

    /// A name as kustomize writes it.
    pub fn name(&self, name: &str) -> String {
        format!("{}{name}{}", self.prefix, self.suffix)
    }

    /// A namespaced object's namespace as kustomize writes it.
    pub fn namespace<'a>(&'a self, ns: &'a str) -> &'a str {
        self.namespace.as_deref().unwrap_or(ns)
    }
}

/// Where the plain files (those no kustomization root or configured cluster takes) go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Plain {
    /// One cluster of them all (`compile`).
    #[default]
    Together,
    /// A cluster per file (`check`): files that define the same object are alternatives.
    EachFile,
}

/// One cluster: its name (a kustomization root's directory, a configured cluster's name,
/// a plain file's name, or `plain files`) and where it comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cluster {
    pub name: String,
    pub origin: Origin,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    Kustomization,
    Configured,
    Plain,
}

/// Per file, the clusters it is in (indices into `clusters`) with its transform there.
/// A file not listed is in cluster 0 under its own names.
#[derive(Clone, Debug, Default)]
pub struct Layout {
    pub clusters: Vec<Cluster>,
    files: HashMap<FileId, Vec<(u32, Transform)>>,
}

/// The identity transform, lent to files without an entry.
static IDENTITY: [(u32, Transform); 1] = [(
    0,
    Transform {
        namespace: None,
        prefix: String::new(),
        suffix: String::new(),
    },
)];

impl Layout {
    /// The clusters `file` is in, each with the transform its objects get there.
    pub fn of(&self, file: FileId) -> &[(u32, Transform)] {
        self.files.get(&file).map_or(&IDENTITY[..], Vec::as_slice)
    }

    /// Every cluster holds every file, each object under its own name (the default).
    pub fn is_trivial(&self) -> bool {
        self.clusters.len() <= 1
            && self
                .files
                .values()
                .all(|m| m.iter().all(|(_, t)| t.is_identity()))
    }

    /// The cluster in which the objects of cluster `c` look for the objects they name (a
    /// slice its Service): plain files look among all plain files, since a Service and its
    /// Endpoints in sibling files is the usual way to write them.
    pub fn related(&self, c: u32) -> u32 {
        match self.clusters.get(c as usize) {
            Some(cl) if cl.origin == Origin::Plain => u32::MAX,
            _ => c,
        }
    }

    /// The files of cluster `c`, each with its transform, in file order.
    pub fn files_of(&self, c: u32) -> Vec<(FileId, &Transform)> {
        let mut out: Vec<(FileId, &Transform)> = self
            .files
            .iter()
            .flat_map(|(f, m)| m.iter().filter(|(i, _)| *i == c).map(move |(_, t)| (*f, t)))
            .collect();
        out.sort_by_key(|(f, _)| *f);
        out
    }
}

/// A cluster the config file names: its name and the files its globs matched.
#[derive(Clone, Debug)]
pub struct Configured {
    pub name: String,
    pub files: Vec<FileId>,
}

/// The layout of `inputs`. `paths` gives each input's absolute, normalised path;
/// `kustomizations` every kustomization found (among the inputs and in their directories
/// and above), by its absolute path. Entries of `resources`, `bases` and `components` are
/// paths relative to the kustomization's directory: a file (one of the inputs) or a
/// directory holding a kustomization. Remote resources and files that are not inputs are
/// not followed.
pub fn layout(
    inputs: &[(FileId, String)],
    kustomizations: &[(String, Kustomization)],
    configured: &[Configured],
    plain: Plain,
) -> Layout {
    let by_path: HashMap<&str, FileId> = inputs.iter().map(|(f, p)| (p.as_str(), *f)).collect();
    let kust_by_dir: BTreeMap<String, &Kustomization> = kustomizations
        .iter()
        .map(|(p, k)| (parent(p).to_string(), k))
        .collect();
    // Edges: a kustomization's directory → the directories of the kustomizations it names,
    // and the input files it names.
    let mut referenced: HashSet<&str> = HashSet::new();
    for (dir, k) in &kust_by_dir {
        for r in k.resources.iter() {
            let p = join(dir, r);
            if let Some((d, _)) = kust_by_dir.get_key_value(p.as_str()) {
                if d != dir {
                    referenced.insert(d.as_str());
                }
            }
        }
    }
    let mut out = Layout::default();
    // The files configured clusters take.
    let mut taken: HashSet<FileId> = HashSet::new();
    let add = |out: &mut Layout, f: FileId, c: u32, t: Transform| {
        let m = out.files.entry(f).or_default();
        if !m.iter().any(|(i, old)| *i == c && *old == t) {
            m.push((c, t));
        }
    };
    for c in configured {
        let idx = out.clusters.len() as u32;
        out.clusters.push(Cluster {
            name: c.name.clone(),
            origin: Origin::Configured,
        });
        for &f in &c.files {
            add(&mut out, f, idx, Transform::default());
            taken.insert(f);
        }
    }
    for (dir, _) in kust_by_dir
        .iter()
        .filter(|(d, _)| !referenced.contains(d.as_str()))
    {
        let mut members: Vec<(FileId, Transform)> = Vec::new();
        let mut stack: Vec<String> = Vec::new();
        reach(
            dir,
            &Transform::default(),
            &kust_by_dir,
            &by_path,
            &mut stack,
            &mut members,
        );
        // A file a configured cluster takes is in no other; a kustomization left without
        // files (all taken, or none among the inputs) is no cluster.
        members.retain(|(f, _)| !taken.contains(f));
        if members.is_empty() {
            continue;
        }
        let idx = out.clusters.len() as u32;
        out.clusters.push(Cluster {
            name: dir.clone(),
            origin: Origin::Kustomization,
        });
        for (f, t) in members {
            add(&mut out, f, idx, t);
        }
    }
    taken.extend(out.files.keys().copied());
    let rest: Vec<&(FileId, String)> = inputs.iter().filter(|(f, _)| !taken.contains(f)).collect();
    match plain {
        Plain::Together if !rest.is_empty() => {
            let idx = out.clusters.len() as u32;
            out.clusters.push(Cluster {
                name: "plain files".into(),
                origin: Origin::Plain,
            });
            for (f, _) in rest {
                add(&mut out, *f, idx, Transform::default());
            }
        }
        Plain::Together => {}
        Plain::EachFile => {
            for (f, p) in rest {
                let idx = out.clusters.len() as u32;
                out.clusters.push(Cluster {
                    name: p.clone(),
                    origin: Origin::Plain,
                });
                add(&mut out, *f, idx, Transform::default());
            }
        }
    }
    out
}

/// The files kustomization `dir` reaches, each with its transform at the root; `stack`
/// holds the kustomizations on the way (a cycle, which kustomize refuses, ends there).
fn reach(
    dir: &str,
    inner: &Transform,
    kusts: &BTreeMap<String, &Kustomization>,
    files: &HashMap<&str, FileId>,
    stack: &mut Vec<String>,
    out: &mut Vec<(FileId, Transform)>,
) {
    // `inner` is what the root and the kustomizations between do; this kustomization's
    // own fields apply first, so its prefix is nearest the name and an outer namespace
    // overrides its own.
    let Some(k) = kusts.get(dir) else { return };
    if stack.iter().any(|d| d == dir) {
        return;
    }
    stack.push(dir.to_string());
    let t = Transform {
        namespace: inner.namespace.clone().or_else(|| k.namespace.clone()),
        prefix: format!("{}{}", inner.prefix, k.name_prefix),
        suffix: format!("{}{}", k.name_suffix, inner.suffix),
    };
    for r in &k.resources {
        let p = join(dir, r);
        if let Some(&f) = files.get(p.as_str()) {
            out.push((f, t.clone()));
        } else if kusts.contains_key(p.as_str()) {
            reach(&p, &t, kusts, files, stack, out);
        }
    }
    stack.pop();
}

/// The note for a Helm chart's template, which was not read: what it becomes is what
/// `helm template` renders from it.
pub fn helm_note(file: FileId, chart: Option<&str>) -> Diagnostic {
    let of = chart.map_or(String::new(), |c| format!(" (chart {c})"));
    Diagnostic::note(
        "SVC024",
        format!("skipped a Helm chart's template{of}: Helm renders it before it is applied"),
    )
    .at(Span::new(file, 1, 1, 1))
    .hint("check what `helm template` renders: `helm template CHART | svc-compile check -`")
}

/// The directory part of a `/`-separated path.
fn parent(p: &str) -> &str {
    match p.rfind('/') {
        Some(0) => "/",
        Some(i) => &p[..i],
        None => ".",
    }
}

/// `rel` (a kustomization's entry) joined to `dir` and normalised as written (`.` and
/// `..` taken away, a trailing `/` dropped); an absolute or remote entry as it is.
pub fn join(dir: &str, rel: &str) -> String {
    let whole = if rel.starts_with('/') {
        rel.to_string()
    } else {
        format!("{dir}/{rel}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for c in whole.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    if whole.starts_with('/') {
        format!("/{}", parts.join("/"))
    } else {
        parts.join("/")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kustomize::parse;

    fn ids(l: &Layout, f: u32) -> Vec<(String, String, String)> {
        l.of(FileId(f))
            .iter()
            .map(|(c, t)| {
                (
                    l.clusters[*c as usize].name.clone(),
                    t.namespace.clone().unwrap_or_default(),
                    t.name("x"),
                )
            })
            .collect()
    }

    #[test]
    fn overlays_are_clusters_and_name_their_bases() {
        let inputs = [
            (FileId(0), "/r/base/svc.yaml".to_string()),
            (FileId(1), "/r/overlays/prod/extra.yaml".to_string()),
            (FileId(2), "/r/install.yaml".to_string()),
            (FileId(3), "/r/namespace-install.yaml".to_string()),
            (FileId(4), "/r/base/unlisted.yaml".to_string()),
        ];
        let k = [
            ("/r/base/kustomization.yaml".to_string(), parse("resources: [svc.yaml]\nnamePrefix: b-\n")),
            (
                "/r/overlays/prod/kustomization.yaml".to_string(),
                parse("resources: [../../base, extra.yaml]\nnamespace: prod\nnamePrefix: p-\nnameSuffix: -1\n"),
            ),
            (
                "/r/overlays/dev/kustomization.yaml".to_string(),
                parse("bases: [../../base/]\nnamespace: dev\n"),
            ),
        ];
        let l = layout(&inputs, &k, &[], Plain::EachFile);
        let mut base = ids(&l, 0);
        base.sort();
        assert_eq!(
            base,
            [
                ("/r/overlays/dev".into(), "dev".into(), "b-x".into()),
                ("/r/overlays/prod".into(), "prod".into(), "p-b-x-1".into()),
            ]
        );
        assert_eq!(
            ids(&l, 1),
            [("/r/overlays/prod".into(), "prod".into(), "p-x-1".into())]
        );
        // Install variants side by side, and a file no kustomization lists: each alone.
        assert_eq!(
            ids(&l, 2),
            [("/r/install.yaml".into(), String::new(), "x".into())]
        );
        assert_eq!(
            ids(&l, 4),
            [("/r/base/unlisted.yaml".into(), String::new(), "x".into())]
        );
        let together = layout(&inputs, &k, &[], Plain::Together);
        assert_eq!(together.of(FileId(2))[0].0, together.of(FileId(3))[0].0);
    }

    #[test]
    fn a_cycle_ends() {
        let inputs = [(FileId(0), "/a/s.yaml".to_string())];
        let k = [
            (
                "/a/kustomization.yaml".to_string(),
                parse("resources: [s.yaml, ../b]\n"),
            ),
            (
                "/b/kustomization.yaml".to_string(),
                parse("resources: [../a]\n"),
            ),
        ];
        // Both are named by the other: neither is a root, the file is plain.
        let l = layout(&inputs, &k, &[], Plain::EachFile);
        assert_eq!(
            ids(&l, 0),
            [("/a/s.yaml".into(), String::new(), "x".into())]
        );
    }

    #[test]
    fn joins() {
        assert_eq!(join("/r/o/p", "../../base/"), "/r/base");
        assert_eq!(join("/r", "./a.yaml"), "/r/a.yaml");
        assert_eq!(join("r", "x/../y"), "r/y");
    }
}
