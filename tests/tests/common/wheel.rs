//! What the wheel tests share: the Python virtual environment that
//! `cargo xtask test` prepares (PyPI's `pip`, `wheel` and `maturin`, and a
//! wheelhouse holding PyPI's `rocm-bootstrap` wheel), and a torch-like fat
//! wheel built from the HIP fixtures.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::*;

/// The virtual environment (`KPACK_PY_VENV`, default `target/py-venv`).
pub fn venv() -> PathBuf {
    let dir = std::env::var_os("KPACK_PY_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/py-venv"));
    assert!(
        dir.join("bin/python").is_file() && wheelhouse_of(&dir).is_dir(),
        "no Python environment in {}: run `cargo xtask test` (or `cargo xtask py-env`)",
        dir.display()
    );
    dir
}

fn wheelhouse_of(venv: &Path) -> PathBuf {
    venv.join("wheelhouse")
}

/// The local wheelhouse: PyPI's rocm-bootstrap wheel.
pub fn wheelhouse() -> PathBuf {
    wheelhouse_of(&venv())
}

/// Run the environment's Python; assert success; stdout.
pub fn python_ok(args: &[&dyn AsRef<std::ffi::OsStr>]) -> String {
    let mut c = Command::new(venv().join("bin/python"));
    for a in args {
        c.arg(a.as_ref());
    }
    run_ok(&mut c)
}

/// A fresh virtual environment at `dir` (its pip is the test
/// environment's, run with `--python`).
pub fn new_venv(dir: &Path) -> PathBuf {
    python_ok(&[&"-m", &"venv", &"--without-pip", &dir]);
    dir.to_path_buf()
}

/// `pip install` into the environment `target` from local directories
/// only.
pub fn pip_install(target: &Path, links: &[&Path], reqs: &[&str]) -> Output {
    let mut c = Command::new(venv().join("bin/python"));
    c.args(["-m", "pip", "--python"])
        .arg(target.join("bin/python"))
        .args(["install", "--no-index", "--disable-pip-version-check"]);
    for l in links {
        c.arg("--find-links").arg(l);
    }
    c.args(reqs);
    c.output().expect("run pip")
}

/// The site-packages directory of a virtual environment.
pub fn site_packages(venv: &Path) -> PathBuf {
    let lib = venv.join("lib");
    let py = fs::read_dir(&lib)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("python")
        })
        .expect("lib/python3.x");
    py.join("site-packages")
}

pub const VERSION: &str = "2.10.0+rocm7.1";
pub const TAG: &str = "cp311-cp311-linux_x86_64";

/// The fat binaries of the torch-like wheel: path below `torch/` and
/// fixture.
pub const FAT: &[(&str, &str)] = &[
    ("lib/libtorch_hip.so", "libmulti.so"),
    ("lib/libc10_hip.so", "libvadd_compressed.so"),
    ("lib/librdc_kernels.so", "librdc.so"),
    ("bin/vadd", "vadd_pie"),
    ("_kernels.so", "libvadd.so"),
];

/// MIOpen's per-target CK library (a fat binary and a database file).
pub const MIOPEN_CK: (&str, &str) = ("lib/libMIOpenCKGroupedConv_gfx1100.so", "libvadd.so");

/// Database files below `torch/`: path and the device wheel they go to.
pub const DATABASES: &[(&str, &str)] = &[
    (
        "lib/rocblas/library/TensileLibrary_Type_HH_gfx1100.co",
        "gfx1100",
    ),
    (
        "lib/rocblas/library/TensileLibrary_Type_HH_gfx942.co",
        "gfx942",
    ),
    (
        "lib/rocblas/library/TensileLibrary_Type_HH_gfx90a-xnack+.hsaco",
        "gfx90a",
    ),
    ("lib/hipblaslt/library/extop_gfx1100.co", "gfx1100"),
    ("lib/hipblaslt/library/extop_gfx942.co", "gfx942"),
    (
        "lib/aotriton.images/amd-gfx110x/flash/attn_fwd.aks2",
        "gfx110x",
    ),
    (
        "lib/aotriton.images/amd-gfx942/flash/attn_fwd.aks2",
        "gfx942",
    ),
    ("share/miopen/db/gfx1100.kdb", "gfx1100"),
    ("share/miopen/db/gfx942130.kdb", "gfx942"),
];

/// Files below `torch/` that stay in the host wheel as they are.
pub const GENERIC: &[&str] = &[
    "__init__.py",
    "lib/libcuda_like.so",
    "lib/rocblas/library/TensileLibrary_fallback.dat",
    "share/miopen/db/readme.txt",
];

/// Lay out the unpacked torch-like wheel at `root` (with a dist-info whose
/// RECORD is for the directory as it is; `python -m wheel pack` turns it
/// into a `.whl`). `symlinks`: also `lib/libtorch_hip.so.1` →
/// `libtorch_hip.so` (a directory input keeps it; `wheel pack` follows
/// it).
pub fn torch_tree(root: &Path, symlinks: bool) {
    let fixtures = fixtures_dir();
    let t = root.join("torch");
    for (rel, fixture) in FAT.iter().chain([&MIOPEN_CK]) {
        let dst = t.join(rel);
        fs::create_dir_all(dst.parent().unwrap()).unwrap();
        fs::copy(fixtures.join(fixture), &dst).unwrap();
    }
    fs::set_permissions(t.join("bin/vadd"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::copy(
        fixtures.join("libhostonly.so"),
        t.join("lib/libcuda_like.so"),
    )
    .unwrap();
    for (rel, key) in DATABASES {
        let dst = t.join(rel);
        fs::create_dir_all(dst.parent().unwrap()).unwrap();
        fs::write(&dst, format!("{key} database {rel}\n").repeat(50)).unwrap();
    }
    for rel in GENERIC.iter().filter(|r| !r.ends_with(".so")) {
        let dst = t.join(rel);
        fs::create_dir_all(dst.parent().unwrap()).unwrap();
        fs::write(&dst, format!("generic {rel}\n")).unwrap();
    }
    if symlinks {
        std::os::unix::fs::symlink("libtorch_hip.so", t.join("lib/libtorch_hip.so.1")).unwrap();
    }
    fs::create_dir_all(root.join("torchgen")).unwrap();
    fs::write(root.join("torchgen/__init__.py"), "# outside the overlay\n").unwrap();
    let di = root.join(format!("torch-{VERSION}.dist-info"));
    fs::create_dir_all(&di).unwrap();
    fs::write(
        di.join("METADATA"),
        format!("Metadata-Version: 2.1\nName: torch\nVersion: {VERSION}\nSummary: Tensors\n\nThe body.\n"),
    )
    .unwrap();
    fs::write(
        di.join("WHEEL"),
        format!("Wheel-Version: 1.0\nGenerator: kpack-tests\nRoot-Is-Purelib: false\nTag: {TAG}\n"),
    )
    .unwrap();
    fs::write(di.join("RECORD"), "").unwrap();
}

/// The torch-like wheel as a `.whl` in `dir` (made by `python -m wheel
/// pack`, which writes its RECORD).
pub fn torch_wheel(dir: &Path) -> PathBuf {
    let src = dir.join("torch-src");
    torch_tree(&src, false);
    python_ok(&[&"-m", &"wheel", &"pack", &src, &"-d", &dir]);
    fs::remove_dir_all(&src).unwrap();
    let whl = dir.join(format!("torch-{VERSION}-{TAG}.whl"));
    assert!(whl.is_file());
    whl
}

/// The arguments TheRock's Linux workflow gives split_python_wheels (with
/// a device requirement pip can resolve here: none).
pub fn therock_args(input: &Path, out: &Path) -> Vec<std::ffi::OsString> {
    let mut v: Vec<std::ffi::OsString> = vec![
        "--input".into(),
        input.into(),
        "--output-dir".into(),
        out.into(),
    ];
    for a in [
        "--device-package-prefix",
        "amd-torch-device",
        "--overlay-root",
        "torch/",
        "--wheel-type",
        "torch-fat",
        "--compression",
        "zstd",
        "-j",
        "2",
    ] {
        v.push(a.into());
    }
    v
}

/// `base` arguments with those of `extra` appended, a flag of `extra`
/// replacing the same flag (and its value) in `base`: kpack refuses a
/// single-valued flag given twice.
pub fn with_overrides(base: Vec<std::ffi::OsString>, extra: &[&str]) -> Vec<std::ffi::OsString> {
    let flags: Vec<&str> = extra
        .iter()
        .copied()
        .filter(|a| a.starts_with('-'))
        .collect();
    let mut out = Vec::new();
    let mut skip_value = false;
    for a in base {
        let s = a.to_string_lossy().into_owned();
        if skip_value && !s.starts_with('-') {
            skip_value = false;
            continue;
        }
        skip_value = flags.contains(&s.as_str());
        if !skip_value {
            out.push(a);
        }
    }
    out.extend(extra.iter().map(Into::into));
    out
}
