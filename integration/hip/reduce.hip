// Block-wise sum reduction in shared memory (one of libmulti.so's objects).
#include "kpack_hip.h"

#define REDUCE_BLOCK 256

__host__ __device__ static inline float reduce_combine(float a, float b) {
  return a + b;
}

__global__ void reduce_sum(const float *in, float *out, unsigned n) {
  __shared__ float partial[REDUCE_BLOCK];
  unsigned t = kp_thread_id();
  unsigned i = kp_global_id();
  partial[t] = i < n ? in[i] : 0.0f;
  kp_sync_threads();
  for (unsigned s = kp_block_dim() / 2; s > 0; s >>= 1) {
    if (t < s)
      partial[t] = reduce_combine(partial[t], partial[t + s]);
    kp_sync_threads();
  }
  if (t == 0)
    out[kp_block_id()] = partial[0];
}

extern "C" int reduce_launch(const float *in, float *out, unsigned n) {
  return kp_launch(reduce_sum, (n + REDUCE_BLOCK - 1) / REDUCE_BLOCK,
                   REDUCE_BLOCK, in, out, n);
}

// Host-only: the same tree reduction, block by block, over 1..1000; returns
// 500500.
extern "C" int reduce_host_check(void) {
  const unsigned n = 1000;
  float total = 0.0f;
  for (unsigned base = 0; base < n; base += REDUCE_BLOCK) {
    float partial[REDUCE_BLOCK];
    for (unsigned t = 0; t < REDUCE_BLOCK; ++t)
      partial[t] = base + t < n ? (float)(base + t + 1) : 0.0f;
    for (unsigned s = REDUCE_BLOCK / 2; s > 0; s >>= 1)
      for (unsigned t = 0; t < s; ++t)
        partial[t] = reduce_combine(partial[t], partial[t + s]);
    total += partial[0];
  }
  return (int)total;
}
