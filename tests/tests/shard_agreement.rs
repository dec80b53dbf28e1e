//! Shards and artifacts that agree: recombine refuses two shards that put
//! different bytes under one path of one output artifact (and lists the
//! difference when the config lets the primary shard win, for generic
//! artifacts always); targets select files as whole target IDs (gfx1250
//! never takes gfx1250-strict or `_strict` files); `--expect-targets`
//! refuses a partial set before anything is written, for split, recombine,
//! split-wheels and verify.

use std::fs;
use std::path::{Path, PathBuf};

use crate::common::wheel::torch_tree;
use crate::common::{fixtures_dir, kpack_fails, kpack_ok, listing, make_shard, names};
use kpack_testkit::shards::{ROCBLAS_PREFIX, SHARDS, SPLIT_DATABASES};

/// Split shards `which` (of the test kit's shard tree) into
/// `root/split/<shard>`; returns that directory.
fn split_shards(root: &Path, which: &[&str]) -> PathBuf {
    let input = root.join("in");
    let split = root.join("split");
    for (shard, family, targets) in SHARDS.iter().filter(|s| which.contains(&s.0)) {
        make_shard(&input, shard, family, targets);
        let mut v: Vec<std::ffi::OsString> = vec![
            "split".into(),
            "--batch-artifact-parent-dir".into(),
            input.join(shard).into(),
            "--output-dir".into(),
            split.join(shard).into(),
            "--split-databases".into(),
        ];
        v.extend(SPLIT_DATABASES.iter().map(Into::into));
        kpack_ok(&args(&v));
    }
    split
}

fn write_config(path: &Path, primary: &str, groups: &str, validation: &str) {
    let text = format!(
        r#"{{"primary_shard": "{primary}", "architecture_groups": {groups}, "validation": {validation}}}"#
    );
    fs::write(path, text).unwrap();
}

/// The groups of a config putting every target of the gfx110X and gfx120X
/// shards in one group, `all`.
const ONE_GROUP: &str =
    r#"{"all": {"architectures": ["gfx1100", "gfx1101", "gfx1102", "gfx1200", "gfx1201"]}}"#;

fn recombine(input: &Path, config: &Path, out: &Path, extra: &[&str]) -> Vec<std::ffi::OsString> {
    let mut v: Vec<std::ffi::OsString> = vec![
        "recombine".into(),
        "--input-shards-dir".into(),
        input.into(),
        "--config".into(),
        config.into(),
        "--output-dir".into(),
        out.into(),
    ];
    v.extend(extra.iter().map(|s| s.into()));
    v
}

fn args(v: &[std::ffi::OsString]) -> Vec<&dyn AsRef<std::ffi::OsStr>> {
    v.iter().map(|a| a as _).collect()
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// Two shards contributing different bytes under one path of one group
/// artifact: refused, naming the path and both shards, nothing written;
/// with `error_on_duplicate_device_code` false the primary shard's file is
/// taken and the conflict listed (text and JSON).
#[test]
fn conflicting_group_file_is_refused_naming_both_shards() {
    let t = tempfile::tempdir().unwrap();
    let split = split_shards(t.path(), &["gfx110X-build", "gfx120X-build"]);
    let rel = format!("{ROCBLAS_PREFIX}/lib/rocblas/library/shared.txt");
    for (shard, target, text) in [
        ("gfx110X-build", "gfx1100", "from gfx110X\n"),
        ("gfx120X-build", "gfx1200", "from gfx120X\n"),
    ] {
        fs::write(
            split
                .join(shard)
                .join(format!("blas_lib_{target}"))
                .join(&rel),
            text,
        )
        .unwrap();
    }
    let config = t.path().join("config.json");
    write_config(&config, "gfx120X-build", ONE_GROUP, "{}");
    let out = t.path().join("out");
    fs::create_dir_all(&out).unwrap();
    let before = listing(&out);
    let err = kpack_fails(&args(&recombine(&split, &config, &out, &[])));
    assert!(err.contains(&format!("blas_lib_all/{rel}")), "{err}");
    assert!(
        err.contains("shard gfx110X-build and shard gfx120X-build"),
        "{err}"
    );
    assert_eq!(listing(&out), before, "a refused recombine wrote something");

    write_config(
        &config,
        "gfx120X-build",
        ONE_GROUP,
        r#"{"error_on_duplicate_device_code": false}"#,
    );
    let s = json(&kpack_ok(&args(&recombine(
        &split,
        &config,
        &out,
        &["--json"],
    ))));
    let conflicts = s["file_conflicts"].as_array().unwrap();
    assert_eq!(conflicts.len(), 1, "{conflicts:?}");
    assert_eq!(conflicts[0]["artifact"], "blas_lib_all");
    assert_eq!(conflicts[0]["path"], rel.as_str());
    assert_eq!(
        conflicts[0]["shards"],
        serde_json::json!(["gfx110X-build", "gfx120X-build"])
    );
    assert_eq!(conflicts[0]["taken_from"], "gfx120X-build");
    assert_eq!(
        fs::read_to_string(out.join("blas_lib_all").join(&rel)).unwrap(),
        "from gfx120X\n"
    );
    let text = kpack_ok(&args(&recombine(
        &split,
        &config,
        &t.path().join("out2"),
        &[],
    )));
    assert!(
        text.contains(&format!(
            "file conflict: blas_lib_all/{rel}: shards gfx110X-build, gfx120X-build differ (taken from gfx120X-build)"
        )),
        "{text}"
    );
}

/// Generic artifacts: offloaded binaries of different shards differ in
/// bytes and HIPK targets but agree (no difference listed); a file that
/// differs (a header, a library that was no fat binary) is listed even
/// though the primary shard wins, and refused with
/// `verify_generic_artifacts_match`.
#[test]
fn differing_generic_files_are_listed_when_the_primary_shard_wins() {
    let t = tempfile::tempdir().unwrap();
    let split = split_shards(t.path(), &["gfx110X-build", "gfx120X-build"]);
    let config = t.path().join("config.json");
    write_config(&config, "gfx110X-build", ONE_GROUP, "{}");
    let s = json(&kpack_ok(&args(&recombine(
        &split,
        &config,
        &t.path().join("o1"),
        &["--json"],
    ))));
    assert_eq!(s["generic_differences"], serde_json::json!([]), "{s}");
    assert_eq!(s["file_conflicts"], serde_json::json!([]));

    let header = format!("{ROCBLAS_PREFIX}/include/rocblas/rocblas.h");
    let lib = format!("{ROCBLAS_PREFIX}/lib/librocfft.so");
    let other = split.join("gfx120X-build/blas_lib_generic");
    fs::write(other.join(&header), "/* another API */\n").unwrap();
    fs::write(
        split.join("gfx110X-build/blas_lib_generic").join(&lib),
        b"\x7fELF one",
    )
    .unwrap();
    fs::write(other.join(&lib), b"\x7fELF two").unwrap();
    let out = t.path().join("o2");
    let s = json(&kpack_ok(&args(&recombine(
        &split,
        &config,
        &out,
        &["--json"],
    ))));
    let d = s["generic_differences"].as_array().unwrap();
    let paths: Vec<&str> = d.iter().map(|x| x["path"].as_str().unwrap()).collect();
    assert_eq!(paths, [header.as_str(), lib.as_str()], "{d:?}");
    for x in d {
        assert_eq!(x["artifact"], "blas_lib_generic");
        assert_eq!(
            x["shards"],
            serde_json::json!(["gfx110X-build", "gfx120X-build"])
        );
        assert_eq!(x["what"], "different bytes");
    }
    assert_eq!(
        fs::read_to_string(out.join("blas_lib_generic").join(&header)).unwrap(),
        "/* rocBLAS API */\n",
        "the primary shard's file is taken"
    );
    let text = kpack_ok(&args(&recombine(
        &split,
        &config,
        &t.path().join("o3"),
        &[],
    )));
    assert!(
        text.contains(&format!(
            "generic difference: blas_lib_generic/{lib}: different bytes (shards gfx110X-build and gfx120X-build; taken from gfx110X-build)"
        )),
        "{text}"
    );

    write_config(
        &config,
        "gfx110X-build",
        ONE_GROUP,
        r#"{"verify_generic_artifacts_match": true}"#,
    );
    let out = t.path().join("o4");
    let err = kpack_fails(&args(&recombine(&split, &config, &out, &[])));
    assert!(err.contains("generic artifacts differ"), "{err}");
    assert!(err.contains(&header), "{err}");
    assert!(!out.exists());
}

/// A shard whose generic artifact is another build's (the last family to
/// upload overwrote it): its archives record their binary's digest, which
/// is not the device digest of the generic binary the shard now holds.
/// Refused before anything is written, naming the shard, an archive of it
/// and both builds; the same shards untouched recombine.
#[test]
fn a_shards_generic_artifact_of_another_build_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let split = split_shards(t.path(), &["gfx110X-build", "gfx120X-build"]);
    let config = t.path().join("config.json");
    write_config(&config, "gfx120X-build", ONE_GROUP, "{}");
    kpack_ok(&args(&recombine(
        &split,
        &config,
        &t.path().join("ok"),
        &[],
    )));

    let overwritten = split.join("gfx110X-build/blas_lib_generic");
    fs::remove_dir_all(&overwritten).unwrap();
    let st = std::process::Command::new("cp")
        .arg("-a")
        .arg(split.join("gfx120X-build/blas_lib_generic"))
        .arg(&overwritten)
        .status()
        .unwrap();
    assert!(st.success());
    let out = t.path().join("out");
    fs::create_dir_all(&out).unwrap();
    let err = kpack_fails(&args(&recombine(&split, &config, &out, &[])));
    assert!(err.contains("shard gfx110X-build: "), "{err}");
    assert!(err.contains("blas_lib_gfx110"), "{err}");
    assert!(err.contains(".kpack holds "), "{err}");
    assert!(
        err.contains("from another build than the binary in"),
        "{err}"
    );
    assert!(err.contains("blas_lib_generic"), "{err}");
    assert!(err.contains("the archive's entry was split from"), "{err}");
    assert_eq!(
        names(&out),
        Vec::<String>::new(),
        "a refused recombine wrote something"
    );
}

/// An artifact with gfx942, gfx1250, gfx1250-strict and amdgcnspirv code
/// objects (the test kit's MIOpen fixture) and database files of gfx1250,
/// gfx1250-strict (spelled `_strict`) and gfx1201.
fn strict_artifact(root: &Path) -> PathBuf {
    let a = root.join("miopen_lib_x");
    let stage = a.join("stage");
    fs::create_dir_all(stage.join("lib/rocblas/library")).unwrap();
    fs::write(a.join("artifact_manifest.txt"), "stage\n").unwrap();
    fs::copy(
        fixtures_dir().join("therock/libMIOpen.so.1"),
        stage.join("lib/libMIOpen.so.1"),
    )
    .unwrap();
    for name in [
        "rocblas/library/TensileLibrary_gfx1250.dat",
        "rocblas/library/TensileLibrary_gfx1250_strict.dat",
        "rocblas/library/TensileLibrary_gfx1201.dat",
        "libdevice_conv_operations_gfx1250.a",
        "libdevice_conv_operations_gfx1250_strict.a",
    ] {
        fs::write(stage.join("lib").join(name), format!("{name}\n")).unwrap();
    }
    a
}

fn split_args(input: &Path, out: &Path, extra: &[&str]) -> Vec<std::ffi::OsString> {
    let mut v: Vec<std::ffi::OsString> = vec![
        "split".into(),
        "--artifact-dir".into(),
        input.into(),
        "--artifact-prefix".into(),
        "miopen_lib".into(),
        "--output-dir".into(),
        out.into(),
        "--split-databases".into(),
        "rocblas".into(),
        "composablekernel".into(),
    ];
    v.extend(extra.iter().map(Into::into));
    v
}

/// Files below `dir`, relative, as strings.
fn files(dir: &Path) -> Vec<String> {
    listing(dir).into_iter().collect()
}

/// gfx1250 and gfx1250-strict side by side: `--gpu-targets gfx1250` keeps
/// no strict code object or file; without it each has its own artifact;
/// recombine's groups (a processor, a family wildcard) leave the strict
/// target out unless it is named.
#[test]
fn strict_and_plain_targets_stay_apart() {
    let t = tempfile::tempdir().unwrap();
    let input = strict_artifact(t.path());
    let only = t.path().join("only");
    kpack_ok(&args(&split_args(
        &input,
        &only,
        &["--gpu-targets", "gfx1250"],
    )));
    assert_eq!(names(&only), ["miopen_lib_generic", "miopen_lib_gfx1250"]);
    let got = files(&only.join("miopen_lib_gfx1250"));
    for want in [
        "stage/.kpack/miopen_lib_gfx1250.kpack",
        "stage/lib/rocblas/library/TensileLibrary_gfx1250.dat",
        "stage/lib/libdevice_conv_operations_gfx1250.a",
    ] {
        assert!(got.iter().any(|f| f == want), "{want} not in {got:?}");
    }
    let everything: Vec<String> = files(&only);
    assert!(
        !everything.iter().any(|f| f.contains("strict")),
        "strict files kept by --gpu-targets gfx1250: {everything:?}"
    );

    let shards = t.path().join("shards");
    let all = shards.join("s");
    kpack_ok(&args(&split_args(&input, &all, &[])));
    let strict = files(&all.join("miopen_lib_gfx1250-strict"));
    for want in [
        "stage/.kpack/miopen_lib_gfx1250-strict.kpack",
        "stage/lib/rocblas/library/TensileLibrary_gfx1250_strict.dat",
        "stage/lib/libdevice_conv_operations_gfx1250_strict.a",
    ] {
        assert!(strict.iter().any(|f| f == want), "{want} not in {strict:?}");
    }
    let plain = files(&all.join("miopen_lib_gfx1250"));
    assert!(!plain.iter().any(|f| f.contains("strict")), "{plain:?}");

    let config = t.path().join("config.json");
    for (i, groups) in [
        r#"{"gfx125X": {"architectures": ["gfx125X"]}}"#,
        r#"{"gfx125X": {"architectures": ["gfx1250"]}}"#,
    ]
    .into_iter()
    .enumerate()
    {
        write_config(&config, "s", groups, "{}");
        let out = t.path().join("r").join(i.to_string());
        let s = json(&kpack_ok(&args(&recombine(
            &shards,
            &config,
            &out,
            &["--json"],
        ))));
        let group = &s["components"][0]["groups"][0];
        assert_eq!(
            group["targets"],
            serde_json::json!({"gfx1250": "s"}),
            "{groups}"
        );
        let left: Vec<&str> = s["unassigned_targets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap())
            .collect();
        assert!(
            left.contains(&"miopen_lib/gfx1250-strict from s"),
            "{left:?}"
        );
        let merged = files(&out.join("miopen_lib_gfx125X"));
        assert!(!merged.iter().any(|f| f.contains("strict")), "{merged:?}");
    }
    write_config(
        &config,
        "s",
        r#"{"gfx125X": {"architectures": ["gfx125X", "gfx1250_strict"]}}"#,
        "{}",
    );
    let s = json(&kpack_ok(&args(&recombine(
        &shards,
        &config,
        &t.path().join("r3"),
        &["--json"],
    ))));
    assert_eq!(
        s["components"][0]["groups"][0]["targets"],
        serde_json::json!({"gfx1250": "s", "gfx1250-strict": "s"})
    );
}

/// Run a refused command and check that it named the target and wrote
/// nothing into `out` (which exists, with a file in it, beforehand).
fn refused(args: &[&dyn AsRef<std::ffi::OsStr>], out: &Path, needle: &str) {
    fs::create_dir_all(out).unwrap();
    fs::write(out.join("keep"), "x").unwrap();
    let before = listing(out);
    let err = kpack_fails(args);
    assert!(err.contains(needle), "{needle:?} not in {err}");
    assert_eq!(listing(out), before, "{needle}: something was written");
}

/// `--expect-targets` with a target missing from the inputs, or present
/// with database files only: split (single and batch), recombine, verify and
/// split-wheels refuse, naming it, before writing anything; with every
/// target present they run.
#[test]
fn a_missing_expected_target_is_refused_before_anything_is_written() {
    let t = tempfile::tempdir().unwrap();
    let input = strict_artifact(t.path());
    let out = t.path().join("refused");
    let missing = |what: &str, t: &str| {
        format!("refusing to build a partial {what}: {t} expected but no code object for it in ")
    };
    let expect = ["--expect-targets", "gfx1250", "gfx1151"];
    refused(
        &args(&split_args(&input, &out, &expect)),
        &out,
        &missing("split artifact set", "gfx1151"),
    );
    let expect = ["--expect-targets", "gfx1201"];
    refused(
        &args(&split_args(&input, &out, &expect)),
        &out,
        "gfx1201 expected but no code object for it (only database files of gfx1201)",
    );
    // gfx1250 code objects do not stand for gfx1250-strict ones, which
    // --gpu-targets leaves out.
    let expect = [
        "--gpu-targets",
        "gfx1250",
        "--expect-targets",
        "gfx1250-strict",
    ];
    refused(
        &args(&split_args(&input, &out, &expect)),
        &out,
        &missing("split artifact set", "gfx1250-strict"),
    );
    let parent = input.parent().unwrap();
    refused(
        &[
            &"split",
            &"--batch-artifact-parent-dir",
            &parent,
            &"--output-dir",
            &out,
            &"--expect-targets",
            &"gfx1151",
        ],
        &out,
        &missing("split artifact set", "gfx1151"),
    );

    let shards = t.path().join("shards");
    let split = shards.join("s");
    let expect = [
        "--expect-targets",
        "gfx942",
        "gfx1250-strict",
        "amdgcnspirv",
    ];
    kpack_ok(&args(&split_args(&input, &split, &expect)));
    let config = t.path().join("config.json");
    write_config(
        &config,
        "s",
        r#"{"gfx125X": {"architectures": ["gfx125X", "gfx942"]}}"#,
        "{}",
    );
    let v = recombine(
        &shards,
        &config,
        &out,
        &["--expect-targets", "gfx942", "gfx1151"],
    );
    refused(
        &args(&v),
        &out,
        &missing("recombined artifact set", "gfx1151"),
    );
    // A per-target artifact of database files only is no code object.
    let v = recombine(&shards, &config, &out, &["--expect-targets", "gfx1201"]);
    refused(
        &args(&v),
        &out,
        "gfx1201 expected but no code object for it (only database files of gfx1201)",
    );
    let ok = t.path().join("recombined");
    kpack_ok(&args(&recombine(
        &shards,
        &config,
        &ok,
        &["--expect-targets", "gfx942", "gfx125X"],
    )));

    let verify = |expect: &str| -> Vec<std::ffi::OsString> {
        ["verify", "--artifacts-dir"]
            .iter()
            .map(Into::into)
            .chain([
                split.clone().into_os_string(),
                "--expect-targets".into(),
                expect.into(),
            ])
            .collect()
    };
    let err = kpack_fails(&args(&verify("gfx1151")));
    assert!(err.contains(&missing("artifact set", "gfx1151")), "{err}");
    let err = kpack_fails(&args(&verify("gfx1201")));
    assert!(err.contains("only database files of gfx1201"), "{err}");
    kpack_ok(&args(&verify("gfx1250-strict")));

    let wheel = t.path().join("wheel");
    torch_tree(&wheel, false);
    let wheel_args = |expect: &'static str| -> Vec<std::ffi::OsString> {
        let mut v: Vec<std::ffi::OsString> = vec![
            "split-wheels".into(),
            "--input".into(),
            wheel.clone().into(),
        ];
        for a in [
            "--device-package-prefix",
            "amd-torch-device",
            "--overlay-root",
            "torch/",
            "--wheel-type",
            "torch-fat",
            "--output-format",
            "directory",
            "--expect-targets",
            "gfx1100",
            expect,
        ] {
            v.push(a.into());
        }
        v.push("--output-dir".into());
        v.push(out.clone().into());
        v
    };
    refused(
        &args(&wheel_args("gfx1201")),
        &out,
        &missing("device wheel set", "gfx1201"),
    );
    let before = listing(&wheel);
    kpack_ok(&args(&wheel_args("gfx1100")));
    assert_eq!(listing(&wheel), before, "the input wheel was modified");
}
