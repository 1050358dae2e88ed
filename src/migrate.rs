//! `svc-compile migrate`: compile, take each asked node's views (every family of the
//! service CIDRs), compare the two proxy modes on each (`svc_compiler::migrate`, which
//! traces every flow with the engine of `trace`), print or write the report.
//!
//! Exit codes, as `diff`'s: 0 no difference, 1 differences, 2 anything else, input errors
//! included (their diagnostics are printed): 1 must never stand for a broken input.

use crate::cli::{MigrateCmd, MigrateFormat};
use crate::compile::{compile_inputs, node_jobs, Compiled};
use crate::report::{print, Emitter, Fail, Outcome};
use svc_compiler::migrate::{compare, render_markdown, render_text, Report};
use svc_compiler::passes::node::node_view;

pub fn run(cmd: &MigrateCmd) -> Result<Outcome, Fail> {
    let Compiled { sources, comp, .. } = compile_inputs(&cmd.opts, None)?;
    Emitter::new(&cmd.opts).diagnostics(&comp.diags, &sources);
    if comp.diags.has_errors() {
        return Ok(Outcome::InputErrors);
    }
    let mut report = Report {
        from: cmd.from,
        to: cmd.to,
        nodes: Vec::new(),
    };
    for (sel, fam) in node_jobs(&cmd.nodes, &comp, true) {
        let view = node_view(&comp.module, &sel, fam).map_err(|d| {
            Fail(format!(
                "--node {} ({}): {}",
                sel.name,
                fam.as_str(),
                d.message
            ))
        })?;
        report.nodes.push(compare(
            &comp.module,
            &view,
            cmd.from,
            cmd.to,
            &cmd.local_ips,
        ));
    }
    let text = match cmd.format {
        MigrateFormat::Json => {
            serde_json::to_string_pretty(&report).expect("the report serialises") + "\n"
        }
        MigrateFormat::Markdown => render_markdown(&report),
        MigrateFormat::Text => render_text(&report),
    };
    match &cmd.output {
        Some(path) => {
            std::fs::write(path, &text).map_err(|e| Fail(format!("cannot write {path}: {e}")))?
        }
        None => print(&text)?,
    }
    Ok(if report.differs() {
        Outcome::Differs
    } else {
        Outcome::Done
    })
}
