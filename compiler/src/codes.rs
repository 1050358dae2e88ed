//! Diagnostic codes outside validation. The validation pass keeps its own table
//! (SVC1xx, SVC2xx, SVC301–SVC330) in [`crate::passes::validate`]. Both tables are the
//! one description of a code: `build.rs` makes [`CODES`] of them (SARIF's rules, the
//! config file's check of the codes it names, `docs/diagnostics.md` read it).
//!
//! | code   | severity | meaning |
//! |--------|----------|---------|
//! | SVC001 | error    | invalid YAML (or JSON); the rest of that file was not read |
//! | SVC002 | error    | alias expansion exceeds the node budget (an alias bomb) |
//! | SVC003 | error    | unknown field in a known kind (with "did you mean"); a warning with `--validate warn`, left out with `ignore` |
//! | SVC004 | error    | a field has the wrong type (e.g. a quoted number) |
//! | SVC005 | warning  | a mapping repeats a key (kubectl keeps the last value; so do we) |
//! | SVC006 | error    | an object without apiVersion or kind, or a document that is no mapping |
//! | SVC007 | error    | unsupported apiVersion for a known kind |
//! | SVC008 | note     | a kind svc-compile does not read was skipped |
//! | SVC009 | error    | object without metadata.name |
//! | SVC010 | error    | Endpoints address without `ip` |
//! | SVC011 | error    | a kind svc-compile reads, written in the wrong case (`kind: service`) |
//! | SVC012 | note     | a top-level document that is not a Kubernetes object was skipped |
//! | SVC013 | warning  | EndpointSlice in `discovery.k8s.io/v1beta1` (removed in 1.25) |
//! | SVC014 | note     | a file that fails where `{{`, `${VAR}` or `{VAR}` is written looks like an unrendered template |
//! | SVC015 | error    | a file is neither UTF-8 nor UTF-16 with a BOM; it was not read |
//! | SVC016 | note     | `--no-allocate` without ranges: the service (or node-port) range inferred from the input |
//! | SVC017 | note     | a file a kustomization names as a patch was not read as manifests |
//! | SVC018 | note     | more diagnostics than `diag::MAX_DIAGNOSTICS`: the rest are only counted |
//! | SVC019 | error    | more than `tree::MAX_DOCUMENTS` documents in one file; it was not read |
//! | SVC020 | error    | two objects glued into one document (`apiVersion`/`kind` written again: a `---` missing) |
//! | SVC021 | error    | the config file (`.svc-compile.yaml`) is invalid: an unknown key, a wrong type, a bad value or an unknown code |
//! | SVC022 | warning  | a suppression (`# svc-compile:ignore`, or the config file's `ignore`/`per-path-ignores`) that matched nothing |
//! | SVC023 | error    | a scalar longer than `tree::MAX_SCALAR_BYTES` (3 MiB, the API server's request limit); the rest of the file was not read |
//! | SVC351 | error    | the service IP range is full |
//! | SVC352 | error    | the node-port range is full (a nodePort or a healthCheckNodePort) |
//! | SVC360 | error    | the lock file cannot be read |
//! | SVC401 | error    | the node to compile for is unknown (no Node manifest, no --node-ip) |
//!
//! The back ends' inputs of their own (crate `svc-targets`, so not in the table above,
//! which lists this crate's codes):
//! - SVC501, error: a `--template` file does not parse or render
//!   (`svc_targets::template::TEMPLATE_ERROR_CODE`), at the template's line and column.
//! - SVC502, error: a node's entries overflow one of Cilium's maps at the sizes given
//!   (`svc_targets::ebpf::MAP_FULL_CODE`; `--map-sizes`, ClusterConfig `ebpfMapSizes`).
//!   `svc_targets::CODES` describes it as [`CODES`] does this crate's.

use crate::diag::Severity;

/// A diagnostic code as its table describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Code {
    pub code: &'static str,
    /// The severity it is reported with by default (flags such as `--validate` change some).
    pub severity: Severity,
    /// What it means, in one line (Markdown: names in backticks).
    pub summary: &'static str,
}

include!(concat!(env!("OUT_DIR"), "/codes.rs"));

/// The code's row of [`CODES`].
pub fn find(code: &str) -> Option<&'static Code> {
    CODES
        .binary_search_by(|c| c.code.cmp(code))
        .ok()
        .map(|i| &CODES[i])
}

#[cfg(test)]
mod tests {
    const SOURCES: &[&str] = &[
        include_str!("diag.rs"),
        include_str!("source.rs"),
        include_str!("tree.rs"),
        include_str!("decode.rs"),
        include_str!("k8s.rs"),
        include_str!("kustomize.rs"),
        include_str!("lib.rs"),
        include_str!("passes/infer.rs"),
        include_str!("passes/resolve.rs"),
        include_str!("passes/allocate.rs"),
        include_str!("passes/lower.rs"),
        include_str!("passes/node.rs"),
        include_str!("project.rs"),
        include_str!("suppress.rs"),
    ];

    #[test]
    fn table_lists_every_code_used_outside_validation() {
        let mut used: Vec<String> = SOURCES
            .iter()
            // Codes named only in a file's unit tests are not used by it.
            .map(|src| src.split("#[cfg(test)]").next().unwrap_or(src))
            .flat_map(|src| {
                src.match_indices("\"SVC")
                    .map(move |(i, _)| &src[i + 1..i + 7])
            })
            .filter(|c| c[3..].bytes().all(|b| b.is_ascii_digit()))
            .map(String::from)
            .collect();
        used.sort();
        used.dedup();
        let table: Vec<String> = include_str!("codes.rs")
            .lines()
            .filter_map(|l| l.strip_prefix("//! | SVC"))
            .map(|l| format!("SVC{}", &l[..3]))
            .collect();
        assert_eq!(used, table);
    }

    /// `CODES` holds every row of both tables, sorted, and `find` finds each.
    #[test]
    fn codes_are_the_tables_rows() {
        let rows = include_str!("codes.rs")
            .lines()
            .chain(include_str!("passes/validate.rs").lines())
            .filter(|l| l.starts_with("//! | SVC"))
            .count();
        assert_eq!(super::CODES.len(), rows);
        assert!(super::CODES.windows(2).all(|w| w[0].code < w[1].code));
        for c in super::CODES {
            assert_eq!(super::find(c.code), Some(c));
        }
        let svc003 = super::find("SVC003").unwrap();
        assert_eq!(svc003.severity, crate::diag::Severity::Error);
        assert!(svc003.summary.starts_with("unknown field"), "{svc003:?}");
        assert_eq!(super::find("SVC999"), None);
    }
}
