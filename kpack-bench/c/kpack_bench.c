/* The runtime section of `cargo xtask bench`
 * (kpack-bench/src/sections/runtime.rs): what users of librocm_kpack get,
 * measured through the C API, linked against the release static library.
 *
 *   kpack_bench latency ARCHIVE META BINARY ARCH CO_INDEX ITERATIONS
 *       kpack_open+kpack_close of ARCHIVE; cold load (kpack_cache_create +
 *       kpack_load_code_object + kpack_cache_destroy) and warm load
 *       (kpack_load_code_object on a cache that has the archive open) of
 *       code object CO_INDEX for agent ARCH, through the HIPK metadata in
 *       the file META (its search paths name the archive(s)).
 *   kpack_bench get-all ITERATIONS ARCHIVE...
 *       kpack_get_kernel of every (binary, architecture) of every ARCHIVE
 *       (opened once): ITERATIONS passes.
 *   kpack_bench memory META BINARY ARCH CO_INDEX
 *       VmRSS/VmHWM of this process (/proc/self/status) after one cold
 *       load, the code object still held.
 *
 * Output: one line per figure, `name median p10 p90 min max n [bytes]`,
 * times in microseconds (memory: kB). Exit 1 on a kpack error. */
#define _POSIX_C_SOURCE 200809L
#include <rocm_kpack/kpack.h>

#include <stdint.h>
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

/* Print the distribution of n samples (sorts them). */
static void report(const char* name, double* v, int n, size_t bytes) {
    qsort(v, (size_t)n, sizeof *v, cmp);
    printf("%s %.3f %.3f %.3f %.3f %.3f %d %zu\n", name, v[n / 2], v[n / 10],
           v[n - 1 - n / 10], v[0], v[n - 1], n, bytes);
}

static unsigned char* read_file(const char* path) {
    FILE* f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char* b = malloc((size_t)n);
    if (!b || fread(b, 1, (size_t)n, f) != (size_t)n) exit(2);
    fclose(f);
    return b;
}

static void check(const char* what, kpack_error_t e) {
    if (e != KPACK_SUCCESS) {
        fprintf(stderr, "%s failed: %d\n", what, (int)e);
        exit(1);
    }
}

static int latency(int argc, char** argv) {
    if (argc != 8) return 2;
    const char* archive = argv[2];
    unsigned char* meta = read_file(argv[3]);
    const char* binary = argv[4];
    const char* archs[] = {argv[5]};
    uint32_t co_index = (uint32_t)strtoul(argv[6], NULL, 10);
    int n = atoi(argv[7]);
    if (n < 1) return 2;
    double* t = calloc((size_t)n, sizeof *t);
    void* co = NULL;
    size_t size = 0;

    for (int i = 0; i < n; i++) {
        kpack_archive_t a = NULL;
        double t0 = now_us();
        check("kpack_open", kpack_open(archive, &a));
        kpack_close(a);
        t[i] = now_us() - t0;
    }
    report("open_close", t, n, 0);

    for (int i = 0; i < n; i++) {
        kpack_cache_t c = NULL;
        double t0 = now_us();
        check("kpack_cache_create", kpack_cache_create(&c));
        check("kpack_load_code_object",
              kpack_load_code_object(c, meta, binary, co_index, archs, 1, &co, &size));
        kpack_free_code_object(co);
        kpack_cache_destroy(c);
        t[i] = now_us() - t0;
    }
    report("cold_load", t, n, size);

    kpack_cache_t c = NULL;
    check("kpack_cache_create", kpack_cache_create(&c));
    check("kpack_load_code_object",
          kpack_load_code_object(c, meta, binary, co_index, archs, 1, &co, &size));
    kpack_free_code_object(co);
    for (int i = 0; i < n; i++) {
        double t0 = now_us();
        check("kpack_load_code_object",
              kpack_load_code_object(c, meta, binary, co_index, archs, 1, &co, &size));
        kpack_free_code_object(co);
        t[i] = now_us() - t0;
    }
    report("warm_load", t, n, size);
    kpack_cache_destroy(c);
    free(t);
    free(meta);
    return 0;
}

static int get_all(int argc, char** argv) {
    if (argc < 4) return 2;
    int passes = atoi(argv[2]);
    int archives = argc - 3;
    if (passes < 1) return 2;
    kpack_archive_t* a = calloc((size_t)archives, sizeof *a);
    size_t kernels = 0;
    for (int i = 0; i < archives; i++) {
        check("kpack_open", kpack_open(argv[3 + i], &a[i]));
        size_t nb = 0, na = 0;
        kpack_get_binary_count(a[i], &nb);
        kpack_get_architecture_count(a[i], &na);
        kernels += nb * na;
    }
    double* pass = calloc((size_t)passes, sizeof *pass);
    double* call = calloc(kernels * (size_t)passes, sizeof *call);
    size_t calls = 0, bytes = 0;
    for (int p = 0; p < passes; p++) {
        double p0 = now_us();
        bytes = 0;
        for (int i = 0; i < archives; i++) {
            size_t nb = 0, na = 0;
            kpack_get_binary_count(a[i], &nb);
            kpack_get_architecture_count(a[i], &na);
            for (size_t b = 0; b < nb; b++) {
                const char* key = NULL;
                check("kpack_get_binary", kpack_get_binary(a[i], b, &key));
                for (size_t r = 0; r < na; r++) {
                    const char* arch = NULL;
                    check("kpack_get_architecture", kpack_get_architecture(a[i], r, &arch));
                    void* data = NULL;
                    size_t size = 0;
                    double t0 = now_us();
                    kpack_error_t e = kpack_get_kernel(a[i], key, arch, &data, &size);
                    if (e == KPACK_ERROR_KERNEL_NOT_FOUND) continue;
                    check("kpack_get_kernel", e);
                    kpack_free_kernel(data);
                    call[calls++] = now_us() - t0;
                    bytes += size;
                }
            }
        }
        pass[p] = now_us() - p0;
    }
    report("get_kernel_all", pass, passes, bytes);
    report("get_kernel_each", call, (int)calls, calls / (size_t)passes);
    for (int i = 0; i < archives; i++) kpack_close(a[i]);
    free(a);
    free(pass);
    free(call);
    return 0;
}

/* A field of /proc/self/status, in kB. */
static long status_kb(const char* field) {
    FILE* f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    size_t n = strlen(field);
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, field, n) == 0 && line[n] == ':') {
            v = strtol(line + n + 1, NULL, 10);
            break;
        }
    }
    if (f) fclose(f);
    return v;
}

static int memory(int argc, char** argv) {
    if (argc != 6) return 2;
    unsigned char* meta = read_file(argv[2]);
    const char* binary = argv[3];
    const char* archs[] = {argv[4]};
    uint32_t co_index = (uint32_t)strtoul(argv[5], NULL, 10);
    long rss0 = status_kb("VmRSS");
    kpack_cache_t c = NULL;
    check("kpack_cache_create", kpack_cache_create(&c));
    void* co = NULL;
    size_t size = 0;
    check("kpack_load_code_object",
          kpack_load_code_object(c, meta, binary, co_index, archs, 1, &co, &size));
    /* The code object is still held: it is what the caller uses next. */
    long rss = status_kb("VmRSS"), hwm = status_kb("VmHWM");
    printf("rss_before_kb %ld\nrss_kb %ld\nhwm_kb %ld\nsize %zu\n", rss0, rss, hwm, size);
    kpack_free_code_object(co);
    kpack_cache_destroy(c);
    free(meta);
    return 0;
}

int main(int argc, char** argv) {
    if (argc >= 2 && strcmp(argv[1], "latency") == 0) return latency(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "get-all") == 0) return get_all(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "memory") == 0) return memory(argc, argv);
    fprintf(stderr, "usage: kpack_bench latency|get-all|memory ...\n");
    return 2;
}
