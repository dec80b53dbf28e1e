//! The artifact subcommands: `split`, `verify`, `recombine`, `pack-tree`.
//! Flag names follow the reference tools (`split_artifacts.py`,
//! `verify_artifacts.py`, `recombine_artifacts.py`) so that existing
//! scripts keep working.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use kpack_core::archive::Scheme;
use kpack_core::artifact::{
    self, with_jobs, ArtifactError, Database, Observer, PackTreeOptions, PackagingConfig,
    RecombineOptions, SplitOptions, VerifyOptions,
};
use serde::Serialize;

type CliResult = Result<(), Box<dyn std::error::Error>>;

#[derive(Subcommand)]
pub enum ArtifactCommand {
    /// Split build artifacts: each into `<prefix>_generic` (host
    /// code; fat binaries offloaded) and `<prefix>_<target>` per target
    /// (its `.kpack` archive and database files).
    Split(SplitArgs),
    /// Check split artifacts (or, with --config, recombined ones): manifests,
    /// no device code left in generic artifacts, only their own target's
    /// files in per-target artifacts, archives that decompress, and every
    /// wrapper of every offloaded binary resolving through the runtime's
    /// search logic once installed.
    Verify(VerifyArgs),
    /// Recombine split artifacts of several shards into one generic artifact
    /// and one artifact per architecture group of a packaging config.
    Recombine(RecombineArgs),
    /// Pack a whole install tree: a host-only copy plus
    /// `.kpack/<group>_<target>.kpack` archives at its root.
    PackTree(PackTreeArgs),
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Compression {
    #[value(alias = "noop")]
    None,
    Zstd,
}

impl Compression {
    fn scheme(self) -> Scheme {
        match self {
            Compression::None => Scheme::None,
            Compression::Zstd => Scheme::ZstdPerKernel,
        }
    }
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["artifact_dir", "batch_artifact_parent_dir"])))]
pub struct SplitArgs {
    /// One artifact directory (with artifact_manifest.txt).
    #[arg(long, value_name = "DIR")]
    artifact_dir: Option<PathBuf>,
    /// Its prefix (default: the directory name without its last `_` part,
    /// `blas_lib_gfx110X-dgpu` → `blas_lib`).
    #[arg(long, value_name = "P", requires = "artifact_dir")]
    artifact_prefix: Option<String>,
    /// Split every artifact in this shard directory.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["artifact_dir", "artifact_prefix"])]
    batch_artifact_parent_dir: Option<PathBuf>,
    /// Where the output artifacts go (created if missing).
    #[arg(long, value_name = "OUT")]
    output_dir: PathBuf,
    /// Database handlers to enable: rocblas, hipblaslt, aotriton, miopen,
    /// hipkernelprovider.
    #[arg(long, value_name = "NAME", num_args = 1..)]
    split_databases: Vec<String>,
    #[command(flatten)]
    common: Common,
    /// Batch mode: when an artifact fails, report it and finish the others.
    #[arg(long)]
    keep_going: bool,
    /// Replace output artifacts that exist already.
    #[arg(long)]
    overwrite: bool,
    /// Scratch space for decompressed code objects (default: OUT).
    #[arg(long, value_name = "DIR")]
    tmp_dir: Option<PathBuf>,
    /// Accepted for compatibility with the reference tool; kpack reads
    /// offload bundles itself and runs no external bundler.
    #[arg(long, value_name = "PATH")]
    clang_offload_bundler: Option<PathBuf>,
}

#[derive(Args)]
struct Common {
    /// Worker threads (default: all cores). The output is the same for any
    /// value.
    #[arg(long, short = 'j', value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    jobs: Option<u64>,
    #[arg(long, value_enum, default_value = "zstd")]
    compression: Compression,
    /// zstd level (1-22).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(i32).range(1..=22))]
    compression_level: i32,
    /// Print a JSON summary on stdout.
    #[arg(long)]
    json: bool,
    /// Say what is done to each artifact, and every note.
    #[arg(long, short = 'v')]
    verbose: bool,
}

#[derive(Args)]
pub struct VerifyArgs {
    /// Directory of split (or recombined) artifacts.
    #[arg(long, value_name = "DIR")]
    artifacts_dir: PathBuf,
    /// The packaging config: the artifacts are recombined ones, named after
    /// its groups.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Worker threads (default: all cores).
    #[arg(long, short = 'j', value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    jobs: Option<u64>,
    #[arg(long)]
    json: bool,
    #[arg(long, short = 'v')]
    verbose: bool,
    /// Accepted for compatibility with the reference tool (unused).
    #[arg(long, value_name = "PATH")]
    clang_offload_bundler: Option<PathBuf>,
}

#[derive(Args)]
pub struct RecombineArgs {
    /// Directory of shard directories, each holding split artifacts.
    #[arg(long, value_name = "DIR")]
    input_shards_dir: PathBuf,
    /// Packaging config (JSON).
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// Where the recombined artifacts go (created if missing).
    #[arg(long, value_name = "OUT")]
    output_dir: PathBuf,
    /// Only this component (repeatable).
    #[arg(long, value_name = "C")]
    component: Vec<String>,
    /// Worker threads (default: all cores).
    #[arg(long, short = 'j', value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    jobs: Option<u64>,
    #[arg(long)]
    json: bool,
    #[arg(long, short = 'v')]
    verbose: bool,
}

#[derive(Args)]
pub struct PackTreeArgs {
    /// The install tree.
    #[arg(long, value_name = "DIR")]
    input: PathBuf,
    /// The host-only tree to write (must not exist or be empty, unless
    /// --overwrite).
    #[arg(long, value_name = "DIR")]
    output: PathBuf,
    /// Archive name prefix: `.kpack/<group>_<target>.kpack`.
    #[arg(long, value_name = "G")]
    group_name: String,
    /// The archives' gfx_arch_family field (default: each archive's target).
    #[arg(long, value_name = "F")]
    gfx_arch_family: Option<String>,
    /// Keep only code objects of these architectures (`gfx90a` takes
    /// gfx90a:xnack± too). Comma- or space-separated.
    #[arg(long, value_name = "ARCH", num_args = 1.., value_delimiter = ',')]
    gfx_arches: Vec<String>,
    /// Same as --jobs (the reference tool's name).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..), conflicts_with = "jobs")]
    max_workers: Option<u64>,
    #[command(flatten)]
    common: Common,
    /// Replace an existing output tree.
    #[arg(long)]
    overwrite: bool,
    /// Scratch space (default: beside the output).
    #[arg(long, value_name = "DIR")]
    tmp_dir: Option<PathBuf>,
    /// Accepted for compatibility with the reference tool (unused).
    #[arg(long, value_name = "PATH")]
    clang_offload_bundler: Option<PathBuf>,
}

pub fn run(command: ArtifactCommand) -> CliResult {
    match command {
        ArtifactCommand::Split(a) => split(a),
        ArtifactCommand::Verify(a) => verify(a),
        ArtifactCommand::Recombine(a) => recombine(a),
        ArtifactCommand::PackTree(a) => pack_tree(a),
    }
}

fn jobs(n: Option<u64>) -> Option<usize> {
    n.map(|n| usize::try_from(n).unwrap_or(usize::MAX))
}

fn split(a: SplitArgs) -> CliResult {
    let databases = Database::parse_list(&a.split_databases)?;
    let mut opts = SplitOptions::new(&a.output_dir);
    opts.databases = databases;
    opts.scheme = a.common.compression.scheme();
    opts.level = a.common.compression_level;
    opts.overwrite = a.overwrite;
    opts.keep_going = a.keep_going;
    opts.tmp_dir = a.tmp_dir.clone();
    let reporter = Reporter::new(a.common.verbose);
    if a.clang_offload_bundler.is_some() {
        reporter.note("--clang-offload-bundler is not needed: kpack reads offload bundles itself");
    }
    let summary = with_jobs(jobs(a.common.jobs), || {
        match (&a.artifact_dir, &a.batch_artifact_parent_dir) {
            (Some(dir), _) => {
                let prefix = match &a.artifact_prefix {
                    Some(p) => p.clone(),
                    None => {
                        let name = dir
                            .canonicalize()
                            .ok()
                            .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
                            .unwrap_or_default();
                        artifact::artifact_prefix(&name)
                        .ok_or_else(|| ArtifactError::Input {
                            path: dir.clone(),
                            what: "cannot derive the artifact prefix from the directory name: pass --artifact-prefix".into(),
                        })?
                        .to_string()
                    }
                };
                artifact::split_artifact(dir, &prefix, &opts, &reporter)
            }
            (None, Some(parent)) => artifact::split_batch(parent, &opts, &reporter),
            (None, None) => unreachable!("clap requires one input"),
        }
    })?;
    reporter.finish();
    let summary = summary?;
    if a.common.json {
        print_json(&summary);
    } else {
        for art in &summary.artifacts {
            if let Some(e) = &art.error {
                println!("{}: FAILED: {e}", art.input);
                continue;
            }
            println!(
                "{} -> {}: {} binaries, {} code objects, {} database files, {} -> {} bytes",
                art.input,
                art.outputs.join(" "),
                art.binaries,
                art.code_objects,
                art.database_files,
                art.bytes_in,
                art.bytes_out
            );
            for p in &art.skipped_prefixes {
                println!("  skipped prefix (no such directory): {p}");
            }
        }
        let t = &summary.totals;
        println!(
            "split {} artifact(s) into {}: {} binaries, {} code objects in {} archives, {} database files, {} -> {} bytes, {:.1} s",
            t.artifacts,
            t.output_artifacts,
            t.binaries,
            t.code_objects,
            t.archives,
            t.database_files,
            t.bytes_in,
            t.bytes_out,
            summary.seconds
        );
    }
    if summary.failed > 0 {
        return Err(ArtifactError::ArtifactsFailed {
            failed: summary.failed,
            total: summary.artifacts.len(),
        }
        .into());
    }
    Ok(())
}

fn verify(a: VerifyArgs) -> CliResult {
    let config = a.config.as_deref().map(PackagingConfig::load).transpose()?;
    let reporter = Reporter::new(a.verbose);
    let report = with_jobs(jobs(a.jobs), || {
        artifact::verify_artifacts(&a.artifacts_dir, &VerifyOptions { config }, &reporter)
    });
    reporter.finish();
    let report = report??;
    if a.json {
        print_json(&report);
    } else {
        for p in &report.problems {
            println!("PROBLEM: {p}");
        }
        println!(
            "{}: {} artifact(s), {} component(s), {} archive(s), {} code object(s), {} database file(s), {} offloaded binar{}, {} wrapper resolution(s); targets: {}; {}",
            report.artifacts_dir,
            report.artifacts,
            report.components,
            report.archives,
            report.code_objects,
            report.database_files,
            report.offloaded_binaries,
            if report.offloaded_binaries == 1 { "y" } else { "ies" },
            report.wrappers_resolved,
            if report.targets.is_empty() { "none".to_string() } else { report.targets.join(", ") },
            if report.ok() { "OK".to_string() } else { format!("{} problem(s)", report.problems.len()) }
        );
    }
    if !report.ok() {
        return Err(ArtifactError::VerifyFailed {
            problems: report.problems.len(),
        }
        .into());
    }
    Ok(())
}

fn recombine(a: RecombineArgs) -> CliResult {
    let config = PackagingConfig::load(&a.config)?;
    let reporter = Reporter::new(a.verbose);
    let opts = RecombineOptions {
        output_dir: a.output_dir.clone(),
        components: a.component.clone(),
    };
    let summary = with_jobs(jobs(a.jobs), || {
        artifact::recombine(&a.input_shards_dir, &config, &opts, &reporter)
    });
    reporter.finish();
    let summary = summary??;
    if a.json {
        print_json(&summary);
    } else {
        for c in &summary.components {
            println!("{}_generic (from {})", c.component, c.generic_from);
            for g in &c.groups {
                let targets: Vec<String> = g
                    .targets
                    .iter()
                    .map(|(t, s)| format!("{t} (from {s})"))
                    .collect();
                println!("{}: {}", g.artifact, targets.join(", "));
            }
        }
        println!(
            "recombined {} component(s) from {} shard(s) into {} artifact(s) in {}, {} bytes, {:.1} s",
            summary.components.len(),
            summary.shards.len(),
            summary.outputs.len(),
            summary.output_dir,
            summary.bytes_out,
            summary.seconds
        );
    }
    Ok(())
}

fn pack_tree(a: PackTreeArgs) -> CliResult {
    let mut opts = PackTreeOptions::new(&a.group_name);
    opts.gfx_arch_family = a.gfx_arch_family.clone();
    opts.gfx_arches = a
        .gfx_arches
        .iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    opts.scheme = a.common.compression.scheme();
    opts.level = a.common.compression_level;
    opts.overwrite = a.overwrite;
    opts.tmp_dir = a.tmp_dir.clone();
    let reporter = Reporter::new(a.common.verbose);
    let summary = with_jobs(jobs(a.max_workers.or(a.common.jobs)), || {
        artifact::pack_tree(&a.input, &a.output, &opts, &reporter)
    });
    reporter.finish();
    let summary = summary??;
    if a.common.json {
        print_json(&summary);
    } else {
        println!(
            "{} -> {}: {} files, {} binaries offloaded, {} code objects ({} left out), {} -> {} bytes",
            summary.input,
            summary.output,
            summary.files,
            summary.binaries,
            summary.code_objects,
            summary.dropped_code_objects,
            summary.bytes_in,
            summary.bytes_out
        );
        for ar in &summary.archives {
            println!(
                "  {}: {} code object(s), {} -> {} bytes",
                ar.path, ar.code_objects, ar.bytes_in, ar.bytes_out
            );
        }
    }
    Ok(())
}

fn print_json(v: &impl Serialize) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).expect("summary serializes")
    );
}

/// Notes (under --verbose) and warnings on stderr, and a progress bar when
/// stderr is a terminal.
struct Reporter {
    verbose: bool,
    bar: Option<Bar>,
}

struct Bar {
    total: AtomicU64,
    done: AtomicU64,
    state: Mutex<BarState>,
}

struct BarState {
    last: Option<Instant>,
    shown: bool,
    start: Instant,
}

impl Reporter {
    fn new(verbose: bool) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| Bar {
            total: AtomicU64::new(0),
            done: AtomicU64::new(0),
            state: Mutex::new(BarState {
                last: None,
                shown: false,
                start: Instant::now(),
            }),
        });
        Reporter { verbose, bar }
    }

    /// A line on stderr, clearing the bar first (it is redrawn on the next
    /// update). Locks: bar state, then stderr, as `draw` does.
    fn line(&self, text: &str) {
        let mut st = self
            .bar
            .as_ref()
            .map(|bar| bar.state.lock().unwrap_or_else(|e| e.into_inner()));
        let mut err = std::io::stderr().lock();
        if let Some(st) = st.as_deref_mut() {
            if st.shown {
                let _ = write!(err, "\r\x1b[K");
                st.shown = false;
                st.last = None;
            }
        }
        let _ = writeln!(err, "{text}");
    }

    /// Redraw the bar, at most ten times a second.
    fn draw(&self) {
        let Some(bar) = &self.bar else { return };
        let mut st = bar.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if st
            .last
            .is_some_and(|t| now - t < Duration::from_millis(100))
        {
            return;
        }
        st.last = Some(now);
        let total = bar.total.load(Ordering::Relaxed).max(1);
        let done = bar.done.load(Ordering::Relaxed).min(total);
        let width = 30;
        let filled = (done as f64 / total as f64 * width as f64) as usize;
        let _ = write!(
            std::io::stderr().lock(),
            "\r\x1b[K[{}{}] {:>3}% {} / {}  {:.0} s",
            "#".repeat(filled),
            "-".repeat(width - filled),
            done * 100 / total,
            kpack_core::bytes::format_size(done),
            kpack_core::bytes::format_size(total),
            (now - st.start).as_secs_f64()
        );
        st.shown = true;
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            let mut st = bar.state.lock().unwrap_or_else(|e| e.into_inner());
            if st.shown {
                let _ = write!(std::io::stderr().lock(), "\r\x1b[K");
                st.shown = false;
            }
        }
    }
}

impl Observer for Reporter {
    fn note(&self, message: &str) {
        if self.verbose {
            self.line(&format!("kpack: {message}"));
        }
    }

    fn warn(&self, message: &str) {
        self.line(&format!("kpack: warning: {message}"));
    }

    fn add_work(&self, bytes: u64) {
        if let Some(bar) = &self.bar {
            bar.total.fetch_add(bytes, Ordering::Relaxed);
            self.draw();
        }
    }

    fn advance(&self, bytes: u64) {
        if let Some(bar) = &self.bar {
            bar.done.fetch_add(bytes, Ordering::Relaxed);
            self.draw();
        }
    }
}
