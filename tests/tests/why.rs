//! `kpack why` says what the runtime loads: on the xnack fall-through case
//! (an xnack- archive without the kernel, PyTorch's `hipErrorInvalidImage`
//! on gfx90a) and on missing archives, its answer is what the C runtime's
//! `kpack_load_code_object` returns for the same binary and ISAs.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

use crate::common::*;
use kpack_host::ArchiveWriter;
use rocm_kpack::*;
use serde_json::Value;

fn why(binary: &Path, archs: &[&str]) -> (bool, Value) {
    let mut c = Command::new(kpack_bin());
    c.arg("why").arg(binary).arg("--json");
    for a in archs {
        c.arg("--arch").arg(a);
    }
    let out = c.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    (out.status.success(), v)
}

#[test]
fn xnack_fall_through_and_missing_archives_match_the_runtime() {
    let f = fixture("libwide.so");
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("lib/libwide.so");
    std::fs::create_dir_all(lib.parent().unwrap()).unwrap();
    let archives = dir.path().join(".kpack");
    kpack_ok(&[
        &"offload",
        &f.path,
        &"-o",
        &lib,
        &"--archive-dir",
        &archives,
    ]);
    // The PyTorch layout: the xnack- archive without this binary's kernel,
    // a plain gfx90a archive with it.
    let minus = archives.join("libwide_gfx90a:xnack-.kpack");
    let code = kpack_loader::open_archive(&minus)
        .unwrap()
        .kernel("libwide.so#0", "gfx90a:xnack-")
        .unwrap();
    let mut w = ArchiveWriter::new("libwide", "gfx90a:xnack-", vec!["gfx90a:xnack-".into()]);
    w.add("other.so#0", "gfx90a:xnack-", code.as_slice(), None)
        .unwrap();
    w.write(&minus).unwrap();
    let mut w = ArchiveWriter::new("libwide", "gfx90a", vec!["gfx90a".into()]);
    w.add("libwide.so#0", "gfx90a", code.as_slice(), None)
        .unwrap();
    w.write(archives.join("libwide_gfx90a.kpack")).unwrap();

    let archs = ["amdgcn-amd-amdhsa--gfx90a:xnack-"];
    let (ok, v) = why(&lib, &archs);
    assert!(ok, "{v}");
    let w0 = &v["wrappers"][0];
    assert_eq!(w0["key"], "libwide.so#0");
    assert_eq!(w0["result"], "loaded");
    assert_eq!(w0["target"], "gfx90a");
    assert_eq!(w0["size"], code.len());
    let cands = w0["candidates"].as_array().unwrap();
    assert!(cands[0]["path"]
        .as_str()
        .unwrap()
        .ends_with("libwide_gfx90a:xnack-.kpack"));
    assert_eq!(cands[0]["status"], "opened");
    assert!(cands[1]["path"]
        .as_str()
        .unwrap()
        .ends_with("libwide_gfx90a.kpack"));
    let tries: Vec<(String, u64, String)> = w0["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["target"].as_str().unwrap().to_string(),
                a["candidate"].as_u64().unwrap(),
                a["outcome"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        tries,
        [
            ("gfx90a:xnack-".to_string(), 0, "key_missing".to_string()),
            ("gfx90a".to_string(), 1, "loaded".to_string()),
        ]
    );
    assert_eq!(c_runtime_load(&lib, 0, &archs).unwrap(), code);
    // Text form names the fall-through too.
    let text = String::from_utf8(
        Command::new(kpack_bin())
            .args([
                OsStr::new("why"),
                lib.as_os_str(),
                OsStr::new("--arch"),
                OsStr::new(archs[0]),
            ])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert!(text.contains("listed, but no entry for the key"), "{text}");
    assert!(text.contains("=> loads gfx90a from"), "{text}");

    // No archive for this GPU: ARCHIVE_NOT_FOUND, as the runtime says, and
    // a non-zero exit.
    assert_eq!(v["has_code"], true);
    for archs in [&["gfx1151"][..], &["gfx9999", "gfx1151"]] {
        let (ok, v) = why(&lib, archs);
        assert!(!ok);
        // The binary records what it was split for: no archive can help.
        assert_eq!(v["has_code"], false, "{v}");
        assert_eq!(v["targets"].as_array().unwrap().len(), 8, "{v}");
        let w0 = &v["wrappers"][0];
        assert_eq!(w0["result"], "failed");
        assert_eq!(w0["error"], "KPACK_ERROR_ARCHIVE_NOT_FOUND");
        assert!(w0["candidates"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["status"] == "missing"));
        let e = c_runtime_load(&lib, 0, archs).unwrap_err();
        assert_eq!(e as u64, w0["code"].as_u64().unwrap());
    }
    // The archive is there but lacks the key: KERNEL_NOT_FOUND both ways.
    std::fs::remove_file(archives.join("libwide_gfx90a.kpack")).unwrap();
    let (ok, v) = why(&lib, &archs);
    assert!(!ok);
    assert_eq!(v["wrappers"][0]["error"], "KPACK_ERROR_KERNEL_NOT_FOUND");
    assert_eq!(
        c_runtime_load(&lib, 0, &archs).unwrap_err(),
        KpackError::KernelNotFound
    );
    // Bad input: a fat binary, no --arch.
    let err = kpack_fails(&[&"why", &f.path, &"--arch", &"gfx1100"]);
    assert!(err.contains("a fat binary"), "{err}");
}

/// Every wrapper of a multi-bundle binary, through ROCM_KPACK_PATH.
#[test]
fn every_wrapper_through_rocm_kpack_path() {
    let f = fixture("libmulti.so");
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("libmulti.so");
    let archives = dir.path().join("somewhere");
    kpack_ok(&[
        &"offload",
        &f.path,
        &"-o",
        &lib,
        &"--archive-dir",
        &archives,
    ]);
    std::fs::rename(&archives, dir.path().join("moved")).unwrap();
    let (ok, v) = why(&lib, &["gfx942"]);
    assert!(!ok);
    assert_eq!(v["wrappers"].as_array().unwrap().len(), 4);
    let moved = dir.path().join("moved/libmulti_gfx942.kpack");
    let out = Command::new(kpack_bin())
        .arg("why")
        .arg(&lib)
        .args(["--arch", "gfx942", "--json"])
        .env("ROCM_KPACK_PATH", &moved)
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let truth = code_objects(&f.path);
    for (i, w) in v["wrappers"].as_array().unwrap().iter().enumerate() {
        assert_eq!(w["result"], "loaded");
        assert_eq!(w["co_index"], i);
        assert_eq!(w["candidates"].as_array().unwrap().len(), 1);
        assert_eq!(w["size"], truth[&(i, "gfx942".to_string())].len());
    }
}
