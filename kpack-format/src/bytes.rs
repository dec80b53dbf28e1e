//! Little-endian integers in byte slices: the one reader and writer every
//! format module uses (all kpack formats are little-endian). Reads are
//! bounds-checked and return `None` past the end, so that untrusted input
//! never panics; writes go to buffers kpack built itself and whose layout
//! was checked first, so a write out of range is a bug and panics.

/// `N` bytes at `at`, or `None` when they are not all there.
pub fn array_at<const N: usize>(b: &[u8], at: u64) -> Option<[u8; N]> {
    let at = usize::try_from(at).ok()?;
    b.get(at..at.checked_add(N)?)?.try_into().ok()
}

pub fn u16_at(b: &[u8], at: u64) -> Option<u16> {
    array_at(b, at).map(u16::from_le_bytes)
}

pub fn u32_at(b: &[u8], at: u64) -> Option<u32> {
    array_at(b, at).map(u32::from_le_bytes)
}

pub fn u64_at(b: &[u8], at: u64) -> Option<u64> {
    array_at(b, at).map(u64::from_le_bytes)
}

/// Write `v` at `at`. Panics when out of range (see the module comment).
pub fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

/// Write `v` at `at`. Panics when out of range (see the module comment).
pub fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// Write `v` at `at`. Panics when out of range (see the module comment).
pub fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// A byte count for people: `512 B`, `1.5 KiB`, `13.2 MiB`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_bounded() {
        let b = [1u8, 2, 3, 4, 5, 6, 7, 8, 9];
        assert_eq!(u16_at(&b, 0), Some(0x0201));
        assert_eq!(u32_at(&b, 5), Some(0x0908_0706));
        assert_eq!(u32_at(&b, 6), None);
        assert_eq!(u64_at(&b, 1), Some(0x0908_0706_0504_0302));
        assert_eq!(u64_at(&b, 2), None);
        assert_eq!(u64_at(&b, u64::MAX), None);
    }

    #[test]
    fn writes_round_trip() {
        let mut b = [0u8; 16];
        put_u16(&mut b, 0, 0xbeef);
        put_u32(&mut b, 2, 0xdead_beef);
        put_u64(&mut b, 8, 0x0102_0304_0506_0708);
        assert_eq!(u16_at(&b, 0), Some(0xbeef));
        assert_eq!(u32_at(&b, 2), Some(0xdead_beef));
        assert_eq!(u64_at(&b, 8), Some(0x0102_0304_0506_0708));
    }

    #[test]
    fn sizes() {
        assert_eq!(format_size(0), "0 B");
        assert_eq!(format_size(1023), "1023 B");
        assert_eq!(format_size(1536), "1.5 KiB");
        assert_eq!(format_size(13 << 20), "13.0 MiB");
    }
}
