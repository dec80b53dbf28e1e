//! What the built libraries export: `librocm_kpack.so` and a shared library
//! linking the prelinked `librocm_kpack.a` export the 15 `kpack_*`
//! functions and nothing of Rust or zstd (formats.md §5.1; the HIP runtime links
//! the static library into `libamdhip64.so`). Both still work.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::common::*;
use rocm_kpack::prelink::{self, Bridge, EXPORTED_SYMBOLS};

/// `nm` output lines `(type, name)` of `file` with extra flags.
fn nm(flags: &[&str], file: &Path) -> Vec<(String, String)> {
    let out = run_ok(Command::new("nm").args(flags).arg(file));
    stdout(&out)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                [_, kind, name] | [kind, name] => Some((kind.to_string(), name.to_string())),
                _ => None,
            }
        })
        .collect()
}

fn exports() -> BTreeSet<String> {
    EXPORTED_SYMBOLS.iter().map(|s| s.to_string()).collect()
}

/// Symbols that are not the library's API and must not appear in a
/// dynamic symbol table: Rust (legacy `_ZN` or v0 `_R` mangling,
/// `rust_*`, `__rust*`) and zstd.
fn is_leak(name: &str) -> bool {
    let name = name.split('@').next().unwrap_or(name);
    name.starts_with("_ZN")
        || name.starts_with("_R")
        || name.contains("rust")
        || name.to_ascii_uppercase().contains("ZSTD")
        || name.starts_with("HUF_")
        || name.starts_with("FSE_")
}

/// The prelinked archive, made once per test run.
fn prelinked() -> PathBuf {
    static ARCHIVE: OnceLock<PathBuf> = OnceLock::new();
    ARCHIVE
        .get_or_init(|| {
            let out = build_dir("symbols").join("librocm_kpack.a");
            let bridge = Bridge::from_out_dir(&cxx_out_dir()).expect("build.rs's output");
            prelink::prelink(&staticlib(), &bridge, &out).expect("prelink");
            out
        })
        .clone()
}

/// The global symbols `archive` defines: (default visibility, hidden).
fn global_definitions(archive: &Path) -> (BTreeSet<String>, BTreeSet<String>) {
    let out = run_ok(Command::new("readelf").args(["-sW"]).arg(archive));
    let mut visible = BTreeSet::new();
    let mut hidden = BTreeSet::new();
    for line in stdout(&out).lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        // Num: Value Size Type Bind Vis Ndx Name
        if let [_, _, _, _, "GLOBAL", vis, ndx, name] = f[..] {
            if ndx == "UND" {
                continue;
            }
            if vis == "HIDDEN" {
                hidden.insert(name.to_string());
            } else {
                visible.insert(name.to_string());
            }
        }
    }
    (visible, hidden)
}

/// The link flag that finds the shared library `lib` where it is.
fn rpath(lib: &Path) -> String {
    format!("-Wl,-rpath,{}", lib.parent().unwrap().display())
}

/// libprobe.so from tests/c/probe.c and `archive`.
fn probe_library(archive: &Path, name: &str) -> PathBuf {
    probe_library_with(archive, name, &[])
}

/// [`probe_library`] with more link inputs.
fn probe_library_with(archive: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let lib = build_dir("symbols").join(name);
    let mut p = Program::c("gnu17");
    p.cc()
        .flag("-shared")
        .flag("-fvisibility=hidden")
        .flag("-Wl,--no-undefined")
        .include(include_dir());
    p.input(crate_dir().join("tests/c/probe.c"))
        .static_runtime(archive);
    for e in extra {
        p.input(e);
    }
    built(p.link(&lib));
    lib
}

#[test]
fn prelinked_archive_exports_only_the_api() {
    let archive = prelinked();
    // Global definitions of default visibility: exactly the API; the
    // others are the bridge's, hidden.
    let (visible, hidden) = global_definitions(&archive);
    assert_eq!(visible, exports());
    let bridge = Bridge::from_out_dir(&cxx_out_dir()).unwrap();
    assert_eq!(hidden, bridge.symbols.iter().cloned().collect());
    assert!(
        hidden.iter().all(|s| s.contains("cxxbridge1$")),
        "{hidden:?}"
    );
    // No C++ runtime: C programs link it with the C compiler alone.
    let undefined = nm(&["-u"], &archive);
    let cxx: Vec<_> = undefined
        .iter()
        .filter(|(kind, n)| {
            kind == "U"
                && (n.starts_with("_ZNSt") || n.starts_with("_ZN4rust") || n.starts_with("__cxa_"))
        })
        .collect();
    assert!(cxx.is_empty(), "{cxx:?}");
    // No debug info, no embedded bitcode.
    let sections = stdout(&run_ok(Command::new("readelf").arg("-SW").arg(&archive)));
    assert!(sections.contains(".text"), "{sections}");
    for gone in [".debug_info", ".debug_line", ".llvmbc"] {
        assert!(
            !sections.contains(gone),
            "{gone} left in the prelinked archive"
        );
    }

    // Linked into a shared library: its dynamic symbols hold the API, the
    // library's own export, the C library's imports, and no Rust or zstd.
    let lib = probe_library(&archive, "libprobe.so");
    let dynamic = nm(&["-D"], &lib);
    let leaks: Vec<&String> = dynamic
        .iter()
        .map(|(_, n)| n)
        .filter(|n| is_leak(n))
        .collect();
    assert!(leaks.is_empty(), "leaked: {leaks:?}");
    let defined: BTreeSet<String> = nm(&["-D", "--defined-only"], &lib)
        .into_iter()
        .map(|(_, n)| n)
        .filter(|n| !["_init", "_fini", "__bss_start", "_edata", "_end"].contains(&n.as_str()))
        .collect();
    let mut want = exports();
    want.insert("probe_kernel_size".into());
    assert_eq!(defined, want);

    // And it works: a kernel of the reference zstd archive, decompressed
    // by the copy of zstd inside.
    let main = build_dir("symbols").join("probe_main");
    let mut p = Program::c("gnu17");
    p.input(crate_dir().join("tests/c/probe_main.c"))
        .input(&lib)
        .input(rpath(&lib));
    built(p.link(&main));
    let out = run_ok(Command::new(&main).arg(reference_fixtures().join("test_zstd.kpack")));
    assert_eq!(stdout(&out).trim(), "size=1019");
}

#[test]
fn plain_staticlib_would_leak() {
    // The reason for prelinking: the archive cargo builds exports Rust's
    // symbols from any shared library that links it (and, with the cxx
    // crate's C++ runtime inside, it needs libstdc++).
    let lib = probe_library_with(&staticlib(), "libprobe_plain.so", &["-lstdc++"]);
    let dynamic = nm(&["-D", "--defined-only"], &lib);
    assert!(dynamic.iter().any(|(_, n)| is_leak(n)), "{dynamic:?}");
}

#[test]
fn shared_library_exports_only_the_api() {
    let so = sharedlib();
    let dynamic = nm(&["-D"], &so);
    let leaks: Vec<&String> = dynamic
        .iter()
        .map(|(_, n)| n)
        .filter(|n| is_leak(n))
        .collect();
    assert!(leaks.is_empty(), "leaked: {leaks:?}");
    let defined: BTreeSet<String> = nm(&["-D", "--defined-only"], &so)
        .into_iter()
        .map(|(_, n)| n)
        .collect();
    assert_eq!(defined, exports());
}

#[test]
fn c_test_program_against_prelinked_and_shared_libraries() {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = reference_fixtures();
    let archive = prelinked();
    let progs = [
        ("api_test_prelinked", archive.clone()),
        ("api_test_shared", sharedlib()),
    ];
    for (name, lib) in progs {
        let exe = build_dir("symbols").join(name);
        let mut p = Program::c("c11");
        p.cc().include(include_dir());
        p.input(crate_dir().join("tests/c/api_test.c"))
            .static_runtime(&lib)
            .input(rpath(&lib));
        built(p.link(&exe));
        // A load through either library.
        let meta = dir.path().join("m");
        write_metadata(
            &meta,
            "lib/libhip.so",
            &[fixtures.join("test_zstd.kpack").to_str().unwrap()],
        );
        let out_file = dir.path().join(format!("{name}.bin"));
        let out = run_ok(
            Command::new(&exe)
                .env_remove("ROCM_KPACK_PATH")
                .env_remove("ROCM_KPACK_PATH_PREFIX")
                .env_remove("ROCM_KPACK_DISABLE")
                .arg("load")
                .arg(&meta)
                .arg(dir.path().join("bin"))
                .arg("0")
                .arg(&out_file)
                .arg("amdgcn-amd-amdhsa--gfx1101"),
        );
        assert!(
            stdout(&out).contains("code=0 size=619"),
            "{name}: {}",
            stdout(&out)
        );
        let bytes = std::fs::read(&out_file).unwrap();
        assert!(bytes.starts_with(b"HIP_KERNEL_GFX1101_XXX") && bytes.ends_with(b"YYY"));
    }
}
