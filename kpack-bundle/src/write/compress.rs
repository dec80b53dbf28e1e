//! Compressed bundles (CCOB) made by one builder, [`Compressor`].

use std::io;

use md5::{Digest, Md5};

use crate::{md5_word, Method, CCOB_MAGIC};

/// zstd's default level, what clang's `--offload-compress` uses.
const ZSTD_DEFAULT_LEVEL: i32 = 3;
/// The window of long-distance matching: 2^27 bytes, 128 MiB.
const LONG_WINDOW_LOG: u32 = 27;

/// Makes compressed bundles: uncompressed bundle bytes (one or more
/// bundles) compressed and put behind a CCOB header. Options are set one by
/// one, then [`compress`](Self::compress) makes the bundle:
///
/// ```
/// use kpack_bundle::{parse_fatbin, write_bundle, Compressor, Method};
///
/// let plain = write_bundle(&[("hipv4-amdgcn-amd-amdhsa--gfx1100", b"code")], 4096);
/// let ccob = Compressor::new(Method::Zstd).version(3).compress(&plain).unwrap();
/// let bundles = parse_fatbin(&ccob).unwrap();
/// assert_eq!(&*bundles[0].entry_for("gfx1100").unwrap().data, b"code");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compressor {
    method: Method,
    version: u16,
    level: Option<i32>,
    long_distance: bool,
    fitting: bool,
}

impl Compressor {
    /// A CCOB v2 (what clang 19 writes) of `method` at its default level
    /// (zstd: 3, zlib: 6), without long-distance matching, of exactly that
    /// version.
    pub fn new(method: Method) -> Compressor {
        Compressor {
            method,
            version: 2,
            level: None,
            long_distance: false,
            fitting: false,
        }
    }

    /// The CCOB version: 1, 2 or 3 (any other makes [`compress`](Self::compress)
    /// fail). Versions 1 and 2 store 32-bit sizes, version 3 64-bit ones.
    pub fn version(mut self, version: u16) -> Compressor {
        self.version = version;
        self
    }

    /// The compression level: zstd's (1 to 22, 0 for its default), or
    /// zlib's (0 to 9).
    pub fn level(mut self, level: i32) -> Compressor {
        self.level = Some(level);
        self
    }

    /// zstd's long-distance matching, as clang's `--offload-compress` uses
    /// it: a window of up to 128 MiB, so that the code objects of a
    /// bundle's many targets, much alike, are matched against each other;
    /// no checksum. Much smaller than plain zstd on bundles of many
    /// targets. zstd only: with zlib, [`compress`](Self::compress) fails.
    pub fn long_distance(mut self, on: bool) -> Compressor {
        self.long_distance = on;
        self
    }

    /// Write version 3 instead where a size does not fit the 32-bit fields
    /// of version 1 or 2 (the uncompressed size, or the compressed one).
    pub fn fitting(mut self, on: bool) -> Compressor {
        self.fitting = on;
        self
    }

    /// `uncompressed` compressed behind a CCOB header, as set. Compressing
    /// the same bytes with the same options gives the same bytes.
    pub fn compress(&self, uncompressed: &[u8]) -> io::Result<Vec<u8>> {
        self.check()?;
        if !self.fitting {
            return self.compress_as(uncompressed, self.version);
        }
        let version = if u32::try_from(uncompressed.len()).is_err() {
            3
        } else {
            self.version
        };
        match self.compress_as(uncompressed, version) {
            Ok(b) if version < 3 && u32::try_from(b.len()).is_err() => {
                self.compress_as(uncompressed, 3)
            }
            Err(_) if version < 3 => self.compress_as(uncompressed, 3),
            r => r,
        }
    }

    /// Options that cannot make a bundle.
    fn check(&self) -> io::Result<()> {
        let invalid = |what: String| Err(io::Error::new(io::ErrorKind::InvalidInput, what));
        if !(1..=3).contains(&self.version) {
            return invalid(format!(
                "unknown CCOB version {} (known: 1, 2, 3)",
                self.version
            ));
        }
        match (self.method, self.level) {
            (Method::Zlib, _) if self.long_distance => {
                invalid("long-distance matching is zstd's, not zlib's".into())
            }
            (Method::Zlib, Some(l)) if !(0..=9).contains(&l) => {
                invalid(format!("zlib level {l} (known: 0 to 9)"))
            }
            _ => Ok(()),
        }
    }

    /// The bundle of CCOB version `version`.
    fn compress_as(&self, uncompressed: &[u8], version: u16) -> io::Result<Vec<u8>> {
        let payload = match self.method {
            Method::Zstd => self.zstd(uncompressed)?,
            Method::Zlib => self.zlib(uncompressed)?,
        };
        wrap_ccob(uncompressed, &payload, version, self.method)
    }

    fn zstd(&self, data: &[u8]) -> io::Result<Vec<u8>> {
        use zstd::zstd_safe::CParameter;
        let mut c = zstd::bulk::Compressor::new(self.level.unwrap_or(ZSTD_DEFAULT_LEVEL))?;
        if self.long_distance {
            c.set_parameter(CParameter::EnableLongDistanceMatching(true))?;
            c.set_parameter(CParameter::WindowLog(LONG_WINDOW_LOG))?;
            c.set_parameter(CParameter::ChecksumFlag(false))?;
        }
        compress_sized(&mut c, data)
    }

    fn zlib(&self, data: &[u8]) -> io::Result<Vec<u8>> {
        use std::io::Write;
        let level = match self.level {
            Some(l) => flate2::Compression::new(l as u32),
            None => flate2::Compression::default(),
        };
        let mut e = flate2::write::ZlibEncoder::new(Vec::new(), level);
        e.write_all(data)?;
        e.finish()
    }
}

/// `data` compressed by `c` into a buffer sized for a code-object bundle's
/// usual ratio (a quarter), and only when that is too small into one of
/// zstd's worst-case bound: that bound is the size of the input, which a
/// bundle of a compressed binary's (up to 120 MB) would hold twice. One-shot
/// compression gives the same bytes whatever the buffer.
fn compress_sized(c: &mut zstd::bulk::Compressor<'_>, data: &[u8]) -> io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(data.len() / 4 + 4096);
    match c.compress_to_buffer(data, &mut out) {
        Ok(_) => Ok(out),
        Err(_) => c.compress(data),
    }
}

/// `payload` (the compressed `uncompressed`) behind a CCOB header.
fn wrap_ccob(
    uncompressed: &[u8],
    payload: &[u8],
    version: u16,
    method: Method,
) -> io::Result<Vec<u8>> {
    let hash = md5_word(&Md5::digest(uncompressed));
    let mut out = Vec::new();
    out.extend_from_slice(CCOB_MAGIC);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&method.code().to_le_bytes());
    let too_big = || io::Error::other("too large for this CCOB version");
    let size32 = |n: usize| u32::try_from(n).map_err(|_| too_big());
    match version {
        1 => out.extend_from_slice(&size32(uncompressed.len())?.to_le_bytes()),
        2 => {
            out.extend_from_slice(&size32(24 + payload.len())?.to_le_bytes());
            out.extend_from_slice(&size32(uncompressed.len())?.to_le_bytes());
        }
        3 => {
            out.extend_from_slice(&(32 + payload.len() as u64).to_le_bytes());
            out.extend_from_slice(&(uncompressed.len() as u64).to_le_bytes());
        }
        _ => return Err(io::Error::other("unknown CCOB version")),
    }
    out.extend_from_slice(&hash.to_le_bytes());
    out.extend_from_slice(payload);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{parse_fatbin, write_bundle};

    fn plain() -> Vec<u8> {
        let code: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
        write_bundle(
            &[
                ("host-x86_64-unknown-linux--", b""),
                ("hipv4-amdgcn-amd-amdhsa--gfx1100", &code),
                ("hipv4-amdgcn-amd-amdhsa--gfx942", &code),
            ],
            4096,
        )
    }

    /// Every option gives a bundle that parses back to the input, with
    /// the header it was asked for.
    #[test]
    fn every_option_parses_back() {
        let p = plain();
        let base = [Compressor::new(Method::Zstd), Compressor::new(Method::Zlib)];
        for c in base {
            for version in 1..=3 {
                for level in [None, Some(1), Some(9)] {
                    let mut c = c.version(version).fitting(version == 2);
                    if let Some(l) = level {
                        c = c.level(l);
                    }
                    let long = [false, c.method == Method::Zstd];
                    for c in long.map(|l| c.long_distance(l)) {
                        let bytes = c.compress(&p).unwrap();
                        let b = parse_fatbin(&bytes).unwrap();
                        let (ccob, _) = b[0].compressed.as_ref().unwrap();
                        assert_eq!((ccob.version, ccob.method), (version, c.method));
                        assert_eq!(ccob.hash_matches, Some(true));
                        assert_eq!(ccob.stored_size, bytes.len() as u64, "{c:?}");
                        let inner = b[0].entry_for("gfx942").unwrap();
                        assert_eq!(
                            &p[inner.offset as usize..][..inner.data.len()],
                            &*inner.data
                        );
                    }
                }
            }
        }
    }

    /// The level and long-distance matching change the bytes; the same
    /// options give the same bytes.
    #[test]
    fn options_reach_the_compressor() {
        let p = plain();
        let z = Compressor::new(Method::Zstd);
        let at = |c: Compressor| c.compress(&p).unwrap();
        assert_eq!(at(z), at(z.level(3)), "zstd's default level is 3");
        assert_ne!(at(z.level(1)), at(z.level(19)));
        assert_ne!(at(z), at(z.long_distance(true)));
        let zl = Compressor::new(Method::Zlib);
        assert_eq!(at(zl), at(zl.level(6)), "zlib's default level is 6");
        assert_ne!(at(zl.level(1)), at(zl.level(9)));
    }

    #[test]
    fn options_that_make_no_bundle_are_refused() {
        let p = plain();
        for (c, want) in [
            (
                Compressor::new(Method::Zstd).version(0),
                "unknown CCOB version 0",
            ),
            (
                Compressor::new(Method::Zstd).version(4).fitting(true),
                "version 4",
            ),
            (Compressor::new(Method::Zlib).long_distance(true), "zstd's"),
            (Compressor::new(Method::Zlib).level(10), "zlib level 10"),
        ] {
            let e = c.compress(&p).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
            assert!(e.to_string().contains(want), "{c:?}: {e}");
        }
    }
}
