//! `--target env`: the service environment variables kubelet gives a container in a
//! namespace (kubelet's `getServiceEnvVarMap` and `envvars.FromServices`).
//!
//! Which services: those with a cluster IP (not headless, not ExternalName, not left
//! unallocated) of the pod's namespace when `enableServiceLinks` is true (the default),
//! plus `default/kubernetes` always. A service named `kubernetes` in the pod's own
//! namespace replaces the master one when service links are on (kubelet keys its map by
//! service name and lets the namespace's service overwrite the master service).
//!
//! Per service, with `SVC` = the name upper-cased and `-` → `_`, and the primary cluster IP:
//! `SVC_SERVICE_HOST`, `SVC_SERVICE_PORT` (the first port), `SVC_SERVICE_PORT_<NAME>` per
//! named port, then Docker's link variables: `SVC_PORT` (`proto://host:port` of the first
//! port, IPv6 in brackets), and per port `SVC_PORT_<port>_<PROTO>` plus `_PROTO`, `_PORT`,
//! `_ADDR` (the bare IP).
//!
//! Invariant: the output is sorted by variable name. Kubelet keeps the variables in a Go
//! map, so the order a container sees is unspecified; its own tests sort by name, and so
//! do we. A name produced twice keeps the last value (a map); with valid service names
//! that cannot happen.

use std::collections::BTreeMap;
use std::fmt::Write;
use svc_compiler::ir::{Module, Service};
use svc_compiler::net::join_host_port;

/// kubelet's `masterServices` in `metav1.NamespaceDefault`.
const MASTER_NAMESPACE: &str = "default";
const MASTER_SERVICE: &str = "kubernetes";

#[derive(Clone, Debug)]
pub struct Options {
    /// The pod's `spec.enableServiceLinks` (the API server defaults it to true).
    pub enable_service_links: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            enable_service_links: true,
        }
    }
}

/// `--target env [--namespace NS]`: one `NS.env` file per namespace (every namespace
/// that has services, or NS), each headed by a `# namespace NS` comment.
pub const TARGET: crate::Target = crate::Target {
    name: "env",
    about: "the service environment variables kubelet gives a pod, per namespace",
    ext: "env",
    render: crate::Render::Cluster(|module, _, params| Ok(render_env(module, params)?)),
    flags: &[NAMESPACE],
    planner: None,
    trace: None,
    deprecated: None,
};

/// `--target env-json [--namespace NS]`: with NS, `NS.json`, a container's `env` list;
/// without, `env.json`, an object of those lists by namespace (one JSON document).
pub const JSON_TARGET: crate::Target = crate::Target {
    name: "env-json",
    about: "the service environment variables as a container's env list (JSON)",
    ext: "json",
    render: crate::Render::Cluster(|module, _, params| Ok(render_json(module, params)?)),
    flags: &[NAMESPACE],
    planner: None,
    trace: None,
    deprecated: None,
};

const NAMESPACE: crate::Flag = crate::Flag {
    name: "namespace",
    value_name: "NS",
    help: "env, env-json: the pod's namespace [default: every namespace with services]",
    repeatable: false,
    file: false,
};

/// The namespaces a run renders: `--namespace`, or every one that has services. A
/// namespace is a DNS label, which also keeps `--out DIR/NS.env` inside DIR.
fn chosen(module: &Module, params: &crate::Params) -> Result<Vec<String>, String> {
    match params.get("namespace") {
        Some(ns) => {
            let label = !ns.is_empty()
                && ns.len() <= 63
                && ns
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !ns.starts_with('-')
                && !ns.ends_with('-');
            if !label {
                return Err(format!(
                    "--namespace `{ns}` is not a namespace name (a DNS label: a-z, 0-9, -)"
                ));
            }
            Ok(vec![ns.to_string()])
        }
        None => Ok(namespaces(module)),
    }
}

fn render_env(module: &Module, params: &crate::Params) -> Result<Vec<crate::File>, String> {
    Ok(chosen(module, params)?
        .into_iter()
        .map(|ns| crate::File {
            text: format!("# namespace {ns}\n{}", write_env(module, &ns)),
            name: format!("{ns}.env"),
        })
        .collect())
}

fn render_json(module: &Module, params: &crate::Params) -> Result<Vec<crate::File>, String> {
    if params.get("namespace").is_some() {
        return Ok(chosen(module, params)?
            .into_iter()
            .map(|ns| crate::File {
                text: write_json(module, &ns),
                name: format!("{ns}.json"),
            })
            .collect());
    }
    let opts = Options::default();
    let all: serde_json::Map<String, serde_json::Value> = namespaces(module)
        .into_iter()
        .map(|ns| {
            let list = variables(module, &ns, &opts)
                .into_iter()
                .map(|(name, value)| serde_json::json!({"name": name, "value": value}))
                .collect();
            (ns, serde_json::Value::Array(list))
        })
        .collect();
    let mut text = serde_json::to_string_pretty(&all).unwrap_or_default();
    text.push('\n');
    Ok(vec![crate::File {
        name: "env.json".into(),
        text,
    }])
}

/// The variables of a container in `namespace`, sorted by name.
pub fn variables(module: &Module, namespace: &str, opts: &Options) -> Vec<(String, String)> {
    // Services by name, as kubelet's serviceMap.
    let mut chosen: BTreeMap<&str, &Service> = BTreeMap::new();
    for svc in module.services.iter().filter(|s| !s.cluster_ips.is_empty()) {
        if svc.namespace == MASTER_NAMESPACE && svc.name == MASTER_SERVICE {
            chosen.entry(&svc.name).or_insert(svc);
        } else if svc.namespace == namespace && opts.enable_service_links {
            chosen.insert(&svc.name, svc);
        }
    }
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    for svc in chosen.values() {
        from_service(svc, &mut vars);
    }
    vars.into_iter().collect()
}

/// kubelet's `FromServices` for one service.
fn from_service(svc: &Service, vars: &mut BTreeMap<String, String>) {
    let (Some(ip), Some(first)) = (svc.cluster_ips.first(), svc.ports.first()) else {
        // No ports: the API server rejects such a service (kubelet would index ports[0]).
        return;
    };
    let prefix = env_name(&svc.name);
    let host = ip.to_string();
    vars.insert(format!("{prefix}_SERVICE_HOST"), host.clone());
    vars.insert(format!("{prefix}_SERVICE_PORT"), first.port.to_string());
    for p in svc.ports.iter().filter(|p| !p.name.is_empty()) {
        vars.insert(
            format!("{prefix}_SERVICE_PORT_{}", env_name(&p.name)),
            p.port.to_string(),
        );
    }
    for (i, p) in svc.ports.iter().enumerate() {
        let proto = p.protocol.lower();
        let url = format!("{proto}://{}", join_host_port(ip, p.port));
        if i == 0 {
            vars.insert(format!("{prefix}_PORT"), url.clone());
        }
        let pp = format!("{prefix}_PORT_{}_{}", p.port, p.protocol.as_str());
        vars.insert(format!("{pp}_PROTO"), proto.to_string());
        vars.insert(format!("{pp}_PORT"), p.port.to_string());
        vars.insert(format!("{pp}_ADDR"), host.clone());
        vars.insert(pp, url);
    }
}

/// kubelet's `makeEnvVariableName`: upper case, `-` → `_`.
pub fn env_name(s: &str) -> String {
    s.replace('-', "_").to_ascii_uppercase()
}

/// Namespaces that have services, sorted: one env file each for `--all-namespaces`.
pub fn namespaces(module: &Module) -> Vec<String> {
    let mut ns: Vec<String> = module
        .services
        .iter()
        .map(|s| s.namespace.clone())
        .collect();
    ns.dedup();
    ns
}

/// `KEY=value` lines (values are IPs, ports and URLs: nothing to quote).
pub fn write_env(module: &Module, namespace: &str) -> String {
    write_env_with(module, namespace, &Options::default())
}

pub fn write_env_with(module: &Module, namespace: &str, opts: &Options) -> String {
    let mut out = String::new();
    for (k, v) in variables(module, namespace, opts) {
        let _ = writeln!(out, "{k}={v}");
    }
    out
}

/// A JSON array of `{"name": ..., "value": ...}`, a container's `env` as written in a Pod.
pub fn write_json(module: &Module, namespace: &str) -> String {
    write_json_with(module, namespace, &Options::default())
}

pub fn write_json_with(module: &Module, namespace: &str, opts: &Options) -> String {
    let list: Vec<serde_json::Value> = variables(module, namespace, opts)
        .into_iter()
        .map(|(name, value)| serde_json::json!({"name": name, "value": value}))
        .collect();
    let mut s = serde_json::to_string_pretty(&list).unwrap_or_default();
    s.push('\n');
    s
}

#[cfg(test)]
mod tests;
