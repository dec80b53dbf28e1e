//! kpack as a pip package: the wheel `cargo xtask wheel` builds (maturin
//! from PyPI) installs into a fresh virtual environment, puts `kpack` on
//! its PATH and provides `python -m rocm_kpack.tools.*`; run with
//! TheRock's argument lists, the entry points write exactly what `kpack
//! split-wheels` and `kpack split` write, with the reference tools' key
//! lines and exit codes.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::wheel::*;
use crate::common::*;

/// Build kpack's wheel (dev profile: reuses the test build) into `dir`
/// (also for the Python API's tests).
pub(crate) fn build_wheel(dir: &Path) -> PathBuf {
    let out = {
        // maturin moves target/debug/kpack away while it packs.
        let _build = build_lock();
        run_ok(
            kpack_testkit::workspace::xtask()
                .args(["wheel", "--debug", "--out"])
                .arg(dir),
        )
    };
    let whl = PathBuf::from(out.lines().last().expect("the wheel's path").trim());
    assert!(whl.is_file(), "{out}");
    whl
}

/// `python -m rocm_kpack.tools.<tool> args` in the installed environment,
/// with only its `bin` on PATH before the system's.
fn tool(env: &Path, name: &str, args: &[OsString]) -> Output {
    let path = format!("{}:/usr/bin:/bin", env.join("bin").display());
    Command::new(env.join("bin/python"))
        .arg("-m")
        .arg(format!("rocm_kpack.tools.{name}"))
        .args(args)
        .env("PATH", path)
        .output()
        .expect("run python")
}

fn ok(o: &Output, what: &str) -> String {
    assert!(
        o.status.success(),
        "{what}: {}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn os(v: &[&str]) -> Vec<OsString> {
    v.iter().map(OsString::from).collect()
}

#[test]
fn pip_installed_kpack_is_a_drop_in_for_rocm_kpack() {
    let tmp = scratch();
    let t = tmp.path();
    let whl = build_wheel(&t.join("kw"));
    let name = whl.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with("rocm_kpack-")
            && name.contains("-cp39-abi3-manylinux_")
            && name.ends_with("_x86_64.whl"),
        "{name}"
    );
    python_ok(&[&"-m", &"wheel", &"unpack", &"-d", &t.join("unpacked"), &whl]);

    let env = new_venv(&t.join("venv"));
    let r = pip_install(&env, &[whl.parent().unwrap()], &["rocm-kpack"]);
    assert!(
        r.status.success(),
        "pip: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    let version = ok(
        &Command::new(env.join("bin/kpack"))
            .arg("--version")
            .output()
            .unwrap(),
        "kpack --version",
    );
    assert!(version.starts_with("kpack "), "{version}");

    split_python_wheels_matches_kpack(&env, t);
    split_artifacts_matches_kpack(&env, t);
    other_tools(&env, t);
}

fn split_python_wheels_matches_kpack(env: &Path, t: &Path) {
    let input = torch_wheel(t);
    let (a, b) = (t.join("wheels-python"), t.join("wheels-kpack"));
    let mut args = therock_args(&input, &a);
    args.extend(os(&[
        "--device-requires-dist",
        "rocm-sdk-device-@GFXARCH@ == 7.1.0",
    ]));
    let stdout = ok(
        &tool(env, "split_python_wheels", &args),
        "split_python_wheels",
    );
    assert!(stdout.starts_with("Split complete:\n"), "{stdout}");
    assert!(stdout.contains(&format!(
        "  Host wheel: {}\n",
        a.join(format!("torch-{VERSION}-{TAG}.whl")).display()
    )));
    let mut kargs: Vec<OsString> = vec!["split-wheels".into()];
    kargs.extend(therock_args(&input, &b));
    kargs.extend(os(&[
        "--device-requires-dist",
        "rocm-sdk-device-@GFXARCH@ == 7.1.0",
    ]));
    let kargs: Vec<&dyn AsRef<std::ffi::OsStr>> = kargs.iter().map(|x| x as _).collect();
    kpack_ok(&kargs);
    assert!(names(&a).len() >= 5, "{:?}", names(&a));
    assert_eq!(dir_files(&a), dir_files(&b));

    // Errors as the reference tool reports them.
    let o = tool(
        env,
        "split_python_wheels",
        &therock_args(&t.join("missing.whl"), &t.join("x")),
    );
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.starts_with("Error: ") && err.contains("missing.whl"),
        "{err}"
    );
    // A usage error: argparse's exit code.
    let o = tool(env, "split_python_wheels", &os(&["--input"]));
    assert_eq!(o.status.code(), Some(2));
}

fn split_artifacts_matches_kpack(env: &Path, t: &Path) {
    let shards = t.join("shards");
    make_shard(
        &shards,
        "gfx110X-build",
        "gfx110X-dgpu",
        &["gfx1100", "gfx1101", "gfx1102"],
    );
    let artifact = shards.join("gfx110X-build/blas_lib_gfx110X-dgpu");
    let therock = |out: &Path| -> Vec<OsString> {
        let mut v: Vec<OsString> = vec![
            "--artifact-dir".into(),
            artifact.clone().into(),
            "--output-dir".into(),
            out.into(),
        ];
        v.extend(os(&[
            "--artifact-prefix",
            "blas_lib",
            "--clang-offload-bundler",
            "/usr/lib/llvm-19/bin/clang-offload-bundler",
            "--split-databases",
            "rocblas",
            "hipblaslt",
        ]));
        v
    };
    let (a, b) = (t.join("split-python"), t.join("split-kpack"));
    let stdout = ok(
        &tool(env, "split_artifacts", &therock(&a)),
        "split_artifacts",
    );
    assert!(
        stdout.contains("Artifact prefix: blas_lib\n") && stdout.ends_with("Splitting complete!\n"),
        "{stdout}"
    );
    let mut kargs: Vec<OsString> = vec!["split".into()];
    kargs.extend(therock(&b));
    let kargs: Vec<&dyn AsRef<std::ffi::OsStr>> = kargs.iter().map(|x| x as _).collect();
    kpack_ok(&kargs);
    assert_eq!(
        names(&a),
        [
            "blas_lib_generic",
            "blas_lib_gfx1100",
            "blas_lib_gfx1101",
            "blas_lib_gfx1102"
        ]
    );
    assert_eq!(snapshot(&a), snapshot(&b));

    let verify = ok(
        &tool(
            env,
            "verify_artifacts",
            &os(&["--artifacts-dir", a.to_str().unwrap()]),
        ),
        "verify_artifacts",
    );
    assert!(verify.ends_with("\u{2713} ALL CHECKS PASSED\n"), "{verify}");
    let o = tool(
        env,
        "verify_artifacts",
        &os(&["--artifacts-dir", t.join("nothing").to_str().unwrap()]),
    );
    assert_eq!(o.status.code(), Some(2));

    // Batch mode, and an error (the output exists).
    let batch = t.join("split-batch");
    let args = os(&[
        "--batch-artifact-parent-dir",
        shards.join("gfx110X-build").to_str().unwrap(),
        "--output-dir",
        batch.to_str().unwrap(),
    ]);
    let stdout = ok(
        &tool(env, "split_artifacts", &args),
        "split_artifacts batch",
    );
    assert!(
        stdout.contains("BATCH ARTIFACT SPLITTING")
            && stdout.contains("\u{2713} BATCH SPLITTING COMPLETED SUCCESSFULLY"),
        "{stdout}"
    );
    let o = tool(env, "split_artifacts", &args);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).starts_with("Error: "));
}

fn other_tools(env: &Path, t: &Path) {
    let fixtures = fixtures_dir();
    let host = t.join("libvadd_host.so");
    kpack_ok(&[
        &"offload",
        &fixtures.join("libvadd.so"),
        &"-o",
        &host,
        &"--archive-dir",
        &t.join("ar"),
    ]);
    let out = ok(
        &tool(env, "verify_elf", &[host.clone().into()]),
        "verify_elf",
    );
    assert!(
        out.starts_with(&format!("Verifying: {}\n", host.display()))
            && out.ends_with("Overall: PASSED\n"),
        "{out}"
    );
    let o = tool(env, "verify_elf", &[fixtures.join("libvadd.so").into()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stdout).ends_with("Overall: FAILED\n"));

    let dest = t.join("unbundled");
    let out = ok(
        &tool(
            env,
            "bulk_unbundle",
            &[
                fixtures.join("libvadd.so").into(),
                "-o".into(),
                dest.clone().into(),
                "--gfx-arch".into(),
                "gfx942".into(),
            ],
        ),
        "bulk_unbundle",
    );
    assert_eq!(out, format!("Unbundled {}: gfx942.hsaco\n", dest.display()));
    assert_eq!(names(&dest), ["gfx942.hsaco"]);
    assert_eq!(
        fs::read(dest.join("gfx942.hsaco")).unwrap(),
        code_objects(&fixtures.join("libvadd.so"))[&(0, "gfx942".to_string())]
    );

    for name in [
        "recombine_artifacts",
        "pack_tree",
        "split_artifacts",
        "split_python_wheels",
        "verify_artifacts",
    ] {
        ok(&tool(env, name, &os(&["--help"])), name);
    }
    let tree = t.join("tree");
    fs::create_dir_all(tree.join("lib")).unwrap();
    fs::copy(fixtures.join("libvadd.so"), tree.join("lib/libvadd.so")).unwrap();
    let args = os(&[
        "--input",
        tree.to_str().unwrap(),
        "--output",
        t.join("packed").to_str().unwrap(),
        "--group-name",
        "vadd",
    ]);
    ok(&tool(env, "pack_tree", &args), "pack_tree");
    assert!(t.join("packed/.kpack/vadd_gfx942.kpack").is_file());
}

/// `pip install .` and `pip install -e .` from a source checkout (PEP 517
/// through maturin, as TheRock installs kpack from its source tree): both
/// install the `kpack` command and both packages, working; the editable
/// install imports the checkout's Python sources (an edit is seen without
/// reinstalling). The checkout is a copy of this one (the editable build
/// writes the extension into its `python/`); the build runs in the dev
/// profile into this workspace's `target/`, so it reuses the test build.
#[test]
fn pip_install_from_a_source_checkout() {
    let tmp = scratch();
    let t = tmp.path();
    let src = t.join("kpack-src");
    copy_checkout(&workspace(), &src);
    for editable in [false, true] {
        let env = new_venv(&t.join(if editable { "editable" } else { "plain" }));
        let out = {
            let _build = build_lock();
            pip_install_source(&env, &src, editable)
        };
        ok(&out, &format!("pip install (editable: {editable})"));
        let version = ok(
            &Command::new(env.join("bin/kpack"))
                .arg("--version")
                .output()
                .unwrap(),
            "kpack --version",
        );
        assert!(version.starts_with("kpack "), "{version}");
        let report = ok(&round_trip(&env, t), "the library API");
        let mut lines = report.lines();
        assert_eq!(lines.next(), Some("b'code object'"), "{report}");
        let origin = PathBuf::from(lines.next().expect("rocm_kpack's file"));
        assert_eq!(
            origin.starts_with(&src),
            editable,
            "rocm_kpack imported from {}",
            origin.display()
        );
    }
    // The editable install follows the checkout.
    let init = src.join("python/rocm_kpack/__init__.py");
    let mut text = fs::read_to_string(&init).unwrap();
    text.push_str("\nEDITED_IN_THE_CHECKOUT = 42\n");
    fs::write(&init, text).unwrap();
    let seen = ok(
        &Command::new(t.join("editable/bin/python"))
            .args([
                "-c",
                "import rocm_kpack; print(rocm_kpack.EDITED_IN_THE_CHECKOUT)",
            ])
            .output()
            .unwrap(),
        "import after an edit",
    );
    assert_eq!(seen.trim(), "42");
}

/// `pip install [-e] src` into `env`, offline: maturin comes from the
/// wheelhouse into pip's isolated build environment.
fn pip_install_source(env: &Path, src: &Path, editable: bool) -> Output {
    let mut c = Command::new(venv().join("bin/python"));
    c.args(["-m", "pip", "--python"])
        .arg(env.join("bin/python"))
        .args(["install", "--no-index", "--disable-pip-version-check"])
        .arg("--find-links")
        .arg(wheelhouse());
    if editable {
        c.arg("-e");
    }
    c.arg(src)
        .env("CARGO_TARGET_DIR", workspace().join("target"))
        .env("MATURIN_PEP517_ARGS", "--profile dev")
        .output()
        .expect("run pip")
}

/// Pack a code object with upstream's API, read it back; print it and
/// where `rocm_kpack` was imported from.
fn round_trip(env: &Path, dir: &Path) -> Output {
    let script = r#"
import sys, rocm_kpack
from rocm_kpack.kpack import PackedKernelArchive
a = PackedKernelArchive("g", "gfx110X", ["gfx1100"])
a.add_kernel(a.prepare_kernel("lib/x.so", "gfx1100", b"code object"))
a.finalize_archive()
a.write(sys.argv[1])
print(PackedKernelArchive.read(sys.argv[1]).get_kernel("lib/x.so", "gfx1100"))
print(rocm_kpack.__file__)
"#;
    Command::new(env.join("bin/python"))
        .args(["-c", script])
        .arg(dir.join(format!(
            "{}.kpack",
            env.file_name().unwrap().to_string_lossy()
        )))
        .output()
        .expect("run python")
}

/// The checkout at `from` without its build outputs, VCS data and caches.
fn copy_checkout(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        let skip = ["target", ".git", "__pycache__"].contains(&name.as_str())
            || (name.starts_with("_native") && name.ends_with(".so"));
        if skip {
            continue;
        }
        let ty = e.file_type().unwrap();
        if ty.is_dir() {
            copy_checkout(&e.path(), &to.join(&name));
        } else if ty.is_file() {
            fs::copy(e.path(), to.join(&name)).unwrap();
        }
    }
}
