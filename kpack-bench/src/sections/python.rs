//! Section `python` (`cargo xtask bench --only python`): kpack's Python API
//! on real code objects (librocsparse's gfx1030 ones).
//!
//! Installs the release wheel (`$KPACK_PY_WHEEL`, built by `cargo xtask
//! bench`) into a fresh virtual environment (with PyPI's zstandard and
//! msgpack from the wheelhouse of `$KPACK_PY_VENV`) and runs
//! `kpack-bench/c/python_api.py`, which times (medians):
//! - packing every code object through `PackedKernelArchive` +
//!   `ZstdCompressor(3)` with a thread pool of 2 (from bytes in memory),
//!   against `kpack pack-tree --gfx-arches gfx1030 -j 2` writing the same
//!   archive from the library (plus its host-only copy);
//! - the same work in pure Python: `zstandard` frames on a pool of 2,
//!   `msgpack` TOC, `struct` header;
//! - reading every kernel back through `kpack.Archive`, against
//!   `zstandard` decompressing the same frames from memory.
//!
//! Prints the figures and writes them to `target/bench/python.json`.

use std::path::Path;

use anyhow::{Context, Result};
use xshell::{cmd, Shell};

use crate::context::Ctx;
use crate::report::Row;

const FAT: &str = "/usr/lib/x86_64-linux-gnu/librocsparse.so.0.1";
const TARGET: &str = "gfx1030";

section!(
    "python",
    "kpack's Python API packing and reading librocsparse's gfx1030 code objects, against the command and pure Python",
    run
);

pub fn run(ctx: &Ctx) -> Result<Vec<Row>> {
    let sh = Shell::new()?;
    let dir = ctx.work.join("python");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let whl = std::env::var_os("KPACK_PY_WHEEL")
        .context("$KPACK_PY_WHEEL (the wheel to measure; `cargo xtask bench` builds it)")?;
    let venv = std::env::var_os("KPACK_PY_VENV")
        .map_or_else(|| ctx.root.join("target/py-venv"), std::path::PathBuf::from);
    let env = dir.join("venv");
    let python = venv.join("bin/python");
    cmd!(sh, "{python} -m venv --without-pip {env}").run()?;
    let house = venv.join("wheelhouse");
    let target_python = env.join("bin/python");
    cmd!(sh, "{python} -m pip --python {target_python} install --quiet --no-index --disable-pip-version-check --find-links {house} {whl} zstandard msgpack")
        .run()
        .context("installing the wheel for the bench")?;
    let script = ctx.root.join("kpack-bench/c/python_api.py");
    let kpack = &ctx.kpack;
    let work = dir.join("work");
    let reps = ctx.reps.to_string();
    let out = cmd!(
        sh,
        "{target_python} {script} {kpack} {FAT} {TARGET} {work} {reps}"
    )
    .read()
    .context("kpack-bench/c/python_api.py")?;
    report(&ctx.root, &out)?;
    Ok(Vec::new())
}

/// Print the figures against their targets; keep them as JSON.
fn report(root: &Path, json: &str) -> Result<()> {
    let v: serde_json::Value = serde_json::from_str(json.trim())?;
    let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    println!(
        "python API: {} code objects ({} bytes) of {FAT} for {TARGET}",
        v["code_objects"], v["bytes"]
    );
    println!(
        "  pack: PackedKernelArchive+ZstdCompressor(3), pool of 2 {:.3} s; kpack pack-tree -j 2 {:.3} s: {:.2}x (target <= 1.2x); same archive: {}",
        f("api_s"),
        f("cli_pack_tree_s"),
        f("api_over_cli"),
        v["api_archive_equals_cli_archive"]
    );
    println!(
        "  pure Python (zstandard + msgpack, pool of 2) {:.3} s: {:.2}x the API's time (target >= 10x)",
        f("pure_python_s"),
        f("pure_python_over_api")
    );
    println!(
        "  read every kernel through kpack.Archive {:.4} s; zstandard decompression of the frames {:.4} s: {:.2}x (target <= 1.2x)",
        f("read_archive_s"),
        f("decompress_s"),
        f("read_over_decompress")
    );
    let dir = root.join("target/bench");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("python.json"), json)?;
    Ok(())
}
