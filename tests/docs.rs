//! The documentation runs as written: every ```` ```console ```` block of README.md and
//! docs/*.md is run against the built binary, and every relative link points to a file
//! (and heading) that exists.
//!
//! A console block is a sequence of commands, each a `$ ` line (continued on the next line
//! after a trailing `\`), then optionally `? CODE` (the exit code; 0 when not given), then
//! the output the command prints, stdout and stderr together as a terminal shows them. In
//! the output, a line `...` stands for any number of lines and `[..]` for any text within
//! a line. The commands of one file run one after the other with `sh -c`, in a sandbox
//! directory of that file holding `examples/` and `golden/` (links to the repository's),
//! with the binary first on PATH: a command may write files that a later one reads.
//!
//! The block's info string says how it runs:
//! - `console`: as above.
//! - `console root`: commands that need root and a node (`apply`, `drift`, `cleanup`,
//!   `bpftool`). As root, they run in a network namespace of their own (one per file, made
//!   and removed here) and a private mount namespace in which /var/lib (the state
//!   directory) and /sys/fs/bpf are directories of the sandbox: "this host" is the
//!   throwaway namespace, and nothing of the machine's is touched. Without root they are
//!   checked as `console parse` blocks, and skipped (`SVC_KERNEL=require`: failed).
//! - `console parse`: commands that cannot run in a test (a resident agent, a kernel without
//!   IPVS, attaching to the machine's cgroup): each `svc-compile` command is run with
//!   `--help` appended, so its subcommand, option names and values must parse (exit 0);
//!   output is not compared.
//!
//! Shell blocks (`sh`, `bash`, `shell`, or none) must not show svc-compile commands: those
//! belong in console blocks, so that they run here.
//!
//! `SVC_DOCS_UPDATE=1` writes the actual output into the files for every command whose
//! output differs (review the diff: wildcards in those outputs are replaced).

use crate::kernel::lab;
use crate::support::{root, TempDir};
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use svc_node::sys::libc;

/// README.md and every docs/*.md, relative to the repository, sorted.
fn doc_files() -> Vec<PathBuf> {
    let mut files = vec![PathBuf::from("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .map(|p| p.strip_prefix(root()).unwrap().to_path_buf())
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// A fenced code block: its info string, the line of its first body line (1-based) and
/// its body.
struct Block {
    info: String,
    first_line: usize,
    body: Vec<String>,
}

/// The fenced blocks of a Markdown text (``` or ~~~ fences, any length, indented or not).
fn blocks(text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<(String, Block)> = None;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        match &mut open {
            None => {
                let fence: String = t.chars().take_while(|&c| c == '`' || c == '~').collect();
                if fence.len() >= 3 && fence.chars().all(|c| c == fence.chars().next().unwrap()) {
                    let info = t[fence.len()..].trim().to_string();
                    let block = Block {
                        info,
                        first_line: i + 2,
                        body: Vec::new(),
                    };
                    open = Some((fence, block));
                }
            }
            Some((fence, block)) => {
                if t.starts_with(fence.as_str())
                    && t.trim_end().trim_start_matches(&**fence).is_empty()
                {
                    out.push(open.take().unwrap().1);
                } else {
                    block.body.push(line.to_string());
                }
            }
        }
    }
    out
}

/// How a console block runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Run,
    Root,
    Parse,
}

fn console_mode(info: &str) -> Option<Mode> {
    let mut words = info.split_whitespace();
    if words.next() != Some("console") {
        return None;
    }
    Some(match words.next() {
        None => Mode::Run,
        Some("root") => Mode::Root,
        Some("parse") => Mode::Parse,
        Some(other) => panic!("console block flag {other:?}: the flags are `root` and `parse`"),
    })
}

/// One documented command: where it is, what it runs, the exit code and output shown.
struct Cmd {
    /// The line of its `$ ` (1-based).
    line: usize,
    /// The lines of the file its expected output takes (0-based, end exclusive).
    output_lines: (usize, usize),
    command: String,
    code: i32,
    output: Vec<String>,
}

/// The commands of a console block.
fn commands(block: &Block, file: &str) -> Vec<Cmd> {
    let mut out: Vec<Cmd> = Vec::new();
    let mut i = 0;
    while i < block.body.len() {
        let line = &block.body[i];
        let at = block.first_line + i;
        let Some(first) = line.strip_prefix("$ ") else {
            panic!("{file}:{at}: a console block starts with a `$ ` command line: {line:?}");
        };
        let mut command = first.to_string();
        while command.ends_with('\\') {
            command.pop();
            i += 1;
            let next = block.body.get(i).unwrap_or_else(|| {
                panic!("{file}:{at}: the command goes on after `\\`, but the block ends")
            });
            command.push(' ');
            command.push_str(next.trim());
        }
        i += 1;
        let mut code = 0;
        if let Some(c) = block.body.get(i).and_then(|l| l.strip_prefix("? ")) {
            code = c
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("{file}:{}: `? CODE` needs a number", at + 1));
            i += 1;
        }
        let start = i;
        while i < block.body.len() && !block.body[i].starts_with("$ ") {
            i += 1;
        }
        out.push(Cmd {
            line: at,
            output_lines: (block.first_line - 1 + start, block.first_line - 1 + i),
            command: command.trim().to_string(),
            code,
            output: block.body[start..i].to_vec(),
        });
    }
    out
}

/// Whether `actual` is what `expected` shows: `...` lines match any lines, `[..]` any text
/// within a line; trailing blanks are not compared.
fn matches(expected: &[String], actual: &[&str]) -> bool {
    match expected.split_first() {
        None => actual.is_empty(),
        Some((e, rest)) if e.trim() == "..." => {
            (0..=actual.len()).any(|skip| matches(rest, &actual[skip..]))
        }
        Some((e, rest)) => match actual.split_first() {
            Some((a, arest)) => line_matches(e.trim_end(), a.trim_end()) && matches(rest, arest),
            None => false,
        },
    }
}

fn line_matches(expected: &str, actual: &str) -> bool {
    let parts: Vec<&str> = expected.split("[..]").collect();
    if parts.len() == 1 {
        return expected == actual;
    }
    let Some(mut rest) = actual.strip_prefix(parts[0]) else {
        return false;
    };
    let last = parts.len() - 1;
    for (k, part) in parts.iter().enumerate().skip(1) {
        if k == last {
            return rest.ends_with(part);
        }
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    unreachable!()
}

/// The sandbox of one file: a scratch directory with `examples/` and `golden/`, and for
/// root blocks a network namespace, /var/lib and a bpffs of its own (removed on drop).
struct Sandbox {
    dir: TempDir,
    netns: Option<String>,
    bpffs: Option<PathBuf>,
}

impl Sandbox {
    fn new(tag: &str) -> Sandbox {
        let dir = TempDir::new(tag);
        for d in ["examples", "golden"] {
            std::os::unix::fs::symlink(root().join(d), dir.path().join(d)).unwrap();
        }
        Sandbox {
            dir,
            netns: None,
            bpffs: None,
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The namespace and mounts root blocks run in, made on first use.
    fn node(&mut self) -> (String, PathBuf, PathBuf) {
        let varlib = self.path().join(".var-lib");
        let bpf = self.path().join(".bpffs");
        if self.netns.is_none() {
            let name = format!("svcdoc-{}-{}", std::process::id(), unique());
            sh_ok(&format!(
                "ip netns add {name} && ip -n {name} link set lo up"
            ));
            self.netns = Some(name);
            std::fs::create_dir_all(&varlib).unwrap();
            std::fs::create_dir_all(&bpf).unwrap();
            sh_ok(&format!("mount -t bpf bpf {}", bpf.display()));
            self.bpffs = Some(bpf.clone());
        }
        (self.netns.clone().unwrap(), varlib, bpf)
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if let Some(b) = &self.bpffs {
            let _ = Command::new("umount").arg(b).status();
        }
        if let Some(n) = &self.netns {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

fn unique() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

fn sh_ok(script: &str) {
    let st = Command::new("sh").args(["-c", script]).status().unwrap();
    assert!(st.success(), "`{script}` failed: {st}");
}

/// PATH with the built binary's directory first.
fn path_env() -> String {
    let bin = Path::new(env!("CARGO_BIN_EXE_svc-compile"));
    format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// Runs `script` with `sh -c` in `dir` (stderr into stdout, as a terminal shows them);
/// (exit code, output).
fn run_sh(prefix: &[&str], script: &str, dir: &Path) -> (i32, String) {
    let mut cmd = Command::new(prefix.first().copied().unwrap_or("sh"));
    if prefix.is_empty() {
        cmd.args(["-c", &format!("exec 2>&1\n{script}")]);
    } else {
        cmd.args(&prefix[1..]).arg(format!("exec 2>&1\n{script}"));
    }
    let out = cmd
        .current_dir(dir)
        .env("PATH", path_env())
        .env("NO_COLOR", "1")
        .env_remove("SVC_COMPILE_APPLY_TIMES")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.code().unwrap_or(-1), text)
}

/// A command whose parse is checked: `svc-compile …` without pipes or `&&`.
fn parse_checkable(command: &str) -> bool {
    command.starts_with("svc-compile ") && !command.contains('|') && !command.contains("&&")
}

#[test]
fn documented_commands_run_as_shown() {
    let update = std::env::var("SVC_DOCS_UPDATE").is_ok_and(|v| v == "1");
    // SAFETY: geteuid cannot fail.
    let is_root = unsafe { libc::geteuid() } == 0;
    let mut failures = String::new();
    let mut ran = 0;
    let mut skipped_root = 0;
    for file in doc_files() {
        let name = file.display().to_string();
        let text = std::fs::read_to_string(root().join(&file)).unwrap();
        let mut sandbox = Sandbox::new("docs");
        // (output line range, new output) of the commands to rewrite under SVC_DOCS_UPDATE.
        let mut rewrites: Vec<((usize, usize), Vec<String>)> = Vec::new();
        for block in blocks(&text) {
            let Some(mode) = console_mode(&block.info) else {
                continue;
            };
            let mode = match mode {
                Mode::Root if !is_root => {
                    skipped_root += 1;
                    Mode::Parse
                }
                m => m,
            };
            for cmd in commands(&block, &name) {
                ran += 1;
                let at = format!("{name}:{}", cmd.line);
                if mode == Mode::Parse {
                    if !parse_checkable(&cmd.command) {
                        if block.info.split_whitespace().nth(1) == Some("parse") {
                            let _ = writeln!(
                                failures,
                                "{at}: `{}`: a `console parse` block holds svc-compile commands only\n",
                                cmd.command
                            );
                        }
                        continue;
                    }
                    let (code, out) =
                        run_sh(&[], &format!("{} --help", cmd.command), sandbox.path());
                    if code != 0 {
                        let _ = writeln!(
                            failures,
                            "{at}: `{}` does not parse (with --help: exit {code})\n{out}",
                            cmd.command
                        );
                    }
                    continue;
                }
                let (code, out) = if mode == Mode::Root {
                    let (netns, varlib, bpf) = sandbox.node();
                    let setup = format!(
                        "mount --bind {} /var/lib && mount --bind {} /sys/fs/bpf || exit 99\n",
                        varlib.display(),
                        bpf.display()
                    );
                    run_sh(
                        &[
                            "ip",
                            "netns",
                            "exec",
                            &netns,
                            "unshare",
                            "--mount",
                            "--propagation",
                            "private",
                            "sh",
                            "-c",
                        ],
                        &format!("{setup}{}", cmd.command),
                        sandbox.path(),
                    )
                } else {
                    run_sh(&[], &cmd.command, sandbox.path())
                };
                // Blank lines at the end are not compared (a terminal does not show them).
                let actual: Vec<&str> = out.trim_end().lines().collect();
                let mut shown = cmd.output.clone();
                while shown.last().is_some_and(|l| l.trim().is_empty()) {
                    shown.pop();
                }
                if code != cmd.code || !matches(&shown, &actual) {
                    let _ = writeln!(
                        failures,
                        "{at}: `{}`\n--- shown (exit {})\n{}\n--- actual (exit {code})\n{}",
                        cmd.command,
                        cmd.code,
                        shown.join("\n"),
                        out.trim_end()
                    );
                    if code == cmd.code {
                        rewrites.push((
                            cmd.output_lines,
                            actual.iter().map(|l| l.trim_end().to_string()).collect(),
                        ));
                    }
                }
            }
        }
        if update && !rewrites.is_empty() {
            let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
            for ((from, to), new) in rewrites.into_iter().rev() {
                lines.splice(from..to, new);
            }
            std::fs::write(root().join(&file), lines.join("\n") + "\n").unwrap();
        }
    }
    if skipped_root > 0 {
        lab::skip(
            "docs::documented_commands_run_as_shown",
            &format!("needs root to run {skipped_root} `console root` block(s) (only their parse was checked)"),
        );
    }
    assert!(
        ran > 20,
        "only {ran} documented commands found: is the parser broken?"
    );
    assert!(
        failures.is_empty(),
        "documented commands that do not run as shown (SVC_DOCS_UPDATE=1 rewrites outputs):\n\n{failures}"
    );
}

#[test]
fn shell_blocks_hold_no_svc_compile_commands() {
    let mut bad = Vec::new();
    for file in doc_files() {
        let text = std::fs::read_to_string(root().join(&file)).unwrap();
        for block in blocks(&text) {
            let lang = block.info.split_whitespace().next().unwrap_or("");
            if !matches!(lang, "" | "sh" | "bash" | "shell") {
                continue;
            }
            for (i, line) in block.body.iter().enumerate() {
                let t = line.trim_start().trim_start_matches("$ ");
                if t.starts_with("svc-compile ") || t.starts_with("cargo run ") {
                    bad.push(format!(
                        "{}:{}: {line}",
                        file.display(),
                        block.first_line + i
                    ));
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "svc-compile commands outside ```console blocks (they would not be tested):\n{}",
        bad.join("\n")
    );
}

/// GitHub's anchor of a heading: lower case, backticks and punctuation other than `-` and
/// `_` dropped, spaces as `-`; repeated anchors get `-1`, `-2`, ….
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut in_code = false;
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("```") || t.starts_with("~~~") {
            in_code = !in_code;
            continue;
        }
        if in_code || !t.starts_with('#') {
            continue;
        }
        let title = t.trim_start_matches('#');
        if !title.starts_with(' ') {
            continue;
        }
        let base: String = title
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut a = base.clone();
        let mut n = 0;
        while seen.contains(&a) {
            n += 1;
            a = format!("{base}-{n}");
        }
        seen.insert(a);
    }
    seen
}

/// The inline links `[text](target)` of a Markdown text outside code blocks and code spans.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_code = false;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with("```") || t.starts_with("~~~") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        // Code spans never hold links.
        let mut plain = String::new();
        for (k, part) in line.split('`').enumerate() {
            if k % 2 == 0 {
                plain.push_str(part);
            }
        }
        let mut rest = plain.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push((i + 1, after[..end].to_string()));
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn relative_links_point_to_files_and_headings_that_exist() {
    let mut bad = Vec::new();
    let mut checked = 0;
    for file in doc_files() {
        let text = std::fs::read_to_string(root().join(&file)).unwrap();
        let dir = root().join(&file).parent().unwrap().to_path_buf();
        for (line, target) in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                root().join(&file)
            } else {
                dir.join(path)
            };
            let at = format!("{}:{line}: ({target})", file.display());
            if !resolved.exists() {
                bad.push(format!("{at}: no such file {}", resolved.display()));
                continue;
            }
            if let Some(anchor) = anchor {
                if resolved.extension().is_some_and(|e| e == "md") {
                    let heads = anchors(&std::fs::read_to_string(&resolved).unwrap());
                    if !heads.contains(anchor) {
                        bad.push(format!("{at}: no heading with anchor #{anchor}"));
                    }
                }
            }
        }
    }
    assert!(
        checked > 30,
        "only {checked} links found: is the parser broken?"
    );
    assert!(bad.is_empty(), "broken links:\n{}", bad.join("\n"));
}

/// CI (`.ci/run`) runs the README's test command: the command the README shows under
/// "Testing" is a line of `.ci/run`.
#[test]
fn the_readme_test_command_is_what_ci_runs() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let testing = &readme[readme
        .find("## Testing")
        .expect("README has a Testing section")..];
    let block = blocks(testing)
        .into_iter()
        .find(|b| b.info == "sh")
        .expect("README's Testing section shows its command in a ```sh block");
    let ci = std::fs::read_to_string(root().join(".ci/run")).unwrap();
    for command in block.body.iter().filter(|l| !l.trim().is_empty()) {
        assert!(
            ci.lines().any(|l| l.trim() == command.trim()),
            "README's test command `{command}` is not a line of .ci/run"
        );
    }
}

#[test]
fn the_matcher_takes_wildcards_and_nothing_else() {
    let e = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert!(matches(&e(&["a", "...", "d"]), &["a", "b", "c", "d"]));
    assert!(matches(&e(&["a", "...", "d"]), &["a", "d"]));
    assert!(!matches(&e(&["a", "...", "d"]), &["a", "b"]));
    assert!(matches(&e(&["x [..] z"]), &["x yyy z"]));
    assert!(!matches(&e(&["x [..] z"]), &["x yyy q"]));
    assert!(!matches(&e(&["a"]), &["a", "b"]));
    assert!(!matches(&e(&[]), &["a"]));
    assert!(matches(&e(&["..."]), &[]));
}
