// Minimal HIP language support for kpack's test fixtures.
//
// The fixtures are built with a plain clang (`-x hip -nogpulib -nogpuinc`):
// no ROCm headers and no device libraries, so this header supplies the few
// pieces of the HIP language the sources use. Host code links against
// libamdhip64 (Debian: libamdhip64-dev), whose registration functions the
// compiler-generated constructors call.
#pragma once

#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __host__ __attribute__((host))
#define __shared__ __attribute__((shared))
#define __constant__ __attribute__((constant))

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1)
      : x(x_), y(y_), z(z_) {}
};
typedef struct ihipStream_t *hipStream_t;
typedef int hipError_t;

// From libamdhip64. Clang's kernel stubs call it; so does kp_launch.
extern "C" hipError_t hipLaunchKernel(const void *function, dim3 grid,
                                      dim3 block, void **args,
                                      unsigned long shared_bytes,
                                      hipStream_t stream);

__device__ static inline unsigned kp_thread_id() {
  return __builtin_amdgcn_workitem_id_x();
}
__device__ static inline unsigned kp_block_id() {
  return __builtin_amdgcn_workgroup_id_x();
}
__device__ static inline unsigned kp_block_dim() {
  return __builtin_amdgcn_workgroup_size_x();
}
__device__ static inline unsigned kp_global_id() {
  return kp_block_id() * kp_block_dim() + kp_thread_id();
}
// __syncthreads(): workgroup barrier with release/acquire fences.
__device__ static inline void kp_sync_threads() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

template <typename T> struct kp_same { typedef T type; };

// Launches `kernel` on a 1-D grid of `blocks` x `threads` (needs a GPU; the
// fixtures' host checks never call it).
template <typename... P>
static inline hipError_t kp_launch(void (*kernel)(P...), unsigned blocks,
                                   unsigned threads,
                                   typename kp_same<P>::type... args) {
  void *argv[] = {&args..., nullptr};
  return hipLaunchKernel((const void *)kernel, dim3(blocks), dim3(threads),
                         argv, 0, nullptr);
}
