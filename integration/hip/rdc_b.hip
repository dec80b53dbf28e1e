#include "rdc.h"

__device__ float rdc_shift(float x) { return x + 1.0f; }

__global__ void rdc_shift_scale(float *data, unsigned n) {
  unsigned i = kp_global_id();
  if (i < n)
    data[i] = rdc_scale(rdc_shift(data[i]));
}

extern "C" int rdc_launch_b(float *data, unsigned n) {
  return kp_launch(rdc_shift_scale, (n + 63) / 64, 64, data, n);
}

extern "C" int rdc_host_b(void) { return 20; }
