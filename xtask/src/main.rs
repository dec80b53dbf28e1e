//! Repository automation for kpack, run as `cargo xtask <task>`.
//!
//! Follows the xtask convention: every step lives here, in Rust; the few
//! external commands (clang, cargo, apt-get) are spawned through `xshell`.

mod artifacts;
mod bench;
mod demo;
mod dist;
mod fuzz;
mod sanitize;
mod test;
mod wheel;

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Parser, Subcommand};
use kpack_testkit::{fixtures, malformed};
use xshell::{cmd, Shell};

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "kpack repository automation"
)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Build the HIP test fixtures into target/fixtures (needs clang-19,
    /// lld-19 and libamdhip64-dev; no GPU, no ROCm install).
    Fixtures {
        /// Also regenerate the committed demo library
        /// integration/sample/libkpack_sample.so.
        #[arg(long)]
        refresh_sample: bool,
        /// Rebuild every fixture even when it is up to date.
        #[arg(long)]
        force: bool,
    },
    /// Regenerate the malformed-input corpus tests/malformed/ (from
    /// committed inputs: a rerun writes the same bytes; commit what
    /// changes).
    Malformed,
    /// Build the kpack CLI and run it on the committed sample fat binary
    /// (needs nothing but cargo).
    Demo,
    /// Release build installed as a relocatable package under PREFIX:
    /// librocm_kpack.a, headers, the kpack command and the CMake package.
    Dist {
        #[arg(long)]
        prefix: PathBuf,
        /// Also install the shared library librocm_kpack.so.
        #[arg(long)]
        shared: bool,
    },
    /// Set up a Debian 12 machine (as root: installs missing packages),
    /// build the fixtures, then run all tests, rustfmt and clippy.
    Test,
    /// Measure the speed and memory of the release kpack and librocm_kpack
    /// against floors (the same bytes through zstd, cp, unzip...) and each
    /// row's targets (never in CI; as root, installs missing packages):
    /// builds and runs the kpack-bench crate; table on stdout,
    /// target/bench/bench.json. See docs/performance.md.
    Bench(bench::BenchArgs),
    /// Run the cargo-fuzz targets of fuzz/ on seeds made from the fixtures
    /// (nightly with AddressSanitizer when installed, else stable without).
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Stop each target after this many executions.
        #[arg(long)]
        runs: Option<u64>,
        /// Only this target (repeatable; default: all).
        #[arg(long = "target", value_name = "T")]
        targets: Vec<String>,
        /// address, memory, thread, leak or none (default: address on
        /// nightly, none on stable).
        #[arg(long)]
        sanitizer: Option<String>,
        /// Targets run at the same time.
        #[arg(long, default_value_t = 1)]
        parallel: usize,
        /// Extra libFuzzer flags, after `--`.
        #[arg(last = true)]
        extra: Vec<String>,
    },
    /// The C API thread-safety stress under valgrind (memcheck, helgrind,
    /// DRD) and, with nightly + rust-src, ThreadSanitizer/AddressSanitizer.
    Sanitize {
        /// Rounds per thread under valgrind.
        #[arg(long, default_value_t = 6)]
        iters: u32,
        /// Only the valgrind runs.
        #[arg(long)]
        valgrind_only: bool,
    },
    /// Build kpack as a pip-installable wheel (the `kpack` command and the
    /// `rocm_kpack.tools.*` entry points) with maturin from PyPI, into DIR.
    Wheel {
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// The dev profile (faster to build; not stripped).
        #[arg(long)]
        debug: bool,
    },
    /// Create or update target/py-venv, the Python environment of the wheel
    /// tests (pip, wheel, maturin from PyPI; PyPI's rocm-bootstrap wheel).
    PyEnv,
    /// `kpack split` over a build tree (release build of kpack; same flags,
    /// see `cargo xtask split --help`).
    #[command(disable_help_flag = true)]
    Split {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// `kpack verify` (same flags).
    #[command(disable_help_flag = true)]
    Verify {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// `kpack recombine` (same flags).
    #[command(disable_help_flag = true)]
    Recombine {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Write an uncompressed offload bundle with the triples exactly as
    /// given (a fixture build step: LLVM 19's bundler rewrites triples of
    /// processors it does not know).
    #[command(hide = true)]
    Bundle {
        /// Comma-separated triples, one per --input, in order.
        #[arg(long)]
        triples: String,
        #[arg(long)]
        input: Vec<PathBuf>,
        #[arg(long)]
        output: PathBuf,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let root = project_root();
    let sh = Shell::new()?;
    sh.change_dir(&root);
    match cli.task {
        Task::Fixtures {
            refresh_sample,
            force,
        } => {
            fixtures::build_all(&sh, &root, force)?;
            if refresh_sample {
                fixtures::refresh_sample(&sh, &root)?;
            }
        }
        Task::Malformed => malformed::run(&sh, &root, &debug_kpack(&sh)?)?,
        Task::Demo => demo::run(&sh, &root)?,
        Task::Dist { prefix, shared } => dist::run(&sh, &root, &prefix, shared)?,
        Task::Test => test::run(&sh, &root)?,
        Task::Bench(args) => bench::run(&sh, &root, &args)?,
        Task::Fuzz {
            seconds,
            runs,
            targets,
            sanitizer,
            parallel,
            extra,
        } => fuzz::run(
            &sh,
            &root,
            fuzz::Options {
                seconds,
                runs,
                targets,
                sanitizer,
                parallel,
                extra,
            },
        )?,
        Task::Sanitize {
            iters,
            valgrind_only,
        } => sanitize::run(
            &sh,
            &root,
            sanitize::Options {
                iters,
                valgrind_only,
            },
        )?,
        Task::Wheel { out, debug } => {
            wheel::build(&sh, &root, &out, debug)?;
        }
        Task::PyEnv => {
            println!("{}", wheel::py_env(&sh, &root)?.display());
        }
        Task::Split { args } => artifacts::run(&root, "split", &args)?,
        Task::Verify { args } => artifacts::run(&root, "verify", &args)?,
        Task::Recombine { args } => artifacts::run(&root, "recombine", &args)?,
        Task::Bundle {
            triples,
            input,
            output,
        } => fixtures::write_bundle(&triples, &input, &output)?,
    }
    Ok(())
}

/// The workspace root: the parent of this crate's directory.
pub fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in a subdirectory of the workspace")
        .to_path_buf()
}

/// The cargo that runs us (so that `cargo +toolchain xtask` is honoured).
pub fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())
}

/// Cargo's target directory.
pub fn target_dir(sh: &Shell) -> anyhow::Result<PathBuf> {
    let cargo = cargo();
    let metadata = cmd!(sh, "{cargo} metadata --format-version 1 --no-deps")
        .quiet()
        .read()?;
    let metadata: serde_json::Value = serde_json::from_str(&metadata)?;
    let dir = metadata["target_directory"]
        .as_str()
        .context("cargo metadata has no target_directory")?;
    Ok(PathBuf::from(dir))
}

/// Build the debug `kpack` binary; its path.
pub fn debug_kpack(sh: &Shell) -> anyhow::Result<PathBuf> {
    let cargo = cargo();
    cmd!(sh, "{cargo} build --quiet --package kpack-cli --bin kpack").run()?;
    Ok(target_dir(sh)?.join("debug/kpack"))
}
