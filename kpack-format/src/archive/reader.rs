//! Reading `.kpack` archives.
//!
//! [`Archive::from_source`] checks the header and decodes the TOC once into
//! plain structures, validating every offset and size against the file.
//! Everything else is built when first needed, as far as a read needs it:
//! the index of keys (on the first lookup), the ordinal order (when
//! listed), and for `zstd-per-kernel` the frame index, which walks the
//! `u32` length prefixes of the frames only up to the frame being read (the
//! format gives no other way to find frame *i*: formats.md §3.2). Reading a
//! kernel then touches only that kernel's bytes and the prefixes before it.

use std::borrow::Cow;
use std::cell::RefCell;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use super::toc::{self, Layout};
use super::{
    ArchiveError, Entry, KernelInfo, Scheme, FORMAT_VERSION, HEADER_SIZE, MAGIC, MAX_KERNEL_SIZE,
};
use crate::bytes;
use crate::msgpack;

/// Where an archive's bytes live: an owned buffer here, a memory map of
/// the file in the loader (which reads the frame index's scattered `u32`s
/// through the file instead of faulting in the pages around each).
pub trait ArchiveBytes: Send + Sync {
    /// The whole archive.
    fn bytes(&self) -> &[u8];

    /// The little-endian `u32` at `pos`, or `None` past the end.
    fn u32_at(&self, pos: u64) -> Option<u32> {
        bytes::u32_at(self.bytes(), pos)
    }
}

impl ArchiveBytes for Box<[u8]> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

struct Storage(Box<dyn ArchiveBytes>);

impl Deref for Storage {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.0.bytes()
    }
}

impl Storage {
    fn u32_at(&self, pos: u64) -> Option<u32> {
        self.0.u32_at(pos)
    }
}

/// An open `.kpack` archive. `Send + Sync`: kernels may be read from several
/// threads at once.
pub struct Archive {
    data: Storage,
    group_name: String,
    gfx_arch_family: String,
    gfx_arches: Vec<String>,
    scheme: Scheme,
    /// In TOC order: keys in file order, targets in file order within a key.
    entries: Vec<Entry>,
    /// `(hash of the key, index into entries)`, sorted (so file order
    /// within a key); built on the first lookup. Hashes, not the keys:
    /// sorting 777 keys that share a long prefix took 100 µs of a cold
    /// load.
    by_key: OnceLock<Vec<(u64, u32)>>,
    /// Indices into `entries` of the first entry of each key, sorted by
    /// key; built when the keys are first listed.
    sorted_keys: OnceLock<Vec<u32>>,
    /// Indices into `entries`, sorted by ordinal (stable); built when first
    /// listed.
    by_ordinal: OnceLock<Vec<u32>>,
    layout: Layout,
    /// `zstd-per-kernel`: the frames located so far.
    frames: FrameIndex,
}

/// The frames of a `zstd-per-kernel` blob located so far: a walk of the
/// length prefixes from the start of the blob, taken only as far as a read
/// needed, and resumed by the next read that needs more. A frame located
/// once is found again without a lock, so readers of known frames on
/// several threads never wait for each other.
#[derive(Debug, Default)]
struct FrameIndex {
    /// `(offset, len)` of each frame; those below `known` are set.
    /// Allocated on the first read, one slot per frame the blob can hold.
    slots: OnceLock<Box<[(AtomicU64, AtomicU64)]>>,
    /// How many frames are located (published after their slots).
    known: AtomicUsize,
    /// The walk, one thread at a time.
    walk: Mutex<Walk>,
}

#[derive(Debug, Default)]
struct Walk {
    /// Where the next frame's length prefix is (0: not started).
    next: u64,
    /// Why the walk cannot go past `known`, once it has failed.
    error: Option<ArchiveError>,
}

impl std::fmt::Debug for Archive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Archive")
            .field("len", &self.data.len())
            .field("group_name", &self.group_name)
            .field("gfx_arch_family", &self.gfx_arch_family)
            .field("gfx_arches", &self.gfx_arches)
            .field("scheme", &self.scheme)
            .field("kernels", &self.entries.len())
            .finish()
    }
}

impl Archive {
    /// Validate an archive held in memory.
    pub fn from_bytes(bytes: impl Into<Box<[u8]>>) -> Result<Archive, ArchiveError> {
        Archive::from_source(bytes.into())
    }

    /// Validate an archive whose bytes `data` holds (the loader passes a
    /// memory map of the file).
    pub fn from_source(data: impl ArchiveBytes + 'static) -> Result<Archive, ArchiveError> {
        let data = Storage(Box::new(data));
        let toc_offset = parse_header(&data)?;
        let toc_bytes = data.get(toc_offset as usize..).unwrap_or_default();
        let toc = msgpack::decode(toc_bytes)
            .map_err(|source| ArchiveError::TocParse { toc_offset, source })?;
        let parsed = toc::parse(&toc, &data, toc_offset)?;
        // Indices into the entries are u32 (at most MAX_FRAMES code objects
        // are readable, but a TOC could list more entries).
        if u32::try_from(parsed.entries.len()).is_err() {
            return Err(ArchiveError::TooManyFrames {
                count: parsed.entries.len() as u64,
                max: u64::from(u32::MAX),
            });
        }
        Ok(Archive {
            data,
            group_name: parsed.group_name,
            gfx_arch_family: parsed.gfx_arch_family,
            gfx_arches: parsed.gfx_arches,
            scheme: parsed.scheme,
            entries: parsed.entries,
            by_key: OnceLock::new(),
            sorted_keys: OnceLock::new(),
            by_ordinal: OnceLock::new(),
            layout: parsed.layout,
            frames: FrameIndex::default(),
        })
    }

    /// The index entries whose key hashes as `key`'s: those of `key` (in
    /// file order), and of any key whose hash collides with it.
    fn key_slots(&self, key: &str) -> &[(u64, u32)] {
        let index = self.by_key.get_or_init(|| {
            let mut v: Vec<(u64, u32)> = (self.entries.iter())
                .zip(0u32..)
                .map(|(e, i)| (key_hash(&e.key), i))
                .collect();
            v.sort_unstable();
            v
        });
        let h = key_hash(key);
        let start = index.partition_point(|&(x, _)| x < h);
        let end = index.partition_point(|&(x, _)| x <= h);
        &index[start..end]
    }

    /// The archive format version (the header's; always
    /// [`FORMAT_VERSION`] for an archive that opened).
    pub fn format_version(&self) -> u32 {
        FORMAT_VERSION
    }

    /// The TOC's `group_name`.
    pub fn group_name(&self) -> &str {
        &self.group_name
    }

    /// The TOC's `gfx_arch_family`.
    pub fn gfx_arch_family(&self) -> &str {
        &self.gfx_arch_family
    }

    /// The TOC's `gfx_arches`, in file order.
    pub fn gfx_arches(&self) -> &[String] {
        &self.gfx_arches
    }

    /// The compression scheme.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// Number of kernels (TOC entries).
    pub fn kernel_count(&self) -> usize {
        self.entries.len()
    }

    /// The binary keys (with `#N`), sorted bytewise.
    pub fn binaries(&self) -> impl Iterator<Item = &str> + '_ {
        let sorted = self.sorted_keys.get_or_init(|| {
            let mut v: Vec<u32> = (0..self.entries.len() as u32).collect();
            v.sort_by(|&a, &b| {
                self.entries[a as usize]
                    .key
                    .cmp(&self.entries[b as usize].key)
            });
            v.dedup_by(|a, b| self.entries[*a as usize].key == self.entries[*b as usize].key);
            v
        });
        sorted
            .iter()
            .map(|&i| self.entries[i as usize].key.as_str())
    }

    /// The targets of binary `key`, in file order (none for an unknown key).
    pub fn targets_of<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.key_slots(key)
            .iter()
            .map(|&(_, i)| &self.entries[i as usize])
            .filter(move |e| e.key == key)
            .map(|e| e.target.as_str())
    }

    /// The entry of `key` @ `target`.
    pub fn entry(&self, key: &str, target: &str) -> Option<&Entry> {
        self.key_slots(key)
            .iter()
            .map(|&(_, i)| &self.entries[i as usize])
            .find(|e| e.key == key && e.target == target)
    }

    /// All entries in TOC order (keys in file order, then targets).
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// All entries in ordinal order (the order they were added), as
    /// `(key, target, entry)`.
    pub fn entries_by_ordinal(&self) -> impl Iterator<Item = (&str, &str, &Entry)> + '_ {
        let sorted = self.by_ordinal.get_or_init(|| {
            let mut v: Vec<u32> = (0..self.entries.len() as u32).collect();
            v.sort_by_key(|&i| self.entries[i as usize].ordinal);
            v
        });
        sorted.iter().map(|&i| {
            let e = &self.entries[i as usize];
            (e.key.as_str(), e.target.as_str(), e)
        })
    }

    /// Every `(key, target)` in TOC order (keys in file order, then their
    /// targets in file order).
    pub fn keys_and_targets(&self) -> impl Iterator<Item = (&str, &str)> + '_ {
        self.entries
            .iter()
            .map(|e| (e.key.as_str(), e.target.as_str()))
    }

    /// The kernel `key` @ `target`, decompressed.
    pub fn kernel(&self, key: &str, target: &str) -> Result<Vec<u8>, ArchiveError> {
        let entry = self
            .entry(key, target)
            .ok_or_else(|| ArchiveError::KernelNotFound {
                key: key.to_owned(),
                target: target.to_owned(),
            })?;
        self.read(entry).map(Cow::into_owned)
    }

    /// The kernel of `entry` (an entry of this archive): borrowed from the
    /// file for scheme `none`, decompressed for `zstd-per-kernel`. Its size is
    /// checked against `original_size`.
    pub fn read(&self, entry: &Entry) -> Result<Cow<'_, [u8]>, ArchiveError> {
        let mismatch = |actual: u64| ArchiveError::SizeMismatch {
            key: entry.key.clone(),
            target: entry.target.clone(),
            expected: entry.original_size,
            actual,
        };
        let ordinal = u64::from(entry.ordinal);
        let out_of_range = |count: u64| ArchiveError::OrdinalOutOfRange {
            key: entry.key.clone(),
            target: entry.target.clone(),
            ordinal,
            count,
        };
        if entry.original_size > MAX_KERNEL_SIZE {
            return Err(ArchiveError::KernelTooLarge {
                key: entry.key.clone(),
                target: entry.target.clone(),
                size: entry.original_size,
                max: MAX_KERNEL_SIZE,
            });
        }
        match &self.layout {
            Layout::Blobs(blobs) => {
                let &(offset, size) = blobs
                    .get(entry.ordinal as usize)
                    .ok_or_else(|| out_of_range(blobs.len() as u64))?;
                if size != entry.original_size {
                    return Err(mismatch(size));
                }
                Ok(Cow::Borrowed(self.slice(offset, size)))
            }
            Layout::Zstd { .. } => {
                let frame = self.zstd_frame(entry)?;
                // original_size <= MAX_KERNEL_SIZE, so this is a bounded,
                // TOC-declared allocation; decompression fails if the frame
                // would write more.
                let cap = usize::try_from(entry.original_size)
                    .map_err(|_| decompress_err(entry, "kernel does not fit in memory".into()))?;
                let mut buf = Vec::with_capacity(cap);
                decompress_into(frame, &mut buf)
                    .map_err(|e| decompress_err(entry, e.to_string()))?;
                if buf.len() as u64 != entry.original_size {
                    return Err(mismatch(buf.len() as u64));
                }
                Ok(Cow::Owned(buf))
            }
        }
    }

    /// Where the kernel of `entry` (an entry of this archive) lies in the
    /// file when the archive stores it as it is (scheme `none`): `(offset,
    /// size)`, checked as [`Archive::read`] checks it. `None` for a
    /// compressed one. A reader that maps the file itself can hand these
    /// bytes out without a copy.
    pub fn stored_range(&self, entry: &Entry) -> Result<Option<(u64, u64)>, ArchiveError> {
        match &self.layout {
            Layout::Blobs(blobs) => {
                self.read(entry)?;
                Ok(blobs.get(entry.ordinal as usize).copied())
            }
            Layout::Zstd { .. } => Ok(None),
        }
    }

    /// Check, without decompressing, that the kernel of `entry` (an entry of
    /// this archive) can be read at its `original_size`: the size limit, the
    /// blob's size (scheme `none`), or the frame's bounds and header
    /// (`zstd-per-kernel`: the content size the frame records, or else the
    /// most the frame's bytes can decompress to). A caller that allocates
    /// `original_size` bytes before [`Archive::read_into`] calls this first,
    /// so that a corrupt TOC cannot make it allocate what the file cannot
    /// hold.
    pub fn check(&self, entry: &Entry) -> Result<(), ArchiveError> {
        match &self.layout {
            Layout::Blobs(_) => self.read(entry).map(drop),
            Layout::Zstd { .. } => self.zstd_frame(entry).map(drop),
        }
    }

    /// Read the kernel of `entry` (an entry of this archive) into `dst`,
    /// which must be exactly `original_size` bytes long. Same checks as
    /// [`Archive::read`]; a `zstd-per-kernel` kernel is decompressed
    /// straight into `dst`, so a caller that owns a differently allocated
    /// buffer (e.g. the C API's `malloc`ed one) needs no extra copy. On
    /// error the contents of `dst` are unspecified.
    pub fn read_into(&self, entry: &Entry, dst: &mut [u8]) -> Result<(), ArchiveError> {
        if dst.len() as u64 != entry.original_size {
            return Err(ArchiveError::SizeMismatch {
                key: entry.key.clone(),
                target: entry.target.clone(),
                expected: entry.original_size,
                actual: dst.len() as u64,
            });
        }
        match &self.layout {
            Layout::Blobs(_) => {
                let src = self.read(entry)?;
                dst.copy_from_slice(&src);
                Ok(())
            }
            Layout::Zstd { .. } => {
                let frame = self.zstd_frame(entry)?;
                let n = decompress_into(frame, dst)
                    .map_err(|e| decompress_err(entry, e.to_string()))?;
                if n as u64 != entry.original_size {
                    return Err(ArchiveError::SizeMismatch {
                        key: entry.key.clone(),
                        target: entry.target.clone(),
                        expected: entry.original_size,
                        actual: n as u64,
                    });
                }
                Ok(())
            }
        }
    }

    /// The zstd frame of `entry` (scheme `zstd-per-kernel`), after checking
    /// its ordinal, its size limit and the content size in its header.
    fn zstd_frame(&self, entry: &Entry) -> Result<&[u8], ArchiveError> {
        let Layout::Zstd { count, .. } = self.layout else {
            return Err(decompress_err(entry, "archive has no zstd blob".into()));
        };
        if entry.original_size > MAX_KERNEL_SIZE {
            return Err(ArchiveError::KernelTooLarge {
                key: entry.key.clone(),
                target: entry.target.clone(),
                size: entry.original_size,
                max: MAX_KERNEL_SIZE,
            });
        }
        if u64::from(entry.ordinal) >= count {
            return Err(ArchiveError::OrdinalOutOfRange {
                key: entry.key.clone(),
                target: entry.target.clone(),
                ordinal: u64::from(entry.ordinal),
                count,
            });
        }
        let (offset, len) = self.frame(entry.ordinal)?;
        let frame = self.slice(offset, len);
        match zstd::zstd_safe::get_frame_content_size(frame) {
            Ok(Some(n)) if n != entry.original_size => Err(ArchiveError::SizeMismatch {
                key: entry.key.clone(),
                target: entry.target.clone(),
                expected: entry.original_size,
                actual: n,
            }),
            // No content size recorded: the frame still bounds its output
            // (every block of at most 128 KiB takes at least 3 bytes).
            Ok(None) if entry.original_size > (len / 3 + 1) * ZSTD_BLOCK_MAX => {
                Err(decompress_err(
                    entry,
                    format!(
                        "original_size {} is more than a {len}-byte zstd frame can hold",
                        entry.original_size
                    ),
                ))
            }
            Ok(_) => Ok(frame),
            Err(_) => Err(decompress_err(entry, "invalid zstd frame header".into())),
        }
    }

    /// The sizes and scheme of the kernel of `entry` (an entry of this
    /// archive), without decompressing it: checked first as
    /// [`Archive::check`] checks it, so that the `original_size` reported
    /// is the size a read gives (a TOC that disagrees with its frame is an
    /// error here, as it would be on reading).
    pub fn kernel_info(&self, entry: &Entry) -> Result<KernelInfo, ArchiveError> {
        self.check(entry)?;
        Ok(KernelInfo {
            original_size: entry.original_size,
            stored_size: self.stored_size(entry)?,
            scheme: self.scheme(),
        })
    }

    /// The bytes the kernel of `entry` takes in the blob: its zstd frame and
    /// the frame's length prefix (`zstd-per-kernel`), or its blob (`none`).
    /// Entries that share an ordinal share these bytes.
    pub fn stored_size(&self, entry: &Entry) -> Result<u64, ArchiveError> {
        let ordinal = entry.ordinal as usize;
        let out_of_range = |count: usize| ArchiveError::OrdinalOutOfRange {
            key: entry.key.clone(),
            target: entry.target.clone(),
            ordinal: ordinal as u64,
            count: count as u64,
        };
        match &self.layout {
            Layout::Blobs(blobs) => blobs
                .get(ordinal)
                .map(|&(_, size)| size)
                .ok_or_else(|| out_of_range(blobs.len())),
            Layout::Zstd { count, .. } => {
                if ordinal as u64 >= *count {
                    return Err(out_of_range(*count as usize));
                }
                self.frame(entry.ordinal).map(|(_, len)| len + 4)
            }
        }
    }

    /// The file's length.
    pub fn file_size(&self) -> u64 {
        self.data.len() as u64
    }

    /// `data[offset..offset + size]` for a range validated at open time.
    fn slice(&self, offset: u64, size: u64) -> &[u8] {
        // Ranges are validated against the file length when the TOC or the
        // frame index is decoded, so they fit in usize and in `data`.
        &self.data[offset as usize..(offset + size) as usize]
    }

    /// `(offset, len)` of frame `ordinal` (below the frame count), walking
    /// the `u32 frame_len` prefixes of the zstd blob as far as it is and no
    /// further. A walk that failed fails the same way for every frame past
    /// the failure.
    fn frame(&self, ordinal: u32) -> Result<(u64, u64), ArchiveError> {
        let Layout::Zstd {
            offset,
            size,
            count,
        } = self.layout
        else {
            return Err(ArchiveError::FrameOutOfRange {
                index: u64::from(ordinal),
                offset: 0,
                size: 0,
                end: 0,
            });
        };
        let i = ordinal as usize;
        let index = &self.frames;
        // Each frame takes at least its 4-byte prefix: no more slots than
        // the blob can hold frames.
        let slots = index.slots.get_or_init(|| {
            (0..count.min(size / 4))
                .map(|_| (AtomicU64::new(0), AtomicU64::new(0)))
                .collect()
        });
        let get = |j: usize| {
            let (o, l) = &slots[j];
            (o.load(Ordering::Relaxed), l.load(Ordering::Relaxed))
        };
        // Acquire: the slots below `known` were written before it was
        // published (Release, below).
        if i < index.known.load(Ordering::Acquire) {
            return Ok(get(i));
        }
        // The walk stays consistent even if a holder panicked: it only
        // moves forward, one complete frame at a time.
        let mut walk = index.walk.lock().unwrap_or_else(PoisonError::into_inner);
        let mut known = index.known.load(Ordering::Acquire);
        if i < known {
            return Ok(get(i));
        }
        if let Some(e) = &walk.error {
            return Err(e.clone());
        }
        let end = offset + size;
        if walk.next == 0 {
            walk.next = offset + 4;
        }
        while known <= i {
            let pos = walk.next;
            let prefix = if end - pos < 4 || known >= slots.len() {
                None
            } else {
                self.data.u32_at(pos)
            };
            let failed = match prefix {
                None => Some(ArchiveError::FrameOutOfRange {
                    index: known as u64,
                    offset: pos,
                    size: 4,
                    end,
                }),
                Some(len) if end - (pos + 4) < u64::from(len) => {
                    Some(ArchiveError::FrameOutOfRange {
                        index: known as u64,
                        offset: pos + 4,
                        size: u64::from(len),
                        end,
                    })
                }
                Some(_) => None,
            };
            if let Some(e) = failed {
                walk.error = Some(e.clone());
                return Err(e);
            }
            let len = u64::from(prefix.unwrap_or_default());
            let (o, l) = &slots[known];
            o.store(pos + 4, Ordering::Relaxed);
            l.store(len, Ordering::Relaxed);
            walk.next = pos + 4 + len;
            known += 1;
            index.known.store(known, Ordering::Release);
        }
        Ok(get(i))
    }
}

/// FNV-1a of a key, for the key index (collisions only cost a comparison).
fn key_hash(key: &str) -> u64 {
    key.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// zstd's largest block (`ZSTD_BLOCKSIZE_MAX`).
const ZSTD_BLOCK_MAX: u64 = 128 << 10;

thread_local! {
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

/// Decompress one frame into the spare capacity of `buf` (fails if it needs
/// more), reusing a per-thread zstd context.
fn decompress_into<B: zstd::zstd_safe::WriteBuf + ?Sized>(
    frame: &[u8],
    buf: &mut B,
) -> std::io::Result<usize> {
    DECOMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        let d = match &mut *slot {
            Some(d) => d,
            empty => empty.insert(zstd::bulk::Decompressor::new()?),
        };
        d.decompress_to_buffer(frame, buf)
    })
}

fn decompress_err(entry: &Entry, reason: String) -> ArchiveError {
    ArchiveError::Decompress {
        key: entry.key.clone(),
        target: entry.target.clone(),
        reason,
    }
}

/// Check magic, version and TOC offset; return the TOC offset. Each is
/// checked as soon as its bytes are there, so a short file with another
/// version is reported as that.
fn parse_header(data: &[u8]) -> Result<u64, ArchiveError> {
    let len = data.len() as u64;
    if let Some(found) = bytes::array_at::<4>(data, 0) {
        if &found != MAGIC {
            return Err(ArchiveError::BadMagic { found });
        }
    }
    if let Some(version) = bytes::u32_at(data, 4) {
        if version != FORMAT_VERSION {
            return Err(ArchiveError::UnsupportedVersion { version });
        }
    }
    let toc_offset = match bytes::u64_at(data, 8) {
        Some(offset) if len >= HEADER_SIZE => offset,
        _ => return Err(ArchiveError::TruncatedHeader { len }),
    };
    if toc_offset < HEADER_SIZE || toc_offset > len {
        return Err(ArchiveError::TocOffsetOutOfRange {
            toc_offset,
            file_len: len,
        });
    }
    Ok(toc_offset)
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use crate::archive::MAX_FRAMES;
    use crate::msgpack::Value;
    use std::path::Path;

    fn assert_send_sync<T: Send + Sync>() {}

    /// The archive file at `path`, read into memory.
    fn open(path: impl AsRef<Path>) -> Result<Archive, ArchiveError> {
        Archive::from_bytes(std::fs::read(path)?)
    }

    #[test]
    fn archive_is_send_sync() {
        assert_send_sync::<Archive>();
    }

    fn check_reference(
        a: &Archive,
        family: &str,
        arches: &[&str],
        scheme: Scheme,
        kernels: &[(&str, &str, Vec<u8>)],
    ) {
        assert_eq!(a.group_name(), "test");
        assert_eq!(a.gfx_arch_family(), family);
        assert_eq!(a.gfx_arches(), arches);
        assert_eq!(a.scheme(), scheme);
        assert_eq!(a.kernel_count(), kernels.len());
        let by_ord: Vec<_> = a
            .entries_by_ordinal()
            .map(|(k, t, e)| (k, t, e.ordinal))
            .collect();
        let want: Vec<_> = kernels
            .iter()
            .enumerate()
            .map(|(i, (k, t, _))| (*k, *t, i as u32))
            .collect();
        assert_eq!(by_ord, want);
        for (key, target, bytes) in kernels {
            let e = a.entry(key, target).unwrap();
            assert_eq!(e.kind.as_deref(), Some("hsaco"));
            assert_eq!(e.original_size, bytes.len() as u64);
            assert_eq!(e.metadata, None);
            assert_eq!(&a.kernel(key, target).unwrap(), bytes, "{key} @ {target}");
        }
    }

    #[test]
    fn reads_reference_noop() {
        let a = open(fixture("test_noop.kpack")).unwrap();
        check_reference(
            &a,
            "gfx900X",
            &["gfx900", "gfx906"],
            Scheme::None,
            &noop_kernels(),
        );
        assert_eq!(
            a.binaries().collect::<Vec<_>>(),
            ["bin/testapp#0", "lib/libtest.so#0"]
        );
        assert_eq!(
            a.targets_of("lib/libtest.so#0").collect::<Vec<_>>(),
            ["gfx900", "gfx906"]
        );
        assert_eq!(
            a.targets_of("bin/testapp#0").collect::<Vec<_>>(),
            ["gfx900"]
        );
        assert_eq!(a.targets_of("nope#0").count(), 0);
        // TOC order is file order.
        let toc: Vec<_> = a.keys_and_targets().collect();
        assert_eq!(
            toc,
            [
                ("lib/libtest.so#0", "gfx900"),
                ("lib/libtest.so#0", "gfx906"),
                ("bin/testapp#0", "gfx900")
            ]
        );
        // Scheme none borrows from the file.
        let e = a.entry("bin/testapp#0", "gfx900").unwrap();
        assert!(matches!(a.read(e).unwrap(), Cow::Borrowed(_)));
    }

    #[test]
    fn reads_reference_zstd() {
        let a = open(fixture("test_zstd.kpack")).unwrap();
        check_reference(
            &a,
            "gfx110X",
            &["gfx1100", "gfx1101"],
            Scheme::ZstdPerKernel,
            &zstd_kernels(),
        );
        assert_eq!(
            a.binaries().collect::<Vec<_>>(),
            ["bin/hiptest#0", "lib/libhip.so#0"]
        );
    }

    #[test]
    fn kernel_not_found() {
        let a = open(fixture("test_noop.kpack")).unwrap();
        assert!(matches!(
            a.kernel("lib/libtest.so#0", "gfx942"),
            Err(ArchiveError::KernelNotFound { ref key, ref target }) if key == "lib/libtest.so#0" && target == "gfx942"
        ));
        assert!(matches!(
            a.kernel("lib/libtest.so#1", "gfx900"),
            Err(ArchiveError::KernelNotFound { .. })
        ));
    }

    #[test]
    fn concurrent_reads() {
        let a = open(fixture("test_zstd.kpack")).unwrap();
        let kernels = zstd_kernels();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..20 {
                        for (k, t, bytes) in &kernels {
                            assert_eq!(&a.kernel(k, t).unwrap(), bytes);
                        }
                    }
                });
            }
        });
    }

    fn noop_bytes() -> Vec<u8> {
        std::fs::read(fixture("test_noop.kpack")).unwrap()
    }

    fn zstd_bytes() -> Vec<u8> {
        std::fs::read(fixture("test_zstd.kpack")).unwrap()
    }

    /// Decode the TOC of `bytes`, let `f` change it, and re-encode it.
    fn with_toc(bytes: &[u8], f: impl FnOnce(&mut Value)) -> Vec<u8> {
        let toc_offset = bytes::u64_at(bytes, 8).unwrap() as usize;
        let mut toc = msgpack::decode(&bytes[toc_offset..]).unwrap();
        f(&mut toc);
        let mut out = bytes[..toc_offset].to_vec();
        out.extend(msgpack::encode(&toc));
        out
    }

    /// The value at `path` (string keys / array indices) in `v`.
    fn at<'v>(v: &'v mut Value, path: &[&str]) -> &'v mut Value {
        let mut v = v;
        for p in path {
            v = match v {
                Value::Map(m) => &mut m.iter_mut().find(|(k, _)| k.as_str() == Some(p)).unwrap().1,
                Value::Array(a) => &mut a[p.parse::<usize>().unwrap()],
                _ => panic!("no {p}"),
            };
        }
        v
    }

    fn remove(v: &mut Value, key: &str) {
        let Value::Map(m) = v else { panic!() };
        m.retain(|(k, _)| k.as_str() != Some(key));
    }

    fn open_err(bytes: Vec<u8>) -> ArchiveError {
        Archive::from_bytes(bytes).unwrap_err()
    }

    #[test]
    fn bad_magic() {
        let mut b = noop_bytes();
        b[0..4].copy_from_slice(b"\x7fELF");
        let e = open_err(b);
        assert!(
            matches!(e, ArchiveError::BadMagic { found } if &found == b"\x7fELF"),
            "{e}"
        );
        assert!(e.to_string().contains("\\x7fELF"), "{e}");
        assert!(matches!(
            open_err(b"PK\x03\x04 short".to_vec()),
            ArchiveError::BadMagic { .. }
        ));
    }

    #[test]
    fn unsupported_version() {
        let mut b = noop_bytes();
        b[4] = 2;
        assert!(matches!(
            open_err(b),
            ArchiveError::UnsupportedVersion { version: 2 }
        ));
    }

    /// formats.md §3.1: a header with another version is UNSUPPORTED_VERSION as
    /// soon as the version is there, however short the file.
    #[test]
    fn version_checked_before_length() {
        for len in [8usize, 20, 63] {
            let mut b = b"KPAK".to_vec();
            b.extend(999u32.to_le_bytes());
            b.resize(len, 0xab);
            let e = open_err(b);
            assert!(
                matches!(e, ArchiveError::UnsupportedVersion { version: 999 }),
                "{len}: {e}"
            );
            assert_eq!(
                e.to_string(),
                "unsupported kpack archive version 999 (supported: 1)"
            );
        }
        // Shorter than the version: truncated.
        assert!(matches!(
            open_err(b"KPAK\xe7\x03".to_vec()),
            ArchiveError::TruncatedHeader { len: 6 }
        ));
    }

    #[test]
    fn toc_offset_out_of_range() {
        let mut b = noop_bytes();
        let len = b.len() as u64;
        bytes::put_u64(&mut b, 8, len + 1);
        assert!(matches!(
            open_err(b.clone()),
            ArchiveError::TocOffsetOutOfRange { toc_offset, file_len } if toc_offset == len + 1 && file_len == len
        ));
        bytes::put_u64(&mut b, 8, u64::MAX);
        assert!(matches!(
            open_err(b.clone()),
            ArchiveError::TocOffsetOutOfRange { .. }
        ));
        bytes::put_u64(&mut b, 8, 10u64);
        assert!(matches!(
            open_err(b.clone()),
            ArchiveError::TocOffsetOutOfRange { toc_offset: 10, .. }
        ));
        // TOC offset at the very end: an empty TOC.
        bytes::put_u64(&mut b, 8, len);
        assert!(matches!(
            open_err(b),
            ArchiveError::TocParse {
                source: msgpack::DecodeError::Truncated { .. },
                ..
            }
        ));
    }

    #[test]
    fn toc_not_msgpack() {
        let b = noop_bytes();
        let toc_offset = bytes::u64_at(&b, 8).unwrap() as usize;
        let mut bad = b[..toc_offset].to_vec();
        bad.extend_from_slice(&[0xc1, 0x00]);
        assert!(matches!(
            open_err(bad),
            ArchiveError::TocParse { toc_offset: o, source: msgpack::DecodeError::InvalidMarker { offset: 0, marker: 0xc1 } }
                if o == toc_offset as u64
        ));
        let mut trailing = b.clone();
        trailing.push(0);
        assert!(matches!(
            open_err(trailing),
            ArchiveError::TocParse {
                source: msgpack::DecodeError::TrailingBytes { .. },
                ..
            }
        ));
        // A TOC that is MessagePack but not a map.
        let mut arr = b[..toc_offset].to_vec();
        arr.push(0x90);
        assert!(matches!(
            open_err(arr),
            ArchiveError::TocFieldType {
                expected: "map",
                found: "array",
                ..
            }
        ));
    }

    #[test]
    fn toc_field_wrong_type() {
        let b = with_toc(&noop_bytes(), |t| {
            *at(t, &["toc", "lib/libtest.so#0", "gfx906", "ordinal"]) = Value::from("1");
        });
        let e = open_err(b);
        match &e {
            ArchiveError::TocFieldType {
                field,
                expected: "int",
                found: "str",
            } => {
                assert_eq!(field, r#"toc["lib/libtest.so#0"]["gfx906"].ordinal"#)
            }
            other => panic!("{other}"),
        }
        assert_eq!(
            e.to_string(),
            r#"TOC field `toc["lib/libtest.so#0"]["gfx906"].ordinal` is a str, expected int"#
        );
        let cases: Vec<(Vec<&str>, Value, &str)> = vec![
            (vec!["group_name"], Value::from(1i64), "group_name"),
            (vec!["gfx_arches"], Value::from("gfx900"), "gfx_arches"),
            (vec!["gfx_arches", "1"], Value::Nil, "gfx_arches[1]"),
            (vec!["toc"], Value::Array(vec![]), "toc"),
            (
                vec!["toc", "bin/testapp#0"],
                Value::from(1i64),
                r#"toc["bin/testapp#0"]"#,
            ),
            (
                vec!["toc", "bin/testapp#0", "gfx900", "original_size"],
                Value::F64(168.0),
                r#"toc["bin/testapp#0"]["gfx900"].original_size"#,
            ),
            (
                vec!["toc", "bin/testapp#0", "gfx900", "type"],
                Value::Boolean(true),
                r#"toc["bin/testapp#0"]["gfx900"].type"#,
            ),
            (vec!["compression_scheme"], Value::Nil, "compression_scheme"),
            (vec!["blobs", "2"], Value::from(5i64), "blobs[2]"),
            (
                vec!["blobs", "2", "size"],
                Value::from("168"),
                "blobs[2].size",
            ),
        ];
        for (path, v, want) in cases {
            let b = with_toc(&noop_bytes(), |t| *at(t, &path) = v);
            match open_err(b) {
                ArchiveError::TocFieldType { field, .. } => assert_eq!(field, want),
                other => panic!("{want}: {other}"),
            }
        }
        // Metadata keys must be strings; metadata must be a map.
        let b = with_toc(&noop_bytes(), |t| {
            let Value::Map(e) = at(t, &["toc", "bin/testapp#0", "gfx900"]) else {
                panic!()
            };
            e.push((
                Value::from("metadata"),
                Value::Map(vec![(Value::from(1i64), Value::from("x"))]),
            ));
        });
        assert!(
            matches!(open_err(b), ArchiveError::TocFieldType { ref field, .. } if field.ends_with("metadata (a key)"))
        );
    }

    #[test]
    fn toc_field_missing_or_invalid() {
        for (path, key, want) in [
            (vec![], "group_name", "group_name"),
            (vec![], "gfx_arch_family", "gfx_arch_family"),
            (vec![], "toc", "toc"),
            (vec![], "blobs", "blobs"),
            (vec!["blobs", "0"], "offset", "blobs[0].offset"),
            (
                vec!["toc", "lib/libtest.so#0", "gfx900"],
                "ordinal",
                r#"toc["lib/libtest.so#0"]["gfx900"].ordinal"#,
            ),
            (
                vec!["toc", "lib/libtest.so#0", "gfx900"],
                "original_size",
                r#"toc["lib/libtest.so#0"]["gfx900"].original_size"#,
            ),
        ] {
            let b = with_toc(&noop_bytes(), |t| remove(at(t, &path), key));
            match open_err(b) {
                ArchiveError::TocFieldMissing { field } => assert_eq!(field, want),
                other => panic!("{want}: {other}"),
            }
        }
        let b = with_toc(&noop_bytes(), |t| {
            *at(t, &["toc", "bin/testapp#0", "gfx900", "ordinal"]) = Value::from(1u64 << 40)
        });
        assert!(matches!(open_err(b), ArchiveError::TocFieldValue { .. }));
        let b = with_toc(&noop_bytes(), |t| {
            *at(t, &["blobs", "0", "size"]) = Value::from(-1i64)
        });
        assert!(
            matches!(open_err(b), ArchiveError::TocFieldValue { ref reason, .. } if reason.contains("negative"))
        );
        let b = with_toc(&noop_bytes(), |t| {
            *at(t, &["format_version"]) = Value::from(2i64)
        });
        assert!(matches!(
            open_err(b),
            ArchiveError::UnsupportedTocVersion { version: 2 }
        ));
        // `type` is optional on read.
        let b = with_toc(&noop_bytes(), |t| {
            remove(at(t, &["toc", "bin/testapp#0", "gfx900"]), "type")
        });
        assert_eq!(
            Archive::from_bytes(b)
                .unwrap()
                .entry("bin/testapp#0", "gfx900")
                .unwrap()
                .kind,
            None
        );
    }

    #[test]
    fn ordinal_out_of_range() {
        let b = with_toc(&noop_bytes(), |t| {
            *at(t, &["toc", "bin/testapp#0", "gfx900", "ordinal"]) = Value::from(3u64)
        });
        assert!(matches!(
            open_err(b),
            ArchiveError::OrdinalOutOfRange {
                ordinal: 3,
                count: 3,
                ..
            }
        ));
        let b = with_toc(&zstd_bytes(), |t| {
            *at(t, &["toc", "bin/hiptest#0", "gfx1100", "ordinal"]) = Value::from(7u64)
        });
        assert!(matches!(
            open_err(b),
            ArchiveError::OrdinalOutOfRange {
                ordinal: 7,
                count: 3,
                ..
            }
        ));
    }

    #[test]
    fn blob_outside_file() {
        let b = with_toc(&noop_bytes(), |t| {
            *at(t, &["blobs", "2", "size"]) = Value::from(10_000u64)
        });
        assert!(matches!(
            open_err(b),
            ArchiveError::BlobOutOfRange {
                index: 2,
                offset: 402,
                size: 10_000,
                start: 64,
                end: 570
            }
        ));
        let b = with_toc(&noop_bytes(), |t| {
            *at(t, &["blobs", "1", "offset"]) = Value::from(u64::MAX)
        });
        assert!(matches!(
            open_err(b),
            ArchiveError::BlobOutOfRange { index: 1, .. }
        ));
        let b = with_toc(&noop_bytes(), |t| {
            *at(t, &["blobs", "0", "offset"]) = Value::from(0u64)
        });
        assert!(matches!(
            open_err(b),
            ArchiveError::BlobOutOfRange {
                index: 0,
                offset: 0,
                ..
            }
        ));
        let b = with_toc(&zstd_bytes(), |t| {
            *at(t, &["zstd_size"]) = Value::from(135u64)
        });
        assert!(matches!(
            open_err(b),
            ArchiveError::ZstdBlobOutOfRange {
                offset: 64,
                size: 135,
                ..
            }
        ));
        let b = with_toc(&zstd_bytes(), |t| remove(t, "zstd_offset"));
        assert!(
            matches!(open_err(b), ArchiveError::TocFieldMissing { ref field } if field == "zstd_offset")
        );
    }

    #[test]
    fn unknown_scheme_and_missing_scheme() {
        let b = with_toc(&noop_bytes(), |t| {
            *at(t, &["compression_scheme"]) = Value::from("lz4")
        });
        let e = open_err(b);
        assert!(matches!(e, ArchiveError::UnknownScheme { ref scheme } if scheme == "lz4"));
        // Missing reads as "none".
        let b = with_toc(&noop_bytes(), |t| remove(t, "compression_scheme"));
        let a = Archive::from_bytes(b).unwrap();
        assert_eq!(a.scheme(), Scheme::None);
        assert_eq!(
            a.kernel("lib/libtest.so#0", "gfx906").unwrap(),
            noop_kernels()[1].2
        );
    }

    #[test]
    fn duplicate_entry_in_toc() {
        let b = with_toc(&noop_bytes(), |t| {
            let Value::Map(m) = at(t, &["toc"]) else {
                panic!()
            };
            let again = m[1].clone();
            m.push(again);
        });
        assert!(
            matches!(open_err(b), ArchiveError::DuplicateKernel { ref key, .. } if key == "bin/testapp#0")
        );
    }

    #[test]
    fn size_mismatch() {
        let b = with_toc(&noop_bytes(), |t| {
            *at(t, &["toc", "bin/testapp#0", "gfx900", "original_size"]) = Value::from(167u64)
        });
        let a = Archive::from_bytes(b).unwrap();
        assert!(matches!(
            a.kernel("bin/testapp#0", "gfx900"),
            Err(ArchiveError::SizeMismatch {
                expected: 167,
                actual: 168,
                ..
            })
        ));
        let b = with_toc(&zstd_bytes(), |t| {
            *at(t, &["toc", "bin/hiptest#0", "gfx1100", "original_size"]) = Value::from(1017u64)
        });
        let a = Archive::from_bytes(b).unwrap();
        assert!(matches!(
            a.kernel("bin/hiptest#0", "gfx1100"),
            Err(ArchiveError::SizeMismatch {
                expected: 1017,
                actual: 1018,
                ..
            })
        ));
        // Sizes above the cap are refused before any allocation.
        let b = with_toc(&zstd_bytes(), |t| {
            *at(t, &["toc", "bin/hiptest#0", "gfx1100", "original_size"]) = Value::from(5u64 << 30)
        });
        let a = Archive::from_bytes(b).unwrap();
        assert!(matches!(
            a.kernel("bin/hiptest#0", "gfx1100"),
            Err(ArchiveError::KernelTooLarge { .. })
        ));
    }

    #[test]
    fn kernel_info_is_what_a_read_gives() {
        for (bytes, scheme) in [
            (noop_bytes(), Scheme::None),
            (zstd_bytes(), Scheme::ZstdPerKernel),
        ] {
            let toc_offset = bytes::u64_at(&bytes, 8).unwrap();
            let a = Archive::from_bytes(bytes).unwrap();
            let mut stored = 0;
            for e in a.entries() {
                let info = a.kernel_info(e).unwrap();
                let data = a.read(e).unwrap();
                assert_eq!(info.original_size, data.len() as u64);
                assert_eq!(info.stored_size, a.stored_size(e).unwrap());
                assert_eq!(info.scheme, scheme);
                if scheme == Scheme::None {
                    assert_eq!(info.stored_size, info.original_size);
                }
                stored += info.stored_size;
            }
            // Frames (with their lengths) or blobs lie between the header
            // and the TOC (the reference archives share no bytes).
            assert!(stored > 0 && stored <= toc_offset - HEADER_SIZE);
        }
        // A TOC whose size disagrees with the frame's header: an error, as
        // on reading, not a wrong answer.
        let b = with_toc(&zstd_bytes(), |t| {
            *at(t, &["toc", "bin/hiptest#0", "gfx1100", "original_size"]) = Value::from(7u64)
        });
        let a = Archive::from_bytes(b).unwrap();
        let e = a.entry("bin/hiptest#0", "gfx1100").unwrap();
        assert!(matches!(
            a.kernel_info(e),
            Err(ArchiveError::SizeMismatch { expected: 7, .. })
        ));
    }

    #[test]
    fn frame_lengths_and_counts() {
        // frame_len of frame 1 runs past the blob: found on the first read.
        let mut b = zstd_bytes();
        bytes::put_u32(&mut b, 68 + 4 + 41, 1000);
        let a = Archive::from_bytes(b).unwrap();
        for _ in 0..2 {
            assert!(matches!(
                a.kernel("lib/libhip.so#0", "gfx1101"),
                Err(ArchiveError::FrameOutOfRange {
                    index: 1,
                    size: 1000,
                    end: 198,
                    ..
                })
            ));
        }
        // More frames claimed than the blob holds: the frames that are
        // there read (the walk stops at the frame being read), the
        // missing one is out of range.
        let mut b = zstd_bytes();
        bytes::put_u32(&mut b, 64, 4);
        let a = Archive::from_bytes(b).unwrap();
        assert_eq!(
            a.kernel("lib/libhip.so#0", "gfx1100").unwrap(),
            zstd_kernels()[0].2
        );
        let e = a.entry("bin/hiptest#0", "gfx1100").unwrap().clone();
        let fourth = Entry { ordinal: 3, ..e };
        for _ in 0..2 {
            assert!(matches!(
                a.read(&fourth),
                Err(ArchiveError::FrameOutOfRange { index: 3, .. })
            ));
        }
        assert_eq!(
            a.kernel("bin/hiptest#0", "gfx1100").unwrap(),
            zstd_kernels()[2].2
        );
        // Frames are located as far as a read needs: frame 1 is read
        // before frame 0, then both again.
        let a = Archive::from_bytes(zstd_bytes()).unwrap();
        for (key, target, want) in [&zstd_kernels()[1], &zstd_kernels()[0], &zstd_kernels()[1]] {
            assert_eq!(&a.kernel(key, target).unwrap(), want);
        }
        // Too many frames.
        let mut b = zstd_bytes();
        bytes::put_u32(&mut b, 64, MAX_FRAMES as u32 + 1);
        assert!(matches!(open_err(b), ArchiveError::TooManyFrames { .. }));
        // Fewer frames than ordinals.
        let mut b = zstd_bytes();
        bytes::put_u32(&mut b, 64, 2);
        assert!(matches!(
            open_err(b),
            ArchiveError::OrdinalOutOfRange {
                ordinal: 2,
                count: 2,
                ..
            }
        ));
    }

    #[test]
    fn truncated_files() {
        for bytes in [noop_bytes(), zstd_bytes()] {
            for cut in 0..bytes.len() {
                let e = open_err(bytes[..cut].to_vec());
                match cut {
                    0..=63 => assert!(
                        matches!(e, ArchiveError::TruncatedHeader { .. }),
                        "{cut}: {e}"
                    ),
                    _ => assert!(
                        matches!(
                            e,
                            ArchiveError::TocOffsetOutOfRange { .. }
                                | ArchiveError::TocParse { .. }
                        ),
                        "{cut}: {e}"
                    ),
                }
            }
        }
    }

    #[test]
    fn damaged_bytes_never_panic() {
        // Flip every byte of both references (one at a time, several ways)
        // and read everything that opens.
        for bytes in [noop_bytes(), zstd_bytes()] {
            for pos in 0..bytes.len() {
                for x in [0x01u8, 0x80, 0xff] {
                    let mut b = bytes.clone();
                    b[pos] ^= x;
                    if let Ok(a) = Archive::from_bytes(b) {
                        for (_, _, e) in a.entries_by_ordinal() {
                            let _ = a.read(e);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn damaged_frame_magic() {
        // A damaged frame magic.
        let mut b = zstd_bytes();
        b[72] = 0;
        let a = Archive::from_bytes(b).unwrap();
        assert!(matches!(
            a.kernel("lib/libhip.so#0", "gfx1100"),
            Err(ArchiveError::Decompress { ref reason, .. }) if reason.contains("frame header")
        ));
    }
}
