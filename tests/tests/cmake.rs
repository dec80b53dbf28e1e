//! The CMake package with real cmake: `cargo xtask dist` installs it, the
//! consumer project (integration/cmake-consumer) builds a HIP library,
//! offloads it with kpack_offload_target(), and its C11 and C++17 checkers
//! (linking kpack::runtime / rocm::rocm_kpack) load every code object back
//! through the runtime, in the build tree and after `cmake --install`; then
//! the same project with kpack built from source (add_subdirectory).

use std::path::Path;
use std::process::Command;

use kpack_e2e::*;

fn cmake(args: &[&dyn AsRef<std::ffi::OsStr>]) -> String {
    let mut c = Command::new("cmake");
    for a in args {
        c.arg(a.as_ref());
    }
    run_ok(&mut c)
}

fn configure(src: &Path, build: &Path, extra: &[String]) -> std::process::Output {
    let mut c = Command::new("cmake");
    c.arg("-S").arg(src).arg("-B").arg(build).args([
        "-DCMAKE_C_COMPILER=clang-19",
        "-DCMAKE_CXX_COMPILER=clang++-19",
    ]);
    c.args(extra);
    c.output().expect("cmake")
}

fn build_and_test(build: &Path) {
    cmake(&[&"--build", &build]);
    let out = run_ok(
        Command::new("ctest")
            .arg("--test-dir")
            .arg(build)
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
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run_ok(
        Command::new(&cargo)
            .args(["run", "--quiet", "-p", "xtask", "--", "dist", "--prefix"])
            .arg(&prefix)
            .current_dir(&root),
    );
    for f in [
        "lib/librocm_kpack.a",
        "bin/kpack",
        "include/rocm_kpack/kpack.h",
        "include/rocm_kpack/kpack.hpp",
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
    // The exported static library has only kpack_* global symbols.
    let nm = run_ok(
        Command::new("nm")
            .args(["-g", "--defined-only"])
            .arg(moved.join("lib/librocm_kpack.a")),
    );
    for line in nm.lines().filter(|l| l.split_whitespace().count() == 3) {
        assert!(
            line.split_whitespace()
                .nth(2)
                .unwrap()
                .starts_with("kpack_"),
            "exported: {line}"
        );
    }

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
    assert!(!out.status.success());
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("libhostlib.so") && text.contains("no .hip_fatbin"),
        "{text}"
    );

    // From source: add_subdirectory, cargo driven by CMake.
    let build = scratch.path().join("build-source");
    let out = configure(
        &consumer,
        &build,
        &[
            "-DKPACK_FROM_SOURCE=ON".into(),
            format!("-DKPACK_SOURCE_DIR={}", root.display()),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    build_and_test(&build);
    assert!(
        build.join("kpack/cargo/release/kpack").is_file(),
        "cargo's target directory is in the CMake build tree"
    );
    check_installed(&build, &scratch.path().join("inst-source"));
}
