//! `kpack ls` on real binaries.

use std::path::Path;

use crate::common::*;
use kpack_format::target::TargetId;
use serde_json::Value;

fn ls_json(path: &Path) -> Value {
    serde_json::from_str(&kpack_ok(&[&"ls", &path, &"--json"])).expect("ls --json prints JSON")
}

fn canon(t: &str) -> String {
    TargetId::parse(t)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| t.to_string())
}

#[test]
fn librocrand_has_seven_targets() {
    let v = ls_json(Path::new(LIBROCRAND));
    assert_eq!(v["kind"], "fat_binary");
    let targets = v["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 7, "{targets:?}");
    let text = kpack_ok(&[&"ls", &LIBROCRAND]);
    assert!(text.contains("targets (7)"), "{text}");
    for t in targets {
        assert!(text.contains(t.as_str().unwrap()));
    }
}

#[test]
fn fixtures_list_their_bundles_targets_and_wrappers() {
    for f in fixtures().into_iter().filter(|f| f.device_code()) {
        let v = ls_json(&f.path);
        assert_eq!(v["kind"], "fat_binary", "{}", f.name);
        let bundles = v["bundles"].as_array().unwrap();
        assert_eq!(bundles.len(), f.bundles, "{}: bundles", f.name);
        assert_eq!(
            v["wrappers"].as_array().unwrap().len(),
            f.wrappers,
            "{}: wrappers",
            f.name
        );
        for w in v["wrappers"].as_array().unwrap() {
            assert_eq!(w["magic"], "HIPF", "{}", f.name);
            assert_eq!(w["version"], 1, "{}", f.name);
        }
        let mut want: Vec<String> = f.targets.iter().map(|t| canon(t)).collect();
        want.sort();
        let mut got: Vec<String> = v["targets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| canon(t.as_str().unwrap()))
            .collect();
        got.sort();
        assert_eq!(got, want, "{}: targets", f.name);
        for b in bundles {
            let compressed = !b["compressed"].is_null();
            if f.compressed_bundles > 0 && f.name != "libmulti.so" {
                assert!(compressed, "{}: bundle should be compressed", f.name);
            }
            if compressed {
                assert_eq!(b["compressed"]["version"], 2, "clang 19 writes CCOB v2");
                assert_eq!(b["compressed"]["method"], "zstd");
                assert_eq!(b["compressed"]["hash_matches"], true);
            }
        }
    }
}

#[test]
fn multi_object_library_mixes_compressed_and_plain_bundles() {
    let f = fixture("libmulti.so");
    let v = ls_json(&f.path);
    let bundles = v["bundles"].as_array().unwrap();
    let compressed = bundles
        .iter()
        .filter(|b| !b["compressed"].is_null())
        .count();
    assert_eq!(bundles.len(), 4);
    assert_eq!(compressed, 2);
}

#[test]
fn host_only_library_is_a_clear_error() {
    let f = fixture("libhostonly.so");
    let err = kpack_fails(&[&"ls", &f.path]);
    assert!(
        err.contains("libhostonly.so") && err.contains("no .hip_fatbin"),
        "{err}"
    );
}

#[test]
fn other_files_are_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("notes.txt");
    std::fs::write(&p, "hello").unwrap();
    let err = kpack_fails(&[&"ls", &p]);
    assert!(err.contains("notes.txt"), "{err}");
    let missing = dir.path().join("missing.so");
    let err = kpack_fails(&[&"ls", &missing]);
    assert!(err.contains("missing.so"), "{err}");
}

/// Standard output a closed pipe (`kpack ls lib.so | head -1`): kpack ends
/// quietly with status 141, as a program killed by SIGPIPE, instead of
/// panicking; a full disk behind the redirect is an error naming stdout.
#[test]
fn closed_stdout_ends_quietly() {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = std::process::Command::new(kpack_bin())
        .args(["ls", LIBROCRAND])
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");

    let full = std::fs::File::create("/dev/full").unwrap();
    let out = std::process::Command::new(kpack_bin())
        .args(["ls", LIBROCRAND])
        .stdout(full)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("writing to standard output") && !stderr.contains("panicked"),
        "{stderr}"
    );
}

/// A bare AMDGPU code object (what wheels such as amd-aiter ship as `.co`
/// files) is described as one: the target its metadata note records and
/// the kernels it defines, against clang-offload-bundler's extraction of
/// the fixture's code objects and llvm-nm's `.kd` symbols.
#[test]
fn a_bare_code_object_says_what_it_is() {
    let f = fixture("libwide.so");
    let dir = tempfile::tempdir().unwrap();
    for ((co, target), bytes) in code_objects(&f.path) {
        let path = dir
            .path()
            .join(format!("k{co}-{}.co", target.replace(':', "_")));
        std::fs::write(&path, &bytes).unwrap();
        let v = ls_json(&path);
        assert_eq!(v["kind"], "code_object", "{target}");
        assert_eq!(v["target"].as_str().map(canon), Some(canon(&target)));
        let nm = std::process::Command::new(kpack_testkit::oracle::llvm_bin().join("llvm-nm"))
            .arg(&path)
            .output()
            .unwrap();
        let mut kd: Vec<String> = String::from_utf8_lossy(&nm.stdout)
            .lines()
            .filter_map(|l| l.rsplit(' ').next()?.strip_suffix(".kd").map(String::from))
            .collect();
        kd.sort();
        kd.dedup();
        let listed: Vec<String> = v["kernels"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_str().unwrap().to_string())
            .collect();
        assert!(!kd.is_empty());
        assert_eq!(listed, kd, "{target}");
        let text = kpack_ok(&[&"ls", &path]);
        assert!(text.contains("AMDGPU code object for"), "{text}");
    }
}

/// What `llvm-objdump --offloading` lists of a link input: (kind, arch)
/// of every image, in order.
fn objdump_offloading(path: &Path) -> Vec<(String, String)> {
    let tool = kpack_testkit::oracle::llvm_bin().join("llvm-objdump");
    let out = run_ok(
        std::process::Command::new(tool)
            .arg("--offloading")
            .arg(path),
    );
    let mut images = Vec::new();
    let mut kind = String::new();
    for line in out.lines() {
        if let Some(k) = line.strip_prefix("kind") {
            kind = k.trim().to_string();
        } else if let Some(a) = line.strip_prefix("arch") {
            images.push((kind.clone(), a.trim().to_string()));
        }
    }
    images
}

/// Link inputs of clang's new offload driver (`-fgpu-rdc`: LLVM IR per
/// target in `.llvm.offloading`): an object and a static archive, listed
/// image by image as LLVM's own tool lists them.
#[test]
fn new_driver_link_inputs_list_their_images() {
    use kpack_testkit::fixtures::{NEW_DRIVER_LINK_INPUTS, NEW_DRIVER_TARGETS};
    for rel in NEW_DRIVER_LINK_INPUTS {
        let path = fixtures_dir().join(rel);
        let v = ls_json(&path);
        assert_eq!(v["kind"], "link_input", "{rel}");
        let archive = rel.ends_with(".a");
        let container = if archive {
            "static_archive"
        } else {
            "relocatable"
        };
        assert_eq!(v["container"], container, "{rel}");
        assert_eq!(v["targets"], serde_json::json!(NEW_DRIVER_TARGETS), "{rel}");
        let members = v["members"].as_array().unwrap();
        assert_eq!(members.len(), if archive { 3 } else { 1 }, "{rel}");
        let ours: Vec<(String, String)> = members
            .iter()
            .flat_map(|m| m["images"].as_array().unwrap().iter())
            .map(|i| {
                assert!(i["size"].as_u64().unwrap() > 1000, "{rel}: {i}");
                (
                    i["kind"].as_str().unwrap().into(),
                    i["target"].as_str().unwrap().into(),
                )
            })
            .collect();
        assert_eq!(ours, objdump_offloading(&path), "{rel}");
        assert!(members.iter().all(|m| m["section"] == ".llvm.offloading"));
        let text = kpack_ok(&[&"ls", &path]);
        assert!(
            text.contains("link input") && text.contains("llvm ir"),
            "{text}"
        );
        assert!(!text.contains("without device code"), "{text}");
    }
    // A static archive without device code is still refused by name.
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("libhost.a");
    let obj = dir.path().join("host.o");
    std::fs::write(dir.path().join("host.c"), "int f(void) { return 1; }\n").unwrap();
    built(
        Program::c("c11")
            .input(dir.path().join("host.c"))
            .compile(&obj),
    );
    run_ok(
        std::process::Command::new("ar")
            .arg("rcs")
            .arg(&empty)
            .arg(&obj),
    );
    let err = kpack_fails(&[&"ls", &empty]);
    assert!(
        err.contains("libhost.a") && err.contains("without device code"),
        "{err}"
    );
}
