//! What wakes the agent: changed input files (inotify, through `notify`), signals, and the
//! sync period's timer. One channel carries them all, so the loop waits in one place.
//!
//! Files: a directory argument is watched recursively; a file argument through its
//! directory (an editor or `git checkout` replaces a file by renaming another over it, which
//! a watch on the file itself would lose). Events for names the compile would not read
//! (hidden entries, editors' swap and backup files, other extensions) wake nothing.
//! A file being written is tracked from its first write to its close: the loop does not
//! sync while one is open for writing (see [`Batch`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use notify::event::{AccessKind, AccessMode, CreateKind, EventKind, ModifyKind};
use notify::{RecursiveMode, Watcher as _};

use crate::Fail;

/// Why the agent woke.
#[derive(Debug)]
pub enum Wake {
    /// A file the compile reads was written (still open: `open`), closed after writing,
    /// created, removed or renamed.
    File { path: PathBuf, open: bool },
    /// The watch lost events (the kernel's queue overflowed) or failed: read everything.
    Rescan(String),
    /// SIGHUP: read everything again.
    Hangup,
    /// SIGTERM or SIGINT: stop, leaving the rules loaded.
    Stop(i32),
}

/// The watches and the signal thread; dropping it stops both.
pub struct Watch {
    _watcher: notify::RecommendedWatcher,
    _signals: signal_hook::iterator::Handle,
    rx: Receiver<Wake>,
}

impl Watch {
    /// Watch `paths` (files or directories) and the signals.
    pub fn new(paths: &[PathBuf]) -> Result<Watch, Fail> {
        let (tx, rx) = std::sync::mpsc::channel();
        let roots: Vec<(PathBuf, bool)> = paths.iter().map(|p| (p.clone(), p.is_dir())).collect();
        let files: BTreeSet<PathBuf> = roots
            .iter()
            .filter(|(_, dir)| !dir)
            .map(|(p, _)| absolute(p))
            .collect();
        let events = tx.clone();
        let mut watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
            for w in wakes(ev, &files) {
                let _ = events.send(w);
            }
        })
        .map_err(|e| Fail(format!("cannot watch the inputs: {e}")))?;
        for (p, dir) in &roots {
            let (at, mode) = if *dir {
                (p.clone(), RecursiveMode::Recursive)
            } else {
                let parent = absolute(p)
                    .parent()
                    .map_or_else(|| PathBuf::from("/"), Path::to_path_buf);
                (parent, RecursiveMode::NonRecursive)
            };
            watcher.watch(&at, mode).map_err(|e| {
                Fail(format!(
                    "cannot watch {}: {e}; check the path (and fs.inotify.max_user_watches)",
                    at.display()
                ))
            })?;
        }
        let signals = signals(tx)?;
        Ok(Watch {
            _watcher: watcher,
            _signals: signals,
            rx,
        })
    }

    /// The next wake, or `None` when `until` passes first.
    pub fn next(&self, until: Instant) -> Option<Wake> {
        let wait = until.saturating_duration_since(Instant::now());
        match self.rx.recv_timeout(wait) {
            Ok(w) => Some(w),
            Err(RecvTimeoutError::Timeout) => None,
            // The senders live as long as `self`.
            Err(RecvTimeoutError::Disconnected) => Some(Wake::Stop(0)),
        }
    }
}

/// The wakes one notify event makes.
fn wakes(ev: notify::Result<notify::Event>, files: &BTreeSet<PathBuf>) -> Vec<Wake> {
    let ev = match ev {
        Ok(ev) => ev,
        Err(e) => return vec![Wake::Rescan(format!("the file watch failed: {e}"))],
    };
    if ev.need_rescan() {
        return vec![Wake::Rescan("the file watch lost events".into())];
    }
    let open = match ev.kind {
        EventKind::Modify(ModifyKind::Data(_)) | EventKind::Create(CreateKind::File) => true,
        EventKind::Access(AccessKind::Close(AccessMode::Write))
        | EventKind::Create(_)
        | EventKind::Remove(_)
        | EventKind::Modify(ModifyKind::Name(_))
        | EventKind::Modify(ModifyKind::Any) => false,
        // Reads, opens, metadata: nothing the compile sees changed.
        _ => return Vec::new(),
    };
    ev.paths
        .into_iter()
        .filter(|p| relevant(p, files))
        .map(|path| Wake::File { path, open })
        .collect()
}

/// Whether a change to `path` may change what the compile reads: a file argument, or a
/// name a directory walk reads (see the CLI's input discovery: `*.yaml`, `*.yml`, `*.json`,
/// no hidden component), or a directory (its removal or renaming removes files).
fn relevant(path: &Path, files: &BTreeSet<PathBuf>) -> bool {
    if files.contains(path) {
        return true;
    }
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    // A ConfigMap or Secret volume (kubelet's atomic writer): every file is a symlink
    // through `..data`, which one rename swaps to the new version's directory.
    if name == "..data" {
        return true;
    }
    if name.starts_with('.') {
        return false;
    }
    match Path::new(name).extension().and_then(|e| e.to_str()) {
        Some("yaml" | "yml" | "json") => true,
        // A directory: renamed or removed (an extensionless name that is not there any more
        // may have been one).
        None => path.is_dir() || !path.exists(),
        Some(_) => false,
    }
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// SIGHUP, SIGTERM and SIGINT, as wakes.
fn signals(tx: Sender<Wake>) -> Result<signal_hook::iterator::Handle, Fail> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGHUP, SIGINT, SIGTERM])
        .map_err(|e| Fail(format!("cannot handle signals: {e}")))?;
    let handle = signals.handle();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for s in signals.forever() {
                let w = match s {
                    SIGHUP => Wake::Hangup,
                    s => Wake::Stop(s),
                };
                if tx.send(w).is_err() {
                    break;
                }
            }
        })
        .map_err(|e| Fail(format!("cannot start the signal thread: {e}")))?;
    Ok(handle)
}

/// File changes gathered until they settle: the sync starts once no event came for `quiet`
/// and no changed file is still open for writing (a half-written file is never compiled),
/// or after `patience` whatever is still open (a process that keeps a file open for writing
/// must not stop the agent).
pub struct Batch {
    pub first: Instant,
    pub last: Instant,
    pub files: BTreeSet<PathBuf>,
    open: BTreeSet<PathBuf>,
    pub rescan: Option<String>,
}

impl Default for Batch {
    fn default() -> Batch {
        Batch::new()
    }
}

impl Batch {
    pub fn new() -> Batch {
        let now = Instant::now();
        Batch {
            first: now,
            last: now,
            files: BTreeSet::new(),
            open: BTreeSet::new(),
            rescan: None,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty() && self.rescan.is_none()
    }

    pub fn file(&mut self, path: PathBuf, open: bool) {
        if self.is_empty() {
            self.first = Instant::now();
        }
        self.last = Instant::now();
        if open {
            self.open.insert(path.clone());
        } else {
            self.open.remove(&path);
        }
        self.files.insert(path);
    }

    pub fn rescan(&mut self, why: String) {
        if self.is_empty() {
            self.first = Instant::now();
        }
        self.last = Instant::now();
        self.rescan.get_or_insert(why);
    }

    /// When the batch is ready to sync.
    pub fn ready_at(&self, quiet: Duration, patience: Duration) -> Instant {
        // Events that never stop (a tool rewriting a file in a loop) wait `patience` too.
        let latest = self.first + patience;
        if self.open.is_empty() {
            (self.last + quiet).min(latest)
        } else {
            latest
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_the_compile_reads_wakes() {
        let files: BTreeSet<PathBuf> = [PathBuf::from("/m/one.txt")].into();
        assert!(relevant(Path::new("/m/one.txt"), &files));
        assert!(relevant(Path::new("/m/d/svc.yaml"), &files));
        assert!(relevant(Path::new("/m/d/svc.json"), &files));
        assert!(!relevant(Path::new("/m/d/.svc.yaml.swp"), &files));
        assert!(!relevant(Path::new("/m/d/svc.yaml~"), &files));
        assert!(!relevant(Path::new("/m/d/notes.md"), &files));
        assert!(relevant(Path::new("/m/d/..data"), &files));
        assert!(!relevant(Path::new("/m/d/..data_tmp"), &files));
    }

    #[test]
    fn an_open_file_holds_the_batch_until_patience() {
        let quiet = Duration::from_millis(10);
        let patience = Duration::from_secs(2);
        let mut b = Batch::new();
        assert!(b.is_empty());
        b.file("/m/a.yaml".into(), true);
        let open_ready = b.ready_at(quiet, patience);
        assert!(open_ready >= b.first + patience);
        b.file("/m/a.yaml".into(), false);
        assert_eq!(b.ready_at(quiet, patience), b.last + quiet);
        assert_eq!(b.files.len(), 1);
    }
}
