//! kpack's Python API on the installed wheel: `cargo xtask wheel` builds
//! the abi3 wheel, which is installed with real pip into a fresh virtual
//! environment per interpreter (the test environment's CPython, and
//! CPython 3.9 and the newest one when installed: `cargo xtask py-env`
//! lists them), and the pytest suite of `python/tests` runs there.

use std::path::PathBuf;
use std::process::Command;

use crate::common::wheel::*;
use crate::common::*;

/// The interpreters to test on: the environment's own, then those
/// `cargo xtask py-env` found (3.9, the newest).
fn interpreters() -> Vec<PathBuf> {
    let venv = venv();
    let mut v = vec![venv.join("bin/python")];
    if let Ok(list) = std::fs::read_to_string(venv.join("test-pythons.txt")) {
        v.extend(list.lines().filter(|l| !l.is_empty()).map(PathBuf::from));
    }
    v
}

#[test]
fn python_api_tests_pass_on_the_installed_wheel() {
    let tmp = scratch();
    let t = tmp.path();
    let whl = crate::python_package::build_wheel(&t.join("kw"));
    let pythons = interpreters();
    let mut ran = Vec::new();
    for (i, py) in pythons.iter().enumerate() {
        let env = t.join(format!("venv{i}"));
        run_ok(
            Command::new(py)
                .args(["-m", "venv", "--without-pip"])
                .arg(&env),
        );
        let r = pip_install(
            &env,
            &[whl.parent().unwrap(), &wheelhouse()],
            &["rocm-kpack", "pytest", "msgpack", "zstandard"],
        );
        assert!(
            r.status.success(),
            "pip ({}): {}",
            py.display(),
            String::from_utf8_lossy(&r.stderr)
        );
        let version = run_ok(Command::new(env.join("bin/python")).arg("--version"));
        let out = Command::new(env.join("bin/python"))
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
            .arg(workspace().join("python/tests"))
            .env("KPACK_FIXTURES_DIR", fixtures_dir())
            .env(
                "PATH",
                format!("{}:/usr/bin:/bin", env.join("bin").display()),
            )
            .current_dir(t)
            .output()
            .expect("run pytest");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "pytest on {}: {}\n{stdout}\n{}",
            version.trim(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        ran.push(format!(
            "{}: {}",
            version.trim(),
            stdout.lines().last().unwrap_or("")
        ));
    }
    // Say which interpreters ran (3.9 and the newest only when installed).
    eprintln!("python API tests ran on:\n  {}", ran.join("\n  "));
}
