//! The state directory: its lock and the atomic writes every record goes through.

use crate::Fail;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where apply keeps its records, per network namespace (`host` for the host's).
pub const DEFAULT_STATE_ROOT: &str = "/var/lib/svc-compile";
/// How long an apply waits for another one's lock, in seconds.
pub const DEFAULT_LOCK_TIMEOUT: f64 = 30.0;

/// `flock` on the lock file, retried until `timeout_s`. The lock lives as long as the open
/// file: in this process and in the loaders it is handed to.
pub fn take_lock(path: &Path, timeout_s: f64) -> Result<File, Fail> {
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| Fail(format!("cannot open the lock file {}: {e}", path.display())))?;
    let deadline = Instant::now() + Duration::from_secs_f64(timeout_s);
    loop {
        // SAFETY: flock on a file descriptor we own.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(f);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(Fail(format!("cannot lock {}: {e}", path.display())));
        }
        if Instant::now() >= deadline {
            return Err(Fail(format!(
                "another apply holds {} (waited {timeout_s}s); try again later or raise --lock-timeout",
                path.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Writes a file so that readers see the old or the new content, never a part.
pub fn write_atomic(path: &Path, text: &str) -> Result<(), Fail> {
    write_atomic_parts(path, &[text])
}

/// [`write_atomic`] of the concatenation of `parts` (a record's header and a snapshot of
/// 100 MB are not copied into one string first).
pub fn write_atomic_parts(path: &Path, parts: &[&str]) -> Result<(), Fail> {
    let tmp = path.with_extension("tmp");
    let res = (|| {
        let mut f = File::create(&tmp)?;
        for p in parts {
            f.write_all(p.as_bytes())?;
        }
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    res.map_err(|e| Fail(format!("cannot write {}: {e}", path.display())))
}

/// A document being written (and synced) to `next.EXT` in the state directory on a
/// thread of its own, so that the record after the load only renames it (a 10k-service
/// node's document is 25–60 MB: ~80 ms to write and sync, which the plan and the load
/// hide). A kill leaves at most a `next.EXT` nothing reads; the next apply writes it again.
pub struct NextDocument {
    path: PathBuf,
    thread: std::thread::JoinHandle<std::io::Result<()>>,
}

impl NextDocument {
    /// Written here (into the page cache: ~15 ms for 25 MB, where a copy for the thread
    /// would cost as much in new pages), synced on the thread.
    pub fn start(dir: &Path, ext: &str, doc: &str) -> NextDocument {
        let path = dir.join(format!("next.{ext}"));
        let written = (|| -> std::io::Result<File> {
            fs::create_dir_all(dir)?;
            let mut f = File::create(&path)?;
            f.write_all(doc.as_bytes())?;
            Ok(f)
        })();
        let thread = std::thread::spawn(move || written?.sync_all());
        NextDocument { path, thread }
    }

    /// The file, once whole and synced; `None`: write the document the usual way.
    pub fn finish(self) -> Option<PathBuf> {
        match self.thread.join() {
            Ok(Ok(())) => Some(self.path),
            _ => None,
        }
    }
}
