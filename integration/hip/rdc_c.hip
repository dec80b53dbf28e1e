#include "rdc.h"

__device__ unsigned rdc_calls = 0;

__global__ void rdc_count(unsigned *out) {
  if (kp_global_id() == 0)
    *out = rdc_calls;
}

extern "C" int rdc_launch_c(unsigned *out) {
  return kp_launch(rdc_count, 1, 1, out);
}

extern "C" int rdc_host_c(void) { return 3; }
