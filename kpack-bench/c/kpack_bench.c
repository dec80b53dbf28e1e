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
 *   kpack_bench floor FRAME SIZE ITERATIONS
 *       the floor of a load: the system's libzstd (libzstd.so.1, opened
 *       with dlopen: no headers needed) decompressing the zstd frame in the
 *       file FRAME (SIZE bytes of content) into one reused buffer with one
 *       reused context, in this process.
 *   kpack_bench hold META BINARY ARCH CO_INDEX
 *       load one code object, read every byte of it (as a GPU loader
 *       would), print `held ADDRESS SIZE` and keep it until standard input
 *       closes: the bench reads this process's PSS meanwhile.
 *
 * latency takes optional last arguments: `touch`, then also
 * `warm_load_touch`, a warm load followed by reading every page of the
 * code object (what a zero-copy load defers to its first reader); and
 * `frame=FILE`, then each warm load is followed by the floor's
 * decompression of FILE (the same code object's frame) by the system's
 * libzstd, `warm_floor`: the two interleaved in one process, so that the
 * machine's noise falls on both alike.
 *
 * Output: one line per figure, `name median p10 p90 min max n [bytes]`,
 * times in microseconds (memory: kB). Exit 1 on a kpack error. */
#define _POSIX_C_SOURCE 200809L
#include <rocm_kpack/kpack.h>

#include <dlfcn.h>
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

/* Read one byte of every page of `p` (and the last byte). */
static unsigned touch(const void* p, size_t size) {
    const volatile unsigned char* b = p;
    unsigned sum = 0;
    for (size_t i = 0; i < size; i += 4096) sum += b[i];
    if (size > 0) sum += b[size - 1];
    return sum;
}

/* The few functions of the system's libzstd the floor needs. */
typedef void* (*create_dctx_fn)(void);
typedef size_t (*decompress_dctx_fn)(void*, void*, size_t, const void*, size_t);
typedef unsigned (*is_error_fn)(size_t);
typedef const char* (*version_fn)(void);

/* The system's libzstd decompressing one frame into a reused buffer. */
struct floor {
    decompress_dctx_fn decompress;
    is_error_fn is_error;
    version_fn version;
    void* dctx;
    unsigned char* frame;
    size_t frame_size;
    unsigned char* out;
    size_t size;
};

static int floor_open(struct floor* f, const char* frame_path, size_t size) {
    FILE* file = fopen(frame_path, "rb");
    if (!file) return 2;
    fseek(file, 0, SEEK_END);
    f->frame_size = (size_t)ftell(file);
    fclose(file);
    f->frame = read_file(frame_path);
    void* lib = dlopen("libzstd.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "cannot load libzstd.so.1: %s\n", dlerror());
        return 3;
    }
    create_dctx_fn create = (create_dctx_fn)dlsym(lib, "ZSTD_createDCtx");
    f->decompress = (decompress_dctx_fn)dlsym(lib, "ZSTD_decompressDCtx");
    f->is_error = (is_error_fn)dlsym(lib, "ZSTD_isError");
    f->version = (version_fn)dlsym(lib, "ZSTD_versionString");
    if (!create || !f->decompress || !f->is_error || !f->version) return 3;
    f->dctx = create();
    f->size = size;
    f->out = malloc(size ? size : 1);
    return 0;
}

/* One decompression; exits on failure. */
static void floor_run(struct floor* f) {
    size_t r = f->decompress(f->dctx, f->out, f->size, f->frame, f->frame_size);
    if (f->is_error(r) || r != f->size) {
        fprintf(stderr, "libzstd: decompression failed\n");
        exit(1);
    }
}

static int latency(int argc, char** argv) {
    if (argc < 8 || argc > 10) return 2;
    int with_touch = 0;
    const char* frame = NULL;
    for (int a = 8; a < argc; a++) {
        if (strcmp(argv[a], "touch") == 0) with_touch = 1;
        if (strncmp(argv[a], "frame=", 6) == 0) frame = argv[a] + 6;
    }
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
    struct floor fl;
    double* tf = calloc((size_t)n, sizeof *tf);
    if (frame) {
        if (floor_open(&fl, frame, size) != 0) return 3;
        floor_run(&fl);
    }
    for (int i = 0; i < n; i++) {
        double t0 = now_us();
        check("kpack_load_code_object",
              kpack_load_code_object(c, meta, binary, co_index, archs, 1, &co, &size));
        kpack_free_code_object(co);
        t[i] = now_us() - t0;
        if (frame) {
            t0 = now_us();
            floor_run(&fl);
            tf[i] = now_us() - t0;
        }
    }
    report("warm_load", t, n, size);
    if (frame) {
        report("warm_floor", tf, n, size);
        free(fl.out);
        free(fl.frame);
    }
    free(tf);
    if (with_touch) {
        unsigned sum = 0;
        for (int i = 0; i < n; i++) {
            double t0 = now_us();
            check("kpack_load_code_object",
                  kpack_load_code_object(c, meta, binary, co_index, archs, 1, &co, &size));
            sum += touch(co, size);
            kpack_free_code_object(co);
            t[i] = now_us() - t0;
        }
        report("warm_load_touch", t, n, size);
        if (sum == 1) fprintf(stderr, " ");
    }
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

static int floor_(int argc, char** argv) {
    if (argc != 5) return 2;
    size_t size = (size_t)strtoull(argv[3], NULL, 10);
    int n = atoi(argv[4]);
    struct floor fl;
    if (n < 1 || floor_open(&fl, argv[2], size) != 0) return 3;
    double* t = calloc((size_t)n, sizeof *t);
    for (int i = 0; i < n; i++) {
        double t0 = now_us();
        floor_run(&fl);
        t[i] = now_us() - t0;
    }
    report("libzstd_floor", t, n, size);
    printf("libzstd_version %s\n", fl.version());
    free(t);
    free(fl.out);
    free(fl.frame);
    return 0;
}

static int hold(int argc, char** argv) {
    if (argc != 6) return 2;
    unsigned char* meta = read_file(argv[2]);
    const char* archs[] = {argv[4]};
    uint32_t co_index = (uint32_t)strtoul(argv[5], NULL, 10);
    kpack_cache_t c = NULL;
    check("kpack_cache_create", kpack_cache_create(&c));
    void* co = NULL;
    size_t size = 0;
    check("kpack_load_code_object",
          kpack_load_code_object(c, meta, argv[3], co_index, archs, 1, &co, &size));
    unsigned sum = touch(co, size);
    printf("held %lu %zu %u\n", (unsigned long)(uintptr_t)co, size, sum & 1);
    fflush(stdout);
    char buf[64];
    while (fread(buf, 1, sizeof buf, stdin) > 0) {
    }
    kpack_free_code_object(co);
    kpack_cache_destroy(c);
    free(meta);
    return 0;
}

int main(int argc, char** argv) {
    if (argc >= 2 && strcmp(argv[1], "latency") == 0) return latency(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "get-all") == 0) return get_all(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "memory") == 0) return memory(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "floor") == 0) return floor_(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "hold") == 0) return hold(argc, argv);
    fprintf(stderr, "usage: kpack_bench latency|get-all|memory|floor|hold ...\n");
    return 2;
}
