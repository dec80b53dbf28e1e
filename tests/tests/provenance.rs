//! Provenance digests (formats.md §3.6): an offloaded binary records the
//! device digest of the code it was split from, each archive entry its code
//! object's digest and its binary's; both are the same whatever wrote them,
//! deterministic, and shown by `ls`. A tree whose host binary comes from one
//! build and an archive from another is found by `verify --tree`,
//! `verify`, `doctor` and `why`, and at load (the C API) the other build's
//! archive is passed over for a matching one; `ROCM_KPACK_VERIFY_DIGEST`
//! checks code objects on load. Archives without digests are judged as
//! before (`verify_tree.rs`).

use std::fs;
use std::path::Path;
use std::process::Command;

use crate::common::*;
use kpack_format::msgpack::Value as Msgpack;
use kpack_format::provenance::{short, TOC_CODE_OBJECT_DIGEST};
use serde_json::Value;

fn ls(path: &Path) -> Value {
    serde_json::from_str(&kpack_ok(&[&"ls", &path, &"--json"])).unwrap()
}

/// Every kernel of every archive in `dir`: (file, key, target, code object
/// digest, binary digest).
fn archive_digests(dir: &Path) -> Vec<(String, String, String, String, String)> {
    let mut out = Vec::new();
    for f in names(dir) {
        let v = ls(&dir.join(&f));
        for k in v["kernels"].as_array().unwrap() {
            let s = |n: &str| k[n].as_str().unwrap_or_default().to_string();
            out.push((
                f.clone(),
                s("key"),
                s("target"),
                s("code_object_sha256"),
                s("binary_sha256"),
            ));
        }
    }
    out.sort();
    out
}

#[test]
fn binaries_and_archives_carry_the_same_digests() {
    let t = scratch();
    for name in ["libvadd.so", "libvadd_compressed.so", "libmulti.so"] {
        let f = fixture(name);
        let device = device_digest_of(&f.path);
        let want = code_objects(&f.path);
        let mut outputs = Vec::new();
        for run in ["a", "b"] {
            let dir = t.path().join(format!("{name}-{run}"));
            kpack_ok(&[
                &"offload",
                &f.path,
                &"-o",
                &dir.join(name),
                &"--archive-dir",
                &dir.join("arch"),
            ]);
            assert_eq!(
                ls(&dir.join(name))["device_sha256"],
                device.as_str(),
                "{name}"
            );
            let kernels = archive_digests(&dir.join("arch"));
            assert_eq!(kernels.len(), want.len(), "{name}: {kernels:?}");
            for (_, key, target, co, binary) in &kernels {
                assert_eq!(binary, &device, "{name} {key}");
                let bundle: usize = key.rsplit_once('#').unwrap().1.parse().unwrap();
                let bytes = &want[&(bundle, target.clone())];
                assert_eq!(co, &kpack_format::provenance::code_object_digest(bytes));
            }
            outputs.push(snapshot(&dir));
        }
        // Re-offloading gives the same bytes, digests included.
        assert_eq!(outputs[0], outputs[1], "{name}");
    }
    // The compressed build of the same code has the same device digest
    // (over decompressed code objects) when its code objects are the same.
    let (plain, compressed) = (fixture("libvadd.so"), fixture("libvadd_compressed.so"));
    if code_objects(&plain.path) == code_objects(&compressed.path) {
        assert_eq!(
            device_digest_of(&plain.path),
            ls(&t
                .path()
                .join("libvadd_compressed.so-a/libvadd_compressed.so"))["device_sha256"]
        );
    }
}

#[test]
fn pack_tree_digests_do_not_depend_on_jobs() {
    let t = scratch();
    let files = [
        ("libvadd.so", "lib/libx.so"),
        ("libvadd_compressed.so", "lib/libc.so"),
        ("libmulti.so", "bin/libm.so"),
    ];
    let mut trees = Vec::new();
    for jobs in ["1", "2"] {
        let out = t.path().join(format!("out-{jobs}"));
        pack_tree_of(&files, &t.path().join("in"), &out, &["--jobs", jobs]);
        trees.push(snapshot(&out));
        let m = ls(&out.join("bin/libm.so"));
        assert_eq!(
            m["device_sha256"],
            device_digest_of(&fixture("libmulti.so").path).as_str()
        );
        // Each entry names its own binary's digest.
        for (_, key, _, _, binary) in archive_digests(&out.join(".kpack")) {
            let rel = key.rsplit_once('#').unwrap().0;
            assert_eq!(
                ls(&out.join(rel))["device_sha256"],
                binary.as_str(),
                "{key}"
            );
        }
    }
    assert_eq!(trees[0], trees[1]);
    // `ls` in words: the binary's full digest, the entries' shortened.
    let text = kpack_ok(&[&"ls", &t.path().join("out-1/lib/libx.so")]);
    let device = device_digest_of(&fixture("libvadd.so").path);
    assert!(
        text.contains(&format!("device code digest: {device}")),
        "{text}"
    );
    let text = kpack_ok(&[&"ls", &t.path().join("out-1/.kpack/g_gfx942.kpack")]);
    assert!(
        text.contains(&format!("of binary {}", short(&device))),
        "{text}"
    );
}

/// A clean tree (lib/libx.so from libvadd), the same path packed from
/// another build (librdc), and the clean tree with gfx942's archive from
/// the other build.
struct Mixed {
    _t: tempfile::TempDir,
    clean: std::path::PathBuf,
    other: std::path::PathBuf,
    mixed: std::path::PathBuf,
    /// Device digests: libvadd's, librdc's.
    ours: String,
    theirs: String,
}

fn mixed() -> Mixed {
    let t = scratch();
    let clean = t.path().join("clean");
    pack_tree_of(
        &[("libvadd.so", "lib/libx.so")],
        &t.path().join("in-a"),
        &clean,
        &[],
    );
    let other = t.path().join("other");
    pack_tree_of(
        &[("librdc.so", "lib/libx.so")],
        &t.path().join("in-b"),
        &other,
        &[],
    );
    let mixed = t.path().join("mixed");
    pack_tree_of(
        &[("libvadd.so", "lib/libx.so")],
        &t.path().join("in-a"),
        &mixed,
        &[],
    );
    fs::copy(
        other.join(".kpack/g_gfx942.kpack"),
        mixed.join(".kpack/g_gfx942.kpack"),
    )
    .unwrap();
    Mixed {
        ours: device_digest_of(&fixture("libvadd.so").path),
        theirs: device_digest_of(&fixture("librdc.so").path),
        _t: t,
        clean,
        other,
        mixed,
    }
}

#[test]
fn verify_tree_doctor_and_why_name_both_builds() {
    let m = mixed();
    assert_ne!(m.ours, m.theirs);
    let builds = |text: &str| text.contains(short(&m.ours)) && text.contains(short(&m.theirs));
    // verify --tree: the other build's archive, and gfx942 unresolved.
    let out = kpack(&[&"verify", &"--tree", &m.mixed, &"--json"]);
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let p = v["problems"].as_array().unwrap();
    let kinds: Vec<(&str, &str)> = p
        .iter()
        .map(|p| (p["binary"].as_str().unwrap(), p["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("lib/libx.so", "missing_target"),
            ("lib/libx.so", "foreign_code_object")
        ],
        "{v}"
    );
    let msg = p[1]["message"].as_str().unwrap();
    assert!(
        msg.contains(".kpack/g_gfx942.kpack") && msg.contains("#0 for gfx942") && builds(msg),
        "{msg}"
    );
    assert!(kpack(&[&"verify", &"--tree", &m.clean]).status.success());
    // doctor, for a gfx942 device: the load fails on the other build's
    // archive, and the tree check names it.
    let out = kpack(&[&"doctor", &m.mixed, &"--arch", &"gfx942", &"--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_ne!(out.status.code(), Some(0), "{v}");
    let foreign: Vec<&Value> = v["problems"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["kind"] == "foreign_code_object")
        .collect();
    assert!(!foreign.is_empty(), "{v}");
    for p in &foreign {
        let msg = p["message"].as_str().unwrap();
        assert!(
            p["binary"].as_str().unwrap().ends_with("lib/libx.so"),
            "{p}"
        );
        assert!(msg.contains("g_gfx942.kpack") && builds(msg), "{msg}");
    }
    // why: the try on that archive, with both builds.
    let out = kpack(&[&"why", &m.mixed.join("lib/libx.so"), &"--arch", &"gfx942"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!("device code digest: {}", m.ours)),
        "{text}"
    );
    let line = text
        .lines()
        .find(|l| l.contains("of another build"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("gfx942") && builds(line), "{line}");
}

/// Split artifacts: one build's generic artifact with another build's
/// gfx942 artifact.
#[test]
fn verify_names_both_builds_in_artifacts() {
    let t = scratch();
    let split = |fixture_name: &str, out: &Path| {
        let art = t.path().join(format!("in-{fixture_name}/blas_lib_x"));
        fs::create_dir_all(art.join("p/lib")).unwrap();
        fs::write(art.join("artifact_manifest.txt"), "p\n").unwrap();
        fs::copy(fixture(fixture_name).path, art.join("p/lib/libx.so")).unwrap();
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
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    split("libvadd.so", &a);
    split("librdc.so", &b);
    fs::remove_dir_all(a.join("blas_lib_gfx942")).unwrap();
    fs::rename(b.join("blas_lib_gfx942"), a.join("blas_lib_gfx942")).unwrap();
    let out = kpack(&[&"verify", &"--artifacts-dir", &a, &"--json"]);
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let (ours, theirs) = (
        device_digest_of(&fixture("libvadd.so").path),
        device_digest_of(&fixture("librdc.so").path),
    );
    let hit = v["problems"].as_array().unwrap().iter().any(|p| {
        let p = p.as_str().unwrap();
        p.starts_with("blas_lib_generic/p/lib/libx.so: code object p/lib/libx.so#0 for gfx942 (installed with blas_lib_gfx942) comes from another build")
            && p.contains(short(&ours))
            && p.contains(short(&theirs))
            && p.contains("blas_lib_gfx942/p/.kpack/blas_lib_gfx942.kpack")
    });
    assert!(hit, "{v}");
}

/// The C checker's code objects of libvadd, as it expects them.
fn expected_vadd(dir: &Path) {
    fs::create_dir_all(dir).unwrap();
    for ((_, t), bytes) in code_objects(&fixture("libvadd.so").path) {
        fs::write(dir.join(format!("{t}.co")), bytes).unwrap();
    }
}

fn check(library: &Path, expected: &Path, env: &[(&str, &Path)]) -> (String, String) {
    let mut c = Command::new(runtime_checker());
    c.arg(library)
        .arg(expected)
        .args(["gfx1100", "gfx1101", "gfx942"])
        .env("ROCM_KPACK_DEBUG", "1");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_runtime_passes_over_another_builds_archive() {
    let m = mixed();
    let want = m.mixed.parent().unwrap().join("expected");
    expected_vadd(&want);
    // The other build's archive first (ROCM_KPACK_PATH_PREFIX), the right
    // one on the embedded path: every code object loads, identical.
    let wrong = m.other.join(".kpack/g_gfx942.kpack");
    let (out, err) = check(
        &m.clean.join("lib/libx.so"),
        &want,
        &[("ROCM_KPACK_PATH_PREFIX", &wrong)],
    );
    assert!(
        out.contains("3 code objects loaded and identical, 0 failures"),
        "{out}\n{err}"
    );
    // Upstream's line, then kpack's reason on a line of its own.
    let lines: Vec<&str> = err.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.contains("is of another build"))
        .unwrap_or_else(|| panic!("{err}"));
    assert_eq!(
        lines[at - 1],
        "kpack:   kernel not found in this archive (error 5), trying next candidate"
    );
    assert!(
        lines[at].starts_with("kpack:   (")
            && lines[at].contains(short(&m.ours))
            && lines[at].contains(short(&m.theirs)),
        "{}",
        lines[at]
    );
    // Only the other build's archive for gfx942: KERNEL_NOT_FOUND there.
    let (out, err) = check(&m.mixed.join("lib/libx.so"), &want, &[]);
    assert!(
        out.contains("2 code objects loaded and identical, 1 failures"),
        "{out}\n{err}"
    );
    assert!(err.contains("(gfx942): error 5"), "{err}");
}

#[test]
fn verify_digest_checks_code_objects_on_load() {
    let m = mixed();
    let want = m.clean.parent().unwrap().join("expected");
    expected_vadd(&want);
    // gfx942's entry records another code object's digest.
    let archive = m.clean.join(".kpack/g_gfx942.kpack");
    let bad = m.clean.join("bad.kpack");
    rewrite_archive(&archive, &bad, |md| {
        for (k, v) in md.iter_mut() {
            if k == TOC_CODE_OBJECT_DIGEST {
                *v = Msgpack::from(kpack_format::provenance::code_object_digest(b"other"));
            }
        }
    });
    fs::rename(&bad, &archive).unwrap();
    let lib = m.clean.join("lib/libx.so");
    // Unchecked, the bytes load as they are.
    let (out, err) = check(&lib, &want, &[]);
    assert!(
        out.contains("3 code objects loaded and identical, 0 failures"),
        "{out}\n{err}"
    );
    // Checked: a load error (DECOMPRESSION_FAILED), said in a debug line.
    let (out, err) = check(&lib, &want, &[("ROCM_KPACK_VERIFY_DIGEST", Path::new("1"))]);
    assert!(
        out.contains("2 code objects loaded and identical, 1 failures"),
        "{out}\n{err}"
    );
    assert!(err.contains("(gfx942): error 6"), "{err}");
    assert!(err.contains("but the TOC records"), "{err}");
    assert!(
        err.contains("code objects checked against their TOC digests"),
        "{err}"
    );
}
