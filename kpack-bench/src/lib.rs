//! kpack's benchmarks: speed and memory of the release `kpack` and
//! `librocm_kpack` against floors (the same bytes through `zstd`, `cp`,
//! `unzip`...) and against targets (each row's limits, in
//! docs/performance.md), measured in one run (never in CI). `cargo xtask bench`
//! installs what they need, builds `kpack` and `librocm_kpack` in release and
//! runs the `kpack-bench` binary; `cargo bench -p kpack-bench` runs the
//! in-process micro-benchmarks (`benches/`, through divan).
//!
//! Whole-process figures: the release `kpack` binary (and the floors: `zstd`,
//! `cp`, ...) run as a child of `/usr/bin/time -f` (CPU = user + sys, peak
//! RSS = max RSS); wall time is measured around the child. Every input file
//! is read once before the runs so that all runs start with it warm in the
//! page cache (nothing is dropped system-wide); its residency is checked
//! with `fincore` before each timed run and reported. Output: a Markdown
//! table on stdout and in `target/bench/bench.md`, everything in
//! `target/bench/bench.json`.
//!
//! The inputs (ROCm libraries laid out, their device code, torch-like
//! wheels, libraries in compressed bundles or with a large host part) are
//! built by the test kit ([`kpack_testkit::inputs`]); this crate measures
//! and reports. Modules, each depending only on those before it:
//! - [`context`]: what every section is given;
//! - [`report`]: rows, the table and the JSON report;
//! - [`measure`]: timing child processes, page-cache residency;
//! - [`sections`]: one module per section of the table.

pub mod context;
pub mod measure;
pub mod report;
pub mod sections;

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use xshell::Shell;

use context::Ctx;
use report::Report;

/// What `kpack-bench` (and `cargo xtask bench`) is asked.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Repetitions of every measured process (medians over them; at least 3
    /// gives a meaningful spread).
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
    /// Measure only these sections (comma-separated). Default: all.
    #[arg(long, value_delimiter = ',', value_parser = sections::names())]
    pub only: Vec<String>,
    /// Keep target/bench/work (the large intermediate files) afterwards.
    #[arg(long)]
    pub keep_work: bool,
}

/// The workspace root: the parent of this crate's directory.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("kpack-bench lives in a subdirectory of the workspace")
        .to_path_buf()
}

/// Measure the sections asked for and write the table and the report to
/// `root/target/bench`.
pub fn run(root: &Path, args: &BenchArgs) -> Result<()> {
    check_args(args)?;
    let bench_dir = root.join("target/bench");
    let work = bench_dir.join("work");
    std::fs::create_dir_all(&work)?;
    let ctx = Ctx {
        root: root.to_path_buf(),
        kpack: root.join("target/release/kpack"),
        work: work.clone(),
        reps: args.reps,
        keep_work: args.keep_work,
    };
    if !ctx.kpack.is_file() {
        bail!(
            "{} missing: `cargo xtask bench` builds it (or cargo build --release -p kpack-cli \
             -p kpack-cxx)",
            ctx.kpack.display()
        );
    }
    let rows = sections::run(&ctx, &args.only)?;
    let sh = Shell::new()?;
    sh.change_dir(root);
    Report::collect(&sh, args.reps, rows)?.write(&bench_dir)?;
    if !args.keep_work {
        std::fs::remove_dir_all(&work).ok();
    }
    Ok(())
}

/// `--reps` at least 1 (`--only` is checked by its parser).
fn check_args(args: &BenchArgs) -> Result<()> {
    if args.reps == 0 {
        bail!("--reps must be at least 1");
    }
    Ok(())
}
