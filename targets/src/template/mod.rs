//! `--target template --template FILE`: user templates (minijinja, a Jinja2 dialect)
//! rendered over [`View`], a documented and versioned view of the IR.
//!
//! The view is a contract with template authors: fields are only added within a
//! `viewVersion`; renaming or removing one bumps [`VIEW_VERSION`]. It is built from the
//! IR here (not the IR's own serde form), so IR refactors do not break templates. The one
//! exception is `views`, the node views, which are the IR's `NodeView` as the `ir` target
//! prints it (documented as such in docs/templates.md, "The view").
//!
//! Environment: undefined variables and attributes are errors (strict), no auto-escaping,
//! `trim_blocks` and `lstrip_blocks` on (a block tag's line leaves no blank line), the
//! template's trailing newline is kept. Errors carry the template's name and line.
//!
//! Invariant: pure and deterministic: the view's lists follow the IR's sorted order, and
//! templates see no clock, environment or file system.

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Serde, Value};
use minijinja::{AutoEscape, Environment, UndefinedBehavior};
use serde::Serialize;
use std::fmt;
use std::net::IpAddr;
use svc_compiler::diag::Diagnostic;
use svc_compiler::ir::{Module, NodeView, ServiceType, TargetPort};
use svc_compiler::source::{FileId, Span};

/// The view's schema version (`viewVersion` in templates).
pub const VIEW_VERSION: u32 = 1;

/// What a template sees at its top level.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct View<'a> {
    pub view_version: u32,
    pub cluster_domain: &'a str,
    #[serde(rename = "serviceCIDRs")]
    pub service_cidrs: Vec<String>,
    /// Sorted by (namespace, name).
    pub services: Vec<ServiceV<'a>>,
    /// Every port of every service that has a cluster IP, flattened, in service order then
    /// spec order; `index` counts from 0 (for allocating local ports in proxy configs).
    pub service_ports: Vec<FlatPort<'a>>,
    /// The node this rendering is for, when one was given.
    pub node: Option<&'a str>,
    /// The node's views, one per IP family (the IR's `NodeView`); empty without a node.
    pub views: &'a [NodeView],
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceV<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    /// `ClusterIP`, `NodePort`, `LoadBalancer` or `ExternalName`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub headless: bool,
    /// `name.namespace.svc.<clusterDomain>` (no trailing dot).
    pub dns_name: String,
    /// Primary first; empty for headless, ExternalName and unallocated services.
    #[serde(rename = "clusterIPs")]
    pub cluster_ips: Vec<IpAddr>,
    pub external_name: Option<&'a str>,
    #[serde(rename = "externalIPs")]
    pub external_ips: &'a [IpAddr],
    /// `sessionAffinity: ClientIP` timeout in seconds; `None` without affinity.
    pub session_affinity_timeout: Option<u32>,
    /// In spec order.
    pub ports: Vec<PortV<'a>>,
    /// A service without ports (headless: DNS only): its endpoints, port 0. Empty when
    /// the service has ports.
    pub portless_endpoints: Vec<EndpointV<'a>>,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PortV<'a> {
    /// Empty when the port has no name.
    pub name: &'a str,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: &'static str,
    pub port: u16,
    pub node_port: Option<u16>,
    /// A number, or the name of a container port.
    pub target_port: String,
    /// Sorted by `ip:port`.
    pub endpoints: Vec<EndpointV<'a>>,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointV<'a> {
    pub ip: IpAddr,
    pub port: u16,
    /// `ip:port`, `[ip]:port` for IPv6.
    pub addr: &'a str,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
    pub node_name: Option<&'a str>,
    pub zone: Option<&'a str>,
    /// The DNS hostname (`hostname`, or a Pod's `spec.hostname` under its subdomain).
    pub hostname: Option<&'a str>,
}

/// One service port with its service's identity, for flat loops.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FlatPort<'a> {
    pub index: usize,
    pub namespace: &'a str,
    pub service: &'a str,
    pub dns_name: String,
    #[serde(rename = "clusterIPs")]
    pub cluster_ips: Vec<IpAddr>,
    pub session_affinity_timeout: Option<u32>,
    #[serde(flatten)]
    pub port: PortV<'a>,
}

fn endpoint_v(e: &svc_compiler::ir::Endpoint) -> EndpointV<'_> {
    EndpointV {
        ip: e.ip,
        port: e.port,
        addr: &e.addr,
        ready: e.ready,
        serving: e.serving,
        terminating: e.terminating,
        node_name: e.node_name.as_deref(),
        zone: e.zone.as_deref(),
        hostname: e.hostname.as_deref(),
    }
}

/// Builds the view. `views` are the node's views (empty for none).
pub fn view<'a>(module: &'a Module, views: &'a [NodeView]) -> View<'a> {
    let domain = module.cluster.cluster_domain.trim_end_matches('.');
    let services: Vec<ServiceV> = module
        .services
        .iter()
        .map(|s| ServiceV {
            namespace: &s.namespace,
            name: &s.name,
            kind: match s.kind {
                ServiceType::ClusterIP => "ClusterIP",
                ServiceType::NodePort => "NodePort",
                ServiceType::LoadBalancer => "LoadBalancer",
                ServiceType::ExternalName => "ExternalName",
            },
            headless: s.headless,
            dns_name: format!("{}.{}.svc.{domain}", s.name, s.namespace),
            cluster_ips: s.cluster_ips.clone(),
            external_name: s.external_name.as_deref(),
            external_ips: &s.external_ips,
            session_affinity_timeout: s.session_affinity_timeout,
            ports: s
                .ports
                .iter()
                .map(|p| PortV {
                    name: &p.name,
                    protocol: p.protocol.as_str(),
                    port: p.port,
                    node_port: p.node_port,
                    target_port: match &p.target_port {
                        TargetPort::Number(n) => n.to_string(),
                        TargetPort::Name(n) => n.clone(),
                    },
                    endpoints: p.endpoints.iter().map(endpoint_v).collect(),
                })
                .collect(),
            portless_endpoints: s.portless_endpoints.iter().map(endpoint_v).collect(),
        })
        .collect();
    let service_ports = services
        .iter()
        .filter(|s| !s.cluster_ips.is_empty())
        .flat_map(|s| {
            s.ports.iter().map(|p| FlatPort {
                index: 0,
                namespace: s.namespace,
                service: s.name,
                dns_name: s.dns_name.clone(),
                cluster_ips: s.cluster_ips.clone(),
                session_affinity_timeout: s.session_affinity_timeout,
                port: p.clone(),
            })
        })
        .enumerate()
        .map(|(i, mut p)| {
            p.index = i;
            p
        })
        .collect();
    View {
        view_version: VIEW_VERSION,
        cluster_domain: domain,
        service_cidrs: module
            .cluster
            .service_cidrs
            .iter()
            .map(|c| c.to_string())
            .collect(),
        services,
        service_ports,
        node: views.first().map(|v| v.node_name.as_str()),
        views,
    }
}

/// `--target template --template FILE...`: each template rendered once per node selected
/// (its views of every family rendered together), or once without a node. A file is
/// named after its template without `.j2`/`.jinja` (`haproxy.cfg.j2` → `haproxy.cfg`),
/// prefixed with the node (`node-a.haproxy.cfg`) when there is one.
pub const TARGET: crate::Target = crate::Target {
    name: "template",
    about: "your minijinja templates rendered over a versioned view of the IR",
    ext: "txt",
    render: crate::Render::Cluster(render_target),
    flags: &[crate::Flag {
        name: "template",
        value_name: "FILE",
        help: "template: a minijinja template to render (repeatable)",
        repeatable: true,
        file: true,
    }],
    planner: None,
    trace: None,
    deprecated: None,
};

fn render_target(
    module: &Module,
    views: &[NodeView],
    params: &crate::Params,
) -> Result<Vec<crate::File>, crate::RenderError> {
    let texts = params.all("template");
    if texts.is_empty() {
        return Err("needs --template FILE (examples in examples/templates/)"
            .to_string()
            .into());
    }
    // The nodes in the order selected, each with its views (one per family).
    let mut nodes: Vec<&[NodeView]> = Vec::new();
    let mut rest = views;
    while let Some(first) = rest.first() {
        let n = rest
            .iter()
            .take_while(|v| v.node_name == first.node_name)
            .count();
        nodes.push(&rest[..n]);
        rest = &rest[n..];
    }
    if nodes.is_empty() {
        nodes.push(&[]);
    }
    let files = params.files("template");
    let mut out: Vec<crate::File> = Vec::new();
    for (i, text) in texts.iter().enumerate() {
        let (path, id) = match files.get(i) {
            Some((path, id)) => (path.as_str(), Some(*id)),
            None => ("template", None),
        };
        let base = path.rsplit('/').next().unwrap_or(path);
        let base = base
            .strip_suffix(".j2")
            .or_else(|| base.strip_suffix(".jinja"))
            .unwrap_or(base);
        for node in &nodes {
            let name = match node.first() {
                Some(v) => format!("{}.{base}", v.node_name),
                None => base.to_string(),
            };
            if out.iter().any(|f| f.name == name) {
                return Err(format!("two templates would both write {name}: rename one").into());
            }
            let text = render(module, node, path, text).map_err(|e| match id {
                Some(id) => crate::RenderError::Input(Box::new(e.diagnostic(id))),
                None => crate::RenderError::Usage(e.to_string()),
            })?;
            out.push(crate::File { name, text });
        }
    }
    Ok(out)
}

/// The diagnostic code of a template that failed to parse or render.
pub const TEMPLATE_ERROR_CODE: &str = "SVC501";

/// A template that failed to parse or render.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TemplateError {
    /// The name the template was given (its file name).
    pub name: String,
    /// 1-based line in the template, when minijinja knows it.
    pub line: Option<usize>,
    /// 1-based column (characters) and length of the failing expression, when known.
    pub col: Option<(usize, usize)>,
    /// What went wrong, e.g. `undefined value: services.foo`.
    pub message: String,
}

impl TemplateError {
    /// The error as a diagnostic pointing into the template, once the CLI has added the
    /// template file to the `SourceMap` as `file` (without a line: the whole file).
    pub fn diagnostic(&self, file: FileId) -> Diagnostic {
        let d = Diagnostic::error(TEMPLATE_ERROR_CODE, format!("template: {}", self.message))
            .hint("the template sees the view documented in docs/templates.md");
        match self.line {
            Some(line) => {
                let (col, len) = self.col.unwrap_or((1, 0));
                d.at(Span::new(file, line as u32, col as u32, len as u32))
            }
            None => d,
        }
    }
}

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self.line {
            Some(l) => write!(f, "{}:{l}: {}", self.name, self.message),
            None => write!(f, "{}: {}", self.name, self.message),
        }
    }
}

impl std::error::Error for TemplateError {}

/// Renders the template `text` (called `name` in errors) over the view of `module` and
/// the node's `views` (empty for no node).
pub fn render(
    module: &Module,
    views: &[NodeView],
    name: &str,
    text: &str,
) -> Result<String, TemplateError> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    let syntax = SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .keep_trailing_newline(true)
        .build();
    if let Ok(syntax) = syntax {
        env.set_syntax(syntax);
    }
    let err = |e: minijinja::Error| {
        let mut message = e.kind().to_string();
        if let Some(d) = e.detail() {
            message = format!("{message}: {d}");
        }
        // The byte range of the failing expression → column and length in characters.
        let col = e.range().filter(|r| r.end <= text.len()).and_then(|r| {
            let start = text.get(..r.start)?;
            let line_start = start.rfind('\n').map_or(0, |i| i + 1);
            let col = start[line_start..].chars().count() + 1;
            Some((col, text.get(r)?.chars().count()))
        });
        TemplateError {
            name: name.to_string(),
            line: e.line(),
            col,
            message,
        }
    };
    let tmpl = env.template_from_named_str(name, text).map_err(err)?;
    tmpl.render(Value::from(Serde(view(module, views))))
        .map_err(err)
}

#[cfg(test)]
mod tests;
