//! Processes: running the tools a plan names (captured, or as a loader that outlives us
//! and holds the lock), checking that they exist, and quoting them for messages.

use crate::Fail;
use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{self, Stdio};
use svc_targets::plan::Tool;

/// One clear line when a program is missing: the planner's, the scratch namespace's
/// (`unshare`, `sh`) and `ip` for `--netns`.
pub fn check_tools(tools: Vec<Tool>, netns: bool) -> Result<(), Fail> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = |tool: &str| std::env::split_paths(&path).any(|d| d.join(tool).is_file());
    let tool = |program, package| Tool { program, package };
    let frame = [tool("unshare", "util-linux"), tool("sh", "dash")];
    let ip = netns.then_some(tool("ip", "iproute2"));
    for Tool {
        program: tool,
        package: pkg,
    } in tools.into_iter().chain(frame).chain(ip)
    {
        if !found(tool) {
            return Err(Fail(format!(
                "{tool} not found in PATH; install {pkg} (Debian/Ubuntu: apt-get install {pkg})"
            )));
        }
    }
    Ok(())
}

/// A finished command: success, stdout, stderr.
pub struct Output {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

pub fn run_captured(argv: &[String]) -> Result<Output, Fail> {
    let out = process::Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Fail(format!("cannot run {}: {e}", argv[0])))?;
    Ok(Output {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
    })
}

/// Runs a loader so that it finishes even if this process is killed: its own process
/// group (a terminal's Ctrl-C does not reach it), output to a file (no pipe to break),
/// and the lock's file descriptor inherited (the lock is held until it exits).
pub fn run_loader(argv: &[String], lock: Option<&File>, log: &Path) -> Result<Output, Fail> {
    let out =
        File::create(log).map_err(|e| Fail(format!("cannot write {}: {e}", log.display())))?;
    let err = out
        .try_clone()
        .map_err(|e| Fail(format!("cannot write {}: {e}", log.display())))?;
    let mut c = process::Command::new(&argv[0]);
    c.args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    if let Some(lock) = lock {
        let fd = lock.as_raw_fd();
        // SAFETY: only fcntl (async-signal-safe) between fork and exec.
        unsafe {
            c.pre_exec(move || {
                if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let status = c
        .status()
        .map_err(|e| Fail(format!("cannot run {}: {e}", argv[0])))?;
    let text = fs::read_to_string(log).unwrap_or_default();
    Ok(Output {
        ok: status.success(),
        stdout: String::new(),
        stderr: text.trim().to_string(),
    })
}

/// Which programs `tools` are, as far as a cache needs to know: each one's resolved path
/// in `PATH` with its size, modification time and inode (an upgrade, or an alternatives
/// switch between iptables-nft and -legacy, changes it).
pub fn tools_identity(tools: &[Tool], path: &std::ffi::OsStr) -> String {
    use std::fmt::Write as _;
    use std::os::unix::fs::MetadataExt;
    let mut out = String::new();
    for t in tools {
        let found = std::env::split_paths(path)
            .map(|d| d.join(t.program))
            .find_map(|p| fs::canonicalize(&p).ok());
        let meta = found.as_ref().and_then(|p| fs::metadata(p).ok());
        match (found, meta) {
            (Some(p), Some(m)) => {
                let _ = writeln!(
                    out,
                    "{} {} {} {} {}",
                    t.program,
                    p.display(),
                    m.len(),
                    m.mtime(),
                    m.ino()
                );
            }
            _ => {
                let _ = writeln!(out, "{} ?", t.program);
            }
        }
    }
    out
}

/// `sh` quoting for printing commands.
pub fn shell_word(w: &str) -> String {
    let plain = !w.is_empty()
        && w.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:@%+,".contains(c));
    if plain {
        w.to_string()
    } else {
        format!("'{}'", w.replace('\'', r"'\''"))
    }
}

pub fn shell_line(argv: &[String]) -> String {
    argv.iter()
        .map(|w| shell_word(w))
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn first_line(s: &str) -> String {
    let lines: Vec<&str> = s.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    match lines.as_slice() {
        [] => "no error message".into(),
        // iptables-restore prints its name on one line and the reason on the next.
        [a, b, ..] if a.ends_with(':') => format!("{a} {b}"),
        [a, ..] => a.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tools_identity_changes_with_the_program_and_only_then() {
        let dir = std::env::temp_dir().join(format!("svc-compile-tools-{}", process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("a")).unwrap();
        fs::create_dir_all(dir.join("b")).unwrap();
        let tools = [Tool {
            program: "svc-fake-restore",
            package: "x",
        }];
        let path = std::env::join_paths([dir.join("a"), dir.join("b")]).unwrap();
        let id = || tools_identity(&tools, &path);
        assert_eq!(id(), "svc-fake-restore ?\n");
        fs::write(dir.join("b/svc-fake-restore"), "one").unwrap();
        let first = id();
        assert!(first.contains("/b/svc-fake-restore 3 "), "{first}");
        assert_eq!(id(), first, "nothing changed");
        fs::write(dir.join("b/svc-fake-restore"), "other").unwrap();
        assert_ne!(id(), first, "the program changed");
        // A symlink earlier in PATH (an alternatives switch) names another program.
        let second = id();
        std::os::unix::fs::symlink(
            dir.join("b/svc-fake-restore"),
            dir.join("a/svc-fake-restore"),
        )
        .unwrap();
        assert_eq!(id(), second, "the same program through a link");
        fs::write(dir.join("a/target"), "legacy!").unwrap();
        fs::remove_file(dir.join("a/svc-fake-restore")).unwrap();
        std::os::unix::fs::symlink(dir.join("a/target"), dir.join("a/svc-fake-restore")).unwrap();
        assert_ne!(id(), second, "the link switched");
        let _ = fs::remove_dir_all(&dir);
    }
}
