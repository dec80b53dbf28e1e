//! The C API (`librocm_kpack`) on arbitrary archive bytes, as a HIP process
//! would drive it: the bytes are written to a file, opened with
//! `kpack_open`, queried, every (binary, architecture) pair is fetched with
//! `kpack_get_kernel` (after `kpack_get_kernel_info`, whose size must be
//! the one handed out), the architectures are enumerated, and each binary is
//! loaded through a fresh cache (`kpack_load_code_object`) with HIPK
//! metadata naming that file.
//!
//! Invariants: no panic (libFuzzer's panic hook aborts even inside the
//! API's `catch_unwind`), no memory error (with ASan), every call returns a
//! defined `kpack_error_t`, outputs are written only on success, and a load
//! that succeeds for exactly one architecture returns the same bytes as
//! `kpack_get_kernel`.
#![no_main]

use std::ffi::{c_char, c_void, CStr, CString};
use std::path::PathBuf;
use std::ptr;
use std::sync::OnceLock;

use kpack_format::hipk::{HipkMetadata, MAX_METADATA_SIZE};
use libfuzzer_sys::fuzz_target;
use rocm_kpack::*;

fn scratch() -> &'static (tempfile::TempDir, PathBuf, CString) {
    static DIR: OnceLock<(tempfile::TempDir, PathBuf, CString)> = OnceLock::new();
    DIR.get_or_init(|| {
        for v in [
            "ROCM_KPACK_PATH",
            "ROCM_KPACK_PATH_PREFIX",
            "ROCM_KPACK_DISABLE",
            "ROCM_KPACK_DEBUG",
        ] {
            std::env::remove_var(v);
        }
        // tmpfs when there is one: rewriting a file per input on a disk
        // file system (truncate, discard) would dominate the run time.
        let shm = std::path::Path::new("/dev/shm");
        let dir = if shm.is_dir() {
            tempfile::tempdir_in(shm)
        } else {
            tempfile::tempdir()
        }
        .expect("temp dir");
        let path = dir.path().join("fuzz.kpack");
        let c = CString::new(path.to_str().expect("utf-8 temp path")).unwrap();
        (dir, path, c)
    })
}

unsafe extern "C" fn count_archs(arch: *const c_char, user: *mut c_void) -> bool {
    assert!(!arch.is_null());
    let n = unsafe { &mut *user.cast::<usize>() };
    let _ = unsafe { CStr::from_ptr(arch) }.to_bytes().len();
    *n += 1;
    *n < 1000
}

fn ok(e: KpackError) -> bool {
    // Reading the discriminant checks it is one of the 15 values.
    (e as i32) == 0
}

fuzz_target!(|data: &[u8]| {
    let (_dir, path, cpath) = scratch();
    std::fs::write(path, data).expect("write temp archive");
    unsafe {
        let mut a: *mut KpackArchive = ptr::null_mut();
        let e = kpack_open(cpath.as_ptr(), &mut a);
        let mut enumerated = 0usize;
        let ee = kpack_enumerate_architectures(
            cpath.as_ptr(),
            Some(count_archs),
            (&mut enumerated as *mut usize).cast(),
        );
        assert_eq!(
            ok(e),
            ok(ee),
            "kpack_open and kpack_enumerate_architectures disagree"
        );
        if !ok(e) {
            assert!(a.is_null(), "output written on failure");
            return;
        }
        assert!(!a.is_null());
        let mut n_arch = usize::MAX;
        assert!(ok(kpack_get_architecture_count(a, &mut n_arch)));
        assert_eq!(enumerated, n_arch.min(1000));
        let mut archs = Vec::new();
        for i in 0..n_arch {
            let mut s: *const c_char = ptr::null();
            assert!(ok(kpack_get_architecture(a, i, &mut s)));
            archs.push(CStr::from_ptr(s).to_owned());
        }
        let mut s: *const c_char = ptr::null();
        assert_eq!(
            kpack_get_architecture(a, n_arch, &mut s),
            KpackError::InvalidArgument
        );
        assert!(s.is_null());
        let mut n_bin = usize::MAX;
        assert!(ok(kpack_get_binary_count(a, &mut n_bin)));
        let mut bins = Vec::new();
        for i in 0..n_bin {
            let mut s: *const c_char = ptr::null();
            assert!(ok(kpack_get_binary(a, i, &mut s)));
            bins.push(CStr::from_ptr(s).to_owned());
        }
        assert_eq!(
            kpack_get_binary(a, n_bin, &mut s),
            KpackError::InvalidArgument
        );

        // Every (binary, architecture), plus each binary under the first
        // architecture spelled differently (never found).
        let mut fetched = Vec::new();
        for b in &bins {
            for t in &archs {
                let mut p: *mut c_void = ptr::null_mut();
                let mut size = usize::MAX;
                let (mut original, mut stored) = (usize::MAX, usize::MAX);
                let mut scheme = KpackCompressionScheme::Noop;
                let info = kpack_get_kernel_info(
                    a,
                    b.as_ptr(),
                    t.as_ptr(),
                    &mut original,
                    &mut stored,
                    &mut scheme,
                );
                if !ok(info) {
                    assert!(
                        original == usize::MAX && stored == usize::MAX,
                        "output written on failure"
                    );
                }
                let e = kpack_get_kernel(a, b.as_ptr(), t.as_ptr(), &mut p, &mut size);
                if ok(e) {
                    assert!(!p.is_null());
                    // What kpack_get_kernel_info said, from the TOC alone.
                    assert!(ok(info), "get_kernel succeeds where get_kernel_info failed");
                    assert_eq!(original, size, "get_kernel_info's size differs");
                    let bytes = std::slice::from_raw_parts(p.cast::<u8>(), size).to_vec();
                    kpack_free_kernel(p);
                    fetched.push((b.clone(), t.clone(), bytes));
                } else {
                    assert!(
                        p.is_null() && size == usize::MAX,
                        "output written on failure"
                    );
                }
            }
        }
        kpack_close(a);

        // Load each binary through a cache, with metadata naming the file.
        for b in bins.iter().take(8) {
            let key = b.to_str().unwrap_or_default();
            let Some((name, co)) = key.rsplit_once('#') else {
                continue;
            };
            let Ok(co) = co.parse::<u32>() else { continue };
            let meta = HipkMetadata::new(name.to_owned(), vec![path.to_str().unwrap().to_owned()])
                .encode();
            if meta.len() > MAX_METADATA_SIZE {
                continue;
            }
            // The runtime reads metadata through a pointer: give it a
            // 64 KiB window, as a mapped binary would.
            let mut window = vec![0u8; MAX_METADATA_SIZE];
            window[..meta.len()].copy_from_slice(&meta);
            let arch_ptrs: Vec<*const c_char> = archs.iter().map(|s| s.as_ptr()).collect();
            if arch_ptrs.is_empty() {
                continue;
            }
            let mut cache: *mut KpackCache = ptr::null_mut();
            assert!(ok(kpack_cache_create(&mut cache)));
            let bin_path =
                CString::new(format!("{}/bin", path.parent().unwrap().display())).unwrap();
            let mut p: *mut c_void = ptr::null_mut();
            let mut size = usize::MAX;
            let e = kpack_load_code_object(
                cache,
                window.as_ptr().cast(),
                bin_path.as_ptr(),
                co,
                arch_ptrs.as_ptr(),
                arch_ptrs.len(),
                &mut p,
                &mut size,
            );
            if ok(e) {
                let bytes = std::slice::from_raw_parts(p.cast::<u8>(), size).to_vec();
                kpack_free_code_object(p);
                // With one architecture listed, the load finds exactly what
                // kpack_get_kernel found for it (when the architecture string
                // is a canonical target ID spelled as in the archive).
                if archs.len() == 1 {
                    if let Some((_, _, want)) = fetched.iter().find(|(k, _, _)| k == b) {
                        assert_eq!(&bytes, want, "load and get_kernel differ");
                    }
                }
            } else {
                assert!(
                    p.is_null() && size == usize::MAX,
                    "output written on failure"
                );
            }
            kpack_cache_destroy(cache);
        }
    }
});
