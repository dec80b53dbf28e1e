/* Latency of the C API, driven by kpack-cxx/tests/bench.rs:
 *   bench ARCHIVE META BINARY ARCH KEY ITERATIONS
 * Prints the median of ITERATIONS runs for: kpack_open+kpack_close, a cold
 * load (kpack_cache_create + kpack_load_code_object + kpack_cache_destroy),
 * a warm load (kpack_load_code_object on a cache that has the archive
 * open) and kpack_get_kernel. */
#define _POSIX_C_SOURCE 200809L
#include <rocm_kpack/kpack.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}

static double median(double* v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp);
    return v[n / 2];
}

static unsigned char* read_file(const char* path) {
    FILE* f = fopen(path, "rb");
    if (!f) exit(2);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char* b = malloc((size_t)n);
    if (fread(b, 1, (size_t)n, f) != (size_t)n) exit(2);
    fclose(f);
    return b;
}

static void fail(const char* what, kpack_error_t e) {
    fprintf(stderr, "%s failed: %d\n", what, (int)e);
    exit(1);
}

int main(int argc, char** argv) {
    if (argc != 7) return 2;
    const char* archive = argv[1];
    unsigned char* meta = read_file(argv[2]);
    const char* binary = argv[3];
    const char* archs[] = {argv[4]};
    const char* key = argv[5];
    int n = atoi(argv[6]);
    double* t = calloc((size_t)n, sizeof *t);
    void* co = NULL;
    size_t size = 0;
    kpack_error_t e;

    for (int i = 0; i < n; i++) {
        kpack_archive_t a = NULL;
        double t0 = now_us();
        if ((e = kpack_open(archive, &a)) != KPACK_SUCCESS) fail("kpack_open", e);
        kpack_close(a);
        t[i] = now_us() - t0;
    }
    printf("open+close: %.1f us\n", median(t, n));

    for (int i = 0; i < n; i++) {
        kpack_cache_t c = NULL;
        double t0 = now_us();
        if ((e = kpack_cache_create(&c)) != KPACK_SUCCESS) fail("kpack_cache_create", e);
        e = kpack_load_code_object(c, meta, binary, 0, archs, 1, &co, &size);
        if (e != KPACK_SUCCESS) fail("kpack_load_code_object", e);
        kpack_free_code_object(co);
        kpack_cache_destroy(c);
        t[i] = now_us() - t0;
    }
    printf("cold load (create+load+destroy): %.1f us, %zu bytes\n", median(t, n), size);

    kpack_cache_t c = NULL;
    kpack_cache_create(&c);
    kpack_load_code_object(c, meta, binary, 0, archs, 1, &co, &size);
    kpack_free_code_object(co);
    for (int i = 0; i < n; i++) {
        double t0 = now_us();
        e = kpack_load_code_object(c, meta, binary, 0, archs, 1, &co, &size);
        if (e != KPACK_SUCCESS) fail("kpack_load_code_object", e);
        kpack_free_code_object(co);
        t[i] = now_us() - t0;
    }
    printf("warm load: %.1f us\n", median(t, n));
    kpack_cache_destroy(c);

    kpack_archive_t a = NULL;
    kpack_open(archive, &a);
    const char* arch = NULL;
    kpack_get_architecture(a, 0, &arch);
    for (int i = 0; i < n; i++) {
        double t0 = now_us();
        e = kpack_get_kernel(a, key, arch, &co, &size);
        if (e != KPACK_SUCCESS) fail("kpack_get_kernel", e);
        kpack_free_kernel(co);
        t[i] = now_us() - t0;
    }
    printf("kpack_get_kernel: %.1f us\n", median(t, n));
    kpack_close(a);
    free(t);
    free(meta);
    return 0;
}
