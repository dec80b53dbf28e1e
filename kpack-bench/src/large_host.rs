//! The `host` section's inputs: fat libraries with a large host part
//! (incompressible `.rodata` of 256 MiB and 1 GiB beside about 0.8 MB of
//! device code for four targets), built from source by the test kit
//! ([`kpack_testkit::large_host`]: clang-19, lld-19), and a torch-like
//! wheel holding one (`torch/lib/liblargehost.so`, packed by PyPI's
//! `wheel pack`, as the `wheels` section's wheels are).
//!
//! Everything is built once into `target/bench/cache/large-host/<size>/`,
//! rebuilt when the test kit's description of the library changes (its
//! `STAMP` file).

use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use kpack_testkit::large_host::{self, LargeHost, Spec};
use xshell::Shell;

use crate::context::Ctx;
use crate::inputs::{link_or_copy, remove};

/// The library's file name (and soname).
pub const LIB_NAME: &str = "liblargehost.so";
const WHEEL_VERSION: &str = "2.10.0+largehost";
const WHEEL_TAG: &str = "cp311-cp311-linux_x86_64";

/// A size of host part measured.
#[derive(Debug, Clone, Copy)]
pub struct Size {
    /// In row ids (`256m`).
    pub id: &'static str,
    /// In the table (`256 MiB`).
    pub label: &'static str,
    pub rodata_bytes: u64,
}

pub const SIZES: [Size; 2] = [
    Size {
        id: "256m",
        label: "256 MiB",
        rodata_bytes: 256 << 20,
    },
    Size {
        id: "1g",
        label: "1 GiB",
        rodata_bytes: 1 << 30,
    },
];

fn cache_dir(ctx: &Ctx, size: &Size) -> PathBuf {
    ctx.root.join("target/bench/cache/large-host").join(size.id)
}

/// The library of `size` (built when missing or stale).
pub fn library(ctx: &Ctx, size: &Size) -> Result<LargeHost> {
    let spec = Spec::bench(LIB_NAME, size.rodata_bytes);
    let dir = cache_dir(ctx, size);
    let stamp = dir.join("STAMP");
    let path = dir.join(LIB_NAME);
    if path.is_file() && std::fs::read_to_string(&stamp).ok() == Some(spec.describe()) {
        return Ok(LargeHost { path, spec });
    }
    remove(&dir)?;
    std::fs::create_dir_all(&dir)?;
    eprintln!(
        "building {} with {} of .rodata (once; kept in {})",
        LIB_NAME,
        size.label,
        dir.display()
    );
    let lib = large_host::build(&spec, &dir)
        .with_context(|| format!("building the {}-host library", size.label))?;
    std::fs::write(&stamp, spec.describe())?;
    Ok(lib)
}

/// The torch-like wheel holding `lib` (of `size`) as
/// `torch/lib/liblargehost.so` (built when missing).
pub fn wheel(ctx: &Ctx, size: &Size, lib: &LargeHost) -> Result<PathBuf> {
    let cache = cache_dir(ctx, size).join("wheel");
    let wheel = cache.join(format!("torch-{WHEEL_VERSION}-{WHEEL_TAG}.whl"));
    if wheel.is_file() {
        return Ok(wheel);
    }
    eprintln!(
        "building the torch-like wheel of the {}-host library (once)",
        size.label
    );
    let tree = ctx.work.join("large-host-wheel-tree");
    remove(&tree)?;
    let t = tree.join("torch");
    link_or_copy(&lib.path, &t.join("lib").join(LIB_NAME))?;
    std::fs::write(t.join("__init__.py"), "# torch-like bench wheel\n")?;
    write_dist_info(&tree)?;
    std::fs::create_dir_all(&cache)?;
    let python = crate::sections::python(ctx)?;
    let sh = Shell::new()?;
    xshell::cmd!(sh, "{python} -m wheel pack {tree} -d {cache}")
        .quiet()
        .run()
        .context("python -m wheel pack")?;
    remove(&tree)?;
    ensure!(wheel.is_file(), "{} was not made", wheel.display());
    Ok(wheel)
}

/// `torch-<version>.dist-info` in `tree`: METADATA, WHEEL, an empty RECORD.
fn write_dist_info(tree: &Path) -> Result<()> {
    let di = tree.join(format!("torch-{WHEEL_VERSION}.dist-info"));
    std::fs::create_dir_all(&di)?;
    std::fs::write(
        di.join("METADATA"),
        format!("Metadata-Version: 2.1\nName: torch\nVersion: {WHEEL_VERSION}\n"),
    )?;
    std::fs::write(
        di.join("WHEEL"),
        format!(
            "Wheel-Version: 1.0\nGenerator: kpack-bench\nRoot-Is-Purelib: false\nTag: {WHEEL_TAG}\n"
        ),
    )?;
    Ok(std::fs::write(di.join("RECORD"), "")?)
}
