//! Torch-like wheels: a tree with a `torch-<version>.dist-info`, packed by
//! PyPI's `wheel pack` (deflate) with the wheel tests' Python.

use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use xshell::Shell;

/// The platform tag of the bench's wheels.
pub const TAG: &str = "cp311-cp311-linux_x86_64";

/// The Python of the wheel tests' virtual environment (PyPI's `wheel`):
/// `$KPACK_PY_VENV`, else `root/target/py-venv` (`cargo xtask bench` and
/// `cargo xtask py-env` make it).
pub fn python(root: &Path) -> Result<PathBuf> {
    let venv = std::env::var_os("KPACK_PY_VENV")
        .map_or_else(|| root.join("target/py-venv"), PathBuf::from);
    let python = venv.join("bin/python");
    if !python.is_file() {
        bail!(
            "{} missing (`cargo xtask py-env` makes it)",
            python.display()
        );
    }
    Ok(python)
}

/// The file name of torch's wheel of `version`.
pub fn file_name(version: &str) -> String {
    format!("torch-{version}-{TAG}.whl")
}

/// Pack `tree` (holding `torch/`) as torch `version` into `out_dir`: its
/// dist-info (METADATA, WHEEL, an empty RECORD) written first. Returns the
/// wheel.
pub fn pack_torch(root: &Path, tree: &Path, version: &str, out_dir: &Path) -> Result<PathBuf> {
    let di = tree.join(format!("torch-{version}.dist-info"));
    std::fs::create_dir_all(&di)?;
    std::fs::write(
        di.join("METADATA"),
        format!("Metadata-Version: 2.1\nName: torch\nVersion: {version}\n"),
    )?;
    std::fs::write(
        di.join("WHEEL"),
        format!("Wheel-Version: 1.0\nGenerator: kpack-bench\nRoot-Is-Purelib: false\nTag: {TAG}\n"),
    )?;
    std::fs::write(di.join("RECORD"), "")?;
    pack(root, tree, &file_name(version), out_dir)
}

/// Pack `tree` (its dist-info written) into `out_dir` with `wheel pack`;
/// the wheel, which must be named `name`.
pub fn pack(root: &Path, tree: &Path, name: &str, out_dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(out_dir)?;
    let python = python(root)?;
    let sh = Shell::new()?;
    xshell::cmd!(sh, "{python} -m wheel pack {tree} -d {out_dir}")
        .quiet()
        .run()
        .context("python -m wheel pack")?;
    let wheel = out_dir.join(name);
    ensure!(wheel.is_file(), "{} was not made", wheel.display());
    Ok(wheel)
}
