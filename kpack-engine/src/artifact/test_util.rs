//! Helpers for the artifact modules' unit tests.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use super::MANIFEST;
use crate::tree::{rel_string, scan, NodeKind};

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
pub(crate) fn hidden_entries(dir: &Path) -> Vec<String> {
    entries(dir)
        .into_iter()
        .filter(|n| n.starts_with('.'))
        .collect()
}

/// An artifact without fat binaries (prefix `stage`): a header, an empty
/// directory, a symlink and a rocBLAS database file per target.
pub(crate) fn small_artifact(dir: &Path, targets: &[&str]) {
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
pub(crate) fn killed_run_leftovers(dir: &Path) {
    let staged = dir.join(".kpack-staging-killed/blas_lib_generic/stage");
    fs::create_dir_all(&staged).unwrap();
    fs::write(staged.join("partial"), b"half").unwrap();
    fs::create_dir_all(dir.join(".kpack-scratch-killed")).unwrap();
    fs::write(dir.join(".kpack-scratch-killed/code-objects-0.bin"), b"x").unwrap();
}

/// The exit code of a run that [`DieOnAdvance`] ended.
const KILLED: i32 = 86;
/// Set (to the test's directory) in the child process of
/// [`run_killed_child`].
const CHILD_DIR: &str = "KPACK_TEST_KILLED_CHILD_DIR";

/// An observer that ends the process the first time work is reported
/// done, in the middle of a run: like SIGKILL, `exit` runs no destructor,
/// so staging and scratch directories stay behind (and their locks go with
/// the process).
pub(crate) struct DieOnAdvance;

impl crate::Observer for DieOnAdvance {
    fn advance(&self, _bytes: u64) {
        std::process::exit(KILLED);
    }
}

/// In the child process of [`run_killed_child`]: the directory to work in.
pub(crate) fn child_dir() -> Option<PathBuf> {
    std::env::var_os(CHILD_DIR).map(PathBuf::from)
}

/// Run the unit test `name` (its full path) again in a child process that
/// sees `dir` through [`child_dir`], and check that [`DieOnAdvance`] ended
/// it.
pub(crate) fn run_killed_child(name: &str, dir: &Path) {
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--test-threads=1"])
        .env(CHILD_DIR, dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(KILLED), "{name} in a child process");
}
