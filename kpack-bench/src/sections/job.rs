//! One measured process of a section ([`Job`]): what it runs, what it
//! reads and writes, its runs; the rows of the `host` and `xla` sections.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::context::Ctx;
use crate::measure::{resident, timed, tree_size, Runs};
use crate::report::{Row, Stats, Target};
use kpack_testkit::tree::remove;

/// One measured process: what it runs and what it took.
pub(super) struct Job {
    pub(super) id: &'static str,
    work: String,
    program: PathBuf,
    args: Vec<OsString>,
    /// Its input (for the page-cache residency) and its output (none when
    /// empty).
    input: PathBuf,
    out: PathBuf,
    /// Removed after it ran (its own output, unless a later job reads it).
    pub(super) then_remove: Vec<PathBuf>,
    /// Where in its output the archives go, if it writes any.
    archives: Option<PathBuf>,
    runs: Runs,
    in_bytes: u64,
    out_bytes: u64,
    pub(super) archive_bytes: u64,
}

impl Job {
    pub(super) fn new(id: &'static str, work: String, program: &Path, args: Vec<OsString>) -> Job {
        Job {
            id,
            work,
            program: program.to_path_buf(),
            args,
            input: PathBuf::new(),
            out: PathBuf::new(),
            then_remove: Vec::new(),
            archives: None,
            runs: Runs::default(),
            in_bytes: 0,
            out_bytes: 0,
            archive_bytes: 0,
        }
    }

    /// Reads `input` and writes nothing.
    pub(super) fn reads(mut self, input: &Path) -> Job {
        self.input = input.to_path_buf();
        self
    }

    /// Reads `input`, writes `out` (removed after the run unless `keep`).
    pub(super) fn files(mut self, input: &Path, out: &Path, keep: bool) -> Job {
        self.input = input.to_path_buf();
        self.out = out.to_path_buf();
        if !keep {
            self.then_remove.push(out.to_path_buf());
        }
        self
    }

    /// Writes its archives into `dir` (their size is measured).
    pub(super) fn archives(mut self, dir: &Path) -> Job {
        self.archives = Some(dir.to_path_buf());
        self
    }

    /// One run: its output removed first, then timed; what it removes
    /// afterwards kept when `keep` is set.
    fn run(&mut self, ctx: &Ctx, keep: bool) -> Result<()> {
        remove(&self.out)?;
        let r = resident(&[&self.input]);
        self.in_bytes = tree_size(&self.input);
        self.runs
            .push(timed(&self.program, &self.args, &ctx.work)?, r);
        self.out_bytes = tree_size(&self.out);
        self.archive_bytes = self.archives.as_deref().map_or(0, tree_size);
        if !keep {
            for p in &self.then_remove {
                remove(p)?;
            }
        }
        Ok(())
    }

    /// Every repetition of `jobs`, in order (`what` names them in the
    /// progress lines); then `dir`, where they write, removed. With
    /// `--keep-work`, the last repetition's outputs and `dir` are kept.
    pub(super) fn run_all(ctx: &Ctx, jobs: &mut [Job], what: &str, dir: &Path) -> Result<()> {
        for rep in 0..ctx.reps {
            eprintln!("  {what}, rep {}/{}", rep + 1, ctx.reps);
            let keep = ctx.keep_work && rep + 1 == ctx.reps;
            for job in jobs.iter_mut() {
                job.run(ctx, keep)?;
            }
        }
        if !ctx.keep_work {
            remove(dir)?;
        }
        Ok(())
    }

    pub(super) fn median(&self) -> f64 {
        Stats::of(self.runs.wall.clone()).map_or(f64::NAN, |s| s.median)
    }

    pub(super) fn worst_rss_mib(&self) -> f64 {
        Stats::of(self.runs.rss.clone()).map_or(f64::NAN, |s| s.max) / 1024.0
    }

    /// What the last run printed.
    pub(super) fn stdout(&self) -> &str {
        &self.runs.last_stdout
    }

    /// Peak RSS at most `limit_mib` in its worst run.
    pub(super) fn rss_target(&self, limit_mib: f64) -> Target {
        Target::at_most(
            format!("peak RSS ≤ {limit_mib} MiB (worst run)"),
            self.worst_rss_mib(),
            limit_mib,
        )
    }

    /// Its row: figures, sizes in and out.
    pub(super) fn row(&self, section: &str) -> Row {
        let mut row = Row::new(section, self.id, self.work.clone());
        self.runs.fill(&mut row);
        row.bytes_in = Some(self.in_bytes);
        row.bytes_out = Some(self.out_bytes);
        if self.archives.is_some() {
            row.details = serde_json::json!({ "archive_bytes": self.archive_bytes });
        }
        row
    }
}
