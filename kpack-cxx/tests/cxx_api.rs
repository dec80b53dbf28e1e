//! The C++ API (`kpack.hpp` over the cxx bridge) through a C++17 program
//! linked as a consumer of the installed library links it: the glue
//! `librocm_kpack_cxx.a`, then the prelinked `librocm_kpack.a`. Every
//! method, every error code with kpack's message naming the file and the
//! problem, 16 threads; under valgrind memcheck too. And a shared library
//! linking both exports only the `kpack_*` functions and its own.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::common::*;

fn program() -> &'static Path {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        let out = build_dir("cxx_api").join("api_test");
        let mut p = cxx_program();
        p.input(crate_dir().join("tests/cxx/api_test.cpp"));
        link_cxx(&mut p, &out);
        out
    })
}

#[test]
fn cxx_api() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    write_bad_archives(work, &reference_fixtures());
    let (meta, bin) = loader_scenario(work);
    let fixtures = reference_fixtures();
    let args = [
        "all",
        fixtures.to_str().unwrap(),
        work.to_str().unwrap(),
        meta.to_str().unwrap(),
        bin.to_str().unwrap(),
    ];
    let out = run_ok(
        Command::new(program())
            .args(args)
            .env_remove("ROCM_KPACK_PATH")
            .env_remove("ROCM_KPACK_PATH_PREFIX")
            .env_remove("ROCM_KPACK_DISABLE"),
    );
    assert!(stdout(&out).contains("PASS"), "{}", stdout(&out));
    run_under_valgrind("memcheck", program(), &args, &[]);
}

#[test]
fn cxx_out_of_memory() {
    run_out_of_memory_case(program());
}

#[test]
fn cxx_shared_library_exports_only_the_api() {
    // A C++ shared library using kpack.hpp, linked as CMake's
    // kpack::runtime links C++ targets (--exclude-libs for the glue).
    let dir = build_dir("cxx_api");
    let src = dir.join("cxxprobe.cpp");
    std::fs::write(
        &src,
        "#include <rocm_kpack/kpack.hpp>\n\
         __attribute__((visibility(\"default\"))) size_t cxxprobe(const char* p) {\n\
           return kpack::Archive(p).kernels().size();\n\
         }\n",
    )
    .unwrap();
    let lib = dir.join("libcxxprobe.so");
    let mut p = cxx_program();
    p.cc()
        .flag("-shared")
        .flag("-fPIC")
        .flag("-fvisibility=hidden")
        .flag("-fvisibility-inlines-hidden")
        .flag("-Wl,--no-undefined")
        .flag("-Wl,--exclude-libs,librocm_kpack_cxx.a");
    p.input(&src);
    link_cxx(&mut p, &lib);
    let out = run_ok(Command::new("nm").args(["-D", "--defined-only"]).arg(&lib));
    let mut defined: Vec<String> = stdout(&out)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_owned))
        .filter(|n| !["_init", "_fini", "__bss_start", "_edata", "_end"].contains(&n.as_str()))
        // The library's own C++ (std::string code kpack.hpp instantiates).
        .filter(|n| !n.starts_with("_ZNSt") && !n.starts_with("_ZSt"))
        .collect();
    defined.sort();
    let mut want: Vec<String> = rocm_kpack::prelink::EXPORTED_SYMBOLS
        .iter()
        .map(|s| s.to_string())
        .collect();
    want.push("_Z8cxxprobePKc".into());
    want.sort();
    assert_eq!(defined, want);
}
