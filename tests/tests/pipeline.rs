//! The artifact pipeline end to end, on real HIP binaries: the tutorial
//! (docs/tutorial.md, every `sh` block run and every `output` block
//! checked) over three shards, then every invariant of its "inspect"
//! step, and finally, per architecture group, an install of generic + group
//! artifact in which every wrapper of every offloaded binary resolves,
//! through the runtime's loader, for every target of the group, to exactly
//! the code object clang-offload-bundler extracts from the original fat
//! binary. Also: determinism across `--jobs` and directory order, and
//! pack-tree.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;
use kpack_host::offload::verify_file;
use kpack_loader::{Config, Loader};

/// A fenced block of the tutorial to run, and the output it must print.
struct Block {
    line: usize,
    code: String,
    output: Option<String>,
}

fn tutorial_blocks() -> Vec<Block> {
    let text = fs::read_to_string(workspace().join("docs/tutorial.md")).unwrap();
    let mut blocks: Vec<Block> = Vec::new();
    let mut fence: Option<(String, usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        match &mut fence {
            None => {
                if let Some(lang) = line.strip_prefix("```") {
                    fence = Some((lang.trim().to_string(), i + 1, String::new()));
                }
            }
            Some((lang, start, body)) => {
                if line == "```" {
                    match lang.as_str() {
                        "sh" => blocks.push(Block {
                            line: *start,
                            code: body.clone(),
                            output: None,
                        }),
                        "output" => {
                            let b = blocks.last_mut().expect("output block after an sh block");
                            assert!(b.output.is_none(), "two output blocks for line {}", b.line);
                            b.output = Some(body.clone());
                        }
                        _ => {
                            for l in body.lines() {
                                assert!(
                                    !l.trim_start().starts_with("kpack "),
                                    "tutorial line {start}: a kpack command outside an sh block is not run by the test: {l}"
                                );
                            }
                        }
                    }
                    fence = None;
                } else {
                    body.push_str(line);
                    body.push('\n');
                }
            }
        }
    }
    assert!(fence.is_none(), "unterminated code block");
    blocks
}

fn normalize(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.trim_end().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

/// Run every `sh` block of the tutorial with `$ARTIFACTS` and `$WORK`, and
/// `kpack` on the PATH; check each `output` block.
fn run_tutorial(artifacts: &Path, work: &Path) -> usize {
    let bin_dir = kpack_bin().parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let blocks = tutorial_blocks();
    assert!(
        blocks.len() >= 10,
        "the tutorial has {} sh blocks",
        blocks.len()
    );
    for b in &blocks {
        let out = Command::new("bash")
            .args(["-euo", "pipefail", "-c", &b.code])
            .env("ARTIFACTS", artifacts)
            .env("WORK", work)
            .env("PATH", &path)
            .env("LC_ALL", "C")
            .current_dir(work)
            .output()
            .expect("bash");
        let stdout = String::from_utf8_lossy(&out.stdout)
            .replace(&work.display().to_string(), "/develop/tmp")
            .replace(&artifacts.display().to_string(), "/develop/artifacts");
        assert!(
            out.status.success(),
            "tutorial block at line {} failed ({}):\n{}\nstdout:\n{stdout}\nstderr:\n{}",
            b.line,
            out.status,
            b.code,
            String::from_utf8_lossy(&out.stderr)
        );
        if let Some(expected) = &b.output {
            assert_eq!(
                normalize(&stdout),
                normalize(expected),
                "tutorial block at line {}: output differs from the documented one:\n{}",
                b.line,
                b.code
            );
        }
    }
    blocks.len()
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&fs::read_to_string(path).unwrap()).unwrap()
}

/// The shard that builds `target`, and its family.
fn shard_of(target: &str) -> (&'static str, &'static str) {
    SHARDS
        .iter()
        .find(|(_, _, ts)| ts.contains(&target))
        .map(|(s, f, _)| (*s, *f))
        .unwrap()
}

/// The tutorial's run, once for the tests below: its shards, its working
/// directory and the split and recombined artifacts it made.
struct Tutorial {
    root: PathBuf,
    artifacts: PathBuf,
    work: PathBuf,
    split: PathBuf,
    rec: PathBuf,
}

/// Run the tutorial (once per test process) under the test target's
/// scratch directory.
fn tutorial() -> &'static Tutorial {
    static RUN: std::sync::OnceLock<Tutorial> = std::sync::OnceLock::new();
    RUN.get_or_init(|| {
        let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pipeline-tutorial");
        let _ = fs::remove_dir_all(&root);
        let artifacts = root.join("artifacts");
        let work = root.join("work");
        fs::create_dir_all(&work).unwrap();
        make_shards(&artifacts);
        let start = std::time::Instant::now();
        let blocks = run_tutorial(&artifacts, &work);
        eprintln!(
            "tutorial: {blocks} blocks in {:.1} s",
            start.elapsed().as_secs_f64()
        );
        Tutorial {
            split: work.join("split-artifacts"),
            rec: work.join("recombined-artifacts"),
            root,
            artifacts,
            work,
        }
    })
}

/// Split summaries: counts, and the prefix that does not exist.
#[test]
fn tutorial_split_summaries() {
    let t = tutorial();
    let work = &t.work;
    let split = &t.split;
    for (shard, _, targets) in SHARDS {
        let s = json(&work.join(format!("split-{shard}.json")));
        let t = &s["totals"];
        assert_eq!(t["artifacts"], 3, "{shard}");
        assert_eq!(t["binaries"], 3, "{shard}");
        // rocblas 1 bundle, hipblaslt 1 bundle, rocfft 2 bundles.
        assert_eq!(t["code_objects"], 4 * targets.len(), "{shard}");
        assert_eq!(t["database_files"], 5 * targets.len(), "{shard}");
        assert!(t["bytes_in"].as_u64().unwrap() > t["bytes_out"].as_u64().unwrap() / 2);
        assert_eq!(s["failed"], 0);
        let per_target = s["targets"].as_object().unwrap();
        assert_eq!(per_target.keys().collect::<Vec<_>>(), targets.to_vec());
        for (_, v) in per_target {
            assert_eq!(v["archives"], 2, "blas_lib and fft_lib");
            assert!(v["archive_bytes"].as_u64().unwrap() > 64);
        }
        let fft = s["artifacts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["artifact_prefix"] == "fft_lib")
            .unwrap();
        assert_eq!(
            fft["skipped_prefixes"],
            serde_json::json!([FFT_MISSING_PREFIX])
        );
        assert_eq!(fft["prefixes"], serde_json::json!([FFT_PREFIX]));
        assert!(s["seconds"].as_f64().is_some());
        for (ap, _, _) in FAT_BINARIES {
            let generic = split.join(shard).join(format!("{ap}_generic"));
            let m = fs::read_to_string(generic.join("artifact_manifest.txt")).unwrap();
            assert!(!m.contains(FFT_MISSING_PREFIX));
        }
    }
}

/// The generic split outputs: offloaded binaries with formats.md §4.5
/// metadata, symlinks and modes kept.
#[test]
fn tutorial_generic_outputs() {
    let t = tutorial();
    let artifacts = &t.artifacts;
    let split = &t.split;
    // symlinks and modes kept.
    let g = split.join("gfx110X-build/blas_lib_generic");
    for (ap, prefix, rel) in FAT_BINARIES {
        let path = split
            .join("gfx110X-build")
            .join(format!("{ap}_generic"))
            .join(prefix)
            .join(rel);
        let v = verify_file(&path).unwrap();
        assert_eq!(v.metadata.kernel_name, format!("{prefix}/{rel}"));
        let depth = rel.matches('/').count();
        assert_eq!(
            v.metadata.search_paths,
            vec![format!(
                "{}.kpack/{ap}_@GFXARCH@.kpack",
                "../".repeat(depth)
            )]
        );
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o755, "{}", path.display());
    }
    let lib = g.join(ROCBLAS_PREFIX).join("lib");
    assert_eq!(
        fs::read_link(lib.join("librocblas.so.5")).unwrap(),
        Path::new("librocblas.so.5.2")
    );
    assert_eq!(
        fs::read_link(lib.join("librocblas.so")).unwrap(),
        Path::new("librocblas.so.5")
    );
    let cfg = g.join(ROCBLAS_PREFIX).join("bin/rocblas-config");
    assert_eq!(
        fs::metadata(&cfg).unwrap().permissions().mode() & 0o777,
        0o750
    );
    let hsaco = split
        .join("gfx110X-build/blas_lib_gfx1101")
        .join(ROCBLAS_PREFIX)
        .join("lib/rocblas/library/Kernels.so-000-gfx1101.hsaco");
    assert_eq!(
        fs::metadata(&hsaco).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert!(split
        .join("gfx110X-build/base_lib_generic")
        .join(BASE_PREFIX)
        .join("share/empty")
        .is_dir());
    assert_eq!(
        fs::read(
            split
                .join("gfx110X-build/base_lib_generic")
                .join(BASE_PREFIX)
                .join("lib/libhostonly.so")
        )
        .unwrap(),
        fs::read(
            artifacts
                .join("gfx110X-build/base_lib_gfx110X-dgpu")
                .join(BASE_PREFIX)
                .join("lib/libhostonly.so")
        )
        .unwrap()
    );
}

/// No staging or scratch directories left behind.
#[test]
fn tutorial_leaves_nothing_behind() {
    let t = tutorial();
    let work = &t.work;
    let split = &t.split;
    for (shard, _, _) in SHARDS {
        for n in names(&split.join(shard)) {
            assert!(!n.starts_with('.'), "{shard}: left behind: {n}");
        }
    }
    assert!(names(work).iter().all(|n| !n.starts_with(".kpack")));
}

/// The recombine summary: primary shard, groups per component.
#[test]
fn tutorial_recombine_summary() {
    let t = tutorial();
    let work = &t.work;
    let r = json(&work.join("recombine.json"));
    assert_eq!(r["primary_shard"], "gfx110X-build");
    assert_eq!(r["unassigned_targets"], serde_json::json!([]));
    assert_eq!(r["missing_architectures"], serde_json::json!([]));
    assert_eq!(r["components"].as_array().unwrap().len(), 3);
    for c in r["components"].as_array().unwrap() {
        assert_eq!(c["generic_from"], "gfx110X-build");
        let groups = c["groups"].as_array().unwrap();
        if c["component"] == "base_lib" {
            assert!(
                groups.is_empty(),
                "host-only components get no group artifacts"
            );
        } else {
            assert_eq!(groups.len(), 3);
        }
    }
}

/// A recombined generic artifact is its primary shard's, byte for byte,
/// except its offloaded binaries: the shards were split from builds for
/// other targets, so those lose their device digest and nothing else.
fn assert_is_the_primary_shards(dir: &Path, primary: &Path, name: &str) {
    let (got, want) = (snapshot(dir), snapshot(primary));
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "{name}"
    );
    for (rel, entry) in &got {
        if entry == &want[rel] {
            continue;
        }
        let ours = verify_file(&dir.join(rel)).unwrap().metadata;
        let theirs = verify_file(&primary.join(rel)).unwrap().metadata;
        assert!(theirs.device_digest.is_some(), "{name}/{rel}");
        assert_eq!(ours, theirs.with_device_digest(None), "{name}/{rel}");
    }
}

/// The invariants of the tutorial's "inspect" step, on every artifact.
#[test]
fn tutorial_inspect_invariants() {
    let t = tutorial();
    let split = &t.split;
    let rec = &t.rec;
    for name in names(rec) {
        let dir = rec.join(&name);
        let manifest = fs::read_to_string(dir.join("artifact_manifest.txt")).unwrap();
        for p in manifest.lines() {
            assert!(dir.join(p).is_dir(), "{name}: manifest prefix {p} missing");
        }
        assert!(find(&dir, &|n| n.ends_with(".kpm")).is_empty());
        if name.ends_with("_generic") {
            assert!(find(&dir, &|n| n.ends_with(".kpack")).is_empty(), "{name}");
            let primary = split.join("gfx110X-build").join(&name);
            assert_is_the_primary_shards(&dir, &primary, &name);
        } else {
            assert!(
                find(&dir, &|n| n.ends_with(".so") || n.contains(".so.")).is_empty(),
                "{name}: host library"
            );
            for f in find(&dir, &|_| true) {
                let head = fs::read(&f)
                    .map(|b| b[..b.len().min(20)].to_vec())
                    .unwrap_or_default();
                let host_elf = head.starts_with(b"\x7fELF") && head.len() == 20 && head[18] == 62;
                assert!(
                    !host_elf,
                    "{}: an x86-64 ELF file in a group artifact",
                    f.display()
                );
            }
            assert!(
                !find(&dir, &|n| n.ends_with(".kpack")).is_empty(),
                "{name}: no archive"
            );
        }
    }
}

/// Install per group and resolve every wrapper through the loader, to
/// the bytes clang-offload-bundler extracts from the original.
#[test]
fn tutorial_installs_resolve_to_the_bundlers_bytes() {
    let t = tutorial();
    let artifacts = &t.artifacts;
    let work = &t.work;
    let rec = &t.rec;
    let config = json(&work.join("packaging-config.json"));
    let mut truth: BTreeMap<PathBuf, BTreeMap<(usize, String), Vec<u8>>> = BTreeMap::new();
    let mut resolved = 0;
    for (group, spec) in config["architecture_groups"].as_object().unwrap() {
        let targets: Vec<&str> = spec["architectures"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect();
        for component in ["blas_lib", "fft_lib"] {
            let root = t.root.join("install").join(format!("{component}-{group}"));
            install(
                &[
                    rec.join(format!("{component}_generic")),
                    rec.join(format!("{component}_{group}")),
                ],
                &root,
            );
            let loader = Loader::new(Config::default());
            for (ap, prefix, rel) in FAT_BINARIES.iter().filter(|(ap, _, _)| *ap == component) {
                let binary = root.join(rel);
                let v = verify_file(&binary).unwrap();
                let metadata = v.metadata.encode();
                for t in &targets {
                    let (shard, family) = shard_of(t);
                    let original = artifacts
                        .join(shard)
                        .join(format!("{ap}_{family}"))
                        .join(prefix)
                        .join(rel);
                    let gt = truth
                        .entry(original.clone())
                        .or_insert_with(|| code_objects(&original));
                    for &co in &v.co_indices {
                        let got = loader
                            .load_code_object(&metadata, &binary, co as u32, &[t])
                            .unwrap_or_else(|e| {
                                panic!("{}: {group} {t} #{co}: {e}", binary.display())
                            });
                        let want = &gt[&(co as usize, t.to_string())];
                        assert!(
                            got == *want,
                            "{}: {t} #{co} differs from the bundler's",
                            binary.display()
                        );
                        resolved += 1;
                    }
                }
                // A target of another group is not installed.
                let other = if *group == "gfx110X" {
                    "gfx1201"
                } else {
                    "gfx1100"
                };
                assert!(loader
                    .load_code_object(&metadata, &binary, v.co_indices[0] as u32, &[other])
                    .is_err());
            }
            if component == "blas_lib" {
                for (_, _, rel, target) in database_files(&targets) {
                    if target.is_some() {
                        assert!(root.join(&rel).is_file(), "{group}: {rel} not installed");
                    }
                }
                assert!(root
                    .join("lib/rocblas/library/TensileLibrary_fallback.dat")
                    .is_file());
            }
        }
    }
    // 6 targets x (rocblas 1 + hipblaslt 3 + rocfft 2 wrappers).
    assert_eq!(resolved, 6 * 6);
}

/// Splitting gives the same bytes for any --jobs and any directory order:
/// the same shard laid out twice, in opposite creation orders on tmpfs
/// (which lists newest first), split with --jobs 1 and --jobs 2.
#[test]
fn split_is_deterministic() {
    let base = scratch();
    let (shard, family, targets) = SHARDS[2];
    let a = base.path().join("a");
    make_shard(&a, shard, family, targets);
    // b: the same entries created in the opposite order.
    let b = base.path().join("b");
    reversed_copy(&a.join(shard), &b.join(shard));
    let mut outs = Vec::new();
    for (input, jobs) in [(&a, "1"), (&b, "2")] {
        let out = base.path().join(format!("out-{jobs}"));
        split_shard(&input.join(shard), &out, jobs);
        outs.push(snapshot(&out));
    }
    assert!(outs[0].len() > 20);
    assert_eq!(
        outs[0].keys().collect::<Vec<_>>(),
        outs[1].keys().collect::<Vec<_>>()
    );
    for (k, v) in &outs[0] {
        assert!(
            outs[1][k] == *v,
            "{k} differs between --jobs 1 and --jobs 2"
        );
    }
}

/// pack-tree: a whole install tree into a host-only tree plus
/// `.kpack/<group>_<target>.kpack` whose keys the runtime finds.
#[test]
fn pack_tree_install_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let (shard, family, targets) = SHARDS[0];
    let shards = tmp.path().join("shards");
    make_shard(&shards, shard, family, targets);
    // An install tree: the prefixes of the blas and fft artifacts, flattened.
    let tree = tmp.path().join("rocm");
    install(
        &[
            shards.join(shard).join(format!("blas_lib_{family}")),
            shards.join(shard).join(format!("fft_lib_{family}")),
        ],
        &tree,
    );
    let out = tmp.path().join("packed");
    let s: serde_json::Value = serde_json::from_str(&kpack_ok(&[
        &"pack-tree",
        &"--input",
        &tree,
        &"--output",
        &out,
        &"--group-name",
        &"rocm",
        &"--max-workers",
        &"2",
        &"--json",
    ]))
    .unwrap();
    assert_eq!(s["binaries"], 3);
    assert_eq!(s["code_objects"], 4 * targets.len());
    assert_eq!(
        names(&out.join(".kpack")),
        targets
            .iter()
            .map(|t| format!("rocm_{t}.kpack"))
            .collect::<Vec<_>>()
    );
    let loader = Loader::new(Config::default());
    let mut resolved = 0;
    for (_, _, rel) in FAT_BINARIES {
        let v = verify_file(&out.join(rel)).unwrap();
        assert_eq!(v.metadata.kernel_name, *rel);
        let gt = code_objects(&tree.join(rel));
        for t in targets {
            for &co in &v.co_indices {
                let got = loader
                    .load_code_object(&v.metadata.encode(), &out.join(rel), co as u32, &[t])
                    .unwrap();
                assert!(got == gt[&(co as usize, t.to_string())]);
                resolved += 1;
            }
        }
    }
    assert_eq!(resolved, 6 * targets.len());
    // Everything else copied as it is.
    let before = snapshot(&tree);
    let after = snapshot(&out);
    for (k, v) in &before {
        if !FAT_BINARIES.iter().any(|(_, _, rel)| rel == k) {
            assert!(after.get(k) == Some(v), "{k} not copied as it is");
        }
    }

    // An existing output is refused; --gfx-arches keeps only some targets.
    let err = kpack_fails(&[
        &"pack-tree",
        &"--input",
        &tree,
        &"--output",
        &out,
        &"--group-name",
        &"rocm",
    ]);
    assert!(err.contains("already exists"), "{err}");
    let s: serde_json::Value = serde_json::from_str(&kpack_ok(&[
        &"pack-tree",
        &"--input",
        &tree,
        &"--output",
        &out,
        &"--group-name",
        &"rocm",
        &"--gfx-arches",
        &"gfx1100,gfx1102",
        &"--gfx-arch-family",
        &"gfx110X",
        &"--compression",
        &"none",
        &"--overwrite",
        &"--json",
    ]))
    .unwrap();
    assert_eq!(s["dropped_code_objects"], 4);
    assert_eq!(
        names(&out.join(".kpack")),
        ["rocm_gfx1100.kpack", "rocm_gfx1102.kpack"]
    );
    let listing: serde_json::Value = serde_json::from_str(&kpack_ok(&[
        &"ls",
        &out.join(".kpack/rocm_gfx1102.kpack"),
        &"--json",
    ]))
    .unwrap();
    assert_eq!(listing["gfx_arch_family"], "gfx110X");
    assert_eq!(listing["compression_scheme"], "none");
}
