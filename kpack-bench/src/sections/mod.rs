//! The sections of the table, one module each, each a `run(ctx)` that
//! returns its rows:
//! - `libs`: split and offload of librocrand and librocsparse (sections
//!   `rocrand` and `rocsparse`), and the floors on the same bytes
//!   (`zstd -3 -T1`/`-T2` over the device code, `cp` of the input);
//! - `pipeline`: pack-tree and recombine over the end-to-end fixture tree,
//!   and over real-size inputs;
//! - `runtime`: the C API (`kpack-bench/c/kpack_bench.c` linked against
//!   the release `librocm_kpack.a`): open, cold and warm loads,
//!   `kpack_get_kernel` over every kernel, memory after one load;
//! - [`large`]: an archive over 4 GiB written and read (child processes:
//!   [`large::child`]);
//! - `rewrite`: prune and restore of librocsparse, and `verify --tree`
//!   over its offloaded form installed as a tree;
//! - `wheels`: `kpack split-wheels` over a torch-like wheel;
//! - `python`: kpack's Python API packing and reading librocsparse's
//!   gfx1030 code objects, against the command and pure Python;
//! - [`python_upstream`]: the reference `rocm_kpack` API on a library
//!   build's job, kpack's wheel against upstream's pure-Python package;
//! - `compressed`: offload, split, extract, pack-tree, restore, ls and
//!   split-wheels of librocsparse re-bundled into compressed bundles, and
//!   the floor `zstd -d | zstd -3 -T1` of the same bytes;
//! - `host`: offload, restore, split, pack-tree and prune of fat libraries
//!   with 256 MiB and 1 GiB of host `.rodata` (built by the test kit),
//!   against `cp`, and split-wheels of a wheel holding one;
//! - `xla`: offload and split-wheels of `xla_rocm_plugin.so` from PyPI's
//!   jax-rocm7-pjrt 0.12.0 wheel, against `zstd -d | zstd -3 -T1` of its
//!   bundles plus `cp`;
//! - `doctor`: `kpack doctor` over a site-packages of a few hundred
//!   binaries;
//! - `digest`: loads through the runtime's loader with and without
//!   `ROCM_KPACK_VERIFY_DIGEST`'s check.
//!
//! `job` is the measured process the `host` and `xla` sections share.

mod compressed;
mod digest;
mod doctor;
mod host;
mod job;
pub mod large;
mod libs;
mod pipeline;
mod python;
pub mod python_upstream;
mod rewrite;
mod runtime;
mod wheels;
mod xla;

pub(crate) use wheels::python;

use anyhow::Result;

use crate::context::Ctx;
use crate::report::Row;

/// The sections `--only` may name, in the order they run.
pub const SECTIONS: &[&str] = &[
    "rocrand",
    "rocsparse",
    "pipeline",
    "runtime",
    "large",
    "rewrite",
    "wheels",
    "python",
    "python-upstream",
    "compressed",
    "host",
    "xla",
    "doctor",
    "digest",
];

/// A section measured by one function (the libraries' sections aside).
type Section = (&'static str, fn(&Ctx) -> Result<Vec<Row>>);

/// The rows of the sections wanted (all when `only` is empty), in order.
pub fn run(ctx: &Ctx, only: &[String]) -> Result<Vec<Row>> {
    let wanted = |s: &str| only.is_empty() || only.iter().any(|o| o == s);
    let mut rows = Vec::new();
    for lib in [&crate::inputs::ROCRAND, &crate::inputs::ROCSPARSE] {
        if wanted(lib.section) {
            eprintln!("== {}", lib.section);
            rows.extend(libs::run(ctx, lib)?);
        }
    }
    let sections: [Section; 12] = [
        ("pipeline", pipeline::run),
        ("runtime", runtime::run),
        ("large", large::run),
        ("rewrite", rewrite::run),
        ("wheels", wheels::run),
        ("python", python::run),
        ("python-upstream", python_upstream::run),
        ("compressed", compressed::run),
        ("host", host::run),
        ("xla", xla::run),
        ("doctor", doctor::run),
        ("digest", digest::run),
    ];
    for (section, run) in sections {
        if wanted(section) {
            eprintln!("== {section}");
            rows.extend(run(ctx)?);
        }
    }
    Ok(rows)
}
