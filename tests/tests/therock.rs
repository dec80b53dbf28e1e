//! A TheRock-shaped build tree through the whole pipeline, split the way
//! TheRock calls it today (formats.md §6.3): several artifact components (BLAS
//! with rocBLAS, hipBLASLt and hipSPARSELt databases in both layouts,
//! MIOpen with its databases and per-target CK libraries, Composable
//! Kernel's static libraries, hipKernelProvider, rocJITsu's hotswap cache,
//! AOTriton images, a `_dbg` artifact), strict, generic and SPIR-V
//! targets, fat binaries with several bundles.
//!
//! - split without `--gpu-targets` (one batch), verified;
//! - split per shard with `--gpu-targets` (each component alone, as
//!   TheRock's per-component jobs do), verified, recombined, verified, and
//!   installed per group: every wrapper of every binary resolves through
//!   the runtime's search logic to the bytes the oracle (LLVM's
//!   clang-offload-bundler, or the entry table where LLVM 19 cannot name
//!   the processor) gives;
//! - the refusals: no code object matching `--gpu-targets`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use crate::common::*;
use kpack_host::offload::verify_file;
use kpack_loader::{Config, Loader};
use kpack_testkit::tree::{copy, symlink, write};

/// The family part of the input artifacts' names.
const FAMILY: &str = "gfx94X-dgpu";
const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

const BLAS: &str = "math-libs/BLAS/rocBLAS/stage";
const HIPBLASLT: &str = "math-libs/BLAS/hipBLASLt/stage";
const HIPSPARSELT: &str = "math-libs/BLAS/hipSPARSELt/stage";
const MIOPEN: &str = "ml-libs/MIOpen/stage";
const CK: &str = "ml-libs/composable_kernel/stage";
const HIPKP: &str = "ml-libs/hipKernelProvider/stage";
const ROCJITSU: &str = "compiler/rocjitsu/stage";
const AOTRITON: &str = "ml-libs/aotriton/stage";

/// (component, its install prefixes, its database handlers as TheRock's
/// topology enables them).
const COMPONENTS: &[(&str, &[&str], &[&str])] = &[
    (
        "blas_lib",
        &[BLAS, HIPBLASLT, HIPSPARSELT],
        &["rocblas", "hipblaslt", "hipsparselt"],
    ),
    ("miopen_lib", &[MIOPEN], &["miopen"]),
    ("ck_lib", &[CK], &["composablekernel"]),
    ("hipkp_lib", &[HIPKP], &["hipkernelprovider"]),
    ("rocjitsu_lib", &[ROCJITSU], &["hotswap_cache"]),
    ("aotriton_lib", &[AOTRITON], &["aotriton"]),
    ("blas_dbg", &[BLAS], &[]),
];

/// Every handler (the batch split enables them all).
const ALL_HANDLERS: &[&str] = &[
    "rocblas",
    "hipblaslt",
    "hipsparselt",
    "aotriton",
    "miopen",
    "composablekernel",
    "hipkernelprovider",
    "hotswap_cache",
];

/// The fat binaries: (component, prefix, path, fixture).
const FAT: &[(&str, &str, &str, &str)] = &[
    (
        "blas_lib",
        BLAS,
        "lib/librocblas.so.4.4",
        "therock/librocblas.so.4.4",
    ),
    (
        "blas_lib",
        HIPBLASLT,
        "lib/libhipblaslt.so.1.0",
        "librdc.so",
    ),
    (
        "blas_lib",
        HIPSPARSELT,
        "lib/libhipsparselt.so.0.2",
        "libvadd_compressed.so",
    ),
    (
        "miopen_lib",
        MIOPEN,
        "lib/libMIOpen.so.1",
        "therock/libMIOpen.so.1",
    ),
    (
        "hipkp_lib",
        HIPKP,
        "lib/libhipkernelprovider.so",
        "libmulti.so",
    ),
    (
        "aotriton_lib",
        AOTRITON,
        "lib/libaotriton_v2.so.0",
        "libvadd.so",
    ),
];

/// MIOpen's per-target CK libraries (fat binaries that are database files).
const CK_LIBS: &[(&str, &str)] = &[
    ("lib/libMIOpenCKGroupedConv_gfx942.so", "gfx942"),
    ("lib/libMIOpenCKGroupedConv_gfx1100.so", "gfx1100"),
];

/// The database files: (component, prefix, path, base target or None for
/// files no handler claims).
fn databases() -> Vec<(&'static str, &'static str, String, Option<&'static str>)> {
    let mut v: Vec<(&str, &str, String, Option<&str>)> = vec![
        (
            "blas_lib",
            BLAS,
            "lib/rocblas/library/TensileLibrary_Type_HH_Contraction_gfx942.dat".into(),
            Some("gfx942"),
        ),
        (
            "blas_lib",
            BLAS,
            "lib/rocblas/library/Kernels.so-000-gfx90a-xnack+.hsaco".into(),
            Some("gfx90a"),
        ),
        (
            "blas_lib",
            BLAS,
            "lib/rocblas/library/TensileLibrary_gfx1250-strict.co".into(),
            Some("gfx1250-strict"),
        ),
        (
            "blas_lib",
            BLAS,
            "lib/rocblas/library/TensileLibrary_gfx1201.co".into(),
            Some("gfx1201"),
        ),
        (
            "blas_lib",
            BLAS,
            "lib/rocblas/library/TensileLibrary_fallback.dat".into(),
            None,
        ),
        (
            "blas_lib",
            BLAS,
            "lib/rocblas/library/TensileManifest.txt".into(),
            None,
        ),
        (
            "blas_lib",
            HIPBLASLT,
            "lib/hipblaslt/library/gfx942/TensileManifest.txt".into(),
            Some("gfx942"),
        ),
        (
            "blas_lib",
            HIPBLASLT,
            "lib/hipblaslt/library/gfx942/TensileLibrary_lazy_fallback.dat".into(),
            Some("gfx942"),
        ),
        (
            "blas_lib",
            HIPBLASLT,
            "lib/hipblaslt/library/gfx1201/extop.co".into(),
            Some("gfx1201"),
        ),
        (
            "blas_lib",
            HIPBLASLT,
            "lib/hipblaslt/library/gfx1250-strict/TensileManifest.txt".into(),
            Some("gfx1250-strict"),
        ),
        (
            "blas_lib",
            HIPBLASLT,
            "lib/hipblaslt/library/extop_gfx1100.co".into(),
            Some("gfx1100"),
        ),
        (
            "blas_lib",
            HIPSPARSELT,
            "lib/hipsparselt/library/spmm_gfx942.co".into(),
            Some("gfx942"),
        ),
        (
            "blas_lib",
            HIPSPARSELT,
            "lib/hipsparselt/library/gfx90a-xnack-/spmm.dat".into(),
            Some("gfx90a"),
        ),
        (
            "miopen_lib",
            MIOPEN,
            "share/miopen/db/gfx942130.kdb".into(),
            Some("gfx942"),
        ),
        (
            "miopen_lib",
            MIOPEN,
            "share/miopen/db/gfx90a68.tn.model".into(),
            Some("gfx90a"),
        ),
        (
            "miopen_lib",
            MIOPEN,
            "share/miopen/db/gfx1100_48.db.txt".into(),
            Some("gfx1100"),
        ),
        (
            "miopen_lib",
            MIOPEN,
            "share/miopen/db/gfx1030_36.HIP.fdb.txt".into(),
            Some("gfx1030"),
        ),
        (
            "miopen_lib",
            MIOPEN,
            "share/miopen/db/gfx1250-strict256.kdb".into(),
            Some("gfx1250-strict"),
        ),
        (
            "miopen_lib",
            MIOPEN,
            "share/miopen/db/gfx1103_20.kdb".into(),
            None,
        ),
        (
            "ck_lib",
            CK,
            "lib/libdevice_conv_operations_gfx942.a".into(),
            Some("gfx942"),
        ),
        (
            "ck_lib",
            CK,
            "lib/libdevice_conv_operations_gfx90a_xnackp.a".into(),
            Some("gfx90a"),
        ),
        (
            "ck_lib",
            CK,
            "lib/libdevice_conv_operations_gfx1250_strict.a".into(),
            Some("gfx1250-strict"),
        ),
        ("ck_lib", CK, "lib/libdevice_conv_operations.a".into(), None),
        (
            "hipkp_lib",
            HIPKP,
            "lib/engines/arch_content/gemm/gfx942/k.co".into(),
            Some("gfx942"),
        ),
        (
            "hipkp_lib",
            HIPKP,
            "lib/engines/test_arch_content/conv/gfx1100/t.co".into(),
            Some("gfx1100"),
        ),
        (
            "hipkp_lib",
            HIPKP,
            "lib/engines/arch_content/index.json".into(),
            None,
        ),
        (
            "rocjitsu_lib",
            ROCJITSU,
            format!("share/rocjitsu/translations/gfx1250-b0-a0/v1/{HEX}.man"),
            Some("gfx1250"),
        ),
        (
            "rocjitsu_lib",
            ROCJITSU,
            format!("share/rocjitsu/translations/gfx1250-b0-a0/v1/{HEX}.obj"),
            Some("gfx1250"),
        ),
        (
            "rocjitsu_lib",
            ROCJITSU,
            format!("share/rocjitsu/translations/gfx942-a0/v1/{HEX}.obj"),
            None,
        ),
        (
            "aotriton_lib",
            AOTRITON,
            "lib/aotriton.images/amd-gfx942/flash/fwd.aks2".into(),
            Some("gfx942"),
        ),
        (
            "aotriton_lib",
            AOTRITON,
            "lib/aotriton.images/amd-gfx11xx/flash/fwd.aks2".into(),
            Some("gfx11"),
        ),
        (
            "aotriton_lib",
            AOTRITON,
            "lib/aotriton.images/amd-gfx120x/flash/fwd.aks2".into(),
            Some("gfx12_0"),
        ),
    ];
    v.sort();
    v
}

/// The shards TheRock would build, each splitting with `--gpu-targets`
/// (one of them, gfx90a:xnack-, stands for every gfx90a variant), and the
/// packaging config's groups (each one shard's targets).
const SHARDS: &[(&str, &[&str])] = &[
    ("gfx94X-build", &["gfx942", "gfx90a:xnack-"]),
    (
        "gfx125X-build",
        &["gfx1250", "gfx1250-strict", "amdgcnspirv"],
    ),
    (
        "gfx11X-build",
        &[
            "gfx1100",
            "gfx1101",
            "gfx11-generic",
            "gfx11",
            "gfx1030",
            "gfx1201",
            "gfx12_0",
        ],
    ),
];

const CONFIG: &str = r#"{
  "primary_shard": "gfx94X-build",
  "architecture_groups": {
    "gfx94X": {"display_name": "MI300", "architectures": ["gfx942", "gfx90a"]},
    "gfx125X": {"display_name": "gfx1250", "architectures": ["gfx1250", "gfx1250-strict", "amdgcnspirv"]},
    "gfx11X": {"display_name": "RDNA", "architectures": ["gfx1100", "gfx1101", "gfx11-generic", "gfx11", "gfx1030", "gfx1201", "gfx12_0"]}
  },
  "validation": {
    "error_on_duplicate_device_code": true,
    "verify_generic_artifacts_match": true,
    "error_on_missing_architecture": false
  }
}
"#;

fn artifact_dir(root: &Path, component: &str) -> PathBuf {
    root.join(format!("{component}_{FAMILY}"))
}

/// Lay the tree out in `root` (one artifact directory per component).
fn make_tree(root: &Path, scratch: &Path) {
    let fx = fixtures_dir();
    for (component, prefixes, _) in COMPONENTS {
        let manifest: String = prefixes.iter().map(|p| format!("{p}\n")).collect();
        write(
            &artifact_dir(root, component).join("artifact_manifest.txt"),
            manifest.as_bytes(),
            0o644,
        )
        .unwrap();
    }
    for (component, prefix, rel, fixture) in FAT {
        let dst = artifact_dir(root, component).join(prefix).join(rel);
        copy(&fx.join(fixture), &dst, 0o755).unwrap();
    }
    let miopen = artifact_dir(root, "miopen_lib").join(MIOPEN);
    symlink("libMIOpen.so.1", &miopen.join("lib/libMIOpen.so")).unwrap();
    for (rel, target) in CK_LIBS {
        let fixture = format!("therock/libMIOpenCKGroupedConv_{target}.so");
        copy(&fx.join(fixture), &miopen.join(rel), 0o755).unwrap();
    }
    let blas = artifact_dir(root, "blas_lib").join(BLAS);
    symlink("librocblas.so.4.4", &blas.join("lib/librocblas.so.4")).unwrap();
    write(
        &blas.join("include/rocblas/rocblas.h"),
        b"/* rocBLAS */\n",
        0o644,
    )
    .unwrap();
    for (component, prefix, rel, target) in databases() {
        let body = if rel.ends_with(".a") {
            format!("!<arch>\n{rel} {target:?}\n")
        } else {
            format!("{rel} for {target:?}\n")
        };
        let dst = artifact_dir(root, component).join(prefix).join(&rel);
        write(&dst, body.as_bytes(), 0o644).unwrap();
    }
    // TheRock's debug artifact: what `objcopy --only-keep-debug` makes of
    // the fat binaries (a NOBITS .hip_fatbin, HIPF wrappers).
    let dbg = artifact_dir(root, "blas_dbg").join(BLAS);
    for (fixture, rel) in [
        (
            "therock/librocblas.so.4.4",
            "lib/.debug/librocblas.so.4.4.debug",
        ),
        (
            "therock/libMIOpen.so.1",
            ".build-id/4f/0123456789abcdef.debug",
        ),
    ] {
        let out = scratch.join("debug.tmp");
        run_ok(
            std::process::Command::new("objcopy")
                .arg("--only-keep-debug")
                .arg(fx.join(fixture))
                .arg(&out),
        );
        copy(&out, &dbg.join(rel), 0o644).unwrap();
    }
}

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

fn args(v: &[String]) -> Vec<&dyn AsRef<std::ffi::OsStr>> {
    v.iter().map(|a| a as &dyn AsRef<std::ffi::OsStr>).collect()
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// The files (not directories) of an artifact, relative to it.
fn files(dir: &Path) -> BTreeSet<String> {
    snapshot(dir)
        .into_iter()
        .filter(|(_, (k, _, _))| *k != 'd')
        .map(|(p, _)| p)
        .collect()
}

/// The oracle's code objects of every fat binary of the tree, by the
/// binary's key (`<prefix>/<path>`).
fn truth(tree: &Path) -> BTreeMap<String, BTreeMap<(usize, String), Vec<u8>>> {
    FAT.iter()
        .map(|(component, prefix, rel, _)| {
            let path = artifact_dir(tree, component).join(prefix).join(rel);
            (format!("{prefix}/{rel}"), code_objects(&path))
        })
        .collect()
}

/// Verify `dir` (split outputs, or recombined ones with `config`).
fn verify(dir: &Path, config: Option<&Path>) -> serde_json::Value {
    let mut a = vec![
        "verify".to_string(),
        "--artifacts-dir".into(),
        s(dir),
        "--json".into(),
    ];
    if let Some(c) = config {
        a.extend(["--config".into(), s(c)]);
    }
    a.push("--split-databases".into());
    a.extend(ALL_HANDLERS.iter().map(|h| h.to_string()));
    let r = json(&kpack_ok(&args(&a)));
    assert_eq!(r["problems"], serde_json::json!([]), "{}", dir.display());
    r
}

/// Split without `--gpu-targets`: every target gets its artifact; the
/// database files go where their handler says; the debug artifact is
/// copied as it is; the per-target CK libraries are moved unchanged.
#[test]
fn therock_tree_split_in_full() {
    let t = tempfile::tempdir().unwrap();
    let tree = t.path().join("shard");
    make_tree(&tree, t.path());
    let out = t.path().join("out");
    let mut a = vec![
        "split".to_string(),
        "--batch-artifact-parent-dir".into(),
        s(&tree),
        "--output-dir".into(),
        s(&out),
        "--json".into(),
        "--split-databases".into(),
    ];
    a.extend(ALL_HANDLERS.iter().map(|h| h.to_string()));
    let summary = json(&kpack_ok(&args(&a)));
    assert_eq!(summary["failed"], 0);
    assert_eq!(summary["totals"]["binaries"], FAT.len());

    let mut want: BTreeSet<String> = BTreeSet::new();
    for (component, _, _) in COMPONENTS {
        want.insert(format!("{component}_generic"));
    }
    let truth = truth(&tree);
    for (component, prefix, rel, _) in FAT {
        for (_, target) in truth[&format!("{prefix}/{rel}")].keys() {
            want.insert(format!("{component}_{target}"));
        }
    }
    for (component, _, _, target) in databases() {
        if let Some(t) = target {
            want.insert(format!("{component}_{t}"));
        }
    }
    for (_, target) in CK_LIBS {
        want.insert(format!("miopen_lib_{target}"));
    }
    assert_eq!(names(&out).into_iter().collect::<BTreeSet<_>>(), want);
    // Strict and SPIR-V targets are archives of their own; gfx1250-strict
    // is never merged into gfx1250.
    for t in ["gfx1250", "gfx1250-strict", "amdgcnspirv", "gfx11-generic"] {
        let component = if t == "gfx11-generic" {
            "blas_lib"
        } else {
            "miopen_lib"
        };
        let prefix = if t == "gfx11-generic" { BLAS } else { MIOPEN };
        let archive = out
            .join(format!("{component}_{t}"))
            .join(prefix)
            .join(format!(".kpack/{component}_{t}.kpack"));
        assert!(archive.is_file(), "{}", archive.display());
    }

    // Database files: at their paths in their base target's artifact,
    // never in generic; unclaimed ones stay generic.
    for (component, prefix, rel, target) in databases() {
        let generic = out
            .join(format!("{component}_generic"))
            .join(prefix)
            .join(&rel);
        match target {
            Some(t) => {
                let dst = out.join(format!("{component}_{t}")).join(prefix).join(&rel);
                assert!(dst.is_file(), "{}", dst.display());
                assert!(!generic.exists(), "{}", generic.display());
            }
            None => assert!(generic.is_file(), "{}", generic.display()),
        }
    }
    // MIOpen's CK libraries are fat binaries, moved as they are.
    for (rel, target) in CK_LIBS {
        let src = artifact_dir(&tree, "miopen_lib").join(MIOPEN).join(rel);
        let dst = out
            .join(format!("miopen_lib_{target}"))
            .join(MIOPEN)
            .join(rel);
        assert_eq!(fs::read(&dst).unwrap(), fs::read(&src).unwrap());
        assert!(!out
            .join("miopen_lib_generic")
            .join(MIOPEN)
            .join(rel)
            .exists());
    }
    // The debug artifact: copied unchanged into generic only.
    let dbg = artifact_dir(&tree, "blas_dbg");
    let dbg_summary = summary["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["artifact_prefix"] == "blas_dbg")
        .unwrap();
    assert_eq!(dbg_summary["debug_only"], 2);
    assert_eq!(
        dbg_summary["outputs"],
        serde_json::json!(["blas_dbg_generic"])
    );
    for f in files(&dbg) {
        if f != "artifact_manifest.txt" {
            let got = fs::read(out.join("blas_dbg_generic").join(&f)).unwrap();
            assert_eq!(got, fs::read(dbg.join(&f)).unwrap(), "{f}");
        }
    }
    let r = verify(&out, None);
    assert!(r["wrappers_resolved"].as_u64().unwrap() > 0);
    assert_eq!(
        r["targets"].as_array().unwrap().len(),
        truth
            .values()
            .flat_map(|m| m.keys().map(|(_, t)| t))
            .collect::<BTreeSet<_>>()
            .len()
    );

    // Splitting its own output again copies the offloaded binaries
    // unchanged (and finds no device code to split).
    let again = t.path().join("again");
    let generic = out.join("blas_lib_generic");
    let o = kpack_ok(&[
        &"split",
        &"--artifact-dir",
        &generic,
        &"--artifact-prefix",
        &"blas_lib",
        &"--output-dir",
        &again,
        &"--gpu-targets",
        &"gfx942",
        &"--json",
    ]);
    let o = json(&o);
    assert_eq!(o["artifacts"][0]["already_offloaded"], 3);
    assert_eq!(o["artifacts"][0]["binaries"], 0);
    assert_eq!(names(&again), ["blas_lib_generic"]);
    assert_eq!(
        snapshot(&again.join("blas_lib_generic")),
        snapshot(&generic)
    );

    // Batch mode takes --gpu-targets too: one target's artifacts only.
    let one = t.path().join("gfx942");
    let mut a = vec![
        "split".to_string(),
        "--batch-artifact-parent-dir".into(),
        s(&tree),
        "--output-dir".into(),
        s(&one),
        "--gpu-targets".into(),
        "gfx942".into(),
        "--split-databases".into(),
    ];
    a.extend(ALL_HANDLERS.iter().map(|h| h.to_string()));
    kpack_ok(&args(&a));
    let got: BTreeSet<String> = names(&one).into_iter().collect();
    let want: BTreeSet<String> = names(&out)
        .into_iter()
        .filter(|n| n.ends_with("_generic") || n.ends_with("_gfx942"))
        .collect();
    assert_eq!(got, want);
    verify(&one, None);
}

/// The shards' splits with `--gpu-targets` (per component, as TheRock's
/// jobs run them), recombined and installed: every wrapper resolves to the
/// oracle's bytes, and only what the group serves is installed.
#[test]
fn therock_tree_split_by_gpu_targets_recombined_and_installed() {
    let t = tempfile::tempdir().unwrap();
    let tree = t.path().join("tree");
    make_tree(&tree, t.path());
    let truth = truth(&tree);
    let shards = t.path().join("shards");
    // (shard, component) splits refused: no code object matched.
    let mut refused: BTreeSet<(&str, &str)> = BTreeSet::new();
    for (shard, targets) in SHARDS {
        let out = shards.join(shard);
        let bases: BTreeSet<String> = targets.iter().map(|t| base(t)).collect();
        for (component, _, handlers) in COMPONENTS {
            let mut a = vec![
                "split".to_string(),
                "--artifact-dir".into(),
                s(&artifact_dir(&tree, component)),
                "--output-dir".into(),
                s(&out),
                "--artifact-prefix".into(),
                component.to_string(),
                "--clang-offload-bundler".into(),
                format!("{}/clang-offload-bundler", kpack_testkit::oracle::LLVM_BIN),
                "--tmp-dir".into(),
                s(&t.path().join("tmp")),
                "--verbose".into(),
                "--json".into(),
            ];
            if !handlers.is_empty() {
                a.push("--split-databases".into());
                a.extend(handlers.iter().map(|h| h.to_string()));
            }
            a.push("--gpu-targets".into());
            a.extend(targets.iter().map(|t| t.to_string()));
            let o = kpack(&args(&a));
            let stderr = String::from_utf8_lossy(&o.stderr);
            let has_code = FAT.iter().any(|(c, prefix, rel, _)| {
                *c == *component
                    && truth[&format!("{prefix}/{rel}")]
                        .keys()
                        .any(|(_, t)| bases.contains(&base(t)))
            });
            let fat = FAT.iter().filter(|(c, _, _, _)| *c == *component).count();
            if fat > 0 && !has_code {
                // formats.md §6.3's refusal: nothing of this component written.
                assert_eq!(o.status.code(), Some(1), "{component}: {stderr}");
                let set: Vec<String> = bases.iter().cloned().collect();
                let want = format!(
                    "Found {fat} fat binaries, but no device code objects matched --gpu-targets ({}). Refusing to emit an untransformed generic artifact.",
                    set.join(", ")
                );
                assert!(stderr.contains(&want), "{stderr}");
                assert!(
                    stderr.contains(&s(&artifact_dir(&tree, component))),
                    "{stderr}"
                );
                let existing = if out.exists() {
                    names(&out)
                } else {
                    Vec::new()
                };
                let written: Vec<String> = existing
                    .into_iter()
                    .filter(|n| n.starts_with(&format!("{component}_")))
                    .collect();
                assert!(written.is_empty(), "{written:?}");
                refused.insert((shard, component));
                continue;
            }
            assert!(o.status.success(), "{shard} {component}: {stderr}");
            // Each offloaded binary records the targets this split kept.
            for (_, prefix, rel, _) in FAT.iter().filter(|f| f.0 == *component) {
                let generic = out.join(format!("{component}_generic"));
                let ls = json(&kpack_ok(&[
                    &"ls",
                    &generic.join(prefix).join(rel),
                    &"--json",
                ]));
                let want: BTreeSet<String> = truth[&format!("{prefix}/{rel}")]
                    .keys()
                    .map(|(_, t)| t.clone())
                    .filter(|t| bases.contains(&base(t)))
                    .collect();
                let got: BTreeSet<String> = serde_json::from_value(ls["targets"].clone()).unwrap();
                assert_eq!(got, want, "{shard}: {prefix}/{rel}");
            }
            let summary = json(&String::from_utf8_lossy(&o.stdout));
            let outputs: Vec<String> = summary["artifacts"][0]["outputs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_string())
                .collect();
            for name in &outputs {
                let suffix = &name[component.len() + 1..];
                assert!(
                    suffix == "generic" || bases.contains(&base(suffix)),
                    "{shard}: {name} is not of {bases:?}"
                );
            }
            assert_eq!(
                summary["gpu_targets"],
                serde_json::json!(bases.iter().collect::<Vec<_>>())
            );
        }
        assert!(
            !t.path().join("tmp").read_dir().unwrap().any(|_| true),
            "scratch left"
        );
        // Every fat binary is offloaded in every shard, whatever it kept.
        for (component, prefix, rel, _) in FAT {
            let generic = out
                .join(format!("{component}_generic"))
                .join(prefix)
                .join(rel);
            if generic.exists() {
                verify_file(&generic).unwrap_or_else(|e| panic!("{}: {e}", generic.display()));
            }
        }
        // Database files of other targets: neither generic nor per-target.
        for (component, prefix, rel, target) in databases() {
            let Some(target) = target else { continue };
            let here = out
                .join(format!("{component}_{target}"))
                .join(prefix)
                .join(&rel);
            let generic = out
                .join(format!("{component}_generic"))
                .join(prefix)
                .join(&rel);
            let kept = bases.contains(target) && !refused.contains(&(shard, component));
            assert_eq!(here.is_file(), kept, "{shard}: {rel}");
            assert!(!generic.exists(), "{shard}: {rel} in generic");
        }
        verify(&out, None);
    }
    // gfx90a:xnack- stands for gfx90a: both feature variants are kept.
    for v in ["gfx90a:xnack-", "gfx90a:xnack+"] {
        assert!(
            shards.join(format!("gfx94X-build/blas_lib_{v}")).is_dir(),
            "{v}"
        );
    }
    // gfx1250 and gfx1250-strict were both asked for; neither took the
    // other's code objects.
    let strict = shards.join("gfx125X-build/miopen_lib_gfx1250-strict");
    assert!(strict.is_dir());

    let config = t.path().join("config.json");
    fs::write(&config, CONFIG).unwrap();
    let rec = t.path().join("recombined");
    kpack_ok(&[
        &"recombine",
        &"--input-shards-dir",
        &shards,
        &"--config",
        &config,
        &"--output-dir",
        &rec,
    ]);
    let r = verify(&rec, Some(&config));
    assert!(r["wrappers_resolved"].as_u64().unwrap() > 0);

    // Install generic + group per component; resolve every wrapper.
    let groups: Vec<(&str, &str, Vec<&str>)> = SHARDS
        .iter()
        .zip(["gfx94X", "gfx125X", "gfx11X"])
        .map(|((shard, targets), g)| (g, *shard, targets.to_vec()))
        .collect();
    // TheRock's shards build only their own targets; this tree's binaries
    // hold every target, so some components have nothing for some shards:
    // the refusal above, for MIOpen in gfx11X and everything but MIOpen
    // in gfx125X.
    assert_eq!(
        refused,
        BTreeSet::from([
            ("gfx11X-build", "miopen_lib"),
            ("gfx125X-build", "aotriton_lib"),
            ("gfx125X-build", "blas_lib"),
            ("gfx125X-build", "hipkp_lib"),
        ])
    );
    let loader = Loader::new(Config::default());
    let mut resolved = 0;
    for (group, shard, targets) in &groups {
        let bases: BTreeSet<String> = targets.iter().map(|t| base(t)).collect();
        for (component, _, _) in COMPONENTS {
            let mut parts = vec![rec.join(format!("{component}_generic"))];
            let group_dir = rec.join(format!("{component}_{group}"));
            if group_dir.is_dir() {
                parts.push(group_dir);
            }
            let root = t.path().join(format!("install/{component}-{group}"));
            install(&parts, &root);
            for (_, prefix, rel, _) in FAT.iter().filter(|f| f.0 == *component) {
                let binary = root.join(rel);
                let v = verify_file(&binary).unwrap();
                let metadata = v.metadata.encode();
                let gt = &truth[&format!("{prefix}/{rel}")];
                for ((bundle, target), want) in gt {
                    let served = bases.contains(&base(target));
                    for (w, &co) in v.co_indices.iter().enumerate() {
                        if co as usize != *bundle {
                            continue;
                        }
                        let got = loader.load_code_object(&metadata, &binary, co as u32, &[target]);
                        if served {
                            let got = got.unwrap_or_else(|e| {
                                panic!("{}: {group} {target} wrapper {w}: {e}", binary.display())
                            });
                            assert!(got == *want, "{}: {target} #{co}", binary.display());
                            resolved += 1;
                        } else {
                            assert!(
                                got.is_err(),
                                "{}: {target} not in {group}",
                                binary.display()
                            );
                        }
                    }
                }
            }
            for (c, _, rel, target) in databases() {
                if c == *component {
                    let installed = root.join(&rel).is_file();
                    let want = target.is_none_or(|t| {
                        bases.contains(t) && !refused.contains(&(*shard, *component))
                    });
                    assert_eq!(installed, want, "{group}: {rel}");
                }
            }
        }
    }
    // Every (binary, bundle, target) of the tree, at least once.
    let total: usize = truth.values().map(BTreeMap::len).sum();
    assert!(resolved >= total, "{resolved} of {total} wrappers resolved");

    // SPIR-V: a caller that can JIT asks for amdgcnspirv last.
    let root = t.path().join("install/miopen_lib-gfx125X");
    let binary = root.join("lib/libMIOpen.so.1");
    let v = verify_file(&binary).unwrap();
    let got = loader
        .load_code_object(
            &v.metadata.encode(),
            &binary,
            0,
            &["gfx1151", "amdgcnspirv"],
        )
        .unwrap();
    assert_eq!(
        got,
        truth["ml-libs/MIOpen/stage/lib/libMIOpen.so.1"][&(0, "amdgcnspirv".into())]
    );
    assert!(got.starts_with(&[0x03, 0x02, 0x23, 0x07]));
    // A strict agent gets strict code, a gfx1250 agent gfx1250 code.
    for t in ["gfx1250", "gfx1250-strict"] {
        let got = loader
            .load_code_object(&v.metadata.encode(), &binary, 1, &[t])
            .unwrap();
        assert_eq!(
            got,
            truth["ml-libs/MIOpen/stage/lib/libMIOpen.so.1"][&(1, t.into())],
            "{t}"
        );
    }
}

/// The processor of a target or key (formats.md §2.3 `base_arch`).
fn base(t: &str) -> String {
    kpack_format::target::base_arch(t)
}

/// Split as a non-root user (setpriv) an input tree that a second user
/// owns and may not be written (files 0444, directories 0555), into an
/// output directory a third user owns (writable by all) that holds that
/// user's outputs of an earlier run (`--overwrite`): the outputs are the
/// same as root's split into a clean directory. When the tests do not run
/// as root, the same split runs as the current user.
#[test]
fn split_into_a_tree_another_user_owns() {
    use std::os::unix::fs::{chown, MetadataExt, PermissionsExt};
    let t = tempfile::tempdir().unwrap();
    fs::set_permissions(t.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let input = t.path().join("blas_lib_gfx94X-dgpu");
    write(&input.join("artifact_manifest.txt"), b"stage\n", 0o644).unwrap();
    copy(
        &fixture("libvadd.so").path,
        &input.join("stage/lib/libvadd.so"),
        0o755,
    )
    .unwrap();
    let db = "stage/lib/rocblas/library/TensileLibrary_gfx942.dat";
    write(&input.join(db), b"db", 0o644).unwrap();
    symlink("libvadd.so", &input.join("stage/lib/libvadd.so.1")).unwrap();
    let split = |out: &Path, uid: Option<u32>| {
        let mut c = match uid {
            Some(u) => {
                let mut c = std::process::Command::new("setpriv");
                c.args([
                    "--reuid",
                    &u.to_string(),
                    "--regid",
                    &u.to_string(),
                    "--clear-groups",
                ]);
                c.arg(kpack_bin());
                c
            }
            None => std::process::Command::new(kpack_bin()),
        };
        c.arg("split").arg("--artifact-dir").arg(&input);
        c.arg("--output-dir")
            .arg(out)
            .args(["--split-databases", "rocblas", "--overwrite"]);
        c.output().unwrap()
    };
    let clean = t.path().join("clean");
    assert!(split(&clean, None).status.success());
    let root = fs::metadata(t.path()).unwrap().uid() == 0;
    let out = t.path().join("out");
    // An earlier run's outputs, the third user's.
    let old = out.join("blas_lib_generic/stage/lib");
    write(&old.join("libvadd.so"), b"old", 0o666).unwrap();
    write(&out.join("blas_lib_gfx942/stage/old"), b"old", 0o666).unwrap();
    let mut as_user = None;
    if root {
        let (user, owner, third) = (4242, 4343, 4444);
        for (path, _) in snapshot(&out) {
            let p = out.join(path);
            chown(&p, Some(third), Some(third)).unwrap();
            if p.is_dir() {
                fs::set_permissions(&p, fs::Permissions::from_mode(0o777)).unwrap();
            }
        }
        chown(&out, Some(third), Some(third)).unwrap();
        fs::set_permissions(&out, fs::Permissions::from_mode(0o777)).unwrap();
        // The input: the second user's, read-only (directories last).
        let snap = snapshot(&input);
        for (path, (kind, _, _)) in snap.iter().rev() {
            let p = input.join(path);
            std::os::unix::fs::lchown(&p, Some(owner), Some(owner)).unwrap();
            match kind {
                'd' => fs::set_permissions(&p, fs::Permissions::from_mode(0o555)).unwrap(),
                'f' => fs::set_permissions(&p, fs::Permissions::from_mode(0o444)).unwrap(),
                _ => {}
            }
        }
        chown(&input, Some(owner), Some(owner)).unwrap();
        fs::set_permissions(&input, fs::Permissions::from_mode(0o555)).unwrap();
        as_user = Some(user);
    }
    let o = split(&out, as_user);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut want = snapshot(&clean);
    let mut got = snapshot(&out);
    if root {
        // Root's copy kept the input's modes as they were then.
        for s in [&mut want, &mut got] {
            for (_, (_, _, mode)) in s.iter_mut() {
                *mode = 0;
            }
        }
        for (path, _) in snapshot(&out) {
            let uid = fs::symlink_metadata(out.join(&path)).unwrap().uid();
            assert_eq!(uid, 4242, "{path}");
        }
    }
    assert_eq!(got, want);
    assert!(
        names(&out).iter().all(|n| !n.starts_with('.')),
        "{:?}",
        names(&out)
    );
    // The earlier run's files are gone.
    assert!(!out.join("blas_lib_gfx942/stage/old").exists());
}

/// Make `dir` read-only as another user would have it (files 0444,
/// directories 0555, owned by `owner` when running as root).
fn make_read_only(dir: &Path, owner: Option<u32>) {
    use std::os::unix::fs::PermissionsExt;
    for (path, (kind, _, _)) in snapshot(dir).iter().rev() {
        let p = dir.join(path);
        if let Some(o) = owner {
            std::os::unix::fs::lchown(&p, Some(o), Some(o)).unwrap();
        }
        match kind {
            'd' => fs::set_permissions(&p, fs::Permissions::from_mode(0o555)).unwrap(),
            'f' => fs::set_permissions(&p, fs::Permissions::from_mode(0o444)).unwrap(),
            _ => {}
        }
    }
    if let Some(o) = owner {
        std::os::unix::fs::chown(dir, Some(o), Some(o)).unwrap();
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(0o555)).unwrap();
}

/// Recombine, as a non-root user, read-only shards that another user owns,
/// with two targets of one group sharing their prefix directories (the
/// second target's files go into directories the first one made): the
/// output is the same as root's, directories with the input's modes.
#[test]
fn recombine_read_only_shards_as_another_user() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let t = tempfile::tempdir().unwrap();
    fs::set_permissions(t.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let lib = fixture("libvadd.so");
    assert!(lib.targets.len() >= 2, "{:?}", lib.targets);
    let input = t.path().join("blas_lib_gfx94X-dgpu");
    write(&input.join("artifact_manifest.txt"), b"stage\n", 0o644).unwrap();
    copy(&lib.path, &input.join("stage/lib/libvadd.so"), 0o755).unwrap();
    for target in &lib.targets {
        let db = format!(
            "stage/lib/rocblas/library/TensileLibrary_{}.dat",
            base(target)
        );
        write(&input.join(db), target.as_bytes(), 0o644).unwrap();
    }
    let shards = t.path().join("shards");
    kpack_ok(&[
        &"split",
        &"--artifact-dir",
        &input,
        &"--output-dir",
        &shards.join("s1"),
        &"--split-databases",
        &"rocblas",
    ]);
    let archs: Vec<String> = lib
        .targets
        .iter()
        .map(|t| format!("{:?}", base(t)))
        .collect();
    let config = t.path().join("config.json");
    let text = format!(
        r#"{{"primary_shard": "s1",
 "architecture_groups": {{"all": {{"display_name": "All", "architectures": [{}]}}}},
 "validation": {{"error_on_duplicate_device_code": true,
                "verify_generic_artifacts_match": false,
                "error_on_missing_architecture": true}}}}"#,
        archs.join(", ")
    );
    fs::write(&config, text).unwrap();
    let root = fs::metadata(t.path()).unwrap().uid() == 0;
    make_read_only(&shards, root.then_some(4343));
    let recombine = |out: &Path, uid: Option<u32>| {
        let mut c = match uid {
            Some(u) => {
                let mut c = std::process::Command::new("setpriv");
                let u = u.to_string();
                c.args(["--reuid", &u, "--regid", &u, "--clear-groups"]);
                c.arg(kpack_bin());
                c
            }
            None => std::process::Command::new(kpack_bin()),
        };
        c.arg("recombine").arg("--input-shards-dir").arg(&shards);
        c.arg("--config").arg(&config).arg("--output-dir").arg(out);
        c.output().unwrap()
    };
    let clean = t.path().join("clean");
    let o = recombine(&clean, None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = t.path().join("out");
    fs::create_dir(&out).unwrap();
    fs::set_permissions(&out, fs::Permissions::from_mode(0o777)).unwrap();
    let o = recombine(&out, root.then_some(4242));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let got = snapshot(&out);
    assert_eq!(got, snapshot(&clean));
    let lib_dir = "blas_lib_all/stage/lib";
    let (kind, _, mode) = &got[lib_dir];
    assert_eq!((*kind, *mode & 0o777), ('d', 0o555), "{lib_dir}");
    for target in &lib.targets {
        let db = format!(
            "blas_lib_all/stage/lib/rocblas/library/TensileLibrary_{}.dat",
            base(target)
        );
        assert!(got.contains_key(&db), "{db}: {:?}", got.keys());
    }
}
