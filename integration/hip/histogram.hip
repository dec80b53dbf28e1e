// 16-bin histogram with device atomics (one of libmulti.so's objects).
#include "kpack_hip.h"

#define HIST_BINS 16

__host__ __device__ static inline unsigned hist_bin(unsigned value) {
  return value % HIST_BINS;
}

__global__ void histogram16(const unsigned *values, unsigned *bins,
                            unsigned n) {
  unsigned i = kp_global_id();
  if (i < n)
    __hip_atomic_fetch_add(&bins[hist_bin(values[i])], 1u, __ATOMIC_RELAXED,
                           __HIP_MEMORY_SCOPE_AGENT);
}

extern "C" int histogram_launch(const unsigned *values, unsigned *bins,
                                unsigned n) {
  return kp_launch(histogram16, (n + 255) / 256, 256, values, bins, n);
}

// Host-only: histogram of 0..999; returns sum(bin * count[bin]) = 7468.
extern "C" int histogram_host_check(void) {
  unsigned bins[HIST_BINS] = {0};
  for (unsigned v = 0; v < 1000; ++v)
    ++bins[hist_bin(v)];
  int weighted = 0;
  for (unsigned b = 0; b < HIST_BINS; ++b)
    weighted += (int)(b * bins[b]);
  return weighted;
}
