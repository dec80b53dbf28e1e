//! Upstream's Python readers on what kpack writes: the reference package
//! (`rocm_kpack` of ROCm's rocm-kpack, not on PyPI) reads the HIPK metadata
//! of kpack's offloaded ELF and PE binaries, which carry kpack's extra key
//! `kpack_targets` (also once `kpack bundle` has re-pointed them), its
//! binary verifiers accept them, and its archive reader gets every code
//! object back.
//!
//! Optional: `KPACK_UPSTREAM_PYTHON` names upstream's `python/` directory.
//! Without it the test says on stderr that it was not exercised, and
//! `cargo xtask test` prints the same in its summary.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::wheel::*;
use crate::common::*;
use serde_json::Value;

/// Upstream's `python/` directory, when the environment names one.
fn upstream() -> Option<PathBuf> {
    let Some(dir) = std::env::var_os("KPACK_UPSTREAM_PYTHON") else {
        eprintln!(
            "upstream readers: NOT exercised (set KPACK_UPSTREAM_PYTHON to the python/ \
             directory of upstream's rocm-kpack)"
        );
        return None;
    };
    let dir = std::path::absolute(PathBuf::from(dir)).unwrap();
    assert!(
        dir.join("rocm_kpack/kpack_transform.py").is_file(),
        "KPACK_UPSTREAM_PYTHON={}: no rocm_kpack/kpack_transform.py there",
        dir.display()
    );
    Some(dir)
}

/// For each binary given (`path`, `pe`), upstream's marker, its verifier's
/// errors, and the SHA-256 of every code object its archive reader gives
/// for `(archive, key, target)` triples; as JSON.
const SCRIPT: &str = r#"
import hashlib, json, sys
from pathlib import Path
from rocm_kpack.kpack_transform import read_kpack_ref_marker
from rocm_kpack.elf import ElfVerifier
from rocm_kpack.coff.verify import CoffVerifier
from rocm_kpack.kpack import PackedKernelArchive

job = json.load(open(sys.argv[1]))
out = {"binaries": [], "kernels": []}
for b in job["binaries"]:
    path = Path(b["path"])
    verifier = CoffVerifier if b["pe"] else ElfVerifier
    result = verifier.verify(path)
    out["binaries"].append({
        "marker": read_kpack_ref_marker(path),
        "keys": list(read_kpack_ref_marker(path)),
        "passed": result.passed,
        "errors": result.errors,
    })
for archive, key, target in job["kernels"]:
    data = PackedKernelArchive.read(Path(archive)).get_kernel(key, target)
    out["kernels"].append(hashlib.sha256(data).hexdigest() if data is not None else None)
print(json.dumps(out))
"#;

fn sha256(b: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// A venv with PyPI's msgpack and zstandard (upstream's dependencies,
/// from the test wheelhouse) and upstream's package on its path.
fn upstream_python(dir: &Path, upstream: &Path, job: &Path) -> Value {
    let env = new_venv(&dir.join("venv"));
    let r = pip_install(&env, &[&wheelhouse()], &["msgpack", "zstandard"]);
    assert!(
        r.status.success(),
        "pip: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    let script = dir.join("read.py");
    fs::write(&script, SCRIPT).unwrap();
    let out = run_ok(
        Command::new(env.join("bin/python"))
            .arg(&script)
            .arg(job)
            .env("PYTHONPATH", upstream),
    );
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[test]
fn upstream_reads_kpack_outputs_with_the_targets_key() {
    let Some(upstream) = upstream() else { return };
    let tmp = scratch();
    let mut binaries = Vec::new();
    let mut kernels = Vec::new();
    let mut expected = Vec::new();
    for (f, pe) in [
        (fixture("libmulti.so"), false),
        (foreign_fixture("windows/multi.dll"), true),
    ] {
        let out = tmp.path().join("lib").join(f.file_name());
        let archives = tmp.path().join(".kpack");
        kpack_ok(&[
            &"offload",
            &f.path,
            &"-o",
            &out,
            &"--archive-dir",
            &archives,
        ]);
        binaries.push(serde_json::json!({"path": out, "pe": pe}));
        let stem = f.file_name().split('.').next().unwrap().to_string();
        for ((co, t), bytes) in code_objects(&f.path) {
            let archive = archives.join(format!("{stem}_{t}.kpack"));
            kernels.push(serde_json::json!([
                archive,
                format!("{}#{co}", f.file_name()),
                t
            ]));
            expected.push(sha256(&bytes));
        }
    }
    // Both re-pointed by `kpack bundle` (their metadata rewritten in place).
    let app = tmp.path().join("app");
    let lib = tmp.path().join("lib");
    kpack_ok(&[
        &"bundle",
        &lib.join("libmulti.so"),
        &lib.join("multi.dll"),
        &"--into",
        &app,
    ]);
    binaries.push(serde_json::json!({"path": app.join("libmulti.so"), "pe": false}));
    binaries.push(serde_json::json!({"path": app.join("multi.dll"), "pe": true}));
    let job = tmp.path().join("job.json");
    let spec = serde_json::json!({"binaries": binaries, "kernels": kernels});
    fs::write(&job, spec.to_string()).unwrap();
    let got = upstream_python(tmp.path(), &upstream, &job);
    assert_eq!(got["binaries"].as_array().unwrap().len(), 4);
    for (i, (b, f)) in got["binaries"]
        .as_array()
        .unwrap()
        .iter()
        .zip([
            "libmulti.so",
            "windows/multi.dll",
            "libmulti.so",
            "windows/multi.dll",
        ])
        .enumerate()
    {
        let stem = if f.ends_with(".dll") {
            "multi"
        } else {
            "libmulti"
        };
        let dir = if i < 2 { "../.kpack" } else { ".kpack" };
        assert_eq!(
            b["marker"]["kpack_search_paths"],
            serde_json::json!([format!("{dir}/{stem}_@GFXARCH@.kpack")]),
            "{f}"
        );
        let fx = if f.ends_with(".dll") {
            foreign_fixture(f)
        } else {
            fixture(f)
        };
        assert_eq!(
            b["passed"], true,
            "{f}: upstream's verifier: {}",
            b["errors"]
        );
        assert_eq!(
            b["keys"],
            serde_json::json!(["kpack_search_paths", "kernel_name", "kpack_targets"]),
            "{f}"
        );
        let m = &b["marker"];
        assert_eq!(m["kernel_name"], fx.file_name(), "{f}");
        let mut targets = fx.targets.clone();
        targets.sort();
        assert_eq!(m["kpack_targets"], serde_json::json!(targets), "{f}");
    }
    let sums: Vec<String> = got["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().expect("upstream found the kernel").to_string())
        .collect();
    assert_eq!(sums, expected, "upstream's archive reader");
    eprintln!(
        "upstream readers: exercised ({} binaries, {} code objects)",
        binaries.len(),
        expected.len()
    );
}
