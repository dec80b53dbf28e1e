//! `kpack split-wheels`: the flags of upstream's
//! `python -m rocm_kpack.tools.split_python_wheels`, and its summary lines.

use std::path::PathBuf;

use clap::Args;
use kpack_engine::wheel::{self, OutputFormat, SplitWheelOptions, WheelError, WheelSummary};
use kpack_engine::{with_jobs, Database, Observer};
use kpack_format::archive::Scheme;

use crate::artifacts::Reporter;

/// Every flag may be given more than once; the last use wins (as with
/// the reference tool's argparse).
#[derive(Args)]
#[command(args_override_self = true)]
pub struct SplitWheelsArgs {
    /// A `.whl` file or an unpacked wheel directory (never modified).
    #[arg(long, value_name = "WHEEL")]
    input: PathBuf,
    /// Where the host, variant and device wheels go (created if missing).
    /// The host wheel has the input's file name.
    #[arg(long, value_name = "DIR")]
    output_dir: PathBuf,
    /// Distribution-name prefix of the device wheels, e.g.
    /// `amd-torch-device` (→ `amd-torch-device-gfx942`).
    #[arg(long, value_name = "PREFIX")]
    device_package_prefix: String,
    /// The directory in the wheel whose fat binaries are split and that
    /// receives `.kpack/`, e.g. `torch/`.
    #[arg(long, value_name = "DIR")]
    overlay_root: String,
    /// Extra `Requires-Dist` values of the device wheels; `@GFXARCH@` is
    /// replaced by the bundle key (such values only go into target-level
    /// wheels). The last use of the flag wins.
    #[arg(long, value_name = "REQ", num_args = 0..)]
    device_requires_dist: Vec<String>,
    /// `wheel` files, or unpacked `directory` trees named like the wheels.
    #[arg(long, value_enum, default_value = "wheel")]
    output_format: Format,
    /// A preset of database handlers: `torch-fat` (rocblas, hipblaslt,
    /// hipsparselt, aotriton, miopen).
    #[arg(long, value_name = "TYPE")]
    wheel_type: Option<String>,
    /// Database handlers to use, replacing the --wheel-type preset; given
    /// with no names, none.
    #[arg(long, value_name = "NAME", num_args = 0..)]
    databases: Option<Vec<String>>,
    #[arg(long, value_enum, default_value = "zstd")]
    compression: Compression,
    /// zstd level (1-22).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(i32).range(1..=22))]
    compression_level: i32,
    /// Scratch space for the unpacked wheel and intermediate files
    /// (default: the output directory).
    #[arg(long, value_name = "DIR")]
    tmp_dir: Option<PathBuf>,
    /// Worker threads (values below 1 mean 1; default: all cores). The
    /// output is the same for any value.
    #[arg(long, short = 'j', value_name = "N", allow_negative_numbers = true)]
    jobs: Option<i64>,
    /// Also write the PEP 817 variant wheel
    /// (`<host wheel name>-<label>.whl`, with variant.json).
    #[arg(long)]
    generate_variant_wheel: bool,
    /// The variant wheel's label.
    #[arg(long, value_name = "LABEL", default_value = "variant")]
    variant_label: String,
    /// Say what is done, step by step.
    #[arg(long, short = 'v')]
    verbose: bool,
    /// Print a JSON summary on stdout instead of the text one.
    #[arg(long)]
    json: bool,
    /// Accepted for compatibility with the reference tool; kpack reads
    /// offload bundles itself and runs no external bundler.
    #[arg(long, value_name = "PATH")]
    clang_offload_bundler: Option<PathBuf>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Format {
    Wheel,
    Directory,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Compression {
    #[value(alias = "noop")]
    None,
    Zstd,
}

pub fn split_wheels(a: SplitWheelsArgs) -> Result<(), Box<dyn std::error::Error>> {
    // Bad options are errors about this input, before anything is read.
    let named = |e: &dyn std::fmt::Display| WheelError::Invalid {
        wheel: a.input.clone(),
        what: e.to_string(),
    };
    if let Some(t) = &a.wheel_type {
        // Checked even when --databases overrides it.
        wheel::wheel_type_databases(t).map_err(|e| named(&e))?;
    }
    let databases = match (&a.databases, &a.wheel_type) {
        (Some(names), _) => Database::parse_list(names).map_err(|e| named(&e))?,
        (None, Some(t)) => wheel::wheel_type_databases(t)?,
        (None, None) => Vec::new(),
    };
    let mut opts = SplitWheelOptions::new(&a.output_dir, &a.device_package_prefix, &a.overlay_root);
    opts.device_requires_dist = a.device_requires_dist.clone();
    opts.databases = databases;
    opts.scheme = match a.compression {
        Compression::None => Scheme::None,
        Compression::Zstd => Scheme::ZstdPerKernel,
    };
    opts.level = a.compression_level;
    opts.output_format = match a.output_format {
        Format::Wheel => OutputFormat::Wheel,
        Format::Directory => OutputFormat::Directory,
    };
    opts.variant_label = a.generate_variant_wheel.then(|| a.variant_label.clone());
    opts.tmp_dir = a.tmp_dir.clone();
    let reporter = Reporter::new(a.verbose, a.json);
    if a.clang_offload_bundler.is_some() {
        reporter.note("--clang-offload-bundler is not needed: kpack reads offload bundles itself");
    }
    let jobs = a
        .jobs
        .map(|n| usize::try_from(n.max(1)).unwrap_or(usize::MAX));
    let summary = with_jobs(jobs, || wheel::split_wheel(&a.input, &opts, &reporter));
    reporter.finish();
    let summary = summary??;
    if a.json {
        crate::print_json(&summary);
    } else {
        print_summary(&summary);
    }
    Ok(())
}

/// The summary upstream's tool prints, line for line.
fn print_summary(s: &WheelSummary) {
    outln!("Split complete:");
    outln!("  Fat binaries processed: {}", s.fat_binaries);
    outln!("  Architectures: {}", s.architectures.join(", "));
    outln!("  Host wheel: {}", s.host.path);
    if let Some(v) = &s.variant {
        outln!("  Variant wheel: {}", v.path);
    }
    for d in &s.devices {
        outln!("  Device wheel ({}): {}", d.bundle_key, d.wheel.path);
    }
}
