//! The malformed-input corpus (`tests/malformed/`): every file (or
//! directory) is run through the `kpack` command named in
//! `tests/malformed/cases.txt` and, for archives, through the C API; each
//! must fail with its own named error: exit code 1, a `kpack: error:` line
//! naming the input and containing the expected text, no panic, and no
//! output left behind.
//!
//! The corpus is committed; `cargo xtask malformed` regenerates its files
//! (tests/testkit/src/malformed/).

use std::collections::BTreeSet;
use std::ffi::{c_char, c_void, CStr, CString};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;

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
    let c = cpath(path);
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
                let archive = kpack_loader::open_archive(path).unwrap();
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
