// A stand-in for the HIP runtime's entry points that HIP host code calls,
// for hosts where no libamdhip64 is installed (the foreign fixtures: AArch64
// and ppc64le, run under qemu-user). Each wrapper handed to
// __hipRegisterFatBinary is appended to the file named by $KPACK_SHIM_LOG:
// magic, version and reserved1, then (hex) up to 1024 bytes at its binary
// pointer, not past the page they start in.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
  uint32_t magic, version;
  const unsigned char *binary;
  uint64_t reserved1;
} wrapper_t;

static void *handle[1];

void **__hipRegisterFatBinary(const void *data) {
  const wrapper_t *w = (const wrapper_t *)data;
  const char *log = getenv("KPACK_SHIM_LOG");
  if (!log)
    return handle;
  FILE *f = fopen(log, "a");
  if (!f)
    abort();
  fprintf(f, "%08x %u %llu ", w->magic, w->version,
          (unsigned long long)w->reserved1);
  size_t n = 4096 - ((uintptr_t)w->binary & 4095);
  if (n > 1024)
    n = 1024;
  for (size_t i = 0; i < n; i++)
    fprintf(f, "%02x", w->binary[i]);
  fprintf(f, "\n");
  fclose(f);
  return handle;
}

void __hipUnregisterFatBinary(void **h) { (void)h; }
void __hipRegisterFunction(void) {}
void __hipRegisterVar(void) {}
void __hipRegisterManagedVar(void) {}
void __hipRegisterSurface(void) {}
void __hipRegisterTexture(void) {}
int __hipPushCallConfiguration(void) { return 0; }
int __hipPopCallConfiguration(void) { return 0; }
// Kernels are never launched: there is no GPU.
int hipLaunchKernel(void) { return 1; }
