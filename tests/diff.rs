//! `svc-compile diff`. Adding a case is adding files: `golden/diff/NAME/{old,new}/`
//! (manifests) + optional `args` (extra flags, one or more per line, `#` comments) →
//! `golden/snapshots/diff.NAME.{text,json,markdown}.snap`, each with the exit code.
//! Runs in the case's directory, so the report names `old` and `new`, never a machine's
//! paths. Then: `git:REV:PATH` against a repository the test makes, and the exit codes.

use crate::support::{root, subdirs, svc, TempDir};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::process::Command;

const FORMATS: &[&str] = &["text", "json", "markdown"];

fn case_args(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("args"))
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .flat_map(|l| l.split_whitespace().map(String::from).collect::<Vec<_>>())
        .collect()
}

fn diff_in(
    dir: &Path,
    old: &str,
    new: &str,
    extra: &[String],
    format: &str,
) -> crate::support::Run {
    let mut args: Vec<&str> = vec!["diff", old, new, "--format", format];
    args.extend(extra.iter().map(String::as_str));
    svc(&args, None, dir)
}

#[test]
fn golden_diff_cases() {
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path(root().join("golden/snapshots"));
    s.set_prepend_module_to_snapshot(false);
    s.set_omit_expression(true);
    let cases = subdirs(&root().join("golden/diff"));
    assert!(cases.len() >= 3, "{cases:?}");
    // Every case and format is checked even when an earlier one fails.
    let mut failed = Vec::new();
    for case in &cases {
        let dir = root().join("golden/diff").join(case);
        let extra = case_args(&dir);
        for format in FORMATS {
            let r = diff_in(&dir, "old", "new", &extra, format);
            let ok = catch_unwind(AssertUnwindSafe(|| {
                assert!(r.code == 0 || r.code == 1, "{}: {}", r.cmdline, r.stderr);
                assert_eq!(r.stderr, "", "{}", r.cmdline);
                let text = format!("exit {}\n{}", r.code, r.stdout);
                s.bind(|| insta::assert_snapshot!(format!("diff.{case}.{format}"), text));
            }));
            if ok.is_err() {
                failed.push(format!("{case} ({format})"));
            }
        }
    }
    assert!(failed.is_empty(), "diff cases failed: {failed:?}");
}

/// A revision against itself is no change (exit 0), in every format; and the report does
/// not depend on which side the files come from in what order.
#[test]
fn same_revision_is_no_change() {
    for case in subdirs(&root().join("golden/diff")) {
        let dir = root().join("golden/diff").join(&case);
        let extra = case_args(&dir);
        for side in ["old", "new"] {
            let r = diff_in(&dir, side, side, &extra, "text");
            r.expect(0);
            assert_eq!(r.stdout, "no changes\n");
            let r = diff_in(&dir, side, side, &extra, "json");
            r.expect(0);
            let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
            assert_eq!(v["servicesChanged"], serde_json::json!([]));
        }
    }
}

fn git(repo: &Path, args: &[&str]) {
    let out = Command::new("git")
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .current_dir(repo)
        .output()
        .expect("run git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// `git:REV:PATH` reads a directory (and a single file) at a revision without checking it
/// out, and gives the same report as the same trees on disk.
#[test]
fn git_revisions() {
    let case = root().join("golden/diff/services");
    let tmp = TempDir::new("diff-git");
    let repo = tmp.path();
    git(repo, &["init", "-q"]);
    copy_dir(&case.join("old"), &repo.join("m"));
    // Not a manifest: must not be read (it would be a parse error).
    std::fs::write(repo.join("m/README.md"), "# not yaml: [\n").unwrap();
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-q", "-m", "old"]);
    std::fs::remove_dir_all(repo.join("m")).unwrap();
    copy_dir(&case.join("new"), &repo.join("m"));
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-q", "-m", "new"]);
    // The work tree now holds something else: only the revisions count.
    std::fs::remove_dir_all(repo.join("m")).unwrap();

    let extra = case_args(&case);
    let on_disk = diff_in(&case, "old", "new", &extra, "markdown");
    on_disk.expect(1);
    let from_git = diff_in(repo, "git:HEAD~1:m", "git:HEAD:m", &extra, "markdown");
    from_git.expect(1);
    assert_eq!(from_git.stdout, on_disk.stdout);

    // Single files: the services file at both revisions, nodes from neither (so no --node).
    let files = diff_in(
        repo,
        "git:HEAD~1:m/services.yaml",
        "git:HEAD:m/services.yaml",
        &[],
        "text",
    );
    files.expect(1);
    assert!(
        files.stdout.contains("+ service shop/cart\n"),
        "{}",
        files.stdout
    );
    assert!(!files.stdout.contains("node "), "{}", files.stdout);
    diff_in(repo, "git:HEAD:m", "git:HEAD:m", &[], "text").expect(0);

    // An unknown revision or path is exit 2, with git's word for it.
    let r = diff_in(repo, "git:no-such-rev:m", "git:HEAD:m", &[], "text");
    r.expect(2);
    assert!(r.stderr.contains("git ls-tree"), "{}", r.stderr);
    let r = diff_in(repo, "git:HEAD:nothing-here", "git:HEAD:m", &[], "text");
    r.expect(2);
    assert!(r.stderr.contains("no such path at HEAD"), "{}", r.stderr);
    let r = diff_in(repo, "git:HEAD", "git:HEAD:m", &[], "text");
    r.expect(2);
    assert!(r.stderr.contains("use git:REV:PATH"), "{}", r.stderr);
}

/// Exit codes: input errors in either revision are 2 (1 means "changes"), with the
/// diagnostics printed; so are usage mistakes.
#[test]
fn exit_codes() {
    let tmp = TempDir::new("diff-exit");
    let case = root().join("golden/diff/services");
    let bad = tmp.path().join("bad");
    copy_dir(&case.join("new"), &bad);
    std::fs::write(
        bad.join("broken.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata: {name: x, namespace: y}\nspec:\n  ports:\n  - {port: 99999}\n",
    )
    .unwrap();
    let old = case.join("old");
    let (old, bad) = (old.to_str().unwrap(), bad.to_str().unwrap());
    for (a, b) in [(old, bad), (bad, old)] {
        let r = diff_in(tmp.path(), a, b, &[], "text");
        r.expect(2);
        assert!(r.stderr.contains("has errors:"), "{}", r.stderr);
        assert!(r.stderr.contains("error["), "{}", r.stderr);
        assert_eq!(r.stdout, "");
    }
    let r = diff_in(tmp.path(), old, old, &["--rules".into()], "text");
    r.expect(2);
    assert!(r.stderr.contains("--rules needs --node"), "{}", r.stderr);
    let args = [
        "--rules".into(),
        "--node".into(),
        "node-1".into(),
        "--target".into(),
        "dns".into(),
    ];
    let r = diff_in(tmp.path(), old, old, &args, "text");
    r.expect(2);
    assert!(
        r.stderr
            .contains("does not take --target dns: use iptables"),
        "{}",
        r.stderr
    );
    let r = diff_in(
        tmp.path(),
        old,
        old,
        &["--node".into(), "nowhere".into()],
        "text",
    );
    r.expect(2);
    assert!(r.stderr.contains("--node nowhere"), "{}", r.stderr);
    let r = diff_in(tmp.path(), old, "/no/such/dir", &[], "text");
    r.expect(2);
}
