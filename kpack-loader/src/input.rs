//! Opening input files: memory-mapped, read-only. This module holds the
//! only `unsafe` code of kpack's Rust libraries (the map and a
//! page-release hint); the C API's FFI is kpack-cxx's.

use std::fs::File;
use std::ops::Deref;
use std::path::{Path, PathBuf};

use crate::archive::{Archive, ArchiveBytes};
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
