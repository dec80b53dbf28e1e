//! `kpack verify --tree DIR`: install trees that mix builds (formats.md
//! §6.7). A clean tree passes, also when its components ship different
//! target sets; a fat binary where the archives expect an offloaded one,
//! an offloaded binary that resolves for no target, code objects of
//! another build under a binary's key and a damaged binary are each one
//! line naming the binary, exit 1, and a `{"problems": [...]}` entry with
//! `--json`. `verify --artifacts-dir` reports code objects of another
//! build per artifact.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common::*;
use serde_json::Value;

/// `pack-tree` of `files` (fixture name, path in the tree) into `out`.
fn packed(files: &[(&str, &str)], scratch: &Path, out: &Path) {
    let input = scratch.join(format!("in-{}", out.file_name().unwrap().to_string_lossy()));
    pack_fixtures(files, &input, out);
}

fn verify_tree(tree: &Path) -> Output {
    kpack(&[&"verify", &"--tree", &tree])
}

/// The problems of `--json`: (binary, kind, message).
fn problems(tree: &Path) -> Vec<(String, String, String)> {
    let out = kpack(&[&"verify", &"--tree", &tree, &"--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v.as_object().unwrap().len(), 1, "{v}");
    let p = v["problems"].as_array().unwrap();
    assert_eq!(out.status.code(), Some(if p.is_empty() { 0 } else { 1 }));
    p.iter()
        .map(|p| {
            assert_eq!(p.as_object().unwrap().len(), 3);
            (
                p["binary"].as_str().unwrap().to_string(),
                p["kind"].as_str().unwrap().to_string(),
                p["message"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn copy_tree(src: &Path, dst: &Path) {
    for (rel, _) in snapshot(src) {
        let (s, d) = (src.join(&rel), dst.join(&rel));
        if s.is_dir() {
            std::fs::create_dir_all(&d).unwrap();
        } else {
            std::fs::create_dir_all(d.parent().unwrap()).unwrap();
            std::fs::copy(&s, &d).unwrap();
        }
    }
}

struct Trees {
    _dir: tempfile::TempDir,
    dir: PathBuf,
    /// lib/libx.so = libvadd (gfx1100, gfx1101, gfx942), lib/librdc.so =
    /// librdc (gfx1100, gfx942), bin/libm.so = libmulti.
    clean: PathBuf,
    /// The same paths, lib/libx.so built from librdc instead.
    other: PathBuf,
}

fn trees() -> Trees {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().to_path_buf();
    let clean = dir.join("clean");
    packed(
        &[
            ("libvadd.so", "lib/libx.so"),
            ("librdc.so", "lib/librdc.so"),
            ("libmulti.so", "bin/libm.so"),
        ],
        &dir,
        &clean,
    );
    let other = dir.join("other");
    packed(&[("librdc.so", "lib/libx.so")], &dir, &other);
    Trees {
        _dir: d,
        dir,
        clean,
        other,
    }
}

#[test]
fn a_clean_tree_passes() {
    let t = trees();
    let out = verify_tree(&t.clean);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("OK: 3 binaries with device code (3 offloaded)")
            && text.contains("targets: gfx1100, gfx1101, gfx942"),
        "{text}"
    );
    assert!(problems(&t.clean).is_empty());
}

#[test]
fn a_fat_binary_at_an_archive_key() {
    let t = trees();
    let tree = t.dir.join("fat");
    copy_tree(&t.clean, &tree);
    // The host artifact replaced by a build that was not offloaded, for
    // fewer targets.
    std::fs::copy(
        fixtures_dir().join("therock/libMIOpenCKGroupedConv_gfx1100.so"),
        tree.join("lib/libx.so"),
    )
    .unwrap();
    let out = verify_tree(&tree);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "{text}");
    assert!(
        lines[0].starts_with("lib/libx.so: a fat binary (HIPF wrappers, device code for gfx1100)"),
        "{text}"
    );
    let p = problems(&tree);
    assert_eq!(p.len(), 1);
    assert_eq!(
        (p[0].0.as_str(), p[0].1.as_str()),
        ("lib/libx.so", "fat_binary")
    );
    // A fat binary nobody offloaded (no archive key for it) is no problem.
    std::fs::rename(tree.join("lib/libx.so"), tree.join("lib/liby.so")).unwrap();
    let p = problems(&tree);
    assert!(p.iter().all(|p| p.0 != "lib/liby.so"), "{p:?}");
}

#[test]
fn an_offloaded_binary_that_resolves_for_no_target() {
    let t = trees();
    let tree = t.dir.join("unresolved");
    copy_tree(&t.clean, &tree);
    // Offloaded elsewhere under a key the tree's archives do not have.
    let scratch = t.dir.join("elsewhere");
    kpack_ok(&[
        &"offload",
        &fixture("libvadd.so").path,
        &"-o",
        &tree.join("lib/libz.so"),
        &"--archive-dir",
        &scratch,
        &"--kernel-name",
        &"lib/libz.so",
        &"--search-path",
        &"../.kpack/g_@GFXARCH@.kpack",
    ]);
    let p = problems(&tree);
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(
        (p[0].0.as_str(), p[0].1.as_str()),
        ("lib/libz.so", "unresolved")
    );
    assert!(p[0].2.contains("resolves for no target"), "{}", p[0].2);
    // One target missing among several is not a problem: only gfx942's
    // archive left, every binary still resolves there.
    let tree = t.dir.join("one-target");
    copy_tree(&t.clean, &tree);
    for other in ["gfx1100", "gfx1101"] {
        std::fs::remove_file(tree.join(format!(".kpack/g_{other}.kpack"))).unwrap();
    }
    assert!(problems(&tree).is_empty());
    assert!(verify_tree(&tree).status.success());
}

#[test]
fn code_objects_of_another_build() {
    let t = trees();
    let tree = t.dir.join("mixed");
    copy_tree(&t.clean, &tree);
    // gfx942's archive from the other build: its lib/libx.so#0 is
    // librdc's. Without provenance digests (as upstream's tools write
    // archives) the kernels the binary names tell (provenance.rs has the
    // digests' case).
    strip_digests(
        &t.other.join(".kpack/g_gfx942.kpack"),
        &tree.join(".kpack/g_gfx942.kpack"),
    );
    let p = problems(&tree);
    let kinds: Vec<(&str, &str)> = p.iter().map(|p| (p.0.as_str(), p.1.as_str())).collect();
    // The other build's archive also lacks the two other binaries' code,
    // which they record as split for gfx942.
    assert_eq!(
        kinds,
        [
            ("bin/libm.so", "missing_target"),
            ("lib/librdc.so", "missing_target"),
            ("lib/libx.so", "foreign_code_object")
        ],
        "{p:?}"
    );
    assert!(
        p[2].2.contains(".kpack/g_gfx942.kpack") && p[2].2.contains("#0 for gfx942"),
        "{}",
        p[2].2
    );
    let out = verify_tree(&tree);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("\nlib/libx.so: code objects of another build"),
        "{text}"
    );
}

#[test]
fn a_damaged_binary() {
    let t = trees();
    let tree = t.dir.join("damaged");
    copy_tree(&t.clean, &tree);
    let path = tree.join("bin/libm.so");
    let mut b = std::fs::read(&path).unwrap();
    let at = {
        let elf = kpack_host::elf::ElfView::parse(&b).unwrap();
        elf.section(".rocm_kpack_ref").unwrap().unwrap().offset as usize
    };
    b[at] = 0xc1;
    std::fs::write(&path, b).unwrap();
    let p = problems(&tree);
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(
        (p[0].0.as_str(), p[0].1.as_str()),
        ("bin/libm.so", "invalid_binary")
    );
}

/// The same check in split artifacts: an artifact of one build's split
/// installed with another build's per-target artifact.
#[test]
fn artifacts_with_code_objects_of_another_build() {
    let dir = tempfile::tempdir().unwrap();
    let split = |fixture_name: &str, out: &Path| {
        let art = dir.path().join(format!("in-{fixture_name}/blas_lib_x"));
        std::fs::create_dir_all(art.join("p/lib")).unwrap();
        std::fs::write(art.join("artifact_manifest.txt"), "p\n").unwrap();
        std::fs::copy(fixture(fixture_name).path, art.join("p/lib/libx.so")).unwrap();
        kpack_ok(&[
            &"split",
            &"--artifact-dir",
            &art,
            &"--artifact-prefix",
            &"blas_lib",
            &"--output-dir",
            &out,
        ]);
    };
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    split("libvadd.so", &a);
    split("librdc.so", &b);
    kpack_ok(&[&"verify", &"--artifacts-dir", &a]);
    std::fs::remove_dir_all(a.join("blas_lib_gfx942")).unwrap();
    copy_tree(&b.join("blas_lib_gfx942"), &a.join("blas_lib_gfx942"));
    let out = kpack(&[&"verify", &"--artifacts-dir", &a]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("code object p/lib/libx.so#0 for gfx942 (installed with blas_lib_gfx942) comes from another build"),
        "{text}"
    );
}

/// A real library nobody here built (Debian's librocrand, one build) packed
/// as a tree passes: every code object shares kernels with the binary.
#[test]
fn a_real_library_passes() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in/lib");
    std::fs::create_dir_all(&input).unwrap();
    std::fs::copy(LIBROCRAND, input.join("librocrand.so.1.1")).unwrap();
    let tree = dir.path().join("tree");
    kpack_ok(&[
        &"pack-tree",
        &"--input",
        &input.parent().unwrap(),
        &"--output",
        &tree,
        &"--group-name",
        &"rocrand",
    ]);
    assert!(problems(&tree).is_empty());
}

/// A target a binary records (`kpack_targets`) and the tree serves, but
/// whose archive lacks the binary's code objects: reported. A target the
/// tree has no archive for at all is an install of fewer targets: fine.
#[test]
fn a_recorded_target_the_tree_serves_without_the_binarys_code() {
    let t = scratch();
    let out = t.path().join("packed");
    packed(
        &[
            ("libvadd.so", "lib/libvadd.so"),
            ("libmulti.so", "lib/libmulti.so"),
        ],
        t.path(),
        &out,
    );
    assert!(problems(&out).is_empty());
    // The gfx942 archive again, without libmulti's code objects.
    let path = out.join(".kpack/g_gfx942.kpack");
    let a = kpack_loader::open_archive(&path).unwrap();
    let mut w = kpack_host::ArchiveWriter::new("g", "gfx942", vec!["gfx942".into()]);
    for key in a.binaries().filter(|k| k.starts_with("lib/libvadd.so#")) {
        w.add(key, "gfx942", a.kernel(key, "gfx942").unwrap(), None)
            .unwrap();
    }
    drop(a);
    w.write(&path).unwrap();
    let got = problems(&out);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        (got[0].0.as_str(), got[0].1.as_str()),
        ("lib/libmulti.so", "missing_target")
    );
    assert!(got[0].2.contains("split for gfx942"), "{}", got[0].2);
    // No gfx942 archive at all: an install of the other targets.
    std::fs::remove_file(&path).unwrap();
    assert!(problems(&out).is_empty(), "{:?}", problems(&out));
}
