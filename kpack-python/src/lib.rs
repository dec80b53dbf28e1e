//! kpack's Python extension, `kpack._native`: the native half of the
//! Python packages `kpack` (kpack's own API) and `rocm_kpack` (the
//! reference package's API and tools), over kpack's crates. Nothing here
//! re-implements a format: archives are written by kpack-host's
//! `ArchiveWriter` and read by kpack-format's reader, binaries rewritten by
//! kpack-host's offload, the operations of kpack's API ([`ops`]) are
//! kpack-engine's and kpack-host's, called with typed options, and the
//! `kpack` command ([`cli`]: the console script) is kpack-cli's, run
//! in-process. Errors become exceptions in one place ([`errors`]). See
//! docs/python.md.

mod archive;
mod binary;
mod cli;
mod convert;
mod errors;
mod ops;
mod writer;

use pyo3::prelude::*;

use crate::errors::Failure;

/// Run `f`, one command's worth of writes, then fsync its outputs at once
/// when `durable` says so (`None`: as `KPACK_DURABLE` says; see
/// kpack-host's `output::Durability`).
pub(crate) fn durably<T>(
    durable: Option<bool>,
    f: impl FnOnce() -> Result<T, Failure>,
) -> Result<T, Failure> {
    use kpack_host::output;
    let d = output::Durability::begin(durable.unwrap_or_else(output::durable_from_env));
    let value = f()?;
    d.commit()?;
    Ok(value)
}

/// The fsync calls kpack made for durability in this process so far (for
/// tests: none unless durable).
#[pyfunction]
fn sync_calls() -> usize {
    kpack_host::output::sync_calls()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<archive::NativeArchive>()?;
    m.add_class::<writer::ArchiveBuilder>()?;
    m.add_function(wrap_pyfunction!(writer::zstd_frame, m)?)?;
    m.add_function(wrap_pyfunction!(writer::zstd_decompress, m)?)?;
    m.add_function(wrap_pyfunction!(writer::zstd_blob, m)?)?;
    m.add_function(wrap_pyfunction!(writer::blob_offset, m)?)?;
    m.add_function(wrap_pyfunction!(binary::rewrite_binary, m)?)?;
    m.add_function(wrap_pyfunction!(binary::read_marker, m)?)?;
    m.add_function(wrap_pyfunction!(binary::has_fatbin_section, m)?)?;
    m.add_function(wrap_pyfunction!(binary::fatbin_section_name, m)?)?;
    m.add_function(wrap_pyfunction!(ops::offload, m)?)?;
    m.add_function(wrap_pyfunction!(ops::split, m)?)?;
    m.add_function(wrap_pyfunction!(ops::pack_tree, m)?)?;
    m.add_function(wrap_pyfunction!(ops::split_wheels, m)?)?;
    m.add_function(wrap_pyfunction!(ops::verify, m)?)?;
    m.add_function(wrap_pyfunction!(ops::doctor, m)?)?;
    m.add_function(wrap_pyfunction!(cli::cli_main, m)?)?;
    m.add_function(wrap_pyfunction!(cli::run_captured, m)?)?;
    m.add_function(wrap_pyfunction!(sync_calls, m)?)?;
    Ok(())
}
