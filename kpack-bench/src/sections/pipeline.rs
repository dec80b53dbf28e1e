//! pack-tree and recombine: over the end-to-end fixture tree (the
//! tutorial's three shards of `kpack_testkit::shards`, the tree the
//! pipeline tests use, laid out from the fixtures), and over real-size
//! inputs (a tree holding librocrand; the split of librocsparse as one
//! shard).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use kpack_testkit::fixtures::FIXTURES_DIR;
use kpack_testkit::manifest;
use kpack_testkit::shards::{self, PACKAGING_CONFIG, SHARDS, SPLIT_DATABASES};
use kpack_testkit::tree::{self, symlink};
use serde_json::json;

use crate::args;
use crate::context::Ctx;
use crate::measure::{resident, timed, tree_size, warm, Run, Runs};
use crate::report::{FloorRatio, Row};
use kpack_testkit::inputs::rocm::make_artifact;
use kpack_testkit::inputs::rocm::{ROCRAND, ROCSPARSE};
use kpack_testkit::tree::{link_or_copy, remove};

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

/// Where the fixtures are: `$KPACK_FIXTURES_DIR`, else `target/fixtures`
/// (`cargo xtask bench` builds them there first).
fn fixtures_dir(ctx: &Ctx) -> PathBuf {
    std::env::var_os("KPACK_FIXTURES_DIR")
        .map_or_else(|| ctx.root.join(FIXTURES_DIR), PathBuf::from)
}

/// The fixture tree: the fixtures laid out as the tutorial's shards under
/// `root`.
fn make_fixture_shards(ctx: &Ctx, root: &Path) -> Result<()> {
    let fixtures = fixtures_dir(ctx);
    if !fixtures.join(manifest::FILE_NAME).is_file() {
        bail!(
            "no fixtures in {} (`cargo xtask fixtures` builds them)",
            fixtures.display()
        );
    }
    shards::make_shards(&fixtures, root)
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
        Err(e) => Row::unavailable(NAME, id, work, format!("{e:#}")),
        Ok(runs) => {
            let mut row = Row::new(NAME, id, work);
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

/// `kpack pack-tree` of `tree` into `out`, group `group`.
fn pack_tree_args(tree: &Path, out: &Path, group: &str) -> [OsString; 8] {
    args![
        "pack-tree",
        "--input",
        tree,
        "--output",
        out,
        "--group-name",
        group,
        "--json"
    ]
}

/// `kpack recombine` of the shards under `shards` into `out`.
fn recombine_args(shards: &Path, config: &Path, out: &Path) -> [OsString; 8] {
    args![
        "recombine",
        "--input-shards-dir",
        shards,
        "--config",
        config,
        "--output-dir",
        out,
        "--json"
    ]
}

/// A kpack command measured against its floor, `cp -a` of `copied`.
struct AgainstCp<'a> {
    id: &'a str,
    work: &'a str,
    floor_id: &'a str,
    floor_work: &'a str,
    /// What the floor copies (into `out`).
    copied: &'a Path,
    /// kpack's input and output.
    input: &'a Path,
    out: &'a Path,
}

/// Warm the input, measure the floor, then `kpack <args>` (`ctx.reps`
/// runs each): the command's row, then the floor's.
fn against_cp(ctx: &Ctx, m: &AgainstCp, args: &[OsString]) -> Result<Vec<Row>> {
    warm(&[m.input])?;
    let floor = row_of(
        m.floor_id,
        m.floor_work,
        measure_cp(ctx, ctx.reps, m.copied, m.out),
        m.copied,
        m.copied,
        None,
    );
    let runs = measure(ctx, ctx.reps, m.input, m.out, args);
    let row = row_of(m.id, m.work, runs, m.input, m.out, Some(&floor));
    Ok(vec![row, floor])
}

/// One split of every fixture shard: the sum of the shards' times, the
/// largest of their peak RSS.
fn split_fixture_shards(ctx: &Ctx, shards: &Path, split: &Path) -> Result<Run> {
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
    Ok(Run {
        wall,
        cpu,
        rss_kib: rss,
        stdout: String::new(),
    })
}

/// Split every shard `reps` times (measured too: small, but the whole map
/// phase), removing `split` before each run.
fn measure_fixture_split(ctx: &Ctx, reps: usize, shards: &Path, split: &Path) -> Result<Runs> {
    let mut all = Runs::default();
    warm(&[shards])?;
    for _ in 0..reps {
        remove(split)?;
        let r = resident(&[shards]);
        all.push(split_fixture_shards(ctx, shards, split)?, r);
    }
    Ok(all)
}

/// Recombine of the fixture split (when the split worked).
fn fixture_recombine(
    ctx: &Ctx,
    reps: usize,
    dir: &Path,
    split: &Path,
    split_ok: bool,
) -> Result<Row> {
    let config = dir.join("packaging-config.json");
    std::fs::write(&config, PACKAGING_CONFIG)?;
    let out = dir.join("recombined");
    let work = "recombine fixture shards (3 groups)";
    let runs = if split_ok {
        measure(
            ctx,
            reps,
            split,
            &out,
            &recombine_args(split, &config, &out),
        )
    } else {
        Err(anyhow::anyhow!("split of the fixture shards failed"))
    };
    Ok(row_of("fixture_recombine", work, runs, split, &out, None))
}

/// pack-tree of the first fixture shard's artifacts, installed.
fn fixture_pack_tree(ctx: &Ctx, reps: usize, dir: &Path, shards_dir: &Path) -> Result<Row> {
    let tree = dir.join("tree");
    shards::install(&shards::artifacts(&shards_dir.join(SHARDS[0].0))?, &tree)?;
    let out = dir.join("packed");
    let work = "pack-tree fixture install tree (gfx110X shard installed)";
    let runs = measure(
        ctx,
        reps,
        &tree,
        &out,
        &pack_tree_args(&tree, &out, "fixture"),
    );
    Ok(row_of("fixture_pack_tree", work, runs, &tree, &out, None))
}

/// The end-to-end fixture tree: split, recombine and pack-tree (or why
/// they are not available).
fn fixture_rows(ctx: &Ctx, dir: &Path) -> Result<Vec<Row>> {
    // Small inputs: more runs (they take milliseconds).
    let reps = ctx.reps.max(5);
    let shards_dir = dir.join("shards");
    if let Err(e) = make_fixture_shards(ctx, &shards_dir) {
        let why = format!("{e:#}");
        return Ok([
            ("fixture_split", "split fixture shards (3 shards, batch)"),
            ("fixture_recombine", "recombine fixture shards"),
            ("fixture_pack_tree", "pack-tree fixture install tree"),
        ]
        .into_iter()
        .map(|(id, work)| Row::unavailable(NAME, id, work, why.clone()))
        .collect());
    }
    let split = dir.join("split");
    let work = "split fixture shards (3 shards, batch)";
    let runs = measure_fixture_split(ctx, reps, &shards_dir, &split);
    let split_ok = runs.is_ok();
    Ok(vec![
        row_of("fixture_split", work, runs, &shards_dir, &split, None),
        fixture_recombine(ctx, reps, dir, &split, split_ok)?,
        fixture_pack_tree(ctx, reps, dir, &shards_dir)?,
    ])
}

/// A tree holding librocrand (linked or copied), its soname link and a
/// header, in `tree`.
fn make_rocrand_tree(tree: &Path) -> Result<()> {
    let lib = tree.join("lib").join(ROCRAND.file_name());
    link_or_copy(Path::new(ROCRAND.path), &lib)?;
    symlink(ROCRAND.file_name(), &tree.join("lib/librocrand.so.1"))?;
    write(&tree.join("include/rocrand/rocrand.h"), "/* rocRAND */\n")
}

/// Real size: pack-tree over a tree holding librocrand, against `cp -a`.
fn rocrand_rows(ctx: &Ctx, dir: &Path) -> Result<Vec<Row>> {
    let work = "pack-tree, tree holding librocrand";
    if !Path::new(ROCRAND.path).is_file() {
        return Ok(vec![Row::not_installed(
            NAME,
            "rocrand_pack_tree",
            work,
            ROCRAND.path,
        )]);
    }
    let tree = dir.join("rocrand-tree");
    make_rocrand_tree(&tree)?;
    let out = dir.join("rocrand-packed");
    let m = AgainstCp {
        id: "rocrand_pack_tree",
        work,
        floor_id: "rocrand_tree_cp",
        floor_work: "floor: cp -a of that tree",
        copied: &tree,
        input: &tree,
        out: &out,
    };
    let rows = against_cp(ctx, &m, &pack_tree_args(&tree, &out, "rand"))?;
    remove(&out)?;
    Ok(rows)
}

/// `kpack split` of librocsparse's artifact into `shard`.
fn split_rocsparse(ctx: &Ctx, dir: &Path, shard: &Path) -> Result<Result<Run>> {
    let artifact = make_artifact(&ROCSPARSE, &dir.join("rocsparse-artifacts"))?;
    eprintln!("splitting librocsparse for the recombine input");
    Ok(timed(
        &ctx.kpack,
        &args![
            "split",
            "--artifact-dir",
            &artifact,
            "--artifact-prefix",
            ROCSPARSE.artifact_prefix,
            "--output-dir",
            shard
        ],
        &ctx.work,
    ))
}

/// Real size: recombine of librocsparse's split as one shard, against
/// `cp -a` of that shard.
fn rocsparse_rows(ctx: &Ctx, dir: &Path) -> Result<Vec<Row>> {
    let work = "recombine librocsparse's split (1 shard, 3 groups)";
    if !Path::new(ROCSPARSE.path).is_file() {
        return Ok(vec![Row::not_installed(
            NAME,
            "rocsparse_recombine",
            work,
            ROCSPARSE.path,
        )]);
    }
    let shards_dir = dir.join("rocsparse-shards");
    let shard = shards_dir.join("rocsparse-build");
    let out = dir.join("rocsparse-recombined");
    let rows = if let Err(e) = split_rocsparse(ctx, dir, &shard)? {
        let why = format!("split failed: {e:#}");
        vec![Row::unavailable(NAME, "rocsparse_recombine", work, why)]
    } else {
        let config = dir.join("rocsparse-config.json");
        std::fs::write(&config, ROCSPARSE_CONFIG)?;
        let m = AgainstCp {
            id: "rocsparse_recombine",
            work,
            floor_id: "rocsparse_shard_cp",
            floor_work: "floor: cp -a of that shard",
            copied: &shard,
            input: &shards_dir,
            out: &out,
        };
        against_cp(ctx, &m, &recombine_args(&shards_dir, &config, &out))?
    };
    remove(&shards_dir)?;
    remove(&out)?;
    Ok(rows)
}

section!(
    "pipeline",
    "pack-tree and recombine over the end-to-end fixture tree, and over real-size inputs (a tree holding librocrand, the split of librocsparse)",
    run
);

/// The section's rows: the fixture tree, then the real-size inputs.
pub fn run(ctx: &Ctx) -> Result<Vec<Row>> {
    let dir = ctx.work.join(NAME);
    remove(&dir)?;
    std::fs::create_dir_all(&dir)?;
    let mut rows = fixture_rows(ctx, &dir)?;
    rows.extend(rocrand_rows(ctx, &dir)?);
    rows.extend(rocsparse_rows(ctx, &dir)?);
    Ok(rows)
}
