// A stand-in amdhip64.dll for kpack's Windows fixtures (no HIP runtime for
// Windows here): the entry points HIP host code calls. Each wrapper handed
// to __hipRegisterFatBinary is recorded (magic, version, reserved1, and up
// to 1024 bytes at its binary pointer, not past the page they start in);
// kp_stub_count() and kp_stub_line() give the records to the loader.
#include <stdint.h>

typedef struct {
  uint32_t magic, version;
  const unsigned char *binary;
  uint64_t reserved1;
} wrapper_t;

#define MAX_WRAPPERS 64
#define LINE 2200

static char lines[MAX_WRAPPERS][LINE];
static int count;
static void *handle[1];

static char *put_hex(char *p, uint64_t v, int digits) {
  for (int i = digits - 1; i >= 0; --i)
    *p++ = "0123456789abcdef"[(v >> (4 * i)) & 15];
  return p;
}

static char *put_dec(char *p, uint64_t v) {
  char tmp[24];
  int n = 0;
  do {
    tmp[n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v);
  while (n)
    *p++ = tmp[--n];
  return p;
}

// One line: "<magic hex> <version> <reserved1> <hex bytes>".
__declspec(dllexport) void **__hipRegisterFatBinary(const void *data) {
  const wrapper_t *w = (const wrapper_t *)data;
  if (count == MAX_WRAPPERS)
    return handle;
  char *p = lines[count++];
  p = put_hex(p, w->magic, 8);
  *p++ = ' ';
  p = put_dec(p, w->version);
  *p++ = ' ';
  p = put_dec(p, w->reserved1);
  *p++ = ' ';
  uint64_t n = 4096 - ((uintptr_t)w->binary & 4095);
  if (n > 1024)
    n = 1024;
  for (uint64_t i = 0; i < n; i++)
    p = put_hex(p, w->binary[i], 2);
  *p = 0;
  return handle;
}

__declspec(dllexport) int kp_stub_count(void) { return count; }
__declspec(dllexport) const char *kp_stub_line(int i) {
  return i >= 0 && i < count ? lines[i] : "";
}

__declspec(dllexport) void __hipUnregisterFatBinary(void **h) { (void)h; }
__declspec(dllexport) void __hipRegisterFunction(void) {}
__declspec(dllexport) void __hipRegisterVar(void) {}
__declspec(dllexport) void __hipRegisterManagedVar(void) {}
__declspec(dllexport) void __hipRegisterSurface(void) {}
__declspec(dllexport) void __hipRegisterTexture(void) {}
__declspec(dllexport) int __hipPushCallConfiguration(void) { return 0; }
__declspec(dllexport) int __hipPopCallConfiguration(void) { return 0; }
// Kernels are never launched: there is no GPU.
__declspec(dllexport) int hipLaunchKernel(void) { return 1; }
