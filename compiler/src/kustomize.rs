//! What a `kustomization.yaml` says about the files beside it: which of them are patches
//! (partial objects kustomize merges into others), which `check` must not read as objects;
//! which files and kustomizations it builds from, and what it does to their names
//! ([`crate::layout`] makes clusters of that).
//!
//! Pure: the CLI reads the files and resolves the paths.

use crate::diag::Diagnostic;
use crate::source::{FileId, Span};
use crate::tree::{Node, Value};

/// The file names kustomize reads as a kustomization.
pub const FILE_NAMES: &[&str] = &["kustomization.yaml", "kustomization.yml", "Kustomization"];

/// The fields of a kustomization svc-compile reads. Paths are relative to its directory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Kustomization {
    /// `resources`, `bases` (deprecated, read the same) and `components`: files or
    /// directories holding a kustomization (remote ones included, as written).
    pub resources: Vec<String>,
    /// See [`patch_paths`].
    pub patches: Vec<String>,
    /// `namespace`, set on every namespaced object it builds.
    pub namespace: Option<String>,
    /// `namePrefix` and `nameSuffix`, put around every object's name.
    pub name_prefix: String,
    pub name_suffix: String,
}

/// A kustomization's text read; what cannot be read is left out (a kustomization that is
/// no YAML mapping says nothing).
pub fn parse(text: &str) -> Kustomization {
    let (docs, _) = crate::tree::parse_file(FileId(0), text);
    let Some(root) = docs.first().map(|d| &d.root) else {
        return Kustomization::default();
    };
    let string = |key: &str| root.get(key).and_then(Node::as_str).map(str::to_string);
    let mut resources = Vec::new();
    for key in ["resources", "bases", "components"] {
        if let Some(Value::Seq(items)) = root.get(key).map(|n| &n.value) {
            resources.extend(items.iter().filter_map(Node::as_str).map(str::to_string));
        }
    }
    Kustomization {
        resources,
        patches: patches_of(root),
        namespace: string("namespace").filter(|n| !n.is_empty()),
        name_prefix: string("namePrefix").unwrap_or_default(),
        name_suffix: string("nameSuffix").unwrap_or_default(),
    }
}

/// The patch files a kustomization names, relative to its directory:
/// `patchesStrategicMerge` entries that are paths (not inline patches), and the `path` of
/// `patches` and `patchesJson6902` entries.
pub fn patch_paths(text: &str) -> Vec<String> {
    parse(text).patches
}

fn patches_of(root: &Node) -> Vec<String> {
    let items = |key: &str| -> Vec<&Node> {
        match root.get(key).map(|n| &n.value) {
            Some(Value::Seq(items)) => items.iter().collect(),
            _ => Vec::new(),
        }
    };
    let mut out = Vec::new();
    for n in items("patchesStrategicMerge") {
        // An inline patch is YAML text; a path is one line.
        if let Some(p) = n
            .as_str()
            .filter(|p| !p.contains('\n') && !p.contains(": "))
        {
            out.push(p.to_string());
        }
    }
    for key in ["patches", "patchesJson6902"] {
        for n in items(key) {
            if let Some(p) = n.get("path").and_then(Node::as_str) {
                out.push(p.to_string());
            }
        }
    }
    out
}

/// The note for a patch file that was not read as manifests.
pub fn patch_note(file: FileId, kustomization: &str) -> Diagnostic {
    Diagnostic::note(
        "SVC017",
        format!("skipped a kustomize patch (named in {kustomization}): it is not a whole object"),
    )
    .at(Span::new(file, 1, 1, 1))
    .hint("check what `kustomize build` renders to check the patched objects")
}

#[cfg(test)]
mod tests {
    #[test]
    fn patches_are_named_three_ways() {
        let text = "resources: [svc.yaml]\npatchesStrategicMerge:\n- lb.yaml\n- |-\n  apiVersion: v1\n  kind: Service\npatches:\n- path: ports.yaml\n  target: {kind: Service}\n- patch: '[]'\npatchesJson6902:\n- path: ops.yaml\n";
        assert_eq!(
            super::patch_paths(text),
            ["lb.yaml", "ports.yaml", "ops.yaml"]
        );
    }

    #[test]
    fn names_and_resources() {
        let k = super::parse(
            "namespace: shop\nnamePrefix: a-\nnameSuffix: -z\nresources: [svc.yaml, ../base]\nbases: [../old]\ncomponents: [../c]\n",
        );
        assert_eq!(k.resources, ["svc.yaml", "../base", "../old", "../c"]);
        assert_eq!(k.namespace.as_deref(), Some("shop"));
        assert_eq!(
            (k.name_prefix.as_str(), k.name_suffix.as_str()),
            ("a-", "-z")
        );
        assert_eq!(
            super::parse("- not a mapping\n"),
            super::Kustomization::default()
        );
    }
}
