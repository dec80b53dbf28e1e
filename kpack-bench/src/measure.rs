//! Measuring child processes: wall time around the child, CPU time and
//! peak RSS from `/usr/bin/time`, and the page-cache residency of the
//! inputs (`fincore`), which are read once before the runs so that every
//! run starts warm.

use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::report::{Row, Stats};

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

/// Total size of the regular files under `path`.
pub fn tree_size(path: &Path) -> u64 {
    files_under(path)
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum()
}

/// The 1-minute load average.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Record in every row's details the load average before and after its
/// section ran (the machine's 2 cores are shared).
pub fn note_load(rows: &mut [Row], before: Option<f64>, after: Option<f64>) {
    for r in rows {
        if r.details.is_null() {
            r.details = serde_json::json!({});
        }
        r.details["load_average_before_after"] = serde_json::json!([before, after]);
    }
}
