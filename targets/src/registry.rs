//! What a target is, as data: the CLI, `--help`, `--out`, `apply` and the golden tests
//! read the one table of them, [`crate::TARGETS`], and never name a target.
//!
//! A target is one module under `targets/src` that exports a [`Target`] constant, and one
//! line in that table. Its flags are declared here as data ([`Flag`]); the CLI adds them to
//! its parser, reads the files they name, and hands their values over as [`Params`].

use crate::plan::Planner;
use crate::trace::Tracer;
use std::collections::BTreeMap;
use svc_compiler::diag::Diagnostic;
use svc_compiler::ir::{Module, NodeView};
use svc_compiler::passes::allocate::NodeIds;
use svc_compiler::source::FileId;

/// One back end, as the CLI sees it.
pub struct Target {
    /// `--target NAME`.
    pub name: &'static str,
    /// One line for `--help`.
    pub about: &'static str,
    /// The extension of its files, `--out DIR/NODE.FAMILY.EXT` and in the state directory.
    pub ext: &'static str,
    pub render: Render,
    /// Flags only this target takes.
    pub flags: &'static [Flag],
    /// What `svc-compile apply` needs to load its output on a node; `None`: not appliable.
    pub planner: Option<&'static dyn Planner>,
    /// Which lines of its output implement each step of `svc-compile trace`; `None`: its
    /// rules are not traced.
    pub trace: Option<&'static dyn Tracer>,
    /// The warning every compile for this target gives once (a deprecated proxy mode);
    /// `None`: none.
    pub deprecated: Option<fn() -> Diagnostic>,
}

/// What a target renders from, which is also what it needs on the command line.
#[derive(Clone, Copy)]
pub enum Render {
    /// One node and family: needs `--node NAME` or `--all-nodes --out DIR`. One renderer
    /// serves every node of a run (`shared`: there will be many, so it may share what
    /// renders the same on several).
    Node(fn(&Params, Sharing) -> Box<dyn NodeRenderer>),
    /// The whole cluster: `--node` is optional, and the views of the nodes it selects
    /// (none without it) are handed over too. It may give several files: on stdout (or
    /// `-o FILE`) their texts follow one another in order, with `--out DIR` each is
    /// written to `DIR/name`.
    Cluster(ClusterRender),
}

/// [`Render::Cluster`]'s function.
pub type ClusterRender = fn(&Module, &[NodeView], &Params) -> Result<Vec<File>, RenderError>;

/// One file of a [`Render::Cluster`] target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct File {
    /// Its name under `--out DIR` (no directories).
    pub name: String,
    pub text: String,
}

/// Why a [`Render::Cluster`] target gave no output.
#[derive(Clone, Debug)]
pub enum RenderError {
    /// A usage error (exit 2), e.g. a flag's value out of range.
    Usage(String),
    /// An error in an input the target reads itself, e.g. a `--template` file (exit 1),
    /// located with the [`FileId`] of [`Params::files`].
    Input(Box<Diagnostic>),
}

impl From<String> for RenderError {
    fn from(s: String) -> RenderError {
        RenderError::Usage(s)
    }
}

/// Whether a node-scoped renderer will see one node or many.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sharing {
    /// One node: render its ports in parallel.
    One,
    /// Many nodes: render each distinct service port once, for all of them.
    Many,
}

/// [`Render::Node`]'s renderer, shared by the threads rendering the nodes of one run.
pub trait NodeRenderer: Send + Sync {
    /// Whether `view` can be rendered at all (a limit of the target's format, or a flag
    /// value it cannot use): the CLI asks before rendering each view, and an `Err` (one
    /// line, naming the node) is a usage error. The default accepts every view.
    fn check(&self, _view: &NodeView) -> Result<(), String> {
        Ok(())
    }
    /// Limits of the target that the manifests exceed for `view` (the ebpf target's map
    /// sizes): diagnostics the CLI reports with the input's (exit 1, nothing rendered),
    /// asked after [`check`](NodeRenderer::check) passed. The default finds none.
    fn input_errors(&self, _view: &NodeView) -> Vec<Diagnostic> {
        Vec::new()
    }
    /// The document for `view` into `out` (cleared first), reusing its memory.
    fn render_into(&self, view: &NodeView, out: &mut String);

    /// [`render_into`](NodeRenderer::render_into) for a target whose output carries ids
    /// that must stay stable across runs (`ebpf`): `locked` is what the `--lock` file keeps
    /// for this node and family, and the ids used are returned for it to keep. The
    /// default renders without ids and returns `None`.
    fn render_locked(
        &self,
        view: &NodeView,
        locked: Option<&NodeIds>,
        out: &mut String,
    ) -> Option<NodeIds> {
        let _ = locked;
        self.render_into(view, out);
        None
    }

    /// The names of the parts a document has, when it has several that load separately
    /// (`--part NAME` writes one; `--all-nodes --out DIR` writes `DIR/NODE.FAMILY.PART.EXT`
    /// for each); empty (the default): one document.
    fn parts(&self) -> &'static [&'static str] {
        &[]
    }

    /// One part of [`parts`](NodeRenderer::parts) for `view`, alone and loadable as is,
    /// into `out` (cleared first). Only called with a name `parts` lists.
    fn render_part_into(&self, view: &NodeView, part: &str, out: &mut String) {
        let _ = (view, out);
        unreachable!("render_part_into(`{part}`) on a renderer without parts")
    }

    /// Every part of [`parts`](NodeRenderer::parts) for `view`: `out[i]` (cleared first)
    /// gets part `parts()[i]`. A renderer whose parts share one computation overrides
    /// this to do it once; the default renders each part on its own.
    fn render_parts_into(&self, view: &NodeView, out: &mut [String]) {
        for (part, text) in self.parts().iter().zip(out) {
            self.render_part_into(view, part, text);
        }
    }
}

impl Target {
    /// Whether it needs a node (see [`Render`]).
    pub fn per_node(&self) -> bool {
        matches!(self.render, Render::Node(_))
    }
}

/// A target-specific flag, `--NAME VALUE`.
#[derive(Clone, Copy, Debug)]
pub struct Flag {
    /// Without the dashes.
    pub name: &'static str,
    pub value_name: &'static str,
    pub help: &'static str,
    /// May be given more than once (the values are kept in order).
    pub repeatable: bool,
    /// The value names a file: the CLI reads it and hands over its text.
    pub file: bool,
}

/// The values of a target's flags, by flag name: as given, or for a [`Flag::file`] the
/// file's text (and, in [`Params::files`], its path and where the CLI's `SourceMap` holds
/// it, so that a diagnostic can point into it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Params(BTreeMap<&'static str, Values>);

/// One flag's values, and for a file flag where each came from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Values {
    given: Vec<String>,
    files: Vec<(String, FileId)>,
}

impl Params {
    pub fn push(&mut self, flag: &'static str, value: String) {
        self.0.entry(flag).or_default().given.push(value);
    }
    /// A [`Flag::file`] value: the file's `text`, read from `path` into the source map as
    /// `file`.
    pub fn push_file(&mut self, flag: &'static str, path: String, file: FileId, text: String) {
        let v = self.0.entry(flag).or_default();
        v.given.push(text);
        v.files.push((path, file));
    }
    /// Every value of `flag`, in command-line order.
    pub fn all(&self, flag: &str) -> &[String] {
        self.0.get(flag).map_or(&[], |v| v.given.as_slice())
    }
    /// The path and source-map id of every file of a [`Flag::file`] `flag`, in the order
    /// of [`Params::all`] (empty when the values were pushed as plain text).
    pub fn files(&self, flag: &str) -> &[(String, FileId)] {
        self.0.get(flag).map_or(&[], |v| v.files.as_slice())
    }
    /// The last value of `flag`.
    pub fn get(&self, flag: &str) -> Option<&str> {
        self.all(flag).last().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use crate::TARGETS;

    /// What the CLI relies on: names it can parse and tell apart, one-line help, planners
    /// and tracers only on per-node targets (apply loads, and trace reads, one node's
    /// document), and `trace::TRACEABLE` naming exactly the targets with a tracer.
    #[test]
    fn the_table_is_consistent() {
        for (i, t) in TARGETS.iter().enumerate() {
            assert!(
                t.name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{}",
                t.name
            );
            assert!(TARGETS[..i].iter().all(|u| u.name != t.name), "{}", t.name);
            assert!(!t.about.is_empty() && !t.about.contains('\n'), "{}", t.name);
            assert!(!t.ext.is_empty() && !t.ext.contains('.'), "{}", t.name);
            assert!(t.planner.is_none() || t.per_node(), "{}", t.name);
            assert!(t.trace.is_none() || t.per_node(), "{}", t.name);
            assert_eq!(
                crate::trace::TRACEABLE.contains(&t.name),
                t.trace.is_some(),
                "{}",
                t.name
            );
            for (j, f) in t.flags.iter().enumerate() {
                assert!(t.flags[..j].iter().all(|g| g.name != f.name), "{}", f.name);
            }
        }
    }
}
