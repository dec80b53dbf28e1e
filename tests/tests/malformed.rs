//! The malformed-input corpus (`tests/malformed/`): every file (or
//! directory) is run through the `kpack` command named in
//! `tests/malformed/cases.txt` and, for archives, through the C API; each
//! must fail with its own named error: exit code 1, a `kpack: error:` line
//! naming the input and containing the expected text, no panic, and no
//! output left behind.
//!
//! The corpus is committed; `regenerate_malformed_corpus` (ignored) rebuilds
//! its files from the fixtures and the reference archives:
//! `cargo test -p kpack-e2e --test malformed -- --ignored regenerate`.

use std::collections::BTreeSet;
use std::ffi::{c_char, c_void, CStr, CString};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use kpack_e2e::*;

fn corpus() -> PathBuf {
    workspace().join("tests/malformed")
}

/// One line of `cases.txt`.
#[derive(Debug)]
struct Case {
    line: usize,
    /// Path below `tests/malformed/`.
    name: String,
    /// `ls`, `extract`, `offload`, `verify-elf`, `split`, `verify`,
    /// `recombine`, `pack-tree`.
    commands: Vec<String>,
    exit: i32,
    /// `-`, `open=N` (kpack_open fails with N) or `kernel=N` (the archive
    /// opens; reading some kernel fails with N).
    capi: Option<(String, i32)>,
    message: String,
}

fn cases() -> Vec<Case> {
    let text = fs::read_to_string(corpus().join("cases.txt")).expect("cases.txt");
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        assert!(f.len() >= 5, "cases.txt:{}: too few fields", i + 1);
        let name = f[0].to_string();
        let commands = f[1].split(',').map(str::to_string).collect();
        let exit = f[2].parse().expect("exit code");
        let capi = match f[3] {
            "-" => None,
            c => {
                let (k, v) = c.split_once('=').expect("capi field: open=N or kernel=N");
                Some((k.to_string(), v.parse().expect("C API code")))
            }
        };
        // The message is the rest of the line (runs of spaces count as one).
        let rest = f[4..].join(" ");
        out.push(Case {
            line: i + 1,
            name,
            commands,
            exit,
            capi,
            message: rest,
        });
    }
    out
}

/// Copy a file or a directory tree (symlinks as symlinks).
fn copy_in(src: &Path, dst: &Path) {
    let m = fs::symlink_metadata(src).unwrap();
    if m.file_type().is_symlink() {
        std::os::unix::fs::symlink(fs::read_link(src).unwrap(), dst).unwrap();
    } else if m.is_dir() {
        fs::create_dir_all(dst).unwrap();
        let mut names: Vec<_> = fs::read_dir(src)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        for p in names {
            copy_in(&p, &dst.join(p.file_name().unwrap()));
        }
    } else {
        fs::copy(src, dst).unwrap();
    }
}

/// Every path below `dir` (relative), for "nothing was written" checks.
fn listing(dir: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            out.insert(p.strip_prefix(root).unwrap().display().to_string());
            if fs::symlink_metadata(&p).unwrap().is_dir() {
                walk(root, &p, out);
            }
        }
    }
    walk(dir, dir, &mut out);
    out
}

/// The arguments of `command` on `input`, writing (if at all) to `out`.
fn args(command: &str, input: &Path, out: &Path, work: &Path) -> Vec<PathBuf> {
    let p = |s: &str| PathBuf::from(s);
    match command {
        "ls" | "verify-elf" => vec![p(command), input.into()],
        "extract" => vec![p("extract"), input.into(), p("-o"), out.into()],
        "offload" => vec![
            p("offload"),
            input.into(),
            p("-o"),
            out.join("lib/out.so"),
            p("--archive-dir"),
            out.join(".kpack"),
        ],
        // A directory holding one artifact (its only subdirectory).
        "split" => {
            let artifact = fs::read_dir(input)
                .unwrap()
                .map(|e| e.unwrap().path())
                .find(|p| p.is_dir())
                .expect("split case: a directory holding one artifact directory");
            vec![
                p("split"),
                p("--artifact-dir"),
                artifact,
                p("--output-dir"),
                out.into(),
            ]
        }
        "split-batch" => vec![
            p("split"),
            p("--batch-artifact-parent-dir"),
            input.into(),
            p("--output-dir"),
            out.into(),
        ],
        "verify" => vec![p("verify"), p("--artifacts-dir"), input.into()],
        // A config file, over the shards in `work/shards` (made by the test).
        "recombine" => vec![
            p("recombine"),
            p("--input-shards-dir"),
            work.join("shards"),
            p("--config"),
            input.into(),
            p("--output-dir"),
            out.into(),
        ],
        // A directory holding `shards/` and `config.json`.
        "recombine-tree" => vec![
            p("recombine"),
            p("--input-shards-dir"),
            input.join("shards"),
            p("--config"),
            input.join("config.json"),
            p("--output-dir"),
            out.into(),
        ],
        "pack-tree" => vec![
            p("pack-tree"),
            p("--input"),
            input.into(),
            p("--output"),
            out.into(),
            p("--group-name"),
            p("g"),
        ],
        c => panic!("unknown command {c} in cases.txt"),
    }
}

/// An empty but well-formed shard tree for config cases.
fn empty_shards(work: &Path) {
    let a = work.join("shards/gfx1100-build/foo_lib_generic");
    fs::create_dir_all(a.join("stage")).unwrap();
    fs::write(a.join("artifact_manifest.txt"), "stage\n").unwrap();
}

#[test]
fn malformed_corpus() {
    let cases = cases();
    assert!(cases.len() >= 40, "only {} cases", cases.len());
    let mut seen = BTreeSet::new();
    let mut capi_checked = 0;
    for case in &cases {
        assert!(seen.insert(case.name.clone()), "{} listed twice", case.name);
        let src = corpus().join(&case.name);
        assert!(
            fs::symlink_metadata(&src).is_ok(),
            "cases.txt:{}: {} missing",
            case.line,
            case.name
        );
        for command in &case.commands {
            let work = tempfile::tempdir().unwrap();
            let file_name = Path::new(&case.name).file_name().unwrap();
            let input = work.path().join(file_name);
            copy_in(&src, &input);
            if command == "recombine" {
                empty_shards(work.path());
            }
            let before = listing(work.path());
            let out = work.path().join("out");
            let argv = args(command, &input, &out, work.path());
            let o = Command::new(kpack_bin()).args(&argv).output().unwrap();
            let stderr = String::from_utf8_lossy(&o.stderr);
            // verify prints its problems on stdout, the error on stderr.
            let both = format!("{}{stderr}", String::from_utf8_lossy(&o.stdout));
            let what = format!("cases.txt:{} {} ({command})", case.line, case.name);
            assert_eq!(
                o.status.code(),
                Some(case.exit),
                "{what}: exit {:?}, stderr: {stderr}",
                o.status
            );
            assert!(!stderr.contains("panicked"), "{what}: panic: {stderr}");
            let first = stderr
                .lines()
                .find(|l| l.starts_with("kpack: error: "))
                .unwrap_or_else(|| panic!("{what}: no `kpack: error:` line: {stderr}"));
            let _ = first;
            assert!(
                both.contains(&case.message),
                "{what}: error lacks {:?}: {both}",
                case.message
            );
            assert!(
                both.contains(&*file_name.to_string_lossy()),
                "{what}: error does not name the input: {both}"
            );
            // split stages its outputs inside OUT, so OUT itself may have
            // been created; it must be empty.
            if out.is_dir() {
                assert!(
                    listing(&out).is_empty(),
                    "{what}: output left behind: {:?}",
                    listing(&out)
                );
                fs::remove_dir(&out).unwrap();
            }
            assert_eq!(
                listing(work.path()),
                before,
                "{what}: output written (or input changed)"
            );
        }
        if let Some((kind, code)) = &case.capi {
            check_capi(case, &src, kind, *code);
            capi_checked += 1;
        }
    }
    assert!(capi_checked >= 15, "only {capi_checked} C API cases");
}

fn check_capi(case: &Case, path: &Path, kind: &str, code: i32) {
    use rocm_kpack::*;
    let what = format!("cases.txt:{} {} (C API)", case.line, case.name);
    let c = CString::new(path.to_str().unwrap()).unwrap();
    let mut a: *mut KpackArchive = std::ptr::null_mut();
    // SAFETY: valid C string and out-pointer.
    let e = unsafe { kpack_open(c.as_ptr(), &mut a) } as i32;
    match kind {
        "open" => {
            assert_eq!(e, code, "{what}: kpack_open");
            assert!(a.is_null(), "{what}: handle written on failure");
            let mut n = 0usize;
            unsafe extern "C" fn count(_: *const c_char, n: *mut c_void) -> bool {
                // SAFETY: user data is the &mut usize passed below.
                unsafe { *n.cast::<usize>() += 1 };
                true
            }
            // SAFETY: valid C string, callback and user data.
            let e2 = unsafe {
                kpack_enumerate_architectures(
                    c.as_ptr(),
                    Some(count),
                    (&mut n as *mut usize).cast(),
                )
            } as i32;
            assert_eq!(e2, code, "{what}: kpack_enumerate_architectures");
            assert_eq!(n, 0);
        }
        "kernel" => {
            assert_eq!(e, 0, "{what}: kpack_open should succeed");
            let mut codes = BTreeSet::new();
            // SAFETY: `a` is a live handle; out-pointers are valid; strings
            // are owned by the handle until kpack_close.
            unsafe {
                let (mut nb, mut na) = (0usize, 0usize);
                assert_eq!(kpack_get_binary_count(a, &mut nb) as i32, 0);
                assert_eq!(kpack_get_architecture_count(a, &mut na) as i32, 0);
                let archive = kpack_core::archive::Archive::open(path).unwrap();
                for (key, target) in archive.keys_and_targets() {
                    let (k, t) = (CString::new(key).unwrap(), CString::new(target).unwrap());
                    let mut p: *mut c_void = std::ptr::null_mut();
                    let mut size = 0usize;
                    let e = kpack_get_kernel(a, k.as_ptr(), t.as_ptr(), &mut p, &mut size) as i32;
                    if e == 0 {
                        kpack_free_kernel(p);
                    } else {
                        assert!(p.is_null(), "{what}: buffer written on failure");
                    }
                    codes.insert(e);
                }
                let _ = CStr::from_ptr(c.as_ptr());
                kpack_close(a);
            }
            assert!(
                codes.contains(&code),
                "{what}: kpack_get_kernel gave {codes:?}"
            );
        }
        k => panic!("{what}: unknown C API check {k}"),
    }
}

// ---------------------------------------------------------------------------
// Regenerating the corpus.

mod make {
    use kpack_core::archive::{ArchiveWriter, Scheme};
    use kpack_core::msgpack::{self, Value};

    pub fn le64(v: u64) -> [u8; 8] {
        v.to_le_bytes()
    }

    /// An uncompressed bundle from raw (triple, data) entries, data right
    /// after the table (no alignment).
    pub fn bundle(entries: &[(&[u8], &[u8])]) -> Vec<u8> {
        let table: usize = 32 + entries.iter().map(|(t, _)| 24 + t.len()).sum::<usize>();
        let mut out = b"__CLANG_OFFLOAD_BUNDLE__".to_vec();
        out.extend(le64(entries.len() as u64));
        let mut pos = table as u64;
        for (t, d) in entries {
            out.extend(le64(pos));
            out.extend(le64(d.len() as u64));
            out.extend(le64(t.len() as u64));
            out.extend_from_slice(t);
            pos += d.len() as u64;
        }
        for (_, d) in entries {
            out.extend_from_slice(d);
        }
        out
    }

    pub const HOST: &[u8] = b"host-x86_64-unknown-linux--";
    pub const GFX1100: &[u8] = b"hipv4-amdgcn-amd-amdhsa--gfx1100";
    pub const GFX942: &[u8] = b"hipv4-amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-";

    pub fn good_bundle() -> Vec<u8> {
        bundle(&[
            (HOST, b""),
            (GFX1100, b"\x7fELF code object for gfx1100"),
            (GFX942, b"\x7fELF code object for gfx942"),
        ])
    }

    /// A CCOB header (v1: 20 bytes, v2: 24, v3: 32) and payload.
    pub fn ccob(version: u16, method: u16, total: u64, size: u64, payload: &[u8]) -> Vec<u8> {
        let mut out = b"CCOB".to_vec();
        out.extend(version.to_le_bytes());
        out.extend(method.to_le_bytes());
        match version {
            1 => {
                out.extend((size as u32).to_le_bytes());
                out.extend(le64(0));
            }
            2 => {
                out.extend((total as u32).to_le_bytes());
                out.extend((size as u32).to_le_bytes());
                out.extend(le64(0));
            }
            _ => {
                out.extend(le64(total));
                out.extend(le64(size));
                out.extend(le64(0));
            }
        }
        out.extend_from_slice(payload);
        out
    }

    /// A v2 zstd CCOB of `inner`, with correct sizes.
    pub fn ccob_of(inner: &[u8]) -> Vec<u8> {
        let payload = zstd::bulk::compress(inner, 3).unwrap();
        ccob(
            2,
            1,
            24 + payload.len() as u64,
            inner.len() as u64,
            &payload,
        )
    }

    /// `KPAK` header + blob + TOC bytes, with the TOC offset right.
    pub fn kpak(version: u32, blob: &[u8], toc: &[u8]) -> Vec<u8> {
        let mut out = b"KPAK".to_vec();
        out.extend(version.to_le_bytes());
        out.extend(le64(64 + blob.len() as u64));
        out.resize(64, 0);
        out.extend_from_slice(blob);
        out.extend_from_slice(toc);
        out
    }

    /// A valid archive: (blob, TOC value) of two kernels of two keys.
    pub fn valid(scheme: Scheme) -> (Vec<u8>, Value) {
        let mut w = ArchiveWriter::new("g", "gfx1100", vec!["gfx1100".into()]).scheme(scheme);
        w.add(
            "lib/liba.so#0",
            "gfx1100",
            &b"kernel a for gfx1100, kernel a, kernel a"[..],
            None,
        )
        .unwrap();
        w.add(
            "lib/libb.so#0",
            "gfx1100",
            &b"kernel b for gfx1100 (the second one)"[..],
            None,
        )
        .unwrap();
        let bytes = w.to_vec().unwrap();
        let toc = u64::from_le_bytes(bytes[8..16].try_into().unwrap()) as usize;
        (
            bytes[64..toc].to_vec(),
            msgpack::decode(&bytes[toc..]).unwrap(),
        )
    }

    /// Replace (or add, or with `None` remove) a top-level TOC field.
    pub fn set(toc: &Value, key: &str, v: Option<Value>) -> Value {
        let Value::Map(m) = toc else {
            panic!("TOC map")
        };
        let mut m: Vec<(Value, Value)> = m.clone();
        let at = m.iter().position(|(k, _)| k.as_str() == Some(key));
        match (at, v) {
            (Some(i), Some(v)) => m[i].1 = v,
            (Some(i), None) => {
                m.remove(i);
            }
            (None, Some(v)) => m.push((Value::from(key.to_string()), v)),
            (None, None) => {}
        }
        Value::Map(m)
    }

    /// The TOC entry of the first kernel, changed by `f`.
    pub fn with_entry(toc: &Value, f: impl FnOnce(&mut Vec<(Value, Value)>)) -> Value {
        let Value::Map(m) = toc else { panic!() };
        let mut m = m.clone();
        let t = m
            .iter_mut()
            .find(|(k, _)| k.as_str() == Some("toc"))
            .unwrap();
        let Value::Map(keys) = &mut t.1 else { panic!() };
        let Value::Map(targets) = &mut keys[0].1 else {
            panic!()
        };
        let Value::Map(entry) = &mut targets[0].1 else {
            panic!()
        };
        f(entry);
        Value::Map(m)
    }

    pub fn put(entry: &mut Vec<(Value, Value)>, key: &str, v: Value) {
        match entry.iter_mut().find(|(k, _)| k.as_str() == Some(key)) {
            Some(e) => e.1 = v,
            None => entry.push((Value::from(key.to_string()), v)),
        }
    }
}

/// Rebuild the corpus files (not cases.txt, which is written by hand).
#[test]
#[ignore = "rewrites tests/malformed; run by hand after changing it"]
fn regenerate_malformed_corpus() {
    use kpack_core::archive::Scheme;
    use kpack_core::elf::{Headers, SectionHeader, SHDR_SIZE};
    use kpack_core::msgpack::{self, encode, Value};
    use make::*;

    let root = corpus();
    let w = |rel: &str, bytes: &[u8]| {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, bytes).unwrap();
    };

    // -- Bundles.
    let good = good_bundle();
    w("bundle/truncated-count.bin", &good[..28]);
    let mut b = good.clone();
    b[24..32].copy_from_slice(&le64(u64::MAX / 2));
    w("bundle/too-many-entries.bin", &b);
    w("bundle/entry-past-end.bin", &good[..good.len() - 5]);
    let mut b = bundle(&[(GFX1100, b"abc")]);
    b[32..40].copy_from_slice(&le64(u64::MAX - 1)); // offset + size overflows
    w("bundle/entry-offset-overflow.bin", &b);
    w(
        "bundle/triple-not-ascii.bin",
        &bundle(&[(b"hipv4-amdgcn-amd-amdhsa--gfx11\xff0", b"x")]),
    );
    w(
        "bundle/duplicate-target.bin",
        &bundle(&[(GFX1100, b"one"), (GFX1100, b"two")]),
    );
    let mut b = good.clone();
    b.extend_from_slice(b"\0\0\0\0__CLANG_OFFLOAD_BUNDLX__");
    w("bundle/bad-magic-after-first.bin", &b);
    let mut b = bundle(&[(GFX1100, b"x")]);
    b[48..56].copy_from_slice(&le64(1 << 40)); // triple length
    w("bundle/triple-length-huge.bin", &b);
    w(
        "bundle/target-escapes-dir.bin",
        &bundle(&[
            (HOST, b""),
            (b"hipv4-amdgcn-amd-amdhsa--../../../evil", b"PWNED"),
        ]),
    );
    w(
        "bundle/target-absolute-path.bin",
        &bundle(&[(b"hipv4-amdgcn-amd-amdhsa--/tmp/kpack-evil", b"PWNED")]),
    );
    w(
        "bundle/no-target.bin",
        &bundle(&[(b"hipv4-amdgcn-amd-amdhsa-gfx1100", b"x")]),
    );

    // -- Compressed bundles.
    let c = ccob_of(&good);
    w("ccob/truncated-header.bin", &c[..14]);
    let mut b = c.clone();
    b[4..6].copy_from_slice(&9u16.to_le_bytes());
    w("ccob/unknown-version.bin", &b);
    let mut b = c.clone();
    b[6..8].copy_from_slice(&7u16.to_le_bytes());
    w("ccob/unknown-method.bin", &b);
    let mut b = c.clone();
    b[8..12].copy_from_slice(&10u32.to_le_bytes());
    w("ccob/total-smaller-than-header.bin", &b);
    let mut b = c.clone();
    b[8..12].copy_from_slice(&((c.len() + 100) as u32).to_le_bytes());
    w("ccob/total-past-end.bin", &b);
    let mut b = c.clone();
    b[12..16].copy_from_slice(&((good.len() + 1) as u32).to_le_bytes());
    w("ccob/size-mismatch.bin", &b);
    let mut b = c.clone();
    let n = b.len();
    for x in &mut b[30..n - 4] {
        *x ^= 0x5a;
    }
    w("ccob/corrupt-zstd.bin", &b);
    w(
        "ccob/corrupt-zlib.bin",
        &ccob(2, 0, 24 + 8, 100, b"\x78\x9c\xff\xff\xff\xff\xff\xff"),
    );
    let junk = b"this is not an offload bundle at all".repeat(3);
    w("ccob/payload-not-a-bundle.bin", &ccob_of(&junk));
    w("ccob/payload-all-zero.bin", &ccob_of(&[0u8; 64]));
    w(
        "ccob/v3-too-large.bin",
        &ccob(3, 1, 32 + 4, 1 << 40, b"abcd"),
    );
    w(
        "ccob/inner-bundle-truncated.bin",
        &ccob_of(&good[..good.len() - 3]),
    );

    // -- Archives.
    let (zblob, ztoc) = valid(Scheme::ZstdPerKernel);
    let (nblob, ntoc) = valid(Scheme::None);
    let z = |toc: &Value| kpak(1, &zblob, &encode(toc));
    let n = |toc: &Value| kpak(1, &nblob, &encode(toc));
    let good_z = z(&ztoc);
    w(
        "archive/bad-magic.kpack",
        &[b"KPAX".as_slice(), &good_z[4..]].concat(),
    );
    w("archive/truncated-header.kpack", &good_z[..40]);
    w("archive/version-2.kpack", &kpak(2, &zblob, &encode(&ztoc)));
    let mut b = good_z.clone();
    b[8..16].copy_from_slice(&le64(good_z.len() as u64 + 1));
    w("archive/toc-offset-past-end.kpack", &b);
    let mut b = good_z.clone();
    b[8..16].copy_from_slice(&le64(16));
    w("archive/toc-offset-in-header.kpack", &b);
    w(
        "archive/toc-not-msgpack.kpack",
        &kpak(1, &zblob, &[0xc1, 0x00]),
    );
    w(
        "archive/toc-trailing-bytes.kpack",
        &[good_z.clone(), vec![0x01, 0x02]].concat(),
    );
    w("archive/toc-truncated.kpack", &good_z[..good_z.len() - 3]);
    w(
        "archive/toc-not-a-map.kpack",
        &kpak(1, &zblob, &encode(&Value::from(7u64))),
    );
    w(
        "archive/toc-missing-group.kpack",
        &z(&set(&ztoc, "group_name", None)),
    );
    w(
        "archive/toc-arches-not-array.kpack",
        &z(&set(&ztoc, "gfx_arches", Some(Value::from(3u64)))),
    );
    w(
        "archive/toc-unknown-scheme.kpack",
        &z(&set(
            &ztoc,
            "compression_scheme",
            Some(Value::from("lz4".to_string())),
        )),
    );
    w(
        "archive/toc-format-version-2.kpack",
        &z(&set(&ztoc, "format_version", Some(Value::from(2u64)))),
    );
    w(
        "archive/zstd-blob-outside.kpack",
        &z(&set(&ztoc, "zstd_size", Some(Value::from(1u64 << 20)))),
    );
    let mut zb = zblob.clone();
    zb[0..4].copy_from_slice(&(2_000_000u32).to_le_bytes());
    w(
        "archive/too-many-frames.kpack",
        &kpak(1, &zb, &encode(&ztoc)),
    );
    let mut zb = zblob.clone();
    zb[4..8].copy_from_slice(&(100_000u32).to_le_bytes());
    w(
        "archive/frame-past-blob.kpack",
        &kpak(1, &zb, &encode(&ztoc)),
    );
    let mut zb = zblob.clone();
    let l = zb.len();
    for x in &mut zb[20..l - 40] {
        *x ^= 0xa5;
    }
    w("archive/frame-corrupt.kpack", &kpak(1, &zb, &encode(&ztoc)));
    w(
        "archive/ordinal-out-of-range.kpack",
        &z(&with_entry(&ztoc, |e| put(e, "ordinal", Value::from(5u64)))),
    );
    w(
        "archive/ordinal-over-u32.kpack",
        &z(&with_entry(&ztoc, |e| {
            put(e, "ordinal", Value::from(1u64 << 33))
        })),
    );
    w(
        "archive/original-size-negative.kpack",
        &z(&with_entry(&ztoc, |e| {
            put(e, "original_size", Value::from(-5i64))
        })),
    );
    w(
        "archive/original-size-wrong.kpack",
        &z(&with_entry(&ztoc, |e| {
            put(e, "original_size", Value::from(3u64))
        })),
    );
    w(
        "archive/original-size-huge.kpack",
        &z(&with_entry(&ztoc, |e| {
            put(e, "original_size", Value::from(1u64 << 40))
        })),
    );
    w(
        "archive/blob-outside.kpack",
        &n(&set(
            &ntoc,
            "blobs",
            Some(Value::Array(vec![
                msgpack::str_map([
                    ("offset", Value::from(64u64)),
                    ("size", Value::from(1u64 << 30)),
                ]),
                msgpack::str_map([("offset", Value::from(64u64)), ("size", Value::from(1u64))]),
            ])),
        )),
    );
    w(
        "archive/noop-size-mismatch.kpack",
        &n(&with_entry(&ntoc, |e| {
            put(e, "original_size", Value::from(2u64))
        })),
    );
    // The same key twice in the TOC map, with the same target.
    let Value::Map(top) = &ztoc else { panic!() };
    let mut top = top.clone();
    let t = top
        .iter_mut()
        .find(|(k, _)| k.as_str() == Some("toc"))
        .unwrap();
    let Value::Map(keys) = &mut t.1 else { panic!() };
    let first = keys[0].clone();
    keys.push(first);
    w("archive/duplicate-kernel.kpack", &z(&Value::Map(top)));
    // A TOC nested deeper than the decoder allows.
    let mut deep = vec![0x91u8; 100];
    deep.push(0xc0);
    w("archive/toc-too-deep.kpack", &kpak(1, &zblob, &deep));
    w("archive/empty.kpack", b"");

    // -- ELF binaries, from the smallest fat fixture (one CCOB bundle).
    let fat = fs::read(fixture("libvadd_compressed.so").path).unwrap();
    let h = Headers::parse(&fat).unwrap();
    let shdr_at = |i: usize| h.file.e_shoff as usize + i * SHDR_SIZE;
    let patch_section = |name: &str, f: &dyn Fn(&mut SectionHeader)| {
        let i = h.section_index(name).unwrap();
        let mut s = h.shdrs[i];
        f(&mut s);
        let mut b = fat.clone();
        b[shdr_at(i)..shdr_at(i) + SHDR_SIZE].copy_from_slice(&s.to_bytes());
        b
    };
    w("elf/truncated-header.so", &fat[..40]);
    let mut b = fat.clone();
    b[4] = 1; // ELFCLASS32
    w("elf/elf32.so", &b);
    let mut b = fat.clone();
    b[40..48].copy_from_slice(&le64(fat.len() as u64 + 4096));
    w("elf/shoff-past-end.so", &b);
    let mut b = fat.clone();
    b[32..40].copy_from_slice(&le64(fat.len() as u64 - 8));
    w("elf/phoff-past-end.so", &b);
    w(
        "elf/fatbin-past-end.so",
        &patch_section(".hip_fatbin", &|s| s.sh_size = 1 << 32),
    );
    w(
        "elf/wrappers-odd-size.so",
        &patch_section(".hipFatBinSegment", &|s| s.sh_size = 25),
    );
    // No .hip_fatbin: rename it in .shstrtab.
    let mut b = fat.clone();
    let i = h.section_index(".hip_fatbin").unwrap();
    let strtab = h.shdrs[h.file.e_shstrndx as usize];
    let at = strtab.sh_offset as usize + h.shdrs[i].sh_name as usize;
    assert_eq!(&b[at..at + 11], b".hip_fatbin");
    b[at + 10] = b'X';
    w("elf/no-fatbin.so", &b);
    // Wrapper magic and pointer.
    let ws = h.shdrs[h.section_index(".hipFatBinSegment").unwrap()];
    let mut b = fat.clone();
    b[ws.sh_offset as usize..ws.sh_offset as usize + 4].copy_from_slice(b"ABCD");
    w("elf/wrapper-bad-magic.so", &b);
    // Corrupt the CCOB inside .hip_fatbin.
    let fs_ = h.shdrs[i];
    let mut b = fat.clone();
    let o = fs_.sh_offset as usize;
    b[o + 4..o + 6].copy_from_slice(&9u16.to_le_bytes());
    w("elf/fatbin-bad-ccob.so", &b);
    let mut b = fat.clone();
    b[o..o + 4].copy_from_slice(b"JUNK");
    w("elf/fatbin-junk.so", &b);
    // .hip_fatbin NOBITS, wrappers still HIPF.
    w(
        "elf/half-offloaded.so",
        &patch_section(".hip_fatbin", &|s| s.sh_type = 8), // SHT_NOBITS
    );
    // A relocatable object type with a PT_LOAD layout is still an ELF we do
    // not rewrite: unsupported machine instead.
    let mut b = fat.clone();
    b[18..20].copy_from_slice(&0x28u16.to_le_bytes()); // EM_ARM
    w("elf/unsupported-machine.so", &b);

    // -- Offloaded binaries with broken metadata.
    let tmp = tempfile::tempdir().unwrap();
    let host = tmp.path().join("lib/libvadd_compressed.so");
    kpack_ok(&[
        &"offload",
        &fixture("libvadd_compressed.so").path,
        &"-o",
        &host,
        &"--archive-dir",
        &tmp.path().join(".kpack"),
    ]);
    let off = fs::read(&host).unwrap();
    let oh = Headers::parse(&off).unwrap();
    let mi = oh.section_index(".rocm_kpack_ref").unwrap();
    let m = oh.shdrs[mi];
    let (mo, ml) = (m.sh_offset as usize, m.sh_size as usize);
    let with_meta = |meta: &[u8]| {
        assert!(meta.len() <= ml, "metadata too long for the section");
        let mut b = off.clone();
        b[mo..mo + ml].fill(0);
        b[mo..mo + meta.len()].copy_from_slice(meta);
        b
    };
    w("metadata/not-msgpack.so", &with_meta(&[0xc1]));
    w(
        "metadata/not-a-map.so",
        &with_meta(&encode(&Value::from(1u64))),
    );
    w(
        "metadata/no-kernel-name.so",
        &with_meta(&encode(&msgpack::str_map([(
            "kpack_search_paths",
            Value::Array(vec![Value::from("x".to_string())]),
        )]))),
    );
    w(
        "metadata/no-search-paths.so",
        &with_meta(&encode(&msgpack::str_map([
            ("kpack_search_paths", Value::Array(vec![])),
            ("kernel_name", Value::from("k".to_string())),
        ]))),
    );
    w(
        "metadata/kernel-name-not-str.so",
        &with_meta(&encode(&msgpack::str_map([
            (
                "kpack_search_paths",
                Value::Array(vec![Value::from("x".to_string())]),
            ),
            ("kernel_name", Value::from(5u64)),
        ]))),
    );
    w(
        "metadata/search-path-not-str.so",
        &with_meta(&encode(&msgpack::str_map([
            ("kpack_search_paths", Value::Array(vec![Value::Nil])),
            ("kernel_name", Value::from("k".to_string())),
        ]))),
    );
    // A HIPK wrapper whose pointer misses the metadata.
    let ows = oh.shdrs[oh.section_index(".hipFatBinSegment").unwrap()];
    let mut b = off.clone();
    let at = ows.sh_offset as usize;
    b[at..at + 4].copy_from_slice(b"HIPF");
    w("metadata/wrapper-back-to-hipf.so", &b);

    // -- Artifact trees and packaging configs. A file's content is text, or
    // `@<corpus file>` for a copy of that file, or `->target` for a symlink.
    let junk_elf = fs::read(root.join("elf/fatbin-junk.so")).unwrap();
    let fat_elf = fat.clone();
    let tree = |case: &str, entries: &[(&str, &str)]| {
        let dir = root.join(case);
        if dir.exists() {
            fs::remove_dir_all(&dir).unwrap();
        }
        for (rel, content) in entries {
            let p = dir.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            if let Some(t) = content.strip_prefix("->") {
                std::os::unix::fs::symlink(t, &p).unwrap();
            } else if *content == "@junk" {
                fs::write(&p, &junk_elf).unwrap();
            } else if *content == "@fat" {
                fs::write(&p, &fat_elf).unwrap();
            } else if *content == "/" {
                fs::create_dir_all(&p).unwrap();
            } else {
                fs::write(&p, content).unwrap();
            }
        }
    };
    const A: &str = "foo_lib_gfx1100";
    let m = |rel: &str| format!("{A}/{rel}");
    tree("split/no-manifest", &[(&m("stage/lib/x.txt"), "x")]);
    tree(
        "split/manifest-dotdot",
        &[
            (&m("artifact_manifest.txt"), "stage\n../outside\n"),
            (&m("stage/x"), "x"),
        ],
    );
    tree(
        "split/manifest-absolute",
        &[(&m("artifact_manifest.txt"), "/etc\n")],
    );
    tree(
        "split/manifest-nested",
        &[
            (&m("artifact_manifest.txt"), "stage\nstage/lib\n"),
            (&m("stage/lib/x"), "x"),
        ],
    );
    tree(
        "split/manifest-root",
        &[(&m("artifact_manifest.txt"), "./\n")],
    );
    tree(
        "split/manifest-not-utf8",
        &[(&m("artifact_manifest.txt"), "stage\u{0}")],
    );
    fs::write(
        root.join("split/manifest-not-utf8")
            .join(m("artifact_manifest.txt")),
        b"st\xffage\n",
    )
    .unwrap();
    tree(
        "split/prefix-symlink-outside",
        &[
            (&m("artifact_manifest.txt"), "stage\n"),
            (&m("stage"), "->.."),
        ],
    );
    tree(
        "split/prefix-is-a-file",
        &[
            (&m("artifact_manifest.txt"), "stage\n"),
            (&m("stage"), "not a directory"),
        ],
    );
    tree(
        "split/bad-fat-binary",
        &[
            (&m("artifact_manifest.txt"), "stage\n"),
            (&m("stage/lib/libbad.so"), "@junk"),
            (&m("stage/lib/libgood.so"), "@fat"),
        ],
    );
    tree(
        "split-batch/duplicate-prefix",
        &[
            ("foo_lib_gfx1100/artifact_manifest.txt", "stage\n"),
            ("foo_lib_gfx1100/stage/x", "x"),
            ("foo_lib_gfx1101/artifact_manifest.txt", "stage\n"),
            ("foo_lib_gfx1101/stage/x", "x"),
        ],
    );
    tree(
        "split-batch/no-family",
        &[
            ("foolib/artifact_manifest.txt", "stage\n"),
            ("foolib/stage/x", "x"),
        ],
    );
    tree(
        "verify/generic-with-fat-binary",
        &[
            ("foo_lib_generic/artifact_manifest.txt", "stage\n"),
            ("foo_lib_generic/stage/lib/libfat.so", "@fat"),
        ],
    );
    tree(
        "verify/missing-manifest",
        &[("foo_lib_generic/stage/x", "x")],
    );
    tree(
        "verify/target-without-generic",
        &[
            ("foo_lib_gfx1100/artifact_manifest.txt", "stage\n"),
            (
                "foo_lib_gfx1100/stage/.kpack/foo_lib_gfx1100.kpack",
                "not an archive",
            ),
        ],
    );
    let bad_archive = fs::read(root.join("archive/frame-corrupt.kpack")).unwrap();
    tree(
        "verify/corrupt-archive",
        &[
            ("foo_lib_generic/artifact_manifest.txt", "stage\n"),
            ("foo_lib_generic/stage/README", "host files"),
            ("foo_lib_gfx1100/artifact_manifest.txt", "stage\n"),
        ],
    );
    fs::create_dir_all(root.join("verify/corrupt-archive/foo_lib_gfx1100/stage/.kpack")).unwrap();
    fs::write(
        root.join("verify/corrupt-archive/foo_lib_gfx1100/stage/.kpack/foo_lib_gfx1100.kpack"),
        &bad_archive,
    )
    .unwrap();
    tree(
        "pack-tree/bad-fat-binary",
        &[("lib/libbad.so", "@junk"), ("share/doc/README", "x")],
    );
    tree(
        "recombine-tree/no-shards",
        &[
            (
                "config.json",
                r#"{"primary_shard": "a", "architecture_groups": {"gfx110X": {"architectures": ["gfx1100"]}}}"#,
            ),
            ("shards/README", "no shard directories here"),
        ],
    );
    for (name, text) in [
        ("empty", ""),
        ("not-json", "{\"primary_shard\": "),
        ("not-an-object", "[1, 2]"),
        (
            "unknown-field",
            r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": ["gfx1100"]}}, "extra": 1}"#,
        ),
        (
            "missing-primary",
            r#"{"architecture_groups": {"g": {"architectures": ["gfx1100"]}}}"#,
        ),
        (
            "primary-not-string",
            r#"{"primary_shard": 3, "architecture_groups": {"g": {"architectures": ["gfx1100"]}}}"#,
        ),
        (
            "groups-empty",
            r#"{"primary_shard": "a", "architecture_groups": {}}"#,
        ),
        (
            "group-name-path",
            r#"{"primary_shard": "a", "architecture_groups": {"../x": {"architectures": ["gfx1100"]}}}"#,
        ),
        (
            "group-name-generic",
            r#"{"primary_shard": "a", "architecture_groups": {"generic": {"architectures": ["gfx1100"]}}}"#,
        ),
        (
            "architectures-empty",
            r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": []}}}"#,
        ),
        (
            "architecture-not-gfx",
            r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": ["sm_90"]}}}"#,
        ),
        (
            "architecture-bad-feature",
            r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": ["gfx90a:xnack"]}}}"#,
        ),
        (
            "processor-in-two-groups",
            r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": ["gfx1100"]}, "h": {"architectures": ["gfx1100"]}}}"#,
        ),
        (
            "validation-unknown",
            r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": ["gfx1100"]}}, "validation": {"error_on_everything": true}}"#,
        ),
        (
            "validation-not-bool",
            r#"{"primary_shard": "a", "architecture_groups": {"g": {"architectures": ["gfx1100"]}}, "validation": {"error_on_duplicate_device_code": "yes"}}"#,
        ),
    ] {
        w(&format!("config/{name}.json"), text.as_bytes());
    }
}
