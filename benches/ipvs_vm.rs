//! `cargo bench --bench ipvs_vm`: how long the kernel takes to load the IPVS target's parts
//! for 10,000 services × 10 endpoints (100 nodes, node-000's view), in the IPVS VM
//! (`tests/ipvs/vm.sh`: Debian's kernel under qemu **TCG, i.e. emulated**: expect one to
//! two orders of magnitude slower than real hardware; the ratios between the loaders mean
//! more than the absolute numbers). Each part is loaded once, in load order, into a fresh
//! network namespace: `ipset restore`, `ipvsadm-restore`, `ip -batch`,
//! `iptables-restore --noflush` (`lo` up first: IPVS refuses real servers in a namespace
//! without a local routing table, "address not unicast"); then the same sets are built beside and swapped in
//! (what `apply` does for a changed set). Needs qemu and a kernel image (as the IPVS
//! kernel tests); otherwise it says so and exits 0. Options: `--services N`.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;
use svc_compiler::synth::{self, Format, Shape};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let services = args
        .iter()
        .position(|a| a == "--services")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(10_000usize);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    if let Some(why) = missing() {
        println!("skipped: ipvs VM benchmark: {why}");
        return;
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let share = target
        .join("ipvs-vm/runs")
        .join(format!("bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&share);
    std::fs::create_dir_all(&share).unwrap();
    let shape = Shape {
        services,
        endpoints: 10,
        nodes: 100,
        seed: 1,
    };
    let input = share.join("cluster.yaml");
    std::fs::write(&input, synth::generate(&shape, Format::YamlList)).unwrap();
    let mut lines = Vec::new();
    for part in ["ipset", "ipvsadm", "addresses", "iptables"] {
        let out = share.join(part);
        let start = Instant::now();
        let st = Command::new(env!("CARGO_BIN_EXE_svc-compile"))
            .arg(&input)
            .args([
                "--target", "ipvs", "--node", "node-000", "--part", part, "-o",
            ])
            .arg(&out)
            .status()
            .unwrap();
        assert!(st.success(), "compiling the {part} part");
        let text = std::fs::read_to_string(&out).unwrap();
        lines.push((part, text.lines().count(), start.elapsed()));
    }
    // The swap of every set: the ipset part under scratch names (ipset names are at most
    // 31 bytes, so a hash, as apply names them), then swap and destroy.
    let ipset = std::fs::read_to_string(share.join("ipset")).unwrap();
    let tmp = |n: &str| {
        let h = n.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        format!("SVC-TMP-{h:016x}")
    };
    let mut swap = String::new();
    let mut names = Vec::new();
    for l in ipset.lines() {
        let w: Vec<&str> = l.splitn(3, ' ').collect();
        if let [op @ ("create" | "add"), name, rest] = w[..] {
            if op == "create" {
                names.push(name.to_string());
            }
            swap += &format!("{op} {} {rest}\n", tmp(name));
        }
    }
    for n in &names {
        swap += &format!("swap {} {n}\ndestroy {}\n", tmp(n), tmp(n));
    }
    std::fs::write(share.join("swap"), swap).unwrap();
    let d = share.display();
    let script = format!(
        "#!/bin/sh\n\
         t() {{ s=$(date +%s%N); \"$@\" > /tmp/out 2>&1; rc=$?; e=$(date +%s%N); n=$(grep -c . /tmp/out); echo \"bench: $L $(( (e - s) / 1000000 )) $rc $n\"; }}\n\
         ip netns add b; X='ip netns exec b'; $X ip link set lo up\n\
         L=ipset t $X sh -c 'ipset restore < {d}/ipset'\n\
         L=ipvsadm t $X sh -c 'ipvsadm-restore < {d}/ipvsadm'\n\
         L=addresses t $X ip -batch {d}/addresses\n\
         L=iptables t $X iptables-restore --noflush {d}/iptables\n\
         L=swap t $X sh -c 'ipset restore < {d}/swap'\n\
         echo \"bench: servers $($X ipvsadm-save -n | grep -c '^-A') $($X ipvsadm-save -n | grep -c '^-a')\"\n"
    );
    let script_path = share.join("guest.sh");
    std::fs::write(&script_path, script).unwrap();
    let start = Instant::now();
    let out = Command::new(root.join("tests/ipvs/vm.sh"))
        .arg(&script_path)
        .env("SVC_IPVS_CACHE", target.join("ipvs-vm"))
        .env("SVC_IPVS_SHARE", &share)
        .env("SVC_IPVS_TIMEOUT", "1500")
        .env("SVC_IPVS_MEM", "1536")
        .output()
        .unwrap();
    let console = String::from_utf8_lossy(&out.stdout);
    let _ = std::fs::remove_dir_all(&share);
    println!(
        "IPVS parts of node-000, {services} services × 10 endpoints (100 nodes), loaded in the \
         IPVS VM (qemu TCG: emulated), one run each; VM run {:.0} s in all\n",
        start.elapsed().as_secs_f64()
    );
    println!("| part | lines | compile (CLI, --part) | kernel load (emulated) |");
    println!("|---|---:|---:|---:|");
    let bench: Vec<Vec<&str>> = console
        .lines()
        .filter_map(|l| l.strip_prefix("bench: "))
        .map(|l| l.split_whitespace().collect())
        .collect();
    let load = |name: &str| {
        bench
            .iter()
            .find(|w| w[0] == name)
            .map(|w| match (w[2], w[3]) {
                ("0", "0") => format!("{:.2} s", w[1].parse::<f64>().unwrap_or(0.0) / 1000.0),
                (rc, n) => format!("failed (exit {rc}, {n} lines of errors)"),
            })
            .unwrap_or_else(|| "no result".into())
    };
    for (part, n, took) in &lines {
        println!(
            "| {part} | {n} | {:.2} s | {} |",
            took.as_secs_f64(),
            load(part)
        );
    }
    println!(
        "| every set built beside and swapped in (apply's way) | | | {} |",
        load("swap")
    );
    if let Some(w) = bench.iter().find(|w| w[0] == "servers") {
        println!(
            "\nThe VM shows {} virtual servers, {} real servers.",
            w[1], w[2]
        );
    } else {
        println!("\nNo result from the VM:\n{console}");
    }
}

fn missing() -> Option<String> {
    let on_path = |t: &str| {
        std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(t).is_file()))
    };
    if !on_path("qemu-system-x86_64") {
        return Some("qemu-system-x86_64 is not installed".into());
    }
    let kernel = std::fs::read_dir("/boot").ok().is_some_and(|rd| {
        rd.filter_map(|e| e.ok())
            .any(|e| e.file_name().to_string_lossy().starts_with("vmlinuz-"))
    });
    (!kernel).then(|| "no /boot/vmlinuz-*".into())
}
