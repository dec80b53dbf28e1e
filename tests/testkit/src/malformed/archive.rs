//! `archive/`: `.kpack` archives with a broken header, TOC, entry or zstd
//! frame, made from two valid archives written here.

use anyhow::Result;
use rmpv::Value;

use super::{le64, Corpus};

/// Size of the archive header; the blob starts there.
const HEADER_SIZE: u64 = 64;

/// `KPAK` header + blob + TOC bytes, with the TOC offset right.
fn kpak(version: u32, blob: &[u8], toc: &[u8]) -> Vec<u8> {
    let mut out = b"KPAK".to_vec();
    out.extend(version.to_le_bytes());
    out.extend(le64(HEADER_SIZE + blob.len() as u64));
    out.resize(HEADER_SIZE as usize, 0);
    out.extend_from_slice(blob);
    out.extend_from_slice(toc);
    out
}

pub(super) fn encode(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, v).expect("writing to a Vec");
    out
}

/// A map with string keys, in order.
pub(super) fn str_map<const N: usize>(entries: [(&str, Value); N]) -> Value {
    Value::Map(entries.into_iter().map(|(k, v)| (k.into(), v)).collect())
}

/// How a valid archive stores its kernels (the TOC's
/// `compression_scheme`).
#[derive(Clone, Copy)]
enum Scheme {
    /// `none`: the kernels one after the other, a `blobs` range each.
    None,
    /// `zstd-per-kernel`: a `u32` frame count, then a `u32` length and a
    /// zstd frame per kernel.
    ZstdPerKernel,
}

/// The kernels of the valid archives, all for gfx1100: (key, bytes).
const KERNELS: [(&str, &[u8]); 2] = [
    ("lib/liba.so#0", b"kernel a for gfx1100, kernel a, kernel a"),
    ("lib/libb.so#0", b"kernel b for gfx1100 (the second one)"),
];

/// A valid archive of [`KERNELS`]: (blob, TOC value), written here from the
/// format's description, not by kpack's writer. The zstd frames are made
/// as kpack makes them (level 3, content size and checksum, no dictionary
/// ID) and the TOC's fields are in its order.
fn valid(scheme: Scheme) -> Result<(Vec<u8>, Value)> {
    let mut blob = Vec::new();
    let (name, layout) = match scheme {
        Scheme::None => {
            let mut blobs = Vec::new();
            for (_, k) in KERNELS {
                let at = HEADER_SIZE + blob.len() as u64;
                blobs.push(str_map([
                    ("offset", Value::from(at)),
                    ("size", Value::from(k.len() as u64)),
                ]));
                blob.extend_from_slice(k);
            }
            ("none", vec![("blobs", Value::Array(blobs))])
        }
        Scheme::ZstdPerKernel => {
            let mut c = zstd::bulk::Compressor::new(3)?;
            c.include_checksum(true)?;
            c.include_contentsize(true)?;
            c.include_dictid(false)?;
            blob.extend((KERNELS.len() as u32).to_le_bytes());
            for (_, k) in KERNELS {
                let frame = c.compress(k)?;
                blob.extend((frame.len() as u32).to_le_bytes());
                blob.extend(frame);
            }
            let size = Value::from(blob.len() as u64);
            let layout = vec![
                ("zstd_offset", Value::from(HEADER_SIZE)),
                ("zstd_size", size),
            ];
            ("zstd-per-kernel", layout)
        }
    };
    let mut fields = vec![
        ("format_version", Value::from(1u64)),
        ("group_name", "g".into()),
        ("gfx_arch_family", "gfx1100".into()),
        ("gfx_arches", Value::Array(vec!["gfx1100".into()])),
        ("toc", valid_toc()),
        ("compression_scheme", name.into()),
    ];
    fields.extend(layout);
    let toc = fields.into_iter().map(|(k, v)| (k.into(), v)).collect();
    Ok((blob, Value::Map(toc)))
}

/// The `toc` field of [`valid`]: key -> gfx1100 -> entry, ordinals in
/// order.
fn valid_toc() -> Value {
    let keys = KERNELS.iter().enumerate().map(|(ordinal, (key, k))| {
        let entry = str_map([
            ("type", "hsaco".into()),
            ("ordinal", Value::from(ordinal as u64)),
            ("original_size", Value::from(k.len() as u64)),
        ]);
        (Value::from(*key), str_map([("gfx1100", entry)]))
    });
    Value::Map(keys.collect())
}

/// The entries of a map value.
fn entries(v: &mut Value) -> &mut Vec<(Value, Value)> {
    match v {
        Value::Map(m) => m,
        other => panic!("a TOC map expected, not {other}"),
    }
}

/// Replace (or add, or with `None` remove) a top-level TOC field.
fn set(toc: &Value, key: &str, v: Option<Value>) -> Value {
    let mut toc = toc.clone();
    let m = entries(&mut toc);
    let at = m.iter().position(|(k, _)| k.as_str() == Some(key));
    match (at, v) {
        (Some(i), Some(v)) => m[i].1 = v,
        (Some(i), None) => {
            m.remove(i);
        }
        (None, Some(v)) => m.push((key.into(), v)),
        (None, None) => {}
    }
    toc
}

/// The `toc` field's map (key -> target -> entry).
fn kernels(toc: &mut Value) -> &mut Vec<(Value, Value)> {
    let t = entries(toc)
        .iter_mut()
        .find(|(k, _)| k.as_str() == Some("toc"))
        .expect("a TOC has a toc field");
    entries(&mut t.1)
}

/// The TOC with the entry of its first kernel's `key` set to `v`.
fn with_entry(toc: &Value, key: &str, v: Value) -> Value {
    let mut toc = toc.clone();
    let targets = entries(&mut kernels(&mut toc)[0].1);
    let entry = entries(&mut targets[0].1);
    match entry.iter_mut().find(|(k, _)| k.as_str() == Some(key)) {
        Some(e) => e.1 = v,
        None => entry.push((key.into(), v)),
    }
    toc
}

/// A version-1 archive of `blob` and the TOC `toc`.
fn archive(blob: &[u8], toc: &Value) -> Vec<u8> {
    kpak(1, blob, &encode(toc))
}

/// `archive/`: broken copies of two valid archives (zstd per kernel, and
/// uncompressed), and an empty file.
pub(super) fn archives(c: &Corpus) -> Result<()> {
    let (zblob, ztoc) = valid(Scheme::ZstdPerKernel)?;
    let (nblob, ntoc) = valid(Scheme::None)?;
    header_archives(c, &zblob, &ztoc)?;
    toc_field_archives(c, &zblob, &ztoc)?;
    frames(c, &zblob, &ztoc)?;
    entry_archives(c, &zblob, &ztoc)?;
    noop_archives(c, &nblob, &ntoc)?;
    // The same key twice in the TOC map, with the same target.
    let mut dup = ztoc.clone();
    let keys = kernels(&mut dup);
    let first = keys[0].clone();
    keys.push(first);
    c.put("archive/duplicate-kernel.kpack", &archive(&zblob, &dup))?;
    // A TOC nested deeper than the decoder allows.
    let mut deep = vec![0x91u8; 100];
    deep.push(0xc0);
    c.put("archive/toc-too-deep.kpack", &kpak(1, &zblob, &deep))?;
    c.put("archive/empty.kpack", b"")
}

/// Archives whose header, or the TOC's place and framing, is broken.
fn header_archives(c: &Corpus, zblob: &[u8], ztoc: &Value) -> Result<()> {
    let good_z = archive(zblob, ztoc);
    c.put(
        "archive/bad-magic.kpack",
        &[b"KPAX".as_slice(), &good_z[4..]].concat(),
    )?;
    c.put("archive/truncated-header.kpack", &good_z[..40])?;
    c.put("archive/version-2.kpack", &kpak(2, zblob, &encode(ztoc)))?;
    let mut b = good_z.clone();
    b[8..16].copy_from_slice(&le64(good_z.len() as u64 + 1));
    c.put("archive/toc-offset-past-end.kpack", &b)?;
    let mut b = good_z.clone();
    b[8..16].copy_from_slice(&le64(16));
    c.put("archive/toc-offset-in-header.kpack", &b)?;
    c.put(
        "archive/toc-not-msgpack.kpack",
        &kpak(1, zblob, &[0xc1, 0x00]),
    )?;
    c.put(
        "archive/toc-trailing-bytes.kpack",
        &[good_z.clone(), vec![0x01, 0x02]].concat(),
    )?;
    c.put("archive/toc-truncated.kpack", &good_z[..good_z.len() - 3])?;
    c.put(
        "archive/toc-not-a-map.kpack",
        &archive(zblob, &Value::from(7u64)),
    )
}

/// Archives with a top-level TOC field missing or wrong.
fn toc_field_archives(c: &Corpus, zblob: &[u8], ztoc: &Value) -> Result<()> {
    let toc_cases = [
        ("toc-missing-group", set(ztoc, "group_name", None)),
        (
            "toc-arches-not-array",
            set(ztoc, "gfx_arches", Some(Value::from(3u64))),
        ),
        (
            "toc-unknown-scheme",
            set(ztoc, "compression_scheme", Some(Value::from("lz4"))),
        ),
        (
            "toc-format-version-2",
            set(ztoc, "format_version", Some(Value::from(2u64))),
        ),
        (
            "zstd-blob-outside",
            set(ztoc, "zstd_size", Some(Value::from(1u64 << 20))),
        ),
    ];
    for (name, toc) in &toc_cases {
        c.put(&format!("archive/{name}.kpack"), &archive(zblob, toc))?;
    }
    Ok(())
}

/// Zstd archives whose first kernel's entry has a wrong field.
fn entry_archives(c: &Corpus, zblob: &[u8], ztoc: &Value) -> Result<()> {
    let entry_cases = [
        ("ordinal-out-of-range", "ordinal", Value::from(5u64)),
        ("ordinal-over-u32", "ordinal", Value::from(1u64 << 33)),
        (
            "original-size-negative",
            "original_size",
            Value::from(-5i64),
        ),
        ("original-size-wrong", "original_size", Value::from(3u64)),
        (
            "original-size-huge",
            "original_size",
            Value::from(1u64 << 40),
        ),
    ];
    for (name, key, v) in entry_cases {
        c.put(
            &format!("archive/{name}.kpack"),
            &archive(zblob, &with_entry(ztoc, key, v)),
        )?;
    }
    Ok(())
}

/// Uncompressed archives whose blobs or sizes do not match.
fn noop_archives(c: &Corpus, nblob: &[u8], ntoc: &Value) -> Result<()> {
    let blob = |offset: u64, size: u64| {
        str_map([("offset", Value::from(offset)), ("size", Value::from(size))])
    };
    c.put(
        "archive/blob-outside.kpack",
        &archive(
            nblob,
            &set(
                ntoc,
                "blobs",
                Some(Value::Array(vec![blob(64, 1 << 30), blob(64, 1)])),
            ),
        ),
    )?;
    c.put(
        "archive/noop-size-mismatch.kpack",
        &archive(nblob, &with_entry(ntoc, "original_size", Value::from(2u64))),
    )
}

/// Archives whose zstd frames (in the blob) are damaged.
fn frames(c: &Corpus, zblob: &[u8], ztoc: &Value) -> Result<()> {
    let with_blob = |edit: &dyn Fn(&mut Vec<u8>)| {
        let mut b = zblob.to_vec();
        edit(&mut b);
        archive(&b, ztoc)
    };
    c.put(
        "archive/too-many-frames.kpack",
        &with_blob(&|b| b[0..4].copy_from_slice(&2_000_000u32.to_le_bytes())),
    )?;
    c.put(
        "archive/frame-past-blob.kpack",
        &with_blob(&|b| b[4..8].copy_from_slice(&100_000u32.to_le_bytes())),
    )?;
    c.put(
        "archive/frame-corrupt.kpack",
        &with_blob(&|b| {
            let l = b.len();
            for x in &mut b[20..l - 40] {
                *x ^= 0xa5;
            }
        }),
    )
}
