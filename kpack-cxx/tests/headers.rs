//! The public headers compile cleanly as C99, C11 and C++17 with
//! `-Wall -Wextra -Werror -pedantic`, and declare exactly the reference's
//! prototypes, types and values (see tests/c/headers.c).

mod common;

use std::process::Command;

use common::*;

fn compile(compiler: &str, lang: Option<&str>, std: &str, source: &str) {
    let out = build_dir("headers").join(format!("{std}.o"));
    let mut cmd = Command::new(compiler);
    cmd.arg(format!("-std={std}"))
        .args(["-Wall", "-Wextra", "-Werror", "-pedantic", "-c"]);
    if let Some(lang) = lang {
        cmd.args(["-x", lang]);
    }
    cmd.arg("-I")
        .arg(include_dir())
        .arg(crate_dir().join(source))
        .arg("-o")
        .arg(out);
    run_ok(&mut cmd);
}

#[test]
fn c_header_as_c99_c11_and_cxx() {
    compile("cc", None, "c99", "tests/c/headers.c");
    compile("cc", None, "c11", "tests/c/headers.c");
    compile("c++", Some("c++"), "c++17", "tests/c/headers.c");
    compile("c++", Some("c++"), "c++11", "tests/c/headers.c");
}

#[test]
fn cxx_header_as_cxx17() {
    compile("c++", None, "c++17", "tests/cxx/headers.cpp");
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
    let out = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Werror", "-pedantic", "-c", "-I"])
        .arg(include_dir())
        .arg(&src)
        .arg("-o")
        .arg(dir.path().join("bad.o"))
        .output()
        .unwrap();
    assert!(!out.status.success());
}
