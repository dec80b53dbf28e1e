//! Thread safety of the C API: 32 threads mixing `kpack_open`, the queries,
//! `kpack_get_kernel`, `kpack_enumerate_architectures` and
//! `kpack_load_code_object`, on shared and on their own archive handles and
//! caches, over archives offloaded from two fixtures (one with four
//! bundles). Every result is compared with what a single thread read
//! first.
//!
//! It runs alone with `cargo test -p kpack-e2e --test e2e robustness_threads::`.
//! `cargo xtask sanitize` runs it under valgrind (memcheck for the
//! whole mix; helgrind and DRD for the steady state, `KPACK_STRESS_STEADY=1`:
//! Rust's locks are futex-based and invisible to them, so there the shared
//! handles are warmed up on one thread first and the threads only read
//! them) and, with a nightly toolchain, under ThreadSanitizer and
//! AddressSanitizer. `KPACK_STRESS_ITERS` sets the rounds per thread.

use std::collections::BTreeMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::ptr;
use std::sync::Barrier;

use crate::common::*;
use kpack_format::archive::Scheme;
use kpack_format::hipk::MAX_METADATA_SIZE;
use kpack_host::offload::{offload, verify_file, OffloadOptions};
use rocm_kpack::*;

const THREADS: usize = 32;

/// (key, target) -> bytes of an archive.
type Kernels = BTreeMap<(CString, CString), Vec<u8>>;

/// What every thread should find.
struct Setup {
    _dir: tempfile::TempDir,
    /// Archive paths, with (key, target) -> bytes.
    archives: Vec<(CString, Kernels)>,
    /// Offloaded binaries: path, 64 KiB metadata window, code object
    /// indices, and (co, target) -> bytes.
    binaries: Vec<Binary>,
}

struct Binary {
    path: CString,
    metadata: Vec<u8>,
    expected: BTreeMap<(u32, CString), Vec<u8>>,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let mut archives = Vec::new();
    let mut binaries = Vec::new();
    for (name, scheme) in [
        ("libvadd.so", Scheme::ZstdPerKernel),
        ("libmulti.so", Scheme::None),
    ] {
        let f = fixture(name);
        let out = dir.path().join("lib").join(name);
        let mut opts = OffloadOptions::new(dir.path().join(".kpack"));
        opts.scheme = scheme;
        let s = offload(&f.path, &out, &opts).unwrap();
        let v = verify_file(&out).unwrap();
        let mut window = vec![0u8; MAX_METADATA_SIZE];
        let meta = v.metadata.encode();
        window[..meta.len()].copy_from_slice(&meta);
        let mut expected = BTreeMap::new();
        for a in &s.archives {
            let archive = kpack_loader::open_archive(&a.path).unwrap();
            let mut kernels = BTreeMap::new();
            for (key, target) in archive.keys_and_targets() {
                let bytes = archive.kernel(key, target).unwrap();
                let co: u32 = key.rsplit_once('#').unwrap().1.parse().unwrap();
                expected.insert((co, CString::new(target).unwrap()), bytes.clone());
                kernels.insert(
                    (CString::new(key).unwrap(), CString::new(target).unwrap()),
                    bytes,
                );
            }
            archives.push((cpath(&a.path), kernels));
        }
        binaries.push(Binary {
            path: cpath(&out),
            metadata: window,
            expected,
        });
    }
    Setup {
        _dir: dir,
        archives,
        binaries,
    }
}

fn ok(e: KpackError) {
    assert_eq!(e, KpackError::Success);
}

/// Every query of an open handle, checked against `kernels`.
///
/// # Safety
/// `a` is a live handle.
unsafe fn read_all(a: *mut KpackArchive, kernels: &Kernels) {
    unsafe {
        let mut n = 0usize;
        ok(kpack_get_architecture_count(a, &mut n));
        for i in 0..n {
            let mut s: *const c_char = ptr::null();
            ok(kpack_get_architecture(a, i, &mut s));
            assert!(!CStr::from_ptr(s).to_bytes().is_empty());
        }
        ok(kpack_get_binary_count(a, &mut n));
        for i in 0..n {
            let mut s: *const c_char = ptr::null();
            ok(kpack_get_binary(a, i, &mut s));
        }
        for ((key, target), want) in kernels {
            let mut p: *mut c_void = ptr::null_mut();
            let mut size = 0usize;
            ok(kpack_get_kernel(
                a,
                key.as_ptr(),
                target.as_ptr(),
                &mut p,
                &mut size,
            ));
            assert_eq!(std::slice::from_raw_parts(p.cast::<u8>(), size), &want[..]);
            kpack_free_kernel(p);
        }
        let (mut p, mut size) = (ptr::null_mut(), 0usize);
        let e = kpack_get_kernel(
            a,
            c"no/such#0".as_ptr(),
            c"gfx1100".as_ptr(),
            &mut p,
            &mut size,
        );
        assert_eq!(e, KpackError::KernelNotFound);
    }
}

/// Load every (co, target) of `b` through `cache` and check the bytes.
///
/// # Safety
/// `cache` is a live cache.
unsafe fn load_all(cache: *mut KpackCache, b: &Binary, salt: usize) {
    let n = b.expected.len();
    for k in 0..n {
        let ((co, target), want) = b.expected.iter().nth((k + salt) % n).unwrap();
        // The agent's full ISA name, then a target no archive has.
        let isa = CString::new(format!("amdgcn-amd-amdhsa--{}", target.to_str().unwrap())).unwrap();
        let archs = [isa.as_ptr(), c"gfx9999".as_ptr()];
        let (mut p, mut size) = (ptr::null_mut(), 0usize);
        // SAFETY: live cache, 64 KiB metadata window, valid strings and
        // out-pointers.
        unsafe {
            ok(kpack_load_code_object(
                cache,
                b.metadata.as_ptr().cast(),
                b.path.as_ptr(),
                *co,
                archs.as_ptr(),
                archs.len(),
                &mut p,
                &mut size,
            ));
            assert_eq!(std::slice::from_raw_parts(p.cast::<u8>(), size), &want[..]);
            kpack_free_code_object(p);
        }
    }
    // A target no archive serves.
    let archs = [c"gfx9999".as_ptr()];
    let (mut p, mut size) = (ptr::null_mut(), 0usize);
    // SAFETY: as above.
    let e = unsafe {
        kpack_load_code_object(
            cache,
            b.metadata.as_ptr().cast(),
            b.path.as_ptr(),
            0,
            archs.as_ptr(),
            1,
            &mut p,
            &mut size,
        )
    };
    assert_eq!(e, KpackError::ArchiveNotFound);
    assert!(p.is_null());
}

unsafe extern "C" fn count_arch(arch: *const c_char, user: *mut c_void) -> bool {
    // SAFETY: user data is the &mut usize passed by the caller.
    unsafe {
        assert!(!CStr::from_ptr(arch).to_bytes().is_empty());
        *user.cast::<usize>() += 1;
    }
    true
}

fn iterations() -> usize {
    std::env::var("KPACK_STRESS_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40)
}

fn steady() -> bool {
    std::env::var_os("KPACK_STRESS_STEADY").is_some_and(|v| v != "0")
}

/// Raw pointers shared between threads (the C API allows it).
#[derive(Clone, Copy)]
struct Shared(*mut KpackArchive, *mut KpackCache);
// SAFETY: the handles are thread-safe by contract (concurrent calls allowed);
// they are destroyed only after every thread has joined.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

#[test]
fn capi_stress_32_threads() {
    let s = setup();
    let iters = iterations();
    let steady = steady();
    let (shared_path, shared_kernels) = &s.archives[0];
    let mut shared_archive: *mut KpackArchive = ptr::null_mut();
    let mut shared_cache: *mut KpackCache = ptr::null_mut();
    // SAFETY: valid out-pointers and strings.
    unsafe {
        ok(kpack_open(shared_path.as_ptr(), &mut shared_archive));
        ok(kpack_cache_create(&mut shared_cache));
        if steady {
            // Everything the threads will share, touched once here.
            read_all(shared_archive, shared_kernels);
            for b in &s.binaries {
                load_all(shared_cache, b, 0);
            }
        }
    }
    let shared = Shared(shared_archive, shared_cache);
    let barrier = Barrier::new(THREADS);
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (s, barrier) = (&s, &barrier);
            scope.spawn(move || {
                let shared = shared;
                barrier.wait();
                for i in 0..iters {
                    let op = (t + i) % 5;
                    let (path, kernels) = &s.archives[(t + i) % s.archives.len()];
                    let b = &s.binaries[(t + i) % s.binaries.len()];
                    // SAFETY: live handles (shared ones outlive the scope),
                    // valid strings and out-pointers.
                    unsafe {
                        match op {
                            // Own handle: open, read everything, close.
                            0 => {
                                let mut a = ptr::null_mut();
                                ok(kpack_open(path.as_ptr(), &mut a));
                                read_all(a, kernels);
                                kpack_close(a);
                            }
                            // The shared handle.
                            1 => read_all(shared.0, shared_kernels),
                            // The shared cache.
                            2 => load_all(shared.1, b, t),
                            // An own cache.
                            3 => {
                                let mut c = ptr::null_mut();
                                ok(kpack_cache_create(&mut c));
                                load_all(c, b, t);
                                kpack_cache_destroy(c);
                            }
                            // Enumeration, and errors.
                            _ => {
                                let mut n = 0usize;
                                ok(kpack_enumerate_architectures(
                                    path.as_ptr(),
                                    Some(count_arch),
                                    (&mut n as *mut usize).cast(),
                                ));
                                assert!(n > 0);
                                let mut a = ptr::null_mut();
                                let e = kpack_open(c"/nonexistent/x.kpack".as_ptr(), &mut a);
                                assert_eq!(e, KpackError::FileNotFound);
                                assert!(a.is_null());
                            }
                        }
                    }
                }
            });
        }
    });
    // SAFETY: every thread has joined; the handles are closed once.
    unsafe {
        kpack_close(shared_archive);
        kpack_cache_destroy(shared_cache);
    }
}
