/* SPDX-License-Identifier: MIT */
/*
 * Who frees what, under threads: `cargo xtask sanitize` runs it natively
 * and under valgrind (memcheck cold, helgrind and DRD steady).
 *
 *   capi_free_stress MODE THREADS ITERS  BINARY METADATA CO_COUNT TARGETS ...
 *
 * One or more offloaded binaries, each with the file holding its HIPK
 * metadata, its code object count and a comma-separated list of targets it
 * has code for (code objects stored uncompressed come as mappings of their
 * archive, compressed ones in buffers recycled through the cache's pool).
 *
 * THREADS threads share one cache. Each loads code objects at random,
 * checks their bytes against what the main thread loaded first, writes to
 * them, and swaps them into shared slots: the code object it takes out,
 * loaded by another thread, it checks and releases, with
 * kpack_free_code_object or kpack_free_kernel. After the threads, the cache
 * is destroyed and the code objects still in the slots are checked and
 * released then. MODE steady: the main thread loads every code object
 * through the shared cache before the threads start (helgrind and DRD do
 * not see the futexes of the cache's one-time opening). Prints PASS and
 * exits 0 when everything agrees.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rocm_kpack/kpack.h"

#define MAX_LOADS 128
#define SLOTS 48

struct load_ref {
    const char* binary;
    unsigned char* metadata;
    uint32_t co;
    char target[64];
    unsigned char* bytes; /* malloc'ed copy */
    size_t size;
};

static struct load_ref refs[MAX_LOADS];
static int n_refs;
static kpack_cache_t cache;
static int iters;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int failures;
static struct {
    void* p;
    int ref;
} slots[SLOTS];

static void fail(const char* what, int ref, int code) {
    pthread_mutex_lock(&lock);
    if (failures++ < 20)
        fprintf(stderr, "%s: %s #%u %s (%d)\n", what, refs[ref].binary, refs[ref].co,
                refs[ref].target, code);
    pthread_mutex_unlock(&lock);
}

static unsigned char* slurp(const char* path) {
    FILE* f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char* b = calloc(1, 65536);
    if (b) (void)fread(b, 1, 65536, f);
    fclose(f);
    return b;
}

static kpack_error_t load(kpack_cache_t c, int r, void** p, size_t* s) {
    const char* archs[] = {refs[r].target};
    return kpack_load_code_object(c, refs[r].metadata, refs[r].binary, refs[r].co, archs, 1, p, s);
}

/* Check a code object against its reference (undoing the write of
 * `scribble`), then release it. */
static void check_and_release(void* p, int r, int with_kernel_free) {
    unsigned char* b = p;
    if (refs[r].size > 0) b[0] ^= 0x5a;
    if (memcmp(b, refs[r].bytes, refs[r].size) != 0) fail("bytes changed while held", r, 0);
    if (with_kernel_free)
        kpack_free_kernel(p);
    else
        kpack_free_code_object(p);
}

static void* worker(void* arg) {
    unsigned seed = (unsigned)(uintptr_t)arg * 2654435761u + 7;
    for (int n = 0; n < iters; n++) {
        seed = seed * 1103515245u + 12345u;
        int r = (int)((seed >> 8) % (unsigned)n_refs);
        void* p = NULL;
        size_t s = 0;
        kpack_error_t e = load(cache, r, &p, &s);
        if (e != KPACK_SUCCESS) {
            fail("load", r, (int)e);
            continue;
        }
        if (s != refs[r].size || memcmp(p, refs[r].bytes, s) != 0) fail("bytes differ", r, 0);
        if (s > 0) ((unsigned char*)p)[0] ^= 0x5a; /* scribble */
        int k = (int)((seed >> 16) % SLOTS);
        pthread_mutex_lock(&lock);
        void* old = slots[k].p;
        int old_ref = slots[k].ref;
        slots[k].p = p;
        slots[k].ref = r;
        pthread_mutex_unlock(&lock);
        if (old) check_and_release(old, old_ref, (seed >> 4) & 1);
    }
    return NULL;
}

int main(int argc, char** argv) {
    if (argc < 8 || (argc - 4) % 4 != 0) {
        fprintf(stderr, "usage: capi_free_stress cold|steady THREADS ITERS (BINARY METADATA "
                        "CO_COUNT TARGETS)...\n");
        return 2;
    }
    int steady = strcmp(argv[1], "steady") == 0;
    int threads = atoi(argv[2]);
    iters = atoi(argv[3]);
    kpack_cache_t first = NULL;
    if (kpack_cache_create(&first) != KPACK_SUCCESS) return 1;
    for (int a = 4; a < argc; a += 4) {
        unsigned char* meta = slurp(argv[a + 1]);
        if (!meta) return 2;
        int count = atoi(argv[a + 2]);
        char* targets = strdup(argv[a + 3]);
        for (char* t = strtok(targets, ","); t; t = strtok(NULL, ",")) {
            for (int co = 0; co < count && n_refs < MAX_LOADS; co++) {
                struct load_ref* ref = &refs[n_refs];
                ref->binary = argv[a];
                ref->metadata = meta;
                ref->co = (uint32_t)co;
                snprintf(ref->target, sizeof ref->target, "%s", t);
                void* p;
                size_t s;
                if (load(first, n_refs, &p, &s) != KPACK_SUCCESS) continue;
                ref->bytes = malloc(s ? s : 1);
                memcpy(ref->bytes, p, s);
                ref->size = s;
                kpack_free_code_object(p);
                n_refs++;
            }
        }
        free(targets);
    }
    kpack_cache_destroy(first);
    if (n_refs == 0) {
        fprintf(stderr, "nothing to load\n");
        return 1;
    }
    if (kpack_cache_create(&cache) != KPACK_SUCCESS) return 1;
    for (int r = 0; steady && r < n_refs; r++) {
        void* p;
        size_t s;
        if (load(cache, r, &p, &s) == KPACK_SUCCESS)
            kpack_free_code_object(p);
        else
            fail("warm-up load", r, 0);
    }
    pthread_t tid[128];
    if (threads > 128) threads = 128;
    for (int t = 0; t < threads; t++) pthread_create(&tid[t], NULL, worker, (void*)(uintptr_t)(t + 1));
    for (int t = 0; t < threads; t++) pthread_join(tid[t], NULL);
    /* The code objects still held outlive the cache. */
    kpack_cache_destroy(cache);
    int after = 0;
    for (int k = 0; k < SLOTS; k++) {
        if (!slots[k].p) continue;
        check_and_release(slots[k].p, slots[k].ref, k & 1);
        after++;
    }
    unsigned char* last = NULL;
    for (int r = 0; r < n_refs; r++) {
        free(refs[r].bytes);
        if (refs[r].metadata != last) {
            last = refs[r].metadata;
            /* Each binary's metadata is shared by its refs, which are
             * consecutive. */
            free(last);
        }
    }
    printf("threads=%d loads=%d code_objects=%d freed_after_destroy=%d failures=%d\n", threads,
           threads * iters, n_refs, after, failures);
    if (failures > 0) return 1;
    printf("PASS\n");
    return 0;
}
