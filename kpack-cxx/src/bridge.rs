//! The C++ API's bridge (cxx): the same archive and loader as the C API,
//! with errors that carry kpack's full message.
//!
//! `include/rocm_kpack/kpack.hpp` is the C++ face (`kpack::Archive`,
//! `kpack::Cache`, `kpack::Error`); it calls the functions below, in C++
//! namespace `kpack::bridge`, through the header cxx generates from this
//! module (installed as `rocm_kpack/kpack_bridge.h`). The opaque types are the C API's handles
//! themselves, so `kpack::Archive::handle()` is a `kpack_archive_t`.
//!
//! Conventions, the same for every fallible function: it fills the
//! caller's `Failure` (the `kpack_error_t` value, 0 for success, and
//! kpack's message) and returns an empty value (NULL, 0, an empty vector)
//! on failure; `kpack.hpp` throws the `kpack::Error`. No `Result`: cxx
//! would allocate the message through its C++ runtime, and nothing on this
//! side may call C++ (the prelinked C library needs no C++ runtime; the
//! prelink step checks it). Every body runs in [`guard`], so a panic (a
//! bug) is an error, never an abort of the host process. Strings from C++
//! come as bytes (`std::string` holds any bytes; a key or target that is
//! not UTF-8 names nothing).

use std::panic::{catch_unwind, AssertUnwindSafe};

use kpack_format::archive::ArchiveError;
use kpack_format::hipk::HipkMetadata;

use crate::buffers::Out;
use crate::{cstr_path_bytes, KpackArchive, KpackCache, KpackError, MetadataReader, PANIC_ERROR};

#[cxx::bridge(namespace = "kpack::bridge")]
pub mod ffi {
    /// How a call failed: the `kpack_error_t` value (0: it did not) and
    /// kpack's message.
    struct Failure {
        code: i32,
        message: String,
    }

    /// One code object of an archive (`kpack::Archive::kernels()`).
    struct KernelInfo {
        /// The binary key, with its `#N` (`lib/libfoo.so#0`).
        binary: String,
        /// The target ID (`gfx942`, `gfx90a:xnack-`).
        target: String,
        /// The code object's size in bytes, uncompressed.
        size: u64,
        /// Its index in the archive's blob.
        ordinal: u32,
    }

    /// What `kpack::Archive::kernel_info` reports of one code object
    /// (`kpack_get_kernel_info`'s outputs).
    #[derive(Default)]
    struct EntryInfo {
        /// Its size, uncompressed: the size a read gives.
        original_size: u64,
        /// The bytes it takes in the archive.
        stored_size: u64,
        /// The archive's `kpack_compression_scheme_t`.
        scheme: i32,
    }

    /// A code object handed out as the C API hands it out (released with
    /// `kpack_free_code_object`): `kpack::CodeObject`.
    #[derive(Default)]
    struct CodeObjectRef {
        /// Its address (0 on failure).
        data: usize,
        size: usize,
        /// A private mapping of the archive (stored uncompressed), not a
        /// buffer.
        mapped: bool,
    }

    /// The file mapped at an address (`kpack::discover_binary_path`).
    #[derive(Default)]
    struct MappedFile {
        /// The path's bytes.
        path: Vec<u8>,
        /// The address's offset in the file.
        offset: u64,
    }

    extern "Rust" {
        /// `kpack_archive_t`'s target (released with `kpack_close`).
        type KpackArchive;
        /// `kpack_cache_t`'s target (released with `kpack_cache_destroy`).
        type KpackCache;

        /// NULL on failure.
        fn open_archive(path: &[u8], failure: &mut Failure) -> *mut KpackArchive;
        fn path(self: &KpackArchive) -> Vec<u8>;
        fn architectures(self: &KpackArchive) -> Vec<String>;
        fn binaries(self: &KpackArchive) -> Vec<String>;
        fn kernels(self: &KpackArchive) -> Vec<KernelInfo>;
        fn kernel_size(
            self: &KpackArchive,
            binary: &[u8],
            arch: &[u8],
            failure: &mut Failure,
        ) -> usize;
        /// Without decompressing.
        fn kernel_info(
            self: &KpackArchive,
            binary: &[u8],
            arch: &[u8],
            failure: &mut Failure,
        ) -> EntryInfo;
        fn read_kernel(
            self: &KpackArchive,
            binary: &[u8],
            arch: &[u8],
            out: &mut [u8],
            failure: &mut Failure,
        ) -> usize;
        fn kernel(
            self: &KpackArchive,
            binary: &[u8],
            arch: &[u8],
            failure: &mut Failure,
        ) -> Vec<u8>;
        /// Mapped (no copy) when stored uncompressed.
        fn kernel_view(
            self: &KpackArchive,
            binary: &[u8],
            arch: &[u8],
            failure: &mut Failure,
        ) -> CodeObjectRef;

        /// NULL on failure.
        fn new_cache(failure: &mut Failure) -> *mut KpackCache;
        /// `archs` holds the architectures' bytes back to back, `lens`
        /// their lengths.
        ///
        /// # Safety
        /// `metadata` points to readable HIPK metadata (as for
        /// `kpack_load_code_object`), or is NULL.
        unsafe fn load_code_object(
            self: &KpackCache,
            metadata: *const u8,
            binary_path: &[u8],
            co_index: u32,
            archs: &[u8],
            lens: &[usize],
            failure: &mut Failure,
        ) -> Vec<u8>;
        /// `load_code_object`, handed out as the C API does: mapped (no
        /// copy) when stored uncompressed, else in a recycled buffer.
        ///
        /// # Safety
        /// As `load_code_object`.
        unsafe fn load_code_object_view(
            self: &KpackCache,
            metadata: *const u8,
            binary_path: &[u8],
            co_index: u32,
            archs: &[u8],
            lens: &[usize],
            failure: &mut Failure,
        ) -> CodeObjectRef;

        fn discover_binary_path(address: usize, failure: &mut Failure) -> MappedFile;
    }
}

/// A failure before it is handed to C++ ([`ffi::Failure`]).
#[derive(Debug)]
pub struct Failure {
    pub code: KpackError,
    pub message: String,
}

impl Failure {
    fn new(code: KpackError, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }
}

/// Run a fallible body: its value, or (its failure written to `out`) the
/// default value. A panic is a failure too ([`PANIC_ERROR`]).
fn guard<T: Default>(out: &mut ffi::Failure, f: impl FnOnce() -> Result<T, Failure>) -> T {
    let result = catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        Err(Failure::new(
            PANIC_ERROR,
            "internal error in the kpack runtime (a bug: please report it)",
        ))
    });
    match result {
        Ok(v) => {
            out.code = KpackError::Success as i32;
            v
        }
        Err(e) => {
            out.code = e.code as i32;
            out.message = e.message;
            T::default()
        }
    }
}

fn open_archive(path: &[u8], failure: &mut ffi::Failure) -> *mut KpackArchive {
    let opened = guard(failure, || {
        KpackArchive::open_path(cstr_path_bytes(path))
            .map(|a| Some(Box::new(a)))
            .map_err(|(code, message)| Failure::new(code, message))
    });
    opened.map_or(std::ptr::null_mut(), Box::into_raw)
}

impl KpackArchive {
    /// An archive error as the CLI reports it: the archive's path, then
    /// what is wrong.
    fn failure(&self, source: ArchiveError) -> Failure {
        let code = KpackError::of_read(&source);
        let e = kpack_loader::OpenError::Archive {
            path: self.path.clone(),
            source,
        };
        Failure::new(code, kpack_loader::report(&e))
    }

    fn path(&self) -> Vec<u8> {
        crate::path_bytes_lossy(&self.path)
    }

    fn architectures(&self) -> Vec<String> {
        self.archive.gfx_arches().to_vec()
    }

    fn binaries(&self) -> Vec<String> {
        self.archive.binaries().map(str::to_owned).collect()
    }

    fn kernels(&self) -> Vec<ffi::KernelInfo> {
        self.archive
            .entries()
            .iter()
            .map(|e| ffi::KernelInfo {
                binary: e.key.clone(),
                target: e.target.clone(),
                size: e.original_size,
                ordinal: e.ordinal,
            })
            .collect()
    }

    /// The entry of `binary` @ `arch`, checked to be readable at its size.
    fn checked_entry(
        &self,
        binary: &[u8],
        arch: &[u8],
    ) -> Result<&kpack_format::archive::Entry, Failure> {
        let entry = self.found_entry(binary, arch)?;
        self.archive.check(entry).map_err(|e| self.failure(e))?;
        Ok(entry)
    }

    /// The entry of `binary` @ `arch`, as the TOC has it.
    fn found_entry(
        &self,
        binary: &[u8],
        arch: &[u8],
    ) -> Result<&kpack_format::archive::Entry, Failure> {
        let not_found = || {
            self.failure(ArchiveError::KernelNotFound {
                key: String::from_utf8_lossy(binary).into_owned(),
                target: String::from_utf8_lossy(arch).into_owned(),
            })
        };
        // Keys and targets are UTF-8: other bytes name no kernel.
        let (Ok(key), Ok(target)) = (std::str::from_utf8(binary), std::str::from_utf8(arch)) else {
            return Err(not_found());
        };
        self.archive.entry(key, target).ok_or_else(not_found)
    }

    fn kernel_info(
        &self,
        binary: &[u8],
        arch: &[u8],
        failure: &mut ffi::Failure,
    ) -> ffi::EntryInfo {
        guard(failure, || {
            let entry = self.found_entry(binary, arch)?;
            let info = self
                .archive
                .kernel_info(entry)
                .map_err(|e| self.failure(e))?;
            Ok(ffi::EntryInfo {
                original_size: info.original_size,
                stored_size: info.stored_size,
                scheme: crate::KpackCompressionScheme::from(info.scheme) as i32,
            })
        })
    }

    fn kernel_size(&self, binary: &[u8], arch: &[u8], failure: &mut ffi::Failure) -> usize {
        guard(failure, || {
            let entry = self.checked_entry(binary, arch)?;
            self.size_of(entry)
        })
    }

    fn size_of(&self, entry: &kpack_format::archive::Entry) -> Result<usize, Failure> {
        usize::try_from(entry.original_size).map_err(|_| {
            Failure::new(
                KpackError::OutOfMemory,
                format!(
                    "{}: kernel {} @ {}: {} bytes do not fit in memory",
                    self.path.display(),
                    entry.key,
                    entry.target,
                    entry.original_size
                ),
            )
        })
    }

    fn read_kernel(
        &self,
        binary: &[u8],
        arch: &[u8],
        out: &mut [u8],
        failure: &mut ffi::Failure,
    ) -> usize {
        guard(failure, || {
            let entry = self.checked_entry(binary, arch)?;
            let size = self.size_of(entry)?;
            let Some(dst) = out.get_mut(..size) else {
                return Err(Failure::new(
                    KpackError::InvalidArgument,
                    format!(
                        "{}: kernel {} @ {} is {size} bytes, the buffer holds {}",
                        self.path.display(),
                        entry.key,
                        entry.target,
                        out.len()
                    ),
                ));
            };
            self.archive
                .read_into(entry, dst)
                .map_err(|e| self.failure(e))?;
            Ok(size)
        })
    }

    fn kernel(&self, binary: &[u8], arch: &[u8], failure: &mut ffi::Failure) -> Vec<u8> {
        guard(failure, || {
            let entry = self.checked_entry(binary, arch)?;
            let size = self.size_of(entry)?;
            let mut v = Vec::new();
            v.try_reserve_exact(size).map_err(|_| {
                Failure::new(
                    KpackError::OutOfMemory,
                    format!(
                        "{}: kernel {} @ {}: cannot allocate {size} bytes",
                        self.path.display(),
                        entry.key,
                        entry.target
                    ),
                )
            })?;
            v.resize(size, 0);
            self.archive
                .read_into(entry, &mut v)
                .map_err(|e| self.failure(e))?;
            Ok(v)
        })
    }

    fn kernel_view(
        &self,
        binary: &[u8],
        arch: &[u8],
        failure: &mut ffi::Failure,
    ) -> ffi::CodeObjectRef {
        guard(failure, || {
            let entry = self.checked_entry(binary, arch)?;
            let size = self.size_of(entry)?;
            let out = self.code_object(entry).map_err(|e| match e {
                Some(e) => self.failure(e),
                None => Failure::new(
                    KpackError::OutOfMemory,
                    format!(
                        "{}: kernel {} @ {}: cannot allocate {size} bytes",
                        self.path.display(),
                        entry.key,
                        entry.target
                    ),
                ),
            })?;
            Ok(hand_out(out))
        })
    }
}

/// A code object handed to C++ as the C API hands it out.
fn hand_out(out: Out) -> ffi::CodeObjectRef {
    let mapped = matches!(out, Out::Mapped(_));
    let (data, size) = out.hand_out();
    ffi::CodeObjectRef {
        data: data as usize,
        size,
        mapped,
    }
}

fn new_cache(failure: &mut ffi::Failure) -> *mut KpackCache {
    let cache = guard(failure, || Ok(Some(Box::new(KpackCache::from_env()))));
    cache.map_or(std::ptr::null_mut(), Box::into_raw)
}

impl KpackCache {
    /// # Safety
    /// `metadata` is NULL or points to readable HIPK metadata.
    #[allow(clippy::too_many_arguments)]
    unsafe fn load_code_object(
        &self,
        metadata: *const u8,
        binary_path: &[u8],
        co_index: u32,
        archs: &[u8],
        lens: &[usize],
        failure: &mut ffi::Failure,
    ) -> Vec<u8> {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            self.run_load(
                metadata,
                binary_path,
                archs,
                lens,
                failure,
                |reader, path, names| {
                    let alloc = |size: usize| {
                        let mut v = Vec::new();
                        v.try_reserve_exact(size).ok()?;
                        v.resize(size, 0);
                        Some(v)
                    };
                    self.loader.load_with(
                        || HipkMetadata::read(reader),
                        path,
                        co_index,
                        names,
                        alloc,
                    )
                },
            )
        }
    }

    /// # Safety
    /// `metadata` is NULL or points to readable HIPK metadata.
    #[allow(clippy::too_many_arguments)]
    unsafe fn load_code_object_view(
        &self,
        metadata: *const u8,
        binary_path: &[u8],
        co_index: u32,
        archs: &[u8],
        lens: &[usize],
        failure: &mut ffi::Failure,
    ) -> ffi::CodeObjectRef {
        // SAFETY: the caller's contract, passed on.
        let out = unsafe {
            self.run_load(
                metadata,
                binary_path,
                archs,
                lens,
                failure,
                |reader, path, names| {
                    self.load(|| HipkMetadata::read(reader), path, co_index, names)
                        .map(Some)
                },
            )
        };
        out.map_or_else(ffi::CodeObjectRef::default, hand_out)
    }

    /// The checks and error messages of a load from C++, around `load`.
    ///
    /// # Safety
    /// `metadata` is NULL or points to readable HIPK metadata.
    unsafe fn run_load<T: Default>(
        &self,
        metadata: *const u8,
        binary_path: &[u8],
        archs: &[u8],
        lens: &[usize],
        failure: &mut ffi::Failure,
        load: impl FnOnce(
            MetadataReader,
            &std::path::Path,
            &[&str],
        ) -> Result<T, kpack_loader::LoadError>,
    ) -> T {
        let path = cstr_path_bytes(binary_path);
        guard(failure, || {
            let invalid = |what: &str| {
                Failure::new(
                    KpackError::InvalidArgument,
                    format!("{}: {what}", path.display()),
                )
            };
            if metadata.is_null() {
                return Err(invalid("the HIPK metadata pointer is NULL"));
            }
            let names = split_archs(archs, lens).ok_or_else(|| {
                invalid("an architecture name is not UTF-8 (or the list is malformed)")
            })?;
            let reader = MetadataReader {
                ptr: metadata,
                pos: 0,
            };
            load(reader, &path, &names).map_err(|e| {
                Failure::new(
                    e.code(),
                    format!("{}: {}", path.display(), kpack_loader::report(&e)),
                )
            })
        })
    }
}

/// `archs` cut at `lens`, each UTF-8; `None` when the lengths do not add up
/// or a name is not UTF-8.
fn split_archs<'a>(mut archs: &'a [u8], lens: &[usize]) -> Option<Vec<&'a str>> {
    let mut out = Vec::with_capacity(lens.len());
    for &len in lens {
        if len > archs.len() {
            return None;
        }
        let (name, rest) = archs.split_at(len);
        out.push(std::str::from_utf8(name).ok()?);
        archs = rest;
    }
    archs.is_empty().then_some(out)
}

fn discover_binary_path(address: usize, failure: &mut ffi::Failure) -> ffi::MappedFile {
    guard(failure, || {
        if address == 0 {
            return Err(Failure::new(
                KpackError::InvalidArgument,
                "kpack::discover_binary_path: the address is NULL",
            ));
        }
        let found = kpack_loader::discover_binary_path(address).map_err(|e| {
            let code = KpackError::of_discover(&e);
            Failure::new(code, kpack_loader::report(&e))
        })?;
        Ok(ffi::MappedFile {
            path: crate::path_bytes_lossy(&found.path),
            offset: found.offset,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_archs_cuts_and_checks() {
        assert_eq!(
            split_archs(b"gfx942gfx1100", &[6, 7]),
            Some(vec!["gfx942", "gfx1100"])
        );
        assert_eq!(split_archs(b"", &[]), Some(vec![]));
        assert_eq!(split_archs(b"gfx942", &[7]), None);
        assert_eq!(split_archs(b"gfx942x", &[6]), None);
        assert_eq!(split_archs(b"\xff", &[1]), None);
    }

    #[test]
    fn guard_writes_the_failure_and_catches_panics() {
        let mut f = ffi::Failure {
            code: -1,
            message: String::new(),
        };
        assert_eq!(guard(&mut f, || Ok(7)), 7);
        assert_eq!(f.code, 0);
        let v: u32 = guard(&mut f, || {
            Err(Failure::new(KpackError::KernelNotFound, "x"))
        });
        assert_eq!((v, f.code, f.message.as_str()), (0, 5, "x"));
        let v: u32 = guard(&mut f, || panic!("boom"));
        assert_eq!((v, f.code), (0, PANIC_ERROR as i32));
        assert!(f.message.contains("internal error"), "{}", f.message);
    }
}
