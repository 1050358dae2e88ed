//! Compiles the socket load balancer (`bpf/sock_lb.c`) with clang, when clang is there, so
//! that `apply --target ebpf` can load it from the binary. Without clang (or when it
//! fails) the embedded object is empty: everything else builds and works, and `apply
//! --target ebpf` says what to install (exit 2). `SVC_COMPILE_CLANG` names another clang.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=../bpf/sock_lb.c");
    println!("cargo:rerun-if-env-changed=SVC_COMPILE_CLANG");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let obj = out.join("sock_lb.o");
    let clang = std::env::var("SVC_COMPILE_CLANG").unwrap_or_else(|_| "clang".into());
    // Debian keeps asm/ under the multiarch directory, which clang -target bpf does not
    // search by itself.
    let arch = Command::new("cc")
        .arg("-dumpmachine")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let built = Command::new(&clang)
        .args(["-O2", "-g", "-Wall", "-Werror", "-target", "bpf"])
        .arg(format!("-I/usr/include/{arch}"))
        .arg("-c")
        .arg("../bpf/sock_lb.c")
        .arg("-o")
        .arg(&obj)
        .output();
    let why = match built {
        Ok(o) if o.status.success() => return,
        Ok(o) => format!(
            "{clang} failed on ../bpf/sock_lb.c (libbpf-dev installed?): {}",
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .next()
                .unwrap_or("")
        ),
        Err(e) => format!("{clang} not found ({e})"),
    };
    println!("cargo:warning=apply --target ebpf will be unavailable: {why}");
    std::fs::write(&obj, b"").expect("write OUT_DIR/sock_lb.o");
}
