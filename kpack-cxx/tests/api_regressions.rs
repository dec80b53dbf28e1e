//! C API regressions, called through the rlib (no C compiler needed).

use std::ffi::{c_char, c_void, CString};
use std::ptr;

use kpack_format::hipk::HipkMetadata;
use rocm_kpack::*;

use crate::common::cpath;

/// formats.md §3.1, §5.2: a 20-byte file `KPAK`, version 999 is
/// UNSUPPORTED_VERSION (it was INVALID_FORMAT: the length was checked
/// first), from `kpack_open` and `kpack_enumerate_architectures` alike.
#[test]
fn open_reports_unsupported_version_of_a_short_file() {
    let dir = tempfile::tempdir().unwrap();
    for len in [8usize, 20, 64, 200] {
        let p = dir.path().join(format!("v999-{len}.kpack"));
        let mut b = b"KPAK".to_vec();
        b.extend(999u32.to_le_bytes());
        b.resize(len, 0);
        std::fs::write(&p, &b).unwrap();
        let c = cpath(&p);
        let mut a: *mut KpackArchive = ptr::null_mut();
        // SAFETY: a C string and a writable out-pointer.
        let e = unsafe { kpack_open(c.as_ptr(), &mut a) };
        assert_eq!(e, KpackError::UnsupportedVersion, "{len} bytes");
        assert!(a.is_null());
        unsafe extern "C" fn never(_: *const c_char, _: *mut c_void) -> bool {
            panic!("no architecture to enumerate")
        }
        // SAFETY: a C string; the callback is not called.
        let e = unsafe { kpack_enumerate_architectures(c.as_ptr(), Some(never), ptr::null_mut()) };
        assert_eq!(e, KpackError::UnsupportedVersion, "{len} bytes");
    }
    // A short file of the right version is still INVALID_FORMAT.
    let p = dir.path().join("v1-20.kpack");
    let mut b = b"KPAK".to_vec();
    b.extend(1u32.to_le_bytes());
    b.resize(20, 0);
    std::fs::write(&p, &b).unwrap();
    let c = cpath(&p);
    let mut a: *mut KpackArchive = ptr::null_mut();
    // SAFETY: a C string and a writable out-pointer.
    assert_eq!(
        unsafe { kpack_open(c.as_ptr(), &mut a) },
        KpackError::InvalidFormat
    );
}

/// `kpack_load_code_object` reads the metadata as a stream, so metadata
/// that ends right before an unreadable page loads: any read past the map
/// would fault. Both for small metadata and for 60 KB of it.
#[test]
fn metadata_at_the_end_of_a_mapping_is_read_only_to_its_end() {
    let page = 4096usize;
    for paths in [1usize, 2, 4000] {
        let meta = HipkMetadata::new(
            "lib/libx.so",
            (0..paths).map(|i| format!("m{i}.kpack")).collect(),
        )
        .encode();
        let len = meta.len().div_ceil(page) * page;
        // SAFETY: a fresh private anonymous mapping of len + one page; the
        // last page is made unreadable; both are unmapped below.
        let base = unsafe {
            let p = libc::mmap(
                ptr::null_mut(),
                len + page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            assert_eq!(
                libc::mprotect(p.cast::<u8>().add(len).cast(), page, libc::PROT_NONE),
                0
            );
            p.cast::<u8>()
        };
        // SAFETY: the metadata fits in the first `len` (writable) bytes and
        // ends exactly at the unreadable page.
        let at = unsafe {
            let at = base.add(len - meta.len());
            ptr::copy_nonoverlapping(meta.as_ptr(), at, meta.len());
            at
        };
        let mut cache: *mut KpackCache = ptr::null_mut();
        let bin = CString::new("/nonexistent/lib/libx.so").unwrap();
        let arch = CString::new("gfx1100").unwrap();
        let archs = [arch.as_ptr()];
        let (mut out, mut size) = (ptr::null_mut::<c_void>(), 0usize);
        // SAFETY: valid handles, strings and out-pointers; the metadata is
        // readable up to its end.
        let e = unsafe {
            assert_eq!(kpack_cache_create(&mut cache), KpackError::Success);
            let e = kpack_load_code_object(
                cache,
                at.cast(),
                bin.as_ptr(),
                0,
                archs.as_ptr(),
                1,
                &mut out,
                &mut size,
            );
            kpack_cache_destroy(cache);
            libc::munmap(base.cast(), len + page);
            e
        };
        // The metadata decoded: the search found no archive.
        assert_eq!(e, KpackError::ArchiveNotFound, "{paths} paths");
        assert!(out.is_null());
    }
}

/// `kpack_get_kernel_info` answers before anything is allocated: a real
/// 4 GiB code object (128 KiB on disk) is reported at its size, its
/// stored size far below it (what a ratio check refuses); a TOC whose size
/// disagrees with the frame's header is DECOMPRESSION_FAILED, as the read
/// would be, and nothing is written.
#[test]
fn kernel_info_before_allocating() {
    let dir = tempfile::tempdir().unwrap();
    let huge = dir.path().join("huge.kpack");
    crate::common::write_huge_archive(&huge);
    let (key, target) = (
        CString::new("k#0").unwrap(),
        CString::new("gfx1100").unwrap(),
    );
    let info = |path: &std::path::Path| {
        let c = cpath(path);
        let mut a: *mut KpackArchive = ptr::null_mut();
        // SAFETY: a C string and a writable out-pointer.
        assert_eq!(
            unsafe { kpack_open(c.as_ptr(), &mut a) },
            KpackError::Success
        );
        let (mut original, mut stored) = (7usize, 7usize);
        let mut scheme = KpackCompressionScheme::Noop;
        // SAFETY: a live handle, C strings, writable out-pointers.
        let e = unsafe {
            kpack_get_kernel_info(
                a,
                key.as_ptr(),
                target.as_ptr(),
                &mut original,
                &mut stored,
                &mut scheme,
            )
        };
        // SAFETY: a live handle, closed once.
        unsafe { kpack_close(a) };
        (e, original, stored, scheme)
    };
    let (e, original, stored, scheme) = info(&huge);
    assert_eq!(e, KpackError::Success);
    assert_eq!(original as u64, 1u64 << 32);
    assert!(stored < (1 << 20) && stored > 8, "{stored}");
    assert_eq!(scheme, KpackCompressionScheme::ZstdPerKernel);

    let lying = dir.path().join("lying.kpack");
    let b = std::fs::read(&huge).unwrap();
    let b = crate::common::edit_toc(&b, |t| {
        *crate::common::at(t, &["toc", "k#0", "gfx1100", "original_size"]) =
            kpack_format::msgpack::Value::from(100u64)
    });
    std::fs::write(&lying, b).unwrap();
    let (e, original, stored, _) = info(&lying);
    assert_eq!(e, KpackError::DecompressionFailed);
    assert_eq!((original, stored), (7, 7));
}
