//! The project's config file, `.svc-compile.yaml`: what a repository says once so that CI
//! and pre-commit need no flags. Parsed here from its text (the CLI finds and reads it);
//! every mistake is an SVC021 error located in the file.
//!
//! ```yaml
//! ignore: [SVC008]                       # codes never reported
//! per-path-ignores:                      # codes not reported for files a glob matches
//!   "legacy/**": [SVC013, SVC153]
//! exclude: ["charts/*/templates/**"]     # as --exclude / --include
//! include: []
//! serviceClusterIPRange: 10.0.0.0/16     # the ClusterConfig document's keys
//! serviceNodePortRange: 30000-32767
//! clusterDomain: cluster.local
//! randomFully: true
//! nfacct: false
//! nftLayout: kube-proxy
//! topologyKeys: honour
//! validate: strict                       # as --validate
//! clusters:                              # files applied together (crate::layout)
//!   prod: ["deploy/prod/**", "crds/*.yaml"]
//! ```
//!
//! Invariant: a value is only taken once it is valid, so a config with errors never
//! changes a setting (the CLI refuses it anyway: a broken config is a usage error).

use crate::decode::{closest, Sp};
use crate::diag::{Diagnostic, Diagnostics};
use crate::ir::{NftLayout, TopologyKeys};
use crate::net::Cidr;
use crate::source::FileId;
use crate::tree::{Node, Value};
use crate::Validate;

/// Its name; the CLI looks for it in the working directory and each directory above.
pub const FILE_NAME: &str = ".svc-compile.yaml";

/// The code of every mistake in the config file.
pub const CONFIG_ERROR: &str = "SVC021";

/// The keys the file takes, in the order `docs/ci.md` lists them.
pub const KEYS: &[&str] = &[
    "ignore",
    "per-path-ignores",
    "exclude",
    "include",
    "serviceClusterIPRange",
    "serviceNodePortRange",
    "clusterDomain",
    "randomFully",
    "nfacct",
    "nftLayout",
    "topologyKeys",
    "validate",
    "clusters",
];

/// The file's settings; `None` or empty where it says nothing.
#[derive(Clone, Debug, Default)]
pub struct Project {
    /// Codes never reported, each where the file names it.
    pub ignore: Vec<Sp<String>>,
    /// Codes not reported for the files a glob matches.
    pub per_path_ignores: Vec<PathIgnore>,
    pub exclude: Option<Vec<String>>,
    pub include: Option<Vec<String>>,
    pub service_cidrs: Option<Vec<Cidr>>,
    pub node_port_range: Option<(u16, u16)>,
    /// Without a trailing dot.
    pub cluster_domain: Option<String>,
    pub random_fully: Option<bool>,
    pub nfacct: Option<bool>,
    pub nft_layout: Option<NftLayout>,
    pub topology_keys: Option<TopologyKeys>,
    pub validate: Option<Validate>,
    /// `clusters`: each cluster's name and the globs of its files, in the file's order.
    pub clusters: Vec<(Sp<String>, Vec<Sp<String>>)>,
}

impl Project {
    /// Its spans moved to file `file` (the same text added to another source map).
    pub fn relocate(&mut self, file: FileId) {
        let codes = self
            .per_path_ignores
            .iter_mut()
            .flat_map(|p| std::iter::once(&mut p.glob).chain(p.codes.iter_mut()));
        for sp in self.ignore.iter_mut().chain(codes) {
            sp.span.file = file;
        }
    }
}

/// One entry of `per-path-ignores`.
#[derive(Clone, Debug)]
pub struct PathIgnore {
    pub glob: Sp<String>,
    pub codes: Vec<Sp<String>>,
}

/// The settings of the config file `file` (text `text`), and its mistakes (SVC021).
/// `known` says whether a code exists (this crate's [`crate::codes::CODES`] and the back
/// ends' own).
pub fn parse(file: FileId, text: &str, known: &dyn Fn(&str) -> bool) -> (Project, Diagnostics) {
    let (docs, mut diags) = crate::tree::parse_file(file, text);
    // YAML errors are the config's errors: one code for everything wrong in the file.
    for d in &mut diags.items {
        d.code = CONFIG_ERROR;
    }
    let mut p = Project::default();
    let mut cx = Cx {
        diags: &mut diags,
        known,
    };
    let mut docs = docs.iter().filter(|d| d.root.value != Value::Null);
    if let Some(doc) = docs.next() {
        cx.project(&doc.root, &mut p);
    }
    for extra in docs {
        cx.error(
            &extra.root,
            "a second document: the config file is one mapping".into(),
            "remove the `---` and merge the two",
        );
    }
    (p, diags)
}

struct Cx<'a> {
    diags: &'a mut Diagnostics,
    known: &'a dyn Fn(&str) -> bool,
}

impl Cx<'_> {
    fn error(&mut self, at: &Node, message: String, hint: &str) {
        self.diags.push(
            Diagnostic::error(CONFIG_ERROR, message)
                .at(at.span)
                .hint(hint),
        );
    }

    fn project(&mut self, root: &Node, p: &mut Project) {
        let Value::Map(entries) = &root.value else {
            return self.error(
                root,
                format!("the config file is a {}, not a mapping", root.kind_name()),
                "write `key: value` lines, e.g. `ignore: [SVC008]`",
            );
        };
        for e in entries {
            let v = &e.value;
            let key = e.key.as_str();
            match key {
                "ignore" => p.ignore = self.codes(v, key),
                "per-path-ignores" => p.per_path_ignores = self.per_path(v),
                "clusters" => p.clusters = self.clusters(v),
                "exclude" => p.exclude = Some(self.strings(v, key)),
                "include" => p.include = Some(self.strings(v, key)),
                "serviceClusterIPRange" => {
                    p.service_cidrs = self.parsed(v, key, crate::passes::parse_service_cidrs)
                }
                "serviceNodePortRange" => {
                    p.node_port_range = self.parsed(v, key, crate::passes::parse_port_range)
                }
                "clusterDomain" => {
                    p.cluster_domain = self.parsed(v, key, |d| {
                        let d = d.strip_suffix('.').unwrap_or(d);
                        crate::passes::validate::names::dns1123_subdomain(d)?;
                        Ok(d.to_string())
                    })
                }
                "randomFully" => p.random_fully = self.bool(v, key),
                "nfacct" => p.nfacct = self.bool(v, key),
                "nftLayout" => {
                    p.nft_layout = self.parsed(v, key, |s| {
                        NftLayout::parse(s).ok_or_else(|| "use kube-proxy or fast".into())
                    })
                }
                "topologyKeys" => {
                    p.topology_keys = self.parsed(v, key, |s| {
                        TopologyKeys::parse(s).ok_or_else(|| "use honour or ignore".into())
                    })
                }
                "validate" => {
                    p.validate = self.parsed(v, key, |s| match s {
                        "strict" => Ok(Validate::Strict),
                        "warn" => Ok(Validate::Warn),
                        "ignore" => Ok(Validate::Ignore),
                        _ => Err("use strict, warn or ignore".into()),
                    })
                }
                _ => {
                    let hint = match closest(key, KEYS) {
                        Some(k) => format!("did you mean `{k}`?"),
                        None => format!("the keys are {}", KEYS.join(", ")),
                    };
                    self.diags.push(
                        Diagnostic::error(CONFIG_ERROR, format!("unknown key `{key}`"))
                            .at(crate::source::Span {
                                len: key.chars().count() as u32,
                                ..e.key_span
                            })
                            .hint(hint),
                    );
                }
            }
        }
    }

    /// A string, or an error naming `key`.
    fn string<'n>(&mut self, v: &'n Node, key: &str) -> Option<&'n str> {
        match &v.value {
            Value::Scalar { text, .. } => Some(text),
            _ => {
                self.error(
                    v,
                    format!("`{key}` is a {}, not a string", v.kind_name()),
                    "write one value, e.g. `clusterDomain: cluster.local`",
                );
                None
            }
        }
    }

    /// A string `read` accepts; its error located at the value.
    fn parsed<T>(
        &mut self,
        v: &Node,
        key: &str,
        read: impl Fn(&str) -> Result<T, String>,
    ) -> Option<T> {
        let s = self.string(v, key)?;
        match read(s) {
            Ok(t) => Some(t),
            Err(e) => {
                self.error(v, format!("invalid `{key}` `{s}`: {e}"), "see docs/ci.md");
                None
            }
        }
    }

    fn bool(&mut self, v: &Node, key: &str) -> Option<bool> {
        let s = self.string(v, key)?;
        match s {
            "true" | "True" | "TRUE" => Some(true),
            "false" | "False" | "FALSE" => Some(false),
            _ => match crate::tree::yaml11_bool(s) {
                Some(b) => Some(b),
                None => {
                    self.error(
                        v,
                        format!("`{key}` `{s}` is not a boolean"),
                        "write true or false",
                    );
                    None
                }
            },
        }
    }

    /// A list of strings (one string alone is a list of one).
    fn strings(&mut self, v: &Node, key: &str) -> Vec<String> {
        self.items(v, key).into_iter().map(|s| s.v).collect()
    }

    fn items(&mut self, v: &Node, key: &str) -> Vec<Sp<String>> {
        match &v.value {
            Value::Null => Vec::new(),
            Value::Scalar { text, .. } => vec![Sp::new(text.clone(), v.span)],
            Value::Seq(items) => items
                .iter()
                .filter_map(|i| self.string(i, key).map(|s| Sp::new(s.to_string(), i.span)))
                .collect(),
            Value::Map(_) => {
                self.error(
                    v,
                    format!("`{key}` is a mapping, not a list"),
                    "write a list, e.g. `[a, b]`",
                );
                Vec::new()
            }
        }
    }

    /// A list of codes, each one that exists.
    fn codes(&mut self, v: &Node, key: &str) -> Vec<Sp<String>> {
        let mut out = Vec::new();
        for code in self.items(v, key) {
            if (self.known)(&code.v) {
                out.push(code);
            } else {
                self.diags.push(
                    Diagnostic::error(
                        CONFIG_ERROR,
                        format!("`{key}`: `{}` is not a diagnostic code", code.v),
                    )
                    .at(code.span)
                    .hint("codes are written SVCnnn; docs/diagnostics.md lists them"),
                );
            }
        }
        out
    }

    fn clusters(&mut self, v: &Node) -> Vec<(Sp<String>, Vec<Sp<String>>)> {
        let Value::Map(entries) = &v.value else {
            if v.value != Value::Null {
                self.error(
                    v,
                    format!("`clusters` is a {}, not a mapping", v.kind_name()),
                    "map each cluster's name to the globs of its files, e.g. `prod: [\"deploy/prod/**\"]`",
                );
            }
            return Vec::new();
        };
        entries
            .iter()
            .map(|e| {
                (
                    Sp::new(e.key.clone(), e.key_span),
                    self.items(&e.value, "clusters"),
                )
            })
            .collect()
    }

    fn per_path(&mut self, v: &Node) -> Vec<PathIgnore> {
        let Value::Map(entries) = &v.value else {
            if v.value != Value::Null {
                self.error(
                    v,
                    format!("`per-path-ignores` is a {}, not a mapping", v.kind_name()),
                    "map globs to codes, e.g. `\"legacy/**\": [SVC013]`",
                );
            }
            return Vec::new();
        };
        entries
            .iter()
            .map(|e| PathIgnore {
                glob: Sp::new(e.key.clone(), e.key_span),
                codes: self.codes(&e.value, "per-path-ignores"),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(c: &str) -> bool {
        crate::codes::find(c).is_some()
    }

    fn parse_text(text: &str) -> (Project, Vec<(String, u32, u32)>) {
        let (p, d) = parse(FileId(0), text, &known);
        let errs = d
            .items
            .iter()
            .map(|d| {
                let s = d.span.expect("located");
                (format!("{}: {}", d.code, d.message), s.line, s.col)
            })
            .collect();
        (p, errs)
    }

    #[test]
    fn every_key_is_read() {
        let (p, errs) = parse_text(
            "ignore: [SVC008, SVC012]\nper-path-ignores:\n  \"legacy/**\": [SVC013]\n\
             exclude: [\"charts/**\"]\ninclude: '*.yaml'\nserviceClusterIPRange: 10.0.0.0/16,fd00::/108\n\
             serviceNodePortRange: 20000-22767\nclusterDomain: example.org.\nrandomFully: false\n\
             nfacct: yes\nnftLayout: fast\ntopologyKeys: ignore\nvalidate: warn\n\
             clusters:\n  prod: [\"deploy/prod/**\", crds.yaml]\n  dev: dev/*.yaml\n",
        );
        assert_eq!(errs, []);
        let clusters: Vec<(&str, Vec<&str>)> = p
            .clusters
            .iter()
            .map(|(n, g)| (n.v.as_str(), g.iter().map(|g| g.v.as_str()).collect()))
            .collect();
        assert_eq!(
            clusters,
            [
                ("prod", vec!["deploy/prod/**", "crds.yaml"]),
                ("dev", vec!["dev/*.yaml"])
            ]
        );
        let codes: Vec<&str> = p.ignore.iter().map(|c| c.v.as_str()).collect();
        assert_eq!(codes, ["SVC008", "SVC012"]);
        assert_eq!(p.ignore[1].span.line, 1);
        assert_eq!(p.ignore[1].span.col, 18);
        assert_eq!(p.per_path_ignores[0].glob.v, "legacy/**");
        assert_eq!(p.per_path_ignores[0].codes[0].v, "SVC013");
        assert_eq!(p.exclude, Some(vec!["charts/**".to_string()]));
        assert_eq!(p.include, Some(vec!["*.yaml".to_string()]));
        assert_eq!(p.service_cidrs.map(|c| c.len()), Some(2));
        assert_eq!(p.node_port_range, Some((20000, 22767)));
        assert_eq!(p.cluster_domain.as_deref(), Some("example.org"));
        assert_eq!((p.random_fully, p.nfacct), (Some(false), Some(true)));
        assert_eq!(p.nft_layout, Some(NftLayout::Fast));
        assert_eq!(p.topology_keys, Some(TopologyKeys::Ignore));
        assert_eq!(p.validate, Some(Validate::Warn));
    }

    #[test]
    fn mistakes_are_located_and_take_nothing() {
        let (p, errs) = parse_text(
            "ignor: [SVC008]\nignore: [SVC999, SVC008]\nserviceNodePortRange: 30000\nvalidate: [strict]\n",
        );
        assert_eq!(
            errs,
            [
                ("SVC021: unknown key `ignor`".to_string(), 1, 1),
                (
                    "SVC021: `ignore`: `SVC999` is not a diagnostic code".to_string(),
                    2,
                    10
                ),
                (
                    "SVC021: invalid `serviceNodePortRange` `30000`: `30000` is not a port range such as 30000-32767".to_string(),
                    3,
                    23
                ),
                (
                    "SVC021: `validate` is a list, not a string".to_string(),
                    4,
                    11
                ),
            ]
        );
        assert_eq!(p.ignore.len(), 1);
        assert_eq!(p.node_port_range, None);
        assert_eq!(p.validate, None);
        let (_, errs) = parse_text("ignore: [\n");
        assert!(errs[0].0.starts_with("SVC021: "), "{errs:?}");
        let (_, errs) = parse_text("- a\n");
        assert_eq!(
            errs[0].0,
            "SVC021: the config file is a list, not a mapping"
        );
        let (p, errs) = parse_text("# nothing yet\n");
        assert_eq!(errs, []);
        assert!(p.ignore.is_empty());
    }
}
