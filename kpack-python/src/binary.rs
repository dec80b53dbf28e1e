//! Host binaries for the reference `rocm_kpack` API: the rewrite of
//! `kpack_offload_binary` (kpack-host's, without writing archives), the
//! HIPK metadata (`read_kpack_ref_marker`) and the fat-binary check.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use kpack_format::hipk::HipkMetadata;
use kpack_host::binary::HostBinary;
use kpack_host::WithPath;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::Failure;

/// What [`rewrite`] did.
struct Rewritten {
    pe: bool,
    original_size: u64,
    new_size: u64,
    metadata_addr: u64,
}

/// Rewrite the fat binary `input` into `output` (may be the same path): a
/// host-only binary whose wrappers point (HIPK) at metadata naming
/// `search_paths` and `kernel_name`, checked before it is written
/// (atomically, with the input's mode; fsynced when `durable`, `None`: when
/// `KPACK_DURABLE=1`). Writes no archive. Returns
/// `(format, original_size, new_size, metadata_address)`.
#[pyfunction]
#[pyo3(signature = (input, output, search_paths, kernel_name, durable=None))]
pub fn rewrite_binary(
    py: Python<'_>,
    input: PathBuf,
    output: PathBuf,
    search_paths: Vec<String>,
    kernel_name: String,
    durable: Option<bool>,
) -> PyResult<(&'static str, u64, u64, u64)> {
    let r = py.detach(|| -> Result<Rewritten, Failure> {
        let mapped = kpack_loader::map_file(&input)?;
        let mode = std::fs::metadata(&input)
            .with_path(&input)?
            .permissions()
            .mode();
        let metadata = HipkMetadata::new(kernel_name, search_paths)
            .with_bundle_targets(&binary_targets(&input, &mapped)?);
        let t = kpack_host::offload::rewrite(&input, &mapped, &metadata)?;
        let r = Rewritten {
            pe: kpack_host::pe::is_pe(&mapped),
            original_size: mapped.len() as u64,
            new_size: t.len(),
            metadata_addr: t.metadata_addr,
        };
        let source = std::fs::File::open(&input).with_path(&input)?;
        let mut pending = kpack_host::output::Pending::create(&output, Some(mode))?;
        kpack_host::offload::write_rewritten(&input, &t, Some(&source), pending.file())?;
        drop(t);
        drop(mapped);
        crate::durably(durable, || Ok(pending.commit()?))?;
        Ok(r)
    })?;
    let format = if r.pe { "coff" } else { "elf" };
    Ok((format, r.original_size, r.new_size, r.metadata_addr))
}

/// The targets of the fat binary `bytes` (at `path`): its metadata's
/// `kpack_targets` (and `kpack_co_targets`), by code object index, as the
/// archives the caller writes for it are named.
fn binary_targets(
    path: &std::path::Path,
    bytes: &[u8],
) -> Result<Vec<(u64, Vec<String>)>, Failure> {
    let bin = HostBinary::parse(bytes).with_path(path)?;
    Ok(kpack_host::offload::fat_targets(path, &bin)?)
}

/// The HIPK metadata of `path` as a dict (`kpack_search_paths`,
/// `kernel_name`), or `None` when it has no metadata section.
#[pyfunction]
pub fn read_marker<'py>(py: Python<'py>, path: PathBuf) -> PyResult<Option<Bound<'py, PyDict>>> {
    let md = py.detach(|| -> Result<Option<HipkMetadata>, Failure> {
        let mapped = kpack_loader::map_file(&path)?;
        let bin = HostBinary::parse(&mapped).with_path(&path)?;
        let Some(section) = bin.metadata().with_path(&path)? else {
            return Ok(None);
        };
        Ok(Some(HipkMetadata::decode(section.data).with_path(&path)?))
    })?;
    let Some(md) = md else { return Ok(None) };
    let d = PyDict::new(py);
    d.set_item("kpack_search_paths", md.search_paths)?;
    d.set_item("kernel_name", md.kernel_name)?;
    if let Some(t) = md.targets {
        d.set_item(kpack_format::hipk::KEY_TARGETS, t)?;
    }
    if let Some(digest) = md.device_digest {
        d.set_item(kpack_format::hipk::KEY_DEVICE_DIGEST, digest)?;
    }
    if let Some(c) = md.co_targets {
        d.set_item(kpack_format::hipk::KEY_CO_TARGETS, c.groups)?;
    }
    Ok(Some(d))
}

/// Whether `path` is an ELF or PE binary with a bundle section
/// (`.hip_fatbin`, `.hip_fat`); false for anything else, unreadable files
/// included.
#[pyfunction]
pub fn has_fatbin_section(py: Python<'_>, path: PathBuf) -> bool {
    py.detach(|| {
        let Ok(mapped) = kpack_loader::map_file(&path) else {
            return false;
        };
        match HostBinary::parse(&mapped) {
            Ok(bin) => matches!(bin.fatbin(), Ok(Some(_))),
            Err(_) => false,
        }
    })
}

/// The name of the bundle section of a host binary's container.
#[pyfunction]
pub fn fatbin_section_name(is_pe: bool) -> &'static str {
    if is_pe {
        ".hip_fat"
    } else {
        ".hip_fatbin"
    }
}
