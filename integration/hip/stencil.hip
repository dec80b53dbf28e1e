// Three-point stencil with weights in constant memory (one of libmulti.so's
// objects).
#include "kpack_hip.h"

__constant__ float stencil_weights[3] = {1.0f, 2.0f, 1.0f};

__host__ __device__ static inline float stencil_point(const float *w,
                                                      const float *in,
                                                      unsigned i) {
  return w[0] * in[i - 1] + w[1] * in[i] + w[2] * in[i + 1];
}

__global__ void stencil3(const float *in, float *out, unsigned n) {
  unsigned i = kp_global_id();
  if (i > 0 && i + 1 < n)
    out[i] = stencil_point(stencil_weights, in, i);
}

extern "C" int stencil_launch(const float *in, float *out, unsigned n) {
  return kp_launch(stencil3, (n + 127) / 128, 128, in, out, n);
}

// Host-only: stencil over in[i] = i, i < 100; returns the sum of the interior
// points, sum(4i for 1 <= i <= 98) = 19404.
extern "C" int stencil_host_check(void) {
  const float w[3] = {1.0f, 2.0f, 1.0f};
  float in[100];
  for (unsigned i = 0; i < 100; ++i)
    in[i] = (float)i;
  long sum = 0;
  for (unsigned i = 1; i + 1 < 100; ++i)
    sum += (long)stencil_point(w, in, i);
  return (int)sum;
}
