//! `cargo xtask wheel --out DIR`: kpack as a pip-installable wheel (the
//! `kpack` binary and the `rocm_kpack.tools.*` entry points of `python/`),
//! built by maturin from PyPI; and `cargo xtask py-env`, the Python virtual
//! environment the wheel tests use (`target/py-venv`: pip, PyPI's `wheel`
//! and `maturin`; `variantlib` and `uv`, which check and install PEP 825
//! variant wheels; and a wheelhouse with PyPI's `rocm-bootstrap` wheel).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use xshell::{cmd, Shell};

/// What the environment gets from PyPI. Changing it rebuilds the
/// environment (the stamp file holds this text).
const REQUIREMENTS: &[&str] = &[
    "wheel>=0.43,<1",
    "maturin>=1.5,<2",
    "variantlib==0.2.2",
    "uv==0.13.8",
];
/// The wheelhouse's wheels (downloaded, not installed).
const WHEELHOUSE: &[&str] = &["rocm-bootstrap==0.3.0"];
const STAMP: &str = ".kpack-py-env";

/// The virtual environment below `target/`.
pub fn venv_dir(root: &Path) -> PathBuf {
    root.join("target/py-venv")
}

/// Create or update `target/py-venv` (needs `python3` with its `venv`
/// module; Debian: python3-venv). Cheap when it is up to date.
pub fn py_env(sh: &Shell, root: &Path) -> Result<PathBuf> {
    let venv = venv_dir(root);
    let stamp = venv.join(STAMP);
    let want = format!("{}\n{}\n", REQUIREMENTS.join("\n"), WHEELHOUSE.join("\n"));
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(want.as_str()) {
        return Ok(venv);
    }
    if !venv.join("bin/python").is_file() {
        cmd!(sh, "python3 -m venv {venv}")
            .run()
            .context("python3 -m venv (Debian: apt-get install python3-venv)")?;
    }
    let python = venv.join("bin/python");
    let house = venv.join("wheelhouse");
    cmd!(
        sh,
        "{python} -m pip install --quiet --disable-pip-version-check {REQUIREMENTS...}"
    )
    .run()
    .context("pip install (PyPI)")?;
    cmd!(sh, "{python} -m pip download --quiet --disable-pip-version-check --no-deps --dest {house} {WHEELHOUSE...}")
        .run()
        .context("pip download (PyPI)")?;
    std::fs::write(&stamp, want)?;
    Ok(venv)
}

/// Build the wheel into `out` (release, stripped; `debug`: the dev
/// profile, which reuses the test build); returns its path.
pub fn build(sh: &Shell, root: &Path, out: &Path, debug: bool) -> Result<PathBuf> {
    let venv = py_env(sh, root)?;
    let maturin = venv.join("bin/maturin");
    std::fs::create_dir_all(out)?;
    let out = std::path::absolute(out)?;
    let _dir = sh.push_dir(root.join("python"));
    let profile: &[&str] = if debug {
        &[]
    } else {
        &["--release", "--strip"]
    };
    let before = wheels(&out)?;
    cmd!(sh, "{maturin} build --quiet {profile...} --out {out}")
        .env("PATH", path_with(&venv))
        .run()
        .context("maturin build")?;
    let mut new: Vec<PathBuf> = wheels(&out)?;
    new.retain(|w| !before.contains(w) || std::fs::metadata(w).is_ok());
    new.sort_by_key(|w| std::fs::metadata(w).and_then(|m| m.modified()).ok());
    match new.pop() {
        Some(w) => {
            println!("{}", w.display());
            Ok(w)
        }
        None => bail!("maturin wrote no wheel into {}", out.display()),
    }
}

fn wheels(dir: &Path) -> Result<Vec<PathBuf>> {
    Ok(std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().is_some_and(|n| {
                n.to_string_lossy().starts_with("rocm_kpack-")
                    && n.to_string_lossy().ends_with(".whl")
            })
        })
        .collect())
}

/// PATH with the environment's `bin` first (maturin finds its Python).
fn path_with(venv: &Path) -> String {
    format!(
        "{}:{}",
        venv.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    )
}
