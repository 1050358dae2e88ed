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
    pub fn start(path: &Path, doc: &str) -> NextDocument {
        let path = path.to_path_buf();
        let written = (|| -> std::io::Result<File> {
            if let Some(dir) = path.parent() {
                fs::create_dir_all(dir)?;
            }
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

/// The state directory of one node (`--state-dir`, else [`DEFAULT_STATE_ROOT`]`/NS`, `NS`
/// the network namespace's name or `host`): its layout in one place.
///
/// ```text
/// STATE/lock                      flock'd by every apply (and the loaders it starts)
/// STATE/TARGET.inputs             the last apply's inputs fingerprint and generation
/// STATE/TARGET-FAMILY/            one target's records for one family (`Records`)
/// ```
#[derive(Clone, Debug)]
pub struct StateDir {
    root: PathBuf,
}

impl StateDir {
    /// `state_dir` (`--state-dir`), else the default for the network namespace `netns`.
    pub fn new(state_dir: Option<&str>, netns: Option<&str>) -> StateDir {
        let root = match state_dir {
            Some(dir) => PathBuf::from(dir),
            None => Path::new(DEFAULT_STATE_ROOT).join(netns.unwrap_or("host")),
        };
        StateDir { root }
    }

    pub fn path(&self) -> &Path {
        &self.root
    }

    pub fn exists(&self) -> bool {
        self.root.exists()
    }

    /// Creates the directory (and its missing parents) for root alone (0700).
    pub fn create(&self) -> Result<(), Fail> {
        use std::os::unix::fs::DirBuilderExt;
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.root)
            .map_err(|e| {
                Fail(format!(
                    "cannot create the state directory {}: {e}",
                    self.root.display()
                ))
            })
    }

    /// Refuses a state directory that someone but root could have written: root loads the
    /// documents it holds (`--rollback`, the record), so one not owned by root, writable
    /// by group or others, or in a directory others can write without the sticky bit
    /// (another user could move it away and put theirs in place) is an error, as sshd's
    /// `StrictModes` refuses such files.
    pub fn verify(&self) -> Result<(), Fail> {
        use std::os::unix::fs::MetadataExt;
        let dir = self.root.display();
        let meta = |p: &Path| {
            fs::metadata(p).map_err(|e| Fail(format!("cannot read {}: {e}", p.display())))
        };
        let m = meta(&self.root)?;
        if m.uid() != 0 {
            return Err(Fail(format!(
                "the state directory {dir} belongs to uid {}, not root: root loads what is recorded there; use a directory root owns (chown root {dir}) or another --state-dir",
                m.uid()
            )));
        }
        if m.mode() & 0o022 != 0 {
            return Err(Fail(format!(
                "the state directory {dir} can be written by others (mode {:o}): root loads what is recorded there; chmod 700 {dir}",
                m.mode() & 0o7777
            )));
        }
        if let Some(parent) = self.root.parent().filter(|p| !p.as_os_str().is_empty()) {
            let p = meta(parent)?;
            if p.mode() & 0o002 != 0 && p.mode() & 0o1000 == 0 {
                return Err(Fail(format!(
                    "the state directory {dir} is in {}, which anyone can write (mode {:o}, no sticky bit): another user could put their own in its place; use another --state-dir",
                    parent.display(),
                    p.mode() & 0o7777
                )));
            }
        }
        Ok(())
    }

    /// Takes `STATE/lock` (see [`take_lock`]) once the directory passes [`Self::verify`];
    /// `timeout_s` defaults to [`DEFAULT_LOCK_TIMEOUT`].
    pub fn lock(&self, timeout_s: Option<f64>) -> Result<File, Fail> {
        self.verify()?;
        take_lock(
            &self.root.join("lock"),
            timeout_s.unwrap_or(DEFAULT_LOCK_TIMEOUT),
        )
    }

    /// `STATE/TARGET.inputs`.
    pub fn inputs(&self, target: &str) -> PathBuf {
        self.root.join(format!("{target}.inputs"))
    }

    /// The records of `target` (documents with extension `ext`) for `family`.
    pub fn records(&self, target: &str, ext: &'static str, family: &str) -> Records {
        Records {
            dir: self.root.join(format!("{target}-{family}")),
            ext,
        }
    }
}

/// One target's records for one family, `STATE/TARGET-FAMILY/`:
///
/// ```text
/// applied.EXT    the document the node was last brought to
/// applied.state  its owned state (or an UNREAD snapshot), headed by the document's hash
/// applied.gen    the nf_tables generation that state was verified at (same header)
/// applied.digest the fingerprint that stands for an unread state (same header)
/// previous.EXT   the document before it (`--rollback`), previous.state its state
/// next.EXT       a new document being written while the apply plans and loads
/// load.EXT       the last load, load.log its loader's output
/// revert.EXT     the last revert of a half-committed load, revert.log
/// scratch.EXT    the last scratch document, scratch.out its read-back (a cache)
/// ```
///
/// Invariant: a file headed by a document's hash belongs to that document only; a pair
/// that disagrees (a kill between two writes) counts as no record.
#[derive(Clone, Debug)]
pub struct Records {
    dir: PathBuf,
    ext: &'static str,
}

impl Records {
    pub fn path(&self) -> &Path {
        &self.dir
    }

    pub fn create(&self) -> Result<(), Fail> {
        fs::create_dir_all(&self.dir)
            .map_err(|e| Fail(format!("cannot create {}: {e}", self.dir.display())))
    }

    fn doc(&self, stem: &str) -> PathBuf {
        self.dir.join(format!("{stem}.{}", self.ext))
    }

    pub fn applied(&self) -> PathBuf {
        self.doc("applied")
    }
    pub fn previous(&self) -> PathBuf {
        self.doc("previous")
    }
    pub fn next(&self) -> PathBuf {
        self.doc("next")
    }
    pub fn load(&self) -> PathBuf {
        self.doc("load")
    }
    pub fn revert(&self) -> PathBuf {
        self.doc("revert")
    }
    pub fn scratch(&self) -> PathBuf {
        self.doc("scratch")
    }
    pub fn state(&self) -> PathBuf {
        self.dir.join("applied.state")
    }
    pub fn previous_state(&self) -> PathBuf {
        self.dir.join("previous.state")
    }
    pub fn generation(&self) -> PathBuf {
        self.dir.join("applied.gen")
    }
    pub fn digest(&self) -> PathBuf {
        self.dir.join("applied.digest")
    }
    pub fn load_log(&self) -> PathBuf {
        self.dir.join("load.log")
    }
    pub fn revert_log(&self) -> PathBuf {
        self.dir.join("revert.log")
    }
    pub fn scratch_out(&self) -> PathBuf {
        self.dir.join("scratch.out")
    }

    /// The document `--rollback` goes back to: `previous.EXT` (`Some((path, text, true))`),
    /// else, with `keep_applied`, `applied.EXT` (`false`: nothing to go back to, the
    /// family stays as it is: for a loader that writes every family at once).
    pub fn rollback_document(&self, keep_applied: bool) -> Option<(PathBuf, String, bool)> {
        let previous = self.previous();
        if let Ok(doc) = fs::read_to_string(&previous) {
            return Some((previous, doc, true));
        }
        let applied = self.applied();
        match fs::read_to_string(&applied) {
            Ok(doc) if keep_applied => Some((applied, doc, false)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn is_root() -> bool {
        // SAFETY: geteuid cannot fail.
        unsafe { libc::geteuid() == 0 }
    }

    /// A directory others could have written is refused, with what to do; 0700 and 0755
    /// under a sticky /tmp pass. (The owner check needs root to chown.)
    #[test]
    fn a_state_directory_others_could_write_is_refused() {
        let base = std::env::temp_dir().join(format!("svc-node-perm-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        let state = StateDir::new(Some(base.join("s").to_str().unwrap()), None);
        state.create().unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(state.path()), 0o700, "created for root alone");
        let chmod =
            |p: &Path, m: u32| fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap();
        chmod(&base, 0o755);
        if !is_root() {
            // Not ours to judge: the owner is the test's user.
            let _ = fs::remove_dir_all(&base);
            return;
        }
        state.verify().unwrap();
        chmod(state.path(), 0o755);
        state.verify().unwrap();
        chmod(state.path(), 0o775);
        let Err(Fail(msg)) = state.verify() else {
            panic!("group-writable passed")
        };
        assert!(
            msg.contains("mode 775") && msg.contains("chmod 700"),
            "{msg}"
        );
        chmod(state.path(), 0o700);
        chmod(&base, 0o777);
        let Err(Fail(msg)) = state.lock(Some(0.0)) else {
            panic!("world-writable parent passed")
        };
        assert!(msg.contains("no sticky bit"), "{msg}");
        chmod(&base, 0o1777);
        state.verify().unwrap();
        std::os::unix::fs::chown(state.path(), Some(65534), None).unwrap();
        let Err(Fail(msg)) = state.verify() else {
            panic!("another owner passed")
        };
        assert!(msg.contains("uid 65534"), "{msg}");
        let _ = fs::remove_dir_all(&base);
    }

    #[test]
    fn the_layout_is_the_documented_one() {
        let s = StateDir::new(None, Some("node-a"));
        assert_eq!(s.path(), Path::new("/var/lib/svc-compile/node-a"));
        assert_eq!(
            StateDir::new(None, None).path(),
            Path::new("/var/lib/svc-compile/host")
        );
        let s = StateDir::new(Some("/x"), Some("ignored"));
        assert_eq!(s.inputs("nftables"), Path::new("/x/nftables.inputs"));
        let r = s.records("nftables", "nft", "ipv6");
        let names: Vec<PathBuf> = vec![
            r.applied(),
            r.previous(),
            r.next(),
            r.load(),
            r.revert(),
            r.scratch(),
            r.state(),
            r.previous_state(),
            r.generation(),
            r.digest(),
            r.load_log(),
            r.revert_log(),
            r.scratch_out(),
        ];
        let names: Vec<String> = names
            .iter()
            .map(|p| {
                p.strip_prefix("/x/nftables-ipv6")
                    .unwrap()
                    .display()
                    .to_string()
            })
            .collect();
        assert_eq!(
            names,
            [
                "applied.nft",
                "previous.nft",
                "next.nft",
                "load.nft",
                "revert.nft",
                "scratch.nft",
                "applied.state",
                "previous.state",
                "applied.gen",
                "applied.digest",
                "load.log",
                "revert.log",
                "scratch.out"
            ]
        );
    }

    #[test]
    fn rollback_takes_previous_else_keeps_applied_only_when_asked() {
        let dir = std::env::temp_dir().join(format!("svc-node-state-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let s = StateDir::new(Some(dir.to_str().unwrap()), None);
        let r = s.records("ebpf", "ebpf", "ipv4");
        assert!(r.rollback_document(true).is_none(), "nothing recorded");
        r.create().unwrap();
        fs::write(r.applied(), "now").unwrap();
        assert!(r.rollback_document(false).is_none());
        let (p, doc, prev) = r.rollback_document(true).unwrap();
        assert_eq!((p, doc.as_str(), prev), (r.applied(), "now", false));
        fs::write(r.previous(), "before").unwrap();
        for keep in [false, true] {
            let (p, doc, prev) = r.rollback_document(keep).unwrap();
            assert_eq!((p, doc.as_str(), prev), (r.previous(), "before", true));
        }
        let _ = fs::remove_dir_all(&dir);
    }
}
