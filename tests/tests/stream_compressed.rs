//! Compressed bundles larger than `kpack_bundle::LIST_CHECK_LIMIT`, inside
//! a real linked library: listed from their entry tables, read as a stream
//! by offload, split, extract and prune, and written to the same bytes (or
//! code objects) as when the same bundles are stored plainly; damaged ones
//! give an error naming the file, the compressed bundle and the problem,
//! and leave no output.
//!
//! The libraries are built here: a host object per bundle, compiled with
//! clang's `-fcuda-include-gpubinary` embedding a bundle file the test
//! writes (real code objects of libvadd.so, and large made-up ones), then
//! linked with lld.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;

use crate::common::*;

const HOST: &str = "host-x86_64-unknown-linux--";
const CLANGXX: &str = "clang++-19";

/// Real code objects of libvadd.so, as clang-offload-bundler extracts them.
fn real_code_objects(scratch: &Path) -> Vec<(String, Vec<u8>)> {
    let f = fixture("libvadd.so");
    let fatbin = objcopy_section(&f.path, ".hip_fatbin", scratch);
    let bundles = split_bundles(&fatbin);
    let file = scratch.join("first.bundle");
    std::fs::write(&file, &bundles[0]).unwrap();
    bundler_unbundle(&file, scratch)
}

/// Bytes that compress well but are not all alike.
fn made_up(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| ((i / 512) as u8).wrapping_mul(31) ^ seed ^ (i % 7) as u8)
        .collect()
}

/// A plain bundle: a host entry, then `entries`, each at a 4 KiB offset.
fn plain(entries: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut all: Vec<(String, &[u8])> = vec![(HOST.to_string(), &[][..])];
    all.extend(
        entries
            .iter()
            .map(|(t, d)| (format!("hipv4-amdgcn-amd-amdhsa--{t}"), &d[..])),
    );
    let refs: Vec<(&str, &[u8])> = all.iter().map(|(t, d)| (t.as_str(), *d)).collect();
    kpack_bundle::write_bundle(&refs, 4096)
}

/// The bundles of the test library: (bundle file of object 0 compressed,
/// the same plain, bundle file of object 1). Object 0 holds two bundles
/// (a compressed bundle with two inner bundles: 2.4 MiB and 1.2 MiB of
/// code objects), object 1 a plain one.
fn bundles(scratch: &Path) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let real = real_code_objects(scratch);
    let mut first = real.clone();
    // libvadd's targets are gfx1100, gfx1101 and gfx942.
    first.push(("gfx1201".into(), made_up(1300 << 10, 1)));
    first.push(("gfx90a:xnack-".into(), made_up(1100 << 10, 2)));
    let second = vec![
        ("gfx1201".to_string(), made_up(700 << 10, 3)),
        (real[0].0.clone(), made_up(500 << 10, 4)),
    ];
    let mut inner = plain(&first);
    inner.extend([0u8; 16]);
    inner.extend(plain(&second));
    let ccob = kpack_bundle::Compressor::new(kpack_bundle::Method::Zstd)
        .version(3)
        .level(3)
        .compress(&inner)
        .unwrap();
    (ccob, inner, plain(&real))
}

/// Link a shared library `name` in `dir` from one host object per bundle
/// file.
fn link_library(dir: &Path, name: &str, fatbins: &[&[u8]]) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let hip = workspace().join("integration/hip");
    let mut objects = Vec::new();
    for (i, fatbin) in fatbins.iter().enumerate() {
        let fb = dir.join(format!("b{i}.hipfb"));
        std::fs::write(&fb, fatbin).unwrap();
        let src = dir.join(format!("b{i}.hip"));
        std::fs::write(
            &src,
            format!(
                "#include \"kpack_hip.h\"\n__global__ void stream_k{i}(float *p) {{ if (p) p[0] = {i}.0f; }}\n"
            ),
        )
        .unwrap();
        let obj = dir.join(format!("b{i}.o"));
        run_ok(
            Command::new(CLANGXX)
                .args(["-x", "hip", "--cuda-host-only", "-fPIC", "-O2"])
                .args(["-nogpulib", "-nogpuinc", "-I"])
                .arg(&hip)
                .args(["-Xclang", &format!("-cuid=stream{i}")])
                .args(["-Xclang", "-fcuda-include-gpubinary", "-Xclang"])
                .arg(&fb)
                .arg("-c")
                .arg("-o")
                .arg(&obj)
                .arg(&src),
        );
        objects.push(obj);
    }
    let lib = dir.join(name);
    run_ok(
        Command::new(CLANGXX)
            .args(["-fuse-ld=lld", "-shared"])
            .arg(format!("-Wl,-soname,{name}"))
            .arg("-o")
            .arg(&lib)
            .args(&objects),
    );
    for o in objects {
        std::fs::remove_file(o).unwrap();
    }
    lib
}

/// The test library twice: with object 0's bundles compressed, and plain.
struct Libs {
    _dir: tempfile::TempDir,
    compressed: PathBuf,
    plain: PathBuf,
}

fn libs() -> Libs {
    let dir = tempfile::tempdir().unwrap();
    let (ccob, inner, second) = bundles(dir.path());
    let compressed = link_library(&dir.path().join("ccob"), "libstream.so", &[&ccob, &second]);
    let plain = link_library(
        &dir.path().join("plain"),
        "libstream.so",
        &[&inner, &second],
    );
    Libs {
        _dir: dir,
        compressed,
        plain,
    }
}

/// Every file below `dir`: (relative path, bytes).
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    find(dir, &|_| true)
        .into_iter()
        .filter(|p| p.is_file())
        .map(|p| {
            let rel = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
            (rel, std::fs::read(&p).unwrap())
        })
        .collect()
}

fn ls_json(file: &Path) -> serde_json::Value {
    serde_json::from_str(&kpack_ok(&[&"ls", &file, &"--json"])).unwrap()
}

#[test]
fn a_large_compressed_bundle_is_listed_from_its_entry_tables() {
    let l = libs();
    let c = ls_json(&l.compressed);
    let p = ls_json(&l.plain);
    let bundles = c["bundles"].as_array().unwrap();
    assert_eq!(bundles.len(), 3);
    for (i, b) in bundles.iter().enumerate() {
        assert_eq!(b["index"], i);
        // The same entries as the plain twin.
        assert_eq!(b["entries"], p["bundles"][i]["entries"], "bundle {i}");
    }
    for (i, b) in bundles[..2].iter().enumerate() {
        let cc = &b["compressed"];
        assert_eq!(cc["version"], 3);
        assert_eq!(cc["inner_index"], i);
        // Not decompressed whole: the hash is not checked.
        assert!(cc["hash_matches"].is_null(), "{cc}");
    }
    assert!(bundles[2]["compressed"].is_null());
    assert_eq!(c["targets"], p["targets"]);
}

#[test]
fn offload_streams_a_large_compressed_bundle_into_the_same_archives() {
    let l = libs();
    let out = tempfile::tempdir().unwrap();
    for (name, lib) in [("ccob", &l.compressed), ("plain", &l.plain)] {
        let o = out.path().join(name);
        kpack_ok(&[
            &"offload",
            lib,
            &"-o",
            &o.join("libstream.so"),
            &"--archive-dir",
            &o.join(".kpack"),
        ]);
    }
    let ccob = files(&out.path().join("ccob/.kpack"));
    assert_eq!(ccob.len(), 5, "one archive per target");
    assert!(
        ccob == files(&out.path().join("plain/.kpack")),
        "archives differ from the plain twin's"
    );
    // No scratch file left beside them.
    assert_eq!(
        names(&out.path().join("ccob/.kpack")).len(),
        5,
        "{:?}",
        names(&out.path().join("ccob/.kpack"))
    );
    // What the runtime would load: the code objects of the bundles.
    let x = out.path().join("x");
    kpack_ok(&[&"extract", &out.path().join("ccob/libstream.so"), &"-o", &x]);
    let y = out.path().join("y");
    kpack_ok(&[&"extract", &l.plain, &"-o", &y]);
    let resolved = dir_files(&x);
    let direct = dir_files(&y);
    // The offloaded binary's wrappers name bundles 0 (the compressed one)
    // and 2: their code objects are extracted.
    assert!(!resolved.is_empty());
    for (name, bytes) in &resolved {
        assert!(direct.contains(&(name.clone(), bytes.clone())), "{name}");
    }
}

#[test]
fn extract_streams_a_large_compressed_bundle() {
    let l = libs();
    let out = tempfile::tempdir().unwrap();
    let (a, b) = (out.path().join("a"), out.path().join("b"));
    let ja = kpack_ok(&[&"extract", &l.compressed, &"-o", &a, &"--json"]);
    let jb = kpack_ok(&[&"extract", &l.plain, &"-o", &b, &"--json"]);
    assert_eq!(ja, jb, "extract summaries differ");
    assert!(dir_files(&a) == dir_files(&b), "extracted files differ");
    assert_eq!(names(&a).len(), 5 + 2 + 3);
    // One target only.
    let c = out.path().join("c");
    kpack_ok(&[
        &"extract",
        &l.compressed,
        &"-o",
        &c,
        &"--target",
        &"gfx1201",
    ]);
    assert_eq!(names(&c), ["gfx1201#0.hsaco", "gfx1201#1.hsaco"]);
}

/// Prune `lib` to `target` into `out`: the summary.
fn prune(lib: &Path, out: &Path, target: &str) -> serde_json::Value {
    let args: [&dyn AsRef<std::ffi::OsStr>; 7] = [
        &"prune",
        &lib,
        &"-o",
        &out,
        &"--targets",
        &target,
        &"--json",
    ];
    serde_json::from_str(&kpack_ok(&args)).unwrap()
}

#[test]
fn prune_streams_a_large_compressed_bundle() {
    let l = libs();
    let d = tempfile::tempdir().unwrap();
    let (c, p) = (d.path().join("c.so"), d.path().join("p.so"));
    let sc = prune(&l.compressed, &c, "gfx1201");
    let sp = prune(&l.plain, &p, "gfx1201");
    let bundles = sc["bundles"].as_array().unwrap();
    assert_eq!(bundles.len(), 3);
    for (i, b) in bundles.iter().enumerate() {
        // What the plain twin keeps and drops.
        for k in ["index", "kept", "dropped"] {
            assert_eq!(b[k], sp["bundles"][i][k], "bundle {i}: {k}");
        }
        let compressed = if i < 2 {
            "CCOB v3 zstd".into()
        } else {
            json!(null)
        };
        assert_eq!(b["compressed"], compressed, "bundle {i}");
    }
    assert_eq!(sc["kept_targets"], json!(["gfx1201"]));
    assert_eq!(sc["kept_targets"], sp["kept_targets"]);
    // A valid fat binary, its first two bundles still one compressed one.
    kpack_ok(&[&"verify-elf", &c]);
    assert_tools_accept(&l.compressed, &c);
    let listed = ls_json(&c);
    for (i, b) in listed["bundles"].as_array().unwrap().iter().enumerate() {
        assert_eq!(b["entries"], ls_json(&p)["bundles"][i]["entries"], "{i}");
        assert_eq!(b["compressed"].is_null(), i == 2, "bundle {i}");
    }
    // The code objects of the input, as pruning the plain twin gives them.
    let (xc, xp, xi) = (
        d.path().join("xc"),
        d.path().join("xp"),
        d.path().join("xi"),
    );
    kpack_ok(&[&"extract", &c, &"-o", &xc]);
    kpack_ok(&[&"extract", &p, &"-o", &xp]);
    kpack_ok(&[
        &"extract",
        &l.compressed,
        &"-o",
        &xi,
        &"--target",
        &"gfx1201",
    ]);
    assert_eq!(names(&xc), ["gfx1201#0.hsaco", "gfx1201#1.hsaco"]);
    assert!(
        dir_files(&xc) == dir_files(&xp),
        "differs from the plain twin's"
    );
    assert!(dir_files(&xc) == dir_files(&xi), "differs from the input's");
    // And as clang-offload-bundler extracts them from the pruned plain twin
    // (LLVM 19's cannot read CCOB v3), and as the testkit's own reader finds
    // them in the compressed bundle (its first inner bundle).
    let gfx1201 = |m: CodeObjects| -> CodeObjects {
        m.into_iter().filter(|((_, t), _)| t == "gfx1201").collect()
    };
    let bundler = code_objects(&p);
    assert_eq!(bundler.len(), 2);
    assert!(bundler == gfx1201(code_objects(&l.plain)));
    let extracted = dir_files(&xc);
    for ((i, t), bytes) in &bundler {
        assert!(extracted.contains(&(format!("{t}#{i}.hsaco"), bytes.clone())));
    }
    let top = split_bundles(&objcopy_section(&c, ".hip_fatbin", d.path()));
    assert_eq!(top.len(), 2);
    let first = kpack_testkit::oracle::entries(&top[0]).unwrap();
    let want = bundler[&(0, "gfx1201".to_string())].clone();
    assert!(first == [("hipv4-amdgcn-amd-amdhsa--gfx1201".to_string(), want)]);
    assert!(kpack_testkit::oracle::entries(&top[1]).unwrap().is_empty());
}

type CodeObjects = std::collections::BTreeMap<(usize, String), Vec<u8>>;

/// Split one artifact holding `lib` into `out` with `--jobs jobs`.
fn split(lib: &Path, root: &Path, out: &Path, jobs: &str) -> String {
    let a = root.join("stream_lib_gfx-all");
    std::fs::create_dir_all(a.join("stage/lib")).unwrap();
    std::fs::write(a.join("artifact_manifest.txt"), "stage\n").unwrap();
    std::fs::copy(lib, a.join("stage/lib/libstream.so")).unwrap();
    kpack(&[
        &"split",
        &"--artifact-dir",
        &a,
        &"--artifact-prefix",
        &"stream_lib",
        &"--output-dir",
        &out,
        &"--jobs",
        &jobs,
    ])
    .status
    .success()
    .then(String::new)
    .unwrap_or_else(|| "failed".into())
}

#[test]
fn split_streams_a_large_compressed_bundle_into_the_same_archives() {
    let l = libs();
    let d = tempfile::tempdir().unwrap();
    let mut archives = Vec::new();
    for (name, lib, jobs) in [
        ("ccob1", &l.compressed, "1"),
        ("ccob2", &l.compressed, "2"),
        ("plain", &l.plain, "2"),
    ] {
        let out = d.path().join(format!("out-{name}"));
        assert_eq!(split(lib, &d.path().join(name), &out, jobs), "", "{name}");
        let kpacks: Vec<(String, Vec<u8>)> = files(&out)
            .into_iter()
            .filter(|(p, _)| p.ends_with(".kpack"))
            .collect();
        assert_eq!(kpacks.len(), 5, "{name}: {:?}", names(&out));
        archives.push(kpacks);
    }
    assert!(archives[0] == archives[1], "archives depend on --jobs");
    assert!(
        archives[0] == archives[2],
        "archives differ from the plain twin's"
    );
}

/// Copies of the compressed library with its compressed bundle damaged,
/// with the problem reported and whether listing sees it: bytes near the
/// end of its payload flipped (in the last inner bundle's code objects,
/// past every entry table: listing does not see it), and its payload cut
/// in the middle (total size smaller, the rest zero: listing, which reads
/// on to the second inner bundle's table, sees it).
fn damaged(l: &Libs, dir: &Path) -> Vec<(PathBuf, &'static str, bool)> {
    let bytes = std::fs::read(&l.compressed).unwrap();
    let at = bytes.windows(4).position(|w| w == b"CCOB").unwrap();
    let total = u64::from_le_bytes(bytes[at + 8..at + 16].try_into().unwrap()) as usize;
    let mut flipped = bytes.clone();
    flipped[at + total - 40..at + total - 8]
        .iter_mut()
        .for_each(|b| *b ^= 0x5a);
    let mut cut = bytes.clone();
    let keep = total / 2;
    cut[at + 8..at + 16].copy_from_slice(&(keep as u64).to_le_bytes());
    cut[at + keep..at + total].iter_mut().for_each(|b| *b = 0);
    let mut out = Vec::new();
    for (name, b, problem, listed) in [
        ("libflipped.so", flipped, "zstd decompression failed", true),
        (
            "libcut.so",
            cut,
            "zstd decompression failed: incomplete frame",
            false,
        ),
    ] {
        let p = dir.join(name);
        std::fs::write(&p, b).unwrap();
        out.push((p, problem, listed));
    }
    out
}

#[test]
fn a_damaged_large_compressed_bundle_fails_cleanly() {
    let l = libs();
    let d = tempfile::tempdir().unwrap();
    for (lib, problem, listed) in damaged(&l, d.path()) {
        let name = lib.file_name().unwrap().to_str().unwrap().to_string();
        let check = |err: String, what: &str| {
            assert!(
                err.contains(&name),
                "{what}: error does not name the file: {err}"
            );
            assert!(
                err.contains("compressed bundle at offset 0x0"),
                "{what}: error does not name the bundle: {err}"
            );
            assert!(
                err.contains(problem),
                "{what}: error lacks '{problem}': {err}"
            );
        };
        // Listing reads as far as the entry tables.
        if listed {
            kpack_ok(&[&"ls", &lib]);
        } else {
            check(kpack_fails(&[&"ls", &lib]), "ls");
        }
        let x = d.path().join(format!("x-{name}"));
        check(kpack_fails(&[&"extract", &lib, &"-o", &x]), "extract");
        assert!(!x.exists(), "extract left {}", x.display());
        let o = d.path().join(format!("o-{name}"));
        check(
            kpack_fails(&[
                &"offload",
                &lib,
                &"-o",
                &o.join("lib/libstream.so"),
                &"--archive-dir",
                &o.join("lib/.kpack"),
            ]),
            "offload",
        );
        assert!(!o.exists(), "offload left {:?}", listing(&o));
        let p = d.path().join(format!("p-{name}"));
        check(
            kpack_fails(&[&"prune", &lib, &"-o", &p, &"--targets", &"gfx1201"]),
            "prune",
        );
        assert!(!p.exists(), "prune left {}", p.display());
        let root = d.path().join(format!("s-{name}"));
        let out = d.path().join(format!("out-{name}"));
        assert_eq!(split(&lib, &root, &out, "2"), "failed");
        assert!(
            !out.exists() || listing(&out).is_empty(),
            "split left {:?}",
            listing(&out)
        );
    }
}
