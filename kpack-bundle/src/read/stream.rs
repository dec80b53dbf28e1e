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
use std::sync::Arc;

use zstd::zstd_safe::DCtx;

use super::ccob::{inner_bundles_of, read_ccob_header, CcobHeader};
use super::cursor::CcobCursor;
use super::payload::{decompress_all, Payload, LOOKAHEAD};
use super::streamed::{Filter, Streamed};
use super::table::parse_plain;
use super::{describe, next_bundle_start, Blob};
use crate::{BundleError, Method, BUNDLE_MAGIC, CCOB_MAGIC};

/// [`FatbinStream`] decompresses a compressed bundle whole, into one
/// buffer its code objects share, when its zstd frame's window is its whole
/// content (a single-segment frame: what clang's long-distance matching
/// makes of bundles up to 128 MiB) and it is at most this large: the
/// decompressor would hold a window that large anyway, and the code
/// objects are not copied out of it. Other compressed bundles are read as
/// a stream, each code object copied out of the decompressor's window.
pub const WHOLE_LIMIT: u64 = 128 << 20;

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
        let inner = inner_bundles_of(buf, len, self.count, start)?;
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
