//! `cargo xtask wheel --out DIR`: kpack as a pip-installable abi3 wheel
//! (the extension of `kpack-python/`, the packages `kpack` and `rocm_kpack`
//! of `python/`, the `kpack` console script), built by maturin from PyPI
//! with the `pyproject.toml` at the root; and `cargo xtask py-env`, the
//! Python virtual environment the wheel tests use (`target/py-venv`: pip,
//! PyPI's `wheel` and `maturin`; `variantlib` and `uv`, which check and
//! install PEP 825 variant wheels; and a wheelhouse with PyPI's
//! `rocm-bootstrap` and `maturin` wheels, and `pytest`, `msgpack` and
//! `zstandard` wheels for each Python the tests run on).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use xshell::{cmd, Shell};

/// What the environment gets from PyPI. Changing it rebuilds the
/// environment (the stamp file holds this text).
const REQUIREMENTS: &[&str] = &[
    "wheel>=0.43,<1",
    "maturin>=1.9.4,<2",
    "variantlib==0.2.2",
    "uv==0.13.8",
    "pytest>=8,<9",
    "msgpack>=1,<2",
    "zstandard>=0.22,<1",
];
/// The wheelhouse's wheels (downloaded, not installed): maturin for `pip
/// install .` from a checkout, offline (PEP 517 build isolation).
const WHEELHOUSE: &[&str] = &["rocm-bootstrap==0.3.0", "maturin>=1.9.4,<2"];
/// Wheels of the Python tests, downloaded for every interpreter they run
/// on ([`test_pythons`]), so that fresh environments install offline.
const TEST_WHEELS: &[&str] = &["pytest>=8,<9", "msgpack>=1,<2", "zstandard>=0.22,<1"];
const STAMP: &str = ".kpack-py-env";
/// The file in the environment listing [`test_pythons`], one a line.
pub const TEST_PYTHONS: &str = "test-pythons.txt";

/// The virtual environment below `target/`.
pub fn venv_dir(root: &Path) -> PathBuf {
    root.join("target/py-venv")
}

/// Create or update `target/py-venv` (needs `python3` with its `venv`
/// module; Debian: python3-venv). Cheap when it is up to date.
pub fn py_env(sh: &Shell, root: &Path) -> Result<PathBuf> {
    let venv = venv_dir(root);
    let stamp = venv.join(STAMP);
    let pythons = test_pythons(sh);
    let want = format!(
        "{}\n{}\n{}\n{}\nvenv python too\n",
        REQUIREMENTS.join("\n"),
        WHEELHOUSE.join("\n"),
        TEST_WHEELS.join("\n"),
        pythons
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
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
    for py in std::iter::once(&python).chain(&pythons) {
        cmd!(sh, "{py} -m pip download --quiet --disable-pip-version-check --only-binary=:all: --dest {house} {TEST_WHEELS...}")
            .run()
            .with_context(|| format!("pip download of the test wheels for {}", py.display()))?;
    }
    let list: String = pythons
        .iter()
        .map(|p| format!("{}\n", p.display()))
        .collect();
    std::fs::write(venv.join(TEST_PYTHONS), list)?;
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
    let _dir = sh.push_dir(root);
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

/// The interpreters the Python tests run on, besides the environment's
/// own: CPython 3.9 (the oldest the abi3 wheel supports) and the newest
/// CPython found, each when installed (on PATH as `python3.N`, or under
/// pyenv's `~/.pyenv/versions`).
pub fn test_pythons(sh: &Shell) -> Vec<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = Vec::new();
    for minor in 9..=14u32 {
        if let Some(p) = find_python(sh, minor) {
            found.push((minor, p));
        }
    }
    let mut out = Vec::new();
    if let Some((_, p)) = found.iter().find(|(m, _)| *m == 9) {
        out.push(p.clone());
    }
    if let Some((m, p)) = found.last() {
        if *m != 9 {
            out.push(p.clone());
        }
    }
    out
}

fn find_python(sh: &Shell, minor: u32) -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(home) = std::env::var_os("HOME") {
        let versions = Path::new(&home).join(".pyenv/versions");
        if let Ok(rd) = std::fs::read_dir(&versions) {
            let mut dirs: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
            dirs.sort();
            for d in dirs.into_iter().rev() {
                let name = d
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned();
                if name.starts_with(&format!("3.{minor}.")) {
                    candidates.push(d.join("bin/python3"));
                }
            }
        }
    }
    candidates.push(PathBuf::from(format!("/usr/bin/python3.{minor}")));
    candidates.into_iter().find(|p| {
        p.is_file()
            && cmd!(sh, "{p} -c 'import venv, ensurepip'")
                .quiet()
                .ignore_stdout()
                .ignore_stderr()
                .run()
                .is_ok()
    })
}

/// PATH with the environment's `bin` first (maturin finds its Python).
fn path_with(venv: &Path) -> String {
    format!(
        "{}:{}",
        venv.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    )
}
