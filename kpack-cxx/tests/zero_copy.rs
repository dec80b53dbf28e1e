//! Who owns the code objects the C API hands out (docs/runtime.md):
//! `tests/c/zero_copy_test.c`, linked against the installed
//! `librocm_kpack.a`, checks through the C API that a code object stored
//! uncompressed is a private mapping of the archive (the pointer lies in a
//! mapping of the archive file, at the code object's offset; a write to one
//! load is seen by no other), that it stays valid after
//! `kpack_cache_destroy` / `kpack_close` and is unmapped by its free, that
//! decompressed buffers are recycled and stay `free()`-able, and that 16
//! threads loading and freeing (often another thread's buffers, the last
//! ones after the cache is gone) agree; natively and under valgrind
//! (memcheck, helgrind, DRD).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::common::zero_copy::{bytes, setup, SIZES};
use crate::common::*;

fn program() -> &'static Path {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        let out = build_dir("zero_copy").join("zero_copy_test");
        let mut p = crate::common::program("c11");
        p.cc().flag("-pthread");
        p.input(crate_dir().join("tests/c/zero_copy_test.c"))
            .static_runtime(&installed().join("lib/librocm_kpack.a"));
        built(p.link(&out));
        out
    })
}

fn args<'a>(mode: &'a str, dir: &'a Path, extra: &[&'a str]) -> Vec<String> {
    let mut v = vec![
        mode.to_string(),
        dir.to_str().unwrap().to_string(),
        SIZES.len().to_string(),
    ];
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

fn run(mode: &str, dir: &Path, extra: &[&str]) {
    let a = args(mode, dir, extra);
    let out = run_ok(
        Command::new(program())
            .args(&a)
            .env_remove("ROCM_KPACK_PATH")
            .env_remove("ROCM_KPACK_PATH_PREFIX")
            .env_remove("ROCM_KPACK_DISABLE"),
    );
    assert!(stdout(&out).contains("PASS"), "{}", stderr(&out));
}

fn under_valgrind(tool: &str, mode: &str, dir: &Path, extra: &[&str]) {
    let a = args(mode, dir, extra);
    if tool == "memcheck" {
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        run_under_valgrind(tool, program(), &a, &[]);
        return;
    }
    // The thread checkers, without their false reports on the futex word
    // of Rust's Mutex (see the suppression file).
    let supp = crate_dir().join("tests/valgrind/rust-futex.supp");
    let out = run_ok(
        valgrind()
            .arg(format!("--tool={tool}"))
            .arg("--error-exitcode=99")
            .arg("--quiet")
            .arg(format!("--suppressions={}", supp.display()))
            .arg(program())
            .args(&a),
    );
    assert!(stdout(&out).contains("PASS"), "{tool}: {}", stderr(&out));
}

/// The archives on disk are never written through a mapping.
fn unchanged(dir: &Path) {
    for target in ["gfx1100", "gfx1101"] {
        let a = kpack_loader::open_archive(dir.join(format!("a_{target}.kpack"))).unwrap();
        for i in 0..SIZES.len() {
            assert_eq!(
                a.kernel(&format!("app#{i}"), target).unwrap(),
                bytes(target, i)
            );
        }
    }
}

#[test]
fn uncompressed_code_objects_are_private_mappings() {
    let (_tmp, dir) = setup();
    run("none", &dir, &[]);
    under_valgrind("memcheck", "none", &dir, &[]);
    unchanged(&dir);
}

#[test]
fn decompressed_buffers_are_recycled_and_free_able() {
    let (_tmp, dir) = setup();
    run("zstd", &dir, &[]);
    under_valgrind("memcheck", "zstd", &dir, &[]);
}

#[test]
fn sixteen_threads_load_and_free_across_threads_and_after_destroy() {
    let (_tmp, dir) = setup();
    run("threads", &dir, &["16", "2000"]);
    under_valgrind("memcheck", "threads", &dir, &["16", "100"]);
    under_valgrind("helgrind", "threads-steady", &dir, &["16", "50"]);
    under_valgrind("drd", "threads-steady", &dir, &["16", "50"]);
    unchanged(&dir);
}

/// The same through the rlib, with ROCM_KPACK_DEBUG: upstream's lines on
/// stderr, nothing on stdout, and the zero-copy load said so.
#[test]
fn debug_lines_go_to_stderr_in_upstream_format() {
    let (_tmp, dir) = setup();
    let out = Command::new(program())
        .args(args("none", &dir, &[]))
        .env("ROCM_KPACK_DEBUG", "1")
        .output()
        .unwrap();
    assert!(out.status.success());
    let so = stdout(&out);
    assert_eq!(
        so.trim(),
        "PASS",
        "stdout holds only the program's own line"
    );
    let err = stderr(&out);
    let a = dir.join("a_gfx1100.kpack");
    for want in [
        "kpack: cache created: disabled=0, debug=1, override_paths=0, prefix_paths=0".to_string(),
        "kpack: parsed HIPK metadata: kernel_name='app', co_index=0, lookup_key='app#0', 1 search paths"
            .to_string(),
        format!(
            "kpack: expanded pattern: a_@GFXARCH@.kpack -> {}",
            a.display()
        ),
        "kpack: trying architecture: gfx1100".to_string(),
        format!("kpack: opened and cached archive: {}", a.display()),
        "kpack:   architecture: gfx1100".to_string(),
        format!("kpack:   archive {} has architecture gfx1100", a.display()),
        "kpack:   found kernel: 100 bytes".to_string(),
        "kpack: loaded code object: 100 bytes".to_string(),
    ] {
        assert!(
            err.lines().any(|l| l == want),
            "missing {want:?} in:\n{err}"
        );
    }
    // Upstream's line as it prints it, kpack's remark on the next line.
    let lines: Vec<&str> = err.lines().collect();
    let at = lines
        .iter()
        .position(|l| *l == "kpack: loaded code object: 100 bytes")
        .unwrap();
    assert_eq!(
        lines.get(at + 1).copied(),
        Some("kpack:   (mapped from the archive, no copy)"),
        "{err}"
    );
    assert!(err.lines().all(|l| l.starts_with("kpack: ")), "{err}");
}
