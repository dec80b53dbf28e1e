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
//! same payload; LLVM 19 writes v2 only), and checked (decompressed, its
//! size and hash, the code objects put in). Copy `k` (k > 0) has the middle byte
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

use anyhow::{ensure, Context, Result};
use md5::{Digest, Md5};

use super::cache_dir;
use super::rocm::{code_objects, CodeObject, Mapped, ROCSPARSE};
use crate::oracle::entry_table;
use crate::tree::{link_or_copy, remove};

const WHEEL_VERSION: &str = "2.10.0+ccob";
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

/// A plain bundle of librocsparse: its range in the file and its device
/// code objects.
struct Bundle {
    index: usize,
    range: std::ops::Range<u64>,
    entries: Vec<CodeObject>,
}

impl Bundle {
    fn entry(&self, triple: &str) -> Option<&CodeObject> {
        self.entries.iter().find(|e| e.triple == triple)
    }
}

/// librocsparse's plain bundles.
fn bundles(lib: &Path, map: &Mapped) -> Result<Vec<Bundle>> {
    let (cos, ranges) = code_objects(lib, map)?;
    let mut bundles: Vec<Bundle> = ranges
        .into_iter()
        .enumerate()
        .map(|(index, range)| Bundle {
            index,
            range,
            entries: Vec::new(),
        })
        .collect();
    for co in cos {
        bundles[co.bundle].entries.push(co);
    }
    Ok(bundles)
}

fn ccob_dir(root: &Path) -> PathBuf {
    cache_dir(root, "ccob-rocsparse")
}

/// The library holding the given copies of librocsparse's bundles, in
/// order (built when missing).
pub fn library(root: &Path, copies: &[usize]) -> Result<CompressedLib> {
    let cache = ccob_dir(root);
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
        all.extend(copy(root, k)?);
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
fn copy(root: &Path, k: usize) -> Result<Vec<Ccob>> {
    let dir = ccob_dir(root).join(format!("copy-{k}"));
    let index = dir.join("ccobs.json");
    if let Ok(s) = std::fs::read_to_string(&index) {
        if let Ok(v) = serde_json::from_str::<Vec<Ccob>>(&s) {
            return Ok(v);
        }
    }
    remove(&dir)?;
    std::fs::create_dir_all(&dir)?;
    let lib = ROCSPARSE.installed()?;
    eprintln!("building compressed bundles of librocsparse, copy {k} (once)");
    let map = Mapped::open(lib)?;
    let bundles = bundles(lib, &map)?;
    let groups = group(&bundles);
    let jobs: Vec<(usize, Vec<&Bundle>)> = groups.into_iter().enumerate().collect();
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
                match build_ccob(root, &dir, k, *g, members, &map) {
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
fn group(bundles: &[Bundle]) -> Vec<Vec<&Bundle>> {
    let mut groups: Vec<Vec<&Bundle>> = Vec::new();
    let mut cur: Vec<&Bundle> = Vec::new();
    let mut size = 0u64;
    for b in bundles {
        let limit = GROUP_MB[groups.len() % GROUP_MB.len()] * 1_000_000;
        let len = b.range.end - b.range.start;
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
    root: &Path,
    dir: &Path,
    k: usize,
    g: usize,
    members: &[&Bundle],
    map: &Mapped,
) -> Result<Ccob> {
    let triples: Vec<&str> = members[0]
        .entries
        .iter()
        .map(|e| e.triple.as_str())
        .collect();
    let code = group_code(k, &triples, members, map)?;
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
    let object = host_object(root, dir, k, g, &file)?;
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

/// For each of `triples`, the code objects of `members` for it one after
/// the other, copy `k` of their bytes.
fn group_code(
    k: usize,
    triples: &[&str],
    members: &[&Bundle],
    map: &Mapped,
) -> Result<Vec<Vec<u8>>> {
    let mut code: Vec<Vec<u8>> = vec![Vec::new(); triples.len()];
    for b in members {
        for (t, out) in triples.iter().zip(&mut code) {
            let e = b
                .entry(t)
                .with_context(|| format!("bundle {} has no {t}", b.index))?;
            let bytes = map.bytes(&e.range);
            let start = out.len();
            out.extend_from_slice(bytes);
            if k > 0 && !bytes.is_empty() {
                out[start + bytes.len() / 2] ^= k as u8;
            }
        }
    }
    Ok(code)
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

/// The CCOB decompresses to the size and hash its header states, and to
/// one bundle holding the code objects put in: its uncompressed size.
fn check(v3: &[u8], triples: &[&str], code: &[Vec<u8>]) -> Result<u64> {
    let word = |at: usize| u64::from_le_bytes(v3[at..at + 8].try_into().unwrap());
    ensure!(v3.len() >= 32, "a CCOB v3 header");
    let (uncompressed, hash) = (word(16), word(24));
    let plain = zstd::stream::decode_all(&v3[32..]).context("the payload")?;
    ensure!(
        plain.len() as u64 == uncompressed,
        "{} bytes decompressed, the header says {uncompressed}",
        plain.len()
    );
    let digest = Md5::digest(&plain);
    ensure!(
        u64::from_le_bytes(digest[..8].try_into().unwrap()) == hash,
        "the hash does not match"
    );
    let entries = entry_table(&plain)?;
    ensure!(
        entries.len() == triples.len(),
        "{} device entries",
        entries.len()
    );
    for (want, c) in triples.iter().zip(code) {
        let (_, r) = entries
            .iter()
            .find(|(t, _)| t == want)
            .with_context(|| format!("no {want}"))?;
        ensure!(&plain[r.clone()] == c.as_slice(), "{want}: other bytes");
    }
    Ok(uncompressed)
}

/// The host object of compressed bundle `g` of copy `k`: a kernel stub
/// and the bundle as its `.hip_fatbin`.
fn host_object(root: &Path, dir: &Path, k: usize, g: usize, fatbin: &Path) -> Result<PathBuf> {
    let src = dir.join(format!("b{g}.hip"));
    std::fs::write(
        &src,
        format!(
            "#include \"kpack_hip.h\"\n\
             __global__ void rocsparse_bench_c{k}_b{g}(float *p) {{ if (p) p[0] = {g}.0f; }}\n"
        ),
    )?;
    let object = dir.join(format!("b{g}.o"));
    let hip = root.join("integration/hip");
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
pub fn plain_twin(root: &Path, dir: &Path) -> Result<PathBuf> {
    let ccobs = copy(root, 0)?;
    remove(dir)?;
    std::fs::create_dir_all(dir)?;
    let mut objects = Vec::new();
    for (g, c) in ccobs.iter().enumerate() {
        let payload = std::fs::read(c.payload.as_ref().context("copy 0 keeps its payloads")?)?;
        let fatbin = dir.join(format!("plain-{g}.bin"));
        std::fs::write(&fatbin, zstd::stream::decode_all(&payload[..])?)?;
        objects.push(host_object(root, dir, 0, g, &fatbin)?);
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

/// The torch-like wheel: copies 0 and 1 as `torch/lib/libtorch_hip_<i>.so`
/// (built once, in the cache; `work` holds its tree meanwhile).
pub fn wheel(root: &Path, work: &Path) -> Result<PathBuf> {
    let cache = ccob_dir(root).join("wheel");
    let wheel = cache.join(super::wheel::file_name(WHEEL_VERSION));
    if wheel.is_file() {
        return Ok(wheel);
    }
    let libs = [library(root, &[0])?, library(root, &[1])?];
    eprintln!("building the torch-like wheel of compressed libraries (once)");
    let tree = work.join("ccob-wheel-tree");
    remove(&tree)?;
    let t = tree.join("torch");
    std::fs::create_dir_all(t.join("lib"))?;
    for (i, l) in libs.iter().enumerate() {
        link_or_copy(&l.path, &t.join(format!("lib/libtorch_hip_{i}.so")))?;
    }
    std::fs::write(t.join("__init__.py"), "# torch-like bench wheel\n")?;
    let wheel = super::wheel::pack_torch(root, &tree, WHEEL_VERSION, &cache)?;
    remove(&tree)?;
    // Only the wheel is needed: copy 1 alone is not measured.
    remove(libs[1].path.parent().context("a library directory")?)?;
    Ok(wheel)
}
