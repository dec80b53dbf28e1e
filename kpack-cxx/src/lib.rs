//! kpack runtime library: the C API of `include/rocm_kpack/kpack.h`, a
//! drop-in for ROCm's reference runtime (formats.md §5), built as
//! `librocm_kpack.a` and `librocm_kpack.so`. The C++ API
//! (`include/rocm_kpack/kpack.hpp`) goes through a cxx bridge over the
//! same handles ([`bridge`]), whose C++ half is built by `build.rs` into
//! its own archive, `librocm_kpack_cxx.a`, so that C programs link no C++.
//!
//! This layer is thin and mechanical: check pointers, convert strings, call
//! [`kpack_format::archive::Archive`] or [`kpack_loader::Loader`], map
//! the error to a [`KpackError`] code, write outputs only on success. Every
//! entry point runs inside `catch_unwind`, so no panic crosses the C
//! boundary; a caught panic (a bug) is reported as
//! `KPACK_ERROR_INVALID_FORMAT`. Code objects are handed out as
//! [`buffers`] says: a private mapping of the archive for those stored
//! uncompressed, a `calloc`ed buffer (recycled through the cache's pool)
//! for the others.
//!
//! [`prelink`] turns the static library into the prelinked archive that is
//! installed (only `kpack_*` symbols global).

#![deny(unsafe_op_in_unsafe_fn)]

mod bridge;
mod buffers;
pub mod prelink;
mod sync;
#[cfg(windows)]
mod windows;

use std::ffi::{c_char, c_void, CStr, CString};
use std::io::Read;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Arc;

use kpack_format::hipk::HipkMetadata;
use kpack_loader::{ArchiveFile, Loaded, Loader};

use buffers::{CBuffer, Out, Pool};

/// `kpack_error_t`: kpack-loader's `ErrorCode`, value for value (`repr(C)`).
pub use kpack_loader::ErrorCode as KpackError;

use KpackError as E;

/// What a caught panic is reported as.
const PANIC_ERROR: KpackError = E::InvalidFormat;

/// What a `kpack_archive_t` points to: the archive, its path and the C
/// strings the query functions hand out (stable until `kpack_close`). The
/// C++ API's `kpack::Archive` holds the same object.
pub struct KpackArchive {
    archive: ArchiveFile,
    path: PathBuf,
    arches: Vec<CString>,
    binaries: Vec<CString>,
}

impl KpackArchive {
    fn open(path: &CStr) -> Result<KpackArchive, KpackError> {
        KpackArchive::open_path(cstr_path(path)).map_err(|(code, _)| code)
    }

    /// The archive at `path`, or the error code and kpack's message.
    fn open_path(path: PathBuf) -> Result<KpackArchive, (KpackError, String)> {
        let archive = ArchiveFile::open(&path)
            .map_err(|e| (KpackError::of_open(&e), kpack_loader::report(&e)))?;
        // TOC strings are MessagePack str: a NUL inside one cannot be
        // handed to C.
        let c = |s: &str| {
            CString::new(s).map_err(|_| {
                let what = format!("{}: TOC string {s:?} holds a NUL byte", path.display());
                (E::InvalidFormat, what)
            })
        };
        let arches = archive
            .gfx_arches()
            .iter()
            .map(|s| c(s))
            .collect::<Result<_, _>>()?;
        let binaries = archive.binaries().map(c).collect::<Result<_, _>>()?;
        Ok(KpackArchive {
            archive,
            path,
            arches,
            binaries,
        })
    }
}

/// What a `kpack_cache_t` points to: the loader, and the pool its loads'
/// buffers go back to when freed.
pub struct KpackCache {
    loader: Loader,
    pool: Arc<Pool>,
}

impl KpackCache {
    fn from_env() -> KpackCache {
        KpackCache {
            loader: Loader::from_env(),
            pool: Pool::new(),
        }
    }

    /// Run a load: the code object as it is handed out.
    fn load(
        &self,
        metadata: impl FnOnce() -> Result<HipkMetadata, kpack_format::hipk::HipkError>,
        path: &std::path::Path,
        co_index: u32,
        archs: &[&str],
    ) -> Result<Out, kpack_loader::LoadError> {
        let loaded = self
            .loader
            .load_view(metadata, path, co_index, archs, |n| self.pool.buffer(n))?;
        Ok(match loaded {
            Loaded::Mapped(m) => Out::Mapped(m),
            Loaded::Buffer(b) => Out::Heap(b, Some(self.pool.clone())),
        })
    }
}

impl KpackArchive {
    /// The code object of `entry`: mapped when stored uncompressed, else
    /// decompressed into a new `calloc`ed buffer; `Err(None)` when that
    /// buffer cannot be had.
    fn code_object(
        &self,
        entry: &kpack_format::archive::Entry,
    ) -> Result<Out, Option<kpack_format::archive::ArchiveError>> {
        if let Some(m) = self.archive.map_code_object(entry)? {
            return Ok(Out::Mapped(m));
        }
        // Validate before allocating original_size bytes.
        self.archive.check(entry)?;
        let len = usize::try_from(entry.original_size).map_err(|_| None)?;
        let mut buf = CBuffer::zeroed(len).ok_or(None)?;
        self.archive.read_into(entry, buf.as_mut())?;
        Ok(Out::Heap(buf, None))
    }
}

/// The HIPK metadata behind a pointer with no length, as a stream: the
/// decoder ([`HipkMetadata::read`]) asks for exactly the bytes the map has,
/// at most 64 KiB, in one pass, so no byte past the caller's metadata is
/// read.
struct MetadataReader {
    ptr: *const u8,
    pos: usize,
}

impl Read for MetadataReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        // SAFETY: the decoder reads only bytes that the map it is decoding
        // still needs (and at most 64 KiB), which lie inside the caller's
        // readable metadata (kpack_load_code_object's contract).
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.add(self.pos), buf.as_mut_ptr(), buf.len());
        }
        self.pos += buf.len();
        Ok(buf.len())
    }
}

/// Run an entry point: its result, or [`PANIC_ERROR`] if it panicked.
fn guard(f: impl FnOnce() -> Result<(), KpackError>) -> KpackError {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => E::Success,
        Ok(Err(e)) => e,
        Err(_) => PANIC_ERROR,
    }
}

/// Run a `void` entry point, swallowing a panic.
fn guard_void(f: impl FnOnce()) {
    let _ = catch_unwind(AssertUnwindSafe(f));
}

/// Fail with `INVALID_ARGUMENT` if any pointer is NULL.
fn require(ptrs: &[bool]) -> Result<(), KpackError> {
    if ptrs.iter().any(|&null| null) {
        Err(E::InvalidArgument)
    } else {
        Ok(())
    }
}

/// # Safety
/// `p` is non-NULL and points to a NUL-terminated string that outlives `'a`.
unsafe fn cstr<'a>(p: *const c_char) -> &'a CStr {
    // SAFETY: guaranteed by the caller.
    unsafe { CStr::from_ptr(p) }
}

fn cstr_path(s: &CStr) -> PathBuf {
    cstr_path_bytes(s.to_bytes())
}

/// A path from its bytes (C and C++ strings).
#[cfg(unix)]
fn cstr_path_bytes(s: &[u8]) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    PathBuf::from(std::ffi::OsStr::from_bytes(s))
}

#[cfg(not(unix))]
fn cstr_path_bytes(s: &[u8]) -> PathBuf {
    PathBuf::from(String::from_utf8_lossy(s).into_owned())
}

/// Open a `.kpack` archive.
///
/// # Safety
/// `path` is NULL or a NUL-terminated string; `archive` is NULL or valid
/// for a write.
#[no_mangle]
pub unsafe extern "C" fn kpack_open(
    path: *const c_char,
    archive: *mut *mut KpackArchive,
) -> KpackError {
    guard(|| {
        require(&[path.is_null(), archive.is_null()])?;
        // SAFETY: checked non-NULL; the caller passes a C string.
        let handle = KpackArchive::open(unsafe { cstr(path) })?;
        // SAFETY: checked non-NULL; the caller passes a writable pointer.
        unsafe { archive.write(Box::into_raw(Box::new(handle))) };
        Ok(())
    })
}

/// Close an archive (NULL: no-op).
///
/// # Safety
/// `archive` is NULL or a handle from `kpack_open` not closed yet, and no
/// other thread uses it.
#[no_mangle]
pub unsafe extern "C" fn kpack_close(archive: *mut KpackArchive) {
    guard_void(|| {
        if !archive.is_null() {
            // SAFETY: a live handle from Box::into_raw in kpack_open, closed
            // once (caller's contract).
            drop(unsafe { Box::from_raw(archive) });
        }
    })
}

/// Shared body of the count queries.
///
/// # Safety
/// `archive` is NULL or a live handle; `count` is NULL or valid for a write.
unsafe fn count_of(
    archive: *const KpackArchive,
    count: *mut usize,
    which: fn(&KpackArchive) -> usize,
) -> KpackError {
    guard(|| {
        require(&[archive.is_null(), count.is_null()])?;
        // SAFETY: checked non-NULL; a live handle (caller's contract).
        let a = unsafe { &*archive };
        // SAFETY: checked non-NULL; writable (caller's contract).
        unsafe { count.write(which(a)) };
        Ok(())
    })
}

/// Shared body of the indexed string queries.
///
/// # Safety
/// `archive` is NULL or a live handle; `out` is NULL or valid for a write.
unsafe fn string_at(
    archive: *const KpackArchive,
    index: usize,
    out: *mut *const c_char,
    which: fn(&KpackArchive) -> &[CString],
) -> KpackError {
    guard(|| {
        require(&[archive.is_null(), out.is_null()])?;
        // SAFETY: checked non-NULL; a live handle (caller's contract).
        let a = unsafe { &*archive };
        let s = which(a).get(index).ok_or(E::InvalidArgument)?;
        // SAFETY: checked non-NULL; writable. The string lives in the
        // handle until kpack_close.
        unsafe { out.write(s.as_ptr()) };
        Ok(())
    })
}

/// Number of architectures of an archive.
///
/// # Safety
/// `archive` is NULL or a live handle; `count` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn kpack_get_architecture_count(
    archive: *const KpackArchive,
    count: *mut usize,
) -> KpackError {
    // SAFETY: same contract as this function's.
    unsafe { count_of(archive, count, |a| a.arches.len()) }
}

/// Architecture `index` of an archive (`gfx_arches` order).
///
/// # Safety
/// `archive` is NULL or a live handle; `arch` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn kpack_get_architecture(
    archive: *const KpackArchive,
    index: usize,
    arch: *mut *const c_char,
) -> KpackError {
    // SAFETY: same contract as this function's.
    unsafe { string_at(archive, index, arch, |a| &a.arches) }
}

/// Number of binary keys of an archive.
///
/// # Safety
/// `archive` is NULL or a live handle; `count` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn kpack_get_binary_count(
    archive: *const KpackArchive,
    count: *mut usize,
) -> KpackError {
    // SAFETY: same contract as this function's.
    unsafe { count_of(archive, count, |a| a.binaries.len()) }
}

/// Binary key `index` of an archive (sorted bytewise).
///
/// # Safety
/// `archive` is NULL or a live handle; `binary` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn kpack_get_binary(
    archive: *const KpackArchive,
    index: usize,
    binary: *mut *const c_char,
) -> KpackError {
    // SAFETY: same contract as this function's.
    unsafe { string_at(archive, index, binary, |a| &a.binaries) }
}

/// The archive behind a handle and its entry `binary_name` @ `arch`: the
/// lookup `kpack_get_kernel` and `kpack_get_kernel_info` share.
/// `KERNEL_NOT_FOUND` when there is none (also for a key or target that is
/// not UTF-8: TOC strings are).
///
/// # Safety
/// The three pointers are non-NULL; `archive` is a live handle, the others
/// C strings, all outliving `'a`.
unsafe fn lookup<'a>(
    archive: *const KpackArchive,
    binary_name: *const c_char,
    arch: *const c_char,
) -> Result<(&'a KpackArchive, &'a kpack_format::archive::Entry), KpackError> {
    // SAFETY: guaranteed by the caller.
    let (a, key, target) = unsafe { (&*archive, cstr(binary_name), cstr(arch)) };
    let (Ok(key), Ok(target)) = (key.to_str(), target.to_str()) else {
        return Err(E::KernelNotFound);
    };
    let entry = a.archive.entry(key, target).ok_or(E::KernelNotFound)?;
    Ok((a, entry))
}

/// `kpack_compression_scheme_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KpackCompressionScheme {
    Noop = 0,
    ZstdPerKernel = 1,
}

impl From<kpack_format::archive::Scheme> for KpackCompressionScheme {
    fn from(s: kpack_format::archive::Scheme) -> Self {
        match s {
            kpack_format::archive::Scheme::None => KpackCompressionScheme::Noop,
            kpack_format::archive::Scheme::ZstdPerKernel => KpackCompressionScheme::ZstdPerKernel,
        }
    }
}

/// The sizes and compression scheme of one code object, without
/// decompressing it. Any of the three outputs may be NULL.
///
/// # Safety
/// `archive` is NULL or a live handle; `binary_name` and `arch` are NULL or
/// C strings; `original_size`, `stored_size` and `scheme` are NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn kpack_get_kernel_info(
    archive: *const KpackArchive,
    binary_name: *const c_char,
    arch: *const c_char,
    original_size: *mut usize,
    stored_size: *mut usize,
    scheme: *mut KpackCompressionScheme,
) -> KpackError {
    guard(|| {
        require(&[archive.is_null(), binary_name.is_null(), arch.is_null()])?;
        // SAFETY: checked non-NULL; a live handle and C strings (caller's
        // contract).
        let (a, entry) = unsafe { lookup(archive, binary_name, arch) }?;
        let info = a
            .archive
            .kernel_info(entry)
            .map_err(|e| KpackError::of_read(&e))?;
        // A size that does not fit a size_t cannot be had in memory.
        let size = |n: u64| usize::try_from(n).map_err(|_| E::OutOfMemory);
        let (original, stored) = (size(info.original_size)?, size(info.stored_size)?);
        // SAFETY: each is NULL or writable (caller's contract).
        unsafe {
            if !original_size.is_null() {
                original_size.write(original);
            }
            if !stored_size.is_null() {
                stored_size.write(stored);
            }
            if !scheme.is_null() {
                scheme.write(info.scheme.into());
            }
        }
        Ok(())
    })
}

/// One code object: mapped from the archive when stored uncompressed, else
/// decompressed into a new `malloc`ed buffer.
///
/// # Safety
/// `archive` is NULL or a live handle; `binary_name` and `arch` are NULL or
/// C strings; `kernel_data` and `kernel_size` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn kpack_get_kernel(
    archive: *const KpackArchive,
    binary_name: *const c_char,
    arch: *const c_char,
    kernel_data: *mut *mut c_void,
    kernel_size: *mut usize,
) -> KpackError {
    guard(|| {
        require(&[
            archive.is_null(),
            binary_name.is_null(),
            arch.is_null(),
            kernel_data.is_null(),
            kernel_size.is_null(),
        ])?;
        // SAFETY: a live handle and C strings (caller's contract).
        let (a, entry) = unsafe { lookup(archive, binary_name, arch) }?;
        let out = a
            .code_object(entry)
            .map_err(|e| e.map_or(E::OutOfMemory, |e| KpackError::of_read(&e)))?;
        let (ptr, len) = out.hand_out();
        // SAFETY: checked non-NULL; writable (caller's contract).
        unsafe {
            kernel_data.write(ptr);
            kernel_size.write(len);
        }
        Ok(())
    })
}

/// Release a code object from `kpack_get_kernel` (NULL: no-op).
///
/// # Safety
/// `kernel_data` is NULL or a code object from this library not released
/// yet.
#[no_mangle]
pub unsafe extern "C" fn kpack_free_kernel(kernel_data: *mut c_void) {
    // SAFETY: the caller's contract, as buffers::release requires.
    guard_void(|| unsafe { buffers::release(kernel_data) })
}

/// Create a loader cache; reads the environment now.
///
/// # Safety
/// `cache` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn kpack_cache_create(cache: *mut *mut KpackCache) -> KpackError {
    guard(|| {
        require(&[cache.is_null()])?;
        let handle = Box::new(KpackCache::from_env());
        // SAFETY: checked non-NULL; writable (caller's contract).
        unsafe { cache.write(Box::into_raw(handle)) };
        Ok(())
    })
}

/// Destroy a cache and close its archives (NULL: no-op).
///
/// # Safety
/// `cache` is NULL or a live handle from `kpack_cache_create`, and no other
/// thread uses it.
#[no_mangle]
pub unsafe extern "C" fn kpack_cache_destroy(cache: *mut KpackCache) {
    guard_void(|| {
        if !cache.is_null() {
            // SAFETY: a live handle from Box::into_raw, destroyed once.
            drop(unsafe { Box::from_raw(cache) });
        }
    })
}

/// Find the file mapped at an address.
///
/// # Safety
/// `path_out` is NULL or valid for `path_out_size` bytes of writes;
/// `offset_out` is NULL or writable. `address_in_binary` is only compared,
/// never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn kpack_discover_binary_path(
    address_in_binary: *const c_void,
    path_out: *mut c_char,
    path_out_size: usize,
    offset_out: *mut usize,
) -> KpackError {
    guard(|| {
        require(&[
            address_in_binary.is_null(),
            path_out.is_null(),
            path_out_size == 0,
        ])?;
        #[cfg(windows)]
        let found = windows::discover_binary_path(address_in_binary as usize);
        #[cfg(not(windows))]
        let found = kpack_loader::discover_binary_path(address_in_binary as usize);
        let found = found.map_err(|e| E::of_discover(&e))?;
        let bytes = path_bytes(&found.path).ok_or(E::PathDiscoveryFailed)?;
        if bytes.len() >= path_out_size {
            return Err(E::InvalidArgument);
        }
        let offset = usize::try_from(found.offset).map_err(|_| E::PathDiscoveryFailed)?;
        // SAFETY: path_out is valid for path_out_size > bytes.len() bytes
        // (caller's contract, checked above); offset_out is NULL or
        // writable.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), path_out.cast::<u8>(), bytes.len());
            path_out.add(bytes.len()).write(0);
            if !offset_out.is_null() {
                offset_out.write(offset);
            }
        }
        Ok(())
    })
}

#[cfg(unix)]
fn path_bytes(p: &std::path::Path) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    Some(p.as_os_str().as_bytes().to_vec())
}

/// Elsewhere (Windows) the path is handed out as UTF-8; one that is not
/// valid UTF-16 cannot be, and discovery fails.
#[cfg(not(unix))]
fn path_bytes(p: &std::path::Path) -> Option<Vec<u8>> {
    p.to_str().map(|s| s.as_bytes().to_vec())
}

/// [`path_bytes`], or (a path that cannot be UTF-8) its lossy text: for
/// the C++ API, which reports paths rather than opening them.
fn path_bytes_lossy(p: &std::path::Path) -> Vec<u8> {
    path_bytes(p).unwrap_or_else(|| p.to_string_lossy().into_owned().into_bytes())
}

/// Load a code object through the cache.
///
/// # Safety
/// `cache` is NULL or a live handle; `hipk_metadata` is NULL or points to
/// readable MessagePack metadata (read only as far as the map extends, at
/// most 64 KiB); `binary_path` is NULL or a C string; `arch_list` is NULL
/// or points to `arch_count` pointers that are NULL or C strings;
/// `code_object_out` and `code_object_size_out` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn kpack_load_code_object(
    cache: *const KpackCache,
    hipk_metadata: *const c_void,
    binary_path: *const c_char,
    co_index: u32,
    arch_list: *const *const c_char,
    arch_count: usize,
    code_object_out: *mut *mut c_void,
    code_object_size_out: *mut usize,
) -> KpackError {
    guard(|| {
        require(&[
            cache.is_null(),
            hipk_metadata.is_null(),
            binary_path.is_null(),
            arch_list.is_null(),
            code_object_out.is_null(),
            code_object_size_out.is_null(),
            arch_count == 0,
            arch_count > isize::MAX as usize / std::mem::size_of::<*const c_char>(),
        ])?;
        // SAFETY: checked non-NULL; arch_list holds arch_count pointers
        // (caller's contract; the count fits an allocation).
        let ptrs = unsafe { std::slice::from_raw_parts(arch_list, arch_count) };
        let archs = ptrs
            .iter()
            .map(|&p| {
                require(&[p.is_null()])?;
                // SAFETY: checked non-NULL; a C string (caller's contract).
                unsafe { cstr(p) }.to_str().map_err(|_| E::InvalidArgument)
            })
            .collect::<Result<Vec<&str>, _>>()?;
        // SAFETY: checked non-NULL; live handle and C string.
        let (cache, path) = unsafe { (&*cache, cstr_path(cstr(binary_path))) };
        let metadata = MetadataReader {
            ptr: hipk_metadata.cast(),
            pos: 0,
        };
        let decode = || HipkMetadata::read(metadata);
        let out = cache
            .load(decode, &path, co_index, &archs)
            .map_err(|e| e.code())?;
        let (ptr, len) = out.hand_out();
        // SAFETY: checked non-NULL; writable (caller's contract).
        unsafe {
            code_object_out.write(ptr);
            code_object_size_out.write(len);
        }
        Ok(())
    })
}

/// Release a code object from `kpack_load_code_object` (NULL: no-op): a
/// mapping is unmapped, a buffer goes back to its cache's pool (or is
/// freed).
///
/// # Safety
/// `code_object` is NULL or a code object from this library not released
/// yet.
#[no_mangle]
pub unsafe extern "C" fn kpack_free_code_object(code_object: *mut c_void) {
    // SAFETY: the caller's contract, as buffers::release requires.
    guard_void(|| unsafe { buffers::release(code_object) })
}

/// `kpack_arch_callback_t`.
pub type ArchCallback = unsafe extern "C" fn(arch: *const c_char, user_data: *mut c_void) -> bool;

/// Call `callback` for each architecture of the archive at `archive_path`.
///
/// # Safety
/// `archive_path` is NULL or a C string; `callback` is NULL or a function
/// that does not unwind; `user_data` is passed through untouched.
#[no_mangle]
pub unsafe extern "C" fn kpack_enumerate_architectures(
    archive_path: *const c_char,
    callback: Option<ArchCallback>,
    user_data: *mut c_void,
) -> KpackError {
    guard(|| {
        require(&[archive_path.is_null()])?;
        let callback = callback.ok_or(E::InvalidArgument)?;
        // SAFETY: checked non-NULL; a C string (caller's contract).
        let archive = KpackArchive::open(unsafe { cstr(archive_path) })?;
        for arch in &archive.arches {
            // SAFETY: the callback gets a C string valid for the call and
            // the caller's user_data, as documented.
            if !unsafe { callback(arch.as_ptr(), user_data) } {
                break;
            }
        }
        Ok(())
    })
}

// zstd's tracing hooks. zstd calls `ZSTD_trace_decompress_begin/end` when
// some loaded library defines them (weak undefined references). Defined here
// as hidden no-ops, so that neither librocm_kpack.so nor a library linking
// librocm_kpack.a imports or exports a `ZSTD_*` symbol (another library in
// the process could otherwise hook into this copy of zstd). Hidden
// visibility needs assembly: a `#[no_mangle]` function would be exported.
// `ZSTD_trace_decompress_begin` returns 0 ("do not trace"), so `_end` is
// never called.
//
// The same assembly also gives the Rust functions the C++ glue calls
// (`cxxbridge1$...`, listed by build.rs) hidden visibility: the prelinked
// archive keeps them global for the glue, and no shared library exports
// them. (Being in the same block, they come along wherever the hooks do.)
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
std::arch::global_asm!(
    include_str!(concat!(env!("OUT_DIR"), "/hidden.s")),
    ".pushsection .text.kpack_zstd_trace,\"ax\",@progbits",
    ".globl ZSTD_trace_decompress_begin",
    ".hidden ZSTD_trace_decompress_begin",
    ".type ZSTD_trace_decompress_begin,@function",
    "ZSTD_trace_decompress_begin:",
    "xor eax, eax",
    "ret",
    ".size ZSTD_trace_decompress_begin, . - ZSTD_trace_decompress_begin",
    ".globl ZSTD_trace_decompress_end",
    ".hidden ZSTD_trace_decompress_end",
    ".type ZSTD_trace_decompress_end,@function",
    "ZSTD_trace_decompress_end:",
    "ret",
    ".size ZSTD_trace_decompress_end, . - ZSTD_trace_decompress_end",
    ".popsection",
);

#[cfg(all(target_os = "linux", target_arch = "aarch64"))]
std::arch::global_asm!(
    include_str!(concat!(env!("OUT_DIR"), "/hidden.s")),
    ".pushsection .text.kpack_zstd_trace,\"ax\",%progbits",
    ".globl ZSTD_trace_decompress_begin",
    ".hidden ZSTD_trace_decompress_begin",
    ".type ZSTD_trace_decompress_begin,%function",
    "ZSTD_trace_decompress_begin:",
    "mov x0, #0",
    "ret",
    ".size ZSTD_trace_decompress_begin, . - ZSTD_trace_decompress_begin",
    ".globl ZSTD_trace_decompress_end",
    ".hidden ZSTD_trace_decompress_end",
    ".type ZSTD_trace_decompress_end,%function",
    "ZSTD_trace_decompress_end:",
    "ret",
    ".size ZSTD_trace_decompress_end, . - ZSTD_trace_decompress_end",
    ".popsection",
);
