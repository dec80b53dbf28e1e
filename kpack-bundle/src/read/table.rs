//! Entry tables: read from a slice or a decompressing stream
//! ([`TableSource`]), every entry checked.

use std::ops::Range;

use kpack_format::target::{is_host_triple, target_of_triple};

use super::{Blob, Bundle, Entry, EntryInfo};
use crate::{BundleError, BUNDLE_MAGIC};

pub(super) struct Reader<'d> {
    pub(super) data: &'d [u8],
    pub(super) pos: usize,
    bundle: usize,
    pub(super) offset: usize,
}

impl<'d> Reader<'d> {
    /// A reader of `data` from its start, whose errors name bundle
    /// `bundle` at `offset`.
    pub(super) fn new(data: &'d [u8], bundle: usize, offset: usize) -> Self {
        Reader {
            data,
            pos: 0,
            bundle,
            offset,
        }
    }

    pub(super) fn take(&mut self, n: u64, field: &'static str) -> Result<&'d [u8], BundleError> {
        let have = (self.data.len() - self.pos) as u64;
        if n > have {
            return Err(BundleError::Truncated {
                bundle: self.bundle,
                offset: self.offset,
                field,
                need: n,
                have,
            });
        }
        let s = &self.data[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    pub(super) fn u16(&mut self, field: &'static str) -> Result<u16, BundleError> {
        Ok(u16::from_le_bytes(
            self.take(2, field)?.try_into().expect("2 bytes"),
        ))
    }

    pub(super) fn u32(&mut self, field: &'static str) -> Result<u64, BundleError> {
        Ok(u64::from(u32::from_le_bytes(
            self.take(4, field)?.try_into().expect("4 bytes"),
        )))
    }

    pub(super) fn u64(&mut self, field: &'static str) -> Result<u64, BundleError> {
        Ok(u64::from_le_bytes(
            self.take(8, field)?.try_into().expect("8 bytes"),
        ))
    }
}

/// Parse one uncompressed bundle at the start of `data`. Returns the bundle
/// (range relative to `data`) and its length.
pub(super) fn parse_plain<'a>(
    data: &[u8],
    index: usize,
    offset: usize,
    blob: impl Fn(Range<usize>) -> Blob<'a>,
) -> Result<(Bundle<'a>, usize), BundleError> {
    let (infos, len) = plain_table(data, index, offset)?;
    let entries = infos
        .into_iter()
        .map(|e| {
            let data = blob(e.offset as usize..(e.offset + e.size) as usize);
            Entry {
                triple: e.triple,
                offset: e.offset,
                data,
            }
        })
        .collect();
    let bundle = Bundle {
        index,
        range: 0..len,
        compressed: None,
        entries,
    };
    Ok((bundle, len))
}

/// The checked entry table of the uncompressed bundle at the start of
/// `data`, and the bundle's length.
pub(super) fn plain_table(
    data: &[u8],
    index: usize,
    offset: usize,
) -> Result<(Vec<EntryInfo>, usize), BundleError> {
    let mut r = Reader::new(data, index, offset);
    let raw = read_entry_table(&mut r)?;
    let table_len = r.pos as u64;
    let (entries, end) = check_entries(raw, table_len, data.len() as u64, index, offset)?;
    Ok((entries, end as usize))
}

/// Check a bundle's raw entries against the `have` bytes the bundle can
/// span (from its first byte); returns them and the bundle's length: it
/// ends after its table or its last entry's data, whichever is later.
pub(super) fn check_entries(
    raw: Vec<(String, u64, u64)>,
    table_len: u64,
    have: u64,
    index: usize,
    offset: usize,
) -> Result<(Vec<EntryInfo>, u64), BundleError> {
    let mut end = table_len;
    let mut entries: Vec<EntryInfo> = Vec::with_capacity(raw.len());
    for (entry, (triple, start, size)) in raw.into_iter().enumerate() {
        let stop = check_entry(have, index, offset, entry, &triple, start, size, &entries)?;
        end = end.max(stop);
        entries.push(EntryInfo {
            triple,
            offset: start,
            size,
        });
    }
    Ok((entries, end))
}

/// Bytes an entry table is read from: a slice ([`Reader`]) or a
/// decompressing stream. `take` hands out the next `n` bytes (valid until
/// the next call), or says what is missing.
pub(super) trait TableSource {
    fn take(&mut self, n: u64, field: &'static str) -> Result<&[u8], BundleError>;
    /// Bytes left from the current position.
    fn left(&self) -> u64;
    /// The bundle index and offset errors name.
    fn place(&self) -> (usize, usize);

    fn u64(&mut self, field: &'static str) -> Result<u64, BundleError> {
        Ok(u64::from_le_bytes(
            self.take(8, field)?.try_into().expect("8 bytes"),
        ))
    }
}

impl TableSource for Reader<'_> {
    fn take(&mut self, n: u64, field: &'static str) -> Result<&[u8], BundleError> {
        Reader::take(self, n, field)
    }

    fn left(&self) -> u64 {
        (self.data.len() - self.pos) as u64
    }

    fn place(&self) -> (usize, usize) {
        (self.bundle, self.offset)
    }
}

/// The magic, the entry count and the entries: (triple, offset, size).
pub(super) fn read_entry_table(
    r: &mut impl TableSource,
) -> Result<Vec<(String, u64, u64)>, BundleError> {
    let (index, offset) = r.place();
    r.take(BUNDLE_MAGIC.len() as u64, "magic")?;
    let count = r.u64("entry count")?;
    let have = r.left();
    // Each entry needs at least three u64 fields.
    if count > have / 24 {
        return Err(BundleError::TooManyEntries {
            bundle: index,
            offset,
            count,
            have,
        });
    }
    let mut raw = Vec::with_capacity(count as usize);
    for entry in 0..count as usize {
        let start = r.u64("entry offset")?;
        let size = r.u64("entry size")?;
        let triple_len = r.u64("entry triple length")?;
        let triple = r.take(triple_len, "entry triple")?;
        let triple = std::str::from_utf8(triple)
            .ok()
            .filter(|t| t.is_ascii())
            .ok_or(BundleError::BadTriple {
                bundle: index,
                offset,
                entry,
            })?;
        raw.push((triple.to_string(), start, size));
    }
    Ok(raw)
}

/// Check one entry against the data and the entries before it; returns
/// the end of its data.
#[allow(clippy::too_many_arguments)]
fn check_entry(
    have: u64,
    bundle: usize,
    offset: usize,
    entry: usize,
    triple: &str,
    start: u64,
    size: u64,
    before: &[EntryInfo],
) -> Result<u64, BundleError> {
    let Some(stop) = start.checked_add(size).filter(|&s| s <= have) else {
        return Err(BundleError::EntryOutOfRange {
            bundle,
            offset,
            entry,
            triple: triple.into(),
            start,
            size,
            have,
        });
    };
    if is_host_triple(triple) {
        return Ok(stop);
    }
    // Targets name files and directories (archives, artifacts, extracted
    // code objects): nothing but target-ID characters, so that no triple
    // can name a path outside where they are written.
    let target = target_of_triple(triple);
    if !is_target_name(target) {
        return Err(BundleError::BadTarget {
            bundle,
            offset,
            entry,
            target: target.into(),
            triple: triple.into(),
        });
    }
    if before.iter().any(|e| !e.is_host() && e.target() == target) {
        return Err(BundleError::DuplicateTarget {
            bundle,
            offset,
            target: target.into(),
        });
    }
    Ok(stop)
}

/// Can `t` be a device entry's target? Non-empty, and only the characters
/// of target IDs (`gfx90a:xnack+`, `gfx9-4-generic`) and offload
/// architecture names such as `amdgcnspirv`.
fn is_target_name(t: &str) -> bool {
    !t.is_empty()
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b':' | b'+' | b'-'))
}
