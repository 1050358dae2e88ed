//! Resource bounds (docs/input.md "Limits"), each with an input generated here, never stored: a
//! 1 GB input, an alias bomb, 10⁶-deep nesting, a 64 MiB scalar and a million documents
//! are refused with a diagnostic or read in memory that the bound below holds. Each runs
//! `svc-compile check` as a child, and its peak RSS is its `VmHWM` (the high-water mark of
//! its own address space: `wait4`'s `ru_maxrss` would count the test process's, which the
//! child's exec inherits), read every millisecond while it runs.

use crate::support::TempDir;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What one `svc-compile check` run gave.
struct Ran {
    code: i32,
    stderr: String,
    stdout: String,
    /// Peak resident set size, MiB.
    peak_mib: u64,
}

/// `VmHWM` of process `pid`, KiB (`None` once it has exited).
fn hwm_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Run `svc-compile check ARGS`, writing `input` (called with the child's stdin, which it
/// may leave early) from another thread.
fn check(args: &[&str], input: impl FnOnce(&mut dyn Write) + Send + 'static) -> Ran {
    let mut child = Command::new(env!("CARGO_BIN_EXE_svc-compile"))
        .arg("check")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start svc-compile");
    let pid = child.id();
    let done = Arc::new(AtomicBool::new(false));
    let monitor = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut peak = 0;
            while !done.load(Ordering::SeqCst) {
                match hwm_kib(pid) {
                    Some(k) => peak = peak.max(k),
                    None => break,
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            peak
        })
    };
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        input(&mut stdin);
    });
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut out, &mut s).ok();
        s
    });
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut err, &mut stderr).ok();
    let stdout = reader.join().unwrap();
    // Output closed: the child is exiting; its last high-water mark has been read (or is
    // read now, while it is not yet reaped).
    let peak_kib = monitor.join().unwrap().max(hwm_kib(pid).unwrap_or(0));
    // A process that ran has some memory: a peak of 0 means no sample was taken, and the
    // bound below would hold for nothing.
    assert!(peak_kib > 0, "no RSS sample of check {args:?}");
    let status = child.wait().expect("wait");
    eprintln!("bounds: check {args:?}: peak RSS {} MiB", peak_kib / 1024);
    done.store(true, Ordering::SeqCst);
    writer.join().unwrap();
    Ran {
        code: status.code().unwrap_or(-1),
        stderr,
        stdout,
        peak_mib: peak_kib / 1024,
    }
}

fn nothing(_: &mut dyn Write) {}

/// Writes `n` copies of `piece` (errors ignored: the reader may stop early).
fn repeat(piece: &'static [u8], n: usize) -> impl FnOnce(&mut dyn Write) + Send + 'static {
    move |w: &mut dyn Write| {
        let chunk = piece.repeat((1 << 16) / piece.len().max(1) + 1);
        let per = chunk.len() / piece.len();
        let mut left = n;
        while left > 0 {
            let k = left.min(per);
            if w.write_all(&chunk[..k * piece.len()]).is_err() {
                return;
            }
            left -= k;
        }
    }
}

/// A 1 GB file (sparse: it takes no disk) is refused by its size before it is read.
#[test]
fn a_1_gb_file_is_refused_unread() {
    let dir = TempDir::new("bounds-1gb");
    let path = dir.path().join("huge.yaml");
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(1_000_000_000).unwrap();
    let r = check(&[path.to_str().unwrap()], nothing);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("(1000000000 bytes): the inputs exceed 256 MiB together"),
        "{}",
        r.stderr
    );
    assert!(r.peak_mib < 64, "peak RSS {} MiB", r.peak_mib);
}

/// 1 GB on standard input: read up to the limit, then refused.
#[test]
fn a_1_gb_stream_is_refused_at_the_limit() {
    let line: &[u8] = b"# a comment line of a very large input, 64 bytes with its end..\n";
    let r = check(&["-"], repeat(line, 1_000_000_000 / line.len()));
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("standard input: the inputs exceed 256 MiB together"),
        "{}",
        r.stderr
    );
    // The limit itself, and what reading it in growing steps costs.
    assert!(r.peak_mib < 256 + 300, "peak RSS {} MiB", r.peak_mib);
}

/// Ten levels of nine aliases each (10⁹ nodes expanded): SVC002, early.
#[test]
fn an_alias_bomb_is_refused() {
    let mut text = String::from("a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for i in 1..10 {
        let refs = vec![format!("*a{}", i - 1); 9].join(", ");
        text += &format!("a{i}: &a{i} [{refs}]\n");
    }
    let r = check(&["-"], move |w| {
        let _ = w.write_all(text.as_bytes());
    });
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stdout.contains("error[SVC002]"), "{}", r.stdout);
    assert!(r.peak_mib < 64, "peak RSS {} MiB", r.peak_mib);
}

/// 10⁶ levels of nesting, as block sequences (`- - - ...`), flow sequences and flow
/// mappings, and as JSON: SVC001 at the 513th level, no stack overflow.
#[test]
fn a_million_levels_of_nesting_are_refused() {
    let cases: [(&'static [u8], &'static [u8]); 4] = [
        (b"- ", b"x\n"),
        (b"[", b""),
        (b"{a: ", b""),
        (b"[[", b""), // JSON: starts with `[`
    ];
    for (open, end) in cases {
        let r = check(&["-"], move |w| {
            repeat(open, 1_000_000)(w);
            let _ = w.write_all(end);
        });
        assert_eq!(r.code, 1, "{}: {}", String::from_utf8_lossy(open), r.stderr);
        assert!(
            r.stdout.contains("error[SVC001]"),
            "{}: {}",
            String::from_utf8_lossy(open),
            r.stdout
        );
        assert!(r.peak_mib < 128, "peak RSS {} MiB", r.peak_mib);
    }
}

/// One scalar of 64 MiB in a file, in every shape the parsers read differently: refused
/// (SVC023, longer than the API server takes a whole object) without being copied, so the
/// peak stays under twice the input. A scalar just under the limit is read.
#[test]
fn a_64_mib_scalar_is_refused_in_under_twice_its_size() {
    const N: usize = 64 << 20;
    const HEAD: &[u8] = b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: big}\ndata:\n  blob: ";
    type Shape = fn(&mut dyn Write);
    let shapes: [(&str, Shape); 7] = [
        ("plain", |w| {
            let _ = w.write_all(HEAD);
            repeat(b"x", N)(w);
        }),
        ("double-quoted with commas", |w| {
            let _ = w.write_all(HEAD);
            let _ = w.write_all(b"\"");
            repeat(b"x,", N / 2)(w);
            let _ = w.write_all(b"\"\n");
        }),
        ("literal block", |w| {
            let _ = w.write_all(HEAD);
            let _ = w.write_all(b"|\n");
            repeat(
                b"    a line of a literal block scalar, sixty-four bytes long..\n",
                N / 64,
            )(w);
        }),
        ("folded, not ASCII (saphyr's path)", |w| {
            let _ = w.write_all(HEAD);
            let _ = w.write_all(b">\n");
            repeat(
                "    é line of a folded block scalar, sixty-four bytes long...\n".as_bytes(),
                N / 64,
            )(w);
        }),
        ("plain over lines", |w| {
            let _ = w.write_all(HEAD);
            let _ = w.write_all(b"start\n");
            repeat(
                b"    more words of one plain scalar, over many lines, 64 bytes\n",
                N / 64,
            )(w);
        }),
        ("single-quoted over lines", |w| {
            let _ = w.write_all(HEAD);
            let _ = w.write_all(b"'start\n");
            repeat(
                b"    more words of one quoted scalar, over many lines, 64 bytes\n",
                N / 64,
            )(w);
            let _ = w.write_all(b"    end'\n");
        }),
        ("JSON", |w| {
            let _ = w.write_all(br#"{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big"}, "data": {"blob": ""#);
            repeat(b"x", N)(w);
            let _ = w.write_all(b"\"}}\n");
        }),
    ];
    let dir = TempDir::new("bounds-scalar");
    let path = dir.path().join("big.yaml");
    for (shape, write) in shapes {
        // A file: read into memory of its size (standard input grows its buffer as it
        // reads, up to twice what it holds).
        let mut f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        write(&mut f);
        f.flush().unwrap();
        drop(f);
        let r = check(&[path.to_str().unwrap()], nothing);
        assert_eq!(r.code, 1, "{shape}: {}", r.stderr);
        assert!(r.stdout.contains("error[SVC023]"), "{shape}: {}", r.stdout);
        assert!(
            r.peak_mib < 2 * (N as u64 >> 20),
            "{shape}: peak RSS {} MiB",
            r.peak_mib
        );
    }
    // 3,000,000 bytes: under the limit, read.
    let r = check(&["-"], |w| {
        let _ = w.write_all(HEAD);
        repeat(b"x", 3_000_000)(w);
        let _ = w.write_all(b"\n");
    });
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
}

/// A million documents: refused before parsing (SVC019), at the first marker past
/// `MAX_DOCUMENTS`.
#[test]
fn a_million_documents_are_refused() {
    let r = check(&["-"], repeat(b"---\na: 1\n", 1_000_000));
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stdout.contains(
            "error[SVC019]: more than 250000 documents in one file; the file was not read\n  --> <stdin>:500001:1"
        ),
        "{}",
        r.stdout
    );
    assert!(r.peak_mib < 128, "peak RSS {} MiB", r.peak_mib);
}

/// 200 000 documents that are no objects: read, with at most `MAX_DIAGNOSTICS` (100 000)
/// of their notes kept (shown each with --verbose) and the rest counted in one SVC018 note.
#[test]
fn many_documents_keep_bounded_diagnostics() {
    let r = check(&["-", "--verbose"], repeat(b"---\na: 1\n", 200_000));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.stdout.matches("note[SVC012]").count(), 100_000);
    assert!(
        r.stdout.contains(
            "note[SVC018]: 100000 more diagnostic(s) not shown (0 error(s), 0 warning(s), 100000 note(s))"
        ),
        "{}",
        &r.stdout[r.stdout.len().saturating_sub(2000)..]
    );
    assert!(r.peak_mib < 512, "peak RSS {} MiB", r.peak_mib);
}

/// 120 000 documents that are no mapping (an error each): errors past the limit are
/// counted, and still fail the run.
#[test]
fn errors_past_the_limit_still_fail() {
    let r = check(&["-"], repeat(b"--- x\n", 120_000));
    assert_eq!(r.code, 1, "{}", r.stderr);
    let tail = &r.stdout[r.stdout.len().saturating_sub(400)..];
    assert!(
        tail.contains("note[SVC018]: 20000 more diagnostic(s) not shown (20000 error(s), 0 warning(s), 0 note(s))"),
        "{tail}"
    );
    assert!(tail.ends_with("120000 error(s), 0 warning(s)\n"), "{tail}");
    assert!(r.peak_mib < 512, "peak RSS {} MiB", r.peak_mib);
}
