//! Reading `.kpack` archives: [`NativeArchive`], over kpack-format's
//! reader on a memory map of the file.

use std::path::PathBuf;

use kpack_format::archive::{Archive, Entry};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

use crate::convert::metadata_to_py;
use crate::errors::{Failure, Kind};

/// Archives up to this size are read into memory when opened; larger ones
/// are mapped (their kernels then read only when asked for). Measured: one
/// read is cheaper than a map up to about 128 KiB; a 330 KiB archive read
/// whole costs twice its map and the reads of three kernels from it (the
/// buffer's pages are faulted in each time).
const READ_WHOLE: u64 = 128 << 10;

/// An open archive. The TOC is validated when opened; kernels are read
/// (and decompressed) only when asked for, with the GIL released.
#[pyclass(frozen, module = "kpack._native")]
pub struct NativeArchive {
    archive: Archive,
    /// Where the archive's bytes start in memory: with it, a kernel stored
    /// as it is (scheme `none`) is located in the file for a zero-copy view.
    base: usize,
    path: Option<PathBuf>,
}

impl NativeArchive {
    fn entry(&self, key: &str, target: &str) -> Option<&Entry> {
        self.archive.entry(key, target)
    }

    fn read_bytes<'py>(&self, py: Python<'py>, e: &Entry) -> PyResult<Bound<'py, PyBytes>> {
        let archive = &self.archive;
        // Checked first: the size is the TOC's, allocated before reading.
        archive.check(e).map_err(|x| self.failure(x))?;
        let len = usize::try_from(e.original_size)
            .map_err(|_| Failure::new(Kind::Archive, "kernel does not fit in memory"))?;
        PyBytes::new_with(py, len, |buf| {
            py.detach(|| archive.read_into(e, buf))
                .map_err(|x| self.failure(x).into())
        })
    }

    fn failure(&self, e: kpack_format::archive::ArchiveError) -> Failure {
        match &self.path {
            Some(p) => Failure::of(&kpack_loader::OpenError::Archive {
                path: p.clone(),
                source: e,
            }),
            None => Failure::from(e),
        }
    }

    /// The archive at `path`, read into memory (one read: cheaper than
    /// mapping a small file and faulting its pages in one by one).
    fn read_whole(path: PathBuf) -> Result<Self, Failure> {
        let bytes = std::fs::read(&path).map_err(|e| kpack_loader::OpenError::io(&path, e))?;
        let boxed: Box<[u8]> = bytes.into_boxed_slice();
        let base = boxed.as_ptr() as usize;
        let archive =
            Archive::from_bytes(boxed).map_err(|source| kpack_loader::OpenError::Archive {
                path: path.clone(),
                source,
            })?;
        Ok(NativeArchive {
            archive,
            base,
            path: Some(path),
        })
    }

    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, Failure> {
        let boxed: Box<[u8]> = bytes.into_boxed_slice();
        let base = boxed.as_ptr() as usize;
        let archive = Archive::from_bytes(boxed)?;
        Ok(NativeArchive {
            archive,
            base,
            path: None,
        })
    }
}

#[pymethods]
impl NativeArchive {
    /// Open and validate the archive at `path`: read into memory when it
    /// is small ([`READ_WHOLE`]), memory-mapped otherwise.
    #[staticmethod]
    fn open(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let opened = py.detach(|| -> Result<NativeArchive, Failure> {
            let small =
                std::fs::metadata(&path).is_ok_and(|m| m.is_file() && m.len() <= READ_WHOLE);
            if small {
                return NativeArchive::read_whole(path.clone());
            }
            let mapped = kpack_loader::map_file_with_handle(&path)?;
            let base = mapped.as_ptr() as usize;
            let archive = Archive::from_source(mapped).map_err(|source| {
                kpack_loader::OpenError::Archive {
                    path: path.clone(),
                    source,
                }
            })?;
            Ok(NativeArchive {
                archive,
                base,
                path: Some(path.clone()),
            })
        });
        Ok(opened?)
    }

    #[getter]
    fn group_name(&self) -> &str {
        self.archive.group_name()
    }

    #[getter]
    fn gfx_arch_family(&self) -> &str {
        self.archive.gfx_arch_family()
    }

    #[getter]
    fn gfx_arches(&self) -> Vec<String> {
        self.archive.gfx_arches().to_vec()
    }

    #[getter]
    fn scheme(&self) -> &'static str {
        self.archive.scheme().name()
    }

    #[getter]
    fn file_size(&self) -> u64 {
        self.archive.file_size()
    }

    fn __len__(&self) -> usize {
        self.archive.kernel_count()
    }

    /// Every entry in TOC order: `(key, target, type, ordinal,
    /// original_size, metadata or None)`.
    fn entries<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for e in self.archive.entries() {
            let md = match &e.metadata {
                Some(m) => metadata_to_py(py, m)?.into_any(),
                None => py.None().into_bound(py),
            };
            let t = PyTuple::new(
                py,
                [
                    e.key.as_str().into_pyobject(py)?.into_any(),
                    e.target.as_str().into_pyobject(py)?.into_any(),
                    e.kind.as_deref().into_pyobject(py)?.into_any(),
                    e.ordinal.into_pyobject(py)?.into_any(),
                    e.original_size.into_pyobject(py)?.into_any(),
                    md,
                ],
            )?;
            list.append(t)?;
        }
        Ok(list)
    }

    fn contains(&self, key: &str, target: &str) -> bool {
        self.entry(key, target).is_some()
    }

    /// The kernel `key` @ `target` as `bytes`, or `None` if the archive has
    /// no such entry.
    fn read<'py>(
        &self,
        py: Python<'py>,
        key: &str,
        target: &str,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        match self.entry(key, target) {
            Some(e) => Ok(Some(self.read_bytes(py, e)?)),
            None => Ok(None),
        }
    }

    /// The kernel of the first entry with this ordinal (the reference
    /// compressors' `decompress_kernel`).
    fn read_ordinal<'py>(&self, py: Python<'py>, ordinal: u32) -> PyResult<Bound<'py, PyBytes>> {
        let e = self
            .archive
            .entries_by_ordinal()
            .map(|(_, _, e)| e)
            .find(|e| e.ordinal == ordinal)
            .ok_or_else(|| {
                Failure::new(
                    Kind::Usage,
                    format!("no kernel has ordinal {ordinal} in this archive"),
                )
            })?;
        self.read_bytes(py, e)
    }

    /// `(original_size, stored_size, scheme)` of the kernel `key` @
    /// `target`, from the TOC and without decompressing (checked as a read
    /// checks it first), or `None` if the archive has no such entry.
    fn info(&self, key: &str, target: &str) -> PyResult<Option<(u64, u64, &'static str)>> {
        let Some(e) = self.entry(key, target) else {
            return Ok(None);
        };
        let i = self.archive.kernel_info(e).map_err(|x| self.failure(x))?;
        Ok(Some((i.original_size, i.stored_size, i.scheme.name())))
    }

    /// Where in the file the kernel `key` @ `target` is stored as it is
    /// (scheme `none`): `(offset, size)` after checking the entry, or `None`
    /// for a compressed kernel. Raises for a missing entry.
    fn stored_range(&self, key: &str, target: &str) -> PyResult<Option<(u64, u64)>> {
        if self.archive.scheme() != kpack_format::archive::Scheme::None {
            return Ok(None);
        }
        let e = self.entry(key, target).ok_or_else(|| {
            Failure::of(&kpack_format::archive::ArchiveError::KernelNotFound {
                key: key.into(),
                target: target.into(),
            })
        })?;
        let data = self.archive.read(e).map_err(|x| self.failure(x))?;
        let offset = data.as_ptr() as usize - self.base;
        Ok(Some((offset as u64, data.len() as u64)))
    }
}
