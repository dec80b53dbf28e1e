//! Split and offload of a ROCm library, and the floors on the same bytes:
//! `zstd -3 -T1`/`-T2` over its device code (the code objects of its
//! `.hip_fatbin`, concatenated in bundle order: the bytes kpack compresses)
//! and `cp` of the input file.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::{json, Value};

use super::Section;
use crate::args;
use crate::context::Ctx;
use crate::measure::{resident, timed, tree_size, warm, Runs};
use crate::report::{fmt_time, FloorRatio, Row, Stats, Target};
use kpack_testkit::inputs::rocm::{self, make_artifact, write_device_code, SystemLib};
use kpack_testkit::tree::remove;

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
        format!("split {} --gpu-targets {targets}", lib.input.name),
    );
    runs.fill(&mut row);
    let j = parse(&runs.last_stdout, "kpack split --gpu-targets")?;
    let (list, ai, ao) = archives(&j["artifacts"][0]["archives"]);
    row.bytes_in = std::fs::metadata(lib.input.path).ok().map(|m| m.len());
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
        format!("≤ full split + 5 % ({})", fmt_time(limit)),
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

/// A library measured, and what its rows are held to.
pub struct Lib {
    /// Section of the table (`rocsparse`).
    pub section: &'static str,
    pub input: &'static SystemLib,
    /// Peak RSS limit of split, MiB, if any.
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

const ROCRAND_LIB: Lib = Lib {
    section: "rocrand",
    input: &rocm::ROCRAND,
    split_rss_limit_mib: None,
    transform_limit_s: None,
    rep_factor: 3,
    gpu_targets: &[],
};

const ROCSPARSE_LIB: Lib = Lib {
    section: "rocsparse",
    input: &rocm::ROCSPARSE,
    split_rss_limit_mib: Some(256.0),
    transform_limit_s: Some(0.2),
    rep_factor: 1,
    gpu_targets: &["gfx90a", "gfx1030"],
};

/// Section `rocrand`: librocrand's split and offload.
pub const ROCRAND: Section = Section {
    name: ROCRAND_LIB.section,
    about: "split and offload of librocrand, against zstd over its device code and cp",
    run: |ctx| run(ctx, &ROCRAND_LIB),
};

/// Section `rocsparse`: librocsparse's split (and per-shard split) and
/// offload.
pub const ROCSPARSE: Section = Section {
    name: ROCSPARSE_LIB.section,
    about: "split (whole and per shard) and offload of librocsparse, against zstd over its \
            device code and cp",
    run: |ctx| run(ctx, &ROCSPARSE_LIB),
};

/// Measures `lib`'s split and offload and the floors; its rows (split and
/// offload unavailable if the library is not installed).
fn run(ctx: &Ctx, lib: &Lib) -> Result<Vec<Row>> {
    let input = Path::new(lib.input.path);
    if !input.is_file() {
        let why = format!("{} is not installed", lib.input.path);
        return Ok(vec![
            Row::unavailable(lib.section, "split", split_work(lib), why.clone()),
            Row::unavailable(lib.section, "offload", offload_work(lib), why),
        ]);
    }
    let setup = Setup::new(ctx, lib)?;
    let measured = Measured::run(ctx, &setup)?;
    let rows = rows(&setup, measured)?;
    setup.clean()?;
    Ok(rows)
}

/// The split row's work.
fn split_work(lib: &Lib) -> String {
    format!("split {} (one artifact)", lib.input.name)
}

/// The offload row's work.
fn offload_work(lib: &Lib) -> String {
    format!("offload {}", lib.input.name)
}

/// One library's work directory: the split input, its device code (one
/// file, and one file per code object) and where each run writes.
struct Setup<'a> {
    lib: &'a Lib,
    input: &'a Path,
    input_size: u64,
    dir: PathBuf,
    artifact: PathBuf,
    devcode: PathBuf,
    devfiles: PathBuf,
    /// The file names in `devfiles`.
    names: Vec<String>,
    /// The size of `devcode`.
    dev_bytes: u64,
    split_out: PathBuf,
    off_out: PathBuf,
    zst: PathBuf,
    zst_files: PathBuf,
    cp_out: PathBuf,
}

impl<'a> Setup<'a> {
    /// Makes the work directory afresh: the artifact, the device code;
    /// warms the inputs.
    fn new(ctx: &Ctx, lib: &'a Lib) -> Result<Setup<'a>> {
        let input = Path::new(lib.input.path);
        let dir = ctx.work.join(lib.section);
        remove(&dir)?;
        std::fs::create_dir_all(&dir)?;
        let input_size = std::fs::metadata(input)?.len();
        let artifact = make_artifact(lib.input, &dir.join("artifacts"))?;
        let devcode = dir.join("devcode.bin");
        eprintln!(
            "{}: writing its device code to {}",
            lib.input.name,
            devcode.display()
        );
        let devfiles = dir.join("devcode.d");
        let (dev_bytes, names) = write_device_code(input, &devcode, &devfiles)?;
        warm(&[input, &devcode, &devfiles])?;
        Ok(Setup {
            lib,
            input,
            input_size,
            artifact,
            devcode,
            devfiles,
            names,
            dev_bytes,
            zst_files: dir.join("devcode.zst.d"),
            split_out: dir.join("split"),
            off_out: dir.join("offload"),
            zst: dir.join("devcode.zst"),
            cp_out: dir.join("cp.out"),
            dir,
        })
    }

    /// `kpack split` of the artifact into `split_out`, `--json`.
    fn split_args(&self) -> Vec<OsString> {
        args![
            "split",
            "--artifact-dir",
            &self.artifact,
            "--artifact-prefix",
            self.lib.input.artifact_prefix,
            "--output-dir",
            &self.split_out,
            "--json"
        ]
        .to_vec()
    }

    /// Removes the device code and the floors' outputs.
    fn clean(&self) -> Result<()> {
        for f in [
            &self.devcode,
            &self.zst,
            &self.cp_out,
            &self.devfiles,
            &self.zst_files,
        ] {
            remove(f)?;
        }
        Ok(())
    }
}

/// The runs of every command, and what their `--json` reported.
#[derive(Default)]
struct Measured {
    split: Runs,
    /// The last failed split's error.
    split_err: Option<String>,
    /// Each split's `seconds`.
    split_seconds: Vec<f64>,
    by_targets: Runs,
    offload: Runs,
    /// Each offload's `transform_seconds`.
    transform: Vec<f64>,
    /// Each offload's `archive_seconds`.
    archive_s: Vec<f64>,
    z1: Runs,
    z2: Runs,
    zf: Runs,
    cp: Runs,
    zst_size: u64,
    zst_files_size: u64,
}

impl Measured {
    /// Runs every command `--reps` × the library's factor times,
    /// interleaved, so that the machine's noise spreads over all of them.
    fn run(ctx: &Ctx, setup: &Setup) -> Result<Measured> {
        let lib = setup.lib;
        let mut m = Measured::default();
        let reps = ctx.reps * lib.rep_factor;
        for rep in 0..reps {
            eprintln!("{}: run {}/{reps}", lib.input.name, rep + 1);
            m.split(ctx, setup)?;
            if !lib.gpu_targets.is_empty() {
                m.split_gpu_targets(ctx, setup)?;
            }
            m.offload(ctx, setup)?;
            m.zstd(setup)?;
            m.zstd_files(setup)?;
            m.cp(setup)?;
        }
        Ok(m)
    }

    /// The full split; a failure is kept (the row reports it).
    fn split(&mut self, ctx: &Ctx, setup: &Setup) -> Result<()> {
        remove(&setup.split_out)?;
        let r = resident(&[setup.input]);
        match timed(&ctx.kpack, &setup.split_args(), &setup.dir) {
            Ok(run) => {
                let j = parse(&run.stdout, "kpack split")?;
                self.split_seconds
                    .push(j["seconds"].as_f64().unwrap_or(f64::NAN));
                self.split.push(run, r);
            }
            Err(e) => self.split_err = Some(format!("{e:#}")),
        }
        Ok(())
    }

    /// The split with `--gpu-targets`.
    fn split_gpu_targets(&mut self, ctx: &Ctx, setup: &Setup) -> Result<()> {
        remove(&setup.split_out)?;
        let r = resident(&[setup.input]);
        let mut a = setup.split_args();
        a.push("--gpu-targets".into());
        a.extend(setup.lib.gpu_targets.iter().map(OsString::from));
        self.by_targets.push(timed(&ctx.kpack, &a, &setup.dir)?, r);
        Ok(())
    }

    /// The offload, and the transform and archive times it reports.
    fn offload(&mut self, ctx: &Ctx, setup: &Setup) -> Result<()> {
        remove(&setup.off_out)?;
        let r = resident(&[setup.input]);
        let run = timed(
            &ctx.kpack,
            &args![
                "offload",
                setup.input,
                "-o",
                setup.off_out.join(setup.lib.input.file_name()),
                "--archive-dir",
                setup.off_out.join("arch"),
                "--json"
            ],
            &setup.dir,
        )?;
        let j = parse(&run.stdout, "kpack offload")?;
        self.transform
            .push(j["transform_seconds"].as_f64().unwrap_or(f64::NAN));
        self.archive_s
            .push(j["archive_seconds"].as_f64().unwrap_or(f64::NAN));
        self.offload.push(run, r);
        Ok(())
    }

    /// `zstd -3` of the device code, `-T1` then `-T2`.
    fn zstd(&mut self, setup: &Setup) -> Result<()> {
        let (devcode, zst) = (&setup.devcode, &setup.zst);
        for (threads, runs) in [("-T1", &mut self.z1), ("-T2", &mut self.z2)] {
            remove(zst)?;
            let r = resident(&[devcode]);
            let run = timed(
                Path::new("zstd"),
                &args!["-3", threads, "-q", "-f", devcode, "-o", zst],
                &setup.dir,
            )?;
            runs.push(run, r);
            self.zst_size = std::fs::metadata(zst)?.len();
        }
        Ok(())
    }

    /// Each code object its own file and frame, as in an archive.
    fn zstd_files(&mut self, setup: &Setup) -> Result<()> {
        let zst_files = &setup.zst_files;
        remove(zst_files)?;
        // (zstd 1.5.4 crashes if the directory does not exist.)
        std::fs::create_dir_all(zst_files)?;
        let r = resident(&[&setup.devfiles]);
        let mut a = args!["-3", "-T1", "-q", "-f", "--output-dir-flat", zst_files].to_vec();
        a.extend(setup.names.iter().map(OsString::from));
        self.zf
            .push(timed(Path::new("zstd"), &a, &setup.devfiles)?, r);
        self.zst_files_size = tree_size(zst_files);
        Ok(())
    }

    /// `cp` of the input.
    fn cp(&mut self, setup: &Setup) -> Result<()> {
        let (input, cp_out) = (setup.input, &setup.cp_out);
        remove(cp_out)?;
        let r = resident(&[input]);
        self.cp.push(
            timed(Path::new("cp"), &args![input, cp_out], &setup.dir)?,
            r,
        );
        Ok(())
    }
}

/// The rows, in the table's order: split (and split with `--gpu-targets`),
/// offload, the transform alone, the floors.
fn rows(setup: &Setup, m: Measured) -> Result<Vec<Row>> {
    let lib = setup.lib;
    let floors = Floors::new(setup, &m);
    let mut rows = Vec::new();
    let split = split_row(setup, &m, &floors)?;
    let (full_split, full_rss) = (split.wall(), split.peak_rss_kib.as_ref().map(|r| r.median));
    rows.push(split);
    if !lib.gpu_targets.is_empty() {
        rows.push(gpu_targets_row(lib, &m.by_targets, full_split, full_rss)?);
    }
    let j = parse(&m.offload.last_stdout, "kpack offload")?;
    rows.push(offload_row(setup, &m, &j, &floors));
    rows.push(transform_row(setup, m.transform, &j));
    rows.extend([
        floors.zstd_t1,
        floors.zstd_t2,
        floors.zstd_files_t1,
        floors.cp,
    ]);
    Ok(rows)
}

/// The floor rows: zstd over the device code (one stream, `-T1` and `-T2`;
/// one file per code object) and `cp` of the input.
struct Floors {
    section: &'static str,
    zstd_t1: Row,
    zstd_t2: Row,
    zstd_files_t1: Row,
    cp: Row,
}

impl Floors {
    /// The floor rows of `m`'s runs.
    fn new(setup: &Setup, m: &Measured) -> Floors {
        let (s, name, cos) = (setup.lib.section, setup.lib.input.name, setup.names.len());
        let mut zstd_t1 = Row::new(
            s,
            "zstd_t1",
            format!("floor: zstd -3 -T1, {name} device code"),
        );
        let mut zstd_t2 = Row::new(
            s,
            "zstd_t2",
            format!("floor: zstd -3 -T2, {name} device code"),
        );
        let mut zstd_files_t1 = Row::new(
            s,
            "zstd_files_t1",
            format!("floor: zstd -3 -T1, {name} device code, one file per code object ({cos})"),
        );
        for (row, runs, out) in [
            (&mut zstd_t1, &m.z1, m.zst_size),
            (&mut zstd_t2, &m.z2, m.zst_size),
            (&mut zstd_files_t1, &m.zf, m.zst_files_size),
        ] {
            runs.fill(row);
            row.bytes_in = Some(setup.dev_bytes);
            row.bytes_out = Some(out);
            row.compression_ratio = ratio(setup.dev_bytes, out);
            row.details = json!({"code_objects": cos});
        }
        let mut cp = Row::new(s, "cp", format!("floor: cp of {name}"));
        m.cp.fill(&mut cp);
        cp.bytes_in = Some(setup.input_size);
        cp.bytes_out = Some(setup.input_size);
        Floors {
            section: s,
            zstd_t1,
            zstd_t2,
            zstd_files_t1,
            cp,
        }
    }

    /// `row`'s wall time over each floor's (none if `row` has none).
    fn ratios(&self, row: &Row) -> Vec<FloorRatio> {
        let Some(w) = row.wall() else {
            return Vec::new();
        };
        [
            ("zstd_t1", &self.zstd_t1),
            ("zstd_t2", &self.zstd_t2),
            ("zstd_files_t1", &self.zstd_files_t1),
            ("cp", &self.cp),
        ]
        .into_iter()
        .filter_map(|(id, f)| {
            f.wall().map(|fw| FloorRatio {
                floor: format!("{}.{id}", self.section),
                ratio: w / fw,
            })
        })
        .collect()
    }
}

/// The full split: unavailable if every run failed; its targets.
fn split_row(setup: &Setup, m: &Measured, floors: &Floors) -> Result<Row> {
    let mut row = Row::new(setup.lib.section, "split", split_work(setup.lib));
    match (&m.split_err, m.split.wall.is_empty()) {
        (Some(e), true) => row.unavailable = Some(e.clone()),
        _ => {
            m.split.fill(&mut row);
            let j = parse(&m.split.last_stdout, "kpack split")?;
            let (list, ai, ao) = archives(&j["artifacts"][0]["archives"]);
            row.bytes_in = Some(setup.input_size);
            row.bytes_out = j["totals"]["bytes_out"].as_u64();
            row.compression_ratio = ratio(ai, ao);
            row.floors = floors.ratios(&row);
            row.details = json!({
                "archives": list,
                "device_code_bytes": ai,
                "archive_bytes": ao,
                "code_objects": j["totals"]["code_objects"],
                "reported_seconds": m.split_seconds,
                "errors": m.split_err,
            });
        }
    }
    split_targets(
        &mut row,
        setup.lib,
        floors.zstd_t1.wall().unwrap_or(f64::NAN),
    );
    Ok(row)
}

/// The split's targets: ≤ 2× the zstd -T1 floor, and the library's peak
/// RSS limit if any.
fn split_targets(row: &mut Row, lib: &Lib, zstd_floor: f64) {
    if let Some(w) = row.wall() {
        row.targets.push(Target::at_most(
            format!("≤ 2× zstd -T1 floor ({})", fmt_time(2.0 * zstd_floor)),
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
}

/// The offload; `j`: its last `--json`.
fn offload_row(setup: &Setup, m: &Measured, j: &Value, floors: &Floors) -> Row {
    let mut row = Row::new(setup.lib.section, "offload", offload_work(setup.lib));
    m.offload.fill(&mut row);
    let (list, ai, ao) = archives(&j["archives"]);
    row.bytes_in = Some(setup.input_size);
    row.bytes_out = Some(j["output_size"].as_u64().unwrap_or(0) + ao);
    row.compression_ratio = ratio(ai, ao);
    row.floors = floors.ratios(&row);
    row.details = json!({
        "archives": list,
        "host_binary_bytes": j["output_size"],
        "device_code_bytes": ai,
        "archive_bytes": ao,
        "archive_seconds": m.archive_s,
    });
    row
}

/// The offload's transform alone, as reported (`transform`); `j`: the
/// last offload's `--json`.
fn transform_row(setup: &Setup, transform: Vec<f64>, j: &Value) -> Row {
    let lib = setup.lib;
    let mut row = Row::new(
        lib.section,
        "transform",
        format!(
            "offload transform alone, {} (--json transform_seconds)",
            lib.input.name
        ),
    );
    row.wall_s = Stats::of(transform);
    row.bytes_in = Some(setup.input_size);
    row.bytes_out = j["output_size"].as_u64();
    if let (Some(limit), Some(w)) = (lib.transform_limit_s, row.wall()) {
        row.targets
            .push(Target::at_most(format!("≤ {}", fmt_time(limit)), w, limit));
    }
    row
}
