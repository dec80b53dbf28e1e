//! The header-only C++ API (`kpack.hpp`) through a C++17 program linked
//! against `librocm_kpack.a`, also under valgrind memcheck.

mod common;

use common::*;

#[test]
fn cxx_api() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    let reference = std::fs::read(reference_fixtures().join("test_noop.kpack")).unwrap();
    let mut bad = reference.clone();
    bad[..4].copy_from_slice(b"KPAX");
    std::fs::write(work.join("bad_magic.kpack"), bad).unwrap();
    // The loader scenario: app#0 in both per-target archives, app#1 only
    // for gfx1101, app#2 damaged.
    write_archive(
        &work.join("lib_gfx1100.kpack"),
        &["gfx1100"],
        &[("app#0", "gfx1100"), ("app#2", "gfx1100")],
    );
    let mut b = std::fs::read(work.join("lib_gfx1100.kpack")).unwrap();
    damage_frame(&mut b, 1);
    std::fs::write(work.join("lib_gfx1100.kpack"), b).unwrap();
    write_archive(
        &work.join("lib_gfx1101.kpack"),
        &["gfx1101"],
        &[("app#0", "gfx1101"), ("app#1", "gfx1101")],
    );
    let meta = work.join("app.meta");
    write_metadata(&meta, "app", &["lib_@GFXARCH@.kpack", "lib_gfx1100.kpack"]);

    let program = build_dir("cxx_api").join("api_test");
    build_program(
        "c++17",
        &crate_dir().join("tests/cxx/api_test.cpp"),
        &staticlib(),
        &program,
    );
    let fixtures = reference_fixtures();
    let bin = work.join("app");
    let args = [
        fixtures.to_str().unwrap(),
        work.to_str().unwrap(),
        meta.to_str().unwrap(),
        bin.to_str().unwrap(),
    ];
    let out = run_ok(std::process::Command::new(&program).args(args));
    assert!(stdout(&out).contains("PASS"), "{}", stdout(&out));
    run_under_valgrind("memcheck", &program, &args, &[]);
}
