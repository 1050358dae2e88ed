//! `svc-compile trace`: compile, take the node's view for the destination's family,
//! trace each packet (`svc_compiler::trace`) and, for `--target iptables|nftables`, show
//! the compiled document's lines behind each step (`svc_targets::trace`).

use crate::cli::{Command, Format, TraceFlags};
use crate::compile::{compile_inputs, Compiled};
use crate::report::{exit_code, Fail};
use std::net::{IpAddr, SocketAddr};
use svc_compiler::diag;
use svc_compiler::ir::{NodeView, Protocol};
use svc_compiler::net::IpFamily;
use svc_compiler::passes::node::{node_view, NodeSelection};
use svc_compiler::trace::{trace, Mode, Packet};
use svc_targets::{Render, Sharing};

pub fn run(cmd: &Command, flags: TraceFlags) -> u8 {
    exit_code(run_inner(cmd, flags))
}

/// One packet as written: `FROM TO [PROTO]`.
struct Query {
    from: IpAddr,
    to: SocketAddr,
    proto: Protocol,
    line: String,
}

fn parse_proto(s: &str) -> Result<Protocol, String> {
    match s.to_ascii_lowercase().as_str() {
        "tcp" => Ok(Protocol::TCP),
        "udp" => Ok(Protocol::UDP),
        "sctp" => Ok(Protocol::SCTP),
        _ => Err(format!("protocol `{s}`: use tcp, udp or sctp")),
    }
}

/// `IP`, `IP:PORT` or `[IPv6]:PORT`; the port of the sender does not matter to the rules.
fn parse_from(s: &str) -> Result<IpAddr, String> {
    s.parse::<IpAddr>()
        .or_else(|_| s.parse::<SocketAddr>().map(|a| a.ip()))
        .map_err(|_| format!("--from `{s}`: give IP or IP:PORT"))
}

fn parse_to(s: &str) -> Result<SocketAddr, String> {
    s.parse()
        .map_err(|_| format!("--to `{s}`: give IP:PORT ([IPv6]:PORT)"))
}

fn queries(flags: &TraceFlags) -> Result<Vec<Query>, Fail> {
    let usage = |e: String| Fail(e);
    if let Some(path) = &flags.flows {
        if flags.from.is_some() || flags.to.is_some() {
            return Err(Fail(
                "use either --flows FILE or --from/--to, not both".into(),
            ));
        }
        let text =
            std::fs::read_to_string(path).map_err(|e| Fail(format!("cannot read {path}: {e}")))?;
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
            out.push(Query {
                from: parse_from(w[0]).map_err(at)?,
                to: parse_to(w[1]).map_err(at)?,
                proto: parse_proto(w.get(2).copied().unwrap_or("tcp")).map_err(at)?,
                line: l.to_string(),
            });
        }
        return Ok(out);
    }
    let (Some(from), Some(to)) = (&flags.from, &flags.to) else {
        return Err(usage(
            "trace needs --from IP[:PORT] and --to IP:PORT (or --flows FILE)".into(),
        ));
    };
    Ok(vec![Query {
        from: parse_from(from).map_err(usage)?,
        to: parse_to(to).map_err(usage)?,
        proto: parse_proto(&flags.proto).map_err(usage)?,
        line: format!("{from} {to} {}", flags.proto),
    }])
}

fn run_inner(cmd: &Command, flags: TraceFlags) -> Result<u8, Fail> {
    let Some(node) = cmd.node.clone() else {
        return Err(Fail("trace needs --node NAME".into()));
    };
    if cmd.format == Format::Sarif {
        return Err(Fail("trace: --format is text or json".into()));
    }
    let target = cmd.target.name;
    if target != "ir" && !svc_targets::trace::TRACEABLE.contains(&target) {
        return Err(Fail(format!(
            "trace shows the rules of --target {}, not {target}",
            svc_targets::trace::TRACEABLE.join(", ")
        )));
    }
    let qs = queries(&flags)?;
    let local_ips = flags
        .local_ip
        .iter()
        .map(|s| {
            s.parse::<IpAddr>()
                .map_err(|_| Fail(format!("--local-ip `{s}` is not an IP address")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let Compiled {
        sources,
        comp,
        params,
        ..
    } = compile_inputs(cmd)?;
    if !comp.diags.items.is_empty() {
        match cmd.format {
            Format::Text => eprint!("{}", diag::render_all(&comp.diags, &sources)),
            _ => {
                let items: Vec<_> = comp
                    .diags
                    .items
                    .iter()
                    .map(|d| diag::to_json(d, &sources))
                    .collect();
                eprintln!("{}", serde_json::to_string_pretty(&items).expect("json"));
            }
        }
    }
    if comp.diags.has_errors() {
        return Ok(1);
    }
    // One view per family the queries need, made once.
    let mut views: Vec<(IpFamily, NodeView, Option<String>)> = Vec::new();
    let mode = if target == "nftables" {
        Mode::Nftables
    } else {
        Mode::Iptables
    };
    let mut out = String::new();
    let mut reports = Vec::new();
    for q in &qs {
        let fam = IpFamily::of(&q.to.ip());
        if !views.iter().any(|v| v.0 == fam) {
            let sel = NodeSelection {
                name: node.clone(),
                ips: cmd.node_ips.clone(),
            };
            let view = node_view(&comp.module, &sel, fam)
                .map_err(|d| Fail(format!("--node {node} ({}): {}", fam.as_str(), d.message)))?;
            let doc = match cmd.target.render {
                Render::Node(new) if target != "ir" => {
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
        };
        let t = trace(view, &packet, mode);
        let rules = doc
            .as_deref()
            .map(|d| svc_targets::trace::rules(target, view, &t, q.to.ip(), q.to.port(), d));
        match cmd.format {
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
                out += &format!(
                    "{} {} -> {}:{}/{} on {node} ({})\n",
                    match t.origin {
                        svc_compiler::trace::Origin::Node => "node",
                        svc_compiler::trace::Origin::Pod => "pod",
                        svc_compiler::trace::Origin::Outside => "outside",
                    },
                    q.from,
                    q.to.ip(),
                    q.to.port(),
                    q.proto.lower(),
                    match (target, mode) {
                        ("ipvs", _) => {
                            "ipvs rules; the verdict is iptables mode's, not checked against IPVS"
                        }
                        (_, Mode::Iptables) => "iptables rules",
                        (_, Mode::Nftables) => "nftables rules",
                    }
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
    if cmd.format == Format::Json {
        let v = if flags.flows.is_some() {
            serde_json::Value::Array(reports)
        } else {
            reports.pop().expect("one query")
        };
        out = serde_json::to_string_pretty(&v).expect("json") + "\n";
    }
    std::io::Write::write_all(&mut std::io::stdout(), out.as_bytes())
        .map_err(|e| Fail(format!("cannot write: {e}")))?;
    Ok(0)
}
