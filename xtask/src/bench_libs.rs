//! Split and offload of a ROCm library, and the floors on the same bytes:
//! `zstd -3 -T1`/`-T2` over its device code (the code objects of its
//! `.hip_fatbin`, concatenated in bundle order: the bytes kpack compresses)
//! and `cp` of the input file.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::args;
use crate::bench::{
    link_or_copy, remove, resident, timed, warm, Ctx, FloorRatio, Row, Runs, Target,
};

/// A library measured.
pub struct Lib {
    /// Section of the table (`rocsparse`).
    pub section: &'static str,
    /// Its name in the table (`librocsparse`).
    pub name: &'static str,
    pub path: &'static str,
    /// The split input: one artifact holding the library.
    pub artifact: &'static str,
    pub artifact_prefix: &'static str,
    /// Symlinks next to the library in the artifact: (name, target).
    pub links: &'static [(&'static str, &'static str)],
    /// Peak RSS limit of split, MiB (issue 8), if any.
    pub split_rss_limit_mib: Option<f64>,
    /// Limit of the offload transform alone, seconds, if any.
    pub transform_limit_s: Option<f64>,
    /// Runs per `--reps` (more for a small library: its runs take tens of
    /// milliseconds, where a busy machine's noise is large).
    pub rep_factor: usize,
    /// Also split with `--gpu-targets` these (TheRock's per-shard split),
    /// which must cost no more than the full split.
    pub gpu_targets: &'static [&'static str],
}

pub const ROCRAND: Lib = Lib {
    section: "rocrand",
    name: "librocrand",
    path: "/usr/lib/x86_64-linux-gnu/librocrand.so.1.1",
    artifact: "rand_lib_gfx-all",
    artifact_prefix: "rand_lib",
    links: &[("librocrand.so.1", "librocrand.so.1.1")],
    split_rss_limit_mib: None,
    transform_limit_s: None,
    rep_factor: 3,
    gpu_targets: &[],
};

pub const ROCSPARSE: Lib = Lib {
    section: "rocsparse",
    name: "librocsparse",
    path: "/usr/lib/x86_64-linux-gnu/librocsparse.so.0.1",
    artifact: "sparse_lib_gfx-all",
    artifact_prefix: "sparse_lib",
    links: &[("librocsparse.so.0", "librocsparse.so.0.1")],
    split_rss_limit_mib: Some(256.0),
    transform_limit_s: Some(0.2),
    rep_factor: 1,
    gpu_targets: &["gfx90a", "gfx1030"],
};

impl Lib {
    pub fn file_name(&self) -> &'static str {
        self.path.rsplit('/').next().unwrap_or(self.path)
    }
}

/// Lay out the split input: `<dir>/<artifact>/artifact_manifest.txt` and
/// `stage/lib/<library>` (a hard link to the system file) with its links.
pub fn make_artifact(lib: &Lib, dir: &Path) -> Result<PathBuf> {
    let a = dir.join(lib.artifact);
    std::fs::create_dir_all(a.join("stage/lib"))?;
    std::fs::write(a.join("artifact_manifest.txt"), "stage\n")?;
    link_or_copy(
        Path::new(lib.path),
        &a.join("stage/lib").join(lib.file_name()),
    )?;
    for (name, target) in lib.links {
        let at = a.join("stage/lib").join(name);
        remove(&at)?;
        std::os::unix::fs::symlink(target, &at)?;
    }
    Ok(a)
}

/// Write the device code of `input` twice: to `out`, its code objects
/// concatenated in the order the per-target archives hold them (by target,
/// then bundle), and into `files`, one file per code object
/// (`<target>#<bundle>.hsaco`, as `kpack extract` names them). Returns
/// its size and the file names.
pub fn write_device_code(input: &Path, out: &Path, files: &Path) -> Result<(u64, Vec<String>)> {
    let mapped = kpack_core::input::map_file(input)?;
    let mut cos = kpack_core::offload::code_objects(input, &mapped)?;
    cos.sort_by(|a, b| (&a.target, a.bundle).cmp(&(&b.target, b.bundle)));
    std::fs::create_dir_all(files)?;
    let mut w = BufWriter::with_capacity(8 << 20, File::create(out)?);
    let mut n = 0u64;
    let mut names = Vec::new();
    for co in &cos {
        w.write_all(&co.data)?;
        let name = format!("{}#{}.hsaco", co.target, co.bundle);
        std::fs::write(files.join(&name), &*co.data)?;
        names.push(name);
        n += co.data.len() as u64;
        mapped.release_slice(&co.data);
    }
    w.flush()?;
    Ok((n, names))
}

/// `split --gpu-targets` of the library: it keeps fewer code objects and
/// must cost no more (wall, peak RSS) than the full split.
fn gpu_targets_row(
    lib: &Lib,
    runs: &Runs,
    full_wall: Option<f64>,
    full_rss: Option<f64>,
) -> Result<Row> {
    let targets = lib.gpu_targets.join(" ");
    let mut row = Row::new(
        lib.section,
        "split_gpu_targets",
        format!("split {} --gpu-targets {targets}", lib.name),
    );
    runs.fill(&mut row);
    let j = parse(&runs.last_stdout, "kpack split --gpu-targets")?;
    let (list, ai, ao) = archives(&j["artifacts"][0]["archives"]);
    row.bytes_in = std::fs::metadata(lib.path).ok().map(|m| m.len());
    row.bytes_out = j["totals"]["bytes_out"].as_u64();
    row.compression_ratio = ratio(ai, ao);
    row.details = json!({
        "archives": list,
        "code_objects": j["totals"]["code_objects"],
        "dropped_code_objects": j["artifacts"][0]["dropped_code_objects"],
        "full_split_wall_s": full_wall,
    });
    // 5 % for the noise of a shared machine.
    let wall = row.wall().unwrap_or(f64::NAN);
    let limit = full_wall.unwrap_or(f64::NAN) * 1.05;
    row.targets.push(Target::at_most(
        format!("≤ full split + 5 % ({})", crate::bench::fmt_time(limit)),
        wall,
        limit,
    ));
    let rss = row.peak_rss_kib.as_ref().map_or(f64::NAN, |r| r.median);
    let rss_limit = full_rss.unwrap_or(f64::NAN);
    row.targets.push(Target::at_most(
        format!("peak RSS ≤ full split's ({:.0} MiB)", rss_limit / 1024.0),
        rss,
        rss_limit,
    ));
    Ok(row)
}

fn parse(stdout: &str, what: &str) -> Result<Value> {
    serde_json::from_str(stdout).with_context(|| format!("{what}: --json output is not JSON"))
}

/// `[{target, bytes_in, bytes_out}]` and their sums.
fn archives(list: &Value) -> (Value, u64, u64) {
    let mut v = Vec::new();
    let (mut i, mut o) = (0, 0);
    for a in list.as_array().into_iter().flatten() {
        let (bi, bo) = (
            a["bytes_in"].as_u64().unwrap_or(0),
            a["bytes_out"].as_u64().unwrap_or(0),
        );
        i += bi;
        o += bo;
        v.push(json!({"target": a["target"], "bytes_in": bi, "bytes_out": bo}));
    }
    (Value::Array(v), i, o)
}

fn ratio(i: u64, o: u64) -> Option<f64> {
    (o > 0).then(|| i as f64 / o as f64)
}

pub fn run(ctx: &Ctx, lib: &Lib) -> Result<Vec<Row>> {
    let s = lib.section;
    let input = Path::new(lib.path);
    let split_work = format!("split {} (one artifact)", lib.name);
    if !input.is_file() {
        let why = format!("{} is not installed", lib.path);
        return Ok(vec![
            Row::unavailable(s, "split", split_work, why.clone()),
            Row::unavailable(s, "offload", format!("offload {}", lib.name), why),
        ]);
    }
    let dir = ctx.work.join(s);
    remove(&dir)?;
    std::fs::create_dir_all(&dir)?;
    let input_size = std::fs::metadata(input)?.len();
    let artifact = make_artifact(lib, &dir.join("artifacts"))?;
    let devcode = dir.join("devcode.bin");
    eprintln!(
        "{}: writing its device code to {}",
        lib.name,
        devcode.display()
    );
    let devfiles = dir.join("devcode.d");
    let (dev_bytes, names) = write_device_code(input, &devcode, &devfiles)?;
    let cos = names.len();
    warm(&[input, &devcode, &devfiles])?;
    let zst_files = dir.join("devcode.zst.d");

    let split_out = dir.join("split");
    let off_out = dir.join("offload");
    let zst = dir.join("devcode.zst");
    let cp_out = dir.join("cp.out");
    let (mut split, mut offload, mut z1, mut z2, mut zf, mut cp) = (
        Runs::default(),
        Runs::default(),
        Runs::default(),
        Runs::default(),
        Runs::default(),
        Runs::default(),
    );
    let mut split_err = None;
    let mut by_targets = Runs::default();
    let mut transform = Vec::new();
    let mut archive_s = Vec::new();
    let mut split_seconds = Vec::new();
    let (mut zst_size, mut zst_files_size) = (0, 0);
    let reps = ctx.reps * lib.rep_factor;
    for rep in 0..reps {
        eprintln!("{}: run {}/{reps}", lib.name, rep + 1);
        // Interleaved, so that the machine's noise spreads over all of them.
        remove(&split_out)?;
        let r = resident(&[input]);
        match timed(
            &ctx.kpack,
            &args![
                "split",
                "--artifact-dir",
                &artifact,
                "--artifact-prefix",
                lib.artifact_prefix,
                "--output-dir",
                &split_out,
                "--json"
            ],
            &dir,
        ) {
            Ok(run) => {
                let j = parse(&run.stdout, "kpack split")?;
                split_seconds.push(j["seconds"].as_f64().unwrap_or(f64::NAN));
                split.push(run, r);
            }
            Err(e) => split_err = Some(format!("{e:#}")),
        }
        if !lib.gpu_targets.is_empty() {
            remove(&split_out)?;
            let r = resident(&[input]);
            let mut a = args![
                "split",
                "--artifact-dir",
                &artifact,
                "--artifact-prefix",
                lib.artifact_prefix,
                "--output-dir",
                &split_out,
                "--json",
                "--gpu-targets"
            ]
            .to_vec();
            a.extend(lib.gpu_targets.iter().map(std::ffi::OsString::from));
            by_targets.push(timed(&ctx.kpack, &a, &dir)?, r);
        }

        remove(&off_out)?;
        let r = resident(&[input]);
        let run = timed(
            &ctx.kpack,
            &args![
                "offload",
                input,
                "-o",
                off_out.join(lib.file_name()),
                "--archive-dir",
                off_out.join("arch"),
                "--json"
            ],
            &dir,
        )?;
        let j = parse(&run.stdout, "kpack offload")?;
        transform.push(j["transform_seconds"].as_f64().unwrap_or(f64::NAN));
        archive_s.push(j["archive_seconds"].as_f64().unwrap_or(f64::NAN));
        offload.push(run, r);

        for (threads, runs) in [("-T1", &mut z1), ("-T2", &mut z2)] {
            remove(&zst)?;
            let r = resident(&[&devcode]);
            let run = timed(
                Path::new("zstd"),
                &args!["-3", threads, "-q", "-f", &devcode, "-o", &zst],
                &dir,
            )?;
            runs.push(run, r);
            zst_size = std::fs::metadata(&zst)?.len();
        }

        // Each code object its own file and frame, as in an archive.
        remove(&zst_files)?;
        // (zstd 1.5.4 crashes if the directory does not exist.)
        std::fs::create_dir_all(&zst_files)?;
        let r = resident(&[&devfiles]);
        let mut a = args!["-3", "-T1", "-q", "-f", "--output-dir-flat", &zst_files].to_vec();
        a.extend(names.iter().map(std::ffi::OsString::from));
        zf.push(timed(Path::new("zstd"), &a, &devfiles)?, r);
        zst_files_size = crate::bench::tree_size(&zst_files);

        remove(&cp_out)?;
        let r = resident(&[input]);
        cp.push(timed(Path::new("cp"), &args![input, &cp_out], &dir)?, r);
    }

    let mut rows = Vec::new();
    let floor_id = |f: &str| format!("{s}.{f}");
    let mut zrow1 = Row::new(
        s,
        "zstd_t1",
        format!("floor: zstd -3 -T1, {} device code", lib.name),
    );
    let mut zrow2 = Row::new(
        s,
        "zstd_t2",
        format!("floor: zstd -3 -T2, {} device code", lib.name),
    );
    let mut zrowf = Row::new(
        s,
        "zstd_files_t1",
        format!(
            "floor: zstd -3 -T1, {} device code, one file per code object ({cos})",
            lib.name
        ),
    );
    for (row, runs, out) in [
        (&mut zrow1, &z1, zst_size),
        (&mut zrow2, &z2, zst_size),
        (&mut zrowf, &zf, zst_files_size),
    ] {
        runs.fill(row);
        row.bytes_in = Some(dev_bytes);
        row.bytes_out = Some(out);
        row.compression_ratio = ratio(dev_bytes, out);
        row.details = json!({"code_objects": cos});
    }
    let mut cprow = Row::new(s, "cp", format!("floor: cp of {}", lib.name));
    cp.fill(&mut cprow);
    cprow.bytes_in = Some(input_size);
    cprow.bytes_out = Some(input_size);
    let floors = |row: &Row| -> Vec<FloorRatio> {
        let Some(w) = row.wall() else {
            return Vec::new();
        };
        [
            ("zstd_t1", &zrow1),
            ("zstd_t2", &zrow2),
            ("zstd_files_t1", &zrowf),
            ("cp", &cprow),
        ]
        .into_iter()
        .filter_map(|(id, f)| {
            f.wall().map(|fw| FloorRatio {
                floor: floor_id(id),
                ratio: w / fw,
            })
        })
        .collect()
    };
    let zstd_floor = zrow1.wall().unwrap_or(f64::NAN);

    // split
    let mut row = Row::new(s, "split", split_work);
    match (&split_err, split.wall.is_empty()) {
        (Some(e), true) => row.unavailable = Some(e.clone()),
        _ => {
            split.fill(&mut row);
            let j = parse(&split.last_stdout, "kpack split")?;
            let (list, ai, ao) = archives(&j["artifacts"][0]["archives"]);
            row.bytes_in = Some(input_size);
            row.bytes_out = j["totals"]["bytes_out"].as_u64();
            row.compression_ratio = ratio(ai, ao);
            row.floors = floors(&row);
            row.details = json!({
                "archives": list,
                "device_code_bytes": ai,
                "archive_bytes": ao,
                "code_objects": j["totals"]["code_objects"],
                "reported_seconds": split_seconds,
                "errors": split_err,
            });
        }
    }
    if let Some(w) = row.wall() {
        row.targets.push(Target::at_most(
            format!(
                "≤ 2× zstd -T1 floor ({})",
                crate::bench::fmt_time(2.0 * zstd_floor)
            ),
            w,
            2.0 * zstd_floor,
        ));
    } else {
        row.targets
            .push(Target::at_most("≤ 2× zstd -T1 floor", f64::NAN, 0.0));
    }
    if let Some(limit) = lib.split_rss_limit_mib {
        let rss = row
            .peak_rss_kib
            .as_ref()
            .map_or(f64::NAN, |r| r.median / 1024.0);
        row.targets.push(Target::at_most(
            format!("peak RSS ≤ {limit:.0} MiB"),
            rss,
            limit,
        ));
    }
    let full_split = row.wall();
    let full_rss = row.peak_rss_kib.as_ref().map(|r| r.median);
    rows.push(row);
    if !lib.gpu_targets.is_empty() {
        rows.push(gpu_targets_row(lib, &by_targets, full_split, full_rss)?);
    }

    // offload
    let mut row = Row::new(s, "offload", format!("offload {}", lib.name));
    offload.fill(&mut row);
    let j = parse(&offload.last_stdout, "kpack offload")?;
    let (list, ai, ao) = archives(&j["archives"]);
    row.bytes_in = Some(input_size);
    row.bytes_out = Some(j["output_size"].as_u64().unwrap_or(0) + ao);
    row.compression_ratio = ratio(ai, ao);
    row.floors = floors(&row);
    row.details = json!({
        "archives": list,
        "host_binary_bytes": j["output_size"],
        "device_code_bytes": ai,
        "archive_bytes": ao,
        "archive_seconds": archive_s,
    });
    rows.push(row);

    let mut row = Row::new(
        s,
        "transform",
        format!(
            "offload transform alone, {} (--json transform_seconds)",
            lib.name
        ),
    );
    row.wall_s = crate::bench::Stats::of(transform);
    row.bytes_in = Some(input_size);
    row.bytes_out = j["output_size"].as_u64();
    if let (Some(limit), Some(w)) = (lib.transform_limit_s, row.wall()) {
        row.targets.push(Target::at_most(
            format!("≤ {}", crate::bench::fmt_time(limit)),
            w,
            limit,
        ));
    }
    rows.push(row);
    rows.extend([zrow1, zrow2, zrowf, cprow]);

    for f in [&devcode, &zst, &cp_out, &devfiles, &zst_files] {
        remove(f)?;
    }
    Ok(rows)
}
