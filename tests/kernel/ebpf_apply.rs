//! `svc-compile apply --target ebpf` in the real kernel: the binary's embedded socket load
//! balancer, pinned under /sys/fs/bpf/svc-compile, serving a fresh cgroup v2 whose
//! processes live in the lab's node namespace.
//!
//! Root, a cgroup2 mount, bpftool and a binary built with clang are needed; otherwise the
//! test prints `skipped:` (a failure under `SVC_KERNEL=require`). Every name is unique
//! (pid and a counter: cgroup, pin instance, foreign pin, state directory), so tests run
//! in parallel; [`Cleanup`] removes the instance's pins (which detaches its links) and the
//! cgroup on drop, also when an assertion fails, and a later run sweeps what a killed one
//! left.
use svc_node::sys::libc;

use super::ebpf::{
    cgroup2_mount, dump_pinned, json_entries, probe_set, probes, remove_dead, Cgroup, Seen,
};
use super::flows::BACKEND_PORT;
use super::lab::{skip, EXEC_TIMEOUT};
use super::sys::enter_netns;
use super::{Lab, LabSpec, Proto};
use crate::support::{root, svc, Run, TempDir};
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const PIN_ROOT: &str = "/sys/fs/bpf/svc-compile";
/// The long-lived connection's service port (its server echoes lines).
const LONG_PORT: u16 = 7001;
const WEB_VIP: &str = "10.96.0.50:80";
const LONG_VIP: &str = "10.96.0.51:7001";

/// The node and two services: `web` (port 80 TCP and UDP → [`BACKEND_PORT`]) with `web_eps`, `long`
/// (port 7001) with `long_eps`.
fn manifests(web_eps: &[&str], long_eps: &[&str]) -> String {
    let eps = |ips: &[&str]| {
        ips.iter()
            .map(|ip| {
                format!(
                    "- addresses: [\"{ip}\"]\n  nodeName: node\n  conditions: {{ready: true}}\n"
                )
            })
            .collect::<String>()
    };
    format!(
        "apiVersion: v1\nkind: Node\nmetadata: {{name: node}}\nspec: {{podCIDRs: [10.244.1.0/24]}}\nstatus: {{addresses: [{{type: InternalIP, address: 192.0.2.10}}]}}\n---\n\
apiVersion: v1\nkind: Service\nmetadata: {{name: web}}\nspec:\n  clusterIP: 10.96.0.50\n  ports: [{{name: tcp, port: 80, targetPort: {BACKEND_PORT}}}, {{name: udp, port: 80, protocol: UDP, targetPort: {BACKEND_PORT}}}]\n---\n\
apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: web-1, labels: {{kubernetes.io/service-name: web}}}}\naddressType: IPv4\nports: [{{name: tcp, port: {BACKEND_PORT}, protocol: TCP}}, {{name: udp, port: {BACKEND_PORT}, protocol: UDP}}]\nendpoints:\n{}---\n\
apiVersion: v1\nkind: Service\nmetadata: {{name: long}}\nspec:\n  clusterIP: 10.96.0.51\n  ports: [{{port: {LONG_PORT}}}]\n---\n\
apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: long-1, labels: {{kubernetes.io/service-name: long}}}}\naddressType: IPv4\nports: [{{port: {LONG_PORT}, protocol: TCP}}]\nendpoints:\n{}",
        eps(web_eps),
        eps(long_eps)
    )
}

/// Removes the instance's pins (links go with them: nothing else holds them) and then
/// the cgroup, and the foreign pin; on drop, in that order.
struct Cleanup {
    inst: PathBuf,
    foreign: PathBuf,
    cg: Option<Cgroup>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.inst);
        self.cg = None;
        let _ = std::fs::remove_file(&self.foreign);
    }
}

/// Root, a cgroup2 mount (returned) and bpftool, or a skip; the first call also removes
/// the pin instances and foreign pins of earlier runs whose process is gone (Drop cannot
/// run after SIGKILL; their cgroups go with `ebpf.rs`'s sweep).
fn prerequisites(test: &str) -> Option<PathBuf> {
    super::lab::check_svc_kernel();
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        skip(test, "needs root (cgroups, BPF, network namespaces)");
        return None;
    }
    let Some(cgroot) = cgroup2_mount() else {
        skip(test, "no cgroup2 mount in /proc/mounts");
        return None;
    };
    if Command::new("bpftool").arg("version").output().is_err() {
        skip(test, "needs bpftool");
        return None;
    }
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| {
        remove_dead(Path::new(PIN_ROOT), "cg-svc-compile-test-", |p| {
            std::fs::remove_dir_all(p)
        });
        remove_dead(Path::new("/sys/fs/bpf"), "svc-compile-foreign-", |p| {
            std::fs::remove_file(p)
        });
    });
    Some(cgroot)
}

fn apply(dir: &Path, state: &Path, cg: &Path, netns: &str, extra: &[&str]) -> Run {
    let mut args = vec![
        "apply",
        dir.to_str().unwrap(),
        "--target",
        "ebpf",
        "--node",
        "node",
        "--cgroup",
        cg.to_str().unwrap(),
        "--netns",
        netns,
        "--state-dir",
        state.to_str().unwrap(),
    ];
    args.extend(extra);
    svc(&args, None, &root())
}

/// The one generation directory of an instance.
fn generation(inst: &Path) -> PathBuf {
    let gens: Vec<PathBuf> = std::fs::read_dir(inst)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("gen-"))
        .map(|e| e.path())
        .collect();
    assert_eq!(gens.len(), 1, "generations: {gens:?}");
    gens[0].clone()
}

fn map_id(path: &Path) -> u64 {
    let out = Command::new("bpftool")
        .args(["-j", "map", "show", "pinned"])
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success(), "bpftool map show {}", path.display());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["id"].as_u64().unwrap()
}

/// `bpftool -j map dump` of every map the applied JSON (the state directory's) configures
/// equals its entries, and that JSON is the compile of `dir` with the apply's ids: the
/// same frontends and backends (the ids themselves differ from a fresh compile's once an
/// apply has held back ids it freed); the runtime maps are the shared ones.
fn check_read_back(dir: &Path, inst: &Path, state: &Path) {
    let r = svc(
        &[dir.to_str().unwrap(), "--target", "ebpf", "--node", "node"],
        None,
        &root(),
    );
    r.expect(0);
    let fresh: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let applied = std::fs::read_to_string(state.join("ebpf-ipv4/applied.ebpf")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&applied).unwrap();
    for kind in ["services", "backends"] {
        let keys = |v: &serde_json::Value| -> BTreeSet<String> {
            v["ids"][kind]
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect()
        };
        assert_eq!(
            keys(&json),
            keys(&fresh),
            "the applied {kind} are not the compiled ones"
        );
    }
    let gen = generation(inst);
    let mut compared = 0;
    for m in json["maps"].as_array().unwrap() {
        let name = m["name"].as_str().unwrap();
        if name.ends_with("_affinity") || name.ends_with("_reverse_sk") {
            assert_eq!(
                map_id(&gen.join(name)),
                map_id(&inst.join("shared").join(name)),
                "{name} is not the shared map"
            );
            continue;
        }
        assert_eq!(
            dump_pinned(&gen.join(name)),
            json_entries(&json, name),
            "{name}: the pinned map differs from the compiled JSON"
        );
        compared += 1;
    }
    assert_eq!(compared, 5, "configuration maps compared");
}

/// A process in the cgroup and the node's namespace holding one TCP connection to `dst`:
/// it reports its peer address and the first echo, then, each time it is told to, sends
/// a line and reports the echo and the peer address again.
struct LongClient {
    pid: libc::pid_t,
    ctl: std::fs::File,
    out: BufReader<std::fs::File>,
}

impl LongClient {
    fn start(cg: &Cgroup, netns: &str, dst: SocketAddr) -> LongClient {
        let procs =
            std::ffi::CString::new(cg.0.join("cgroup.procs").as_os_str().as_encoded_bytes())
                .unwrap();
        let pipe = || {
            let mut fds = [0i32; 2];
            // SAFETY: pipe2 fills two descriptors we then own.
            assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
        };
        let (ctl_rd, ctl_wr) = pipe();
        let (out_rd, out_wr) = pipe();
        // SAFETY: the child makes syscalls and small allocations (glibc's malloc is
        // fork-safe) and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let mut out = std::fs::File::from(out_wr);
            let mut ctl = std::fs::File::from(ctl_rd);
            let r = (|| -> std::io::Result<()> {
                // SAFETY: a NUL-terminated path; writing "0" moves this process.
                let fd = unsafe { libc::open(procs.as_ptr(), libc::O_WRONLY) };
                if fd < 0 || unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) } != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                unsafe { libc::close(fd) };
                enter_netns(netns)?;
                // Hang guards (a broken connection says so by a reset or a read that
                // never answers), not time limits.
                let s = TcpStream::connect_timeout(&dst, EXEC_TIMEOUT)?;
                s.set_read_timeout(Some(EXEC_TIMEOUT))?;
                let mut lines = BufReader::new(s.try_clone()?);
                let mut byte = [0u8; 1];
                loop {
                    (&s).write_all(b"ping\n")?;
                    let mut echo = String::new();
                    lines.read_line(&mut echo)?;
                    writeln!(out, "{} {}", s.peer_addr()?, echo.trim())?;
                    if ctl.read(&mut byte)? == 0 {
                        return Ok(());
                    }
                }
            })();
            if let Err(e) = r {
                let _ = writeln!(out, "error {e}");
            }
            // SAFETY: leave without running the test harness's destructors.
            unsafe { libc::_exit(0) };
        }
        drop((ctl_rd, out_wr));
        LongClient {
            pid,
            ctl: std::fs::File::from(ctl_wr),
            out: BufReader::new(std::fs::File::from(out_rd)),
        }
    }

    /// The next report (peer, echo), bounded.
    fn report(&mut self) -> String {
        let fd = self.out.get_ref().as_raw_fd();
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, 20_000) };
        assert_eq!(r, 1, "the long-lived client did not report");
        let mut l = String::new();
        self.out.read_line(&mut l).unwrap();
        l.trim().to_string()
    }

    fn again(&mut self) -> String {
        self.ctl.write_all(b"x").unwrap();
        self.report()
    }
}

impl Drop for LongClient {
    fn drop(&mut self) {
        // SAFETY: our own child.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
    }
}

/// An echo server for one connection in `netns` on [`LONG_PORT`]: each line comes back as
/// `<name> <line>`. Runs until the connection ends or 120 s pass.
fn echo_server(netns: String, name: &'static str) -> std::thread::JoinHandle<()> {
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        enter_netns(&netns).unwrap();
        let l = TcpListener::bind(("0.0.0.0", LONG_PORT)).unwrap();
        l.set_nonblocking(true).unwrap();
        tx.send(()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(120);
        let s = loop {
            match l.accept() {
                Ok((s, _)) => break s,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(_) => return,
            }
        };
        s.set_nonblocking(false).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        loop {
            let mut line = String::new();
            match r.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    if (&s)
                        .write_all(format!("{name} {}\n", line.trim()).as_bytes())
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
    });
    rx.recv_timeout(EXEC_TIMEOUT)
        .expect("the echo server listens");
    h
}

fn tcp_backends(cg: &Cgroup, netns: &str, dst: SocketAddr, n: usize) -> BTreeSet<String> {
    let seen = probes(Some(cg), netns, Proto::Tcp, dst, n);
    for s in &seen {
        match s {
            Seen::Answer { peer, .. } => assert_eq!(*peer, dst, "getpeername: {seen:?}"),
            other => panic!("TCP to {dst}: {other:?}"),
        }
    }
    probe_set(&seen)
}

/// The whole life of one instance: a dry run changes nothing; the first apply serves web
/// from a process in the cgroup (TCP spread over both pods, UDP, getpeername the service)
/// and not outside it, and every pinned map equals the compiled JSON; with new endpoints
/// an incremental apply sends new connections only to the new set, and a `--full` apply
/// (a new generation, links switched) too, while an established connection keeps its
/// backend and its getpeername through both; a dry run afterwards prints the writes
/// without making them; a rollback puts back the previous endpoints; a foreign pin
/// outside /sys/fs/bpf/svc-compile survives; pins outside it are refused; cleanup leaves
/// no pin and no cgroup.
#[test]
fn apply_serves_switches_and_cleans_up() {
    let test = "kernel ebpf apply";
    let Some(cgroot) = prerequisites(test) else {
        return;
    };
    let t = TempDir::new("ebpf-apply");
    let state = t.path().join("state");
    let (first, second) = (t.path().join("first"), t.path().join("second"));
    for (d, web, long) in [
        (&first, ["10.244.1.2", "10.244.1.3"], "10.244.1.2"),
        (&second, ["10.244.2.2", "10.244.2.3"], "10.244.1.3"),
    ] {
        std::fs::create_dir_all(d).unwrap();
        std::fs::write(d.join("cluster.yaml"), manifests(&web, &[long])).unwrap();
    }

    let mut lab = Lab::new("ebap", &LabSpec::default()).expect("lab");
    lab.serve(Proto::Tcp, BACKEND_PORT).expect("serve tcp");
    lab.serve(Proto::Udp, BACKEND_PORT).expect("serve udp");
    let cg = Cgroup::new(&cgroot);
    let cg_path = cg.0.clone();
    let inst = Path::new(PIN_ROOT).join(format!(
        "cg-{}",
        cg_path.file_name().unwrap().to_string_lossy()
    ));
    let foreign = Path::new("/sys/fs/bpf").join(format!(
        "svc-compile-foreign-{}-{}",
        std::process::id(),
        cg_path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .rsplit('-')
            .next()
            .unwrap()
    ));
    let cleanup = Cleanup {
        inst: inst.clone(),
        foreign: foreign.clone(),
        cg: Some(cg),
    };
    let cg = cleanup.cg.as_ref().unwrap();
    let made = Command::new("bpftool")
        .args(["map", "create"])
        .arg(&foreign)
        .args([
            "type", "hash", "key", "4", "value", "4", "entries", "4", "name", "foreign",
        ])
        .status()
        .unwrap();
    assert!(made.success(), "bpftool map create (foreign)");
    let node = lab.netns("node").to_string();
    let web: SocketAddr = WEB_VIP.parse().unwrap();
    let long: SocketAddr = LONG_VIP.parse().unwrap();

    // Pins outside /sys/fs/bpf/svc-compile are refused before anything happens.
    let r = apply(
        &first,
        &state,
        &cg_path,
        &node,
        &["--pin-dir", "/sys/fs/bpf/tc/globals"],
    );
    r.expect(2);
    assert!(
        r.stderr.contains("only under /sys/fs/bpf/svc-compile"),
        "{}",
        r.stderr
    );

    // A dry run on a fresh node: the full plan, and nothing made.
    let r = apply(&first, &state, &cg_path, &node, &["--dry-run"]);
    if r.code == 2 && r.stderr.contains("built without the socket load balancer") {
        return skip(test, "svc-compile was built without clang");
    }
    r.expect(0);
    assert!(r.stdout.contains("full (first apply)"), "{}", r.stdout);
    assert!(r.stdout.contains("map update pinned"), "{}", r.stdout);
    assert!(
        !inst.exists() && !state.exists(),
        "the dry run made something"
    );

    // First apply.
    let r = apply(&first, &state, &cg_path, &node, &[]);
    r.expect(0);
    assert!(r.stdout.contains("full (first apply)"), "{}", r.stdout);
    check_read_back(&first, &inst, &state);
    assert_eq!(
        tcp_backends(cg, &node, web, 30),
        BTreeSet::from(["pod-a".to_string(), "pod-b".to_string()])
    );
    let udp = probes(Some(cg), &node, Proto::Udp, web, 10);
    assert!(
        udp.iter()
            .all(|s| matches!(s, Seen::Answer { peer, .. } if *peer == web)),
        "UDP: {udp:?}"
    );
    let outside = probes(None, &node, Proto::Tcp, web, 1);
    assert!(
        !matches!(outside[0], Seen::Answer { .. }),
        "outside: {outside:?}"
    );
    // The same again: nothing written.
    let r = apply(&first, &state, &cg_path, &node, &[]);
    r.expect(0);
    assert!(
        r.stdout
            .contains("unchanged: incremental: 0 entries written, 0 deleted"),
        "{}",
        r.stdout
    );

    // An established connection to long (pod-a), across the next applies.
    let server = echo_server(lab.netns("pod-a").to_string(), "pod-a");
    let mut client = LongClient::start(cg, &node, long);
    assert_eq!(client.report(), format!("{long} pod-a ping"));

    // New endpoints, incremental: new connections only to the new set.
    let r = apply(&second, &state, &cg_path, &node, &[]);
    r.expect(0);
    assert!(r.stdout.contains(": incremental: "), "{}", r.stdout);
    let gen = generation(&inst);
    check_read_back(&second, &inst, &state);
    assert_eq!(
        tcp_backends(cg, &node, web, 30),
        BTreeSet::from(["pod-r1".to_string(), "pod-r2".to_string()])
    );
    assert_eq!(client.again(), format!("{long} pod-a ping"));

    // A new generation: the links switch, the old generation goes, the shared maps stay.
    let r = apply(&second, &state, &cg_path, &node, &["--full"]);
    r.expect(0);
    assert!(r.stdout.contains("full (--full)"), "{}", r.stdout);
    let new_gen = generation(&inst);
    assert_ne!(new_gen, gen, "no new generation");
    check_read_back(&second, &inst, &state);
    assert_eq!(
        tcp_backends(cg, &node, web, 30),
        BTreeSet::from(["pod-r1".to_string(), "pod-r2".to_string()])
    );
    // The same endpoints in both generations: traffic alone cannot tell which maps the
    // attached programs read. Written behind apply's back, the new generation's web
    // slots decide it: both pointing at one backend, only that one answers.
    serves_from(cg, &node, &new_gen, &state, web);
    assert_eq!(client.again(), format!("{long} pod-a ping"));
    drop(client);
    let _ = server.join();

    // A dry run towards the first state prints its writes and makes none.
    let gen = generation(&inst);
    let before: Vec<_> = ["cilium_lb4_services_v2", "cilium_lb4_backends_v3"]
        .iter()
        .map(|m| dump_pinned(&gen.join(m)))
        .collect();
    let r = apply(&first, &state, &cg_path, &node, &["--dry-run"]);
    r.expect(0);
    assert!(r.stdout.contains(": incremental: "), "{}", r.stdout);
    assert!(r.stdout.contains("map update pinned"), "{}", r.stdout);
    let after: Vec<_> = ["cilium_lb4_services_v2", "cilium_lb4_backends_v3"]
        .iter()
        .map(|m| dump_pinned(&gen.join(m)))
        .collect();
    assert_eq!(before, after, "the dry run wrote");

    // Rollback: the first endpoints again.
    let svc_args = [
        "apply",
        "--rollback",
        "--target",
        "ebpf",
        "--cgroup",
        cg_path.to_str().unwrap(),
        "--netns",
        node.as_str(),
        "--state-dir",
        state.to_str().unwrap(),
    ];
    svc(&svc_args, None, &root()).expect(0);
    check_read_back(&first, &inst, &state);
    assert_eq!(
        tcp_backends(cg, &node, web, 30),
        BTreeSet::from(["pod-a".to_string(), "pod-b".to_string()])
    );

    // `svc-compile cleanup`: our pins, links and records go, the service is no longer
    // translated in the cgroup, the foreign pin stays; a second cleanup finds nothing.
    let cleanup_args = [
        "cleanup",
        "--target",
        "ebpf",
        "--cgroup",
        cg_path.to_str().unwrap(),
        "--netns",
        node.as_str(),
        "--state-dir",
        state.to_str().unwrap(),
    ];
    let r = svc(&cleanup_args, None, &root());
    r.expect(0);
    assert!(r.stdout.contains("removed"), "{}", r.stdout);
    assert!(!inst.exists(), "cleanup left {}", inst.display());
    assert!(
        !state.join("ebpf-ipv4").exists(),
        "cleanup left the records"
    );
    let after = probes(Some(cg), &node, Proto::Tcp, web, 1);
    assert!(
        !matches!(after[0], Seen::Answer { .. }),
        "still served after cleanup: {after:?}"
    );
    let attached = Command::new("bpftool")
        .args(["-j", "cgroup", "show"])
        .arg(&cg_path)
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&attached.stdout).contains("sock4_connect"),
        "{}",
        String::from_utf8_lossy(&attached.stdout)
    );
    let r = svc(&cleanup_args, None, &root());
    r.expect(0);
    assert!(r.stdout.contains("nothing of ours there"), "{}", r.stdout);

    assert!(foreign.exists(), "the foreign pin is gone");
    drop(cleanup);
    assert!(!inst.exists(), "pins left");
    assert!(!cg_path.exists(), "cgroup left");
    drop(lab);
}

/// Shows with traffic that the programs attached to `cg` read the services map of
/// generation `gen`: `frontend`'s second slot is set (with bpftool) to its first slot's
/// value there, new connections must all reach the first slot's backend, and after the
/// slot is put back both backends answer again. Slots and values come from the applied
/// document in `state`.
fn serves_from(cg: &Cgroup, netns: &str, gen: &Path, state: &Path, frontend: SocketAddr) {
    let applied = std::fs::read_to_string(state.join("ebpf-ipv4/applied.ebpf")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&applied).unwrap();
    let services = json["maps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "cilium_lb4_services_v2")
        .expect("a services map");
    let slot = |n: u64| -> (String, String, String) {
        let e = services["entries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| {
                e["decoded"]["frontend"] == format!("{frontend}/TCP") && e["decoded"]["slot"] == n
            })
            .unwrap_or_else(|| panic!("no slot {n} of {frontend}/TCP in {applied}"));
        let text = |f: &str| e[f].as_str().unwrap().to_string();
        let backend = e["decoded"]["backend"].as_str().unwrap();
        let ip = backend.split(':').next().unwrap();
        let spec = LabSpec::default();
        let pod = spec
            .local_pods
            .iter()
            .chain(&spec.remote_pods)
            .find(|h| h.ip.to_string() == ip)
            .unwrap_or_else(|| panic!("backend {backend} is no lab pod"))
            .name
            .clone();
        (text("key"), text("value"), pod)
    };
    let (_, first_value, first_pod) = slot(1);
    let (second_key, second_value, second_pod) = slot(2);
    assert_ne!(first_pod, second_pod);
    let map = gen.join("cilium_lb4_services_v2");
    let update = |value: &str| {
        let mut c = Command::new("bpftool");
        c.args(["map", "update", "pinned"])
            .arg(&map)
            .arg("key")
            .arg("hex");
        c.args(second_key.split(' '))
            .arg("value")
            .arg("hex")
            .args(value.split(' '));
        let out = c.output().expect("bpftool");
        assert!(
            out.status.success(),
            "bpftool map update {}: {}",
            map.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    update(&first_value);
    let only = tcp_backends(cg, netns, frontend, 30);
    update(&second_value);
    assert_eq!(
        only,
        BTreeSet::from([first_pod.clone()]),
        "the attached programs do not read {}",
        map.display()
    );
    assert_eq!(
        tcp_backends(cg, netns, frontend, 30),
        BTreeSet::from([first_pod, second_pod])
    );
}

/// The generation the cgroup links run: every link's program must be that generation's
/// (`None`: no link yet).
fn serving_generation(inst: &Path) -> Option<PathBuf> {
    let json = |args: &[&str], path: &Path| -> serde_json::Value {
        let out = Command::new("bpftool")
            .args(args)
            .arg(path)
            .output()
            .unwrap();
        assert!(out.status.success(), "bpftool {args:?} {}", path.display());
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let programs = [
        "sock4_connect",
        "sock6_connect",
        "sock4_sendmsg",
        "sock6_sendmsg",
        "sock4_recvmsg",
        "sock6_recvmsg",
        "sock4_getpeername",
        "sock6_getpeername",
    ];
    let links: Vec<Option<u64>> = programs
        .iter()
        .map(|p| {
            let pin = inst.join(format!("link_{p}"));
            pin.exists().then(|| {
                json(&["-j", "link", "show", "pinned"], &pin)["prog_id"]
                    .as_u64()
                    .unwrap()
            })
        })
        .collect();
    if links.iter().all(Option::is_none) {
        return None;
    }
    let gens: Vec<PathBuf> = std::fs::read_dir(inst)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("gen-"))
        .map(|e| e.path())
        .collect();
    for g in gens {
        let ids: Vec<Option<u64>> = programs
            .iter()
            .map(|p| {
                let pin = g.join(format!("prog_{p}"));
                pin.exists().then(|| {
                    json(&["-j", "prog", "show", "pinned"], &pin)["id"]
                        .as_u64()
                        .unwrap()
                })
            })
            .collect();
        if ids == links {
            return Some(g);
        }
    }
    panic!("the links {links:?} run no whole generation");
}

/// Waits (bounded) until nothing holds the state directory's lock: a killed apply's
/// writer child finishes first.
fn wait_for_lock(state: &Path) {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(state.join("lock"))
        .unwrap();
    // A hang guard: the loader holding it may be finishing a load on a loaded machine.
    let deadline = Instant::now() + EXEC_TIMEOUT;
    // SAFETY: flock on a descriptor we own.
    while unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        assert!(Instant::now() < deadline, "the lock was not released");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// SIGKILL at any moment of an apply (incremental or a new generation, the compiled JSON
/// of two different generated clusters in turn) leaves the old or the new state: once the
/// lock is free (a writer child the kill left finishes first), the links run one whole
/// generation whose configuration maps hold exactly one of the two documents; the next
/// apply completes and leaves one generation.
#[test]
fn sigkill_leaves_old_or_new() {
    let Some(cgroot) = prerequisites("kernel ebpf apply sigkill") else {
        return;
    };
    let t = TempDir::new("ebpf-kill");
    let state = t.path().join("state");
    let docs: Vec<(PathBuf, serde_json::Value)> = [1, 2]
        .iter()
        .map(|seed| {
            let seed = seed.to_string();
            let m = t.path().join(format!("m{seed}.yaml"));
            let gen = svc(
                &[
                    "gen",
                    "--services",
                    "400",
                    "--endpoints",
                    "5",
                    "--nodes",
                    "2",
                    "--seed",
                    &seed,
                    "-o",
                    m.to_str().unwrap(),
                ],
                None,
                &root(),
            );
            gen.expect(0);
            let r = svc(
                &[
                    m.to_str().unwrap(),
                    "--target",
                    "ebpf",
                    "--node",
                    "node-000",
                ],
                None,
                &root(),
            );
            r.expect(0);
            let p = t.path().join(format!("m{seed}.json"));
            std::fs::write(&p, &r.stdout).unwrap();
            (p, serde_json::from_str(&r.stdout).unwrap())
        })
        .collect();
    let cg = Cgroup::new(&cgroot);
    let cg_path = cg.0.clone();
    let inst = Path::new(PIN_ROOT).join(format!(
        "cg-{}",
        cg_path.file_name().unwrap().to_string_lossy()
    ));
    let _cleanup = Cleanup {
        inst: inst.clone(),
        foreign: PathBuf::new(),
        cg: Some(cg),
    };
    let args = |doc: &Path, full: bool| -> Vec<String> {
        let mut a: Vec<String> = [
            "apply",
            "--from",
            doc.to_str().unwrap(),
            "--target",
            "ebpf",
            "--cgroup",
            cg_path.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if full {
            a.push("--full".into());
        }
        a
    };
    let exe = env!("CARGO_BIN_EXE_svc-compile");
    // How long one apply takes here, to spread the kills over it.
    let t0 = Instant::now();
    let ok = Command::new(exe)
        .args(args(&docs[0].0, true))
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let span = t0.elapsed().as_micros() as u64 * 3 / 2;
    let mut rng = crate::support::Rng::new(7);
    let (mut old, mut killed) = (0usize, 0);
    for round in 0..24 {
        let new = 1 - old;
        let full = round % 3 == 0;
        let mut child = Command::new(exe)
            .args(args(&docs[new].0, full))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_micros(rng.below(span.max(1))));
        if child.try_wait().unwrap().is_none() {
            killed += 1;
        }
        let _ = child.kill();
        let _ = child.wait();
        wait_for_lock(&state);
        let gen = serving_generation(&inst).expect("the first apply's links are gone");
        let holds = |d: &serde_json::Value| {
            d["maps"].as_array().unwrap().iter().all(|m| {
                let name = m["name"].as_str().unwrap();
                name.ends_with("_affinity")
                    || name.ends_with("_reverse_sk")
                    || dump_pinned(&gen.join(name)) == json_entries(d, name)
            })
        };
        if holds(&docs[new].1) {
            old = new;
        } else {
            assert!(holds(&docs[old].1), "round {round}: neither old nor new");
        }
    }
    assert!(
        killed > 5,
        "only {killed} applies were killed while running"
    );
    // The next apply completes and leaves one generation.
    let ok = Command::new(exe)
        .args(args(&docs[0].0, false))
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    generation(&inst);
}

/// Cgroups made inside a fresh test cgroup, and the pin instance `cg-<parent>_<slug>`; on
/// drop the pins go first (their links detach), then the cgroups, innermost first.
struct Nested {
    inst: PathBuf,
    children: Vec<PathBuf>,
    _parent: Cgroup,
}

impl Nested {
    fn new(cgroot: &Path, children: &[&str], slug: &str) -> Nested {
        let parent = Cgroup::new(cgroot);
        let inst = Path::new(PIN_ROOT).join(format!(
            "cg-{}_{slug}",
            parent.0.file_name().unwrap().to_string_lossy()
        ));
        let nested = Nested {
            inst,
            children: children.iter().map(|c| parent.0.join(c)).collect(),
            _parent: parent,
        };
        for c in &nested.children {
            std::fs::create_dir(c).expect("create cgroup");
        }
        nested
    }
}

impl Drop for Nested {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.inst);
        for c in &self.children {
            let _ = std::fs::remove_dir(c);
        }
    }
}

/// A manifests directory in `t` with the node and one endpoint per service.
fn one_service(t: &TempDir) -> PathBuf {
    let dir = t.path().join("in");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("cluster.yaml"),
        manifests(&["10.244.1.2"], &["10.244.1.2"]),
    )
    .unwrap();
    dir
}

/// Two cgroups whose pin-instance names collide (`X/a.b` and `X/a_b` are both
/// `cg-X_a_b`): the second apply is refused (exit 2) instead of switching the first
/// cgroup's links to its maps, and the first cgroup's apply goes on unchanged.
#[test]
fn a_pin_instance_of_another_cgroup_is_refused() {
    let test = "kernel ebpf apply: colliding instance names";
    let Some(cgroot) = prerequisites(test) else {
        return;
    };
    let t = TempDir::new("ebpf-collide");
    let dir = one_service(&t);
    let lab = Lab::new("ebcl", &LabSpec::default()).expect("lab");
    let nested = Nested::new(&cgroot, &["a.b", "a_b"], "a_b");
    let (dotted, underscored) = (nested.children[0].clone(), nested.children[1].clone());
    let inst = nested.inst.clone();
    let node = lab.netns("node").to_string();
    let (s1, s2) = (t.path().join("state-1"), t.path().join("state-2"));

    let r = apply(&dir, &s1, &dotted, &node, &[]);
    if r.code == 2 && r.stderr.contains("built without the socket load balancer") {
        return skip(test, "svc-compile was built without clang");
    }
    r.expect(0);
    assert!(inst.join("link_sock4_connect").exists(), "{}", r.stdout);
    let r = apply(&dir, &s2, &underscored, &node, &[]);
    r.expect(2);
    assert!(
        r.stderr.contains("holds the links of another cgroup"),
        "{}",
        r.stderr
    );
    // The first cgroup's instance is as it was.
    let r = apply(&dir, &s1, &dotted, &node, &[]);
    r.expect(0);
    assert!(
        r.stdout
            .contains("unchanged: incremental: 0 entries written, 0 deleted"),
        "{}",
        r.stdout
    );
}

/// The cgroup id a pinned cgroup link reports (`bpftool link show pinned`; 0 once the
/// kernel detached it).
fn link_cgroup_id(pin: &Path) -> Option<u64> {
    let out = Command::new("bpftool")
        .args(["-j", "link", "show", "pinned"])
        .arg(pin)
        .output()
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    v.get("cgroup_id")?.as_u64()
}

/// A cgroup removed and made again at the same path: the kernel detached the old links
/// (they still name their programs), so the next apply makes new links for the new
/// cgroup instead of writing maps nobody runs, or updating a dead link.
#[test]
fn links_of_a_removed_cgroup_are_made_anew() {
    let test = "kernel ebpf apply: a removed cgroup";
    let Some(cgroot) = prerequisites(test) else {
        return;
    };
    let t = TempDir::new("ebpf-regone");
    let dir = one_service(&t);
    let lab = Lab::new("ebrg", &LabSpec::default()).expect("lab");
    let nested = Nested::new(&cgroot, &["pods"], "pods");
    let (child, inst) = (nested.children[0].clone(), nested.inst.clone());
    let node = lab.netns("node").to_string();
    let state = t.path().join("state");
    let r = apply(&dir, &state, &child, &node, &[]);
    if r.code == 2 && r.stderr.contains("built without the socket load balancer") {
        return skip(test, "svc-compile was built without clang");
    }
    r.expect(0);
    let pin = inst.join("link_sock4_connect");
    assert!(link_cgroup_id(&pin).is_some_and(|id| id != 0));

    // Removed (no process in it), the links detach as the cgroup is released.
    std::fs::remove_dir(&child).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while link_cgroup_id(&pin) != Some(0) {
        assert!(
            Instant::now() < deadline,
            "the link was not detached in 20 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::create_dir(&child).unwrap();
    let r = apply(&dir, &state, &child, &node, &[]);
    r.expect(0);
    assert!(r.stdout.contains("detached"), "{}", r.stdout);
    assert!(link_cgroup_id(&pin).is_some_and(|id| id != 0));
    let shown = Command::new("bpftool")
        .args(["-j", "cgroup", "show"])
        .arg(&child)
        .output()
        .unwrap();
    let attached: Vec<serde_json::Value> = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(attached.len(), 8, "{attached:?}");
}
