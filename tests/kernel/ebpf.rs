//! The `ebpf` target in the real kernel: the maps of each golden case loaded (by this
//! loader and by the `bpftool batch` rendering), `bpf/sock_lb.c` attached to a fresh
//! cgroup v2, and real sockets from a process inside that cgroup.
//!
//! Root, clang and a cgroup2 mount are needed; without them the tests print `skipped:`
//! and pass, unless `SVC_KERNEL=require` (CI) makes a skip a failure.
//!
//! Everything made here is unique to the test (`svc-compile-test-<pid>-<n>`: the cgroup,
//! the pin directory under /sys/fs/bpf, the lab's namespaces) and removed by Drop, also
//! when a test fails. The cgroup links are bpf links owned by the loaded object: they go
//! when it is dropped. Probing processes are forked children that move themselves into
//! the cgroup; they are bounded in time and reaped.
//!
//! The loader here (open the object with aya, pin maps by name, write the entries in
//! Cilium's order, attach eight programs) is what `apply --target ebpf` will do from src/.
use svc_node::sys::{aya, libc};

use super::echo::{probe_in, PROBE_TIMEOUT};
use super::flows::{parse_flows, Expect, BACKEND_PORT};
use super::lab::skip;
use super::sys::enter_netns;
use super::{Lab, LabSpec, Outcome, Proto};
use crate::golden::{case_args, case_dirs, case_flows, compile_case, compile_case_with};
use crate::support::root;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::io::{self, Read};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use svc_compiler::ir::NodeView;
use svc_compiler::net::{Cidr, IpFamily};
use svc_compiler::passes::node::{node_view, NodeSelection};
use svc_compiler::source::SourceMap;
use svc_node::sys::aya::programs::{CgroupAttachMode, CgroupSockAddr};
use svc_targets::ebpf::{self, Layout};

mod cilium;

static SEQ: AtomicU32 = AtomicU32::new(0);

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst)
    )
}

/// What every test here needs: root, clang (the program, compiled once per process),
/// a cgroup2 mount. `None` after a skip.
fn prerequisites(test: &str) -> Option<(PathBuf, PathBuf)> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        skip(test, "needs root (cgroups, BPF, network namespaces)");
        return None;
    }
    let Some(cg) = cgroup2_mount() else {
        skip(test, "no cgroup2 mount in /proc/mounts");
        return None;
    };
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| sweep_stale(&cg));
    match program() {
        Ok(obj) => Some((obj, cg)),
        Err(e) => {
            skip(test, &e);
            None
        }
    }
}

/// `bpf/sock_lb.c` compiled with clang, once per test process, into one object per
/// version of the source (`CARGO_TARGET_TMPDIR/sock_lb-HASH.o`, written under a
/// temporary name and renamed): runs share it, and it is replaced, not added to, when
/// the source changes.
fn program() -> Result<PathBuf, String> {
    static OBJ: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    OBJ.get_or_init(|| {
        use std::hash::{Hash, Hasher};
        let src = root().join("bpf/sock_lb.c");
        let text = std::fs::read(&src).map_err(|e| format!("cannot read bpf/sock_lb.c: {e}"))?;
        // Debian keeps asm/ under the multiarch directory, which clang -target bpf does
        // not search by itself.
        let arch = Command::new("cc")
            .arg("-dumpmachine")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        let args = [
            "-O2".to_string(),
            "-g".into(),
            "-Wall".into(),
            "-Werror".into(),
            "-target".into(),
            "bpf".into(),
            format!("-I/usr/include/{arch}"),
        ];
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (&text, &args).hash(&mut h);
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let name = format!("sock_lb-{:016x}.o", h.finish());
        let out = dir.join(&name);
        if out.exists() {
            return Ok(out);
        }
        let tmp = dir.join(format!("{name}.{}", std::process::id()));
        let r = Command::new("clang")
            .args(&args)
            .arg("-c")
            .arg(&src)
            .arg("-o")
            .arg(&tmp)
            .output()
            .map_err(|e| {
                format!("needs clang to build bpf/sock_lb.c ({e}); install clang and libbpf-dev")
            })?;
        if !r.status.success() {
            let _ = std::fs::remove_file(&tmp);
            return Err(format!(
                "clang failed on bpf/sock_lb.c (libbpf-dev installed?):\n{}",
                String::from_utf8_lossy(&r.stderr)
            ));
        }
        std::fs::rename(&tmp, &out).map_err(|e| format!("cannot keep {name}: {e}"))?;
        // The objects of older versions of the source go.
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with("sock_lb-") && n.ends_with(".o") && n != name {
                let _ = std::fs::remove_file(e.path());
            }
        }
        Ok(out)
    })
    .clone()
}

/// Removes what a killed run left (a cgroup or pin directory whose process is gone);
/// Drop cannot run after SIGKILL.
fn sweep_stale(cgroup_mount: &Path) {
    remove_dead(cgroup_mount, "svc-compile-test-", |p| {
        std::fs::remove_dir(p)
    });
    remove_dead(Path::new("/sys/fs/bpf"), "svc-compile-test-", |p| {
        std::fs::remove_dir_all(p)
    });
}

/// Removes, with `remove`, each entry of `dir` named `{prefix}{pid}-…` whose process
/// `pid` is gone.
pub(super) fn remove_dead(dir: &Path, prefix: &str, remove: fn(&Path) -> io::Result<()>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let dead = name
            .strip_prefix(prefix)
            .and_then(|r| r.split('-').next())
            .is_some_and(|pid| !Path::new("/proc").join(pid).exists());
        if dead {
            let _ = remove(&e.path());
        }
    }
}

pub(super) fn cgroup2_mount() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    mounts.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 2 && f[2] == "cgroup2").then(|| PathBuf::from(f[1]))
    })
}

/// A fresh cgroup v2 directory; removed on drop (its processes have exited by then).
pub(super) struct Cgroup(pub(super) PathBuf);

impl Cgroup {
    pub(super) fn new(mount: &Path) -> Cgroup {
        let p = mount.join(unique("svc-compile-test"));
        std::fs::create_dir(&p).expect("create cgroup");
        Cgroup(p)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// A pin directory under /sys/fs/bpf (bpffs mounted there if it is not); removed with
/// every pin in it on drop.
struct Pins(PathBuf);

impl Pins {
    fn new() -> Pins {
        let bpffs = Path::new("/sys/fs/bpf");
        let mounted = std::fs::read_to_string("/proc/mounts")
            .unwrap_or_default()
            .lines()
            .any(|l| l.split_whitespace().nth(1) == Some("/sys/fs/bpf") && l.contains(" bpf "));
        if !mounted {
            let ok = Command::new("mount")
                .args(["-t", "bpf", "bpf", "/sys/fs/bpf"])
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            assert!(ok, "cannot mount bpffs on /sys/fs/bpf");
        }
        let p = bpffs.join(unique("svc-compile-test"));
        std::fs::create_dir(&p).expect("create pin directory");
        Pins(p)
    }
}

impl Drop for Pins {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn bpf(cmd: libc::c_long, attr: &mut [u64; 4]) -> io::Result<i64> {
    // SAFETY: the attribute buffer is larger than every command's attribute struct used
    // here and lives across the call.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), 32usize) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// BPF_OBJ_GET: an fd for a pinned map.
fn open_pinned(path: &Path) -> io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let mut attr = [c.as_ptr() as u64, 0, 0, 0];
    // SAFETY: BPF_OBJ_GET returned a new descriptor that we own.
    bpf(7, &mut attr).map(|fd| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// BPF_MAP_UPDATE_ELEM.
fn update(fd: &OwnedFd, key: &[u8], value: &[u8]) -> io::Result<()> {
    let mut attr = [
        fd.as_raw_fd() as u64,
        key.as_ptr() as u64,
        value.as_ptr() as u64,
        0,
    ];
    bpf(2, &mut attr).map(|_| ())
}

/// The program loaded with its maps pinned in `pins`, the layout written into them, and
/// the four hooks attached to `cgroup`. Dropping it detaches the hooks.
struct Loaded {
    _ebpf: aya::Ebpf,
}

/// Opens the object with its maps pinned by name under `pins` (kept if they exist,
/// e.g. made by a bpftool batch file) and sized from the layout. `host_netns` is the
/// cookie of the node's network namespace (0: the initial one).
fn open(obj: &Path, layout: &Layout, pins: &Pins, host_netns: u64) -> aya::Ebpf {
    let mut loader = aya::EbpfLoader::new();
    loader.default_map_pin_directory(&pins.0);
    loader.override_global("host_netns_cookie", &host_netns, true);
    for m in layout.maps.iter().filter(|m| m.id.in_program()) {
        loader.map_max_entries(m.name, m.max_entries);
    }
    loader.load_file(obj).expect("load the BPF object")
}

/// Writes the entries of the program's maps in layout order (Cilium's write order); the
/// Maglev tables are not the socket load balancer's.
fn fill(layout: &Layout, pins: &Pins) -> io::Result<()> {
    let mut fds = BTreeMap::new();
    for m in layout.maps.iter().filter(|m| m.id.in_program()) {
        fds.insert(m.name, open_pinned(&pins.0.join(m.name))?);
    }
    for e in layout.entries.iter().filter(|e| e.map().in_program()) {
        let name = e.map().name(layout.family);
        update(&fds[name], &e.key(), &e.value())
            .map_err(|err| io::Error::new(err.kind(), format!("{name} {e:?}: {err}")))?;
    }
    Ok(())
}

fn attach(mut ebpf: aya::Ebpf, cgroup: &Cgroup) -> Loaded {
    let dir = std::fs::File::open(&cgroup.0).expect("open cgroup");
    for name in [
        "sock4_connect",
        "sock4_sendmsg",
        "sock4_recvmsg",
        "sock4_getpeername",
        "sock6_connect",
        "sock6_sendmsg",
        "sock6_recvmsg",
        "sock6_getpeername",
    ] {
        let p: &mut CgroupSockAddr = ebpf
            .program_mut(name)
            .unwrap_or_else(|| panic!("no program {name}"))
            .try_into()
            .expect("cgroup sock_addr program");
        p.load()
            .unwrap_or_else(|e| panic!("verifier rejected {name}: {e:?}"));
        p.attach(&dir, CgroupAttachMode::Single)
            .unwrap_or_else(|e| panic!("attach {name}: {e}"));
    }
    Loaded { _ebpf: ebpf }
}

fn load(obj: &Path, layout: &Layout, pins: &Pins, cgroup: &Cgroup, host_netns: u64) -> Loaded {
    let ebpf = open(obj, layout, pins, host_netns);
    fill(layout, pins).expect("write the maps");
    attach(ebpf, cgroup)
}

/// The cookie of a network namespace (SO_NETNS_COOKIE of a socket made there).
fn netns_cookie(netns: &str) -> u64 {
    super::sys::in_netns(netns, || {
        let s = UdpSocket::bind("0.0.0.0:0").expect("socket");
        let mut cookie = 0u64;
        let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `cookie`.
        let r = unsafe {
            libc::getsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                71, // SO_NETNS_COOKIE
                (&mut cookie as *mut u64).cast(),
                &mut len,
            )
        };
        assert_eq!(r, 0, "SO_NETNS_COOKIE: {}", io::Error::last_os_error());
        cookie
    })
    .expect("enter netns")
}

/// A lab whose pods serve TCP and UDP on [`BACKEND_PORT`], a fresh cgroup, and the
/// program attached to it with a view's maps. Fields drop in order: the program (its
/// links) first, the lab last.
struct Served {
    loaded: Option<Loaded>,
    pins: Pins,
    cg: Cgroup,
    lab: Lab,
}

impl Served {
    fn new(tag: &str, obj: &Path, cgroot: &Path, view: &NodeView) -> Served {
        let mut lab = Lab::new(tag, &LabSpec::default()).expect("lab");
        lab.serve(Proto::Tcp, BACKEND_PORT).expect("serve tcp");
        lab.serve(Proto::Udp, BACKEND_PORT).expect("serve udp");
        let mut s = Served {
            loaded: None,
            pins: Pins::new(),
            cg: Cgroup::new(cgroot),
            lab,
        };
        s.reload(obj, view);
        s
    }

    /// Replaces the program and its maps with `view`'s, in new pins.
    fn reload(&mut self, obj: &Path, view: &NodeView) {
        self.loaded = None;
        self.pins = Pins::new();
        let l = ebpf::layout(view, None, &ebpf::MapSizes::default()).unwrap();
        let node = netns_cookie(self.lab.netns("node"));
        self.loaded = Some(load(obj, &l, &self.pins, &self.cg, node));
    }

    /// `n` probes from `host`, inside the cgroup.
    fn probes(&self, host: &str, proto: Proto, dst: SocketAddr, n: usize) -> Vec<Seen> {
        probes(Some(&self.cg), self.lab.netns(host), proto, dst, n)
    }
}

// ---------------------------------------------------------------------------------------
// Probes from inside the cgroup
// ---------------------------------------------------------------------------------------

/// One probe's result as seen by the client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Seen {
    /// Who answered, and the peer address the socket reports (getpeername for TCP, the
    /// datagram's source for UDP).
    Answer { backend: String, peer: SocketAddr },
    /// connect/send failed with this errno (EHOSTUNREACH: no backend).
    Errno(i32),
    /// Anything else.
    Other(String),
}

fn tcp_once(dst: SocketAddr) -> Seen {
    let s = match TcpStream::connect_timeout(&dst, PROBE_TIMEOUT) {
        Ok(s) => s,
        Err(e) => {
            return e
                .raw_os_error()
                .map_or(Seen::Other(e.to_string()), Seen::Errno)
        }
    };
    let peer = match s.peer_addr() {
        Ok(p) => p,
        Err(e) => return Seen::Other(format!("getpeername: {e}")),
    };
    let _ = s.set_read_timeout(Some(PROBE_TIMEOUT));
    let mut text = String::new();
    match (&s).take(512).read_to_string(&mut text) {
        Ok(_) => match text.split_whitespace().next() {
            Some(b) => Seen::Answer {
                backend: b.to_string(),
                peer,
            },
            None => Seen::Other("empty answer".into()),
        },
        Err(e) => Seen::Other(e.to_string()),
    }
}

/// An unconnected socket: sendmsg4 translates the destination, recvmsg4 the source.
fn udp_once(dst: SocketAddr) -> Seen {
    let run = || -> io::Result<Seen> {
        let s = UdpSocket::bind(if dst.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" })?;
        s.set_read_timeout(Some(PROBE_TIMEOUT))?;
        s.send_to(b"probe\n", dst)?;
        let mut buf = [0u8; 512];
        let (n, from) = s.recv_from(&mut buf)?;
        let text = String::from_utf8_lossy(&buf[..n]);
        Ok(Seen::Answer {
            backend: text.split_whitespace().next().unwrap_or("").to_string(),
            peer: from,
        })
    };
    run().unwrap_or_else(|e| {
        e.raw_os_error()
            .map_or(Seen::Other(e.to_string()), Seen::Errno)
    })
}

fn encode(s: &Seen) -> String {
    match s {
        Seen::Answer { backend, peer } => format!("ok {backend} {peer}"),
        Seen::Errno(e) => format!("errno {e}"),
        Seen::Other(t) => format!("other {}", t.replace('\n', " ")),
    }
}

fn decode(l: &str) -> Seen {
    let mut w = l.splitn(3, ' ');
    match (w.next(), w.next(), w.next()) {
        (Some("ok"), Some(b), Some(p)) => Seen::Answer {
            backend: b.to_string(),
            peer: p.parse().unwrap(),
        },
        (Some("errno"), Some(e), None) => Seen::Errno(e.parse().unwrap()),
        _ => Seen::Other(l.to_string()),
    }
}

/// Runs `n` probes of `proto` to `dst` from a child process that first moves itself into
/// `cgroup` (None: stays outside) and into the network namespace `netns`. Stops early
/// after a probe that timed out or failed oddly.
pub(super) fn probes(
    cgroup: Option<&Cgroup>,
    netns: &str,
    proto: Proto,
    dst: SocketAddr,
    n: usize,
) -> Vec<Seen> {
    let procs = cgroup
        .map(|c| CString::new(c.0.join("cgroup.procs").as_os_str().as_encoded_bytes()).unwrap());
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 fills two descriptors we then own.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the child only makes syscalls and small allocations (glibc's malloc is
    // fork-safe) and leaves with _exit, never returning into the test harness.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
    if pid == 0 {
        drop(rd);
        let mut out = String::new();
        let ok = (|| -> io::Result<()> {
            if let Some(p) = &procs {
                // SAFETY: a NUL-terminated path; writing "0" moves the writing process.
                let fd = unsafe { libc::open(p.as_ptr(), libc::O_WRONLY) };
                if fd < 0 || unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) } != 1 {
                    return Err(io::Error::last_os_error());
                }
                unsafe { libc::close(fd) };
            }
            enter_netns(netns)
        })();
        match ok {
            Err(e) => out.push_str(&format!("other setup: {e}\n")),
            Ok(()) => {
                for _ in 0..n {
                    let s = match proto {
                        Proto::Tcp => tcp_once(dst),
                        Proto::Udp => udp_once(dst),
                    };
                    out.push_str(&encode(&s));
                    out.push('\n');
                    // A time-out says enough; don't wait for the rest.
                    if matches!(s, Seen::Other(_)) {
                        break;
                    }
                }
            }
        }
        // SAFETY: plain write to our pipe end, then leave without running destructors.
        unsafe {
            libc::write(wr.as_raw_fd(), out.as_ptr().cast(), out.len());
            libc::_exit(0);
        }
    }
    drop(wr);
    // Bounded: every probe is bounded by PROBE_TIMEOUT twice; give the child that and a
    // hang guard's worth more (starting it on a loaded machine).
    let limit = PROBE_TIMEOUT * 2 * n as u32 + super::lab::EXEC_TIMEOUT;
    let start = Instant::now();
    let mut text = Vec::new();
    let mut file = std::fs::File::from(rd);
    let mut buf = [0u8; 4096];
    loop {
        let mut pfd = libc::pollfd {
            fd: file.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let left = limit.saturating_sub(start.elapsed());
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, left.as_millis().max(1) as i32) };
        if r <= 0 {
            // SAFETY: our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            break;
        }
        match file.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(k) => text.extend_from_slice(&buf[..k]),
        }
    }
    let mut status = 0;
    // SAFETY: reaping our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    let text = String::from_utf8_lossy(&text);
    let v: Vec<Seen> = text.lines().map(decode).collect();
    assert!(
        !v.is_empty() && v.len() <= n,
        "probe child gave {} results: {text}",
        v.len()
    );
    v
}

// ---------------------------------------------------------------------------------------
// Golden cases
// ---------------------------------------------------------------------------------------

/// A golden case's view, compiled in-process from its `args`: the loader here needs the
/// typed layout (and some tests change the view). [`golden_cases_render`] checks that it
/// renders what the CLI prints.
pub fn case_view(case: &str) -> NodeView {
    let args = case_args(case);
    let mut sources = SourceMap::default();
    let mut files = Vec::new();
    let mut node = None;
    let mut family = None;
    let mut opts = svc_compiler::Options {
        allocate: true,
        ..Default::default()
    };
    let dir = root().join("golden/cases").join(case);
    let add = |p: &Path, sources: &mut SourceMap, files: &mut Vec<_>| {
        let text = std::fs::read_to_string(p).unwrap();
        files.push(sources.add(p.display().to_string(), text));
    };
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            matches!(
                p.extension().and_then(|x| x.to_str()),
                Some("yaml" | "json")
            )
        })
        .collect();
    entries.sort();
    for p in &entries {
        add(p, &mut sources, &mut files);
    }
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--node" => node = it.next().cloned(),
            "--family" => {
                family = Some(match it.next().unwrap().as_str() {
                    "ipv6" => IpFamily::IPv6,
                    _ => IpFamily::IPv4,
                })
            }
            "--service-cluster-ip-range" => {
                opts.service_cidrs = Some(
                    it.next()
                        .unwrap()
                        .split(',')
                        .map(|c| c.parse::<Cidr>().unwrap())
                        .collect(),
                )
            }
            "--no-allocate" => opts.allocate = false,
            f if f.starts_with("--") => panic!("{case}: flag {f} not handled here"),
            f => add(&root().join(f), &mut sources, &mut files),
        }
    }
    let comp = svc_compiler::compile(&sources, &files, &opts);
    assert!(!comp.diags.has_errors(), "{case}: {:?}", comp.diags);
    let fam = family.unwrap_or_else(|| comp.settings.service_cidrs[0].family());
    let sel = NodeSelection {
        name: node.expect("--node"),
        ips: vec![],
    };
    node_view(&comp.module, &sel, fam).unwrap()
}

/// Every golden case through the CLI in all three forms (the JSON is the golden
/// snapshot's text): each equals what this file's in-process [`case_view`] renders, so
/// the loader here loads exactly the CLI's maps; the batch file and the table hold the
/// layout's entries (no kernel needed).
#[test]
fn golden_cases_render() {
    for case in case_dirs() {
        let v = case_view(&case);
        let o = ebpf::Options::default();
        let l = ebpf::layout(&v, None, &o.sizes_for(&v)).unwrap();
        let json_text = compile_case(&case, "ebpf");
        assert_eq!(
            json_text,
            ebpf::write_json(&v, &o).unwrap(),
            "{case}: the CLI's JSON"
        );
        let json: serde_json::Value = serde_json::from_str(&json_text).unwrap();
        let n: usize = json["maps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["entries"].as_array().unwrap().len())
            .sum();
        assert_eq!(n, l.entries.len(), "{case}");
        let batch = compile_case_with(&case, "ebpf", &["--map-format", "batch"]);
        assert_eq!(batch, ebpf::write_batch(&v, &o).unwrap(), "{case}: batch");
        // A Maglev table is two updates: its inner array, then the outer map.
        let tables = l
            .entries
            .iter()
            .filter(|e| e.map() == ebpf::MapId::Maglev)
            .count();
        assert_eq!(
            batch
                .lines()
                .filter(|x| x.starts_with("map update"))
                .count(),
            l.entries.len() + tables,
            "{case}"
        );
        let table = compile_case_with(&case, "ebpf", &["--map-format", "table"]);
        assert_eq!(table, ebpf::write_table(&v, &o).unwrap(), "{case}: table");
        let services = l
            .entries
            .iter()
            .filter(|e| e.map() == ebpf::MapId::Services)
            .count();
        assert_eq!(table.lines().count(), services + 1, "{case}");
        if v.ports.iter().any(|p| p.cluster_ip.is_some()) {
            assert!(services > 0, "{case}: no service entries");
        }
    }
}

/// The dump of every map, as a set of (key, value) hex strings.
fn dump(pins: &Pins, name: &str) -> BTreeSet<(String, String)> {
    dump_pinned(&pins.0.join(name))
}

/// `bpftool -j map dump pinned PATH` as (key, value) hex pairs.
pub(super) fn dump_pinned(path: &Path) -> BTreeSet<(String, String)> {
    let name = path.display();
    let out = Command::new("bpftool")
        .args(["-j", "map", "dump", "pinned"])
        .arg(path)
        .output()
        .expect("bpftool");
    assert!(
        out.status.success(),
        "bpftool map dump {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let hex = |a: &serde_json::Value| {
        a.as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_str().unwrap().trim_start_matches("0x").to_string())
            .collect::<Vec<_>>()
            .join(" ")
    };
    v.as_array()
        .unwrap()
        .iter()
        .map(|e| (hex(&e["key"]), hex(&e["value"])))
        .collect()
}

/// The JSON rendering's entries of one map.
pub(super) fn json_entries(json: &serde_json::Value, name: &str) -> BTreeSet<(String, String)> {
    json["maps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == name)
        .unwrap()["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            // A hash of maps' entries carry their inner map's value.
            let value = e.get("value").unwrap_or(&e["innerValue"]);
            (
                e["key"].as_str().unwrap().to_string(),
                value.as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// A hash of maps as (key, its inner map's value at key 0) hex pairs: bpftool dumps the
/// outer map's values as inner map ids.
fn dump_outer(path: &Path) -> BTreeSet<(String, String)> {
    dump_pinned(path)
        .into_iter()
        .map(|(k, id)| {
            let id = ebpf::plan::parse_hex(&id).unwrap();
            let id = u32::from_le_bytes(id.try_into().unwrap());
            let out = Command::new("bpftool")
                .args(["-j", "map", "dump", "id", &id.to_string()])
                .output()
                .expect("bpftool");
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let inner: Vec<String> = v[0]["value"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_str().unwrap().trim_start_matches("0x").to_string())
                .collect();
            (k, inner.join(" "))
        })
        .collect()
}

/// For every golden case: `bpftool batch file` of the CLI's batch rendering creates and
/// fills the maps; `bpftool -j map dump` of each equals the CLI's JSON; the program loads
/// on top of those pinned maps and passes the verifier; and this test's loader, into a
/// second directory, writes the same bytes.
#[test]
fn batch_file_loads_and_dump_equals_json() {
    let test = "kernel ebpf batch file";
    let Some((obj, cgroot)) = prerequisites(test) else {
        return;
    };
    if Command::new("bpftool").arg("version").output().is_err() {
        return skip(test, "needs bpftool");
    }
    let tmp = crate::support::TempDir::new("ebpf-batch");
    for case in case_dirs() {
        let v = case_view(&case);
        let pins = Pins::new();
        let pin_dir = pins.0.display().to_string();
        let batch = compile_case_with(
            &case,
            "ebpf",
            &["--map-format", "batch", "--pin-dir", &pin_dir],
        );
        let file = tmp.path().join(format!("{case}.batch"));
        std::fs::write(&file, &batch).unwrap();
        let out = Command::new("bpftool")
            .args(["batch", "file"])
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{case}: bpftool batch: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let json: serde_json::Value = serde_json::from_str(&compile_case(&case, "ebpf")).unwrap();
        let l = ebpf::layout(&v, None, &ebpf::MapSizes::default()).unwrap();
        for m in &l.maps {
            let dumped = match m.inner_value_size {
                Some(_) => dump_outer(&pins.0.join(m.name)),
                None => dump(&pins, m.name),
            };
            assert_eq!(dumped, json_entries(&json, m.name), "{case}: {}", m.name);
        }
        // The program reuses the batch's maps, and the verifier accepts it.
        let cg = Cgroup::new(&cgroot);
        drop(attach(open(&obj, &l, &pins, 0), &cg));
        // Our loader into fresh pins writes the same bytes.
        let pins2 = Pins::new();
        let loaded = load(&obj, &l, &pins2, &cg, 0);
        for m in l.maps.iter().filter(|m| m.id.in_program()) {
            assert_eq!(
                dump(&pins2, m.name),
                json_entries(&json, m.name),
                "{case}: loader, {}",
                m.name
            );
        }
        drop(loaded);
    }
}

/// The lab's pods by address (what a flows file names them).
pub(super) fn probe_set(seen: &[Seen]) -> BTreeSet<String> {
    seen.iter()
        .filter_map(|s| match s {
            Seen::Answer { backend, .. } => Some(backend.clone()),
            _ => None,
        })
        .collect()
}

/// For every golden case (IPv4 and IPv6), each flow of its `flows` file that a socket load balancer
/// serves (in-cluster clients — the node and its pods — to a cluster IP): from a process
/// in the cgroup, 40 connections (TCP) or 40 sockets (UDP) reach exactly the flow's
/// backend set (one backend of it for `sticky`), the peer address is the service's;
/// refused or dropped flows get no backend (EHOSTUNREACH, no translation). The same
/// probe from outside the cgroup is not translated.
#[test]
fn golden_cluster_ips_through_the_socket_lb() {
    let test = "kernel ebpf golden cluster IPs";
    let Some((obj, cgroot)) = prerequisites(test) else {
        return;
    };
    let mut failures = Vec::new();
    let mut checked = 0;
    for (case, text) in case_flows() {
        let v = case_view(&case);
        let cluster_ips: BTreeSet<SocketAddr> = v
            .ports
            .iter()
            .filter_map(|p| p.cluster_ip.map(|ip| SocketAddr::new(ip, p.port)))
            .collect();
        let flows: Vec<_> = parse_flows(&text)
            .into_iter()
            .filter(|f| {
                let ebpf = |t: &String| t.split(',').any(|t| t == "ebpf");
                f.target.as_ref().is_none_or(ebpf) && cluster_ips.contains(&f.dst)
            })
            .filter(|f| f.from == "node" || f.from.starts_with("pod-"))
            .collect();
        if flows.is_empty() {
            continue;
        }
        let served = Served::new(&format!("eb{}", case.len()), &obj, &cgroot, &v);
        for f in &flows {
            checked += 1;
            let what = format!("{case} line {}: {} {:?} {}", f.line, f.from, f.proto, f.dst);
            let netns = served.lab.netns(&f.from).to_string();
            let n = match f.expect {
                Expect::Sticky(_) => 20,
                _ => 40,
            };
            let seen = served.probes(&f.from, f.proto, f.dst, n);
            let reached = probe_set(&seen);
            let wrong_peer = seen
                .iter()
                .find(|s| matches!(s, Seen::Answer { peer, .. } if *peer != f.dst));
            if let Some(s) = wrong_peer {
                failures.push(format!("{what}: peer {s:?}, wanted the service address"));
            }
            match &f.expect {
                Expect::Answer { backends, .. } => {
                    if &reached != backends
                        || seen.iter().any(|s| !matches!(s, Seen::Answer { .. }))
                    {
                        failures.push(format!(
                            "{what}: reached {reached:?} ({:?}), wanted all of {backends:?}",
                            seen.iter().find(|s| !matches!(s, Seen::Answer { .. }))
                        ));
                    }
                }
                Expect::Sticky(backends) => {
                    if reached.len() != 1 || !reached.is_subset(backends) {
                        failures.push(format!(
                            "{what}: reached {reached:?}, wanted one of {backends:?}"
                        ));
                    }
                }
                Expect::Refused | Expect::Timeout => {
                    if seen.iter().any(|s| *s != Seen::Errno(libc::EHOSTUNREACH)) {
                        failures.push(format!(
                            "{what}: {:?}, wanted EHOSTUNREACH (no backend)",
                            seen[0]
                        ));
                    }
                }
            }
            // Outside the cgroup nothing translates: the lab has no rules, so the cluster
            // IP leads nowhere.
            if f.proto == Proto::Tcp {
                let o = probe_in(&netns, Proto::Tcp, f.dst, Duration::from_millis(500));
                if o.backend().is_some() {
                    failures.push(format!("{what}: outside the cgroup answered: {o:?}"));
                }
            }
        }
    }
    println!("{checked} flows checked");
    assert!(checked > 10, "only {checked} flows checked");
    assert!(
        failures.is_empty(),
        "socket LB disagrees with the flows:\n{}",
        failures.join("\n")
    );
}

/// Affinity pins one client (a network namespace) to one backend across connections,
/// and the pin expires after the service's timeout; UDP replies come from the service
/// address and different sockets spread; a process outside the cgroup is not translated
/// even though the backends are reachable.
#[test]
fn affinity_udp_and_outside_the_cgroup() {
    let test = "kernel ebpf affinity and udp";
    let Some((obj, cgroot)) = prerequisites(test) else {
        return;
    };
    let mut v = case_view("affinity");
    let mut served = Served::new("ebaff", &obj, &cgroot, &v);
    let vip: SocketAddr = "10.96.0.19:80".parse().unwrap();
    for from in ["node", "pod-a", "pod-b"] {
        let seen = served.probes(from, Proto::Tcp, vip, 15);
        assert_eq!(probe_set(&seen).len(), 1, "{from} not pinned: {seen:?}");
    }
    // One affinity entry per client network namespace.
    let aff = dump(&served.pins, "cilium_lb4_affinity");
    assert_eq!(aff.len(), 3, "affinity entries: {aff:?}");

    // Outside the cgroup: untranslated (no answer), while a backend itself answers.
    let netns = served.lab.netns("pod-a");
    let outside = probes(None, netns, Proto::Tcp, vip, 1);
    assert!(
        !matches!(outside[0], Seen::Answer { .. }),
        "outside the cgroup: {outside:?}"
    );
    let direct = SocketAddr::new(IpAddr::V4("10.244.1.3".parse().unwrap()), BACKEND_PORT);
    assert!(
        matches!(
            probe_in(netns, Proto::Tcp, direct, PROBE_TIMEOUT),
            Outcome::Answered { .. }
        ),
        "the lab's backend itself does not answer"
    );

    // A 1 s timeout: one connection every 2.05 s is never pinned, so ten of them do not
    // all land on one of the four backends (chance of a false failure (1/4)^9 ≈ 4·10⁻⁶).
    for p in &mut v.ports {
        p.affinity_timeout = p.affinity_timeout.map(|_| 1);
    }
    served.reload(&obj, &v);
    let mut chosen = BTreeSet::new();
    for _ in 0..10 {
        chosen.extend(probe_set(&served.probes("pod-a", Proto::Tcp, vip, 1)));
        std::thread::sleep(Duration::from_millis(2050));
    }
    assert!(
        chosen.len() > 1,
        "the pin did not expire: always {chosen:?}"
    );

    // UDP: the udp case's service from a pod: replies come from the service address.
    let v = case_view("udp");
    served.reload(&obj, &v);
    let pv = v
        .ports
        .iter()
        .find(|p| p.protocol == svc_compiler::ir::Protocol::UDP)
        .expect("a UDP port");
    let dst = SocketAddr::new(pv.cluster_ip.unwrap(), pv.port);
    let seen = served.probes("pod-a", Proto::Udp, dst, 40);
    for s in &seen {
        match s {
            Seen::Answer { peer, .. } => assert_eq!(*peer, dst, "UDP reply source"),
            other => panic!("UDP to {dst}: {other:?}"),
        }
    }
    assert!(
        probe_set(&seen).len() > 1,
        "40 UDP sockets all went to {:?}",
        probe_set(&seen)
    );
}

/// Room for the 10,000-service node's 376,421 entries (Cilium's agent would need
/// `--bpf-lb-map-max=1048576` too).
const SCALE_SIZES: ebpf::MapSizes = ebpf::MapSizes(svc_compiler::ir::EbpfMapSizes {
    all: Some(1 << 20),
    services: None,
    backends: None,
    rev_nat: None,
    affinity: None,
    source_ranges: None,
    maglev: None,
    sock_rev: None,
});

/// Scale: the maps of a generated 10,000-service cluster (the shape of `svc-compile gen
/// --services 10000 --endpoints 10 --nodes 10`, or the manifests in the file named by
/// `SVC_EBPF_SCALE_FILE`) rendered and loaded, with timings printed. Not run by default:
/// `cargo test --release --test main ebpf_scale -- --ignored --nocapture`.
#[test]
#[ignore]
fn ebpf_scale() {
    let test = "kernel ebpf scale";
    let Some((obj, cgroot)) = prerequisites(test) else {
        return;
    };
    let text = match std::env::var("SVC_EBPF_SCALE_FILE") {
        Ok(p) => std::fs::read_to_string(p).expect("read SVC_EBPF_SCALE_FILE"),
        Err(_) => svc_compiler::synth::generate(
            &svc_compiler::synth::Shape {
                services: 10_000,
                endpoints: 10,
                nodes: 10,
                seed: 1,
            },
            svc_compiler::synth::Format::YamlStream,
        ),
    };
    let mut sources = SourceMap::default();
    let f = sources.add("cluster.yaml", text);
    let opts = svc_compiler::Options {
        allocate: true,
        ..Default::default()
    };
    let comp = svc_compiler::compile(&sources, &[f], &opts);
    assert!(!comp.diags.has_errors());
    let sel = NodeSelection {
        name: comp.module.nodes[0].name.clone(),
        ips: vec![],
    };
    let v = node_view(&comp.module, &sel, IpFamily::IPv4).unwrap();
    let t = Instant::now();
    let l = ebpf::layout(&v, None, &SCALE_SIZES).unwrap();
    println!(
        "{} ports, {} entries, {} frontends, {} backends: layout {:?}",
        v.ports.len(),
        l.entries.len(),
        l.ids.services.len(),
        l.ids.backends.len(),
        t.elapsed()
    );
    let pins = Pins::new();
    let o = ebpf::Options {
        pin_dir: pins.0.display().to_string(),
        sizes: SCALE_SIZES.0,
        ..Default::default()
    };
    for (name, format) in [
        ("json", ebpf::Format::Json),
        ("batch", ebpf::Format::Batch),
        ("table", ebpf::Format::Table),
    ] {
        let t = Instant::now();
        let s = ebpf::write_string(
            &v,
            None,
            &ebpf::Options {
                format,
                ..o.clone()
            },
        )
        .unwrap();
        println!("render {name}: {:?}, {} bytes", t.elapsed(), s.len());
    }
    let cg = Cgroup::new(&cgroot);
    let t = Instant::now();
    let ebpf_obj = open(&obj, &l, &pins, 0);
    let opened = t.elapsed();
    let t = Instant::now();
    fill(&l, &pins).expect("fill");
    let filled = t.elapsed();
    let t = Instant::now();
    let loaded = attach(ebpf_obj, &cg);
    println!(
        "loader: create and pin maps {opened:?}, write {} entries {filled:?}, load and attach {:?}",
        l.entries.len(),
        t.elapsed()
    );
    drop(loaded);
    let pins2 = Pins::new();
    let batch = ebpf::write_batch(
        &v,
        &ebpf::Options {
            pin_dir: pins2.0.display().to_string(),
            ..o.clone()
        },
    )
    .unwrap();
    let tmp = crate::support::TempDir::new("ebpf-scale");
    let file = tmp.path().join("maps.batch");
    std::fs::write(&file, batch).unwrap();
    let t = Instant::now();
    let out = Command::new("bpftool")
        .args(["batch", "file"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("bpftool batch file: {:?}", t.elapsed());
}

/// A node port on a loopback address from the node's own namespace finds the service
/// through its 0.0.0.0 surrogate entry (and getpeername shows the loopback address);
/// from a pod's namespace the same address is not translated.
#[test]
fn loopback_node_port_uses_the_surrogate() {
    let test = "kernel ebpf loopback node port";
    let Some((obj, cgroot)) = prerequisites(test) else {
        return;
    };
    let v = case_view("nodeport");
    let pv = v
        .ports
        .iter()
        .find(|p| p.node_port.is_some() && p.protocol == svc_compiler::ir::Protocol::TCP)
        .expect("a TCP node port");
    let want: BTreeSet<String> = pv
        .cluster_endpoints
        .iter()
        .map(
            |&i| match pv.endpoints[i as usize].ip.to_string().as_str() {
                "10.244.1.2" => "pod-a".to_string(),
                "10.244.1.3" => "pod-b".to_string(),
                "10.244.2.2" => "pod-r1".to_string(),
                "10.244.2.3" => "pod-r2".to_string(),
                other => panic!("endpoint {other} is no lab pod"),
            },
        )
        .collect();
    let served = Served::new("eblo", &obj, &cgroot, &v);
    let dst = SocketAddr::new("127.0.0.1".parse().unwrap(), pv.node_port.unwrap());
    let seen = served.probes("node", Proto::Tcp, dst, 40);
    assert_eq!(probe_set(&seen), want, "{seen:?}");
    for s in &seen {
        assert!(
            matches!(s, Seen::Answer { peer, .. } if *peer == dst),
            "{s:?}"
        );
    }
    let seen = served.probes("pod-a", Proto::Tcp, dst, 1);
    assert!(
        !matches!(seen[0], Seen::Answer { .. }),
        "from a pod: {seen:?}"
    );
}
