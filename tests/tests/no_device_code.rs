//! Inputs without device code (docs/offload.md): a host-only library, an
//! empty `.hip_fatbin`, one of zeros only and a NOBITS one each go through
//! `offload`, `split` and `split-wheels` as host code only, unchanged, with
//! a note naming the file, never an error; a pure-Python wheel stays an
//! error (nothing to split).

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;
use kpack_host::binary::HostBinary;

/// The four shapes: file name, bytes, and the words of its note.
fn shapes(dir: &Path) -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let host = fs::read(fixture("libhostonly.so").path).unwrap();
    let fat = fs::read(fixture("libvadd.so").path).unwrap();
    // An empty .hip_fatbin: objcopy adds a zero-size allocated section.
    let empty = dir.join("empty.so");
    run_ok(
        Command::new("objcopy")
            .args(["--add-section", ".hip_fatbin=/dev/null"])
            .args(["--set-section-flags", ".hip_fatbin=alloc,contents,readonly"])
            .arg(fixture("libhostonly.so").path)
            .arg(&empty),
    );
    let (offset, size, header) = fatbin(&fat);
    let mut zeros = fat.clone();
    zeros[offset..offset + size].fill(0);
    // NOBITS: the section header's type (SHT_NOBITS = 8).
    let mut nobits = fat.clone();
    nobits[header + 4..header + 8].copy_from_slice(&8u32.to_le_bytes());
    vec![
        ("libhost.so", host, "no .hip_fatbin section"),
        (
            "libempty.so",
            fs::read(&empty).unwrap(),
            "an empty .hip_fatbin section",
        ),
        ("libzeros.so", zeros, "a .hip_fatbin section of zeros only"),
        (
            "libnobits.so",
            nobits,
            "a .hip_fatbin section without bytes in the file",
        ),
    ]
}

/// `.hip_fatbin`'s file offset and size, and the offset of its section
/// header (ELF64 little-endian).
fn fatbin(elf: &[u8]) -> (usize, usize, usize) {
    let s = HostBinary::parse(elf).unwrap().fatbin().unwrap().unwrap();
    let u64_at = |at: usize| u64::from_le_bytes(elf[at..at + 8].try_into().unwrap()) as usize;
    let u16_at = |at: usize| u16::from_le_bytes(elf[at..at + 2].try_into().unwrap()) as usize;
    let (shoff, shentsize, shnum) = (u64_at(0x28), u16_at(0x3a), u16_at(0x3c));
    let header = (0..shnum)
        .map(|i| shoff + i * shentsize)
        .find(|h| u64_at(h + 0x18) == s.offset as usize && u64_at(h + 0x20) == s.size as usize)
        .unwrap();
    (s.offset as usize, s.size as usize, header)
}

#[test]
fn offload_copies_each_shape_with_a_note() {
    let t = scratch();
    for (name, bytes, why) in shapes(t.path()) {
        let input = t.path().join(name);
        fs::write(&input, &bytes).unwrap();
        let out = t.path().join("out").join(name);
        let archives = t.path().join("kpack");
        let o = kpack(&[&"offload", &input, &"-o", &out, &"--archive-dir", &archives]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{name}: {err}");
        assert!(
            err.contains(&format!("{name}: no device code ({why})")),
            "{name}: {err}"
        );
        assert_eq!(fs::read(&out).unwrap(), bytes, "{name}: changed");
        assert!(
            !archives.exists() || names(&archives).is_empty(),
            "{name}: archives"
        );
        let j: serde_json::Value = offload_json(&input, &out, &archives);
        assert_eq!(j["outcome"], "host_only", "{j}");
    }
}

#[test]
fn split_gives_a_generic_artifact_only() {
    let t = scratch();
    let shard = t.path().join("shard");
    let a = shard.join("fft_lib_gfx110X-dgpu");
    fs::create_dir_all(a.join("stage/lib")).unwrap();
    fs::write(a.join("artifact_manifest.txt"), "stage\n").unwrap();
    let shapes = shapes(t.path());
    for (name, bytes, _) in &shapes {
        fs::write(a.join("stage/lib").join(name), bytes).unwrap();
    }
    let out = t.path().join("out");
    let j: serde_json::Value = serde_json::from_str(&kpack_ok(&[
        &"split",
        &"--batch-artifact-parent-dir",
        &shard,
        &"--output-dir",
        &out,
        &"--json",
    ]))
    .unwrap();
    assert_eq!(names(&out), ["fft_lib_generic"]);
    let notes = j["artifacts"][0]["notes"].to_string();
    for (name, bytes, why) in &shapes {
        let got = out.join("fft_lib_generic/stage/lib").join(name);
        assert_eq!(&fs::read(&got).unwrap(), bytes, "{name}");
        // Host-only libraries are most of a ROCm tree: no note for them.
        if *name != "libhost.so" {
            assert!(
                notes.contains(&format!("{name}: no device code ({why})")),
                "{notes}"
            );
        }
    }
    kpack_ok(&[&"verify", &"--artifacts-dir", &out]);
}

/// An unpacked wheel `pkg` with these files below `pkg/`.
fn wheel(dir: &Path, files: &[(&str, Vec<u8>)]) -> PathBuf {
    let root = dir.join("pkg-src");
    for (rel, bytes) in files {
        let p = root.join("pkg").join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, bytes).unwrap();
    }
    let di = root.join("pkg-1.0.dist-info");
    fs::create_dir_all(&di).unwrap();
    fs::write(
        di.join("METADATA"),
        "Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n",
    )
    .unwrap();
    fs::write(
        di.join("WHEEL"),
        "Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: false\nTag: py3-none-linux_x86_64\n",
    )
    .unwrap();
    root
}

fn split_wheel(input: &Path, out: &Path) -> std::process::Output {
    kpack(&[
        &"split-wheels",
        &"--input",
        &input,
        &"--output-dir",
        &out,
        &"--device-package-prefix",
        &"pkg-device",
        &"--overlay-root",
        &"pkg/",
        &"--json",
    ])
}

#[test]
fn split_wheels_gives_the_host_wheel_only() {
    let t = scratch();
    let shapes = shapes(t.path());
    let files: Vec<(&str, Vec<u8>)> = shapes
        .iter()
        .map(|(n, b, _)| (*n, b.clone()))
        .chain([("__init__.py", b"".to_vec())])
        .collect();
    let src = wheel(t.path(), &files);
    let out = t.path().join("dist");
    let o = split_wheel(&src, &out);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let host = "pkg-1.0-py3-none-linux_x86_64.whl";
    assert_eq!(names(&out), [host]);
    assert_eq!(j["devices"], serde_json::json!([]));
    let notes = j["notes"].to_string();
    let mut z = zip::ZipArchive::new(fs::File::open(out.join(host)).unwrap()).unwrap();
    for (name, bytes, why) in &shapes {
        assert!(
            notes.contains(&format!("pkg/{name}: no device code ({why})")),
            "{notes}"
        );
        let mut got = Vec::new();
        z.by_name(&format!("pkg/{name}"))
            .unwrap()
            .read_to_end(&mut got)
            .unwrap();
        assert_eq!(&got, bytes, "{name}");
    }
    // Nothing to depend on: METADATA as it was.
    let mut md = String::new();
    z.by_name("pkg-1.0.dist-info/METADATA")
        .unwrap()
        .read_to_string(&mut md)
        .unwrap();
    assert_eq!(md, "Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n");

    // A pure-Python wheel: nothing to split.
    let py = wheel(
        &t.path().join("py"),
        &[("__init__.py", b"x = 1\n".to_vec())],
    );
    let o = split_wheel(&py, &t.path().join("dist2"));
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no fat binaries found under pkg/"), "{err}");
    assert!(err.contains("no binaries at all"), "{err}");
}

/// The notes of `kpack split` over an artifact holding only `name`.
fn split_notes(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let a = dir.join("shard/blas_dbg_gfx110X-dgpu");
    fs::create_dir_all(a.join("stage/lib")).unwrap();
    fs::write(a.join("artifact_manifest.txt"), "stage\n").unwrap();
    fs::write(a.join("stage/lib").join(name), bytes).unwrap();
    let j: serde_json::Value = serde_json::from_str(&kpack_ok(&[
        &"split",
        &"--batch-artifact-parent-dir",
        &dir.join("shard"),
        &"--output-dir",
        &dir.join("split"),
        &"--json",
    ]))
    .unwrap();
    j["artifacts"][0]["notes"].to_string()
}

/// A `_dbg` debug library (`objcopy --only-keep-debug` of a fat one: the
/// sections are NOBITS headers, no device bytes) is copied as it is by
/// `offload`, `split` and `split-wheels`, each with the same note.
#[test]
fn a_debug_library_gets_the_same_note_from_every_command() {
    let t = scratch();
    let dbg = t.path().join("libvadd.so.dbg");
    run_ok(
        Command::new("objcopy")
            .arg("--only-keep-debug")
            .arg(fixture("libvadd.so").path)
            .arg(&dbg),
    );
    let bytes = fs::read(&dbg).unwrap();
    let note = "a debug-info file (NOBITS .hip_fatbin, no metadata): no device code";
    // offload
    let out = t.path().join("out/libvadd.so.dbg");
    let o = kpack(&[
        &"offload",
        &dbg,
        &"-o",
        &out,
        &"--archive-dir",
        &t.path().join("k"),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains(&format!("libvadd.so.dbg: {note}")), "{err}");
    assert_eq!(fs::read(&out).unwrap(), bytes);
    // split
    let notes = split_notes(t.path(), "libvadd.so.dbg", &bytes);
    assert!(
        notes.contains(&format!("libvadd.so.dbg: {note}")),
        "{notes}"
    );
    // split-wheels, beside a fat library (something to split)
    let fat = fs::read(fixture("libvadd.so").path).unwrap();
    let src = wheel(
        &t.path().join("w"),
        &[
            ("lib/libvadd.so.dbg", bytes.clone()),
            ("lib/libvadd.so", fat),
        ],
    );
    let o = split_wheel(&src, &t.path().join("dist"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let notes = j["notes"].to_string();
    assert!(
        notes.contains(&format!("pkg/lib/libvadd.so.dbg: {note}")),
        "{notes}"
    );
}
