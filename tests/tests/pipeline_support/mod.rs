//! The shard tree of the seed tutorial, built from real HIP binaries, and
//! helpers shared by the artifact pipeline tests.
//!
//! Three shards, as TheRock's CI produces them: `gfx110X-build` (gfx1100,
//! gfx1101, gfx1102), `gfx1151-build` (gfx1151), `gfx120X-build` (gfx1200,
//! gfx1201), each with
//! - `blas_lib_<family>`: a fat `librocblas.so.5.2` (one bundle) with its
//!   `.so.5`/`.so` symlink chain and rocBLAS Tensile database files, and a
//!   fat `libhipblaslt.so.0.9` (`-fgpu-rdc`: one bundle, three wrappers)
//!   with hipBLASLt database files; two manifest prefixes;
//! - `fft_lib_<family>`: `lib/rocfft/librocfft_kernels.so.0.1`, two
//!   objects with device code, one compressed (two bundles), and a manifest
//!   prefix that does not exist;
//! - `base_lib_<family>`: host-only.
//!
//! The binaries are compiled once (16 clang invocations, a few seconds) into
//! `target/pipeline-fixtures/<hash>/`, keyed by the sources and commands,
//! and copied into each test's own temporary shard tree.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use kpack_e2e::*;

pub const CLANGXX: &str = "clang++-19";

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
/// in the prefix).
pub const FAT_BINARIES: &[(&str, &str, &str)] = &[
    ("blas_lib", ROCBLAS_PREFIX, "lib/librocblas.so.5.2"),
    ("blas_lib", HIPBLASLT_PREFIX, "lib/libhipblaslt.so.0.9"),
    ("fft_lib", FFT_PREFIX, "lib/rocfft/librocfft_kernels.so.0.1"),
];

/// Compiled binaries of one shard (and the shared host-only library).
struct Built {
    dir: PathBuf,
}

fn fnv1a(bytes: &[u8], mut h: u64) -> u64 {
    for &b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn offload_flags(targets: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = ["-nogpulib", "-nogpuinc", "-I", "integration/hip"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    v.extend(targets.iter().map(|t| format!("--offload-arch={t}")));
    v
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// The clang commands that build a shard's binaries into `out` (absolute).
fn commands(targets: &[&str], out: &Path) -> Vec<Vec<String>> {
    let o = |name: &str| out.join(name).display().to_string();
    let mut cmds = Vec::new();
    let shared = |soname: &str| s(&["-fuse-ld=lld", "-shared", &format!("-Wl,-soname,{soname}")]);
    // librocblas: one bundle.
    let mut c = s(&[CLANGXX, "-O2", "-fPIC"]);
    c.extend(offload_flags(targets));
    c.extend(shared("librocblas.so.5"));
    c.extend(s(&[
        "-o",
        &o("librocblas.so.5.2"),
        "-x",
        "hip",
        "integration/hip/vadd.hip",
    ]));
    cmds.push(c);
    // libhipblaslt: -fgpu-rdc, three translation units, one bundle, three wrappers.
    let mut c = s(&[CLANGXX, "-O2", "-fPIC", "-fgpu-rdc"]);
    c.extend(offload_flags(targets));
    c.extend(shared("libhipblaslt.so.0"));
    c.extend(s(&[
        "-o",
        &o("libhipblaslt.so.0.9"),
        "-x",
        "hip",
        "integration/hip/rdc_a.hip",
        "integration/hip/rdc_b.hip",
        "integration/hip/rdc_c.hip",
    ]));
    cmds.push(c);
    // librocfft_kernels: two objects with device code, the first compressed.
    for (src, compress) in [("reduce", true), ("stencil", false)] {
        let mut c = s(&[CLANGXX, "-O2", "-fPIC"]);
        c.extend(offload_flags(targets));
        if compress {
            c.push("--offload-compress".into());
        }
        c.extend(s(&[
            "-c",
            "-o",
            &o(&format!("{src}.o")),
            "-x",
            "hip",
            &format!("integration/hip/{src}.hip"),
        ]));
        cmds.push(c);
    }
    let mut c = s(&[CLANGXX]);
    c.extend(shared("librocfft_kernels.so.0"));
    c.extend(s(&[
        "-o",
        &o("librocfft_kernels.so.0.1"),
        &o("reduce.o"),
        &o("stencil.o"),
        "-lamdhip64",
    ]));
    cmds.push(c);
    cmds
}

fn hostonly_command(out: &Path) -> Vec<String> {
    s(&[
        CLANGXX,
        "-O2",
        "-fPIC",
        "-fuse-ld=lld",
        "-shared",
        "-Wl,-soname,libhostonly.so",
        "-o",
        &out.join("libhostonly.so").display().to_string(),
        "integration/hip/hostonly.cpp",
    ])
}

fn run_commands(cmds: &[Vec<String>]) {
    for c in cmds {
        let out = Command::new(&c[0])
            .args(&c[1..])
            .current_dir(workspace())
            .output()
            .unwrap_or_else(|e| panic!("run {}: {e} (the pipeline tests need clang++-19)", c[0]));
        assert!(
            out.status.success(),
            "{} failed: {}",
            c.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Build (or find built) the binaries of every shard; returns the cache
/// directory: `<shard>/<binary>` and `libhostonly.so`.
fn built() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = workspace().join("target/pipeline-fixtures");
        // The key: every source, every command (with a placeholder output).
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        let mut sources: Vec<PathBuf> = fs::read_dir(workspace().join("integration/hip"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        sources.sort();
        for p in &sources {
            h = fnv1a(&fs::read(p).unwrap(), h);
        }
        for (shard, _, targets) in SHARDS {
            h = fnv1a(shard.as_bytes(), h);
            for c in commands(targets, Path::new("OUT")) {
                h = fnv1a(c.join(" ").as_bytes(), h);
            }
        }
        let version = Command::new(CLANGXX)
            .arg("--version")
            .output()
            .expect("clang++-19 --version");
        h = fnv1a(&version.stdout, h);
        let dir = base.join(format!("{h:016x}"));
        if dir.join("done").is_file() {
            return dir;
        }
        let tmp = base.join(format!(".tmp-{}", std::process::id()));
        let _ = fs::remove_dir_all(&tmp);
        fs::create_dir_all(&tmp).unwrap();
        let mut jobs: Vec<Vec<Vec<String>>> = vec![vec![hostonly_command(&tmp)]];
        for (shard, _, targets) in SHARDS {
            let out = tmp.join(shard);
            fs::create_dir_all(&out).unwrap();
            jobs.push(commands(targets, &out));
        }
        // Two at a time (the machine has two cores).
        std::thread::scope(|scope| {
            let (a, b): (Vec<_>, Vec<_>) = jobs.iter().enumerate().partition(|(i, _)| i % 2 == 0);
            let h1 = scope.spawn(move || a.iter().for_each(|(_, c)| run_commands(c)));
            let h2 = scope.spawn(move || b.iter().for_each(|(_, c)| run_commands(c)));
            h1.join().unwrap();
            h2.join().unwrap();
        });
        fs::write(tmp.join("done"), "").unwrap();
        match fs::rename(&tmp, &dir) {
            Ok(()) => {}
            Err(_) if dir.join("done").is_file() => {
                let _ = fs::remove_dir_all(&tmp);
            }
            Err(e) => panic!("{}: {e}", dir.display()),
        }
        dir
    })
}

fn write(path: &Path, bytes: &[u8], mode: u32) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, bytes).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

fn copy(src: &Path, dst: &Path, mode: u32) {
    write(dst, &fs::read(src).unwrap(), mode);
}

fn symlink(target: &str, at: &Path) {
    fs::create_dir_all(at.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(target, at).unwrap();
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

/// Lay the tutorial's shard tree out under `root` (`root/<shard>/<artifact>`).
pub fn make_shards(root: &Path) {
    for (shard, family, targets) in SHARDS {
        make_shard(root, shard, family, targets);
    }
}

/// One shard of the tutorial tree.
pub fn make_shard(root: &Path, shard: &str, family: &str, targets: &[&str]) {
    let bin = built().join(shard);
    let blas = root.join(shard).join(format!("blas_lib_{family}"));
    write(
        &blas.join("artifact_manifest.txt"),
        format!("{ROCBLAS_PREFIX}\n{HIPBLASLT_PREFIX}\n").as_bytes(),
        0o644,
    );
    let rb = blas.join(ROCBLAS_PREFIX);
    copy(
        &bin.join("librocblas.so.5.2"),
        &rb.join("lib/librocblas.so.5.2"),
        0o755,
    );
    symlink("librocblas.so.5.2", &rb.join("lib/librocblas.so.5"));
    symlink("librocblas.so.5", &rb.join("lib/librocblas.so"));
    write(
        &rb.join("include/rocblas/rocblas.h"),
        b"/* rocBLAS API */\n",
        0o644,
    );
    write(
        &rb.join("bin/rocblas-config"),
        b"#!/bin/sh\necho rocblas\n",
        0o750,
    );
    write(
        &rb.join("lib/rocblas/library/TensileManifest.txt"),
        b"manifest\n",
        0o644,
    );
    let hb = blas.join(HIPBLASLT_PREFIX);
    copy(
        &bin.join("libhipblaslt.so.0.9"),
        &hb.join("lib/libhipblaslt.so.0.9"),
        0o755,
    );
    symlink("libhipblaslt.so.0.9", &hb.join("lib/libhipblaslt.so.0"));
    for (_, prefix, rel, target) in database_files(targets) {
        let text = format!("{rel} for {}\n", target.as_deref().unwrap_or("any target"));
        // One database file is private, to check that modes are kept.
        let mode = if rel.ends_with(".hsaco") {
            0o600
        } else {
            0o644
        };
        write(&blas.join(prefix).join(&rel), text.as_bytes(), mode);
    }

    let fft = root.join(shard).join(format!("fft_lib_{family}"));
    write(
        &fft.join("artifact_manifest.txt"),
        format!("{FFT_PREFIX}\n{FFT_MISSING_PREFIX}\n").as_bytes(),
        0o644,
    );
    let f = fft.join(FFT_PREFIX);
    copy(
        &bin.join("librocfft_kernels.so.0.1"),
        &f.join("lib/rocfft/librocfft_kernels.so.0.1"),
        0o755,
    );
    symlink(
        "rocfft/librocfft_kernels.so.0.1",
        &f.join("lib/librocfft_kernels.so.0"),
    );

    let base = root.join(shard).join(format!("base_lib_{family}"));
    write(
        &base.join("artifact_manifest.txt"),
        format!("{BASE_PREFIX}\n").as_bytes(),
        0o644,
    );
    let b = base.join(BASE_PREFIX);
    copy(
        &built().join("libhostonly.so"),
        &b.join("lib/libhostonly.so"),
        0o755,
    );
    write(&b.join("share/doc/base/README"), b"base\n", 0o644);
    fs::create_dir_all(b.join("share/empty")).unwrap();
}

/// The code objects of a fat binary as clang-offload-bundler extracts them:
/// (bundle index, target) -> bytes.
pub fn ground_truth(binary: &Path) -> BTreeMap<(usize, String), Vec<u8>> {
    let scratch = tempfile::tempdir().unwrap();
    let fatbin = objcopy_section(binary, ".hip_fatbin", scratch.path());
    let mut out = BTreeMap::new();
    for (i, b) in split_bundles(&fatbin).iter().enumerate() {
        let file = scratch.path().join(format!("bundle{i}.bin"));
        fs::write(&file, b).unwrap();
        let sub = scratch.path().join(format!("b{i}"));
        fs::create_dir(&sub).unwrap();
        for (target, bytes) in bundler_unbundle(&file, &sub) {
            out.insert((i, target), bytes);
        }
    }
    out
}

/// Every entry below `dir`: relative path -> (kind, bytes or link target,
/// mode), for comparing trees.
pub fn snapshot(dir: &Path) -> BTreeMap<String, (char, Vec<u8>, u32)> {
    let mut out = BTreeMap::new();
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, (char, Vec<u8>, u32)>) {
        let mut names: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        for p in names {
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let m = fs::symlink_metadata(&p).unwrap();
            let mode = m.permissions().mode() & 0o7777;
            if m.file_type().is_symlink() {
                let t = fs::read_link(&p).unwrap();
                out.insert(rel, ('l', t.display().to_string().into_bytes(), 0));
            } else if m.is_dir() {
                out.insert(rel, ('d', Vec::new(), mode));
                walk(root, &p, out);
            } else {
                out.insert(rel, ('f', fs::read(&p).unwrap(), mode));
            }
        }
    }
    walk(dir, dir, &mut out);
    out
}

/// Names of the entries of a directory, sorted.
pub fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Files below `dir` (recursively) whose name satisfies `pred`.
pub fn find(dir: &Path, pred: &dyn Fn(&str) -> bool) -> Vec<PathBuf> {
    snapshot(dir)
        .keys()
        .filter(|k| pred(Path::new(k).file_name().unwrap().to_str().unwrap()))
        .map(|k| dir.join(k))
        .collect()
}

/// Install artifacts the way a package does: every prefix of each is
/// copied into `root` (symlinks as symlinks). A file that two prefixes
/// both provide is an error.
pub fn install(artifacts: &[PathBuf], root: &Path) {
    for a in artifacts {
        let manifest = fs::read_to_string(a.join("artifact_manifest.txt")).unwrap();
        for prefix in manifest.lines().filter(|l| !l.trim().is_empty()) {
            let src = a.join(prefix.trim());
            if !src.is_dir() {
                continue;
            }
            for (rel, (kind, bytes, mode)) in snapshot(&src) {
                let dst = root.join(&rel);
                match kind {
                    'd' => fs::create_dir_all(&dst).unwrap(),
                    'l' => {
                        assert!(fs::symlink_metadata(&dst).is_err(), "{rel} installed twice");
                        symlink(std::str::from_utf8(&bytes).unwrap(), &dst);
                    }
                    _ => {
                        assert!(fs::symlink_metadata(&dst).is_err(), "{rel} installed twice");
                        write(&dst, &bytes, mode);
                    }
                }
            }
        }
    }
}
