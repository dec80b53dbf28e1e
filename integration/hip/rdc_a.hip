#include "rdc.h"

__device__ float rdc_scale(float x) { return 3.0f * x; }

__global__ void rdc_scale_shift(float *data, unsigned n) {
  unsigned i = kp_global_id();
  if (i < n)
    data[i] = rdc_shift(rdc_scale(data[i]));
  __hip_atomic_fetch_add(&rdc_calls, 1u, __ATOMIC_RELAXED,
                         __HIP_MEMORY_SCOPE_AGENT);
}

extern "C" int rdc_launch_a(float *data, unsigned n) {
  return kp_launch(rdc_scale_shift, (n + 63) / 64, 64, data, n);
}

extern "C" int rdc_host_a(void) { return 100; }

// Host-only: sums the host parts of the three units; returns 123.
extern "C" int rdc_host_check(void) {
  return rdc_host_a() + rdc_host_b() + rdc_host_c();
}
