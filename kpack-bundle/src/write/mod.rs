//! Writing bundles: plain ones laid out as clang does ([`write_bundle`],
//! [`BundleBuf`]), compressed ones through [`Compressor`].

use std::ops::Deref;

use crate::BUNDLE_MAGIC;

mod compress;

pub use compress::Compressor;

/// Build an uncompressed bundle from (triple, data) entries, laid out as
/// clang does: the entry table, then each entry's data (aligned to
/// `align`, which clang sets to 4096 for code objects).
pub fn write_bundle(entries: &[(&str, &[u8])], align: usize) -> Vec<u8> {
    let sizes: Vec<(&str, usize)> = entries.iter().map(|(t, d)| (*t, d.len())).collect();
    let mut bundle = BundleBuf::new(&sizes, align);
    for (i, (_, d)) in entries.iter().enumerate() {
        bundle.put(i, d);
    }
    bundle.into_bytes()
}

/// [`write_bundle`] of entries it takes (their bytes owned, or shared as
/// a [`Blob`]): each entry's bytes are dropped once copied, so that the
/// entries and the bundle are not both held whole.
pub fn write_bundle_owned<D: Deref<Target = [u8]>>(
    entries: Vec<(String, D)>,
    align: usize,
) -> Vec<u8> {
    let sizes: Vec<(&str, usize)> = entries.iter().map(|(t, d)| (t.as_str(), d.len())).collect();
    let mut bundle = BundleBuf::new(&sizes, align);
    for (i, (_, d)) in entries.into_iter().enumerate() {
        bundle.put(i, &d);
    }
    bundle.into_bytes()
}

/// A bundle written in place: its table first, for entries whose sizes are
/// known, then each entry's bytes put at its offset as they come (so that
/// the entries are never all held next to the bundle). The same bytes as
/// [`write_bundle`] of the same entries.
pub struct BundleBuf {
    bytes: Vec<u8>,
    offsets: Vec<u64>,
    sizes: Vec<usize>,
}

impl BundleBuf {
    /// The bundle of entries of these (triple, size), zero-filled but for
    /// its table.
    pub fn new(entries: &[(&str, usize)], align: usize) -> BundleBuf {
        let (offsets, len) = bundle_layout(entries, align);
        let mut bytes = Vec::with_capacity(len as usize);
        write_table(&mut bytes, entries, &offsets);
        bytes.resize(len as usize, 0);
        let sizes = entries.iter().map(|(_, n)| *n).collect();
        BundleBuf {
            bytes,
            offsets,
            sizes,
        }
    }

    /// Put entry `i`'s bytes in place; `false` (and nothing written) when
    /// there is no entry `i` of that size.
    pub fn put(&mut self, i: usize, data: &[u8]) -> bool {
        if self.sizes.get(i) != Some(&data.len()) {
            return false;
        }
        let at = self.offsets[i] as usize;
        self.bytes[at..at + data.len()].copy_from_slice(data);
        true
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}

/// Where [`write_bundle`] puts entries of these (triple, size): their
/// offsets, and the bundle's length.
pub fn bundle_layout(entries: &[(&str, usize)], align: usize) -> (Vec<u64>, u64) {
    let align = align.max(1) as u64;
    let table_len: u64 = 32
        + entries
            .iter()
            .map(|(t, _)| 24 + t.len() as u64)
            .sum::<u64>();
    let mut offsets = Vec::with_capacity(entries.len());
    let mut pos = table_len;
    for (_, n) in entries {
        if *n > 0 {
            pos = pos.div_ceil(align) * align;
        }
        offsets.push(pos);
        pos += *n as u64;
    }
    (offsets, pos)
}

fn write_table(out: &mut Vec<u8>, entries: &[(&str, usize)], offsets: &[u64]) {
    out.extend_from_slice(BUNDLE_MAGIC);
    out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    for ((t, n), off) in entries.iter().zip(offsets) {
        out.extend_from_slice(&off.to_le_bytes());
        out.extend_from_slice(&(*n as u64).to_le_bytes());
        out.extend_from_slice(&(t.len() as u64).to_le_bytes());
        out.extend_from_slice(t.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_bundles_are_laid_out_as_clang_does() {
        let host: &[u8] = &[];
        let a = vec![7u8; 5000];
        let b: Vec<u8> = (0..=255).collect();
        let entries = [
            ("host-x86_64-unknown-linux--", host),
            ("hipv4-amdgcn-amd-amdhsa--gfx1100", &a[..]),
            ("hipv4-amdgcn-amd-amdhsa--gfx942", &b[..]),
        ];
        let sizes: Vec<(&str, usize)> = entries.iter().map(|(t, d)| (*t, d.len())).collect();
        for align in [1, 16, 4096] {
            let bytes = write_bundle(&entries, align);
            // The table: magic, count, then (offset, size, triple) each.
            let table_len = 32 + entries.iter().map(|(t, _)| 24 + t.len()).sum::<usize>();
            let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
            assert_eq!(&bytes[..24], BUNDLE_MAGIC);
            assert_eq!(word(24), 3);
            let mut at = 32;
            let mut end = table_len;
            for (t, d) in &entries {
                let (off, size) = (word(at) as usize, word(at + 8) as usize);
                assert_eq!(size, d.len());
                assert_eq!(&bytes[at + 24..at + 24 + t.len()], t.as_bytes());
                let want = if d.is_empty() {
                    end
                } else {
                    end.div_ceil(align) * align
                };
                assert_eq!(off, want, "{t} at align {align}");
                assert!(bytes[end..off].iter().all(|&z| z == 0), "padding is zeros");
                assert_eq!(&bytes[off..off + size], *d);
                end = off + size;
                at += 24 + t.len();
            }
            assert_eq!(bytes.len(), end);
            assert_eq!(bundle_layout(&sizes, align).1 as usize, end);
            let owned = entries
                .iter()
                .map(|(t, d)| (t.to_string(), d.to_vec()))
                .collect();
            assert_eq!(write_bundle_owned(owned, align), bytes, "align {align}");

            let mut buf = BundleBuf::new(&sizes, align);
            assert!(!buf.put(1, &b), "a wrong size is refused");
            assert!(!buf.put(3, &b), "no entry 3");
            for (i, (_, d)) in entries.iter().enumerate() {
                assert!(buf.put(i, d));
            }
            assert_eq!(buf.into_bytes(), bytes, "align {align}");
        }
    }
}
