//! kpack's operations for the Python API (`kpack.offload`, `kpack.split`,
//! ...): the arguments of each (a dict of the Python function's keyword
//! arguments, extracted into a typed struct) become kpack-engine's or
//! kpack-host's options, the work runs with the GIL released, and the
//! summary the engine returns is handed back as Python data (the same data
//! `kpack ... --json` prints: the CLI serializes the same structs). The
//! command line (kpack-cli) is not involved; failures are classified in
//! [`crate::errors`].

use std::path::PathBuf;

use kpack_engine::artifact::{
    self, GpuTargets, PackTreeOptions, PackagingConfig, SplitInput, SplitOptions, VerifyOptions,
};
use kpack_engine::doctor as diagnose;
use kpack_engine::wheel::{self, OutputFormat, SplitWheelOptions};
use kpack_engine::{options, with_jobs, Database, Observer};
use kpack_host::offload::OffloadOptions;
use pyo3::prelude::*;
use serde::Serialize;

use crate::convert::json_to_py;
use crate::errors::Failure;

/// Notes (when `verbose`) and warnings on stderr, as the command prints
/// them; no progress bar.
struct Stderr {
    verbose: bool,
}

impl Observer for Stderr {
    fn note(&self, message: &str) {
        if self.verbose {
            eprintln!("kpack: {message}");
        }
    }

    fn warn(&self, message: &str) {
        eprintln!("kpack: warning: {message}");
    }
}

/// A summary as JSON data (what `--json` prints).
fn data(v: &impl Serialize) -> Result<serde_json::Value, Failure> {
    serde_json::to_value(v).map_err(|e| {
        Failure::new(
            crate::errors::Kind::Other,
            format!("summary does not serialize: {e}"),
        )
    })
}

/// Run `work` without the GIL, `durable` as the Python API takes it
/// (`True`, or else as `KPACK_DURABLE` says), and return its summary as
/// Python data.
fn run<F>(py: Python<'_>, durable: bool, work: F) -> PyResult<Py<PyAny>>
where
    F: FnOnce() -> Result<serde_json::Value, Failure> + Send,
{
    let value = py.detach(|| crate::durably(durable.then_some(true), work))?;
    Ok(json_to_py(py, &value)?.unbind())
}

/// The compression options every writing operation takes.
fn scheme_and_level(
    compression: &str,
    level: i32,
) -> Result<(kpack_format::archive::Scheme, i32), Failure> {
    Ok((
        options::compression(compression)?,
        options::compression_level(level)?,
    ))
}

#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct OffloadArgs {
    input: PathBuf,
    output: PathBuf,
    archive_dir: PathBuf,
    kernel_name: Option<String>,
    search_paths: Vec<String>,
    extra_search_paths: Vec<String>,
    group: Option<String>,
    compression: String,
    compression_level: i32,
    durable: bool,
}

/// `kpack.offload`: kpack-host's offload of one binary.
#[pyfunction]
pub fn offload(py: Python<'_>, args: OffloadArgs) -> PyResult<Py<PyAny>> {
    run(py, args.durable, move || {
        let (scheme, level) = scheme_and_level(&args.compression, args.compression_level)?;
        let opts = OffloadOptions {
            kernel_name: args.kernel_name,
            search_paths: args.search_paths,
            extra_search_paths: args.extra_search_paths,
            group: args.group,
            scheme,
            level,
            ..OffloadOptions::new(args.archive_dir)
        };
        data(&kpack_host::offload::offload(
            &args.input,
            &args.output,
            &opts,
        )?)
    })
}

#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct SplitArgs {
    output_dir: PathBuf,
    artifact_dir: Option<PathBuf>,
    artifact_prefix: Option<String>,
    batch_artifact_parent_dir: Option<PathBuf>,
    split_databases: Vec<String>,
    gpu_targets: Option<Vec<String>>,
    expect_targets: Option<Vec<String>>,
    jobs: Option<i64>,
    compression: String,
    compression_level: i32,
    keep_going: bool,
    overwrite: bool,
    tmp_dir: Option<PathBuf>,
    verbose: bool,
    durable: bool,
}

/// `kpack.split`: the engine's split of one artifact or a batch. Failed
/// artifacts are a failure carrying the summary.
#[pyfunction]
pub fn split(py: Python<'_>, args: SplitArgs) -> PyResult<Py<PyAny>> {
    run(py, args.durable, move || {
        let input = SplitInput::new(
            args.artifact_dir.as_deref(),
            args.artifact_prefix.as_deref(),
            args.batch_artifact_parent_dir.as_deref(),
        )?;
        let (scheme, level) = scheme_and_level(&args.compression, args.compression_level)?;
        let mut opts = SplitOptions::new(&args.output_dir);
        opts.databases = Database::parse_list(&args.split_databases)?;
        opts.scheme = scheme;
        opts.level = level;
        opts.overwrite = args.overwrite;
        opts.keep_going = args.keep_going;
        opts.tmp_dir = args.tmp_dir.clone();
        opts.expect_targets = args.expect_targets.clone().unwrap_or_default();
        // An empty list filters nothing, as no list (the flag left out).
        opts.gpu_targets = args
            .gpu_targets
            .as_deref()
            .filter(|t| !t.is_empty())
            .map(GpuTargets::new)
            .transpose()?;
        let observer = Stderr {
            verbose: args.verbose,
        };
        let jobs = options::jobs(args.jobs)?;
        let summary = with_jobs(jobs, || artifact::split(input, &opts, &observer))??;
        let value = data(&summary)?;
        match summary.check() {
            Ok(()) => Ok(value),
            Err(e) => Err(Failure::from(e).with_summary(value)),
        }
    })
}

#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct PackTreeArgs {
    input: PathBuf,
    output: PathBuf,
    group_name: String,
    gfx_arch_family: Option<String>,
    gfx_arches: Vec<String>,
    jobs: Option<i64>,
    compression: String,
    compression_level: i32,
    overwrite: bool,
    tmp_dir: Option<PathBuf>,
    verbose: bool,
    durable: bool,
}

/// `kpack.pack_tree`: the engine's pack-tree.
#[pyfunction]
pub fn pack_tree(py: Python<'_>, args: PackTreeArgs) -> PyResult<Py<PyAny>> {
    run(py, args.durable, move || {
        let (scheme, level) = scheme_and_level(&args.compression, args.compression_level)?;
        let mut opts = PackTreeOptions::new(&args.group_name);
        opts.gfx_arch_family = args.gfx_arch_family.clone();
        opts.set_gfx_arches(&args.gfx_arches);
        opts.scheme = scheme;
        opts.level = level;
        opts.overwrite = args.overwrite;
        opts.tmp_dir = args.tmp_dir.clone();
        let observer = Stderr {
            verbose: args.verbose,
        };
        let jobs = options::jobs(args.jobs)?;
        let summary = with_jobs(jobs, || {
            artifact::pack_tree(&args.input, &args.output, &opts, &observer)
        })??;
        data(&summary)
    })
}

#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct SplitWheelsArgs {
    input: PathBuf,
    output_dir: PathBuf,
    device_package_prefix: String,
    overlay_root: String,
    device_requires_dist: Option<Vec<String>>,
    output_format: String,
    wheel_type: Option<String>,
    databases: Option<Vec<String>>,
    expect_targets: Option<Vec<String>>,
    compression: String,
    compression_level: i32,
    tmp_dir: Option<PathBuf>,
    jobs: Option<i64>,
    generate_variant_wheel: bool,
    variant_label: Option<String>,
    verbose: bool,
    durable: bool,
}

/// `kpack.split_wheels`: the engine's wheel split (upstream's variant
/// format). One wheel's summary, or a list for a directory of wheels.
#[pyfunction]
pub fn split_wheels(py: Python<'_>, args: SplitWheelsArgs) -> PyResult<Py<PyAny>> {
    run(py, args.durable, move || {
        let databases = wheel::databases_for(
            &args.input,
            args.wheel_type.as_deref(),
            args.databases.as_deref(),
        )?;
        let (scheme, level) = scheme_and_level(&args.compression, args.compression_level)?;
        let mut opts = SplitWheelOptions::new(
            &args.output_dir,
            &args.device_package_prefix,
            &args.overlay_root,
        );
        opts.device_requires_dist = args.device_requires_dist.clone().unwrap_or_default();
        opts.databases = databases;
        opts.scheme = scheme;
        opts.level = level;
        opts.output_format = OutputFormat::from_name(&args.output_format)?;
        opts.variant_label = args.generate_variant_wheel.then(|| {
            args.variant_label
                .clone()
                .unwrap_or_else(|| wheel::DEFAULT_VARIANT_LABEL.to_string())
        });
        opts.tmp_dir = args.tmp_dir.clone();
        opts.expect_targets = args.expect_targets.clone().unwrap_or_default();
        let observer = Stderr {
            verbose: args.verbose,
        };
        let jobs = options::jobs_at_least_one(args.jobs);
        let inputs = [args.input.clone()];
        let summaries = with_jobs(jobs, || wheel::split_wheels(&inputs, &opts, &observer))??;
        data(&wheel::Summaries(&summaries))
    })
}

#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct VerifyArgs {
    artifacts_dir: PathBuf,
    config: Option<PathBuf>,
    split_databases: Vec<String>,
    expect_targets: Option<Vec<String>>,
    jobs: Option<i64>,
}

/// `kpack.verify`: the engine's check of split (or recombined) artifacts.
/// Problems are a failure carrying the report.
#[pyfunction]
pub fn verify(py: Python<'_>, args: VerifyArgs) -> PyResult<Py<PyAny>> {
    run(py, false, move || {
        let config = args
            .config
            .as_deref()
            .map(PackagingConfig::load)
            .transpose()?;
        let databases = Database::parse_list(&args.split_databases)?;
        let opts = VerifyOptions {
            config,
            databases,
            expect_targets: args.expect_targets.clone().unwrap_or_default(),
        };
        let observer = Stderr { verbose: false };
        let jobs = options::jobs(args.jobs)?;
        let report = with_jobs(jobs, || {
            artifact::verify_artifacts(&args.artifacts_dir, &opts, &observer)
        })??;
        let value = data(&report)?;
        match report.check() {
            Ok(()) => Ok(value),
            Err(e) => Err(Failure::from(e).with_summary(value)),
        }
    })
}

#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct DoctorArgs {
    paths: Vec<PathBuf>,
    arch: Vec<String>,
    sysfs_root: Option<PathBuf>,
}

/// `kpack.doctor`: the engine's doctor. Problems are returned in the
/// report, not raised; nothing to check is a failure.
#[pyfunction]
pub fn doctor(py: Python<'_>, args: DoctorArgs) -> PyResult<Py<PyAny>> {
    run(py, false, move || {
        let sysfs = args
            .sysfs_root
            .unwrap_or_else(|| PathBuf::from(diagnose::gpus::SYSFS_ROOT));
        let (targets, _source) = diagnose::choose_targets(&args.arch, &sysfs)?;
        let opts = diagnose::DoctorOptions {
            paths: args.paths,
            targets,
        };
        data(&diagnose::doctor(&opts, &kpack_engine::Silent)?)
    })
}
