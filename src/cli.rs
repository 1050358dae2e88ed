//! Arguments, in two stages: clap reads the flags as written ([`Cli`]), then they are
//! checked and turned into one [`Run`] per subcommand, with the same one-line messages as
//! every other usage error. Each subcommand owns its flags; the targets it takes, their
//! `--help` lines and their own flags come from the registry ([`svc_targets::TARGETS`]);
//! nothing here names a target.
//!
//! Plain data: this module imports nothing of the crate (the commands import it).

use clap::builder::{PossibleValue, PossibleValuesParser};
use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{ArgAction, Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use std::net::{IpAddr, SocketAddr};
use svc_compiler::ir::{NftLayout, Protocol, TopologyKeys};
use svc_compiler::net::{Cidr, IpFamily};
use svc_compiler::passes::{parse_port_range, parse_service_cidrs};
use svc_targets::{Params, Target};

const ABOUT: &str = "Compile Kubernetes Service manifests into kube-proxy dataplane rulesets";

const AFTER_HELP: &str = "\
PATHS are files, directories (read recursively: *.yaml, *.yml, *.json) or `-` for stdin.
Multi-document YAML, JSON and `kind: List` dumps (kubectl get ... -o yaml) are accepted.
Settings no flag gives come from .svc-compile.yaml, in the working directory or above
(--config FILE, --no-config); see docs/ci.md.
`svc-compile PATHS... [OPTIONS]` is `svc-compile compile PATHS... [OPTIONS]`.";

/// Each command's exit codes, for its `--help` (the program's: `None`).
fn exit_codes(sub: Option<&str>) -> String {
    let (ok, one, two) = match sub {
        Some("check") => ("no errors (warnings may have been printed)", ERRORS, USAGE),
        Some("compile") => ("written (warnings may have been printed)", ERRORS, USAGE),
        Some("apply") => (
            "applied, or nothing to do",
            "the input has errors (printed; nothing is loaded)",
            "usage, I/O or apply failure (nothing or the previous state is loaded)",
        ),
        Some("agent") => (
            "stopped by SIGTERM or SIGINT (the rules stay loaded, as kube-proxy leaves them)",
            "-",
            "could not start: usage, not root, no such namespace, a path that cannot be watched",
        ),
        Some("cleanup") => (
            "removed, or nothing of ours there",
            "-",
            "usage, I/O or cleanup failure (the target's records are kept: run it again)",
        ),
        Some("drift") => ("no drift", "drift (the report is printed)", DIFFERS),
        Some("trace") => ("traced", ERRORS, USAGE),
        Some("diff") => ("no change", "changes (the report is printed)", DIFFERS),
        Some("migrate") => (
            "no difference",
            "differences (the report is printed)",
            DIFFERS,
        ),
        Some(_) => ("written", "-", USAGE),
        None => (
            "success (warnings may have been printed)",
            "the input has errors; drift and diff: drift or changes",
            "usage, I/O or apply failure (apply: nothing or the previous state is loaded)",
        ),
    };
    let one = match one {
        "-" => String::new(),
        _ => format!("  1  {one}\n"),
    };
    format!("Exit codes:\n  0  {ok}\n{one}  2  {two}")
}

const ERRORS: &str = "the input has errors (each printed as error[SVCnnn] at file:line:col)";
const USAGE: &str = "usage, I/O or rendering failure, or a .svc-compile.yaml with errors (printed)";
const DIFFERS: &str =
    "anything else: usage, I/O, a tool's failure, or errors in the input (printed)";

#[derive(Parser)]
#[command(
    name = "svc-compile",
    version,
    about = ABOUT,
    args_override_self = true,
    propagate_version = true,
    subcommand_required = true
)]
struct Cli {
    #[command(subcommand)]
    sub: Sub,
}

#[derive(Subcommand)]
enum Sub {
    /// Validate the manifests; exit 1 on errors
    Check {
        #[command(flatten)]
        inputs: InputFlags,
        #[command(flatten)]
        lock: WriteLockFlag,
        /// Write the report (any --format) to FILE instead of stdout
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        report: Option<String>,
    },
    /// Compile the manifests for a target (the default command)
    Compile {
        #[command(flatten)]
        inputs: InputFlags,
        #[command(flatten)]
        node: NodeFlags,
        #[command(flatten)]
        output: OutputFlags,
        #[command(flatten)]
        lock: WriteLockFlag,
    },
    /// Compile for this node and load the result here (needs root; see docs/apply.md)
    Apply {
        #[command(flatten)]
        inputs: InputFlags,
        #[command(flatten)]
        node: NodeFlags,
        #[command(flatten)]
        apply: ApplyFlags,
    },
    /// Stay resident: apply the manifests at start, when they change and every sync period
    /// (kube-proxy's job on a node, from files; needs root)
    Agent {
        #[command(flatten)]
        inputs: InputFlags,
        #[command(flatten)]
        node: NodeFlags,
        #[command(flatten)]
        agent: AgentFlags,
    },
    /// Remove everything apply loaded for a target on this node, and its records (needs root)
    Cleanup(CleanupFlags),
    /// Compare a node's live (or saved) rules with the compiled ruleset; exit 1 on drift
    Drift {
        #[command(flatten)]
        inputs: InputFlags,
        #[command(flatten)]
        node: NodeFlags,
        #[command(flatten)]
        drift: DriftFlags,
    },
    /// What the node does with one packet, step by step, and the rules that do it
    Trace {
        #[command(flatten)]
        inputs: InputFlags,
        #[command(flatten)]
        node: NodeFlags,
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
    /// What changes for each packet when a node moves between proxy modes; exit 1 on differences
    Migrate {
        #[command(flatten)]
        inputs: InputFlags,
        #[command(flatten)]
        node: NodeFlags,
        #[command(flatten)]
        migrate: MigrateFlags,
    },
}

/// The subcommands in help order (and the words that are not paths of the default command).
const SUBCOMMANDS: &[&str] = &[
    "check",
    "compile",
    "apply",
    "agent",
    "cleanup",
    "drift",
    "trace",
    "gen",
    "completions",
    "man",
    "diff",
    "migrate",
    "help",
];

#[derive(Clone, Copy, ValueEnum)]
enum Shell {
    Bash,
    Zsh,
    Fish,
}

/// What every compiling command reads and how it reports.
#[derive(Args)]
struct InputFlags {
    /// Files, directories or `-` for stdin
    #[arg(value_name = "PATHS")]
    paths: Vec<String>,
    /// Comma-separated, one per family [default: 10.96.0.0/12, kubeadm's; kube-apiserver's
    /// own is 10.0.0.0/24; with --no-allocate: inferred from the input]
    #[arg(long, value_name = "CIDRS")]
    service_cluster_ip_range: Option<String>,
    /// [default: 30000-32767]
    #[arg(long, value_name = "RANGE")]
    service_node_port_range: Option<String>,
    /// RFC 1123 labels joined by dots (a trailing dot is dropped) [default: cluster.local]
    #[arg(long, value_name = "DOMAIN")]
    cluster_domain: Option<String>,
    /// Compile objects exactly as given (a live-cluster dump)
    #[arg(long)]
    no_allocate: bool,
    /// Keep allocations stable across commits (read if present)
    #[arg(long, value_name = "FILE")]
    lock: Option<String>,
    /// How diagnostics are printed (sarif: code scanning; github: workflow annotations)
    #[arg(long, value_name = "FORMAT", default_value = "text", value_parser = ["text", "json", "sarif", "github"])]
    format: String,
    /// Leave out diagnostics less severe than LEVEL, in every format [default: text shows
    /// all, notes as one line per code; the other formats leave notes out]
    #[arg(long, value_name = "LEVEL", value_parser = ["error", "warning", "note"])]
    min_severity: Option<String>,
    /// Show every note in full (as --min-severity note)
    #[arg(short, long)]
    verbose: bool,
    /// Unknown fields, as kubectl's --validate: strict (an error: the API server refuses
    /// them), warn (for those who apply with --validate=false), ignore [default: the config
    /// file's `validate`, else strict]
    #[arg(long, value_name = "MODE", value_parser = ["strict", "warn", "ignore"])]
    validate: Option<String>,
    #[command(flatten)]
    config: ConfigFlags,
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
}

/// The config file (`.svc-compile.yaml`, see docs/ci.md).
#[derive(Args)]
struct ConfigFlags {
    /// Read settings from FILE instead of the .svc-compile.yaml found in the working
    /// directory or the nearest directory above it
    #[arg(long, value_name = "FILE", conflicts_with = "no_config")]
    config: Option<String>,
    /// Read no config file
    #[arg(long)]
    no_config: bool,
}

#[derive(Args)]
struct WriteLockFlag {
    /// Write the allocations back to the --lock file
    #[arg(long)]
    write_lock: bool,
}

/// The target and the node a command compiles for.
#[derive(Args)]
struct NodeFlags {
    /// What to write (see Targets)
    #[arg(long, value_name = "TARGET")]
    target: Option<String>,
    /// Compile for this node (a Node manifest, or --node-ip)
    #[arg(long, value_name = "NAME")]
    node: Option<String>,
    /// The node's IP (repeatable); for nodes without a manifest
    #[arg(long, value_name = "IP")]
    node_ip: Vec<String>,
    /// The IP family to compile for [default: the primary family of --service-cluster-ip-range]
    #[arg(long, value_name = "ipv4|ipv6")]
    family: Option<String>,
    /// The node's iptables supports MASQUERADE --random-fully (kube-proxy detects it)
    /// [default: ClusterConfig `randomFully`, else on]
    #[arg(long, value_name = "on|off", value_parser = ["on", "off"])]
    random_fully: Option<String>,
    /// The node has kube-proxy's nfacct counters (kube-proxy detects it) [default:
    /// ClusterConfig `nfacct`, else off]
    #[arg(long, value_name = "on|off", value_parser = ["on", "off"])]
    nfacct: Option<String>,
    /// The nftables targets' layout: kube-proxy's (diffs against a live node) or fast
    /// (loads a large node in seconds; see docs/targets.md) [default: ClusterConfig `nftLayout`,
    /// else kube-proxy]
    #[arg(long, value_name = "LAYOUT", value_parser = ["kube-proxy", "fast"])]
    nft_layout: Option<String>,
    /// A Service's spec.topologyKeys (removed in 1.22): honour it (kube-proxy 1.17-1.21) or
    /// ignore it (a current kube-proxy) [default: ClusterConfig `topologyKeys`, else honour]
    #[arg(long, value_name = "honour|ignore", value_parser = ["honour", "ignore"])]
    topology_keys: Option<String>,
}

#[derive(Args)]
#[command(next_help_heading = "Output options")]
struct OutputFlags {
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
}

#[derive(Args)]
#[command(next_help_heading = "Apply options")]
struct ApplyFlags {
    /// Load inside network namespace NAME (ip netns)
    #[arg(long, value_name = "NAME")]
    netns: Option<String>,
    /// Write the report (with --dry-run: the commands and documents) to FILE instead of stdout
    #[arg(short = 'o', long, value_name = "FILE")]
    output: Option<String>,
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
#[command(next_help_heading = "Agent options")]
struct AgentFlags {
    /// Load inside network namespace NAME (ip netns)
    #[arg(long, value_name = "NAME")]
    netns: Option<String>,
    /// [default: /var/lib/svc-compile/<netns or host>]
    #[arg(long, value_name = "DIR")]
    state_dir: Option<String>,
    /// Wait at most this long for an apply that holds the lock [default: 30]
    #[arg(long, value_name = "SECONDS")]
    lock_timeout: Option<String>,
    /// ebpf: the cgroup v2 directory the socket load balancer serves [default: the
    /// cgroup2 mount's root]
    #[arg(long, value_name = "PATH")]
    cgroup: Option<String>,
    /// The longest time between syncs: each one checks the node and mends what someone
    /// else changed (e.g. 30s, 1m, 500ms) [default: 30s, kube-proxy's]
    #[arg(long, value_name = "DURATION")]
    sync_period: Option<String>,
    /// The shortest time between syncs: changes within it are applied together [default: 0s]
    #[arg(long, value_name = "DURATION")]
    min_sync_period: Option<String>,
    /// One log line per sync on stderr: text or json
    #[arg(long, value_name = "FORMAT", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
    /// Where /healthz and /livez answer (in --netns's namespace); `` turns them off
    /// [default: 0.0.0.0:10256, kube-proxy's]
    #[arg(long, value_name = "IP:PORT")]
    healthz_bind_address: Option<String>,
    /// Where /metrics answers (Prometheus); `` turns it off [default: 127.0.0.1:10249,
    /// kube-proxy's]
    #[arg(long, value_name = "IP:PORT")]
    metrics_bind_address: Option<String>,
}

/// `svc-compile cleanup`: no inputs, no node to compile for; the node is this host or
/// `--netns`.
#[derive(Args)]
struct CleanupFlags {
    /// Whose state to remove: what `apply --target TARGET` loaded (see Targets)
    #[arg(long, value_name = "TARGET")]
    target: Option<String>,
    /// Remove inside network namespace NAME (ip netns)
    #[arg(long, value_name = "NAME")]
    netns: Option<String>,
    /// Write the report (with --dry-run: the commands) to FILE instead of stdout
    #[arg(short = 'o', long, value_name = "FILE")]
    output: Option<String>,
    /// Print the commands and documents, change nothing
    #[arg(long)]
    dry_run: bool,
    /// Where apply recorded this node (the target's records there are removed)
    /// [default: /var/lib/svc-compile/<netns or host>]
    #[arg(long, value_name = "DIR")]
    state_dir: Option<String>,
    /// Wait at most this long for an apply that holds the lock [default: 30]
    #[arg(long, value_name = "SECONDS")]
    lock_timeout: Option<String>,
    /// ebpf: the cgroup v2 directory apply attached to [default: the cgroup2 mount's root]
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
    /// Write the report to FILE instead of stdout
    #[arg(short = 'o', long, value_name = "FILE")]
    output: Option<String>,
    /// Where apply recorded this node (drift names the layout it wrote when the manifests
    /// compile to another) [default: /var/lib/svc-compile/<netns or host>]
    #[arg(long, value_name = "DIR")]
    state_dir: Option<String>,
}

/// `svc-compile trace`: the packet (`--target iptables|nftables|ipvs` adds their rules).
#[derive(Args)]
#[command(next_help_heading = "Trace options")]
struct TraceFlags {
    /// The sender: IP[:PORT] (a node IP = the node itself; the local-traffic detector decides pod or outside)
    #[arg(long, value_name = "IP[:PORT]")]
    from: Option<String>,
    /// The destination: IP:PORT ([IPv6]:PORT), of the sender's family
    #[arg(long, value_name = "IP:PORT")]
    to: Option<String>,
    /// The protocol
    #[arg(long, value_name = "PROTO", default_value = "tcp", value_parser = ["tcp", "udp", "sctp"])]
    proto: String,
    /// Another address local to the node (repeatable): node ports are reached there too
    #[arg(long, value_name = "IP")]
    local_ip: Vec<String>,
    /// Trace many packets: one `FROM TO [PROTO]` per line (`#` comments); one report each
    #[arg(long, value_name = "FILE")]
    flows: Option<String>,
    /// Write the report (text or json) to FILE instead of stdout
    #[arg(short = 'o', long, value_name = "FILE")]
    output: Option<String>,
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

#[derive(Args)]
struct DiffFlags {
    /// The old revision: a path, or `git:REV:PATH` (read with git, no checkout)
    #[arg(value_name = "OLD")]
    old: String,
    /// The new revision, like OLD
    #[arg(value_name = "NEW")]
    new: String,
    /// Also compare what this node does (a Node manifest)
    #[arg(long, value_name = "NAME")]
    node: Option<String>,
    /// Compare every Node manifest of either revision
    #[arg(long, conflicts_with = "node")]
    all_nodes: bool,
    /// The per-node target whose rulesets --rules compares
    #[arg(long, value_name = "TARGET", default_value = "iptables")]
    target: String,
    /// Add the unified diff of the compiled rulesets per node and family
    #[arg(long)]
    rules: bool,
    /// How the report is printed
    #[arg(long, value_name = "FORMAT", default_value = "text", value_parser = ["text", "json", "markdown"])]
    format: String,
    /// Write the report (any --format) to FILE instead of stdout
    #[arg(short = 'o', long, value_name = "FILE")]
    output: Option<String>,
    /// Compile objects exactly as given (live-cluster dumps)
    #[arg(long)]
    no_allocate: bool,
    /// Leave out files and directories the glob matches, in both revisions (repeatable;
    /// `*`, `?`, `**`; e.g. 'templates/**')
    #[arg(long, value_name = "GLOB")]
    exclude: Vec<String>,
    /// Read only the files a glob matches, in both revisions (repeatable)
    #[arg(long, value_name = "GLOB")]
    include: Vec<String>,
    /// Colour the diagnostics of a revision with errors: auto = on a terminal unless NO_COLOR is set
    #[arg(long, value_name = "WHEN", default_value = "auto", value_parser = ["auto", "always", "never"])]
    color: String,
    #[command(flatten)]
    config: ConfigFlags,
}

// ---------------------------------------------------------------------------------------
// The checked values: one per subcommand.

/// What the command line asks for.
pub enum Run {
    /// Text to print on stdout, then exit 0 (help, version, completions, man page).
    Print(String),
    Check(CheckCmd),
    Compile(Box<CompileCmd>),
    Apply(Box<ApplyCmd>),
    Agent(Box<AgentCmd>),
    Cleanup(Box<CleanupCmd>),
    Drift(Box<DriftCmd>),
    Trace(Box<TraceCmd>),
    Diff(DiffCmd),
    Gen(GenCmd),
    Migrate(Box<MigrateCmd>),
}

/// How diagnostics are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
    Sarif,
    /// GitHub Actions workflow commands (`::error file=…::message`), one per diagnostic.
    Github,
    /// JUnit XML, a test case per file (`check` only).
    Junit,
}

/// Which config file a command reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigChoice {
    /// `.svc-compile.yaml` in the working directory or the nearest directory above.
    Find,
    /// `--config FILE`.
    File(String),
    /// `--no-config`.
    Off,
}

/// What every compile shares: the inputs, the compiler's settings and how diagnostics are
/// printed.
#[derive(Clone)]
pub struct CompileOpts {
    pub paths: Vec<String>,
    pub service_cidrs: Option<Vec<Cidr>>,
    pub node_port_range: Option<(u16, u16)>,
    /// Checked: RFC 1123 labels, without a trailing dot.
    pub cluster_domain: Option<String>,
    pub allocate: bool,
    pub lock: Option<String>,
    /// `--exclude GLOB` / `--include GLOB` (repeatable): which files are read.
    pub exclude: Vec<String>,
    pub include: Vec<String>,
    pub format: Format,
    /// `--min-severity`: `None` = the format's default (see `report`).
    pub min_severity: Option<svc_compiler::diag::Severity>,
    /// `--verbose`: every note in full.
    pub verbose: bool,
    /// `--config FILE` / `--no-config`.
    pub config: ConfigChoice,
    /// `--color`: `None` = auto (a terminal, and NO_COLOR unset), else always / never.
    pub color: Option<bool>,
    /// `--random-fully on|off`, `--nfacct on|off`: node capabilities (`None` for check).
    pub random_fully: Option<bool>,
    pub nfacct: Option<bool>,
    /// `--nft-layout kube-proxy|fast`.
    pub nft_layout: Option<NftLayout>,
    /// `--validate strict|warn|ignore` (`None`: the config file's, else strict).
    pub validate: Option<svc_compiler::Validate>,
    /// `--topology-keys honour|ignore`.
    pub topology_keys: Option<TopologyKeys>,
}

/// The target and its own flags, as given (a file flag's value is still the path).
pub struct TargetArgs {
    pub target: &'static Target,
    pub params: Params,
}

/// Which node views: `--node` (with `--node-ip`) or `--all-nodes`, and `--family`.
#[derive(Default)]
pub struct Nodes {
    pub node: Option<String>,
    pub node_ips: Vec<IpAddr>,
    pub family: Option<IpFamily>,
    pub all_nodes: bool,
}

/// `svc-compile check`.
pub struct CheckCmd {
    pub opts: CompileOpts,
    pub write_lock: bool,
    /// `-o FILE`: the report goes there instead of stdout.
    pub output: Option<String>,
}

/// `svc-compile compile` (and `svc-compile PATHS...`).
pub struct CompileCmd {
    pub opts: CompileOpts,
    pub target: TargetArgs,
    pub nodes: Nodes,
    pub out_dir: Option<String>,
    /// `--part`: checked against the target's renderer when it is made (`run.rs`).
    pub part: Option<String>,
    pub output: Option<String>,
    pub write_lock: bool,
}

/// Where `apply` takes the document from.
pub enum ApplySource {
    Manifests,
    From(String),
    Rollback,
}

/// `svc-compile apply`.
pub struct ApplyCmd {
    pub opts: CompileOpts,
    pub target: TargetArgs,
    /// One node (`all_nodes` is false).
    pub nodes: Nodes,
    pub source: ApplySource,
    /// `--netns`, `--dry-run`, `--full`, `--read-back`, `--state-dir`, `--lock-timeout`,
    /// `--cgroup` and `--family`, as the node crate takes them.
    pub apply: svc_node::apply::Options,
    /// `-o FILE`: what apply prints on stdout goes there.
    pub output: Option<String>,
}

/// `svc-compile agent`.
pub struct AgentCmd {
    pub opts: CompileOpts,
    pub target: TargetArgs,
    /// One node, given.
    pub nodes: Nodes,
    pub agent: svc_node::agent::Options,
}

/// `svc-compile cleanup`.
pub struct CleanupCmd {
    pub target: &'static Target,
    /// `--netns`, `--dry-run`, `--state-dir`, `--lock-timeout` and `--cgroup`, as the node
    /// crate takes them.
    pub cleanup: svc_node::apply::Options,
    /// `-o FILE`: what cleanup prints on stdout goes there.
    pub output: Option<String>,
}

/// `svc-compile drift`.
pub struct DriftCmd {
    pub opts: CompileOpts,
    pub target: TargetArgs,
    /// One node, given.
    pub nodes: Nodes,
    /// `--netns`, `--state-dir` and `--family`.
    pub drift: svc_node::apply::Options,
    pub from_saved: Option<String>,
    /// `-o FILE`: the report goes there instead of stdout.
    pub output: Option<String>,
}

/// One packet as written: `FROM TO [PROTO]`.
#[derive(Debug)]
pub struct Query {
    pub from: IpAddr,
    pub to: SocketAddr,
    pub proto: Protocol,
    pub line: String,
}

/// The packets `trace` follows.
pub enum Packets {
    One(Query),
    /// `--flows FILE`, read by the command.
    Flows(String),
}

/// `svc-compile trace`.
pub struct TraceCmd {
    pub opts: CompileOpts,
    pub target: TargetArgs,
    /// One node, given.
    pub nodes: Nodes,
    pub packets: Packets,
    pub local_ips: Vec<IpAddr>,
    /// `-o FILE`: the report goes there instead of stdout.
    pub output: Option<String>,
}

/// The format of `diff`'s report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiffFormat {
    Text,
    Json,
    Markdown,
}

/// `svc-compile diff`.
pub struct DiffCmd {
    pub old: String,
    pub new: String,
    pub node: Option<String>,
    pub all_nodes: bool,
    /// With `--rules`: the per-node target whose rulesets are compared.
    pub rules: Option<&'static Target>,
    pub format: DiffFormat,
    /// `-o FILE`: the report goes there instead of stdout.
    pub output: Option<String>,
    pub allocate: bool,
    /// `--exclude GLOB` / `--include GLOB`, for both revisions.
    pub exclude: Vec<String>,
    pub include: Vec<String>,
    pub color: Option<bool>,
    pub config: ConfigChoice,
}

/// `svc-compile gen`.
#[derive(Debug)]
pub struct GenCmd {
    pub shape: svc_compiler::synth::Shape,
    pub format: svc_compiler::synth::Format,
    pub output: Option<String>,
}

// ---------------------------------------------------------------------------------------
// The parser.

/// The targets a subcommand takes.
fn targets_of(sub: &str, targets: &[&'static Target]) -> Vec<&'static Target> {
    let takes = |t: &Target| match sub {
        "apply" | "agent" | "cleanup" => t.planner.is_some() || svc_node::ebpf::applies(t),
        "drift" => t.planner.is_some_and(|p| p.drift()),
        "trace" => t.name == "ir" || svc_targets::trace::TRACEABLE.contains(&t.name),
        "diff" => t.per_node(),
        _ => true,
    };
    targets.iter().copied().filter(|t| takes(t)).collect()
}

/// `Targets:` and a line per target, for `--help`.
fn target_list(targets: &[&'static Target]) -> String {
    let mut help = String::from("Targets:\n");
    let width = targets.iter().map(|t| t.name.len()).max().unwrap_or(0);
    for t in targets {
        help += &format!("  {:width$}  {}\n", t.name, t.about);
    }
    help
}

/// The parser, with every target of `targets` and its flags, each subcommand with the
/// targets it takes.
fn command(targets: &[&'static Target]) -> clap::Command {
    let with_targets = |c: clap::Command| {
        let name = c.get_name().to_string();
        let own = targets_of(&name, targets);
        let values: Vec<PossibleValue> = own
            .iter()
            .map(|t| PossibleValue::new(t.name).help(t.about))
            .collect();
        let mut flags: Vec<clap::Arg> = Vec::new();
        for f in own.iter().flat_map(|t| t.flags) {
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
        let c = c
            .mut_arg("target", |a| {
                let a = a.value_parser(PossibleValuesParser::new(values));
                match name.as_str() {
                    "compile" | "trace" => a.default_value("ir"),
                    _ => a,
                }
            })
            .args(flags)
            .after_help(format!(
                "{}\n{}",
                target_list(&own),
                exit_codes(Some(&name))
            ));
        match name.as_str() {
            "trace" => c.mut_arg("format", |a| {
                a.value_parser(["text", "json"])
                    .help("How the report and diagnostics are printed")
            }),
            _ => c,
        }
    };
    let plain = |c: clap::Command| {
        let codes = exit_codes(Some(c.get_name()));
        c.after_help(codes)
    };
    let cleanup = |c: clap::Command| {
        let own = targets_of("cleanup", targets);
        let values: Vec<PossibleValue> = own
            .iter()
            .map(|t| PossibleValue::new(t.name).help(t.about))
            .collect();
        c.mut_arg("target", |a| {
            a.value_parser(PossibleValuesParser::new(values))
        })
        .after_help(format!(
            "{}\n{}",
            target_list(&own),
            exit_codes(Some("cleanup"))
        ))
    };
    let diff_targets: Vec<PossibleValue> = targets_of("diff", targets)
        .iter()
        .map(|t| PossibleValue::new(t.name).help(t.about))
        .collect();
    Cli::command()
        .after_help(format!(
            "{AFTER_HELP}\n\n{}\n{}",
            target_list(targets),
            exit_codes(None)
        ))
        .mut_subcommand("check", |c| {
            plain(c).mut_arg("format", |a| {
                a.value_parser(["text", "json", "sarif", "github", "junit"])
                    .help("How the report is printed (sarif: code scanning; github: workflow annotations; junit: a test case per file)")
            })
        })
        .mut_subcommand("compile", with_targets)
        .mut_subcommand("apply", with_targets)
        .mut_subcommand("agent", with_targets)
        .mut_subcommand("cleanup", cleanup)
        .mut_subcommand("drift", with_targets)
        .mut_subcommand("trace", with_targets)
        .mut_subcommand("gen", plain)
        .mut_subcommand("diff", |c| {
            plain(c).mut_arg("target", |a| {
                a.value_parser(PossibleValuesParser::new(diff_targets))
            })
        })
        .mut_subcommand("migrate", migrate_command)
}

pub fn parse(args: &[String]) -> Result<Run, String> {
    parse_with(args, svc_targets::TARGETS)
}

/// [`parse`] with the targets given (tests use made-up ones).
pub(crate) fn parse_with(args: &[String], targets: &[&'static Target]) -> Result<Run, String> {
    let mut cmd = command(targets);
    // `svc-compile PATHS...` compiles, as it always has.
    let sub = match args.first().map(String::as_str) {
        Some(a) if SUBCOMMANDS.contains(&a) => a,
        Some("-h" | "--help" | "-V" | "--version") => "",
        _ => "compile",
    };
    let default = sub == "compile" && args.first().map(String::as_str) != Some("compile");
    let argv = std::iter::once("svc-compile")
        .chain(default.then_some("compile"))
        .chain(args.iter().map(String::as_str));
    let matches = match cmd.try_get_matches_from_mut(argv) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::DisplayHelp => {
            return Ok(Run::Print(e.render().to_string()));
        }
        // clap names the subcommand (`svc-compile-check`); the program is one.
        Err(e) if e.kind() == ErrorKind::DisplayVersion => {
            return Ok(Run::Print(format!(
                "svc-compile {}\n",
                env!("CARGO_PKG_VERSION")
            )));
        }
        Err(e) => return Err(message(&e, sub, targets)),
    };
    let cli = Cli::from_arg_matches(&matches).map_err(|e| message(&e, sub, targets))?;
    let m = matches.subcommand().map(|(_, m)| m);
    match cli.sub {
        Sub::Check {
            inputs,
            lock,
            report,
        } => {
            let opts = compile_opts(inputs, None)?;
            if lock.write_lock && opts.lock.is_none() {
                return Err("--write-lock needs --lock FILE".into());
            }
            if opts.paths.is_empty() {
                return Err(NO_INPUT.into());
            }
            Ok(Run::Check(CheckCmd {
                opts,
                write_lock: lock.write_lock,
                output: report,
            }))
        }
        Sub::Compile {
            inputs,
            node,
            output,
            lock,
        } => compile_cmd(inputs, node, output, lock, m, targets),
        Sub::Apply {
            inputs,
            node,
            apply,
        } => apply_cmd(inputs, node, apply, m, targets),
        Sub::Agent {
            inputs,
            node,
            agent,
        } => agent_cmd(inputs, node, agent, m, targets),
        Sub::Cleanup(c) => cleanup_cmd(c, targets),
        Sub::Drift {
            inputs,
            node,
            drift,
        } => drift_cmd(inputs, node, drift, m, targets),
        Sub::Trace {
            inputs,
            node,
            trace,
        } => trace_cmd(inputs, node, trace, m, targets),
        Sub::Gen(g) => gen_cmd(g),
        Sub::Completions { shell } => {
            let shell = match shell {
                Shell::Bash => clap_complete::Shell::Bash,
                Shell::Zsh => clap_complete::Shell::Zsh,
                Shell::Fish => clap_complete::Shell::Fish,
            };
            Ok(Run::Print(completions(shell, command(targets))))
        }
        Sub::Man => man_page(command(targets)).map(Run::Print),
        Sub::Diff(d) => diff_cmd(d, targets),
        Sub::Migrate {
            inputs,
            node,
            migrate,
        } => migrate_cmd(inputs, node, migrate),
    }
}

/// The completion script for `shell`. clap_complete's bash script names its states from
/// the program's name with `-` made `__` in one place and `__subcmd__` in another, so that
/// for `svc-compile` no subcommand's state is ever reached: bash's is generated for a name
/// without `-` and registered for the real one.
fn completions(shell: clap_complete::Shell, mut cmd: clap::Command) -> String {
    let mut out = Vec::new();
    if shell != clap_complete::Shell::Bash {
        clap_complete::generate(shell, &mut cmd, "svc-compile", &mut out);
        return String::from_utf8_lossy(&out).into_owned();
    }
    clap_complete::generate(shell, &mut cmd, "svc_compile", &mut out);
    let text = String::from_utf8_lossy(&out);
    let mut script = String::new();
    for line in text.lines() {
        match line.strip_suffix(" svc_compile") {
            Some(head) if line.trim_start().starts_with("complete ") => {
                script += &format!("{head} svc-compile\n");
            }
            _ => script += &format!("{line}\n"),
        }
    }
    script
}

const NO_INPUT: &str = "no input: give files, directories or `-` for stdin";

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

/// A clap error of subcommand `sub` as one line, in the words of the rest of the CLI.
fn message(e: &clap::Error, sub: &str, targets: &[&'static Target]) -> String {
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
        (ErrorKind::UnknownArgument, Some(f)) if f.starts_with('-') => {
            unknown_flag(&f, sub, targets)
        }
        (ErrorKind::UnknownArgument, Some(a)) => format!("unexpected argument `{a}`"),
        (ErrorKind::InvalidValue, Some(f)) => match get(ContextKind::InvalidValue) {
            Some(v) if v.is_empty() => format!("{f} needs a value"),
            Some(v) if f == "--target" => {
                let own = targets_of(sub, targets);
                let names = one_of(own.iter().map(|t| t.name));
                if own.is_empty() {
                    format!("`svc-compile {sub}` takes none of the targets")
                } else if targets.iter().any(|t| t.name == v) {
                    format!("`svc-compile {sub}` does not take --target {v}: use {names}")
                } else {
                    format!("unknown target `{v}`: use {names}")
                }
            }
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

/// An unknown flag of `sub`: whose it is, if another subcommand's, or the flag meant.
fn unknown_flag(flag: &str, sub: &str, targets: &[&'static Target]) -> String {
    let cmd = command(targets);
    // A hidden flag is refused by its command (migrate's `--target`): not its.
    let flags_of = |c: &clap::Command| -> Vec<String> {
        c.get_arguments()
            .filter(|a| !a.is_hide_set())
            .flat_map(|a| {
                let long = a.get_long().map(|l| format!("--{l}"));
                let short = a.get_short().map(|s| format!("-{s}"));
                long.into_iter().chain(short)
            })
            .collect()
    };
    let others: Vec<(String, Vec<String>)> = cmd
        .get_subcommands()
        .filter(|c| c.get_name() != sub)
        .map(|c| (c.get_name().to_string(), flags_of(c)))
        .collect();
    let owners = |f: &str| -> Vec<String> {
        others
            .iter()
            .filter(|(_, flags)| flags.iter().any(|g| g == f))
            .map(|(n, _)| n.clone())
            .collect()
    };
    let belongs = |f: &str, owners: &[String]| {
        let named = owners.iter().enumerate().map(|(i, n)| match i {
            0 => format!("`svc-compile {n}`"),
            _ => format!("`{n}`"),
        });
        format!("{f} belongs to {}, not `{sub}`", list(named, "and"))
    };
    let found = owners(flag);
    if !found.is_empty() {
        return belongs(flag, &found);
    }
    let help = format!("see `svc-compile {sub} --help`");
    // The nearest flag of this command, else of another.
    let own = cmd.find_subcommand(sub).map(flags_of).unwrap_or_default();
    if let Some(near) = nearest(flag, &own) {
        return format!("unknown flag `{flag}`: did you mean `{near}`?");
    }
    let all: Vec<String> = others.iter().flat_map(|(_, f)| f.clone()).collect();
    match nearest(flag, &all) {
        Some(near) => format!(
            "unknown flag `{flag}`: did you mean `{near}`? ({})",
            belongs(&near, &owners(&near))
        ),
        None => format!("unknown flag `{flag}` ({help})"),
    }
}

/// The candidate nearest to `word` by edit distance, if near enough to be a typo.
fn nearest(word: &str, candidates: &[String]) -> Option<String> {
    let word = word.split('=').next().unwrap_or(word);
    let limit = (word.len() / 4).max(1);
    candidates
        .iter()
        .filter(|c| c.len() > 2)
        .map(|c| (edit_distance(word, c), c))
        .filter(|(d, _)| *d <= limit)
        .min()
        .map(|(_, c)| c.clone())
}

/// Levenshtein distance, by characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (diag + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// `a, b or c`.
pub(crate) fn one_of<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> String {
    list(names, "or")
}

/// `a, b {conj} c`.
fn list<S: AsRef<str>>(names: impl IntoIterator<Item = S>, conj: &str) -> String {
    let names: Vec<S> = names.into_iter().collect();
    match names.split_last() {
        None => String::new(),
        Some((last, [])) => last.as_ref().to_string(),
        Some((last, rest)) => {
            let rest: Vec<&str> = rest.iter().map(AsRef::as_ref).collect();
            format!("{} {conj} {}", rest.join(", "), last.as_ref())
        }
    }
}

// ---------------------------------------------------------------------------------------
// The second stage: checked values.

fn gen_cmd(g: GenFlags) -> Result<Run, String> {
    use svc_compiler::synth::{Format, Shape, MAX_NODES};
    let number = |flag: &str, v: &str| {
        v.parse::<usize>()
            .map_err(|_| format!("--{flag} `{v}` is not a number"))
    };
    let shape = Shape {
        services: number("services", &g.services)?,
        endpoints: number("endpoints", &g.endpoints)?,
        nodes: number("nodes", &g.nodes)?,
        seed: number("seed", &g.seed)? as u64,
    };
    let format = match g.format.as_str() {
        "yaml" => Format::YamlList,
        "yaml-stream" => Format::YamlStream,
        _ => Format::Json,
    };
    if !(1..=MAX_NODES).contains(&shape.nodes) {
        return Err(format!("--nodes must be between 1 and {MAX_NODES}"));
    }
    Ok(Run::Gen(GenCmd {
        shape,
        format,
        output: g.output,
    }))
}

fn config_choice(c: ConfigFlags) -> ConfigChoice {
    match (c.config, c.no_config) {
        (_, true) => ConfigChoice::Off,
        (Some(f), false) => ConfigChoice::File(f),
        (None, false) => ConfigChoice::Find,
    }
}

fn color(when: &str) -> Option<bool> {
    match when {
        "always" => Some(true),
        "never" => Some(false),
        _ => None,
    }
}

fn compile_opts(c: InputFlags, node: Option<&NodeFlags>) -> Result<CompileOpts, String> {
    let service_cidrs = c
        .service_cluster_ip_range
        .map(|s| parse_service_cidrs(&s).map_err(|e| format!("--service-cluster-ip-range: {e}")))
        .transpose()?;
    let node_port_range = c
        .service_node_port_range
        .map(|s| parse_port_range(&s).map_err(|e| format!("--service-node-port-range: {e}")))
        .transpose()?;
    let cluster_domain = c
        .cluster_domain
        .map(|d| {
            cluster_domain(&d).map_err(|e| format!("--cluster-domain `{d}`: {e}"))?;
            Ok::<_, String>(d.strip_suffix('.').unwrap_or(&d).to_string())
        })
        .transpose()?;
    let on = |v: &Option<String>| v.as_ref().map(|v| v == "on");
    Ok(CompileOpts {
        paths: c.paths,
        service_cidrs,
        node_port_range,
        cluster_domain,
        allocate: !c.no_allocate,
        lock: c.lock,
        exclude: c.exclude,
        include: c.include,
        format: match c.format.as_str() {
            "json" => Format::Json,
            "sarif" => Format::Sarif,
            "github" => Format::Github,
            "junit" => Format::Junit,
            _ => Format::Text,
        },
        min_severity: c.min_severity.as_deref().map(|s| match s {
            "error" => svc_compiler::diag::Severity::Error,
            "warning" => svc_compiler::diag::Severity::Warning,
            _ => svc_compiler::diag::Severity::Note,
        }),
        verbose: c.verbose,
        config: config_choice(c.config),
        color: color(&c.color),
        random_fully: node.and_then(|n| on(&n.random_fully)),
        nfacct: node.and_then(|n| on(&n.nfacct)),
        nft_layout: node
            .and_then(|n| n.nft_layout.as_deref())
            .and_then(NftLayout::parse),
        validate: c.validate.as_deref().map(|v| match v {
            "warn" => svc_compiler::Validate::Warn,
            "ignore" => svc_compiler::Validate::Ignore,
            _ => svc_compiler::Validate::Strict,
        }),
        topology_keys: node
            .and_then(|n| n.topology_keys.as_deref())
            .and_then(TopologyKeys::parse),
    })
}

/// A cluster domain as kube-proxy and CoreDNS take it: RFC 1123 labels (lower case, as
/// ClusterConfig's `clusterDomain`, SVC318) joined by dots; one trailing dot is dropped.
pub(crate) fn cluster_domain(d: &str) -> Result<(), String> {
    let name = d.strip_suffix('.').unwrap_or(d);
    if name.is_empty() {
        return Err("give a domain, e.g. cluster.local".into());
    }
    if name.len() > 253 {
        return Err(format!("{} characters: at most 253", name.len()));
    }
    for label in name.split('.') {
        let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
        let why = if label.is_empty() {
            "an empty label".to_string()
        } else if label.len() > 63 {
            format!("label `{label}` is longer than 63 characters")
        } else if !label.chars().all(ok) {
            format!("label `{label}`: use lower-case letters, digits and `-`")
        } else if label.starts_with('-') || label.ends_with('-') {
            format!("label `{label}` starts or ends with `-`")
        } else {
            continue;
        };
        return Err(format!(
            "{why} (RFC 1123 labels joined by dots, e.g. cluster.local)"
        ));
    }
    Ok(())
}

/// The target (checked against `sub`'s by clap, or `None` when not given) and its flags.
fn target_args(
    sub: &str,
    target: Option<&str>,
    matches: Option<&clap::ArgMatches>,
    targets: &[&'static Target],
) -> Result<TargetArgs, String> {
    let own = targets_of(sub, targets);
    let Some(target) = target.and_then(|n| own.iter().find(|t| t.name == n)) else {
        return Err(format!(
            "{sub} needs {}",
            one_of(own.iter().map(|t| format!("--target {}", t.name)))
        ));
    };
    let mut params = Params::default();
    for f in own.iter().flat_map(|t| t.flags) {
        let given: Vec<&String> = matches
            .and_then(|m| m.get_many::<String>(f.name))
            .into_iter()
            .flatten()
            .collect();
        if given.is_empty() || params.get(f.name).is_some() {
            continue;
        }
        let Some(flag) = target.flags.iter().find(|o| o.name == f.name) else {
            let owners = own
                .iter()
                .filter(|t| t.flags.iter().any(|o| o.name == f.name))
                .map(|t| t.name);
            return Err(format!(
                "--{} belongs to --target {}",
                f.name,
                one_of(owners)
            ));
        };
        if !flag.repeatable && given.len() > 1 {
            return Err(format!("--{} is given more than once", f.name));
        }
        for v in given {
            params.push(flag.name, v.clone());
        }
    }
    Ok(TargetArgs { target, params })
}

/// A repeatable IP flag's values (`--node-ip`, `--local-ip`).
fn ip_list(flag: &str, given: &[String]) -> Result<Vec<IpAddr>, String> {
    given
        .iter()
        .map(|s| {
            s.parse()
                .map_err(|_| format!("{flag} `{s}` is not an IP address"))
        })
        .collect()
}

fn nodes(n: &NodeFlags, all_nodes: bool) -> Result<Nodes, String> {
    let node_ips = ip_list("--node-ip", &n.node_ip)?;
    let family = match n.family.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None => None,
        Some("ipv4" | "4") => Some(IpFamily::IPv4),
        Some("ipv6" | "6") => Some(IpFamily::IPv6),
        Some(f) => return Err(format!("--family `{f}`: use ipv4 or ipv6")),
    };
    if all_nodes && n.node.is_some() {
        return Err("use either --node or --all-nodes, not both".into());
    }
    Ok(Nodes {
        node: n.node.clone(),
        node_ips,
        family,
        all_nodes,
    })
}

fn compile_cmd(
    inputs: InputFlags,
    n: NodeFlags,
    o: OutputFlags,
    lock: WriteLockFlag,
    m: Option<&clap::ArgMatches>,
    targets: &[&'static Target],
) -> Result<Run, String> {
    let target = target_args("compile", n.target.as_deref(), m, targets)?;
    let nodes = nodes(&n, o.all_nodes)?;
    let opts = compile_opts(inputs, Some(&n))?;
    if opts.paths.is_empty() {
        return Err(NO_INPUT.into());
    }
    if lock.write_lock && opts.lock.is_none() {
        return Err("--write-lock needs --lock FILE".into());
    }
    if nodes.all_nodes && o.out.is_none() {
        return Err("--all-nodes needs --out DIR".into());
    }
    if target.target.per_node() && nodes.node.is_none() && !nodes.all_nodes {
        return Err("this target needs --node NAME (or --all-nodes --out DIR)".into());
    }
    Ok(Run::Compile(Box::new(CompileCmd {
        opts,
        target,
        nodes,
        out_dir: o.out,
        part: o.part,
        output: o.output,
        write_lock: lock.write_lock,
    })))
}

fn apply_cmd(
    inputs: InputFlags,
    n: NodeFlags,
    a: ApplyFlags,
    m: Option<&clap::ArgMatches>,
    targets: &[&'static Target],
) -> Result<Run, String> {
    let target = target_args("apply", n.target.as_deref(), m, targets)?;
    let nodes = nodes(&n, false)?;
    let opts = compile_opts(inputs, Some(&n))?;
    if a.cgroup.is_some() && !svc_node::ebpf::applies(target.target) {
        return Err("--cgroup is for apply --target ebpf".into());
    }
    let source = match (!opts.paths.is_empty(), a.from, a.rollback) {
        (true, None, false) => ApplySource::Manifests,
        (false, Some(f), false) => ApplySource::From(f),
        (false, None, true) => ApplySource::Rollback,
        (false, None, false) => {
            return Err("apply needs manifests (PATHS), --from FILE or --rollback".into())
        }
        _ => return Err("apply takes one of PATHS, --from FILE and --rollback".into()),
    };
    if matches!(source, ApplySource::Manifests) && nodes.node.is_none() {
        return Err("apply needs --node NAME: the node this ruleset is for".into());
    }
    let lock_timeout = lock_timeout(a.lock_timeout)?;
    Ok(Run::Apply(Box::new(ApplyCmd {
        apply: svc_node::apply::Options {
            netns: a.netns,
            dry_run: a.dry_run,
            full: a.full,
            read_back: a.read_back,
            state_dir: a.state_dir,
            lock_timeout,
            cgroup: a.cgroup,
            family: nodes.family,
        },
        opts,
        target,
        nodes,
        source,
        output: a.output,
    })))
}

fn agent_cmd(
    inputs: InputFlags,
    n: NodeFlags,
    a: AgentFlags,
    m: Option<&clap::ArgMatches>,
    targets: &[&'static Target],
) -> Result<Run, String> {
    let target = target_args("agent", n.target.as_deref(), m, targets)?;
    let nodes = nodes(&n, false)?;
    let opts = compile_opts(inputs, Some(&n))?;
    if opts.paths.is_empty() {
        return Err(NO_INPUT.into());
    }
    if opts.paths.iter().any(|p| p == "-") {
        return Err("agent reads files and directories it can watch, not `-`".into());
    }
    if nodes.node.is_none() {
        return Err("agent needs --node NAME: the node this ruleset is for".into());
    }
    if a.cgroup.is_some() && !svc_node::ebpf::applies(target.target) {
        return Err("--cgroup is for agent --target ebpf".into());
    }
    let defaults = svc_node::agent::Options::default();
    let sync_period = match a.sync_period {
        Some(d) => duration("--sync-period", &d)?,
        None => defaults.sync_period,
    };
    if sync_period.is_zero() {
        return Err("--sync-period must be more than 0".into());
    }
    let min_sync_period = match a.min_sync_period {
        Some(d) => duration("--min-sync-period", &d)?,
        None => defaults.min_sync_period,
    };
    let bind = |flag: &str, given: Option<String>, default| match given.as_deref() {
        None => Ok(default),
        Some("") => Ok(None),
        Some(a) => a.parse::<SocketAddr>().map(Some).map_err(|_| {
            format!(
                "{flag} `{a}`: give IP:PORT (e.g. 0.0.0.0:10256, [::]:10256), or `` to turn it off"
            )
        }),
    };
    let healthz = bind(
        "--healthz-bind-address",
        a.healthz_bind_address,
        defaults.healthz,
    )?;
    let metrics = bind(
        "--metrics-bind-address",
        a.metrics_bind_address,
        defaults.metrics,
    )?;
    Ok(Run::Agent(Box::new(AgentCmd {
        agent: svc_node::agent::Options {
            healthz,
            metrics,
            apply: svc_node::apply::Options {
                netns: a.netns,
                state_dir: a.state_dir,
                lock_timeout: lock_timeout(a.lock_timeout)?,
                cgroup: a.cgroup,
                family: nodes.family,
                ..Default::default()
            },
            sync_period,
            min_sync_period,
            json_log: a.log_format == "json",
            ..defaults
        },
        opts,
        target,
        nodes,
    })))
}

/// A duration as kube-proxy's flags take them: a number with a unit (`ms`, `s`, `m`, `h`),
/// several added (`1m30s`); a plain number is seconds.
fn duration(flag: &str, given: &str) -> Result<std::time::Duration, String> {
    let bad = || format!("{flag} `{given}`: give a duration, e.g. 30s, 1m30s or 500ms");
    if let Ok(secs) = given.parse::<f64>() {
        return std::time::Duration::try_from_secs_f64(secs).map_err(|_| bad());
    }
    let mut total = 0f64;
    let mut rest = given;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let n: f64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let scale = match &rest[..unit] {
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += n * scale;
        rest = &rest[unit..];
    }
    std::time::Duration::try_from_secs_f64(total).map_err(|_| bad())
}

/// `--lock-timeout SECONDS`.
fn lock_timeout(given: Option<String>) -> Result<Option<f64>, String> {
    given
        .map(|s| {
            s.parse::<f64>()
                .ok()
                .filter(|t| t.is_finite() && *t >= 0.0)
                .ok_or_else(|| format!("--lock-timeout `{s}`: give seconds, e.g. 30"))
        })
        .transpose()
}

fn cleanup_cmd(c: CleanupFlags, targets: &[&'static Target]) -> Result<Run, String> {
    let own = targets_of("cleanup", targets);
    let Some(target) = c
        .target
        .as_deref()
        .and_then(|n| own.iter().find(|t| t.name == n))
    else {
        return Err(format!(
            "cleanup needs {}",
            one_of(own.iter().map(|t| format!("--target {}", t.name)))
        ));
    };
    if c.cgroup.is_some() && !svc_node::ebpf::applies(target) {
        return Err("--cgroup is for cleanup --target ebpf".into());
    }
    Ok(Run::Cleanup(Box::new(CleanupCmd {
        target,
        cleanup: svc_node::apply::Options {
            netns: c.netns,
            dry_run: c.dry_run,
            state_dir: c.state_dir,
            lock_timeout: lock_timeout(c.lock_timeout)?,
            cgroup: c.cgroup,
            ..Default::default()
        },
        output: c.output,
    })))
}

fn drift_cmd(
    inputs: InputFlags,
    n: NodeFlags,
    d: DriftFlags,
    m: Option<&clap::ArgMatches>,
    targets: &[&'static Target],
) -> Result<Run, String> {
    let target = target_args("drift", n.target.as_deref(), m, targets)?;
    let nodes = nodes(&n, false)?;
    let opts = compile_opts(inputs, Some(&n))?;
    if opts.paths.is_empty() {
        return Err(NO_INPUT.into());
    }
    if nodes.node.is_none() {
        return Err("drift needs --node NAME: the node the rules are compiled for".into());
    }
    Ok(Run::Drift(Box::new(DriftCmd {
        drift: svc_node::apply::Options {
            netns: d.netns,
            state_dir: d.state_dir,
            family: nodes.family,
            ..Default::default()
        },
        opts,
        target,
        nodes,
        from_saved: d.from_saved,
        output: d.output,
    })))
}

fn trace_cmd(
    inputs: InputFlags,
    n: NodeFlags,
    t: TraceFlags,
    m: Option<&clap::ArgMatches>,
    targets: &[&'static Target],
) -> Result<Run, String> {
    let target = target_args("trace", n.target.as_deref(), m, targets)?;
    let nodes = nodes(&n, false)?;
    let opts = compile_opts(inputs, Some(&n))?;
    if opts.paths.is_empty() {
        return Err(NO_INPUT.into());
    }
    if nodes.node.is_none() {
        return Err("trace needs --node NAME".into());
    }
    let packets = match (t.flows, &t.from, &t.to) {
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
            return Err("use either --flows FILE or --from/--to, not both".into())
        }
        (Some(path), None, None) => Packets::Flows(path),
        (None, Some(from), Some(to)) => Packets::One(query(from, to, &t.proto)?),
        (None, _, _) => {
            return Err("trace needs --from IP[:PORT] and --to IP:PORT (or --flows FILE)".into())
        }
    };
    let local_ips = ip_list("--local-ip", &t.local_ip)?;
    Ok(Run::Trace(Box::new(TraceCmd {
        opts,
        target,
        nodes,
        packets,
        local_ips,
        output: t.output,
    })))
}

/// One packet: `--from IP[:PORT]` (the sender's port does not matter to the rules),
/// `--to IP:PORT` of the same family, the protocol.
pub(crate) fn query(from: &str, to: &str, proto: &str) -> Result<Query, String> {
    let src = from
        .parse::<IpAddr>()
        .or_else(|_| from.parse::<SocketAddr>().map(|a| a.ip()))
        .map_err(|_| format!("--from `{from}`: give IP or IP:PORT"))?;
    let dst = to
        .parse::<SocketAddr>()
        .map_err(|_| format!("--to `{to}`: give IP:PORT ([IPv6]:PORT)"))?;
    let proto = match proto.to_ascii_lowercase().as_str() {
        "tcp" => Protocol::TCP,
        "udp" => Protocol::UDP,
        "sctp" => Protocol::SCTP,
        _ => return Err(format!("protocol `{proto}`: use tcp, udp or sctp")),
    };
    let (f, t) = (IpFamily::of(&src), IpFamily::of(&dst.ip()));
    if f != t {
        return Err(format!(
            "--from `{from}` is {} and --to `{to}` is {}: a packet has one family",
            f.as_str(),
            t.as_str()
        ));
    }
    Ok(Query {
        from: src,
        to: dst,
        proto,
        line: format!("{from} {to} {}", proto.lower()),
    })
}

fn diff_cmd(d: DiffFlags, targets: &[&'static Target]) -> Result<Run, String> {
    let rules = d
        .rules
        .then(|| targets.iter().copied().find(|t| t.name == d.target))
        .map(|t| t.expect("clap checks --target"));
    if d.rules && d.node.is_none() && !d.all_nodes {
        return Err("--rules needs --node NAME or --all-nodes".into());
    }
    Ok(Run::Diff(DiffCmd {
        old: d.old,
        new: d.new,
        node: d.node,
        all_nodes: d.all_nodes,
        rules,
        format: match d.format.as_str() {
            "json" => DiffFormat::Json,
            "markdown" => DiffFormat::Markdown,
            _ => DiffFormat::Text,
        },
        output: d.output,
        allocate: !d.no_allocate,
        exclude: d.exclude,
        include: d.include,
        color: color(&d.color),
        config: config_choice(d.config),
    }))
}

// ---------------------------------------------------------------------------------------
// `svc-compile migrate`: its flags, its command and its checks, kept together.

#[derive(Args)]
#[command(next_help_heading = "Migrate options")]
struct MigrateFlags {
    /// The proxy mode the node runs now
    #[arg(long, value_name = "MODE", value_parser = MODES)]
    from: Option<String>,
    /// The proxy mode it moves to
    #[arg(long, value_name = "MODE", value_parser = MODES)]
    to: Option<String>,
    /// Compare every Node manifest
    #[arg(long)]
    all_nodes: bool,
    /// Another address local to the node (repeatable): node ports are compared there too
    #[arg(long, value_name = "IP")]
    local_ip: Vec<String>,
    /// Write the report to FILE instead of stdout
    #[arg(short = 'o', long, value_name = "FILE")]
    output: Option<String>,
}

const MODES: [&str; 4] = ["iptables", "ipvs", "nftables", "ebpf"];

/// `svc-compile migrate`'s report formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MigrateFormat {
    Text,
    Markdown,
    Json,
}

/// `svc-compile migrate`.
pub struct MigrateCmd {
    pub opts: CompileOpts,
    /// `--node` or `--all-nodes`.
    pub nodes: Nodes,
    pub from: svc_compiler::trace::Mode,
    pub to: svc_compiler::trace::Mode,
    pub format: MigrateFormat,
    pub output: Option<String>,
    pub local_ips: Vec<IpAddr>,
}

/// Its own `--format` (the report's; diagnostics are text with markdown) and no `--target`.
fn migrate_command(c: clap::Command) -> clap::Command {
    let codes = exit_codes(Some("migrate"));
    c.mut_arg("format", |a| {
        a.value_parser(["text", "markdown", "json"])
            .help("How the report is printed (json: diagnostics too)")
    })
    .mut_arg("target", |a| a.hide(true))
    .after_help(format!(
        "Modes: {}

{codes}",
        MODES.join(", ")
    ))
}

fn migrate_cmd(inputs: InputFlags, n: NodeFlags, m: MigrateFlags) -> Result<Run, String> {
    if n.target.is_some() {
        return Err(
            "migrate compares proxy modes: give --from MODE and --to MODE, not --target".into(),
        );
    }
    let format = match inputs.format.as_str() {
        "json" => MigrateFormat::Json,
        "markdown" => MigrateFormat::Markdown,
        _ => MigrateFormat::Text,
    };
    let nodes = nodes(&n, m.all_nodes)?;
    let opts = compile_opts(inputs, Some(&n))?;
    if opts.paths.is_empty() {
        return Err(NO_INPUT.into());
    }
    if nodes.node.is_none() && !nodes.all_nodes {
        return Err("migrate needs --node NAME or --all-nodes".into());
    }
    let mode = |flag: &str, v: Option<String>| {
        v.as_deref()
            .and_then(svc_compiler::trace::Mode::parse)
            .ok_or_else(|| format!("migrate needs {flag} MODE ({})", MODES.join(", ")))
    };
    let (from, to) = (mode("--from", m.from)?, mode("--to", m.to)?);
    let local_ips = ip_list("--local-ip", &m.local_ip)?;
    Ok(Run::Migrate(Box::new(MigrateCmd {
        opts,
        nodes,
        from,
        to,
        format,
        output: m.output,
        local_ips,
    })))
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
        deprecated: None,
    };
    const TARGETS: &[&Target] = &[&svc_targets::ir::TARGET, &FAKE];

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|a| a.to_string()).collect()
    }

    fn parse(a: &[&str]) -> Result<CompileCmd, String> {
        match parse_with(&args(a), TARGETS)? {
            Run::Compile(cmd) => Ok(*cmd),
            _ => panic!("not a compile"),
        }
    }

    fn err(a: &[&str]) -> String {
        parse_with(&args(a), TARGETS).err().expect("an error")
    }

    #[test]
    fn the_parser_is_consistent() {
        command(svc_targets::TARGETS).debug_assert();
        command(TARGETS).debug_assert();
    }

    #[test]
    fn target_flags_come_from_the_registry() {
        let cmd = parse(&["m/", "--target", "fake", "--zone", "a", "--zone=b"]).unwrap();
        assert_eq!(cmd.target.target.name, "fake");
        assert_eq!(cmd.target.params.all("zone"), ["a", "b"]);
        assert_eq!(cmd.target.params.get("template"), None);
        let cmd = parse(&["compile", "m/", "--target", "fake", "--template", "t"]).unwrap();
        assert_eq!(cmd.target.params.get("template"), Some("t"));
        // A cluster-wide target needs no --node.
        assert!(cmd.nodes.node.is_none());
    }

    #[test]
    fn target_flags_are_checked() {
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
        assert_eq!(err(&["completions"]), "missing shell");
        assert_eq!(
            err(&["apply", "--from", "x", "--target", "fake"]),
            "`svc-compile apply` takes none of the targets"
        );
    }

    #[test]
    fn help_lists_the_targets_and_their_flags() {
        let Ok(Run::Print(help)) = parse_with(&args(&["--help"]), TARGETS) else {
            panic!("help")
        };
        assert!(help.contains("  fake  a target with flags"), "{help}");
        let Ok(Run::Print(help)) = parse_with(&args(&["compile", "--help"]), TARGETS) else {
            panic!("help")
        };
        assert!(help.contains("--template <FILE>"), "{help}");
        assert!(help.contains("a zone (repeatable)"), "{help}");
    }
}
