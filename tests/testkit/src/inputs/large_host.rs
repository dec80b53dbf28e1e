//! The inputs of the bench's `host` section: fat libraries with a large
//! host part (incompressible `.rodata` of 256 MiB and 1 GiB beside about
//! 0.8 MB of device code for four targets), built from source by
//! [`crate::large_host`] (clang-19, lld-19), and a torch-like wheel holding
//! one (`torch/lib/liblargehost.so`).
//!
//! Everything is built once into `target/bench/cache/large-host/<size>/`,
//! rebuilt when the test kit's description of the library changes (its
//! `STAMP` file).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::cache_dir;
use crate::large_host::{self, LargeHost, Spec};
use crate::tree::{link_or_copy, remove};

/// The library's file name (and soname).
pub const LIB_NAME: &str = "liblargehost.so";
const WHEEL_VERSION: &str = "2.10.0+largehost";

/// A size of host part.
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

fn size_dir(root: &Path, size: &Size) -> PathBuf {
    cache_dir(root, "large-host").join(size.id)
}

/// The library of `size` (built when missing or stale).
pub fn library(root: &Path, size: &Size) -> Result<LargeHost> {
    let spec = Spec::bench(LIB_NAME, size.rodata_bytes);
    let dir = size_dir(root, size);
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
/// `torch/lib/liblargehost.so` (built when missing; `work` holds its tree
/// meanwhile).
pub fn wheel(root: &Path, work: &Path, size: &Size, lib: &LargeHost) -> Result<PathBuf> {
    let cache = size_dir(root, size).join("wheel");
    let whl = cache.join(super::wheel::file_name(WHEEL_VERSION));
    if whl.is_file() {
        return Ok(whl);
    }
    eprintln!(
        "building the torch-like wheel of the {}-host library (once)",
        size.label
    );
    let tree = work.join("large-host-wheel-tree");
    remove(&tree)?;
    let t = tree.join("torch");
    link_or_copy(&lib.path, &t.join("lib").join(LIB_NAME))?;
    std::fs::write(t.join("__init__.py"), "# torch-like bench wheel\n")?;
    let whl = super::wheel::pack_torch(root, &tree, WHEEL_VERSION, &cache)?;
    remove(&tree)?;
    Ok(whl)
}
