//! The C++ API's zero-copy path (`kpack::CodeObject` from
//! `Archive::kernel_view` and `Cache::load_code_object_view`):
//! `tests/cxx/view_test.cpp`, built as a consumer of the installed
//! libraries, over the scenario of `common/zero_copy.rs`; natively and
//! under valgrind memcheck.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::common::zero_copy::{setup, SIZES};
use crate::common::*;

fn program() -> &'static Path {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        let out = build_dir("cxx_view").join("view_test");
        let mut p = cxx_program();
        p.input(crate_dir().join("tests/cxx/view_test.cpp"));
        link_cxx(&mut p, &out);
        out
    })
}

#[test]
fn views_are_mappings_that_outlive_archive_and_cache() {
    let (_tmp, dir) = setup();
    let n = SIZES.len().to_string();
    let args = [dir.to_str().unwrap(), n.as_str()];
    let out = run_ok(
        Command::new(program())
            .args(args)
            .env_remove("ROCM_KPACK_PATH")
            .env_remove("ROCM_KPACK_PATH_PREFIX")
            .env_remove("ROCM_KPACK_DISABLE"),
    );
    assert!(stdout(&out).contains("PASS"), "{}", stderr(&out));
    run_under_valgrind("memcheck", program(), &args, &[]);
}
