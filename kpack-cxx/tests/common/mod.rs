//! Shared helpers of the runtime library's tests: where the built library,
//! the headers and the fixtures are; compiling (through `cc`, see
//! `kpack_testkit::cprog`) and running C/C++ programs; valgrind.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub use kpack_testkit::cprog::Program;
use kpack_testkit::workspace;

pub mod archives;
pub mod zero_copy;
#[allow(unused_imports)]
pub use archives::*;

/// The cargo profile directory this test was built into (holds
/// `librocm_kpack.a` and `librocm_kpack.so`).
pub fn profile_dir() -> PathBuf {
    workspace::profile_dir().unwrap_or_else(|e| panic!("{e:#}"))
}

/// `cargo test` builds this crate as an rlib for its tests; the static and
/// shared libraries the C and C++ programs link are built here, once per
/// test process, in the same profile.
fn build_libraries() {
    static BUILT: std::sync::Once = std::sync::Once::new();
    BUILT.call_once(|| {
        workspace::build(&["--package", "kpack-cxx", "--lib"])
            .unwrap_or_else(|e| panic!("building kpack-cxx: {e:#}"));
    });
}

pub fn staticlib() -> PathBuf {
    build_libraries();
    let p = profile_dir().join("librocm_kpack.a");
    assert!(p.is_file(), "{} missing: build kpack-cxx", p.display());
    p
}

pub fn sharedlib() -> PathBuf {
    build_libraries();
    let p = profile_dir().join("librocm_kpack.so");
    assert!(p.is_file(), "{} missing: build kpack-cxx", p.display());
    p
}

/// build.rs's output directory of this build: the C++ glue
/// (`librocm_kpack_cxx.a`), the generated bridge header, `rust/cxx.h`, the
/// bridge symbols and the stand-ins the prelink step uses.
pub fn cxx_out_dir() -> PathBuf {
    PathBuf::from(env!("KPACK_CXX_OUT_DIR"))
}

/// The installed layout of the runtime library (`rocm-kpack-prelink`'s
/// output: the prelinked `librocm_kpack.a`, `librocm_kpack_cxx.a`, the
/// headers), made once per test process from this build.
pub fn installed() -> PathBuf {
    static DONE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        let dir = build_dir("installed");
        workspace::install_runtime(&dir).unwrap_or_else(|e| panic!("{e:#}"));
        dir
    })
    .clone()
}

pub fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn include_dir() -> PathBuf {
    crate_dir().join("include")
}

/// The reference archives (`tests/data/reference-kpack`).
pub fn reference_fixtures() -> PathBuf {
    let p = workspace::reference_archives();
    assert!(
        p.join("test_zstd.kpack").is_file(),
        "{} missing",
        p.display()
    );
    p
}

/// A scratch directory for this test binary's build products.
pub fn build_dir(name: &str) -> PathBuf {
    let d = profile_dir().join("kpack-cxx-tests").join(name);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A path as the C API takes it.
pub fn cpath(p: &Path) -> std::ffi::CString {
    std::ffi::CString::new(p.to_str().expect("a UTF-8 path")).expect("a path without NUL")
}

/// Run `cmd`, panicking with its output unless it exits 0.
pub fn run_ok(cmd: &mut Command) -> Output {
    workspace::output(cmd).unwrap_or_else(|e| panic!("{e:#}"))
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A program in the standard `std` (C++ for `c++NN`) with the public
/// headers and the strict warning flags (`-Wall -Wextra -Werror
/// -pedantic`, `-O1 -g`).
pub fn program(std: &str) -> Program {
    let mut p = if std.starts_with("c++") {
        Program::cxx(std)
    } else {
        Program::c(std)
    };
    p.strict().cc().flag("-pedantic").include(include_dir());
    if std.starts_with("c++") {
        p.cc().flag("-pthread");
    }
    p
}

/// Compile `source` and link it against `lib` (static or shared, with the
/// static library's native libraries) into `out`, with [`program`]'s flags.
pub fn build_program(std: &str, source: &Path, lib: &Path, out: &Path) {
    let mut p = program(std);
    p.input(source).static_runtime(lib);
    built(p.link(out));
}

/// A C++17 program against the installed C++ API ([`installed`]): its
/// headers, the glue first, then the prelinked library.
pub fn cxx_program() -> Program {
    let inst = installed();
    let mut p = Program::cxx("c++17");
    p.strict()
        .cc()
        .flag("-pedantic")
        .flag("-pthread")
        .include(inst.join("include"));
    p
}

/// Link [`cxx_program`]'s inputs with the installed libraries into `out`.
pub fn link_cxx(p: &mut Program, out: &Path) {
    let lib = installed().join("lib");
    p.input(lib.join("librocm_kpack_cxx.a"))
        .static_runtime(&lib.join("librocm_kpack.a"));
    built(p.link(out));
}

/// Panic with the compiler's output if a build failed.
pub fn built<E: std::fmt::Display>(result: Result<(), E>) {
    result.unwrap_or_else(|e| panic!("{e:#}"));
}

/// Valgrind must be installed (`cargo xtask test` installs it).
pub fn valgrind() -> Command {
    let found = Command::new("valgrind").arg("--version").output();
    assert!(
        found.map(|o| o.status.success()).unwrap_or(false),
        "valgrind is not installed: apt-get install valgrind"
    );
    Command::new("valgrind")
}

/// Run `program args` under valgrind tool `tool` (with its strict options)
/// and assert a clean report.
pub fn run_under_valgrind(tool: &str, program: &Path, args: &[&str], envs: &[(&str, &str)]) {
    let mut cmd = valgrind();
    cmd.arg(format!("--tool={tool}"))
        .arg("--error-exitcode=99")
        .arg("--quiet");
    if tool == "memcheck" {
        cmd.args([
            "--leak-check=full",
            "--errors-for-leak-kinds=definite,indirect",
            "--track-origins=yes",
        ]);
    }
    cmd.arg(program).args(args);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = run_ok(&mut cmd);
    assert!(
        stdout(&out).contains("PASS"),
        "{tool}: {}\n{}",
        stdout(&out),
        stderr(&out)
    );
}
