//! Outputs past the limits of ROCm's HRX runtime (`kpack_format::hrx`):
//! the writers warn and still write them (they load with kpack's
//! runtime), `kpack verify` reports them as warnings and succeeds. Limits
//! reached with real fixtures: a lookup key over 1,024 bytes (a long
//! `--kernel-name`, or a binary deep in a tree split or packed), more than 32
//! search paths.

use std::ffi::OsString;
use std::path::Path;

use crate::common::*;

/// Run `kpack` with `args`, assert success: (stdout, stderr).
fn kpack_warns(args: &[OsString]) -> (String, String) {
    let args: Vec<&dyn AsRef<std::ffi::OsStr>> = args
        .iter()
        .map(|a| a as &dyn AsRef<std::ffi::OsStr>)
        .collect();
    let out = kpack(&args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "kpack failed: {stderr}");
    (String::from_utf8_lossy(&out.stdout).into_owned(), stderr)
}

fn os(v: &[&dyn AsRef<std::ffi::OsStr>]) -> Vec<OsString> {
    v.iter().map(|a| a.as_ref().to_os_string()).collect()
}

/// The `kpack: warning:` lines of `stderr` that name HRX.
fn hrx_warnings(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("kpack: warning: ") && l.contains("HRX"))
        .collect()
}

#[test]
fn offload_warns_of_a_key_past_1024_bytes() {
    let t = scratch();
    let name = format!("lib/{}.so", "k".repeat(1100));
    let ar = t.path().join("ar");
    let out = t.path().join("libvadd.so");
    let (stdout, stderr) = kpack_warns(&os(&[
        &"offload",
        &fixtures_dir().join("libvadd.so"),
        &"-o",
        &out,
        &"--archive-dir",
        &ar,
        &"--kernel-name",
        &name,
        &"--json",
    ]));
    let w = hrx_warnings(&stderr);
    assert!(!w.is_empty(), "{stderr}");
    assert!(
        w.iter()
            .all(|l| l.contains("key \"lib/kkk") && l.contains("(at most 1024)")),
        "{w:?}"
    );
    // One per archive (each holds the key), naming the archive.
    let archives: Vec<_> = std::fs::read_dir(&ar).unwrap().collect();
    assert_eq!(w.len(), archives.len(), "{w:?}");
    assert!(w.iter().all(|l| l.contains(".kpack:")), "{w:?}");
    // The JSON summary carries them too; the outputs are written and read.
    let j: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(j["warnings"].as_array().unwrap().len(), w.len());
    for a in archives {
        let a = kpack_loader::open_archive(a.unwrap().path()).unwrap();
        assert!(a.binaries().all(|k| k.len() > 1024));
        assert_eq!(kpack_format::hrx::check_archive(&a).len(), 1);
    }
    // Within the limits: no warning, no `warnings` in the JSON.
    let (stdout, stderr) = kpack_warns(&os(&[
        &"offload",
        &fixtures_dir().join("libvadd.so"),
        &"-o",
        &t.path().join("plain.so"),
        &"--archive-dir",
        &t.path().join("ar2"),
        &"--json",
    ]));
    assert_eq!(hrx_warnings(&stderr), Vec::<&str>::new());
    assert!(!stdout.contains("\"warnings\""), "{stdout}");
}

#[test]
fn offload_and_verify_warn_of_33_search_paths() {
    let t = scratch();
    let out = t.path().join("libvadd.so");
    let mut args = os(&[
        &"offload",
        &fixtures_dir().join("libvadd.so"),
        &"-o",
        &out,
        &"--archive-dir",
        &t.path().join("ar"),
    ]);
    for i in 0..33 {
        args.push("--search-path".into());
        args.push(format!("p{i}/vadd_@GFXARCH@.kpack").into());
    }
    let (_, stderr) = kpack_warns(&args);
    let w = hrx_warnings(&stderr);
    assert_eq!(w.len(), 1, "{stderr}");
    assert!(
        w[0].contains("33 search paths") && w[0].contains("(at most 32)"),
        "{w:?}"
    );
    assert!(w[0].contains(&*out.to_string_lossy()), "{w:?}");
    // verify-binary: still valid (exit 0), the limit reported as a warning.
    let (stdout, stderr) = kpack_warns(&os(&[&"verify-binary", &out]));
    assert!(stdout.contains(": ok:"), "{stdout}");
    let w = hrx_warnings(&stderr);
    assert_eq!(w.len(), 1, "{stderr}");
    assert!(w[0].contains("33 search paths"), "{w:?}");
    // 32 are within the limit.
    let mut args = os(&[
        &"offload",
        &fixtures_dir().join("libvadd.so"),
        &"-o",
        &t.path().join("ok.so"),
        &"--archive-dir",
        &t.path().join("ar32"),
    ]);
    for i in 0..32 {
        args.push("--search-path".into());
        args.push(format!("p{i}/vadd_@GFXARCH@.kpack").into());
    }
    let (_, stderr) = kpack_warns(&args);
    assert_eq!(hrx_warnings(&stderr), Vec::<&str>::new());
    let (_, stderr) = kpack_warns(&os(&[&"verify-binary", &t.path().join("ok.so")]));
    assert_eq!(hrx_warnings(&stderr), Vec::<&str>::new());
}

/// An artifact holding libvadd.so below `rel` (under `stage/`).
fn artifact(root: &Path, rel: &str) -> std::path::PathBuf {
    let art = root.join("shard/fft_lib_gfx110X-dgpu");
    let dst = art.join("stage").join(rel);
    std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
    std::fs::write(art.join("artifact_manifest.txt"), "stage\n").unwrap();
    std::fs::copy(fixtures_dir().join("libvadd.so"), &dst).unwrap();
    art
}

#[test]
fn split_warns_of_a_binary_deep_in_the_tree() {
    let t = scratch();
    // Five 200-byte directories: the binary's key is over 1,024 bytes.
    let deep: Vec<String> = (0..5).map(|i| format!("{i}{}", "d".repeat(199))).collect();
    let rel = format!("lib/{}/libvadd.so", deep.join("/"));
    let art = artifact(t.path(), &rel);
    let out = t.path().join("out");
    let (_, stderr) = kpack_warns(&os(&[
        &"split",
        &"--artifact-dir",
        &art,
        &"--output-dir",
        &out,
    ]));
    let w = hrx_warnings(&stderr);
    assert!(!w.is_empty(), "{stderr}");
    assert!(
        w.iter().all(|l| l.contains("key \"stage/lib/0ddd")),
        "{w:?}"
    );
    // The split is complete: its archives hold the long key.
    let mut archives = Vec::new();
    for e in walk(&out) {
        if e.extension().is_some_and(|x| x == "kpack") {
            archives.push(e);
        }
    }
    assert_eq!(w.len(), archives.len(), "{w:?} {archives:?}");
    for p in &archives {
        let a = kpack_loader::open_archive(p).unwrap();
        assert!(a.binaries().any(|k| k.len() > 1024), "{}", p.display());
    }
    // kpack verify: the artifacts are valid (exit 0), each archive's key
    // a warning.
    let (_, stderr) = kpack_warns(&os(&[&"verify", &"--artifacts-dir", &out]));
    let v = hrx_warnings(&stderr);
    assert_eq!(v.len(), archives.len(), "{stderr}");
    assert!(v.iter().all(|l| l.contains("(at most 1024)")), "{v:?}");
    // The same binary near the top: no warning.
    let t2 = scratch();
    let art = artifact(t2.path(), "lib/libvadd.so");
    let (_, stderr) = kpack_warns(&os(&[
        &"split",
        &"--artifact-dir",
        &art,
        &"--output-dir",
        &t2.path().join("out"),
    ]));
    assert_eq!(hrx_warnings(&stderr), Vec::<&str>::new());
    let (_, stderr) = kpack_warns(&os(&[
        &"verify",
        &"--artifacts-dir",
        &t2.path().join("out"),
    ]));
    assert_eq!(hrx_warnings(&stderr), Vec::<&str>::new());
}

/// Every file below `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            v.extend(walk(&p));
        } else {
            v.push(p);
        }
    }
    v.sort();
    v
}

#[test]
fn pack_tree_warns_of_a_binary_deep_in_the_tree_and_verify_tree_passes() {
    let t = scratch();
    let deep: Vec<String> = (0..6).map(|i| format!("{i}{}", "e".repeat(199))).collect();
    let dst = t
        .path()
        .join("in/lib")
        .join(deep.join("/"))
        .join("libvadd.so");
    std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
    std::fs::copy(fixtures_dir().join("libvadd.so"), &dst).unwrap();
    let out = t.path().join("packed");
    let (_, stderr) = kpack_warns(&os(&[
        &"pack-tree",
        &"--input",
        &t.path().join("in"),
        &"--output",
        &out,
        &"--group-name",
        &"rocm",
    ]));
    let w = hrx_warnings(&stderr);
    let archives: Vec<_> = walk(&out.join(".kpack"));
    assert!(!archives.is_empty());
    assert_eq!(w.len(), archives.len(), "{stderr}");
    assert!(w.iter().all(|l| l.contains("key \"lib/0eee")), "{w:?}");
    // The tree is valid: verify --tree passes (the binary's metadata is
    // within the limits; the archives' keys are not its to judge).
    let (_, stderr) = kpack_warns(&os(&[&"verify", &"--tree", &out]));
    assert!(!stderr.contains("error"), "{stderr}");
}
