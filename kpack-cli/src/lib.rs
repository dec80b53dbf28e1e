//! `kpack`: the command-line face of the library crates (kpack-format,
//! kpack-loader, kpack-host, kpack-engine). Flags become calls, results
//! become text, JSON or SVG; all the work happens in those crates.
//!
//! A library as well as the `kpack` binary: [`main_with_args`] is the
//! whole command (the binary's `main`, and the `kpack` console script of
//! the Python package, which runs it in-process), and [`run_captured`]
//! runs one command and hands back its `--json` summary and its error
//! instead of printing them (kpack's Python API).

#![forbid(unsafe_code)]

/// `println!` that ends the process quietly when standard output is a
/// closed pipe (`kpack ls big.so | head`), as a program killed by SIGPIPE
/// would (status 141), and reports any other write error.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::write_stdout_line(format_args!($($arg)*))
    };
}

mod artifacts;
mod bundle;
mod doctor;
mod svg;
mod wheels;

use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};
use kpack_format::archive::Scheme;
use kpack_host::inspect::{self, Listing};
use kpack_host::offload::{self, OffloadOptions};
use kpack_host::output::{self, Durability};

#[derive(Parser)]
#[command(
    name = "kpack",
    version,
    about = "Split GPU device code out of HIP fat binaries into .kpack archives, and inspect them"
)]
struct Cli {
    /// fsync every output before exiting (once, at the end of the command),
    /// so that it survives a power failure; off by default, as with build
    /// tools. `KPACK_DURABLE=1` does the same. Outputs are atomic either way.
    #[arg(long, global = true)]
    durable: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Describe a fat binary (bundles, targets, sizes), a .kpack archive
    /// (header, scheme, targets, keys) or an offloaded host binary (its HIPK
    /// metadata).
    Ls {
        file: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Write the code objects of a fat binary or archive to files:
    /// `<target>.hsaco` (`<target>#<N>.hsaco` for binaries with several
    /// bundles), or `<key>@<target>.hsaco` for archives (`/`, `%`, `@` in the
    /// key written as `%2F`, `%25`, `%40`).
    Extract {
        file: PathBuf,
        /// Output directory (created if missing).
        #[arg(short, long)]
        output: PathBuf,
        /// Only code objects for this target ID.
        #[arg(long)]
        target: Option<String>,
        /// Print a JSON list of the files written.
        #[arg(long)]
        json: bool,
    },
    /// Move the device code of a fat binary into per-target .kpack archives
    /// and write a host-only binary that points at them.
    Offload {
        input: PathBuf,
        /// The host-only binary to write (may be INPUT itself).
        #[arg(short, long)]
        output: PathBuf,
        /// Directory for the archives (`<group>_<target>.kpack`).
        #[arg(long)]
        archive_dir: PathBuf,
        /// The binary's key in the archives (default: OUTPUT's file name).
        #[arg(long)]
        kernel_name: Option<String>,
        /// Archive path written into the binary, relative to its directory
        /// unless absolute; `@GFXARCH@` stands for a target ID. Repeatable.
        /// Default: `<path from OUTPUT's dir to ARCHIVE_DIR>/<group>_@GFXARCH@.kpack`.
        #[arg(long = "search-path", value_name = "PATTERN")]
        search_paths: Vec<String>,
        /// A search path written after the others (default or given);
        /// repeatable. For an installed layout that differs from the build
        /// tree's.
        #[arg(long = "extra-search-path", value_name = "PATTERN")]
        extra_search_paths: Vec<String>,
        /// Archive name prefix (default: OUTPUT's name up to its first `.`).
        #[arg(long)]
        group: Option<String>,
        #[arg(long, value_enum, default_value = "zstd")]
        compression: Compression,
        /// zstd level (1-22).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(i32).range(1..=22))]
        compression_level: i32,
        /// Print a JSON summary.
        #[arg(long)]
        json: bool,
    },
    /// Check a rewritten host binary (ELF, or PE: `verify-binary` is the
    /// same command): segments or sections, headers, relocations and
    /// wrappers; for an offloaded binary its HIPK metadata, for a fat one
    /// (what prune and restore write) its bundles.
    #[command(visible_alias = "verify-binary")]
    VerifyElf {
        file: PathBuf,
        /// Only an offloaded binary passes (a fat one fails), as with the
        /// reference `verify_elf` tool.
        #[arg(long)]
        offloaded: bool,
        /// Print a JSON summary.
        #[arg(long)]
        json: bool,
    },
    /// Keep only some targets inside a fat binary's own bundles: the output
    /// is still a fat binary (HIPF wrappers) that any HIP runtime loads,
    /// with every other target's bytes gone from the file.
    Prune {
        input: PathBuf,
        /// The pruned binary to write (may be INPUT itself).
        #[arg(short, long)]
        output: PathBuf,
        /// Targets to keep, matched as the loader matches: `gfx90a` keeps
        /// `gfx90a:xnack+` and `gfx90a:xnack-`; `gfx90a:xnack-` keeps
        /// `gfx90a:xnack-` and `gfx90a`.
        #[arg(long, num_args = 1.., required = true, value_name = "TARGET")]
        targets: Vec<String>,
        /// Also keep every generic target (`gfx11-generic`, ...).
        #[arg(long)]
        keep_generic: bool,
        /// Print a JSON summary.
        #[arg(long)]
        json: bool,
    },
    /// The way back from an offloaded binary: a fat binary (HIPF wrappers,
    /// `.hip_fatbin` again) with the chosen targets' code objects, found in
    /// the archives its metadata names as the runtime finds them
    /// (ROCM_KPACK_PATH and ROCM_KPACK_PATH_PREFIX honoured).
    Restore {
        input: PathBuf,
        /// The fat binary to write (may be INPUT itself).
        #[arg(short, long)]
        output: PathBuf,
        /// Targets to put back, matched as prune matches them (default:
        /// every target the archives have).
        #[arg(long, num_args = 1.., value_name = "TARGET")]
        targets: Vec<String>,
        /// With --targets: also every generic target.
        #[arg(long)]
        keep_generic: bool,
        /// Bundle form: `auto` (uncompressed when they fit the original
        /// range, else compressed), `none` or `zstd` (CCOB).
        #[arg(long, value_enum, default_value = "auto")]
        compression: RestoreCompression,
        /// Print a JSON summary.
        #[arg(long)]
        json: bool,
    },
    /// For each wrapper of an offloaded binary, what the runtime would load
    /// for a device with these ISAs and why: the candidate archives in
    /// order, whether each exists, opens, lists a compatible target and
    /// holds the key, and the winner or the error code (the loader's own
    /// search, ROCM_KPACK_* honoured). Exit 0 when every wrapper resolves.
    Why {
        binary: PathBuf,
        /// A device ISA (`gfx90a:xnack-`, `amdgcn-amd-amdhsa--gfx1100`), in
        /// priority order; repeatable.
        #[arg(long = "arch", required = true, value_name = "ISA")]
        archs: Vec<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Where the bytes of a package go: fat and offloaded binaries,
    /// archives, trees (artifact or install trees) and wheels; host vs
    /// device bytes, per target and per binary, stored and uncompressed,
    /// and the code objects archives share.
    Size {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Also write a treemap (binary -> host code and targets) as SVG.
        #[arg(long, value_name = "FILE")]
        svg: Option<PathBuf>,
    },
    /// Compare two paths of the same kind (two builds of a library, two
    /// trees, two wheels): targets, binaries and code objects added,
    /// removed, grown or shrunk, with totals.
    Diff {
        a: PathBuf,
        b: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// What keeps the GPU code of an installation from loading on this
    /// machine, and what fixes it: every offloaded binary under the paths
    /// resolved for every GPU (detected, or --arch) as the runtime would.
    /// Exit 0 when all resolve, 1 when problems are found, 2 when nothing
    /// could be checked.
    Doctor(doctor::DoctorArgs),
    /// Copy offloaded binaries into an application folder with the
    /// archives they need, re-pointed so that they resolve from there
    /// (checked before anything is moved in).
    Bundle(bundle::BundleArgs),
    #[command(flatten)]
    Artifact(artifacts::ArtifactCommand),
    /// Split a Python wheel whose package carries fat binaries (PyTorch)
    /// into a host wheel of the same name and one device wheel per GPU
    /// bundle (`pip install "torch[device-gfx942]"`); the flags of
    /// `python -m rocm_kpack.tools.split_python_wheels`.
    SplitWheels(Box<wheels::SplitWheelsArgs>),
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum RestoreCompression {
    Auto,
    None,
    Zstd,
}

impl RestoreCompression {
    fn restore(self) -> kpack_host::restore::Compression {
        use kpack_host::restore::Compression as C;
        match self {
            RestoreCompression::Auto => C::Auto,
            RestoreCompression::None => C::None,
            RestoreCompression::Zstd => C::Zstd,
        }
    }
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Compression {
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

/// Run `kpack` with `args` (the first is the program name, as from
/// [`std::env::args_os`]): parse them (usage errors and `--help` as clap
/// prints them), run the command, and report a failure on stderr as
/// `<error_prefix><message>`. Returns the exit status: 0, 1 for a failure
/// (2 when `doctor` could check nothing), clap's status for a usage error
/// (2).
pub fn main_with_args<I, T>(args: I, error_prefix: &str) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version are "errors" that print to stdout, status 0.
            let _ = e.print();
            return u8::try_from(e.exit_code()).unwrap_or(2);
        }
    };
    let status = match dispatch(cli) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{error_prefix}{}", kpack_host::report(e.as_ref()));
            exit_status(e.as_ref())
        }
    };
    flush_stdout();
    status
}

/// The exit status of a failed command: 2 when `doctor` could check
/// nothing, else 1.
fn exit_status(e: &(dyn std::error::Error + 'static)) -> u8 {
    match e.downcast_ref::<kpack_engine::ArtifactError>() {
        Some(kpack_engine::ArtifactError::NothingToCheck { .. }) => 2,
        _ => 1,
    }
}

/// What [`run_captured`] gives back.
pub struct Captured {
    /// The summary the command prints with `--json` (when it got that far:
    /// a batch split with failures has one and an error).
    pub json: Option<serde_json::Value>,
    /// The command's error (the same value whose [`kpack_host::report`] the
    /// command line prints after `kpack: error: `), or a usage error
    /// ([`clap::Error`]).
    pub result: Result<(), Box<dyn std::error::Error>>,
}

/// Run one command (`args` without the program name; add `--json` for a
/// summary) on this thread with its `--json` output captured instead of
/// printed. Text output and notes still go to stdout and stderr.
pub fn run_captured<I, T>(args: I) -> Captured
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let argv =
        std::iter::once(std::ffi::OsString::from("kpack")).chain(args.into_iter().map(Into::into));
    let cli = match Cli::try_parse_from(argv) {
        Ok(cli) => cli,
        Err(e) => {
            return Captured {
                json: None,
                result: Err(Box::new(e)),
            }
        }
    };
    CAPTURE.with(|c| *c.borrow_mut() = Some(None));
    let result = dispatch(cli);
    let json = CAPTURE.with(|c| c.borrow_mut().take()).flatten();
    flush_stdout();
    Captured { json, result }
}

/// Run the command; with `--durable` (or `KPACK_DURABLE=1`), the outputs
/// it wrote are fsynced at the end, all at once (those of a batch that
/// failed part-way too).
fn dispatch(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    let durable = Durability::begin(cli.durable || output::durable_from_env());
    let result = match cli.command {
        Command::Artifact(c) => artifacts::run(c),
        Command::SplitWheels(a) => wheels::split_wheels(*a),
        Command::Doctor(a) => doctor::run(a),
        Command::Bundle(a) => bundle::run(a),
        command => run(command).map_err(Into::into),
    };
    let synced = durable.commit();
    result?;
    synced?;
    Ok(())
}

thread_local! {
    /// `Some` while [`run_captured`] runs on this thread: the summary
    /// [`print_json`] was given, if any.
    static CAPTURE: std::cell::RefCell<Option<Option<serde_json::Value>>> =
        const { std::cell::RefCell::new(None) };
}

fn flush_stdout() {
    use std::io::Write;
    let _ = std::io::stdout().flush();
}

/// One line to standard output ([`outln!`]).
fn write_stdout_line(args: std::fmt::Arguments) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.write_all(b"\n")) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(141);
        }
        eprintln!("kpack: error: writing to standard output: {e}");
        std::process::exit(1);
    }
}

/// Run a subcommand other than `artifact` and `split-wheels` (dispatched in
/// [`main`]).
fn run(command: Command) -> kpack_host::Result<()> {
    match command {
        c @ (Command::Offload { .. } | Command::Prune { .. } | Command::Restore { .. }) => {
            run_rewrite(c)
        }
        Command::Artifact(_)
        | Command::SplitWheels(_)
        | Command::Doctor(_)
        | Command::Bundle(_) => {
            unreachable!("dispatched in main")
        }
        c => run_inspect(c),
    }
}

/// The commands that write a rewritten binary: offload, prune, restore.
fn run_rewrite(command: Command) -> kpack_host::Result<()> {
    match command {
        Command::Offload {
            input,
            output,
            archive_dir,
            kernel_name,
            search_paths,
            extra_search_paths,
            group,
            compression,
            compression_level,
            json,
        } => {
            let opts = OffloadOptions {
                kernel_name,
                search_paths,
                extra_search_paths,
                group,
                scheme: compression.scheme(),
                level: compression_level,
                ..OffloadOptions::new(archive_dir)
            };
            offload(&input, &output, &opts, json)
        }
        Command::Prune {
            input,
            output,
            targets,
            keep_generic,
            json,
        } => prune(&input, &output, targets, keep_generic, json),
        Command::Restore {
            input,
            output,
            targets,
            keep_generic,
            compression,
            json,
        } => {
            let opts = kpack_host::restore::RestoreOptions {
                targets,
                keep_generic,
                compression: compression.restore(),
            };
            restore(&input, &output, &opts, json)
        }
        _ => unreachable!("not a rewriting command"),
    }
}

/// The commands that read and report: ls, extract, verify-elf, why, size,
/// diff.
fn run_inspect(command: Command) -> kpack_host::Result<()> {
    match command {
        Command::Ls { file, json } => ls(&file, json),
        Command::Extract {
            file,
            output,
            target,
            json,
        } => extract(&file, &output, target.as_deref(), json),
        Command::VerifyElf {
            file,
            offloaded,
            json,
        } => verify_elf(&file, offloaded, json),
        Command::Why {
            binary,
            archs,
            json,
        } => why(&binary, &archs, json),
        Command::Size { paths, json, svg } => size(&paths, json, svg.as_deref()),
        Command::Diff { a, b, json } => diff(&a, &b, json),
        _ => unreachable!("not an inspection command"),
    }
}

/// A `--json` summary: printed, or kept for [`run_captured`].
fn print_json(v: &impl serde::Serialize) {
    let captured = CAPTURE.with(|c| match c.borrow_mut().as_mut() {
        Some(slot) => {
            *slot = Some(serde_json::to_value(v).expect("output serializes"));
            true
        }
        None => false,
    });
    if !captured {
        outln!(
            "{}",
            serde_json::to_string_pretty(v).expect("output serializes")
        );
    }
}

fn ls(file: &Path, json: bool) -> kpack_host::Result<()> {
    let listing = inspect::list(file)?;
    if json {
        print_json(&listing);
    } else {
        print_listing(&listing);
    }
    Ok(())
}

fn extract(file: &Path, output: &Path, target: Option<&str>, json: bool) -> kpack_host::Result<()> {
    let files = kpack_host::extract::extract(file, output, target)?;
    if json {
        print_json(&files);
    } else {
        for f in &files {
            outln!("{}\t{} bytes", output.join(&f.file).display(), f.size);
        }
    }
    Ok(())
}

fn offload(
    input: &Path,
    output: &Path,
    opts: &OffloadOptions,
    json: bool,
) -> kpack_host::Result<()> {
    let s = offload::offload(input, output, opts)?;
    if json {
        print_json(&s);
        return Ok(());
    }
    if let Some(note) = &s.note {
        eprintln!("kpack: note: {}: {note}", input.display());
    }
    if s.outcome == offload::Outcome::Offloaded {
        outln!(
            "{} -> {}: {} -> {} bytes, {} bundle(s), {} wrapper(s)",
            input.display(),
            output.display(),
            s.input_size,
            s.output_size,
            s.bundles,
            s.wrappers.len()
        );
        for a in &s.archives {
            outln!(
                "  {}: {} code object(s), {} -> {} bytes",
                a.path.display(),
                a.kernels,
                a.bytes_in,
                a.bytes_out
            );
        }
    }
    Ok(())
}

fn prune(
    input: &Path,
    output: &Path,
    targets: Vec<String>,
    keep_generic: bool,
    json: bool,
) -> kpack_host::Result<()> {
    let selection = kpack_host::prune::Selection {
        targets,
        keep_generic,
    };
    let s = kpack_host::prune::prune(input, output, &selection)?;
    if json {
        print_json(&s);
        return Ok(());
    }
    outln!(
        "{} -> {}: {} -> {} bytes; kept {}; dropped {}",
        input.display(),
        output.display(),
        s.input_size,
        s.output_size,
        s.kept_targets.join(", "),
        if s.dropped_targets.is_empty() {
            "nothing".to_string()
        } else {
            s.dropped_targets.join(", ")
        }
    );
    for b in &s.bundles {
        outln!(
            "  bundle {}{}: {} -> {} bytes, kept [{}]",
            b.index,
            b.compressed
                .as_ref()
                .map(|c| format!(" ({c})"))
                .unwrap_or_default(),
            b.bytes_before,
            b.bytes_after,
            b.kept.join(", ")
        );
    }
    Ok(())
}

fn restore(
    input: &Path,
    output: &Path,
    opts: &kpack_host::restore::RestoreOptions,
    json: bool,
) -> kpack_host::Result<()> {
    let s = kpack_host::restore::restore(input, output, opts)?;
    if json {
        print_json(&s);
        return Ok(());
    }
    outln!(
        "{} -> {}: {} -> {} bytes; restored {} in {} bundle(s){}",
        input.display(),
        output.display(),
        s.input_size,
        s.output_size,
        s.targets.join(", "),
        s.bundles.len(),
        if s.compressed { ", compressed" } else { "" }
    );
    for b in &s.bundles {
        outln!(
            "  bundle for code object {}: {} bytes, [{}]",
            b.co_index,
            b.bytes,
            b.targets.join(", ")
        );
    }
    Ok(())
}

fn why(binary: &Path, archs: &[String], json: bool) -> kpack_host::Result<()> {
    use kpack_host::why::Outcome;
    let w = kpack_host::why::why(binary, archs)?;
    if json {
        print_json(&w);
    } else {
        outln!(
            "{} (found at run time as {}): kernel name {}, search paths {}",
            binary.display(),
            w.binary_path.display(),
            w.kernel_name,
            w.search_paths.join(", ")
        );
        if let Some(t) = &w.targets {
            outln!("split for targets: {}", t.join(", "));
        }
        if let Some(d) = &w.device_digest {
            outln!("device code digest: {d}");
        }
        for x in &w.wrappers {
            print_wrapper_why(x);
        }
    }
    if w.all_resolve() {
        return Ok(());
    }
    let failing = w
        .wrappers
        .iter()
        .filter(|x| !matches!(x.result, Outcome::Loaded { .. }))
        .count();
    // No archive can help a binary that has no code for the device.
    let no_code = match (&w.targets, w.has_code) {
        (Some(t), Some(false)) => format!(
            ": the binary has no code for them (it was split for {} only)",
            t.join(", ")
        ),
        _ => String::new(),
    };
    Err(kpack_host::Error::request(
        binary,
        format!(
            "{failing} of {} wrapper(s) do not resolve for {}{no_code}",
            w.wrappers.len(),
            archs.join(", ")
        ),
    ))
}

/// One wrapper of `kpack why`: the targets each agent tries, the candidate
/// archives with what each gave, and the result.
fn print_wrapper_why(x: &kpack_host::why::WrapperWhy) {
    use kpack_host::why::Outcome;
    outln!("wrapper {}: key {}", x.wrapper, x.trace.key);
    for a in &x.trace.agents {
        outln!("  {} tries {}", a.arch, a.targets.join(", "));
    }
    for (i, c) in x.trace.candidates.iter().enumerate() {
        outln!(
            "  {}. {}: {}",
            i + 1,
            c.path.display(),
            candidate_status(&c.status)
        );
        for t in x.trace.attempts.iter().filter(|t| t.candidate == i) {
            outln!("       {}: {}", t.target, attempt_outcome(&t.outcome));
        }
    }
    match &x.result {
        Outcome::Loaded {
            archive,
            target,
            size,
        } => outln!(
            "  => loads {target} from {} ({size} bytes)",
            archive.display()
        ),
        Outcome::Failed {
            code,
            error,
            message,
        } => outln!("  => {error} ({code}): {message}"),
    }
}

/// What a candidate archive gave the loader, in words.
fn candidate_status(status: &kpack_loader::CandidateStatus) -> String {
    use kpack_loader::CandidateStatus;
    match status {
        CandidateStatus::NotReached => "not reached (found before it)".to_string(),
        CandidateStatus::Missing { error } => format!("missing ({error})"),
        CandidateStatus::Unusable { error } => format!("does not open: {error}"),
        CandidateStatus::SameAs { candidate } => {
            format!("the same archive as candidate {}", candidate + 1)
        }
        CandidateStatus::Opened { targets, .. } => {
            format!("opens, lists [{}]", targets.join(", "))
        }
    }
}

/// What looking up the key for one target of a candidate gave, in words.
fn attempt_outcome(outcome: &kpack_loader::AttemptOutcome) -> String {
    use kpack_loader::AttemptOutcome;
    match outcome {
        AttemptOutcome::KeyMissing => "listed, but no entry for the key".to_string(),
        AttemptOutcome::OtherBuild { binary, archive } => format!(
            "has the key, but of another build: {}",
            kpack_format::provenance::builds(binary, archive)
        ),
        AttemptOutcome::ReadFailed { error } => format!("has the key, read failed: {error}"),
        AttemptOutcome::Loaded { size } => format!("has the key: loaded, {size} bytes"),
    }
}

fn size(paths: &[PathBuf], json: bool, svg: Option<&Path>) -> kpack_host::Result<()> {
    let report = kpack_engine::size::size(paths)?;
    if let Some(file) = svg {
        let doc = crate::svg::treemap(&report.roots);
        kpack_host::output::write_atomically(file, |f| {
            std::io::Write::write_all(f, doc.as_bytes())
        })?;
    }
    if json {
        print_json(&report);
        return Ok(());
    }
    for r in &report.roots {
        print_size_root(r);
    }
    Ok(())
}

/// One path of `kpack size`: its totals, a table of its targets, and its
/// binaries, largest first.
fn print_size_root(r: &kpack_engine::size::Root) {
    use kpack_format::bytes::format_size as fs;
    outln!(
        "{}: {}, {} file(s), {}{}: host {}, device {} (stored), headers/padding/TOCs {}, other files {}",
        r.path,
        r.kind.name(),
        r.files,
        fs(r.bytes),
        r.unpacked_bytes
            .map(|u| format!(" ({} unpacked)", fs(u)))
            .unwrap_or_default(),
        fs(r.host_bytes),
        fs(r.device_bytes),
        fs(r.overhead_bytes),
        fs(r.other_bytes)
    );
    outln!(
        "  {:<24} {:>6} {:>12} {:>14} {:>7} {:>12}",
        "target",
        "codes",
        "stored",
        "uncompressed",
        "shared",
        "saved"
    );
    for (t, v) in &r.targets {
        outln!(
            "  {:<24} {:>6} {:>12} {:>14} {:>7} {:>12}",
            t,
            v.code_objects,
            fs(v.stored),
            fs(v.uncompressed),
            v.shared,
            fs(v.bytes_saved)
        );
    }
    print_size_binaries(&r.binaries);
}

/// The binaries of one path of `kpack size`, largest (host and stored
/// device bytes) first, then by name.
fn print_size_binaries(binaries: &[kpack_engine::size::BinaryBytes]) {
    use kpack_engine::size::BinaryBytes;
    use kpack_format::bytes::format_size as fs;
    let device = |b: &BinaryBytes| -> u64 { b.targets.values().map(|t| t.stored).sum() };
    let total = |b: &BinaryBytes| b.host_bytes + device(b);
    let mut bins: Vec<&BinaryBytes> = binaries.iter().collect();
    bins.sort_by(|a, b| total(b).cmp(&total(a)).then(a.name.cmp(&b.name)));
    for b in bins {
        outln!(
            "  {} ({}): host {}, device {} in {} target(s)",
            b.name,
            b.kind,
            fs(b.host_bytes),
            fs(device(b)),
            b.targets.len()
        );
    }
}

fn diff(a: &Path, b: &Path, json: bool) -> kpack_host::Result<()> {
    use kpack_format::bytes::format_size as fs;
    let d = kpack_engine::size::diff(a, b)?;
    if json {
        print_json(&d);
        return Ok(());
    }
    let delta = |x: u64, y: u64| {
        if y >= x {
            format!("+{}", fs(y - x))
        } else {
            format!("-{}", fs(x - y))
        }
    };
    outln!(
        "{} -> {} ({}): {} -> {} ({}); host {} -> {}; device {} -> {}",
        d.a,
        d.b,
        d.kind.name(),
        fs(d.bytes_a),
        fs(d.bytes_b),
        delta(d.bytes_a, d.bytes_b),
        fs(d.host_bytes_a),
        fs(d.host_bytes_b),
        fs(d.device_bytes_a),
        fs(d.device_bytes_b)
    );
    for (title, list) in [
        ("targets", &d.targets),
        ("binaries", &d.binaries),
        ("code objects", &d.code_objects),
    ] {
        outln!("{title}:");
        for c in list {
            outln!(
                "  {:<8} {}: {} -> {} stored, {} -> {} uncompressed",
                format!("{:?}", c.change).to_lowercase(),
                c.name,
                fs(c.stored_a),
                fs(c.stored_b),
                fs(c.uncompressed_a),
                fs(c.uncompressed_b)
            );
        }
    }
    Ok(())
}

fn verify_elf(file: &Path, offloaded_only: bool, json: bool) -> kpack_host::Result<()> {
    let mapped = kpack_loader::map_file(file)?;
    // Judged by the rules of the kind of binary it is: a fat binary's (what
    // prune and restore write) unless it carries HIPK metadata, whose
    // presence makes it an offloaded one, however damaged.
    let file_class = kpack_host::binary::classify_parsed(&mapped);
    let has_metadata = file_class
        .binary
        .as_ref()
        .is_ok_and(|b| matches!(b.metadata(), Ok(Some(m)) if m.in_file));
    if !offloaded_only && file_class.class == kpack_host::binary::Class::Fat && !has_metadata {
        let v = offload::verify_fat_file(file)?;
        if json {
            print_json(&serde_json::json!({"kind": "fat", "verified": v}));
        } else {
            outln!(
                "{}: ok: fat binary, {} wrapper(s), {} bundle(s), targets {}",
                file.display(),
                v.wrapper_bundles.len(),
                v.bundles,
                v.targets.join(", ")
            );
        }
        return Ok(());
    }
    drop(mapped);
    let v = offload::verify_file(file)?;
    // Defects of the reference tools' outputs, accepted (they load and run).
    for w in &v.warnings {
        eprintln!("kpack: warning: {}: {w}", file.display());
    }
    if json {
        print_json(&v);
    } else {
        outln!(
            "{}: ok: {} wrapper(s), kernel name {}, search paths {}",
            file.display(),
            v.co_indices.len(),
            v.metadata.kernel_name,
            v.metadata.search_paths.join(", ")
        );
    }
    Ok(())
}

fn print_listing(listing: &Listing) {
    match listing {
        Listing::FatBinary(f) => print_fat_binary(f),
        Listing::Archive(a) => print_archive(a),
        Listing::Offloaded(o) => print_offloaded(o),
        Listing::CodeObject(c) => print_code_object(c),
        Listing::LinkInput(l) => print_link_input(l),
    }
}

fn print_link_input(l: &kpack_host::link_input::LinkInputListing) {
    let what = match l.container {
        "static_archive" => "static archive",
        _ => "relocatable object",
    };
    outln!(
        "{}: link input ({what}), {} bytes: device code in {} object(s), not offloaded (link inputs are copied as they are)",
        l.file,
        l.file_size,
        l.members.len()
    );
    outln!("targets ({}): {}", l.targets.len(), l.targets.join(", "));
    for m in &l.members {
        outln!("  {} ({}): {} image(s)", m.name, m.section, m.images.len());
        for i in &m.images {
            outln!(
                "    {:<28} {:>10} bytes  {} ({}, {})",
                i.target,
                i.size,
                i.kind,
                i.triple,
                i.producer
            );
        }
    }
}

fn print_code_object(c: &inspect::CodeObjectListing) {
    let target = c.target.as_deref().unwrap_or("an unrecorded target");
    outln!(
        "{}: AMDGPU code object for {}, {} bytes (device code on its own, not a host binary)",
        c.file,
        target,
        c.file_size
    );
    outln!("kernels ({}):", c.kernels.len());
    for k in &c.kernels {
        outln!("  {k}");
    }
}

fn print_fat_binary(f: &inspect::FatBinaryListing) {
    match f.section_offset {
        Some(off) => outln!(
            "{}: fat binary ({}), {} bytes; {}: {} bytes at offset {:#x}",
            f.file,
            f.container,
            f.file_size,
            f.section_name.as_deref().unwrap_or(".hip_fatbin"),
            f.section_size,
            off
        ),
        None => outln!("{}: offload bundle file, {} bytes", f.file, f.file_size),
    }
    outln!("targets ({}): {}", f.targets.len(), f.targets.join(", "));
    outln!("bundles: {}", f.bundles.len());
    for b in &f.bundles {
        let how = match &b.compressed {
            Some(c) => format!(
                ", compressed (CCOB v{} {}, {} bytes uncompressed{}{})",
                c.version,
                c.method,
                c.uncompressed_size,
                if c.inner_index > 0 {
                    format!(", inner bundle {}", c.inner_index)
                } else {
                    String::new()
                },
                if c.hash_matches == Some(false) {
                    ", hash MISMATCH"
                } else {
                    ""
                }
            ),
            None => String::new(),
        };
        outln!(
            "  bundle {} at {:#x}, {} bytes{}",
            b.index,
            b.offset,
            b.stored_size,
            how
        );
        for e in &b.entries {
            match &e.target {
                Some(t) => outln!("    {:<28} {:>10} bytes  {}", t, e.size, e.triple),
                None => outln!("    {:<28} {:>10} bytes  {}", "(host)", e.size, e.triple),
            }
        }
    }
    print_wrappers(&f.wrappers);
}

fn print_archive(a: &inspect::ArchiveListing) {
    outln!(
        "{}: kpack archive version {}, {} bytes",
        a.file,
        a.format_version,
        a.file_size
    );
    outln!(
        "group: {}  family: {}  scheme: {}",
        a.group_name,
        a.gfx_arch_family,
        a.compression_scheme
    );
    outln!(
        "targets ({}): {}",
        a.gfx_arches.len(),
        a.gfx_arches.join(", ")
    );
    outln!("kernels: {}", a.kernels.len());
    for k in &a.kernels {
        use kpack_format::provenance::short;
        let digests = match (&k.code_object_sha256, &k.binary_sha256) {
            (Some(c), Some(b)) => format!("  sha256 {} of binary {}", short(c), short(b)),
            (Some(c), None) => format!("  sha256 {}", short(c)),
            (None, Some(b)) => format!("  of binary {}", short(b)),
            (None, None) => String::new(),
        };
        outln!(
            "  {:>5}  {:<40} {:<24} {:>10} bytes{digests}",
            k.ordinal,
            k.key,
            k.target,
            k.original_size
        );
    }
}

fn print_offloaded(o: &inspect::OffloadedListing) {
    outln!(
        "{}: offloaded host binary ({}), {} bytes",
        o.file,
        match (&o.elf_type, &o.pe_kind) {
            (Some(t), _) => format!("{t:?}"),
            (None, Some(k)) => format!("{k:?}").to_uppercase(),
            (None, None) => "?".into(),
        },
        o.file_size
    );
    outln!("kernel name: {}", o.kernel_name);
    outln!("search paths:");
    for p in &o.search_paths {
        outln!("  {p}");
    }
    match &o.targets {
        Some(t) => outln!("split for targets ({}): {}", t.len(), t.join(", ")),
        None => outln!("split for targets: not recorded (no kpack_targets in the metadata)"),
    }
    if let Some(d) = &o.device_sha256 {
        outln!("device code digest: {d}");
    }
    outln!("metadata at address {:#x}", o.metadata_address);
    print_wrappers(&o.wrappers);
}

fn print_wrappers(ws: &[inspect::WrapperListing]) {
    outln!("wrappers: {}", ws.len());
    for w in ws {
        outln!(
            "  {}: {} version {} binary {:#x} reserved1 {}",
            w.index,
            w.magic,
            w.version,
            w.binary,
            w.reserved1
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{ArgAction, CommandFactory};

    /// Every subcommand, nested ones too, with its argv prefix.
    fn commands(
        c: &clap::Command,
        prefix: Vec<String>,
        out: &mut Vec<(Vec<String>, clap::Command)>,
    ) {
        for sub in c.get_subcommands() {
            let mut p = prefix.clone();
            p.push(sub.get_name().to_string());
            out.push((p.clone(), sub.clone()));
            commands(sub, p, out);
        }
    }

    /// No flag of any command drops a value given twice: a flag that
    /// takes one value (or none) is refused the second time, and a list
    /// flag appends (clap's default for a single-valued flag given twice
    /// is an error, unless `args_override_self` makes the last use win
    /// silently).
    #[test]
    fn no_flag_drops_a_repeated_value() {
        let cli = Cli::command();
        cli.clone().debug_assert();
        let mut all = Vec::new();
        commands(&cli, vec!["kpack".to_string()], &mut all);
        let mut checked = 0;
        for (argv, cmd) in &all {
            for arg in cmd.get_arguments() {
                let Some(long) = arg.get_long() else { continue };
                let action = arg.get_action();
                match action {
                    ArgAction::Help | ArgAction::Version => continue,
                    ArgAction::Append => continue,
                    ArgAction::Set | ArgAction::SetTrue | ArgAction::SetFalse => {}
                    other => panic!("{argv:?} --{long}: action {other:?}"),
                }
                let value = arg
                    .get_possible_values()
                    .first()
                    .map(|v| v.get_name().to_string())
                    .unwrap_or_else(|| "3".to_string());
                let mut v = argv.clone();
                for _ in 0..2 {
                    v.push(format!("--{long}"));
                    if action.takes_values() {
                        v.push(value.clone());
                    }
                }
                let err = match Cli::try_parse_from(&v) {
                    Ok(_) => panic!("{v:?}: accepted"),
                    Err(e) => e.to_string(),
                };
                assert!(
                    err.contains("cannot be used multiple times"),
                    "{v:?}: {err}"
                );
                checked += 1;
            }
        }
        assert!(checked > 50, "{checked} flags checked");
    }

    /// List flags keep every use's values.
    #[test]
    fn repeated_inputs_are_all_kept() {
        let Cli {
            command: Command::SplitWheels(a),
            ..
        } = Cli::try_parse_from([
            "kpack",
            "split-wheels",
            "--input",
            "a.whl",
            "--input",
            "dir",
            "--output-dir",
            "o",
            "--device-package-prefix",
            "p",
            "--overlay-root",
            "t/",
            "--device-requires-dist",
            "x",
            "--device-requires-dist",
            "y",
            "z",
        ])
        .unwrap()
        else {
            panic!("not split-wheels")
        };
        assert_eq!(a.inputs().len(), 2);
        assert_eq!(a.device_requires_dist(), ["x", "y", "z"]);
    }
}
