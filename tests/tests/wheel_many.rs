//! Many wheels in one run (docs/wheels.md): `--input` repeated and a
//! directory of wheels, with `@NAME@` in the prefix and overlay root, one
//! thread pool; each wheel's outputs are byte for byte those of a run on
//! it alone, and its summary lines are those a run alone prints. The same
//! wheel twice, and wheels of several distributions without `@NAME@`, are
//! errors.

use std::fs;
use std::path::{Path, PathBuf};

use crate::common::wheel::*;
use crate::common::*;

const VISION: &str = "0.25.0+rocm7.1";

/// A torchvision-like wheel: two fat binaries under `torchvision/`.
fn vision_wheel(dir: &Path) -> PathBuf {
    let src = dir.join("vision-src");
    let t = src.join("torchvision");
    fs::create_dir_all(t.join("lib")).unwrap();
    fs::copy(fixtures_dir().join("libvadd.so"), t.join("_C.so")).unwrap();
    fs::copy(
        fixtures_dir().join("librdc.so"),
        t.join("lib/libvision_hip.so"),
    )
    .unwrap();
    fs::write(t.join("__init__.py"), "").unwrap();
    let di = src.join(format!("torchvision-{VISION}.dist-info"));
    fs::create_dir_all(&di).unwrap();
    fs::write(
        di.join("METADATA"),
        format!("Metadata-Version: 2.1\nName: torchvision\nVersion: {VISION}\n"),
    )
    .unwrap();
    fs::write(
        di.join("WHEEL"),
        format!("Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: false\nTag: {TAG}\n"),
    )
    .unwrap();
    fs::write(di.join("RECORD"), "").unwrap();
    python_ok(&[&"-m", &"wheel", &"pack", &src, &"-d", &dir]);
    dir.join(format!("torchvision-{VISION}-{TAG}.whl"))
}

fn split(inputs: &[&Path], out: &Path, prefix: &str, overlay: &str) -> std::process::Output {
    let mut args: Vec<std::ffi::OsString> = vec!["split-wheels".into()];
    for i in inputs {
        args.push("--input".into());
        args.push(i.into());
    }
    for a in [
        "--output-dir".into(),
        out.into(),
        "--device-package-prefix".into(),
        prefix.into(),
        "--overlay-root".into(),
        overlay.into(),
        "--wheel-type".into(),
        "torch-fat".into(),
        "-j".into(),
        "2".into(),
    ] {
        args.push(a);
    }
    let args: Vec<&dyn AsRef<std::ffi::OsStr>> = args.iter().map(|a| a as _).collect();
    kpack(&args)
}

fn ok(o: std::process::Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn many_wheels_one_run_as_if_alone() {
    let tmp = scratch();
    let wheels = tmp.path().join("wheels");
    fs::create_dir_all(&wheels).unwrap();
    let torch = torch_wheel(&wheels);
    let vision = vision_wheel(&wheels);

    // Each alone.
    let alone = tmp.path().join("alone");
    let t = ok(split(&[&torch], &alone, "amd-torch-device", "torch/"));
    let v = ok(split(
        &[&vision],
        &alone,
        "amd-torchvision-device",
        "torchvision/",
    ));

    // Both in one run, as two --input and as the directory.
    let prefix = "amd-@NAME@-device";
    let together = tmp.path().join("together");
    let both = ok(split(&[&torch, &vision], &together, prefix, "@NAME@/"));
    assert_eq!(
        both,
        format!("{t}{v}").replace(&*alone.to_string_lossy(), &together.to_string_lossy())
    );
    assert_eq!(dir_files(&together), dir_files(&alone), "byte for byte");
    let from_dir = tmp.path().join("from-dir");
    let out = ok(split(&[&wheels], &from_dir, prefix, "@NAME@/"));
    assert_eq!(out.matches("Split complete:").count(), 2);
    assert_eq!(dir_files(&from_dir), dir_files(&alone));
    assert!(names(&alone).contains(&format!("amd_torchvision_device_gfx942-{VISION}-{TAG}.whl")));

    // The same wheel twice; several distributions under one prefix.
    let bad = tmp.path().join("bad");
    let o = split(&[&torch, &wheels], &bad, prefix, "@NAME@/");
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("given twice"));
    let o = split(&[&torch, &vision], &bad, "amd-torch-device", "@NAME@/");
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("@NAME@"));
    assert!(!bad.exists() || names(&bad).is_empty(), "nothing written");
}
