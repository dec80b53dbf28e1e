//! Parsing whole: plain and compressed bundles, and every way they can be
//! damaged.

use crate::{parse_fatbin, write_bundle, BundleError, Compressor, Method};

const G1: &str = "hipv4-amdgcn-amd-amdhsa--gfx1100";
const G2: &str = "hipv4-amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-";
const HOST: &str = "host-x86_64-unknown-linux--";

fn sample() -> Vec<u8> {
    write_bundle(
        &[(HOST, b""), (G1, b"code-for-gfx1100"), (G2, &[7u8; 5000])],
        4096,
    )
}

#[test]
fn plain_bundle_roundtrip() {
    let data = sample();
    let b = parse_fatbin(&data).unwrap();
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].range, 0..data.len());
    let dev: Vec<_> = b[0]
        .device_entries()
        .map(|e| (e.target().to_string(), e.data.to_vec()))
        .collect();
    assert_eq!(
        dev,
        vec![
            ("gfx1100".into(), b"code-for-gfx1100".to_vec()),
            ("gfx942:sramecc+:xnack-".into(), vec![7u8; 5000])
        ]
    );
}

#[test]
fn several_bundles_with_padding_and_every_ccob_flavour() {
    let a = sample();
    let b = write_bundle(&[(HOST, b""), (G1, b"second")], 1);
    let mut data = a.clone();
    data.resize(data.len().div_ceil(4096) * 4096, 0);
    data.extend_from_slice(&b);
    for (v, m) in [
        (2, Method::Zstd),
        (3, Method::Zstd),
        (2, Method::Zlib),
        (3, Method::Zlib),
    ] {
        data.extend_from_slice(&[0; 13]);
        data.extend_from_slice(&Compressor::new(m).version(v).compress(&a).unwrap());
    }
    // v1 has no total size: its payload runs to the end, so it goes last.
    let mut inner = b.clone();
    inner.extend_from_slice(&[0; 3]);
    inner.extend_from_slice(&a);
    data.extend_from_slice(
        &Compressor::new(Method::Zstd)
            .version(1)
            .compress(&inner)
            .unwrap(),
    );
    let bundles = parse_fatbin(&data).unwrap();
    assert_eq!(bundles.len(), 8);
    for (i, bd) in bundles.iter().enumerate() {
        assert_eq!(bd.index, i);
    }
    assert_eq!(&*bundles[1].entry_for("gfx1100").unwrap().data, b"second");
    for bd in &bundles[2..6] {
        let (c, pos) = bd.compressed.as_ref().unwrap();
        assert_eq!(c.hash_matches, Some(true));
        assert_eq!(*pos, 0);
        assert_eq!(
            &*bd.entry_for("gfx942:sramecc+:xnack-").unwrap().data,
            &[7u8; 5000][..]
        );
    }
    let (c, _) = bundles[6].compressed.as_ref().unwrap();
    assert_eq!((c.version, c.inner_bundles), (1, 2));
    assert_eq!(bundles[6].range, bundles[7].range);
    assert_eq!(&*bundles[6].entry_for("gfx1100").unwrap().data, b"second");
    assert_eq!(bundles[7].compressed.as_ref().unwrap().1, 1);
    assert_eq!(
        &*bundles[7].entry_for("gfx1100").unwrap().data,
        b"code-for-gfx1100"
    );
}

#[test]
fn empty_and_zero_data_have_no_bundles() {
    assert!(parse_fatbin(&[]).unwrap().is_empty());
    assert!(parse_fatbin(&[0; 100]).unwrap().is_empty());
}

#[test]
fn every_truncation_is_an_error() {
    let data = sample();
    let end_of_last = data.len();
    for cut in 1..end_of_last {
        let r = parse_fatbin(&data[..cut]);
        // Cuts inside zero fill between table and data may still parse
        // only if every entry fits, which it cannot once the last
        // entry's bytes are cut.
        assert!(r.is_err(), "cut at {cut} parsed");
    }
}

#[test]
fn wrong_magic() {
    let mut data = sample();
    data[0] = b'X';
    assert!(matches!(
        parse_fatbin(&data),
        Err(BundleError::BadMagic { offset: 0, .. })
    ));
}

#[test]
fn entry_past_end() {
    let mut data = sample();
    // Size of the last entry: make it huge.
    let table_entry2 = 32 + (24 + HOST.len()) + (24 + G1.len());
    data[table_entry2 + 8..table_entry2 + 16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        parse_fatbin(&data),
        Err(BundleError::EntryOutOfRange { entry: 2, .. })
    ));
}

#[test]
fn huge_entry_count() {
    let mut data = sample();
    data[24..32].copy_from_slice(&(1u64 << 60).to_le_bytes());
    assert!(matches!(
        parse_fatbin(&data),
        Err(BundleError::TooManyEntries { .. })
    ));
}

#[test]
fn ccob_bad_sizes_and_methods() {
    let a = sample();
    let good = Compressor::new(Method::Zstd)
        .version(2)
        .compress(&a)
        .unwrap();
    let mut t = good.clone();
    t[8..12].copy_from_slice(&(good.len() as u32 + 1).to_le_bytes());
    assert!(matches!(
        parse_fatbin(&t),
        Err(BundleError::BadTotalSize { .. })
    ));
    let mut t = good.clone();
    t[8..12].copy_from_slice(&10u32.to_le_bytes());
    assert!(matches!(
        parse_fatbin(&t),
        Err(BundleError::BadTotalSize { .. })
    ));
    let mut u = good.clone();
    u[12..16].copy_from_slice(&(a.len() as u32 - 1).to_le_bytes());
    assert!(matches!(
        parse_fatbin(&u),
        Err(BundleError::SizeMismatch { .. })
    ));
    let mut u = good.clone();
    u[12..16].copy_from_slice(&(a.len() as u32 + 100).to_le_bytes());
    assert!(matches!(
        parse_fatbin(&u),
        Err(BundleError::SizeMismatch { .. })
    ));
    let mut m = good.clone();
    m[6] = 7;
    assert!(matches!(
        parse_fatbin(&m),
        Err(BundleError::UnsupportedMethod { method: 7, .. })
    ));
    let mut v = good.clone();
    v[4] = 9;
    assert!(matches!(
        parse_fatbin(&v),
        Err(BundleError::UnsupportedVersion { version: 9, .. })
    ));
    let mut c = good.clone();
    let n = c.len();
    c[30..n - 4].iter_mut().for_each(|b| *b ^= 0x5a);
    assert!(matches!(
        parse_fatbin(&c),
        Err(BundleError::Decompress { .. } | BundleError::SizeMismatch { .. })
    ));
    let mut h = good;
    h[16] ^= 1;
    let b = parse_fatbin(&h).unwrap();
    assert_eq!(
        b[0].compressed.as_ref().unwrap().0.hash_matches,
        Some(false)
    );
}

#[test]
fn duplicate_target_in_one_bundle() {
    let d = write_bundle(&[(G1, b"a"), (G1, b"b")], 1);
    assert!(matches!(
        parse_fatbin(&d),
        Err(BundleError::DuplicateTarget { .. })
    ));
}
