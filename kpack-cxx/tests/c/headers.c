/* Compile-only check of <rocm_kpack/kpack.h> as C99, C11 and C++17: the
 * exact prototypes, type names, error values and macros (docs/formats.md
 * §5.1, §5.2). */
#include <rocm_kpack/kpack.h>

#define CHECK(name, cond) typedef char check_##name[(cond) ? 1 : -1]

CHECK(success, KPACK_SUCCESS == 0);
CHECK(e1, KPACK_ERROR_INVALID_ARGUMENT == 1);
CHECK(e2, KPACK_ERROR_FILE_NOT_FOUND == 2);
CHECK(e3, KPACK_ERROR_INVALID_FORMAT == 3);
CHECK(e4, KPACK_ERROR_UNSUPPORTED_VERSION == 4);
CHECK(e5, KPACK_ERROR_KERNEL_NOT_FOUND == 5);
CHECK(e6, KPACK_ERROR_DECOMPRESSION_FAILED == 6);
CHECK(e7, KPACK_ERROR_OUT_OF_MEMORY == 7);
CHECK(e8, KPACK_ERROR_NOT_IMPLEMENTED == 8);
CHECK(e9, KPACK_ERROR_IO_ERROR == 9);
CHECK(e10, KPACK_ERROR_MSGPACK_PARSE_FAILED == 10);
CHECK(e11, KPACK_ERROR_PATH_DISCOVERY_FAILED == 11);
CHECK(e12, KPACK_ERROR_INVALID_METADATA == 12);
CHECK(e13, KPACK_ERROR_ARCHIVE_NOT_FOUND == 13);
CHECK(e14, KPACK_ERROR_ARCH_NOT_FOUND == 14);
CHECK(noop, KPACK_COMPRESSION_NOOP == 0);
CHECK(zstd, KPACK_COMPRESSION_ZSTD_PER_KERNEL == 1);
CHECK(magic_size, KPACK_MAGIC_SIZE == 4 && sizeof(KPACK_MAGIC) == 5);
CHECK(version, KPACK_CURRENT_VERSION == 1);
CHECK(error_size, sizeof(kpack_error_t) == sizeof(int));

static bool callback(const char* arch, void* user_data) {
    (void)arch;
    (void)user_data;
    return true;
}

/* Each function has exactly the reference's type (kpack_get_kernel_info,
 * kpack's addition, the type kpack.h documents). */
int main(void) {
    kpack_error_t (*open_)(const char*, kpack_archive_t*) = kpack_open;
    void (*close_)(kpack_archive_t) = kpack_close;
    kpack_error_t (*arch_count)(kpack_archive_t, size_t*) = kpack_get_architecture_count;
    kpack_error_t (*arch)(kpack_archive_t, size_t, const char**) = kpack_get_architecture;
    kpack_error_t (*bin_count)(kpack_archive_t, size_t*) = kpack_get_binary_count;
    kpack_error_t (*bin)(kpack_archive_t, size_t, const char**) = kpack_get_binary;
    kpack_error_t (*kernel)(kpack_archive_t, const char*, const char*, void**, size_t*) =
        kpack_get_kernel;
    kpack_error_t (*info)(kpack_archive_t, const char*, const char*, size_t*, size_t*,
                          kpack_compression_scheme_t*) = kpack_get_kernel_info;
    void (*free_kernel)(void*) = kpack_free_kernel;
    kpack_error_t (*cache_create)(kpack_cache_t*) = kpack_cache_create;
    void (*cache_destroy)(kpack_cache_t) = kpack_cache_destroy;
    kpack_error_t (*discover)(const void*, char*, size_t, size_t*) = kpack_discover_binary_path;
    kpack_error_t (*load)(kpack_cache_t, const void*, const char*, uint32_t, const char* const*,
                          size_t, void**, size_t*) = kpack_load_code_object;
    void (*free_co)(void*) = kpack_free_code_object;
    kpack_error_t (*enumerate)(const char*, kpack_arch_callback_t, void*) =
        kpack_enumerate_architectures;
    kpack_arch_callback_t cb = callback;
    kpack_compression_scheme_t scheme = KPACK_COMPRESSION_ZSTD_PER_KERNEL;
    const void* all[] = {(const void*)&open_,        (const void*)&close_,
                         (const void*)&arch_count,   (const void*)&arch,
                         (const void*)&bin_count,    (const void*)&bin,
                         (const void*)&kernel,       (const void*)&free_kernel,
                         (const void*)&cache_create, (const void*)&cache_destroy,
                         (const void*)&discover,     (const void*)&load,
                         (const void*)&free_co,      (const void*)&enumerate,
                         (const void*)&cb,           (const void*)&scheme,
                         (const void*)&info};
    return (int)(sizeof all / sizeof all[0]) - 17;
}
