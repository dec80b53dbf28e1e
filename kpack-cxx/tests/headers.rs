//! The public headers (as installed, with the generated bridge header and
//! cxx's `rust/cxx.h` for kpack.hpp) compile cleanly as C99, C11 and C++17 with
//! `-Wall -Wextra -Werror -pedantic`, and declare exactly the reference's
//! prototypes, types and values (see tests/c/headers.c).

use crate::common::*;

/// Compile `source` in the standard `std` (as C++ for `c++NN`, whatever the
/// file's extension) with the strict flags.
fn compile(std: &str, source: &str) {
    let out = build_dir("headers").join(format!("{std}.o"));
    let mut p = program(std);
    if std.starts_with("c++") {
        // kpack.hpp includes the generated bridge header and rust/cxx.h.
        p.cc()
            .flag("-x")
            .flag("c++")
            .include(installed().join("include"));
    }
    built(p.input(crate_dir().join(source)).compile(&out));
}

#[test]
fn c_header_as_c99_c11_and_cxx() {
    compile("c99", "tests/c/headers.c");
    compile("c11", "tests/c/headers.c");
    compile("c++17", "tests/c/headers.c");
    compile("c++11", "tests/c/headers.c");
}

#[test]
fn cxx_header_as_cxx17() {
    compile("c++17", "tests/cxx/headers.cpp");
}

#[test]
fn a_wrong_prototype_is_caught() {
    // The check file is strict enough to notice a changed signature.
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("bad.c");
    std::fs::write(
        &src,
        "#include <rocm_kpack/kpack.h>\n\
         int main(void) { kpack_error_t (*f)(const char*, void**) = kpack_open; return f != 0; }\n",
    )
    .unwrap();
    let mut p = program("c11");
    let out = p.input(&src).compile(&dir.path().join("bad.o"));
    assert!(out.is_err());
}
