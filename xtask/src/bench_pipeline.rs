//! pack-tree and recombine: over the end-to-end fixture tree (the
//! tutorial's three shards, laid out from the HIP binaries that
//! `tests/tests/pipeline.rs` compiles into `target/pipeline-fixtures/`),
//! and over real-size inputs (a tree holding librocrand; the split of
//! librocsparse as one shard).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::json;

use crate::args;
use crate::bench::{
    link_or_copy, remove, resident, timed, tree_size, warm, Ctx, FloorRatio, Row, Runs,
};
use crate::bench_libs::{make_artifact, ROCRAND, ROCSPARSE};

const SECTION: &str = "pipeline";

/// (shard directory, artifact family, targets), as in the tutorial.
const SHARDS: &[(&str, &str, &[&str])] = &[
    (
        "gfx110X-build",
        "gfx110X-dgpu",
        &["gfx1100", "gfx1101", "gfx1102"],
    ),
    ("gfx1151-build", "gfx1151", &["gfx1151"]),
    ("gfx120X-build", "gfx120X-all", &["gfx1200", "gfx1201"]),
];

const TUTORIAL_CONFIG: &str = r#"{
  "primary_shard": "gfx110X-build",
  "architecture_groups": {
    "gfx110X": {"display_name": "gfx110X", "architectures": ["gfx1100", "gfx1101", "gfx1102"]},
    "gfx115X": {"display_name": "gfx115X", "architectures": ["gfx1151"]},
    "gfx120X": {"display_name": "gfx120X", "architectures": ["gfx1200", "gfx1201"]}
  },
  "validation": {
    "error_on_duplicate_device_code": true,
    "verify_generic_artifacts_match": false,
    "error_on_missing_architecture": false
  }
}
"#;

const ROCSPARSE_CONFIG: &str = r#"{
  "primary_shard": "rocsparse-build",
  "architecture_groups": {
    "gfx8": {"display_name": "gfx8", "architectures": ["gfx803"]},
    "gfx9": {"display_name": "gfx9", "architectures": ["gfx900", "gfx906", "gfx908", "gfx90a"]},
    "gfx10": {"display_name": "gfx10", "architectures": ["gfx1030"]}
  },
  "validation": {
    "error_on_duplicate_device_code": true,
    "verify_generic_artifacts_match": false,
    "error_on_missing_architecture": true
  }
}
"#;

const ROCBLAS: &str = "math-libs/BLAS/rocBLAS/stage";
const HIPBLASLT: &str = "math-libs/BLAS/hipBLASLt/stage";
const FFT: &str = "math-libs/rocFFT/stage";
const BASE: &str = "base/stage";

/// Files every shard of the compiled fixtures has.
const BUILT: &[&str] = &[
    "librocblas.so.5.2",
    "libhipblaslt.so.0.9",
    "librocfft_kernels.so.0.1",
];

/// The newest complete `target/pipeline-fixtures/<hash>/`.
fn find_fixtures(root: &Path) -> Option<PathBuf> {
    let base = root.join("target/pipeline-fixtures");
    let mut found: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(&base)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|d| {
            d.join("done").is_file()
                && d.join("libhostonly.so").is_file()
                && SHARDS
                    .iter()
                    .all(|(s, _, _)| BUILT.iter().all(|f| d.join(s).join(f).is_file()))
        })
        .filter_map(|d| Some((d.join("done").metadata().ok()?.modified().ok()?, d)))
        .collect();
    found.sort();
    found.pop().map(|(_, d)| d)
}

/// The compiled fixture binaries, building them (through the pipeline
/// tests, which own their compilation) when missing.
fn fixtures(root: &Path) -> Result<PathBuf> {
    if let Some(d) = find_fixtures(root) {
        return Ok(d);
    }
    eprintln!("pipeline fixtures missing: building them with the pipeline tests");
    let status = std::process::Command::new(crate::cargo())
        .args(["test", "-p", "kpack-e2e", "--test", "pipeline"])
        .current_dir(root)
        .status()?;
    match find_fixtures(root) {
        Some(d) => Ok(d),
        None => bail!(
            "no target/pipeline-fixtures/<hash>/ after `cargo test -p kpack-e2e --test pipeline` \
             ({status})"
        ),
    }
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::create_dir_all(path.parent().context("no parent")?)?;
    std::fs::write(path, text)?;
    Ok(())
}

fn copy(src: &Path, dst: &Path) -> Result<()> {
    std::fs::create_dir_all(dst.parent().context("no parent")?)?;
    std::fs::copy(src, dst).with_context(|| format!("copying {}", src.display()))?;
    Ok(())
}

fn symlink(target: &str, at: &Path) -> Result<()> {
    std::fs::create_dir_all(at.parent().context("no parent")?)?;
    std::os::unix::fs::symlink(target, at)?;
    Ok(())
}

/// The tutorial's shard tree under `root` (`root/<shard>/<artifact>`):
/// blas_lib (rocBLAS and hipBLASLt prefixes, symlink chains, database
/// files), fft_lib (two bundles, one compressed), base_lib (host-only).
fn make_shards(bin: &Path, root: &Path) -> Result<()> {
    for (shard, family, targets) in SHARDS {
        let b = bin.join(shard);
        let blas = root.join(shard).join(format!("blas_lib_{family}"));
        write(
            &blas.join("artifact_manifest.txt"),
            &format!("{ROCBLAS}\n{HIPBLASLT}\n"),
        )?;
        let rb = blas.join(ROCBLAS);
        copy(
            &b.join("librocblas.so.5.2"),
            &rb.join("lib/librocblas.so.5.2"),
        )?;
        symlink("librocblas.so.5.2", &rb.join("lib/librocblas.so.5"))?;
        symlink("librocblas.so.5", &rb.join("lib/librocblas.so"))?;
        write(&rb.join("include/rocblas/rocblas.h"), "/* rocBLAS */\n")?;
        let hb = blas.join(HIPBLASLT);
        copy(
            &b.join("libhipblaslt.so.0.9"),
            &hb.join("lib/libhipblaslt.so.0.9"),
        )?;
        symlink("libhipblaslt.so.0.9", &hb.join("lib/libhipblaslt.so.0"))?;
        for t in *targets {
            for name in [
                format!("TensileLibrary_{t}.co"),
                format!("TensileLibrary_Type_HH_{t}.dat"),
            ] {
                write(
                    &rb.join("lib/rocblas/library").join(&name),
                    &format!("{name}\n"),
                )?;
            }
            let name = format!("extop_{t}.co");
            write(
                &hb.join("lib/hipblaslt/library").join(&name),
                &format!("{name}\n"),
            )?;
        }
        let fft = root.join(shard).join(format!("fft_lib_{family}"));
        write(&fft.join("artifact_manifest.txt"), &format!("{FFT}\n"))?;
        let f = fft.join(FFT);
        copy(
            &b.join("librocfft_kernels.so.0.1"),
            &f.join("lib/rocfft/librocfft_kernels.so.0.1"),
        )?;
        symlink(
            "rocfft/librocfft_kernels.so.0.1",
            &f.join("lib/librocfft_kernels.so.0"),
        )?;
        let base = root.join(shard).join(format!("base_lib_{family}"));
        write(&base.join("artifact_manifest.txt"), &format!("{BASE}\n"))?;
        copy(
            &bin.join("libhostonly.so"),
            &base.join(BASE).join("lib/libhostonly.so"),
        )?;
        write(&base.join(BASE).join("share/doc/base/README"), "base\n")?;
    }
    Ok(())
}

/// Install (flatten) every artifact of `shard`: the contents of each of
/// their prefixes copied into `tree`.
fn flatten(shard: &Path, tree: &Path) -> Result<()> {
    std::fs::create_dir_all(tree)?;
    let mut artifacts: Vec<PathBuf> = std::fs::read_dir(shard)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    artifacts.sort();
    for a in artifacts {
        let manifest = std::fs::read_to_string(a.join("artifact_manifest.txt"))?;
        for prefix in manifest.lines().filter(|l| !l.is_empty()) {
            let p = a.join(prefix);
            if p.is_dir() {
                let status = std::process::Command::new("cp")
                    .arg("-a")
                    .arg(format!("{}/.", p.display()))
                    .arg(tree)
                    .status()?;
                if !status.success() {
                    bail!("cp -a {} failed", p.display());
                }
            }
        }
    }
    Ok(())
}

/// Measure `kpack <args>` `reps` times, removing `out` before each run.
fn measure(
    ctx: &Ctx,
    reps: usize,
    input: &Path,
    out: &Path,
    args: &[std::ffi::OsString],
) -> Result<Runs> {
    let mut runs = Runs::default();
    warm(&[input])?;
    for _ in 0..reps {
        remove(out)?;
        let r = resident(&[input]);
        runs.push(timed(&ctx.kpack, args, &ctx.work)?, r);
    }
    Ok(runs)
}

/// `cp -a input out`, `reps` times: the floor of a tree copy.
fn measure_cp(ctx: &Ctx, reps: usize, input: &Path, out: &Path) -> Result<Runs> {
    let mut runs = Runs::default();
    for _ in 0..reps {
        remove(out)?;
        let r = resident(&[input]);
        runs.push(
            timed(Path::new("cp"), &args!["-a", input, out], &ctx.work)?,
            r,
        );
    }
    remove(out)?;
    Ok(runs)
}

/// A row from measured runs (or the error that stopped them).
fn row_of(
    id: &str,
    work: &str,
    runs: Result<Runs>,
    input: &Path,
    out: &Path,
    floor: Option<&Row>,
) -> Row {
    match runs {
        Err(e) => Row::unavailable(SECTION, id, work, format!("{e:#}")),
        Ok(runs) => {
            let mut row = Row::new(SECTION, id, work);
            runs.fill(&mut row);
            row.bytes_in = Some(tree_size(input));
            row.bytes_out = Some(tree_size(out));
            row.details = serde_json::from_str(&runs.last_stdout)
                .ok()
                .map(|j: serde_json::Value| json!({"reported_seconds": j["seconds"]}))
                .unwrap_or_default();
            if let (Some(f), Some(w)) = (floor, row.wall()) {
                if let Some(fw) = f.wall() {
                    row.floors.push(FloorRatio {
                        floor: f.id.clone(),
                        ratio: w / fw,
                    });
                }
            }
            row
        }
    }
}

pub fn run(ctx: &Ctx) -> Result<Vec<Row>> {
    let dir = ctx.work.join(SECTION);
    remove(&dir)?;
    std::fs::create_dir_all(&dir)?;
    let mut rows = Vec::new();
    // Small inputs: more runs (they take milliseconds).
    let reps = ctx.reps.max(5);

    // The end-to-end fixture tree.
    match fixtures(&ctx.root) {
        Err(e) => {
            let why = format!("{e:#}");
            for (id, work) in [
                ("fixture_split", "split fixture shards (3 shards, batch)"),
                ("fixture_recombine", "recombine fixture shards"),
                ("fixture_pack_tree", "pack-tree fixture install tree"),
            ] {
                rows.push(Row::unavailable(SECTION, id, work, why.clone()));
            }
        }
        Ok(bin) => {
            let shards = dir.join("shards");
            make_shards(&bin, &shards)?;
            let split = dir.join("split");
            // Split every shard (measured too: small, but the whole map phase).
            let work = "split fixture shards (3 shards, batch)";
            let runs = (|| -> Result<Runs> {
                let mut all = Runs::default();
                warm(&[&shards])?;
                for _ in 0..reps {
                    remove(&split)?;
                    let r = resident(&[&shards]);
                    let (mut wall, mut cpu, mut rss) = (0.0, 0.0, 0.0f64);
                    for (shard, _, _) in SHARDS {
                        let run = timed(
                            &ctx.kpack,
                            &args![
                                "split",
                                "--batch-artifact-parent-dir",
                                shards.join(shard),
                                "--output-dir",
                                split.join(shard),
                                "--split-databases",
                                "rocblas",
                                "hipblaslt",
                                "--json"
                            ],
                            &ctx.work,
                        )?;
                        wall += run.wall;
                        cpu += run.cpu;
                        rss = rss.max(run.rss_kib);
                    }
                    all.push(
                        crate::bench::Run {
                            wall,
                            cpu,
                            rss_kib: rss,
                            stdout: String::new(),
                        },
                        r,
                    );
                }
                Ok(all)
            })();
            let ok = runs.is_ok();
            rows.push(row_of("fixture_split", work, runs, &shards, &split, None));

            let config = dir.join("packaging-config.json");
            std::fs::write(&config, TUTORIAL_CONFIG)?;
            let out = dir.join("recombined");
            let work = "recombine fixture shards (3 groups)";
            let runs = if ok {
                measure(
                    ctx,
                    reps,
                    &split,
                    &out,
                    &args![
                        "recombine",
                        "--input-shards-dir",
                        &split,
                        "--config",
                        &config,
                        "--output-dir",
                        &out,
                        "--json"
                    ],
                )
            } else {
                Err(anyhow::anyhow!("split of the fixture shards failed"))
            };
            rows.push(row_of("fixture_recombine", work, runs, &split, &out, None));

            let tree = dir.join("tree");
            flatten(&shards.join(SHARDS[0].0), &tree)?;
            let out = dir.join("packed");
            let work = "pack-tree fixture install tree (gfx110X shard installed)";
            let runs = measure(
                ctx,
                reps,
                &tree,
                &out,
                &args![
                    "pack-tree",
                    "--input",
                    &tree,
                    "--output",
                    &out,
                    "--group-name",
                    "fixture",
                    "--json"
                ],
            );
            rows.push(row_of("fixture_pack_tree", work, runs, &tree, &out, None));
        }
    }

    // Real size: pack-tree over a tree holding librocrand.
    let work = "pack-tree, tree holding librocrand";
    if Path::new(ROCRAND.path).is_file() {
        let tree = dir.join("rocrand-tree");
        let lib = tree.join("lib").join(ROCRAND.file_name());
        link_or_copy(Path::new(ROCRAND.path), &lib)?;
        symlink(ROCRAND.file_name(), &tree.join("lib/librocrand.so.1"))?;
        write(&tree.join("include/rocrand/rocrand.h"), "/* rocRAND */\n")?;
        let out = dir.join("rocrand-packed");
        warm(&[&tree])?;
        let floor = row_of(
            "rocrand_tree_cp",
            "floor: cp -a of that tree",
            measure_cp(ctx, ctx.reps, &tree, &out),
            &tree,
            &tree,
            None,
        );
        let runs = measure(
            ctx,
            ctx.reps,
            &tree,
            &out,
            &args![
                "pack-tree",
                "--input",
                &tree,
                "--output",
                &out,
                "--group-name",
                "rand",
                "--json"
            ],
        );
        rows.push(row_of(
            "rocrand_pack_tree",
            work,
            runs,
            &tree,
            &out,
            Some(&floor),
        ));
        rows.push(floor);
        remove(&out)?;
    } else {
        rows.push(Row::unavailable(
            SECTION,
            "rocrand_pack_tree",
            work,
            format!("{} is not installed", ROCRAND.path),
        ));
    }

    // Real size: recombine of librocsparse's split, as one shard.
    let work = "recombine librocsparse's split (1 shard, 3 groups)";
    if Path::new(ROCSPARSE.path).is_file() {
        let shards = dir.join("rocsparse-shards");
        let shard = shards.join("rocsparse-build");
        let artifact = make_artifact(&ROCSPARSE, &dir.join("rocsparse-artifacts"))?;
        eprintln!("splitting librocsparse for the recombine input");
        let split = timed(
            &ctx.kpack,
            &args![
                "split",
                "--artifact-dir",
                &artifact,
                "--artifact-prefix",
                ROCSPARSE.artifact_prefix,
                "--output-dir",
                &shard
            ],
            &ctx.work,
        );
        if let Err(e) = split {
            rows.push(Row::unavailable(
                SECTION,
                "rocsparse_recombine",
                work,
                format!("split failed: {e:#}"),
            ));
        } else {
            let config = dir.join("rocsparse-config.json");
            std::fs::write(&config, ROCSPARSE_CONFIG)?;
            let out = dir.join("rocsparse-recombined");
            warm(&[&shards])?;
            let floor = row_of(
                "rocsparse_shard_cp",
                "floor: cp -a of that shard",
                measure_cp(ctx, ctx.reps, &shard, &out),
                &shard,
                &shard,
                None,
            );
            let runs = measure(
                ctx,
                ctx.reps,
                &shards,
                &out,
                &args![
                    "recombine",
                    "--input-shards-dir",
                    &shards,
                    "--config",
                    &config,
                    "--output-dir",
                    &out,
                    "--json"
                ],
            );
            rows.push(row_of(
                "rocsparse_recombine",
                work,
                runs,
                &shards,
                &out,
                Some(&floor),
            ));
            rows.push(floor);
        }
        remove(&shards)?;
        remove(&dir.join("rocsparse-recombined"))?;
    } else {
        rows.push(Row::unavailable(
            SECTION,
            "rocsparse_recombine",
            work,
            format!("{} is not installed", ROCSPARSE.path),
        ));
    }
    Ok(rows)
}
