//! Provenance (formats.md §3.6): the digests that tie an offloaded binary to
//! the code objects it was split from, so that every later step can tell an
//! archive of its own build from another build's.
//!
//! - A code object's digest is the SHA-256 of its bytes as the loader hands
//!   them out (decompressed), as 64 lowercase hex digits.
//! - A binary's device digest is the SHA-256 over the 32-byte digests of
//!   every device code object of the fat binary it was split from (all its
//!   targets, also those left out of the archives), sorted: it does not
//!   depend on the bundles' order, on which targets a run kept, or on how
//!   the bundles were compressed. The binary's HIPK metadata carries it
//!   (`kpack_device_sha256`, see the HIPK module).
//! - Each TOC entry written with a binary carries, in its `metadata` map,
//!   its code object's digest ([`TOC_CODE_OBJECT_DIGEST`]) and its binary's
//!   device digest ([`TOC_BINARY_DIGEST`]).
//!
//! All three are additional keys, which the reference's readers ignore.
//! A value that is not 64 hex digits is ignored as an absent key is:
//! archives and binaries without them are taken as they always were.

use sha2::{Digest, Sha256};

use crate::archive::Entry;

/// Key of an entry's `metadata` map: the SHA-256 of its code object.
pub const TOC_CODE_OBJECT_DIGEST: &str = "code_object_sha256";
/// Key of an entry's `metadata` map: the device digest of the binary the
/// code object was split from.
pub const TOC_BINARY_DIGEST: &str = "binary_sha256";
/// How many hex digits a digest is shown with in messages.
pub const SHORT: usize = 12;

/// The digest of a code object's bytes.
pub fn code_object_digest(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// The device digest of a binary whose device code objects have these
/// digests (any order; each as [`code_object_digest`] gives it). Digests
/// that are not 64 hex digits are left out.
pub fn device_digest<'a>(code_objects: impl IntoIterator<Item = &'a str>) -> String {
    let mut raw: Vec<[u8; 32]> = code_objects.into_iter().filter_map(unhex).collect();
    raw.sort_unstable();
    let mut h = Sha256::new();
    for d in &raw {
        h.update(d);
    }
    hex(&h.finalize())
}

/// `s` if it is a digest (64 hex digits), in lowercase.
pub fn parse(s: &str) -> Option<String> {
    unhex(s).map(|b| hex(&b))
}

/// The first [`SHORT`] digits of a digest, for messages.
pub fn short(digest: &str) -> &str {
    digest.get(..SHORT).unwrap_or(digest)
}

/// The digests an archive entry carries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EntryDigests {
    /// Its code object's digest.
    pub code_object: Option<String>,
    /// The device digest of the binary it belongs to.
    pub binary: Option<String>,
}

impl EntryDigests {
    /// The digests of `entry`'s metadata (malformed values: none).
    pub fn of(entry: &Entry) -> EntryDigests {
        let get = |k| entry.metadata_str(k).and_then(parse);
        EntryDigests {
            code_object: get(TOC_CODE_OBJECT_DIGEST),
            binary: get(TOC_BINARY_DIGEST),
        }
    }
}

/// Whether an archive entry holds code of the binary whose device digest
/// is `binary` (`None`: the binary carries none). Without a digest on
/// either side the answer is yes, as before digests existed.
pub fn same_build(binary: Option<&str>, entry: &Entry) -> Result<(), BuildMismatch> {
    let (Some(b), Some(e)) = (binary, EntryDigests::of(entry).binary) else {
        return Ok(());
    };
    if e == b {
        return Ok(());
    }
    Err(BuildMismatch {
        binary: b.to_string(),
        archive: e,
    })
}

/// An archive entry split from another build than the binary asking for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildMismatch {
    /// The binary's device digest.
    pub binary: String,
    /// The device digest the entry records.
    pub archive: String,
}

impl std::fmt::Display for BuildMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&builds(&self.binary, &self.archive))
    }
}

/// The two builds of a mismatch in words: the binary's device digest and
/// the one an archive entry records (shortened).
pub fn builds(binary: &str, archive: &str) -> String {
    format!(
        "the binary's device code is {}, the archive's entry was split from {}",
        short(binary),
        short(archive)
    )
}

/// Check code object bytes read for `entry` against the digest its TOC
/// records, if any.
pub fn verify(entry: &Entry, bytes: &[u8]) -> Result<(), crate::archive::ArchiveError> {
    let Some(expected) = EntryDigests::of(entry).code_object else {
        return Ok(());
    };
    let actual = code_object_digest(bytes);
    if actual == expected {
        return Ok(());
    }
    Err(crate::archive::ArchiveError::DigestMismatch {
        key: entry.key.clone(),
        target: entry.target.clone(),
        expected: expected.into(),
        actual: actual.into(),
    })
}

fn hex(b: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(b.len() * 2);
    for &x in b {
        s.push(DIGITS[usize::from(x >> 4)] as char);
        s.push(DIGITS[usize::from(x & 15)] as char);
    }
    s
}

fn unhex(s: &str) -> Option<[u8; 32]> {
    let b = s.as_bytes();
    if b.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in b.chunks_exact(2).enumerate() {
        let d = |c: u8| (c as char).to_digit(16);
        out[i] = u8::try_from(d(pair[0])? * 16 + d(pair[1])?).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msgpack::Value;

    fn entry(meta: &[(&str, &str)]) -> Entry {
        Entry {
            key: "bin/x#0".into(),
            target: "gfx942".into(),
            kind: Some("hsaco".into()),
            ordinal: 0,
            original_size: 3,
            metadata: Some(
                meta.iter()
                    .map(|(k, v)| (k.to_string(), Value::from(*v)))
                    .collect(),
            ),
        }
    }

    #[test]
    fn digests_are_sha256_and_order_free() {
        // sha256("abc")
        let abc = code_object_digest(b"abc");
        assert_eq!(
            abc,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let x = code_object_digest(b"x");
        assert_eq!(device_digest([&*abc, &*x]), device_digest([&*x, &*abc]));
        assert_ne!(device_digest([&*abc, &*x]), device_digest([&*abc]));
        // Multiplicity counts.
        assert_ne!(device_digest([&*abc, &*abc]), device_digest([&*abc]));
        assert_eq!(parse(&abc.to_uppercase()), Some(abc.clone()));
        assert_eq!(parse("abc"), None);
        assert_eq!(short(&abc), "ba7816bf8f01");
    }

    #[test]
    fn entries_match_by_binary_digest() {
        let b = device_digest([&*code_object_digest(b"abc")]);
        let other = device_digest([&*code_object_digest(b"abd")]);
        let e = entry(&[(TOC_BINARY_DIGEST, &b)]);
        assert_eq!(same_build(Some(&b), &e), Ok(()));
        assert_eq!(same_build(None, &e), Ok(()));
        assert_eq!(same_build(Some(&b), &entry(&[])), Ok(()));
        assert_eq!(
            same_build(Some(&b), &entry(&[(TOC_BINARY_DIGEST, "not a digest")])),
            Ok(())
        );
        let m = same_build(Some(&other), &e).unwrap_err();
        assert_eq!(m.archive, b);
        assert!(m.to_string().contains(short(&b)), "{m}");
    }

    #[test]
    fn verify_checks_the_recorded_code_object_digest() {
        let e = entry(&[(TOC_CODE_OBJECT_DIGEST, &code_object_digest(b"abc"))]);
        assert!(verify(&e, b"abc").is_ok());
        assert!(matches!(
            verify(&e, b"abd"),
            Err(crate::archive::ArchiveError::DigestMismatch { .. })
        ));
        assert!(verify(&entry(&[]), b"anything").is_ok());
    }
}
