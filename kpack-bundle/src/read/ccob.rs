//! Compressed bundles (CCOB v1/v2/v3): the header, and the payload
//! decompressed whole.

use std::sync::Arc;

use md5::{Digest, Md5};

use super::payload::decompress_all;
use super::table::{parse_plain, Reader};
use super::{describe, Blob, Bundle, Ccob};
use crate::{md5_word, BundleError, Method, BUNDLE_MAGIC, MAX_UNCOMPRESSED};

/// A CCOB header, read.
pub(super) struct CcobHeader {
    pub(crate) version: u16,
    pub(crate) method: Method,
    /// Header and payload (v1: the rest of the data).
    pub(crate) total: u64,
    pub(crate) uncompressed: u64,
    pub(crate) hash: u64,
    pub(crate) header_len: u64,
}

/// Parse a compressed bundle at the start of `data`: its inner bundles and
/// the stored length.
pub(super) fn parse_ccob(
    data: &[u8],
    first_index: usize,
    offset: usize,
) -> Result<(Vec<Bundle<'static>>, usize), BundleError> {
    let h = read_ccob_header(data, first_index, offset)?;
    let payload = &data[h.header_len as usize..h.total as usize];
    let decompressed = decompress_all(payload, h.method, h.uncompressed, offset)?;
    let digest = Md5::digest(&decompressed);
    let hash_matches = Some(md5_word(&digest) == h.hash);
    let mut inner = inner_bundles(Arc::from(decompressed), first_index, offset)?;
    let info = Arc::new(Ccob {
        version: h.version,
        method: h.method,
        stored_size: h.total,
        uncompressed_size: h.uncompressed,
        hash: h.hash,
        hash_matches,
        inner_bundles: inner.len(),
    });
    for (i, b) in inner.iter_mut().enumerate() {
        b.compressed = Some((info.clone(), i));
    }
    Ok((inner, h.total as usize))
}

/// The header of every CCOB version, checked against the data.
pub(super) fn read_ccob_header(
    data: &[u8],
    first_index: usize,
    offset: usize,
) -> Result<CcobHeader, BundleError> {
    let mut r = Reader::new(data, first_index, offset);
    r.take(4, "CCOB magic")?;
    let version = r.u16("CCOB version")?;
    let method_raw = r.u16("CCOB compression method")?;
    let (total, uncompressed, hash) = read_ccob_sizes(&mut r, version)?;
    let h = CcobHeader {
        version,
        method: ccob_method(method_raw, offset)?,
        total,
        uncompressed,
        hash,
        header_len: r.pos as u64,
    };
    check_ccob_sizes(&h, data.len() as u64, offset)?;
    Ok(h)
}

/// The fields after a CCOB's version and method, as `(total, uncompressed,
/// hash)`: v1 stores no total size (it is the rest of the data), v2 stores
/// 32-bit sizes and v3 64-bit ones.
fn read_ccob_sizes(r: &mut Reader, version: u16) -> Result<(u64, u64, u64), BundleError> {
    match version {
        1 => {
            let u = r.u32("CCOB uncompressed size")?;
            Ok((r.data.len() as u64, u, r.u64("CCOB hash")?))
        }
        2 => {
            let t = r.u32("CCOB total size")?;
            let u = r.u32("CCOB uncompressed size")?;
            Ok((t, u, r.u64("CCOB hash")?))
        }
        3 => {
            let t = r.u64("CCOB total size")?;
            let u = r.u64("CCOB uncompressed size")?;
            Ok((t, u, r.u64("CCOB hash")?))
        }
        v => Err(BundleError::UnsupportedVersion {
            offset: r.offset,
            version: v,
        }),
    }
}

/// A CCOB's compression method from its stored number.
fn ccob_method(raw: u16, offset: usize) -> Result<Method, BundleError> {
    Method::from_code(raw).ok_or(BundleError::UnsupportedMethod {
        offset,
        method: raw,
    })
}

/// Check a CCOB header's sizes against the `have` bytes of data: the total
/// size must cover the header and fit in the data, and the uncompressed
/// size must be at most [`MAX_UNCOMPRESSED`].
fn check_ccob_sizes(h: &CcobHeader, have: u64, offset: usize) -> Result<(), BundleError> {
    let bad_total = |problem| BundleError::BadTotalSize {
        offset,
        total: h.total,
        have,
        problem,
    };
    if h.total < h.header_len {
        return Err(bad_total("smaller than the header"));
    }
    if h.total > have {
        return Err(bad_total("past the end of the data"));
    }
    if h.uncompressed > MAX_UNCOMPRESSED {
        return Err(BundleError::TooLarge {
            offset,
            size: h.uncompressed,
            limit: MAX_UNCOMPRESSED,
        });
    }
    Ok(())
}

/// The plain bundles the decompressed data of a CCOB holds (zero padding
/// allowed between them), numbered from `first_index`.
fn inner_bundles(
    buf: Arc<[u8]>,
    first_index: usize,
    offset: usize,
) -> Result<Vec<Bundle<'static>>, BundleError> {
    let len = buf.len();
    inner_bundles_of(buf, len, first_index, offset)
}

/// [`inner_bundles`] of the first `len` bytes of `buf` (a reused buffer may
/// be longer than the data in it).
pub(super) fn inner_bundles_of(
    buf: Arc<[u8]>,
    len: usize,
    first_index: usize,
    offset: usize,
) -> Result<Vec<Bundle<'static>>, BundleError> {
    let bad = |problem: String| BundleError::BadPayload { offset, problem };
    let data = &buf[..len];
    let mut inner = Vec::new();
    let mut pos = 0usize;
    loop {
        while pos < data.len() && data[pos] == 0 {
            pos += 1;
        }
        if pos >= data.len() {
            break;
        }
        let rest = &data[pos..];
        if !rest.starts_with(BUNDLE_MAGIC) {
            return Err(bad(format!(
                "not an uncompressed bundle at decompressed offset {pos:#x} ({})",
                describe(rest)
            )));
        }
        let base = pos;
        let (bundle, len) = parse_plain(rest, first_index + inner.len(), offset, |r| {
            Blob::Shared(buf.clone(), r.start + base..r.end + base)
        })
        .map_err(|e| bad(e.to_string()))?;
        inner.push(bundle);
        pos += len;
    }
    if inner.is_empty() {
        return Err(bad("empty".into()));
    }
    Ok(inner)
}
