//! A compressed bundle read as a stream: its inner bundles' tables, then
//! their kept code objects in offset order.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;

use md5::Digest;
use zstd::zstd_safe::DCtx;

use super::ccob::CcobHeader;
use super::payload::Payload;
use super::streamed::{Filter, Streamed};
use super::table::{check_entries, read_entry_table, TableSource};
use super::{describe, Blob, BundleInfo, Ccob, EntryInfo};
use crate::{md5_word, BundleError, BUNDLE_MAGIC};

/// A compressed bundle being read: its header, its payload as a stream,
/// and the inner bundle being handed out.
pub(super) struct CcobCursor<'a> {
    pub(super) header: CcobHeader,
    /// Offset of the compressed bundle in the section.
    pub(super) offset: usize,
    pub(super) first_index: usize,
    pub(super) payload: Payload<'a>,
    /// Inner bundles read so far (their tables).
    pub(super) inner: usize,
    /// End (decompressed offset) of the last inner bundle read.
    pub(super) inner_end: u64,
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
    pub(super) fn new(
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
    pub(super) fn ccob(&self, inner_bundles: usize, hash_matches: Option<bool>) -> Ccob {
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
    pub(super) fn finished_hash(&mut self) -> Option<bool> {
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
    pub(super) fn next_bundle(&mut self) -> Result<Option<BundleInfo>, BundleError> {
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
    pub(super) fn next_code_object(
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
