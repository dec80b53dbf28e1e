//! In-process micro-benchmarks of the runtime library's C API (the
//! `rocm_kpack` crate of kpack-cxx, called as C would call it), through
//! divan: `kpack_open` + `kpack_close`, `kpack_get_kernel`, and loads
//! through the loader cache (cold: create, load, destroy; warm: a cache
//! that has the archive open). The table of `cargo xtask bench` measures
//! the same calls from a C program linked against the release
//! `librocm_kpack.a`, on Debian's ROCm libraries; these run on a synthetic
//! archive, with nothing installed. `cargo bench -p kpack-bench --bench
//! runtime`.

use std::ffi::{c_void, CString};
use std::path::Path;
use std::ptr;

use divan::{black_box, Bencher};
use kpack_format::hipk::HipkMetadata;
use kpack_host::ArchiveWriter;
use kpack_loader::ErrorCode;
use rocm_kpack as c;

fn main() {
    divan::main();
}

/// Kernel sizes: a median-size code object and a large one.
const SIZES: [usize; 2] = [448 << 10, 4 << 20];
/// Kernels in the archive.
const KERNELS: usize = 8;
/// The agent the loads ask for.
const AGENT: &str = "amdgcn-amd-amdhsa--gfx942";
/// The binary's key in the archive (`libbench.so#N`).
const KERNEL_NAME: &str = "libbench.so";

/// Code-object-like bytes: 4-byte words drawn from 256 "instructions".
fn kernel(size: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(size);
    while out.len() < size {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend(((x % 256) as u32).wrapping_mul(0x9E37_79B9).to_le_bytes());
    }
    out.truncate(size);
    out
}

/// A directory holding an archive of [`KERNELS`] kernels of `size` bytes,
/// the HIPK metadata that names it and a binary next to it.
struct Setup {
    _dir: tempfile::TempDir,
    archive: CString,
    binary: CString,
    metadata: Vec<u8>,
}

impl Setup {
    fn new(size: usize) -> Setup {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let archive = dir.path().join("libbench_gfx942.kpack");
        let mut w = ArchiveWriter::new("bench", "gfx942", vec!["gfx942".into()]);
        for i in 0..KERNELS {
            let key = format!("{KERNEL_NAME}#{i}");
            w.add(key, "gfx942", kernel(size, i as u64), None)
                .expect("a new kernel");
        }
        w.write(&archive).expect("written");
        let binary = dir.path().join(KERNEL_NAME);
        std::fs::write(&binary, b"").expect("the binary");
        let metadata = HipkMetadata::new(KERNEL_NAME, vec![archive.display().to_string()]).encode();
        Setup {
            archive: cstring(&archive),
            binary: cstring(&binary),
            metadata,
            _dir: dir,
        }
    }

    /// Load code object `index` through `cache`; free it.
    ///
    /// # Safety
    /// `cache` is a live cache.
    unsafe fn load(&self, cache: *const c::KpackCache, index: u32) {
        let agent = CString::new(AGENT).expect("no NUL");
        let archs = [agent.as_ptr()];
        let (mut co, mut size) = (ptr::null_mut::<c_void>(), 0usize);
        // SAFETY: live cache, metadata bytes, C strings, writable outputs.
        let e = unsafe {
            c::kpack_load_code_object(
                cache,
                self.metadata.as_ptr().cast(),
                self.binary.as_ptr(),
                index,
                archs.as_ptr(),
                archs.len(),
                &mut co,
                &mut size,
            )
        };
        check("kpack_load_code_object", e);
        // SAFETY: a buffer from kpack_load_code_object, freed once.
        unsafe { c::kpack_free_code_object(black_box(co)) };
    }
}

fn cstring(p: &Path) -> CString {
    CString::new(p.as_os_str().as_encoded_bytes()).expect("no NUL in a temporary path")
}

fn check(what: &str, e: ErrorCode) {
    assert!(e == ErrorCode::Success, "{what}: {e:?}");
}

/// `kpack_open` + `kpack_close`: map the archive, decode its TOC.
#[divan::bench(args = SIZES)]
fn open_close(bencher: Bencher, size: usize) {
    let s = Setup::new(size);
    bencher.bench_local(|| {
        let mut a = ptr::null_mut();
        // SAFETY: a C string and a writable handle; closed once.
        unsafe {
            check("kpack_open", c::kpack_open(s.archive.as_ptr(), &mut a));
            c::kpack_close(a);
        }
    });
}

/// `kpack_get_kernel` of one kernel of an open archive (decompressed into a
/// new buffer), and `kpack_free_kernel`.
#[divan::bench(args = SIZES)]
fn get_kernel(bencher: Bencher, size: usize) {
    let s = Setup::new(size);
    let mut a = ptr::null_mut();
    // SAFETY: a C string and a writable handle.
    check("kpack_open", unsafe {
        c::kpack_open(s.archive.as_ptr(), &mut a)
    });
    let key = CString::new(format!("{KERNEL_NAME}#{}", KERNELS / 2)).expect("no NUL");
    let arch = CString::new("gfx942").expect("no NUL");
    bencher
        .counter(divan::counter::BytesCount::new(size))
        .bench_local(|| {
            let (mut data, mut len) = (ptr::null_mut::<c_void>(), 0usize);
            // SAFETY: a live handle, C strings, writable outputs; the
            // buffer freed once.
            unsafe {
                let e = c::kpack_get_kernel(a, key.as_ptr(), arch.as_ptr(), &mut data, &mut len);
                check("kpack_get_kernel", e);
                c::kpack_free_kernel(black_box(data));
            }
        });
    // SAFETY: the live handle, closed once.
    unsafe { c::kpack_close(a) };
}

/// Cold first load: `kpack_cache_create` + `kpack_load_code_object` +
/// `kpack_cache_destroy` (the archive opened, one kernel decompressed,
/// everything closed).
#[divan::bench(args = SIZES)]
fn cold_load(bencher: Bencher, size: usize) {
    let s = Setup::new(size);
    bencher.bench_local(|| {
        let mut cache = ptr::null_mut();
        // SAFETY: a writable handle; the cache used while live, destroyed
        // once.
        unsafe {
            check("kpack_cache_create", c::kpack_cache_create(&mut cache));
            s.load(cache, (KERNELS / 2) as u32);
            c::kpack_cache_destroy(cache);
        }
    });
}

/// Warm load: `kpack_load_code_object` on a cache that has the archive
/// open.
#[divan::bench(args = SIZES)]
fn warm_load(bencher: Bencher, size: usize) {
    let s = Setup::new(size);
    let mut cache = ptr::null_mut();
    // SAFETY: a writable handle; the cache used while live, destroyed once.
    unsafe {
        check("kpack_cache_create", c::kpack_cache_create(&mut cache));
        s.load(cache, 0);
    }
    bencher
        .counter(divan::counter::BytesCount::new(size))
        // SAFETY: the cache is live until after the benchmark.
        .bench_local(|| unsafe { s.load(cache, (KERNELS / 2) as u32) });
    // SAFETY: the live cache, destroyed once.
    unsafe { c::kpack_cache_destroy(cache) };
}
