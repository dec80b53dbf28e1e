/* C11 test program for the kpack C API, driven by kpack-cxx/tests/c_api.rs.
 *
 *   api_test archive FIXTURES_DIR WORK_DIR   every archive function and error
 *   api_test load META BINARY CO_INDEX OUT ARCH...
 *                                            one kpack_load_code_object;
 *                                            prints "code=N size=M", writes OUT
 *   api_test loader META BINARY WORK_DIR     loader argument/error checks
 *   api_test threads META BINARY ARCH COUNT EXPECTED_DIR THREADS LOADS WARM
 *                                            THREADS x LOADS loads on one cache
 *                                            (WARM=1: one load first, before
 *                                            the threads start)
 *   api_test discover LIB.so DELETE          dlopen, kpack_discover_binary_path
 *
 * The metadata file is read into a buffer of exactly its size, so memcheck
 * sees any read past the MessagePack map.
 */
#define _POSIX_C_SOURCE 200809L
#include <rocm_kpack/kpack.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failures = 0;

#define CHECK(cond)                                                       \
    do {                                                                  \
        if (!(cond)) {                                                    \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__,        \
                    __LINE__, #cond);                                     \
            failures++;                                                   \
        }                                                                 \
    } while (0)

#define CHECK_ERR(expr, want)                                             \
    do {                                                                  \
        kpack_error_t got_ = (expr);                                      \
        if (got_ != (want)) {                                             \
            fprintf(stderr, "%s:%d: %s = %d, expected %s (%d)\n",         \
                    __FILE__, __LINE__, #expr, (int)got_, #want,          \
                    (int)(want));                                         \
            failures++;                                                   \
        }                                                                 \
    } while (0)

static char* join(const char* dir, const char* name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char* p = malloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* Read a whole file into an exactly sized malloc'ed buffer. */
static unsigned char* read_file(const char* path, size_t* size) {
    FILE* f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char* buf = malloc(n > 0 ? (size_t)n : 1);
    if (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "cannot read %s\n", path);
        exit(2);
    }
    fclose(f);
    *size = (size_t)n;
    return buf;
}

/* `text` followed by `count` copies of `fill`. */
static unsigned char* pattern(const char* text, unsigned char fill, size_t count,
                              size_t* size) {
    size_t t = strlen(text);
    unsigned char* p = malloc(t + count);
    memcpy(p, text, t);
    memset(p + t, fill, count);
    *size = t + count;
    return p;
}

static void expect_kernel(kpack_archive_t a, const char* key, const char* arch,
                          const unsigned char* want, size_t want_size) {
    void* data = NULL;
    size_t size = 0;
    CHECK_ERR(kpack_get_kernel(a, key, arch, &data, &size), KPACK_SUCCESS);
    CHECK(size == want_size);
    CHECK(data != NULL && memcmp(data, want, want_size) == 0);
    kpack_free_kernel(data);
}

static bool count_arches(const char* arch, void* user) {
    int* n = user;
    CHECK(arch != NULL && strncmp(arch, "gfx", 3) == 0);
    (*n)++;
    return true;
}

static bool stop_after_one(const char* arch, void* user) {
    (void)arch;
    int* n = user;
    (*n)++;
    return false;
}

static void test_reference_archives(const char* fixtures) {
    char* noop_path = join(fixtures, "test_noop.kpack");
    char* zstd_path = join(fixtures, "test_zstd.kpack");
    kpack_archive_t a = NULL;
    size_t n = 0;
    const char* s = NULL;
    unsigned char* want;
    size_t want_size;

    /* test_noop.kpack */
    CHECK_ERR(kpack_open(noop_path, &a), KPACK_SUCCESS);
    CHECK(a != NULL);
    CHECK_ERR(kpack_get_architecture_count(a, &n), KPACK_SUCCESS);
    CHECK(n == 2);
    CHECK_ERR(kpack_get_architecture(a, 0, &s), KPACK_SUCCESS);
    CHECK(strcmp(s, "gfx900") == 0);
    CHECK_ERR(kpack_get_architecture(a, 1, &s), KPACK_SUCCESS);
    CHECK(strcmp(s, "gfx906") == 0);
    s = (const char*)0x1;
    CHECK_ERR(kpack_get_architecture(a, 2, &s), KPACK_ERROR_INVALID_ARGUMENT);
    CHECK(s == (const char*)0x1); /* not written on failure */
    CHECK_ERR(kpack_get_binary_count(a, &n), KPACK_SUCCESS);
    CHECK(n == 2);
    const char* b0 = NULL;
    const char* b1 = NULL;
    CHECK_ERR(kpack_get_binary(a, 0, &b0), KPACK_SUCCESS);
    CHECK_ERR(kpack_get_binary(a, 1, &b1), KPACK_SUCCESS);
    CHECK(strcmp(b0, "bin/testapp#0") == 0); /* sorted bytewise */
    CHECK(strcmp(b1, "lib/libtest.so#0") == 0);
    CHECK_ERR(kpack_get_binary(a, 2, &s), KPACK_ERROR_INVALID_ARGUMENT);
    CHECK_ERR(kpack_get_binary(a, (size_t)-1, &s), KPACK_ERROR_INVALID_ARGUMENT);

    want = pattern("KERNEL1_GFX900_DATA", 0x00, 100, &want_size);
    CHECK(want_size == 119);
    expect_kernel(a, "lib/libtest.so#0", "gfx900", want, want_size);
    free(want);
    want = pattern("KERNEL2_GFX906_DATA", 0x00, 200, &want_size);
    expect_kernel(a, "lib/libtest.so#0", "gfx906", want, want_size);
    free(want);
    want = pattern("KERNEL3_APP_GFX900", 0xff, 150, &want_size);
    CHECK(want_size == 168);
    expect_kernel(a, "bin/testapp#0", "gfx900", want, want_size);
    free(want);

    /* Kernel lookups are exact. */
    void* data = (void*)0x1;
    size_t size = 77;
    CHECK_ERR(kpack_get_kernel(a, "bin/testapp#0", "gfx906", &data, &size),
              KPACK_ERROR_KERNEL_NOT_FOUND);
    CHECK_ERR(kpack_get_kernel(a, "bin/testapp", "gfx900", &data, &size),
              KPACK_ERROR_KERNEL_NOT_FOUND);
    CHECK_ERR(kpack_get_kernel(a, "bin/testapp#0", "amdgcn-amd-amdhsa--gfx900", &data,
                               &size),
              KPACK_ERROR_KERNEL_NOT_FOUND);
    CHECK(data == (void*)0x1 && size == 77);

    /* Pointers stay stable until close. */
    const char* again = NULL;
    CHECK_ERR(kpack_get_binary(a, 0, &again), KPACK_SUCCESS);
    CHECK(again == b0);
    CHECK_ERR(kpack_get_binary(a, 1, &again), KPACK_SUCCESS);
    CHECK(again == b1 && strcmp(b1, "lib/libtest.so#0") == 0);
    kpack_close(a);

    /* test_zstd.kpack */
    CHECK_ERR(kpack_open(zstd_path, &a), KPACK_SUCCESS);
    CHECK_ERR(kpack_get_architecture_count(a, &n), KPACK_SUCCESS);
    CHECK(n == 2);
    CHECK_ERR(kpack_get_architecture(a, 0, &s), KPACK_SUCCESS);
    CHECK(strcmp(s, "gfx1100") == 0);
    CHECK_ERR(kpack_get_architecture(a, 1, &s), KPACK_SUCCESS);
    CHECK(strcmp(s, "gfx1101") == 0);
    CHECK_ERR(kpack_get_binary_count(a, &n), KPACK_SUCCESS);
    CHECK(n == 2);
    CHECK_ERR(kpack_get_binary(a, 0, &s), KPACK_SUCCESS);
    CHECK(strcmp(s, "bin/hiptest#0") == 0);
    CHECK_ERR(kpack_get_binary(a, 1, &s), KPACK_SUCCESS);
    CHECK(strcmp(s, "lib/libhip.so#0") == 0);
    {
        size_t t = strlen("HIP_KERNEL_GFX1100_");
        want_size = t + 1000;
        want = malloc(want_size);
        memcpy(want, "HIP_KERNEL_GFX1100_", t);
        memset(want + t, 'A', 500);
        memset(want + t + 500, 'B', 500);
        CHECK(want_size == 1019);
        expect_kernel(a, "lib/libhip.so#0", "gfx1100", want, want_size);
        free(want);
        t = strlen("HIP_KERNEL_GFX1101_");
        want_size = t + 600;
        want = malloc(want_size);
        memcpy(want, "HIP_KERNEL_GFX1101_", t);
        memset(want + t, 'X', 300);
        memset(want + t + 300, 'Y', 300);
        expect_kernel(a, "lib/libhip.so#0", "gfx1101", want, want_size);
        free(want);
    }
    want = pattern("TEST_APP_KERNEL___", 0x42, 1000, &want_size);
    CHECK(want_size == 1018);
    expect_kernel(a, "bin/hiptest#0", "gfx1100", want, want_size);
    free(want);
    /* Two buffers of the same kernel are independent. */
    void* k1 = NULL;
    void* k2 = NULL;
    size_t z1 = 0, z2 = 0;
    CHECK_ERR(kpack_get_kernel(a, "bin/hiptest#0", "gfx1100", &k1, &z1), KPACK_SUCCESS);
    CHECK_ERR(kpack_get_kernel(a, "bin/hiptest#0", "gfx1100", &k2, &z2), KPACK_SUCCESS);
    CHECK(k1 != k2 && z1 == z2 && memcmp(k1, k2, z1) == 0);
    ((unsigned char*)k1)[0] = 0;
    CHECK(((unsigned char*)k2)[0] == 'T');
    free(k1); /* plain free() releases them */
    kpack_free_kernel(k2);
    kpack_free_kernel(NULL);
    kpack_close(a);

    /* kpack_enumerate_architectures */
    int count = 0;
    CHECK_ERR(kpack_enumerate_architectures(zstd_path, count_arches, &count), KPACK_SUCCESS);
    CHECK(count == 2);
    count = 0;
    CHECK_ERR(kpack_enumerate_architectures(zstd_path, stop_after_one, &count), KPACK_SUCCESS);
    CHECK(count == 1);
    CHECK_ERR(kpack_enumerate_architectures(NULL, count_arches, &count),
              KPACK_ERROR_INVALID_ARGUMENT);
    CHECK_ERR(kpack_enumerate_architectures(zstd_path, NULL, &count),
              KPACK_ERROR_INVALID_ARGUMENT);
    CHECK_ERR(kpack_enumerate_architectures("/nonexistent/x.kpack", count_arches, &count),
              KPACK_ERROR_FILE_NOT_FOUND);

    free(noop_path);
    free(zstd_path);
}

static void test_archive_errors(const char* fixtures, const char* work) {
    char* zstd_path = join(fixtures, "test_zstd.kpack");
    kpack_archive_t a = (kpack_archive_t)0x1;
    size_t n = 0;
    const char* s = NULL;
    void* data = NULL;
    size_t size = 0;

    /* NULL arguments. */
    CHECK_ERR(kpack_open(NULL, &a), KPACK_ERROR_INVALID_ARGUMENT);
    CHECK_ERR(kpack_open(zstd_path, NULL), KPACK_ERROR_INVALID_ARGUMENT);
    CHECK(a == (kpack_archive_t)0x1);
    kpack_close(NULL);
    CHECK_ERR(kpack_get_architecture_count(NULL, &n), KPACK_ERROR_INVALID_ARGUMENT);
    CHECK_ERR(kpack_get_architecture(NULL, 0, &s), KPACK_ERROR_INVALID_ARGUMENT);
    CHECK_ERR(kpack_get_binary_count(NULL, &n), KPACK_ERROR_INVALID_ARGUMENT);
    CHECK_ERR(kpack_get_binary(NULL, 0, &s), KPACK_ERROR_INVALID_ARGUMENT);
    CHECK_ERR(kpack_get_kernel(NULL, "bin/hiptest#0", "gfx1100", &data, &size),
              KPACK_ERROR_INVALID_ARGUMENT);

    CHECK_ERR(kpack_open(zstd_path, &a), KPACK_SUCCESS);
    CHECK_ERR(kpack_get_architecture_count(a, NULL), KPACK_ERROR_INVALID_ARGUMENT);
    CHECK_ERR(kpack_get_architecture(a, 0, NULL), KPACK_ERROR_INVALID_ARGUMENT);
    CHECK_ERR(kpack_get_binary_count(a, NULL), KPACK_ERROR_INVALID_ARGUMENT);
    CHECK_ERR(kpack_get_binary(a, 0, NULL), KPACK_ERROR_INVALID_ARGUMENT);
    CHECK_ERR(kpack_get_kernel(a, NULL, "gfx1100", &data, &size), KPACK_ERROR_INVALID_ARGUMENT);
    CHECK_ERR(kpack_get_kernel(a, "bin/hiptest#0", NULL, &data, &size),
              KPACK_ERROR_INVALID_ARGUMENT);
    CHECK_ERR(kpack_get_kernel(a, "bin/hiptest#0", "gfx1100", NULL, &size),
              KPACK_ERROR_INVALID_ARGUMENT);
    CHECK_ERR(kpack_get_kernel(a, "bin/hiptest#0", "gfx1100", &data, NULL),
              KPACK_ERROR_INVALID_ARGUMENT);
    CHECK(data == NULL && size == 0);
    CHECK_ERR(kpack_get_kernel(a, "\xff\xfe", "gfx1100", &data, &size),
              KPACK_ERROR_KERNEL_NOT_FOUND);
    kpack_close(a);

    /* Files that are not (usable) archives; made by the Rust test. */
    struct {
        const char* name;
        kpack_error_t want;
    } cases[] = {
        {"missing.kpack", KPACK_ERROR_FILE_NOT_FOUND},
        {"bad_magic.kpack", KPACK_ERROR_INVALID_FORMAT},
        {"short.kpack", KPACK_ERROR_INVALID_FORMAT},
        {"bad_version.kpack", KPACK_ERROR_UNSUPPORTED_VERSION},
        {"toc_past_end.kpack", KPACK_ERROR_INVALID_FORMAT},
        {"bad_toc.kpack", KPACK_ERROR_MSGPACK_PARSE_FAILED},
        {"toc_not_a_map.kpack", KPACK_ERROR_INVALID_FORMAT},
        {"unknown_scheme.kpack", KPACK_ERROR_INVALID_FORMAT},
        {"a_directory.kpack", KPACK_ERROR_IO_ERROR},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char* p = join(work, cases[i].name);
        a = (kpack_archive_t)0x1;
        kpack_error_t e = kpack_open(p, &a);
        if (e != cases[i].want) {
            fprintf(stderr, "kpack_open(%s) = %d, expected %d\n", cases[i].name, (int)e,
                    (int)cases[i].want);
            failures++;
        }
        CHECK(a == (kpack_archive_t)0x1);
        int count = 0;
        CHECK_ERR(kpack_enumerate_architectures(p, count_arches, &count), cases[i].want);
        CHECK(count == 0);
        free(p);
    }

    /* A damaged zstd frame: the archive opens, that kernel fails, the
     * others still read. */
    char* corrupt = join(work, "corrupt_zstd.kpack");
    CHECK_ERR(kpack_open(corrupt, &a), KPACK_SUCCESS);
    data = (void*)0x1;
    CHECK_ERR(kpack_get_kernel(a, "lib/libhip.so#0", "gfx1100", &data, &size),
              KPACK_ERROR_DECOMPRESSION_FAILED);
    CHECK(data == (void*)0x1);
    CHECK_ERR(kpack_get_kernel(a, "bin/hiptest#0", "gfx1100", &data, &size), KPACK_SUCCESS);
    CHECK(size == 1018);
    kpack_free_kernel(data);
    kpack_close(a);
    free(corrupt);
    free(zstd_path);
}

/* Out of memory: run by the Rust test under `ulimit -v`. */
static int cmd_oom(const char* archive, const char* meta_path, const char* binary) {
    kpack_archive_t a = NULL;
    void* data = (void*)0x1;
    size_t size = 5;
    CHECK_ERR(kpack_open(archive, &a), KPACK_SUCCESS);
    CHECK_ERR(kpack_get_kernel(a, "k#0", "gfx1100", &data, &size), KPACK_ERROR_OUT_OF_MEMORY);
    CHECK(data == (void*)0x1 && size == 5);
    kpack_close(a);

    size_t meta_size = 0;
    unsigned char* meta = read_file(meta_path, &meta_size);
    kpack_cache_t c = NULL;
    const char* archs[] = {"gfx1100"};
    CHECK_ERR(kpack_cache_create(&c), KPACK_SUCCESS);
    CHECK_ERR(kpack_load_code_object(c, meta, binary, 0, archs, 1, &data, &size),
              KPACK_ERROR_OUT_OF_MEMORY);
    kpack_cache_destroy(c);
    free(meta);
    return 0;
}

static int cmd_load(int argc, char** argv) {
    /* load META BINARY CO_INDEX OUT ARCH... */
    if (argc < 7) return 2;
    size_t meta_size = 0;
    unsigned char* meta = read_file(argv[2], &meta_size);
    kpack_cache_t cache = NULL;
    CHECK_ERR(kpack_cache_create(&cache), KPACK_SUCCESS);
    void* code = NULL;
    size_t size = 0;
    kpack_error_t e = kpack_load_code_object(cache, meta, argv[3], (uint32_t)atoi(argv[4]),
                                             (const char* const*)(argv + 6), (size_t)(argc - 6),
                                             &code, &size);
    printf("code=%d size=%zu\n", (int)e, size);
    if (e == KPACK_SUCCESS) {
        FILE* f = fopen(argv[5], "wb");
        CHECK(f != NULL && fwrite(code, 1, size, f) == size);
        fclose(f);
        kpack_free_code_object(code);
    } else {
        CHECK(code == NULL && size == 0);
    }
    kpack_cache_destroy(cache);
    free(meta);
    return 0;
}

static int cmd_loader(const char* meta_path, const char* binary, const char* work) {
    size_t meta_size = 0;
    unsigned char* meta = read_file(meta_path, &meta_size);
    const char* archs[] = {"amdgcn-amd-amdhsa--gfx1100", "gfx1101"};
    const char* with_null[] = {"gfx1100", NULL};
    void* code = (void*)0x1;
    size_t size = 3;
    kpack_cache_t c = NULL;

    CHECK_ERR(kpack_cache_create(NULL), KPACK_ERROR_INVALID_ARGUMENT);
    CHECK_ERR(kpack_cache_create(&c), KPACK_SUCCESS);
    CHECK(c != NULL);
    CHECK_ERR(kpack_load_code_object(NULL, meta, binary, 0, archs, 2, &code, &size),
              KPACK_ERROR_INVALID_ARGUMENT);
    CHECK_ERR(kpack_load_code_object(c, NULL, binary, 0, archs, 2, &code, &size),
              KPACK_ERROR_INVALID_ARGUMENT);
    CHECK_ERR(kpack_load_code_object(c, meta, NULL, 0, archs, 2, &code, &size),
              KPACK_ERROR_INVALID_ARGUMENT);
    CHECK_ERR(kpack_load_code_object(c, meta, binary, 0, NULL, 2, &code, &size),
              KPACK_ERROR_INVALID_ARGUMENT);
    CHECK_ERR(kpack_load_code_object(c, meta, binary, 0, archs, 0, &code, &size),
              KPACK_ERROR_INVALID_ARGUMENT);
    CHECK_ERR(kpack_load_code_object(c, meta, binary, 0, archs, 2, NULL, &size),
              KPACK_ERROR_INVALID_ARGUMENT);
    CHECK_ERR(kpack_load_code_object(c, meta, binary, 0, archs, 2, &code, NULL),
              KPACK_ERROR_INVALID_ARGUMENT);
    CHECK_ERR(kpack_load_code_object(c, meta, binary, 0, with_null, 2, &code, &size),
              KPACK_ERROR_INVALID_ARGUMENT);
    CHECK(code == (void*)0x1 && size == 3);

    /* Success, then each failure the loader reports. */
    CHECK_ERR(kpack_load_code_object(c, meta, binary, 0, archs, 2, &code, &size), KPACK_SUCCESS);
    CHECK(size > 0 && memcmp(code, "co 0 gfx1100", 12) == 0);
    kpack_free_code_object(code);
    kpack_free_code_object(NULL);
    code = (void*)0x1;
    CHECK_ERR(kpack_load_code_object(c, meta, binary, 1, archs, 2, &code, &size), KPACK_SUCCESS);
    CHECK(memcmp(code, "co 1 gfx1101", 12) == 0); /* second choice */
    free(code);
    code = (void*)0x1;
    size = 3;
    CHECK_ERR(kpack_load_code_object(c, meta, binary, 9, archs, 2, &code, &size),
              KPACK_ERROR_KERNEL_NOT_FOUND);
    const char* other[] = {"gfx90a"};
    CHECK_ERR(kpack_load_code_object(c, meta, binary, 0, other, 1, &code, &size),
              KPACK_ERROR_ARCH_NOT_FOUND);
    /* Reading a damaged code object: DECOMPRESSION_FAILED. */
    CHECK_ERR(kpack_load_code_object(c, meta, binary, 2, archs, 2, &code, &size),
              KPACK_ERROR_DECOMPRESSION_FAILED);
    CHECK(code == (void*)0x1 && size == 3);

    /* Metadata that is not valid. */
    const unsigned char junk[] = {0xc1};
    const unsigned char not_map[] = {0x91, 0xa1, 'x'};
    const unsigned char no_paths[] = {0x82, 0xab, 'k', 'e', 'r', 'n', 'e', 'l', '_', 'n', 'a',
                                      'm', 'e', 0xa1, 'k', 0xb2, 'k', 'p', 'a', 'c', 'k', '_',
                                      's', 'e', 'a', 'r', 'c', 'h', '_', 'p', 'a', 't', 'h',
                                      's', 0x90};
    CHECK_ERR(kpack_load_code_object(c, junk, binary, 0, archs, 2, &code, &size),
              KPACK_ERROR_INVALID_METADATA);
    CHECK_ERR(kpack_load_code_object(c, not_map, binary, 0, archs, 2, &code, &size),
              KPACK_ERROR_INVALID_METADATA);
    CHECK_ERR(kpack_load_code_object(c, no_paths, binary, 0, archs, 2, &code, &size),
              KPACK_ERROR_INVALID_METADATA);
    /* A binary elsewhere: its relative search paths find nothing. */
    char* elsewhere = join(work, "no/such/dir/bin");
    CHECK_ERR(kpack_load_code_object(c, meta, elsewhere, 0, archs, 2, &code, &size),
              KPACK_ERROR_ARCHIVE_NOT_FOUND);
    CHECK(code == (void*)0x1 && size == 3);
    free(elsewhere);
    kpack_cache_destroy(c);
    kpack_cache_destroy(NULL);
    free(meta);
    return 0;
}

struct thread_job {
    kpack_cache_t cache;
    const unsigned char* meta;
    const char* binary;
    const char* arch;
    unsigned char** expected;
    size_t* expected_size;
    int count;
    int loads;
    int seed;
    int errors;
};

static void* thread_main(void* p) {
    struct thread_job* j = p;
    const char* archs[] = {j->arch};
    for (int i = 0; i < j->loads; i++) {
        int co = (j->seed + i) % j->count;
        void* code = NULL;
        size_t size = 0;
        kpack_error_t e = kpack_load_code_object(j->cache, j->meta, j->binary, (uint32_t)co,
                                                 archs, 1, &code, &size);
        if (e != KPACK_SUCCESS || size != j->expected_size[co] ||
            memcmp(code, j->expected[co], size) != 0) {
            j->errors++;
        }
        kpack_free_code_object(code);
    }
    return NULL;
}

static int cmd_threads(char** argv) {
    /* threads META BINARY ARCH COUNT EXPECTED_DIR THREADS LOADS WARM */
    size_t meta_size = 0;
    unsigned char* meta = read_file(argv[2], &meta_size);
    int count = atoi(argv[5]);
    int nthreads = atoi(argv[7]);
    int loads = atoi(argv[8]);
    unsigned char** expected = calloc((size_t)count, sizeof *expected);
    size_t* expected_size = calloc((size_t)count, sizeof *expected_size);
    for (int i = 0; i < count; i++) {
        char name[32];
        snprintf(name, sizeof name, "%d.bin", i);
        char* p = join(argv[6], name);
        expected[i] = read_file(p, &expected_size[i]);
        free(p);
    }
    kpack_cache_t cache = NULL;
    CHECK_ERR(kpack_cache_create(&cache), KPACK_SUCCESS);
    if (atoi(argv[9]) != 0) {
        /* Open the archive before the threads start. For helgrind/drd:
         * Rust's locks are futex-based, invisible to them, so the one-time
         * writes of the first load would look like races. */
        struct thread_job warm = {cache, meta,  argv[3], argv[4], expected, expected_size,
                                  count, count, 0,       0};
        thread_main(&warm);
        CHECK(warm.errors == 0);
    }
    pthread_t* threads = calloc((size_t)nthreads, sizeof *threads);
    struct thread_job* jobs = calloc((size_t)nthreads, sizeof *jobs);
    for (int t = 0; t < nthreads; t++) {
        jobs[t] = (struct thread_job){cache, meta,  argv[3], argv[4], expected, expected_size,
                                      count, loads, t * 7,   0};
        CHECK(pthread_create(&threads[t], NULL, thread_main, &jobs[t]) == 0);
    }
    int errors = 0;
    for (int t = 0; t < nthreads; t++) {
        pthread_join(threads[t], NULL);
        errors += jobs[t].errors;
    }
    printf("threads=%d loads=%d errors=%d\n", nthreads, loads, errors);
    CHECK(errors == 0);
    kpack_cache_destroy(cache);
    for (int i = 0; i < count; i++) free(expected[i]);
    free(expected);
    free(expected_size);
    free(threads);
    free(jobs);
    free(meta);
    return 0;
}

static int cmd_discover(const char* lib, int delete_it) {
    void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen %s: %s\n", lib, dlerror());
        return 2;
    }
    if (delete_it) CHECK(unlink(lib) == 0);
    const void* datum = dlsym(h, "kpack_test_datum");
    CHECK(datum != NULL);
    char path[4096];
    size_t offset = 0;
    CHECK_ERR(kpack_discover_binary_path(datum, path, sizeof path, &offset), KPACK_SUCCESS);
    printf("path=%s\noffset=%zu\n", path, offset);
    CHECK_ERR(kpack_discover_binary_path(datum, path, sizeof path, NULL), KPACK_SUCCESS);
    /* Exactly big enough, and one byte short. */
    size_t len = strlen(path);
    char* exact = malloc(len + 1);
    CHECK_ERR(kpack_discover_binary_path(datum, exact, len + 1, NULL), KPACK_SUCCESS);
    CHECK(strcmp(exact, path) == 0);
    memset(exact, 'Z', len + 1);
    CHECK_ERR(kpack_discover_binary_path(datum, exact, len, NULL), KPACK_ERROR_INVALID_ARGUMENT);
    CHECK(exact[0] == 'Z');
    free(exact);
    CHECK_ERR(kpack_discover_binary_path(NULL, path, sizeof path, NULL),
              KPACK_ERROR_INVALID_ARGUMENT);
    CHECK_ERR(kpack_discover_binary_path(datum, NULL, sizeof path, NULL),
              KPACK_ERROR_INVALID_ARGUMENT);
    CHECK_ERR(kpack_discover_binary_path(datum, path, 0, NULL), KPACK_ERROR_INVALID_ARGUMENT);
    /* The stack and the heap are not files. */
    int local = 0;
    offset = 99;
    CHECK_ERR(kpack_discover_binary_path(&local, path, sizeof path, &offset),
              KPACK_ERROR_PATH_DISCOVERY_FAILED);
    CHECK(offset == 99);
    /* This program's own data is. */
    static const char self_marker[] = "kpack self marker";
    CHECK_ERR(kpack_discover_binary_path(self_marker, path, sizeof path, NULL), KPACK_SUCCESS);
    printf("self=%s\n", path);
    dlclose(h);
    return 0;
}

int main(int argc, char** argv) {
    if (argc < 2) return 2;
    const char* cmd = argv[1];
    int rc;
    if (strcmp(cmd, "archive") == 0 && argc == 4) {
        test_reference_archives(argv[2]);
        test_archive_errors(argv[2], argv[3]);
        rc = 0;
    } else if (strcmp(cmd, "load") == 0) {
        rc = cmd_load(argc, argv);
    } else if (strcmp(cmd, "loader") == 0 && argc == 5) {
        rc = cmd_loader(argv[2], argv[3], argv[4]);
    } else if (strcmp(cmd, "threads") == 0 && argc == 10) {
        rc = cmd_threads(argv);
    } else if (strcmp(cmd, "discover") == 0 && argc == 4) {
        rc = cmd_discover(argv[2], atoi(argv[3]));
    } else if (strcmp(cmd, "oom") == 0 && argc == 5) {
        rc = cmd_oom(argv[2], argv[3], argv[4]);
    } else {
        fprintf(stderr, "bad command line\n");
        return 2;
    }
    if (rc != 0) return rc;
    if (failures != 0) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("PASS\n");
    return 0;
}
