//! Records, for `kpack_testkit::cprog`, the target the workspace is built
//! for and the native libraries a Rust static library needs on it, as
//! `rustc --print native-static-libs` reports them (asked of the rustc that
//! builds the workspace, on an empty static library: the libraries of the
//! standard library, which are all `librocm_kpack.a` needs).

use std::process::{Command, Stdio};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let target = std::env::var("TARGET").expect("cargo sets TARGET");
    let host = std::env::var("HOST").expect("cargo sets HOST");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out_dir = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    let out = Command::new(&rustc)
        .args([
            "--crate-type",
            "staticlib",
            "--crate-name",
            "native_libs_probe",
        ])
        .args(["--target", &target, "--print", "native-static-libs", "-o"])
        .arg(format!("{out_dir}/libnative_libs_probe.a"))
        .arg("-")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {rustc}: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{rustc} --print native-static-libs failed:\n{stderr}"
    );
    let libs = stderr
        .lines()
        .find_map(|l| {
            l.split_once("native-static-libs:")
                .map(|(_, libs)| libs.trim())
        })
        .unwrap_or_else(|| panic!("no native-static-libs line from {rustc}:\n{stderr}"));
    println!("cargo:rustc-env=KPACK_TESTKIT_NATIVE_STATIC_LIBS={libs}");
    println!("cargo:rustc-env=KPACK_TESTKIT_TARGET={target}");
    println!("cargo:rustc-env=KPACK_TESTKIT_HOST={host}");
}
