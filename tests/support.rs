//! Running the built `svc-compile` binary; a failing check prints the command and its output.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub cmdline: String,
}

impl Run {
    /// Panic with the whole story unless the exit code is `code`.
    #[track_caller]
    pub fn expect(&self, code: i32) -> &Self {
        assert_eq!(
            self.code, code,
            "`{}` exited {} (wanted {code})\n--- stdout\n{}\n--- stderr\n{}",
            self.cmdline, self.code, self.stdout, self.stderr
        );
        self
    }

    /// Panic with the whole story unless stdout contains `text`.
    #[track_caller]
    pub fn says(&self, text: &str) -> &Self {
        assert!(
            self.stdout.contains(text),
            "`{}` did not say {text:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.cmdline,
            self.stdout,
            self.stderr
        );
        self
    }
}

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The manifests of examples/ (`*.yaml`; examples/templates/ holds the template
/// examples), sorted, as (path, text).
pub fn example_manifests() -> Vec<(String, String)> {
    let mut files: Vec<_> = std::fs::read_dir(root().join("examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p.display().to_string(), text)
        })
        .collect()
}

/// The names of the directories in `dir`, sorted.
pub fn subdirs(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

pub fn svc(args: &[&str], stdin: Option<&str>, cwd: &Path) -> Run {
    svc_env(args, stdin, cwd, &[])
}

/// [`svc`] with `env` added to its environment.
pub fn svc_env(args: &[&str], stdin: Option<&str>, cwd: &Path, env: &[(String, String)]) -> Run {
    let exe = env!("CARGO_BIN_EXE_svc-compile");
    let mut child = Command::new(exe)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .current_dir(cwd)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run svc-compile");
    if let Some(input) = stdin {
        // A command that fails before reading its input (a usage error) closes the pipe:
        // what it did is in its exit code and output, not in this write.
        match child.stdin.take().unwrap().write_all(input.as_bytes()) {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                panic!("writing svc-compile's stdin: {e}")
            }
            _ => {}
        }
    }
    let out = child.wait_with_output().unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        cmdline: format!("svc-compile {}", args.join(" ")),
    }
}

/// A unique scratch directory under the target dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "svc-compile-test-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// xorshift64: a small deterministic generator (no dependency), so that a failure
/// reproduces from the seed it prints.
pub struct Rng(pub u64);

impl Rng {
    /// Seeded through splitmix64, so that neighbouring seeds give unrelated streams.
    pub fn new(seed: u64) -> Rng {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// [`Rng::below`] for indices.
    pub fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }
    /// True with probability `pct`%.
    pub fn chance(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }
    pub fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.index(v.len())]
    }
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.index(i + 1));
        }
    }
}
