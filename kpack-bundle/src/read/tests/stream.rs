//! Listing, checking and streaming agree with parsing on generated
//! sections, damaged or not.

use crate::fuzzing::stream_agrees;
use crate::{
    check_fatbin, list_fatbin, parse_fatbin, write_bundle, BundleError, Compressor, FatbinStream,
    Method, CCOB_MAGIC, LIST_CHECK_LIMIT,
};

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        // Compressible: runs of a few values.
        let mut v = Vec::with_capacity(n);
        while v.len() < n {
            let b = self.below(4) as u8 * 0x41;
            let run = 1 + self.below(40) as usize;
            v.extend(std::iter::repeat_n(b, run.min(n - v.len())));
        }
        v
    }
}

const TARGETS: &[&str] = &[
    "gfx1100",
    "gfx942:sramecc+:xnack-",
    "gfx90a",
    "gfx906:xnack-",
    "gfx1030",
];

/// One plain bundle: a host entry and some device entries, laid out
/// by `write_bundle` or by hand (overlaps, entries inside the table).
fn plain(r: &mut Rng, big: bool) -> Vec<u8> {
    let n = 1 + r.below(4) as usize;
    let mut datas = Vec::new();
    for _ in 0..n {
        let size = if big && datas.is_empty() {
            (LIST_CHECK_LIMIT as usize) + r.below(50_000) as usize
        } else {
            r.below(3000) as usize
        };
        datas.push(r.bytes(size));
    }
    let mut entries: Vec<(String, &[u8])> = vec![("host-x86_64-unknown-linux--".into(), &[])];
    let start = r.below(TARGETS.len() as u64) as usize;
    for (i, d) in datas.iter().enumerate() {
        let t = TARGETS[(start + i) % TARGETS.len()];
        entries.push((format!("hipv4-amdgcn-amd-amdhsa--{t}"), d));
    }
    let refs: Vec<(&str, &[u8])> = entries.iter().map(|(t, d)| (t.as_str(), *d)).collect();
    let align = [1, 8, 4096][r.below(3) as usize];
    let mut b = write_bundle(&refs, align);
    match r.below(6) {
        // Entry 1 (first device entry) at the same offset as entry 2,
        // no longer than it (its old bytes lie before entry 2's).
        0 if refs.len() > 2 => {
            let e1 = 32 + 24 + refs[0].0.len();
            let e2 = e1 + 24 + refs[1].0.len();
            let off2 = b[e2..e2 + 8].to_vec();
            b[e1..e1 + 8].copy_from_slice(&off2);
            let size = refs[1].1.len().min(refs[2].1.len()) as u64;
            b[e1 + 8..e1 + 16].copy_from_slice(&size.to_le_bytes());
        }
        // Entry 1 starting inside the table.
        1 if refs.len() > 2 => {
            let e1 = 32 + 24 + refs[0].0.len();
            let size = u64::from_le_bytes(b[e1 + 8..e1 + 16].try_into().unwrap());
            let off = r.below(40).min((b.len() as u64).saturating_sub(size));
            b[e1..e1 + 8].copy_from_slice(&off.to_le_bytes());
        }
        _ => {}
    }
    b
}

fn ccob(r: &mut Rng, inner: &[u8], last: bool) -> Vec<u8> {
    let version = if last {
        1 + r.below(3) as u16
    } else {
        2 + r.below(2) as u16
    };
    let method = if r.below(4) == 0 {
        Method::Zlib
    } else {
        Method::Zstd
    };
    let level = 1 + r.below(3) as i32;
    let mut c = match method {
        Method::Zstd => Compressor::new(method).level(level),
        Method::Zlib => Compressor::new(method),
    }
    .version(version)
    .compress(inner)
    .unwrap();
    if method == Method::Zstd && version == 3 && r.below(4) == 0 {
        // Two frames back to back in one payload.
        let cut = r.below(inner.len() as u64 + 1) as usize;
        let mut payload = zstd::bulk::compress(&inner[..cut], 1).unwrap();
        payload.extend(zstd::bulk::compress(&inner[cut..], 1).unwrap());
        c.truncate(32);
        c[8..16].copy_from_slice(&(32 + payload.len() as u64).to_le_bytes());
        c.extend(payload);
    }
    c
}

/// A section: plain and compressed bundles, zero padding between.
fn section(r: &mut Rng, big: bool) -> Vec<u8> {
    let n = 1 + r.below(3);
    let mut out = Vec::new();
    for i in 0..n {
        let last = i + 1 == n;
        out.extend(std::iter::repeat_n(0u8, r.below(3) as usize * 7));
        if r.below(3) == 0 {
            out.extend(plain(r, false));
        } else {
            let mut inner = Vec::new();
            for k in 0..1 + r.below(3) {
                if k > 0 {
                    inner.extend(std::iter::repeat_n(0u8, r.below(2) as usize * 9));
                }
                inner.extend(plain(r, big && k == 0));
            }
            if r.below(5) == 0 {
                inner.extend([0u8; 5]);
            }
            out.extend(ccob(r, &inner, last));
        }
    }
    out
}

fn mutate(r: &mut Rng, mut d: Vec<u8>) -> Vec<u8> {
    match r.below(4) {
        0 => {
            let cut = r.below(d.len() as u64) as usize;
            d.truncate(cut);
        }
        1 => {
            for _ in 0..1 + r.below(3) {
                let at = r.below(d.len() as u64) as usize;
                d[at] ^= 1 << r.below(8);
            }
        }
        2 => {
            // A header field of a compressed bundle.
            if let Some(at) = d.windows(4).position(|w| w == CCOB_MAGIC) {
                let f = at + 4 + r.below(28) as usize;
                if f < d.len() {
                    d[f] = d[f].wrapping_add(1 + r.below(3) as u8);
                }
            }
        }
        _ => {
            let at = r.below(d.len() as u64) as usize;
            let n = r.below(64) as usize;
            let junk = r.bytes(n);
            d.splice(at..at, junk);
        }
    }
    d
}

#[test]
fn streaming_and_listing_agree_with_parsing_on_generated_sections() {
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut ok, mut bad) = (0, 0);
    for _ in 0..1500 {
        let d = section(&mut r, false);
        if let Err(e) = parse_fatbin(&d) {
            panic!("generated section does not parse: {e}");
        }
        stream_agrees(&d);
        let m = mutate(&mut r, d);
        match parse_fatbin(&m) {
            Ok(_) => ok += 1,
            Err(_) => bad += 1,
        }
        stream_agrees(&m);
    }
    // The mutations reach both outcomes.
    assert!(ok > 50 && bad > 500, "{ok} parsed, {bad} rejected");
}

/// Inputs the `bundle_stream` fuzz target found (fuzz/regressions/).
#[test]
fn fuzz_regressions_agree() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/regressions/bundle_stream");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        stream_agrees(&std::fs::read(e.unwrap().path()).unwrap());
        n += 1;
    }
    assert!(n > 0, "no regressions in {}", dir.display());
}

#[test]
fn large_compressed_bundles_are_listed_from_their_tables() {
    let mut r = Rng(0x2545_f491_4f6c_dd1d);
    for _ in 0..12 {
        let d = section(&mut r, true);
        stream_agrees(&d);
        stream_agrees(&mutate(&mut r, d));
    }
}

#[test]
fn listing_a_large_bundle_decompresses_only_its_table() {
    let mut r = Rng(7);
    let inner = plain(&mut r, true);
    let mut c = Compressor::new(Method::Zstd)
        .version(3)
        .compress(&inner)
        .unwrap();
    // Damage the end of the payload: listing does not see it, reading
    // the code objects does, after the tables.
    let n = c.len();
    c[n - 20..n - 4].iter_mut().for_each(|b| *b ^= 0x5a);
    let listed = list_fatbin(&c).unwrap();
    assert_eq!(listed.len(), 1);
    let (ccob, _) = listed[0].compressed.as_ref().unwrap();
    assert_eq!((ccob.hash_matches, ccob.inner_bundles), (None, 1));
    let err = check_fatbin(&c).unwrap_err();
    assert!(matches!(err, BundleError::Decompress { .. }), "{err}");
    let mut s = FatbinStream::new(&c);
    let err = loop {
        match s.next() {
            Ok(Some(_)) => {}
            Ok(None) => panic!("damage not seen"),
            Err(e) => break e,
        }
    };
    assert_eq!(err.to_string(), parse_fatbin(&c).unwrap_err().to_string());
}
