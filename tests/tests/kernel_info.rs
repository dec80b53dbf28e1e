//! `kpack_get_kernel_info` (and `kpack::Archive::kernel_info`, and
//! `kpack.Archive.info` in python/tests) on archives `kpack offload` and
//! `kpack split` made of real fixtures, through a C11 and a C++17 program
//! linked against the installed runtime: for every code object, the size
//! it reports is the size of the bytes `kpack_get_kernel` hands out, and
//! its stored size is the one kpack's own reader gives.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use kpack_format::archive::Scheme;

use crate::common::*;

/// `tests/capi/<name>`, built once per test process against the installed
/// runtime (a C++ source also with the C++ API's glue).
fn program(name: &str) -> PathBuf {
    let root = workspace();
    let inst = installed_runtime();
    let src = root.join("tests/capi").join(name);
    let out = e2e_build_dir().join(name.replace('.', "_"));
    let cxx = name.ends_with(".cpp");
    let mut p = if cxx {
        Program::cxx("c++17")
    } else {
        Program::c("c11")
    };
    p.strict()
        .cc()
        .flag("-pedantic")
        .define("ROCM_KPACK_STATIC", None)
        .include(inst.join("include"));
    p.input(&src);
    if cxx {
        p.cc().flag("-pthread");
        p.input(inst.join("lib/librocm_kpack_cxx.a"));
    }
    p.static_runtime(&inst.join("lib/librocm_kpack.a"));
    built(p.link(&out));
    out
}

fn c_program() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| program("kernel_info.c"))
}

fn cxx_program() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| program("kernel_info.cpp"))
}

/// Every `.kpack` under `dir`, sorted.
fn archives_under(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            archives_under(&p, out);
        } else if p.extension().is_some_and(|x| x == "kpack") {
            out.push(p);
        }
    }
    out.sort();
}

/// Archives of both schemes: `kpack offload` of three fixtures, and
/// `kpack split` of an artifact holding them.
fn make_archives(t: &Path) -> Vec<PathBuf> {
    let fixtures = fixtures_dir();
    let libs = ["libvadd.so", "libmulti.so", "libwide.so"];
    for scheme in ["zstd", "none"] {
        for lib in libs {
            let ar = t.join(format!("offload-{scheme}"));
            let out = t.join(format!("host-{scheme}")).join(lib);
            kpack_ok(&[
                &"offload",
                &fixtures.join(lib),
                &"-o",
                &out,
                &"--archive-dir",
                &ar,
                &"--compression",
                &scheme,
            ]);
        }
        let art = t.join(format!("shard-{scheme}/fft_lib_gfx110X-dgpu"));
        std::fs::create_dir_all(art.join("stage/lib")).unwrap();
        std::fs::write(art.join("artifact_manifest.txt"), "stage\n").unwrap();
        for lib in libs {
            std::fs::copy(fixtures.join(lib), art.join("stage/lib").join(lib)).unwrap();
        }
        kpack_ok(&[
            &"split",
            &"--artifact-dir",
            &art,
            &"--output-dir",
            &t.join(format!("split-{scheme}")),
            &"--compression",
            &scheme,
        ]);
    }
    let mut v = Vec::new();
    archives_under(t, &mut v);
    v
}

/// What kpack's reader says of every code object: `ENTRY` lines as the
/// programs print them.
fn expected(archives: &[PathBuf]) -> (BTreeSet<String>, BTreeSet<&'static str>) {
    let mut lines = BTreeSet::new();
    let mut schemes = BTreeSet::new();
    for p in archives {
        let a = kpack_loader::open_archive(p).unwrap();
        schemes.insert(a.scheme().name());
        for e in a.entries() {
            let data = a.kernel(&e.key, &e.target).unwrap();
            let stored = a.stored_size(e).unwrap();
            let code = match a.scheme() {
                Scheme::None => 0,
                Scheme::ZstdPerKernel => 1,
            };
            assert!(
                lines.insert(format!(
                    "{} {} {} {} {} {code}",
                    p.display(),
                    e.key,
                    e.target,
                    data.len(),
                    stored
                )),
                "{}: {} @ {} twice",
                p.display(),
                e.key,
                e.target
            );
        }
    }
    (lines, schemes)
}

/// Run `program` on each archive: its `ENTRY` lines, prefixed with the
/// archive, and the code objects it counted.
fn run_on(program: &Path, archives: &[PathBuf]) -> (BTreeSet<String>, usize) {
    let mut lines = BTreeSet::new();
    let mut total = 0;
    for p in archives {
        let out = run_ok(Command::new(program).arg(p));
        for l in out.lines() {
            if let Some(rest) = l.strip_prefix("ENTRY ") {
                lines.insert(format!("{} {rest}", p.display()));
            } else if let Some(n) = l.strip_prefix("PASS ") {
                total += n.parse::<usize>().unwrap();
            }
        }
    }
    (lines, total)
}

#[test]
fn kernel_info_is_what_get_kernel_hands_out() {
    let tmp = scratch();
    let archives = make_archives(tmp.path());
    assert!(archives.len() >= 4, "{archives:?}");
    let (want, schemes) = expected(&archives);
    assert_eq!(schemes.len(), 2, "both schemes: {schemes:?}");
    let (c, c_total) = run_on(c_program(), &archives);
    assert_eq!(c, want);
    assert_eq!(c_total, want.len());
    let (cxx, cxx_total) = run_on(cxx_program(), &archives);
    assert_eq!(cxx, want);
    assert_eq!(cxx_total, want.len());
}

#[test]
fn kernel_info_programs_fail_on_a_bad_archive() {
    // The programs' checks can fail: a file that is no archive is
    // reported, not counted.
    let tmp = scratch();
    let bad = tmp.path().join("bad.kpack");
    std::fs::write(&bad, b"KPAKnot an archive").unwrap();
    for program in [c_program(), cxx_program()] {
        let out = Command::new(program).arg(&bad).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{}", program.display());
        assert!(String::from_utf8_lossy(&out.stderr).contains("bad.kpack"));
    }
}
