//! What the CMake tests share: configuring and building projects with
//! clang-19 (cmake is run directly: see docs/cmake.md, "Tests"), and where
//! Corrosion comes from.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::*;

#[path = "../../../kpack-cxx/tests/common/archives.rs"]
mod archives;

/// `cmake -S src -B build` with clang-19 and `extra`; the output, whether
/// it failed or not.
pub fn configure(src: &Path, build: &Path, extra: &[String]) -> Output {
    let mut c = Command::new("cmake");
    c.arg("-S").arg(src).arg("-B").arg(build).args([
        "-DCMAKE_C_COMPILER=clang-19",
        "-DCMAKE_CXX_COMPILER=clang++-19",
    ]);
    c.args(extra);
    c.output().expect("cmake")
}

/// [`configure`], which must succeed.
pub fn configure_ok(src: &Path, build: &Path, extra: &[String]) -> String {
    let out = configure(src, build, extra);
    assert!(
        out.status.success(),
        "configuring {}:\n{}\n{}",
        src.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `cmake --build build -j2` (the CI machine's two cores); its output.
pub fn cmake_build(build: &Path) -> String {
    run_ok(Command::new("cmake").arg("--build").arg(build).arg("-j2"))
}

/// `cmake --install build --prefix prefix`.
pub fn cmake_install(build: &Path, prefix: &Path) {
    run_ok(
        Command::new("cmake")
            .arg("--install")
            .arg(build)
            .arg("--prefix")
            .arg(prefix),
    );
}

/// Where the tests get Corrosion from.
#[derive(Debug, Clone)]
pub enum Corrosion {
    /// A source tree (`CORROSION_SOURCE_DIR`, relative paths against the
    /// workspace; CI's `.ci/run` points it at a vendored copy).
    Source(PathBuf),
    /// An installed package that `find_package(Corrosion)` finds.
    Package,
}

/// Corrosion, if these tests can use it: `CORROSION_SOURCE_DIR`, else an
/// installed package. `None`: the Corrosion path cannot be exercised
/// (`cargo xtask test` says so in its summary, and fails under CI=true).
pub fn corrosion() -> Option<Corrosion> {
    if let Some(dir) = std::env::var_os("CORROSION_SOURCE_DIR").filter(|d| !d.is_empty()) {
        let dir = workspace().join(dir);
        assert!(
            dir.join("CMakeLists.txt").is_file(),
            "CORROSION_SOURCE_DIR={} holds no CMakeLists.txt",
            dir.display()
        );
        return Some(Corrosion::Source(dir.canonicalize().unwrap()));
    }
    // cmake --find-package writes CMakeFiles/ (and Corrosion's probe a
    // cargo project) into the current directory: give it a scratch one.
    let scratch = tempfile::tempdir().unwrap();
    let found = Command::new("cmake")
        .current_dir(scratch.path())
        .args([
            "--find-package",
            "-DNAME=Corrosion",
            "-DCOMPILER_ID=GNU",
            "-DLANGUAGE=C",
            "-DMODE=EXIST",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    found.then_some(Corrosion::Package)
}

/// The C++ API's test program (kpack-cxx/tests/cxx/api_test.cpp) as a
/// CMake project built it: every method and error code.
pub fn run_cxx_api_test(program: &Path, scratch: &Path) {
    let work = scratch.join("cxx-api-work");
    std::fs::create_dir_all(&work).unwrap();
    let fixtures = kpack_testkit::workspace::reference_archives();
    archives::write_bad_archives(&work, &fixtures);
    let (meta, bin) = archives::loader_scenario(&work);
    let out = run_ok(
        Command::new(program)
            .arg("all")
            .arg(&fixtures)
            .arg(&work)
            .arg(&meta)
            .arg(&bin)
            .env_remove("ROCM_KPACK_PATH")
            .env_remove("ROCM_KPACK_PATH_PREFIX")
            .env_remove("ROCM_KPACK_DISABLE"),
    );
    assert!(out.contains("PASS"), "{out}");
}

/// A C program or library linking kpack::runtime needs no C++ runtime.
pub fn assert_no_cxx_runtime(binary: &Path) {
    let d = run_ok(Command::new("readelf").arg("-d").arg(binary));
    assert!(
        !d.contains("libstdc++") && !d.contains("libc++"),
        "{} needs a C++ runtime:\n{d}",
        binary.display()
    );
}

/// The global symbols `object` (an archive or object) defines with default
/// visibility.
pub fn default_visibility_globals(object: &Path) -> std::collections::BTreeSet<String> {
    let out = run_ok(Command::new("readelf").arg("-sW").arg(object));
    out.lines()
        .filter_map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            [_, _, _, _, "GLOBAL", "DEFAULT", ndx, name] if ndx != "UND" => Some(name.to_owned()),
            _ => None,
        })
        .collect()
}
