//! Arguments, in two stages: clap reads the flags as written ([`Cli`]), then they are
//! checked and turned into a [`Command`] with the same one-line messages as every other
//! usage error. Targets, their `--help` lines and their own flags come from the registry
//! ([`svc_targets::TARGETS`]); nothing here names a target.

use clap::builder::{PossibleValue, PossibleValuesParser};
use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{ArgAction, Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use svc_compiler::net::{Cidr, IpFamily};
use svc_compiler::passes::{parse_port_range, parse_service_cidrs};
use svc_targets::{Params, Target};

const ABOUT: &str = "Compile Kubernetes Service manifests into kube-proxy dataplane rulesets";

const AFTER_HELP: &str = "\
PATHS are files, directories (read recursively: *.yaml, *.yml, *.json) or `-` for stdin.
Multi-document YAML, JSON and `kind: List` dumps (kubectl get ... -o yaml) are accepted.
`svc-compile PATHS... [OPTIONS]` is `svc-compile compile PATHS... [OPTIONS]`.";

const EXIT_CODES: &str = "\
Exit codes:
  0  success (warnings may have been printed)
  1  the input has errors (each printed as error[SVCnnn] at file:line:col)
  2  usage, I/O or apply failure (apply: nothing or the previous state is loaded)";

#[derive(Parser)]
#[command(
    name = "svc-compile",
    version,
    about = ABOUT,
    args_override_self = true,
    propagate_version = true,
    disable_help_subcommand = true,
    subcommand_required = true
)]
struct Cli {
    #[command(subcommand)]
    sub: Sub,
}

#[derive(Subcommand)]
enum Sub {
    /// Validate the manifests; exit 1 on errors
    Check(CompileFlags),
    /// Compile the manifests for a target (the default command)
    Compile(CompileFlags),
    /// Compile for this node and load the result here (needs root; see README.md)
    Apply {
        #[command(flatten)]
        compile: CompileFlags,
        #[command(flatten)]
        apply: ApplyFlags,
    },
    /// Compare a node's live (or saved) rules with the compiled ruleset; exit 1 on drift
    Drift {
        #[command(flatten)]
        compile: CompileFlags,
        #[command(flatten)]
        drift: DriftFlags,
    },
    /// What the node does with one packet, step by step, and the rules that do it
    Trace {
        #[command(flatten)]
        compile: CompileFlags,
        #[command(flatten)]
        trace: TraceFlags,
    },
    /// Write a synthetic cluster for benchmarks (deterministic from the seed)
    Gen(GenFlags),
    /// Print shell completions
    Completions {
        #[arg(value_enum)]
        shell: Shell,
    },
    /// Print the man page (roff)
    Man,
    /// What changes between two revisions of the manifests; exit 1 on changes
    Diff(DiffFlags),
}

/// `svc-compile trace`: the packet (`--target iptables|nftables` adds their rules; the
/// compile flags' `--format text|json` is the report's format).
#[derive(Args)]
pub(crate) struct TraceFlags {
    /// The sender: IP[:PORT] (a node IP = the node itself; the local-traffic detector decides pod or outside)
    #[arg(long, value_name = "IP[:PORT]")]
    pub from: Option<String>,
    /// The destination: IP:PORT
    #[arg(long, value_name = "IP:PORT")]
    pub to: Option<String>,
    /// The protocol
    #[arg(long, value_name = "PROTO", default_value = "tcp", value_parser = ["tcp", "udp", "sctp"])]
    pub proto: String,
    /// Another address local to the node (repeatable): node ports are reached there too
    #[arg(long, value_name = "IP")]
    pub local_ip: Vec<String>,
    /// Trace many packets: one `FROM TO [PROTO]` per line (`#` comments); one report each
    #[arg(long, value_name = "FILE")]
    pub flows: Option<String>,
}

#[derive(Clone, Copy, ValueEnum)]
enum Shell {
    Bash,
    Zsh,
    Fish,
}

#[derive(Args)]
struct CompileFlags {
    /// Files, directories or `-` for stdin
    #[arg(value_name = "PATHS")]
    paths: Vec<String>,
    /// What to write
    #[arg(long, value_name = "TARGET", default_value = "ir")]
    target: String,
    /// Compile for this node (a Node manifest, or --node-ip)
    #[arg(long, value_name = "NAME")]
    node: Option<String>,
    /// The node's IP (repeatable); for nodes without a manifest
    #[arg(long, value_name = "IP")]
    node_ip: Vec<String>,
    /// The IP family to compile for [default: the primary family of --service-cluster-ip-range]
    #[arg(long, value_name = "ipv4|ipv6")]
    family: Option<String>,
    /// Compile for every Node manifest (needs --out)
    #[arg(long)]
    all_nodes: bool,
    /// Write one file per node and family into DIR
    #[arg(long, value_name = "DIR")]
    out: Option<String>,
    /// Write only this part, for a target whose output has several (see Targets)
    #[arg(long, value_name = "PART")]
    part: Option<String>,
    /// Write the output to FILE instead of stdout
    #[arg(short = 'o', long, value_name = "FILE")]
    output: Option<String>,
    /// Comma-separated, one per family [default: 10.96.0.0/12, kubeadm's; kube-apiserver's
    /// own is 10.0.0.0/24; with --no-allocate: inferred from the input]
    #[arg(long, value_name = "CIDRS")]
    service_cluster_ip_range: Option<String>,
    /// [default: 30000-32767]
    #[arg(long, value_name = "RANGE")]
    service_node_port_range: Option<String>,
    /// [default: cluster.local]
    #[arg(long, value_name = "DOMAIN")]
    cluster_domain: Option<String>,
    /// Compile objects exactly as given (a live-cluster dump)
    #[arg(long)]
    no_allocate: bool,
    /// Keep allocations stable across commits (read if present)
    #[arg(long, value_name = "FILE")]
    lock: Option<String>,
    /// Write the allocations back to the --lock file
    #[arg(long)]
    write_lock: bool,
    /// How diagnostics are printed (sarif: for code scanning in CI)
    #[arg(long, value_name = "FORMAT", default_value = "text", value_parser = ["text", "json", "sarif"])]
    format: String,
    /// Leave out files and directories the glob matches (repeatable; `*`, `?`, `**`;
    /// e.g. 'templates/**')
    #[arg(long, value_name = "GLOB")]
    exclude: Vec<String>,
    /// Read only the files a glob matches (repeatable; both also filter files named on the
    /// command line)
    #[arg(long, value_name = "GLOB")]
    include: Vec<String>,
    /// Colour text diagnostics: auto = on a terminal unless NO_COLOR is set
    #[arg(long, value_name = "WHEN", default_value = "auto", value_parser = ["auto", "always", "never"])]
    color: String,
    /// The node's iptables supports MASQUERADE --random-fully (kube-proxy detects it)
    /// [default: ClusterConfig `randomFully`, else on]
    #[arg(long, value_name = "on|off", value_parser = ["on", "off"])]
    random_fully: Option<String>,
    /// The node has kube-proxy's nfacct counters (kube-proxy detects it) [default:
    /// ClusterConfig `nfacct`, else off]
    #[arg(long, value_name = "on|off", value_parser = ["on", "off"])]
    nfacct: Option<String>,
    /// The nftables targets' layout: kube-proxy's (diffs against a live node) or fast
    /// (loads a large node in seconds; see README) [default: ClusterConfig `nftLayout`,
    /// else kube-proxy]
    #[arg(long, value_name = "LAYOUT", value_parser = ["kube-proxy", "fast"])]
    nft_layout: Option<String>,
}

#[derive(Args)]
#[command(next_help_heading = "Apply options")]
struct ApplyFlags {
    /// Load inside network namespace NAME (ip netns)
    #[arg(long, value_name = "NAME")]
    netns: Option<String>,
    /// Print the commands and documents, change nothing
    #[arg(long)]
    dry_run: bool,
    /// Apply an already compiled document
    #[arg(long, value_name = "FILE")]
    from: Option<String>,
    /// Apply the document loaded before the last apply
    #[arg(long)]
    rollback: bool,
    /// Rewrite everything owned, not only what changed
    #[arg(long)]
    full: bool,
    /// nftables: read a first load back and record the kernel's listing, even when the
    /// nf_tables generation proves it (default: a fingerprint of the table)
    #[arg(long)]
    read_back: bool,
    /// [default: /var/lib/svc-compile/<netns or host>]
    #[arg(long, value_name = "DIR")]
    state_dir: Option<String>,
    /// Wait at most this long for another apply [default: 30]
    #[arg(long, value_name = "SECONDS")]
    lock_timeout: Option<String>,
    /// ebpf: the cgroup v2 directory the socket load balancer serves [default: the
    /// cgroup2 mount's root]
    #[arg(long, value_name = "PATH")]
    cgroup: Option<String>,
}

#[derive(Args)]
#[command(next_help_heading = "Drift options")]
struct DriftFlags {
    /// Read the node's rules inside network namespace NAME (ip netns)
    #[arg(long, value_name = "NAME", conflicts_with = "from_saved")]
    netns: Option<String>,
    /// Compare with a saved listing instead of the node: `iptables-save` output (counters
    /// are dropped) or `nft -j list ruleset` / `nft -j list table ...`
    #[arg(long, value_name = "FILE")]
    from_saved: Option<String>,
}

/// The flags only `drift` takes.
#[derive(Debug, Default)]
pub struct DriftArgs {
    pub netns: Option<String>,
    pub from_saved: Option<String>,
}

#[derive(Args)]
struct GenFlags {
    /// Services to generate
    #[arg(long, value_name = "N", default_value = "1000")]
    services: String,
    /// Endpoints per service
    #[arg(long, value_name = "M", default_value = "10")]
    endpoints: String,
    /// Nodes the endpoints are spread over
    #[arg(long, value_name = "K", default_value = "1")]
    nodes: String,
    /// The generator's seed
    #[arg(long, value_name = "S", default_value = "1")]
    seed: String,
    /// A kind: List as kubectl prints it, or one YAML document per object
    #[arg(long, value_name = "FORMAT", default_value = "yaml", value_parser = ["yaml", "yaml-stream", "json"])]
    format: String,
    /// Write to FILE instead of stdout
    #[arg(short = 'o', long, value_name = "FILE")]
    output: Option<String>,
}

/// `svc-compile diff` (checked and run by `diff.rs`).
#[derive(Args, Debug)]
#[command(after_help = "\
Exit codes:
  0  no change
  1  changes (the report is printed)
  2  usage, I/O or git failure, or input errors in either revision (printed)")]
pub struct DiffFlags {
    /// The old revision: a path, or `git:REV:PATH` (read with git, no checkout)
    #[arg(value_name = "OLD")]
    pub old: String,
    /// The new revision, like OLD
    #[arg(value_name = "NEW")]
    pub new: String,
    /// Also compare what this node does (a Node manifest)
    #[arg(long, value_name = "NAME")]
    pub node: Option<String>,
    /// Compare every Node manifest of either revision
    #[arg(long, conflicts_with = "node")]
    pub all_nodes: bool,
    /// The per-node target whose rulesets --rules compares
    #[arg(long, value_name = "TARGET", default_value = "iptables")]
    pub target: String,
    /// Add the unified diff of the compiled rulesets per node and family
    #[arg(long)]
    pub rules: bool,
    /// How the report is printed
    #[arg(long, value_name = "FORMAT", default_value = "text", value_parser = ["text", "json", "markdown"])]
    pub format: String,
    /// Compile objects exactly as given (live-cluster dumps)
    #[arg(long)]
    pub no_allocate: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
    Sarif,
}

pub struct Command {
    pub check: bool,
    pub paths: Vec<String>,
    pub target: &'static Target,
    /// The target's own flags, as given (a file flag's value is still the path).
    pub params: Params,
    pub node: Option<String>,
    pub node_ips: Vec<std::net::IpAddr>,
    pub family: Option<IpFamily>,
    pub all_nodes: bool,
    pub out_dir: Option<String>,
    /// `--part`: checked against the target's renderer when it is made (`run.rs`).
    pub part: Option<String>,
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
    /// `--color`: `None` = auto (a terminal, and NO_COLOR unset), else always / never.
    pub color: Option<bool>,
    /// `--random-fully on|off`, `--nfacct on|off`: node capabilities.
    pub random_fully: Option<bool>,
    pub nfacct: Option<bool>,
    /// `--nft-layout kube-proxy|fast`.
    pub nft_layout: Option<svc_compiler::ir::NftLayout>,
    /// `svc-compile apply ...`.
    pub apply: Option<Box<ApplyArgs>>,
    /// `svc-compile drift ...`.
    pub drift: Option<Box<DriftArgs>>,
}

/// The flags only `apply` takes.
#[derive(Debug, Default)]
pub struct ApplyArgs {
    pub netns: Option<String>,
    pub dry_run: bool,
    pub from: Option<String>,
    pub rollback: bool,
    pub full: bool,
    /// `--read-back`.
    pub read_back: bool,
    pub state_dir: Option<String>,
    pub lock_timeout: Option<f64>,
    /// `--cgroup` (ebpf only).
    pub cgroup: Option<String>,
}

pub enum Parsed {
    /// Text to print on stdout, then exit 0 (help, version, completions, man page).
    Print(String),
    /// Boxed: a `Command` is several times the size of the other variants.
    Run(Box<Command>),
    Gen(GenCommand),
    Diff(Box<DiffFlags>),
    /// `svc-compile trace`: the compile part checked like `compile`'s.
    Trace(Box<Command>, TraceFlags),
}

#[derive(Debug)]
pub struct GenCommand {
    pub shape: svc_compiler::synth::Shape,
    pub format: svc_compiler::synth::Format,
    pub output: Option<String>,
}

/// The parser, with every target of `targets` and its flags.
fn command(targets: &[&'static Target]) -> clap::Command {
    let mut help = String::from("Targets:\n");
    let width = targets.iter().map(|t| t.name.len()).max().unwrap_or(0);
    for t in targets {
        help += &format!("  {:width$}  {}\n", t.name, t.about);
    }
    let after = format!("{AFTER_HELP}\n\n{help}\n{EXIT_CODES}");
    let values: Vec<PossibleValue> = targets
        .iter()
        .map(|t| PossibleValue::new(t.name).help(t.about))
        .collect();
    let mut flags: Vec<clap::Arg> = Vec::new();
    for f in targets.iter().flat_map(|t| t.flags) {
        if flags.iter().any(|a| a.get_id() == f.name) {
            continue; // two targets may share a flag name
        }
        flags.push(
            clap::Arg::new(f.name)
                .long(f.name)
                .value_name(f.value_name)
                .help(f.help)
                .help_heading("Target options")
                .action(ArgAction::Append),
        );
    }
    let compiling = |c: clap::Command| {
        c.mut_arg("target", |a| {
            a.value_parser(PossibleValuesParser::new(values.clone()))
        })
        .args(flags.clone())
        .after_help(EXIT_CODES)
    };
    Cli::command()
        .after_help(after)
        .mut_subcommand("check", compiling)
        .mut_subcommand("compile", compiling)
        .mut_subcommand("apply", compiling)
        .mut_subcommand("drift", compiling)
        .mut_subcommand("trace", compiling)
}

const SUBCOMMANDS: &[&str] = &[
    "check",
    "compile",
    "apply",
    "drift",
    "trace",
    "gen",
    "completions",
    "man",
    "diff",
];

pub fn parse(args: &[String]) -> Result<Parsed, String> {
    parse_with(args, svc_targets::TARGETS)
}

/// [`parse`] with the targets given (tests use made-up ones).
pub(crate) fn parse_with(args: &[String], targets: &[&'static Target]) -> Result<Parsed, String> {
    let mut cmd = command(targets);
    // `svc-compile PATHS...` compiles, as it always has.
    let first = args.first().map(String::as_str);
    let default = match first {
        None => true,
        Some(a) => !SUBCOMMANDS.contains(&a) && !matches!(a, "-h" | "--help" | "-V" | "--version"),
    };
    let argv = std::iter::once("svc-compile")
        .chain(default.then_some("compile"))
        .chain(args.iter().map(String::as_str));
    let matches = match cmd.try_get_matches_from_mut(argv) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::DisplayHelp => {
            return Ok(Parsed::Print(e.render().to_string()));
        }
        // clap names the subcommand (`svc-compile-check`); the program is one.
        Err(e) if e.kind() == ErrorKind::DisplayVersion => {
            return Ok(Parsed::Print(format!(
                "svc-compile {}\n",
                env!("CARGO_PKG_VERSION")
            )));
        }
        Err(e) => return Err(message(&e, targets)),
    };
    let cli = Cli::from_arg_matches(&matches).map_err(|e| message(&e, targets))?;
    let sub_matches = matches.subcommand().map(|(_, m)| m);
    match cli.sub {
        Sub::Check(c) => compile_command(c, None, true, sub_matches, targets),
        Sub::Compile(c) => compile_command(c, None, false, sub_matches, targets),
        Sub::Apply { compile, apply } => {
            compile_command(compile, Some(apply), false, sub_matches, targets)
        }
        Sub::Drift { compile, drift } => drift_command(compile, drift, sub_matches, targets),
        Sub::Trace { compile, trace } => {
            match compile_command(compile, None, true, sub_matches, targets)? {
                Parsed::Run(cmd) => Ok(Parsed::Trace(cmd, trace)),
                other => Ok(other),
            }
        }
        Sub::Gen(g) => gen_command(g),
        Sub::Completions { shell } => {
            let shell = match shell {
                Shell::Bash => clap_complete::Shell::Bash,
                Shell::Zsh => clap_complete::Shell::Zsh,
                Shell::Fish => clap_complete::Shell::Fish,
            };
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut cmd, "svc-compile", &mut out);
            Ok(Parsed::Print(String::from_utf8_lossy(&out).into_owned()))
        }
        Sub::Man => man_page(cmd).map(Parsed::Print),
        Sub::Diff(d) => Ok(Parsed::Diff(Box::new(d))),
    }
}

/// One roff page: the program's, then each command's synopsis and options (rather than
/// references to per-command pages that are not installed).
fn man_page(cmd: clap::Command) -> Result<String, String> {
    let fail = |e: std::io::Error| format!("cannot render the man page: {e}");
    let mut out = Vec::new();
    let mut subs: Vec<clap::Command> = cmd.get_subcommands().cloned().collect();
    subs.sort_by_key(|s| SUBCOMMANDS.iter().position(|n| *n == s.get_name()));
    let notes = cmd
        .get_after_help()
        .map(|h| h.to_string())
        .unwrap_or_default();
    let page = clap_mangen::Man::new(cmd);
    page.render_title(&mut out).map_err(fail)?;
    page.render_name_section(&mut out).map_err(fail)?;
    page.render_synopsis_section(&mut out).map_err(fail)?;
    page.render_description_section(&mut out).map_err(fail)?;
    for sub in subs {
        let name = sub.get_name().to_string();
        let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
        out.extend(format!(".SH \"SVC-COMPILE {}\"\n{about}\n", name.to_uppercase()).bytes());
        let sub = clap_mangen::Man::new(sub.name(format!("svc-compile {name}")));
        sub.render_synopsis_section(&mut out).map_err(fail)?;
        sub.render_options_section(&mut out).map_err(fail)?;
    }
    // The notes of `--help` (paths, targets, exit codes) as written.
    out.extend(b".SH NOTES\n.nf\n");
    for line in notes.lines() {
        out.extend(format!("\\&{}\n", line.replace('\\', "\\e")).bytes());
    }
    out.extend(b".fi\n");
    page.render_version_section(&mut out).map_err(fail)?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// A clap error as one line, in the words of the rest of the CLI.
fn message(e: &clap::Error, targets: &[&'static Target]) -> String {
    let get = |kind| match e.get(kind) {
        Some(ContextValue::String(s)) => Some(s.clone()),
        _ => None,
    };
    // `--format <FORMAT>` → `--format`; a positional `<SHELL>` → `shell`.
    let name = |a: &str| {
        let first = a.split([' ', '=']).next().unwrap_or_default();
        match first.strip_prefix('<').and_then(|f| f.strip_suffix('>')) {
            Some(positional) => positional.to_ascii_lowercase(),
            None => first.to_string(),
        }
    };
    let flag = get(ContextKind::InvalidArg).map(|a| name(&a));
    match (e.kind(), flag) {
        (ErrorKind::MissingRequiredArgument, _) => match e.get(ContextKind::InvalidArg) {
            Some(ContextValue::Strings(missing)) => {
                format!("missing {}", one_of(missing.iter().map(|m| name(m))))
            }
            _ => "an argument is missing".into(),
        },
        (ErrorKind::UnknownArgument, Some(f)) if APPLY_FLAGS.contains(&f.as_str()) => {
            format!("{f} belongs to `svc-compile apply`")
        }
        (ErrorKind::UnknownArgument, Some(f)) if f.starts_with('-') => {
            format!("unknown flag `{f}`")
        }
        (ErrorKind::UnknownArgument, Some(a)) => format!("unexpected argument `{a}`"),
        (ErrorKind::InvalidValue, Some(f)) => match get(ContextKind::InvalidValue) {
            Some(v) if v.is_empty() => format!("{f} needs a value"),
            Some(v) if f == "--target" => format!(
                "unknown target `{v}`: use {}",
                one_of(targets.iter().map(|t| t.name))
            ),
            Some(v) => match e.get(ContextKind::ValidValue) {
                Some(ContextValue::Strings(valid)) => {
                    format!("{f} `{v}`: use {}", one_of(valid))
                }
                _ => format!("{f} `{v}` is not valid"),
            },
            None => format!("{f} needs a value"),
        },
        _ => {
            // Other errors: clap's first line, without its `error: ` and quoting.
            let text = e.render().to_string();
            let line = text.lines().next().unwrap_or_default();
            line.trim_start_matches("error: ").replace('\'', "`")
        }
    }
}

/// `a, b or c`.
pub(crate) fn one_of<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> String {
    let names: Vec<S> = names.into_iter().collect();
    match names.split_last() {
        None => String::new(),
        Some((last, [])) => last.as_ref().to_string(),
        Some((last, rest)) => {
            let rest: Vec<&str> = rest.iter().map(AsRef::as_ref).collect();
            format!("{} or {}", rest.join(", "), last.as_ref())
        }
    }
}

const APPLY_FLAGS: &[&str] = &[
    "--netns",
    "--dry-run",
    "--from",
    "--rollback",
    "--full",
    "--read-back",
    "--state-dir",
    "--lock-timeout",
];

fn gen_command(g: GenFlags) -> Result<Parsed, String> {
    use svc_compiler::synth::{Format, Shape, MAX_NODES};
    let number = |flag: &str, v: &str| {
        v.parse::<usize>()
            .map_err(|_| format!("{flag} `{v}` is not a number"))
    };
    let shape = Shape {
        services: number("--services", &g.services)?,
        endpoints: number("--endpoints", &g.endpoints)?,
        nodes: number("--nodes", &g.nodes)?,
        seed: number("--seed", &g.seed)? as u64,
    };
    let format = match g.format.as_str() {
        "yaml" => Format::YamlList,
        "yaml-stream" => Format::YamlStream,
        _ => Format::Json,
    };
    if !(1..=MAX_NODES).contains(&shape.nodes) {
        return Err(format!("--nodes must be between 1 and {MAX_NODES}"));
    }
    Ok(Parsed::Gen(GenCommand {
        shape,
        format,
        output: g.output,
    }))
}

fn compile_command(
    c: CompileFlags,
    apply: Option<ApplyFlags>,
    check: bool,
    matches: Option<&clap::ArgMatches>,
    targets: &[&'static Target],
) -> Result<Parsed, String> {
    let target = *targets
        .iter()
        .find(|t| t.name == c.target)
        .expect("clap checks --target");
    let mut params = Params::default();
    for f in targets.iter().flat_map(|t| t.flags) {
        let given: Vec<&String> = matches
            .and_then(|m| m.get_many::<String>(f.name))
            .into_iter()
            .flatten()
            .collect();
        if given.is_empty() || params.get(f.name).is_some() {
            continue;
        }
        let Some(own) = target.flags.iter().find(|o| o.name == f.name) else {
            let owners: Vec<&str> = targets
                .iter()
                .filter(|t| t.flags.iter().any(|o| o.name == f.name))
                .map(|t| t.name)
                .collect();
            return Err(format!(
                "--{} belongs to --target {}",
                f.name,
                one_of(owners)
            ));
        };
        if !own.repeatable && given.len() > 1 {
            return Err(format!("--{} is given more than once", f.name));
        }
        for v in given {
            params.push(own.name, v.clone());
        }
    }
    let node_ips = c
        .node_ip
        .iter()
        .map(|s| {
            s.parse()
                .map_err(|_| format!("--node-ip `{s}` is not an IP address"))
        })
        .collect::<Result<_, _>>()?;
    let family = match c.family.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None => None,
        Some("ipv4" | "4") => Some(IpFamily::IPv4),
        Some("ipv6" | "6") => Some(IpFamily::IPv6),
        Some(f) => return Err(format!("--family `{f}`: use ipv4 or ipv6")),
    };
    let service_cidrs = c
        .service_cluster_ip_range
        .map(|s| parse_service_cidrs(&s).map_err(|e| format!("--service-cluster-ip-range: {e}")))
        .transpose()?;
    let node_port_range = c
        .service_node_port_range
        .map(|s| parse_port_range(&s).map_err(|e| format!("--service-node-port-range: {e}")))
        .transpose()?;
    let format = match c.format.as_str() {
        "json" => Format::Json,
        "sarif" => Format::Sarif,
        _ => Format::Text,
    };
    let apply = apply.map(apply_args).transpose()?.map(Box::new);
    let cmd = Command {
        check,
        paths: c.paths,
        target,
        params,
        node: c.node,
        node_ips,
        family,
        all_nodes: c.all_nodes,
        out_dir: c.out,
        part: c.part,
        output: c.output,
        service_cidrs,
        node_port_range,
        cluster_domain: c.cluster_domain,
        allocate: !c.no_allocate,
        lock: c.lock,
        write_lock: c.write_lock,
        format,
        exclude: c.exclude,
        include: c.include,
        color: match c.color.as_str() {
            "always" => Some(true),
            "never" => Some(false),
            _ => None,
        },
        random_fully: c.random_fully.map(|v| v == "on"),
        nfacct: c.nfacct.map(|v| v == "on"),
        nft_layout: c
            .nft_layout
            .as_deref()
            .and_then(svc_compiler::ir::NftLayout::parse),
        apply,
        drift: None,
    };
    if let Some(apply) = &cmd.apply {
        if cmd.part.is_some() {
            return Err("apply loads the whole document: --part is for compile".into());
        }
        check_apply(&cmd, apply, targets)?;
        return Ok(Parsed::Run(Box::new(cmd)));
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
    if !cmd.check && cmd.target.per_node() && cmd.node.is_none() && !cmd.all_nodes {
        return Err("this target needs --node NAME (or --all-nodes --out DIR)".into());
    }
    Ok(Parsed::Run(Box::new(cmd)))
}

/// `svc-compile drift`: a compile for one node of a target `apply` can load, and where to
/// read the node's state.
fn drift_command(
    c: CompileFlags,
    d: DriftFlags,
    matches: Option<&clap::ArgMatches>,
    targets: &[&'static Target],
) -> Result<Parsed, String> {
    let Parsed::Run(mut cmd) = compile_command(c, None, false, matches, targets)? else {
        unreachable!("compile_command gives a run")
    };
    if !cmd.target.planner.is_some_and(|p| p.drift()) {
        let names: Vec<String> = targets
            .iter()
            .filter(|t| t.planner.is_some_and(|p| p.drift()))
            .map(|t| format!("--target {}", t.name))
            .collect();
        return Err(format!("drift needs {}", one_of(&names)));
    }
    if cmd.node.is_none() {
        return Err("drift needs --node NAME: the node the rules are compiled for".into());
    }
    if cmd.all_nodes || cmd.out_dir.is_some() || cmd.part.is_some() || cmd.write_lock {
        return Err(
            "drift compares one node: --all-nodes, --out, --part and --write-lock do not apply"
                .into(),
        );
    }
    cmd.drift = Some(Box::new(DriftArgs {
        netns: d.netns,
        from_saved: d.from_saved,
    }));
    Ok(Parsed::Run(cmd))
}

fn apply_args(a: ApplyFlags) -> Result<ApplyArgs, String> {
    let lock_timeout = a
        .lock_timeout
        .map(|s| {
            s.parse::<f64>()
                .ok()
                .filter(|t| t.is_finite() && *t >= 0.0)
                .ok_or_else(|| format!("--lock-timeout `{s}`: give seconds, e.g. 30"))
        })
        .transpose()?;
    Ok(ApplyArgs {
        netns: a.netns,
        dry_run: a.dry_run,
        from: a.from,
        rollback: a.rollback,
        full: a.full,
        read_back: a.read_back,
        state_dir: a.state_dir,
        lock_timeout,
        cgroup: a.cgroup,
    })
}

fn check_apply(
    cmd: &Command,
    apply: &ApplyArgs,
    targets: &[&'static Target],
) -> Result<(), String> {
    let in_process = svc_node::ebpf::applies(cmd.target);
    if apply.cgroup.is_some() && !in_process {
        return Err("--cgroup is for apply --target ebpf".into());
    }
    if cmd.target.planner.is_none() && !in_process {
        let appliable = targets
            .iter()
            .filter(|t| t.planner.is_some() || svc_node::ebpf::applies(t))
            .map(|t| format!("--target {}", t.name));
        let names: Vec<String> = appliable.collect();
        if names.is_empty() {
            return Err("apply: no target can be applied".into());
        }
        return Err(format!("apply needs {}", one_of(&names)));
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

#[cfg(test)]
mod tests {
    use super::*;
    use svc_targets::{Flag, Render};

    /// A cluster-wide target with flags of every kind, as DNS or templates will have.
    const FAKE: Target = Target {
        name: "fake",
        about: "a target with flags",
        ext: "txt",
        render: Render::Cluster(|_, _, params| {
            Ok(vec![svc_targets::File {
                name: "params".into(),
                text: format!("{params:?}"),
            }])
        }),
        flags: &[
            Flag {
                name: "zone",
                value_name: "ZONE",
                help: "a zone (repeatable)",
                repeatable: true,
                file: false,
            },
            Flag {
                name: "template",
                value_name: "FILE",
                help: "a template",
                repeatable: false,
                file: true,
            },
        ],
        planner: None,
        trace: None,
    };
    const TARGETS: &[&Target] = &[&svc_targets::ir::TARGET, &FAKE];

    fn parse(args: &[&str]) -> Result<Command, String> {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        match parse_with(&args, TARGETS)? {
            Parsed::Run(cmd) => Ok(*cmd),
            _ => panic!("not a run"),
        }
    }

    #[test]
    fn the_parser_is_consistent() {
        command(svc_targets::TARGETS).debug_assert();
        command(TARGETS).debug_assert();
    }

    #[test]
    fn target_flags_come_from_the_registry() {
        let cmd = parse(&["m/", "--target", "fake", "--zone", "a", "--zone=b"]).unwrap();
        assert_eq!(cmd.target.name, "fake");
        assert_eq!(cmd.params.all("zone"), ["a", "b"]);
        assert_eq!(cmd.params.get("template"), None);
        let cmd = parse(&["check", "m/", "--target", "fake", "--template", "t.txt"]).unwrap();
        assert_eq!(cmd.params.get("template"), Some("t.txt"));
        // A cluster-wide target needs no --node.
        assert!(cmd.node.is_none());
    }

    #[test]
    fn target_flags_are_checked() {
        let err = |args: &[&str]| parse(args).err().expect("an error");
        assert_eq!(
            err(&["m/", "--zone", "a"]),
            "--zone belongs to --target fake"
        );
        assert_eq!(
            err(&[
                "m/",
                "--target",
                "fake",
                "--template",
                "a",
                "--template",
                "b"
            ]),
            "--template is given more than once"
        );
        assert_eq!(
            err(&["m/", "--target", "nope"]),
            "unknown target `nope`: use ir or fake"
        );
        let Err(missing) = parse_with(&["completions".to_string()], TARGETS) else {
            panic!("completions without a shell")
        };
        assert_eq!(missing, "missing shell");
        assert_eq!(
            err(&["apply", "--from", "x", "--target", "fake"]),
            "apply: no target can be applied"
        );
    }

    #[test]
    fn help_lists_the_targets_and_their_flags() {
        let args = |a: &[&str]| a.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        let Ok(Parsed::Print(help)) = parse_with(&args(&["--help"]), TARGETS) else {
            panic!("help")
        };
        assert!(help.contains("  fake  a target with flags"), "{help}");
        let Ok(Parsed::Print(help)) = parse_with(&args(&["compile", "--help"]), TARGETS) else {
            panic!("help")
        };
        assert!(help.contains("--template <FILE>"), "{help}");
        assert!(help.contains("a zone (repeatable)"), "{help}");
    }
}
