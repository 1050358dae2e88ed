//! `svc-compile trace`: compile, take the node's view for the destination's family,
//! trace each packet (`svc_compiler::trace`) and, for `--target iptables|nftables`, show
//! the compiled document's lines behind each step (`svc_targets::trace`).

use crate::cli::{query, Format, Packets, Query, TraceCmd};
use crate::compile::{compile_inputs, Compiled};
use crate::report::{output, Emitter, Fail, Outcome};
use svc_compiler::ir::NodeView;
use svc_compiler::net::IpFamily;
use svc_compiler::passes::node::{node_view, NodeSelection};
use svc_compiler::trace::{trace, Mode, Packet};
use svc_targets::{Render, Sharing};

/// The packets: the flags' one, or a line each of `--flows FILE` (`FROM TO [PROTO]`, `#`
/// comments), checked as the flags are.
fn queries(packets: Packets) -> Result<Vec<Query>, Fail> {
    let path = match packets {
        Packets::One(q) => return Ok(vec![q]),
        Packets::Flows(path) => path,
    };
    let text =
        std::fs::read_to_string(&path).map_err(|e| Fail(format!("cannot read {path}: {e}")))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let l = line.split('#').next().unwrap_or("").trim();
        if l.is_empty() {
            continue;
        }
        let w: Vec<&str> = l.split_whitespace().collect();
        let at = |e: String| Fail(format!("{path}:{}: {e}", n + 1));
        if !(2..=3).contains(&w.len()) {
            return Err(at("want `FROM TO [PROTO]`".into()));
        }
        let mut q = query(w[0], w[1], w.get(2).copied().unwrap_or("tcp")).map_err(at)?;
        q.line = l.to_string();
        out.push(q);
    }
    Ok(out)
}

/// `svc-compile trace`.
pub fn run(cmd: TraceCmd) -> Result<Outcome, Fail> {
    let TraceCmd {
        opts,
        target,
        nodes,
        packets,
        local_ips,
        output: out_file,
    } = cmd;
    let node = nodes.node.clone().expect("checked by cli");
    let flows = matches!(packets, Packets::Flows(_));
    let qs = queries(packets)?;
    let Compiled {
        sources,
        comp,
        params,
        ..
    } = compile_inputs(&opts, Some(&target))?;
    Emitter::new(&opts).diagnostics(&comp.diags, &sources);
    if comp.diags.has_errors() {
        return Ok(Outcome::InputErrors);
    }
    let target = target.target;
    // A target without rules to show (`ir`) traces iptables mode's decisions.
    let tracer = target.trace;
    // One view per family the queries need, made once.
    let mut views: Vec<(IpFamily, NodeView, Option<String>)> = Vec::new();
    let mode = tracer.map_or(Mode::Iptables, |t| t.mode());
    let mut out = String::new();
    let mut reports = Vec::new();
    for q in &qs {
        let fam = IpFamily::of(&q.to.ip());
        if !views.iter().any(|v| v.0 == fam) {
            let sel = NodeSelection {
                name: node.clone(),
                ips: nodes.node_ips.clone(),
            };
            let view = node_view(&comp.module, &sel, fam)
                .map_err(|d| Fail(format!("--node {node} ({}): {}", fam.as_str(), d.message)))?;
            let doc = match target.render {
                Render::Node(new) if tracer.is_some() => {
                    let mut text = String::new();
                    new(&params, Sharing::One).render_into(&view, &mut text);
                    Some(text)
                }
                _ => None,
            };
            views.push((fam, view, doc));
        }
        let (_, view, doc) = views.iter().find(|v| v.0 == fam).expect("made above");
        let packet = Packet {
            src: q.from,
            dst: q.to.ip(),
            port: q.to.port(),
            proto: q.proto,
            local_ips: local_ips.clone(),
            on_node: None,
        };
        let t = trace(view, &packet, mode);
        let rules = doc
            .as_deref()
            .map(|d| svc_targets::trace::rules(target.name, view, &t, q.to.ip(), q.to.port(), d));
        match opts.format {
            Format::Json => {
                let mut v = serde_json::to_value(&t).expect("trace serialises");
                v["packet"] = serde_json::json!({
                    "from": q.from.to_string(),
                    "to": q.to.to_string(),
                    "proto": q.proto.lower(),
                    "node": node,
                });
                if let Some(r) = &rules {
                    for (step, lines) in v["steps"].as_array_mut().expect("steps").iter_mut().zip(r)
                    {
                        step["rules"] = serde_json::json!(lines);
                    }
                }
                reports.push(v);
            }
            _ => {
                if qs.len() > 1 {
                    out += &format!("# {}\n", q.line);
                }
                // `q.to` as a socket address: an IPv6 address in brackets before its port.
                out += &format!(
                    "{} {} -> {}/{} on {node} ({})\n",
                    match t.origin {
                        svc_compiler::trace::Origin::Node => "node",
                        svc_compiler::trace::Origin::Pod => "pod",
                        svc_compiler::trace::Origin::Outside => "outside",
                    },
                    q.from,
                    q.to,
                    q.proto.lower(),
                    tracer.map_or("iptables rules", |t| t.heading())
                );
                for (i, line) in t.to_text().lines().enumerate() {
                    out += line;
                    out.push('\n');
                    if let Some(lines) = rules.as_ref().and_then(|r| r.get(i)) {
                        for l in lines {
                            out += &format!("      {l}\n");
                        }
                    }
                }
                if qs.len() > 1 {
                    out.push('\n');
                }
            }
        }
    }
    if opts.format == Format::Json {
        let v = if flows {
            serde_json::Value::Array(reports)
        } else {
            reports.pop().expect("one query")
        };
        out = serde_json::to_string_pretty(&v).expect("json") + "\n";
    }
    output(out_file.as_deref(), &out)?;
    Ok(Outcome::Done)
}
