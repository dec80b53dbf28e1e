//! Fat libraries with a large host part ([`kpack_testkit::inputs::large_host`]: 256 MiB
//! and 1 GiB of incompressible `.rodata` beside about 0.8 MB of device
//! code for four targets, linked by lld), and a torch-like wheel holding
//! the 1 GiB one.
//!
//! For each size, one repetition runs, interleaved: the floor `cp` of the
//! library; `kpack offload`; `kpack restore` of the offloaded library (its
//! archives beside it, as offload writes them); `kpack split` of a
//! TheRock-style artifact holding the library; `kpack pack-tree` of a tree
//! holding it; `kpack prune --targets gfx942`. Targets: peak RSS ≤ 256 MiB
//! for each command, whatever the host size (the 1 GiB library's peak held
//! within 1.25× of the 256 MiB one's), and offload ≤ 2× the `cp`. The
//! wheel: `kpack split-wheels -j 2` (peak RSS ≤ 256 MiB), beside the
//! floors `unzip` of the wheel and `zip -r` of what it unpacks to.

use std::ffi::OsString;
use std::path::Path;

use anyhow::Result;
use serde_json::json;

use super::job::Job;
use super::split_wheels::{split_wheels_args, TORCH};
use crate::args;
use crate::context::Ctx;
use crate::measure::{load_average, note_load, warm};
use crate::report::{FloorRatio, Row, Target};
use kpack_testkit::inputs::large_host::{self, Size, LIB_NAME, SIZES};
use kpack_testkit::tree::{link_or_copy, remove};

const RSS_LIMIT_MIB: f64 = 256.0;
/// Offload against `cp` of its input.
const CP_FACTOR: f64 = 2.0;
/// Most the peak RSS may grow from the 256 MiB host to the 1 GiB one.
const GROWTH: f64 = 1.25;
/// The target `prune` keeps.
const PRUNE_TARGET: &str = "gfx942";

section!(
    "host",
    "offload, restore, split, pack-tree and prune of libraries with 256 MiB and 1 GiB of host code (clang-19, lld-19), and split-wheels of a wheel holding one",
    run
);

pub fn run(ctx: &Ctx) -> Result<Vec<Row>> {
    let mut libs = Vec::new();
    for size in &SIZES {
        match large_host::library(&ctx.root, size) {
            Ok(lib) => libs.push(lib),
            Err(e) => {
                eprintln!("host: not measured: {e:#}");
                let work = format!("offload and the others, {}-host library", size.label);
                return Ok(vec![Row::unavailable(
                    NAME,
                    "offload",
                    work,
                    format!("{e:#}"),
                )]);
            }
        }
    }
    let before = load_average();
    let mut measured = Vec::new();
    for (size, lib) in SIZES.iter().zip(&libs) {
        let dir = ctx.work.join(format!("{NAME}-{}", size.id));
        remove(&dir)?;
        std::fs::create_dir_all(&dir)?;
        let mut jobs = library_jobs(ctx, size, &lib.path, &dir)?;
        warm(&[&lib.path])?;
        Job::run_all(ctx, &mut jobs, &format!("{} host", size.label), &dir)?;
        measured.push((*size, jobs));
    }
    let mut rows = library_rows(&measured);
    match wheel_rows(ctx, &SIZES[1]) {
        Ok(r) => rows.extend(r),
        Err(e) => rows.push(Row::unavailable(
            NAME,
            "split_wheels",
            "split-wheels -j 2, torch-like wheel",
            format!("{e:#}"),
        )),
    }
    note_load(&mut rows, before, load_average());
    Ok(rows)
}

/// The floor and kpack's commands on the library at `lib`, in the order
/// one repetition runs them: `cp`, offload, restore of its output, then
/// the commands over the inputs laid out in `dir`.
fn library_jobs(ctx: &Ctx, size: &Size, lib: &Path, dir: &Path) -> Result<Vec<Job>> {
    let label = size.label;
    let (copied, off, restored) = (
        dir.join("cp.so"),
        dir.join("offload"),
        dir.join("restored.so"),
    );
    let host = off.join(LIB_NAME);
    let offload = args![
        "offload",
        lib,
        "-o",
        &host,
        "--archive-dir",
        off.join(".kpack"),
        "--json"
    ];
    let mut restore = kpack_job(
        ctx,
        "restore",
        format!("restore of the offloaded {label}-host library"),
        &args!["restore", &host, "-o", &restored],
        (&host, &restored),
    );
    restore.then_remove.push(off.clone());
    let mut jobs = vec![
        Job::new(
            "cp",
            format!("floor: cp of the {label}-host library"),
            Path::new("cp"),
            args!["--", lib, &copied].to_vec(),
        )
        .files(lib, &copied, false),
        Job::new(
            "offload",
            format!("offload, {label}-host library"),
            &ctx.kpack,
            offload.to_vec(),
        )
        .files(lib, &off, true)
        .archives(&off.join(".kpack")),
        restore,
    ];
    jobs.extend(tree_jobs(ctx, label, lib, dir)?);
    Ok(jobs)
}

/// split of an artifact holding the library, pack-tree of a tree holding
/// it (both laid out in `dir`, hard links), prune of the library.
fn tree_jobs(ctx: &Ctx, label: &str, lib: &Path, dir: &Path) -> Result<Vec<Job>> {
    let artifact = dir.join("artifacts/large_lib_gfx-all");
    std::fs::create_dir_all(artifact.join("stage/lib"))?;
    std::fs::write(artifact.join("artifact_manifest.txt"), "stage\n")?;
    link_or_copy(lib, &artifact.join("stage/lib").join(LIB_NAME))?;
    let tree = dir.join("tree");
    link_or_copy(lib, &tree.join("lib").join(LIB_NAME))?;
    let (split, packed, pruned) = (
        dir.join("split"),
        dir.join("pack-tree"),
        dir.join("pruned.so"),
    );
    let split_args = args![
        "split",
        "--artifact-dir",
        &artifact,
        "--artifact-prefix",
        "large_lib",
        "--output-dir",
        &split,
        "--json"
    ];
    let pack = args![
        "pack-tree",
        "--input",
        &tree,
        "--output",
        &packed,
        "--group-name",
        "large"
    ];
    let prune = args!["prune", lib, "-o", &pruned, "--targets", PRUNE_TARGET];
    Ok(vec![
        kpack_job(
            ctx,
            "split",
            format!("split, one artifact holding the {label}-host library"),
            &split_args,
            (lib, &split),
        ),
        kpack_job(
            ctx,
            "pack_tree",
            format!("pack-tree, a tree holding the {label}-host library"),
            &pack,
            (lib, &packed),
        ),
        kpack_job(
            ctx,
            "prune",
            format!("prune --targets {PRUNE_TARGET}, {label}-host library"),
            &prune,
            (lib, &pruned),
        ),
    ])
}

/// `kpack ARGS`, reading `input` and writing `out` (removed after each run).
fn kpack_job(
    ctx: &Ctx,
    id: &'static str,
    work: String,
    args: &[OsString],
    (input, out): (&Path, &Path),
) -> Job {
    Job::new(id, work, &ctx.kpack, args.to_vec()).files(input, out, false)
}

/// The rows of both sizes: targets on peak RSS, on offload against `cp`,
/// and on the growth of the peak from the first size to the last.
fn library_rows(measured: &[(Size, Vec<Job>)]) -> Vec<Row> {
    let mut rows = Vec::new();
    let base = &measured[0].1;
    for (i, (size, jobs)) in measured.iter().enumerate() {
        let cp = &jobs[0];
        for job in jobs {
            let mut row = job.row(NAME);
            row.id = format!("{NAME}.{}_{}", job.id, size.id);
            if job.id == "cp" {
                rows.push(row);
                continue;
            }
            row.floors = vec![FloorRatio {
                floor: format!("{NAME}.cp_{}", size.id),
                ratio: job.median() / cp.median(),
            }];
            row.targets.push(job.rss_target(RSS_LIMIT_MIB));
            if job.id == "offload" {
                row.targets.push(Target::at_most(
                    format!("≤ {CP_FACTOR}× cp ({:.2} s)", cp.median() * CP_FACTOR),
                    job.median() / cp.median(),
                    CP_FACTOR,
                ));
            }
            if i > 0 {
                let b = base
                    .iter()
                    .find(|b| b.id == job.id)
                    .map_or(f64::NAN, Job::worst_rss_mib);
                row.targets.push(Target::at_most(
                    format!(
                        "peak RSS ≤ {GROWTH}× the {}-host library's ({b:.0} MiB)",
                        measured[0].0.label
                    ),
                    job.worst_rss_mib() / b,
                    GROWTH,
                ));
            }
            if row.details.is_null() {
                row.details = json!({});
            }
            row.details["rodata_bytes"] = json!(size.rodata_bytes);
            rows.push(row);
        }
    }
    rows
}

/// `split-wheels -j 2` of the torch-like wheel holding the library of
/// `size`, and the floors `unzip` and `zip -r`, interleaved.
fn wheel_rows(ctx: &Ctx, size: &Size) -> Result<Vec<Row>> {
    let lib = large_host::library(&ctx.root, size)?;
    let wheel = large_host::wheel(&ctx.root, &ctx.work, size, &lib)?;
    let dir = ctx.work.join(format!("{NAME}-wheel"));
    remove(&dir)?;
    std::fs::create_dir_all(&dir)?;
    let mut jobs = wheel_jobs(ctx, size, &wheel, &dir);
    warm(&[&wheel])?;
    Job::run_all(ctx, &mut jobs, "wheel", &dir)?;
    let [split, unzip, zip] = &jobs;
    let mut row = split.row(NAME);
    let floor = unzip.median() + zip.median();
    row.floors = vec![FloorRatio {
        floor: "unzip + zip".into(),
        ratio: split.median() / floor,
    }];
    row.targets = vec![split.rss_target(RSS_LIMIT_MIB)];
    Ok(vec![row, unzip.row(NAME), zip.row(NAME)])
}

/// split-wheels of `wheel`, then `unzip` of it and `zip -r` of what it
/// unpacked to; their files in `dir`.
fn wheel_jobs(ctx: &Ctx, size: &Size, wheel: &Path, dir: &Path) -> [Job; 3] {
    let (out, unzipped, rezipped) = (
        dir.join("out"),
        dir.join("unzipped"),
        dir.join("rezipped.whl"),
    );
    let split = kpack_job(
        ctx,
        "split_wheels",
        format!(
            "split-wheels -j 2, torch-like wheel holding the {}-host library",
            size.label
        ),
        &split_wheels_args(wheel, &out, &dir.join("tmp"), TORCH),
        (wheel, &out),
    );
    let unzip = Job::new(
        "unzip",
        "floor: unzip of the wheel".into(),
        Path::new("unzip"),
        args!["-q", "-o", wheel, "-d", &unzipped].to_vec(),
    )
    .files(wheel, &unzipped, true);
    let zip_cmd = format!(
        "cd {} && zip -q -r {} .",
        unzipped.display(),
        rezipped.display()
    );
    let mut zip = Job::new(
        "zip",
        "floor: zip -r of the unpacked wheel".into(),
        Path::new("sh"),
        args!["-c", zip_cmd].to_vec(),
    )
    .files(&unzipped, &rezipped, false);
    zip.then_remove.push(unzipped);
    [split, unzip, zip]
}
