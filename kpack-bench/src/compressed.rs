//! A benchmark input that looks like the libraries ROCm and PyTorch ship
//! since `--offload-compress` became the default: one compressed bundle
//! (CCOB v3, zstd) per host object, each holding one bundle with a code
//! object per target, 20 to 120 MB decompressed, inside a shared library
//! linked with lld from those host objects (clang's
//! `-fcuda-include-gpubinary`), whose wrappers point at them.
//!
//! Made from Debian's librocsparse (111 plain bundles of 7 targets, 777
//! code objects): its bundles are taken in order and grouped to the sizes
//! of [`GROUP_MB`]; a group becomes one bundle whose code object for a
//! target is the group's code objects for it, one after the other (as one
//! device-linked code object per target would be; kpack never looks inside
//! code objects). LLVM 19's `clang-offload-bundler -compress` makes each
//! bundle (zstd at its default level 3, long-distance matching, CCOB v2),
//! which is then given the CCOB v3 header ROCm 7's compilers write (the
//! same payload; LLVM 19 writes v2 only); kpack's own parser checks that
//! it holds the code objects put in. Copy `k` (k > 0) has the middle byte
//! of every original code object XORed with `k`, so that copies share no
//! code object; a library is a list of copies (`[0]`, `[0, 1]`, `[0, 1, 2,
//! 3]`: 1×, 2×, 4× the bundles).
//!
//! Everything is built once into `target/bench/cache/ccob-rocsparse/`
//! (deterministic: the same bytes on every build); the payloads of copy 0
//! are kept as files (`ccob-<g>.zst`) for the floor, which decompresses
//! them. [`plain_twin`] links the same host objects with the bundles
//! stored plainly, for checking that offload writes the same archives.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use anyhow::{bail, ensure, Context, Result};
use kpack_bundle::{list_fatbin, BundleInfo};

use crate::context::Ctx;
use crate::inputs::{remove, ROCSPARSE};

/// Decompressed sizes the compressed bundles are grouped to, in turn (MB):
/// a group closes before the bundle that would take it past its size.
const GROUP_MB: &[u64] = &[24, 64, 118, 40, 96, 32, 80, 56, 110, 72];
/// Changes when the way the inputs are made changes (rebuilds the cache).
const STAMP: &str = "ccob-rocsparse v2: clang-offload-bundler-19 -compress, v3 header, one code object per target per group; groups 24,64,118,40,96,32,80,56,110,72 MB";
const CLANGXX: &str = "clang++-19";
const BUNDLER: &str = "/usr/lib/llvm-19/bin/clang-offload-bundler";

/// A compressed library, built.
#[derive(Debug, Clone)]
pub struct CompressedLib {
    /// `lib-<copies>/librocsparse.so.0.1`.
    pub path: PathBuf,
    /// The compressed bundles' payloads (zstd frames), in order, when the
    /// library is copy 0 alone: what the floor decompresses.
    pub payloads: Vec<PathBuf>,
    /// Compressed bundles, and plain bundles inside them.
    pub ccobs: usize,
    pub bundles: usize,
    /// Sum of the compressed bundles' uncompressed sizes.
    pub decompressed: u64,
    /// The largest compressed bundle's uncompressed size.
    pub largest: u64,
    /// Sum of the code objects' sizes (what kpack compresses).
    pub code_bytes: u64,
}

/// One compressed bundle of a copy, built.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Ccob {
    /// Its payload (copy 0 only).
    payload: Option<PathBuf>,
    object: PathBuf,
    uncompressed: u64,
    code_bytes: u64,
    inner: usize,
}

fn cache_dir(ctx: &Ctx) -> PathBuf {
    ctx.root.join("target/bench/cache/ccob-rocsparse")
}

/// The library holding the given copies of librocsparse's bundles, in
/// order (built when missing).
pub fn library(ctx: &Ctx, copies: &[usize]) -> Result<CompressedLib> {
    let cache = cache_dir(ctx);
    let stamp = cache.join("STAMP");
    if std::fs::read_to_string(&stamp).ok().as_deref() != Some(STAMP) {
        remove(&cache)?;
        std::fs::create_dir_all(&cache)?;
        std::fs::write(&stamp, STAMP)?;
    }
    let name = copies
        .iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join("-");
    let dir = cache.join(format!("lib-{name}"));
    let path = dir.join(ROCSPARSE.file_name());
    let mut all = Vec::new();
    for &k in copies {
        all.extend(copy(ctx, k)?);
    }
    if !path.is_file() {
        remove(&dir)?;
        std::fs::create_dir_all(&dir)?;
        eprintln!(
            "linking {} ({} compressed bundles)",
            path.display(),
            all.len()
        );
        let objects: Vec<PathBuf> = all.iter().map(|c| c.object.clone()).collect();
        link(&objects, &path)?;
    }
    let payloads = match copies {
        [0] => all.iter().filter_map(|c| c.payload.clone()).collect(),
        _ => Vec::new(),
    };
    Ok(CompressedLib {
        path,
        payloads,
        ccobs: all.len(),
        bundles: all.iter().map(|c| c.inner).sum(),
        decompressed: all.iter().map(|c| c.uncompressed).sum(),
        largest: all.iter().map(|c| c.uncompressed).max().unwrap_or(0),
        code_bytes: all.iter().map(|c| c.code_bytes).sum(),
    })
}

/// Copy `k` of the bundles: its compressed bundles and host objects
/// (built when missing).
fn copy(ctx: &Ctx, k: usize) -> Result<Vec<Ccob>> {
    let dir = cache_dir(ctx).join(format!("copy-{k}"));
    let index = dir.join("ccobs.json");
    if let Ok(s) = std::fs::read_to_string(&index) {
        if let Ok(v) = serde_json::from_str::<Vec<Ccob>>(&s) {
            return Ok(v);
        }
    }
    remove(&dir)?;
    std::fs::create_dir_all(&dir)?;
    let lib = Path::new(ROCSPARSE.path);
    if !lib.is_file() {
        bail!("{} missing (Debian package librocsparse0)", lib.display());
    }
    eprintln!("building compressed bundles of librocsparse, copy {k} (once)");
    let mapped = kpack_loader::map_file(lib)?;
    let bin = kpack_host::binary::HostBinary::parse(&mapped)?;
    let section = bin.fatbin()?.context("librocsparse has no .hip_fatbin")?;
    let bundles = list_fatbin(section.data)?;
    ensure!(
        bundles.iter().all(|b| b.compressed.is_none()),
        "librocsparse's bundles are expected plain"
    );
    let groups = group(&bundles);
    let jobs: Vec<(usize, Vec<&BundleInfo>)> = groups.into_iter().enumerate().collect();
    let next = Mutex::new(0usize);
    let out: Mutex<Vec<Option<Ccob>>> = Mutex::new(vec![None; jobs.len()]);
    let failed: Mutex<Option<anyhow::Error>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let i = {
                    let mut n = next.lock().unwrap();
                    let i = *n;
                    *n += 1;
                    i
                };
                let Some((g, members)) = jobs.get(i) else {
                    break;
                };
                match build_ccob(ctx, &dir, k, *g, members, section.data) {
                    Ok(c) => out.lock().unwrap()[i] = Some(c),
                    Err(e) => {
                        *failed.lock().unwrap() = Some(e);
                        break;
                    }
                }
            });
        }
    });
    if let Some(e) = failed.into_inner().unwrap() {
        return Err(e);
    }
    let ccobs: Vec<Ccob> = out.into_inner().unwrap().into_iter().flatten().collect();
    ensure!(
        ccobs.len() == jobs.len(),
        "a compressed bundle was not built"
    );
    std::fs::write(&index, serde_json::to_string_pretty(&ccobs)?)?;
    Ok(ccobs)
}

/// Consecutive bundles grouped to the sizes of [`GROUP_MB`] in turn.
fn group(bundles: &[BundleInfo]) -> Vec<Vec<&BundleInfo>> {
    let mut groups: Vec<Vec<&BundleInfo>> = Vec::new();
    let mut cur: Vec<&BundleInfo> = Vec::new();
    let mut size = 0u64;
    for b in bundles {
        let limit = GROUP_MB[groups.len() % GROUP_MB.len()] * 1_000_000;
        let len = b.range.len() as u64;
        if !cur.is_empty() && size + len > limit {
            groups.push(std::mem::take(&mut cur));
            size = 0;
        }
        cur.push(b);
        size += len;
    }
    if !cur.is_empty() {
        groups.push(cur);
    }
    groups
}

/// Compressed bundle `g` of copy `k`: one bundle whose code object for
/// each target is the code objects of `members` for it (copy `k` of their
/// bytes) one after the other, made by clang-offload-bundler; and its host
/// object.
fn build_ccob(
    ctx: &Ctx,
    dir: &Path,
    k: usize,
    g: usize,
    members: &[&BundleInfo],
    section: &[u8],
) -> Result<Ccob> {
    let triples: Vec<&str> = members[0]
        .device_entries()
        .map(|e| e.triple.as_str())
        .collect();
    let mut code: Vec<Vec<u8>> = vec![Vec::new(); triples.len()];
    for b in members {
        let bytes = &section[b.range.clone()];
        for (t, out) in triples.iter().zip(&mut code) {
            let e = b
                .device_entries()
                .find(|e| e.triple == *t)
                .with_context(|| format!("bundle {} has no {t}", b.index))?;
            let start = out.len();
            out.extend_from_slice(&bytes[e.offset as usize..(e.offset + e.size) as usize]);
            if k > 0 && e.size > 0 {
                out[start + e.size as usize / 2] ^= k as u8;
            }
        }
    }
    let inputs: Vec<PathBuf> = (0..triples.len())
        .map(|i| dir.join(format!("g{g}-{i}.co")))
        .collect();
    for (p, c) in inputs.iter().zip(&code) {
        std::fs::write(p, c)?;
    }
    let host = dir.join(format!("g{g}-host.o"));
    std::fs::write(&host, b"")?;
    let v2 = dir.join(format!("ccob-{g}.v2"));
    let mut targets = vec!["host-x86_64-unknown-linux-gnu".to_string()];
    targets.extend(triples.iter().map(|t| t.to_string()));
    let mut cmd = Command::new(BUNDLER);
    cmd.args(["-type=o", "-compress"])
        .arg(format!("-targets={}", targets.join(",")))
        .arg(format!("-input={}", host.display()));
    for p in &inputs {
        cmd.arg(format!("-input={}", p.display()));
    }
    cmd.arg(format!("-output={}", v2.display()));
    let out = cmd.output().with_context(|| format!("running {BUNDLER}"))?;
    ensure!(
        out.status.success(),
        "{BUNDLER} -compress of group {g}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for p in inputs.iter().chain([&host]) {
        std::fs::remove_file(p)?;
    }
    let made = std::fs::read(&v2)?;
    std::fs::remove_file(&v2)?;
    let v3 = to_v3(&made).with_context(|| format!("group {g}"))?;
    let uncompressed = check(&v3, &triples, &code).with_context(|| format!("group {g}"))?;
    let file = dir.join(format!("ccob-{g}.bin"));
    std::fs::write(&file, &v3)?;
    let object = host_object(ctx, dir, k, g, &file)?;
    std::fs::remove_file(&file)?;
    let payload = match k {
        0 => {
            let p = dir.join(format!("ccob-{g}.zst"));
            std::fs::write(&p, &v3[32..])?;
            Some(p)
        }
        _ => None,
    };
    Ok(Ccob {
        payload,
        object,
        uncompressed,
        code_bytes: code.iter().map(|c| c.len() as u64).sum(),
        inner: 1,
    })
}

/// A CCOB v2 (what LLVM 19 writes) as v3: the same method, sizes, hash
/// and payload under the 32-byte header.
fn to_v3(v2: &[u8]) -> Result<Vec<u8>> {
    ensure!(
        v2.len() >= 24 && &v2[..4] == b"CCOB" && v2[4..6] == 2u16.to_le_bytes(),
        "clang-offload-bundler did not write a CCOB v2"
    );
    let word = |at: usize| u32::from_le_bytes(v2[at..at + 4].try_into().unwrap()) as u64;
    let (total, uncompressed) = (word(8) as usize, word(12));
    ensure!(
        total == v2.len(),
        "CCOB v2 total size {total}, file {}",
        v2.len()
    );
    let payload = &v2[24..];
    let mut v3 = b"CCOB".to_vec();
    v3.extend(3u16.to_le_bytes());
    v3.extend_from_slice(&v2[6..8]);
    v3.extend((32 + payload.len() as u64).to_le_bytes());
    v3.extend(uncompressed.to_le_bytes());
    v3.extend_from_slice(&v2[16..24]);
    v3.extend_from_slice(payload);
    Ok(v3)
}

/// kpack's parser finds in the CCOB the code objects put in (and its hash
/// matches): its uncompressed size.
fn check(v3: &[u8], triples: &[&str], code: &[Vec<u8>]) -> Result<u64> {
    let bundles = kpack_bundle::parse_fatbin(v3)?;
    ensure!(bundles.len() == 1, "{} bundles", bundles.len());
    let (ccob, _) = bundles[0].compressed.as_ref().context("not compressed")?;
    ensure!(
        ccob.version == 3 && ccob.hash_matches == Some(true),
        "{ccob:?}"
    );
    for (t, c) in triples.iter().zip(code) {
        let e = bundles[0]
            .device_entries()
            .find(|e| e.triple == *t)
            .with_context(|| format!("no {t}"))?;
        ensure!(&e.data[..] == c.as_slice(), "{t}: other bytes");
    }
    Ok(ccob.uncompressed_size)
}

/// The host object of compressed bundle `g` of copy `k`: a kernel stub
/// and the bundle as its `.hip_fatbin`.
fn host_object(ctx: &Ctx, dir: &Path, k: usize, g: usize, fatbin: &Path) -> Result<PathBuf> {
    let src = dir.join(format!("b{g}.hip"));
    std::fs::write(
        &src,
        format!(
            "#include \"kpack_hip.h\"\n\
             __global__ void rocsparse_bench_c{k}_b{g}(float *p) {{ if (p) p[0] = {g}.0f; }}\n"
        ),
    )?;
    let object = dir.join(format!("b{g}.o"));
    let hip = ctx.root.join("integration/hip");
    let out = Command::new(CLANGXX)
        .args(["-x", "hip", "--cuda-host-only", "-fPIC", "-O2"])
        .args(["-nogpulib", "-nogpuinc", "-I"])
        .arg(&hip)
        .arg("-Xclang")
        .arg(format!("-cuid=bench{k}x{g}"))
        .args(["-Xclang", "-fcuda-include-gpubinary", "-Xclang"])
        .arg(fatbin)
        .args(["-c", "-o"])
        .arg(&object)
        .arg(&src)
        .output()
        .with_context(|| format!("running {CLANGXX}"))?;
    ensure!(
        out.status.success(),
        "compiling {}: {}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(object)
}

/// The 1× library with its bundles stored plainly: the same host objects
/// (made again in `dir`, each with its bundle decompressed), linked at
/// `dir/librocsparse.so.0.1`. Offloading it must write the same archives
/// as offloading the 1× library.
pub fn plain_twin(ctx: &Ctx, dir: &Path) -> Result<PathBuf> {
    let ccobs = copy(ctx, 0)?;
    remove(dir)?;
    std::fs::create_dir_all(dir)?;
    let mut objects = Vec::new();
    for (g, c) in ccobs.iter().enumerate() {
        let payload = std::fs::read(c.payload.as_ref().context("copy 0 keeps its payloads")?)?;
        let fatbin = dir.join(format!("plain-{g}.bin"));
        std::fs::write(&fatbin, zstd::stream::decode_all(&payload[..])?)?;
        objects.push(host_object(ctx, dir, 0, g, &fatbin)?);
        std::fs::remove_file(&fatbin)?;
    }
    let path = dir.join(ROCSPARSE.file_name());
    link(&objects, &path)?;
    for o in objects {
        std::fs::remove_file(o)?;
    }
    Ok(path)
}

/// Link host objects into a shared library at `path`, soname
/// `librocsparse.so.0`.
fn link(objects: &[PathBuf], path: &Path) -> Result<()> {
    // Linked beside and renamed: an interrupted link leaves no library.
    let tmp = path.with_extension("linking");
    let out = Command::new(CLANGXX)
        .args([
            "-fuse-ld=lld",
            "-shared",
            "-Wl,-soname,librocsparse.so.0",
            "-o",
        ])
        .arg(&tmp)
        .args(objects)
        .output()
        .with_context(|| format!("running {CLANGXX}"))?;
    ensure!(
        out.status.success(),
        "linking {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::rename(&tmp, path)?;
    Ok(())
}
