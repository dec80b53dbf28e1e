//! `cargo xtask bench`: kpack's speed and memory against the floors and the
//! targets of issue 8, measured in one run (never in CI).
//!
//! - `bench_libs`: split and offload of librocrand and librocsparse, and the
//!   floors on the same bytes (`zstd -3 -T1`/`-T2` over the device code,
//!   `cp` of the input);
//! - `bench_pipeline`: pack-tree and recombine over the end-to-end fixture
//!   tree, and over real-size inputs;
//! - `bench_runtime`: the C API (`xtask/bench/kpack_bench.c` linked against
//!   the release `librocm_kpack.a`): open, cold and warm loads,
//!   `kpack_get_kernel` over every kernel, memory after one load;
//! - `bench_python`: kpack's Python API (the release wheel) packing and
//!   reading librocsparse's gfx1030 code objects, against the command and
//!   pure Python.
//!
//! Processes are the release `kpack` binary run as a child of
//! `/usr/bin/time -f` (CPU = user + sys, peak RSS = max RSS); wall time is
//! measured around the child. Every input file is read once before the
//! runs so that all runs start with it warm in the page cache (nothing is
//! dropped system-wide); its residency is checked with `fincore` before
//! each timed run and reported. Output: a Markdown table on stdout and in
//! `target/bench/bench.md`, everything in `target/bench/bench.json`.
//!
//! The bench itself runs as a release build (it writes a 200 MB archive
//! with kpack-core): `cargo xtask bench` builds `xtask`, `kpack` and
//! `librocm_kpack` in release and re-runs itself from `target/release`.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde::Serialize;
use xshell::{cmd, Shell};

use crate::{
    bench_large, bench_libs, bench_pipeline, bench_rewrite, bench_runtime, bench_wheels, cargo,
};

/// Debian packages the bench needs (the C compiler builds the runtime
/// bench program).
const DEBIAN_PACKAGES: &[&str] = &[
    "librocsparse0",
    "librocrand1",
    "zstd",
    "time",
    "gcc",
    "zip",
    "unzip",
    "python3-venv",
];

/// Set in the environment of the release re-run.
const RELEASE_VAR: &str = "KPACK_BENCH_RELEASE";

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Repetitions of every measured process (medians over them; at least 3
    /// gives a meaningful spread).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Measure only these sections (comma-separated): rocrand, rocsparse,
    /// pipeline, runtime, large, rewrite (prune and restore of
    /// librocsparse), wheels, python (the Python API). Default: all.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Keep target/bench/work (the large intermediate files) afterwards.
    #[arg(long)]
    pub keep_work: bool,
}

/// The machine-readable distribution of one figure over the runs.
#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub runs: Vec<f64>,
}

impl Stats {
    pub fn of(runs: Vec<f64>) -> Option<Stats> {
        if runs.is_empty() {
            return None;
        }
        let mut v = runs.clone();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Stats {
            median,
            min: v[0],
            max: v[n - 1],
            runs,
        })
    }
}

/// One target of the issue, checked on a row.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    /// What the issue asks, in words.
    pub text: String,
    /// The figure compared (median), and its limit, in the same unit.
    pub value: f64,
    pub limit: f64,
    pub met: bool,
}

impl Target {
    pub fn at_most(text: impl Into<String>, value: f64, limit: f64) -> Target {
        Target {
            text: text.into(),
            value,
            limit,
            met: value <= limit,
        }
    }
}

/// A row's ratio to a floor measured in the same run.
#[derive(Debug, Clone, Serialize)]
pub struct FloorRatio {
    /// The id of the floor's row.
    pub floor: String,
    /// This row's median wall time over the floor's.
    pub ratio: f64,
}

/// One line of the table.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Row {
    pub id: String,
    pub section: String,
    pub work: String,
    /// Wall time, seconds (runtime rows: the latency).
    pub wall_s: Option<Stats>,
    /// CPU time (user + sys), seconds.
    pub cpu_s: Option<Stats>,
    /// Peak RSS (`/usr/bin/time` max RSS, or VmHWM), KiB.
    pub peak_rss_kib: Option<Stats>,
    pub bytes_in: Option<u64>,
    pub bytes_out: Option<u64>,
    /// Device code bytes over their compressed bytes.
    pub compression_ratio: Option<f64>,
    pub floors: Vec<FloorRatio>,
    pub targets: Vec<Target>,
    /// Lowest page-cache residency of the input seen before a timed run
    /// (1.0: entirely warm).
    pub input_resident: Option<f64>,
    /// Why there are no figures.
    pub unavailable: Option<String>,
    pub details: serde_json::Value,
}

impl Row {
    pub fn new(section: &str, id: &str, work: impl Into<String>) -> Row {
        Row {
            id: format!("{section}.{id}"),
            section: section.to_string(),
            work: work.into(),
            details: serde_json::Value::Null,
            ..Row::default()
        }
    }

    pub fn unavailable(section: &str, id: &str, work: impl Into<String>, why: String) -> Row {
        let mut r = Row::new(section, id, work);
        r.unavailable = Some(why);
        r
    }

    /// A row for work that needs `path`, which is not installed.
    pub fn not_installed(section: &str, id: &str, work: impl Into<String>, path: &str) -> Row {
        Row::unavailable(section, id, work, format!("{path} is not installed"))
    }

    pub fn wall(&self) -> Option<f64> {
        self.wall_s.as_ref().map(|s| s.median)
    }
}

/// Everything the bench found.
#[derive(Debug, Serialize)]
pub struct Report {
    pub date: String,
    pub host: String,
    pub cores: usize,
    pub reps: usize,
    pub kpack_commit: String,
    pub zstd_version: String,
    pub page_cache: String,
    pub rows: Vec<Row>,
}

/// Paths and tools shared by the sections.
pub struct Ctx {
    pub root: PathBuf,
    pub kpack: PathBuf,
    /// target/bench/work
    pub work: PathBuf,
    pub reps: usize,
}

/// What a child process took.
#[derive(Debug, Clone)]
pub struct Run {
    pub wall: f64,
    pub cpu: f64,
    pub rss_kib: f64,
    pub stdout: String,
}

/// Measured runs of one process, and the page-cache residency of its input.
#[derive(Debug, Default)]
pub struct Runs {
    pub wall: Vec<f64>,
    pub cpu: Vec<f64>,
    pub rss: Vec<f64>,
    pub resident: Option<f64>,
    pub last_stdout: String,
}

impl Runs {
    pub fn push(&mut self, r: Run, resident: f64) {
        self.wall.push(r.wall);
        self.cpu.push(r.cpu);
        self.rss.push(r.rss_kib);
        self.resident = Some(self.resident.map_or(resident, |x| x.min(resident)));
        self.last_stdout = r.stdout;
    }

    /// Fill the row's timing figures.
    pub fn fill(&self, row: &mut Row) {
        row.wall_s = Stats::of(self.wall.clone());
        row.cpu_s = Stats::of(self.cpu.clone());
        row.peak_rss_kib = Stats::of(self.rss.clone());
        row.input_resident = self.resident;
    }
}

/// The sections `--only` may name, in the order they run.
const SECTIONS: &[&str] = &[
    "rocrand",
    "rocsparse",
    "pipeline",
    "runtime",
    "large",
    "rewrite",
    "wheels",
    "python",
];

/// A section measured by one function (the libraries' sections aside).
type Section = (&'static str, fn(&Ctx) -> Result<Vec<Row>>);

/// Re-run in release, then measure the sections asked for and write the
/// table and the report.
pub fn run(root: &Path, args: &BenchArgs) -> Result<()> {
    let sh = Shell::new()?;
    sh.change_dir(root);
    if std::env::var_os(RELEASE_VAR).is_none() {
        return rerun_in_release(&sh, root);
    }
    check_args(args)?;
    let bench_dir = root.join("target/bench");
    let work = bench_dir.join("work");
    std::fs::create_dir_all(&work)?;
    let ctx = Ctx {
        root: root.to_path_buf(),
        kpack: root.join("target/release/kpack"),
        work: work.clone(),
        reps: args.reps,
    };
    if !ctx.kpack.is_file() {
        bail!("{} missing", ctx.kpack.display());
    }
    let rows = run_sections(&ctx, &args.only)?;
    let report = make_report(&sh, args.reps, rows)?;
    write_outputs(&bench_dir, &report)?;
    if !args.keep_work {
        std::fs::remove_dir_all(&work).ok();
    }
    Ok(())
}

/// Install what the bench needs, build it in release, and run the release
/// build with the same arguments.
fn rerun_in_release(sh: &Shell, root: &Path) -> Result<()> {
    install_debian_packages(sh)?;
    let cargo = cargo();
    cmd!(
        sh,
        "{cargo} build --release -p xtask -p kpack-cli -p kpack-cxx"
    )
    .run()
    .context("cargo build --release")?;
    let status = Command::new(root.join("target/release/xtask"))
        .args(std::env::args_os().skip(1))
        .env(RELEASE_VAR, "1")
        .current_dir(root)
        .status()
        .context("running the release xtask")?;
    if !status.success() {
        bail!("the bench failed ({status})");
    }
    Ok(())
}

/// `--reps` at least 1, `--only` naming sections.
fn check_args(args: &BenchArgs) -> Result<()> {
    if args.reps == 0 {
        bail!("--reps must be at least 1");
    }
    for o in &args.only {
        if !SECTIONS.contains(&o.as_str()) {
            bail!("--only {o}: sections are {}", SECTIONS.join(", "));
        }
    }
    Ok(())
}

/// The rows of the sections wanted (all when `only` is empty), in order.
fn run_sections(ctx: &Ctx, only: &[String]) -> Result<Vec<Row>> {
    let wanted = |s: &str| only.is_empty() || only.iter().any(|o| o == s);
    let mut rows = Vec::new();
    for (section, lib) in [
        ("rocrand", &bench_libs::ROCRAND),
        ("rocsparse", &bench_libs::ROCSPARSE),
    ] {
        if wanted(section) {
            eprintln!("== {section}");
            rows.extend(bench_libs::run(ctx, lib)?);
        }
    }
    let sections: [Section; 6] = [
        ("pipeline", bench_pipeline::run),
        ("runtime", bench_runtime::run),
        ("large", bench_large::run),
        ("rewrite", bench_rewrite::run),
        ("wheels", bench_wheels::run),
        ("python", crate::bench_python::run),
    ];
    for (section, run) in sections {
        if wanted(section) {
            eprintln!("== {section}");
            rows.extend(run(ctx)?);
        }
    }
    Ok(rows)
}

/// The report of `rows`: when, where, with which commit and zstd.
fn make_report(sh: &Shell, reps: usize, rows: Vec<Row>) -> Result<Report> {
    Ok(Report {
        date: cmd!(sh, "date -u +%Y-%m-%dT%H:%M:%SZ").quiet().read()?,
        host: cmd!(sh, "uname -srm").quiet().read()?,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        reps,
        kpack_commit: cmd!(sh, "git describe --always --dirty")
            .quiet()
            .ignore_status()
            .read()
            .unwrap_or_default(),
        zstd_version: zstd_version(sh),
        page_cache: page_cache_note(&rows),
        rows,
    })
}

/// `zstd CLI v1.5.x`, or empty when `zstd --version` fails.
fn zstd_version(sh: &Shell) -> String {
    cmd!(sh, "zstd --version")
        .quiet()
        .read()
        .unwrap_or_default()
        .split_whitespace()
        .find(|w| w.starts_with('v'))
        .map(|v| format!("zstd CLI {}", v.trim_end_matches(',')))
        .unwrap_or_default()
}

/// Print the table, and write it to `bench.md` and the report to
/// `bench.json` in `bench_dir`.
fn write_outputs(bench_dir: &Path, report: &Report) -> Result<()> {
    let table = render(report);
    print!("{table}");
    let md = bench_dir.join("bench.md");
    std::fs::write(&md, &table)?;
    let json = bench_dir.join("bench.json");
    std::fs::write(&json, serde_json::to_string_pretty(report)? + "\n")?;
    eprintln!("wrote {} and {}", json.display(), md.display());
    Ok(())
}

fn install_debian_packages(sh: &Shell) -> Result<()> {
    crate::test::ensure_debian_packages(sh, DEBIAN_PACKAGES, "bench")
}

/// Run `program args` under `/usr/bin/time`, in `cwd`; fails unless it
/// exits 0.
pub fn timed(program: &Path, args: &[OsString], cwd: &Path) -> Result<Run> {
    let tf = cwd.join(format!(".time-{}", std::process::id()));
    let mut cmd = Command::new("/usr/bin/time");
    cmd.arg("-f")
        .arg("%U %S %M")
        .arg("-o")
        .arg(&tf)
        .arg(program)
        .args(args)
        .current_dir(cwd);
    let t0 = Instant::now();
    let out = cmd
        .output()
        .with_context(|| format!("running {}", program.display()))?;
    let wall = t0.elapsed().as_secs_f64();
    let times = std::fs::read_to_string(&tf).unwrap_or_default();
    std::fs::remove_file(&tf).ok();
    if !out.status.success() {
        bail!(
            "{} {} failed ({}): {}",
            program.display(),
            args.iter()
                .map(|a| a.to_string_lossy())
                .collect::<Vec<_>>()
                .join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    // `time` writes its line last.
    let line = times.lines().last().unwrap_or_default();
    let f: Vec<f64> = line
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    if f.len() != 3 {
        bail!("unexpected /usr/bin/time output {times:?}");
    }
    Ok(Run {
        wall,
        cpu: f[0] + f[1],
        rss_kib: f[2],
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
    })
}

/// An array of `OsString` arguments from anything path- or string-like.
#[macro_export]
macro_rules! args {
    ($($a:expr),* $(,)?) => {
        [$(std::ffi::OsString::from($a)),*]
    };
}

/// Every regular file under `path` (or `path` itself).
pub fn files_under(path: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return out;
    };
    if meta.is_file() {
        out.push(path.to_path_buf());
    } else if meta.is_dir() {
        if let Ok(rd) = std::fs::read_dir(path) {
            let mut entries: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
            entries.sort();
            for e in entries {
                out.extend(files_under(&e));
            }
        }
    }
    out
}

/// Read every file under `paths` once, so that they are in the page cache.
pub fn warm(paths: &[&Path]) -> Result<()> {
    let mut buf = vec![0u8; 8 << 20];
    for p in paths {
        for f in files_under(p) {
            let mut file =
                std::fs::File::open(&f).with_context(|| format!("reading {}", f.display()))?;
            while file.read(&mut buf)? > 0 {}
        }
    }
    Ok(())
}

/// The fraction of the bytes of the files under `paths` that are in the
/// page cache (`fincore`); 1.0 when there are none.
pub fn resident(paths: &[&Path]) -> f64 {
    let files: Vec<PathBuf> = paths.iter().flat_map(|p| files_under(p)).collect();
    if files.is_empty() {
        return 1.0;
    }
    let (mut res, mut size) = (0u64, 0u64);
    for chunk in files.chunks(200) {
        let out = Command::new("fincore")
            .args(["--bytes", "--noheadings", "--raw", "--output", "RES,SIZE"])
            .args(chunk)
            .output();
        let Ok(out) = out else { return f64::NAN };
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let v: Vec<u64> = line
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            if v.len() == 2 {
                res += v[0].min(v[1]);
                size += v[1];
            }
        }
    }
    if size == 0 {
        1.0
    } else {
        res as f64 / size as f64
    }
}

/// Remove `path` (file or tree) if it exists.
pub fn remove(path: &Path) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => {
            std::fs::remove_dir_all(path).with_context(|| format!("removing {}", path.display()))
        }
        Ok(_) => std::fs::remove_file(path).with_context(|| format!("removing {}", path.display())),
        Err(_) => Ok(()),
    }
}

/// Hard-link `src` at `dst` (same file system), else copy it.
pub fn link_or_copy(src: &Path, dst: &Path) -> Result<()> {
    if let Some(d) = dst.parent() {
        std::fs::create_dir_all(d)?;
    }
    remove(dst)?;
    if std::fs::hard_link(src, dst).is_err() {
        std::fs::copy(src, dst)
            .with_context(|| format!("copying {} to {}", src.display(), dst.display()))?;
    }
    Ok(())
}

/// Total size of the regular files under `path`.
pub fn tree_size(path: &Path) -> u64 {
    files_under(path)
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum()
}

fn page_cache_note(rows: &[Row]) -> String {
    let r: Vec<f64> = rows.iter().filter_map(|r| r.input_resident).collect();
    if r.is_empty() {
        return "no inputs measured".into();
    }
    let min = r.iter().copied().fold(f64::INFINITY, f64::min);
    format!(
        "warm: every input was read once before its runs (nothing dropped system-wide); \
         lowest page-cache residency of an input before a timed run: {:.1}%",
        min * 100.0
    )
}

pub fn fmt_time(s: f64) -> String {
    let (v, unit) = if s >= 1.0 {
        (s, "s")
    } else if s >= 1e-3 {
        (s * 1e3, "ms")
    } else {
        (s * 1e6, "µs")
    };
    // Three significant digits.
    if v >= 100.0 {
        format!("{v:.0} {unit}")
    } else if v >= 10.0 {
        format!("{v:.1} {unit}")
    } else {
        format!("{v:.2} {unit}")
    }
}

/// CPU time from `/usr/bin/time` (10 ms resolution).
fn fmt_cpu(s: f64) -> String {
    if s < 0.005 {
        "< 10 ms".into()
    } else {
        fmt_time(s)
    }
}

pub fn fmt_bytes(b: f64) -> String {
    if b >= 1e9 {
        format!("{:.2} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.1} MB", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.0} kB", b / 1e3)
    } else {
        format!("{b:.0} B")
    }
}

fn fmt_mib(kib: f64) -> String {
    format!("{:.0} MiB", kib / 1024.0)
}

fn spread(s: &Stats, f: fn(f64) -> String) -> String {
    if s.runs.len() > 1 && f(s.min) != f(s.max) {
        format!("{} ({}–{})", f(s.median), f(s.min), f(s.max))
    } else {
        f(s.median)
    }
}

/// The Markdown table (and its header lines).
pub fn render(r: &Report) -> String {
    let mut out = String::new();
    render_header(&mut out, r);
    for row in &r.rows {
        render_row(&mut out, row);
    }
    render_archives(&mut out, &r.rows);
    out
}

/// The lines before the table, and its header.
fn render_header(out: &mut String, r: &Report) {
    let _ = writeln!(
        out,
        "kpack bench, {} ({}), {} cores, commit {}, {} reps; {}.",
        r.date, r.host, r.cores, r.kpack_commit, r.reps, r.zstd_version
    );
    let _ = writeln!(out, "Page cache: {}.", r.page_cache);
    let _ = writeln!(
        out,
        "Times: median (min–max) over the runs; runtime latencies: median over runs of each \
         run's median. Sizes in decimal units, memory in MiB."
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "| work | wall | CPU (user+sys) | peak RSS | in | out | compr. | vs floor | target | met |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|");
}

/// `f(item)` for each of `items`, joined with `sep`.
fn joined<T>(items: &[T], sep: &str, f: impl Fn(&T) -> String) -> String {
    items.iter().map(f).collect::<Vec<_>>().join(sep)
}

/// A figure's cell: its median (and spread), or empty.
fn stats_cell(s: &Option<Stats>, f: fn(f64) -> String) -> String {
    s.as_ref().map(|s| spread(s, f)).unwrap_or_default()
}

/// One line of the table.
fn render_row(out: &mut String, row: &Row) {
    let targets = joined(&row.targets, "; ", |t| t.text.clone());
    if let Some(why) = &row.unavailable {
        let _ = writeln!(
            out,
            "| {} | not available: {} | | | | | | | {} | |",
            row.work,
            why.replace('|', "\\|").replace('\n', " "),
            targets
        );
        return;
    }
    let floors = joined(&row.floors, ", ", |f| {
        format!("{:.2}× {}", f.ratio, short_floor(&f.floor))
    });
    let met = joined(&row.targets, "; ", |t| {
        (if t.met { "yes" } else { "**NO**" }).to_string()
    });
    let _ = writeln!(
        out,
        "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        row.work,
        stats_cell(&row.wall_s, fmt_time),
        stats_cell(&row.cpu_s, fmt_cpu),
        stats_cell(&row.peak_rss_kib, fmt_mib),
        row.bytes_in
            .map(|b| fmt_bytes(b as f64))
            .unwrap_or_default(),
        row.bytes_out
            .map(|b| fmt_bytes(b as f64))
            .unwrap_or_default(),
        row.compression_ratio
            .map(|c| format!("{c:.2}"))
            .unwrap_or_default(),
        floors,
        targets,
        met
    );
}

/// The per-target archives of the rows that list them, after the table.
fn render_archives(out: &mut String, rows: &[Row]) {
    let archives: Vec<&Row> = rows
        .iter()
        .filter(|r| r.details.get("archives").is_some())
        .collect();
    if archives.is_empty() {
        return;
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Per-target archives (bytes in → archive bytes, ratio):"
    );
    let _ = writeln!(out);
    for row in archives {
        let _ = writeln!(out, "- {}: {}", row.work, archive_list(row));
    }
}

/// `target in → out (ratio)` for each archive in the row's details.
fn archive_list(row: &Row) -> String {
    let mut parts = Vec::new();
    for a in row.details["archives"].as_array().into_iter().flatten() {
        let (i, o) = (
            a["bytes_in"].as_f64().unwrap_or(0.0),
            a["bytes_out"].as_f64().unwrap_or(0.0),
        );
        parts.push(format!(
            "{} {} → {} ({:.2})",
            a["target"].as_str().unwrap_or("?"),
            fmt_bytes(i),
            fmt_bytes(o),
            if o > 0.0 { i / o } else { 0.0 }
        ));
    }
    parts.join(", ")
}

/// A floor's name for the table (`rocsparse.zstd_t1` → `zstd -T1`).
fn short_floor(id: &str) -> String {
    match id.rsplit('.').next().unwrap_or(id) {
        "zstd_t1" => "zstd -T1".into(),
        "zstd_t2" => "zstd -T2".into(),
        "zstd_files_t1" => "zstd -T1 per file".into(),
        "cp" => "cp".into(),
        d if d.starts_with("decompress") => "decompression".into(),
        other => other.replace('_', " "),
    }
}
