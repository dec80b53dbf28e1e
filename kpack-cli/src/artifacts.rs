//! The artifact subcommands: `split`, `verify`, `recombine`, `pack-tree`.
//! Flag names follow the reference tools (`split_artifacts.py`,
//! `verify_artifacts.py`, `recombine_artifacts.py`) so that existing
//! scripts keep working.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};
use kpack_engine::artifact::pack_tree::PackTreeSummary;
use kpack_engine::artifact::recombine::RecombineSummary;
use kpack_engine::artifact::split::SplitSummary;
use kpack_engine::artifact::verify::VerifyReport;
use kpack_engine::artifact::{
    self, GpuTargets, PackTreeOptions, PackagingConfig, RecombineOptions, SplitInput, SplitOptions,
    VerifyOptions,
};
use kpack_engine::{with_jobs, Database, Observer};
use kpack_format::bytes::format_size;
use serde::Serialize;

use crate::cli::{Compression, ExpectTargets};

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
    /// Database handlers to enable: rocblas, hipblaslt, hipsparselt,
    /// aotriton, miopen, composablekernel, hipkernelprovider, hotswap_cache,
    /// rocfft (the first to claim a file wins, in this order).
    #[arg(long, value_name = "NAME", num_args = 1..)]
    split_databases: Vec<String>,
    /// Keep only the code objects and database files of these targets'
    /// base processors (`gfx90a:xnack-` keeps everything of gfx90a),
    /// matched as whole target IDs (`gfx1250` keeps nothing of
    /// gfx1250-strict; `gfx125X` keeps gfx1250, gfx1251, but strict targets
    /// only when named); those of other targets are left out (their own
    /// job emits them).
    /// Every fat binary is still offloaded; a split where fat binaries
    /// exist but not one code object matches is refused.
    #[arg(long, value_name = "T", num_args = 1..)]
    gpu_targets: Option<Vec<String>>,
    #[command(flatten)]
    expect: ExpectTargets,
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
    #[arg(long, value_name = "DIR", required_unless_present = "tree")]
    artifacts_dir: Option<PathBuf>,
    /// An install tree (host binaries and `.kpack` archives, as pack-tree
    /// and installed artifacts lay them out): fat binaries where the
    /// archives expect offloaded ones, offloaded binaries that resolve for
    /// no target, code objects of another build under a binary's keys,
    /// invalid binaries and archives. One line per problem; exit 1 if any.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["artifacts_dir", "config", "split_databases"])]
    tree: Option<PathBuf>,
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
    /// The database handlers split was given: generic artifacts must hold
    /// no file they claim. (Per-target artifacts are always checked with
    /// every handler.)
    #[arg(long, value_name = "NAME", num_args = 1..)]
    split_databases: Vec<String>,
    #[command(flatten)]
    expect: ExpectTargets,
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
    #[command(flatten)]
    expect: ExpectTargets,
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
    opts.gpu_targets = a.gpu_targets.as_deref().map(GpuTargets::new).transpose()?;
    opts.expect_targets = a.expect.expect_targets.clone();
    let reporter = Reporter::new(a.common.verbose, a.common.json);
    if a.clang_offload_bundler.is_some() {
        reporter.note("--clang-offload-bundler is not needed: kpack reads offload bundles itself");
    }
    let input = SplitInput::new(
        a.artifact_dir.as_deref(),
        a.artifact_prefix.as_deref(),
        a.batch_artifact_parent_dir.as_deref(),
    )?;
    let summary = with_jobs(jobs(a.common.jobs), || {
        artifact::split(input, &opts, &reporter)
    })?;
    reporter.finish();
    let summary = summary?;
    if a.common.json {
        print_json(&summary);
    } else {
        print_split(&summary);
    }
    Ok(summary.check()?)
}

fn print_split(summary: &SplitSummary) {
    for art in &summary.artifacts {
        if let Some(e) = &art.error {
            outln!("{}: FAILED: {e}", art.input);
            continue;
        }
        outln!(
            "{} -> {}: {} binaries, {} code objects, {} database files, {} -> {} bytes",
            art.input,
            art.outputs.join(" "),
            art.counts.binaries,
            art.counts.code_objects,
            art.database_files,
            art.counts.bytes_in,
            art.counts.bytes_out
        );
        for p in &art.skipped_prefixes {
            outln!("  skipped prefix (no such directory): {p}");
        }
        if art.counts.dropped_code_objects + art.dropped_database_files > 0 {
            outln!(
                "  left out (other --gpu-targets): {} code objects, {} database files",
                art.counts.dropped_code_objects,
                art.dropped_database_files
            );
        }
    }
    let t = &summary.totals;
    outln!(
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

fn verify(a: VerifyArgs) -> CliResult {
    if let Some(tree) = &a.tree {
        return verify_tree(tree, &a);
    }
    let dir = a.artifacts_dir.clone().expect("clap requires it");
    let config = a.config.as_deref().map(PackagingConfig::load).transpose()?;
    let databases = Database::parse_list(&a.split_databases)?;
    let reporter = Reporter::new(a.verbose, a.json);
    let opts = VerifyOptions {
        config,
        databases,
        expect_targets: a.expect.expect_targets.clone(),
    };
    let report = with_jobs(jobs(a.jobs), || {
        artifact::verify_artifacts(&dir, &opts, &reporter)
    });
    reporter.finish();
    let report = report??;
    if a.json {
        print_json(&report);
    } else {
        print_verify(&report);
    }
    Ok(report.check()?)
}

/// `verify --tree`: one line per problem (`<binary>: <problem>`), a
/// summary line when there is none.
fn verify_tree(tree: &Path, a: &VerifyArgs) -> CliResult {
    let reporter = Reporter::new(a.verbose, a.json);
    let report = with_jobs(jobs(a.jobs), || {
        kpack_engine::install_tree::verify_tree(tree, &reporter)
    });
    reporter.finish();
    let report = report??;
    if a.json {
        print_json(&report);
    } else {
        for p in &report.problems {
            outln!("{}: {}", p.binary, p.message);
        }
        for n in &report.notes {
            outln!("note: {}: {}", n.binary, n.message);
        }
        if report.ok() {
            outln!(
                "{}: OK: {} binar{} with device code ({} offloaded), {} archive(s), {} code object(s) read; targets: {}",
                tree.display(),
                report.binaries,
                if report.binaries == 1 { "y" } else { "ies" },
                report.offloaded,
                report.archives,
                report.code_objects,
                if report.targets.is_empty() { "none".to_string() } else { report.targets.join(", ") }
            );
        }
    }
    Ok(report.check()?)
}

fn print_verify(report: &VerifyReport) {
    for p in &report.problems {
        outln!("PROBLEM: {p}");
    }
    for n in &report.notes {
        outln!("note: {n}");
    }
    outln!(
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

fn recombine(a: RecombineArgs) -> CliResult {
    let config = PackagingConfig::load(&a.config)?;
    let reporter = Reporter::new(a.verbose, a.json);
    let opts = RecombineOptions {
        output_dir: a.output_dir.clone(),
        components: a.component.clone(),
        expect_targets: a.expect.expect_targets.clone(),
    };
    let summary = with_jobs(jobs(a.jobs), || {
        artifact::recombine(&a.input_shards_dir, &config, &opts, &reporter)
    });
    reporter.finish();
    let summary = summary??;
    if a.json {
        print_json(&summary);
    } else {
        print_recombine(&summary);
    }
    Ok(())
}

fn print_recombine(summary: &RecombineSummary) {
    for c in &summary.components {
        outln!("{}_generic (from {})", c.component, c.generic_from);
        for g in &c.groups {
            let targets: Vec<String> = g
                .targets
                .iter()
                .map(|(t, s)| format!("{t} (from {s})"))
                .collect();
            outln!("{}: {}", g.artifact, targets.join(", "));
        }
    }
    for d in &summary.generic_differences {
        outln!(
            "generic difference: {}/{}: {} (shards {} and {}; taken from {})",
            d.artifact,
            d.path,
            d.what,
            d.shards[0],
            d.shards[1],
            d.shards[0]
        );
    }
    for c in &summary.file_conflicts {
        outln!(
            "file conflict: {}/{}: shards {} differ (taken from {})",
            c.artifact,
            c.path,
            c.shards.join(", "),
            c.taken_from
        );
    }
    outln!(
        "recombined {} component(s) from {} shard(s) into {} artifact(s) in {}, {} bytes, {:.1} s",
        summary.components.len(),
        summary.shards.len(),
        summary.outputs.len(),
        summary.output_dir,
        summary.bytes_out,
        summary.seconds
    );
}

fn pack_tree(a: PackTreeArgs) -> CliResult {
    let mut opts = PackTreeOptions::new(&a.group_name);
    opts.gfx_arch_family = a.gfx_arch_family.clone();
    opts.set_gfx_arches(&a.gfx_arches);
    opts.scheme = a.common.compression.scheme();
    opts.level = a.common.compression_level;
    opts.overwrite = a.overwrite;
    opts.tmp_dir = a.tmp_dir.clone();
    let reporter = Reporter::new(a.common.verbose, a.common.json);
    let summary = with_jobs(jobs(a.max_workers.or(a.common.jobs)), || {
        artifact::pack_tree(&a.input, &a.output, &opts, &reporter)
    });
    reporter.finish();
    let summary = summary??;
    if a.common.json {
        print_json(&summary);
    } else {
        print_pack_tree(&summary);
    }
    Ok(())
}

fn print_pack_tree(summary: &PackTreeSummary) {
    outln!(
        "{} -> {}: {} files, {} binaries offloaded, {} code objects ({} left out), {} -> {} bytes",
        summary.input,
        summary.output,
        summary.counts.files,
        summary.counts.binaries,
        summary.counts.code_objects,
        summary.counts.dropped_code_objects,
        summary.counts.bytes_in,
        summary.counts.bytes_out
    );
    for ar in &summary.archives {
        outln!(
            "  {}: {} code object(s), {} -> {} bytes",
            ar.path,
            ar.code_objects,
            ar.bytes_in,
            ar.bytes_out
        );
    }
}

fn print_json(v: &impl Serialize) {
    crate::capture::print_json(v);
}

/// Notes (under --verbose) and warnings on stderr, and a progress bar of
/// the bytes processed when stderr is a terminal (never with --json).
pub(crate) struct Reporter {
    verbose: bool,
    bar: Option<ProgressBar>,
}

impl Reporter {
    pub(crate) fn new(verbose: bool, json: bool) -> Self {
        let bar = (!json && std::io::stderr().is_terminal())
            .then(|| progress_bar(ProgressDrawTarget::stderr_with_hz(10)));
        Reporter { verbose, bar }
    }

    /// A line on stderr (above the bar, which is redrawn after it).
    fn line(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.suspend(|| eprintln!("{text}")),
            None => eprintln!("{text}"),
        }
    }

    pub(crate) fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// `[#########---------------------]  30% 1.2 MiB / 4.0 MiB  3s`: the
/// sizes through kpack's one byte-size formatter.
fn progress_bar(target: ProgressDrawTarget) -> ProgressBar {
    let style =
        ProgressStyle::with_template("[{bar:30}] {percent:>3}% {done} / {total}  {elapsed}")
            .expect("a valid progress template")
            .progress_chars("#-")
            .with_key("done", |s: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = w.write_str(&format_size(s.pos().min(s.len().unwrap_or(0))));
            })
            .with_key("total", |s: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = w.write_str(&format_size(s.len().unwrap_or(0)));
            });
    ProgressBar::with_draw_target(Some(0), target).with_style(style)
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
            bar.inc_length(bytes);
        }
    }

    fn advance(&self, bytes: u64) {
        if let Some(bar) = &self.bar {
            bar.inc(bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A terminal that records what is drawn on it.
    #[derive(Debug, Clone, Default)]
    struct Screen(Arc<Mutex<String>>);

    impl indicatif::TermLike for Screen {
        fn width(&self) -> u16 {
            100
        }
        fn move_cursor_up(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn write_line(&self, s: &str) -> std::io::Result<()> {
            let mut t = self.0.lock().unwrap();
            t.push_str(s);
            t.push('\n');
            Ok(())
        }
        fn write_str(&self, s: &str) -> std::io::Result<()> {
            self.0.lock().unwrap().push_str(s);
            Ok(())
        }
        fn clear_line(&self) -> std::io::Result<()> {
            self.0.lock().unwrap().push_str("<clear>");
            Ok(())
        }
        fn flush(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_bar_shows_bytes_done_and_to_do() {
        let screen = Screen::default();
        let bar = progress_bar(ProgressDrawTarget::term_like(Box::new(screen.clone())));
        let r = Reporter {
            verbose: false,
            bar: Some(bar),
        };
        r.add_work(3 << 20);
        r.advance(1 << 20);
        let shown = screen.0.lock().unwrap().clone();
        let last = shown.rsplit("<clear>").next().unwrap();
        assert!(
            last.starts_with("[##########--------------------]  33% 1.0 MiB / 3.0 MiB  "),
            "{shown:?}"
        );
        r.advance(5 << 20);
        let shown = screen.0.lock().unwrap().clone();
        let last = shown.rsplit("<clear>").next().unwrap();
        assert!(
            last.starts_with(&format!("[{}] 100% 3.0 MiB / 3.0 MiB  ", "#".repeat(30))),
            "{shown:?}"
        );
        r.finish();
        assert!(screen.0.lock().unwrap().ends_with("<clear>"));
    }

    #[test]
    fn no_bar_with_json_or_without_a_terminal() {
        assert!(Reporter::new(false, true).bar.is_none());
        if !std::io::stderr().is_terminal() {
            assert!(Reporter::new(true, false).bar.is_none());
        }
    }
}
