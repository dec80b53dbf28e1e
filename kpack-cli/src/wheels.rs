//! `kpack split-wheels`: the flags of upstream's
//! `python -m rocm_kpack.tools.split_python_wheels`, and its summary lines.

use std::path::PathBuf;

use clap::Args;
use kpack_engine::wheel::{
    self, OutputFormat, SplitWheelOptions, VariantFormat, WheelError, WheelSummary,
};
use kpack_engine::{with_jobs, Observer};

use crate::artifacts::Reporter;
use crate::cli::{Compression, ExpectTargets};

/// A flag that takes one value is refused when given twice; list flags
/// (`--input`, `--device-requires-dist`, `--databases`) keep the values of
/// every use (upstream's argparse keeps only the last use's).
#[derive(Args)]
pub struct SplitWheelsArgs {
    /// A `.whl` file, an unpacked wheel directory (never modified), or a
    /// directory of `.whl` files. Repeatable: the wheels are split one
    /// after the other in one thread pool, each as if split alone.
    #[arg(long, value_name = "WHEEL", required = true)]
    input: Vec<PathBuf>,
    /// Where the host, variant and device wheels go (created if missing).
    /// The host wheel has the input's file name.
    #[arg(long, value_name = "DIR")]
    output_dir: PathBuf,
    /// Distribution-name prefix of the device wheels, e.g.
    /// `amd-torch-device` (→ `amd-torch-device-gfx942`). `@NAME@` stands
    /// for each wheel's distribution name (`amd-@NAME@-device`): needed
    /// when one run splits wheels of several distributions.
    #[arg(long, value_name = "PREFIX")]
    device_package_prefix: String,
    /// The directory in the wheel whose fat binaries are split and that
    /// receives `.kpack/`, e.g. `torch/`; `@NAME@` stands for each wheel's
    /// distribution name (`@NAME@/`).
    #[arg(long, value_name = "DIR")]
    overlay_root: String,
    /// Extra `Requires-Dist` values of the device wheels; `@GFXARCH@` is
    /// replaced by the bundle key (such values only go into target-level
    /// wheels). Repeatable: every use's values are kept.
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
    /// Also write the variant wheel(s): see --variant-format.
    #[arg(long)]
    generate_variant_wheel: bool,
    /// `upstream`: one PEP 817 variant wheel `<host wheel name>-<label>.whl`
    /// with every target's variant (upstream's format); `pep825`: one
    /// variant wheel per target, `<host wheel name>-<target>.whl`, and the
    /// index file `<name>-<version>-variants.json` (PEP 825 schema v0.1.1,
    /// static provider properties), which uv installs.
    #[arg(long, value_enum, default_value = "upstream")]
    variant_format: Variants,
    /// The upstream-format variant wheel's label (default `variant`).
    #[arg(long, value_name = "LABEL")]
    variant_label: Option<String>,
    #[command(flatten)]
    expect: ExpectTargets,
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

#[cfg(test)]
impl SplitWheelsArgs {
    pub(crate) fn inputs(&self) -> &[PathBuf] {
        &self.input
    }

    pub(crate) fn device_requires_dist(&self) -> &[String] {
        &self.device_requires_dist
    }
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Variants {
    Upstream,
    Pep825,
}

pub fn split_wheels(a: SplitWheelsArgs) -> Result<(), Box<dyn std::error::Error>> {
    // Bad options are errors about the (first) input, before anything is
    // read.
    let named = |e: &dyn std::fmt::Display| WheelError::Invalid {
        wheel: a.input[0].clone(),
        what: e.to_string(),
    };
    if a.variant_format == Variants::Pep825 && a.variant_label.is_some() {
        return Err(named(&"--variant-label names the upstream-format variant wheel; PEP 825 variant wheels are labelled by their target").into());
    }
    let databases =
        wheel::databases_for(&a.input[0], a.wheel_type.as_deref(), a.databases.as_deref())?;
    let mut opts = SplitWheelOptions::new(&a.output_dir, &a.device_package_prefix, &a.overlay_root);
    opts.device_requires_dist = a.device_requires_dist.clone();
    opts.expect_targets = a.expect.expect_targets.clone();
    opts.databases = databases;
    opts.scheme = a.compression.scheme();
    opts.level = a.compression_level;
    opts.output_format = match a.output_format {
        Format::Wheel => OutputFormat::Wheel,
        Format::Directory => OutputFormat::Directory,
    };
    opts.variant_label = a.generate_variant_wheel.then(|| {
        a.variant_label
            .clone()
            .unwrap_or_else(|| wheel::DEFAULT_VARIANT_LABEL.to_string())
    });
    opts.variant_format = match a.variant_format {
        Variants::Upstream => VariantFormat::Upstream,
        Variants::Pep825 => VariantFormat::Pep825,
    };
    opts.tmp_dir = a.tmp_dir.clone();
    let reporter = Reporter::new(a.verbose, a.json);
    if a.clang_offload_bundler.is_some() {
        reporter.note("--clang-offload-bundler is not needed: kpack reads offload bundles itself");
    }
    let jobs = kpack_engine::options::jobs_at_least_one(a.jobs);
    // One pool for every wheel.
    let summaries = with_jobs(jobs, || wheel::split_wheels(&a.input, &opts, &reporter));
    reporter.finish();
    let summaries = summaries??;
    if a.json {
        crate::capture::print_json(&wheel::Summaries(&summaries));
    } else {
        summaries.iter().for_each(print_summary);
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
    for v in &s.variants {
        outln!("  Variant wheel ({}): {}", v.label, v.wheel.path);
    }
    if let Some(index) = &s.variants_index {
        outln!("  Variants index: {index}");
    }
    for d in &s.devices {
        outln!("  Device wheel ({}): {}", d.bundle_key, d.wheel.path);
    }
}
