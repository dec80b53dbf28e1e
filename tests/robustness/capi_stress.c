/* SPDX-License-Identifier: MIT */
/*
 * Thread-safety stress of the kpack C API, for valgrind (memcheck, helgrind,
 * DRD) and the sanitizers: `cargo xtask sanitize` builds it against
 * librocm_kpack.a and runs it.
 *
 *   capi_stress MODE THREADS ITERS BINARY METADATA CO_COUNT TARGETS ARCHIVE...
 *
 * MODE cold: the threads start on an unopened shared archive handle and an
 * empty shared cache (memcheck, ASan, TSan). MODE steady: the shared handle
 * and cache are used once by the main thread first (helgrind and DRD: the
 * library's locks are Rust futexes, invisible to them, so the one-time
 * writes of a cold start would be reported; the steady state is what they
 * check). TARGETS is a comma-separated list of target IDs the binary has
 * code for; METADATA a file holding the binary's HIPK metadata.
 *
 * Every thread mixes, on shared and on its own handles and caches:
 * kpack_open + every query + kpack_get_kernel of every (binary, arch) +
 * kpack_close; kpack_cache_create + kpack_load_code_object of every
 * (code object, target) + kpack_cache_destroy; kpack_enumerate_architectures;
 * error paths. Every result is compared with what the main thread read
 * before the threads started. Prints "PASS" and exits 0 when all agree.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rocm_kpack/kpack.h"

#define MAX_ARCHIVES 8
#define MAX_KERNELS 256
#define MAX_LOADS 64

struct kernel {
    char* key;
    char* arch;
    void* data;
    size_t size;
};

struct archive_ref {
    const char* path;
    int count;
    struct kernel kernels[MAX_KERNELS];
};

struct load_ref {
    uint32_t co;
    char isa[128];
    kpack_error_t err;
    void* data;
    size_t size;
};

static const char* mode;
static int iters;
static const char* binary;
static unsigned char* metadata; /* a 64 KiB window */
static int n_archives;
static struct archive_ref refs[MAX_ARCHIVES];
static int n_loads;
static struct load_ref loads[MAX_LOADS];
static kpack_archive_t shared_archive;
static kpack_cache_t shared_cache;

static pthread_mutex_t fail_lock = PTHREAD_MUTEX_INITIALIZER;
static int failures;

static void fail(const char* what, int t, int code) {
    pthread_mutex_lock(&fail_lock);
    failures++;
    if (failures < 20) fprintf(stderr, "thread %d: %s (code %d)\n", t, what, code);
    pthread_mutex_unlock(&fail_lock);
}

static char* dup(const char* s) {
    size_t n = strlen(s) + 1;
    char* p = malloc(n);
    memcpy(p, s, n);
    return p;
}

/* Read every kernel of an open archive; compare with (or fill) ref. */
static void read_all(kpack_archive_t a, struct archive_ref* ref, int fill, int t) {
    size_t nb = 0, na = 0;
    if (kpack_get_binary_count(a, &nb) || kpack_get_architecture_count(a, &na)) {
        fail("count", t, -1);
        return;
    }
    int k = 0;
    for (size_t i = 0; i < nb; i++) {
        const char* key;
        if (kpack_get_binary(a, i, &key)) { fail("get_binary", t, -1); return; }
        for (size_t j = 0; j < na; j++) {
            const char* arch;
            if (kpack_get_architecture(a, j, &arch)) { fail("get_architecture", t, -1); return; }
            void* data = NULL;
            size_t size = 0;
            kpack_error_t e = kpack_get_kernel(a, key, arch, &data, &size);
            if (e == KPACK_ERROR_KERNEL_NOT_FOUND) continue;
            if (e != KPACK_SUCCESS) { fail("get_kernel", t, e); continue; }
            if (fill) {
                if (k < MAX_KERNELS)
                    ref->kernels[k] = (struct kernel){dup(key), dup(arch), data, size};
                else
                    kpack_free_kernel(data);
            } else {
                struct kernel* r = &ref->kernels[k];
                if (k >= ref->count || strcmp(r->key, key) || strcmp(r->arch, arch) ||
                    r->size != size || memcmp(r->data, data, size))
                    fail("get_kernel returned different bytes", t, 0);
                kpack_free_kernel(data);
            }
            k++;
        }
    }
    if (fill) ref->count = k < MAX_KERNELS ? k : MAX_KERNELS;
    else if (k != ref->count) fail("a different number of kernels", t, k);
    /* An unknown key. */
    void* data = NULL;
    size_t size = 0;
    if (kpack_get_kernel(a, "no/such#0", "gfx1100", &data, &size) != KPACK_ERROR_KERNEL_NOT_FOUND ||
        data != NULL)
        fail("unknown key", t, -1);
}

/* Every load of `loads` through cache c; compare (or fill). */
static void load_all(kpack_cache_t c, int fill, int t) {
    for (int n = 0; n < n_loads; n++) {
        int i = (n + (t < 0 ? 0 : t)) % n_loads;
        struct load_ref* l = &loads[i];
        const char* archs[2] = {l->isa, "amdgcn-amd-amdhsa--gfx9999"};
        void* data = NULL;
        size_t size = 0;
        kpack_error_t e =
            kpack_load_code_object(c, metadata, binary, l->co, archs, 2, &data, &size);
        if (fill) {
            l->err = e;
            l->data = data;
            l->size = size;
            continue;
        }
        if (e != l->err) fail("load gave another result", t, e);
        if (e == KPACK_SUCCESS) {
            if (size != l->size || memcmp(data, l->data, size)) fail("load: different bytes", t, 0);
            kpack_free_code_object(data);
        }
    }
}

static bool count_arch(const char* arch, void* user) {
    if (arch == NULL || arch[0] == 0) return false;
    ++*(int*)user;
    return true;
}

struct job {
    int t;
};

static void* thread_main(void* p) {
    int t = ((struct job*)p)->t;
    for (int i = 0; i < iters; i++) {
        struct archive_ref* ref = &refs[(t + i) % n_archives];
        switch ((t + i) % 5) {
        case 0: { /* own handle */
            kpack_archive_t a;
            kpack_error_t e = kpack_open(ref->path, &a);
            if (e) { fail("open", t, e); break; }
            read_all(a, ref, 0, t);
            kpack_close(a);
            break;
        }
        case 1: /* the shared handle */
            read_all(shared_archive, &refs[0], 0, t);
            break;
        case 2: /* the shared cache */
            load_all(shared_cache, 0, t);
            break;
        case 3: { /* own cache */
            kpack_cache_t c;
            kpack_error_t e = kpack_cache_create(&c);
            if (e) { fail("cache_create", t, e); break; }
            load_all(c, 0, t);
            kpack_cache_destroy(c);
            break;
        }
        default: { /* enumeration and errors */
            int n = 0;
            kpack_error_t e = kpack_enumerate_architectures(ref->path, count_arch, &n);
            if (e || n == 0) fail("enumerate", t, e);
            kpack_archive_t a = NULL;
            e = kpack_open("/nonexistent/kpack/x.kpack", &a);
            if (e != KPACK_ERROR_FILE_NOT_FOUND || a != NULL) fail("open missing", t, e);
            if (kpack_get_kernel(NULL, "k", "a", NULL, NULL) != KPACK_ERROR_INVALID_ARGUMENT)
                fail("NULL handle", t, -1);
            break;
        }
        }
    }
    return NULL;
}

int main(int argc, char** argv) {
    if (argc < 9) {
        fprintf(stderr,
                "usage: %s cold|steady THREADS ITERS BINARY METADATA CO_COUNT TARGETS ARCHIVE...\n",
                argv[0]);
        return 2;
    }
    mode = argv[1];
    int nthreads = atoi(argv[2]);
    iters = atoi(argv[3]);
    binary = argv[4];
    metadata = calloc(64 * 1024, 1);
    FILE* f = fopen(argv[5], "rb");
    if (!f) { perror(argv[5]); return 2; }
    size_t got = fread(metadata, 1, 64 * 1024, f);
    fclose(f);
    if (got == 0) { fprintf(stderr, "empty metadata\n"); return 2; }
    int co_count = atoi(argv[6]);
    char* targets = dup(argv[7]);
    for (char* s = strtok(targets, ","); s; s = strtok(NULL, ",")) {
        for (int co = 0; co < co_count && n_loads < MAX_LOADS; co++) {
            loads[n_loads].co = (uint32_t)co;
            snprintf(loads[n_loads].isa, sizeof loads[n_loads].isa, "amdgcn-amd-amdhsa--%s", s);
            n_loads++;
        }
    }
    n_archives = argc - 8;
    if (n_archives > MAX_ARCHIVES) n_archives = MAX_ARCHIVES;

    /* References, with handles and a cache of their own. */
    for (int i = 0; i < n_archives; i++) {
        refs[i].path = argv[8 + i];
        kpack_archive_t a;
        kpack_error_t e = kpack_open(refs[i].path, &a);
        if (e) { fprintf(stderr, "open %s: %d\n", refs[i].path, e); return 1; }
        read_all(a, &refs[i], 1, -1);
        kpack_close(a);
    }
    kpack_cache_t c;
    if (kpack_cache_create(&c)) return 1;
    load_all(c, 1, 0);
    kpack_cache_destroy(c);
    int loaded = 0;
    for (int i = 0; i < n_loads; i++) loaded += loads[i].err == KPACK_SUCCESS;
    if (loaded == 0) { fprintf(stderr, "no load succeeded\n"); return 1; }

    if (kpack_open(refs[0].path, &shared_archive) || kpack_cache_create(&shared_cache)) return 1;
    if (strcmp(mode, "steady") == 0) {
        read_all(shared_archive, &refs[0], 0, -1);
        load_all(shared_cache, 0, -1);
    }
    pthread_t* threads = calloc((size_t)nthreads, sizeof *threads);
    struct job* jobs = calloc((size_t)nthreads, sizeof *jobs);
    for (int t = 0; t < nthreads; t++) {
        jobs[t].t = t;
        if (pthread_create(&threads[t], NULL, thread_main, &jobs[t])) { perror("pthread_create"); return 1; }
    }
    for (int t = 0; t < nthreads; t++) pthread_join(threads[t], NULL);
    kpack_close(shared_archive);
    kpack_cache_destroy(shared_cache);

    for (int i = 0; i < n_archives; i++)
        for (int k = 0; k < refs[i].count; k++) {
            free(refs[i].kernels[k].key);
            free(refs[i].kernels[k].arch);
            kpack_free_kernel(refs[i].kernels[k].data);
        }
    for (int i = 0; i < n_loads; i++) kpack_free_code_object(loads[i].data);
    free(threads);
    free(jobs);
    free(targets);
    free(metadata);
    printf("threads=%d iters=%d archives=%d loads=%d (%d found) failures=%d\n", nthreads, iters,
           n_archives, n_loads, loaded, failures);
    if (failures) return 1;
    printf("PASS\n");
    return 0;
}
