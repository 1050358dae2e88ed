//! Low-level helpers: bounded child processes, threads inside a network
//! namespace, sysctls, and the sweep of namespaces left by crashed runs.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};
use svc_node::sys::libc;

/// Every namespace a [`super::Lab`] creates is named
/// `sct-<tag>-<pid>-<counter>-<host>`.
pub const NETNS_PREFIX: &str = "sct-";

/// Where `ip netns add` keeps its namespace handles.
pub const NETNS_DIR: &str = "/run/netns";

/// Runs `cmd` with piped stdout/stderr (and `stdin` written to its input),
/// killing it if it has not exited within `timeout`.
pub fn run_bounded(
    cmd: &mut Command,
    stdin: Option<&str>,
    timeout: Duration,
) -> io::Result<Output> {
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let what = format!("{cmd:?}");
    let mut child = cmd.spawn()?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        let text = text.to_owned();
        // A child that never reads its input must not block us: write from a
        // thread; it ends with EPIPE at the latest when the child dies.
        thread::spawn(move || {
            let _ = pipe.write_all(text.as_bytes());
        });
    }
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let deadline = Instant::now() + timeout;
    let mut nap = Duration::from_millis(1);
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{what} did not finish within {timeout:?}"),
            ));
        }
        thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(20));
    };
    // A grandchild may still hold the pipes open: do not wait for it long.
    let collect =
        |rx: mpsc::Receiver<Vec<u8>>| rx.recv_timeout(Duration::from_secs(1)).unwrap_or_default();
    Ok(Output {
        status,
        stdout: collect(stdout),
        stderr: collect(stderr),
    })
}

fn drain(pipe: Option<impl Read + Send + 'static>) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    if let Some(mut pipe) = pipe {
        thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = pipe.read_to_end(&mut buf);
            let _ = tx.send(buf);
        });
    } else {
        let _ = tx.send(Vec::new());
    }
    rx
}

/// Like [`run_bounded`], but a non-zero exit status is an error carrying the
/// command and its stderr. Returns stdout.
pub fn run_ok(cmd: &mut Command, stdin: Option<&str>, timeout: Duration) -> io::Result<String> {
    let what = format!("{cmd:?}");
    let out = run_bounded(cmd, stdin, timeout)?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Moves the calling thread into the network namespace `netns`.
/// Only ever call this on a thread of our own, never on a test's thread.
pub fn enter_netns(netns: &str) -> io::Result<()> {
    let file = File::open(Path::new(NETNS_DIR).join(netns))?;
    // SAFETY: plain syscall on a valid, open descriptor.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Runs `f` on a short-lived thread inside the network namespace `netns`.
/// Sockets created by `f` belong to that namespace.
pub fn in_netns<T: Send>(netns: &str, f: impl FnOnce() -> T + Send) -> io::Result<T> {
    thread::scope(|s| {
        s.spawn(|| {
            enter_netns(netns)?;
            Ok(f())
        })
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// Writes sysctls (paths relative to /proc/sys, e.g. `net/ipv4/ip_forward`)
/// inside `netns`. /proc/sys/net shows the namespace of the opening thread.
/// Entries marked optional may be missing (e.g. bridge netfilter knobs).
pub fn write_sysctls(netns: &str, entries: &[(&str, &str, bool)]) -> io::Result<()> {
    in_netns(netns, || {
        for &(key, value, optional) in entries {
            let path = Path::new("/proc/sys").join(key);
            let result = OpenOptions::new()
                .write(true)
                .open(&path)
                .and_then(|mut f| f.write_all(value.as_bytes()));
            match result {
                Err(e) if optional && e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("sysctl {key}={value} in {netns}: {e}"),
                    ))
                }
                Ok(()) => {}
            }
        }
        Ok(())
    })?
}

/// Names of all network namespaces known to `ip netns` (the files under
/// /run/netns).
pub fn list_netns() -> Vec<String> {
    let Ok(dir) = fs::read_dir(NETNS_DIR) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect()
}

/// Deletes namespaces with our prefix whose creating process is gone
/// (`sct-<tag>-<pid>-...` with no /proc/<pid>): leftovers of crashed or
/// killed runs. Namespaces of live processes (other test runs) are kept.
/// Returns the names deleted.
pub fn sweep_stale() -> io::Result<Vec<String>> {
    let stale: Vec<String> = list_netns()
        .into_iter()
        .filter(|name| {
            let Some(rest) = name.strip_prefix(NETNS_PREFIX) else {
                return false;
            };
            let mut parts = rest.splitn(3, '-');
            let (_tag, pid) = (parts.next(), parts.next());
            match pid.and_then(|p| p.parse::<u32>().ok()) {
                Some(pid) => !Path::new(&format!("/proc/{pid}")).exists(),
                None => false,
            }
        })
        .collect();
    delete_netns(&stale)?;
    Ok(stale)
}

/// Deletes the named namespaces (one `ip -force -batch` run); missing ones
/// are not an error. Deleting a namespace also removes its veths.
pub fn delete_netns(names: &[String]) -> io::Result<()> {
    if names.is_empty() {
        return Ok(());
    }
    let script: String = names.iter().map(|n| format!("netns del {n}\n")).collect();
    let out = run_bounded(
        Command::new("ip").args(["-force", "-batch", "-"]),
        Some(&script),
        // A hang guard, not a time limit (see `lab::SETUP_TIMEOUT`).
        Duration::from_secs(120),
    )?;
    let left: Vec<&String> = names
        .iter()
        .filter(|n| Path::new(NETNS_DIR).join(n).exists())
        .collect();
    if !left.is_empty() {
        return Err(io::Error::other(format!(
            "namespaces not deleted: {left:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}
