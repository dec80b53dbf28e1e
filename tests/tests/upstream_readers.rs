//! Upstream's Python readers on what kpack writes: the reference package
//! (`rocm_kpack` of ROCm's rocm-kpack, not on PyPI) reads the HIPK metadata
//! of kpack's offloaded ELF and PE binaries, which carry kpack's extra keys
//! `kpack_targets` and `kpack_device_sha256` (also once `kpack bundle` has
//! re-pointed them; and `kpack_co_targets` for a binary whose bundles
//! hold different targets), its
//! binary verifiers accept them, and its archive reader gets every code
//! object back from archives whose entries carry provenance digests.
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

/// The job for upstream's readers: kpack's offloaded libmulti.so and
/// multi.dll (in `dir/lib`, archives in `dir/.kpack`), then both bundled
/// into `dir/app` (re-pointed: their metadata rewritten in place); every
/// code object as (archive, key, target), and its SHA-256.
fn outputs(dir: &Path) -> (Vec<Value>, Vec<Value>, Vec<String>) {
    let (mut binaries, mut kernels, mut expected) = (Vec::new(), Vec::new(), Vec::new());
    let (lib, archives, app) = (dir.join("lib"), dir.join(".kpack"), dir.join("app"));
    for (f, pe) in [
        (fixture("libmulti.so"), false),
        (foreign_fixture("windows/multi.dll"), true),
    ] {
        let out = lib.join(f.file_name());
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
            let key = format!("{}#{co}", f.file_name());
            kernels.push(serde_json::json!([archive, key, t]));
            expected.push(sha256(&bytes));
        }
    }
    kpack_ok(&[
        &"bundle",
        &lib.join("libmulti.so"),
        &lib.join("multi.dll"),
        &"--into",
        &app,
    ]);
    binaries.push(serde_json::json!({"path": app.join("libmulti.so"), "pe": false}));
    binaries.push(serde_json::json!({"path": app.join("multi.dll"), "pe": true}));
    (binaries, kernels, expected)
}

/// What upstream read of one binary, fixture `name`: its verifier passes,
/// the marker has the reference's keys first and kpack's targets after.
fn check_binary(b: &Value, name: &str, search_dir: &str) {
    let (fx, stem) = match name.ends_with(".dll") {
        true => (foreign_fixture(name), "multi"),
        false => (fixture(name), "libmulti"),
    };
    assert_eq!(
        b["passed"], true,
        "{name}: upstream's verifier: {}",
        b["errors"]
    );
    let keys = serde_json::json!([
        "kpack_search_paths",
        "kernel_name",
        "kpack_targets",
        "kpack_device_sha256"
    ]);
    assert_eq!(b["keys"], keys, "{name}");
    let m = &b["marker"];
    let path = format!("{search_dir}/{stem}_@GFXARCH@.kpack");
    assert_eq!(m["kpack_search_paths"], serde_json::json!([path]), "{name}");
    assert_eq!(m["kernel_name"], fx.file_name(), "{name}");
    let mut targets = fx.targets.clone();
    targets.sort();
    assert_eq!(m["kpack_targets"], serde_json::json!(targets), "{name}");
    assert_eq!(
        m["kpack_device_sha256"],
        device_digest_of(&fx.path).as_str(),
        "{name}"
    );
}

#[test]
fn upstream_reads_kpack_outputs_with_the_targets_key() {
    let Some(upstream) = upstream() else { return };
    let tmp = scratch();
    let (binaries, kernels, expected) = outputs(tmp.path());
    let job = tmp.path().join("job.json");
    let spec = serde_json::json!({"binaries": binaries, "kernels": kernels});
    fs::write(&job, spec.to_string()).unwrap();
    let got = upstream_python(tmp.path(), &upstream, &job);
    let read = got["binaries"].as_array().unwrap();
    assert_eq!(read.len(), 4);
    for (i, name) in ["libmulti.so", "windows/multi.dll"]
        .iter()
        .cycle()
        .take(4)
        .enumerate()
    {
        check_binary(&read[i], name, if i < 2 { "../.kpack" } else { ".kpack" });
    }
    let sums: Vec<String> = got["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().expect("upstream found the kernel").to_string())
        .collect();
    assert_eq!(sums, expected, "upstream's archive reader");
    // The digests the entries record are those of the bytes upstream read.
    for (k, sum) in kernels.iter().zip(&sums) {
        let ls: Value =
            serde_json::from_str(&kpack_ok(&[&"ls", &k[0].as_str().unwrap(), &"--json"])).unwrap();
        let entry = ls["kernels"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["key"] == k[1] && e["target"] == k[2])
            .unwrap();
        assert_eq!(entry["code_object_sha256"], sum.as_str(), "{k}");
    }
    eprintln!(
        "upstream readers: exercised ({} binaries, {} code objects)",
        binaries.len(),
        expected.len()
    );
}

/// A binary whose bundles hold different targets (libmixed.so) carries
/// `kpack_co_targets` too, after the other keys, also once `kpack bundle`
/// has re-pointed it: upstream's verifier and marker reader take it, and
/// its archive reader gets every code object back.
#[test]
fn upstream_reads_a_binary_with_per_bundle_targets() {
    let Some(upstream) = upstream() else { return };
    let tmp = scratch();
    let (lib, archives, app) = (
        tmp.path().join("lib"),
        tmp.path().join(".kpack"),
        tmp.path().join("app"),
    );
    let f = fixture("libmixed.so");
    let out = lib.join("libmixed.so");
    kpack_ok(&[
        &"offload",
        &f.path,
        &"-o",
        &out,
        &"--archive-dir",
        &archives,
    ]);
    kpack_ok(&[&"bundle", &out, &"--into", &app]);
    let (mut kernels, mut expected) = (Vec::new(), Vec::new());
    for ((co, t), bytes) in code_objects(&f.path) {
        let archive = archives.join(format!("libmixed_{t}.kpack"));
        kernels.push(serde_json::json!([archive, format!("libmixed.so#{co}"), t]));
        expected.push(sha256(&bytes));
    }
    let binaries =
        [out, app.join("libmixed.so")].map(|p| serde_json::json!({"path": p, "pe": false}));
    let job = tmp.path().join("job.json");
    let spec = serde_json::json!({"binaries": binaries, "kernels": kernels});
    fs::write(&job, spec.to_string()).unwrap();
    let got = upstream_python(tmp.path(), &upstream, &job);
    for b in got["binaries"].as_array().unwrap() {
        assert_eq!(b["passed"], true, "upstream's verifier: {}", b["errors"]);
        let keys = serde_json::json!([
            "kpack_search_paths",
            "kernel_name",
            "kpack_targets",
            "kpack_device_sha256",
            "kpack_co_targets"
        ]);
        assert_eq!(b["keys"], keys);
        let m = &b["marker"];
        assert_eq!(m["kpack_targets"], serde_json::json!(["gfx1100", "gfx90a"]));
        // Bundle #1 holds kpack_targets[0] (gfx1100) only.
        assert_eq!(m["kpack_co_targets"], serde_json::json!([[[0], [1]]]));
    }
    let sums: Vec<&str> = (got["kernels"].as_array().unwrap().iter())
        .map(|v| v.as_str().expect("upstream found the kernel"))
        .collect();
    assert_eq!(sums, expected, "upstream's archive reader");
    assert_eq!(expected.len(), 3);
}
