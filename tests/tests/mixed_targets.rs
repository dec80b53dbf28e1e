//! Bundles that do not all hold the same targets (`libmixed.so`: one unit
//! built for gfx1100 and gfx90a, one for gfx1100 only). The split records
//! each code object index's targets (`kpack_co_targets`) only for such a
//! binary; `why`, `verify`, `verify --tree`, `doctor` and `bundle` then
//! say that bundle #1 was built without gfx90a, as a note, and succeed;
//! `ls` lists each bundle's targets; the runtime, like the fat binary, has
//! no code for it.

use std::fs;
use std::path::Path;
use std::process::Command;

use crate::common::*;
use kpack_format::hipk::KEY_CO_TARGETS;
use rocm_kpack::*;
use serde_json::{json, Value};

const NOTE: &str = "bundle #1 was built without gfx90a in the original fat binary";

/// `kpack_offload` of fixture `name` into `dir/lib`, archives in
/// `dir/.kpack`: the offloaded binary.
fn offloaded(name: &str, dir: &Path) -> std::path::PathBuf {
    let out = dir.join("lib").join(name);
    let f = fixture(name);
    let archives = dir.join(".kpack");
    kpack_ok(&[
        &"offload",
        &f.path,
        &"-o",
        &out,
        &"--archive-dir",
        &archives,
    ]);
    out
}

/// The HIPK metadata of an offloaded ELF binary, as MessagePack.
fn metadata(binary: &Path) -> kpack_format::msgpack::Value {
    let bytes = fs::read(binary).unwrap();
    let elf = kpack_host::elf::ElfView::parse(&bytes).unwrap();
    let meta = elf.section(".rocm_kpack_ref").unwrap().unwrap();
    kpack_format::msgpack::decode_prefix(meta.data).unwrap().0
}

/// Run `kpack ARGS --json`: whether it succeeded, and its JSON.
fn json_of(args: &[&dyn AsRef<std::ffi::OsStr>]) -> (bool, Value) {
    let out = kpack(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    (out.status.success(), v)
}

#[test]
fn the_key_is_written_only_for_bundles_of_different_targets() {
    let dir = scratch();
    let mixed = offloaded("libmixed.so", dir.path());
    let m = metadata(&mixed);
    let key = kpack_format::msgpack::get(&m, KEY_CO_TARGETS).expect("kpack_co_targets");
    // kpack_targets = [gfx1100, gfx90a]; #1 holds position 0 only.
    assert_eq!(
        kpack_format::msgpack::encode(key),
        [0x91, 0x92, 0x91, 0x00, 0x91, 0x01]
    );
    let plain = offloaded("libmulti.so", dir.path());
    assert!(kpack_format::msgpack::get(&metadata(&plain), KEY_CO_TARGETS).is_none());
    assert!(kpack_format::msgpack::get(&metadata(&plain), "kpack_targets").is_some());
    // ls: per code object index for the mixed one, nothing for the other.
    let (_, l) = json_of(&[&"ls", &mixed, &"--json"]);
    assert_eq!(
        l["bundle_targets"],
        json!([
            {"co_index": 0, "targets": ["gfx1100", "gfx90a"]},
            {"co_index": 1, "targets": ["gfx1100"]}
        ])
    );
    let text = kpack_ok(&[&"ls", &mixed]);
    assert!(text.contains("  #1: gfx1100\n"), "{text}");
    let (_, l) = json_of(&[&"ls", &plain, &"--json"]);
    assert!(l.get("bundle_targets").is_none(), "{l}");
}

#[test]
fn ls_lists_each_bundles_targets() {
    let f = fixture("libmixed.so");
    let (_, l) = json_of(&[&"ls", &f.path, &"--json"]);
    let per: Vec<&Value> = (l["bundles"].as_array().unwrap().iter())
        .map(|b| &b["targets"])
        .collect();
    assert_eq!(per, [&json!(["gfx1100", "gfx90a"]), &json!(["gfx1100"])]);
    for (i, want) in f.bundle_targets.iter().enumerate() {
        assert_eq!(per[i], &json!(want), "bundle {i}");
    }
    let text = kpack_ok(&[&"ls", &f.path]);
    assert!(text.contains(", targets gfx1100\n"), "{text}");
    // Bundles of the same targets: the text as before.
    let text = kpack_ok(&[&"ls", &fixture("libmulti.so").path]);
    assert!(!text.contains(", targets "), "{text}");
}

#[test]
fn why_notes_the_bundle_built_without_the_target() {
    let dir = scratch();
    let lib = offloaded("libmixed.so", dir.path());
    let (ok, w) = json_of(&[&"why", &lib, &"--arch", &"gfx90a", &"--json"]);
    assert!(ok, "{w}");
    let ws = w["wrappers"].as_array().unwrap();
    assert_eq!(ws[0]["result"], "loaded");
    assert!(ws[0].get("note").is_none());
    assert_eq!(ws[1]["result"], "failed");
    assert_eq!(ws[1]["error"], "KPACK_ERROR_KERNEL_NOT_FOUND");
    assert!(ws[1]["note"].as_str().unwrap().starts_with(NOTE), "{w}");
    let text = kpack_ok(&[&"why", &lib, &"--arch", &"gfx90a"]);
    assert!(text.contains(&format!("note: {NOTE}")), "{text}");
    // gfx1100: both load, no note.
    let (ok, w) = json_of(&[&"why", &lib, &"--arch", &"gfx1100", &"--json"]);
    assert!(ok && !w.to_string().contains("built without"), "{w}");
    // A target no bundle has: a failure, as before.
    let (ok, w) = json_of(&[&"why", &lib, &"--arch", &"gfx942", &"--json"]);
    assert!(!ok && w["has_code"] == false, "{w}");
    // A missing archive is still a failure, not a note.
    fs::remove_file(dir.path().join(".kpack/libmixed_gfx90a.kpack")).unwrap();
    let (ok, w) = json_of(&[&"why", &lib, &"--arch", &"gfx90a", &"--json"]);
    assert!(!ok, "{w}");
    assert_eq!(w["wrappers"][0]["error"], "KPACK_ERROR_ARCHIVE_NOT_FOUND");
}

/// The C runtime loads what the fat binary holds, and nothing where it
/// holds nothing.
#[test]
fn the_runtime_has_the_fat_binarys_code_and_no_more() {
    let dir = scratch();
    let lib = offloaded("libmixed.so", dir.path());
    let truth = code_objects(&fixture("libmixed.so").path);
    for co in 0..2u32 {
        for t in ["gfx1100", "gfx90a"] {
            let got = c_runtime_load(&lib, co, &[&format!("amdgcn-amd-amdhsa--{t}")]);
            match truth.get(&(co as usize, t.to_string())) {
                Some(bytes) => assert!(got.as_ref() == Ok(bytes), "#{co} {t}"),
                None => assert_eq!(got, Err(KpackError::KernelNotFound), "#{co} {t}"),
            }
        }
    }
    assert!(!truth.contains_key(&(1, "gfx90a".to_string())));
    assert_eq!(truth.len(), 3);
}

#[test]
fn verify_tree_and_doctor_note_it_and_pass() {
    let dir = scratch();
    let root = dir.path().join("tree");
    offloaded("libmixed.so", &root);
    let (ok, v) = json_of(&[&"verify", &"--tree", &root, &"--json"]);
    assert!(ok, "{v}");
    assert_eq!(v["problems"], json!([]));
    assert_eq!(v["notes"][0]["binary"], "lib/libmixed.so");
    assert!(v["notes"][0]["message"].as_str().unwrap().starts_with(NOTE));
    assert_eq!(v["notes"].as_array().unwrap().len(), 1);
    let (ok, d) = json_of(&[&"doctor", &root, &"--arch", &"gfx90a", &"--json"]);
    assert!(ok, "{d}");
    assert_eq!(d["problems"], json!([]));
    assert_eq!(d["notes"][0]["target"], "gfx90a");
    assert!(d["notes"][0]["message"].as_str().unwrap().starts_with(NOTE));
    let text = kpack_ok(&[&"doctor", &root, &"--arch", &"gfx90a"]);
    assert!(text.contains(NOTE) && text.contains("OK:"), "{text}");
    assert!(!text.contains("pip install"), "{text}");
    // gfx1100: every code object loads, no note.
    let (ok, d) = json_of(&[&"doctor", &root, &"--arch", &"gfx1100", &"--json"]);
    assert!(ok && d.get("notes").is_none(), "{d}");
    // An ordinary binary's tree has no notes.
    let plain = dir.path().join("plain");
    offloaded("libmulti.so", &plain);
    let (ok, v) = json_of(&[&"verify", &"--tree", &plain, &"--json"]);
    assert!(ok && v.get("notes").is_none(), "{v}");
    // The gfx90a archive gone: code object #0 is missing, a problem.
    fs::remove_file(root.join(".kpack/libmixed_gfx90a.kpack")).unwrap();
    let (ok, d) = json_of(&[&"doctor", &root, &"--arch", &"gfx90a", &"--json"]);
    assert!(!ok, "{d}");
    assert_eq!(d["problems"][0]["kind"], "missing_archive");
}

#[test]
fn split_artifacts_verify_with_a_note() {
    let dir = scratch();
    let input = dir.path().join("mixed_lib_x");
    fs::create_dir_all(input.join("stage/lib")).unwrap();
    fs::write(input.join("artifact_manifest.txt"), "stage\n").unwrap();
    fs::copy(
        fixture("libmixed.so").path,
        input.join("stage/lib/libmixed.so"),
    )
    .unwrap();
    let out = dir.path().join("out");
    kpack_ok(&[
        &"split",
        &"--artifact-dir",
        &input,
        &"--artifact-prefix",
        &"mixed_lib",
        &"--output-dir",
        &out,
    ]);
    let generic = out.join("mixed_lib_generic/stage/lib/libmixed.so");
    assert!(kpack_format::msgpack::get(&metadata(&generic), KEY_CO_TARGETS).is_some());
    let (ok, v) = json_of(&[&"verify", &"--artifacts-dir", &out, &"--json"]);
    assert!(ok, "{v}");
    assert_eq!(v["problems"], json!([]));
    let notes = v["notes"].as_array().unwrap();
    assert_eq!(notes.len(), 1, "{v}");
    assert!(notes[0].as_str().unwrap().contains(NOTE), "{v}");
    // 2 code objects for gfx1100, 1 for gfx90a.
    assert_eq!(v["wrappers_resolved"], 3);
    let text = kpack_ok(&[&"verify", &"--artifacts-dir", &out]);
    assert!(text.contains("note: ") && text.contains(NOTE), "{text}");
}

/// `kpack bundle` copies it with the archives and checks it from there,
/// the bundle built without gfx90a not looked for.
#[test]
fn bundle_takes_it() {
    let dir = scratch();
    let lib = offloaded("libmixed.so", dir.path());
    let app = dir.path().join("app");
    kpack_ok(&[&"bundle", &lib, &"--into", &app]);
    let (ok, w) = json_of(&[
        &"why",
        &app.join("libmixed.so"),
        &"--arch",
        &"gfx90a",
        &"--json",
    ]);
    assert!(ok, "{w}");
    assert!(w["wrappers"][1]["note"].is_string(), "{w}");
    let out = Command::new(kpack_bin())
        .arg("ls")
        .arg(app.join("libmixed.so"))
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("kpack_co_targets"));
}
