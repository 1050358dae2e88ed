//! Golden snapshots. Adding a case is adding files:
//! - `golden/cases/NAME/*.yaml` (+ optional `args`: extra flags, one per line; default
//!   `--node node-a`) → snapshots of every target of the registry
//!   (`svc_targets::TARGETS`), `golden/snapshots/NAME.TARGET.snap`;
//! - `golden/errors/NAME.yaml` → the diagnostics exactly as `svc-compile check` prints
//!   them, with the exit code;
//! - `golden/migrate/NAME/args` → `svc-compile migrate`'s report and exit code.
//!
//! Every case is checked even when an earlier one fails; the test then fails once, naming
//! each failing case (insta has written a `.snap.new` for each mismatch).
//!
//! Review changes with `cargo insta review` (or `INSTA_UPDATE=always cargo test` and git diff).

use crate::support::{root, subdirs, svc};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

/// Runs every check, then fails once listing those that failed (a failing case must not
/// hide the ones after it).
/// A named check.
type Check<'a> = (String, Box<dyn FnOnce() + 'a>);

fn check_each<'a>(checks: impl IntoIterator<Item = Check<'a>>) {
    let failed: Vec<String> = checks
        .into_iter()
        .filter_map(|(name, check)| catch_unwind(AssertUnwindSafe(check)).err().map(|_| name))
        .collect();
    assert!(
        failed.is_empty(),
        "{} golden case(s) failed (see above):\n  {}",
        failed.len(),
        failed.join("\n  ")
    );
}

fn settings() -> insta::Settings {
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path(root().join("golden/snapshots"));
    s.set_prepend_module_to_snapshot(false);
    s.set_omit_expression(true);
    s
}

pub fn case_dirs() -> Vec<String> {
    subdirs(&root().join("golden/cases"))
}

/// Every case that has a `flows` file (the kernel tests' packets), with that file's text.
pub fn case_flows() -> Vec<(String, String)> {
    case_dirs()
        .into_iter()
        .filter_map(|case| {
            let text =
                std::fs::read_to_string(root().join("golden/cases").join(&case).join("flows"))
                    .ok()?;
            Some((case, text))
        })
        .collect()
}

/// The extra flags of a case (`args` file), default `--node node-a`.
pub fn case_args(case: &str) -> Vec<String> {
    match std::fs::read_to_string(root().join("golden/cases").join(case).join("args")) {
        Ok(t) => t
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .flat_map(|l| l.split_whitespace().map(String::from).collect::<Vec<_>>())
            .collect(),
        Err(_) => vec!["--node".into(), "node-a".into()],
    }
}

/// Flags a target cannot render without, added to every case's `args` for that target
/// (data: one line per such target). `template` renders every shipped example.
const TARGET_ARGS: &[(&str, &[&str])] = &[(
    "template",
    &[
        "--template",
        "examples/templates/blackbox-targets.json.j2",
        "--template",
        "examples/templates/coredns-hosts.j2",
        "--template",
        "examples/templates/etc-hosts.j2",
        "--template",
        "examples/templates/haproxy.cfg.j2",
        "--template",
        "examples/templates/userspace-iptables.rules.j2",
    ],
)];

/// Compile one case for one target through the CLI.
pub fn compile_case(case: &str, target: &str) -> String {
    compile_case_with(case, target, &[])
}

/// [`compile_case`] with more flags after the case's own (`--part`).
pub fn compile_case_with(case: &str, target: &str, extra: &[&str]) -> String {
    let dir = format!("golden/cases/{case}");
    let args = case_args(case);
    let mut a: Vec<&str> = vec![&dir, "--target", target];
    a.extend(args.iter().map(String::as_str));
    for (t, extra) in TARGET_ARGS {
        if *t == target {
            a.extend(extra.iter());
        }
    }
    a.extend(extra);
    let r = svc(&a, None, &root());
    r.expect(0);
    r.stdout
}

#[test]
fn golden_cases() {
    let s = settings();
    let cases = case_dirs();
    assert!(!cases.is_empty());
    check_each(cases.iter().flat_map(|case| {
        let s = &s;
        svc_targets::TARGETS.iter().map(move |t| {
            let name = format!("{case}.{}", t.name);
            let check = move || {
                let out = compile_case(case, t.name);
                s.bind(|| insta::assert_snapshot!(format!("{case}.{}", t.name), out));
            };
            (name, Box::new(check) as Box<dyn FnOnce() + '_>)
        })
    }));
}

/// A variant: its name, the one case it is limited to (`NAME@CASE`), target and flags.
type Variant = (String, Option<String>, String, Vec<String>);

/// `golden/variants` (`NAME[@CASE] TARGET FLAGS...` a line): every case (or only CASE)
/// compiled for TARGET with FLAGS added, into `CASE.TARGET.NAME.snap` (e.g. the nftables
/// targets' fast layout).
pub fn variants() -> Vec<Variant> {
    let text = std::fs::read_to_string(root().join("golden/variants")).unwrap();
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let mut w = l.split_whitespace().map(String::from);
            let name = w.next().unwrap();
            let (name, case) = match name.split_once('@') {
                Some((n, c)) => (n.to_string(), Some(c.to_string())),
                None => (name, None),
            };
            let target = w.next().expect("a variant names its target");
            (name, case, target, w.collect())
        })
        .collect()
}

#[test]
fn golden_variants() {
    let s = settings();
    let cases = case_dirs();
    let variants = variants();
    assert!(!variants.is_empty());
    for (name, only, ..) in &variants {
        if let Some(c) = only {
            assert!(cases.contains(c), "variant {name}: no golden case {c}");
        }
    }
    check_each(cases.iter().flat_map(|case| {
        let s = &s;
        let mine = variants
            .iter()
            .filter(move |(_, only, ..)| only.as_ref().is_none_or(|c| c == case));
        mine.map(move |(name, _, target, flags)| {
            let snap = format!("{case}.{target}.{name}");
            let check = {
                let snap = snap.clone();
                move || {
                    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
                    let out = compile_case_with(case, target, &flags);
                    s.bind(|| insta::assert_snapshot!(snap, out));
                }
            };
            (snap, Box::new(check) as Box<dyn FnOnce() + '_>)
        })
    }));
}

#[test]
fn golden_examples() {
    let s = settings();
    let r = svc(
        &["examples/", "--target", "ir", "--node", "node-a"],
        None,
        &root(),
    );
    r.expect(0);
    s.bind(|| insta::assert_snapshot!("examples.ir", r.stdout));
}

#[test]
fn golden_errors() {
    let s = settings();
    let dir = root().join("golden/errors");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") || n.ends_with(".yml") || n.ends_with(".json"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    check_each(files.into_iter().map(|f| {
        let s = &s;
        let name = format!("errors/{f}");
        let check = move || check_error(s, &f);
        (name, Box::new(check) as Box<dyn FnOnce() + '_>)
    }));
}

fn check_error(s: &insta::Settings, f: &str) {
    let rel = format!("golden/errors/{f}");
    let r = svc(&["check", &rel], None, &root());
    assert!(
        r.code == 0 || r.code == 1,
        "`{}` exited {}: {}",
        r.cmdline,
        r.code,
        r.stderr
    );
    let stem = Path::new(f)
        .file_stem()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let text = format!("exit code: {}\n{}", r.code, r.stdout);
    s.bind(|| insta::assert_snapshot!(format!("errors.{stem}"), text));
}

/// `golden/errors/targets/NAME.yaml`: inputs that check clean but exceed a target's
/// limits (the ebpf maps' sizes). The first line is `# expect: SVCnnn`, the second
/// `# args: FLAGS...` (the target, more files, `--node`); the file is compiled with them
/// and the exit code and diagnostics (stderr) are snapshotted as
/// `errors.targets.NAME.snap`.
#[test]
fn golden_target_errors() {
    let s = settings();
    let dir = root().join("golden/errors/targets");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    check_each(files.into_iter().map(|f| {
        let s = &s;
        let name = format!("errors/targets/{f}");
        let check = move || {
            let rel = format!("golden/errors/targets/{f}");
            let text = std::fs::read_to_string(root().join(&rel)).unwrap();
            let mut lines = text.lines();
            let expect = lines
                .next()
                .and_then(|l| l.strip_prefix("# expect:"))
                .unwrap_or_else(|| panic!("{rel}: first line must be `# expect: SVCnnn`"))
                .trim()
                .to_string();
            let args: Vec<&str> = lines
                .next()
                .and_then(|l| l.strip_prefix("# args:"))
                .unwrap_or_else(|| panic!("{rel}: second line must be `# args: FLAGS`"))
                .split_whitespace()
                .collect();
            let mut a = vec![rel.as_str()];
            a.extend(args);
            let r = svc(&a, None, &root());
            assert_eq!(r.code, 1, "`{}`: {}", r.cmdline, r.stderr);
            assert!(
                r.stderr.contains(&format!("[{expect}]")),
                "{rel}: no {expect} in {}",
                r.stderr
            );
            let stem = f.trim_end_matches(".yaml");
            let out = format!("exit code: {}\n{}", r.code, r.stderr);
            s.bind(|| insta::assert_snapshot!(format!("errors.targets.{stem}"), out));
        };
        (name, Box::new(check) as Box<dyn FnOnce() + '_>)
    }));
}

/// `golden/trace/CASE.flows` (one `FROM TO [PROTO]` per line) → `svc-compile trace` of
/// each packet through golden case CASE, with the iptables, nftables and ipvs rules:
/// `golden/snapshots/trace.CASE.TARGET.snap`.
#[test]
fn golden_traces() {
    let s = settings();
    let dir = root().join("golden/trace");
    let mut cases: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.strip_suffix(".flows").map(str::to_string)
        })
        .collect();
    cases.sort();
    assert!(!cases.is_empty());
    check_each(cases.iter().flat_map(|case| {
        let s = &s;
        ["iptables", "nftables", "ipvs"]
            .into_iter()
            .map(move |target| {
                let name = format!("trace.{case}.{target}");
                let check = move || {
                    let dir = format!("golden/cases/{case}");
                    let flows = format!("golden/trace/{case}.flows");
                    let args = case_args(case);
                    let mut a: Vec<&str> = vec!["trace", &dir];
                    a.extend(args.iter().map(String::as_str));
                    a.extend(["--target", target, "--flows", &flows]);
                    let r = svc(&a, None, &root());
                    r.expect(0);
                    s.bind(|| insta::assert_snapshot!(format!("trace.{case}.{target}"), r.stdout));
                };
                (name, Box::new(check) as Box<dyn FnOnce() + '_>)
            })
    }));
}

/// `golden/migrate/CASE/args` (the arguments after `svc-compile migrate`, inputs under
/// `golden/migrate/inputs/` or `golden/cases/`) → the exit code and the report:
/// `golden/snapshots/migrate.CASE.snap`. Adding a case is adding a directory with `args`.
#[test]
fn golden_migrations() {
    let s = settings();
    let dir = root().join("golden/migrate");
    let cases: Vec<String> = subdirs(&dir)
        .into_iter()
        .filter(|c| dir.join(c).join("args").exists())
        .collect();
    assert!(cases.len() >= 2, "{cases:?}");
    check_each(cases.iter().map(|case| {
        let s = &s;
        let name = format!("migrate.{case}");
        let check = move || {
            let text =
                std::fs::read_to_string(root().join("golden/migrate").join(case).join("args"))
                    .expect("args");
            let mut a = vec!["migrate"];
            a.extend(
                text.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .flat_map(str::split_whitespace),
            );
            let r = svc(&a, None, &root());
            assert!(
                r.code == 0 || r.code == 1,
                "`{}` exited {}: {}",
                r.cmdline,
                r.code,
                r.stderr
            );
            // Exit 1 exactly when some node view differs.
            let differs = r
                .stdout
                .lines()
                .any(|l| l.contains("flows compared") && !l.contains("no difference in"));
            assert_eq!(
                r.code,
                i32::from(differs),
                "{case}: exit code and report disagree"
            );
            let out = format!("exit code: {}\n{}", r.code, r.stdout);
            s.bind(|| insta::assert_snapshot!(format!("migrate.{case}"), out));
        };
        (name, Box::new(check) as Box<dyn FnOnce() + '_>)
    }));
}
