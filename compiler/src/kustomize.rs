//! What a `kustomization.yaml` says about the files beside it: which of them are patches
//! (partial objects kustomize merges into others), which `check` must not read as objects.
//!
//! Pure: the CLI reads the files and resolves the paths.

use crate::diag::Diagnostic;
use crate::source::{FileId, Span};
use crate::tree::{Node, Value};

/// The file names kustomize reads as a kustomization.
pub const FILE_NAMES: &[&str] = &["kustomization.yaml", "kustomization.yml", "Kustomization"];

/// The patch files a kustomization names, relative to its directory:
/// `patchesStrategicMerge` entries that are paths (not inline patches), and the `path` of
/// `patches` and `patchesJson6902` entries.
pub fn patch_paths(text: &str) -> Vec<String> {
    let (docs, _) = crate::tree::parse_file(FileId(0), text);
    let Some(root) = docs.first().map(|d| &d.root) else {
        return Vec::new();
    };
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
}
