/* Loads every code object of an offloaded HIP library through the kpack C
 * API and compares it with the expected bytes.
 *
 *   consumer_c LIBRARY EXPECTED_DIR TARGET...
 *
 * Stands in for the HIP runtime: dlopen() runs the library's constructor,
 * whose __hipRegisterFatBinary call lands here with the wrapper. Every
 * wrapper of the library's .hipFatBinSegment is checked too, also those
 * its constructors do not register (-fgpu-rdc units share one handle, so
 * only the first registers).
 * Expected bytes: EXPECTED_DIR/<target>#<co_index>.co, else <target>.co;
 * EXPECTED_DIR/<target>#<co_index>.none instead: that bundle of the fat
 * binary had no code for the target, and the load must fail as the HIP
 * runtime's would (KPACK_ERROR_KERNEL_NOT_FOUND). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rocm_kpack/kpack.h>

typedef struct {
  uint32_t magic;
  uint32_t version;
  const void* binary;
  uint64_t reserved1;
} wrapper_t;

#define MAX_WRAPPERS 64
static const wrapper_t* wrappers[MAX_WRAPPERS];
static int wrapper_count;
static void* handle_storage[1];

void** __hipRegisterFatBinary(const void* data) {
  if (wrapper_count < MAX_WRAPPERS) wrappers[wrapper_count++] = (const wrapper_t*)data;
  return handle_storage;
}
void __hipUnregisterFatBinary(void** handle) { (void)handle; }
void __hipRegisterFunction(void) {}
void __hipRegisterVar(void) {}
void __hipRegisterManagedVar(void) {}
void __hipRegisterSurface(void) {}
void __hipRegisterTexture(void) {}

static unsigned char* read_file(const char* path, size_t* size) {
  FILE* f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char* buf = malloc(n > 0 ? (size_t)n : 1);
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  *size = (size_t)n;
  return buf;
}

/* Add the wrappers of LIBRARY's .hipFatBinSegment (read from the file's
 * section headers, at the library's load address) not registered yet. */
static int add_section_wrappers(const char* path, void* handle) {
  struct link_map* map = NULL;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 || !map) return -1;
  size_t size = 0;
  unsigned char* file = read_file(path, &size);
  if (!file || size < sizeof(Elf64_Ehdr)) return -1;
  const Elf64_Ehdr* eh = (const Elf64_Ehdr*)file;
  const Elf64_Shdr* sh = (const Elf64_Shdr*)(file + eh->e_shoff);
  const char* names = (const char*)file + sh[eh->e_shstrndx].sh_offset;
  int found = -1;
  for (int i = 0; i < eh->e_shnum; i++) {
    if (strcmp(names + sh[i].sh_name, ".hipFatBinSegment") != 0) continue;
    found = 0;
    const wrapper_t* w = (const wrapper_t*)(map->l_addr + sh[i].sh_addr);
    for (size_t k = 0; k < sh[i].sh_size / sizeof(wrapper_t); k++) {
      int known = 0;
      for (int j = 0; j < wrapper_count; j++) known |= wrappers[j] == &w[k];
      if (!known && wrapper_count < MAX_WRAPPERS) wrappers[wrapper_count++] = &w[k];
      found++;
    }
  }
  free(file);
  return found;
}

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s LIBRARY EXPECTED_DIR TARGET...\n", argv[0]);
    return 2;
  }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  if (wrapper_count == 0) {
    fprintf(stderr, "no fat binary was registered\n");
    return 1;
  }
  int registered = wrapper_count;
  int in_section = add_section_wrappers(argv[1], lib);
  if (in_section < registered) {
    fprintf(stderr, "%s: cannot read its .hipFatBinSegment\n", argv[1]);
    return 1;
  }
  printf("%d wrappers (%d registered)\n", wrapper_count, registered);
  kpack_cache_t cache = NULL;
  if (kpack_cache_create(&cache) != KPACK_SUCCESS) return 1;
  int failures = 0, loaded = 0, absent = 0;
  for (int w = 0; w < wrapper_count; w++) {
    const wrapper_t* wr = wrappers[w];
    if (wr->magic != 0x4B504948u || wr->version != 1) {
      fprintf(stderr, "wrapper %d: magic %08x is not HIPK\n", w, wr->magic);
      return 1;
    }
    char path[4096];
    size_t offset = 0;
    kpack_error_t e = kpack_discover_binary_path(wr, path, sizeof path, &offset);
    if (e != KPACK_SUCCESS) {
      fprintf(stderr, "kpack_discover_binary_path: %d\n", (int)e);
      return 1;
    }
    for (int t = 3; t < argc; t++) {
      /* The runtime passes the agent's full ISA name. */
      char agent[128];
      snprintf(agent, sizeof agent, "amdgcn-amd-amdhsa--%s", argv[t]);
      const char* archs[1] = {agent};
      void* co = NULL;
      size_t co_size = 0;
      e = kpack_load_code_object(cache, wr->binary, path, (uint32_t)wr->reserved1, archs, 1, &co, &co_size);
      char expected_path[4096];
      snprintf(expected_path, sizeof expected_path, "%s/%s#%llu.none", argv[2], argv[t],
               (unsigned long long)wr->reserved1);
      FILE* none = fopen(expected_path, "rb");
      if (none) {
        fclose(none);
        if (e == KPACK_ERROR_KERNEL_NOT_FOUND) {
          absent++;
        } else {
          fprintf(stderr, "%s (%s): error %d, expected KPACK_ERROR_KERNEL_NOT_FOUND (%s)\n", path, argv[t], (int)e,
                  expected_path);
          failures++;
        }
        kpack_free_code_object(co);
        continue;
      }
      /* EXPECTED_DIR/<target>#<co_index>.co, or <target>.co. */
      snprintf(expected_path, sizeof expected_path, "%s/%s#%llu.co", argv[2], argv[t],
               (unsigned long long)wr->reserved1);
      size_t want_size = 0;
      unsigned char* want = read_file(expected_path, &want_size);
      if (!want) {
        snprintf(expected_path, sizeof expected_path, "%s/%s.co", argv[2], argv[t]);
        want = read_file(expected_path, &want_size);
      }
      if (e != KPACK_SUCCESS || !want || want_size != co_size || memcmp(want, co, co_size) != 0) {
        fprintf(stderr, "%s (%s): error %d, %zu bytes; expected %zu bytes from %s\n", path, argv[t], (int)e,
                co_size, want_size, expected_path);
        failures++;
      } else {
        loaded++;
      }
      free(want);
      kpack_free_code_object(co);
    }
  }
  kpack_cache_destroy(cache);
  printf("%d code objects loaded and identical, %d failures\n", loaded, failures);
  if (absent > 0) printf("%d code objects absent, as in the fat binary\n", absent);
  return failures == 0 && loaded > 0 ? 0 : 1;
}
