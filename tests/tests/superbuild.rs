//! A superbuild shaped like TheRock's (integration/superbuild): Corrosion
//! added first, then kpack with add_subdirectory, several HIP shared
//! libraries offloaded post-link by kpack_offload_target() with the kpack
//! built there (one with two bundles, one linked with -fgpu-rdc, one
//! installing its archives away from it), C and C++ consumers of
//! kpack::runtime and the C++ API's test program. Built with -j2 in the
//! Debug profile, installed; then, from the install tree only, every
//! wrapper of every installed library must load through the runtime to the
//! bytes clang-offload-bundler extracts from the library's un-offloaded
//! twin, and shared libraries linking kpack::runtime export nothing of it
//! but the C API. Also: kpack's targets through FetchContent and
//! find_package(Corrosion) (configured only).
//!
//! Corrosion comes from `CORROSION_SOURCE_DIR` (`.ci/run` sets it to the
//! vendored copy) or an installed package; without either these tests say
//! so and return, and `cargo xtask test` reports the Corrosion path as not
//! exercised (an error under CI=true).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use crate::common::cmake::*;
use crate::common::*;

/// The installed libraries, their twins and their wrappers (1 per bundle,
/// 3 for the three -fgpu-rdc units).
const LIBRARIES: [(&str, usize); 3] = [("kp_blas", 2), ("kp_rdc", 3), ("kp_stencil", 1)];
const TARGETS: [&str; 2] = ["gfx1100", "gfx942"];

fn not_exercised() {
    eprintln!(
        "the Corrosion path was NOT exercised: set CORROSION_SOURCE_DIR \
         to a Corrosion source tree or install Corrosion"
    );
}

fn corrosion_args(c: &Corrosion) -> Vec<String> {
    match c {
        Corrosion::Source(dir) => vec![
            "-DKPACK_CORROSION=subdirectory".into(),
            format!("-DCORROSION_SOURCE_DIR={}", dir.display()),
        ],
        Corrosion::Package => vec!["-DKPACK_CORROSION=package".into()],
    }
}

#[test]
fn superbuild_through_corrosion() {
    let Some(corrosion) = corrosion() else {
        return not_exercised();
    };
    let root = workspace();
    let scratch = tempfile::tempdir().unwrap();
    let build_dir = scratch.path().join("build");
    let mut args = corrosion_args(&corrosion);
    args.push("-DCMAKE_BUILD_TYPE=Debug".into());
    let out = configure_ok(&root.join("integration/superbuild"), &build_dir, &args);
    assert!(
        out.contains("kpack: built from source with Corrosion"),
        "{out}"
    );
    let start = Instant::now();
    let log = cmake_build(&build_dir);
    println!(
        "superbuild (Corrosion, Debug, -j2): built in {:.0} s",
        start.elapsed().as_secs_f64()
    );
    // The offloading ran the kpack built here (Corrosion's cargo tree).
    assert!(
        log.contains("kpack: offloading the device code of kp_rdc"),
        "{log}"
    );
    let cargo_tree = build_dir.join("cargo");
    let built_kpack = std::fs::read_dir(&cargo_tree)
        .unwrap()
        .map(|e| {
            e.unwrap()
                .path()
                .join("x86_64-unknown-linux-gnu/debug/kpack")
        })
        .any(|p| p.is_file());
    assert!(built_kpack, "no kpack built in {}", cargo_tree.display());

    check_symbols(&build_dir);
    assert_no_cxx_runtime(&build_dir.join("check_c"));
    assert_no_cxx_runtime(&build_dir.join("libprobe_c.so"));
    let expected = scratch.path().join("expected");
    for (lib, _) in LIBRARIES {
        write_expected(
            &build_dir.join(format!("lib{lib}_fat.so")),
            &expected.join(lib),
        );
    }

    // From the install tree only.
    let prefix = scratch.path().join("prefix");
    cmake_install(&build_dir, &prefix);
    std::fs::remove_dir_all(&build_dir).unwrap();
    assert!(prefix
        .join("share/kpack/archives/stencil_kernels_gfx942.kpack")
        .is_file());
    for (lib, wrappers) in LIBRARIES {
        let so = prefix.join(format!("lib/lib{lib}.so"));
        kpack_ok(&[&"verify-elf", &so]);
        let c = run_ok(
            Command::new(prefix.join("bin/check_c"))
                .arg(&so)
                .arg(expected.join(lib))
                .args(TARGETS),
        );
        let want = format!(
            "{} code objects loaded and identical, 0 failures",
            wrappers * TARGETS.len()
        );
        assert!(c.contains(&want), "{lib}: {c}");
        assert!(c.contains(&format!("{wrappers} wrappers")), "{lib}: {c}");
        // The C++ consumer checks the wrappers the constructors register.
        let cxx = run_ok(
            Command::new(prefix.join("bin/check_cxx"))
                .arg(&so)
                .arg(expected.join(lib))
                .args(TARGETS),
        );
        assert!(
            cxx.contains("code objects loaded and identical"),
            "{lib}: {cxx}"
        );
    }
    run_cxx_api_test(&prefix.join("bin/cxx_api_test"), scratch.path());
}

/// Shared libraries linking kpack::runtime export their own symbols and
/// the C API only, from C and from C++; the prelinked archive of the build
/// tree has only the C API at default visibility.
fn check_symbols(build_dir: &Path) {
    let api: BTreeSet<String> = rocm_kpack::prelink::EXPORTED_SYMBOLS
        .iter()
        .map(|s| s.to_string())
        .collect();
    for (lib, own) in [
        ("libprobe_c.so", "probe_c"),
        ("libprobe_cxx.so", "_Z9probe_cxxPKc"),
    ] {
        let nm = run_ok(
            Command::new("nm")
                .args(["-D", "--defined-only"])
                .arg(build_dir.join(lib)),
        );
        let defined: BTreeSet<String> = nm
            .lines()
            .filter_map(|l| l.split_whitespace().nth(2))
            // The C++ probe's own instantiations of the standard library.
            .filter(|n| !n.starts_with("_ZNSt") && !n.starts_with("_ZSt"))
            .filter(|n| !["_init", "_fini", "__bss_start", "_edata", "_end"].contains(n))
            .map(str::to_owned)
            .collect();
        let mut want = api.clone();
        want.insert(own.to_string());
        assert_eq!(defined, want, "{lib}");
    }
    let archive = build_dir.join("kpack/kpack-runtime/lib/librocm_kpack.a");
    assert_eq!(default_visibility_globals(&archive), api);
}

/// `dir/<target>#<bundle>.co`: what clang-offload-bundler extracts from each
/// bundle of `twin`'s `.hip_fatbin`.
fn write_expected(twin: &Path, dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let cos = code_objects(twin);
    assert!(!cos.is_empty(), "{}", twin.display());
    for ((bundle, target), bytes) in cos {
        std::fs::write(dir.join(format!("{target}#{bundle}.co")), bytes).unwrap();
    }
}

/// kpack's targets, whichever way Corrosion is brought in: FetchContent
/// (offline, from the same source) and an installed package.
#[test]
fn corrosion_through_fetchcontent_and_find_package() {
    let Some(corrosion) = corrosion() else {
        return not_exercised();
    };
    let root = workspace();
    let scratch = tempfile::tempdir().unwrap();
    let src = root.join("integration/superbuild");
    let package_prefix = match &corrosion {
        Corrosion::Source(dir) => {
            let out = configure_ok(
                &src,
                &scratch.path().join("fetch"),
                &[
                    "-DKPACK_CORROSION=fetchcontent".into(),
                    format!("-DFETCHCONTENT_SOURCE_DIR_CORROSION={}", dir.display()),
                    "-DKPACK_CONFIGURE_ONLY=ON".into(),
                ],
            );
            assert!(
                out.contains("superbuild: kpack built with Corrosion"),
                "{out}"
            );
            // Install Corrosion itself, for find_package, into a scratch
            // prefix: its install rules use absolute destinations made at
            // configure time, so the prefix is set there.
            let b = scratch.path().join("corrosion-build");
            let p = scratch.path().join("corrosion-prefix");
            configure_ok(
                dir,
                &b,
                &[
                    "-DCORROSION_INSTALL_ONLY=ON".into(),
                    "-DCORROSION_BUILD_TESTS=OFF".into(),
                    format!("-DCMAKE_INSTALL_PREFIX={}", p.display()),
                ],
            );
            cmake_install(&b, &p);
            assert!(p
                .join("lib/cmake/Corrosion/CorrosionConfig.cmake")
                .is_file());
            Some(p)
        }
        Corrosion::Package => None,
    };
    let mut args = vec![
        "-DKPACK_CORROSION=package".into(),
        "-DKPACK_CONFIGURE_ONLY=ON".into(),
    ];
    if let Some(p) = package_prefix {
        args.push(format!("-DCMAKE_PREFIX_PATH={}", p.display()));
    }
    let out = configure_ok(&src, &scratch.path().join("package"), &args);
    assert!(
        out.contains("superbuild: kpack built with Corrosion"),
        "{out}"
    );

    // And with Corrosion present but KPACK_USE_CORROSION=OFF: cargo.
    let out = configure_ok(
        &src,
        &scratch.path().join("none"),
        &[
            "-DKPACK_CORROSION=none".into(),
            "-DKPACK_CONFIGURE_ONLY=ON".into(),
        ],
    );
    assert!(out.contains("superbuild: kpack built with cargo"), "{out}");
}
