use super::*;
use crate::bundle::{parse_fatbin, write_bundle, Bundle, Method};

const HOST: &str = "host-x86_64-unknown-linux--";
const A: &str = "hipv4-amdgcn-amd-amdhsa--gfx1100";
const B: &str = "hipv4-amdgcn-amd-amdhsa--gfx90a:xnack-";
const C: &str = "hipv4-amdgcn-amd-amdhsa--gfx90a:xnack+";

/// [`plan_bundles`] of a section at 4 KiB.
fn plan(section: &[u8], keep: Keep) -> Result<Layout> {
    let listed = list_fatbin(section).with_path("x")?;
    plan_bundles(Path::new("x"), section, &listed, 4096, keep, None)
}

fn wanted(t: &[&str]) -> Vec<(String, Option<TargetId>)> {
    Selection {
        targets: t.iter().map(|s| s.to_string()).collect(),
        keep_generic: false,
    }
    .parsed(Path::new("x"))
    .unwrap()
}

#[test]
fn keeps_as_the_loader_matches() {
    let w = wanted(&["gfx90a"]);
    assert!(keeps(&w, false, "gfx90a:xnack+"));
    assert!(keeps(&w, false, "gfx90a:xnack-"));
    assert!(!keeps(&w, false, "gfx1100"));
    assert!(!keeps(&w, false, "gfx11-generic"));
    assert!(keeps(&w, true, "gfx11-generic"));
    let w = wanted(&["gfx90a:xnack-", "amdgcnspirv"]);
    assert!(!keeps(&w, false, "gfx90a:xnack+"));
    assert!(keeps(&w, false, "gfx90a"));
    assert!(keeps(&w, false, "amdgcnspirv"));
    assert!(Selection::default().parsed(Path::new("x")).is_err());
    let bad = Selection {
        targets: vec!["../x".into()],
        keep_generic: false,
    };
    assert!(bad.parsed(Path::new("x")).is_err());
}

/// Plain and compressed bundles keep their form; a bundle left without
/// device code keeps its host entry; every kept code object is intact.
#[test]
fn bundles_keep_their_form() {
    let a = vec![1u8; 5000];
    let b = vec![2u8; 3000];
    let c = vec![3u8; 7000];
    let plain = write_bundle(&[(HOST, b""), (A, &a), (B, &b), (C, &c)], 4096);
    let inner = write_bundle(&[(HOST, b""), (B, &b), (C, &c)], 4096);
    let ccob = Compressor::new(Method::Zstd)
        .version(2)
        .compress(&inner)
        .unwrap();
    let only_a = write_bundle(&[(HOST, b""), (A, &a)], 4096);
    let mut section = plain.clone();
    section.resize(plain.len().div_ceil(4096) * 4096, 0);
    let ccob_at = section.len();
    section.extend_from_slice(&ccob);
    section.resize(section.len().div_ceil(4096) * 4096, 0);
    let last_at = section.len();
    section.extend_from_slice(&only_a);
    let w = wanted(&["gfx90a:xnack-"]);
    let l = plan(&section, &|t| keeps(&w, false, t)).unwrap();
    assert_eq!(l.starts.len(), 3);
    assert_eq!(l.starts[1].0, ccob_at as u64);
    assert_eq!(l.starts[2].0, last_at as u64);
    let out = parse_fatbin(&l.bytes).unwrap();
    assert_eq!(out.len(), 3);
    for (o, &(_, new)) in out.iter().zip(&l.starts) {
        assert_eq!(o.range.start as u64, new);
        assert_eq!(new % 4096, 0);
    }
    let targets = |b: &Bundle| {
        b.device_entries()
            .map(|e| e.target().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(targets(&out[0]), ["gfx90a:xnack-"]);
    assert_eq!(&*out[0].entry_for("gfx90a:xnack-").unwrap().data, &b[..]);
    assert_eq!(out[0].entry_for("gfx90a:xnack-").unwrap().offset % 4096, 0);
    let (c1, _) = out[1].compressed.as_ref().expect("still compressed");
    assert_eq!((c1.version, c1.method), (2, Method::Zstd));
    assert_eq!(c1.hash_matches, Some(true));
    assert_eq!(targets(&out[1]), ["gfx90a:xnack-"]);
    // Left without device code: the host entry, a valid empty bundle.
    assert!(out[2].device_entries().next().is_none());
    assert_eq!(out[2].entries.len(), 1);
    assert!(l.bundles[2].kept.is_empty());
    assert_eq!(l.bundles[0].dropped, ["gfx1100", "gfx90a:xnack+"]);
    assert!(l.bytes.len() < section.len());
}

/// A compressed bundle damaged past its entry tables: listed, then an
/// error naming the bundle and the problem (the one decompressing it whole
/// gives) when its code objects are read.
#[test]
fn a_damaged_compressed_bundle_is_an_error() {
    let big: Vec<u8> = (0..1_200_000u32).map(|i| (i / 300) as u8).collect();
    let inner = write_bundle(&[(HOST, b""), (A, &big), (B, b"small")], 4096);
    let mut section = write_bundle(&[(HOST, b""), (A, b"plain")], 8);
    section.resize(4096, 0);
    section.extend(
        Compressor::new(Method::Zstd)
            .version(3)
            .compress(&inner)
            .unwrap(),
    );
    let n = section.len();
    section[n - 24..n - 8].iter_mut().for_each(|b| *b ^= 0x5a);
    let want = parse_fatbin(&section).unwrap_err().to_string();
    assert!(
        want.contains("compressed bundle at offset 0x1000"),
        "{want}"
    );
    for t in ["gfx1100", "gfx90a"] {
        let w = wanted(&[t]);
        let err = plan(&section, &|t| keeps(&w, false, t)).err().unwrap();
        assert_eq!(err.to_string(), format!("x: {want}"));
    }
}

/// The prune of before bundles were read one at a time: every bundle
/// parsed up front (compressed ones decompressed whole), kept as the
/// reference the bytes must still match.
mod reference {
    use super::*;

    pub(super) fn plan(section: &[u8], keep: &dyn Fn(&str) -> bool) -> Layout {
        let bundles = parse_fatbin(section).unwrap();
        let mut out = Layout::default();
        for group in bundles.chunk_by(|a, b| a.range == b.range) {
            let start = align_up(out.bytes.len() as u64, 4096);
            out.bytes.resize(start as usize, 0);
            let mut plain = Vec::new();
            for b in group {
                let (bytes, kept, dropped) = pruned_plain(b, keep);
                plain.extend_from_slice(&bytes);
                out.bundles.push(BundlePruned {
                    index: b.index,
                    compressed: None,
                    kept,
                    dropped,
                    bytes_before: group[0].range.len() as u64,
                    bytes_after: 0,
                });
            }
            let stored = match &group[0].compressed {
                Some((ccob, _)) => recompress(&plain, ccob),
                None => plain,
            };
            let n = out.bundles.len();
            for b in &mut out.bundles[n - group.len()..] {
                b.bytes_after = stored.len() as u64;
                b.compressed = group[0]
                    .compressed
                    .as_ref()
                    .map(|(c, _)| format!("CCOB v{} {}", ccob_version(c, stored.len()), c.method));
            }
            out.starts.push((group[0].range.start as u64, start));
            out.bytes.extend_from_slice(&stored);
        }
        out
    }

    fn pruned_plain(
        b: &Bundle,
        keep: &dyn Fn(&str) -> bool,
    ) -> (Vec<u8>, Vec<String>, Vec<String>) {
        let (mut kept, mut dropped) = (Vec::new(), Vec::new());
        let mut entries: Vec<(&str, &[u8])> = Vec::new();
        for e in &b.entries {
            if e.is_host() || keep(e.target()) {
                entries.push((&e.triple, &e.data));
                if !e.is_host() {
                    kept.push(e.target().to_string());
                }
            } else {
                dropped.push(e.target().to_string());
            }
        }
        (write_bundle(&entries, entry_alignment(b)), kept, dropped)
    }

    fn entry_alignment(b: &Bundle) -> usize {
        b.device_entries()
            .filter(|e| !e.data.is_empty())
            .map(|e| 1u64 << e.offset.trailing_zeros().min(12))
            .min()
            .unwrap_or(1) as usize
    }

    fn ccob_version(c: &Ccob, stored: usize) -> u16 {
        if c.version < 3 && u32::try_from(stored).is_err() {
            3
        } else {
            c.version
        }
    }

    fn recompress(plain: &[u8], ccob: &Ccob) -> Vec<u8> {
        let version = if u32::try_from(plain.len()).is_err() {
            3
        } else {
            ccob.version
        };
        match Compressor::new(ccob.method)
            .version(version)
            .compress(plain)
        {
            Ok(b) if version < 3 && u32::try_from(b.len()).is_err() => Compressor::new(ccob.method)
                .version(3)
                .compress(plain)
                .unwrap(),
            Ok(b) => b,
            Err(_) if version < 3 => Compressor::new(ccob.method)
                .version(3)
                .compress(plain)
                .unwrap(),
            Err(e) => panic!("{e}"),
        }
    }
}

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }

    /// Compressible bytes: runs of a few values.
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n);
        while v.len() < n {
            let b = self.below(4) as u8 * 0x41;
            let run = 1 + self.below(40) as usize;
            v.extend(std::iter::repeat_n(b, run.min(n - v.len())));
        }
        v
    }
}

const TRIPLES: &[&str] = &[
    A,
    B,
    C,
    "hipv4-amdgcn-amd-amdhsa--gfx1030",
    "hipv4-amdgcn-amd-amdhsa--gfx11-generic",
    "hip-spirv64-amd-amdhsa--amdgcnspirv",
];

/// A plain bundle: up to four device entries (some empty) and a host
/// entry (sometimes not empty) somewhere among them, at an alignment of 1
/// to 4096.
fn plain_bundle(r: &mut Rng) -> Vec<u8> {
    let n = 1 + r.below(4) as usize;
    let first = r.below(TRIPLES.len() as u64) as usize;
    let mut entries: Vec<(&str, Vec<u8>)> = (0..n)
        .map(|i| {
            let size = [0, 1 + r.below(300), r.below(9000)][r.below(3) as usize];
            (TRIPLES[(first + i) % TRIPLES.len()], r.bytes(size as usize))
        })
        .collect();
    let host = if r.below(4) == 0 {
        r.bytes(100)
    } else {
        Vec::new()
    };
    let at = [0, r.below(n as u64 + 1) as usize][r.below(2) as usize];
    entries.insert(at, (HOST, host));
    let refs: Vec<(&str, &[u8])> = entries.iter().map(|(t, d)| (*t, &d[..])).collect();
    write_bundle(&refs, [1, 8, 16, 4096][r.below(4) as usize])
}

/// A section of one to four bundles, plain and compressed (CCOB v1 last
/// only, v2, v3; zstd and zlib; one to three inner bundles), zero padding
/// between them.
fn section(r: &mut Rng) -> Vec<u8> {
    let n = 1 + r.below(4);
    let mut out = Vec::new();
    for i in 0..n {
        out.resize(out.len().div_ceil(8) * 8 + r.below(3) as usize * 8, 0);
        if r.below(3) == 0 {
            out.extend(plain_bundle(r));
            continue;
        }
        let mut inner = Vec::new();
        for _ in 0..1 + r.below(3) {
            inner.resize(inner.len() + r.below(2) as usize * 16, 0);
            inner.extend(plain_bundle(r));
        }
        let version = (if i + 1 == n {
            1 + r.below(3)
        } else {
            2 + r.below(2)
        }) as u16;
        let method = [Method::Zstd, Method::Zlib][r.below(2) as usize];
        out.extend(
            Compressor::new(method)
                .version(version)
                .compress(&inner)
                .unwrap(),
        );
    }
    out
}

/// Bundles read one at a time give the bytes (and the summary) the old
/// prune, which parsed every bundle up front, gave.
#[test]
fn one_bundle_at_a_time_gives_the_old_bytes() {
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    let selections: &[(&[&str], bool)] = &[
        (&["gfx90a"], false),
        (&["gfx90a:xnack-", "amdgcnspirv"], false),
        (&["gfx1100"], true),
        (&["gfx1030", "gfx1100"], false),
        (&["gfx942"], false),
    ];
    for _ in 0..300 {
        let s = section(&mut r);
        for (targets, generic) in selections {
            let w = wanted(targets);
            let keep = |t: &str| keeps(&w, *generic, t);
            let new = plan(&s, &keep).unwrap();
            let old = reference::plan(&s, &keep);
            assert!(new.bytes == old.bytes, "bytes differ for {targets:?}");
            assert_eq!(new.starts, old.starts);
            assert_eq!(format!("{:?}", new.bundles), format!("{:?}", old.bundles));
        }
    }
}
