//! Bundle formats clang 19 does not emit (CCOB v1 and v3, zlib, a
//! compressed bundle holding several bundles), built here by the test's own
//! code from real code objects, and read by `kpack`.

use std::io::Write;
use std::path::Path;

use crate::common::*;
use md5::{Digest, Md5};

/// Real code objects of libvadd.so, as clang-offload-bundler extracts them.
fn real_code_objects(scratch: &Path) -> Vec<(String, Vec<u8>)> {
    let f = fixture("libvadd.so");
    let fatbin = objcopy_section(&f.path, ".hip_fatbin", scratch);
    let bundles = split_bundles(&fatbin);
    let file = scratch.join("b.bin");
    std::fs::write(&file, &bundles[0]).unwrap();
    let cos = bundler_unbundle(&file, scratch);
    assert!(cos.len() >= 2);
    cos
}

/// A plain bundle laid out by hand: table, then data aligned to 4096.
fn plain(entries: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut all: Vec<(String, &[u8])> = vec![("host-x86_64-unknown-linux--".to_string(), &[][..])];
    all.extend(
        entries
            .iter()
            .map(|(t, d)| (format!("hipv4-amdgcn-amd-amdhsa--{t}"), &d[..])),
    );
    let table: usize = 32 + all.iter().map(|(t, _)| 24 + t.len()).sum::<usize>();
    let mut offs = vec![];
    let mut pos = table;
    for (_, d) in &all {
        pos = pos.div_ceil(4096) * 4096;
        offs.push(pos);
        pos += d.len();
    }
    let mut out = b"__CLANG_OFFLOAD_BUNDLE__".to_vec();
    out.extend((all.len() as u64).to_le_bytes());
    for ((t, d), o) in all.iter().zip(&offs) {
        out.extend((*o as u64).to_le_bytes());
        out.extend((d.len() as u64).to_le_bytes());
        out.extend((t.len() as u64).to_le_bytes());
        out.extend(t.as_bytes());
    }
    for ((_, d), o) in all.iter().zip(&offs) {
        out.resize(*o, 0);
        out.extend_from_slice(d);
    }
    out
}

fn ccob(inner: &[u8], version: u16, zlib: bool) -> Vec<u8> {
    let payload = if zlib {
        let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(inner).unwrap();
        e.finish().unwrap()
    } else {
        zstd::bulk::compress(inner, 9).unwrap()
    };
    let hash = u64::from_le_bytes(Md5::digest(inner)[..8].try_into().unwrap());
    let mut out = b"CCOB".to_vec();
    out.extend(version.to_le_bytes());
    out.extend((if zlib { 0u16 } else { 1u16 }).to_le_bytes());
    match version {
        1 => out.extend((inner.len() as u32).to_le_bytes()),
        2 => {
            out.extend(((24 + payload.len()) as u32).to_le_bytes());
            out.extend((inner.len() as u32).to_le_bytes());
        }
        3 => {
            out.extend(((32 + payload.len()) as u64).to_le_bytes());
            out.extend((inner.len() as u64).to_le_bytes());
        }
        _ => unreachable!(),
    }
    out.extend(hash.to_le_bytes());
    out.extend(payload);
    out
}

fn extract_all(file: &Path, out: &Path) -> Vec<(String, Vec<u8>)> {
    kpack_ok(&[&"extract", &file, &"-o", &out]);
    dir_files(out)
}

#[test]
fn ccob_versions_and_methods() {
    let dir = tempfile::tempdir().unwrap();
    let cos = real_code_objects(dir.path());
    let bundle = plain(&cos);
    for (version, zlib) in [
        (1, false),
        (1, true),
        (2, true),
        (3, false),
        (3, true),
        (2, false),
    ] {
        let file = dir.path().join(format!(
            "v{version}-{}.bin",
            if zlib { "zlib" } else { "zstd" }
        ));
        std::fs::write(&file, ccob(&bundle, version, zlib)).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&kpack_ok(&[&"ls", &file, &"--json"])).unwrap();
        let c = &v["bundles"][0]["compressed"];
        assert_eq!(c["version"], version);
        assert_eq!(c["method"], if zlib { "zlib" } else { "zstd" });
        assert_eq!(c["hash_matches"], true);
        let out = dir.path().join(format!("out-{version}-{zlib}"));
        let got = extract_all(&file, &out);
        let want: Vec<(String, Vec<u8>)> = {
            let mut w: Vec<_> = cos
                .iter()
                .map(|(t, d)| (format!("{t}.hsaco"), d.clone()))
                .collect();
            w.sort();
            w
        };
        assert!(
            got == want,
            "CCOB v{version} zlib={zlib}: extracted code objects differ"
        );
    }
}

#[test]
fn compressed_bundle_holding_several_bundles() {
    let dir = tempfile::tempdir().unwrap();
    let cos = real_code_objects(dir.path());
    // Bundle 0 and 1 inside one CCOB (with padding between), then a plain
    // bundle 2 after page padding.
    let mut inner = plain(&cos[..1]);
    inner.extend([0u8; 8]);
    inner.extend(plain(&cos));
    let mut data = ccob(&inner, 3, false);
    data.resize(data.len().div_ceil(4096) * 4096, 0);
    data.extend(plain(&cos[1..]));
    let file = dir.path().join("multi.bin");
    std::fs::write(&file, &data).unwrap();
    let got = extract_all(&file, &dir.path().join("out"));
    let mut want = vec![(format!("{}#0.hsaco", cos[0].0), cos[0].1.clone())];
    for (t, d) in &cos {
        want.push((format!("{t}#1.hsaco"), d.clone()));
    }
    for (t, d) in &cos[1..] {
        want.push((format!("{t}#2.hsaco"), d.clone()));
    }
    want.sort();
    assert_eq!(
        got.iter().map(|x| &x.0).collect::<Vec<_>>(),
        want.iter().map(|x| &x.0).collect::<Vec<_>>()
    );
    assert!(got == want);
    let v: serde_json::Value = serde_json::from_str(&kpack_ok(&[&"ls", &file, &"--json"])).unwrap();
    assert_eq!(v["bundles"].as_array().unwrap().len(), 3);
    assert_eq!(v["bundles"][1]["compressed"]["inner_index"], 1);
    assert!(v["bundles"][2]["compressed"].is_null());
}

#[test]
fn extract_one_target() {
    let dir = tempfile::tempdir().unwrap();
    let f = fixture("libwide.so");
    let out = dir.path().join("out");
    kpack_ok(&[
        &"extract",
        &f.path,
        &"-o",
        &out,
        &"--target",
        &"gfx90a:xnack+",
    ]);
    let files = dir_files(&out);
    assert_eq!(files.len(), 1);
    assert_eq!(files[0].0, "gfx90a:xnack+.hsaco");
    let err = kpack_fails(&[
        &"extract",
        &f.path,
        &"-o",
        &dir.path().join("none"),
        &"--target",
        &"gfx1151",
    ]);
    assert!(err.contains("gfx1151") && err.contains("gfx1030"), "{err}");
    assert!(!dir.path().join("none").exists());
}
