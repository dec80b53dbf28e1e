//! The CMake package with real cmake: `cargo xtask dist` installs it, the
//! consumer project (integration/cmake-consumer) builds a HIP library,
//! offloads it with kpack_offload_target(), and its C11 and C++17 checkers
//! (linking kpack::runtime / rocm::rocm_kpack) load every code object back
//! through the runtime, in the build tree and after `cmake --install`; the
//! C++ API's test program (against kpack::cxx) passes and a C shared
//! library linking kpack::runtime exports only the C API and its own
//! symbol. Then the same project with kpack built from source
//! (add_subdirectory) through cargo, kpack's fallback when Corrosion is
//! absent (the Corrosion path: tests/superbuild.rs).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use crate::common::cmake::*;
use crate::common::*;

fn cmake(args: &[&dyn AsRef<std::ffi::OsStr>]) -> String {
    let mut c = Command::new("cmake");
    for a in args {
        c.arg(a.as_ref());
    }
    run_ok(&mut c)
}

/// What a build tree of the consumer must show beside its ctest: the C++
/// API's program passes, the C probe exports only the C API and its own.
fn check_build_tree(build_dir: &Path, scratch: &Path) {
    run_cxx_api_test(&build_dir.join("cxx_api_test"), scratch);
    assert_no_cxx_runtime(&build_dir.join("consumer_c"));
    assert_no_cxx_runtime(&build_dir.join("libprobe_c.so"));
    let nm = run_ok(
        Command::new("nm")
            .args(["-D", "--defined-only"])
            .arg(build_dir.join("libprobe_c.so")),
    );
    let defined: BTreeSet<&str> = nm
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .filter(|n| !["_init", "_fini", "__bss_start", "_edata", "_end"].contains(n))
        .collect();
    let mut want: BTreeSet<&str> = rocm_kpack::prelink::EXPORTED_SYMBOLS.into_iter().collect();
    want.insert("probe_c");
    assert_eq!(defined, want);
}

fn build_and_test(build_dir: &Path) {
    cmake_build(build_dir);
    let out = run_ok(
        Command::new("ctest")
            .arg("--test-dir")
            .arg(build_dir)
            .arg("--output-on-failure"),
    );
    assert!(out.contains("100% tests passed"), "{out}");
}

/// The checkers of an installed consumer load from the install tree only:
/// the build tree is gone.
fn check_installed(build: &Path, inst: &Path) {
    cmake(&[&"--install", &build, &"--prefix", &inst]);
    let expected = inst.join("expected");
    std::fs::rename(build.join("expected"), &expected).unwrap();
    std::fs::remove_dir_all(build).unwrap();
    let lib = inst.join("lib/libconsumer_vadd.so");
    assert!(inst
        .join("lib/.kpack/consumer_vadd_gfx1100.kpack")
        .is_file());
    let rpath = run_ok(Command::new("readelf").arg("-d").arg(&lib));
    assert!(
        rpath.contains("[$ORIGIN]"),
        "install-time RPATH rewrite: {rpath}"
    );
    kpack_ok(&[&"verify-elf", &lib]);
    // kpack_offload_target() records the targets it split for.
    let ls: serde_json::Value = serde_json::from_str(&kpack_ok(&[&"ls", &lib, &"--json"])).unwrap();
    assert_eq!(
        ls["targets"],
        serde_json::json!(["gfx1100", "gfx942"]),
        "{ls}"
    );
    for prog in ["consumer_c", "consumer_cxx"] {
        let out = run_ok(
            Command::new(inst.join("bin").join(prog))
                .arg(&lib)
                .arg(&expected)
                .args(["gfx1100", "gfx942"]),
        );
        assert!(
            out.contains("2 code objects loaded and identical"),
            "{prog}: {out}"
        );
    }
}

#[test]
fn installed_package_and_from_source() {
    let root = workspace();
    let scratch = tempfile::tempdir().unwrap();
    let prefix = scratch.path().join("prefix");
    run_ok(
        kpack_testkit::workspace::xtask()
            .args(["dist", "--prefix"])
            .arg(&prefix),
    );
    for f in [
        "lib/librocm_kpack.a",
        "lib/librocm_kpack_cxx.a",
        "bin/kpack",
        "include/rocm_kpack/kpack.h",
        "include/rocm_kpack/kpack.hpp",
        "include/rocm_kpack/kpack_bridge.h",
        "include/rust/cxx.h",
    ] {
        assert!(prefix.join(f).is_file(), "dist did not install {f}");
    }
    // Relocatable: no absolute path of the build in the package files, and
    // it works from wherever it is moved to.
    let pkg = prefix.join("lib/cmake/rocm-kpack");
    for e in std::fs::read_dir(&pkg).unwrap() {
        let text = std::fs::read_to_string(e.unwrap().path()).unwrap();
        assert!(!text.contains(prefix.to_str().unwrap()) && !text.contains(root.to_str().unwrap()));
    }
    let moved = scratch.path().join("moved-prefix");
    std::fs::rename(&prefix, &moved).unwrap();
    // The installed static library has only the C API at default
    // visibility (the C++ glue's Rust functions are global but hidden).
    let api: BTreeSet<String> = rocm_kpack::prelink::EXPORTED_SYMBOLS
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(
        default_visibility_globals(&moved.join("lib/librocm_kpack.a")),
        api
    );

    let consumer = root.join("integration/cmake-consumer");
    let build = scratch.path().join("build-installed");
    let out = configure(
        &consumer,
        &build,
        &[format!("-DCMAKE_PREFIX_PATH={}", moved.display())],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    build_and_test(&build);
    check_build_tree(&build, scratch.path());
    check_installed(&build, &scratch.path().join("inst-installed"));

    // Misuse is a clear message: a static library at configure time, a
    // library without device code at build time.
    let neg = root.join("integration/cmake-negative");
    let b = scratch.path().join("neg-static");
    let out = configure(
        &neg,
        &b,
        &[
            format!("-DCMAKE_PREFIX_PATH={}", moved.display()),
            "-DCASE=static".into(),
        ],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("STATIC_LIBRARY has no device code"));
    let b = scratch.path().join("neg-hostonly");
    let out = configure(
        &neg,
        &b,
        &[
            format!("-DCMAKE_PREFIX_PATH={}", moved.display()),
            "-DCASE=hostonly".into(),
        ],
    );
    assert!(out.status.success());
    let out = Command::new("cmake")
        .arg("--build")
        .arg(&b)
        .output()
        .unwrap();
    // A shared library without device code: copied unchanged with a note,
    // not an error (a host-only build is a valid input).
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("libhostlib.so") && text.contains("no device code (no .hip_fatbin section)"),
        "{text}"
    );

    // From source: add_subdirectory, cargo driven by CMake (no Corrosion
    // here), in the Debug profile. cargo's target directory is this
    // workspace's, whose debug build the test run has made already.
    let build = scratch.path().join("build-source");
    {
        // cargo relinks target/debug/kpack and librocm_kpack.a (with the
        // features of both packages).
        let _build = build_lock();
        configure_ok(
            &consumer,
            &build,
            &[
                "-DKPACK_FROM_SOURCE=ON".into(),
                "-DKPACK_USE_CORROSION=OFF".into(),
                "-DCMAKE_BUILD_TYPE=Debug".into(),
                format!("-DKPACK_SOURCE_DIR={}", root.display()),
                format!("-DKPACK_CARGO_TARGET_DIR={}", root.join("target").display()),
            ],
        );
        build_and_test(&build);
    }
    check_build_tree(&build, scratch.path());
    assert!(
        build
            .join("kpack/kpack-runtime/lib/librocm_kpack_cxx.a")
            .is_file(),
        "the installed layout is in the CMake build tree"
    );
    check_installed(&build, &scratch.path().join("inst-source"));
}
