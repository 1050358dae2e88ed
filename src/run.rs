//! Running a command: the only place that reads files, writes files and prints.

use crate::cli::{Command, Format, GenCommand, Target};
use std::io::Write;
use std::path::Path;
use svc_compiler::diag::{self, Severity};
use svc_compiler::ir::NodeView;
use svc_compiler::net::IpFamily;
use svc_compiler::passes::allocate::write_lock;
use svc_compiler::passes::node::{check_selection, node_view, NodeSelection};
use svc_compiler::source::SourceMap;

/// A tool failure (exit 2): one line that says what to do.
pub(crate) struct Fail(pub(crate) String);

pub fn run(cmd: Command) -> u8 {
    if cmd.apply.is_some() {
        return crate::apply::run(&cmd);
    }
    match run_inner(&cmd) {
        Ok(code) => code,
        Err(Fail(msg)) => {
            eprintln!("svc-compile: {msg}");
            2
        }
    }
}

/// `svc-compile gen`: write a synthetic cluster.
pub fn gen(cmd: GenCommand) -> u8 {
    let text = svc_compiler::synth::generate(&cmd.shape, cmd.format);
    match write_output(cmd.output.as_deref(), &text) {
        Ok(()) => 0,
        Err(Fail(msg)) => {
            eprintln!("svc-compile: {msg}");
            2
        }
    }
}

/// Read the inputs (and the lock file, if it exists) and compile them.
pub(crate) fn compile_inputs(
    cmd: &Command,
) -> Result<(SourceMap, svc_compiler::Compilation), Fail> {
    let mut sources = SourceMap::default();
    let filters = crate::inputs::Filters {
        exclude: &cmd.exclude,
        include: &cmd.include,
    };
    let inputs = crate::inputs::read_inputs(&cmd.paths, &filters, &mut sources)?;
    let lock = match &cmd.lock {
        Some(p) if Path::new(p).exists() => {
            Some(sources.add(p.clone(), crate::inputs::read_file(Path::new(p))?))
        }
        _ => None,
    };
    let opts = svc_compiler::Options {
        service_cidrs: cmd.service_cidrs.clone(),
        node_port_range: cmd.node_port_range,
        cluster_domain: cmd.cluster_domain.clone(),
        allocate: cmd.allocate,
        lock,
    };
    let mut comp = svc_compiler::compile(&sources, &inputs.files, &opts);
    if !inputs.diags.items.is_empty() {
        comp.diags.extend(inputs.diags);
        comp.diags.sort(&sources);
    }
    Ok((sources, comp))
}

fn run_inner(cmd: &Command) -> Result<u8, Fail> {
    let (sources, mut comp) = compile_inputs(cmd)?;
    let mut diags = std::mem::take(&mut comp.diags);

    // Node views (per node and family), when the command asks for them: rendered into
    // `output`, or (with --out) listed in `per_node` to be rendered file by file.
    let mut output: Option<String> = None;
    let mut per_node: Vec<(NodeSelection, IpFamily)> = Vec::new();
    if !cmd.check && !diags.has_errors() {
        let nodes: Vec<NodeSelection> = if cmd.all_nodes {
            comp.module
                .nodes
                .iter()
                .map(|n| NodeSelection {
                    name: n.name.clone(),
                    ips: vec![],
                })
                .collect()
        } else {
            cmd.node
                .iter()
                .map(|n| NodeSelection {
                    name: n.clone(),
                    ips: cmd.node_ips.clone(),
                })
                .collect()
        };
        let families: Vec<IpFamily> = match cmd.family {
            Some(f) => vec![f],
            None if cmd.out_dir.is_some() => comp
                .settings
                .service_cidrs
                .iter()
                .map(|c| c.family())
                .collect(),
            None => comp
                .settings
                .service_cidrs
                .iter()
                .map(|c| c.family())
                .take(1)
                .collect(),
        };
        let jobs: Vec<(NodeSelection, IpFamily)> = nodes
            .into_iter()
            .flat_map(|sel| families.iter().map(move |f| (sel.clone(), *f)))
            .collect();
        if cmd.out_dir.is_some() && cmd.target != Target::Ir {
            // One file per job, made and written in parallel after the checks below.
            for (sel, fam) in &jobs {
                if let Err(d) = check_selection(&comp.module, sel, *fam) {
                    diags.push(d);
                }
            }
            per_node = jobs;
        } else {
            let mut views: Vec<NodeView> = Vec::new();
            for (sel, fam) in &jobs {
                match node_view(&comp.module, sel, *fam) {
                    Ok(v) => views.push(v),
                    Err(d) => diags.push(d),
                }
            }
            if !diags.has_errors() {
                let text = if cmd.target == Target::Ir {
                    svc_targets::ir::write_string(&comp.module, &views)
                } else {
                    views.iter().map(|v| render(cmd.target, v)).collect()
                };
                output = Some(text);
            }
        }
    }

    print_diagnostics(cmd, &diags, &sources);
    if diags.has_errors() {
        return Ok(1);
    }
    if cmd.write_lock {
        let p = cmd.lock.as_ref().expect("checked by cli");
        std::fs::write(p, write_lock(&comp.lock))
            .map_err(|e| Fail(format!("cannot write lock file {p}: {e}")))?;
    }
    if cmd.check {
        return Ok(0);
    }
    match &cmd.out_dir {
        Some(dir) if cmd.target != Target::Ir => {
            std::fs::create_dir_all(dir).map_err(|e| Fail(format!("cannot create {dir}: {e}")))?;
            write_per_node(cmd.target, &comp.module, &per_node, Path::new(dir))?;
        }
        _ => write_output(
            cmd.output
                .as_deref()
                .or(cmd.out_dir.as_deref().map(|_| ""))
                .filter(|s| !s.is_empty()),
            output.as_deref().unwrap_or_default(),
        )?,
    }
    // The process ends here: freeing the IR piece by piece would only cost time.
    std::mem::forget(comp);
    std::mem::forget(sources);
    Ok(0)
}

/// `--out DIR`: every node's view made, rendered and written in parallel, one node at a
/// time per thread, so only a few rulesets are in memory at once. One renderer serves all
/// nodes, so each service port that renders the same on many nodes is rendered once.
fn write_per_node(
    target: Target,
    module: &svc_compiler::ir::Module,
    jobs: &[(NodeSelection, IpFamily)],
    dir: &Path,
) -> Result<(), Fail> {
    use rayon::prelude::*;
    crate::alloc::purge_later();
    let renderer = Renderer::new(target);
    // Each thread reuses one text buffer: a fresh one per node would be paged in each time.
    jobs.par_iter()
        .try_for_each_init(String::new, |text, (sel, fam)| {
            let view = node_view(module, sel, *fam).expect("checked before anything was written");
            renderer.render_into(&view, text);
            drop(view);
            let fam = match fam {
                IpFamily::IPv4 => "ipv4",
                IpFamily::IPv6 => "ipv6",
            };
            let ext = match target {
                Target::Iptables => "rules",
                Target::Nftables => "nft",
                Target::NftablesJson | Target::Ir => "json",
            };
            let p = dir.join(format!("{}.{fam}.{ext}", sel.name));
            std::fs::write(&p, text.as_bytes())
                .map_err(|e| Fail(format!("cannot write {}: {e}", p.display())))
        })
}

/// One node's view, rendered on its own.
fn render(target: Target, v: &NodeView) -> String {
    match target {
        Target::Ir => unreachable!("the ir target renders the module"),
        Target::Iptables => svc_targets::iptables::write_string(v, &Default::default()),
        Target::Nftables => svc_targets::nftables::write_string(v, &Default::default()),
        Target::NftablesJson => svc_targets::nftables::write_json(v, &Default::default()),
    }
}

/// A target's writer, shared by every node of a run.
enum Renderer {
    Iptables(svc_targets::iptables::Renderer),
    Nftables(svc_targets::nftables::Renderer),
    NftablesJson,
}

impl Renderer {
    fn new(target: Target) -> Renderer {
        match target {
            Target::Ir => unreachable!("the ir target renders the module"),
            Target::Iptables => Renderer::Iptables(Default::default()),
            Target::Nftables => Renderer::Nftables(Default::default()),
            Target::NftablesJson => Renderer::NftablesJson,
        }
    }
    fn render_into(&self, v: &NodeView, text: &mut String) {
        match self {
            Renderer::Iptables(r) => r.write_into(v, text),
            Renderer::Nftables(r) => r.write_into(v, text),
            Renderer::NftablesJson => {
                *text = svc_targets::nftables::write_json(v, &Default::default())
            }
        }
    }
}

pub(crate) fn print_diagnostics(cmd: &Command, diags: &diag::Diagnostics, sources: &SourceMap) {
    match cmd.format {
        Format::Json | Format::Sarif => {
            let items: Vec<_> = diags
                .items
                .iter()
                .map(|d| diag::to_json(d, sources))
                .collect();
            let value = if cmd.format == Format::Sarif {
                sarif(&items)
            } else {
                serde_json::to_value(&items).expect("diagnostics serialise")
            };
            let text = serde_json::to_string_pretty(&value).expect("diagnostics serialise");
            // `check --format json` is the product: stdout. Otherwise stderr.
            if cmd.check {
                let _ = writeln!(std::io::stdout(), "{text}");
            } else {
                eprintln!("{text}");
            }
        }
        Format::Text => {
            let text = diag::render_all(diags, sources);
            if cmd.check {
                let _ = write!(std::io::stdout(), "{text}");
                if !diags.has_errors() {
                    let _ = writeln!(
                        std::io::stdout(),
                        "ok: {} file(s) checked, {} warning(s)",
                        sources.files.len()
                            - cmd.lock.iter().filter(|p| Path::new(p).exists()).count(),
                        diags.count(Severity::Warning)
                    );
                }
            } else {
                eprint!("{text}");
            }
        }
    }
}

/// SARIF 2.1.0, for code-scanning tools in CI.
fn sarif(items: &[diag::JsonDiagnostic]) -> serde_json::Value {
    use serde_json::json;
    let mut rules: Vec<&str> = items.iter().map(|d| d.code).collect();
    rules.sort_unstable();
    rules.dedup();
    let results: Vec<_> = items
        .iter()
        .map(|d| {
            let level = match d.severity {
                Severity::Error => "error",
                Severity::Warning => "warning",
                Severity::Note => "note",
            };
            let text = match d.hint {
                Some(h) => format!("{} (help: {h})", d.message),
                None => d.message.to_string(),
            };
            let locations: Vec<_> = d
                .file
                .map(|f| {
                    json!({"physicalLocation": {
                        "artifactLocation": {"uri": f},
                        "region": {"startLine": d.line, "startColumn": d.column}
                    }})
                })
                .into_iter()
                .collect();
            json!({"ruleId": d.code, "level": level, "message": {"text": text}, "locations": locations})
        })
        .collect();
    json!({
        "version": "2.1.0",
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "runs": [{
            "tool": {"driver": {
                "name": "svc-compile",
                "version": env!("CARGO_PKG_VERSION"),
                "rules": rules.iter().map(|r| json!({"id": r})).collect::<Vec<_>>()
            }},
            "results": results
        }]
    })
}

fn write_output(path: Option<&str>, text: &str) -> Result<(), Fail> {
    match path {
        Some(p) => std::fs::write(p, text).map_err(|e| Fail(format!("cannot write {p}: {e}"))),
        None => {
            let mut out = std::io::stdout().lock();
            match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
                // A closed pipe (`| head`) is not an error.
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                    Err(Fail(format!("cannot write output: {e}")))
                }
                _ => Ok(()),
            }
        }
    }
}
