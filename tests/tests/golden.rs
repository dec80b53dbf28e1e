//! Golden outputs: what kpack writes for committed inputs, byte for byte.
//!
//! `tests/golden/inputs/` holds real fat binaries (copies of the compiled
//! fixtures and the demo sample, committed so that the expected bytes do not
//! depend on the compiler installed). Each test runs one command over them
//! and compares every file it writes (path, kind, size, SHA-256; symlink
//! targets) with `tests/golden/expected/<name>.txt`. A refactoring must not
//! change a byte of what kpack writes; a deliberate format change updates the
//! expectations with `KPACK_UPDATE_GOLDEN=1 cargo test -p kpack-e2e --test
//! e2e -- golden::` and says why in its commit.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use crate::common::*;
use sha2::{Digest, Sha256};

fn golden_dir() -> PathBuf {
    workspace().join("tests/golden")
}

fn input(name: &str) -> PathBuf {
    golden_dir().join("inputs").join(name)
}

/// The fat binaries among the inputs.
const FAT: &[&str] = &[
    "libkpack_sample.so",
    "libvadd.so",
    "vadd_pie",
    "vadd_nopie",
    "libvadd_compressed.so",
    "librdc.so",
    "libmulti.so",
    "libwide.so",
    "libvadd_relr.so",
    "libmixed.so",
];

/// One line per entry under `root`, sorted: `path kind size sha256` for
/// files, `path -> target` for symlinks, `path/` for directories.
fn describe(root: &Path) -> String {
    let mut lines = Vec::new();
    walk(root, Path::new(""), &mut lines);
    lines.sort();
    lines.join("\n") + "\n"
}

fn walk(root: &Path, rel: &Path, out: &mut Vec<String>) {
    let mut entries: Vec<_> = fs::read_dir(root.join(rel))
        .unwrap()
        .map(|e| e.unwrap())
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let rel = rel.join(e.file_name());
        let shown = rel.to_string_lossy().into_owned();
        let ty = e.file_type().unwrap();
        if ty.is_symlink() {
            let target = fs::read_link(root.join(&rel)).unwrap();
            out.push(format!("{shown} -> {}", target.display()));
        } else if ty.is_dir() {
            out.push(format!("{shown}/"));
            walk(root, &rel, out);
        } else {
            let bytes = fs::read(root.join(&rel)).unwrap();
            let digest = Sha256::digest(&bytes);
            let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
            out.push(format!("{shown} {} {hex}", bytes.len()));
        }
    }
}

/// Compare what was written under `root` with the expectation `name`.
fn check(name: &str, root: &Path) {
    let actual = describe(root);
    let path = golden_dir().join("expected").join(format!("{name}.txt"));
    if std::env::var_os("KPACK_UPDATE_GOLDEN").is_some() {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, &actual).unwrap();
        return;
    }
    let expected = fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (KPACK_UPDATE_GOLDEN=1 writes it)", path.display()));
    if actual != expected {
        let keep = workspace().join("target/golden-actual").join(name);
        let _ = fs::remove_dir_all(&keep);
        fs::create_dir_all(keep.parent().unwrap()).unwrap();
        copy_tree(root, &keep);
        let diff: Vec<String> = diff_lines(&expected, &actual);
        panic!(
            "{name}: output differs from {} (actual output kept in {}):\n{}",
            path.display(),
            keep.display(),
            diff.join("\n")
        );
    }
}

fn diff_lines(expected: &str, actual: &str) -> Vec<String> {
    let e: Vec<&str> = expected.lines().collect();
    let a: Vec<&str> = actual.lines().collect();
    let mut out: Vec<String> = e
        .iter()
        .filter(|l| !a.contains(l))
        .map(|l| format!("- {l}"))
        .collect();
    out.extend(
        a.iter()
            .filter(|l| !e.contains(l))
            .map(|l| format!("+ {l}")),
    );
    out
}

fn copy_tree(from: &Path, to: &Path) {
    let st = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(st.success());
}

use std::process::Command;

#[test]
fn offload_outputs() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    for name in FAT {
        kpack_ok(&[
            &"offload",
            &input(name),
            &"-o",
            &out.join(name),
            &"--archive-dir",
            &out.join("kpack"),
        ]);
    }
    // Options that change the metadata and the archives.
    kpack_ok(&[
        &"offload",
        &input("libmulti.so"),
        &"-o",
        &out.join("lib/libmulti.so.1"),
        &"--archive-dir",
        &out.join("archives"),
        &"--kernel-name",
        &"lib/libmulti.so.1",
        &"--search-path",
        &"../archives/multi_@GFXARCH@.kpack",
        &"--search-path",
        &"/opt/rocm/.kpack/multi_@GFXARCH@.kpack",
        &"--group",
        &"multi",
        &"--compression",
        &"none",
    ]);
    kpack_ok(&[
        &"offload",
        &input("libwide.so"),
        &"-o",
        &out.join("lib/libwide9.so"),
        &"--archive-dir",
        &out.join("archives"),
        &"--compression-level",
        &"9",
    ]);
    check("offload", &out);
}

/// An install tree made of the inputs: a symlink, a host-only library, an
/// executable and a data file beside the fat binaries.
fn install_tree(root: &Path) {
    fs::create_dir_all(root.join("lib/sub")).unwrap();
    fs::create_dir_all(root.join("bin")).unwrap();
    fs::create_dir_all(root.join("share/doc")).unwrap();
    for (from, to) in [
        ("libvadd.so", "lib/libvadd.so.1"),
        ("libmulti.so", "lib/libmulti.so"),
        ("librdc.so", "lib/sub/librdc.so"),
        ("libhostonly.so", "lib/libhostonly.so"),
        ("vadd_pie", "bin/vadd_pie"),
        ("libvadd_compressed.so", "lib/libvadd_compressed.so"),
    ] {
        fs::copy(input(from), root.join(to)).unwrap();
    }
    symlink("libvadd.so.1", root.join("lib/libvadd.so")).unwrap();
    fs::write(root.join("share/doc/README"), "not a binary\n").unwrap();
}

#[test]
fn pack_tree_outputs() {
    let tmp = tempfile::tempdir().unwrap();
    let tree = tmp.path().join("tree");
    install_tree(&tree);
    let out = tmp.path().join("out");
    kpack_ok(&[
        &"pack-tree",
        &"--input",
        &tree,
        &"--output",
        &out,
        &"--group-name",
        &"golden",
    ]);
    check("pack-tree", &out);
}

const ROCBLAS: &str = "math-libs/BLAS/rocBLAS/stage";
const FFT: &str = "math-libs/rocFFT/stage";

/// One TheRock artifact (`blas_lib_gfx110X-dgpu`) of two prefixes, with
/// rocBLAS database files.
fn artifact(shards: &Path, shard: &str) -> PathBuf {
    let art = shards.join(shard).join("blas_lib_gfx110X-dgpu");
    let blas = art.join(ROCBLAS);
    let fft = art.join(FFT);
    fs::create_dir_all(blas.join("lib/rocblas/library")).unwrap();
    fs::create_dir_all(fft.join("lib")).unwrap();
    fs::create_dir_all(fft.join("bin")).unwrap();
    fs::copy(input("libwide.so"), blas.join("lib/librocblas.so.5.2")).unwrap();
    symlink("librocblas.so.5.2", blas.join("lib/librocblas.so.5")).unwrap();
    symlink("librocblas.so.5", blas.join("lib/librocblas.so")).unwrap();
    let lib = blas.join("lib/rocblas/library");
    fs::write(lib.join("Kernels.so-000-gfx1100.hsaco"), b"gfx1100 code").unwrap();
    fs::write(lib.join("TensileLibrary_gfx942.dat"), b"gfx942 data").unwrap();
    fs::write(lib.join("TensileLibrary_gfx1030.co"), b"gfx1030 code").unwrap();
    fs::write(lib.join("TensileManifest.txt"), b"generic").unwrap();
    fs::copy(input("libmulti.so"), fft.join("lib/librocfft.so")).unwrap();
    fs::copy(input("vadd_nopie"), fft.join("bin/vadd")).unwrap();
    fs::copy(input("libhostonly.so"), fft.join("lib/libhost.so")).unwrap();
    fs::write(
        art.join("artifact_manifest.txt"),
        format!("{ROCBLAS}\n{FFT}\n"),
    )
    .unwrap();
    art
}

#[test]
fn split_and_recombine_outputs() {
    let tmp = tempfile::tempdir().unwrap();
    let art = artifact(&tmp.path().join("build"), "gfx110X-build");
    let split = tmp.path().join("split/gfx110X-build");
    kpack_ok(&[
        &"split",
        &"--artifact-dir",
        &art,
        &"--output-dir",
        &split,
        &"--split-databases",
        &"rocblas",
    ]);
    check("split", &split);

    let config = tmp.path().join("config.json");
    fs::write(
        &config,
        r#"{"primary_shard": "gfx110X-build",
 "architecture_groups": {
   "gfx110X": {"display_name": "RDNA3", "architectures": ["gfx1100"]},
   "gfx90X": {"display_name": "MI200", "architectures": ["gfx900", "gfx906", "gfx908", "gfx90a"]},
   "gfx94X": {"display_name": "MI300", "architectures": ["gfx942"]}},
 "validation": {"error_on_duplicate_device_code": true,
                "verify_generic_artifacts_match": false,
                "error_on_missing_architecture": false}}"#,
    )
    .unwrap();
    let out = tmp.path().join("recombined");
    kpack_ok(&[
        &"recombine",
        &"--input-shards-dir",
        &tmp.path().join("split"),
        &"--config",
        &config,
        &"--output-dir",
        &out,
    ]);
    check("recombine", &out);
}
