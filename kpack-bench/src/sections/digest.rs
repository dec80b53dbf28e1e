//! Section `digest`: what checking code objects against their TOC digests
//! on load costs (`ROCM_KPACK_VERIFY_DIGEST`). librocrand offloaded (its
//! archives carry `code_object_sha256`); every code object of one target
//! loaded through the runtime's loader (the search `kpack_load_code_object`
//! runs), archives open and warm, without and with the check. Rows: the
//! time to load them all, each way; the second row's floor is the first.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};

use crate::context::Ctx;
use crate::report::{FloorRatio, Row, Stats};
use kpack_host::offload::{offload, verify_file, OffloadOptions};
use kpack_loader::{Config, Loader};
use kpack_testkit::inputs::rocm::ROCRAND;
use kpack_testkit::tree::remove;

section!(
    "digest",
    "loads through the runtime's loader with and without ROCM_KPACK_VERIFY_DIGEST's check",
    run
);

/// The target whose code objects are loaded.
const TARGET: &str = "gfx1030";
/// Passes over every code object per repetition (the median is kept).
const PASSES: usize = 5;

pub fn run(ctx: &Ctx) -> Result<Vec<Row>> {
    if !Path::new(ROCRAND.path).is_file() {
        return Ok(vec![Row::not_installed(
            NAME,
            "load",
            "load with and without digest checks",
            ROCRAND.path,
        )]);
    }
    let dir = ctx.work.join(NAME);
    remove(&dir)?;
    std::fs::create_dir_all(&dir)?;
    let bin = dir.join(ROCRAND.file_name());
    offload(
        Path::new(ROCRAND.path),
        &bin,
        &OffloadOptions::new(dir.join("arch")),
    )?;
    let v = verify_file(&bin)?;
    let metadata = v.metadata.encode();
    let mut cos: Vec<u32> = v
        .co_indices
        .iter()
        .filter_map(|&c| c.try_into().ok())
        .collect();
    cos.sort_unstable();
    cos.dedup();
    let mut rows = Vec::new();
    let mut plain = f64::NAN;
    for (id, verify) in [("load", false), ("load_verified", true)] {
        let loader = Loader::new(Config {
            verify_digest: verify,
            ..Config::default()
        });
        let load_all = || -> Result<u64> {
            let mut bytes = 0;
            for &co in &cos {
                let b = loader
                    .load_code_object(&metadata, &bin, co, &[TARGET])
                    .with_context(|| format!("loading #{co} for {TARGET}"))?;
                bytes += b.len() as u64;
            }
            Ok(bytes)
        };
        let bytes = load_all()?;
        let mut runs = Vec::with_capacity(ctx.reps);
        for _ in 0..ctx.reps {
            let mut t = Vec::with_capacity(PASSES);
            for _ in 0..PASSES {
                let t0 = Instant::now();
                load_all()?;
                t.push(t0.elapsed().as_secs_f64());
            }
            runs.push(Stats::of(t).map_or(f64::NAN, |s| s.median));
        }
        let check = if verify { "checked against" } else { "without" };
        let work = format!(
            "load librocrand's {} code objects for {TARGET} ({:.1} MB), {check} their SHA-256 digests",
            cos.len(),
            bytes as f64 / 1e6
        );
        let mut row = Row::new(NAME, id, work);
        row.wall_s = Stats::of(runs);
        row.bytes_out = Some(bytes);
        match verify {
            false => plain = row.wall().unwrap_or(f64::NAN),
            true => {
                if let Some(w) = row.wall() {
                    row.floors.push(FloorRatio {
                        floor: format!("{NAME}.load"),
                        ratio: w / plain,
                    });
                }
            }
        }
        rows.push(row);
    }
    if !ctx.keep_work {
        remove(&dir)?;
    }
    Ok(rows)
}
