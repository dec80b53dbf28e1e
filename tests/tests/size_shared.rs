//! Shared code objects (the same code object in several binaries of one
//! archive is stored once, its TOC entries sharing the ordinal), and `kpack
//! size` / `kpack diff`, whose figures are those `kpack ls` and `extract`
//! give, and whose treemap is an SVG that renders.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::path::Path;
use std::process::Command;
use std::ptr;

use crate::common::*;
use rocm_kpack::*;
use serde_json::Value;

/// An install tree with libvadd.so twice (lib/ and a test program's copy
/// under share/), libmulti.so and a data file.
fn tree_with_duplicates(root: &Path) {
    std::fs::create_dir_all(root.join("lib")).unwrap();
    std::fs::create_dir_all(root.join("share/tests")).unwrap();
    std::fs::copy(fixture("libvadd.so").path, root.join("lib/libvadd.so")).unwrap();
    std::fs::copy(
        fixture("libvadd.so").path,
        root.join("share/tests/libvadd_test.so"),
    )
    .unwrap();
    std::fs::copy(fixture("libmulti.so").path, root.join("lib/libmulti.so")).unwrap();
    std::fs::write(root.join("share/data.txt"), vec![b'x'; 5000]).unwrap();
}

fn pack_tree(input: &Path, out: &Path, jobs: &str) -> Value {
    let s = kpack_ok(&[
        &"pack-tree",
        &"--input",
        &input,
        &"--output",
        &out,
        &"--group-name",
        &"pkg",
        &"--jobs",
        &jobs,
        &"--json",
    ]);
    serde_json::from_str(&s).unwrap()
}

/// `kpack_get_kernel` through the C API (what the reference runtime's
/// reader does: look the key up, read its ordinal's frame).
fn c_get_kernel(archive: &Path, key: &str, target: &str) -> Vec<u8> {
    let path = cpath(archive);
    let (key, target) = (CString::new(key).unwrap(), CString::new(target).unwrap());
    let mut a = ptr::null_mut();
    let (mut p, mut size) = (ptr::null_mut(), 0usize);
    // SAFETY: valid C strings and out-pointers; the archive is closed once.
    unsafe {
        assert_eq!(kpack_open(path.as_ptr(), &mut a), KpackError::Success);
        assert_eq!(
            kpack_get_kernel(a, key.as_ptr(), target.as_ptr(), &mut p, &mut size),
            KpackError::Success
        );
        let v = std::slice::from_raw_parts(p.cast::<u8>(), size).to_vec();
        kpack_free_kernel(p);
        kpack_close(a);
        v
    }
}

#[test]
fn identical_code_objects_are_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in");
    tree_with_duplicates(&input);
    let out = dir.path().join("out");
    let s = pack_tree(&input, &out, "1");
    let vadd = code_objects(&fixture("libvadd.so").path);
    let multi = code_objects(&fixture("libmulti.so").path);
    assert_eq!(s["shared_code_objects"], vadd.len());
    let saved: usize = vadd.values().map(Vec::len).sum();
    assert_eq!(s["bytes_saved"], saved);
    for ((bundle, target), bytes) in &vadd {
        let path = out.join(format!(".kpack/pkg_{target}.kpack"));
        let a = kpack_loader::open_archive(&path).unwrap();
        let x = a
            .entry(&format!("lib/libvadd.so#{bundle}"), target)
            .unwrap();
        let y = a
            .entry(&format!("share/tests/libvadd_test.so#{bundle}"), target)
            .unwrap();
        assert_eq!(x.ordinal, y.ordinal, "{target}: one ordinal for both");
        assert_eq!(x.original_size, bytes.len() as u64);
        // formats.md §3.5: ordinals below the frame count, u32, original_size exact:
        // the C reader (as the reference's) reads both keys unchanged.
        for key in ["lib/libvadd.so", "share/tests/libvadd_test.so"] {
            assert!(c_get_kernel(&path, &format!("{key}#{bundle}"), target) == *bytes);
        }
        // Frames: one per distinct code object.
        let raw = std::fs::read(&path).unwrap();
        let frames = u32::from_le_bytes(raw[64..68].try_into().unwrap()) as usize;
        let distinct = 1 + multi.keys().filter(|(_, t)| t == target).count();
        assert_eq!(frames, distinct, "{target}");
        assert_eq!(a.kernel_count(), distinct + 1);
    }
    // The installed layout loads through the runtime's search.
    let v = kpack_ok(&[&"verify-elf", &out.join("share/tests/libvadd_test.so")]);
    assert!(v.contains("ok"));
    // The same bytes for any --jobs.
    let out2 = dir.path().join("out2");
    pack_tree(&input, &out2, "2");
    assert_eq!(snapshot(&out), snapshot(&out2));
    // kpack size reports the sharing.
    let size: Value = serde_json::from_str(&kpack_ok(&[&"size", &out, &"--json"])).unwrap();
    let root = &size["roots"][0];
    let shared: u64 = root["targets"]
        .as_object()
        .unwrap()
        .values()
        .map(|t| t["shared"].as_u64().unwrap())
        .sum();
    assert_eq!(shared as usize, vadd.len());
}

/// `kpack size` on a fat binary and on its offloaded form: the per-target
/// figures are the sizes `kpack ls` lists and `kpack extract` writes; the
/// treemap renders.
#[test]
fn size_figures_are_those_of_ls_and_extract() {
    for name in ["libmulti.so", "libwide.so", "libvadd_compressed.so"] {
        let f = fixture(name);
        let ls: Value = serde_json::from_str(&kpack_ok(&[&"ls", &f.path, &"--json"])).unwrap();
        let mut want: BTreeMap<String, u64> = BTreeMap::new();
        for b in ls["bundles"].as_array().unwrap() {
            for e in b["entries"].as_array().unwrap() {
                if let Some(t) = e["target"].as_str() {
                    *want.entry(t.to_string()).or_default() += e["size"].as_u64().unwrap();
                }
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let svg = dir.path().join("map.svg");
        let s: Value =
            serde_json::from_str(&kpack_ok(&[&"size", &f.path, &"--json", &"--svg", &svg]))
                .unwrap();
        let root = &s["roots"][0];
        assert_eq!(root["kind"], "fat_binary");
        let got: BTreeMap<String, u64> = root["targets"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(t, v)| (t.clone(), v["uncompressed"].as_u64().unwrap()))
            .collect();
        assert_eq!(got, want, "{name}");
        let section = ls["section_size"].as_u64().unwrap();
        assert_eq!(
            root["host_bytes"].as_u64().unwrap(),
            ls["file_size"].as_u64().unwrap() - section
        );
        assert_eq!(
            root["device_bytes"].as_u64().unwrap() + root["overhead_bytes"].as_u64().unwrap(),
            section
        );
        renders(&svg, name);

        // Offloaded: host bytes are the file, device bytes are in the
        // archives its search paths find, uncompressed as extracted.
        let lib = dir.path().join("lib").join(f.file_name());
        std::fs::create_dir_all(lib.parent().unwrap()).unwrap();
        kpack_ok(&[
            &"offload",
            &f.path,
            &"-o",
            &lib,
            &"--archive-dir",
            &dir.path().join(".kpack"),
        ]);
        let ex = dir.path().join("ex");
        let files: Value =
            serde_json::from_str(&kpack_ok(&[&"extract", &lib, &"-o", &ex, &"--json"])).unwrap();
        let mut extracted: BTreeMap<String, u64> = BTreeMap::new();
        for x in files.as_array().unwrap() {
            *extracted
                .entry(x["target"].as_str().unwrap().into())
                .or_default() += x["size"].as_u64().unwrap();
        }
        let s: Value = serde_json::from_str(&kpack_ok(&[&"size", &lib, &"--json"])).unwrap();
        let root = &s["roots"][0];
        assert_eq!(root["kind"], "offloaded_binary");
        assert_eq!(root["host_bytes"], std::fs::metadata(&lib).unwrap().len());
        let got: BTreeMap<String, u64> = root["targets"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(t, v)| (t.clone(), v["uncompressed"].as_u64().unwrap()))
            .collect();
        assert_eq!(got, extracted, "{name} offloaded");
        // Stored bytes are the archives' frames.
        for (t, v) in root["targets"].as_object().unwrap() {
            let a = kpack_loader::open_archive(dir.path().join(format!(
                ".kpack/{}_{t}.kpack",
                f.file_name().split('.').next().unwrap()
            )))
            .unwrap();
            let stored: u64 = a.entries().iter().map(|e| a.stored_size(e).unwrap()).sum();
            assert_eq!(v["stored"].as_u64().unwrap(), stored);
        }
    }
}

/// rsvg-convert (librsvg) parses the SVG as XML and renders it.
fn renders(svg: &Path, what: &str) {
    let text = std::fs::read_to_string(svg).unwrap();
    assert!(text.starts_with("<?xml") && text.trim_end().ends_with("</svg>"));
    let png = svg.with_extension("png");
    let out = Command::new("rsvg-convert")
        .arg(svg)
        .arg("-o")
        .arg(&png)
        .output()
        .expect("rsvg-convert (package librsvg2-bin)");
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"));
    // Width and height from the IHDR chunk.
    let w = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    let h = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
    assert!(w >= 1000 && h >= 700, "{w}x{h}");
}

/// Trees and wheels: size adds every file up; diff compares two builds.
#[test]
fn trees_wheels_and_diff() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    tree_with_duplicates(&a);
    let b = dir.path().join("b");
    tree_with_duplicates(&b);
    // B: libvadd pruned to one target, libwide added.
    kpack_ok(&[
        &"prune",
        &a.join("lib/libvadd.so"),
        &"-o",
        &b.join("lib/libvadd.so"),
        &"--targets",
        &"gfx1100",
    ]);
    std::fs::copy(fixture("libwide.so").path, b.join("lib/libwide.so")).unwrap();
    let s: Value = serde_json::from_str(&kpack_ok(&[&"size", &a, &"--json"])).unwrap();
    let root = &s["roots"][0];
    assert_eq!(root["kind"], "tree");
    assert_eq!(root["files"], 4);
    assert_eq!(root["other_bytes"], 5000);
    let disk: u64 = [
        "lib/libvadd.so",
        "share/tests/libvadd_test.so",
        "lib/libmulti.so",
        "share/data.txt",
    ]
    .iter()
    .map(|p| std::fs::metadata(a.join(p)).unwrap().len())
    .sum();
    assert_eq!(root["bytes"], disk);
    assert_eq!(
        root["host_bytes"].as_u64().unwrap()
            + root["device_bytes"].as_u64().unwrap()
            + root["overhead_bytes"].as_u64().unwrap()
            + root["other_bytes"].as_u64().unwrap(),
        disk
    );

    let d: Value = serde_json::from_str(&kpack_ok(&[&"diff", &a, &b, &"--json"])).unwrap();
    assert_eq!(d["kind"], "tree");
    let change = |list: &str, name: &str| -> String {
        d[list]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .map(|c| c["change"].as_str().unwrap().to_string())
            .unwrap_or_else(|| "absent".into())
    };
    assert_eq!(change("binaries", "lib/libwide.so"), "added");
    assert_eq!(change("binaries", "lib/libvadd.so"), "shrunk");
    assert_eq!(
        change("code_objects", "lib/libvadd.so#0 @ gfx942"),
        "removed"
    );
    assert_eq!(
        change("code_objects", "lib/libwide.so#0 @ gfx90a:xnack+"),
        "added"
    );
    assert_eq!(
        change("code_objects", "lib/libvadd.so#0 @ gfx1100"),
        "absent"
    );
    assert_eq!(change("targets", "gfx90a:xnack-"), "added");
    assert_eq!(change("targets", "gfx1101"), "shrunk");
    assert!(d["bytes_b"].as_u64().unwrap() > d["bytes_a"].as_u64().unwrap());

    // A wheel of tree A (zip, deflated): the same figures as the tree.
    let whl = dir.path().join("pkg-1.0-py3-none-linux_x86_64.whl");
    let st = Command::new("python3")
        .args([
            "-c",
            "import sys,os,zipfile\nz=zipfile.ZipFile(sys.argv[1],'w',zipfile.ZIP_DEFLATED)\nfor d,_,fs in sorted(os.walk(sys.argv[2])):\n  for f in sorted(fs):\n    p=os.path.join(d,f); z.write(p, os.path.relpath(p, sys.argv[2]))\nz.close()",
        ])
        .arg(&whl)
        .arg(&a)
        .status()
        .unwrap();
    assert!(st.success());
    let w: Value = serde_json::from_str(&kpack_ok(&[&"size", &whl, &"--json"])).unwrap();
    let wr = &w["roots"][0];
    assert_eq!(wr["kind"], "wheel");
    assert_eq!(wr["unpacked_bytes"], disk);
    assert_eq!(wr["targets"], root["targets"]);
    assert_eq!(wr["host_bytes"], root["host_bytes"]);
    // Two kinds: a clear error.
    let err = kpack_fails(&[&"diff", &a, &whl]);
    assert!(err.contains("same kind"), "{err}");
    let err = kpack_fails(&[&"size", &a.join("share/data.txt")]);
    assert!(err.contains("data.txt"), "{err}");
    // The treemap of several paths renders.
    let svg = dir.path().join("both.svg");
    kpack_ok(&[&"size", &a, &b, &whl, &"--svg", &svg]);
    renders(&svg, "trees and wheel");
}
