//! `kpack split-wheels -j 2` over a synthetic torch-like wheel: several
//! copies of Debian's librocsparse (1.3 GB, seven targets) as
//! `torch/lib/libtorch_hip_<i>.so`, one target's code objects as rocBLAS
//! database files, a MIOpen database, a host-only library and Python
//! files, packed by PyPI's `wheel pack` (deflate). The copies differ in one
//! byte of every code object, so that no two share code objects (split
//! stores a shared one once: identical copies would be compressed once where
//! the floor compresses each). The wheels are built once and kept in
//! `target/bench/cache/`.
//!
//! Floors on the same bytes: `unzip` of the wheel (every split reads it
//! all) and `zstd -3 -T1` over the device code (what split compresses):
//! their sum is the floor of the target (≤ 1.5×); `zip -r` of the unpacked
//! tree (repacking it, once: it is slow) is shown too. Peak RSS ≤ 256 MiB,
//! whatever the wheel's size: a wheel with one copy is split too, and the
//! five-copy wheel's peak must stay within 1.25× of its. Many wheels, one
//! run (`many_row`): the five-copy wheel and a torchvision-like copy of the
//! one-copy wheel in one `split-wheels`, its peak RSS held to the five-copy
//! wheel's alone.

use std::ffi::OsString;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::json;

use super::split_wheels::{split_wheels_args, TORCH};
use crate::args;
use crate::context::Ctx;
use crate::measure::{resident, timed, tree_size, warm, Runs};
use crate::report::{FloorRatio, Row, Stats, Target};
use kpack_testkit::inputs::torch::{rocsparse_wheel, vision_wheel, TorchWheel as Inputs};
use kpack_testkit::tree::remove;

/// Copies of librocsparse in the wheel (its content is then ~6.5 GB and the
/// deflated wheel about 1 GB).
const COPIES: usize = 5;
/// Copies in the small wheel, against which memory must not grow.
const SMALL_COPIES: usize = 1;
/// Most the peak RSS may grow from the small wheel to the large one.
const RSS_GROWTH: f64 = 1.25;
const RSS_LIMIT_MIB: f64 = 256.0;
const TIME_FACTOR: f64 = 1.5;

section!(
    "wheels",
    "kpack split-wheels over a torch-like wheel of several librocsparse copies",
    run
);

pub fn run(ctx: &Ctx) -> Result<Vec<Row>> {
    let small = rocsparse_wheel(&ctx.root, &ctx.work, SMALL_COPIES)?;
    let inputs = rocsparse_wheel(&ctx.root, &ctx.work, COPIES)?;
    let wheel_size = std::fs::metadata(&inputs.wheel)?.len();
    eprintln!(
        "wheel: {} ({:.2} GB)",
        inputs.wheel.display(),
        wheel_size as f64 / 1e9
    );
    let out = ctx.work.join("wheels-out");
    let scratch = ctx.work.join("wheels-tmp");
    let unzipped = ctx.work.join("wheels-unzipped");
    let mut split = Runs::default();
    let mut split_small = Runs::default();
    let mut unzip = Runs::default();
    let mut zstd = Runs::default();
    // The split's outputs, measured before each next run removes them.
    let mut outputs = 0;
    warm(&[&inputs.wheel, &inputs.device])?;
    let small_args = split_wheels_args(&small.wheel, &out, &scratch, TORCH);
    let split_args = split_wheels_args(&inputs.wheel, &out, &scratch, TORCH);
    for rep in 0..ctx.reps {
        eprintln!("  rep {}/{}", rep + 1, ctx.reps);
        remove(&out)?;
        let r = resident(&[&small.wheel]);
        split_small.push(timed(&ctx.kpack, &small_args, &ctx.work)?, r);
        remove(&out)?;
        let r = resident(&[&inputs.wheel]);
        split.push(timed(&ctx.kpack, &split_args, &ctx.work)?, r);
        outputs = tree_size(&out);
        remove(&out)?;
        remove(&unzipped)?;
        let unzip_args = args!["-q", "-o", &inputs.wheel, "-d", &unzipped];
        unzip.push(
            timed(Path::new("unzip"), &unzip_args, &ctx.work)?,
            resident(&[&inputs.wheel]),
        );
        let zstd_cmd = format!(
            "zstd -q -3 -T1 -c {} > /dev/null",
            vec![inputs.device.display().to_string(); COPIES].join(" ")
        );
        zstd.push(
            timed(Path::new("sh"), &args!["-c", &zstd_cmd], &ctx.work)?,
            resident(&[&inputs.device]),
        );
    }
    let zip_cmd = format!(
        "cd {} && zip -q -r {} .",
        unzipped.display(),
        ctx.work.join("rezipped.whl").display()
    );
    let mut zip = Runs::default();
    zip.push(
        timed(Path::new("sh"), &args!["-c", &zip_cmd], &ctx.work)?,
        1.0,
    );
    let content = tree_size(&unzipped);
    remove(&unzipped)?;
    remove(&ctx.work.join("rezipped.whl"))?;
    let summary: serde_json::Value =
        serde_json::from_str(&split.last_stdout).context("split-wheels --json")?;
    let mut v = rows(
        &inputs,
        wheel_size,
        content,
        outputs,
        &summary,
        [&split, &unzip, &zstd, &zip],
    )?;
    v.insert(1, small_row(&small, &split_small, &split)?);
    v.insert(2, many_row(ctx, &small, &inputs, &split, &split_small)?);
    Ok(v)
}

/// Many wheels, one run: the large wheel and a torchvision-like copy of
/// the small one (`torchvision/`, its own name) split by one `split-wheels
/// -j 2` (`--input` twice, `@NAME@` in prefix and overlay root). Peak RSS
/// must stay that of the largest wheel alone (the wheels are split one
/// after the other); the wall time is shown against the two runs alone.
fn many_row(
    ctx: &Ctx,
    small: &Inputs,
    large: &Inputs,
    alone: &Runs,
    small_alone: &Runs,
) -> Result<Row> {
    let vision = vision_wheel(&ctx.root, &ctx.work, &small.wheel)?;
    let out = ctx.work.join("wheels-many-out");
    let scratch = ctx.work.join("wheels-tmp");
    let args: Vec<OsString> = crate::args![
        "split-wheels",
        "--input",
        &large.wheel,
        "--input",
        &vision,
        "--output-dir",
        &out,
        "--device-package-prefix",
        "amd-@NAME@-device",
        "--overlay-root",
        "@NAME@/",
        "--wheel-type",
        "torch-fat",
        "-j",
        "2",
        "--tmp-dir",
        &scratch,
        "--json"
    ]
    .to_vec();
    let mut runs = Runs::default();
    for _ in 0..ctx.reps {
        remove(&out)?;
        let r = resident(&[&large.wheel, &vision]);
        runs.push(timed(&ctx.kpack, &args, &ctx.work)?, r);
    }
    remove(&out)?;
    let mut row = Row::new(
        NAME,
        "split_wheels_many",
        format!(
            "split-wheels -j 2 of two wheels in one run ({COPIES} × and {SMALL_COPIES} × librocsparse)"
        ),
    );
    runs.fill(&mut row);
    row.bytes_in = Some(std::fs::metadata(&large.wheel)?.len() + std::fs::metadata(&vision)?.len());
    let (rss, alone_rss) = (worst_rss_mib(&runs), worst_rss_mib(alone));
    let separate = median(alone) + median(small_alone);
    row.floors = vec![FloorRatio {
        floor: "the two wheels split in separate runs".into(),
        ratio: median(&runs) / separate.max(1e-9),
    }];
    row.targets = vec![
        Target::at_most(
            format!("peak RSS ≤ {RSS_LIMIT_MIB} MiB (worst run)"),
            rss,
            RSS_LIMIT_MIB,
        ),
        Target::at_most(
            format!("peak RSS ≤ {RSS_GROWTH}× the large wheel's alone ({alone_rss:.0} MiB)"),
            rss / alone_rss.max(1.0),
            RSS_GROWTH,
        ),
    ];
    Ok(row)
}

/// The one-copy wheel: peak RSS, against which the large wheel's is held.
fn small_row(small: &Inputs, runs: &Runs, large: &Runs) -> Result<Row> {
    let mut row = Row::new(
        NAME,
        "split_wheels_small",
        format!("split-wheels -j 2, the same wheel with {SMALL_COPIES} × librocsparse"),
    );
    runs.fill(&mut row);
    row.bytes_in = Some(std::fs::metadata(&small.wheel)?.len());
    let (rss, large_rss) = (worst_rss_mib(runs), worst_rss_mib(large));
    row.targets = vec![
        Target::at_most(
            format!("peak RSS ≤ {RSS_LIMIT_MIB} MiB (worst run)"),
            rss,
            RSS_LIMIT_MIB,
        ),
        Target::at_most(
            format!(
                "the {COPIES}-copy wheel's peak RSS ≤ {RSS_GROWTH}× this one's ({large_rss:.0} MiB)"
            ),
            large_rss / rss.max(1.0),
            RSS_GROWTH,
        ),
    ];
    Ok(row)
}

fn worst_rss_mib(runs: &Runs) -> f64 {
    Stats::of(runs.rss.clone()).map_or(0.0, |s| s.max) / 1024.0
}

fn rows(
    inputs: &Inputs,
    wheel_size: u64,
    content: u64,
    outputs: u64,
    summary: &serde_json::Value,
    [split, unzip, zstd, zip]: [&Runs; 4],
) -> Result<Vec<Row>> {
    let device = inputs.device_bytes * COPIES as u64;
    let floor_rows = floor_rows(wheel_size, device, content, [unzip, zstd, zip]);
    let mut row = Row::new(
        NAME,
        "split_wheels",
        format!("split-wheels -j 2, torch-like wheel ({COPIES} × librocsparse + databases)"),
    );
    split.fill(&mut row);
    row.bytes_in = Some(wheel_size);
    row.bytes_out = Some(outputs);
    row.compression_ratio = Some(device as f64 / outputs.max(1) as f64);
    let floor = median(unzip) + median(zstd);
    row.floors = split_floors(median(split), floor, [unzip, zstd, zip]);
    row.targets = split_targets(split, floor);
    row.details = json!({
        "wheel_content_bytes": content,
        "device_code_bytes": device,
        "devices": summary["devices"].as_array().map(|d| d.len()),
        "architectures": summary["architectures"],
        "host_wheel_bytes": summary["host"]["size"],
        "fat_binaries": summary["fat_binaries"],
        "database_files": summary["database_files"],
    });
    let mut v = vec![row];
    v.extend(floor_rows);
    Ok(v)
}

/// The median wall time of `runs` (0 if none).
fn median(runs: &Runs) -> f64 {
    Stats::of(runs.wall.clone()).map_or(0.0, |s| s.median)
}

/// The floor rows: unzip of the wheel, zstd over the device code
/// (`device` bytes), zip of the unpacked wheel (`content` bytes).
fn floor_rows(
    wheel_size: u64,
    device: u64,
    content: u64,
    [unzip, zstd, zip]: [&Runs; 3],
) -> Vec<Row> {
    let mut floor_rows = Vec::new();
    for (id, work, runs, bytes) in [
        (
            "unzip",
            "floor: unzip of the wheel".to_string(),
            unzip,
            wheel_size,
        ),
        (
            "zstd_t1",
            format!("floor: zstd -3 -T1 over the device code ({COPIES} × librocsparse's)"),
            zstd,
            device,
        ),
        (
            "zip",
            "floor: zip -r of the unpacked wheel (one run)".to_string(),
            zip,
            content,
        ),
    ] {
        let mut row = Row::new(NAME, id, work);
        runs.fill(&mut row);
        row.bytes_in = Some(bytes);
        floor_rows.push(row);
    }
    floor_rows
}

/// The split's wall time `wall` over the floors' (`floor`: unzip + zstd
/// -T1).
fn split_floors(wall: f64, floor: f64, [unzip, zstd, zip]: [&Runs; 3]) -> Vec<FloorRatio> {
    vec![
        FloorRatio {
            floor: "unzip + zstd -T1".into(),
            ratio: wall / floor,
        },
        FloorRatio {
            floor: format!("{NAME}.unzip"),
            ratio: wall / median(unzip),
        },
        FloorRatio {
            floor: format!("{NAME}.zstd_t1"),
            ratio: wall / median(zstd),
        },
        FloorRatio {
            floor: "unzip + zip".into(),
            ratio: wall / (median(unzip) + median(zip)),
        },
    ]
}

/// The split's targets: its time against the unzip + zstd -T1 `floor`, and
/// its worst peak RSS.
fn split_targets(split: &Runs, floor: f64) -> Vec<Target> {
    let wall = median(split);
    let rss_mib = worst_rss_mib(split);
    vec![
        Target::at_most(
            format!(
                "≤ {TIME_FACTOR}× the unzip + zstd -T1 floor ({:.1} s)",
                floor * TIME_FACTOR
            ),
            wall,
            floor * TIME_FACTOR,
        ),
        Target::at_most(
            format!("peak RSS ≤ {RSS_LIMIT_MIB} MiB (worst run)"),
            rss_mib,
            RSS_LIMIT_MIB,
        ),
    ]
}
