//! Nothing is written outside the output directory, whatever the inputs
//! say: bundle triples and archive targets that are paths, archive keys
//! such as `../../x` or `/etc/x`, symlinks in artifacts and install trees
//! that point outside (copied as links, never followed for writing), and
//! symlinks in one shard's artifact where another shard has a directory.
//!
//! Each test works in a fresh directory holding the input, the output and
//! an `outside/` directory that must stay empty.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use crate::common::*;
use kpack_bundle::write_bundle;
use kpack_host::extract::parse_archive_file_name;
use kpack_host::ArchiveWriter;

struct Scene {
    tmp: tempfile::TempDir,
}

impl Scene {
    fn new() -> Scene {
        let s = Scene {
            tmp: tempfile::tempdir().unwrap(),
        };
        fs::create_dir_all(s.outside()).unwrap();
        s
    }
    fn root(&self) -> &Path {
        self.tmp.path()
    }
    fn outside(&self) -> PathBuf {
        self.root().join("outside")
    }
    /// Nothing was written to `outside/`, nor next to the scene.
    fn check_outside(&self) {
        assert!(
            listing(&self.outside()).is_empty(),
            "written outside: {:?}",
            listing(&self.outside())
        );
    }
}

const HOST: &str = "host-x86_64-unknown-linux--";

#[test]
fn extract_bundle_targets_that_are_paths() {
    let s = Scene::new();
    let abs = s.outside().join("abs");
    let abs_triple = format!("hipv4-amdgcn-amd-amdhsa--{}", abs.display());
    for (name, triple) in [
        ("rel.bin", "hipv4-amdgcn-amd-amdhsa--../../outside/rel"),
        ("abs.bin", abs_triple.as_str()),
        ("dot.bin", "hipv4-amdgcn-amd-amdhsa--.."),
    ] {
        let input = s.root().join(name);
        fs::write(&input, write_bundle(&[(HOST, b""), (triple, b"PWNED")], 1)).unwrap();
        let out = s.root().join("a/b/out");
        let err = kpack_fails(&[&"extract", &input, &"-o", &out]);
        assert!(err.contains("which is not a target ID"), "{err}");
        assert!(!out.exists());
        let err = kpack_fails(&[
            &"offload",
            &input,
            &"-o",
            &s.root().join("o/x.so"),
            &"--archive-dir",
            &s.root().join("o/.kpack"),
        ]);
        assert!(err.contains(name), "{err}");
    }
    s.check_outside();
    assert!(!s.root().join("a").exists() && !s.root().join("o").exists());
}

#[test]
fn extract_archive_keys_that_are_paths() {
    let s = Scene::new();
    let keys = [
        "../../outside/x#0",
        "/etc/kpack-evil#0",
        "a/../../../outside/b#0",
        "..#0",
        ".#0",
        "./.#1",
        "%2F..%2F#0",
        "@/..@#0",
        "lib/libfine.so#0",
    ];
    let mut w = ArchiveWriter::new("g", "gfx1100", vec!["gfx1100".into()]);
    for (i, k) in keys.iter().enumerate() {
        w.add(*k, "gfx1100", format!("kernel {i}").into_bytes(), None)
            .unwrap();
    }
    let archive = s.root().join("hostile.kpack");
    w.write(&archive).unwrap();
    let out = s.root().join("out");
    kpack_ok(&[&"extract", &archive, &"-o", &out]);
    // One plain file per (key, target), directly in `out`, naming it.
    let mut back = BTreeSet::new();
    for e in fs::read_dir(&out).unwrap() {
        let e = e.unwrap();
        assert!(e.file_type().unwrap().is_file());
        let name = e.file_name().into_string().unwrap();
        let (key, target) = parse_archive_file_name(&name).unwrap();
        assert_eq!(target, "gfx1100");
        let i = keys.iter().position(|k| *k == key).unwrap();
        assert_eq!(
            fs::read(e.path()).unwrap(),
            format!("kernel {i}").into_bytes()
        );
        back.insert(key);
    }
    assert_eq!(back.len(), keys.len());
    let others: Vec<_> = listing(s.root())
        .into_iter()
        .filter(|p| p != "out" && !p.starts_with("out/"))
        .collect();
    assert_eq!(others, ["hostile.kpack", "outside"]);
    s.check_outside();
}

#[test]
fn extract_archive_targets_that_are_paths() {
    let s = Scene::new();
    for target in [
        "../../outside/t",
        "/tmp/kpack-evil-target",
        "a/b",
        "x/../../y",
    ] {
        let mut w = ArchiveWriter::new("g", target, vec![target.into()]);
        w.add("k#0", target, &b"PWNED"[..], None).unwrap();
        let archive = s.root().join("t.kpack");
        w.write(&archive).unwrap();
        let out = s.root().join("out");
        let err = kpack_fails(&[&"extract", &archive, &"-o", &out]);
        assert!(err.contains("not a plain file name"), "{target}: {err}");
        assert!(!out.exists());
    }
    s.check_outside();
    assert!(!Path::new("/tmp/kpack-evil-target.hsaco").exists());
}

/// `kpack extract` of an offloaded binary names files after the targets of
/// the archives its metadata finds: a hostile archive there cannot make it
/// write elsewhere.
#[test]
fn extract_offloaded_binary_through_hostile_archive() {
    let s = Scene::new();
    let f = fixture("libvadd_compressed.so");
    let lib = s.root().join("lib/libvadd_compressed.so");
    kpack_ok(&[
        &"offload",
        &f.path,
        &"-o",
        &lib,
        &"--archive-dir",
        &s.root().join(".kpack"),
        &"--kernel-name",
        &"lib/libvadd_compressed.so",
    ]);
    // Replace one archive by one serving a "target" that is a path.
    let evil = "../../../outside/evil";
    let good = s.root().join(".kpack/libvadd_compressed_gfx1100.kpack");
    let bytes = kpack_loader::open_archive(&good)
        .unwrap()
        .kernel("lib/libvadd_compressed.so#0", "gfx1100")
        .unwrap();
    fs::remove_file(&good).unwrap();
    let mut w = ArchiveWriter::new("libvadd_compressed", evil, vec![evil.into()]);
    w.add("lib/libvadd_compressed.so#0", evil, bytes, None)
        .unwrap();
    w.write(s.root().join(".kpack/libvadd_compressed_evil.kpack"))
        .unwrap();
    let out = s.root().join("x/y/out");
    let err = kpack_fails(&[&"extract", &lib, &"-o", &out]);
    assert!(err.contains("not a plain file name"), "{err}");
    assert!(!s.root().join("x").exists());
    s.check_outside();
}

/// An artifact whose files include symlinks pointing outside it (absolute,
/// relative, to a directory, and one named `.kpack` where split puts
/// archives): split copies them as links, with their targets unchanged,
/// and writes nothing through them.
#[test]
fn split_copies_outside_symlinks_as_links() {
    let s = Scene::new();
    let outside = s.outside();
    let art = s.root().join("in/foo_lib_gfx110X");
    let stage = art.join("stage");
    fs::create_dir_all(stage.join("lib")).unwrap();
    fs::write(art.join("artifact_manifest.txt"), "stage\n").unwrap();
    fs::copy(fixture("libvadd.so").path, stage.join("lib/libvadd.so")).unwrap();
    let links = [
        ("lib/abs-file", outside.join("file").display().to_string()),
        ("lib/abs-dir", outside.display().to_string()),
        ("lib/rel-dir", "../../../../outside".to_string()),
        (".kpack", outside.display().to_string()),
        ("lib/.kpack", "../../../../outside".to_string()),
        ("lib/dangling", "/nonexistent/kpack/x".to_string()),
    ];
    for (rel, target) in &links {
        symlink(target, stage.join(rel)).unwrap();
    }
    let out = s.root().join("out");
    kpack_ok(&[&"split", &"--artifact-dir", &art, &"--output-dir", &out]);
    let generic = out.join("foo_lib_generic/stage");
    for (rel, target) in &links {
        let p = generic.join(rel);
        assert!(
            fs::symlink_metadata(&p).unwrap().file_type().is_symlink(),
            "{rel} is not a symlink"
        );
        assert_eq!(fs::read_link(&p).unwrap(), PathBuf::from(target));
    }
    for t in ["gfx1100", "gfx1101", "gfx942"] {
        let a = out.join(format!("foo_lib_{t}/stage/.kpack/foo_lib_{t}.kpack"));
        assert!(fs::symlink_metadata(a.parent().unwrap()).unwrap().is_dir());
        kpack_loader::open_archive(&a).unwrap();
    }
    s.check_outside();
    // Installed together, the generic artifact's `.kpack` link and the
    // per-target artifacts' `.kpack` directory would collide: verify says so.
    let err = kpack(&[&"verify", &"--artifacts-dir", &out]);
    let text = String::from_utf8_lossy(&err.stdout);
    assert_eq!(err.status.code(), Some(1));
    assert!(
        text.contains(
            ".kpack is a directory in foo_lib_gfx1100/stage but not in foo_lib_generic/stage"
        ),
        "{text}"
    );
    s.check_outside();
}

/// pack-tree: an install tree whose `.kpack` is a symlink pointing outside
/// (where pack-tree writes its archives) is refused, not written through.
#[test]
fn pack_tree_does_not_write_through_a_kpack_symlink() {
    let s = Scene::new();
    let tree = s.root().join("tree");
    fs::create_dir_all(tree.join("lib")).unwrap();
    fs::copy(fixture("libvadd.so").path, tree.join("lib/libvadd.so")).unwrap();
    symlink(s.outside(), tree.join(".kpack")).unwrap();
    symlink("../outside", tree.join("lib/up")).unwrap();
    let out = s.root().join("out");
    let err = kpack_fails(&[
        &"pack-tree",
        &"--input",
        &tree,
        &"--output",
        &out,
        &"--group-name",
        &"g",
    ]);
    assert!(err.contains(".kpack"), "{err}");
    assert!(!out.exists());
    s.check_outside();
    // Without the .kpack link, the other link is copied as a link.
    fs::remove_file(tree.join(".kpack")).unwrap();
    kpack_ok(&[
        &"pack-tree",
        &"--input",
        &tree,
        &"--output",
        &out,
        &"--group-name",
        &"g",
    ]);
    assert_eq!(
        fs::read_link(out.join("lib/up")).unwrap(),
        PathBuf::from("../outside")
    );
    assert!(out.join(".kpack/g_gfx1100.kpack").is_file());
    s.check_outside();
}

/// recombine: one shard's per-target artifact has a symlink (to outside)
/// where another shard's has a directory with files. Merging them into one
/// group artifact must not write those files through the link.
#[test]
fn recombine_does_not_write_through_another_shards_symlink() {
    let s = Scene::new();
    let shards = s.root().join("shards");
    let mk = |rel: &str, text: &str| {
        let p = shards.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    };
    for shard in ["s1", "s2"] {
        mk(
            &format!("{shard}/foo_lib_generic/artifact_manifest.txt"),
            "stage\n",
        );
        mk(&format!("{shard}/foo_lib_generic/stage/README"), "host\n");
    }
    mk("s1/foo_lib_gfx1100/artifact_manifest.txt", "stage\n");
    fs::create_dir_all(shards.join("s1/foo_lib_gfx1100/stage/lib")).unwrap();
    symlink(s.outside(), shards.join("s1/foo_lib_gfx1100/stage/lib/db")).unwrap();
    mk("s2/foo_lib_gfx1101/artifact_manifest.txt", "stage\n");
    mk(
        "s2/foo_lib_gfx1101/stage/lib/db/kernels_gfx1101.dat",
        "PWNED\n",
    );
    // The same with a prefix: s3's manifest names `stage/lib` as a prefix,
    // which s1's symlink covers.
    let config = s.root().join("config.json");
    fs::write(
        &config,
        r#"{"primary_shard": "s1", "architecture_groups": {"gfx110X": {"architectures": ["gfx1100", "gfx1101"]}}}"#,
    )
    .unwrap();
    let out = s.root().join("out");
    let err = kpack_fails(&[
        &"recombine",
        &"--input-shards-dir",
        &shards,
        &"--config",
        &config,
        &"--output-dir",
        &out,
    ]);
    assert!(err.contains("symlink"), "{err}");
    s.check_outside();
    assert!(listing(&out).is_empty(), "{:?}", listing(&out));

    // A prefix directory that another target has as a symlink.
    fs::remove_dir_all(shards.join("s2/foo_lib_gfx1101")).unwrap();
    mk("s2/foo_lib_gfx1101/artifact_manifest.txt", "stage/lib/db\n");
    mk(
        "s2/foo_lib_gfx1101/stage/lib/db/kernels_gfx1101.dat",
        "PWNED\n",
    );
    let err = kpack_fails(&[
        &"recombine",
        &"--input-shards-dir",
        &shards,
        &"--config",
        &config,
        &"--output-dir",
        &out,
    ]);
    assert!(err.contains("symlink"), "{err}");
    s.check_outside();
}
