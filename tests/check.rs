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
fn helm_chart_templates_are_skipped_with_a_note() {
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
    // The template is not a manifest yet (what Helm renders of it is): not read, a note
    // saying so, never an error.
    let r = svc(&["check", dir, "--verbose"], None, &root());
    r.expect(0);
    assert!(
        r.stdout
            .contains("note[SVC024]: skipped a Helm chart's template (chart "),
        "{}",
        r.stdout
    );
    assert!(!r.stdout.contains("SVC001"), "{}", r.stdout);
    // Chart.yaml and values.yaml are skipped with a note, never an error.
    assert_eq!(r.stdout.matches("note[SVC012]").count(), 2, "{}", r.stdout);
    assert!(r.stdout.contains("ok: 3 file(s) checked"), "{}", r.stdout);
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
    // As a pre-commit hook runs it: changed files named one by one; the template alone
    // is judged (skipped), not "nothing to check".
    let template = chart.join("templates/service.yaml");
    let r = svc(&["check", template.to_str().unwrap()], None, &root());
    r.expect(0);
    assert!(r.stdout.contains("note[SVC024]"), "{}", r.stdout);
    // A `templates/` directory whose chart is not beside it: `{{` marks a template.
    write(
        t.path(),
        "loose/templates/svc.yaml",
        "{{- if .Values.on }}\n",
    );
    let loose = t.path().join("loose/templates/svc.yaml");
    let r = svc(&["check", loose.to_str().unwrap()], None, &root());
    r.expect(0);
    assert!(
        r.stdout
            .contains("note[SVC024]: skipped a Helm chart's template:"),
        "{}",
        r.stdout
    );
}

/// A Service with a written cluster IP, for the clash checks.
const PINNED: &str = "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  clusterIP: 10.96.0.10\n  selector: {app: web}\n  ports:\n  - port: 80\n";

#[test]
fn a_repository_is_not_one_cluster() {
    let t = TempDir::new("clusters");
    let dir = t.path().to_str().unwrap();
    // Install variants side by side, as argo-cd ships them: each file is applied alone
    // (`kubectl apply -f install.yaml`), so they define `web` once each.
    write(t.path(), "install.yaml", PINNED);
    write(t.path(), "namespace-install.yaml", PINNED);
    write(t.path(), "ha/install.yaml", PINNED);
    let r = svc(&["check", dir], None, &root());
    r.expect(0);
    // `compile` reads its inputs as one cluster: there they clash.
    let r = svc(
        &[
            dir,
            "--target",
            "iptables",
            "--node-ip",
            "192.168.0.10",
            "--node",
            "n",
        ],
        None,
        &root(),
    );
    r.expect(1);
    assert!(
        r.stderr
            .contains("error[SVC301]: duplicate Service `default/web`"),
        "{}",
        r.stderr
    );
    // The config file says which files are one cluster: then they clash in check too.
    write(
        t.path(),
        ".svc-compile.yaml",
        "clusters:\n  one: [\"ha/*.yaml\", namespace-install.yaml]\n",
    );
    let r = svc(&["check", "."], None, t.path());
    r.expect(1);
    assert!(
        r.stdout
            .contains("error[SVC301]: duplicate Service `default/web` in cluster `one`"),
        "{}",
        r.stdout
    );
    // `install.yaml` is not in it, and alone.
    assert_eq!(r.stdout.matches("error[SVC301]").count(), 1, "{}", r.stdout);
    assert!(r.stdout.contains("error[SVC303]"), "{}", r.stdout);
}

#[test]
fn kustomize_names_decide_what_clashes() {
    let t = TempDir::new("kustomize-clusters");
    let dir = t.path().to_str().unwrap();
    write(
        t.path(),
        "base/kustomization.yaml",
        "resources: [web.yaml]\n",
    );
    write(t.path(), "base/web.yaml", SVC);
    // Two overlays of one base: two clusters (kustomize builds each on its own).
    for env in ["prod", "staging"] {
        write(
            t.path(),
            &format!("overlays/{env}/kustomization.yaml"),
            format!("resources: [../../base]\nnamespace: {env}\n"),
        );
    }
    svc(&["check", dir], None, &root()).expect(0);
    // One build with two copies of `web`: `kustomize build` itself refuses it ("may not
    // add resource with an already registered id").
    write(
        t.path(),
        "other/kustomization.yaml",
        "resources: [web.yaml]\n",
    );
    write(t.path(), "other/web.yaml", SVC);
    write(
        t.path(),
        "overlays/both/kustomization.yaml",
        "resources: [../../base, ../../other]\n",
    );
    let r = svc(&["check", dir], None, &root());
    r.expect(1);
    assert!(
        r.stdout
            .contains("error[SVC301]: duplicate Service `default/web` in cluster `"),
        "{}",
        r.stdout
    );
    // kustomize's nameSuffix on one of them makes the names differ (`web-other`).
    write(
        t.path(),
        "other/kustomization.yaml",
        "resources: [web.yaml]\nnameSuffix: -other\n",
    );
    svc(&["check", dir], None, &root()).expect(0);
    // A namespace set by the overlay wins over the base's own.
    write(
        t.path(),
        "other/kustomization.yaml",
        "resources: [web.yaml]\nnamespace: other\n",
    );
    svc(&["check", dir], None, &root()).expect(0);
    write(
        t.path(),
        "overlays/both/kustomization.yaml",
        "resources: [../../base, ../../other]\nnamespace: one\n",
    );
    let r = svc(&["check", dir], None, &root());
    r.expect(1);
    assert!(
        r.stdout.contains("duplicate Service `one/web`"),
        "{}",
        r.stdout
    );
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
    let r = svc(&["check", f, "--no-allocate", "--verbose"], None, &root());
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

// ---- CI output (issue 32): formats, the config file, suppressions ----

/// docs/diagnostics.md as the code tables make it: a heading per code (the anchor SARIF's
/// `helpUri` points at), its default severity and what it means.
fn diagnostics_doc() -> String {
    let mut codes: Vec<&svc_compiler::codes::Code> = svc_compiler::codes::CODES
        .iter()
        .chain(svc_targets::CODES)
        .collect();
    codes.sort_by_key(|c| c.code);
    let mut out = String::from(
        "# Diagnostic codes\n\n\
         <!-- Made from the code tables (compiler/src/codes.rs, compiler/src/passes/validate.rs,\n     \
         svc_targets::CODES) by tests/check.rs, which fails when this file differs from them;\n     \
         `UPDATE_DOCS=1 cargo test --test main check::diagnostics_doc` writes it. Edit the\n     \
         tables, not this file. -->\n\n\
         Every diagnostic svc-compile prints has a stable code: `error[SVC110]: …` in text, the\n\
         `ruleId` of a SARIF result (whose rule links here), the title of a GitHub annotation.\n\
         Each code below is given with the severity it is reported with by default (`--validate`\n\
         changes SVC003's). To leave one out on a line, in some files or everywhere, see\n\
         [suppressions](ci.md#suppressions).\n\n\
         | codes | what they are about |\n\
         |---|---|\n\
         | SVC0xx | reading the input; the config file and suppressions |\n\
         | SVC1xx | the API server's rules for Services (and metadata of any kind) |\n\
         | SVC2xx | the API server's rules for endpoints, nodes and pods |\n\
         | SVC3xx | rules across objects; kube-proxy's and svc-compile's configuration; allocation (SVC35x, SVC360) |\n\
         | SVC4xx | the node compiled for |\n\
         | SVC5xx | the back ends' own inputs (templates) |\n",
    );
    for c in codes {
        let sev = match c.severity {
            svc_compiler::diag::Severity::Error => "error",
            svc_compiler::diag::Severity::Warning => "warning",
            svc_compiler::diag::Severity::Note => "note",
        };
        out += &format!("\n## {}\n\n{sev}: {}\n", c.code, c.summary);
    }
    out
}

/// docs/diagnostics.md lists every code with its table's description: it cannot drift
/// from the tables (`UPDATE_DOCS=1` rewrites it).
#[test]
fn diagnostics_doc_lists_every_code() {
    let want = diagnostics_doc();
    let path = root().join("docs/diagnostics.md");
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "docs/diagnostics.md differs from the code tables: run `UPDATE_DOCS=1 cargo test --test main check::diagnostics_doc`"
    );
    for code in ["SVC001", "SVC021", "SVC022", "SVC110", "SVC322", "SVC501"] {
        assert!(have.contains(&format!("\n## {code}\n")), "{code}");
    }
}

/// A repository with one of each: an error with a related location (a duplicate), a
/// warning, notes (skipped kinds), a clean file.
fn ci_repo(t: &TempDir) {
    write(t.path(), "apps/web.yaml", SVC);
    write(
        t.path(),
        "apps/dup.yaml",
        format!("{SVC}---\n{SVC}").replace("name: web", "name: dup"),
    );
    write(
        t.path(),
        "apps/slice.yaml",
        "apiVersion: discovery.k8s.io/v1beta1\nkind: EndpointSlice\nmetadata:\n  name: web-1\n  labels: {kubernetes.io/service-name: web}\naddressType: IPv4\nendpoints: []\n",
    );
    write(
        t.path(),
        "apps/deploy.yaml",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: web}\n",
    );
}

/// Where serde-sarif's source (and the SARIF 2.1.0 schema it ships) is.
fn sarif_schema() -> serde_json::Value {
    let out = std::process::Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1"])
        .current_dir(root())
        .output()
        .expect("cargo metadata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let manifest = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "serde-sarif")
        .expect("serde-sarif is a dev-dependency")["manifest_path"]
        .as_str()
        .unwrap()
        .to_string();
    let schema = Path::new(&manifest).with_file_name("src/schema.json");
    serde_json::from_str(&std::fs::read_to_string(schema).unwrap()).unwrap()
}

/// The SARIF 2.1.0 schema's verdict on `sarif` (formats asserted too).
fn validate_sarif(schema: &serde_json::Value, sarif: &serde_json::Value) -> Result<(), String> {
    let id = schema["$id"].as_str().unwrap();
    let mut schemas = boon::Schemas::new();
    let mut compiler = boon::Compiler::new();
    compiler.enable_format_assertions();
    compiler.add_resource(id, schema.clone()).unwrap();
    let index = compiler.compile(id, &mut schemas).unwrap();
    schemas.validate(sarif, index).map_err(|e| format!("{e:#}"))
}

/// SARIF as GitHub code scanning ingests it: valid against the SARIF 2.1.0 schema; a
/// rule per code shown with short and full descriptions, a help URI at the code's heading
/// in docs/diagnostics.md and its default level; results pointing at their rule, with
/// start and end, paths relative to %SRCROOT% (the working directory), related
/// locations; notes only when asked for.
#[test]
fn sarif_is_what_code_scanning_ingests() {
    let t = TempDir::new("sarif");
    ci_repo(&t);
    let schema = sarif_schema();
    let run = |extra: &[&str]| {
        let mut args = vec!["check", ".", "--format", "sarif"];
        args.extend(extra);
        let r = svc(&args, None, t.path());
        r.expect(1);
        let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
        if let Err(e) = validate_sarif(&schema, &v) {
            panic!("{} is not valid SARIF 2.1.0: {e}\n{}", r.cmdline, r.stdout);
        }
        v
    };
    let v = run(&[]);
    let run0 = &v["runs"][0];
    let cwd = std::fs::canonicalize(t.path()).unwrap();
    assert_eq!(
        run0["originalUriBaseIds"]["%SRCROOT%"]["uri"],
        format!("file://{}/", cwd.display())
    );
    let rules = run0["tool"]["driver"]["rules"].as_array().unwrap();
    let ids: Vec<&str> = rules.iter().map(|r| r["id"].as_str().unwrap()).collect();
    // SVC301 (the duplicate), SVC013 (v1beta1); no notes.
    assert_eq!(ids, ["SVC013", "SVC301"], "{run0:#}");
    let docs = std::fs::read_to_string(root().join("docs/diagnostics.md")).unwrap();
    for r in rules {
        let id = r["id"].as_str().unwrap();
        let info = svc_compiler::codes::find(id).unwrap();
        assert_eq!(r["shortDescription"]["text"], info.summary.replace('`', ""));
        assert!(r["fullDescription"]["text"].as_str().unwrap().len() > info.summary.len());
        let uri = r["helpUri"].as_str().unwrap();
        let anchor = id.to_ascii_lowercase();
        assert!(
            uri.ends_with(&format!("/docs/diagnostics.md#{anchor}")),
            "{uri}"
        );
        assert!(
            docs.contains(&format!("\n## {id}\n")),
            "{id} has no heading"
        );
        assert!(r["help"]["text"].as_str().unwrap().contains(uri));
        let level = match info.severity {
            svc_compiler::diag::Severity::Error => "error",
            svc_compiler::diag::Severity::Warning => "warning",
            svc_compiler::diag::Severity::Note => "note",
        };
        assert_eq!(r["defaultConfiguration"]["level"], level);
    }
    let results = run0["results"].as_array().unwrap();
    for res in results {
        let i = res["ruleIndex"].as_u64().unwrap() as usize;
        assert_eq!(rules[i]["id"], res["ruleId"]);
        assert_ne!(res["level"], "note");
    }
    let dup = results.iter().find(|r| r["ruleId"] == "SVC301").unwrap();
    let loc = &dup["locations"][0]["physicalLocation"];
    assert_eq!(loc["artifactLocation"]["uri"], "apps/dup.yaml");
    assert_eq!(loc["artifactLocation"]["uriBaseId"], "%SRCROOT%");
    // The second `name: dup`: line 13, the value at column 9, three characters.
    assert_eq!(
        loc["region"],
        serde_json::json!({"startLine": 13, "startColumn": 9, "endLine": 13, "endColumn": 12})
    );
    let related = &dup["relatedLocations"][0]["physicalLocation"];
    assert_eq!(related["region"]["startLine"], 4);
    assert_eq!(related["artifactLocation"]["uri"], "apps/dup.yaml");

    // Notes: only when asked for, at level note.
    for extra in [&["--verbose"][..], &["--min-severity", "note"]] {
        let v = run(extra);
        let notes: Vec<&serde_json::Value> = v["runs"][0]["results"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["level"] == "note")
            .collect();
        assert_eq!(notes.len(), 2, "{extra:?}");
        assert!(notes.iter().all(|n| n["ruleId"] == "SVC008"));
    }
    // Errors only.
    let v = run(&["--min-severity", "error"]);
    let levels: Vec<&str> = v["runs"][0]["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["level"].as_str().unwrap())
        .collect();
    assert!(levels.iter().all(|l| *l == "error"), "{levels:?}");
    // Every result has a location, as code scanning requires (it refuses the whole file
    // otherwise): one about the whole run (no such node) is at the first input.
    let r = svc(
        &[
            "compile",
            "apps/web.yaml",
            "--target",
            "iptables",
            "--node",
            "nope",
            "--format",
            "sarif",
        ],
        None,
        t.path(),
    );
    r.expect(1);
    let v: serde_json::Value = serde_json::from_str(&r.stderr).unwrap();
    validate_sarif(&schema, &v).unwrap();
    let res = &v["runs"][0]["results"];
    let unknown = res
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["ruleId"] == "SVC401")
        .unwrap();
    assert_eq!(
        unknown["locations"][0]["physicalLocation"]["region"]["startLine"], 1,
        "{unknown}"
    );
    // A file outside the working directory is an absolute URI, without a base.
    let outside = TempDir::new("sarif-out");
    write(outside.path(), "bad.yaml", "kind: Service\n");
    let f = outside.path().join("bad.yaml");
    let r = svc(
        &["check", f.to_str().unwrap(), "--format", "sarif"],
        None,
        t.path(),
    );
    r.expect(1);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    validate_sarif(&schema, &v).unwrap();
    let art = &v["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"];
    assert_eq!(art["uri"], format!("file://{}", f.display()));
    assert!(art.get("uriBaseId").is_none(), "{art}");
}

/// `--format junit`: a test case per file read (kubeconform's and conftest's shape), its
/// errors one failure, its warnings in system-out (kubeconform fails only what is
/// invalid), a skipped kustomize patch skipped; XML that parses, escaped as it must be.
#[test]
fn junit_has_a_test_case_per_file() {
    let t = TempDir::new("junit");
    ci_repo(&t);
    // A message with every character XML escapes.
    write(
        t.path(),
        "apps/odd.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: \"a<b&c'd\\\"\"}\nspec:\n  ports: [{port: 80}]\n",
    );
    write(
        t.path(),
        "kustomization.yaml",
        "resources: [apps/web.yaml]\npatches:\n- path: patch.yaml\n",
    );
    write(t.path(), "patch.yaml", "spec:\n  type: NodePort\n");
    let r = svc(&["check", ".", "--format", "junit"], None, t.path());
    r.expect(1);
    let doc = roxmltree::Document::parse(&r.stdout)
        .unwrap_or_else(|e| panic!("not XML: {e}\n{}", r.stdout));
    let suites = doc.root_element();
    assert_eq!(suites.tag_name().name(), "testsuites");
    let cases: Vec<roxmltree::Node> = suites
        .descendants()
        .filter(|n| n.has_tag_name("testcase"))
        .collect();
    let names: Vec<&str> = cases.iter().map(|c| c.attribute("name").unwrap()).collect();
    assert_eq!(
        names,
        [
            "./apps/deploy.yaml",
            "./apps/dup.yaml",
            "./apps/odd.yaml",
            "./apps/slice.yaml",
            "./apps/web.yaml",
            "./kustomization.yaml",
            "./patch.yaml"
        ],
        "{}",
        r.stdout
    );
    assert_eq!(suites.attribute("tests"), Some("7"));
    assert_eq!(suites.attribute("failures"), Some("2"));
    assert_eq!(suites.attribute("skipped"), Some("1"));
    let child = |c: &roxmltree::Node, tag: &str| {
        c.children().find(|n| n.has_tag_name(tag)).map(|n| {
            (
                n.attribute("message").unwrap_or("").to_string(),
                n.text().unwrap_or("").to_string(),
            )
        })
    };
    let (message, text) = child(&cases[2], "failure").expect("odd.yaml fails");
    assert!(message.contains("a<b&c'd\""), "{message}");
    assert!(text.contains("error[SVC101]"), "{text}");
    let (message, text) = child(&cases[1], "failure").expect("dup.yaml fails");
    assert!(
        message.starts_with("1 error(s): duplicate Service"),
        "{message}"
    );
    assert!(
        text.starts_with("./apps/dup.yaml:13:9: error[SVC301]"),
        "{text}"
    );
    // The warning does not fail its file; it is shown.
    assert!(child(&cases[3], "failure").is_none());
    let (_, out) = child(&cases[3], "system-out").unwrap();
    assert!(out.contains("warning[SVC013]"), "{out}");
    assert!(child(&cases[6], "skipped").is_some());
    // Clean files pass; notes are left out unless asked for.
    assert_eq!(cases[4].children().filter(|n| n.is_element()).count(), 0);
    assert!(child(&cases[0], "system-out").is_none());
    let r = svc(
        &["check", ".", "--format", "junit", "--verbose"],
        None,
        t.path(),
    );
    let doc = roxmltree::Document::parse(&r.stdout).unwrap();
    let deploy = doc
        .descendants()
        .find(|n| n.attribute("name") == Some("./apps/deploy.yaml"))
        .unwrap();
    assert!(child(&deploy, "system-out")
        .unwrap()
        .1
        .contains("note[SVC008]"));
    // Only `check` writes JUnit.
    let r = svc(&["compile", ".", "--format", "junit"], None, t.path());
    r.expect(2);
}

/// A bundle's hundreds of skipped objects: one line per code in text (kinds counted),
/// each with --verbose; --min-severity filters every format.
#[test]
fn notes_are_summarised_unless_verbose() {
    let t = TempDir::new("notes");
    let mut bundle = String::from(SVC);
    for i in 0..40 {
        bundle +=
            &format!("---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: d{i}}}\n");
    }
    for i in 0..3 {
        bundle += &format!("---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: c{i}}}\n");
    }
    write(t.path(), "bundle.yaml", bundle);
    let r = svc(&["check", "bundle.yaml"], None, t.path());
    r.expect(0);
    assert_eq!(
        r.stdout,
        "note[SVC008]: 43 notes: a kind svc-compile does not read was skipped (ConfigMap 3, Deployment 40); --verbose shows each\nok: 1 file(s) checked, 0 warning(s)\n"
    );
    let r = svc(&["check", "bundle.yaml", "--verbose"], None, t.path());
    assert_eq!(r.stdout.matches("note[SVC008]").count(), 43, "{}", r.stdout);
    assert!(r.stdout.contains("  --> bundle.yaml:"), "{}", r.stdout);
    let r = svc(
        &["check", "bundle.yaml", "--min-severity", "warning"],
        None,
        t.path(),
    );
    assert_eq!(r.stdout, "ok: 1 file(s) checked, 0 warning(s)\n");
    // The other formats leave notes out unless asked for.
    for (format, note) in [("json", "\"note\""), ("github", "::notice ")] {
        let r = svc(
            &["check", "bundle.yaml", "--format", format],
            None,
            t.path(),
        );
        assert!(!r.stdout.contains(note), "[{format}] {}", r.stdout);
        let r = svc(
            &["check", "bundle.yaml", "--format", format, "-v"],
            None,
            t.path(),
        );
        assert_eq!(
            r.stdout.matches(note).count(),
            43,
            "[{format}] {}",
            r.stdout
        );
    }
    // compile's diagnostics on stderr are summarised the same way.
    let r = svc(&["compile", "bundle.yaml"], None, t.path());
    r.expect(0);
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
}

/// `-o FILE` for every command that prints a report, in every format: the file holds
/// what stdout would, and stdout nothing.
#[test]
fn every_report_goes_to_a_file_with_o() {
    let t = TempDir::new("o-file");
    ci_repo(&t);
    write(
        t.path(),
        "new/web.yaml",
        SVC.replace("port: 80", "port: 81"),
    );
    let dir = t.path().to_str().unwrap();
    let cases: Vec<(Vec<&str>, &[&str], i32)> = vec![
        (
            vec!["check", "apps"],
            &["text", "json", "sarif", "github", "junit"],
            1,
        ),
        (
            vec!["diff", "apps/web.yaml", "new/web.yaml"],
            &["text", "json", "markdown"],
            1,
        ),
        (
            vec![
                "trace",
                "apps/web.yaml",
                "--node",
                "n",
                "--node-ip",
                "192.168.0.10",
                "--from",
                "10.244.0.5",
                "--to",
                "10.96.0.1:80",
            ],
            &["text", "json"],
            0,
        ),
    ];
    for (args, formats, code) in cases {
        for format in formats {
            let mut plain = args.clone();
            plain.extend(["--format", format]);
            let want = svc(&plain, None, t.path());
            want.expect(code);
            assert!(!want.stdout.is_empty(), "{}", want.cmdline);
            let file = t.path().join(format!("{}.{format}", args[0]));
            let mut to_file = plain.clone();
            to_file.extend(["-o", file.to_str().unwrap()]);
            let r = svc(&to_file, None, t.path());
            r.expect(code);
            assert_eq!(r.stdout, "", "{}", r.cmdline);
            assert_eq!(
                std::fs::read_to_string(&file).unwrap(),
                want.stdout,
                "{}",
                r.cmdline
            );
        }
    }
    let _ = dir;
}

/// The config file: found from the working directory upward (a `.git` directory on the
/// way does not stop the search), its globs relative to its directory; `ignore`,
/// `per-path-ignores`, `exclude` and the ClusterConfig settings; flags beat it; a broken
/// one is a usage error (exit 2) located in it; `--config FILE`, `--no-config`.
#[test]
fn the_config_file_stands_for_flags() {
    let t = TempDir::new("config");
    let repo = t.path();
    write(
        repo,
        ".svc-compile.yaml",
        "# CI reads this; no flags needed\nserviceClusterIPRange: 10.0.0.0/16\nignore: [SVC013]\nper-path-ignores:\n  \"legacy/**\": [SVC153]\nexclude: [\"charts/**\"]\n",
    );
    write(
        repo,
        "apps/svc.yaml",
        SVC.replace("spec:\n", "spec:\n  clusterIP: 10.0.0.10\n"),
    );
    write(
        repo,
        "apps/slice.yaml",
        "apiVersion: discovery.k8s.io/v1beta1\nkind: EndpointSlice\nmetadata:\n  name: web-1\n  labels: {kubernetes.io/service-name: web}\naddressType: IPv4\nendpoints: []\n",
    );
    write(
        repo,
        "legacy/old.yaml",
        SVC.replace("name: web", "name: old")
            .replace("spec:\n", "spec:\n  externalIPs: [010.1.2.3]\n"),
    );
    write(
        repo,
        "charts/web/templates/svc.yaml",
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {{ .Release.Name }}\n",
    );
    std::fs::create_dir_all(repo.join("apps/.git")).unwrap();
    let apps = repo.join("apps");
    let check = |extra: &[&str]| {
        let mut args = vec!["check", ".."];
        args.extend(extra);
        svc(&args, None, &apps)
    };
    let r = check(&[]);
    r.expect(0);
    assert_eq!(
        r.stdout, "ok: 3 file(s) checked, 0 warning(s), 2 suppressed\n",
        "{}",
        r.stderr
    );
    // Without it: the default range, the chart, the warnings.
    let r = check(&["--no-config"]);
    r.expect(1);
    for code in ["SVC119", "SVC013", "SVC153", "SVC024"] {
        assert!(r.stdout.contains(code), "{code}: {}", r.stdout);
    }
    // Flags beat it.
    let r = check(&["--service-cluster-ip-range", "10.96.0.0/12"]);
    r.expect(1);
    assert!(r.stdout.contains("error[SVC119]"), "{}", r.stdout);
    // The chart's template is skipped (a note naming it), not an error.
    let r = check(&["--exclude", "nothing"]);
    r.expect(0);
    assert!(
        r.stdout.contains("charts/web/templates/svc.yaml"),
        "{}",
        r.stdout
    );
    // --config FILE: another file, its globs relative to the working directory.
    let elsewhere = TempDir::new("config-other");
    write(
        elsewhere.path(),
        "other.yaml",
        "exclude: [\"charts/**\"]\nvalidate: warn\n",
    );
    let other = elsewhere.path().join("other.yaml");
    let r = check(&["--config", other.to_str().unwrap()]);
    r.expect(1);
    assert!(r.stdout.contains("error[SVC119]"), "{}", r.stdout);
    assert!(!r.stdout.contains("charts/web"), "{}", r.stdout);
    // An ignore that matches nothing is a warning where it is written.
    write(
        repo,
        ".svc-compile.yaml",
        "serviceClusterIPRange: 10.0.0.0/16\nignore: [SVC013, SVC020]\nper-path-ignores:\n  \"legacy/**\": [SVC153]\nexclude: [\"charts/**\"]\n",
    );
    let r = check(&[]);
    r.expect(0);
    assert!(
        r.stdout.contains(
            "warning[SVC022]: `ignore` `SVC020` matched nothing\n  --> ../.svc-compile.yaml:2:18"
        ),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout
            .ends_with("ok: 3 file(s) checked, 1 warning(s), 2 suppressed\n"),
        "{}",
        r.stdout
    );
    // A broken config: exit 2, located, before anything is read.
    write(
        repo,
        ".svc-compile.yaml",
        "ignor: [SVC013]\nnftLayout: quick\n",
    );
    let r = check(&[]);
    r.expect(2);
    assert!(
        r.stderr.contains("error[SVC021]: unknown key `ignor`"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("--> ../.svc-compile.yaml:1:1"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("did you mean `ignore`?"), "{}", r.stderr);
    assert!(
        r.stderr.contains("--> ../.svc-compile.yaml:2:12"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.lines().last().unwrap().starts_with(
            "svc-compile: ../.svc-compile.yaml:1:1: unknown key `ignor` (the config file has 2 error(s)"
        ),
        "{}",
        r.stderr
    );
    assert_eq!(r.stdout, "");
    check(&["--no-config", "--exclude", "charts/**"]).expect(1);
    // The settings reach compile as flags would.
    write(
        repo,
        ".svc-compile.yaml",
        "serviceClusterIPRange: 10.0.0.0/16\n",
    );
    let r = svc(&["compile", "svc.yaml"], None, &apps);
    r.expect(0);
    assert!(r.stdout.contains("10.0.0.10"), "{}", r.stdout);
}

/// `# svc-compile:ignore SVCnnn[,SVCmmm]` on the finding's line, or alone on the line
/// above; an error suppressed no longer fails; a comment that suppresses nothing (or names
/// no code, or an unknown one) is an SVC022 warning; the summary counts the suppressed.
#[test]
fn inline_suppressions() {
    let t = TempDir::new("inline");
    let svc_text = "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  externalIPs:\n  - 010.1.2.3  # svc-compile:ignore SVC153 (written so by the vendor)\n  ports:\n  # svc-compile:ignore SVC110\n  - port: 80800\n";
    write(t.path(), "svc.yaml", svc_text);
    let r = svc(&["check", "svc.yaml"], None, t.path());
    r.expect(0);
    assert_eq!(
        r.stdout,
        "ok: 1 file(s) checked, 0 warning(s), 2 suppressed\n"
    );
    // Without the comments: an error and a warning.
    let bare: String = svc_text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .map(|l| l.split("  #").next().unwrap().to_string() + "\n")
        .collect();
    write(t.path(), "svc.yaml", &bare);
    let r = svc(&["check", "svc.yaml"], None, t.path());
    r.expect(1);
    assert!(
        r.stdout.ends_with("1 error(s), 1 warning(s)\n"),
        "{}",
        r.stdout
    );
    // A trailing comment covers its own line only.
    write(
        t.path(),
        "svc.yaml",
        bare.replace("  ports:\n", "  ports:  # svc-compile:ignore SVC110\n"),
    );
    let r = svc(&["check", "svc.yaml"], None, t.path());
    r.expect(1);
    assert!(
        r.stdout.contains(
            "warning[SVC022]: `# svc-compile:ignore` `SVC110` matched nothing\n  --> svc.yaml:8:32"
        ),
        "{}",
        r.stdout
    );
    // Unused, unknown and empty comments.
    write(
        t.path(),
        "svc.yaml",
        format!("{svc_text}# svc-compile:ignore SVC116, SVC999\n# svc-compile:ignore\n"),
    );
    let r = svc(&["check", "svc.yaml"], None, t.path());
    r.expect(0);
    let warnings: Vec<&str> = r
        .stdout
        .lines()
        .filter(|l| l.starts_with("warning["))
        .collect();
    assert_eq!(
        warnings,
        [
            "warning[SVC022]: `# svc-compile:ignore` `SVC116` matched nothing",
            "warning[SVC022]: `# svc-compile:ignore`: `SVC999` is not a diagnostic code",
            "warning[SVC022]: `# svc-compile:ignore` names no code",
        ],
        "{}",
        r.stdout
    );
    assert!(
        r.stdout
            .ends_with("ok: 1 file(s) checked, 3 warning(s), 2 suppressed\n"),
        "{}",
        r.stdout
    );
    // In the config file, `ignore: [SVC022]` silences them (and counts them).
    write(t.path(), ".svc-compile.yaml", "ignore: [SVC022]\n");
    let r = svc(&["check", "svc.yaml"], None, t.path());
    r.expect(0);
    assert_eq!(
        r.stdout,
        "ok: 1 file(s) checked, 0 warning(s), 5 suppressed\n"
    );
}

/// `diff` takes `--exclude`/`--include` like check, and skips a Helm chart's templates
/// (not manifests until Helm renders them) as check does.
#[test]
fn diff_leaves_out_what_check_leaves_out() {
    let t = TempDir::new("diff-helm");
    for (side, port) in [("old", "80"), ("new", "81")] {
        write(
            t.path(),
            &format!("{side}/app/svc.yaml"),
            SVC.replace("port: 80", &format!("port: {port}")),
        );
        write(
            t.path(),
            &format!("{side}/chart/Chart.yaml"),
            "apiVersion: v2\nname: web\nversion: 0.1.0\n",
        );
        write(
            t.path(),
            &format!("{side}/chart/templates/svc.yaml"),
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: {{ .Release.Name }}\nspec:\n  ports:\n  - port: {{ .Values.port }}\n",
        );
    }
    let r = svc(&["diff", "old", "new"], None, t.path());
    r.expect(1);
    assert!(r.stdout.contains("default/web"), "{}", r.stdout);
    assert!(!r.stderr.contains("error"), "{}", r.stderr);
    let r = svc(
        &[
            "diff",
            "old",
            "new",
            "--exclude",
            "templates/**",
            "--color",
            "always",
        ],
        None,
        t.path(),
    );
    r.expect(1);
    assert!(r.stdout.contains("default/web"), "{}", r.stdout);
    assert_eq!(r.stderr, "");
    let r = svc(
        &["diff", "old", "new", "--include", "app/*"],
        None,
        t.path(),
    );
    r.expect(1);
    // The same from the config file.
    write(
        t.path(),
        ".svc-compile.yaml",
        "exclude: [\"templates/**\"]\n",
    );
    svc(&["diff", "old", "new"], None, t.path()).expect(1);
    svc(&["diff", "old", "new", "--no-config"], None, t.path()).expect(1);
    // Without the chart's `Chart.yaml` and `{{`, a broken file under `templates/` is read.
    write(t.path(), "new/chart/Chart.yaml", "");
    std::fs::remove_file(t.path().join("new/chart/Chart.yaml")).unwrap();
    write(
        t.path(),
        "new/chart/templates/svc.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec:\n  ports:\n  - port: 0\n",
    );
    svc(&["diff", "old", "new", "--no-config"], None, t.path()).expect(2);
}
