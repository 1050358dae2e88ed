//! The agent's input files between syncs: each file's text and fingerprint
//! ([`svc_compiler::source::fingerprint`]), kept while the file's `stat` says it is the
//! same file with the same contents, so that a sync reads and hashes only the files that
//! changed. The text is shared with every compile ([`SourceMap::add_shared`]), so the
//! inputs key and the parse cache take the fingerprint from here too.
//!
//! A file is the same while its device, inode, size, modification and change times (to
//! the nanosecond) are. A rename over it changes the inode; a write in place changes the
//! times, and the change time cannot be set back by anyone (`touch -d`, `cp -p`, `tar`
//! set the modification time only). What timestamps cannot tell is a write within the
//! same clock tick as the last one the cache read after (the kernel's file times are
//! coarse): as git does with its "racily clean" entries, a file whose times are within
//! [`RACY`] of the moment it was read is read again at the next look, until it has been
//! quiet that long.
//!
//! [`SourceMap::add_shared`]: svc_compiler::source::SourceMap::add_shared

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long after a file's last change its `stat` is trusted to tell a later change.
pub const RACY: Duration = Duration::from_secs(1);

/// A file's identity and times, as `stat` gives them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    /// Nanoseconds since the epoch.
    pub mtime: i128,
    pub ctime: i128,
}

impl Stat {
    pub fn of(m: &std::fs::Metadata) -> Stat {
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        Stat {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: ns(m.mtime(), m.mtime_nsec()),
            ctime: ns(m.ctime(), m.ctime_nsec()),
        }
    }

    /// Whether a read that started at `read` (nanoseconds since the epoch) saw the file's
    /// last change: both its times are more than [`RACY`] before the read. Then any later
    /// change gives it other times; otherwise one in the same tick might not.
    pub fn settled(&self, read: i128) -> bool {
        let racy = RACY.as_nanos() as i128;
        self.mtime.max(self.ctime) + racy < read
    }
}

/// Taken just before a file is read: its `stat` then, and when the read started.
#[derive(Clone, Copy, Debug)]
pub struct Stamp {
    stat: Stat,
    read: i128,
}

/// What [`FileCache::look`] found.
#[derive(Debug)]
pub enum Looked {
    /// The file as last read: its text and fingerprint.
    Same(Arc<String>, (u64, u64)),
    /// Read it (then [`FileCache::keep`] it with this stamp).
    Read(Stamp),
}

struct Entry {
    stat: Stat,
    settled: bool,
    text: Arc<String>,
    print: (u64, u64),
}

/// The files, by path.
#[derive(Default)]
pub struct FileCache {
    files: HashMap<PathBuf, Entry>,
    looked: HashSet<PathBuf>,
    read: usize,
}

impl FileCache {
    /// The file at `path` as last kept, if its `stat` shows no change since and it had
    /// settled when it was read; else the stamp to keep it with once read (the `stat` is
    /// taken before the caller reads, so a change during the read shows at the next look).
    pub fn look(&mut self, path: &Path) -> io::Result<Looked> {
        let read = now_ns();
        let stat = Stat::of(&std::fs::metadata(path)?);
        Ok(self.look_at(path, stat, read))
    }

    /// [`FileCache::look`] with the file's `stat` and the clock (nanoseconds since the
    /// epoch) given: how a file system with coarser times than this one's behaves (a
    /// kernel with multigrain timestamps gives a write right after a `stat` new times).
    pub fn look_at(&mut self, path: &Path, stat: Stat, read: i128) -> Looked {
        self.looked.insert(path.to_path_buf());
        if let Some(e) = self.files.get(path) {
            if e.settled && e.stat == stat {
                return Looked::Same(e.text.clone(), e.print);
            }
        }
        self.read += 1;
        Looked::Read(Stamp { stat, read })
    }

    /// The text read after `stamp` (as the compile takes it) and its fingerprint.
    pub fn keep(&mut self, path: &Path, stamp: Stamp, text: Arc<String>, print: (u64, u64)) {
        self.files.insert(
            path.to_path_buf(),
            Entry {
                stat: stamp.stat,
                settled: stamp.stat.settled(stamp.read),
                text,
                print,
            },
        );
    }

    /// Forgets the files not looked at since the last call (gone from the inputs), and
    /// says how many files were read (not taken from the cache) since.
    pub fn sweep(&mut self) -> usize {
        let looked = std::mem::take(&mut self.looked);
        self.files.retain(|p, _| looked.contains(p));
        std::mem::take(&mut self.read)
    }
}

/// The clock the kernel stamps files with (`CLOCK_REALTIME_COARSE`, what `current_time`
/// reads), in nanoseconds since the epoch. A read's moment must come from it, not from
/// the precise wall clock, which runs up to a tick ahead: a write just after a read could
/// otherwise be stamped with a time before that read (seen with times cut to the second,
/// where such a write kept the second of the last change and was served stale).
pub fn now_ns() -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) } == 0 {
        return i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec);
    }
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i128,
        Err(e) => -(e.duration().as_nanos() as i128),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_is_trusted_only_once_the_file_was_quiet_for_a_while_before_its_read() {
        let s = 1_000_000_000;
        let stat = Stat {
            dev: 1,
            ino: 2,
            size: 3,
            mtime: 100 * s,
            ctime: 100 * s,
        };
        assert!(stat.settled(102 * s));
        assert!(!stat.settled(100 * s + s / 2));
        assert!(!stat.settled(101 * s));
        // The change time counts even when the modification time was set back.
        let touched = Stat {
            mtime: 50 * s,
            ..stat
        };
        assert!(!touched.settled(100 * s + s / 2));
        // A file from the future (a clock set back) is never trusted.
        assert!(!stat.settled(90 * s));
    }
}
