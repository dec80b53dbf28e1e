//! The shard tree of the tutorial (docs/tutorial.md), as TheRock's CI
//! produces it, laid out from real HIP binaries: the input of the pipeline
//! tests and of the pipeline benchmark.
//!
//! Three shards, `gfx110X-build` (gfx1100, gfx1101, gfx1102),
//! `gfx1151-build` (gfx1151) and `gfx120X-build` (gfx1200, gfx1201), each
//! with
//! - `blas_lib_<family>`: a fat `librocblas.so.5.2` (one bundle) with its
//!   `.so.5`/`.so` symlink chain and rocBLAS Tensile database files, and a
//!   fat `libhipblaslt.so.0.9` (`-fgpu-rdc`: one bundle, three wrappers)
//!   with hipBLASLt database files; two manifest prefixes;
//! - `fft_lib_<family>`: `lib/rocfft/librocfft_kernels.so.0.1`, two
//!   objects with device code, one compressed (two bundles), and a manifest
//!   prefix that does not exist;
//! - `base_lib_<family>`: host-only.
//!
//! `cargo xtask fixtures` builds the fat binaries of each shard into
//! `target/fixtures/<shard>/` (listed in `fixtures.json` as
//! `shard_binaries`); the host-only library is the `libhostonly.so`
//! fixture.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::tree::{self, copy, symlink, write};

/// (shard directory, artifact family, targets).
pub const SHARDS: &[(&str, &str, &[&str])] = &[
    (
        "gfx110X-build",
        "gfx110X-dgpu",
        &["gfx1100", "gfx1101", "gfx1102"],
    ),
    ("gfx1151-build", "gfx1151", &["gfx1151"]),
    ("gfx120X-build", "gfx120X-all", &["gfx1200", "gfx1201"]),
];

pub const ROCBLAS_PREFIX: &str = "math-libs/BLAS/rocBLAS/stage";
pub const HIPBLASLT_PREFIX: &str = "math-libs/BLAS/hipBLASLt/stage";
pub const FFT_PREFIX: &str = "math-libs/rocFFT/stage";
pub const FFT_MISSING_PREFIX: &str = "math-libs/rocFFT/unused-stage";
pub const BASE_PREFIX: &str = "base/stage";

/// The fat binaries of every shard: (artifact prefix, install prefix, path
/// in the prefix). The file name is the fixture's, in the shard's
/// directory of `target/fixtures`.
pub const FAT_BINARIES: &[(&str, &str, &str)] = &[
    ("blas_lib", ROCBLAS_PREFIX, "lib/librocblas.so.5.2"),
    ("blas_lib", HIPBLASLT_PREFIX, "lib/libhipblaslt.so.0.9"),
    ("fft_lib", FFT_PREFIX, "lib/rocfft/librocfft_kernels.so.0.1"),
];

/// The fixture that is every shard's host-only library.
pub const HOST_ONLY_FIXTURE: &str = "libhostonly.so";

/// The database families `kpack split --split-databases` is given.
pub const SPLIT_DATABASES: &[&str] = &["rocblas", "hipblaslt"];

/// The tutorial's packaging config for these shards (`kpack recombine`).
pub const PACKAGING_CONFIG: &str = r#"{
  "primary_shard": "gfx110X-build",
  "architecture_groups": {
    "gfx110X": {"display_name": "gfx110X", "architectures": ["gfx1100", "gfx1101", "gfx1102"]},
    "gfx115X": {"display_name": "gfx115X", "architectures": ["gfx1151"]},
    "gfx120X": {"display_name": "gfx120X", "architectures": ["gfx1200", "gfx1201"]}
  },
  "validation": {
    "error_on_duplicate_device_code": true,
    "verify_generic_artifacts_match": false,
    "error_on_missing_architecture": false
  }
}
"#;

/// The file name of a path in a prefix.
pub fn file_name(rel: &str) -> &str {
    rel.rsplit('/').next().unwrap_or(rel)
}

/// Where `cargo xtask fixtures` puts a shard's fat binary `rel` (a path of
/// [`FAT_BINARIES`]), relative to the fixtures directory.
pub fn fixture_name(shard: &str, rel: &str) -> String {
    format!("{shard}/{}", file_name(rel))
}

/// The database files of a shard: (artifact prefix, install prefix, path,
/// target or None for generic database files).
pub fn database_files(
    targets: &[&str],
) -> Vec<(&'static str, &'static str, String, Option<String>)> {
    let mut v = Vec::new();
    for t in targets {
        for name in [
            format!("TensileLibrary_Type_HH_Contraction_l_Ailk_Bljk_{t}.dat"),
            format!("TensileLibrary_{t}.co"),
            format!("Kernels.so-000-{t}.hsaco"),
        ] {
            v.push((
                "blas_lib",
                ROCBLAS_PREFIX,
                format!("lib/rocblas/library/{name}"),
                Some(t.to_string()),
            ));
        }
        for name in [
            format!("TensileLibrary_lazy_{t}.dat"),
            format!("extop_{t}.co"),
        ] {
            v.push((
                "blas_lib",
                HIPBLASLT_PREFIX,
                format!("lib/hipblaslt/library/{name}"),
                Some(t.to_string()),
            ));
        }
    }
    v.push((
        "blas_lib",
        ROCBLAS_PREFIX,
        "lib/rocblas/library/TensileLibrary_fallback.dat".into(),
        None,
    ));
    v
}

/// Lay the whole shard tree out under `root` (`root/<shard>/<artifact>`),
/// from the binaries in the fixtures directory `fixtures`.
pub fn make_shards(fixtures: &Path, root: &Path) -> Result<()> {
    for (shard, family, targets) in SHARDS {
        make_shard(fixtures, root, shard, family, targets)?;
    }
    Ok(())
}

/// One shard of the tree.
pub fn make_shard(
    fixtures: &Path,
    root: &Path,
    shard: &str,
    family: &str,
    targets: &[&str],
) -> Result<()> {
    let fat = |rel: &str| fixtures.join(fixture_name(shard, rel));
    let blas = root.join(shard).join(format!("blas_lib_{family}"));
    write(
        &blas.join("artifact_manifest.txt"),
        format!("{ROCBLAS_PREFIX}\n{HIPBLASLT_PREFIX}\n").as_bytes(),
        0o644,
    )?;
    for (artifact, prefix, rel) in FAT_BINARIES {
        let dir = root.join(shard).join(format!("{artifact}_{family}"));
        copy(&fat(rel), &dir.join(prefix).join(rel), 0o755)
            .with_context(|| format!("{shard}: run `cargo xtask fixtures`"))?;
    }
    let rb = blas.join(ROCBLAS_PREFIX);
    symlink("librocblas.so.5.2", &rb.join("lib/librocblas.so.5"))?;
    symlink("librocblas.so.5", &rb.join("lib/librocblas.so"))?;
    write(
        &rb.join("include/rocblas/rocblas.h"),
        b"/* rocBLAS API */\n",
        0o644,
    )?;
    write(
        &rb.join("bin/rocblas-config"),
        b"#!/bin/sh\necho rocblas\n",
        0o750,
    )?;
    write(
        &rb.join("lib/rocblas/library/TensileManifest.txt"),
        b"manifest\n",
        0o644,
    )?;
    let hb = blas.join(HIPBLASLT_PREFIX);
    symlink("libhipblaslt.so.0.9", &hb.join("lib/libhipblaslt.so.0"))?;
    for (_, prefix, rel, target) in database_files(targets) {
        let text = format!("{rel} for {}\n", target.as_deref().unwrap_or("any target"));
        // One database file is private, to check that modes are kept.
        let mode = if rel.ends_with(".hsaco") {
            0o600
        } else {
            0o644
        };
        write(&blas.join(prefix).join(&rel), text.as_bytes(), mode)?;
    }

    let fft = root.join(shard).join(format!("fft_lib_{family}"));
    write(
        &fft.join("artifact_manifest.txt"),
        format!("{FFT_PREFIX}\n{FFT_MISSING_PREFIX}\n").as_bytes(),
        0o644,
    )?;
    symlink(
        "rocfft/librocfft_kernels.so.0.1",
        &fft.join(FFT_PREFIX).join("lib/librocfft_kernels.so.0"),
    )?;

    let base = root.join(shard).join(format!("base_lib_{family}"));
    write(
        &base.join("artifact_manifest.txt"),
        format!("{BASE_PREFIX}\n").as_bytes(),
        0o644,
    )?;
    let b = base.join(BASE_PREFIX);
    copy(
        &fixtures.join(HOST_ONLY_FIXTURE),
        &b.join("lib").join(HOST_ONLY_FIXTURE),
        0o755,
    )?;
    write(&b.join("share/doc/base/README"), b"base\n", 0o644)?;
    fs::create_dir_all(b.join("share/empty"))?;
    Ok(())
}

/// The artifact directories of a shard, sorted.
pub fn artifacts(shard: &Path) -> Result<Vec<PathBuf>> {
    let mut v = Vec::new();
    for e in fs::read_dir(shard).with_context(|| format!("listing {}", shard.display()))? {
        v.push(e?.path());
    }
    v.sort();
    Ok(v)
}

/// Install artifacts the way a package does: every prefix of each is
/// copied into `root` (symlinks as symlinks). A file that two prefixes
/// both provide is an error.
pub fn install(artifacts: &[PathBuf], root: &Path) -> Result<()> {
    for a in artifacts {
        let manifest = fs::read_to_string(a.join("artifact_manifest.txt"))
            .with_context(|| format!("{}: no manifest", a.display()))?;
        for prefix in manifest.lines().filter(|l| !l.trim().is_empty()) {
            let src = a.join(prefix.trim());
            if src.is_dir() {
                tree::restore(&tree::snapshot(&src)?, root)
                    .with_context(|| format!("installing {}", src.display()))?;
            }
        }
    }
    Ok(())
}
