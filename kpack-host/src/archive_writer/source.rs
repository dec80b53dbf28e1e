//! Where the bytes of a kernel being written come from: memory, a range of
//! a file read when needed, or a zstd frame made already (with the
//! writer's parameters: the writer then copies it instead of compressing).
//!
//! A range of a file is read with `pread` into bounded buffers, never
//! mapped: its pages then stay in the page cache, out of the writing
//! process. (Pages of a map that a writer touches count in its resident
//! size; with large page-cache folios, touching one code object maps its
//! neighbours too, which other archives may not write for a long time.)

use std::borrow::Cow;
use std::cell::RefCell;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::archive::ArchiveError;
use crate::input::Mapped;

/// Bytes read from a file per step when comparing or copying a range.
const CHUNK: usize = 1 << 20;

/// A kernel's bytes, as given to [`super::ArchiveWriter::add`].
#[derive(Debug, Clone)]
pub enum KernelData<'a> {
    /// In memory (or in a map the caller manages).
    Bytes(Cow<'a, [u8]>),
    /// In memory owned elsewhere, shared without a copy.
    Shared(SharedBytes),
    /// A range of a file, read when the kernel is compared or written.
    File(FileRange),
    /// A range of a file holding the kernel's zstd frame, made by a
    /// [`FrameCompressor`]: copied as it is by a writer with the same
    /// [`FrameParams`], decompressed otherwise.
    Frame(Frame),
}

/// Bytes in memory that the writer shares with their owner instead of
/// copying (kpack's Python API hands it the `bytes` objects it is given):
/// kept alive as long as the writer holds them.
#[derive(Clone)]
pub struct SharedBytes(Arc<dyn AsRef<[u8]> + Send + Sync>);

impl SharedBytes {
    pub fn new(bytes: impl AsRef<[u8]> + Send + Sync + 'static) -> Self {
        SharedBytes(Arc::new(bytes))
    }
}

impl std::ops::Deref for SharedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        (*self.0).as_ref()
    }
}

impl std::fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedBytes({} bytes)", self.len())
    }
}

impl From<Vec<u8>> for SharedBytes {
    fn from(v: Vec<u8>) -> Self {
        SharedBytes::new(v)
    }
}

/// A kernel compressed already.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Where the frame is.
    pub bytes: FileRange,
    /// The kernel's size, uncompressed.
    pub len: usize,
    /// What it was compressed with.
    pub params: FrameParams,
}

/// The parameters that decide a frame's bytes: an archive writer's zstd
/// level and whether frames carry a checksum (formats.md §3.2). zstd is
/// deterministic: the same bytes compressed with the same parameters give
/// the same frame, and different bytes different frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameParams {
    pub level: i32,
    pub checksum: bool,
}

/// Compresses kernels into frames exactly as an [`super::ArchiveWriter`]
/// with the same [`FrameParams`] does.
///
/// The zstd context is the calling thread's, kept from one frame to the
/// next ([`with_context`]): making a context costs as much as compressing
/// 20 kB, and zstd's output does not depend on what a context compressed
/// before.
pub struct FrameCompressor {
    params: FrameParams,
}

impl FrameCompressor {
    /// A compressor with these parameters (an invalid level is an error).
    pub fn new(params: FrameParams) -> std::io::Result<Self> {
        with_context(params, |_| Ok(()))?;
        Ok(FrameCompressor { params })
    }

    pub fn compress(&mut self, data: &[u8]) -> std::io::Result<Vec<u8>> {
        with_context(self.params, |z| z.compress(data))
    }
}

thread_local! {
    /// This thread's zstd context and the parameters it is set up with.
    static CONTEXT: RefCell<Option<(FrameParams, zstd::bulk::Compressor<'static>)>> =
        const { RefCell::new(None) };
}

/// Run `f` with this thread's zstd context, set up for `params` (made, or
/// set up again, when it was for other parameters).
fn with_context<T>(
    params: FrameParams,
    f: impl FnOnce(&mut zstd::bulk::Compressor<'static>) -> std::io::Result<T>,
) -> std::io::Result<T> {
    CONTEXT.with(|cell| {
        let mut slot = cell.borrow_mut();
        let z = match &mut *slot {
            Some((p, z)) if *p == params => z,
            other => &mut other.insert((params, zstd_context(params)?)).1,
        };
        f(z)
    })
}

fn zstd_context(params: FrameParams) -> std::io::Result<zstd::bulk::Compressor<'static>> {
    let mut zstd = zstd::bulk::Compressor::new(params.level)?;
    zstd.include_checksum(params.checksum)?;
    zstd.include_contentsize(true)?;
    zstd.include_dictid(false)?;
    Ok(zstd)
}

/// `len` bytes at `offset` of the file at `path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRange {
    pub path: Arc<Path>,
    pub offset: u64,
    pub len: usize,
}

impl<'a> From<&'a [u8]> for KernelData<'a> {
    fn from(b: &'a [u8]) -> Self {
        KernelData::Bytes(Cow::Borrowed(b))
    }
}

impl From<Vec<u8>> for KernelData<'_> {
    fn from(b: Vec<u8>) -> Self {
        KernelData::Bytes(Cow::Owned(b))
    }
}

impl<'a> From<Cow<'a, [u8]>> for KernelData<'a> {
    fn from(b: Cow<'a, [u8]>) -> Self {
        KernelData::Bytes(b)
    }
}

impl From<SharedBytes> for KernelData<'_> {
    fn from(b: SharedBytes) -> Self {
        KernelData::Shared(b)
    }
}

impl From<FileRange> for KernelData<'_> {
    fn from(r: FileRange) -> Self {
        KernelData::File(r)
    }
}

impl From<Frame> for KernelData<'_> {
    fn from(f: Frame) -> Self {
        KernelData::Frame(f)
    }
}

impl KernelData<'_> {
    /// The kernel's size (uncompressed).
    pub fn len(&self) -> usize {
        match self {
            KernelData::Bytes(b) => b.len(),
            KernelData::Shared(b) => b.len(),
            KernelData::File(r) => r.len,
            KernelData::Frame(f) => f.len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes, when they are in memory.
    fn in_memory(&self) -> Option<&[u8]> {
        match self {
            KernelData::Bytes(b) => Some(b),
            KernelData::Shared(b) => Some(b),
            KernelData::File(_) | KernelData::Frame(_) => None,
        }
    }

    /// The bytes: borrowed when in memory, read (and decompressed)
    /// otherwise.
    pub(super) fn load(&self) -> Result<Cow<'_, [u8]>, ArchiveError> {
        match self {
            KernelData::Bytes(b) => Ok(Cow::Borrowed(b)),
            KernelData::Shared(b) => Ok(Cow::Borrowed(b)),
            KernelData::File(r) => Ok(Cow::Owned(r.read_all()?)),
            KernelData::Frame(f) => Ok(Cow::Owned(f.decompress()?)),
        }
    }

    /// The frame to write for a writer compressing with `params`, when
    /// this kernel is one made with them already.
    pub(super) fn frame_for(&self, params: FrameParams) -> Result<Option<Vec<u8>>, ArchiveError> {
        match self {
            KernelData::Frame(f) if f.params == params => Ok(Some(f.bytes.read_all()?)),
            _ => Ok(None),
        }
    }

    /// Pass the bytes to `f` in order, at most [`CHUNK`] at a time.
    pub(super) fn for_each_chunk(
        &self,
        mut f: impl FnMut(&[u8]) -> Result<(), ArchiveError>,
    ) -> Result<(), ArchiveError> {
        if let KernelData::Frame(frame) = self {
            let bytes = frame.decompress()?;
            return bytes.chunks(CHUNK).try_for_each(f);
        }
        let mut chunks = Chunks::new(self)?;
        while let Some(c) = chunks.next()? {
            f(c)?;
        }
        Ok(())
    }
}

/// Whether two kernels hold the same bytes (compared chunk by chunk: two
/// ranges of files need two [`CHUNK`] buffers, not their sizes).
pub(super) fn same_bytes(a: &KernelData<'_>, b: &KernelData<'_>) -> Result<bool, ArchiveError> {
    if a.len() != b.len() {
        return Ok(false);
    }
    if let (Some(x), Some(y)) = (a.in_memory(), b.in_memory()) {
        return Ok(x == y);
    }
    match (a, b) {
        // Same parameters: the same bytes make the same frame.
        (KernelData::Frame(x), KernelData::Frame(y)) if x.params == y.params => {
            return same_bytes(
                &KernelData::File(x.bytes.clone()),
                &KernelData::File(y.bytes.clone()),
            );
        }
        (KernelData::Frame(x), other) | (other, KernelData::Frame(x)) => {
            let bytes = KernelData::from(x.decompress()?);
            return same_bytes(&bytes, other);
        }
        _ => {}
    }
    let (mut ca, mut cb) = (Chunks::new(a)?, Chunks::new(b)?);
    loop {
        match (ca.next()?, cb.next()?) {
            (Some(x), Some(y)) if x == y => continue,
            (None, None) => return Ok(true),
            _ => return Ok(false),
        }
    }
}

impl FileRange {
    /// The slice `s` of `input`'s map as a range of its file, for a writer
    /// to read when it needs the bytes (`None` for a slice from elsewhere).
    pub fn of_slice(input: &Mapped, s: &[u8]) -> Option<FileRange> {
        Some(FileRange {
            path: input.path().into(),
            offset: input.offset_of(s)?,
            len: s.len(),
        })
    }

    /// All of the range's bytes.
    pub(super) fn read_all(&self) -> Result<Vec<u8>, ArchiveError> {
        let mut buf = vec![0; self.len];
        if self.len > 0 {
            self.read(&self.open()?, 0, &mut buf)?;
        }
        Ok(buf)
    }

    fn open(&self) -> Result<File, ArchiveError> {
        File::open(&self.path).map_err(|e| self.error(0, e))
    }

    /// Fill `buf` from `at` bytes into the range.
    fn read(&self, file: &File, at: usize, buf: &mut [u8]) -> Result<(), ArchiveError> {
        read_exact_at(file, buf, self.offset + at as u64).map_err(|e| self.error(at, e))
    }

    fn error(&self, at: usize, e: std::io::Error) -> ArchiveError {
        ArchiveError::ReadInput {
            path: PathBuf::from(&*self.path),
            offset: self.offset + at as u64,
            len: self.len - at,
            source: Arc::new(e),
        }
    }
}

impl Frame {
    /// The kernel's bytes.
    fn decompress(&self) -> Result<Vec<u8>, ArchiveError> {
        let frame = self.bytes.read_all()?;
        let fail = |e: std::io::Error| self.bytes.error(0, e);
        let bytes = zstd::bulk::decompress(&frame, self.len).map_err(fail)?;
        if bytes.len() != self.len {
            return Err(fail(std::io::Error::other(format!(
                "the frame holds {} bytes, not {}",
                bytes.len(),
                self.len
            ))));
        }
        Ok(bytes)
    }
}

/// Successive pieces of a kernel's bytes, [`CHUNK`] bytes each but the
/// last (slices when in memory, read into one buffer from a file).
struct Chunks<'d> {
    data: &'d KernelData<'d>,
    file: Option<File>,
    buf: Vec<u8>,
    pos: usize,
}

impl<'d> Chunks<'d> {
    fn new(data: &'d KernelData<'d>) -> Result<Self, ArchiveError> {
        let file = match data {
            KernelData::File(r) if r.len > 0 => Some(r.open()?),
            _ => None,
        };
        Ok(Chunks {
            data,
            file,
            buf: Vec::new(),
            pos: 0,
        })
    }

    fn next(&mut self) -> Result<Option<&[u8]>, ArchiveError> {
        let len = self.data.len();
        if self.pos >= len {
            return Ok(None);
        }
        let (at, n) = (self.pos, CHUNK.min(len - self.pos));
        self.pos += n;
        match (self.data, &self.file) {
            (KernelData::File(r), Some(file)) => {
                self.buf.resize(n, 0);
                r.read(file, at, &mut self.buf)?;
                Ok(Some(&self.buf))
            }
            (KernelData::Bytes(b), _) => Ok(Some(&b[at..at + n])),
            (KernelData::Shared(b), _) => Ok(Some(&b[at..at + n])),
            (KernelData::File(_), None) | (KernelData::Frame(_), _) => Ok(None),
        }
    }
}

#[cfg(unix)]
fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
}

#[cfg(windows)]
fn read_exact_at(file: &File, mut buf: &mut [u8], mut offset: u64) -> std::io::Result<()> {
    use std::os::windows::fs::FileExt;
    while !buf.is_empty() {
        match file.seek_read(buf, offset) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with(bytes: &[u8]) -> (tempfile::TempDir, Arc<Path>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.bin");
        std::fs::write(&path, bytes).unwrap();
        (dir, Arc::from(path.as_path()))
    }

    #[test]
    fn a_range_reads_the_same_bytes_as_memory() {
        let bytes: Vec<u8> = (0..3 * CHUNK + 17).map(|i| (i * 7 % 251) as u8).collect();
        let (_d, path) = file_with(&bytes);
        let range = |offset: usize, len: usize| {
            KernelData::File(FileRange {
                path: path.clone(),
                offset: offset as u64,
                len,
            })
        };
        let r = range(5, 2 * CHUNK + 3);
        let mem = KernelData::from(&bytes[5..5 + 2 * CHUNK + 3]);
        assert_eq!(r.load().unwrap(), mem.load().unwrap());
        assert!(same_bytes(&r, &mem).unwrap());
        let mut copied = Vec::new();
        r.for_each_chunk(|c| {
            assert!(c.len() <= CHUNK);
            copied.extend_from_slice(c);
            Ok(())
        })
        .unwrap();
        assert_eq!(copied, &bytes[5..5 + 2 * CHUNK + 3]);
        // One byte apart, in the last chunk; shifted by one.
        assert!(!same_bytes(&range(5, 2 * CHUNK + 3), &range(6, 2 * CHUNK + 3)).unwrap());
        let mut other = bytes.clone();
        other[5 + 2 * CHUNK + 2] ^= 1;
        let other_mem = KernelData::from(&other[5..5 + 2 * CHUNK + 3]);
        assert!(!same_bytes(&r, &other_mem).unwrap());
        assert!(same_bytes(&range(0, 0), &KernelData::from(&[][..])).unwrap());
    }

    /// A thread's context kept across frames of all sizes, in any order
    /// and with other parameters in between, makes the frames a fresh
    /// context makes.
    #[test]
    fn a_kept_context_makes_the_frames_of_a_fresh_one() {
        let data: Vec<u8> = (0..3_000_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 27) as u8 & (i as u8 | 0x0f))
            .collect();
        let fresh = |p: FrameParams, d: &[u8]| zstd_context(p).unwrap().compress(d).unwrap();
        let a = FrameParams {
            level: 3,
            checksum: true,
        };
        let b = FrameParams {
            level: 19,
            checksum: false,
        };
        let sizes = [2_500_000, 10, 70_000, 0, 1_200_000, 5_000, 300_000, 131_073];
        let mut kept = FrameCompressor::new(a).unwrap();
        for (i, &n) in sizes.iter().chain(sizes.iter().rev()).enumerate() {
            let d = &data[i * 1000..i * 1000 + n];
            assert_eq!(kept.compress(d).unwrap(), fresh(a, d), "{n} bytes");
            if i % 3 == 0 {
                let small = &d[..n.min(9_000)];
                let got = FrameCompressor::new(b).unwrap().compress(small).unwrap();
                assert_eq!(got, fresh(b, small));
            }
        }
    }

    #[test]
    fn a_range_past_the_end_names_the_file() {
        let (_d, path) = file_with(b"0123456789");
        let r = KernelData::File(FileRange {
            path: path.clone(),
            offset: 4,
            len: 10,
        });
        let e = r.load().unwrap_err().to_string();
        assert!(e.contains("f.bin") && e.contains("offset 4"), "{e}");
        assert!(same_bytes(&r, &KernelData::from(vec![0; 10])).is_err());
    }
}
