//! The runtime, measured through the C API as users get it:
//! `xtask/bench/kpack_bench.c` compiled against the release
//! `librocm_kpack.a`.
//!
//! Archives: librocsparse's per-target archives (`kpack offload`), one
//! archive holding all of librocsparse's code objects (every target;
//! written here with `ArchiveWriter`, keys `librocsparse.so.0.1#N`), and
//! librocrand's per-target archives (for the 1.7 MB code object).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use kpack_core::archive::ArchiveWriter;
use kpack_core::hipk::HipkMetadata;
use kpack_core::msgpack::Value;
use kpack_testkit::cprog::Program;
use serde_json::json;

use crate::args;
use crate::bench::{fmt_bytes, remove, resident, timed, warm, Ctx, FloorRatio, Row, Stats, Target};
use crate::bench_libs::{ROCRAND, ROCSPARSE};

const SECTION: &str = "runtime";

/// The librocrand code object of the warm-load target (1.7 MB).
const WARM_TARGET_SIZE: usize = 1_716_776;

/// A code object chosen for a measurement.
#[derive(Debug, Clone)]
struct Pick {
    bundle: usize,
    target: String,
    size: usize,
}

impl Pick {
    fn agent(&self) -> String {
        format!("amdgcn-amd-amdhsa--{}", self.target)
    }
}

/// The code objects of a fat binary: (bundle, target, size), sorted by
/// size (then bundle, target).
fn sizes(path: &Path) -> Result<Vec<Pick>> {
    let mapped = kpack_core::input::map_file(path)?;
    let cos = kpack_core::offload::code_objects(path, &mapped)?;
    let mut v: Vec<Pick> = cos
        .iter()
        .map(|c| Pick {
            bundle: c.bundle,
            target: c.target.clone(),
            size: c.data.len(),
        })
        .collect();
    v.sort_by(|a, b| (a.size, a.bundle, &a.target).cmp(&(b.size, b.bundle, &b.target)));
    Ok(v)
}

/// One archive with every code object of `input`, keys `<name>#N`.
fn write_all_targets(input: &Path, name: &str, out: &Path) -> Result<(u64, f64)> {
    let mapped = kpack_core::input::map_file(input)?;
    let cos = kpack_core::offload::code_objects(input, &mapped)?;
    let mut targets: Vec<String> = cos.iter().map(|c| c.target.clone()).collect();
    targets.sort();
    targets.dedup();
    let group = name.split('.').next().unwrap_or(name).to_string();
    let mut w = ArchiveWriter::new(group, "all", targets);
    for c in &cos {
        w.add(
            kpack_core::offload::archive_key(name, c.bundle),
            c.target.clone(),
            c.source(&mapped),
            Some(vec![("target".to_string(), Value::from(c.triple.as_str()))]),
        )?;
    }
    let t0 = Instant::now();
    let s = w.write(out)?;
    Ok((s.bytes_out, t0.elapsed().as_secs_f64()))
}

/// The bytes of code object (bundle, target) of `path`.
fn code_object(path: &Path, pick: &Pick) -> Result<Vec<u8>> {
    let mapped = kpack_core::input::map_file(path)?;
    let cos = kpack_core::offload::code_objects(path, &mapped)?;
    cos.iter()
        .find(|c| c.bundle == pick.bundle && c.target == pick.target)
        .map(|c| c.data.to_vec())
        .context("code object not found")
}

/// The floor of a load: decompressing the code object's zstd frame (level
/// 3, content size and checksum, as the archive writer makes it) with the
/// same zstd library, one reused context and output buffer. Per run, the
/// median of `iterations`. (`checksum` false: a frame without the content
/// checksum, to show what verifying it costs.)
fn decompress_floor(
    data: &[u8],
    checksum: bool,
    reps: usize,
    iterations: usize,
) -> Result<Vec<f64>> {
    let mut c = zstd::bulk::Compressor::new(3)?;
    c.include_checksum(checksum)?;
    c.include_contentsize(true)?;
    let frame = c.compress(data)?;
    let mut d = zstd::bulk::Decompressor::new()?;
    let mut buf = Vec::with_capacity(data.len());
    let mut runs = Vec::new();
    for _ in 0..reps {
        let mut t = Vec::with_capacity(iterations);
        for _ in 0..iterations {
            buf.clear();
            let t0 = Instant::now();
            d.decompress_to_buffer(&frame[..], &mut buf)?;
            t.push(t0.elapsed().as_secs_f64());
        }
        if buf != data {
            bail!("zstd round trip differs");
        }
        runs.push(Stats::of(t).map_or(f64::NAN, |s| s.median));
    }
    Ok(runs)
}

fn write_metadata(path: &Path, kernel_name: &str, search_path: &str) -> Result<()> {
    let m = HipkMetadata {
        kernel_name: kernel_name.to_string(),
        search_paths: vec![search_path.to_string()],
    };
    std::fs::write(path, m.encode())?;
    Ok(())
}

/// Figures printed by the C program: name → (median, p10, p90, min, max,
/// n, bytes), times in µs.
fn parse_lines(out: &str) -> Vec<(String, Vec<f64>)> {
    out.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let name = it.next()?.to_string();
            let v: Vec<f64> = it.filter_map(|x| x.parse().ok()).collect();
            Some((name, v))
        })
        .collect()
}

fn run_c(exe: &Path, args: &[std::ffi::OsString]) -> Result<String> {
    let out = Command::new(exe)
        .args(args)
        .output()
        .with_context(|| format!("running {}", exe.display()))?;
    if !out.status.success() {
        bail!(
            "{} {:?} failed ({}): {}",
            exe.display(),
            args,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The C program, built against the release static library.
fn build_program(ctx: &Ctx, dir: &Path) -> Result<PathBuf> {
    let exe = dir.join("kpack_bench");
    let lib = ctx.root.join("target/release/librocm_kpack.a");
    if !lib.is_file() {
        bail!("{} missing", lib.display());
    }
    let mut c = Program::c("c11");
    c.strict()
        .cc()
        .opt_level(2)
        .debug(false)
        .include(ctx.root.join("kpack-cxx/include"));
    c.input(ctx.root.join("xtask/bench/kpack_bench.c"))
        .static_runtime(&lib)
        .link(&exe)?;
    Ok(exe)
}

/// A latency configuration: which code object, through which metadata.
struct Latency<'a> {
    label: &'a str,
    /// Archive opened by open+close.
    archive: &'a Path,
    meta: &'a Path,
    binary: &'a Path,
    pick: &'a Pick,
    iterations: usize,
}

/// Per-figure medians of each run (µs), and the last run's lines.
type Figures = Vec<(String, Vec<f64>)>;

fn latency(exe: &Path, reps: usize, l: &Latency) -> Result<(Figures, String)> {
    let mut per: Vec<(String, Vec<f64>)> = Vec::new();
    let mut last = String::new();
    for _ in 0..reps {
        let out = run_c(
            exe,
            &args![
                "latency",
                l.archive,
                l.meta,
                l.binary,
                l.pick.agent(),
                l.pick.bundle.to_string(),
                l.iterations.to_string()
            ],
        )?;
        for (name, v) in parse_lines(&out) {
            let median = v.first().copied().unwrap_or(f64::NAN);
            match per.iter_mut().find(|(n, _)| *n == name) {
                Some((_, runs)) => runs.push(median),
                None => per.push((name, vec![median])),
            }
        }
        last = out;
    }
    Ok((per, last))
}

fn figure(f: &Figures, name: &str) -> Option<Stats> {
    f.iter()
        .find(|(n, _)| n == name)
        .and_then(|(_, v)| Stats::of(v.iter().map(|us| us / 1e6).collect()))
}

fn latency_row(
    id: &str,
    work: String,
    figures: &Figures,
    name: &str,
    last: &str,
    size: usize,
) -> Row {
    let mut row = Row::new(SECTION, id, work);
    row.wall_s = figure(figures, name);
    row.bytes_out = Some(size as u64);
    let line = last
        .lines()
        .find(|l| l.starts_with(&format!("{name} ")))
        .unwrap_or_default();
    row.details = json!({"last_run": line, "fields": "name median p10 p90 min max n bytes (µs)"});
    row
}

pub fn run(ctx: &Ctx) -> Result<Vec<Row>> {
    for p in [ROCSPARSE.path, ROCRAND.path] {
        if !Path::new(p).is_file() {
            return Ok(vec![Row::unavailable(
                SECTION,
                "all",
                "runtime",
                format!("{p} is not installed"),
            )]);
        }
    }
    let dir = ctx.work.join(SECTION);
    remove(&dir)?;
    std::fs::create_dir_all(&dir)?;
    let exe = build_program(ctx, &dir)?;
    let sparse = Path::new(ROCSPARSE.path);
    let sparse_name = ROCSPARSE.file_name();
    let rand_name = ROCRAND.file_name();

    // Per-target archives, as kpack offload writes them.
    let sd = dir.join("sparse");
    let rd = dir.join("rand");
    eprintln!("runtime: offloading librocsparse and librocrand");
    for (input, d, name) in [
        (sparse, &sd, sparse_name),
        (Path::new(ROCRAND.path), &rd, rand_name),
    ] {
        timed(
            &ctx.kpack,
            &args![
                "offload",
                input,
                "-o",
                d.join(name),
                "--archive-dir",
                d.join("arch")
            ],
            &dir,
        )?;
    }
    eprintln!("runtime: writing one archive with all of librocsparse's code objects");
    let all = sd.join("librocsparse_all.kpack");
    let (all_size, all_write_s) = write_all_targets(sparse, sparse_name, &all)?;
    let per_target = |d: &Path, group: &str, target: &str| {
        d.join("arch")
            .join(kpack_core::offload::archive_file_name(group, target))
    };

    let cos = sizes(sparse)?;
    let median = cos[cos.len() / 2].clone();
    let largest = cos[cos.len() - 1].clone();
    let rand_cos = sizes(Path::new(ROCRAND.path))?;
    let warm_pick = rand_cos
        .iter()
        .min_by_key(|c| c.size.abs_diff(WARM_TARGET_SIZE))
        .context("librocrand has no code objects")?
        .clone();
    let device_bytes: usize = cos.iter().map(|c| c.size).sum();

    let meta_all = dir.join("meta-all");
    write_metadata(&meta_all, sparse_name, &all.display().to_string())?;
    let meta_pt = dir.join("meta-per-target");
    write_metadata(
        &meta_pt,
        sparse_name,
        &format!("{}/librocsparse_@GFXARCH@.kpack", sd.join("arch").display()),
    )?;
    let meta_rand = dir.join("meta-rand");
    write_metadata(
        &meta_rand,
        rand_name,
        &format!("{}/librocrand_@GFXARCH@.kpack", rd.join("arch").display()),
    )?;
    let sparse_bin = sd.join(sparse_name);
    let rand_bin = rd.join(rand_name);
    let pt_archives: Vec<PathBuf> = {
        let mut v: Vec<PathBuf> = std::fs::read_dir(sd.join("arch"))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "kpack"))
            .collect();
        v.sort();
        v
    };
    warm(&[&sd, &rd])?;

    let mut rows = Vec::new();
    let all_desc = format!(
        "all-targets archive ({} kernels, {})",
        cos.len(),
        fmt_bytes(all_size as f64)
    );
    let median_pt = per_target(&sd, "librocsparse", &median.target);
    let largest_pt = per_target(&sd, "librocsparse", &largest.target);
    let rand_pt = per_target(&rd, "librocrand", &warm_pick.target);
    let configs = [
        (
            "all_median",
            Latency {
                label: "median code object",
                archive: &all,
                meta: &meta_all,
                binary: &sparse_bin,
                pick: &median,
                iterations: 200,
            },
        ),
        (
            "all_largest",
            Latency {
                label: "largest code object",
                archive: &all,
                meta: &meta_all,
                binary: &sparse_bin,
                pick: &largest,
                iterations: 20,
            },
        ),
        (
            "pt_median",
            Latency {
                label: "median code object",
                archive: &median_pt,
                meta: &meta_pt,
                binary: &sparse_bin,
                pick: &median,
                iterations: 200,
            },
        ),
        (
            "pt_largest",
            Latency {
                label: "largest code object",
                archive: &largest_pt,
                meta: &meta_pt,
                binary: &sparse_bin,
                pick: &largest,
                iterations: 20,
            },
        ),
        (
            "rand",
            Latency {
                label: "librocrand code object",
                archive: &rand_pt,
                meta: &meta_rand,
                binary: &rand_bin,
                pick: &warm_pick,
                iterations: 100,
            },
        ),
    ];
    // Floors: the decompression alone of each code object measured.
    let mut floors: Vec<(String, Row)> = Vec::new();
    for (id, pick, bin, iterations) in [
        ("decompress_median", &median, sparse, 200),
        ("decompress_largest", &largest, sparse, 20),
        ("decompress_rand", &warm_pick, Path::new(ROCRAND.path), 100),
    ] {
        eprintln!("runtime: {id}");
        let data = code_object(bin, pick)?;
        let mut row = Row::new(
            SECTION,
            id,
            format!(
                "floor: zstd decompression alone (same library, reused context), {} #{} ({})",
                pick.target,
                pick.bundle,
                fmt_bytes(pick.size as f64)
            ),
        );
        row.wall_s = Stats::of(decompress_floor(&data, true, ctx.reps, iterations)?);
        row.bytes_out = Some(pick.size as u64);
        row.details = json!({
            "without_content_checksum_s":
                Stats::of(decompress_floor(&data, false, ctx.reps, iterations)?),
        });
        floors.push((format!("{}#{}", pick.target, pick.bundle), row));
    }
    let floor_of = |pick: &Pick, row: &Row| -> Vec<FloorRatio> {
        let key = format!("{}#{}", pick.target, pick.bundle);
        floors
            .iter()
            .filter(|(k, _)| *k == key)
            .filter_map(|(_, f)| {
                Some(FloorRatio {
                    floor: f.id.clone(),
                    ratio: row.wall()? / f.wall()?,
                })
            })
            .collect()
    };

    for (id, l) in &configs {
        eprintln!("runtime: latency {id}");
        let resident_before = resident(&[l.archive]);
        let (where_, is_all) = match *id {
            "all_median" | "all_largest" => (all_desc.clone(), true),
            "rand" => ("librocrand per-target archive".to_string(), false),
            _ => ("librocsparse per-target archive".to_string(), false),
        };
        let (f, last) = latency(&exe, ctx.reps, l)?;
        let co = format!(
            "{} ({}, {} #{})",
            l.label,
            fmt_bytes(l.pick.size as f64),
            l.pick.target,
            l.pick.bundle
        );
        if *id == "all_median" || *id == "pt_median" {
            let mut r = latency_row(
                &format!("{id}_open_close"),
                format!(
                    "kpack_open + kpack_close, {}",
                    if is_all {
                        &all_desc
                    } else {
                        "per-target archive"
                    }
                ),
                &f,
                "open_close",
                &last,
                0,
            );
            r.bytes_out = None;
            r.bytes_in = std::fs::metadata(l.archive).ok().map(|m| m.len());
            rows.push(r);
        }
        let mut cold = latency_row(
            &format!("{id}_cold"),
            format!("cold first load (create+load+destroy), {co}, {where_}"),
            &f,
            "cold_load",
            &last,
            l.pick.size,
        );
        cold.floors = floor_of(l.pick, &cold);
        cold.input_resident = Some(resident_before);
        if *id == "all_median" {
            if let Some(w) = cold.wall() {
                cold.targets.push(Target::at_most("≤ 2 ms", w, 2e-3));
            }
        }
        rows.push(cold);
        let mut warm_row = latency_row(
            &format!("{id}_warm"),
            format!("warm load, {co}, {where_}"),
            &f,
            "warm_load",
            &last,
            l.pick.size,
        );
        warm_row.floors = floor_of(l.pick, &warm_row);
        warm_row.input_resident = Some(resident_before);
        if *id == "rand" {
            if let Some(w) = warm_row.wall() {
                warm_row
                    .targets
                    .push(Target::at_most("≤ 1.1 ms", w, 1.1e-3));
            }
        }
        rows.push(warm_row);
    }
    rows.extend(floors.into_iter().map(|(_, r)| r));

    // kpack_get_kernel over every kernel.
    for (id, work, archives) in [
        (
            "get_all_all",
            format!("kpack_get_kernel × every kernel, {all_desc}"),
            vec![all.clone()],
        ),
        (
            "get_all_pt",
            format!(
                "kpack_get_kernel × every kernel, {} per-target archives",
                pt_archives.len()
            ),
            pt_archives.clone(),
        ),
    ] {
        eprintln!("runtime: {id}");
        // One pass per process (a fresh kpack_open each time), `reps` processes.
        let mut a = args!["get-all", "1"].to_vec();
        a.extend(archives.iter().map(std::ffi::OsString::from));
        let mut passes = Vec::new();
        let (mut each, mut bytes) = (Vec::new(), None);
        for _ in 0..ctx.reps {
            let lines = parse_lines(&run_c(&exe, &a)?);
            for (k, v) in lines {
                match k.as_str() {
                    "get_kernel_all" => {
                        passes.push(v.first().copied().unwrap_or(f64::NAN) / 1e6);
                        bytes = v.get(6).map(|b| *b as u64);
                    }
                    "get_kernel_each" => each = v,
                    _ => {}
                }
            }
        }
        let mut row = Row::new(SECTION, id, work);
        row.wall_s = Stats::of(passes);
        row.bytes_in = archives
            .iter()
            .map(|p| std::fs::metadata(p).map(|m| m.len()).ok())
            .sum();
        row.bytes_out = bytes;
        row.details = json!({
            "kernels": each.get(6),
            "per_call_median_us": each.first(),
            "per_call_p10_us": each.get(1),
            "per_call_p90_us": each.get(2),
            "per_call_max_us": each.get(4),
        });
        rows.push(row);
    }

    // Memory of a loader process after one load.
    for (id, pick, meta, where_) in [
        ("mem_all_median", &median, &meta_all, all_desc.as_str()),
        ("mem_all_largest", &largest, &meta_all, all_desc.as_str()),
        (
            "mem_pt_largest",
            &largest,
            &meta_pt,
            "librocsparse per-target archive",
        ),
    ] {
        eprintln!("runtime: {id}");
        let (mut hwm, mut rss, mut before) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..ctx.reps {
            let out = run_c(
                &exe,
                &args![
                    "memory",
                    meta,
                    &sparse_bin,
                    pick.agent(),
                    pick.bundle.to_string()
                ],
            )?;
            for (k, v) in parse_lines(&out) {
                let x = v.first().copied().unwrap_or(f64::NAN);
                match k.as_str() {
                    "hwm_kb" => hwm.push(x),
                    "rss_kb" => rss.push(x),
                    "rss_before_kb" => before.push(x),
                    _ => {}
                }
            }
        }
        let mut row = Row::new(
            SECTION,
            id,
            format!(
                "loader process after one load (VmHWM), {} code object ({}), {where_}",
                if pick.size == largest.size {
                    "largest"
                } else {
                    "median"
                },
                fmt_bytes(pick.size as f64)
            ),
        );
        row.peak_rss_kib = Stats::of(hwm);
        row.bytes_out = Some(pick.size as u64);
        let limit_kib = (1.5 * pick.size as f64 + 16.0 * 1024.0 * 1024.0) / 1024.0;
        if let Some(h) = row.peak_rss_kib.as_ref().map(|s| s.median) {
            row.targets.push(Target::at_most(
                format!("≤ 1.5× kernel + 16 MiB ({:.1} MiB)", limit_kib / 1024.0),
                h,
                limit_kib,
            ));
        }
        row.details = json!({
            "vm_rss_kib": Stats::of(rss),
            "vm_rss_before_load_kib": Stats::of(before),
            "kernel_bytes": pick.size,
        });
        rows.push(row);
    }

    if let Some(r) = rows.first_mut() {
        r.details = json!({
            "all_targets_archive_bytes": all_size,
            "all_targets_archive_write_seconds": all_write_s,
            "device_code_bytes": device_bytes,
            "code_objects": cos.len(),
            "last_run": r.details.get("last_run"),
        });
    }
    Ok(rows)
}
