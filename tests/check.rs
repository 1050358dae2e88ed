//! `check` over repositories as they are (issue 16): files that are not manifests,
//! encodings, symlinks, `--exclude`/`--include`, and the `golden/real-world/` sets, which
//! must check clean.

use crate::support::{root, subdirs, svc, TempDir};
use std::path::Path;

const SVC: &str = "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  selector: {app: web}\n  ports:\n  - port: 80\n";

fn write(dir: &Path, rel: &str, bytes: impl AsRef<[u8]>) {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, bytes).unwrap();
}

#[test]
fn real_world_repositories_check_clean() {
    let sets = subdirs(&root().join("golden/real-world"));
    assert!(sets.len() >= 3, "{sets:?}");
    for set in sets {
        let dir = format!("golden/real-world/{set}");
        let r = svc(&["check", &dir], None, &root());
        r.expect(0);
        assert!(!r.stdout.contains("error["), "{}", r.stdout);
        assert!(!r.stdout.contains("warning["), "{}", r.stdout);
        // And each compiles: every Service gets its rules.
        svc(
            &[
                &dir,
                "--target",
                "iptables",
                "--node-ip",
                "192.168.0.10",
                "--node",
                "n",
            ],
            None,
            &root(),
        )
        .expect(0);
    }
}

#[test]
fn invalid_utf8_is_located_and_the_other_files_are_checked() {
    let t = TempDir::new("utf8");
    write(
        t.path(),
        "a-bad.yaml",
        b"apiVersion: v1\nkind: Service\nmetadata: {name: caf\xe9}\n",
    );
    write(
        t.path(),
        "b-good.yaml",
        SVC.replace("port: 80", "port: 80\n    protocol: tcp"),
    );
    let r = svc(&["check", t.path().to_str().unwrap()], None, &root());
    r.expect(1);
    let bad = format!("{}:3:21", t.path().join("a-bad.yaml").display());
    assert!(
        r.stdout.contains("error[SVC015]: invalid UTF-8"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains(&bad), "wanted {bad} in\n{}", r.stdout);
    assert!(r.stdout.contains("error[SVC112]"), "{}", r.stdout);
}

#[test]
fn utf16_with_a_byte_order_mark_is_read() {
    let t = TempDir::new("utf16");
    let mut le = vec![0xFF, 0xFE];
    le.extend(SVC.encode_utf16().flat_map(u16::to_le_bytes));
    write(t.path(), "svc.yaml", le);
    let r = svc(&["check", t.path().to_str().unwrap()], None, &root());
    r.expect(0);
    // Without the mark the bytes are not UTF-8: located error, exit 1.
    let raw: Vec<u8> = SVC.encode_utf16().flat_map(u16::to_be_bytes).collect();
    write(t.path(), "svc.yaml", raw);
    let r = svc(&["check", t.path().to_str().unwrap()], None, &root());
    r.expect(1);
    assert!(r.stdout.contains("error[SVC"), "{}", r.stdout);
}

#[test]
fn a_symlink_loop_is_walked_once() {
    let t = TempDir::new("loop");
    write(t.path(), "app/svc.yaml", SVC);
    std::os::unix::fs::symlink("..", t.path().join("app/up")).unwrap();
    std::os::unix::fs::symlink("svc.yaml", t.path().join("app/same.yaml")).unwrap();
    let r = svc(&["check", t.path().to_str().unwrap()], None, &root());
    r.expect(0);
    assert!(r.stdout.contains("ok: 1 file(s) checked"), "{}", r.stdout);
}

#[test]
fn helm_charts_need_exclude_or_include() {
    let t = TempDir::new("helm");
    let chart = t.path().join("chart");
    write(
        &chart,
        "Chart.yaml",
        "apiVersion: v2\nname: web\nversion: 0.1.0\n",
    );
    write(
        &chart,
        "values.yaml",
        "replicaCount: 2\nservice:\n  port: 80\n",
    );
    write(
        &chart,
        "templates/service.yaml",
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {{ include \"web.fullname\" . }}\nspec:\n  ports:\n  - port: {{ .Values.service.port }}\n",
    );
    write(t.path(), "rendered/web.yaml", SVC);
    let dir = t.path().to_str().unwrap();
    // The template is not a manifest yet: errors, and a note saying why.
    let r = svc(&["check", dir], None, &root());
    r.expect(1);
    assert!(
        r.stdout
            .contains("note[SVC014]: this file looks like an unrendered Helm template"),
        "{}",
        r.stdout
    );
    // Chart.yaml and values.yaml are skipped with a note, never an error.
    assert_eq!(r.stdout.matches("note[SVC012]").count(), 2, "{}", r.stdout);
    let r = svc(&["check", dir, "--exclude", "templates/**"], None, &root());
    r.expect(0);
    assert!(r.stdout.contains("ok: 3 file(s) checked"), "{}", r.stdout);
    let r = svc(
        &["check", dir, "--exclude", "chart", "--include", "*.yaml"],
        None,
        &root(),
    );
    r.expect(0);
    assert!(r.stdout.contains("ok: 1 file(s) checked"), "{}", r.stdout);
    let r = svc(&["check", dir, "--include", "**/Chart.yaml"], None, &root());
    r.expect(0);
    assert!(r.stdout.contains("ok: 1 file(s) checked"), "{}", r.stdout);
    // As a pre-commit hook runs it: changed files named one by one.
    let template = chart.join("templates/service.yaml");
    let values = chart.join("values.yaml");
    let files = [template.to_str().unwrap(), values.to_str().unwrap()];
    let r = svc(
        &["check", files[0], files[1], "--exclude", "templates/**"],
        None,
        &root(),
    );
    r.expect(0);
    assert!(r.stdout.contains("ok: 1 file(s) checked"), "{}", r.stdout);
    let r = svc(
        &["check", files[0], files[1], "--include", "templates/*"],
        None,
        &root(),
    );
    r.expect(1);
}

/// `kubectl get svc -A -o yaml` of a k3s cluster (service range 10.43.0.0/16).
const K3S_DUMP: &str = "apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: kubernetes, namespace: default}
  spec:
    clusterIP: 10.43.0.1
    clusterIPs: [10.43.0.1]
    ipFamilies: [IPv4]
    ipFamilyPolicy: SingleStack
    ports: [{name: https, port: 443, protocol: TCP, targetPort: 6443}]
    type: ClusterIP
- apiVersion: v1
  kind: Service
  metadata: {name: kube-dns, namespace: kube-system}
  spec:
    clusterIP: 10.43.0.10
    clusterIPs: [10.43.0.10]
    ipFamilies: [IPv4]
    ipFamilyPolicy: SingleStack
    ports: [{name: dns, port: 53, protocol: UDP, targetPort: 53}]
    selector: {k8s-app: kube-dns}
- apiVersion: v1
  kind: Service
  metadata: {name: traefik, namespace: kube-system}
  spec:
    clusterIP: 10.43.171.9
    clusterIPs: [10.43.171.9]
    ipFamilies: [IPv4]
    ipFamilyPolicy: SingleStack
    ports: [{name: web, port: 80, protocol: TCP, targetPort: web}]
    selector: {app.kubernetes.io/name: traefik}
";

#[test]
fn no_allocate_infers_the_range_from_the_dump() {
    let t = TempDir::new("dump");
    write(t.path(), "dump.yaml", K3S_DUMP);
    let f = t.path().join("dump.yaml");
    let f = f.to_str().unwrap();
    let r = svc(&["check", f, "--no-allocate"], None, &root());
    r.expect(0);
    assert!(
        r.stdout
            .contains("note[SVC016]: no service range was given: using 10.43.0.0/16"),
        "{}",
        r.stdout
    );
    // A given range wins, and is checked.
    let r = svc(
        &[
            "check",
            f,
            "--no-allocate",
            "--service-cluster-ip-range",
            "10.96.0.0/12",
        ],
        None,
        &root(),
    );
    r.expect(1);
    assert_eq!(r.stdout.matches("error[SVC119]").count(), 3, "{}", r.stdout);
    // Allocating (manifests, not a dump): the default range applies.
    svc(&["check", f], None, &root()).expect(1);
    // A ServiceCIDR object in the dump names the range.
    let with_cidr = format!(
        "{K3S_DUMP}- apiVersion: networking.k8s.io/v1\n  kind: ServiceCIDR\n  metadata: {{name: kubernetes}}\n  spec: {{cidrs: [10.43.0.0/16]}}\n"
    );
    write(t.path(), "dump.yaml", with_cidr);
    let r = svc(&["check", f, "--no-allocate"], None, &root());
    r.expect(0);
    assert!(
        r.stdout
            .contains("using 10.43.0.0/16, inferred from the ServiceCIDR objects"),
        "{}",
        r.stdout
    );
}

#[test]
fn kustomize_patches_are_not_read_as_objects() {
    let t = TempDir::new("kpatch");
    write(t.path(), "base/svc.yaml", SVC);
    write(
        t.path(),
        "prod/lb.yaml",
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  type: LoadBalancer\n",
    );
    let dir = t.path().to_str().unwrap();
    // Read as an object, the partial Service has no ports and repeats `web`.
    let r = svc(&["check", dir], None, &root());
    r.expect(1);
    assert!(r.stdout.contains("error[SVC106]"), "{}", r.stdout);
    write(
        t.path(),
        "prod/kustomization.yaml",
        "resources: [../base]\npatchesStrategicMerge: [lb.yaml]\n",
    );
    let r = svc(&["check", dir], None, &root());
    r.expect(0);
    assert!(r.stdout.contains("note[SVC017]"), "{}", r.stdout);
    // The patch is skipped, not checked: the Service and the kustomization (a non-object,
    // read and skipped with its note) are.
    assert!(r.stdout.contains("ok: 2 file(s) checked"), "{}", r.stdout);
}

#[test]
fn the_lock_file_is_not_counted_as_checked() {
    let t = TempDir::new("lockcount");
    write(t.path(), "m/svc.yaml", SVC);
    let dir = t.path().join("m");
    let lock = t.path().join("lock.yaml");
    let (dir, lock) = (dir.to_str().unwrap(), lock.to_str().unwrap());
    let r = svc(
        &["check", dir, "--lock", lock, "--write-lock"],
        None,
        &root(),
    );
    r.expect(0);
    assert!(std::fs::metadata(lock).is_ok(), "no lock written");
    // Now the lock exists and is read, but it is not an input.
    let r = svc(&["check", dir, "--lock", lock], None, &root());
    r.expect(0);
    assert!(r.stdout.contains("ok: 1 file(s) checked"), "{}", r.stdout);
}

#[test]
fn template_note_only_where_a_marker_explains_an_error() {
    let t = TempDir::new("tmpl");
    write(
        t.path(),
        "envsubst.yaml",
        SVC.replace("name: web", "name: ${APP_NAME}"),
    );
    // A dashboard's `{{instance}}` is a valid value; the error is elsewhere.
    write(
        t.path(),
        "dashboard.yaml",
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: dash}}\ndata:\n  legend: \"{{{{instance}}}}\"\n---\n{}",
            SVC.replace("port: 80", "port: 80\n    protocol: tcp")
        ),
    );
    let r = svc(&["check", t.path().to_str().unwrap()], None, &root());
    r.expect(1);
    assert_eq!(r.stdout.matches("note[SVC014]").count(), 1, "{}", r.stdout);
    let at = format!("{}:4:9", t.path().join("envsubst.yaml").display());
    assert!(
        r.stdout.contains("unrendered envsubst template") && r.stdout.contains(&at),
        "wanted the note at {at}:\n{}",
        r.stdout
    );
}

#[test]
fn no_allocate_widens_the_node_port_range_to_the_dump() {
    let t = TempDir::new("npdump");
    let dump = format!(
        "{K3S_DUMP}- apiVersion: v1\n  kind: Service\n  metadata: {{name: ingress, namespace: default}}\n  spec:\n    type: NodePort\n    clusterIP: 10.43.9.9\n    ports: [{{port: 80, nodePort: 20080, protocol: TCP, targetPort: 80}}]\n"
    );
    write(t.path(), "dump.yaml", dump);
    let f = t.path().join("dump.yaml");
    let f = f.to_str().unwrap();
    let r = svc(&["check", f, "--no-allocate"], None, &root());
    r.expect(0);
    assert!(r.stdout.contains("using 20080-32767"), "{}", r.stdout);
    // A given range is checked as given.
    let r = svc(
        &[
            "check",
            f,
            "--no-allocate",
            "--service-node-port-range",
            "30000-32767",
        ],
        None,
        &root(),
    );
    r.expect(1);
    assert!(r.stdout.contains("error[SVC116]"), "{}", r.stdout);
}

#[test]
fn check_help_shows_the_filters_and_the_default_range() {
    let r = svc(&["check", "--help"], None, &root());
    r.expect(0);
    for want in [
        "--exclude <GLOB>",
        "--include <GLOB>",
        "10.96.0.0/12, kubeadm's",
        "10.0.0.0/24",
    ] {
        assert!(r.stdout.contains(want), "no {want} in\n{}", r.stdout);
    }
}

#[test]
fn exclude_and_include_repeat() {
    // clap's args_override_self must not make the last --exclude/--include win.
    let t = TempDir::new("repeat");
    for d in ["a", "b", "c"] {
        write(t.path(), &format!("{d}/svc.yaml"), SVC.replace("web", d));
    }
    let dir = t.path().to_str().unwrap();
    let r = svc(
        &["check", dir, "--exclude", "a", "--exclude", "b"],
        None,
        &root(),
    );
    r.expect(0);
    assert!(r.stdout.contains("ok: 1 file(s) checked"), "{}", r.stdout);
    let r = svc(
        &["check", dir, "--include", "a/*", "--include", "c/*"],
        None,
        &root(),
    );
    r.expect(0);
    assert!(r.stdout.contains("ok: 2 file(s) checked"), "{}", r.stdout);
}

/// A check that reads nothing fails (exit 2, one line): an exclude or a path that leaves
/// no manifest is a broken pipeline, not a clean repository.
#[test]
fn a_check_that_reads_nothing_fails() {
    let dir = TempDir::new("check-nothing");
    write(dir.path(), "svc.yaml", "apiVersion: v1\nkind: Service\n");
    let d = dir.path().to_str().unwrap();
    let r = svc(&["check", d, "--exclude", "*.yaml"], None, &root());
    r.expect(2);
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    assert!(r.stderr.contains("nothing to check"), "{}", r.stderr);
    assert!(!r.stdout.contains("ok:"), "{}", r.stdout);
    let empty = TempDir::new("check-empty");
    svc(&["check", empty.path().to_str().unwrap()], None, &root()).expect(2);
}

/// What kubectl and the API server take checks clean: `metadata.namespace: ""` is an unset
/// namespace (kubectl fills in its context's), and the API's own typed list
/// (`kubectl get --raw /api/v1/services`) leaves `apiVersion` and `kind` out of its items.
#[test]
fn an_empty_namespace_and_a_raw_service_list_check_clean() {
    let t = TempDir::new("check-raw");
    write(
        t.path(),
        "ns.yaml",
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: \"\"\nspec:\n  clusterIP: 10.96.0.10\n  ports:\n  - port: 80\n",
    );
    write(
        t.path(),
        "raw.json",
        r#"{"kind":"ServiceList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[{"metadata":{"name":"api","namespace":"shop"},"spec":{"clusterIP":"10.96.0.11","ports":[{"port":80}]}}]}"#,
    );
    let d = t.path().to_str().unwrap();
    let r = svc(&["check", d], None, &root());
    r.expect(0);
    assert!(
        r.stdout.contains("ok: 2 file(s) checked, 0 warning(s)"),
        "{}",
        r.stdout
    );
    // Both are read: the empty namespace as `default`, the item as a Service.
    let zone = svc(&[d, "--target", "dns"], None, &root());
    zone.expect(0);
    for name in [
        "web.default.svc.cluster.local.",
        "api.shop.svc.cluster.local.",
    ] {
        assert!(zone.stdout.contains(name), "{name}\n{}", zone.stdout);
    }
}

/// Unknown fields follow kubectl's `--validate`: strict (the default) refuses them as the
/// API server does, warn keeps a warning, ignore says nothing; "did you mean" either way.
#[test]
fn unknown_fields_follow_validate() {
    let t = TempDir::new("check-validate");
    write(
        t.path(),
        "svc.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  selctor: {app: web}\n  clusterIP: 10.96.0.10\n  ports:\n  - port: 80\n",
    );
    let d = t.path().to_str().unwrap();
    let strict = svc(&["check", d], None, &root());
    strict.expect(1);
    assert!(
        strict
            .stdout
            .contains("error[SVC003]: unknown field `selctor`")
            && strict.stdout.contains("did you mean `selector`?"),
        "{}",
        strict.stdout
    );
    let warn = svc(&["check", d, "--validate", "warn"], None, &root());
    warn.expect(0);
    assert!(warn.stdout.contains("warning[SVC003]"), "{}", warn.stdout);
    let ignore = svc(&["check", d, "--validate", "ignore"], None, &root());
    ignore.expect(0);
    assert!(!ignore.stdout.contains("SVC003"), "{}", ignore.stdout);
}

/// A pre-commit hook passes a changed kustomize patch alone: the kustomization that names
/// it, in its directory or above (up to the repository's root), makes it a patch, skipped
/// with a note, not an object "without ports" (and a check of only patches passes).
#[test]
fn a_patch_passed_alone_is_known_by_the_kustomization_above_it() {
    let t = TempDir::new("check-patch");
    std::fs::create_dir_all(t.path().join(".git")).unwrap();
    write(
        t.path(),
        "overlay/kustomization.yaml",
        "resources:\n- ../base\npatches:\n- path: patches/svc.yaml\n",
    );
    write(
        t.path(),
        "overlay/patches/svc.yaml",
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  type: NodePort\n",
    );
    let patch = t.path().join("overlay/patches/svc.yaml");
    let r = svc(&["check", patch.to_str().unwrap()], None, &root());
    r.expect(0);
    assert!(r.stdout.contains("note[SVC017]"), "{}", r.stdout);
    assert!(!r.stdout.contains("error"), "{}", r.stdout);
}
