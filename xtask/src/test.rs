//! `cargo xtask test`: set up a Debian 12 machine, build the fixtures, run
//! every test, rustfmt and clippy.

use std::path::Path;

use anyhow::{bail, Context, Result};
use kpack_testkit::fixtures::{self, FIXTURES_DIR};
use kpack_testkit::oracle::LLVM_BIN;
use xshell::{cmd, Shell};

use crate::cargo;

/// Debian packages the fixtures and the tests need. clang-tools-19 holds
/// clang-offload-bundler and llvm-19 the llvm-* tools (llvm-dlltool too):
/// both only recommended by clang-19, so named here.
const DEBIAN_PACKAGES: &[&str] = &[
    "clang-19",
    "clang-tools-19",
    "llvm-19",
    "lld-19",
    "libamdhip64-dev",
    "librocrand1",
    "elfutils",
    "cmake",
    "patchelf",
    "valgrind",
    // Counts the fsync calls of `kpack --durable` (tests/tests/durability.rs).
    "strace",
    "binutils",
    "g++",
    // Foreign hosts: AArch64 and ppc64le fixtures, linked by GNU ld and run
    // under qemu-user.
    "gcc-aarch64-linux-gnu",
    "gcc-powerpc64le-linux-gnu",
    "libc6-dev-arm64-cross",
    "libc6-dev-ppc64el-cross",
    "qemu-user",
    // Debian's dh_dwz runs dwz on every package's binaries.
    "dwz",
    // rsvg-convert: the tests render `kpack size --svg` treemaps.
    "librsvg2-bin",
    // Runs the Windows fixtures (PE32+ DLLs and EXEs): /usr/lib/wine/wine64.
    "wine64",
    // The rocFFT kernel-cache tests make and read real SQLite databases.
    "sqlite3",
    // The fourth linker of the AddressSanitizer tests (padded wrapper
    // tables): lld, GNU ld and gold come with lld-19 and binutils.
    "mold",
];

pub fn run(sh: &Shell, root: &Path) -> Result<()> {
    install_debian_packages(sh)?;
    install_rust_components(sh)?;
    fixtures::build_all(sh, root, false)?;
    let py_venv = crate::wheel::py_env(sh, root)?;

    let cargo = cargo();
    let fixtures_dir = root.join(FIXTURES_DIR);
    let corrosion = corrosion(sh, root);
    let steps = [
        (
            "cargo test",
            cmd!(sh, "{cargo} test --workspace")
                .env("KPACK_FIXTURES_DIR", &fixtures_dir)
                .env("KPACK_LLVM_BIN", LLVM_BIN)
                .env("KPACK_PY_VENV", &py_venv),
        ),
        ("cargo fmt", cmd!(sh, "{cargo} fmt --all --check")),
        (
            "cargo clippy",
            cmd!(
                sh,
                "{cargo} clippy --workspace --all-targets -- -D warnings"
            ),
        ),
    ];
    // Run every step, so that one failure does not hide the others.
    let mut failed = Vec::new();
    for (name, command) in steps {
        if let Err(err) = command.run() {
            eprintln!("{name} failed: {err}");
            failed.push(name);
        }
    }
    // The CMake tests exercise kpack's Corrosion path only when Corrosion
    // is there (tests/tests/cmake_common): say which, never skip silently.
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let (line, fails) = corrosion_summary(corrosion.as_deref(), ci);
    println!("{line}");
    if fails {
        failed.push("the Corrosion path (not exercised under CI=true)");
    }
    // Upstream's Python readers on kpack's outputs
    // (tests/tests/upstream_readers.rs) need upstream's package.
    println!("{}", upstream_readers_summary());
    if !failed.is_empty() {
        bail!("failed: {}", failed.join(", "));
    }
    println!("all tests and checks passed");
    Ok(())
}

/// The summary line about kpack's Corrosion path, and whether it fails the
/// run (not exercised, under CI).
fn corrosion_summary(corrosion: Option<&str>, ci: bool) -> (String, bool) {
    match corrosion {
        Some(how) => (format!("Corrosion path: exercised ({how})"), false),
        None => (
            "Corrosion path: NOT exercised (set CORROSION_SOURCE_DIR to a Corrosion source \
             tree, or install Corrosion)"
                .to_string(),
            ci,
        ),
    }
}

/// The summary line about the test of upstream's readers, which runs only
/// when `KPACK_UPSTREAM_PYTHON` names upstream's `python/` directory.
fn upstream_readers_summary() -> String {
    match std::env::var_os("KPACK_UPSTREAM_PYTHON").filter(|d| !d.is_empty()) {
        Some(dir) => format!(
            "upstream readers: exercised (KPACK_UPSTREAM_PYTHON={})",
            Path::new(&dir).display()
        ),
        None => "upstream readers: NOT exercised (set KPACK_UPSTREAM_PYTHON to the python/ \
                 directory of upstream's rocm-kpack)"
            .to_string(),
    }
}

/// Where the CMake tests get Corrosion from, as they decide it: a source
/// tree in `CORROSION_SOURCE_DIR` (relative to the workspace), else an
/// installed package `find_package(Corrosion)` finds; `None` if neither.
fn corrosion(sh: &Shell, root: &Path) -> Option<String> {
    if let Some(dir) = std::env::var_os("CORROSION_SOURCE_DIR").filter(|d| !d.is_empty()) {
        let dir = root.join(dir);
        return dir
            .join("CMakeLists.txt")
            .is_file()
            .then(|| format!("CORROSION_SOURCE_DIR={}", dir.display()));
    }
    // cmake --find-package writes CMakeFiles/ where it runs: not in the
    // checkout.
    let scratch = tempfile::tempdir().ok()?;
    let _in_scratch = sh.push_dir(scratch.path());
    let found = cmd!(
        sh,
        "cmake --find-package -DNAME=Corrosion -DCOMPILER_ID=GNU -DLANGUAGE=C -DMODE=EXIST"
    )
    .quiet()
    .ignore_stdout()
    .ignore_stderr()
    .run()
    .is_ok();
    found.then(|| "an installed Corrosion package".to_string())
}

/// The Debian packages the tests and the fixtures need (see
/// [`DEBIAN_PACKAGES`]).
pub fn install_debian_packages(sh: &Shell) -> Result<()> {
    ensure_debian_packages(sh, DEBIAN_PACKAGES, "test")
}

/// Install the Debian packages of `packages` that are missing (as root, with
/// apt-get); as another user, fail naming them. `task` names the xtask for
/// the messages.
pub fn ensure_debian_packages(sh: &Shell, packages: &[&str], task: &str) -> Result<()> {
    let format = "-f=${db:Status-Abbrev}";
    let mut missing = Vec::new();
    for &package in packages {
        let status = cmd!(sh, "dpkg-query -W {format} {package}")
            .quiet()
            .ignore_status()
            .ignore_stderr()
            .read()
            .with_context(|| {
                format!(
                    "dpkg-query not found: `cargo xtask {task}` sets up Debian 12 machines only; \
                     elsewhere install the equivalents of the Debian packages by hand"
                )
            })?;
        if !status.starts_with("ii") {
            missing.push(package);
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    let uid = cmd!(sh, "id -u").quiet().read()?;
    if uid.trim() != "0" {
        bail!(
            "missing Debian packages: {}\nrun `cargo xtask {task}` as root to install them, or: \
             sudo apt-get install {}",
            missing.join(" "),
            missing.join(" ")
        );
    }
    println!("installing Debian packages: {}", missing.join(" "));
    cmd!(sh, "apt-get update").run()?;
    cmd!(sh, "apt-get install -y {missing...}")
        .env("DEBIAN_FRONTEND", "noninteractive")
        .run()?;
    Ok(())
}

/// rustfmt and clippy ship with rustup's default profile, but not with the
/// minimal one.
fn install_rust_components(sh: &Shell) -> Result<()> {
    let cargo = cargo();
    let mut missing = Vec::new();
    for (subcommand, component) in [("fmt", "rustfmt"), ("clippy", "clippy")] {
        let present = cmd!(sh, "{cargo} {subcommand} --version")
            .quiet()
            .ignore_stdout()
            .ignore_stderr()
            .run()
            .is_ok();
        if !present {
            missing.push(component);
        }
    }
    if !missing.is_empty() {
        cmd!(sh, "rustup component add {missing...}")
            .run()
            .context("installing rustfmt/clippy needs rustup")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corrosion_summary_says_whether_the_path_ran() {
        let (line, fails) = corrosion_summary(Some("CORROSION_SOURCE_DIR=x"), true);
        assert_eq!(
            (line.as_str(), fails),
            ("Corrosion path: exercised (CORROSION_SOURCE_DIR=x)", false)
        );
        let (line, fails) = corrosion_summary(None, false);
        assert!(line.starts_with("Corrosion path: NOT exercised"), "{line}");
        assert!(!fails);
        assert!(corrosion_summary(None, true).1, "fails under CI=true");
    }
}
