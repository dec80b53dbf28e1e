/* A shared library that links librocm_kpack.a, standing in for
 * libamdhip64.so in tests/symbols.rs. Its own export: probe_kernel_size. */
#include <rocm_kpack/kpack.h>

__attribute__((visibility("default"))) long probe_kernel_size(const char* path,
                                                              const char* key,
                                                              const char* arch) {
    kpack_archive_t a = NULL;
    void* data = NULL;
    size_t size = 0;
    if (kpack_open(path, &a) != KPACK_SUCCESS) return -1;
    kpack_error_t e = kpack_get_kernel(a, key, arch, &data, &size);
    kpack_close(a);
    if (e != KPACK_SUCCESS) return -(long)e;
    kpack_free_kernel(data);
    return (long)size;
}
