//! The workspace the tests drive, for both test binaries (`kpack-e2e`'s
//! and the runtime library's): its root and reference data, cargo
//! (building the programs and libraries the tests run, in the running
//! test's profile), the runtime library in its installed form, and
//! running a program that must succeed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{bail, Context, Result};

/// The workspace root.
pub fn root() -> PathBuf {
    // This crate is tests/testkit.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("tests/testkit is two levels below the workspace")
        .to_path_buf()
}

/// The reference archives (`tests/data/reference-kpack`: `.kpack` files
/// the reference implementation wrote).
pub fn reference_archives() -> PathBuf {
    root().join("tests/data/reference-kpack")
}

/// The cargo that runs us (`$CARGO`, so that `cargo +toolchain test` is
/// honoured), in the workspace root.
pub fn cargo() -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.current_dir(root());
    c
}

/// `cargo run --quiet -p xtask -- `, the workspace named by its manifest
/// (the caller may run it from another directory); arguments follow.
pub fn xtask() -> Command {
    let mut c = cargo();
    c.args(["run", "--quiet", "--manifest-path"])
        .arg(root().join("Cargo.toml"))
        .args(["--package", "xtask", "--"]);
    c
}

/// The profile directory (`<target>/debug`, `<target>/release`) of the
/// running test executable, which cargo puts in `<profile>/deps/`.
pub fn profile_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("the test executable's path")?;
    exe.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .with_context(|| format!("{} is not in a profile directory", exe.display()))
}

/// `cargo build --quiet ARGS` in the running test's profile (so that a
/// `cargo test --release` builds and tests release binaries); the profile
/// directory, which holds the outputs.
pub fn build(args: &[&str]) -> Result<PathBuf> {
    let dir = profile_dir()?;
    let mut c = cargo();
    c.args(["build", "--quiet"]).args(args);
    match dir.file_name().and_then(|n| n.to_str()) {
        // The dev and test profiles.
        Some("debug") | None => {}
        Some(profile) => {
            c.args(["--profile", profile]);
        }
    }
    output(&mut c)?;
    Ok(dir)
}

/// The runtime library as a package installs it, laid out in `dir` by
/// `rocm-kpack-prelink` from this build: `lib/librocm_kpack.a` (prelinked:
/// the C API alone, which a C program links with a C compiler only),
/// `lib/librocm_kpack_cxx.a` (the C++ API's glue) and `include/`.
pub fn install_runtime(dir: &Path) -> Result<()> {
    let profile = build(&[
        "--package",
        "kpack-cxx",
        "--lib",
        "--bin",
        "rocm-kpack-prelink",
    ])?;
    output(
        Command::new(profile.join("rocm-kpack-prelink"))
            .arg(profile.join("librocm_kpack.a"))
            .arg(dir.join("lib"))
            .arg(dir.join("include")),
    )?;
    Ok(())
}

/// Run `cmd`: its output if it exits 0, else an error with its status,
/// stdout and stderr.
pub fn output(cmd: &mut Command) -> Result<Output> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_workspace_and_its_reference_archives() {
        assert!(root().join("Cargo.toml").is_file());
        assert!(root().join("tests/testkit/Cargo.toml").is_file());
        assert!(reference_archives().join("test_zstd.kpack").is_file());
    }

    #[test]
    fn output_names_a_failure() {
        assert!(output(Command::new("true").arg("x")).is_ok());
        let e = output(Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("exit status: 3"), "{e}");
        assert!(
            e.contains("--- stdout\nout\n") && e.contains("--- stderr\nerr\n"),
            "{e}"
        );
    }
}
