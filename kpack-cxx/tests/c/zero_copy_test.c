/* SPDX-License-Identifier: MIT */
/*
 * Ownership of the code objects the C API hands out (docs/runtime.md,
 * "Who owns a code object"): zero-copy loads from scheme `none` archives,
 * recycled buffers for compressed ones, and what outlives the cache.
 * Driven by tests/zero_copy.rs (over tests/common/zero_copy.rs), which writes the scenario:
 *
 *   DIR/a_gfx1100.kpack   scheme none, keys app#0..app#(N-1) for gfx1100
 *   DIR/a_gfx1101.kpack   zstd-per-kernel, the same keys for gfx1101
 *   DIR/meta              HIPK metadata: kernel "app", search path
 *                         "a_@GFXARCH@.kpack"
 *   DIR/<target>_<i>.bin  the bytes of app#i for <target>
 *   DIR/<target>_<i>.off  (gfx1100) where they are in the archive file
 *
 *   zero_copy_test none DIR N       mapped loads: kpack_load_code_object
 *                                   and kpack_get_kernel
 *   zero_copy_test zstd DIR N       heap loads: recycled, free()-able
 *   zero_copy_test threads DIR N T ITERS
 *                                   T threads load both kinds and free
 *                                   them, often on another thread; the
 *                                   last buffers are freed after
 *                                   kpack_cache_destroy
 *   zero_copy_test threads-steady DIR N T ITERS
 *                                   the same after the main thread loaded
 *                                   every code object once (for helgrind
 *                                   and DRD, which do not see the futexes
 *                                   of the cache's one-time opening; the
 *                                   pool and the registry of code objects
 *                                   use pthread mutexes, which they see)
 *
 * Prints PASS and exits 0 when every check holds.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rocm_kpack/kpack.h"

#define MAX_CO 16

static int failures;
static pthread_mutex_t fail_lock = PTHREAD_MUTEX_INITIALIZER;

#define CHECK(cond, ...)                                             \
    do {                                                             \
        if (!(cond)) {                                               \
            pthread_mutex_lock(&fail_lock);                          \
            failures++;                                              \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);     \
            fprintf(stderr, __VA_ARGS__);                            \
            fprintf(stderr, "\n");                                   \
            pthread_mutex_unlock(&fail_lock);                        \
        }                                                            \
    } while (0)

struct expected {
    unsigned char* bytes;
    size_t size;
    long long offset; /* in the archive file; -1: not given */
};

static char dir[4096];
static char none_archive[4200];
static char zstd_archive[4200];
static unsigned char* metadata;
static char binary[4200];
static int n_co;
static struct expected want[2][MAX_CO]; /* [0] gfx1100 (none), [1] gfx1101 (zstd) */
static const char* targets[2] = {"gfx1100", "gfx1101"};

static unsigned char* slurp(const char* path, size_t* size) {
    FILE* f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char* b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    if (b) b[n] = 0;
    fclose(f);
    if (size) *size = (size_t)n;
    return b;
}

static void load_scenario(const char* d, int n) {
    snprintf(dir, sizeof dir, "%s", d);
    snprintf(none_archive, sizeof none_archive, "%s/a_gfx1100.kpack", dir);
    snprintf(zstd_archive, sizeof zstd_archive, "%s/a_gfx1101.kpack", dir);
    snprintf(binary, sizeof binary, "%s/app", dir);
    char path[4400];
    snprintf(path, sizeof path, "%s/meta", dir);
    metadata = slurp(path, NULL);
    if (!metadata) {
        fprintf(stderr, "cannot read %s\n", path);
        exit(2);
    }
    n_co = n;
    for (int t = 0; t < 2; t++) {
        for (int i = 0; i < n; i++) {
            snprintf(path, sizeof path, "%s/%s_%d.bin", dir, targets[t], i);
            want[t][i].bytes = slurp(path, &want[t][i].size);
            if (!want[t][i].bytes) {
                fprintf(stderr, "cannot read %s\n", path);
                exit(2);
            }
            want[t][i].offset = -1;
            snprintf(path, sizeof path, "%s/%s_%d.off", dir, targets[t], i);
            unsigned char* off = slurp(path, NULL);
            if (off) {
                want[t][i].offset = atoll((const char*)off);
                free(off);
            }
        }
    }
}

static kpack_error_t load(kpack_cache_t c, int t, int i, void** data, size_t* size) {
    const char* archs[] = {targets[t]};
    return kpack_load_code_object(c, metadata, binary, (uint32_t)i, archs, 1, data, size);
}

static char key_buf[32];
static const char* key(int i) {
    snprintf(key_buf, sizeof key_buf, "app#%d", i);
    return key_buf;
}

/* Mappings of `path` in /proc/self/maps. */
static int count_maps(const char* path) {
    FILE* f = fopen("/proc/self/maps", "r");
    char line[8192];
    int n = 0;
    size_t len = strlen(path);
    while (f && fgets(line, sizeof line, f)) {
        size_t l = strlen(line);
        while (l > 0 && (line[l - 1] == '\n' || line[l - 1] == ' ')) line[--l] = 0;
        if (l >= len && strcmp(line + l - len, path) == 0) n++;
    }
    if (f) fclose(f);
    return n;
}

/* A mapped code object: inside a mapping of the archive, at its offset in
 * the file, with the right bytes. */
static void check_mapped(const char* what, int i, void* p, size_t size) {
    const struct expected* w = &want[0][i];
    CHECK(size == w->size, "%s app#%d: size %zu, expected %zu", what, i, size, w->size);
    CHECK(p != NULL, "%s app#%d: NULL", what, i);
    if (!p || size != w->size) return;
    CHECK(memcmp(p, w->bytes, size) == 0, "%s app#%d: bytes differ", what, i);
    if (size == 0) return;
    char path[4096];
    size_t offset = 0;
    kpack_error_t e = kpack_discover_binary_path(p, path, sizeof path, &offset);
    CHECK(e == KPACK_SUCCESS, "%s app#%d: not in a file mapping (%d)", what, i, (int)e);
    if (e != KPACK_SUCCESS) return;
    CHECK(strcmp(path, none_archive) == 0, "%s app#%d: mapped from %s, expected %s", what, i,
          path, none_archive);
    CHECK((long long)offset == w->offset, "%s app#%d: at offset %zu of the file, expected %lld",
          what, i, offset, w->offset);
}

/* Each mapped load is private: a write to one is seen by no other load. */
static void check_private(kpack_cache_t c, kpack_archive_t a) {
    void* p[MAX_CO];
    size_t s[MAX_CO];
    for (int i = 0; i < n_co; i++) {
        CHECK(load(c, 0, i, &p[i], &s[i]) == KPACK_SUCCESS, "load app#%d", i);
    }
    for (int i = 0; i < n_co; i++) {
        if (s[i] == 0) continue;
        unsigned char* b = p[i];
        /* Scribble over every byte of this one; the others (code objects of
         * the same page included) and a fresh load are untouched. */
        memset(b, 0xA5 ^ i, s[i]);
        for (int j = 0; j < n_co; j++) {
            if (j != i && s[j] > 0)
                CHECK(memcmp(p[j], want[0][j].bytes, s[j]) == 0,
                      "a write to app#%d changed app#%d", i, j);
        }
        void* q;
        size_t qs;
        CHECK(load(c, 0, i, &q, &qs) == KPACK_SUCCESS, "reload app#%d", i);
        CHECK(q != p[i], "two loads of app#%d share a buffer", i);
        CHECK(qs == s[i] && memcmp(q, want[0][i].bytes, qs) == 0,
              "a write to a load of app#%d shows in the next load", i);
        void* k;
        size_t ks;
        CHECK(kpack_get_kernel(a, key(i), targets[0], &k, &ks) == KPACK_SUCCESS, "get app#%d", i);
        CHECK(ks == s[i] && memcmp(k, want[0][i].bytes, ks) == 0,
              "a write to a load of app#%d shows in kpack_get_kernel", i);
        kpack_free_code_object(q);
        kpack_free_kernel(k);
        memcpy(b, want[0][i].bytes, s[i]);
    }
    for (int i = 0; i < n_co; i++) kpack_free_code_object(p[i]);
}

static int run_none(void) {
    int before = count_maps(none_archive);
    CHECK(before == 0, "the archive is mapped %d times before the test", before);
    kpack_cache_t c = NULL;
    kpack_archive_t a = NULL;
    CHECK(kpack_cache_create(&c) == KPACK_SUCCESS, "kpack_cache_create");
    CHECK(kpack_open(none_archive, &a) == KPACK_SUCCESS, "kpack_open");
    if (!c || !a) return 1;

    void* loaded[MAX_CO];
    size_t loaded_size[MAX_CO];
    void* got[MAX_CO];
    size_t got_size[MAX_CO];
    for (int i = 0; i < n_co; i++) {
        CHECK(load(c, 0, i, &loaded[i], &loaded_size[i]) == KPACK_SUCCESS, "load app#%d", i);
        check_mapped("kpack_load_code_object", i, loaded[i], loaded_size[i]);
        CHECK(kpack_get_kernel(a, key(i), targets[0], &got[i], &got_size[i]) == KPACK_SUCCESS,
              "kpack_get_kernel app#%d", i);
        check_mapped("kpack_get_kernel", i, got[i], got_size[i]);
        CHECK(got[i] != loaded[i], "app#%d: kpack_get_kernel and the load share a buffer", i);
    }
    check_private(c, a);

    /* Valid after kpack_cache_destroy and kpack_close: the archive is no
     * longer open, the code objects still are. */
    kpack_cache_destroy(c);
    kpack_close(a);
    int held = 0;
    for (int i = 0; i < n_co; i++) held += (loaded_size[i] > 0) + (got_size[i] > 0);
    CHECK(count_maps(none_archive) == held, "%d mappings of the archive, expected %d (one per "
          "code object held)", count_maps(none_archive), held);
    for (int i = 0; i < n_co; i++) {
        check_mapped("after destroy: kpack_load_code_object", i, loaded[i], loaded_size[i]);
        check_mapped("after close: kpack_get_kernel", i, got[i], got_size[i]);
        /* Writable like a heap buffer. */
        memset(loaded[i], 0x5A, loaded_size[i]);
        memset(got[i], 0x3C, got_size[i]);
    }
    for (int i = 0; i < n_co; i++) {
        int maps = count_maps(none_archive);
        kpack_free_code_object(loaded[i]);
        CHECK(count_maps(none_archive) == maps - (loaded_size[i] > 0),
              "kpack_free_code_object(app#%d) did not release its mapping", i);
        kpack_free_kernel(got[i]);
    }
    /* Freed exactly once: nothing of the archive is left. */
    CHECK(count_maps(none_archive) == 0, "%d mappings of the archive left after every free",
          count_maps(none_archive));
    kpack_free_code_object(NULL);
    kpack_free_kernel(NULL);

    /* A free through the other function releases the mapping as well. */
    CHECK(kpack_cache_create(&c) == KPACK_SUCCESS, "kpack_cache_create");
    void* p;
    size_t s;
    CHECK(load(c, 0, n_co - 1, &p, &s) == KPACK_SUCCESS, "load");
    kpack_free_kernel(p);
    kpack_cache_destroy(c);
    CHECK(count_maps(none_archive) == 0, "kpack_free_kernel left a mapping");
    return 0;
}

static int run_zstd(void) {
    kpack_cache_t c = NULL;
    CHECK(kpack_cache_create(&c) == KPACK_SUCCESS, "kpack_cache_create");
    if (!c) return 1;
    int big = 0; /* the largest code object */
    for (int i = 0; i < n_co; i++)
        if (want[1][i].size > want[1][big].size) big = i;

    void* p;
    size_t s;
    CHECK(load(c, 1, big, &p, &s) == KPACK_SUCCESS, "load");
    CHECK(s == want[1][big].size && memcmp(p, want[1][big].bytes, s) == 0, "bytes");
    char path[4096];
    CHECK(kpack_discover_binary_path(p, path, sizeof path, NULL) ==
              KPACK_ERROR_PATH_DISCOVERY_FAILED,
          "a decompressed code object lies in a file mapping (%s)", path);
    /* A freed buffer is recycled by the next load of its size. */
    kpack_free_code_object(p);
    void* q;
    CHECK(load(c, 1, big, &q, &s) == KPACK_SUCCESS, "reload");
    CHECK(q == p, "the buffer freed was not recycled (%p, then %p)", p, q);
    CHECK(s == want[1][big].size && memcmp(q, want[1][big].bytes, s) == 0, "recycled bytes");

    /* Every code object, several held at once; malloc-compatible: free()
     * releases them too. */
    void* held[MAX_CO];
    size_t held_size[MAX_CO];
    for (int i = 0; i < n_co; i++) {
        CHECK(load(c, 1, i, &held[i], &held_size[i]) == KPACK_SUCCESS, "load app#%d", i);
        CHECK(held_size[i] == want[1][i].size &&
                  memcmp(held[i], want[1][i].bytes, held_size[i]) == 0,
              "app#%d bytes", i);
        CHECK(held[i] != q, "app#%d got a buffer still in use", i);
    }
    free(q);
    for (int i = 0; i < n_co; i += 2) kpack_free_code_object(held[i]);
    /* Destroyed with buffers out, and buffers in its pool: those left are
     * freed afterwards, through kpack_free_code_object or free(). */
    kpack_cache_destroy(c);
    for (int i = 1; i < n_co; i += 2) {
        CHECK(memcmp(held[i], want[1][i].bytes, held_size[i]) == 0,
              "app#%d after destroy", i);
        if (i % 4 == 1)
            kpack_free_code_object(held[i]);
        else
            free(held[i]);
    }

    /* kpack_get_kernel of a compressed entry: a malloc'ed buffer. */
    kpack_archive_t a = NULL;
    CHECK(kpack_open(zstd_archive, &a) == KPACK_SUCCESS, "kpack_open");
    void* k;
    size_t ks;
    CHECK(kpack_get_kernel(a, key(big), targets[1], &k, &ks) == KPACK_SUCCESS, "get");
    kpack_close(a);
    CHECK(ks == want[1][big].size && memcmp(k, want[1][big].bytes, ks) == 0, "get bytes");
    free(k);
    CHECK(kpack_get_kernel(NULL, key(big), targets[1], &k, &ks) == KPACK_ERROR_INVALID_ARGUMENT,
          "NULL archive");
    return 0;
}

/* ---- threads ---------------------------------------------------------- */

/* Buffers passed between threads: a thread frees what another loaded. */
#define SLOTS 64
static pthread_mutex_t slot_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    void* p;
    int t, i;
} slots[SLOTS];
static kpack_cache_t shared_cache;
static int iterations;
static int n_threads;

static void* worker(void* arg) {
    unsigned seed = (unsigned)(uintptr_t)arg * 2654435761u + 1;
    for (int n = 0; n < iterations; n++) {
        seed = seed * 1103515245u + 12345u;
        int t = (int)(seed >> 16) & 1;
        int i = (int)((seed >> 8) % (unsigned)n_co);
        void* p;
        size_t s;
        kpack_error_t e = load(shared_cache, t, i, &p, &s);
        CHECK(e == KPACK_SUCCESS, "thread load %s app#%d: %d", targets[t], i, (int)e);
        if (e != KPACK_SUCCESS) continue;
        CHECK(s == want[t][i].size && memcmp(p, want[t][i].bytes, s) == 0,
              "thread load %s app#%d: bytes differ", targets[t], i);
        /* Written to, as a heap buffer may be. */
        if (s > 0) ((unsigned char*)p)[s - 1] ^= 0xff;
        /* Swap it with whatever another thread left in a slot, and free
         * that one (after checking it is still what was loaded). */
        int k = (int)((seed >> 4) % SLOTS);
        pthread_mutex_lock(&slot_lock);
        void* old = slots[k].p;
        int ot = slots[k].t, oi = slots[k].i;
        slots[k].p = p;
        slots[k].t = t;
        slots[k].i = i;
        pthread_mutex_unlock(&slot_lock);
        if (old) {
            size_t os = want[ot][oi].size;
            if (os > 0) ((unsigned char*)old)[os - 1] ^= 0xff;
            CHECK(memcmp(old, want[ot][oi].bytes, os) == 0,
                  "a buffer of %s app#%d changed while another thread held it", targets[ot], oi);
            if (seed & 0x100)
                kpack_free_code_object(old);
            else
                kpack_free_kernel(old);
        }
    }
    return NULL;
}

static int run_threads(int threads, int iters, int steady) {
    n_threads = threads;
    iterations = iters;
    CHECK(kpack_cache_create(&shared_cache) == KPACK_SUCCESS, "kpack_cache_create");
    for (int t = 0; steady && t < 2; t++) {
        for (int i = 0; i < n_co; i++) {
            void* p;
            size_t s;
            CHECK(load(shared_cache, t, i, &p, &s) == KPACK_SUCCESS, "warm-up load");
            kpack_free_code_object(p);
        }
    }
    pthread_t tid[64];
    for (int t = 0; t < threads && t < 64; t++)
        pthread_create(&tid[t], NULL, worker, (void*)(uintptr_t)(t + 1));
    for (int t = 0; t < threads && t < 64; t++) pthread_join(tid[t], NULL);
    /* The buffers still held outlive the cache. */
    kpack_cache_destroy(shared_cache);
    for (int k = 0; k < SLOTS; k++) {
        if (!slots[k].p) continue;
        size_t os = want[slots[k].t][slots[k].i].size;
        unsigned char* b = slots[k].p;
        if (os > 0) b[os - 1] ^= 0xff;
        CHECK(memcmp(b, want[slots[k].t][slots[k].i].bytes, os) == 0,
              "a buffer changed after kpack_cache_destroy");
        kpack_free_code_object(b);
    }
    CHECK(count_maps(none_archive) == 0, "%d mappings of the archive left",
          count_maps(none_archive));
    return 0;
}

int main(int argc, char** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: zero_copy_test none|zstd|threads DIR N [THREADS ITERS]\n");
        return 2;
    }
    int n = atoi(argv[3]);
    if (n < 1 || n > MAX_CO) return 2;
    load_scenario(argv[2], n);
    int r;
    if (strcmp(argv[1], "none") == 0)
        r = run_none();
    else if (strcmp(argv[1], "zstd") == 0)
        r = run_zstd();
    else if (strcmp(argv[1], "threads") == 0 && argc == 6)
        r = run_threads(atoi(argv[4]), atoi(argv[5]), 0);
    else if (strcmp(argv[1], "threads-steady") == 0 && argc == 6)
        r = run_threads(atoi(argv[4]), atoi(argv[5]), 1);
    else
        return 2;
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < n_co; i++) free(want[t][i].bytes);
    free(metadata);
    if (r != 0 || failures > 0) {
        printf("FAILED (%d)\n", failures);
        return 1;
    }
    printf("PASS\n");
    return 0;
}
