//! The artifact pipeline on bad input and edge cases: each bad input fails
//! with an error that names it, exit code 1, and nothing half-written in
//! the output directory; verify rejects each broken invariant; recombine
//! enforces its three validation options; split's --overwrite and
//! --keep-going.

use std::fs;
use std::path::{Path, PathBuf};

use crate::common::*;

/// Write an artifact: its manifest and files (`rel`, bytes).
fn artifact(dir: &Path, manifest: &str, files: &[(&str, &[u8])]) {
    fs::create_dir_all(dir).unwrap();
    fs::write(dir.join("artifact_manifest.txt"), manifest).unwrap();
    for (rel, bytes) in files {
        let p = dir.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, bytes).unwrap();
    }
}

fn lib(name: &str) -> Vec<u8> {
    fs::read(fixture(name).path).unwrap()
}

/// `out` does not exist, or holds nothing at all (not even hidden staging
/// directories).
fn nothing_written(out: &Path) {
    if out.exists() {
        assert_eq!(
            names(out),
            Vec::<String>::new(),
            "{}: output left behind",
            out.display()
        );
    }
}

/// `out` was not even created.
fn not_created(out: &Path) {
    assert!(!out.exists(), "{} created", out.display());
}

/// A blas_lib artifact with one fat binary (libvadd.so: gfx1100, gfx1101,
/// gfx942) and a rocBLAS database file.
fn blas_artifact(dir: &Path, fat: &[u8]) {
    artifact(
        dir,
        "stage\n",
        &[
            ("stage/lib/librocblas.so.5", fat),
            (
                "stage/lib/rocblas/library/TensileLibrary_gfx1100.dat",
                b"db",
            ),
            ("stage/include/rocblas.h", b"h"),
        ],
    );
}

fn split_batch(shard: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![
        &"split",
        &"--batch-artifact-parent-dir",
        &shard,
        &"--output-dir",
        &out,
        &"--split-databases",
        &"rocblas",
    ];
    for e in extra {
        args.push(e);
    }
    kpack(&args)
}

#[test]
fn split_missing_manifest() {
    let t = tempfile::tempdir().unwrap();
    let a = t.path().join("shard/blas_lib_gfx110X-dgpu");
    fs::create_dir_all(a.join("stage/lib")).unwrap();
    fs::write(a.join("stage/lib/x"), "x").unwrap();
    let out = t.path().join("out");
    let err = kpack_fails(&[&"split", &"--artifact-dir", &a, &"--output-dir", &out]);
    assert!(
        err.contains("missing artifact manifest (artifact_manifest.txt)"),
        "{err}"
    );
    assert!(err.contains("blas_lib_gfx110X-dgpu"), "{err}");
    not_created(&out);
    // In batch mode a directory without manifest is not an artifact: skipped
    // and reported.
    let o = split_batch(&t.path().join("shard"), &out, &["--json"]);
    assert!(o.status.success());
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["skipped_directories"][0]["path"], a.display().to_string());
    assert_eq!(s["totals"]["artifacts"], 0);
    nothing_written(&out);
}

#[test]
fn split_manifest_line_escaping_the_artifact() {
    for (line, needle) in [
        ("../x", "escapes the artifact"),
        ("stage/../../x", "escapes the artifact"),
        ("/abs/stage", "is absolute"),
    ] {
        let t = tempfile::tempdir().unwrap();
        let shard = t.path().join("shard");
        blas_artifact(&shard.join("blas_lib_gfx110X-dgpu"), &lib("libvadd.so"));
        artifact(
            &shard.join("fft_lib_gfx110X-dgpu"),
            &format!("stage\n{line}\n"),
            &[("stage/lib/x", b"x")],
        );
        let out = t.path().join("out");
        // Single artifact and batch: the whole batch is checked before any
        // artifact is written.
        let err = kpack_fails(&[
            &"split",
            &"--artifact-dir",
            &shard.join("fft_lib_gfx110X-dgpu"),
            &"--output-dir",
            &out,
        ]);
        assert!(
            err.contains(needle) && err.contains("line 2") && err.contains(line),
            "{err}"
        );
        assert!(err.contains("artifact_manifest.txt"), "{err}");
        not_created(&out);
        let o = split_batch(&shard, &out, &[]);
        assert_eq!(o.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&o.stderr).contains(needle));
        not_created(&out);
    }
}

#[test]
fn split_unknown_database_handler() {
    let t = tempfile::tempdir().unwrap();
    let a = t.path().join("blas_lib_gfx110X-dgpu");
    blas_artifact(&a, &lib("libvadd.so"));
    let out = t.path().join("out");
    let err = kpack_fails(&[
        &"split",
        &"--artifact-dir",
        &a,
        &"--output-dir",
        &out,
        &"--split-databases",
        &"rocblas",
        &"tensile",
    ]);
    assert!(
        err.contains("unknown database handler \"tensile\""),
        "{err}"
    );
    assert!(
        err.contains("rocblas, hipblaslt, hipsparselt, aotriton, miopen, composablekernel, hipkernelprovider, hotswap_cache"),
        "{err}"
    );
    assert!(!out.exists());
}

#[test]
fn split_existing_output_and_overwrite() {
    let t = tempfile::tempdir().unwrap();
    let shard = t.path().join("shard");
    blas_artifact(&shard.join("blas_lib_gfx110X-dgpu"), &lib("libvadd.so"));
    let out = t.path().join("out");
    assert!(split_batch(&shard, &out, &[]).status.success());
    assert_eq!(
        names(&out),
        [
            "blas_lib_generic",
            "blas_lib_gfx1100",
            "blas_lib_gfx1101",
            "blas_lib_gfx942"
        ]
    );
    let before = snapshot(&out);
    let o = split_batch(&shard, &out, &[]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("already exists (pass --overwrite to replace it)"),
        "{err}"
    );
    assert!(snapshot(&out) == before, "a refused run changed the output");

    // --overwrite with a binary for fewer targets: replaced, and the
    // per-target artifact no longer produced is removed.
    blas_artifact(
        &shard.join("blas_lib_gfx110X-dgpu"),
        &lib("libvadd_relr.so"),
    );
    let o = split_batch(&shard, &out, &["--overwrite", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        names(&out),
        ["blas_lib_generic", "blas_lib_gfx1100", "blas_lib_gfx942"]
    );
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        s["artifacts"][0]["replaced"],
        serde_json::json!([
            "blas_lib_generic",
            "blas_lib_gfx1100",
            "blas_lib_gfx1101",
            "blas_lib_gfx942"
        ])
    );
    kpack_ok(&[&"verify", &"--artifacts-dir", &out]);
}

#[test]
fn split_keep_going() {
    let t = tempfile::tempdir().unwrap();
    let shard = t.path().join("shard");
    blas_artifact(&shard.join("blas_lib_gfx110X-dgpu"), &lib("libvadd.so"));
    // A fat binary whose bundle claims more entries than fit.
    let mut bad = lib("libvadd.so");
    let at = bad
        .windows(24)
        .position(|w| w == b"__CLANG_OFFLOAD_BUNDLE__")
        .unwrap();
    bad[at + 24..at + 32].copy_from_slice(&1000u64.to_le_bytes());
    artifact(
        &shard.join("fft_lib_gfx110X-dgpu"),
        "stage\n",
        &[("stage/lib/librocfft.so", &bad)],
    );
    let out = t.path().join("out");
    let o = split_batch(&shard, &out, &[]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.starts_with("kpack: error: ") && err.contains("librocfft.so"),
        "{err}"
    );
    assert!(!names(&out)
        .iter()
        .any(|n| n.starts_with("fft_lib") || n.starts_with('.')));

    let out = t.path().join("out2");
    let o = split_batch(&shard, &out, &["--keep-going", "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("1 of 2 artifact(s) failed"), "{err}");
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["failed"], 1);
    let failed = s["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["status"] == "failed")
        .unwrap();
    assert_eq!(failed["artifact_prefix"], "fft_lib");
    assert!(failed["error"].as_str().unwrap().contains("librocfft.so"));
    assert_eq!(
        names(&out),
        [
            "blas_lib_generic",
            "blas_lib_gfx1100",
            "blas_lib_gfx1101",
            "blas_lib_gfx942"
        ]
    );
    kpack_ok(&[&"verify", &"--artifacts-dir", &out]);
}

/// A split output of one artifact with libvadd.so, to break.
fn split_output(t: &Path) -> PathBuf {
    let shard = t.join("shard");
    blas_artifact(&shard.join("blas_lib_gfx110X-dgpu"), &lib("libvadd.so"));
    let out = t.join("split");
    assert!(split_batch(&shard, &out, &[]).status.success());
    kpack_ok(&[&"verify", &"--artifacts-dir", &out]);
    out
}

fn verify_fails(dir: &Path, needle: &str) {
    let o = kpack(&[&"verify", &"--artifacts-dir", &dir]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "verify accepted it: {stdout}");
    assert!(stderr.contains("verification failed"), "{stderr}");
    assert!(
        stdout.contains(needle),
        "no problem mentioning {needle:?}:\n{stdout}"
    );
}

#[test]
fn verify_rejects_each_broken_invariant() {
    let t = tempfile::tempdir().unwrap();
    let good = split_output(t.path());
    let case = |name: &str| {
        let d = t.path().join(name);
        fs::create_dir_all(&d).unwrap();
        for n in names(&good) {
            run_ok(
                std::process::Command::new("cp")
                    .arg("-a")
                    .arg(good.join(&n))
                    .arg(&d),
            );
        }
        d
    };
    let stage = |d: &Path, a: &str| d.join(a).join("stage");

    // A fat binary left in a generic artifact.
    let d = case("fat");
    fs::write(
        stage(&d, "blas_lib_generic").join("lib/libextra.so"),
        lib("libvadd.so"),
    )
    .unwrap();
    verify_fails(&d, "still carries device code");

    // A host library in a per-target artifact.
    let d = case("host");
    fs::write(
        stage(&d, "blas_lib_gfx1100").join("libhost.so"),
        lib("libhostonly.so"),
    )
    .unwrap();
    verify_fails(&d, "a host binary in a per-target artifact");

    // Another target's database file in a per-target artifact.
    let d = case("db");
    fs::create_dir_all(stage(&d, "blas_lib_gfx1101").join("lib/rocblas/library")).unwrap();
    fs::write(
        stage(&d, "blas_lib_gfx1101").join("lib/rocblas/library/TensileLibrary_gfx1100.dat"),
        "db",
    )
    .unwrap();
    verify_fails(&d, "a database file of gfx1100");

    // A damaged archive: a code object that does not decompress.
    let d = case("corrupt");
    let k = stage(&d, "blas_lib_gfx942").join(".kpack/blas_lib_gfx942.kpack");
    let mut bytes = fs::read(&k).unwrap();
    for b in &mut bytes[80..120] {
        *b ^= 0x5a;
    }
    fs::write(&k, bytes).unwrap();
    verify_fails(&d, "blas_lib_gfx942.kpack");

    // An archive where the search path does not lead: wrappers do not resolve.
    let d = case("moved");
    let s = stage(&d, "blas_lib_gfx1101");
    fs::create_dir_all(s.join("lib/.kpack")).unwrap();
    fs::rename(
        s.join(".kpack/blas_lib_gfx1101.kpack"),
        s.join("lib/.kpack/blas_lib_gfx1101.kpack"),
    )
    .unwrap();
    verify_fails(&d, "does not resolve for gfx1101");

    // Per-target artifacts without their generic artifact (a split
    // interrupted before its last rename).
    let d = case("interrupted");
    fs::remove_dir_all(d.join("blas_lib_generic")).unwrap();
    verify_fails(&d, "without blas_lib_generic");

    // A missing manifest, and a file outside every prefix.
    let d = case("manifest");
    fs::remove_file(d.join("blas_lib_gfx942/artifact_manifest.txt")).unwrap();
    fs::write(d.join("blas_lib_generic/stray.txt"), "x").unwrap();
    verify_fails(&d, "missing artifact manifest");
    verify_fails(&d, "stray.txt lies outside every manifest prefix");

    // A leftover staging directory is only a warning.
    let d = case("staging");
    fs::create_dir_all(d.join(".kpack-staging-x/blas_lib_generic")).unwrap();
    let o = kpack(&[&"verify", &"--artifacts-dir", &d, &"--json"]);
    assert!(o.status.success());
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(r["warnings"][0]
        .as_str()
        .unwrap()
        .contains("leftover staging directory"));
    assert_eq!(r["wrappers_resolved"], 3);
    assert_eq!(
        r["targets"],
        serde_json::json!(["gfx1100", "gfx1101", "gfx942"])
    );
}

// ---- recombine -------------------------------------------------------------

const CONFIG: &str = r#"{"primary_shard": "s1",
  "architecture_groups": {"gfx110X": {"architectures": ["gfx1100", "gfx1101"]},
                          "gfx94X": {"architectures": ["gfx942"]}},
  "validation": {"error_on_duplicate_device_code": true,
                 "verify_generic_artifacts_match": false,
                 "error_on_missing_architecture": false}}"#;

/// Synthetic split shards: `s1` with blas_lib generic + gfx1100 + gfx942,
/// `s2` with blas_lib generic + gfx1101.
fn shards(t: &Path) -> PathBuf {
    let root = t.join("shards");
    for (shard, targets) in [("s1", &["gfx1100", "gfx942"][..]), ("s2", &["gfx1101"][..])] {
        let s = root.join(shard);
        artifact(
            &s.join("blas_lib_generic"),
            "stage\n",
            &[
                ("stage/lib/librocblas.so", b"host"),
                ("stage/share/doc", b"doc"),
            ],
        );
        for t in targets {
            artifact(
                &s.join(format!("blas_lib_{t}")),
                "stage\n",
                &[
                    (
                        &format!("stage/.kpack/blas_lib_{t}.kpack"),
                        format!("code for {t}").as_bytes(),
                    ),
                    (
                        &format!("stage/lib/rocblas/library/T_{t}.dat"),
                        t.as_bytes(),
                    ),
                ],
            );
        }
    }
    root
}

fn recombine(shards: &Path, config: &str, out: &Path, extra: &[&str]) -> std::process::Output {
    let cfg = shards.parent().unwrap().join("config.json");
    fs::write(&cfg, config).unwrap();
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![
        &"recombine",
        &"--input-shards-dir",
        &shards,
        &"--config",
        &cfg,
        &"--output-dir",
        &out,
    ];
    for e in extra {
        args.push(e);
    }
    kpack(&args)
}

fn recombine_fails(shards: &Path, config: &str, out: &Path, needles: &[&str]) {
    let o = recombine(shards, config, out, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.starts_with("kpack: error: "), "{err}");
    for n in needles {
        assert!(err.contains(n), "no {n:?} in: {err}");
    }
    not_created(out);
}

#[test]
fn recombine_config_errors() {
    let t = tempfile::tempdir().unwrap();
    let s = shards(t.path());
    let out = t.path().join("out");
    let cases: &[(&str, &str)] = &[
        ("", "packaging config is empty"),
        ("{\"primary_shard\": ", "not valid JSON"),
        (
            r#"{"architecture_groups": {"g": {"architectures": ["gfx1100"]}}}"#,
            "missing field `primary_shard`",
        ),
        (
            r#"{"primary_shard": "s1", "architecture_groups": {}}"#,
            "`architecture_groups` is empty",
        ),
        (
            r#"{"primary_shard": "s1", "architecture_groups": {"g": {"architectures": ["sm_90"]}}}"#,
            "`architecture_groups.g.architectures[0]`: \"sm_90\" does not start with \"gfx\"",
        ),
        (
            r#"{"primary_shard": ["s1"], "architecture_groups": {"g": {"architectures": ["gfx1100"]}}}"#,
            "`primary_shard`: invalid type: sequence, expected a string",
        ),
        (
            r#"{"primary_shard": "s1", "architecture_groups": {"g": {"architectures": "gfx1100"}}}"#,
            "`architecture_groups.g.architectures`: invalid type: string \"gfx1100\", expected a sequence",
        ),
        (
            r#"{"primary_shard": "s1", "architecture_groups": {"g": {"architectures": ["gfx1100"]}}, "validation": {"error_on_missing_architecture": 1}}"#,
            "`validation.error_on_missing_architecture`: invalid type: integer `1`, expected a boolean",
        ),
    ];
    for (config, needle) in cases {
        recombine_fails(&s, config, &out, &[needle, "config.json"]);
    }
    recombine_fails(
        &s,
        r#"{"primary_shard": "s9", "architecture_groups": {"g": {"architectures": ["gfx1100"]}}}"#,
        &out,
        &["primary_shard \"s9\" is not a shard directory here (shards: s1, s2)"],
    );
}

#[test]
fn recombine_merges_by_group() {
    let t = tempfile::tempdir().unwrap();
    let s = shards(t.path());
    let out = t.path().join("out");
    let o = recombine(&s, CONFIG, &out, &["--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        names(&out),
        ["blas_lib_generic", "blas_lib_gfx110X", "blas_lib_gfx94X"]
    );
    let g = out.join("blas_lib_gfx110X/stage");
    assert_eq!(
        names(&g.join(".kpack")),
        ["blas_lib_gfx1100.kpack", "blas_lib_gfx1101.kpack"]
    );
    assert_eq!(
        fs::read_to_string(out.join("blas_lib_gfx110X/artifact_manifest.txt")).unwrap(),
        "stage\n"
    );
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        r["components"][0]["groups"][0]["targets"],
        serde_json::json!({"gfx1100": "s1", "gfx1101": "s2"})
    );
    // The same target from two shards with identical bytes: a note.
    let dup = s.join("s2/blas_lib_gfx1100");
    run_ok(
        std::process::Command::new("cp")
            .arg("-a")
            .arg(s.join("s1/blas_lib_gfx1100"))
            .arg(&dup),
    );
    let out2 = t.path().join("out2");
    let o = recombine(&s, CONFIG, &out2, &["--json", "--component", "blas_lib"]);
    assert!(o.status.success());
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        r["notes"][0]
            .as_str()
            .unwrap()
            .contains("identical in shards s1, s2"),
        "{r}"
    );
    // An unknown component.
    let o = recombine(
        &s,
        CONFIG,
        &t.path().join("out3"),
        &["--component", "fft_lib"],
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("no component \"fft_lib\""));
}

#[test]
fn recombine_duplicate_device_code() {
    let t = tempfile::tempdir().unwrap();
    let s = shards(t.path());
    artifact(
        &s.join("s2/blas_lib_gfx1100"),
        "stage\n",
        &[(
            "stage/.kpack/blas_lib_gfx1100.kpack",
            b"other code for gfx1100",
        )],
    );
    let out = t.path().join("out");
    recombine_fails(
        &s,
        CONFIG,
        &out,
        &["duplicate device code: component blas_lib, target gfx1100: shards s1 and s2 provide different bytes"],
    );
    // Not an error when switched off: the primary shard wins, with a warning.
    let relaxed = CONFIG.replace(
        "\"error_on_duplicate_device_code\": true",
        "\"error_on_duplicate_device_code\": false",
    );
    let o = recombine(&s, &relaxed, &out, &["--json"]);
    assert!(o.status.success());
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        r["warnings"][0].as_str().unwrap().contains("taken from s1"),
        "{r}"
    );
    assert_eq!(
        fs::read(out.join("blas_lib_gfx110X/stage/.kpack/blas_lib_gfx1100.kpack")).unwrap(),
        b"code for gfx1100"
    );
}

#[test]
fn recombine_missing_architecture() {
    let t = tempfile::tempdir().unwrap();
    let s = shards(t.path());
    let out = t.path().join("out");
    let config = CONFIG
        .replace(
            "[\"gfx1100\", \"gfx1101\"]",
            "[\"gfx1100\", \"gfx1101\", \"gfx1102\"]",
        )
        .replace(
            "\"error_on_missing_architecture\": false",
            "\"error_on_missing_architecture\": true",
        );
    recombine_fails(
        &s,
        &config,
        &out,
        &["configured architecture(s) provided by no shard: gfx1102"],
    );
    let relaxed = config.replace(
        "\"error_on_missing_architecture\": true",
        "\"error_on_missing_architecture\": false",
    );
    let o = recombine(&s, &relaxed, &out, &["--json"]);
    assert!(o.status.success());
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["missing_architectures"], serde_json::json!(["gfx1102"]));
}

#[test]
fn recombine_generic_artifacts_must_match() {
    let t = tempfile::tempdir().unwrap();
    let s = shards(t.path());
    fs::write(s.join("s2/blas_lib_generic/stage/share/doc"), "other doc").unwrap();
    let out = t.path().join("out");
    let config = CONFIG.replace(
        "\"verify_generic_artifacts_match\": false",
        "\"verify_generic_artifacts_match\": true",
    );
    recombine_fails(
        &s,
        &config,
        &out,
        &["generic artifacts differ: blas_lib_generic in shards s1 and s2: stage/share/doc: different bytes"],
    );
    // Without the option the primary shard's generic artifact is taken.
    let o = recombine(&s, CONFIG, &out, &[]);
    assert!(o.status.success());
    assert_eq!(
        fs::read(out.join("blas_lib_generic/stage/share/doc")).unwrap(),
        b"doc"
    );
}

/// Real split outputs of two shards that built the same library for
/// different targets: the offloaded binaries differ in bytes but match in
/// metadata, so verify_generic_artifacts_match accepts them; gfx90a takes
/// gfx90a:xnack+ and gfx90a:xnack-; targets of no group are reported; the
/// result verifies with --config.
#[test]
fn recombine_real_shards() {
    let t = tempfile::tempdir().unwrap();
    let split = t.path().join("split");
    for (shard, fat) in [("s1", "libvadd.so"), ("s2", "libwide.so")] {
        let input = t.path().join("in").join(shard);
        blas_artifact(&input.join("blas_lib_fam"), &lib(fat));
        let o = split_batch(&input, &split.join(shard), &[]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let config = r#"{"primary_shard": "s1",
      "architecture_groups": {"gfx110X": {"architectures": ["gfx1100", "gfx1101"]},
                              "gfx90X": {"architectures": ["gfx90a", "gfx908"]},
                              "gfx94X": {"architectures": ["gfx942"]}},
      "validation": {"error_on_duplicate_device_code": false,
                     "verify_generic_artifacts_match": true}}"#;
    let out = t.path().join("rec");
    let o = recombine(&split, config, &out, &["--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        r["unassigned_targets"],
        serde_json::json!([
            "blas_lib/gfx1030 from s2",
            "blas_lib/gfx1201 from s2",
            "blas_lib/gfx900 from s2",
            "blas_lib/gfx906 from s2"
        ])
    );
    assert_eq!(
        names(&out.join("blas_lib_gfx90X/stage/.kpack")),
        [
            "blas_lib_gfx908.kpack",
            "blas_lib_gfx90a:xnack+.kpack",
            "blas_lib_gfx90a:xnack-.kpack"
        ]
    );
    let cfg = split.parent().unwrap().join("config.json");
    let o = kpack(&[
        &"verify",
        &"--artifacts-dir",
        &out,
        &"--config",
        &cfg,
        &"--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["wrappers_resolved"], 6);
    // A group artifact with a target of another group is rejected.
    fs::copy(
        out.join("blas_lib_gfx94X/stage/.kpack/blas_lib_gfx942.kpack"),
        out.join("blas_lib_gfx110X/stage/.kpack/blas_lib_gfx942.kpack"),
    )
    .unwrap();
    let o = kpack(&[&"verify", &"--artifacts-dir", &out, &"--config", &cfg]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stdout)
        .contains("serves gfx942, which does not belong in this artifact"));
}

/// `cargo xtask split|verify|recombine` run kpack's subcommand with the same
/// flags, from the caller's directory.
#[test]
fn xtask_forwards_to_kpack() {
    let t = tempfile::tempdir().unwrap();
    let shard = t.path().join("shard");
    blas_artifact(&shard.join("blas_lib_gfx110X-dgpu"), &lib("libvadd.so"));
    let xtask = |args: &[&str]| {
        // xtask builds and runs target/debug/kpack.
        let _build = build_lock();
        kpack_testkit::workspace::xtask()
            .args(args)
            .env("KPACK_XTASK_PROFILE", "dev")
            .current_dir(t.path())
            .output()
            .unwrap()
    };
    let o = xtask(&[
        "split",
        "--batch-artifact-parent-dir",
        "shard",
        "--output-dir",
        "out",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(s["totals"]["binaries"], 1);
    let o = xtask(&["verify", "--artifacts-dir", "out"]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("OK"));
    let o = xtask(&[
        "recombine",
        "--input-shards-dir",
        "nowhere",
        "--config",
        "missing.json",
        "--output-dir",
        "r",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("kpack: error: missing.json"));
}

/// A manifest prefix without a directory is skipped, left out of the
/// output manifests, and reported under --verbose and in --json.
#[test]
fn split_skips_missing_prefix() {
    let t = tempfile::tempdir().unwrap();
    let a = t.path().join("fft_lib_gfx110X-dgpu");
    artifact(&a, "stage\nnever/installed\n", &[("stage/lib/x", b"x")]);
    let out = t.path().join("out");
    let o = kpack(&[
        &"split",
        &"--artifact-dir",
        &a,
        &"--output-dir",
        &out,
        &"--verbose",
        &"--json",
    ]);
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("manifest prefix never/installed does not exist: skipped"),
        "{err}"
    );
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        s["artifacts"][0]["skipped_prefixes"],
        serde_json::json!(["never/installed"])
    );
    assert_eq!(s["artifacts"][0]["artifact_prefix"], "fft_lib");
    assert_eq!(names(&out), ["fft_lib_generic"]);
    assert_eq!(
        fs::read_to_string(out.join("fft_lib_generic/artifact_manifest.txt")).unwrap(),
        "stage\n"
    );
}

/// Every database handler routes its files; files no enabled handler
/// claims stay generic; decompressed code objects are spilled to --tmp-dir
/// (and cleaned up).
#[test]
fn split_database_handlers_and_tmp_dir() {
    let t = tempfile::tempdir().unwrap();
    let a = t.path().join("ml_lib_fam");
    let fat = lib("libvadd_compressed.so");
    artifact(
        &a,
        "stage\n",
        &[
            ("stage/lib/libml.so", &fat),
            (
                "stage/lib/aotriton.images/amd-gfx1100/flash/attn.aks2",
                b"a",
            ),
            ("stage/lib/aotriton.images/README", b"r"),
            ("stage/share/miopen/db/gfx942.tn.model", b"m"),
            ("stage/share/miopen/db/gfx942.kdb", b"k"),
            ("stage/lib/engines/arch_content/gemm/gfx1101/k.co", b"h"),
            ("stage/lib/hipblaslt/library/extop_gfx942.co", b"x"),
        ],
    );
    let out = t.path().join("out");
    let tmp = t.path().join("scratch");
    let o = kpack(&[
        &"split",
        &"--artifact-dir",
        &a,
        &"--output-dir",
        &out,
        &"--tmp-dir",
        &tmp,
        &"--split-databases",
        &"aotriton",
        &"miopen",
        &"hipkernelprovider",
        &"--clang-offload-bundler",
        &"/nonexistent/clang-offload-bundler",
        &"--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        s["artifacts"][0]["database_targets"],
        serde_json::json!({"gfx1100": 1, "gfx1101": 1, "gfx942": 2})
    );
    let files = |name: &str| -> Vec<String> {
        snapshot(&out.join(name))
            .into_iter()
            .filter(|(_, (k, _, _))| *k == 'f')
            .map(|(p, _)| p)
            .collect()
    };
    assert_eq!(
        files("ml_lib_gfx1100"),
        [
            "artifact_manifest.txt",
            "stage/.kpack/ml_lib_gfx1100.kpack",
            "stage/lib/aotriton.images/amd-gfx1100/flash/attn.aks2"
        ]
    );
    assert_eq!(
        files("ml_lib_gfx1101"),
        [
            "artifact_manifest.txt",
            "stage/.kpack/ml_lib_gfx1101.kpack",
            "stage/lib/engines/arch_content/gemm/gfx1101/k.co"
        ]
    );
    assert_eq!(
        files("ml_lib_gfx942"),
        [
            "artifact_manifest.txt",
            "stage/.kpack/ml_lib_gfx942.kpack",
            "stage/share/miopen/db/gfx942.kdb",
            "stage/share/miopen/db/gfx942.tn.model"
        ]
    );
    assert_eq!(
        files("ml_lib_generic"),
        [
            "artifact_manifest.txt",
            "stage/lib/aotriton.images/README",
            "stage/lib/hipblaslt/library/extop_gfx942.co",
            "stage/lib/libml.so"
        ]
    );
    assert_eq!(names(&tmp), Vec::<String>::new(), "scratch left behind");
    kpack_ok(&[&"verify", &"--artifacts-dir", &out]);
}
