//! `cargo xtask bench`: installs what the benchmarks need, builds `kpack`
//! and `librocm_kpack` in release (and the fixtures and the Python
//! environment when their sections are asked for), then runs the
//! `kpack-bench` crate's binary with the same flags. See
//! docs/performance.md; the micro-benchmarks are `cargo bench -p
//! kpack-bench`.

use std::path::Path;

use anyhow::{Context, Result};
use kpack_testkit::fixtures;
use xshell::{cmd, Shell};

use crate::{cargo, test, wheel};

/// Debian packages the bench needs (the C compiler builds the runtime
/// bench program).
const DEBIAN_PACKAGES: &[&str] = &[
    "librocsparse0",
    "librocrand1",
    "zstd",
    "time",
    "gcc",
    "zip",
    "unzip",
    "python3-venv",
];
/// What the sections that build libraries from source need besides
/// (`compressed`, `host`: clang-19, lld-19, the HIP runtime to link).
const COMPILER_PACKAGES: &[&str] = &["clang-19", "lld-19", "libamdhip64-dev"];

/// `kpack-bench`'s flags, passed on as they are.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Repetitions of every measured process (medians over them; at least 3
    /// gives a meaningful spread).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Measure only these sections (comma-separated): rocrand, rocsparse,
    /// pipeline, runtime, large, rewrite (prune and restore of
    /// librocsparse, verify --tree over it), wheels, python,
    /// python-upstream (the reference API: kpack's wheel against upstream's
    /// package, named by KPACK_UPSTREAM_PYTHON), compressed
    /// (librocsparse re-bundled into compressed bundles: needs clang-19 and
    /// lld-19), host (libraries with 256 MiB and 1 GiB of host code, built
    /// with clang-19 and lld-19), xla (JAX's ROCm plugin, downloaded from
    /// PyPI), doctor (kpack doctor over a site-packages of 300 binaries),
    /// digest (loads with and without ROCM_KPACK_VERIFY_DIGEST's check).
    /// Default: all.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Keep target/bench/work (the large intermediate files) afterwards.
    #[arg(long)]
    keep_work: bool,
}

impl BenchArgs {
    fn wants(&self, section: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| o == section)
    }

    fn flags(&self) -> Vec<String> {
        let mut flags = vec!["--reps".to_owned(), self.reps.to_string()];
        if !self.only.is_empty() {
            flags.extend(["--only".to_owned(), self.only.join(",")]);
        }
        if self.keep_work {
            flags.push("--keep-work".to_owned());
        }
        flags
    }
}

pub fn run(sh: &Shell, root: &Path, args: &BenchArgs) -> Result<()> {
    let mut packages = DEBIAN_PACKAGES.to_vec();
    if args.wants("compressed") || args.wants("host") {
        packages.extend(COMPILER_PACKAGES);
    }
    test::ensure_debian_packages(sh, &packages, "bench")?;
    if args.wants("pipeline") {
        // A failure is the fixture rows' to report.
        if let Err(e) = fixtures::build_all(sh, root, false) {
            eprintln!("bench: the fixtures did not build: {e:#}");
        }
    }
    let cargo = cargo();
    let flags = args.flags();
    let mut bench = cmd!(sh, "{cargo} run --release -p kpack-bench -- {flags...}");
    let venv = [
        "wheels",
        "python",
        "python-upstream",
        "compressed",
        "host",
        "xla",
    ];
    if venv.iter().any(|s| args.wants(s)) {
        bench = bench.env("KPACK_PY_VENV", wheel::py_env(sh, root)?);
    }
    if args.wants("python") || args.wants("python-upstream") {
        let dir = root.join("target/bench/python-wheel");
        let _ = std::fs::remove_dir_all(&dir);
        bench = bench.env("KPACK_PY_WHEEL", wheel::build(sh, root, &dir, false)?);
    }
    // Upstream's pure-Python package (not on PyPI): a source tree named by
    // KPACK_UPSTREAM_PYTHON (relative to the workspace); the section
    // reports it missing otherwise.
    if let Some(dir) = std::env::var_os("KPACK_UPSTREAM_PYTHON").filter(|d| !d.is_empty()) {
        let upstream = root.join(dir);
        if args.wants("python-upstream") && upstream.join("rocm_kpack").is_dir() {
            bench = bench.env("KPACK_UPSTREAM_PYTHON", std::path::absolute(&upstream)?);
        }
    }
    cmd!(sh, "{cargo} build --release -p kpack-cli -p kpack-cxx")
        .run()
        .context("cargo build --release")?;
    bench.run().context("the bench failed")?;
    Ok(())
}
