//! pack-tree and recombine: over the end-to-end fixture tree (the
//! tutorial's three shards of `kpack_testkit::shards`, the tree the
//! pipeline tests use, laid out from the fixtures), and over real-size
//! inputs (a tree holding librocrand; the split of librocsparse as one
//! shard).

use std::path::Path;

use anyhow::Result;
use kpack_testkit::shards::{self, PACKAGING_CONFIG, SHARDS, SPLIT_DATABASES};
use kpack_testkit::tree::{self, symlink};
use serde_json::json;
use xshell::Shell;

use crate::args;
use crate::bench::{
    link_or_copy, remove, resident, timed, tree_size, warm, Ctx, FloorRatio, Row, Runs,
};
use crate::bench_libs::{make_artifact, ROCRAND, ROCSPARSE};
use crate::fixtures;

const SECTION: &str = "pipeline";

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

fn write(path: &Path, text: &str) -> Result<()> {
    tree::write(path, text.as_bytes(), 0o644)
}

/// The fixture tree: the fixtures (built when missing or out of date),
/// laid out as the tutorial's shards under `root`.
fn make_fixture_shards(ctx: &Ctx, root: &Path) -> Result<()> {
    let sh = Shell::new()?;
    sh.change_dir(&ctx.root);
    fixtures::build_all(&sh, &ctx.root, false)?;
    shards::make_shards(&ctx.root.join(fixtures::FIXTURES_DIR), root)
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
    let shards = dir.join("shards");
    match make_fixture_shards(ctx, &shards) {
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
        Ok(()) => {
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
                                SPLIT_DATABASES[0],
                                SPLIT_DATABASES[1],
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
            std::fs::write(&config, PACKAGING_CONFIG)?;
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
            shards::install(&shards::artifacts(&shards.join(SHARDS[0].0))?, &tree)?;
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
