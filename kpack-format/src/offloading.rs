//! LLVM's offload binaries (formats.md §1.5): what clang's new offload
//! driver (`--offload-new-driver`, and `-fgpu-rdc` link inputs) puts in a
//! host object's `.llvm.offloading` section instead of a `.hip_fatbin`
//! bundle. The section is a sequence of offload binaries, each starting on
//! a multiple of 8:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `10 FF 10 AD` |
//! | 4 | 4 | `u32` version (1) |
//! | 8 | 8 | `u64` size of this binary |
//! | 16 | 8 | `u64` offset of its entry |
//! | 24 | 8 | `u64` size of its entry |
//!
//! The entry: `u16` image kind, `u16` offload kind, `u32` flags, `u64`
//! offset of the string table, `u64` number of strings, `u64` offset and
//! `u64` size of the image. Each string is a pair of `u64` offsets (key,
//! value) of NUL-terminated strings (`triple`, `arch`). Offsets are from the
//! binary's start. Bytes in, descriptions out; nothing is copied.

use std::ops::Range;

use crate::bytes;

/// The magic of an offload binary.
pub const MAGIC: [u8; 4] = [0x10, 0xFF, 0x10, 0xAD];
/// The ELF section that holds offload binaries.
pub const SECTION: &str = ".llvm.offloading";
const HEADER_SIZE: usize = 32;
const ENTRY_SIZE: usize = 40;
const ALIGN: usize = 8;

/// Why bytes are not offload binaries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OffloadingError {
    #[error("offload binary at +{at:#x}: bad magic")]
    Magic { at: usize },
    #[error("offload binary at +{at:#x}: version {version}, expected 1")]
    Version { at: usize, version: u32 },
    #[error("offload binary at +{at:#x}: {what} runs past its end")]
    Truncated { at: usize, what: &'static str },
    #[error("offload binary at +{at:#x}: a string is not NUL-terminated UTF-8")]
    BadString { at: usize },
}

/// One device image of an offload binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// Where its offload binary starts in the section.
    pub binary_offset: usize,
    /// As `llvm-objdump --offloading` names it: `elf` (a code object),
    /// `llvm ir`, `cubin`, `fatbinary`, `ptx`, or the number.
    pub kind: String,
    /// Who made it: `hip`, `openmp`, `cuda`, or the number.
    pub producer: String,
    pub flags: u32,
    /// The `triple` string (`amdgcn-amd-amdhsa`), empty when absent.
    pub triple: String,
    /// The `arch` string: the target ID (`gfx942`, `gfx90a:xnack-`).
    pub arch: String,
    /// The image's bytes in the section.
    pub range: Range<usize>,
}

/// Every image of the offload binaries in `section` (the bytes of
/// `.llvm.offloading`), in order. Zero bytes between binaries are padding.
pub fn parse(section: &[u8]) -> Result<Vec<Image>, OffloadingError> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < section.len() {
        if section[at..].iter().take(ALIGN).all(|&b| b == 0) {
            at += ALIGN;
            continue;
        }
        let size = binary_at(section, at, &mut out)?;
        at += size.div_ceil(ALIGN).max(1) * ALIGN;
    }
    Ok(out)
}

/// The offload binary at `section[at..]`: its image pushed to `out`; its
/// size.
fn binary_at(section: &[u8], at: usize, out: &mut Vec<Image>) -> Result<usize, OffloadingError> {
    let b = &section[at..];
    let truncated = |what| OffloadingError::Truncated { at, what };
    if b.len() < HEADER_SIZE {
        return Err(truncated("the header"));
    }
    if b[..4] != MAGIC {
        return Err(OffloadingError::Magic { at });
    }
    let version = bytes::u32_at(b, 4).unwrap_or_default();
    if version != 1 {
        return Err(OffloadingError::Version { at, version });
    }
    let u64_at = |o: usize| bytes::u64_at(b, o as u64).map(|v| v as usize);
    let size = u64_at(8).ok_or_else(|| truncated("the header"))?;
    let b = b.get(..size).ok_or_else(|| truncated("the binary"))?;
    let entry = u64_at(16).ok_or_else(|| truncated("the header"))?;
    let e = b
        .get(entry..entry.saturating_add(ENTRY_SIZE))
        .ok_or_else(|| truncated("the entry"))?;
    let field = |o: usize| bytes::u64_at(e, o as u64).map_or(0, |v| v as usize);
    let (strings, count) = (field(8), field(16));
    let (offset, len) = (field(24), field(32));
    if offset.checked_add(len).is_none_or(|end| end > b.len()) {
        return Err(truncated("the image"));
    }
    let mut image = Image {
        binary_offset: at,
        kind: image_kind(bytes::u16_at(e, 0).unwrap_or_default()),
        producer: offload_kind(bytes::u16_at(e, 2).unwrap_or_default()),
        flags: bytes::u32_at(e, 4).unwrap_or_default(),
        triple: String::new(),
        arch: String::new(),
        range: at + offset..at + offset + len,
    };
    for i in 0..count {
        let pair = strings.saturating_add(i.saturating_mul(16));
        let key = string_at(b, u64_at(pair), at)?;
        let value = string_at(b, u64_at(pair + 8), at)?;
        match key {
            "triple" => image.triple = value.to_string(),
            "arch" => image.arch = value.to_string(),
            _ => {}
        }
    }
    out.push(image);
    Ok(size)
}

/// The NUL-terminated string at `offset` of the binary `b`.
fn string_at(b: &[u8], offset: Option<usize>, at: usize) -> Result<&str, OffloadingError> {
    let bad = OffloadingError::BadString { at };
    let s = offset.and_then(|o| b.get(o..)).ok_or(bad.clone())?;
    let end = s.iter().position(|&c| c == 0).ok_or(bad.clone())?;
    std::str::from_utf8(&s[..end]).map_err(|_| bad)
}

fn image_kind(k: u16) -> String {
    match k {
        0 => "none",
        1 => "elf",
        2 => "llvm ir",
        3 => "cubin",
        4 => "fatbinary",
        5 => "ptx",
        n => return n.to_string(),
    }
    .to_string()
}

fn offload_kind(k: u16) -> String {
    match k {
        0 => "none",
        1 => "openmp",
        2 => "cuda",
        3 => "hip",
        n => return n.to_string(),
    }
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An offload binary as LLVM writes one: header, entry, string table,
    /// strings, image.
    fn binary(kind: u16, arch: &str, image: &[u8]) -> Vec<u8> {
        let strings_at = HEADER_SIZE + ENTRY_SIZE;
        let text_at = strings_at + 2 * 16;
        let mut text = Vec::new();
        let mut offs = Vec::new();
        for s in ["triple", "amdgcn-amd-amdhsa", "arch", arch] {
            offs.push((text_at + text.len()) as u64);
            text.extend_from_slice(s.as_bytes());
            text.push(0);
        }
        let image_at = (text_at + text.len()).div_ceil(8) * 8;
        let size = image_at + image.len();
        let mut b = vec![0u8; size];
        b[..4].copy_from_slice(&MAGIC);
        bytes::put_u32(&mut b, 4, 1);
        bytes::put_u64(&mut b, 8, size as u64);
        bytes::put_u64(&mut b, 16, HEADER_SIZE as u64);
        bytes::put_u64(&mut b, 24, ENTRY_SIZE as u64);
        let e = HEADER_SIZE;
        b[e..e + 2].copy_from_slice(&kind.to_le_bytes());
        b[e + 2..e + 4].copy_from_slice(&3u16.to_le_bytes());
        bytes::put_u64(&mut b, e + 8, strings_at as u64);
        bytes::put_u64(&mut b, e + 16, 2);
        bytes::put_u64(&mut b, e + 24, image_at as u64);
        bytes::put_u64(&mut b, e + 32, image.len() as u64);
        for (i, o) in offs.iter().enumerate() {
            bytes::put_u64(&mut b, strings_at + i * 8, *o);
        }
        b[text_at..text_at + text.len()].copy_from_slice(&text);
        b[image_at..].copy_from_slice(image);
        b
    }

    #[test]
    fn parses_a_section_of_two_binaries() {
        let mut s = binary(2, "gfx1100", b"BC\xc0\xde1234567");
        while !s.len().is_multiple_of(8) {
            s.push(0);
        }
        let second = s.len();
        s.extend(binary(1, "gfx90a:xnack-", b"\x7fELF"));
        let images = parse(&s).unwrap();
        assert_eq!(images.len(), 2);
        assert_eq!(
            (images[0].kind.as_str(), images[0].producer.as_str()),
            ("llvm ir", "hip")
        );
        assert_eq!(images[0].arch, "gfx1100");
        assert_eq!(images[0].triple, "amdgcn-amd-amdhsa");
        assert_eq!(&s[images[0].range.clone()], b"BC\xc0\xde1234567");
        assert_eq!(images[1].binary_offset, second);
        assert_eq!(
            (images[1].kind.as_str(), images[1].arch.as_str()),
            ("elf", "gfx90a:xnack-")
        );
        assert_eq!(&s[images[1].range.clone()], b"\x7fELF");
    }

    #[test]
    fn damage_is_an_error_not_a_panic() {
        let good = binary(2, "gfx942", b"abcdefgh");
        assert_eq!(parse(&[0u8; 16]).unwrap(), vec![]);
        let mut bad = good.clone();
        bad[0] = 0x11;
        assert_eq!(parse(&bad), Err(OffloadingError::Magic { at: 0 }));
        let mut bad = good.clone();
        bad[4] = 2;
        assert!(matches!(parse(&bad), Err(OffloadingError::Version { .. })));
        for cut in [4, 31, 40, good.len() - 1] {
            assert!(parse(&good[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = good.clone();
        bytes::put_u64(&mut bad, HEADER_SIZE + 8, u64::MAX);
        assert!(parse(&bad).is_err());
        // Every byte changed: never a panic.
        for i in 0..good.len() {
            let mut m = good.clone();
            m[i] ^= 0xff;
            let _ = parse(&m);
        }
    }
}
