/* SPDX-License-Identifier: MIT */
/*
 * kpack runtime C API: read .kpack archives and load the code objects of
 * offloaded (HIPK) binaries. A drop-in replacement for ROCm's
 * rocm_kpack/kpack.h; see docs/runtime.md.
 *
 * Conventions:
 * - Every fallible function returns a kpack_error_t. Output parameters are
 *   written only when it is KPACK_SUCCESS.
 * - A NULL pointer argument (other than the optional ones documented below)
 *   gives KPACK_ERROR_INVALID_ARGUMENT.
 * - Code objects returned by kpack_get_kernel and kpack_load_code_object
 *   are the caller's until released with kpack_free_kernel /
 *   kpack_free_code_object (either one, exactly once). They stay valid until
 *   then, also after kpack_close / kpack_cache_destroy, and are writable;
 *   a write to one is seen by no other.
 *   - Stored uncompressed in the archive (scheme none): no copy is made.
 *     The pointer is into a private copy-on-write mapping of the archive
 *     file of this code object alone (pages shared with the page cache, and
 *     so with other processes, until written). Release it ONLY through
 *     kpack_free_code_object / kpack_free_kernel: free() on it is undefined.
 *   - Compressed: a malloc-compatible buffer the code object was
 *     decompressed into (free() also releases it).
 *     kpack_free_code_object returns it to a small pool of its cache, whose
 *     next loads decompress into it (at most 4 buffers and 32 MiB per
 *     cache, freed by kpack_cache_destroy).
 * - Concurrent calls on one archive or one cache are safe; kpack_close and
 *   kpack_cache_destroy must not race them.
 * - Archives are memory-mapped: replace an archive file by renaming a new
 *   file over it, never by rewriting it in place (a process that has it
 *   mapped would get SIGBUS).
 */
#ifndef ROCM_KPACK_H
#define ROCM_KPACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kpack_export.h"
#include "kpack_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Called by kpack_enumerate_architectures for each architecture; return
 * false to stop. Must not throw (C++) or longjmp out. */
typedef bool (*kpack_arch_callback_t)(const char* arch, void* user_data);

/* ---- Archives ---------------------------------------------------------- */

/* Open the archive at `path` (reads the header and the TOC only).
 * Errors: INVALID_ARGUMENT (NULL), FILE_NOT_FOUND, IO_ERROR,
 * INVALID_FORMAT (bad magic or layout), UNSUPPORTED_VERSION,
 * MSGPACK_PARSE_FAILED (TOC is not MessagePack). */
KPACK_API kpack_error_t kpack_open(const char* path, kpack_archive_t* archive);

/* Close an archive; NULL is a no-op. Strings it returned become invalid. */
KPACK_API void kpack_close(kpack_archive_t archive);

/* Number of architectures (target IDs) the archive serves. */
KPACK_API kpack_error_t kpack_get_architecture_count(kpack_archive_t archive,
                                                     size_t* count);

/* Architecture `index` in the archive's gfx_arches order; the string is
 * owned by the archive and valid until kpack_close. Index out of range:
 * INVALID_ARGUMENT. */
KPACK_API kpack_error_t kpack_get_architecture(kpack_archive_t archive,
                                               size_t index, const char** arch);

/* Number of binary keys (e.g. "lib/librocblas.so#0") in the archive. */
KPACK_API kpack_error_t kpack_get_binary_count(kpack_archive_t archive,
                                               size_t* count);

/* Binary key `index`, keys sorted bytewise; owned by the archive and valid
 * until kpack_close. Index out of range: INVALID_ARGUMENT. */
KPACK_API kpack_error_t kpack_get_binary(kpack_archive_t archive, size_t index,
                                         const char** binary);

/* The code object of `binary_name` (the exact key, with its "#N") for
 * `arch` (exact target ID): mapped from the archive when stored
 * uncompressed, else decompressed into a new malloc'ed buffer (see the
 * conventions above). Release it with kpack_free_kernel.
 * Errors: KERNEL_NOT_FOUND, DECOMPRESSION_FAILED, OUT_OF_MEMORY. */
KPACK_API kpack_error_t kpack_get_kernel(kpack_archive_t archive,
                                         const char* binary_name,
                                         const char* arch, void** kernel_data,
                                         size_t* kernel_size);

/* What kpack_get_kernel would hand out for `binary_name` @ `arch`, from the
 * TOC and without decompressing: `original_size` receives the code object's
 * size (the kernel_size kpack_get_kernel gives), `stored_size` the bytes it
 * takes in the archive (its zstd frame with the frame's 4-byte length, or
 * its blob), `scheme` how the archive stores it. Each of the three may be
 * NULL (not asked for). Lets a caller refuse a code object by its size, or
 * by its compression ratio, before anything is allocated.
 * Errors: INVALID_ARGUMENT (archive, binary_name or arch NULL),
 * KERNEL_NOT_FOUND, DECOMPRESSION_FAILED (the TOC's size disagrees with the
 * frame's header, or the frame is out of bounds), OUT_OF_MEMORY (a size
 * that does not fit a size_t). */
KPACK_API kpack_error_t kpack_get_kernel_info(kpack_archive_t archive,
                                              const char* binary_name,
                                              const char* arch,
                                              size_t* original_size,
                                              size_t* stored_size,
                                              kpack_compression_scheme_t* scheme);

/* Release a code object from kpack_get_kernel (or kpack_load_code_object);
 * NULL is a no-op. */
KPACK_API void kpack_free_kernel(void* kernel_data);

/* ---- Loader ------------------------------------------------------------ */

/* Create a loader cache. Reads ROCM_KPACK_DISABLE, ROCM_KPACK_DEBUG,
 * ROCM_KPACK_PATH and ROCM_KPACK_PATH_PREFIX now, once. Archives are opened
 * on first use and stay open until kpack_cache_destroy. */
KPACK_API kpack_error_t kpack_cache_create(kpack_cache_t* cache);

/* Destroy a cache and close its archives; NULL is a no-op. */
KPACK_API void kpack_cache_destroy(kpack_cache_t cache);

/* Find the file mapped at `address_in_binary` (Linux: /proc/self/maps) and
 * write its path, NUL-terminated, to `path_out` (`path_out_size` bytes);
 * `offset_out` (may be NULL) receives the address's offset in the file.
 * Errors: INVALID_ARGUMENT (NULL, or buffer too small),
 * PATH_DISCOVERY_FAILED (not in a file mapping), NOT_IMPLEMENTED (other
 * platforms). */
KPACK_API kpack_error_t kpack_discover_binary_path(const void* address_in_binary,
                                                   char* path_out,
                                                   size_t path_out_size,
                                                   size_t* offset_out);

/* Load the code object `kernel_name#co_index` of the binary whose HIPK
 * metadata (MessagePack, at most 64 KiB) is at `hipk_metadata` and whose
 * file is `binary_path`, for the first of `arch_list` (priority order, e.g.
 * "amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-" then its generic target)
 * that an archive serves. The result is mapped from the archive when it is
 * stored uncompressed, else a malloc-compatible buffer (see the conventions
 * above); release it with kpack_free_code_object.
 * Errors: INVALID_ARGUMENT (NULL, arch_count == 0), NOT_IMPLEMENTED
 * (ROCM_KPACK_DISABLE), INVALID_METADATA, then, when no archive had it:
 * DECOMPRESSION_FAILED / IO_ERROR (a matching archive failed to read it),
 * KERNEL_NOT_FOUND (archives serve the target but lack the code object),
 * ARCH_NOT_FOUND (archives opened, none serves the architectures),
 * ARCHIVE_NOT_FOUND (no candidate archive could be opened). */
KPACK_API kpack_error_t kpack_load_code_object(
    kpack_cache_t cache, const void* hipk_metadata, const char* binary_path,
    uint32_t co_index, const char* const* arch_list, size_t arch_count,
    void** code_object_out, size_t* code_object_size_out);

/* Release a code object from kpack_load_code_object (or kpack_get_kernel):
 * unmaps a mapped one, returns a buffer to its cache's pool (or frees it
 * when the cache is gone or the pool full). NULL is a no-op. */
KPACK_API void kpack_free_code_object(void* code_object);

/* Open the archive at `archive_path`, call `callback` for each of its
 * architectures until it returns false, close it. Returns KPACK_SUCCESS
 * also when stopped early; open errors as kpack_open. */
KPACK_API kpack_error_t kpack_enumerate_architectures(
    const char* archive_path, kpack_arch_callback_t callback, void* user_data);

#ifdef __cplusplus
}
#endif

#endif /* ROCM_KPACK_H */
