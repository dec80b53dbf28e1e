//! The C API through a C11 program linked against `librocm_kpack.a`:
//! every function and every error value, the reference archives, the
//! loader's environment variables, target matching, fall-through between
//! archives, threads, `/proc/self/maps` discovery, and valgrind.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::common::*;
use kpack_host::ArchiveWriter;

/// The C test program, built once per test run.
fn program() -> &'static Path {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        let out = build_dir("c_api").join("api_test");
        build_program(
            "c11",
            &crate_dir().join("tests/c/api_test.c"),
            &installed().join("lib/librocm_kpack.a"),
            &out,
        );
        out
    })
}

/// A clean command for the program: no ROCM_KPACK_* from the caller.
fn cmd() -> Command {
    let mut c = Command::new(program());
    for v in [
        "ROCM_KPACK_DISABLE",
        "ROCM_KPACK_DEBUG",
        "ROCM_KPACK_PATH",
        "ROCM_KPACK_PATH_PREFIX",
    ] {
        c.env_remove(v);
    }
    c
}

#[test]
fn archive_functions_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    write_bad_archives(dir.path(), &reference_fixtures());
    let fixtures = reference_fixtures();
    let args = [
        "archive",
        fixtures.to_str().unwrap(),
        dir.path().to_str().unwrap(),
    ];
    let out = run_ok(cmd().args(args));
    assert!(stdout(&out).contains("PASS"));
    run_under_valgrind("memcheck", program(), &args, &[]);
}

#[test]
fn loader_arguments_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (meta, bin) = loader_scenario(dir.path());
    let args = [
        "loader",
        meta.to_str().unwrap(),
        bin.to_str().unwrap(),
        dir.path().to_str().unwrap(),
    ];
    let out = run_ok(cmd().args(args));
    assert!(stdout(&out).contains("PASS"), "{}", stdout(&out));
    run_under_valgrind("memcheck", program(), &args, &[]);
}

/// One `kpack_load_code_object` through the C program: the error code and
/// the bytes.
fn load(
    envs: &[(&str, &str)],
    meta: &Path,
    bin: &Path,
    co: u32,
    archs: &[&str],
) -> (i32, Option<Vec<u8>>, String) {
    let out_dir = tempfile::tempdir().unwrap();
    let out_file = out_dir.path().join("co.bin");
    let mut c = cmd();
    c.arg("load")
        .arg(meta)
        .arg(bin)
        .arg(co.to_string())
        .arg(&out_file)
        .args(archs);
    for (k, v) in envs {
        c.env(k, v);
    }
    let out = run_ok(&mut c);
    let text = stdout(&out);
    let code: i32 = text
        .lines()
        .find_map(|l| l.strip_prefix("code="))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no code in {text}"));
    let bytes = std::fs::read(&out_file).ok();
    assert_eq!(bytes.is_some(), code == 0);
    (code, bytes, stderr(&out))
}

const SUCCESS: i32 = 0;
const NOT_IMPLEMENTED: i32 = 8;
const KERNEL_NOT_FOUND: i32 = 5;
const ARCHIVE_NOT_FOUND: i32 = 13;

#[test]
fn environment_variables() {
    let dir = tempfile::tempdir().unwrap();
    let (meta, bin) = loader_scenario(dir.path());
    let over = dir.path().join("override.kpack");
    let mut w = ArchiveWriter::new("o", "gfx1100", vec!["gfx1100".into()]);
    w.add("app#0", "gfx1100", b"from override".to_vec(), None)
        .unwrap();
    w.write(&over).unwrap();
    let over_s = over.to_str().unwrap();
    let archs = ["gfx1100", "gfx1101"];
    let load = |envs: &[(&str, &str)], co| load(envs, &meta, &bin, co, &archs);

    let (c, b, _) = load(&[], 0);
    assert_eq!((c, b), (SUCCESS, Some(code("app#0", "gfx1100"))));

    // ROCM_KPACK_DISABLE: set, non-empty and not starting with 0.
    for (value, want) in [
        ("1", NOT_IMPLEMENTED),
        ("yes", NOT_IMPLEMENTED),
        ("0", SUCCESS),
        ("00", SUCCESS),
        ("", SUCCESS),
    ] {
        assert_eq!(
            load(&[("ROCM_KPACK_DISABLE", value)], 0).0,
            want,
            "ROCM_KPACK_DISABLE={value:?}"
        );
    }

    // ROCM_KPACK_PATH replaces the embedded paths.
    let (c, b, _) = load(&[("ROCM_KPACK_PATH", over_s)], 0);
    assert_eq!((c, b.as_deref()), (SUCCESS, Some(&b"from override"[..])));
    assert_eq!(load(&[("ROCM_KPACK_PATH", over_s)], 1).0, KERNEL_NOT_FOUND);
    let missing = dir.path().join("missing.kpack");
    assert_eq!(
        load(&[("ROCM_KPACK_PATH", missing.to_str().unwrap())], 0).0,
        ARCHIVE_NOT_FOUND
    );
    // Separators only: unset. Empty components are ignored.
    assert_eq!(
        load(&[("ROCM_KPACK_PATH", ":::")], 0).1,
        Some(code("app#0", "gfx1100"))
    );
    let list = format!("::{}::{over_s}:", missing.display());
    assert_eq!(
        load(&[("ROCM_KPACK_PATH", &list)], 0).1.as_deref(),
        Some(&b"from override"[..])
    );
    // Relative entries resolve against the current directory.
    let mut c = cmd();
    c.current_dir(dir.path())
        .env("ROCM_KPACK_PATH", "override.kpack")
        .arg("load")
        .arg(&meta)
        .arg("/elsewhere/app")
        .arg("0")
        .arg(dir.path().join("rel.bin"))
        .arg("gfx1100");
    let out = run_ok(&mut c);
    assert!(stdout(&out).contains("code=0"), "{}", stdout(&out));
    assert_eq!(
        std::fs::read(dir.path().join("rel.bin")).unwrap(),
        b"from override"
    );

    // ROCM_KPACK_PATH_PREFIX is searched first, then the embedded paths.
    let (c, b, _) = load(&[("ROCM_KPACK_PATH_PREFIX", over_s)], 0);
    assert_eq!((c, b.as_deref()), (SUCCESS, Some(&b"from override"[..])));
    assert_eq!(
        load(&[("ROCM_KPACK_PATH_PREFIX", over_s)], 1).1,
        Some(code("app#1", "gfx1101"))
    );

    // ROCM_KPACK_DEBUG: diagnostic lines on stderr.
    let (_, _, err) = load(&[("ROCM_KPACK_DEBUG", "1")], 1);
    let lines: Vec<&str> = err.lines().collect();
    assert!(
        !lines.is_empty() && lines.iter().all(|l| l.starts_with("kpack: ")),
        "{err}"
    );
    // Upstream's lines (the full sequence: tests/zero_copy.rs).
    for want in [
        "cache created",
        "parsed HIPK metadata: kernel_name='app', co_index=1, lookup_key='app#1'",
        "opened and cached archive",
        "kernel not found in this archive (error 5), trying next candidate",
        "trying architecture: gfx1101",
        "loaded code object:",
    ] {
        assert!(err.contains(want), "missing {want:?} in:\n{err}");
    }
    for quiet in ["0", ""] {
        let (_, _, err) = load(&[("ROCM_KPACK_DEBUG", quiet)], 1);
        assert!(!err.contains("kpack:"), "{err}");
    }
    let (c, _, err) = load(&[("ROCM_KPACK_DEBUG", "1"), ("ROCM_KPACK_DISABLE", "1")], 0);
    assert_eq!(c, NOT_IMPLEMENTED);
    assert!(
        err.contains("kpack: kpack disabled via ROCM_KPACK_DISABLE"),
        "{err}"
    );
}

#[test]
fn target_matching() {
    let dir = tempfile::tempdir().unwrap();
    write_archive(
        &dir.path().join("t_gfx942:sramecc+.kpack"),
        &["gfx942:sramecc+"],
        &[("app#0", "gfx942:sramecc+")],
    );
    write_archive(
        &dir.path().join("t_gfx942.kpack"),
        &["gfx942"],
        &[("app#0", "gfx942"), ("app#1", "gfx942")],
    );
    write_archive(
        &dir.path().join("t_gfx942:xnack+.kpack"),
        &["gfx942:xnack+"],
        &[("app#3", "gfx942:xnack+")],
    );
    write_archive(
        &dir.path().join("t_gfx9-4-generic.kpack"),
        &["gfx9-4-generic"],
        &[("app#2", "gfx9-4-generic")],
    );
    let meta = dir.path().join("m");
    write_metadata(&meta, "app", &["t_@GFXARCH@.kpack"]);
    let bin = dir.path().join("app");
    let agent = "amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-";
    let generic = "amdgcn-amd-amdhsa--gfx9-4-generic";
    let get = |co, archs: &[&str]| load(&[], &meta, &bin, co, archs);
    // Most specific first.
    assert_eq!(get(0, &[agent]).1, Some(code("app#0", "gfx942:sramecc+")));
    assert_eq!(get(1, &[agent]).1, Some(code("app#1", "gfx942")));
    // Without the prefix too.
    assert_eq!(
        get(0, &["gfx942:sramecc+:xnack-"]).1,
        Some(code("app#0", "gfx942:sramecc+"))
    );
    // An sramecc- agent does not take sramecc+ code.
    assert_eq!(
        get(0, &["gfx942:sramecc-"]).1,
        Some(code("app#0", "gfx942"))
    );
    // xnack+ code never runs on an xnack- agent.
    assert_eq!(get(3, &[agent]).0, KERNEL_NOT_FOUND);
    assert_eq!(
        get(3, &["gfx942:xnack+"]).1,
        Some(code("app#3", "gfx942:xnack+"))
    );
    // The generic target only when the caller lists it.
    assert_eq!(get(2, &[agent]).0, KERNEL_NOT_FOUND);
    assert_eq!(
        get(2, &[agent, generic]).1,
        Some(code("app#2", "gfx9-4-generic"))
    );
    // The native target wins over the generic one.
    assert_eq!(get(1, &[generic, agent]).1, Some(code("app#1", "gfx942")));
}

/// The PyTorch case: `lib_gfx90a:xnack-.kpack` holds some code objects,
/// `lib_gfx90a.kpack` all of them; an xnack- agent gets every one.
#[test]
fn falls_through_to_the_next_archive() {
    let dir = tempfile::tempdir().unwrap();
    let kp = dir.path().join(".kpack");
    std::fs::create_dir_all(&kp).unwrap();
    std::fs::create_dir_all(dir.path().join("lib")).unwrap();
    write_archive(
        &kp.join("lib_gfx90a:xnack-.kpack"),
        &["gfx90a:xnack-"],
        &[
            ("lib/libtorch.so#0", "gfx90a:xnack-"),
            ("lib/libtorch.so#2", "gfx90a:xnack-"),
        ],
    );
    let all: Vec<String> = (0..4).map(|i| format!("lib/libtorch.so#{i}")).collect();
    let kernels: Vec<(&str, &str)> = all.iter().map(|k| (k.as_str(), "gfx90a")).collect();
    write_archive(&kp.join("lib_gfx90a.kpack"), &["gfx90a"], &kernels);
    let meta = dir.path().join("m");
    write_metadata(&meta, "lib/libtorch.so", &["../.kpack/lib_@GFXARCH@.kpack"]);
    let bin = dir.path().join("lib/libtorch.so");
    let agent = "amdgcn-amd-amdhsa--gfx90a:xnack-";
    for co in 0..4u32 {
        let key = format!("lib/libtorch.so#{co}");
        let want = if co % 2 == 0 {
            code(&key, "gfx90a:xnack-")
        } else {
            code(&key, "gfx90a")
        };
        let (c, b, _) = load(&[], &meta, &bin, co, &[agent]);
        assert_eq!((c, b), (SUCCESS, Some(want)), "co {co}");
    }
    assert_eq!(load(&[], &meta, &bin, 4, &[agent]).0, KERNEL_NOT_FOUND);
    // An xnack+ agent gets the any-xnack code only.
    assert_eq!(
        load(&[], &meta, &bin, 0, &["gfx90a:xnack+"]).1,
        Some(code("lib/libtorch.so#0", "gfx90a"))
    );
}

fn threads_scenario(dir: &Path, count: usize) -> (PathBuf, PathBuf, PathBuf) {
    let keys: Vec<String> = (0..count).map(|i| format!("lib/libx.so#{i}")).collect();
    let kernels: Vec<(&str, &str)> = keys.iter().map(|k| (k.as_str(), "gfx942")).collect();
    let kp = dir.join(".kpack");
    std::fs::create_dir_all(&kp).unwrap();
    std::fs::create_dir_all(dir.join("lib")).unwrap();
    write_archive(&kp.join("x_gfx942.kpack"), &["gfx942"], &kernels);
    let expected = dir.join("expected");
    std::fs::create_dir_all(&expected).unwrap();
    for (i, k) in keys.iter().enumerate() {
        std::fs::write(expected.join(format!("{i}.bin")), code(k, "gfx942")).unwrap();
    }
    let meta = dir.join("m");
    write_metadata(&meta, "lib/libx.so", &["../.kpack/x_@GFXARCH@.kpack"]);
    (meta, dir.join("lib/libx.so"), expected)
}

#[test]
fn sixteen_threads_one_cache() {
    let dir = tempfile::tempdir().unwrap();
    let (meta, bin, expected) = threads_scenario(dir.path(), 12);
    let args = |threads: &str, loads: &str, warm: &str| -> Vec<String> {
        [
            "threads",
            meta.to_str().unwrap(),
            bin.to_str().unwrap(),
            "amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-",
            "12",
            expected.to_str().unwrap(),
            threads,
            loads,
            warm,
        ]
        .map(String::from)
        .to_vec()
    };
    // Cold: the threads race to open the archive.
    let out = run_ok(cmd().args(args("16", "1000", "0")));
    assert!(
        stdout(&out).contains("threads=16 loads=1000 errors=0") && stdout(&out).contains("PASS"),
        "{}",
        stdout(&out)
    );
    // Under valgrind: fewer loads (it serializes threads and is ~50x
    // slower). memcheck from cold; helgrind once the archive is open: Rust's
    // Mutex and OnceLock are futex-based and invisible to helgrind, so the
    // one-time writes of a cold start would be reported as races. What it
    // checks is the steady state: concurrent lookups, reads and
    // decompression on one cache.
    let a = args("16", "20", "0");
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    run_under_valgrind("memcheck", program(), &a, &[]);
    let a = args("16", "20", "1");
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    run_under_valgrind("helgrind", program(), &a, &[]);
}

#[test]
fn out_of_memory() {
    run_out_of_memory_case(program());
}

/// A small shared library with a data symbol, for discovery.
fn datum_library(dir: &Path) -> PathBuf {
    let src = dir.join("datum.c");
    std::fs::write(&src, "int kpack_test_datum[1024] = {1};\n").unwrap();
    let lib = dir.join("libdatum.so");
    let mut p = Program::c("c11");
    p.cc().flag("-shared");
    built(p.input(&src).link(&lib));
    lib
}

fn discover(lib: &Path, delete: bool) -> (String, u64, String) {
    let out = run_ok(
        cmd()
            .arg("discover")
            .arg(lib)
            .arg(if delete { "1" } else { "0" }),
    );
    let text = stdout(&out);
    assert!(text.contains("PASS"), "{text}");
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {text}"))
            .to_string()
    };
    (
        field("path="),
        field("offset=").parse().unwrap(),
        field("self="),
    )
}

#[test]
fn discovers_binary_paths() {
    let dir = tempfile::tempdir().unwrap();
    let dir = std::fs::canonicalize(dir.path()).unwrap();
    let lib = datum_library(&dir);
    let (path, offset, me) = discover(&lib, false);
    assert_eq!(Path::new(&path), lib);
    assert_eq!(Path::new(&me), std::fs::canonicalize(program()).unwrap());
    // The offset is the datum's offset in the file: its bytes are there.
    let bytes = std::fs::read(&lib).unwrap();
    assert_eq!(
        &bytes[offset as usize..offset as usize + 4],
        &1i32.to_le_bytes()
    );

    // A library deleted after loading: /proc/self/maps says
    // "<path> (deleted)"; the path is reported without the suffix.
    let copy = dir.join("libcopy.so");
    std::fs::copy(&lib, &copy).unwrap();
    let (path, _, _) = discover(&copy, true);
    assert!(!copy.exists());
    assert_eq!(Path::new(&path), copy);

    run_under_valgrind(
        "memcheck",
        program(),
        &["discover", lib.to_str().unwrap(), "0"],
        &[],
    );
}
