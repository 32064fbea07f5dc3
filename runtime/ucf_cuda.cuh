/* ucf_cuda.cuh: device helpers included by every CUDA kernel ucf generates.
 *
 * The same text builds two ways: with nvcc for a GPU, or, with
 * UCF_CUDA_EMULATION defined, as C++ against ucf_cuda_emu.h, which runs the
 * kernels on the CPU with warp-lockstep semantics (see that header). Nothing
 * below may depend on which one it is, except the launch plumbing.
 *
 * Launching: host code launches through UCF_LAUNCH(kernel, grid, block,
 * shmem, args...) and returns ucf_launch_error() (0 on success). A template
 * kernel whose name contains a comma goes in parentheses,
 * `UCF_LAUNCH((kern<float, 4>), ...)`, or through a pointer, since the
 * preprocessor would split the name. Dynamic shared memory is ucf_dynamic_shared<T>(),
 * never `extern __shared__` (which the emulator cannot express).
 */
#ifndef UCF_CUDA_CUH
#define UCF_CUDA_CUH

#ifdef UCF_CUDA_EMULATION
#include "ucf_cuda_emu.h"
typedef _Float16 ucf_half; /* half-precision stored values (csr@float16) */
#else
#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
typedef __half ucf_half;
#endif

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#ifdef UCF_CUDA_EMULATION

#define UCF_LAUNCH(kernel, grid, block, shmem, ...) \
  ::ucf_emu::launch(#kernel, (grid), (block), (shmem), kernel __VA_OPT__(, ) __VA_ARGS__)

/* The first error since the previous call (deadlock, invalid collective or
 * configuration); ucf_emu_message() says what happened. */
static inline int ucf_launch_error() { return ::ucf_emu::take_status(); }

template <typename T>
__device__ __forceinline__ T* ucf_dynamic_shared() {
  return static_cast<T*>(::ucf_emu::dynamic_shared());
}

#else

#define UCF_LAUNCH(kernel, grid, block, shmem, ...) \
  kernel<<<(grid), (block), (shmem)>>>(__VA_ARGS__)

/* A launch error shows at once; a fault inside the kernel only at the sync. */
static inline int ucf_launch_error() {
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  return static_cast<int>(err);
}

template <typename T>
__device__ __forceinline__ T* ucf_dynamic_shared() {
  extern __shared__ __align__(16) unsigned char ucf_shared_bytes[];
  return reinterpret_cast<T*>(ucf_shared_bytes);
}

#endif

/* The min/max of generated index arithmetic (as ucf_runtime.h gives C kernels). */
/* min and max per type, as in ucf_runtime.h (a NaN comparison picks the second operand). */
#define UCF_MINMAX(T, S)                                                                 \
  __host__ __device__ __forceinline__ T ucf_min_##S(T a, T b) { return a < b ? a : b; } \
  __host__ __device__ __forceinline__ T ucf_max_##S(T a, T b) { return a > b ? a : b; }
UCF_MINMAX(int32_t, i32)
UCF_MINMAX(int64_t, i64)
UCF_MINMAX(float, f32)
UCF_MINMAX(double, f64)

/* A bfloat16 (its bits, held in uint16_t) as the float32 it is, as in ucf_runtime.h. */
__host__ __device__ __forceinline__ float ucf_bf16_f32(uint16_t b) {
  uint32_t bits = (uint32_t)b << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

/* The launcher's own reads and writes of device arrays: a few scalars that
 * size a grid, such as the number of nonzeros A1_pos[n]. With CUDA they copy
 * one element (and order with the launches, as cudaMemcpy does); the emulator's
 * arrays are host memory. */
template <typename T>
static inline T ucf_host_load(const T* p, int64_t i) {
#ifdef UCF_CUDA_EMULATION
  return p[i];
#else
  T v{};
  cudaMemcpy(&v, p + i, sizeof(T), cudaMemcpyDeviceToHost);
  return v;
#endif
}

template <typename T, typename V>
static inline void ucf_host_store(T* p, int64_t i, V value) {
  const T v = static_cast<T>(value);
#ifdef UCF_CUDA_EMULATION
  p[i] = v;
#else
  cudaMemcpy(p + i, &v, sizeof(T), cudaMemcpyHostToDevice);
#endif
}

#ifndef UCF_CUDA_EMULATION
/* The text of a status a launcher returned, for callers without the CUDA headers. */
extern "C" __attribute__((used, visibility("default"))) inline const char* ucf_cuda_error_string(
    int status) {
  return cudaGetErrorString(static_cast<cudaError_t>(status));
}
#endif

/* atomicAdd for every value type ucf computes in; like atomicAdd it returns the
 * old value (a claimed slot). CUDA has no signed 64-bit atomicAdd (int64_t is
 * long on LP64); two's-complement addition is the same bit operation as
 * unsigned addition, so that overload serves. */
template <typename T>
__device__ __forceinline__ T ucf_atomic_add(T* p, T v) {
  if constexpr (std::is_integral_v<T> && std::is_signed_v<T> && sizeof(T) == 8) {
    return static_cast<T>(
        atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v)));
  } else {
    return atomicAdd(p, v);
  }
}

/* The G lanes of the calling thread's tile add into one out[idx]: one atomic
 * per tile instead of G. A lane with a negative idx has nothing to add (a lane
 * whose share of a loop never reached the store); the others must all pass the
 * same idx, and the tile writes there. A tile whose lanes all pass a negative
 * idx writes nothing. */
template <typename T, int G>
__device__ __forceinline__ void atomicAddGroup(T* out, int64_t idx, T val) {
  static_assert(G >= 1 && G <= 32 && (G & (G - 1)) == 0, "G must be 1, 2, 4, 8, 16 or 32");
  const auto tile = cooperative_groups::tiled_partition<G>(cooperative_groups::this_thread_block());
  const unsigned active = tile.ballot(idx >= 0);
  if (active == 0u) return; /* the same in every lane of the tile */
  const int64_t dest = tile.shfl(idx, __ffs(static_cast<int>(active)) - 1);
  if (idx < 0) val = T(0);
  /* shfl_down stays inside the tile (width G); only rank 0's sum is complete. */
  for (unsigned off = G / 2; off > 0; off /= 2) val += tile.shfl_down(val, off);
  if (tile.thread_rank() == 0) ucf_atomic_add(&out[dest], val);
}

/* Segmented reduction over the tile: consecutive lanes with equal idx form a
 * segment, and the first lane of each segment adds the segment's sum into
 * out[idx]. Lanes with idx < 0 are inactive: they take part in the shuffles
 * (the helper is convergent, so every lane of the tile must call it) but add
 * nothing and write nothing.
 *
 * Why the ballot: lanes l and l+d may hold equal idx without being in one
 * segment (5, 7, 5), so comparing idx across distance d is wrong. The ballot
 * of segment heads tells each lane exactly whether a head lies in
 * (l, l+d], i.e. whether lane l+d is still in its segment. */
template <typename T, int G>
__device__ __forceinline__ void segReduceGroup(T* out, int64_t idx, T val) {
  static_assert(G >= 1 && G <= 32 && (G & (G - 1)) == 0, "G must be 1, 2, 4, 8, 16 or 32");
  const auto tile = cooperative_groups::tiled_partition<G>(cooperative_groups::this_thread_block());
  const unsigned lane = tile.thread_rank();
  const int64_t prev = tile.shfl_up(idx, 1);
  const bool head = lane == 0 || prev != idx;
  const unsigned heads = tile.ballot(head);
  /* Bit k: lane lane+1+k starts a segment. A shift by 32 would be undefined. */
  const unsigned later = lane + 1 < G ? heads >> (lane + 1) : 0u;
  if (idx < 0) val = T(0);
  /* Suffix scan: after the step with offset d, lane l holds the sum of
   * [l, min(l + 2d, end of l's segment)), so each head ends with its segment. */
  for (unsigned d = 1; d < G; d *= 2) {
    const T other = tile.shfl_down(val, d);
    if (lane + d < G && (later & ((1u << d) - 1u)) == 0u) val += other;
  }
  if (head && idx >= 0) ucf_atomic_add(&out[idx], val);
}

/* First position p in [lo, hi) with a[p] >= key, or hi: finds where a
 * coordinate starts in a sorted crd array (pos splits, co-iteration). */
template <typename I>
__host__ __device__ __forceinline__ int64_t ucf_lower_bound(const I* a, int64_t lo, int64_t hi,
                                                            int64_t key) {
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (static_cast<int64_t>(a[mid]) < key)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* First position p in [lo, hi) with a[p] > key, or hi: the row of a position
 * in a pos array is ucf_upper_bound(pos, 0, n + 1, p) - 1. */
template <typename I>
__host__ __device__ __forceinline__ int64_t ucf_upper_bound(const I* a, int64_t lo, int64_t hi,
                                                            int64_t key) {
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (static_cast<int64_t>(a[mid]) <= key)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

#endif /* UCF_CUDA_CUH */
