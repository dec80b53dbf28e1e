/* kpack_get_kernel_info against kpack_get_kernel, driven by
 * tests/tests/kernel_info.rs:
 *
 *   kernel_info ARCHIVE...
 *
 * For every binary key and every architecture of each archive: when
 * kpack_get_kernel hands out a code object, kpack_get_kernel_info succeeds
 * and its original_size is the size handed out (stored_size and scheme as
 * kpack.h says; NULL outputs allowed); when it does not, kpack_get_kernel_info
 * fails with the same code and writes nothing. Then the errors: unknown key
 * or architecture, NULL arguments. Prints one line per code object,
 * "ENTRY <key> <arch> <original_size> <stored_size> <scheme>", then "PASS N"
 * (N code objects); exits 1 on any failed check.
 */
#include <rocm_kpack/kpack.h>

#include <stdio.h>
#include <string.h>

static int failures = 0;

#define CHECK(cond)                                                          \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, \
                    #cond);                                                  \
            failures++;                                                      \
        }                                                                    \
    } while (0)

#define SENTINEL ((size_t)0x5a5a5a5a)

/* One (key, arch): returns 1 when the archive has that code object. */
static int check_pair(kpack_archive_t a, const char* key, const char* arch) {
    void* data = NULL;
    size_t size = 0;
    kpack_error_t got = kpack_get_kernel(a, key, arch, &data, &size);
    size_t original = SENTINEL, stored = SENTINEL;
    kpack_compression_scheme_t scheme = (kpack_compression_scheme_t)7;
    kpack_error_t info = kpack_get_kernel_info(a, key, arch, &original, &stored, &scheme);
    if (got != KPACK_SUCCESS) {
        CHECK(info == got);
        CHECK(original == SENTINEL && stored == SENTINEL && (int)scheme == 7);
        return 0;
    }
    CHECK(info == KPACK_SUCCESS);
    CHECK(original == size);
    CHECK(scheme == KPACK_COMPRESSION_NOOP || scheme == KPACK_COMPRESSION_ZSTD_PER_KERNEL);
    if (scheme == KPACK_COMPRESSION_NOOP) CHECK(stored == original);
    /* A zstd frame: its 4-byte length, a header, at least one block. */
    if (scheme == KPACK_COMPRESSION_ZSTD_PER_KERNEL) CHECK(stored > 4 + 6);
    /* Each output may be left out; the others are the same. */
    size_t only = SENTINEL;
    CHECK(kpack_get_kernel_info(a, key, arch, NULL, NULL, NULL) == KPACK_SUCCESS);
    CHECK(kpack_get_kernel_info(a, key, arch, &only, NULL, NULL) == KPACK_SUCCESS);
    CHECK(only == original);
    only = SENTINEL;
    CHECK(kpack_get_kernel_info(a, key, arch, NULL, &only, NULL) == KPACK_SUCCESS);
    CHECK(only == stored);
    printf("ENTRY %s %s %zu %zu %d\n", key, arch, original, stored, (int)scheme);
    kpack_free_kernel(data);
    return 1;
}

static void check_errors(kpack_archive_t a, const char* key, const char* arch) {
    size_t original = SENTINEL;
    CHECK(kpack_get_kernel_info(a, "no/such/binary.so#0", arch, &original, NULL, NULL) ==
          KPACK_ERROR_KERNEL_NOT_FOUND);
    CHECK(kpack_get_kernel_info(a, key, "gfx0", &original, NULL, NULL) ==
          KPACK_ERROR_KERNEL_NOT_FOUND);
    /* The key without its "#N" names nothing. */
    char bare[4096];
    snprintf(bare, sizeof bare, "%s", key);
    char* hash = strrchr(bare, '#');
    if (hash) *hash = '\0';
    CHECK(kpack_get_kernel_info(a, bare, arch, &original, NULL, NULL) ==
          KPACK_ERROR_KERNEL_NOT_FOUND);
    CHECK(original == SENTINEL);
    CHECK(kpack_get_kernel_info(NULL, key, arch, &original, NULL, NULL) ==
          KPACK_ERROR_INVALID_ARGUMENT);
    CHECK(kpack_get_kernel_info(a, NULL, arch, &original, NULL, NULL) ==
          KPACK_ERROR_INVALID_ARGUMENT);
    CHECK(kpack_get_kernel_info(a, key, NULL, &original, NULL, NULL) ==
          KPACK_ERROR_INVALID_ARGUMENT);
    CHECK(original == SENTINEL);
}

static size_t check_archive(const char* path) {
    kpack_archive_t a = NULL;
    if (kpack_open(path, &a) != KPACK_SUCCESS) {
        fprintf(stderr, "cannot open %s\n", path);
        failures++;
        return 0;
    }
    size_t n_bin = 0, n_arch = 0, found = 0;
    CHECK(kpack_get_binary_count(a, &n_bin) == KPACK_SUCCESS);
    CHECK(kpack_get_architecture_count(a, &n_arch) == KPACK_SUCCESS);
    const char* first_key = NULL;
    const char* first_arch = NULL;
    for (size_t b = 0; b < n_bin; b++) {
        const char* key = NULL;
        CHECK(kpack_get_binary(a, b, &key) == KPACK_SUCCESS);
        for (size_t t = 0; t < n_arch; t++) {
            const char* arch = NULL;
            CHECK(kpack_get_architecture(a, t, &arch) == KPACK_SUCCESS);
            if (!check_pair(a, key, arch)) continue;
            found++;
            if (!first_key) {
                first_key = key;
                first_arch = arch;
            }
        }
    }
    CHECK(first_key != NULL);
    if (first_key) check_errors(a, first_key, first_arch);
    kpack_close(a);
    return found;
}

int main(int argc, char** argv) {
    size_t total = 0;
    for (int i = 1; i < argc; i++) total += check_archive(argv[i]);
    CHECK(argc > 1);
    if (failures) {
        fprintf(stderr, "%d checks failed\n", failures);
        return 1;
    }
    printf("PASS %zu\n", total);
    return 0;
}
