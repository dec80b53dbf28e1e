//! Compressed bundles without holding them: listing a fat binary from its
//! entry tables, and reading its code objects one at a time.
//!
//! A CCOB's payload decompresses to plain bundles whose entry tables come
//! first (formats.md §1.2). [`list_fatbin`] decompresses only as far as
//! it must to read them: for the usual CCOB, whose one inner bundle ends
//! where the header's uncompressed size says, that is the table alone.
//! [`FatbinStream`] hands out code objects in bundle order, reading each
//! inner bundle's entries in offset order from a zstd (or zlib) stream: what
//! it holds is the decompressor's window and the code object being handed
//! out, never the whole decompressed bundle. Both check what they read as
//! [`crate::parse_fatbin`] does, and report the same errors: a parse error
//! inside a payload is reported only after the rest of the payload was
//! decompressed without error (decompression errors and size mismatches
//! come first, as when the payload is decompressed whole).

use std::collections::VecDeque;
use std::io::Read;
use std::ops::Range;
use std::sync::Arc;

use md5::{Digest, Md5};
use zstd::zstd_safe::{get_error_name, DCtx, InBuffer, OutBuffer, ResetDirective};

use crate::{
    check_entries, describe, md5_word, parse_ccob, parse_plain, plain_table, read_ccob_header,
    read_entry_table, Blob, BundleError, BundleInfo, Ccob, CcobHeader, EntryInfo, Method,
    TableSource, BUNDLE_MAGIC, CCOB_MAGIC,
};

/// [`list_fatbin`] decompresses a compressed bundle whole (checking its
/// size and hash) when it is at most this large uncompressed; a larger one
/// is listed from its entry tables.
pub const LIST_CHECK_LIMIT: u64 = 1 << 20;

/// Bytes decompressed ahead of what is asked for (entry tables, padding).
const LOOKAHEAD: usize = 64 << 10;

/// [`FatbinStream`] decompresses a compressed bundle whole, into one
/// buffer its code objects share, when its zstd frame's window is its whole
/// content (a single-segment frame: what clang's long-distance matching
/// makes of bundles up to 128 MiB) and it is at most this large: the
/// decompressor would hold a window that large anyway, and the code
/// objects are not copied out of it. Other compressed bundles are read as
/// a stream, each code object copied out of the decompressor's window.
pub const WHOLE_LIMIT: u64 = 128 << 20;

/// List the bundles of a `.hip_fatbin` section (or bundle file) from their
/// headers and entry tables, every count, offset and size checked as
/// [`crate::parse_fatbin`] checks them. A compressed bundle of at most
/// [`LIST_CHECK_LIMIT`] bytes is decompressed whole; of a larger one only
/// the first bytes are, unless its inner bundles do not account for every
/// byte of it (then the rest is read, a window at a time, to find them):
/// its `hash_matches` is then `None` and damage past its entry tables goes
/// unnoticed. (A compressed bundle holding several bundles is read up to the
/// last one's table: their start is found only by reading past the others.)
pub fn list_fatbin(data: &[u8]) -> Result<Vec<BundleInfo>, BundleError> {
    list(data, false)
}

/// [`list_fatbin`] that decompresses every compressed bundle to the end,
/// a window at a time: every check [`crate::parse_fatbin`] makes, hashes
/// included, in bounded memory.
pub fn check_fatbin(data: &[u8]) -> Result<Vec<BundleInfo>, BundleError> {
    list(data, true)
}

fn list(data: &[u8], whole: bool) -> Result<Vec<BundleInfo>, BundleError> {
    let mut out = Vec::new();
    let mut dctx = None;
    let (mut pos, mut count) = (0usize, 0usize);
    while let Some(start) = next_bundle_start(data, pos) {
        let rest = &data[start..];
        if rest.starts_with(BUNDLE_MAGIC) {
            let (entries, len) = plain_table(rest, count, start)?;
            out.push(BundleInfo {
                index: count,
                range: start..start + len,
                compressed: None,
                entries,
            });
            count += 1;
            pos = start + len;
        } else if rest.starts_with(CCOB_MAGIC) {
            let h = read_ccob_header(rest, count, start)?;
            let len = h.total as usize;
            if !whole && h.uncompressed <= LIST_CHECK_LIMIT {
                let (inner, _) = parse_ccob(rest, count, start)?;
                for b in &inner {
                    let mut info = BundleInfo::from(b);
                    info.range = start..start + len;
                    out.push(info);
                }
                count += inner.len();
            } else {
                // The hash only when every byte is read anyway.
                let mut c = CcobCursor::new(rest, h, count, start, dctx.take(), whole);
                let mut inner = Vec::new();
                while let Some(info) = c.next_bundle()? {
                    inner.push(info);
                    // Accounted for every byte: nothing more to find.
                    if !whole && c.inner_end == c.payload.expected {
                        break;
                    }
                }
                let hash_matches = c.finished_hash();
                let ccob = Arc::new(c.ccob(inner.len(), hash_matches));
                count += inner.len();
                dctx = c.payload.into_dctx();
                for (i, b) in inner.into_iter().enumerate() {
                    out.push(BundleInfo {
                        range: start..start + len,
                        compressed: Some((ccob.clone(), i)),
                        ..b
                    });
                }
            }
            pos = start + len;
        } else {
            return Err(BundleError::BadMagic {
                offset: start,
                found: describe(rest),
            });
        }
    }
    Ok(out)
}

/// The offset of the next bundle at or after `pos` (zero bytes skipped),
/// or `None` at the end of the data.
fn next_bundle_start(data: &[u8], pos: usize) -> Option<usize> {
    data.get(pos..)?
        .iter()
        .position(|&b| b != 0)
        .map(|i| pos + i)
}

/// One device code object handed out by [`FatbinStream`] (or a host
/// entry, when [`FatbinStream::with_host_entries`] asks for them).
#[derive(Debug, Clone)]
pub struct Streamed<'a> {
    /// Bundle index (formats.md §1.4).
    pub bundle: usize,
    /// Byte range in the input of this bundle, or of the compressed bundle
    /// it came from.
    pub range: Range<usize>,
    /// Whether it came out of a compressed bundle (then `data` is its own
    /// buffer; otherwise a slice of the input).
    pub compressed: bool,
    /// Its position in its bundle's entry table.
    pub entry: usize,
    pub triple: String,
    /// Its offset from the start of its (uncompressed) bundle.
    pub offset: u64,
    pub data: Blob<'a>,
}

impl Streamed<'_> {
    /// The target ID as written in the triple.
    pub fn target(&self) -> &str {
        kpack_format::target::target_of_triple(&self.triple)
    }
}

/// Which targets' code objects to hand out.
type Keep<'a> = Box<dyn Fn(&str) -> bool + Send + 'a>;

/// Which entries a [`FatbinStream`] hands out.
#[derive(Default)]
struct Filter<'a> {
    /// Device entries of the targets it accepts (all without it).
    keep: Option<Keep<'a>>,
    /// Host entries too.
    hosts: bool,
}

impl Filter<'_> {
    /// Whether an entry (a host entry, or one for `target`) is handed out.
    fn takes(&self, host: bool, target: &str) -> bool {
        if host {
            self.hosts
        } else {
            self.keep.as_ref().is_none_or(|k| k(target))
        }
    }
}

/// The device code objects of a `.hip_fatbin` section, in bundle order (in
/// table order inside a plain bundle, in offset order inside a compressed
/// one), with bounded memory: a plain bundle's code objects are slices of
/// the input; a compressed bundle is decompressed as a stream, each code
/// object read into a buffer of its own (entries that overlap share one).
/// Entries of targets [`FatbinStream::keep`] refuses are skipped, not read;
/// host entries are skipped unless [`FatbinStream::with_host_entries`].
///
/// An error can come after code objects were handed out (a damaged end of
/// a compressed bundle is found when it is reached): a caller that writes
/// output from them must be ready to discard it.
pub struct FatbinStream<'a> {
    data: &'a [u8],
    pos: usize,
    count: usize,
    filter: Filter<'a>,
    whole_limit: u64,
    ready: VecDeque<Streamed<'a>>,
    ccob: Option<CcobCursor<'a>>,
    /// A zstd context reused from one compressed bundle to the next.
    dctx: Option<DCtx<'static>>,
    /// The last decompressed buffer, taken again for the next one once
    /// nobody holds its code objects ([`FatbinStream::buffer`]).
    spare: Option<Arc<[u8]>>,
}

impl<'a> FatbinStream<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        FatbinStream {
            data,
            pos: 0,
            count: 0,
            filter: Filter::default(),
            whole_limit: WHOLE_LIMIT,
            ready: VecDeque::new(),
            ccob: None,
            dctx: None,
            spare: None,
        }
    }

    /// A buffer of at least `len` bytes to decompress into: the last one
    /// when it is large enough and every code object handed out of it has
    /// been dropped (its pages are resident already, where a new buffer
    /// costs a page fault per 4 KiB: a fifth of an offload's time with
    /// gigabytes of compressed device code), else a new one. The last one
    /// is let go either way, before a new one is made: what is held stays
    /// what the caller holds, plus one buffer.
    fn buffer(&mut self, len: usize) -> Arc<[u8]> {
        if let Some(mut b) = self.spare.take() {
            if b.len() >= len && Arc::get_mut(&mut b).is_some() {
                return b;
            }
        }
        std::iter::repeat_n(0u8, len).collect()
    }

    /// Hand out only the code objects of targets `keep` accepts (the target
    /// as written in the triple); the others are not read.
    pub fn keep(mut self, keep: impl Fn(&str) -> bool + Send + 'a) -> Self {
        self.filter.keep = Some(Box::new(keep));
        self
    }

    /// Hand out host entries too (bytes a bundle's host entry holds,
    /// usually none), in their place among the device entries: what a
    /// caller rebuilding bundles needs.
    pub fn with_host_entries(mut self) -> Self {
        self.filter.hosts = true;
        self
    }

    /// Decompress a compressed bundle whole (see [`WHOLE_LIMIT`]) only up
    /// to `bytes`; 0: always as a stream.
    pub fn whole_limit(mut self, bytes: u64) -> Self {
        self.whole_limit = bytes;
        self
    }

    /// What the next call of [`next`](Self::next) may allocate to
    /// decompress: the size of the next compressed bundle when it starts
    /// one read whole, its zstd window when read as a stream (an estimate
    /// for zlib), 0 when the next code object is at hand.
    pub fn upcoming(&self) -> u64 {
        if !self.ready.is_empty() || self.ccob.is_some() {
            return 0;
        }
        let Some(start) = next_bundle_start(self.data, self.pos) else {
            return 0;
        };
        let rest = &self.data[start..];
        if !rest.starts_with(CCOB_MAGIC) {
            return 0;
        }
        let Ok(h) = read_ccob_header(rest, self.count, start) else {
            return 0;
        };
        let payload = &rest[h.header_len as usize..h.total as usize];
        match (h.method, frame_window(payload)) {
            (Method::Zstd, Some(w)) if self.reads_whole(&h, payload) => w.window,
            (Method::Zstd, Some(w)) => w.window.min(h.uncompressed),
            _ => LOOKAHEAD as u64,
        }
    }

    /// Whether a compressed bundle is decompressed whole.
    fn reads_whole(&self, h: &CcobHeader, payload: &[u8]) -> bool {
        h.method == Method::Zstd
            && h.uncompressed <= self.whole_limit
            && frame_window(payload)
                .is_some_and(|w| w.single_segment && w.content == Some(h.uncompressed))
    }

    /// Decompress a compressed bundle at `start` (`rest` from there) into
    /// one buffer and queue its kept code objects (slices of it).
    fn read_whole(
        &mut self,
        rest: &'a [u8],
        h: CcobHeader,
        start: usize,
    ) -> Result<(), BundleError> {
        let payload = &rest[h.header_len as usize..h.total as usize];
        let mut p = Payload::new(
            payload,
            h.method,
            h.uncompressed,
            start,
            self.dctx.take(),
            false,
        );
        let len = h.uncompressed as usize;
        // The frame says its window is this large: zstd would allocate it.
        let mut buf = self.buffer(len);
        let read = p
            .read_exact(&mut Arc::get_mut(&mut buf).expect("not shared yet")[..len])
            .and_then(|()| p.finish());
        self.dctx = p.into_dctx();
        if let Err(e) = read {
            // zstd decoding straight into a buffer of the stated size names
            // some damage differently ("Destination buffer is too small"):
            // the error is the one decompressing as a stream gives.
            return Err(match e {
                BundleError::Decompress { .. } => {
                    decompress_all(payload, h.method, h.uncompressed, start)
                        .err()
                        .unwrap_or(e)
                }
                e => e,
            });
        }
        let range = start..start + h.total as usize;
        self.spare = Some(buf.clone());
        let inner = crate::inner_bundles_of(buf, len, self.count, start)?;
        self.count += inner.len();
        for b in inner {
            for (i, e) in b.entries.into_iter().enumerate() {
                if !self.filter.takes(e.is_host(), e.target()) {
                    continue;
                }
                self.ready.push_back(Streamed {
                    bundle: b.index,
                    range: range.clone(),
                    compressed: true,
                    entry: i,
                    triple: e.triple,
                    offset: e.offset,
                    data: e.data,
                });
            }
        }
        Ok(())
    }

    /// Bundles seen so far (all of them once [`next`](Self::next) returned
    /// `None`).
    pub fn bundles(&self) -> usize {
        self.count + self.ccob.as_ref().map_or(0, |c| c.inner)
    }

    /// How many bytes of the input, from its start, were read and are not
    /// needed again: a caller reading the input through a memory map may
    /// drop these pages (the code objects of plain bundles handed out are
    /// slices of the input, and excluded only if still held by the caller).
    pub fn consumed(&self) -> usize {
        match &self.ccob {
            Some(c) => c.offset + c.header.header_len as usize + c.payload.input_pos(),
            None => self.pos.min(self.data.len()),
        }
    }

    /// The next code object, `None` after the last.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<Streamed<'a>>, BundleError> {
        loop {
            if let Some(s) = self.ready.pop_front() {
                return Ok(Some(s));
            }
            if let Some(c) = self.ccob.as_mut() {
                if let Some(s) = c.next_code_object(&self.filter)? {
                    return Ok(Some(s));
                }
                let c = self.ccob.take().expect("a compressed bundle");
                self.count = c.first_index + c.inner;
                self.dctx = c.payload.into_dctx();
                continue;
            }
            let Some(start) = next_bundle_start(self.data, self.pos) else {
                return Ok(None);
            };
            let rest = &self.data[start..];
            if rest.starts_with(BUNDLE_MAGIC) {
                let (bundle, len) =
                    parse_plain(rest, self.count, start, |r| Blob::Borrowed(&rest[r]))?;
                for (i, e) in bundle.entries.into_iter().enumerate() {
                    if !self.filter.takes(e.is_host(), e.target()) {
                        continue;
                    }
                    self.ready.push_back(Streamed {
                        bundle: self.count,
                        range: start..start + len,
                        compressed: false,
                        entry: i,
                        triple: e.triple,
                        offset: e.offset,
                        data: e.data,
                    });
                }
                self.count += 1;
                self.pos = start + len;
            } else if rest.starts_with(CCOB_MAGIC) {
                let h = read_ccob_header(rest, self.count, start)?;
                self.pos = start + h.total as usize;
                if self.reads_whole(&h, &rest[h.header_len as usize..h.total as usize]) {
                    self.read_whole(rest, h, start)?;
                    continue;
                }
                self.ccob = Some(CcobCursor::new(
                    rest,
                    h,
                    self.count,
                    start,
                    self.dctx.take(),
                    false,
                ));
            } else {
                return Err(BundleError::BadMagic {
                    offset: start,
                    found: describe(rest),
                });
            }
        }
    }
}

/// What a zstd frame header says of the memory its decompression needs.
struct FrameWindow {
    /// The window the decoder keeps (the content size for a single-segment
    /// frame).
    window: u64,
    single_segment: bool,
    content: Option<u64>,
}

/// The window of the zstd frame at the start of `payload` (RFC 8878
/// §3.1.1.1), if it is one.
fn frame_window(payload: &[u8]) -> Option<FrameWindow> {
    let magic = payload.get(..4)?;
    if magic != [0x28, 0xb5, 0x2f, 0xfd] {
        return None;
    }
    let fhd = *payload.get(4)?;
    let single_segment = fhd & 0x20 != 0;
    let mut at = 5;
    let mut window = 0u64;
    if !single_segment {
        let wd = *payload.get(at)?;
        at += 1;
        let base = 1u64 << (10 + (wd >> 3));
        window = base + (base / 8) * u64::from(wd & 7);
    }
    at += [0, 1, 2, 4][usize::from(fhd & 3)];
    let content = match (fhd >> 6, single_segment) {
        (0, false) => None,
        (0, true) => Some(u64::from(*payload.get(at)?)),
        (1, _) => {
            let b = payload.get(at..at + 2)?;
            Some(u64::from(u16::from_le_bytes([b[0], b[1]])) + 256)
        }
        (2, _) => Some(u64::from(u32::from_le_bytes(
            payload.get(at..at + 4)?.try_into().ok()?,
        ))),
        _ => Some(u64::from_le_bytes(
            payload.get(at..at + 8)?.try_into().ok()?,
        )),
    };
    if single_segment {
        window = content?;
    }
    Some(FrameWindow {
        window,
        single_segment,
        content,
    })
}

/// A compressed bundle being read: its header, its payload as a stream,
/// and the inner bundle being handed out.
struct CcobCursor<'a> {
    header: CcobHeader,
    /// Offset of the compressed bundle in the section.
    offset: usize,
    first_index: usize,
    payload: Payload<'a>,
    /// Inner bundles read so far (their tables).
    inner: usize,
    /// End (decompressed offset) of the last inner bundle read.
    inner_end: u64,
    current: Option<Inner<'a>>,
    done: bool,
}

/// The inner bundle whose code objects are being handed out.
struct Inner<'a> {
    index: usize,
    /// Decompressed offset of its first byte.
    start: u64,
    /// Its magic and entry table, as read (an entry may overlap them).
    table: Vec<u8>,
    entries: Vec<EntryInfo>,
    /// Runs of overlapping entries to read, in offset order: (start, end)
    /// relative to the bundle, and the entries in each.
    runs: VecDeque<(u64, u64, Vec<usize>)>,
    ready: VecDeque<Streamed<'a>>,
}

impl<'a> CcobCursor<'a> {
    fn new(
        rest: &'a [u8],
        header: CcobHeader,
        first_index: usize,
        offset: usize,
        dctx: Option<DCtx<'static>>,
        hash: bool,
    ) -> Self {
        let payload = Payload::new(
            &rest[header.header_len as usize..header.total as usize],
            header.method,
            header.uncompressed,
            offset,
            dctx,
            hash,
        );
        CcobCursor {
            header,
            offset,
            first_index,
            payload,
            inner: 0,
            inner_end: 0,
            current: None,
            done: false,
        }
    }

    /// The compressed bundle's range in the section.
    fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.header.total as usize
    }

    /// What the header says, with the number of inner bundles.
    fn ccob(&self, inner_bundles: usize, hash_matches: Option<bool>) -> Ccob {
        Ccob {
            version: self.header.version,
            method: self.header.method,
            stored_size: self.header.total,
            uncompressed_size: self.header.uncompressed,
            hash: self.header.hash,
            hash_matches,
            inner_bundles,
        }
    }

    /// Whether the hash matched, if every byte was decompressed.
    fn finished_hash(&mut self) -> Option<bool> {
        if !self.done {
            return None;
        }
        self.payload
            .md5
            .take()
            .map(|m| md5_word(&m.finalize()) == self.header.hash)
    }

    /// An error inside the payload, unless decompressing the rest of it
    /// gives one first (as when the payload is decompressed whole).
    fn fail(&mut self, e: BundleError) -> BundleError {
        let e = match e {
            e @ (BundleError::Decompress { .. }
            | BundleError::SizeMismatch { .. }
            | BundleError::BadPayload { .. }) => e,
            e => BundleError::BadPayload {
                offset: self.offset,
                problem: e.to_string(),
            },
        };
        self.payload.drain().err().unwrap_or(e)
    }

    /// The next inner bundle's table (the current one's bytes skipped), or
    /// `None` after the last, once the payload was checked to end there.
    fn next_bundle(&mut self) -> Result<Option<BundleInfo>, BundleError> {
        match self.read_next_bundle() {
            Ok(b) => Ok(b),
            Err(e) => Err(self.fail(e)),
        }
    }

    fn read_next_bundle(&mut self) -> Result<Option<BundleInfo>, BundleError> {
        if self.done {
            return Ok(None);
        }
        self.payload.skip_to(self.inner_end)?;
        self.current = None;
        // Zero padding between inner bundles.
        loop {
            match self.payload.peek(1)?.first() {
                Some(0) => self.payload.skip(1)?,
                Some(_) => break,
                None => {
                    self.payload.finish()?;
                    if self.inner == 0 {
                        return Err(BundleError::BadPayload {
                            offset: self.offset,
                            problem: "empty".into(),
                        });
                    }
                    self.done = true;
                    return Ok(None);
                }
            }
        }
        let start = self.payload.pos;
        let head = self.payload.peek(BUNDLE_MAGIC.len())?;
        if !head.starts_with(BUNDLE_MAGIC) {
            return Err(BundleError::BadPayload {
                offset: self.offset,
                problem: format!(
                    "not an uncompressed bundle at decompressed offset {start:#x} ({})",
                    describe(head)
                ),
            });
        }
        let index = self.first_index + self.inner;
        self.payload.record = Some(Vec::new());
        let raw = read_entry_table(&mut PayloadTable {
            payload: &mut self.payload,
            bundle: index,
            offset: self.offset,
        });
        let table = self.payload.record.take().unwrap_or_default();
        let have = self.payload.expected - start;
        let (entries, len) = check_entries(raw?, table.len() as u64, have, index, self.offset)?;
        self.inner += 1;
        self.inner_end = start + len;
        let info = BundleInfo {
            index,
            range: 0..0,
            compressed: None,
            entries,
        };
        self.current = Some(Inner {
            index,
            start,
            table,
            entries: info.entries.clone(),
            runs: VecDeque::new(),
            ready: VecDeque::new(),
        });
        Ok(Some(info))
    }

    /// The next kept code object of this compressed bundle.
    fn next_code_object(
        &mut self,
        filter: &Filter<'_>,
    ) -> Result<Option<Streamed<'a>>, BundleError> {
        loop {
            if let Some(cur) = self.current.as_mut() {
                if let Some(s) = cur.ready.pop_front() {
                    return Ok(Some(s));
                }
                if let Some(run) = cur.runs.pop_front() {
                    if let Err(e) = self.read_run(run) {
                        return Err(self.fail(e));
                    }
                    continue;
                }
            }
            let Some(_) = self.next_bundle()? else {
                return Ok(None);
            };
            let range = self.range();
            let cur = self.current.as_mut().expect("the bundle just read");
            cur.plan(filter, range);
        }
    }

    /// Read one run of entries and queue them.
    fn read_run(&mut self, (lo, hi, members): (u64, u64, Vec<usize>)) -> Result<(), BundleError> {
        let cur = self.current.as_mut().expect("a bundle");
        let len = (hi - lo) as usize;
        let mut buf: Arc<[u8]> = std::iter::repeat_n(0u8, len).collect();
        {
            let dst = Arc::get_mut(&mut buf).expect("not shared yet");
            let abs = cur.start + lo;
            // The part inside the entry table was read already.
            let mut filled = 0;
            if abs < self.payload.pos {
                let from = (abs - cur.start) as usize;
                let n = (cur.table.len() - from).min(len);
                dst[..n].copy_from_slice(&cur.table[from..from + n]);
                filled = n;
            }
            self.payload.skip_to(abs + filled as u64)?;
            self.payload.read_exact(&mut dst[filled..])?;
        }
        let range = self.range();
        let cur = self.current.as_mut().expect("a bundle");
        for i in members {
            let e = &cur.entries[i];
            let from = (e.offset - lo) as usize;
            cur.ready.push_back(Streamed {
                bundle: cur.index,
                range: range.clone(),
                compressed: true,
                entry: i,
                triple: e.triple.clone(),
                offset: e.offset,
                data: Blob::Shared(buf.clone(), from..from + e.size as usize),
            });
        }
        Ok(())
    }
}

impl Inner<'_> {
    /// The runs of entries to read (those `filter` takes), in offset
    /// order; empty entries are handed out at once.
    fn plan(&mut self, filter: &Filter<'_>, range: Range<usize>) {
        let mut order: Vec<usize> = (0..self.entries.len())
            .filter(|&i| {
                let e = &self.entries[i];
                filter.takes(e.is_host(), e.target())
            })
            .collect();
        order.sort_by_key(|&i| (self.entries[i].offset, i));
        for i in order {
            let e = &self.entries[i];
            if e.size == 0 {
                self.ready.push_back(Streamed {
                    bundle: self.index,
                    range: range.clone(),
                    compressed: true,
                    entry: i,
                    triple: e.triple.clone(),
                    offset: e.offset,
                    data: Blob::Borrowed(&[]),
                });
                continue;
            }
            let (lo, hi) = (e.offset, e.offset + e.size);
            match self.runs.back_mut() {
                Some(run) if lo < run.1 => {
                    run.1 = run.1.max(hi);
                    run.2.push(i);
                }
                _ => self.runs.push_back((lo, hi, vec![i])),
            }
        }
    }
}

/// An entry table read from a payload.
struct PayloadTable<'p, 'a> {
    payload: &'p mut Payload<'a>,
    bundle: usize,
    offset: usize,
}

impl TableSource for PayloadTable<'_, '_> {
    fn take(&mut self, n: u64, field: &'static str) -> Result<&[u8], BundleError> {
        let have = self.left();
        if n > have {
            return Err(BundleError::Truncated {
                bundle: self.bundle,
                offset: self.offset,
                field,
                need: n,
                have,
            });
        }
        self.payload.take(n as usize)
    }

    fn left(&self) -> u64 {
        self.payload.expected - self.payload.pos
    }

    fn place(&self) -> (usize, usize) {
        (self.bundle, self.offset)
    }
}

/// The decompressor of a payload.
enum Inflate<'a> {
    Zstd {
        dctx: DCtx<'static>,
        input: &'a [u8],
        pos: usize,
        /// Inside a frame (its end not reached yet).
        in_frame: bool,
    },
    Zlib(Box<flate2::read::ZlibDecoder<&'a [u8]>>),
}

impl Inflate<'_> {
    /// Up to `out.len()` more decompressed bytes; 0 at the end.
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let Inflate::Zstd {
            dctx,
            input,
            pos,
            in_frame,
        } = self
        else {
            let Inflate::Zlib(z) = self else {
                unreachable!()
            };
            return z.read(out);
        };
        if out.is_empty() {
            return Ok(0);
        }
        loop {
            if *pos == input.len() && !*in_frame {
                return Ok(0);
            }
            let mut ob = OutBuffer::around(&mut *out);
            let mut ib = InBuffer::around(&input[*pos..]);
            let hint = dctx
                .decompress_stream(&mut ob, &mut ib)
                .map_err(|code| std::io::Error::other(get_error_name(code)))?;
            *pos += ib.pos();
            *in_frame = hint != 0;
            let produced = ob.pos();
            if produced > 0 {
                return Ok(produced);
            }
            if ib.pos() == 0 && *in_frame {
                // Nothing consumed, nothing produced: the frame is cut off.
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "incomplete frame",
                ));
            }
        }
    }
}

/// A CCOB payload, decompressed on demand, never past the size its header
/// states; bytes come out in order through a small look-ahead buffer.
struct Payload<'a> {
    inflate: Inflate<'a>,
    method: Method,
    /// The CCOB's offset (for errors).
    offset: usize,
    /// The uncompressed size the header states.
    expected: u64,
    /// Decompressed offset of the next byte handed out.
    pos: u64,
    /// Bytes the decompressor produced (handed out or in `buf`).
    produced: u64,
    buf: Vec<u8>,
    /// `buf[head..]` is decompressed and not handed out yet.
    head: usize,
    md5: Option<Md5>,
    /// Bytes handed out are copied here while it is set.
    record: Option<Vec<u8>>,
}

impl<'a> Payload<'a> {
    fn new(
        input: &'a [u8],
        method: Method,
        expected: u64,
        offset: usize,
        dctx: Option<DCtx<'static>>,
        hash: bool,
    ) -> Self {
        let inflate = match method {
            Method::Zstd => {
                let mut dctx = dctx.unwrap_or_else(DCtx::create);
                // A context reused after an error may hold a frame's state.
                let _ = dctx.reset(ResetDirective::SessionOnly);
                Inflate::Zstd {
                    dctx,
                    input,
                    pos: 0,
                    in_frame: false,
                }
            }
            Method::Zlib => Inflate::Zlib(Box::new(flate2::read::ZlibDecoder::new(input))),
        };
        Payload {
            inflate,
            method,
            offset,
            expected,
            pos: 0,
            produced: 0,
            buf: Vec::new(),
            head: 0,
            md5: hash.then(Md5::new),
            record: None,
        }
    }

    /// Compressed bytes consumed so far.
    fn input_pos(&self) -> usize {
        match &self.inflate {
            Inflate::Zstd { pos, .. } => *pos,
            Inflate::Zlib(z) => z.total_in() as usize,
        }
    }

    fn into_dctx(self) -> Option<DCtx<'static>> {
        match self.inflate {
            Inflate::Zstd { dctx, .. } => Some(dctx),
            Inflate::Zlib(_) => None,
        }
    }

    fn fail(&self, e: std::io::Error) -> BundleError {
        BundleError::Decompress {
            offset: self.offset,
            method: self.method,
            message: e.to_string(),
        }
    }

    fn short(&self) -> BundleError {
        BundleError::SizeMismatch {
            offset: self.offset,
            expected: self.expected,
            actual: self.produced,
        }
    }

    /// Decompress into `out`, at most `limit` bytes more than `produced`
    /// allows past `expected` + 1; returns how many came.
    fn inflate_into(&mut self, out: &mut [u8]) -> Result<usize, BundleError> {
        // Never more than one byte past the stated size.
        let room = (self.expected + 1).saturating_sub(self.produced);
        let n = out.len().min(room.min(usize::MAX as u64) as usize);
        if n == 0 {
            return Ok(0);
        }
        let got = self.inflate.read(&mut out[..n]).map_err(|e| self.fail(e))?;
        if let Some(m) = self.md5.as_mut() {
            // The byte past the stated size never counts: it is an error.
            let counted = (self.expected.saturating_sub(self.produced) as usize).min(got);
            m.update(&out[..counted]);
        }
        self.produced += got as u64;
        if self.produced > self.expected {
            return Err(BundleError::SizeMismatch {
                offset: self.offset,
                expected: self.expected,
                actual: self.produced,
            });
        }
        Ok(got)
    }

    /// The next `n` bytes without handing them out (fewer at the end of
    /// the stated size).
    fn peek(&mut self, n: usize) -> Result<&[u8], BundleError> {
        let n = n.min((self.expected - self.pos) as usize);
        if self.buf.len() - self.head < n {
            self.buf.drain(..self.head);
            self.head = 0;
            // The buffer grows with the data the stream actually gives (a
            // lying length in an entry table cannot make it allocate).
            let cap = n.max(LOOKAHEAD);
            while self.buf.len() < n {
                let have = self.buf.len();
                let want = (have + LOOKAHEAD).max(have.saturating_mul(2)).min(cap);
                self.buf.resize(want, 0);
                let got = self.inflate_into_buf(have)?;
                self.buf.truncate(have + got);
                if got == 0 {
                    return Err(self.short());
                }
            }
        }
        Ok(&self.buf[self.head..self.head + n])
    }

    fn inflate_into_buf(&mut self, from: usize) -> Result<usize, BundleError> {
        let mut buf = std::mem::take(&mut self.buf);
        let r = self.inflate_into(&mut buf[from..]);
        self.buf = buf;
        r
    }

    /// Hand out the next `n` bytes (all within the stated size).
    fn take(&mut self, n: usize) -> Result<&[u8], BundleError> {
        self.peek(n)?;
        let (from, to) = (self.head, self.head + n);
        self.head = to;
        self.pos += n as u64;
        if let Some(r) = self.record.as_mut() {
            r.extend_from_slice(&self.buf[from..to]);
        }
        Ok(&self.buf[from..to])
    }

    /// Skip `n` bytes.
    fn skip(&mut self, n: u64) -> Result<(), BundleError> {
        let mut left = n;
        while left > 0 {
            let step = left.min(LOOKAHEAD as u64) as usize;
            self.take(step)?;
            left -= step as u64;
        }
        Ok(())
    }

    /// Skip to decompressed offset `to` (at or after the current one).
    fn skip_to(&mut self, to: u64) -> Result<(), BundleError> {
        self.skip(to.saturating_sub(self.pos))
    }

    /// Fill `out` with the next bytes.
    fn read_exact(&mut self, out: &mut [u8]) -> Result<(), BundleError> {
        let buffered = (self.buf.len() - self.head).min(out.len());
        out[..buffered].copy_from_slice(&self.buf[self.head..self.head + buffered]);
        self.head += buffered;
        let mut filled = buffered;
        while filled < out.len() {
            let got = self.inflate_into(&mut out[filled..])?;
            if got == 0 {
                return Err(self.short());
            }
            filled += got;
        }
        self.pos += out.len() as u64;
        Ok(())
    }

    /// At the stated size: check that the payload ends there.
    fn finish(&mut self) -> Result<(), BundleError> {
        debug_assert_eq!(self.pos, self.expected);
        let mut one = [0u8; 1];
        if self.produced == self.expected {
            self.inflate_into(&mut one)?;
        }
        Ok(())
    }

    /// Decompress the rest, discarding it: an error it gives, if any.
    fn drain(&mut self) -> Result<(), BundleError> {
        self.record = None;
        let mut scratch = vec![0u8; LOOKAHEAD];
        loop {
            if self.inflate_into(&mut scratch)? == 0 {
                break;
            }
        }
        if self.produced != self.expected {
            return Err(self.short());
        }
        Ok(())
    }
}

/// Decompress a whole payload (exactly `expected` bytes).
pub(crate) fn decompress_all(
    input: &[u8],
    method: Method,
    expected: u64,
    offset: usize,
) -> Result<Vec<u8>, BundleError> {
    let mut p = Payload::new(input, method, expected, offset, None, false);
    // A lying header cannot make us allocate: the buffer grows with the
    // data actually produced.
    let mut out = Vec::with_capacity(expected.min(64 << 20) as usize);
    loop {
        let have = out.len();
        let want = (have + LOOKAHEAD).max(have * 2).min(expected as usize + 1);
        out.resize(want.max(have + 1), 0);
        let got = p.inflate_into(&mut out[have..])?;
        out.truncate(have + got);
        if got == 0 {
            break;
        }
    }
    if p.produced != expected {
        return Err(p.short());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuzzing::stream_agrees;
    use crate::{compress_bundle_at, parse_fatbin, write_bundle};

    /// A small deterministic generator (xorshift).
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n.max(1)
        }
        fn bytes(&mut self, n: usize) -> Vec<u8> {
            // Compressible: runs of a few values.
            let mut v = Vec::with_capacity(n);
            while v.len() < n {
                let b = self.below(4) as u8 * 0x41;
                let run = 1 + self.below(40) as usize;
                v.extend(std::iter::repeat_n(b, run.min(n - v.len())));
            }
            v
        }
    }

    const TARGETS: &[&str] = &[
        "gfx1100",
        "gfx942:sramecc+:xnack-",
        "gfx90a",
        "gfx906:xnack-",
        "gfx1030",
    ];

    /// One plain bundle: a host entry and some device entries, laid out
    /// by `write_bundle` or by hand (overlaps, entries inside the table).
    fn plain(r: &mut Rng, big: bool) -> Vec<u8> {
        let n = 1 + r.below(4) as usize;
        let mut datas = Vec::new();
        for _ in 0..n {
            let size = if big && datas.is_empty() {
                (LIST_CHECK_LIMIT as usize) + r.below(50_000) as usize
            } else {
                r.below(3000) as usize
            };
            datas.push(r.bytes(size));
        }
        let mut entries: Vec<(String, &[u8])> = vec![("host-x86_64-unknown-linux--".into(), &[])];
        let start = r.below(TARGETS.len() as u64) as usize;
        for (i, d) in datas.iter().enumerate() {
            let t = TARGETS[(start + i) % TARGETS.len()];
            entries.push((format!("hipv4-amdgcn-amd-amdhsa--{t}"), d));
        }
        let refs: Vec<(&str, &[u8])> = entries.iter().map(|(t, d)| (t.as_str(), *d)).collect();
        let align = [1, 8, 4096][r.below(3) as usize];
        let mut b = write_bundle(&refs, align);
        match r.below(6) {
            // Entry 1 (first device entry) at the same offset as entry 2,
            // no longer than it (its old bytes lie before entry 2's).
            0 if refs.len() > 2 => {
                let e1 = 32 + 24 + refs[0].0.len();
                let e2 = e1 + 24 + refs[1].0.len();
                let off2 = b[e2..e2 + 8].to_vec();
                b[e1..e1 + 8].copy_from_slice(&off2);
                let size = refs[1].1.len().min(refs[2].1.len()) as u64;
                b[e1 + 8..e1 + 16].copy_from_slice(&size.to_le_bytes());
            }
            // Entry 1 starting inside the table.
            1 if refs.len() > 2 => {
                let e1 = 32 + 24 + refs[0].0.len();
                let size = u64::from_le_bytes(b[e1 + 8..e1 + 16].try_into().unwrap());
                let off = r.below(40).min((b.len() as u64).saturating_sub(size));
                b[e1..e1 + 8].copy_from_slice(&off.to_le_bytes());
            }
            _ => {}
        }
        b
    }

    fn ccob(r: &mut Rng, inner: &[u8], last: bool) -> Vec<u8> {
        let version = if last {
            1 + r.below(3) as u16
        } else {
            2 + r.below(2) as u16
        };
        let method = if r.below(4) == 0 {
            Method::Zlib
        } else {
            Method::Zstd
        };
        let mut c = compress_bundle_at(inner, version, method, 1 + r.below(3) as i32).unwrap();
        if method == Method::Zstd && version == 3 && r.below(4) == 0 {
            // Two frames back to back in one payload.
            let cut = r.below(inner.len() as u64 + 1) as usize;
            let mut payload = zstd::bulk::compress(&inner[..cut], 1).unwrap();
            payload.extend(zstd::bulk::compress(&inner[cut..], 1).unwrap());
            c.truncate(32);
            c[8..16].copy_from_slice(&(32 + payload.len() as u64).to_le_bytes());
            c.extend(payload);
        }
        c
    }

    /// A section: plain and compressed bundles, zero padding between.
    fn section(r: &mut Rng, big: bool) -> Vec<u8> {
        let n = 1 + r.below(3);
        let mut out = Vec::new();
        for i in 0..n {
            let last = i + 1 == n;
            out.extend(std::iter::repeat_n(0u8, r.below(3) as usize * 7));
            if r.below(3) == 0 {
                out.extend(plain(r, false));
            } else {
                let mut inner = Vec::new();
                for k in 0..1 + r.below(3) {
                    if k > 0 {
                        inner.extend(std::iter::repeat_n(0u8, r.below(2) as usize * 9));
                    }
                    inner.extend(plain(r, big && k == 0));
                }
                if r.below(5) == 0 {
                    inner.extend([0u8; 5]);
                }
                out.extend(ccob(r, &inner, last));
            }
        }
        out
    }

    fn mutate(r: &mut Rng, mut d: Vec<u8>) -> Vec<u8> {
        match r.below(4) {
            0 => {
                let cut = r.below(d.len() as u64) as usize;
                d.truncate(cut);
            }
            1 => {
                for _ in 0..1 + r.below(3) {
                    let at = r.below(d.len() as u64) as usize;
                    d[at] ^= 1 << r.below(8);
                }
            }
            2 => {
                // A header field of a compressed bundle.
                if let Some(at) = d.windows(4).position(|w| w == CCOB_MAGIC) {
                    let f = at + 4 + r.below(28) as usize;
                    if f < d.len() {
                        d[f] = d[f].wrapping_add(1 + r.below(3) as u8);
                    }
                }
            }
            _ => {
                let at = r.below(d.len() as u64) as usize;
                let n = r.below(64) as usize;
                let junk = r.bytes(n);
                d.splice(at..at, junk);
            }
        }
        d
    }

    #[test]
    fn streaming_and_listing_agree_with_parsing_on_generated_sections() {
        let mut r = Rng(0x9e37_79b9_7f4a_7c15);
        let (mut ok, mut bad) = (0, 0);
        for _ in 0..1500 {
            let d = section(&mut r, false);
            if let Err(e) = parse_fatbin(&d) {
                panic!("generated section does not parse: {e}");
            }
            stream_agrees(&d);
            let m = mutate(&mut r, d);
            match parse_fatbin(&m) {
                Ok(_) => ok += 1,
                Err(_) => bad += 1,
            }
            stream_agrees(&m);
        }
        // The mutations reach both outcomes.
        assert!(ok > 50 && bad > 500, "{ok} parsed, {bad} rejected");
    }

    /// Inputs the `bundle_stream` fuzz target found (fuzz/regressions/).
    #[test]
    fn fuzz_regressions_agree() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fuzz/regressions/bundle_stream");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            stream_agrees(&std::fs::read(e.unwrap().path()).unwrap());
            n += 1;
        }
        assert!(n > 0, "no regressions in {}", dir.display());
    }

    #[test]
    fn large_compressed_bundles_are_listed_from_their_tables() {
        let mut r = Rng(0x2545_f491_4f6c_dd1d);
        for _ in 0..12 {
            let d = section(&mut r, true);
            stream_agrees(&d);
            stream_agrees(&mutate(&mut r, d));
        }
    }

    #[test]
    fn listing_a_large_bundle_decompresses_only_its_table() {
        let mut r = Rng(7);
        let inner = plain(&mut r, true);
        let mut c = compress_bundle_at(&inner, 3, Method::Zstd, 3).unwrap();
        // Damage the end of the payload: listing does not see it, reading
        // the code objects does, after the tables.
        let n = c.len();
        c[n - 20..n - 4].iter_mut().for_each(|b| *b ^= 0x5a);
        let listed = list_fatbin(&c).unwrap();
        assert_eq!(listed.len(), 1);
        let (ccob, _) = listed[0].compressed.as_ref().unwrap();
        assert_eq!((ccob.hash_matches, ccob.inner_bundles), (None, 1));
        let err = check_fatbin(&c).unwrap_err();
        assert!(matches!(err, BundleError::Decompress { .. }), "{err}");
        let mut s = FatbinStream::new(&c);
        let err = loop {
            match s.next() {
                Ok(Some(_)) => {}
                Ok(None) => panic!("damage not seen"),
                Err(e) => break e,
            }
        };
        assert_eq!(err.to_string(), parse_fatbin(&c).unwrap_err().to_string());
    }
}
