// Vector add and SAXPY: the fixtures libvadd*.so, vadd_pie, vadd_nopie,
// libwide.so, and one of libmulti.so's objects.
#include "kpack_hip.h"

__host__ __device__ static inline float vadd_op(float a, float b) {
  return a + b;
}

__global__ void vadd(const float *a, const float *b, float *c, unsigned n) {
  unsigned i = kp_global_id();
  if (i < n)
    c[i] = vadd_op(a[i], b[i]);
}

__global__ void saxpy(float alpha, const float *x, float *y, unsigned n) {
  unsigned i = kp_global_id();
  if (i < n)
    y[i] = alpha * x[i] + y[i];
}

extern "C" int vadd_launch(const float *a, const float *b, float *c,
                           unsigned n) {
  return kp_launch(vadd, (n + 255) / 256, 256, a, b, c, n);
}

extern "C" int saxpy_launch(float alpha, const float *x, float *y,
                            unsigned n) {
  return kp_launch(saxpy, (n + 255) / 256, 256, alpha, x, y, n);
}

// Host-only: c = a + b with a[i] = i, b[i] = 2i for i < 1024; returns
// sum(c) = 1571328.
extern "C" int vadd_host_check(void) {
  float c[1024];
  for (unsigned i = 0; i < 1024; ++i)
    c[i] = vadd_op((float)i, 2.0f * (float)i);
  long sum = 0;
  for (float v : c)
    sum += (long)v;
  return (int)sum;
}
