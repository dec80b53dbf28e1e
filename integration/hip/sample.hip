// The library behind integration/sample/libkpack_sample.so, the fat binary
// `cargo xtask demo` runs kpack on (regenerate: cargo xtask fixtures
// --refresh-sample). Device code for gfx1100 and gfx942.
#include "kpack_hip.h"

__global__ void sample_vadd(const float *a, const float *b, float *c,
                            unsigned n) {
  unsigned i = kp_global_id();
  if (i < n)
    c[i] = a[i] + b[i];
}

__global__ void sample_scale(float alpha, float *x, unsigned n) {
  unsigned i = kp_global_id();
  if (i < n)
    x[i] *= alpha;
}

extern "C" int sample_vadd_launch(const float *a, const float *b, float *c,
                                  unsigned n) {
  return kp_launch(sample_vadd, (n + 255) / 256, 256, a, b, c, n);
}

extern "C" int sample_scale_launch(float alpha, float *x, unsigned n) {
  return kp_launch(sample_scale, (n + 255) / 256, 256, alpha, x, n);
}

// Host-only: returns 1 + 2 + ... + 10 = 55.
extern "C" int sample_host_check(void) {
  int sum = 0;
  for (int i = 1; i <= 10; ++i)
    sum += i;
  return sum;
}
