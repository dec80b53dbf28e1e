//! Helpers for the artifact modules' unit tests.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use super::tree::{rel_string, scan, NodeKind};
use super::MANIFEST;

/// Every entry below `dir` with its kind, contents (a symlink's target) and
/// mode, to compare trees.
pub fn snapshot(dir: &Path) -> BTreeMap<String, (char, Vec<u8>, u32)> {
    scan(dir)
        .unwrap()
        .into_iter()
        .map(|n| {
            let value = match &n.kind {
                NodeKind::Dir => ('d', Vec::new(), n.mode),
                NodeKind::Symlink(t) => ('l', t.to_string_lossy().into_owned().into_bytes(), 0),
                NodeKind::File { .. } => ('f', fs::read(dir.join(&n.rel)).unwrap(), n.mode),
            };
            (rel_string(&n.rel).unwrap(), value)
        })
        .collect()
}

/// Names of the entries of `dir`, sorted.
pub fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Names of the hidden entries of `dir`, sorted.
pub fn hidden_entries(dir: &Path) -> Vec<String> {
    entries(dir)
        .into_iter()
        .filter(|n| n.starts_with('.'))
        .collect()
}

/// An artifact without fat binaries (prefix `stage`): a header, an empty
/// directory, a symlink and a rocBLAS database file per target.
pub fn small_artifact(dir: &Path, targets: &[&str]) {
    let stage = dir.join("stage");
    fs::create_dir_all(stage.join("lib/rocblas/library")).unwrap();
    fs::create_dir_all(stage.join("include")).unwrap();
    fs::create_dir_all(stage.join("share/empty")).unwrap();
    fs::write(dir.join(MANIFEST), "stage\n").unwrap();
    fs::write(stage.join("include/blas.h"), "int f();\n").unwrap();
    for t in targets {
        let db = format!("lib/rocblas/library/TensileLibrary_{t}.dat");
        fs::write(stage.join(db), t).unwrap();
    }
    std::os::unix::fs::symlink("blas.h", stage.join("include/cblas.h")).unwrap();
}

/// Make a leftover of a killed run in `dir`: a staging directory with a
/// partial artifact and a scratch directory with a spill file.
pub fn killed_run_leftovers(dir: &Path) {
    let staged = dir.join(".kpack-staging-killed/blas_lib_generic/stage");
    fs::create_dir_all(&staged).unwrap();
    fs::write(staged.join("partial"), b"half").unwrap();
    fs::create_dir_all(dir.join(".kpack-scratch-killed")).unwrap();
    fs::write(dir.join(".kpack-scratch-killed/code-objects-0.bin"), b"x").unwrap();
}
