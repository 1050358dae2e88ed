//! The IPVS target in a real kernel. This machine's kernel may lack IPVS, so the suite
//! boots Debian's kernel under qemu once (`tests/ipvs/vm.sh`: host root shared read-only,
//! a RAM overlay on top) and runs this very test binary inside it, as root, with the
//! ignored test [`guest_suite`]. Everything the guest needs is written before the boot
//! (9p caches what it saw, so later host writes may not show): the four parts of every
//! golden case with a `flows` file, compiled here, and the flows themselves.
//!
//! Inside, each case gets a fresh [`Lab`] (the same node, pods and clients as the other
//! kernel tests); the node loads the parts in [`Part::ALL`] order (`ipset restore`,
//! `ipvsadm-restore`, then the sysctls the `addresses` part lists, `ip -batch`,
//! `iptables-restore --noflush`) and the flows run with target name `ipvs` (flow lines
//! marked `[iptables]` or `[nftables]` alone are skipped). The guest writes one result
//! line per case to a shared directory; the host test reports every failing case.
//!
//! Skips with a message when qemu or a kernel image is missing, unless
//! `SVC_KERNEL=require` (CI), which turns the skip into a failure.

use super::flows::{check_flows, parse_flows, BACKEND_PORT};
use super::sys::run_bounded;
use super::{Lab, LabSpec, Proto};
use crate::golden::{case_flows, compile_case_with};
use crate::support::root;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use svc_targets::ipvs::Part;

/// Where the guest finds its cases (set by the host for the guest).
pub(super) const GUEST_DIR_ENV: &str = "SVC_IPVS_GUEST_DIR";
/// The whole suite in the VM, boot included (TCG is slow; measured: see docs/performance.md and docs/testing.md).
const SUITE_TIMEOUT_SECS: u64 = 1500;

/// `ipvsadm-save -n` in `netns` of `lab` until two listings in a row agree (at most 20):
/// the kernel's table of virtual servers is shared by all network namespaces and a dump
/// resumes at a count over all of them, so servers added or removed in another namespace
/// meanwhile (a scratch namespace, or its later teardown) make this one's listing repeat
/// or skip a server (seen once: every line of a killed apply's check listed twice).
pub fn ipvsadm_save(lab: &Lab, netns: &str) -> String {
    let read = || {
        lab.exec_ok(netns, "ipvsadm-save", &["-n"], None)
            .unwrap_or_else(|e| panic!("ipvsadm-save -n: {e}"))
    };
    let mut last = read();
    for _ in 0..20 {
        let now = read();
        if now == last {
            break;
        }
        last = now;
    }
    last
}

/// A golden case's four parts, each compiled through the CLI with the case's `args` and
/// `--part`, as a node would write them.
fn compile_case_ipvs(case: &str) -> Vec<(Part, String)> {
    Part::ALL
        .iter()
        .map(|&p| (p, compile_case_with(case, "ipvs", &["--part", p.name()])))
        .collect()
}

/// Why the VM cannot run here, if it cannot.
fn vm_missing() -> Option<String> {
    let on_path = |tool: &str| {
        std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
    };
    if !on_path("qemu-system-x86_64") {
        return Some(
            "qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)".into(),
        );
    }
    let kernel = std::fs::read_dir("/boot").ok().is_some_and(|rd| {
        rd.filter_map(|e| e.ok())
            .any(|e| e.file_name().to_string_lossy().starts_with("vmlinuz-"))
    });
    if !kernel {
        return Some("no /boot/vmlinuz-* (apt-get install linux-image-amd64)".into());
    }
    for tool in ["ipvsadm", "ipset", "busybox", "cpio"] {
        if !on_path(tool) && !Path::new("/usr/sbin").join(tool).is_file() {
            return Some(format!("{tool} is not installed"));
        }
    }
    None
}

/// Skip (print why and return false), or fail under `SVC_KERNEL=require`.
fn require_vm(test: &str) -> bool {
    let Some(why) = vm_missing() else { return true };
    super::lab::skip(test, &format!("the IPVS VM cannot run: {why}"));
    false
}

/// What one VM run gave back.
struct VmRun {
    status: Option<i32>,
    console: String,
    elapsed: Duration,
}

/// Boots the VM once and runs `script` (a shell script) inside; `share` is writable
/// from the guest. Bounded: qemu is killed after `timeout_secs`.
fn run_vm(script: &str, share: &Path, timeout_secs: u64) -> VmRun {
    let script_path = share.join("guest.sh");
    std::fs::write(&script_path, script).unwrap();
    let mut cmd = Command::new(root().join("tests/ipvs/vm.sh"));
    cmd.arg(&script_path)
        .current_dir(root())
        .env("SVC_IPVS_CACHE", vm_dir())
        .env("SVC_IPVS_SHARE", share)
        .env("SVC_IPVS_TIMEOUT", timeout_secs.to_string());
    let start = Instant::now();
    // The script's own deadline kills qemu; ours is a backstop a little later.
    let out = run_bounded(&mut cmd, None, Duration::from_secs(timeout_secs + 60))
        .expect("run tests/ipvs/vm.sh");
    VmRun {
        status: out.status.code(),
        console: format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        elapsed: start.elapsed(),
    }
}

/// `target/ipvs-vm`: the kernel and initramfs cache, and each run's shared directory.
fn vm_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
        .join("ipvs-vm")
}

/// A fresh directory under [`vm_dir`] for one run (removed at the end).
fn share_dir(tag: &str) -> PathBuf {
    let d = vm_dir()
        .join("runs")
        .join(format!("{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The guest's boot time from the console (`svc-vm: guest script starts at uptime Ns`).
fn boot_secs(console: &str) -> Option<f64> {
    console.lines().find_map(|l| {
        l.strip_prefix("svc-vm: guest script starts at uptime ")
            .and_then(|r| r.trim_end_matches('s').parse().ok())
    })
}

/// The harness itself: the guest's exit status comes back, a file the guest writes to
/// the share comes back, and a guest that never finishes is killed at the deadline
/// (status 125) with no qemu left behind.
#[test]
fn vm_harness_status_share_and_deadline() {
    if !require_vm("kernel ipvs VM harness") {
        return;
    }
    let share = share_dir("harness");
    let script = format!(
        "#!/bin/sh\necho guest-was-here > '{}/out'\nexit 3\n",
        share.display()
    );
    let run = run_vm(&script, &share, SUITE_TIMEOUT_SECS);
    assert_eq!(run.status, Some(3), "{}", run.console);
    assert_eq!(
        std::fs::read_to_string(share.join("out")).ok().as_deref(),
        Some("guest-was-here\n")
    );
    let run = run_vm("#!/bin/sh\nsleep 100000\n", &share, 20);
    assert_eq!(run.status, Some(125), "{}", run.console);
    // qemu's command line names the share; nothing running may still name it.
    let needle = share.display().to_string();
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains("qemu") && c.contains(&needle))
        .collect();
    let _ = std::fs::remove_dir_all(&share);
    assert!(left.is_empty(), "qemu still running: {left:?}");
}

/// Every golden case with flows, through the IPVS target, in one VM boot.
#[test]
fn golden_flows_ipvs() {
    let test = "kernel golden flows (ipvs, in a VM)";
    if !require_vm(test) {
        return;
    }
    let share = share_dir("flows");
    let cases_dir = share.join("cases");
    std::fs::create_dir_all(&cases_dir).unwrap();
    let mut cases = Vec::new();
    // SVC_IPVS_CASES=a,b runs only those cases (while working on one).
    let only = std::env::var("SVC_IPVS_CASES").ok();
    for (case, flows) in case_flows() {
        if only
            .as_deref()
            .is_some_and(|o| !o.split(',').any(|c| c == case))
        {
            continue;
        }
        let dir = cases_dir.join(&case);
        std::fs::create_dir_all(&dir).unwrap();
        for (part, text) in compile_case_ipvs(&case) {
            std::fs::write(dir.join(part.name()), text).unwrap();
        }
        std::fs::write(dir.join("flows"), flows).unwrap();
        cases.push(case);
    }
    // apply's steps (tests/kernel/ipvs_apply.rs) run in the same boot, after the cases.
    let apply = only
        .as_deref()
        .is_none_or(|o| o.split(',').any(|c| c == "apply"));
    // The differential's IPVS side too (tests/kernel/differential_ipvs.rs).
    let diff = only
        .as_deref()
        .is_none_or(|o| o.split(',').any(|c| c == "diff"));
    let exe = std::env::current_exe().unwrap();
    let mut script = format!(
        "#!/bin/sh\nexport {GUEST_DIR_ENV}='{}'\n'{}' --exact kernel::ipvs::guest_suite --ignored --nocapture --test-threads 1; rc=$?\n",
        share.display(),
        exe.display()
    );
    if apply {
        script += &format!(
            "'{}' --exact kernel::ipvs_apply::guest_apply --ignored --nocapture --test-threads 1 || rc=1\n",
            exe.display()
        );
    }
    let diff = diff && !super::differential::ipvs::steps().is_empty();
    if diff {
        script += &super::differential::ipvs::guest_env();
        script += &format!(
            "'{}' --exact kernel::differential::ipvs::guest_differential --ignored --nocapture --test-threads 1 || rc=1\n",
            exe.display()
        );
    }
    script += "exit $rc\n";
    let run = run_vm(&script, &share, SUITE_TIMEOUT_SECS);
    let results = std::fs::read_to_string(share.join("results")).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&share);

    // One line per case: CASE \t ok|fail \t millis \t failures (` | `-separated).
    let mut failures = Vec::new();
    let mut report = String::new();
    let mut seen = Vec::new();
    for l in results.lines() {
        let f: Vec<&str> = l.splitn(4, '\t').collect();
        let [case, verdict, ms, msg] = f[..] else {
            continue;
        };
        seen.push(case.to_string());
        let _ = writeln!(report, "  {case:<22} {verdict:<4} {ms:>6} ms");
        if verdict != "ok" {
            for m in msg.split(" | ") {
                failures.push(format!("{case} [ipvs] {m}"));
            }
        }
    }
    let mut steps: Vec<String> = super::ipvs_apply::STEPS
        .iter()
        .filter(|_| apply)
        .map(|s| s.to_string())
        .collect();
    if diff {
        steps.extend(super::differential::ipvs::steps());
    }
    for c in cases.iter().chain(&steps) {
        if !seen.contains(c) {
            failures.push(format!("{c} [ipvs]: no result from the guest"));
        }
    }
    if std::env::var_os("SVC_IPVS_CONSOLE").is_some() {
        println!("--- guest console\n{}", run.console);
    }
    println!(
        "ipvs VM suite: {} cases, boot {:.1} s, total {:.1} s, exit {:?}\n{report}",
        cases.len(),
        boot_secs(&run.console).unwrap_or(f64::NAN),
        run.elapsed.as_secs_f64(),
        run.status
    );
    assert!(
        failures.is_empty() && run.status == Some(0),
        "IPVS kernel disagrees with the flows:\n{}\n--- guest console (exit {:?})\n{}",
        failures.join("\n"),
        run.status,
        run.console
    );
}

/// The guest side of [`golden_flows_ipvs`]: runs inside the VM only.
#[test]
#[ignore = "runs inside the IPVS VM, started by golden_flows_ipvs"]
fn guest_suite() {
    let dir = PathBuf::from(
        std::env::var_os(GUEST_DIR_ENV)
            .unwrap_or_else(|| panic!("{GUEST_DIR_ENV} unset: this runs inside the IPVS VM")),
    );
    let mut cases: Vec<String> = std::fs::read_dir(dir.join("cases"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    cases.sort();
    let mut results = String::new();
    for case in &cases {
        let start = Instant::now();
        // A panic in one case (lab setup, a loader) is that case's failure only.
        let d = dir.join("cases").join(case);
        let outcome = std::panic::catch_unwind(|| run_guest_case(&d));
        let failures = match outcome {
            Ok(f) => f,
            Err(p) => vec![p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panicked".into())],
        };
        let ms = start.elapsed().as_millis();
        // One line per case: no newline or tab inside a message.
        let failures: Vec<String> = failures
            .iter()
            .map(|f| f.replace('\n', " / ").replace('\t', " "))
            .collect();
        let verdict = if failures.is_empty() { "ok" } else { "fail" };
        println!("ipvs guest: {case}: {verdict} in {ms} ms");
        let _ = writeln!(results, "{case}\t{verdict}\t{ms}\t{}", failures.join(" | "));
        // Written after every case: a hang later still leaves these.
        std::fs::write(dir.join("results"), &results).unwrap();
    }
}

/// The sysctls the `addresses` part documents (`#   key=value  (note)`), except those
/// for older kernels.
fn documented_sysctls(addresses: &str) -> Vec<(String, String)> {
    addresses
        .lines()
        .filter_map(|l| l.strip_prefix("#   "))
        .filter(|l| !l.contains("older than"))
        .filter_map(|l| {
            let kv = l.split_whitespace().next()?;
            let (k, v) = kv.split_once('=')?;
            Some((k.to_string(), v.to_string()))
        })
        .collect()
}

/// `ipset save`/restore text compared as sets: `create` lines in order without the
/// kernel's `bucketsize`/`initval` (ipset ≥ 7.11 adds them; initval is random), each
/// set's `add` lines sorted.
fn ipset_normal(text: &str) -> Vec<(String, Vec<String>)> {
    let mut sets: Vec<(String, Vec<String>)> = Vec::new();
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix("create ") {
            let mut words: Vec<&str> = Vec::new();
            let mut it = rest.split_whitespace();
            while let Some(w) = it.next() {
                if w == "bucketsize" || w == "initval" {
                    it.next();
                } else {
                    words.push(w);
                }
            }
            sets.push((words.join(" "), Vec::new()));
        } else if let (Some(add), Some(last)) = (l.strip_prefix("add "), sets.last_mut()) {
            last.1.push(add.to_string());
        }
    }
    for s in &mut sets {
        s.1.sort();
    }
    sets
}

fn run_guest_case(dir: &Path) -> Vec<String> {
    let read = |p: Part| std::fs::read_to_string(dir.join(p.name())).unwrap();
    let flows = parse_flows(&std::fs::read_to_string(dir.join("flows")).unwrap());
    let case = dir.file_name().unwrap().to_string_lossy().into_owned();
    let mut lab = Lab::new(&format!("ipvs{}", case.len()), &LabSpec::default()).expect("lab");
    lab.serve(Proto::Tcp, BACKEND_PORT).expect("serve tcp");
    lab.serve(Proto::Udp, BACKEND_PORT).expect("serve udp");
    let ipt = read(Part::Iptables);
    let v6 = ipt.lines().next().is_some_and(|l| l.contains("IPv6"));
    let load = |prog: &str, args: &[&str], text: &str| {
        let out = lab.exec("node", prog, args, Some(text)).expect(prog);
        assert!(
            out.status.success(),
            "{prog} {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    for part in Part::ALL {
        let text = read(part);
        match part {
            Part::Ipset => load("ipset", &["restore"], &text),
            Part::Addresses => load("ip", &["-batch", "-"], &text),
            Part::Ipvsadm => {
                load("ipvsadm-restore", &[], &text);
                // After ip_vs is loaded (its sysctls exist from then on).
                for (k, v) in documented_sysctls(&read(Part::Addresses)) {
                    load("sysctl", &["-qw", &format!("{k}={v}")], "");
                }
            }
            Part::Iptables if v6 => load("ip6tables-restore", &["--noflush"], &text),
            Part::Iptables => load("iptables-restore", &["--noflush"], &text),
        }
    }
    // What was loaded reads back as written: ipvsadm-save -n lists the part's servers.
    let saved = ipvsadm_save(&lab, "node");
    let mut failures = Vec::new();
    let written = read(Part::Ipvsadm);
    let written: Vec<&str> = written
        .lines()
        .filter(|l| !l.starts_with("--set"))
        .collect();
    let saved_lines: Vec<&str> = saved.lines().collect();
    if written != saved_lines {
        failures.push(format!(
            "ipvsadm-save -n differs from the ipvsadm part: saved {saved_lines:?}, written {written:?}"
        ));
    }
    // The `--set` line's timeouts are in force (0 keeps the kernel's value).
    if let Some(set) = read(Part::Ipvsadm)
        .lines()
        .find_map(|l| l.strip_prefix("--set "))
    {
        let shown = lab
            .exec_ok("node", "ipvsadm", &["-L", "--timeout"], None)
            .expect("ipvsadm --timeout");
        let got: Vec<&str> = shown
            .split(':')
            .nth(1)
            .unwrap_or("")
            .split_whitespace()
            .collect();
        let want: Vec<&str> = set.split_whitespace().collect();
        let agree = got.len() == 3 && want.iter().zip(&got).all(|(w, g)| *w == "0" || w == g);
        if !agree {
            failures.push(format!(
                "ipvsadm -L --timeout shows `{}`, the part sets {want:?}",
                shown.trim()
            ));
        }
    }
    // ipset save lists the sets as written, in creation order (entries in hash order).
    let saved = lab
        .exec_ok("node", "ipset", &["save"], None)
        .expect("ipset save");
    let (got, want) = (ipset_normal(&saved), ipset_normal(&read(Part::Ipset)));
    if got != want {
        failures.push(format!(
            "ipset save differs from the ipset part: saved {got:?}, written {want:?}"
        ));
    }
    // kube-ipvs0 holds exactly the part's addresses.
    let shown = lab
        .exec_ok(
            "node",
            "ip",
            &["-o", "addr", "show", "dev", "kube-ipvs0"],
            None,
        )
        .expect("ip addr");
    let mut got: Vec<&str> = shown
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let i = w.iter().position(|x| *x == "inet" || *x == "inet6")?;
            w.get(i + 1).copied()
        })
        .collect();
    let addresses = read(Part::Addresses);
    let mut want: Vec<&str> = addresses
        .lines()
        .filter_map(|l| l.strip_prefix("address add ")?.split_whitespace().next())
        .collect();
    got.sort_unstable();
    want.sort_unstable();
    if got != want {
        failures.push(format!(
            "kube-ipvs0 has {got:?}, the addresses part binds {want:?}"
        ));
    }
    failures.extend(check_flows(&lab, "ipvs", &flows));
    failures
}
