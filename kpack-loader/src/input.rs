//! Opening input files: memory-mapped, read-only. This module holds the
//! only `unsafe` code of kpack's Rust libraries (the maps and a
//! page-release hint); the C API's FFI is kpack-cxx's.
//!
//! [`ArchiveFile`] is an archive opened from its file with the map at hand,
//! so that a code object stored uncompressed can be handed out without a
//! copy, as its own private copy-on-write mapping ([`PrivateMap`]).

use std::fs::File;
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::archive::{Archive, ArchiveBytes, ArchiveError, Entry};
use crate::error::OpenError;

type Result<T> = std::result::Result<T, OpenError>;

/// A read-only view of a whole file. Empty files have no mapping.
pub struct Mapped {
    path: PathBuf,
    map: Option<memmap2::Mmap>,
    /// Kept open by [`map_file_with_handle`], for [`Mapped::array_at`].
    file: Option<File>,
}

impl Mapped {
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }

    /// Tell the kernel that the pages of `range` will not be needed again,
    /// so a long pass over a large input does not keep them resident. Only
    /// a hint: errors are ignored.
    pub fn release(&self, range: std::ops::Range<usize>) {
        if let Some(map) = &self.map {
            let page = 4096;
            let start = range.start.div_ceil(page) * page;
            let end = (range.end / page) * page;
            // Elsewhere than on Unix there is no such hint: the pages stay.
            #[cfg(unix)]
            if end > start && end <= map.len() {
                // SAFETY: MADV_DONTNEED on a read-only file mapping only
                // drops resident pages; touching them again refaults the
                // same bytes from the file. No writable private copy exists
                // whose contents could be lost.
                #[allow(unsafe_code)]
                let _ = unsafe {
                    map.unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        start,
                        end - start,
                    )
                };
            }
            #[cfg(not(unix))]
            let _ = (map, start, end);
        }
    }
}

impl Mapped {
    /// Where the slice `s` of this map is in the file (`None` for a slice
    /// from elsewhere).
    pub fn offset_of(&self, s: &[u8]) -> Option<u64> {
        let off = (s.as_ptr() as usize).checked_sub(self.bytes().as_ptr() as usize)?;
        (off.checked_add(s.len())? <= self.len() && !self.is_empty()).then_some(off as u64)
    }

    /// [`Mapped::release`] for a slice of this map (a slice from elsewhere
    /// is ignored).
    pub fn release_slice(&self, s: &[u8]) {
        if let Some(off) = self.offset_of(s) {
            let off = off as usize;
            self.release(off..off + s.len());
        }
    }
}

impl Mapped {
    /// The `N` bytes at `pos`, or `None` past the end. Read through the
    /// file (`pread`) when it was kept open ([`map_file_with_handle`]),
    /// otherwise from the map: a reader of a few bytes here and there across
    /// a large file (the frame index of an archive) is spared a page fault
    /// per read, each mapping the 64 KiB around it (the kernel's
    /// fault-around) into the process.
    pub fn array_at<const N: usize>(&self, pos: u64) -> Option<[u8; N]> {
        #[cfg(unix)]
        if let Some(file) = &self.file {
            use std::os::unix::fs::FileExt;
            let mut b = [0u8; N];
            if pos.checked_add(N as u64)? <= self.len() as u64
                && file.read_exact_at(&mut b, pos).is_ok()
            {
                return Some(b);
            }
        }
        crate::bytes::array_at(self.bytes(), pos)
    }
}

impl Deref for Mapped {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.bytes()
    }
}

impl Mapped {
    /// The `len` bytes at `offset` of the file, as a new private
    /// copy-on-write mapping of their pages: readable at once (shared with
    /// the page cache), writable (a written page becomes this mapping's own
    /// copy, seen by no other mapping), and valid until dropped, whatever
    /// becomes of `self`. `None` when the file was not kept open
    /// ([`map_file_with_handle`]), the range is empty or not in the file,
    /// or the system refuses the mapping.
    pub fn map_private(&self, offset: u64, len: usize) -> Option<PrivateMap> {
        let file = self.file.as_ref()?;
        let end = offset.checked_add(len as u64)?;
        if len == 0 || end > self.len() as u64 {
            return None;
        }
        // SAFETY: a private mapping of a range inside the file, which is
        // not truncated while kpack reads it (the documented contract:
        // replace files by renaming); writes go to this mapping's own
        // copies of the pages, never to the file. memmap2 aligns the offset
        // down to a page and hands out the requested range.
        #[allow(unsafe_code)]
        let map = unsafe {
            memmap2::MmapOptions::new()
                .offset(offset)
                .len(len)
                .map_copy(file)
        };
        map.ok().map(|map| PrivateMap { map })
    }
}

/// A code object that lives in its own private copy-on-write mapping of
/// the archive's pages ([`Mapped::map_private`]): its bytes without a copy,
/// writable like a heap buffer, unmapped when dropped.
pub struct PrivateMap {
    map: memmap2::MmapMut,
}

impl PrivateMap {
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.map.as_mut_ptr()
    }
}

impl Deref for PrivateMap {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.map
    }
}

impl DerefMut for PrivateMap {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.map
    }
}

impl std::fmt::Debug for PrivateMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrivateMap")
            .field("ptr", &self.map.as_ptr())
            .field("len", &self.map.len())
            .finish()
    }
}

/// Memory-map a file read-only.
///
/// Files kpack reads must not be truncated while mapped (that raises
/// SIGBUS on access): replace files by renaming, as package managers and
/// kpack itself do.
pub fn map_file(path: &Path) -> Result<Mapped> {
    map(path, false)
}

/// [`map_file`], keeping the file open for [`Mapped::array_at`] (one more
/// descriptor for as long as the map lives).
pub fn map_file_with_handle(path: &Path) -> Result<Mapped> {
    map(path, true)
}

/// Memory-map a file kpack has open (one it just wrote, to check it),
/// read-only; `path` names it in errors. The same contract as
/// [`map_file`]: nobody truncates it while it is mapped.
pub fn map_open(path: &Path, file: &File) -> Result<Mapped> {
    let len = file.metadata().map_err(|e| OpenError::io(path, e))?.len();
    let map = if len == 0 {
        None
    } else {
        // SAFETY: as in `map`: read-only, and the file is kpack's own
        // output, which nothing else writes while it is checked.
        #[allow(unsafe_code)]
        let map = unsafe { memmap2::Mmap::map(file) }.map_err(|e| OpenError::io(path, e))?;
        Some(map)
    };
    Ok(Mapped {
        path: path.to_path_buf(),
        map,
        file: None,
    })
}

fn map(path: &Path, keep_open: bool) -> Result<Mapped> {
    let io = |e| OpenError::io(path, e);
    let file = File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    let map = if len == 0 {
        None
    } else {
        // SAFETY: the map is read-only and private; its contents may change
        // only if another process rewrites the file in place, which kpack's
        // documented contract (replace by rename) excludes. Every parser
        // treats the bytes as untrusted input and bounds-checks them.
        #[allow(unsafe_code)]
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Some(map)
    };
    Ok(Mapped {
        path: path.to_path_buf(),
        map,
        file: keep_open.then_some(file),
    })
}

impl ArchiveBytes for Mapped {
    fn bytes(&self) -> &[u8] {
        Mapped::bytes(self)
    }

    /// Read through the file ([`Mapped::array_at`]): the frame index reads
    /// one such prefix per frame, spread over the whole blob.
    fn u32_at(&self, pos: u64) -> Option<u32> {
        self.array_at(pos).map(u32::from_le_bytes)
    }
}

/// Open and validate the archive at `path` (memory-mapped).
pub fn open_archive(path: impl AsRef<Path>) -> Result<Archive> {
    let path = path.as_ref();
    let data = map_file_with_handle(path)?;
    Archive::from_source(data).map_err(|source| OpenError::Archive {
        path: path.to_path_buf(),
        source,
    })
}

/// The map of an [`ArchiveFile`], shared by its [`Archive`] and itself.
struct SharedMap(Arc<Mapped>);

impl ArchiveBytes for SharedMap {
    fn bytes(&self) -> &[u8] {
        self.0.bytes()
    }

    fn u32_at(&self, pos: u64) -> Option<u32> {
        self.0.array_at(pos).map(u32::from_le_bytes)
    }
}

/// An archive opened from its file, the file's map at hand: what the
/// runtime reads code objects from ([`ArchiveFile::map_code_object`]).
/// Derefs to the [`Archive`].
pub struct ArchiveFile {
    archive: Archive,
    map: Arc<Mapped>,
}

impl ArchiveFile {
    /// Open and validate the archive at `path` (memory-mapped, the file
    /// kept open).
    pub fn open(path: impl AsRef<Path>) -> Result<ArchiveFile> {
        let path = path.as_ref();
        let map = Arc::new(map_file_with_handle(path)?);
        let archive =
            Archive::from_source(SharedMap(map.clone())).map_err(|source| OpenError::Archive {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(ArchiveFile { archive, map })
    }

    pub fn archive(&self) -> &Archive {
        &self.archive
    }

    /// The path it was opened with.
    pub fn path(&self) -> &Path {
        self.map.path()
    }

    /// Drop the map's resident pages ([`Mapped::release`]): for a tool
    /// reading many code objects, so that what it read stays in the page
    /// cache, not in the process. The archive reads on as before.
    pub fn release_pages(&self) {
        self.map.release(0..self.map.len());
    }

    /// The code object of `entry` (an entry of this archive) without a
    /// copy, when the archive stores it as it is (scheme `none`): its own
    /// private copy-on-write mapping of the file's pages. `Ok(None)` when it
    /// is compressed, empty, or the system refuses the mapping: read it
    /// with [`Archive::read_into`] then. `Err` as [`Archive::read`] would
    /// fail.
    pub fn map_code_object(
        &self,
        entry: &Entry,
    ) -> std::result::Result<Option<PrivateMap>, ArchiveError> {
        let Some((offset, size)) = self.archive.stored_range(entry)? else {
            return Ok(None);
        };
        Ok(usize::try_from(size)
            .ok()
            .and_then(|len| self.map.map_private(offset, len)))
    }
}

impl Deref for ArchiveFile {
    type Target = Archive;
    fn deref(&self) -> &Archive {
        &self.archive
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::ArchiveError;

    #[test]
    fn open_archive_names_the_file() {
        let err = open_archive("/nonexistent/x.kpack").unwrap_err();
        assert!(matches!(err, OpenError::Io { .. }));
        assert_eq!(err.path(), Path::new("/nonexistent/x.kpack"));
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("empty.kpack");
        std::fs::write(&p, b"").unwrap();
        let err = open_archive(&p).unwrap_err();
        assert!(
            matches!(
                err,
                OpenError::Archive {
                    source: ArchiveError::TruncatedHeader { len: 0 },
                    ..
                }
            ),
            "{err}"
        );
        let p = dir.path().join("v999.kpack");
        let mut b = b"KPAK".to_vec();
        b.extend(999u32.to_le_bytes());
        b.resize(20, 0);
        std::fs::write(&p, b).unwrap();
        let err = open_archive(&p).unwrap_err();
        assert!(err
            .to_string()
            .contains("unsupported kpack archive version 999"));
        assert_eq!(
            crate::ErrorCode::of_open(&err),
            crate::ErrorCode::UnsupportedVersion
        );
    }
}
