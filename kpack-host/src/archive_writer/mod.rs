//! Writing `.kpack` archives.
//!
//! Kernels are added in order (their ordinals), then written in one pass:
//! header placeholder, blob, TOC, then the TOC offset is patched in. For
//! `zstd-per-kernel`, kernels are compressed in parallel in batches of about
//! [`DEFAULT_BATCH_BYTES`] of input, each batch written before the next is
//! compressed, so memory stays bounded. Every kernel is its own frame
//! compressed with the same parameters, so the output does not depend on the
//! number of threads.
//!
//! A kernel may also come compressed ahead of time ([`zstd_frame`], e.g. on
//! a caller's own threads, as kpack's Python API does): [`ArchiveWriter::add_frame`]
//! takes the frame as it is, and the archive is the same, byte for byte, as
//! with the kernel's bytes given to [`ArchiveWriter::add`] at that level.
//!
//! Shared code objects: a kernel added with the same target and the same
//! bytes as one added before is stored once; its TOC entry gets the earlier
//! kernel's ordinal (frames: the same target and the same frame). Readers (kpack's, the reference runtime's and Python
//! tooling's) find kernels by ordinal, so such archives read unchanged; an
//! archive without duplicates is byte-for-byte what it was before.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::Path;

use rayon::prelude::*;

mod source;

use source::same_bytes;
pub use source::{FileRange, Frame, FrameCompressor, FrameParams, KernelData, SharedBytes};

use crate::archive::{
    ArchiveError, Metadata, Scheme, DEFAULT_ZSTD_LEVEL, FORMAT_VERSION, HEADER_SIZE, MAGIC,
    MAX_FRAMES, MAX_FRAME_SIZE, MAX_KERNEL_SIZE,
};
use crate::archive::{EntryOut, Layout, TocOut};
use crate::bytes;
use crate::error::WithPath;
use crate::msgpack;

/// Input bytes compressed per parallel batch.
pub const DEFAULT_BATCH_BYTES: usize = 64 << 20;

/// What [`ArchiveWriter`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteSummary {
    /// Number of kernels.
    pub kernels: usize,
    /// Sum of the kernels' sizes.
    pub bytes_in: u64,
    /// Size of the archive file.
    pub bytes_out: u64,
    /// TOC entries that share the ordinal of an earlier, identical code
    /// object (same target, same bytes) instead of being stored again.
    pub shared: usize,
    /// Uncompressed bytes those entries did not store again.
    pub bytes_saved: u64,
}

/// A kernel stored in the blob (its index is its ordinal).
struct Pending<'a> {
    key: String,
    target: String,
    data: Stored<'a>,
}

/// A stored kernel's bytes: as given, or already a zstd frame.
enum Stored<'a> {
    Raw(KernelData<'a>),
    Frame {
        frame: SharedBytes,
        original_size: u64,
    },
}

impl Stored<'_> {
    /// The kernel's size, uncompressed.
    fn original_size(&self) -> u64 {
        match self {
            Stored::Raw(d) => d.len() as u64,
            Stored::Frame { original_size, .. } => *original_size,
        }
    }

    /// The bytes a batch takes to compress (a frame: none to speak of).
    fn work(&self) -> usize {
        match self {
            Stored::Raw(d) => d.len(),
            Stored::Frame { frame, .. } => frame.len() / 16,
        }
    }
}

/// The zstd frame [`ArchiveWriter`] writes for `data` at `level` (content
/// size and checksum recorded, no dictionary ID): for
/// [`ArchiveWriter::add_frame`], so that kernels may be compressed where
/// and when the caller likes.
pub fn zstd_frame(data: &[u8], level: i32) -> Result<Vec<u8>, ArchiveError> {
    check_level(level)?;
    let mut c = FrameCompressor::new(FrameParams {
        level,
        checksum: true,
    })?;
    Ok(c.compress(data)?)
}

/// One TOC entry: a (key, target) and the ordinal of its bytes.
struct TocEntry {
    target: String,
    ordinal: usize,
    size: u64,
    metadata: Option<Metadata>,
}

/// Builds a `.kpack` archive.
///
/// ```no_run
/// # use kpack_format::archive::Scheme;
/// # use kpack_host::ArchiveWriter;
/// let code = std::fs::read("kernel.hsaco")?;
/// let mut w = ArchiveWriter::new("blas", "gfx942", vec!["gfx942".into()]);
/// w.add("lib/librocblas.so#0", "gfx942", code.as_slice(), None)?;
/// let summary = w.write("blas_gfx942.kpack")?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct ArchiveWriter<'a> {
    group_name: String,
    gfx_arch_family: String,
    gfx_arches: Vec<String>,
    scheme: Scheme,
    level: i32,
    checksum: bool,
    batch_bytes: usize,
    /// Keys need not end in `#N`.
    free_keys: bool,
    /// In ordinal order.
    kernels: Vec<Pending<'a>>,
    /// In insertion order.
    entries: Vec<TocEntry>,
    /// Keys in first-insertion order, each with its entries' indices.
    keys: Vec<(String, Vec<usize>)>,
    key_index: HashMap<String, usize>,
    seen: HashSet<(String, String)>,
    /// (target, size) -> ordinals of the stored kernels of that size.
    by_content: HashMap<(String, u64), Vec<usize>>,
}

impl<'a> ArchiveWriter<'a> {
    /// An empty archive with the given TOC header fields; scheme
    /// `zstd-per-kernel`, level [`DEFAULT_ZSTD_LEVEL`], content checksums on.
    pub fn new(
        group_name: impl Into<String>,
        gfx_arch_family: impl Into<String>,
        gfx_arches: Vec<String>,
    ) -> Self {
        ArchiveWriter {
            group_name: group_name.into(),
            gfx_arch_family: gfx_arch_family.into(),
            gfx_arches,
            scheme: Scheme::ZstdPerKernel,
            level: DEFAULT_ZSTD_LEVEL,
            checksum: true,
            batch_bytes: DEFAULT_BATCH_BYTES,
            free_keys: false,
            kernels: Vec::new(),
            entries: Vec::new(),
            keys: Vec::new(),
            key_index: HashMap::new(),
            seen: HashSet::new(),
            by_content: HashMap::new(),
        }
    }

    /// Set the compression scheme.
    pub fn scheme(mut self, scheme: Scheme) -> Self {
        self.scheme = scheme;
        self
    }

    /// Set the zstd level (checked when writing; `0` means zstd's default).
    pub fn zstd_level(mut self, level: i32) -> Self {
        self.level = level;
        self
    }

    /// Whether zstd frames carry a content checksum (default: yes, formats.md §3.2).
    /// Turning it off reproduces the reference Python writer's frames.
    pub fn content_checksum(mut self, on: bool) -> Self {
        self.checksum = on;
        self
    }

    /// Input bytes compressed per parallel batch (default
    /// [`DEFAULT_BATCH_BYTES`]; a batch holds at least one kernel).
    pub fn batch_bytes(mut self, bytes: usize) -> Self {
        self.batch_bytes = bytes.max(1);
        self
    }

    /// Accept any key, not only `<path>#<N>` (the keys of kpack's own
    /// writers and of the runtime's lookups): the reference Python API packs
    /// kernels under arbitrary relative paths.
    pub fn free_form_keys(mut self, on: bool) -> Self {
        self.free_keys = on;
        self
    }

    /// The limits of ROCm's HRX runtime ([`kpack_format::hrx`]) the
    /// archive as added so far exceeds: its targets', keys' and code
    /// objects' (each key and target once), in TOC order. Writers report
    /// them as warnings: the archive is valid, but only kpack's runtime
    /// reads it.
    pub fn hrx_limits(&self) -> Vec<kpack_format::hrx::Exceeded> {
        use kpack_format::hrx;
        let mut v = Vec::new();
        let mut targets = HashSet::new();
        for t in &self.gfx_arches {
            if targets.insert(t.as_str()) {
                v.extend(hrx::check_target(t));
            }
        }
        for (key, entries) in &self.keys {
            v.extend(hrx::check_key(key));
            for e in entries.iter().map(|&i| &self.entries[i]) {
                if targets.insert(e.target.as_str()) {
                    v.extend(hrx::check_target(&e.target));
                }
                v.extend(hrx::check_code_object(key, &e.target, e.size));
            }
        }
        v
    }

    /// The archive's group name, as given to [`ArchiveWriter::new`].
    pub fn group_name(&self) -> &str {
        &self.group_name
    }

    /// Number of kernels added (TOC entries, shared ones included).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no kernel was added.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Add a kernel; returns its ordinal: a new one, or that of an earlier
    /// kernel with the same target and bytes, which it then shares (the
    /// bytes are stored once). `key` must end in `#N` (N decimal);
    /// (`key`, `target`) must be new. `metadata`, if given, is written as the
    /// entry's `metadata` map in the given order. The bytes are in memory,
    /// or a range of a file ([`super::FileRange`]), read only when compared
    /// and when written, so a large input is never held or mapped whole.
    pub fn add(
        &mut self,
        key: impl Into<String>,
        target: impl Into<String>,
        data: impl Into<KernelData<'a>>,
        metadata: Option<Metadata>,
    ) -> Result<u32, ArchiveError> {
        self.add_stored(
            key.into(),
            target.into(),
            Stored::Raw(data.into()),
            metadata,
        )
    }

    /// Add a kernel compressed ahead of time: `frame` is [`zstd_frame`] of
    /// its `original_size` bytes. As [`ArchiveWriter::add`] otherwise; it
    /// shares the ordinal of an earlier frame of the same target with the
    /// same bytes (the same code object at the same level). Written as it
    /// is with `zstd-per-kernel` (whatever the writer's level), decompressed
    /// with scheme `none`.
    pub fn add_frame(
        &mut self,
        key: impl Into<String>,
        target: impl Into<String>,
        frame: impl Into<SharedBytes>,
        original_size: u64,
        metadata: Option<Metadata>,
    ) -> Result<u32, ArchiveError> {
        let data = Stored::Frame {
            frame: frame.into(),
            original_size,
        };
        self.add_stored(key.into(), target.into(), data, metadata)
    }

    fn add_stored(
        &mut self,
        key: String,
        target: String,
        data: Stored<'a>,
        metadata: Option<Metadata>,
    ) -> Result<u32, ArchiveError> {
        if !self.free_keys {
            check_key(&key)?;
        }
        let size = data.original_size();
        if size > MAX_KERNEL_SIZE {
            return Err(ArchiveError::KernelTooLarge {
                key,
                target,
                size,
                max: MAX_KERNEL_SIZE,
            });
        }
        let id = (key.clone(), target.clone());
        if self.seen.contains(&id) {
            return Err(ArchiveError::DuplicateKernel { key, target });
        }
        // A failed add changes nothing.
        let ordinal = match self.stored_copy(&target, &data)? {
            Some(ordinal) => ordinal,
            None => self.store(&key, &target, data)?,
        };
        self.seen.insert(id);
        let slot = match self.key_index.get(&key) {
            Some(&i) => i,
            None => {
                self.keys.push((key.clone(), Vec::new()));
                self.key_index.insert(key, self.keys.len() - 1);
                self.keys.len() - 1
            }
        };
        self.keys[slot].1.push(self.entries.len());
        self.entries.push(TocEntry {
            target,
            ordinal,
            size,
            metadata,
        });
        // Fits: store() checked it.
        Ok(ordinal as u32)
    }

    /// The ordinal of a stored kernel with this target and these bytes.
    fn stored_copy(&self, target: &str, data: &Stored<'_>) -> Result<Option<usize>, ArchiveError> {
        let Some(same_size) = self
            .by_content
            .get(&(target.to_owned(), data.original_size()))
        else {
            return Ok(None);
        };
        for &o in same_size {
            let same = match (&self.kernels[o].data, data) {
                (Stored::Raw(a), Stored::Raw(b)) => same_bytes(a, b)?,
                (Stored::Frame { frame: a, .. }, Stored::Frame { frame: b, .. }) => a[..] == b[..],
                // Not compared: stored again.
                _ => false,
            };
            if same {
                return Ok(Some(o));
            }
        }
        Ok(None)
    }

    /// Store a new kernel: its ordinal.
    fn store(&mut self, key: &str, target: &str, data: Stored<'a>) -> Result<usize, ArchiveError> {
        let ordinal = self.kernels.len();
        if u32::try_from(ordinal).is_err() {
            return Err(ArchiveError::TooManyFrames {
                count: ordinal as u64,
                max: u32::MAX.into(),
            });
        }
        self.by_content
            .entry((target.to_owned(), data.original_size()))
            .or_default()
            .push(ordinal);
        self.kernels.push(Pending {
            key: key.to_owned(),
            target: target.to_owned(),
            data,
        });
        Ok(ordinal)
    }

    /// Write the archive to `path`: into a temporary file in the same
    /// directory, renamed over `path` only once complete
    /// ([`crate::output::write_atomically_as`]: nothing is left behind on
    /// error).
    pub fn write(&self, path: impl AsRef<Path>) -> crate::Result<WriteSummary> {
        let path = path.as_ref();
        crate::output::write_atomically_as(path, None, |file| {
            let mut out = BufWriter::with_capacity(1 << 20, file);
            let summary = self.write_to(&mut out).with_path(path)?;
            out.flush().with_path(path)?;
            Ok(summary)
        })
    }

    /// Write the archive to `out`, starting at its current position.
    pub fn write_to<W: Write + Seek>(&self, mut out: W) -> Result<WriteSummary, ArchiveError> {
        self.check_writable()?;
        let base = out.stream_position()?;
        // Header with a placeholder TOC offset, patched at the end.
        let mut header = [0u8; HEADER_SIZE as usize];
        header[0..4].copy_from_slice(MAGIC);
        bytes::put_u32(&mut header, 4, FORMAT_VERSION);
        out.write_all(&header)?;
        let layout = match self.scheme {
            Scheme::None => self.write_kernels(&mut out)?,
            Scheme::ZstdPerKernel => self.write_frames(&mut out)?,
        };
        let toc_offset = match &layout {
            Layout::Blobs(blobs) => blobs.last().map_or(HEADER_SIZE, |&(o, s)| o + s),
            Layout::Zstd { offset, size, .. } => offset + size,
        };
        let toc = msgpack::to_vec(&self.toc(layout));
        out.write_all(&toc)?;
        let end = toc_offset + toc.len() as u64;
        out.seek(SeekFrom::Start(base + 8))?;
        out.write_all(&toc_offset.to_le_bytes())?;
        out.seek(SeekFrom::Start(base + end))?;
        out.flush()?;
        let bytes_in: u64 = self.entries.iter().map(|e| e.size).sum();
        let stored: u64 = self.kernels.iter().map(|k| k.data.original_size()).sum();
        Ok(WriteSummary {
            kernels: self.entries.len(),
            bytes_in,
            bytes_out: end,
            shared: self.entries.len() - self.kernels.len(),
            bytes_saved: bytes_in - stored,
        })
    }

    /// The checks a `zstd-per-kernel` archive needs before anything is
    /// written: a valid level and not too many frames (what `write` would
    /// refuse before writing anything).
    pub fn check_writable(&self) -> Result<(), ArchiveError> {
        if self.scheme != Scheme::ZstdPerKernel {
            return Ok(());
        }
        check_level(self.level)?;
        let n = self.kernels.len() as u64;
        if n > MAX_FRAMES {
            return Err(ArchiveError::TooManyFrames {
                count: n,
                max: MAX_FRAMES,
            });
        }
        Ok(())
    }

    /// Scheme `none`: the kernels as they are, one after the other.
    fn write_kernels(&self, out: &mut impl Write) -> Result<Layout, ArchiveError> {
        let mut blobs = Vec::with_capacity(self.kernels.len());
        let mut pos = HEADER_SIZE;
        for k in &self.kernels {
            match &k.data {
                Stored::Raw(d) => d.for_each_chunk(|c| Ok(out.write_all(c)?))?,
                Stored::Frame { frame, .. } => {
                    let bytes = zstd::bulk::decompress(frame, k.data.original_size() as usize)
                        .map_err(|e| ArchiveError::Decompress {
                            key: k.key.clone(),
                            target: k.target.clone(),
                            reason: e.to_string(),
                        })?;
                    out.write_all(&bytes)?;
                }
            }
            let size = k.data.original_size();
            blobs.push((pos, size));
            pos += size;
        }
        Ok(Layout::Blobs(blobs))
    }

    /// Scheme `zstd-per-kernel`: `u32` frame count, then `u32` length and
    /// frame per kernel, compressed in parallel batch by batch.
    fn write_frames(&self, out: &mut impl Write) -> Result<Layout, ArchiveError> {
        // check_writable: at most MAX_FRAMES kernels, so the count fits.
        out.write_all(&(self.kernels.len() as u32).to_le_bytes())?;
        let mut zstd_size: u64 = 4;
        for batch in self.batches() {
            for (frame, k) in self.compress(batch).into_iter().zip(batch) {
                let frame = frame?;
                let len = u32::try_from(frame.len()).map_err(|_| ArchiveError::FrameTooLarge {
                    key: k.key.clone(),
                    target: k.target.clone(),
                    size: frame.len() as u64,
                    max: MAX_FRAME_SIZE,
                })?;
                // 64-bit: the blob (and the archive) may exceed 4 GiB.
                zstd_size += 4 + u64::from(len);
                out.write_all(&len.to_le_bytes())?;
                out.write_all(&frame)?;
            }
        }
        Ok(Layout::Zstd {
            offset: HEADER_SIZE,
            size: zstd_size,
            count: self.kernels.len() as u64,
        })
    }

    /// The frames of `batch`, compressed in parallel, in order. A kernel
    /// read from a file is read by the thread compressing it: a batch holds
    /// its frames, and only as many inputs as there are threads. With at
    /// most one kernel to compress (frames made ahead only, as from the
    /// Python API): on this thread, without waking the pool.
    fn compress<'b>(&self, batch: &'b [Pending<'a>]) -> Vec<Result<Cow<'b, [u8]>, ArchiveError>> {
        let raw = batch
            .iter()
            .filter(|k| matches!(k.data, Stored::Raw(_)))
            .count();
        if raw <= 1 {
            let mut c = self.compressor();
            return batch.iter().map(|k| self.frame_of(&mut c, k)).collect();
        }
        batch
            .par_iter()
            .map_init(|| self.compressor(), |c, k| self.frame_of(c, k))
            .collect()
    }

    /// The frame of one kernel: made ahead, or compressed with `c`.
    fn frame_of<'b>(
        &self,
        c: &mut std::io::Result<FrameCompressor>,
        k: &'b Pending<'a>,
    ) -> Result<Cow<'b, [u8]>, ArchiveError> {
        let data = match &k.data {
            Stored::Raw(d) => d,
            Stored::Frame { frame, .. } => return Ok(Cow::Borrowed(&frame[..])),
        };
        // A kernel compressed already with these parameters is the same
        // frame: copied.
        if let Some(frame) = data.frame_for(self.frame_params())? {
            return Ok(Cow::Owned(frame));
        }
        let c = c.as_mut().map_err(|e| compress_err(k, &e.to_string()))?;
        let data = data.load()?;
        c.compress(&data)
            .map(Cow::Owned)
            .map_err(|e| compress_err(k, &e.to_string()))
    }

    /// The archive as bytes in memory.
    pub fn to_vec(&self) -> Result<Vec<u8>, ArchiveError> {
        let mut cur = std::io::Cursor::new(Vec::with_capacity(self.size_hint()));
        self.write_to(&mut cur)?;
        Ok(cur.into_inner())
    }

    /// About the size of the archive when its kernels are frames made ahead
    /// or stored as they are (a compressed size is not known before).
    fn size_hint(&self) -> usize {
        let blob: usize = (self.kernels.iter())
            .map(|k| match &k.data {
                Stored::Frame { frame, .. } => frame.len() + 4,
                Stored::Raw(d) if self.scheme == Scheme::None => d.len(),
                Stored::Raw(d) => d.len() / 4,
            })
            .sum();
        HEADER_SIZE as usize + blob + 64 * self.entries.len() + 256
    }

    /// Consecutive runs of kernels of about `batch_bytes` input each.
    fn batches(&self) -> impl Iterator<Item = &[Pending<'a>]> + '_ {
        let mut rest = self.kernels.as_slice();
        std::iter::from_fn(move || {
            if rest.is_empty() {
                return None;
            }
            let mut bytes = 0usize;
            let mut n = 0;
            while n < rest.len() && (n == 0 || bytes + rest[n].data.work() <= self.batch_bytes) {
                bytes += rest[n].data.work();
                n += 1;
            }
            let (batch, tail) = rest.split_at(n);
            rest = tail;
            Some(batch)
        })
    }

    fn compressor(&self) -> std::io::Result<FrameCompressor> {
        FrameCompressor::new(self.frame_params())
    }

    /// What decides the bytes of this writer's frames.
    pub fn frame_params(&self) -> FrameParams {
        FrameParams {
            level: self.level,
            checksum: self.checksum,
        }
    }

    /// The frames this writer makes, for kernels compressed ahead of
    /// writing ([`KernelData::Frame`]): `None` when it stores kernels
    /// uncompressed, or when its level is invalid (which `write` reports).
    pub fn frames(&self) -> Option<FrameParams> {
        let valid = zstd::compression_level_range().contains(&self.level);
        (self.scheme == Scheme::ZstdPerKernel && valid).then(|| self.frame_params())
    }

    /// The TOC of these kernels stored as `layout` says.
    fn toc(&self, layout: Layout) -> TocOut<'_> {
        let keys = self
            .keys
            .iter()
            .map(|(key, indices)| {
                let entries = indices
                    .iter()
                    .map(|&i| {
                        let e = &self.entries[i];
                        EntryOut {
                            target: &e.target,
                            ordinal: e.ordinal,
                            original_size: e.size,
                            metadata: e.metadata.as_ref(),
                        }
                    })
                    .collect();
                (key.as_str(), entries)
            })
            .collect();
        TocOut {
            group_name: &self.group_name,
            gfx_arch_family: &self.gfx_arch_family,
            gfx_arches: &self.gfx_arches,
            scheme: self.scheme,
            keys,
            layout,
        }
    }
}

/// The compressor of every frame: `level`, the content size recorded, a
/// checksum or not, no dictionary ID.
fn check_level(level: i32) -> Result<(), ArchiveError> {
    let range = zstd::compression_level_range();
    if !range.contains(&level) {
        return Err(ArchiveError::InvalidZstdLevel {
            level,
            min: *range.start(),
            max: *range.end(),
        });
    }
    Ok(())
}

fn compress_err(k: &Pending<'_>, reason: &str) -> ArchiveError {
    ArchiveError::Compress {
        key: k.key.clone(),
        target: k.target.clone(),
        reason: reason.to_owned(),
    }
}

/// A TOC key is `<path>#<N>` with N decimal.
fn check_key(key: &str) -> Result<(), ArchiveError> {
    let bad = |reason| {
        Err(ArchiveError::InvalidKey {
            key: key.to_owned(),
            reason,
        })
    };
    match key.rsplit_once('#') {
        None => bad("no `#N` suffix"),
        Some(("", _)) => bad("empty binary path"),
        Some((_, n)) if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) => {
            bad("the `#N` suffix is not a decimal number")
        }
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::test_support::*;
    use crate::archive::Archive;
    use crate::msgpack::Value;

    fn writer_for<'a>(
        family: &str,
        arches: &[&str],
        kernels: &'a [(&str, &str, Vec<u8>)],
    ) -> ArchiveWriter<'a> {
        let mut w = ArchiveWriter::new(
            "test",
            family,
            arches.iter().map(|s| s.to_string()).collect(),
        );
        for (i, (k, t, b)) in kernels.iter().enumerate() {
            assert_eq!(w.add(*k, *t, b.as_slice(), None).unwrap(), i as u32);
        }
        w
    }

    #[test]
    fn hrx_limits_of_what_was_added() {
        let mut w = ArchiveWriter::new("g", "gfx942", vec!["gfx942".into()]);
        w.add("lib/a.so#0", "gfx942", &b"code"[..], None).unwrap();
        assert_eq!(w.hrx_limits(), []);
        // A 1,100-byte key, added for two targets: reported once, with
        // the target of five features (once too).
        let long = format!("{}#0", "d/".repeat(549));
        let five = "gfx942:a+:b+:c+:d+:e+";
        w.add(long.as_str(), "gfx942", &b"code"[..], None).unwrap();
        w.add(long.as_str(), five, &b"code"[..], None).unwrap();
        w.add("lib/b.so#0", five, &b"code"[..], None).unwrap();
        let v = w.hrx_limits();
        let units: Vec<_> = v.iter().map(|e| (e.unit, e.value)).collect();
        assert_eq!(
            units,
            [("bytes (with its NUL)", 1101), ("features", 5)],
            "{v:?}"
        );
        // The archive is written all the same, and reads back.
        let bytes = w.to_vec().unwrap();
        let a = Archive::from_bytes(bytes).unwrap();
        assert_eq!(kpack_format::hrx::check_archive(&a), v);
    }

    #[test]
    fn noop_is_byte_identical_to_reference() {
        let kernels = noop_kernels();
        let w = writer_for("gfx900X", &["gfx900", "gfx906"], &kernels).scheme(Scheme::None);
        let reference = std::fs::read(fixture("test_noop.kpack")).unwrap();
        assert_eq!(w.to_vec().unwrap(), reference);

        // And through a file.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.kpack");
        let s = w.write(&p).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), reference);
        assert_eq!(
            s,
            WriteSummary {
                kernels: 3,
                bytes_in: 119 + 219 + 168,
                bytes_out: 903,
                shared: 0,
                bytes_saved: 0,
            }
        );
        // Only the archive is left in the directory.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    /// Kernels and frames shared with their owner ([`SharedBytes`]) make
    /// the archive that copies of them make, in both schemes.
    #[test]
    fn shared_bytes_make_the_same_archive() {
        let kernels = noop_kernels();
        let arches = vec!["gfx900".to_string(), "gfx906".to_string()];
        let shared = |scheme: Scheme| {
            let mut w = ArchiveWriter::new("test", "gfx900X", arches.clone()).scheme(scheme);
            for (k, t, b) in &kernels {
                w.add(*k, *t, SharedBytes::new(b.clone()), None).unwrap();
            }
            w.to_vec().unwrap()
        };
        let none = writer_for("gfx900X", &["gfx900", "gfx906"], &kernels).scheme(Scheme::None);
        assert_eq!(shared(Scheme::None), none.to_vec().unwrap());
        let zstd = writer_for("gfx900X", &["gfx900", "gfx906"], &kernels);
        assert_eq!(shared(Scheme::ZstdPerKernel), zstd.to_vec().unwrap());
        let mut frames = ArchiveWriter::new("test", "gfx900X", arches.clone());
        for (k, t, b) in &kernels {
            let f = SharedBytes::new(zstd_frame(b, DEFAULT_ZSTD_LEVEL).unwrap());
            frames.add_frame(*k, *t, f, b.len() as u64, None).unwrap();
        }
        assert_eq!(frames.to_vec().unwrap(), zstd.to_vec().unwrap());
    }

    #[test]
    fn zstd_without_checksum_is_byte_identical_to_reference() {
        let kernels = zstd_kernels();
        let w = writer_for("gfx110X", &["gfx1100", "gfx1101"], &kernels).content_checksum(false);
        let reference = std::fs::read(fixture("test_zstd.kpack")).unwrap();
        assert_eq!(w.to_vec().unwrap(), reference);
    }

    #[test]
    fn zstd_with_checksum_reads_back() {
        let kernels = zstd_kernels();
        let w = writer_for("gfx110X", &["gfx1100", "gfx1101"], &kernels);
        let bytes = w.to_vec().unwrap();
        // Each frame's descriptor has the checksum flag (bit 2) set.
        let a = Archive::from_bytes(bytes.clone()).unwrap();
        assert_eq!(a.scheme(), Scheme::ZstdPerKernel);
        let mut pos = 68usize;
        for _ in 0..3 {
            let len = bytes::u32_at(&bytes, pos as u64).unwrap() as usize;
            assert_eq!(&bytes[pos + 4..pos + 8], &[0x28, 0xb5, 0x2f, 0xfd]);
            assert_ne!(bytes[pos + 8] & 0x04, 0, "checksum flag");
            pos += 4 + len;
        }
        let reference = kpack_loader::open_archive(fixture("test_zstd.kpack")).unwrap();
        assert_eq!(a.entries(), reference.entries());
        assert_eq!(a.gfx_arches(), reference.gfx_arches());
        for (k, t, b) in &kernels {
            assert_eq!(&a.kernel(k, t).unwrap(), b);
        }
    }

    fn big_kernels() -> Vec<(String, String, Vec<u8>)> {
        let mut x: u32 = 12345;
        (0..24)
            .map(|i| {
                let len = 1000 + i * 3777;
                let data = (0..len)
                    .map(|j| {
                        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                        if j % 7 == 0 {
                            (x >> 24) as u8
                        } else {
                            (j % 13) as u8
                        }
                    })
                    .collect();
                (
                    format!("lib/lib{}.so#{}", i % 5, i / 5),
                    format!("gfx90{}", i % 3),
                    data,
                )
            })
            .collect()
    }

    #[test]
    fn output_independent_of_threads_and_batches() {
        let kernels = big_kernels();
        let build = |batch: usize| {
            let mut w = ArchiveWriter::new("g", "gfx90X", vec!["gfx900".into()]).batch_bytes(batch);
            for (k, t, b) in &kernels {
                w.add(k.as_str(), t.as_str(), b.as_slice(), None).unwrap();
            }
            w
        };
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let four = rayon::ThreadPoolBuilder::new()
            .num_threads(4)
            .build()
            .unwrap();
        let a = one.install(|| build(usize::MAX).to_vec().unwrap());
        let b = four.install(|| build(10_000).to_vec().unwrap());
        let c = four.install(|| build(1).to_vec().unwrap());
        assert_eq!(a, b);
        assert_eq!(a, c);
        let ar = Archive::from_bytes(a).unwrap();
        assert_eq!(ar.kernel_count(), kernels.len());
        for (i, (k, t, bytes)) in kernels.iter().enumerate() {
            assert_eq!(ar.entry(k, t).unwrap().ordinal, i as u32);
            assert_eq!(&ar.kernel(k, t).unwrap(), bytes);
        }
    }

    #[test]
    fn metadata_and_first_insertion_order() {
        let mut w = ArchiveWriter::new("torch", "gfx90a:xnack-", vec!["gfx90a:xnack-".into()])
            .scheme(Scheme::None);
        let md = vec![
            (
                "target".to_string(),
                Value::from("hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-"),
            ),
            ("source_prefix".to_string(), Value::from("torch")),
        ];
        w.add("z/b.so#0", "gfx90a:xnack-", &b"one"[..], Some(md.clone()))
            .unwrap();
        w.add("a/a.so#1", "gfx90a:xnack-", &b"two"[..], None)
            .unwrap();
        w.add("z/b.so#1", "gfx90a:xnack-", vec![3u8; 5], None)
            .unwrap();
        let bytes = w.to_vec().unwrap();
        let a = Archive::from_bytes(bytes.clone()).unwrap();
        let keys: Vec<_> = a.entries().iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, ["z/b.so#0", "a/a.so#1", "z/b.so#1"]);
        assert_eq!(
            a.binaries().collect::<Vec<_>>(),
            ["a/a.so#1", "z/b.so#0", "z/b.so#1"]
        );
        let e = a.entry("z/b.so#0", "gfx90a:xnack-").unwrap();
        assert_eq!(e.metadata.as_ref(), Some(&md));
        assert_eq!(e.metadata_str("source_prefix"), Some("torch"));
        assert_eq!(a.kernel("z/b.so#1", "gfx90a:xnack-").unwrap(), vec![3u8; 5]);
        // TOC key order: the entry map is type, ordinal, original_size, metadata.
        let toc_offset = bytes::u64_at(&bytes, 8).unwrap() as usize;
        let toc = msgpack::decode(&bytes[toc_offset..]).unwrap();
        let names: Vec<_> = toc
            .as_map()
            .unwrap()
            .iter()
            .map(|(k, _)| k.as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "format_version",
                "group_name",
                "gfx_arch_family",
                "gfx_arches",
                "toc",
                "compression_scheme",
                "blobs"
            ]
        );
        let entry = ["toc", "z/b.so#0", "gfx90a:xnack-"]
            .iter()
            .fold(&toc, |v, k| msgpack::get(v, k).unwrap());
        let names: Vec<_> = entry
            .as_map()
            .unwrap()
            .iter()
            .map(|(k, _)| k.as_str().unwrap())
            .collect();
        assert_eq!(names, ["type", "ordinal", "original_size", "metadata"]);
    }

    /// The same code object (same target, same bytes) under several keys is
    /// stored once, its entries sharing the ordinal; the same bytes for
    /// another target are a kernel of their own. The result reads back
    /// entry by entry, keeps the limits of formats.md §3.5 (ordinals below the frame
    /// count, `original_size` exact), and does not depend on the threads.
    #[test]
    fn identical_code_objects_share_an_ordinal() {
        let a = vec![1u8; 3000];
        let b: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
        let build = |scheme| {
            let mut w = ArchiveWriter::new("g", "gfx900", vec!["gfx900".into(), "gfx906".into()])
                .scheme(scheme);
            let added = [
                w.add("lib/a.so#0", "gfx900", a.as_slice(), None).unwrap(),
                w.add("lib/b.so#0", "gfx900", b.as_slice(), None).unwrap(),
                w.add("bin/t1#0", "gfx900", a.clone(), None).unwrap(),
                w.add("bin/t2#3", "gfx900", a.as_slice(), None).unwrap(),
                w.add("lib/a.so#0", "gfx906", a.as_slice(), None).unwrap(),
                w.add("bin/t1#1", "gfx900", b.as_slice(), None).unwrap(),
            ];
            assert_eq!(added, [0, 1, 0, 0, 2, 1]);
            assert_eq!(w.len(), 6);
            w
        };
        for scheme in [Scheme::None, Scheme::ZstdPerKernel] {
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("s.kpack");
            let s = build(scheme).write(&p).unwrap();
            assert_eq!((s.kernels, s.shared, s.bytes_saved), (6, 3, 9000));
            assert_eq!(s.bytes_in, 18000);
            let ar = kpack_loader::open_archive(&p).unwrap();
            assert_eq!(ar.kernel_count(), 6);
            for (key, target, want) in [
                ("lib/a.so#0", "gfx900", &a),
                ("lib/b.so#0", "gfx900", &b),
                ("bin/t1#0", "gfx900", &a),
                ("bin/t2#3", "gfx900", &a),
                ("lib/a.so#0", "gfx906", &a),
                ("bin/t1#1", "gfx900", &b),
            ] {
                let e = ar.entry(key, target).unwrap();
                assert_eq!(e.original_size, want.len() as u64);
                assert_eq!(&ar.kernel(key, target).unwrap(), want, "{key} {target}");
            }
            // Three kernels stored: the blob has three frames or blobs.
            let bytes = std::fs::read(&p).unwrap();
            let toc_offset = bytes::u64_at(&bytes, 8).unwrap() as usize;
            let toc = msgpack::decode(&bytes[toc_offset..]).unwrap();
            match scheme {
                Scheme::None => assert_eq!(
                    msgpack::get(&toc, "blobs")
                        .unwrap()
                        .as_array()
                        .unwrap()
                        .len(),
                    3
                ),
                Scheme::ZstdPerKernel => assert_eq!(bytes::u32_at(&bytes, 64), Some(3)),
            }
            let one = rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .build()
                .unwrap();
            let again = one.install(|| build(scheme).to_vec().unwrap());
            assert_eq!(again, bytes);
        }
    }

    /// Kernels given as ranges of a file make the same archive, byte for
    /// byte, as the same kernels in memory (shared code objects included,
    /// a range compared with bytes and with another range), for both
    /// schemes; a range that cannot be read fails the add or the write,
    /// naming the file.
    #[test]
    fn file_ranges_write_what_bytes_write() {
        let kernels = big_kernels();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("input.bin");
        let mut file = Vec::new();
        let mut ranges = Vec::new();
        for (_, _, b) in &kernels {
            ranges.push((file.len() as u64, b.len()));
            file.extend_from_slice(b);
        }
        std::fs::write(&path, &file).unwrap();
        let input: std::sync::Arc<Path> = path.as_path().into();
        let range = |i: usize| FileRange {
            path: input.clone(),
            offset: ranges[i].0,
            len: ranges[i].1,
        };
        for scheme in [Scheme::None, Scheme::ZstdPerKernel] {
            let build = |from_file: bool| {
                let mut w = ArchiveWriter::new("g", "gfx90X", vec!["gfx900".into()])
                    .scheme(scheme)
                    .batch_bytes(20_000);
                for (i, (k, t, b)) in kernels.iter().enumerate() {
                    let data: KernelData = if from_file {
                        range(i).into()
                    } else {
                        b.as_slice().into()
                    };
                    w.add(k.as_str(), t.as_str(), data, None).unwrap();
                }
                // Shared with kernel 3: once as bytes, once as its range.
                let (_, t, b) = &kernels[3];
                assert_eq!(w.add("dup/a#0", t.as_str(), b.as_slice(), None).unwrap(), 3);
                assert_eq!(w.add("dup/b#0", t.as_str(), range(3), None).unwrap(), 3);
                w.to_vec().unwrap()
            };
            assert_eq!(build(true), build(false));
        }
        // Past the end of the file: the comparison or the write names it.
        let past = FileRange {
            path: input.clone(),
            offset: file.len() as u64 - 10,
            len: 20,
        };
        let mut w = ArchiveWriter::new("g", "gfx900", vec!["gfx900".into()]);
        w.add("a#0", "gfx900", past.clone(), None).unwrap();
        let e = w.add("b#0", "gfx900", vec![0u8; 20], None).unwrap_err();
        assert!(e.to_string().contains("input.bin"), "{e}");
        assert_eq!(w.len(), 1, "a failed add adds nothing");
        let e = w.to_vec().unwrap_err();
        assert!(matches!(e, ArchiveError::ReadInput { .. }), "{e}");
        assert!(e.to_string().contains("input.bin"), "{e}");
    }

    /// Kernels compressed ahead of time with `zstd_frame` make the archive
    /// that the same kernels given as bytes make, shared code objects
    /// included, at any level; with scheme `none` the frames are written
    /// decompressed. Free-form keys only when asked for.
    #[test]
    fn frames_write_what_bytes_write() {
        let mut kernels = big_kernels();
        let dup = kernels[2].clone();
        kernels.push(("dup/x.so#0".into(), dup.1, dup.2));
        for scheme in [Scheme::ZstdPerKernel, Scheme::None] {
            for level in [1, 3, 19] {
                let mut a = ArchiveWriter::new("g", "gfx90X", vec!["gfx900".into()])
                    .scheme(scheme)
                    .zstd_level(level);
                let mut b = ArchiveWriter::new("g", "gfx90X", vec!["gfx900".into()])
                    .scheme(scheme)
                    .zstd_level(level);
                for (k, t, bytes) in &kernels {
                    let oa = a
                        .add(k.as_str(), t.as_str(), bytes.as_slice(), None)
                        .unwrap();
                    let frame = zstd_frame(bytes, level).unwrap();
                    let ob = b
                        .add_frame(k.as_str(), t.as_str(), frame, bytes.len() as u64, None)
                        .unwrap();
                    assert_eq!(oa, ob);
                }
                let (x, y) = (a.to_vec().unwrap(), b.to_vec().unwrap());
                assert_eq!(x, y, "{scheme} level {level}");
                let ar = Archive::from_bytes(y).unwrap();
                assert_eq!(ar.entry("dup/x.so#0", &kernels[2].1).unwrap().ordinal, 2);
            }
        }
        assert!(matches!(
            zstd_frame(b"x", 1000),
            Err(ArchiveError::InvalidZstdLevel { .. })
        ));
        let mut w = ArchiveWriter::new("g", "f", vec![]);
        assert!(w.add("bin/hipcc", "gfx900", &b"x"[..], None).is_err());
        let mut w = w.free_form_keys(true);
        w.add("bin/hipcc", "gfx900", &b"x"[..], None).unwrap();
        let a = Archive::from_bytes(w.to_vec().unwrap()).unwrap();
        assert_eq!(a.kernel("bin/hipcc", "gfx900").unwrap(), b"x");
    }

    #[test]
    fn empty_archives() {
        for scheme in [Scheme::None, Scheme::ZstdPerKernel] {
            let w = ArchiveWriter::new("g", "f", vec![]).scheme(scheme);
            let a = Archive::from_bytes(w.to_vec().unwrap()).unwrap();
            assert_eq!(a.kernel_count(), 0);
            assert_eq!(a.scheme(), scheme);
            assert_eq!(a.binaries().count(), 0);
        }
    }

    #[test]
    fn add_rejects_duplicates_and_bad_keys() {
        let mut w = ArchiveWriter::new("g", "f", vec![]);
        w.add("a#0", "gfx900", &b"x"[..], None).unwrap();
        assert!(matches!(
            w.add("a#0", "gfx900", &b"y"[..], None),
            Err(ArchiveError::DuplicateKernel { ref key, ref target }) if key == "a#0" && target == "gfx900"
        ));
        w.add("a#0", "gfx906", &b"y"[..], None).unwrap();
        for bad in ["a", "a#", "#0", "a#x1", "a#-1"] {
            assert!(
                matches!(
                    w.add(bad, "gfx900", &b"z"[..], None),
                    Err(ArchiveError::InvalidKey { .. })
                ),
                "{bad}"
            );
        }
        assert_eq!(w.len(), 2);
    }

    #[test]
    fn invalid_level() {
        let mut w = ArchiveWriter::new("g", "f", vec![]).zstd_level(1000);
        w.add("a#0", "t", &b"x"[..], None).unwrap();
        assert!(matches!(
            w.to_vec(),
            Err(ArchiveError::InvalidZstdLevel { level: 1000, .. })
        ));
        // Failed writes leave nothing behind.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.kpack");
        let err = w.write(&p).unwrap_err();
        assert!(matches!(
            err,
            crate::Error::Archive {
                source: ArchiveError::InvalidZstdLevel { .. },
                ..
            }
        ));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[cfg(unix)]
    #[test]
    fn written_file_mode_is_not_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.kpack");
        ArchiveWriter::new("g", "f", vec![]).write(&p).unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode();
        // 0666 less the umask: at least the owner can read and write; group or
        // other bits are whatever the umask allows (not forced to 0600).
        assert_eq!(mode & 0o600, 0o600);
    }

    #[test]
    fn corrupt_checksummed_frames() {
        // Our own archive: frames carry a checksum.
        let kernels = zstd_kernels();
        let mut w = ArchiveWriter::new("test", "gfx110X", vec![]);
        for (k, t, b) in &kernels {
            w.add(*k, *t, b.as_slice(), None).unwrap();
        }
        let good = w.to_vec().unwrap();
        let len0 = bytes::u32_at(&good, 68).unwrap() as usize;
        // Damage the last byte of frame 0 (its checksum) and a byte in its body.
        for pos in [72 + len0 - 1, 72 + len0 / 2] {
            let mut b = good.clone();
            b[pos] ^= 0x55;
            let a = Archive::from_bytes(b).unwrap();
            let e = a.kernel("lib/libhip.so#0", "gfx1100").unwrap_err();
            assert!(matches!(e, ArchiveError::Decompress { .. }), "{pos}: {e}");
            // The other kernels still read.
            assert_eq!(a.kernel("bin/hiptest#0", "gfx1100").unwrap(), kernels[2].2);
        }
    }
}
