//! Listing a fat binary from its headers and entry tables, decompressing
//! a compressed bundle only as far as needed ([`list_fatbin`]) or to the
//! end, a window at a time ([`check_fatbin`]).

use std::sync::Arc;

use super::ccob::{parse_ccob, read_ccob_header};
use super::cursor::CcobCursor;
use super::table::plain_table;
use super::{describe, next_bundle_start, BundleInfo};
use crate::{BundleError, BUNDLE_MAGIC, CCOB_MAGIC};

/// [`list_fatbin`] decompresses a compressed bundle whole (checking its
/// size and hash) when it is at most this large uncompressed; a larger one
/// is listed from its entry tables.
pub const LIST_CHECK_LIMIT: u64 = 1 << 20;

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
