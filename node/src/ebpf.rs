//! `svc-compile apply --target ebpf`: loads the socket load balancer (`bpf/sock_lb.c`,
//! compiled by build.rs and embedded) with a node's Cilium maps into a cgroup v2. The
//! eBPF side of apply does not fit the `Planner` frame (there are no commands to run: the
//! loader is this process); it shares the frame's state directory, lock and atomic writes
//! (`crate::state`), and plans with the pure `svc_targets::ebpf::plan`.
//!
//! Pins, all under `--pin-dir` (default and only allowed root `/sys/fs/bpf/svc-compile`),
//! in one instance directory per cgroup (`INST` = `PIN_DIR/cg-<cgroup path, `/` and `.` as `_`>`:
//! bpffs refuses names with a dot):
//! - `INST/shared/`: the runtime maps (`*_affinity`, `*_reverse_sk`), shared by every
//!   generation (hard links into each), so open sockets keep their service address and
//!   affinity survives a new generation;
//! - `INST/gen-N-HASH/`: one generation: the configuration maps, the runtime maps' links,
//!   and the eight programs (`prog_NAME`); HASH is the program object's and the node
//!   namespace's fingerprint, so a new binary or namespace gets a new generation;
//! - `INST/link_NAME`: the eight cgroup links (`BPF_LINK_CREATE`), which pin the programs
//!   to the cgroup and are switched to a new generation with `BPF_LINK_UPDATE`.
//!
//! One apply:
//! 1. the lock (`STATE/lock`, the frame's); which generation the links run (each link's
//!    program id against each generation's pinned programs);
//! 2. incremental when that generation is whole and its maps can take the new state
//!    (shape and size): the pinned maps are dumped (`bpftool -j map dump`) and only the
//!    differing entries are written, in Cilium's order, by a forked child that finishes
//!    even if this process is killed and holds the lock until it does;
//! 3. otherwise a new generation: maps created and filled, programs loaded and pinned,
//!    read back; then the child switches the links (`BPF_LINK_UPDATE`, or creates them)
//!    and the old generation is deleted. Until the switch the old one serves; a kill
//!    leaves a generation no link runs, which the next apply deletes;
//! 4. read-back: `bpftool -j map dump` of every configuration map equals the compiled
//!    JSON (the runtime maps are the datapath's and are not compared);
//! 5. the record: per family `STATE/ebpf-FAMILY/applied.ebpf` (the compiled JSON, whose
//!    ids the next compile keeps when no `--lock` file has them) and `previous.ebpf`.
//!
//! Nothing outside the instance directory is ever pinned, changed or deleted.

use crate::apply::{preflight, Compiled, Input, Options};
use crate::proc::{check_tools, first_line, run_captured};
use crate::state::{write_atomic, Records, StateDir};
use crate::Fail;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::fs::{self, File};
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Instant;
use svc_compiler::passes::allocate::NodeIds;
use svc_targets::ebpf::plan::{self, Contents, Op, Shape, Wanted};
use svc_targets::ebpf::{self, Ids, Layout};
use svc_targets::plan::Tool;
use svc_targets::{Params, Target};

/// `bpf/sock_lb.c` as build.rs compiled it; empty when clang was missing.
static OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/sock_lb.o"));

/// The only directory apply pins under.
pub(crate) const PIN_ROOT: &str = "/sys/fs/bpf/svc-compile";

/// The eight programs and their cgroup attach types (`enum bpf_attach_type`).
const PROGRAMS: [(&str, u32); 8] = [
    ("sock4_connect", 10),     // BPF_CGROUP_INET4_CONNECT
    ("sock6_connect", 11),     // BPF_CGROUP_INET6_CONNECT
    ("sock4_sendmsg", 14),     // BPF_CGROUP_UDP4_SENDMSG
    ("sock6_sendmsg", 15),     // BPF_CGROUP_UDP6_SENDMSG
    ("sock4_recvmsg", 19),     // BPF_CGROUP_UDP4_RECVMSG
    ("sock6_recvmsg", 20),     // BPF_CGROUP_UDP6_RECVMSG
    ("sock4_getpeername", 29), // BPF_CGROUP_INET4_GETPEERNAME
    ("sock6_getpeername", 30), // BPF_CGROUP_INET6_GETPEERNAME
];

/// Whether `apply` of this target runs here (the socket load balancer).
pub fn applies(t: &Target) -> bool {
    t.name == ebpf::TARGET.name
}

/// One family's compiled document: family (`ipv4`/`ipv6`), JSON, where it came from.
struct Doc {
    family: &'static str,
    json: String,
    layout: Option<Layout>,
}

/// `apply --target ebpf` (see the module doc).
pub fn apply(
    target: &'static Target,
    args: &Options,
    params: &Params,
    input: Input<'_>,
) -> Result<u8, Fail> {
    let start = Instant::now();
    preflight(target, args)?;
    if OBJECT.is_empty() {
        return Err(Fail(
            "apply --target ebpf: this svc-compile was built without the socket load balancer (clang was not found when it was built); install clang and libbpf-dev (Debian/Ubuntu: apt-get install clang libbpf-dev) and rebuild".into(),
        ));
    }
    check_tools(
        vec![Tool {
            program: "bpftool",
            package: "bpftool",
        }],
        false,
    )?;
    let opts = ebpf::options(params).map_err(|e| Fail(format!("--target ebpf: {e}")))?;
    let pin_root = pin_root(&opts.pin_dir)?;
    let (cgroup, slug) = cgroup_of(args.cgroup.as_deref())?;
    let inst = pin_root.join(format!("cg-{slug}"));
    let host_netns = match &args.netns {
        Some(ns) => netns_cookie(ns)?,
        None => 0,
    };
    let state = StateDir::new(args.state_dir.as_deref(), args.netns.as_deref());
    let fam_dir = |f: &str| state.records(ebpf::TARGET.name, ebpf::TARGET.ext, f);

    // What to apply.
    let rollback = matches!(input, Input::Rollback);
    // The map sizes: the flags' over the ClusterConfig's (a compile), the flags' alone
    // otherwise (a document says its own maps' sizes).
    let mut sizes = ebpf::MapSizes(opts.sizes);
    let docs: Vec<Doc> = match input {
        Input::Rollback => Vec::new(),
        Input::From { path, text } => vec![doc_of_json(text, &path)?],
        Input::Manifests {
            mut times, compile, ..
        } => {
            let compiled = match compile(&mut times)? {
                Ok(c) => c,
                Err(code) => return Ok(code),
            };
            if let Some(v) = compiled.views.first() {
                sizes = opts.sizes_for(v);
            }
            documents(compiled, &opts, &|f| {
                fs::read_to_string(fam_dir(f).applied()).ok()
            })?
        }
    };

    let lock = if !args.dry_run || state.exists() {
        state.create()?;
        Some(state.lock(args.lock_timeout)?)
    } else {
        None
    };
    let docs = if rollback {
        let mut docs = Vec::new();
        let mut any = false;
        for f in ["ipv4", "ipv6"] {
            // A family without a previous document keeps the one it has (the maps of a
            // family no document names are emptied).
            if let Some((p, json, previous)) = fam_dir(f).rollback_document(true) {
                any |= previous;
                docs.push(doc_of_json(json, &p.display().to_string())?);
            }
        }
        if !any {
            return Err(Fail(format!(
                "nothing to roll back to: no earlier ebpf apply recorded in {}",
                state.path().display()
            )));
        }
        docs
    } else {
        docs
    };
    let wanted = match docs
        .iter()
        .map(|d| d.layout.as_ref())
        .collect::<Option<Vec<_>>>()
    {
        Some(layouts) => Wanted::from_layouts(&layouts),
        None => Wanted::from_json(&docs.iter().map(|d| d.json.as_str()).collect::<Vec<_>>())
            .map_err(|e| Fail(format!("cannot apply: {e}")))?,
    }
    .complete(&sizes);
    // The affinity-match map holds both families' entries: it may overflow only here.
    if let Some(m) = wanted
        .maps
        .values()
        .find(|m| m.entries.len() > m.max_entries as usize)
    {
        return Err(Fail(format!(
            "--target ebpf: {} entries for Cilium's {} map, which holds {}; give it room with --map-sizes (the node's cilium-agent: --bpf-lb-*-map-max)",
            m.entries.len(),
            m.name,
            m.max_entries
        )));
    }
    let fingerprint = fingerprint(host_netns);
    let what = format!(
        "ebpf {} on cgroup {}",
        docs.iter().map(|d| d.family).collect::<Vec<_>>().join("+"),
        cgroup.display()
    );

    if !args.dry_run {
        mount_bpffs()?;
    }
    let found = Found::read(&inst);
    found.owned_by(&inst, &cgroup)?;
    let current = found.current(&fingerprint);
    // What the pinned maps hold, where they may be written in place.
    let before = match (&current, args.full) {
        (Ok(gen), false) => Some(dump_all(gen, &wanted)?),
        _ => None,
    };
    let mode = match (&current, args.full) {
        (_, true) => Err("--full".to_string()),
        (Err(why), _) => Err(why.clone()),
        (Ok(gen), false) => match plan::fits(&wanted, &shapes(gen), before.as_ref()) {
            Some(why) => Err(why),
            None => Ok(gen.clone()),
        },
    };

    match mode {
        Ok(gen) => {
            // Incremental: only what differs from the pinned maps.
            let before = before.expect("dumped above");
            let ops = plan::diff(&wanted, &before);
            let (ups, dels) = counts(&ops);
            if args.dry_run {
                print_dry_run(&what, "incremental", &gen, &ops, None);
                return Ok(0);
            }
            if !ops.is_empty() {
                if let Err(e) = write_ops(&gen, &ops, true) {
                    // Put back what the pinned maps held before.
                    let now = dump_all(&gen, &wanted)?;
                    let back = plan::diff(&as_wanted(&wanted, &before), &now);
                    let outcome = match write_ops(&gen, &back, false) {
                        Ok(()) => "the maps were put back as they were".to_string(),
                        Err(e2) => format!("putting the maps back failed too ({e2})"),
                    };
                    return Err(Fail(format!(
                        "{what}: writing the maps failed: {e}; {outcome}"
                    )));
                }
            }
            read_back(&gen, &wanted, &what)?;
            // A generation no link runs is what a killed apply left: it goes.
            for other in &found.generations {
                if *other != gen {
                    let _ = fs::remove_dir_all(other);
                }
            }
            record(&docs, &fam_dir)?;
            let verb = if ops.is_empty() {
                "unchanged"
            } else {
                "applied"
            };
            println!(
                "svc-compile: {what} {verb}: incremental: {ups} entries written, {dels} deleted; verified in {} ms",
                start.elapsed().as_millis()
            );
        }
        Err(why) => {
            let gen = inst.join(format!("gen-{}-{fingerprint}", found.next_generation()));
            let ops = plan::diff(&wanted, &BTreeMap::new());
            if args.dry_run {
                print_dry_run(&what, &format!("full ({why})"), &gen, &ops, Some(&inst));
                return Ok(0);
            }
            let res =
                new_generation(&inst, &gen, &wanted, &ops, host_netns, &sizes).and_then(|progs| {
                    read_back(&gen, &wanted, &what)?;
                    switch(&inst, &cgroup, &progs).map_err(|e| {
                        Fail(format!("{what}: switching the cgroup links failed: {e}"))
                    })
                });
            if let Err(e) = res {
                // The links still run the old generation (or none): drop the new one.
                let _ = fs::remove_dir_all(&gen);
                return Err(e);
            }
            // Every generation but the new one goes (also ones a killed apply left).
            for old in Found::read(&inst).generations {
                if old != gen {
                    let _ = fs::remove_dir_all(&old);
                }
            }
            record(&docs, &fam_dir)?;
            println!(
                "svc-compile: {what} applied: full ({why}): {} entries written in a new generation, links switched; verified in {} ms",
                ops.len(),
                start.elapsed().as_millis()
            );
        }
    }
    drop(lock);
    Ok(0)
}

/// The compiled documents for `--node` (every family), ids kept from the `--lock` file,
/// else from the last applied document (`applied(family)`).
fn documents(
    compiled: Compiled,
    opts: &ebpf::Options,
    applied: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<Doc>, Fail> {
    let mut docs = Vec::new();
    for v in &compiled.views {
        ebpf::check(v).map_err(|e| Fail(format!("--target ebpf: node {}: {e}", v.node_name)))?;
        let key = NodeIds::key_of(v);
        let family: &'static str = if key.1 == "ipv4" { "ipv4" } else { "ipv6" };
        let previous = match compiled.locked_ids.get(&key) {
            Some(locked) => Some(Ids::from_lock(locked)),
            None => applied(family).and_then(|j| ids_of_json(&j)),
        };
        let l = ebpf::layout_of(v, previous.as_ref(), opts).map_err(|e| {
            Fail(format!(
                "--target ebpf: node {} ({}): {e}",
                v.node_name,
                v.family.as_str()
            ))
        })?;
        let json = ebpf::render(
            &l,
            &ebpf::Options {
                format: ebpf::Format::Json,
                ..opts.clone()
            },
        );
        docs.push(Doc {
            family,
            json,
            layout: Some(l),
        });
    }
    Ok(docs)
}

/// The ids of an applied JSON document (its `ids` section).
fn ids_of_json(json: &str) -> Option<Ids> {
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    let mut locked = svc_compiler::passes::allocate::NodeIds::default();
    for (k, id) in v["ids"]["services"].as_object()? {
        locked
            .services
            .insert(k.clone(), u16::try_from(id.as_u64()?).ok()?);
    }
    for (k, id) in v["ids"]["backends"].as_object()? {
        locked
            .backends
            .insert(k.clone(), u32::try_from(id.as_u64()?).ok()?);
    }
    Some(Ids::from_lock(&locked))
}

fn doc_of_json(json: String, source: &str) -> Result<Doc, Fail> {
    let v: serde_json::Value = serde_json::from_str(&json)
        .map_err(|e| Fail(format!("{source}: not an ebpf JSON document: {e}")))?;
    let family = match v["family"].as_str() {
        Some("IPv4") | Some("ipv4") => "ipv4",
        Some("IPv6") | Some("ipv6") => "ipv6",
        _ => {
            return Err(Fail(format!(
                "{source}: not an ebpf JSON document (no `family`)"
            )))
        }
    };
    Ok(Doc {
        family,
        json,
        layout: None,
    })
}

/// `svc-compile cleanup --target ebpf [--cgroup PATH]`: the instance directory of that
/// cgroup under the default pin root is removed, links first (a link's pin is its last
/// reference, so its program leaves the cgroup), then every generation's programs and maps
/// and the shared maps; then the records. Nothing outside the instance directory is
/// touched (another cgroup's instance, another `--pin-dir`, Cilium's pins). Checked: the
/// directory is gone and no program of ours is attached to the cgroup any more.
pub fn cleanup(args: &Options) -> Result<u8, Fail> {
    let (cgroup, slug) = cgroup_of(args.cgroup.as_deref())?;
    let inst = Path::new(PIN_ROOT).join(format!("cg-{slug}"));
    let state = StateDir::new(args.state_dir.as_deref(), args.netns.as_deref());
    let _lock = match (args.dry_run, state.exists()) {
        (true, false) => None,
        _ => {
            state.create()?;
            Some(state.lock(args.lock_timeout)?)
        }
    };
    let what = format!("ebpf on cgroup {}", cgroup.display());
    if !inst.exists() {
        println!("svc-compile: cleanup: {what}: nothing of ours there");
    } else if args.dry_run {
        println!(
            "svc-compile: cleanup: {what}: would remove {} (its links, programs and maps)",
            inst.display()
        );
        return Ok(0);
    } else {
        for (name, _) in PROGRAMS {
            let link = inst.join(format!("link_{name}"));
            match fs::remove_file(&link) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    return Err(Fail(format!("cannot remove {}: {e}", link.display())))
                }
                _ => {}
            }
        }
        fs::remove_dir_all(&inst)
            .map_err(|e| Fail(format!("cannot remove {}: {e}", inst.display())))?;
        let left = ours_attached(&cgroup)?;
        if !left.is_empty() {
            return Err(Fail(format!(
                "cleanup: {what}: still attached after removing {}: {}; something else holds our links (run it again once that process is gone)",
                inst.display(),
                left.join(", ")
            )));
        }
        println!("svc-compile: cleanup: {what}: removed {}", inst.display());
    }
    for f in ["ipv4", "ipv6"] {
        crate::cleanup::forget(&state.records(ebpf::TARGET.name, ebpf::TARGET.ext, f))?;
    }
    Ok(0)
}

/// Our programs' names (the kernel keeps 15 characters) attached to `cgroup` itself.
fn ours_attached(cgroup: &Path) -> Result<Vec<String>, Fail> {
    let argv: Vec<String> = ["bpftool", "-j", "cgroup", "show"]
        .iter()
        .map(|s| s.to_string())
        .chain([cgroup.display().to_string()])
        .collect();
    let out = run_captured(&argv)?;
    if !out.ok {
        return Err(Fail(format!(
            "bpftool cgroup show {}: {}",
            cgroup.display(),
            out.stderr
        )));
    }
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap_or_default();
    Ok(v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["name"].as_str())
        .filter(|n| {
            PROGRAMS
                .iter()
                .any(|(ours, _)| ours.starts_with(n) && !n.is_empty())
        })
        .map(str::to_string)
        .collect())
}

/// `--pin-dir`, which must be [`PIN_ROOT`] or under it.
fn pin_root(dir: &str) -> Result<PathBuf, Fail> {
    let p = Path::new(dir.trim_end_matches('/'));
    let inside = p.starts_with(PIN_ROOT)
        && p.components().all(|c| {
            matches!(
                c,
                std::path::Component::Normal(_) | std::path::Component::RootDir
            )
        });
    if inside {
        Ok(p.to_path_buf())
    } else {
        Err(Fail(format!(
            "--pin-dir `{dir}`: apply pins only under {PIN_ROOT} (never Cilium's tc/globals)"
        )))
    }
}

/// The cgroup v2 directory (`--cgroup`, or the cgroup2 mount's root) and its name in a
/// pin path.
fn cgroup_of(arg: Option<&str>) -> Result<(PathBuf, String), Fail> {
    let mounts = fs::read_to_string("/proc/mounts").unwrap_or_default();
    let roots: Vec<PathBuf> = mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 2 && f[2] == "cgroup2").then(|| PathBuf::from(f[1]))
        })
        .collect();
    let Some(first) = roots.first() else {
        return Err(Fail(
            "no cgroup2 mount in /proc/mounts: the socket load balancer needs cgroup v2".into(),
        ));
    };
    let path = match arg {
        Some(p) => fs::canonicalize(p).map_err(|e| Fail(format!("--cgroup {p}: {e}")))?,
        None => first.clone(),
    };
    let Some(root) = roots.iter().find(|r| path.starts_with(r)) else {
        return Err(Fail(format!(
            "--cgroup {}: not in a cgroup2 mount ({})",
            path.display(),
            roots
                .iter()
                .map(|r| r.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    };
    let rel = path.strip_prefix(root).expect("checked").to_string_lossy();
    let slug = if rel.is_empty() {
        "root".to_string()
    } else {
        rel.replace(['/', '.'], "_")
    };
    Ok((path, slug))
}

/// Mounts bpffs on /sys/fs/bpf when nothing of type bpf is mounted there.
fn mount_bpffs() -> Result<(), Fail> {
    let mounted = fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 2 && f[1] == "/sys/fs/bpf" && f[2] == "bpf"
        });
    if mounted {
        return Ok(());
    }
    let c = |s: &str| CString::new(s).expect("no NUL");
    let (src, dst, ty) = (c("bpf"), c("/sys/fs/bpf"), c("bpf"));
    // SAFETY: mount(2) with valid C strings and no data.
    let r = unsafe { libc::mount(src.as_ptr(), dst.as_ptr(), ty.as_ptr(), 0, std::ptr::null()) };
    if r != 0 {
        return Err(Fail(format!(
            "cannot mount bpffs on /sys/fs/bpf: {}",
            io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// The object's and the node namespace's fingerprint (FNV-1a, 64 bits).
fn fingerprint(host_netns: u64) -> String {
    let h = OBJECT
        .iter()
        .chain(host_netns.to_le_bytes().iter())
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
    format!("{h:016x}")
}

/// What an instance directory holds.
struct Found {
    /// `gen-*` directories.
    generations: Vec<PathBuf>,
    /// Per program: the program id its link runs (`None`: no link pinned).
    links: Vec<Option<u32>>,
    /// The cgroup ids the pinned links are attached to (`bpf_link_info.cgroup.cgroup_id`;
    /// 0 for a link whose cgroup is gone).
    cgroups: BTreeSet<u64>,
}

impl Found {
    fn read(inst: &Path) -> Found {
        let mut generations: Vec<PathBuf> = fs::read_dir(inst)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("gen-"))
            .map(|e| e.path())
            .collect();
        generations.sort();
        let mut cgroups = BTreeSet::new();
        let links = PROGRAMS
            .iter()
            .map(|(name, _)| {
                let fd = obj_get(&inst.join(format!("link_{name}"))).ok()?;
                let i = info(fd.as_raw_fd()).ok()?;
                cgroups.insert(link_cgroup(&i));
                Some(i[2])
            })
            .collect();
        Found {
            generations,
            links,
            cgroups,
        }
    }

    /// An instance directory is named from the cgroup's path, `/` and `.` both as `_`, so
    /// two cgroups (`a/b`, `a.b`, `a_b`) can share a name. Its links say whose it is: one
    /// attached to another cgroup is refused, never switched over.
    fn owned_by(&self, inst: &Path, cgroup: &Path) -> Result<(), Fail> {
        use std::os::unix::fs::MetadataExt;
        let id = fs::metadata(cgroup)
            .map_err(|e| Fail(format!("--cgroup {}: {e}", cgroup.display())))?
            .ino();
        match self.cgroups.iter().find(|&&c| c != 0 && c != id) {
            None => Ok(()),
            Some(other) => Err(Fail(format!(
                "{} holds the links of another cgroup (id {other}; {} is id {id}): their names \
                 collide in the pin directory (or an earlier cgroup at this path is not yet \
                 released); give one of them its own --pin-dir",
                inst.display(),
                cgroup.display()
            ))),
        }
    }

    /// The generation every link runs, made by this binary for this namespace.
    fn current(&self, fingerprint: &str) -> Result<PathBuf, String> {
        if self.links.iter().all(Option::is_none) {
            return Err("first apply".into());
        }
        if self.cgroups.contains(&0) {
            // The kernel detached them when their cgroup went (a cgroup made again at the
            // path is a new one): they run nothing, whatever program they still name.
            return Err("the cgroup links are detached (their cgroup was removed)".into());
        }
        for g in &self.generations {
            let ids: Vec<Option<u32>> = PROGRAMS
                .iter()
                .map(|(name, _)| {
                    let fd = obj_get(&g.join(format!("prog_{name}"))).ok()?;
                    info(fd.as_raw_fd()).ok().map(|i| i[1])
                })
                .collect();
            if ids == self.links {
                let name = g.file_name().unwrap_or_default().to_string_lossy();
                return if name.ends_with(fingerprint) {
                    Ok(g.clone())
                } else {
                    Err("another program object or node namespace".into())
                };
            }
        }
        Err("the cgroup links run no whole generation (an interrupted apply)".into())
    }

    fn next_generation(&self) -> u64 {
        self.generations
            .iter()
            .filter_map(|g| {
                g.file_name()?
                    .to_string_lossy()
                    .split('-')
                    .nth(1)?
                    .parse::<u64>()
                    .ok()
            })
            .max()
            .map_or(1, |n| n + 1)
    }
}

/// The shapes of the configuration maps pinned in `gen`.
fn shapes(gen: &Path) -> BTreeMap<String, Shape> {
    let mut out = BTreeMap::new();
    for (name, configured) in plan::all_maps() {
        if !configured {
            continue;
        }
        let Ok(fd) = obj_get(&gen.join(name)) else {
            continue;
        };
        let Ok(i) = info(fd.as_raw_fd()) else {
            continue;
        };
        let kind = match i[0] {
            1 => "hash",
            9 => "lru_hash",
            11 => "lpm_trie",
            _ => "other",
        };
        out.insert(
            name.to_string(),
            Shape {
                kind: kind.into(),
                key_size: i[2],
                value_size: i[3],
                max_entries: i[4],
            },
        );
    }
    out
}

/// `bpftool -j map dump pinned` of every configuration map of `gen`.
fn dump_all(gen: &Path, wanted: &Wanted) -> Result<BTreeMap<String, Contents>, Fail> {
    let mut out = BTreeMap::new();
    for name in wanted.maps.keys() {
        let path = gen.join(name);
        let argv: Vec<String> = ["bpftool", "-j", "map", "dump", "pinned"]
            .iter()
            .map(|s| s.to_string())
            .chain([path.display().to_string()])
            .collect();
        let o = run_captured(&argv)?;
        if !o.ok {
            return Err(Fail(format!(
                "cannot read {} (`bpftool -j map dump pinned`): {}",
                path.display(),
                first_line(&o.stderr)
            )));
        }
        let c = plan::parse_dump(&o.stdout)
            .map_err(|e| Fail(format!("cannot read {}: {e}", path.display())))?;
        out.insert(name.clone(), c);
    }
    Ok(out)
}

/// `before` (dumped contents) as a wanted state with `shape`'s maps.
fn as_wanted(shape: &Wanted, before: &BTreeMap<String, Contents>) -> Wanted {
    let mut w = shape.clone();
    for m in w.maps.values_mut() {
        m.entries = before
            .get(&m.name)
            .map(|c| c.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
    }
    w
}

/// Every configuration map must hold exactly what was compiled.
fn read_back(gen: &Path, wanted: &Wanted, what: &str) -> Result<(), Fail> {
    let now = dump_all(gen, wanted)?;
    match plan::first_mismatch(wanted, &now) {
        None => Ok(()),
        Some((map, how)) => Err(Fail(format!(
            "{what}: after loading, {map} does not hold what was compiled: {how}; the next apply writes the difference"
        ))),
    }
}

fn counts(ops: &[Op]) -> (usize, usize) {
    let dels = ops
        .iter()
        .filter(|o| matches!(o, Op::Delete { .. }))
        .count();
    (ops.len() - dels, dels)
}

fn record(docs: &[Doc], fam_dir: &dyn Fn(&str) -> Records) -> Result<(), Fail> {
    // Each family's document now (`None`: no document, its maps were emptied) and before.
    let states: Vec<(&str, Option<&str>, Option<String>)> = ["ipv4", "ipv6"]
        .into_iter()
        .map(|f| {
            let now = docs.iter().find(|d| d.family == f).map(|d| d.json.as_str());
            let old = fs::read_to_string(fam_dir(f).applied()).ok();
            (f, now, old)
        })
        .collect();
    // `previous` is what this apply replaced, in every family, when it changed any: a
    // rollback then gives the node both families as they were (a family this apply left
    // as it was keeps its document; one it emptied gets its last one back).
    if states.iter().all(|(_, now, old)| *now == old.as_deref()) {
        return Ok(());
    }
    for (f, now, old) in &states {
        let dir = fam_dir(f);
        if now.is_none() && old.is_none() {
            continue;
        }
        dir.create()?;
        if let Some(old) = old {
            write_atomic(&dir.previous(), old)?;
        }
        match now {
            Some(json) => write_atomic(&dir.applied(), json)?,
            None => {
                let _ = fs::remove_file(dir.applied());
            }
        }
    }
    Ok(())
}

/// `--dry-run`: the plan as a comment header and `bpftool batch file` lines.
fn print_dry_run(what: &str, mode: &str, gen: &Path, ops: &[Op], new_in: Option<&Path>) {
    let (ups, dels) = counts(ops);
    let mut out = format!(
        "# svc-compile apply --dry-run: {what}: {mode}: {ups} entries written, {dels} deleted\n"
    );
    if let Some(inst) = new_in {
        out += &format!(
            "# a new generation {} is created (its maps, the shared runtime maps of {}/shared, the eight programs), filled with the lines below, read back; then the cgroup links {}/link_* are switched to it (BPF_LINK_UPDATE) and older generations are deleted\n",
            gen.display(),
            inst.display(),
            inst.display()
        );
    }
    out += &plan::batch_lines(ops, &gen.display().to_string());
    use std::io::Write;
    let mut stdout = io::stdout().lock();
    let _ = stdout
        .write_all(out.as_bytes())
        .and_then(|_| stdout.flush());
}

/// Creates and fills generation `gen` and loads and pins its programs; returns their fds.
fn new_generation(
    inst: &Path,
    gen: &Path,
    wanted: &Wanted,
    ops: &[Op],
    host_netns: u64,
    sizes: &ebpf::MapSizes,
) -> Result<Vec<OwnedFd>, Fail> {
    let shared = inst.join("shared");
    let io_err = |p: &Path, e: io::Error| Fail(format!("cannot create {}: {e}", p.display()));
    fs::create_dir_all(&shared).map_err(|e| io_err(&shared, e))?;
    fs::create_dir_all(gen).map_err(|e| io_err(gen, e))?;
    let runtime: Vec<&str> = plan::all_maps()
        .into_iter()
        .filter(|(_, configured)| !configured)
        .map(|(n, _)| n)
        .collect();
    // The runtime maps of earlier generations are this one's too.
    for name in &runtime {
        let s = shared.join(name);
        if s.exists() {
            fs::hard_link(&s, gen.join(name)).map_err(|e| io_err(&gen.join(name), e))?;
        }
    }
    let mut loader = aya::EbpfLoader::new();
    loader.default_map_pin_directory(gen);
    loader.override_global("host_netns_cookie", &host_netns, true);
    for m in wanted.maps.values() {
        loader.map_max_entries(&m.name, m.max_entries);
    }
    for name in &runtime {
        loader.map_max_entries(name, sizes.of(plan::id_of(name).expect("a known map").0));
    }
    // aya parses the ELF in place: give it an 8-byte-aligned copy.
    let mut aligned: Vec<u64> = vec![0; OBJECT.len().div_ceil(8)];
    // SAFETY: the u64 buffer has at least OBJECT.len() bytes.
    let bytes =
        unsafe { std::slice::from_raw_parts_mut(aligned.as_mut_ptr().cast::<u8>(), OBJECT.len()) };
    bytes.copy_from_slice(OBJECT);
    let mut obj = loader
        .load(bytes)
        .map_err(|e| Fail(format!("cannot load the socket load balancer's maps: {e}")))?;
    for name in &runtime {
        let s = shared.join(name);
        if !s.exists() {
            fs::hard_link(gen.join(name), &s).map_err(|e| io_err(&s, e))?;
        }
    }
    // Not live yet: written here, in order, without a child.
    write_ops(gen, ops, false).map_err(|e| Fail(format!("cannot fill {}: {e}", gen.display())))?;
    let mut progs = Vec::new();
    for (name, _) in PROGRAMS {
        let p: &mut aya::programs::CgroupSockAddr = obj
            .program_mut(name)
            .ok_or_else(|| Fail(format!("the embedded object has no program {name}")))?
            .try_into()
            .map_err(|e| Fail(format!("{name}: {e}")))?;
        p.load()
            .map_err(|e| Fail(format!("the kernel refuses {name}: {e}")))?;
        let pin = gen.join(format!("prog_{name}"));
        p.pin(&pin)
            .map_err(|e| Fail(format!("cannot pin {}: {e}", pin.display())))?;
        let fd = p
            .fd()
            .map_err(|e| Fail(format!("{name}: {e}")))?
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| Fail(format!("{name}: {e}")))?;
        progs.push(fd);
    }
    Ok(progs)
}

/// Points the eight cgroup links at `progs` (updating pinned links, creating and
/// pinning missing ones), in a child that finishes even if this process is killed.
fn switch(inst: &Path, cgroup: &Path, progs: &[OwnedFd]) -> Result<(), String> {
    let cg = File::open(cgroup).map_err(|e| format!("cannot open {}: {e}", cgroup.display()))?;
    let mut calls: Vec<Call> = Vec::new();
    let mut paths: Vec<CString> = Vec::new();
    let mut links: Vec<OwnedFd> = Vec::new();
    for (i, (name, attach)) in PROGRAMS.iter().enumerate() {
        let pin = inst.join(format!("link_{name}"));
        let prog = progs[i].as_raw_fd() as u64;
        // A link its cgroup's removal detached cannot be updated (ENOLINK): made anew.
        let live = obj_get(&pin)
            .ok()
            .filter(|l| info(l.as_raw_fd()).is_ok_and(|i| link_cgroup(&i) != 0));
        match live {
            Some(link) => {
                // BPF_LINK_UPDATE { link_fd, new_prog_fd, flags 0, old_prog_fd 0 }
                calls.push(Call::Update([
                    link.as_raw_fd() as u64 | prog << 32,
                    0,
                    0,
                    0,
                ]));
                links.push(link);
            }
            None => {
                let _ = fs::remove_file(&pin);
                paths.push(
                    CString::new(pin.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?,
                );
                // BPF_LINK_CREATE { prog_fd, target_fd, attach_type, flags 0 }
                calls.push(Call::CreateAndPin(
                    [
                        prog | (cg.as_raw_fd() as u64) << 32,
                        u64::from(*attach),
                        0,
                        0,
                    ],
                    paths.len() - 1,
                ));
            }
        }
    }
    let path_ptrs: Vec<u64> = paths.iter().map(|p| p.as_ptr() as u64).collect();
    run_in_child(&|| {
        for c in &calls {
            match c {
                Call::Update(a) => {
                    let mut a = *a;
                    sys_bpf(29, &mut a)?;
                }
                Call::CreateAndPin(a, p) => {
                    let mut a = *a;
                    let fd = sys_bpf(28, &mut a)?;
                    // BPF_OBJ_PIN { pathname, bpf_fd }
                    let mut pin = [path_ptrs[*p], fd as u64, 0, 0];
                    sys_bpf(6, &mut pin)?;
                }
            }
        }
        Ok(())
    })
    .map_err(|n| {
        format!(
            "BPF link call {n} failed: {}",
            io::Error::from_raw_os_error(n as i32)
        )
    })?;
    drop(links);
    // Every link runs the new program now.
    for (i, (name, _)) in PROGRAMS.iter().enumerate() {
        let want = info(progs[i].as_raw_fd()).map_err(|e| e.to_string())?[1];
        let fd =
            obj_get(&inst.join(format!("link_{name}"))).map_err(|e| format!("link_{name}: {e}"))?;
        let got = info(fd.as_raw_fd()).map_err(|e| e.to_string())?[2];
        if got != want {
            return Err(format!("link_{name} runs program {got}, not {want}"));
        }
    }
    Ok(())
}

enum Call {
    Update([u64; 4]),
    CreateAndPin([u64; 4], usize),
}

/// Writes `ops` to the maps pinned in `gen`; in a child (see [`run_in_child`]) when
/// `detached`.
fn write_ops(gen: &Path, ops: &[Op], detached: bool) -> Result<(), String> {
    let mut fds: BTreeMap<&str, OwnedFd> = BTreeMap::new();
    for op in ops {
        let (Op::Update { map, .. } | Op::Delete { map, .. }) = op;
        if !fds.contains_key(map.as_str()) {
            let fd = obj_get(&gen.join(map)).map_err(|e| format!("{map}: {e}"))?;
            fds.insert(map, fd);
        }
    }
    // Attribute blocks built before any call: the child only makes system calls.
    let calls: Vec<(libc::c_long, [u64; 4])> = ops
        .iter()
        .map(|op| match op {
            // BPF_MAP_UPDATE_ELEM { map_fd, key, value, flags BPF_ANY }
            Op::Update { map, key, value } => (
                2,
                [
                    fds[map.as_str()].as_raw_fd() as u64,
                    key.as_ptr() as u64,
                    value.as_ptr() as u64,
                    0,
                ],
            ),
            // BPF_MAP_DELETE_ELEM { map_fd, key }
            Op::Delete { map, key } => (
                3,
                [
                    fds[map.as_str()].as_raw_fd() as u64,
                    key.as_ptr() as u64,
                    0,
                    0,
                ],
            ),
        })
        .collect();
    let run = || {
        for (cmd, a) in &calls {
            let mut a = *a;
            match sys_bpf(*cmd, &mut a) {
                // Deleting what is already gone is what was meant.
                Err(e) if *cmd == 3 && e == libc::ENOENT as i64 => {}
                r => {
                    r?;
                }
            }
        }
        Ok(())
    };
    let r = if detached { run_in_child(&run) } else { run() };
    r.map_err(|n| {
        format!(
            "a map write failed: {}",
            io::Error::from_raw_os_error(n as i32)
        )
    })
}

/// Runs `f` (system calls only) in a forked child in its own process group, so that it
/// finishes even if this process is killed; the child shares the lock's open file (a
/// `flock` belongs to it), so another apply waits for the child too. `Err(errno)` when
/// `f` failed.
fn run_in_child(f: &dyn Fn() -> Result<(), i64>) -> Result<(), i64> {
    // SAFETY: the child calls only `f` (bpf(2) on prepared buffers), setpgid and _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0) as i64);
    }
    if pid == 0 {
        // SAFETY: async-signal-safe calls only.
        unsafe {
            libc::setpgid(0, 0);
            let code = match f() {
                Ok(()) => 0,
                Err(e) => (e.clamp(1, 250)) as i32,
            };
            libc::_exit(code);
        }
    }
    let mut status = 0;
    loop {
        // SAFETY: waiting for our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            break;
        }
        if io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return Err(libc::ECHILD as i64);
        }
    }
    match (libc::WIFEXITED(status), libc::WEXITSTATUS(status)) {
        (true, 0) => Ok(()),
        (true, n) => Err(n as i64),
        _ => Err(libc::EINTR as i64),
    }
}

/// bpf(2) with a 32-byte attribute block; `Err(errno)`.
fn sys_bpf(cmd: libc::c_long, attr: &mut [u64; 4]) -> Result<i64, i64> {
    // SAFETY: the block is larger than every attribute struct used here and lives
    // across the call; the kernel zero-fills the rest of its own copy.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), 32usize) };
    if r < 0 {
        // SAFETY: reading errno right after the failed call.
        Err(unsafe { *libc::__errno_location() } as i64)
    } else {
        Ok(r)
    }
}

/// BPF_OBJ_GET: a descriptor for a pinned object.
fn obj_get(path: &Path) -> io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut attr = [c.as_ptr() as u64, 0, 0, 0];
    match sys_bpf(7, &mut attr) {
        // SAFETY: BPF_OBJ_GET returned a new descriptor that we own.
        Ok(fd) => Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) }),
        Err(e) => Err(io::Error::from_raw_os_error(e as i32)),
    }
}

/// BPF_OBJ_GET_INFO_BY_FD: the first eight u32 words of the object's info (maps: type,
/// id, key size, value size, max entries; programs: type, id; links: type, id, prog id).
fn info(fd: RawFd) -> io::Result<[u32; 8]> {
    let mut buf = [0u64; 32];
    let mut attr = [
        fd as u64 | ((std::mem::size_of_val(&buf) as u64) << 32),
        buf.as_mut_ptr() as u64,
        0,
        0,
    ];
    sys_bpf(15, &mut attr).map_err(|e| io::Error::from_raw_os_error(e as i32))?;
    let mut out = [0u32; 8];
    for (i, w) in out.iter_mut().enumerate() {
        let v = buf[i / 2];
        *w = if i % 2 == 0 {
            v as u32
        } else {
            (v >> 32) as u32
        };
    }
    Ok(out)
}

/// A cgroup link's cgroup id from its [`info`] words: `bpf_link_info` is type, id,
/// prog_id, then (8-aligned) `cgroup.cgroup_id`, 0 once the kernel detached the link.
fn link_cgroup(i: &[u32; 8]) -> u64 {
    u64::from(i[4]) | u64::from(i[5]) << 32
}

/// The cookie of network namespace `name` (`/run/netns/NAME`): that of a socket made in it.
fn netns_cookie(name: &str) -> Result<u64, Fail> {
    let path = Path::new("/run/netns").join(name);
    let f = File::open(&path).map_err(|_| {
        Fail(format!(
            "no network namespace `{name}` (see `ip netns list`)"
        ))
    })?;
    crate::netns::in_netns(&f, || {
        let s = std::net::UdpSocket::bind("0.0.0.0:0")
            .or_else(|_| std::net::UdpSocket::bind("[::]:0"))
            .map_err(|e| Fail(format!("cannot make a socket in {name}: {e}")))?;
        crate::netns::cookie_of(&s).map_err(|e| Fail(format!("SO_NETNS_COOKIE: {e}")))
    })
    .map_err(|e| Fail(format!("cannot enter {}: {e}", path.display())))?
}
