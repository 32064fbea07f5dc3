// Test kernels for runtime/ucf_cuda.cuh and the CPU emulator (tests/toolchain/test_cuda_runtime.py).
//
// Every launcher is extern "C", takes pointers and int64_t scalars only (so one
// ctypes harness calls them all, with host or device pointers), launches
// through UCF_LAUNCH and returns ucf_launch_error(). The same file is built
// for the emulator and checked with nvcc.
#include "ucf_cuda.cuh"

namespace cg = cooperative_groups;

static constexpr unsigned kFull = 0xFFFFFFFFu;

static unsigned blocks_for(int64_t n, int64_t threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

// ---- the group helpers ------------------------------------------------------

// Lanes past n still call the helpers, which are convergent over the tile.
template <typename T, int G>
__global__ void seg_reduce_kernel(T* out, const int64_t* idx, const T* val, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  segReduceGroup<T, G>(out, i < n ? idx[i] : -1, i < n ? val[i] : T(0));
}

template <typename T, int G>
__global__ void atomic_group_kernel(T* out, const int64_t* idx, const T* val, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  atomicAddGroup<T, G>(out, i < n ? idx[i] : -1, i < n ? val[i] : T(0));
}

#define GROUP_LAUNCHERS(T, NAME, G)                                                        \
  extern "C" int seg_reduce_##NAME##_g##G(T* out, const int64_t* idx, const T* val,       \
                                          int64_t n, int64_t threads) {                    \
    UCF_LAUNCH((seg_reduce_kernel<T, G>), blocks_for(n, threads), threads, 0, out, idx, val, \
               n);                                                                         \
    return ucf_launch_error();                                                             \
  }                                                                                        \
  extern "C" int atomic_group_##NAME##_g##G(T* out, const int64_t* idx, const T* val,     \
                                            int64_t n, int64_t threads) {                  \
    UCF_LAUNCH((atomic_group_kernel<T, G>), blocks_for(n, threads), threads, 0, out, idx,  \
               val, n);                                                                    \
    return ucf_launch_error();                                                             \
  }

#define GROUP_SIZES(T, NAME)     \
  GROUP_LAUNCHERS(T, NAME, 1)    \
  GROUP_LAUNCHERS(T, NAME, 2)    \
  GROUP_LAUNCHERS(T, NAME, 4)    \
  GROUP_LAUNCHERS(T, NAME, 8)    \
  GROUP_LAUNCHERS(T, NAME, 16)   \
  GROUP_LAUNCHERS(T, NAME, 32)

GROUP_SIZES(float, f32)
GROUP_SIZES(double, f64)
GROUP_SIZES(int64_t, i64)

// ---- warp-synchronous semantics ---------------------------------------------

__global__ void warp_sum_kernel(double* out, const double* in) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  double v = in[i];
  for (unsigned off = 16; off > 0; off /= 2) v += __shfl_down_sync(kFull, v, off);
  if (threadIdx.x % 32 == 0) out[i / 32] = v;
}

extern "C" int warp_sum(double* out, const double* in, int64_t blocks, int64_t threads) {
  UCF_LAUNCH(warp_sum_kernel, blocks, threads, 0, out, in);
  return ucf_launch_error();
}

// One output row per shuffle mode; width and delta choices cover the segment
// edges (up/down clamping, xor into earlier and later segments).
static constexpr int kModes = 10;

__global__ void shuffle_modes_kernel(int64_t* out, const int* in, int64_t n) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned lane = threadIdx.x % 32;
  const int v = in[i];
  int64_t r[kModes];
  r[0] = __shfl_sync(kFull, v, (lane * 7 + 3) % 32);
  r[1] = __shfl_sync(kFull, v, 3, 16);
  r[2] = __shfl_up_sync(kFull, v, 3);
  r[3] = __shfl_up_sync(kFull, v, 2, 8);
  r[4] = __shfl_down_sync(kFull, v, 5);
  r[5] = __shfl_down_sync(kFull, v, 3, 8);
  r[6] = __shfl_xor_sync(kFull, v, 6);
  r[7] = __shfl_xor_sync(kFull, v, 12, 8);
  int s = v;  // butterfly: every lane ends with the sum of its 8-lane segment
  for (int m = 4; m > 0; m /= 2) s += __shfl_xor_sync(kFull, s, m, 8);
  r[8] = s;
  // 64-bit values move whole: both halves come from the same source lane.
  const long long wide = (static_cast<long long>(v) << 32) | static_cast<unsigned>(v + 1);
  r[9] = __shfl_down_sync(kFull, wide, 1);
  for (int m = 0; m < kModes; ++m) out[m * n + i] = r[m];
}

extern "C" int shuffle_modes(int64_t* out, const int* in, int64_t blocks, int64_t threads) {
  UCF_LAUNCH(shuffle_modes_kernel, blocks, threads, 0, out, in, blocks * threads);
  return ucf_launch_error();
}

// Inclusive scans: over the warp with __shfl_up_sync, over 8-lane tiles with
// thread_block_tile::shfl_up.
__global__ void scan_kernel(int64_t* warp_out, int64_t* tile_out, const int64_t* in) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned lane = threadIdx.x % 32;
  int64_t v = in[i];
  for (unsigned d = 1; d < 32; d *= 2) {
    const int64_t t = __shfl_up_sync(kFull, v, d);
    if (lane >= d) v += t;
  }
  warp_out[i] = v;
  const auto tile = cg::tiled_partition<8>(cg::this_thread_block());
  int64_t w = in[i];
  for (unsigned d = 1; d < tile.size(); d *= 2) {
    const int64_t t = tile.shfl_up(w, d);
    if (tile.thread_rank() >= d) w += t;
  }
  tile_out[i] = w;
}

extern "C" int scan(int64_t* warp_out, int64_t* tile_out, const int64_t* in, int64_t blocks,
                    int64_t threads) {
  UCF_LAUNCH(scan_kernel, blocks, threads, 0, warp_out, tile_out, in);
  return ucf_launch_error();
}

// out[warp] = the warp's ballot; tiles[3 * tile + {0,1,2}] = the 8-lane tile's
// ballot (tile-relative bits), any and all.
__global__ void ballot_kernel(int64_t* out, int64_t* tiles, const int* pred) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned b = __ballot_sync(kFull, pred[i]);
  if (threadIdx.x % 32 == 0) out[i / 32] = b;
  const auto tile = cg::tiled_partition<8>(cg::this_thread_block());
  const unsigned tb = tile.ballot(pred[i]);
  const int any = tile.any(pred[i]);
  const int all = tile.all(pred[i]);
  if (tile.thread_rank() == 0) {
    const unsigned t = blockIdx.x * tile.meta_group_size() + tile.meta_group_rank();
    tiles[3 * t + 0] = tb;
    tiles[3 * t + 1] = any;
    tiles[3 * t + 2] = all;
  }
}

extern "C" int ballot(int64_t* out, int64_t* tiles, const int* pred, int64_t blocks,
                      int64_t threads) {
  UCF_LAUNCH(ballot_kernel, blocks, threads, 0, out, tiles, pred);
  return ucf_launch_error();
}

// Lanes exchange through shared memory; only the barrier makes the neighbour's
// store visible (a fiber runs ahead to its next collective otherwise).
__global__ void exchange_kernel(int* warp_out, int* tile_out, const int* in) {
  __shared__ int s[1024];
  const unsigned t = threadIdx.x;
  const unsigned i = blockIdx.x * blockDim.x + t;
  const unsigned lane = t % 32;
  s[t] = in[i];
  __syncwarp();
  warp_out[i] = s[t - lane + (lane + 1) % 32];
  __syncwarp();
  const auto tile = cg::tiled_partition<8>(cg::this_thread_block());
  s[t] = 2 * in[i];
  tile.sync();
  tile_out[i] = s[t - tile.thread_rank() + (tile.thread_rank() + 1) % 8];
}

extern "C" int exchange(int* warp_out, int* tile_out, const int* in, int64_t blocks,
                        int64_t threads) {
  UCF_LAUNCH(exchange_kernel, blocks, threads, 0, warp_out, tile_out, in);
  return ucf_launch_error();
}

// ---- block-level ------------------------------------------------------------

__global__ void block_sum_kernel(double* out, const double* in) {
  __shared__ double s[1024];
  const unsigned t = threadIdx.x;
  s[t] = in[blockIdx.x * blockDim.x + t];
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (t < half) s[t] += s[t + half];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = s[0];
}

extern "C" int block_sum(double* out, const double* in, int64_t blocks, int64_t threads) {
  UCF_LAUNCH(block_sum_kernel, blocks, threads, 0, out, in);
  return ucf_launch_error();
}

// Each thread reverses its block's slice through dynamic shared memory.
__global__ void reverse_kernel(float* out, const float* in) {
  float* s = ucf_dynamic_shared<float>();
  const unsigned t = threadIdx.x;
  const unsigned base = blockIdx.x * blockDim.x;
  s[t] = in[base + t];
  cg::this_thread_block().sync();
  out[base + t] = s[blockDim.x - 1 - t];
}

extern "C" int reverse(float* out, const float* in, int64_t blocks, int64_t threads) {
  UCF_LAUNCH(reverse_kernel, blocks, threads, threads * sizeof(float), out, in);
  return ucf_launch_error();
}

// A 2-D grid of 2-D blocks: warps are 32 consecutive linear thread ids.
// out[kLayout * g + k]: linear id in block, first linear id of the warp (by
// shuffle), linear block id, threads per block, then the meta-group rank of
// the warp tile, and rank and size of an 8-lane tile of that warp tile.
static constexpr int kLayout = 7;

__global__ void layout_kernel(int64_t* out) {
  const unsigned linear = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned per_block = blockDim.x * blockDim.y * blockDim.z;
  int64_t* o = out + kLayout * (block * per_block + linear);
  const cg::thread_block b = cg::this_thread_block();
  o[0] = b.thread_rank() == linear ? static_cast<int64_t>(linear) : -1;
  o[1] = __shfl_sync(kFull, linear, 0);
  o[2] = block;
  o[3] = b.size() == per_block ? static_cast<int64_t>(per_block) : -1;
  const cg::thread_block_tile<32> warp = cg::tiled_partition<32>(b);
  const auto sub = cg::tiled_partition<8>(warp);
  o[4] = warp.meta_group_rank();
  o[5] = sub.meta_group_rank();
  o[6] = sub.meta_group_size();
}

extern "C" int layout(int64_t* out, int64_t gx, int64_t gy, int64_t bx, int64_t by,
                      int64_t bz) {
  UCF_LAUNCH(layout_kernel, dim3(gx, gy), dim3(bx, by, bz), 0, out);
  return ucf_launch_error();
}

// ---- atomics across blocks --------------------------------------------------

template <typename T>
__global__ void histogram_kernel(T* hist, const int* keys, const T* weights, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) atomicAdd(&hist[keys[i]], weights[i]);
}

// ucf_atomic_add is the only way to add a signed 64-bit value atomically.
__global__ void histogram_i64_kernel(int64_t* hist, const int* keys, const int64_t* weights,
                                     int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) ucf_atomic_add(&hist[keys[i]], weights[i]);
}

#define HISTOGRAM(T, NAME, KERNEL)                                                          \
  extern "C" int histogram_##NAME(T* hist, const int* keys, const T* weights, int64_t n,    \
                                  int64_t threads) {                                        \
    UCF_LAUNCH(KERNEL, blocks_for(n, threads), threads, 0, hist, keys, weights, n);         \
    return ucf_launch_error();                                                              \
  }

HISTOGRAM(int, i32, histogram_kernel<int>)
HISTOGRAM(unsigned int, u32, histogram_kernel<unsigned int>)
HISTOGRAM(unsigned long long, u64, histogram_kernel<unsigned long long>)
HISTOGRAM(float, f32, histogram_kernel<float>)
HISTOGRAM(double, f64, histogram_kernel<double>)
HISTOGRAM(int64_t, i64, histogram_i64_kernel)

// ---- search helpers ---------------------------------------------------------

__global__ void bounds_kernel(int64_t* lower, int64_t* upper, const int* a, int64_t n,
                              const int64_t* keys, int64_t m) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= m) return;
  lower[i] = ucf_lower_bound(a, 0, n, keys[i]);
  upper[i] = ucf_upper_bound(a, 0, n, keys[i]);
}

extern "C" int bounds(int64_t* lower, int64_t* upper, const int* a, int64_t n,
                      const int64_t* keys, int64_t m) {
  UCF_LAUNCH(bounds_kernel, blocks_for(m, 64), 64, 0, lower, upper, a, n, keys, m);
  return ucf_launch_error();
}

// The helpers are __host__ __device__: the same search from host code.
extern "C" int bounds_host(int64_t* lower, int64_t* upper, const int64_t* a, int64_t n,
                           const int64_t* keys, int64_t m) {
  for (int64_t i = 0; i < m; ++i) {
    lower[i] = ucf_lower_bound(a, 0, n, keys[i]);
    upper[i] = ucf_upper_bound(a, 0, n, keys[i]);
  }
  return 0;
}

// ---- misuse the emulator must report (undefined or hanging on a GPU) -------

// Half the block waits at a barrier the other half never reaches.
__global__ void divergent_sync_kernel(int* out) {
  if (threadIdx.x < 16) __syncthreads();
  out[threadIdx.x] = 1;
}

// The upper half-warp exits; the lower half shuffles with a full mask.
__global__ void exited_lane_kernel(int* out) {
  if (threadIdx.x % 32 >= 16) return;
  out[threadIdx.x] = __shfl_down_sync(kFull, static_cast<int>(threadIdx.x), 1);
}

// Lanes 0-15 wait at the block barrier, lanes 16-31 at a full-warp shuffle:
// each waits for the other.
__global__ void crossed_kernel(int* out) {
  int v = threadIdx.x;
  if (threadIdx.x < 16)
    __syncthreads();
  else
    v = __shfl_sync(kFull, v, 0);
  out[threadIdx.x] = v;
}

// The mask leaves out the calling lanes 1-31.
__global__ void foreign_mask_kernel(int* out) {
  out[threadIdx.x] = __shfl_sync(1u, static_cast<int>(threadIdx.x), 0);
}

// Lanes 0-15 shuffle among themselves; lanes 8-15 read lanes 16-23, outside
// the mask, which CUDA leaves undefined and the emulator poisons.
__global__ void outside_mask_kernel(long long* out) {
  const unsigned lane = threadIdx.x % 32;
  long long v = lane;
  if (lane < 16) v = __shfl_down_sync(0x0000FFFFu, v, 8);
  out[threadIdx.x] = v;
}

#define MISUSE(NAME, T, BLOCKS, THREADS)           \
  extern "C" int NAME(T* out) {                    \
    UCF_LAUNCH(NAME##_kernel, BLOCKS, THREADS, 0, out); \
    return ucf_launch_error();                     \
  }

// The control: a correct kernel, which must succeed after the failures above.
__global__ void fill_kernel(int* out) { out[threadIdx.x] = threadIdx.x; }

MISUSE(fill, int, 1, 32)
MISUSE(divergent_sync, int, 1, 32)
MISUSE(exited_lane, int, 1, 32)
MISUSE(crossed, int, 1, 32)
MISUSE(foreign_mask, int, 1, 32)
MISUSE(outside_mask, long long, 1, 32)

// A launch CUDA rejects: blocks of 2048 threads, or an empty grid.
extern "C" int bad_config(int* out, int64_t blocks, int64_t threads) {
  UCF_LAUNCH(divergent_sync_kernel, blocks, threads, 0, out);
  return ucf_launch_error();
}
