//! `cargo xtask dist --prefix P [--shared]`: a release build installed as a
//! relocatable package: `P/lib/librocm_kpack.a` (prelinked: only the C API
//! is global, no C++ runtime needed), `P/lib/librocm_kpack_cxx.a` (the C++
//! API's glue), `P/include/rocm_kpack/` and `P/include/rust/cxx.h`,
//! `P/bin/kpack`, and the CMake package in `P/lib/cmake/rocm-kpack/`. No
//! Rust toolchain (nor cxx) is needed to consume it, from C or C++17.

use std::path::Path;

use anyhow::{bail, Context, Result};
use xshell::{cmd, Shell};

use kpack_testkit::cprog::prelinked;

use crate::cargo;

/// The library directory under the prefix.
const LIBDIR: &str = "lib";

pub fn run(sh: &Shell, root: &Path, prefix: &Path, shared: bool) -> Result<()> {
    let cargo = cargo();
    let prefix = std::path::absolute(prefix)?;
    cmd!(
        sh,
        "{cargo} build --release --package kpack-cxx --package kpack-cli"
    )
    .run()
    .context("cargo build --release")?;
    let release = root.join("target/release");
    let system_libs = native_static_libs(sh)?;

    let lib = prefix.join(LIBDIR);
    let include = prefix.join("include");
    let bin = prefix.join("bin");
    let cmake = lib.join("cmake/rocm-kpack");
    for d in [&lib, &include, &bin, &cmake] {
        sh.create_dir(d)?;
    }

    // The static library, prelinked so that a shared library linking it
    // (libamdhip64) exports nothing of Rust or zstd; the C++ glue; the
    // headers (kpack-cxx/src/bin/rocm-kpack-prelink.rs).
    prelinked(&release, &lib, &include)?;
    // The glue is compiled with the release profile's line tables: drop
    // them, as for the other installed binaries.
    let glue = lib.join("librocm_kpack_cxx.a");
    cmd!(sh, "strip --strip-debug {glue}").run()?;
    if shared {
        let so = lib.join("librocm_kpack.so");
        sh.copy_file(release.join("librocm_kpack.so"), &so)?;
        cmd!(sh, "strip --strip-debug {so}").run()?;
    }
    let kpack = bin.join("kpack");
    sh.copy_file(release.join("kpack"), &kpack)?;
    cmd!(sh, "strip {kpack}").run()?;

    // The CMake package.
    let version = env!("CARGO_PKG_VERSION");
    let fill = |text: &str| {
        text.replace("@KPACK_VERSION@", version)
            .replace("@KPACK_LIBDIR@", LIBDIR)
            .replace("@KPACK_SYSTEM_LIBS@", &system_libs.join(";"))
    };
    for (template, out) in [
        ("rocm-kpack-config.cmake.in", "rocm-kpack-config.cmake"),
        (
            "rocm-kpack-config-version.cmake.in",
            "rocm-kpack-config-version.cmake",
        ),
    ] {
        let text = sh.read_file(root.join("cmake").join(template))?;
        sh.write_file(cmake.join(out), fill(&text))?;
    }
    for module in ["KpackOffload.cmake", "KpackTargets.cmake"] {
        sh.copy_file(root.join("cmake").join(module), &cmake)?;
    }
    println!("installed kpack {version} into {}", prefix.display());
    println!(
        "  link libraries of kpack::runtime: {}",
        system_libs.join(" ")
    );
    Ok(())
}

/// The system libraries the static library needs, as rustc reports them
/// (`-lpthread` becomes `Threads::Threads`; libc goes without saying;
/// `-lstdc++`, which the cxx crate asks for, is for the C++ glue only and
/// comes with the C++ compiler that links it: the prelinked C library
/// needs no C++ runtime).
fn native_static_libs(sh: &Shell) -> Result<Vec<String>> {
    let cargo = cargo();
    let out = cmd!(
        sh,
        "{cargo} rustc --release --package kpack-cxx --lib --crate-type staticlib -- --print native-static-libs"
    )
    .quiet()
    .ignore_status()
    .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let Some(line) = stderr
        .lines()
        .find_map(|l| l.split_once("native-static-libs:").map(|x| x.1))
    else {
        bail!("rustc did not print native-static-libs:\n{stderr}");
    };
    let mut libs = Vec::new();
    for flag in line.split_whitespace() {
        let name = flag.strip_prefix("-l").unwrap_or(flag);
        let name = match name {
            "c" | "stdc++" => continue,
            "pthread" => "Threads::Threads",
            n => n,
        };
        if !libs.iter().any(|l: &String| l == name) {
            libs.push(name.to_string());
        }
    }
    Ok(libs)
}
