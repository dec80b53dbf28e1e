// Declarations shared by the -fgpu-rdc translation units rdc_a/b/c.hip
// (librdc.so): device functions and a device variable defined in one unit
// and used in the others, resolved by the device link.
#pragma once
#include "kpack_hip.h"

__device__ float rdc_scale(float x);   // rdc_a.hip
__device__ float rdc_shift(float x);   // rdc_b.hip
extern __device__ unsigned rdc_calls;  // rdc_c.hip

// Host side of each unit, combined by rdc_host_check.
extern "C" int rdc_host_a(void);
extern "C" int rdc_host_b(void);
extern "C" int rdc_host_c(void);
