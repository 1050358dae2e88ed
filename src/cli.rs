//! Arguments, in two stages: flags as written, then a checked [`Command`].

use svc_compiler::net::{Cidr, IpFamily};
use svc_compiler::passes::{parse_port_range, parse_service_cidrs};

pub const USAGE: &str = "\
svc-compile: compile Kubernetes Service manifests into kube-proxy dataplane rulesets

USAGE:
    svc-compile check PATHS... [OPTIONS]
    svc-compile PATHS... --target TARGET [--node NAME | --all-nodes --out DIR] [OPTIONS]
    svc-compile apply PATHS... --target iptables|nftables --node NAME [APPLY OPTIONS] [OPTIONS]
    svc-compile apply --from FILE | --rollback --target iptables|nftables [APPLY OPTIONS]
    svc-compile gen --services N --endpoints M --nodes K [--seed S] [--format F] [-o FILE]

PATHS are files, directories (read recursively: *.yaml, *.yml, *.json) or `-` for stdin.
Multi-document YAML, JSON and `kind: List` dumps (kubectl get ... -o yaml) are accepted.

TARGETS:
    ir              the resolved IR as JSON (with --node: plus that node's view)
    iptables        iptables-restore input, as kube-proxy's iptables mode loads it
    nftables        nft -f input, as kube-proxy's nftables mode loads it
    nftables-json   the same as nft -j -f input

OPTIONS:
    --target TARGET                    output format (default: ir)
    --node NAME                        compile for this node (a Node manifest, or --node-ip)
    --node-ip IP                       the node's IP (repeatable); for nodes without a manifest
    --family ipv4|ipv6                 the IP family to compile for (default: the primary
                                       family of --service-cluster-ip-range)
    --all-nodes                        compile for every Node manifest (needs --out)
    --out DIR                          write one file per node and family into DIR
    -o, --output FILE                  write the output to FILE instead of stdout
    --service-cluster-ip-range CIDRS   comma-separated, one per family (default 10.96.0.0/12,
                                       kubeadm's; with --no-allocate: inferred from the input)
    --service-node-port-range RANGE    default 30000-32767
    --cluster-domain DOMAIN            default cluster.local
    --no-allocate                      compile objects exactly as given (a live-cluster dump)
    --lock FILE                        keep allocations stable across commits (read if present)
    --write-lock                       write the allocations back to the --lock file
    --exclude GLOB                     leave out files and directories the glob matches
                                       (repeatable; `*`, `?`, `**`; e.g. 'templates/**')
    --include GLOB                     read only the files a glob matches (repeatable;
                                       both also filter files named on the command line)
    --format text|json|sarif           how diagnostics are printed (default: text;
                                       sarif for code-scanning in CI)
    -h, --help                         this text
    -V, --version                      the version

APPLY OPTIONS (load the result on this node; needs root, see README.md):
    --netns NAME                       load inside network namespace NAME (ip netns)
    --dry-run                          print the commands and documents, change nothing
    --from FILE                        apply an already compiled document
    --rollback                         apply the document loaded before the last apply
    --full                             rewrite everything owned, not only what changed
    --state-dir DIR                    default /var/lib/svc-compile/<netns or host>
    --lock-timeout SECONDS             wait at most this long for another apply (default 30)

GEN (a synthetic cluster for benchmarks; deterministic from the seed):
    --services N / --endpoints M / --nodes K   N services with M endpoints each on K nodes
    --seed S                           default 1
    --format yaml|yaml-stream|json     a kind: List as kubectl prints it (default yaml),
                                       or one YAML document per object

EXIT CODES:
    0  success (warnings may have been printed)
    1  the input has errors (each printed as error[SVCnnn] at file:line:col)
    2  usage, I/O or apply failure (apply: nothing or the previous state is loaded)
";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Ir,
    Iptables,
    Nftables,
    NftablesJson,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
    Sarif,
}

#[derive(Debug)]
pub struct Command {
    pub check: bool,
    pub paths: Vec<String>,
    pub target: Target,
    pub node: Option<String>,
    pub node_ips: Vec<std::net::IpAddr>,
    pub family: Option<IpFamily>,
    pub all_nodes: bool,
    pub out_dir: Option<String>,
    pub output: Option<String>,
    pub service_cidrs: Option<Vec<Cidr>>,
    pub node_port_range: Option<(u16, u16)>,
    pub cluster_domain: Option<String>,
    pub allocate: bool,
    pub lock: Option<String>,
    pub write_lock: bool,
    pub format: Format,
    /// `--exclude GLOB` / `--include GLOB` (repeatable): which files are read.
    pub exclude: Vec<String>,
    pub include: Vec<String>,
    /// `svc-compile apply ...`.
    pub apply: Option<Box<ApplyArgs>>,
}

/// The flags only `apply` takes.
#[derive(Debug, Default)]
pub struct ApplyArgs {
    pub netns: Option<String>,
    pub dry_run: bool,
    pub from: Option<String>,
    pub rollback: bool,
    pub full: bool,
    pub state_dir: Option<String>,
    pub lock_timeout: Option<f64>,
}

pub enum Parsed {
    Help(String),
    Run(Command),
    Gen(GenCommand),
}

#[derive(Debug)]
pub struct GenCommand {
    pub shape: svc_compiler::synth::Shape,
    pub format: svc_compiler::synth::Format,
    pub output: Option<String>,
}

fn parse_gen(args: &[String]) -> Result<Parsed, String> {
    use svc_compiler::synth::{Format, Shape, MAX_NODES};
    let mut shape = Shape {
        services: 1000,
        endpoints: 10,
        nodes: 1,
        seed: 1,
    };
    let (mut format, mut output) = (Format::YamlList, None);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |v: &String| {
            v.parse::<usize>()
                .map_err(|_| format!("{flag} `{v}` is not a number"))
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(Parsed::Help(USAGE.to_string())),
            "--services" => shape.services = number(value()?)?,
            "--endpoints" => shape.endpoints = number(value()?)?,
            "--nodes" => shape.nodes = number(value()?)?,
            "--seed" => shape.seed = number(value()?)? as u64,
            "--format" => {
                format = match value()?.as_str() {
                    "yaml" => Format::YamlList,
                    "yaml-stream" => Format::YamlStream,
                    "json" => Format::Json,
                    f => return Err(format!("--format `{f}`: use yaml, yaml-stream or json")),
                }
            }
            "-o" | "--output" => output = Some(value()?.clone()),
            _ => return Err(format!("gen: unknown flag `{flag}`")),
        }
    }
    if !(1..=MAX_NODES).contains(&shape.nodes) {
        return Err(format!("--nodes must be between 1 and {MAX_NODES}"));
    }
    Ok(Parsed::Gen(GenCommand {
        shape,
        format,
        output,
    }))
}

pub fn parse(args: &[String]) -> Result<Parsed, String> {
    if args.first().is_some_and(|a| a == "gen") {
        return parse_gen(&args[1..]);
    }
    let mut cmd = Command {
        check: false,
        paths: vec![],
        target: Target::Ir,
        node: None,
        node_ips: vec![],
        family: None,
        all_nodes: false,
        out_dir: None,
        output: None,
        service_cidrs: None,
        node_port_range: None,
        cluster_domain: None,
        allocate: true,
        lock: None,
        write_lock: false,
        format: Format::Text,
        exclude: vec![],
        include: vec![],
        apply: None,
    };
    let mut it = args.iter().peekable();
    if it.peek().is_some_and(|a| *a == "check") {
        cmd.check = true;
        it.next();
    } else if it.peek().is_some_and(|a| *a == "apply") {
        cmd.apply = Some(Box::default());
        it.next();
    } else if it.peek().is_some_and(|a| *a == "compile") {
        it.next();
    }
    let mut only_paths = false;
    while let Some(a) = it.next() {
        let mut value = |flag: &str| -> Result<String, String> {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        if only_paths || a == "-" || !a.starts_with('-') {
            cmd.paths.push(a.clone());
            continue;
        }
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (a.as_str(), None),
        };
        let mut v = |f: &str| inline.clone().map_or_else(|| value(f), Ok);
        match flag {
            "--" => only_paths = true,
            "-h" | "--help" => return Ok(Parsed::Help(USAGE.to_string())),
            "-V" | "--version" => {
                return Ok(Parsed::Help(format!(
                    "svc-compile {}\n",
                    env!("CARGO_PKG_VERSION")
                )))
            }
            "--target" => {
                cmd.target = match v(flag)?.as_str() {
                    "ir" => Target::Ir,
                    "iptables" => Target::Iptables,
                    "nftables" => Target::Nftables,
                    "nftables-json" => Target::NftablesJson,
                    t => {
                        return Err(format!(
                            "unknown target `{t}`: use ir, iptables, nftables or nftables-json"
                        ))
                    }
                }
            }
            "--node" => cmd.node = Some(v(flag)?),
            "--node-ip" => {
                let s = v(flag)?;
                cmd.node_ips.push(
                    s.parse()
                        .map_err(|_| format!("--node-ip `{s}` is not an IP address"))?,
                );
            }
            "--family" => {
                cmd.family = Some(match v(flag)?.to_ascii_lowercase().as_str() {
                    "ipv4" | "4" => IpFamily::IPv4,
                    "ipv6" | "6" => IpFamily::IPv6,
                    f => return Err(format!("--family `{f}`: use ipv4 or ipv6")),
                })
            }
            "--all-nodes" => cmd.all_nodes = true,
            "--out" => cmd.out_dir = Some(v(flag)?),
            "-o" | "--output" => cmd.output = Some(v(flag)?),
            "--service-cluster-ip-range" => {
                cmd.service_cidrs = Some(
                    parse_service_cidrs(&v(flag)?)
                        .map_err(|e| format!("--service-cluster-ip-range: {e}"))?,
                )
            }
            "--service-node-port-range" => {
                cmd.node_port_range = Some(
                    parse_port_range(&v(flag)?)
                        .map_err(|e| format!("--service-node-port-range: {e}"))?,
                )
            }
            "--cluster-domain" => cmd.cluster_domain = Some(v(flag)?),
            "--no-allocate" => cmd.allocate = false,
            "--exclude" => cmd.exclude.push(v(flag)?),
            "--include" => cmd.include.push(v(flag)?),
            "--lock" => cmd.lock = Some(v(flag)?),
            "--write-lock" => cmd.write_lock = true,
            "--format" => {
                cmd.format = match v(flag)?.as_str() {
                    "text" => Format::Text,
                    "json" => Format::Json,
                    "sarif" => Format::Sarif,
                    f => return Err(format!("--format `{f}`: use text, json or sarif")),
                }
            }
            _ => match cmd.apply.as_mut() {
                Some(apply) => parse_apply_flag(apply, flag, &mut v)?,
                None if APPLY_FLAGS.contains(&flag) => {
                    return Err(format!("{flag} belongs to `svc-compile apply`"))
                }
                None => return Err(format!("unknown flag `{a}`")),
            },
        }
    }
    if let Some(apply) = &cmd.apply {
        check_apply(&cmd, apply)?;
        return Ok(Parsed::Run(cmd));
    }
    if cmd.paths.is_empty() {
        return Err("no input: give files, directories or `-` for stdin".into());
    }
    if cmd.write_lock && cmd.lock.is_none() {
        return Err("--write-lock needs --lock FILE".into());
    }
    if cmd.all_nodes && cmd.out_dir.is_none() {
        return Err("--all-nodes needs --out DIR".into());
    }
    if cmd.all_nodes && cmd.node.is_some() {
        return Err("use either --node or --all-nodes, not both".into());
    }
    if !cmd.check && cmd.target != Target::Ir && cmd.node.is_none() && !cmd.all_nodes {
        return Err("this target needs --node NAME (or --all-nodes --out DIR)".into());
    }
    Ok(Parsed::Run(cmd))
}

const APPLY_FLAGS: &[&str] = &[
    "--netns",
    "--dry-run",
    "--from",
    "--rollback",
    "--full",
    "--state-dir",
    "--lock-timeout",
];

/// One `apply` flag; anything else is unknown.
fn parse_apply_flag(
    apply: &mut ApplyArgs,
    flag: &str,
    value: &mut dyn FnMut(&str) -> Result<String, String>,
) -> Result<(), String> {
    match flag {
        "--netns" => apply.netns = Some(value(flag)?),
        "--dry-run" => apply.dry_run = true,
        "--from" => apply.from = Some(value(flag)?),
        "--rollback" => apply.rollback = true,
        "--full" => apply.full = true,
        "--state-dir" => apply.state_dir = Some(value(flag)?),
        "--lock-timeout" => {
            let s = value(flag)?;
            apply.lock_timeout = Some(
                s.parse::<f64>()
                    .ok()
                    .filter(|t| t.is_finite() && *t >= 0.0)
                    .ok_or_else(|| format!("--lock-timeout `{s}`: give seconds, e.g. 30"))?,
            );
        }
        _ => return Err(format!("unknown flag `{flag}`")),
    }
    Ok(())
}

fn check_apply(cmd: &Command, apply: &ApplyArgs) -> Result<(), String> {
    if !matches!(cmd.target, Target::Iptables | Target::Nftables) {
        return Err("apply needs --target iptables or --target nftables".into());
    }
    let sources = [!cmd.paths.is_empty(), apply.from.is_some(), apply.rollback];
    match sources.iter().filter(|s| **s).count() {
        0 => return Err("apply needs manifests (PATHS), --from FILE or --rollback".into()),
        1 => {}
        _ => return Err("apply takes one of PATHS, --from FILE and --rollback".into()),
    }
    if !cmd.paths.is_empty() && cmd.node.is_none() {
        return Err("apply needs --node NAME: the node this ruleset is for".into());
    }
    if cmd.all_nodes || cmd.out_dir.is_some() || cmd.output.is_some() || cmd.write_lock {
        return Err(
            "apply loads one node's ruleset: --all-nodes, --out, -o and --write-lock do not apply"
                .into(),
        );
    }
    Ok(())
}
