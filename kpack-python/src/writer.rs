//! Writing `.kpack` archives: [`ArchiveBuilder`], over kpack-host's
//! `ArchiveWriter` (the writer of the `kpack` command: same bytes for the
//! same kernels and options), and the compressor pieces of the reference
//! `rocm_kpack.compression` API.

use std::ffi::CString;
use std::io::Write;
use std::path::PathBuf;

use kpack_format::archive::{Scheme, HEADER_SIZE};
use kpack_host::{ArchiveWriter, KernelData, SharedBytes};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBytes, PyDict};

use crate::archive::NativeArchive;
use crate::convert::metadata_from_py;
use crate::errors::Failure;

/// The zstd frame kpack's writer stores for `data` at `level`; compressed
/// with the GIL released, so a thread pool compresses in parallel.
#[pyfunction]
pub fn zstd_frame<'py>(py: Python<'py>, data: &[u8], level: i32) -> PyResult<Bound<'py, PyBytes>> {
    let frame = py.detach(|| kpack_host::zstd_frame(data, level).map_err(Failure::from))?;
    Ok(PyBytes::new(py, &frame))
}

/// Decompress one zstd frame (of at most `capacity` bytes).
#[pyfunction]
pub fn zstd_decompress<'py>(
    py: Python<'py>,
    frame: &[u8],
    capacity: usize,
) -> PyResult<Bound<'py, PyBytes>> {
    let data = py
        .detach(|| zstd::bulk::decompress(frame, capacity))
        .map_err(|e| PyValueError::new_err(format!("zstd decompression failed: {e}")))?;
    Ok(PyBytes::new(py, &data))
}

/// The blob of scheme `zstd-per-kernel` for these frames, in order: `u32`
/// count, then `u32` length and frame each.
#[pyfunction]
pub fn zstd_blob<'py>(py: Python<'py>, frames: Vec<Vec<u8>>) -> PyResult<Bound<'py, PyBytes>> {
    let mut out = Vec::with_capacity(4 + frames.iter().map(|f| f.len() + 4).sum::<usize>());
    let count =
        u32::try_from(frames.len()).map_err(|_| PyValueError::new_err("too many frames"))?;
    out.extend_from_slice(&count.to_le_bytes());
    for f in &frames {
        let len = u32::try_from(f.len()).map_err(|_| PyValueError::new_err("frame too large"))?;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(f);
    }
    Ok(PyBytes::new(py, &out))
}

/// The offset of the blob in an archive (the header's size).
#[pyfunction]
pub fn blob_offset() -> u64 {
    HEADER_SIZE
}

/// An archive being built: kernels added in order (each gets its ordinal
/// then), then finalized, then written. The kernels' `bytes` objects are
/// shared with the writer, not copied: `write` writes them from where
/// Python holds them straight into the file (the archive's bytes are made
/// in memory only when asked for: `reader`, `to_bytes`).
#[pyclass(module = "kpack._native")]
pub struct ArchiveBuilder {
    writer: Option<ArchiveWriter<'static>>,
    finalized: Option<Finalized>,
}

/// A finalized archive: its writer, and its bytes once made.
struct Finalized {
    writer: ArchiveWriter<'static>,
    bytes: std::sync::OnceLock<Vec<u8>>,
}

impl ArchiveBuilder {
    fn writer(&mut self) -> PyResult<&mut ArchiveWriter<'static>> {
        self.writer
            .as_mut()
            .ok_or_else(|| PyRuntimeError::new_err("Archive already finalized"))
    }

    fn finalized(&self) -> PyResult<&Finalized> {
        self.finalized.as_ref().ok_or_else(|| {
            PyRuntimeError::new_err("Archive not finalized. Call finalize_archive() first.")
        })
    }

    /// The finalized archive's bytes (made on first use, without the GIL).
    fn bytes<'s>(&'s self, py: Python<'_>) -> PyResult<&'s [u8]> {
        let f = self.finalized()?;
        if let Some(b) = f.bytes.get() {
            return Ok(b);
        }
        let made = py.detach(|| f.writer.to_vec().map_err(Failure::from))?;
        Ok(f.bytes.get_or_init(|| made))
    }
}

/// One `kpack.HrxLimitWarning` per HRX limit `writer`'s archive exceeds
/// (it stays valid: kpack's runtime reads it).
fn warn_hrx_limits(py: Python<'_>, writer: &ArchiveWriter<'_>) -> PyResult<()> {
    let limits = writer.hrx_limits();
    if limits.is_empty() {
        return Ok(());
    }
    let category = py.import("kpack._errors")?.getattr("HrxLimitWarning")?;
    for e in limits {
        let message = format!("archive of group {:?}: {e}", writer.group_name());
        let message = CString::new(message.replace('\0', " ")).unwrap_or_default();
        PyErr::warn(py, &category, &message, 2)?;
    }
    Ok(())
}

fn metadata(
    d: Option<&Bound<'_, PyDict>>,
) -> PyResult<Option<Vec<(String, kpack_format::msgpack::Value)>>> {
    d.map(metadata_from_py).transpose()
}

#[pymethods]
impl ArchiveBuilder {
    /// `scheme` is `"none"` or `"zstd-per-kernel"`; `level` the zstd level
    /// for kernels added as bytes with that scheme.
    #[new]
    fn new(
        group_name: String,
        gfx_arch_family: String,
        gfx_arches: Vec<String>,
        scheme: &str,
        level: i32,
    ) -> PyResult<Self> {
        let scheme = Scheme::from_name(scheme).ok_or_else(|| {
            PyValueError::new_err(format!("Unknown compression scheme: {scheme}"))
        })?;
        let writer = ArchiveWriter::new(group_name, gfx_arch_family, gfx_arches)
            .scheme(scheme)
            .zstd_level(level)
            .free_form_keys(true);
        Ok(ArchiveBuilder {
            writer: Some(writer),
            finalized: None,
        })
    }

    /// Add a kernel's bytes; returns its ordinal (that of an identical
    /// kernel of the same target added before, which it then shares).
    #[pyo3(signature = (key, target, data, metadata=None))]
    fn add_bytes(
        &mut self,
        key: String,
        target: String,
        data: PyBackedBytes,
        metadata: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<u32> {
        let md = self::metadata(metadata)?;
        let data = KernelData::from(SharedBytes::new(data));
        Ok(self
            .writer()?
            .add(key, target, data, md)
            .map_err(Failure::from)?)
    }

    /// Add a kernel compressed ahead of time ([`zstd_frame`]).
    #[pyo3(signature = (key, target, frame, original_size, metadata=None))]
    fn add_frame(
        &mut self,
        key: String,
        target: String,
        frame: PyBackedBytes,
        original_size: u64,
        metadata: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<u32> {
        let md = self::metadata(metadata)?;
        let frame = SharedBytes::new(frame);
        Ok(self
            .writer()?
            .add_frame(key, target, frame, original_size, md)
            .map_err(Failure::from)?)
    }

    /// End the archive: no kernel may be added after. Checks what writing
    /// needs (the zstd level, the number of frames); kernels added as
    /// bytes to a compressing archive are compressed when it is written.
    /// Warns (`kpack.HrxLimitWarning`) for each limit of ROCm's HRX
    /// runtime the archive exceeds, as the `kpack` command's writers do.
    fn finalize(&mut self, py: Python<'_>) -> PyResult<()> {
        let writer = self
            .writer
            .take()
            .ok_or_else(|| PyRuntimeError::new_err("Archive already finalized"))?;
        writer.check_writable().map_err(Failure::from)?;
        warn_hrx_limits(py, &writer)?;
        self.finalized = Some(Finalized {
            writer,
            bytes: std::sync::OnceLock::new(),
        });
        Ok(())
    }

    /// Write the finalized archive to `path` (atomically: a temporary file
    /// renamed into place; parent directories created), fsynced when
    /// `durable` (`None`: when `KPACK_DURABLE=1`).
    #[pyo3(signature = (path, durable=None))]
    fn write(&self, py: Python<'_>, path: PathBuf, durable: Option<bool>) -> PyResult<()> {
        let f = self.finalized()?;
        py.detach(|| {
            crate::durably(durable, || {
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir)
                        .map_err(|e| Failure::from(kpack_host::Error::io(dir, e)))?;
                }
                match f.bytes.get() {
                    Some(bytes) => {
                        kpack_host::output::write_atomically(&path, |out| out.write_all(bytes))?
                    }
                    None => drop(f.writer.write(&path)?),
                }
                Ok(())
            })
        })?;
        Ok(())
    }

    /// The finalized archive, for reading back.
    fn reader(&self, py: Python<'_>) -> PyResult<NativeArchive> {
        let bytes = self.bytes(py)?.to_vec();
        Ok(NativeArchive::from_bytes(bytes)?)
    }

    /// The finalized archive's bytes.
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let bytes = self.bytes(py)?;
        Ok(PyBytes::new(py, bytes))
    }
}
