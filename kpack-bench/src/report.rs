//! The report: one [`Row`] per figure measured, the Markdown table of them
//! (`target/bench/bench.md`, on stdout too) and everything in
//! `target/bench/bench.json`.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;
use serde::Serialize;
use tabled::{builder::Builder, settings::Style};
use xshell::{cmd, Shell};

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

/// One target (a limit a figure must meet), checked on a row.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    /// What it asks, in words.
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

impl Report {
    /// The report of `rows`: when, where, with which commit and zstd.
    pub fn collect(sh: &Shell, reps: usize, rows: Vec<Row>) -> Result<Report> {
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

    /// Print the table, and write it to `bench.md` and the report to
    /// `bench.json` in `dir`.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let table = render(self);
        print!("{table}");
        let md = dir.join("bench.md");
        std::fs::write(&md, &table)?;
        let json = dir.join("bench.json");
        std::fs::write(&json, serde_json::to_string_pretty(self)? + "\n")?;
        eprintln!("wrote {} and {}", json.display(), md.display());
        Ok(())
    }
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

/// The Markdown table (rendered by `tabled`), the lines before it and the
/// per-target archives after it.
pub fn render(r: &Report) -> String {
    let mut out = String::new();
    render_header(&mut out, r);
    let mut table = Builder::default();
    table.push_record(COLUMNS);
    for row in &r.rows {
        table.push_record(cells(row));
    }
    let _ = writeln!(out, "{}", table.build().with(Style::markdown()));
    render_archives(&mut out, &r.rows);
    out
}

/// The table's columns.
const COLUMNS: [&str; 10] = [
    "work",
    "wall",
    "CPU (user+sys)",
    "peak RSS",
    "in",
    "out",
    "compr.",
    "vs floor",
    "target",
    "met",
];

/// The lines before the table.
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
}

/// `f(item)` for each of `items`, joined with `sep`.
fn joined<T>(items: &[T], sep: &str, f: impl Fn(&T) -> String) -> String {
    items.iter().map(f).collect::<Vec<_>>().join(sep)
}

/// A figure's cell: its median (and spread), or empty.
fn stats_cell(s: &Option<Stats>, f: fn(f64) -> String) -> String {
    s.as_ref().map(|s| spread(s, f)).unwrap_or_default()
}

/// One line of the table, a cell per column.
fn cells(row: &Row) -> [String; 10] {
    let targets = joined(&row.targets, "; ", |t| t.text.clone());
    if let Some(why) = &row.unavailable {
        let why = why.replace('|', "\\|").replace('\n', " ");
        let mut c: [String; 10] = Default::default();
        c[0] = row.work.clone();
        c[1] = format!("not available: {why}");
        c[8] = targets;
        return c;
    }
    let floors = joined(&row.floors, ", ", |f| {
        format!("{:.2}× {}", f.ratio, short_floor(&f.floor))
    });
    let met = joined(&row.targets, "; ", |t| {
        (if t.met { "yes" } else { "**NO**" }).to_string()
    });
    let bytes = |b: Option<u64>| b.map(|b| fmt_bytes(b as f64)).unwrap_or_default();
    [
        row.work.clone(),
        stats_cell(&row.wall_s, fmt_time),
        stats_cell(&row.cpu_s, fmt_cpu),
        stats_cell(&row.peak_rss_kib, fmt_mib),
        bytes(row.bytes_in),
        bytes(row.bytes_out),
        row.compression_ratio
            .map(|c| format!("{c:.2}"))
            .unwrap_or_default(),
        floors,
        targets,
        met,
    ]
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
        // A section's `cp` of one of its inputs (`host.cp_1g`).
        d if d.starts_with("cp_") => "cp".into(),
        d if d.starts_with("decompress") => "bundled zstd".into(),
        "libzstd_same_process" => "system libzstd (same process)".into(),
        d if d.starts_with("libzstd") => "system libzstd".into(),
        other => other.replace('_', " "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(rows: Vec<Row>) -> Report {
        Report {
            date: "2026-12-02T00:00:00Z".into(),
            host: "Linux x86_64".into(),
            cores: 2,
            reps: 3,
            kpack_commit: "abc1234".into(),
            zstd_version: "zstd CLI v1.5.4".into(),
            page_cache: page_cache_note(&rows),
            rows,
        }
    }

    #[test]
    fn stats_are_the_median_and_the_range() {
        let s = Stats::of(vec![3.0, 1.0, 2.0, 10.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (2.5, 1.0, 10.0));
        assert!(Stats::of(Vec::new()).is_none());
    }

    #[test]
    fn the_table_has_every_column_and_row() {
        let mut ok = Row::new("s", "a", "work a");
        ok.wall_s = Stats::of(vec![1.0, 2.0, 3.0]);
        ok.bytes_in = Some(2_500_000);
        ok.targets.push(Target::at_most("≤ 3 s", 2.0, 3.0));
        let gone = Row::unavailable("s", "b", "work b", "x | y\nz".into());
        let text = render(&report(vec![ok, gone]));
        let table: Vec<&str> = text.lines().filter(|l| l.starts_with('|')).collect();
        assert_eq!(table.len(), 4, "{text}");
        for c in COLUMNS {
            assert!(table[0].contains(c), "{c} in {}", table[0]);
        }
        assert!(table[1].starts_with("|---"), "{}", table[1]);
        assert!(table[2].contains("2.00 s (1.00 s–3.00 s)"), "{}", table[2]);
        assert!(table[2].contains("2.5 MB") && table[2].contains("yes"));
        assert!(
            table[3].contains(r"not available: x \| y z"),
            "{}",
            table[3]
        );
        assert!(text.starts_with("kpack bench, 2026-12-02T00:00:00Z (Linux x86_64), 2 cores"));
    }

    #[test]
    fn times_and_sizes_have_three_digits() {
        assert_eq!(fmt_time(1.234), "1.23 s");
        assert_eq!(fmt_time(0.0456), "45.6 ms");
        assert_eq!(fmt_time(0.000_789), "789 µs");
        assert_eq!(fmt_bytes(1.5e9), "1.50 GB");
        assert_eq!(short_floor("rocsparse.zstd_t1"), "zstd -T1");
        assert_eq!(short_floor("host.cp_1g"), "cp");
    }
}
