/* ucf_cuda_emu.h: run ucf's CUDA kernels on a CPU, with warp-lockstep semantics.
 *
 * Why: generated CUDA must be verifiable on machines without a GPU. Compiling
 * the very same .cu text as C++ (g++ -std=c++20 -x c++ -DUCF_CUDA_EMULATION)
 * against this header gives a shared library whose launchers run every thread
 * of every block on the CPU.
 *
 * Execution model
 *  - Each thread of a block is a cooperative fiber (ucontext). One OS thread
 *    runs one block at a time; blocks are spread over UCF_EMU_THREADS OS
 *    threads (default 2), so atomics must be, and are, real atomics.
 *  - A fiber runs until it reaches a collective (__syncthreads, __syncwarp, a
 *    shuffle, a ballot, or a cooperative-groups call built on them), then
 *    yields. When no fiber can run, the scheduler completes every collective
 *    whose participants have all arrived, PTX-style: a warp collective
 *    completes when every lane of its mask waits at the same kind of
 *    collective with the same mask (the call sites may differ, as on sm_70+).
 *    A shuffle therefore returns exactly the value its source lane passed at
 *    that same collective.
 *  - Warps are 32 consecutive linear thread ids (x fastest); tiles of G lanes
 *    are G consecutive lanes of a warp.
 *
 * Stricter than hardware, on purpose (a verifier should fail loudly):
 *  - __syncthreads() must be reached by every thread of the block; a thread
 *    that exits while others wait at (or later reach) the barrier is an error.
 *  - A warp collective whose mask names an exited or non-existent lane, or
 *    that omits the calling lane, is an error.
 *  - A shuffle that reads a lane outside its mask gets a poison pattern
 *    (kPoison: a NaN as float and double, a huge value as an integer) rather
 *    than an error, because guarded code may legitimately discard it.
 *  - When nothing can proceed, the launch reports a deadlock that lists where
 *    each thread waits. Errors abandon the block (its fibers are never
 *    resumed, so objects on their stacks are not destroyed) and skip the
 *    remaining blocks; ucf_launch_error() returns the status and
 *    ucf_emu_message() describes it.
 *
 * Only what ucf's kernels use is implemented, so anything else (for example
 * __match_any_sync, __reduce_add_sync, extern __shared__) is a compile error
 * rather than a silent difference. Dynamic shared memory goes through
 * ucf_dynamic_shared<T>() from ucf_cuda.cuh.
 *
 * Fiber stacks are UCF_EMU_STACK_KIB KiB (default 256) with a guard page
 * below each, so an overflow faults instead of corrupting a neighbour.
 */
#ifndef UCF_CUDA_EMU_H
#define UCF_CUDA_EMU_H

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
/* A register-allocation hint to nvcc; generated kernels never launch more threads. */
#define __launch_bounds__(...)
/* One copy per OS thread is one copy per block: an OS thread runs one block
 * at a time, and all fibers of that block share it. Like CUDA shared memory,
 * its contents are undefined at the start of a block. */
#define __shared__ static thread_local

struct uint3 {
  unsigned int x, y, z;
};

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return {x, y, z}; }
};

namespace ucf_emu {

/* Launch status codes returned by ucf_launch_error(); 0 is success. */
enum Status : int {
  kOk = 0,
  kInvalidConfiguration = 1, /* grid/block/shared-memory sizes CUDA would reject */
  kDeadlock = 2,             /* a divergent __syncthreads, a wait for an exited lane, ... */
  kInvalidCollective = 3,    /* a mask without the caller or with absent lanes; a bad width */
  kOutOfResources = 4,       /* fiber stacks could not be allocated */
};

/* Returned by a shuffle that reads a lane outside its mask (undefined in CUDA). */
constexpr std::uint64_t kPoison = 0x7FF4DEAD7FA0DEADull;

enum class Op : unsigned char {
  kNone,
  kSyncThreads,
  kSyncWarp,
  kShfl,
  kShflUp,
  kShflDown,
  kShflXor,
  kBallot,
};

inline const char* op_name(Op op) {
  switch (op) {
    case Op::kSyncThreads: return "__syncthreads()";
    case Op::kSyncWarp: return "__syncwarp";
    case Op::kShfl: return "__shfl_sync";
    case Op::kShflUp: return "__shfl_up_sync";
    case Op::kShflDown: return "__shfl_down_sync";
    case Op::kShflXor: return "__shfl_xor_sync";
    case Op::kBallot: return "__ballot_sync";
    default: return "(none)";
  }
}

struct Block;

struct Fiber {
  enum State : unsigned char { kRunnable, kWaiting, kDone };
  ucontext_t ctx;
  Block* block = nullptr;
  uint3 tid{};
  unsigned linear = 0;
  State state = kRunnable;
  /* The collective this fiber waits at. */
  Op op = Op::kNone;
  unsigned mask = 0;
  unsigned arg = 0;   /* srcLane, delta or laneMask; PTX uses its low 5 bits */
  unsigned width = 32;
  unsigned size = 0;  /* bytes of the shuffled type: an int and a double shuffle never pair */
  std::uint64_t value = 0;
  std::uint64_t result = 0;
};

/* One launch: its configuration and the type-erased kernel call. */
struct Kernel {
  const char* name;
  dim3 grid, block;
  std::size_t shmem;
  unsigned nthreads;
  void (*body)(const void*);
  const void* args;
  std::atomic<bool> failed{false};
};

struct Block {
  const Kernel* kernel = nullptr;
  uint3 idx{};
  Fiber* fibers = nullptr;
  unsigned done = 0;
  unsigned char* dynamic_shared = nullptr;
  ucontext_t scheduler;
  int status = kOk;
  std::string message;

  void fail(int code, const std::string& what) {
    if (status != kOk) return;
    status = code;
    char where[256];
    std::snprintf(where, sizeof where, "kernel '%s' block (%u,%u,%u): ", kernel->name, idx.x, idx.y,
                  idx.z);
    message = where + what;
  }
};

/* ---- the process-wide status that ucf_launch_error() reads ---------------- */

struct ErrorState {
  std::mutex mutex;
  int status = kOk;
  std::string message;
};

inline ErrorState& error_state() {
  static ErrorState state;
  return state;
}

/* Keeps the first error since the last take_status(): later ones are usually
 * consequences of it. The message outlives take_status() so that a caller can
 * read it after the launcher returned the code. */
inline void record(int status, const std::string& message) {
  ErrorState& s = error_state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.status != kOk) return;
  s.status = status;
  s.message = message;
}

inline int take_status() {
  ErrorState& s = error_state();
  std::lock_guard<std::mutex> lock(s.mutex);
  const int status = s.status;
  s.status = kOk;
  return status;
}

/* ---- what device code sees ------------------------------------------------ */

inline thread_local Fiber* tls_fiber = nullptr;

inline Fiber& self() {
  Fiber* f = tls_fiber;
  if (f == nullptr) {
    std::fputs("ucf_cuda_emu: device code ran outside a kernel launch\n", stderr);
    std::abort();
  }
  return *f;
}

inline const uint3& thread_idx() { return self().tid; }
inline const uint3& block_idx() { return self().block->idx; }
inline const dim3& block_dim() { return self().block->kernel->block; }
inline const dim3& grid_dim() { return self().block->kernel->grid; }
/* A function, not a constant: warpSize is no constant expression in CUDA either. */
inline int warp_size() { return 32; }
inline void* dynamic_shared() { return self().block->dynamic_shared; }

/* Fails the current block from inside a fiber and never returns to it. */
[[noreturn]] __attribute__((format(printf, 2, 3))) inline void fail_here(int status,
                                                                         const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  Fiber& f = self();
  f.block->fail(status, buf);
  swapcontext(&f.ctx, &f.block->scheduler);
  std::abort(); /* unreachable: an abandoned fiber is never resumed */
}

/* Arrive at a collective, wait until the scheduler completes it, return this lane's result. */
inline std::uint64_t collective(Op op, unsigned mask, unsigned arg, unsigned width, unsigned size,
                                std::uint64_t value) {
  Fiber& f = self();
  if (op != Op::kSyncThreads) {
    const unsigned lane = f.linear & 31u;
    if (((mask >> lane) & 1u) == 0)
      fail_here(kInvalidCollective,
                "%s(mask=0x%08x) called by thread (%u,%u,%u), lane %u, which is not in its mask",
                op_name(op), mask, f.tid.x, f.tid.y, f.tid.z, lane);
    if (width == 0 || width > 32 || (width & (width - 1)) != 0)
      fail_here(kInvalidCollective, "%s: width %d is not a power of two in [1, 32]", op_name(op),
                static_cast<int>(width));
  }
  f.op = op;
  f.mask = mask;
  f.arg = arg;
  f.width = width;
  f.size = size;
  f.value = value;
  f.state = Fiber::kWaiting;
  swapcontext(&f.ctx, &f.block->scheduler);
  return f.result;
}

/* Any trivially copyable value travels in 8-byte pieces, each its own
 * collective, as cooperative groups does with 32-bit shuffles. */
template <typename T>
inline T shuffle(Op op, unsigned mask, const T& var, unsigned arg, int width) {
  static_assert(std::is_trivially_copyable_v<T>, "shuffled types must be trivially copyable");
  std::array<unsigned char, sizeof(T)> in, out;
  std::memcpy(in.data(), &var, sizeof(T));
  for (std::size_t off = 0; off < sizeof(T); off += 8) {
    const std::size_t n = std::min<std::size_t>(8, sizeof(T) - off);
    std::uint64_t chunk = 0;
    std::memcpy(&chunk, in.data() + off, n);
    const std::uint64_t r =
        collective(op, mask, arg, static_cast<unsigned>(width), sizeof(T), chunk);
    std::memcpy(out.data() + off, &r, n);
  }
  return std::bit_cast<T>(out);
}

/* ---- the scheduler -------------------------------------------------------- */

inline void fiber_entry() {
  Fiber* f = tls_fiber;
  const Kernel& k = *f->block->kernel;
  k.body(k.args);
  f->state = Fiber::kDone;
  f->block->done++;
  /* Returning resumes uc_link, the scheduler. */
}

/* The source lane of a shuffle, following the PTX shfl.sync definition. */
inline unsigned shuffle_source(Op op, unsigned lane, unsigned arg, unsigned width) {
  const unsigned bval = arg & 31u;
  const unsigned first = lane & ~(width - 1);   /* first lane of this lane's segment */
  const unsigned last = first + width - 1;      /* last lane of the segment */
  switch (op) {
    case Op::kShfl: return first | (bval & (width - 1));
    case Op::kShflUp: return (lane >= first + bval) ? lane - bval : lane;
    case Op::kShflDown: return (lane + bval <= last) ? lane + bval : lane;
    case Op::kShflXor: return ((lane ^ bval) <= last) ? (lane ^ bval) : lane;
    default: return lane;
  }
}

inline void complete(Block& b, unsigned base, unsigned mask) {
  Fiber* w = b.fibers + base;
  const Op op = w[std::countr_zero(mask)].op;
  if (op == Op::kBallot) {
    unsigned bits = 0;
    for (unsigned lane = 0; lane < 32; ++lane)
      if (((mask >> lane) & 1u) && w[lane].value != 0) bits |= 1u << lane;
    for (unsigned lane = 0; lane < 32; ++lane)
      if ((mask >> lane) & 1u) w[lane].result = bits;
  } else if (op != Op::kSyncWarp) {
    for (unsigned lane = 0; lane < 32; ++lane) {
      if (((mask >> lane) & 1u) == 0) continue;
      const unsigned src = shuffle_source(op, lane, w[lane].arg, w[lane].width);
      w[lane].result = ((mask >> src) & 1u) ? w[src].value : kPoison;
    }
  }
  for (unsigned lane = 0; lane < 32; ++lane)
    if ((mask >> lane) & 1u) w[lane].state = Fiber::kRunnable;
}

/* Where every thread is stuck, as runs of linear thread ids. */
inline std::string describe(const Block& b) {
  std::string out = "deadlock: no thread can proceed;";
  const unsigned n = b.kernel->nthreads;
  /* An exited thread's op and mask are stale: only its state counts. */
  const auto same = [](const Fiber& f, const Fiber& g) {
    return f.state == g.state &&
           (f.state == Fiber::kDone || (f.op == g.op && f.mask == g.mask));
  };
  int runs = 0;
  for (unsigned i = 0; i < n;) {
    const Fiber& f = b.fibers[i];
    unsigned j = i + 1;
    while (j < n && same(f, b.fibers[j])) ++j;
    if (++runs > 12) {
      out += " ...";
      break;
    }
    char who[64], buf[192];
    if (j == i + 1)
      std::snprintf(who, sizeof who, " thread %u", i);
    else
      std::snprintf(who, sizeof who, " threads %u-%u", i, j - 1);
    if (f.state == Fiber::kDone)
      std::snprintf(buf, sizeof buf, "%s exited;", who);
    else if (f.op == Op::kSyncThreads)
      std::snprintf(buf, sizeof buf, "%s wait at __syncthreads();", who);
    else
      std::snprintf(buf, sizeof buf, "%s wait at %s(mask=0x%08x);", who, op_name(f.op), f.mask);
    out += buf;
    i = j;
  }
  return out + " (linear thread ids)";
}

/* Complete every collective whose participants have all arrived. Called only
 * when no fiber is runnable; fails the block when nothing can complete. */
inline void resolve(Block& b) {
  const unsigned n = b.kernel->nthreads;
  Fiber* fs = b.fibers;
  unsigned at_barrier = 0;
  for (unsigned i = 0; i < n; ++i)
    if (fs[i].state == Fiber::kWaiting && fs[i].op == Op::kSyncThreads) ++at_barrier;
  if (at_barrier != 0) {
    if (b.done != 0) {
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    "__syncthreads() reached by %u of %u threads while %u exited without "
                    "reaching it (a barrier in divergent code)",
                    at_barrier, n, b.done);
      b.fail(kDeadlock, buf);
      return;
    }
    if (at_barrier == n) {
      for (unsigned i = 0; i < n; ++i) fs[i].state = Fiber::kRunnable;
      return;
    }
  }
  bool progress = false;
  for (unsigned i = 0; i < n; ++i) {
    const Fiber& f = fs[i];
    if (f.state != Fiber::kWaiting || f.op == Op::kSyncThreads) continue;
    const unsigned base = i & ~31u;
    bool ready = true;
    for (unsigned lane = 0; lane < 32; ++lane) {
      if (((f.mask >> lane) & 1u) == 0) continue;
      char buf[256];
      if (base + lane >= n) {
        std::snprintf(buf, sizeof buf,
                      "%s(mask=0x%08x) in warp %u names lane %u, but the block has only %u "
                      "threads",
                      op_name(f.op), f.mask, i / 32, lane, n);
        b.fail(kInvalidCollective, buf);
        return;
      }
      const Fiber& g = fs[base + lane];
      if (g.state == Fiber::kDone) {
        std::snprintf(buf, sizeof buf,
                      "%s(mask=0x%08x) by thread %u waits for lane %u of warp %u, which has "
                      "exited",
                      op_name(f.op), f.mask, i, lane, i / 32);
        b.fail(kDeadlock, buf);
        return;
      }
      if (g.state != Fiber::kWaiting || g.op != f.op || g.mask != f.mask || g.size != f.size)
        ready = false;
    }
    if (ready) {
      complete(b, base, f.mask);
      progress = true;
    }
  }
  if (!progress) b.fail(kDeadlock, describe(b));
}

inline std::size_t env_size(const char* name, std::size_t fallback, std::size_t lo,
                            std::size_t hi) {
  const char* s = std::getenv(name);
  if (s == nullptr || *s == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s, &end, 10);
  if (end == s || *end != '\0') return fallback;
  return std::clamp<std::size_t>(v, lo, hi);
}

/* The fibers, stacks and dynamic shared memory of one OS thread, reused for
 * every block it runs in a launch. */
class Worker {
 public:
  explicit Worker(const Kernel& k)
      : kernel_(k),
        page_(static_cast<std::size_t>(sysconf(_SC_PAGESIZE))),
        stack_((env_size("UCF_EMU_STACK_KIB", 256, 16, 1 << 20) * 1024 + page_ - 1) / page_ *
               page_),
        fibers_(k.nthreads),
        shared_((k.shmem + sizeof(std::max_align_t) - 1) / sizeof(std::max_align_t) + 1) {
    bytes_ = (stack_ + page_) * k.nthreads;
    void* p = mmap(nullptr, bytes_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return;
    region_ = static_cast<unsigned char*>(p);
    for (unsigned i = 0; i < k.nthreads; ++i) {
      /* Layout per fiber: [guard page][stack], the stack growing down toward the guard. */
      if (mprotect(stack_base(i), stack_, PROT_READ | PROT_WRITE) != 0) {
        munmap(region_, bytes_);
        region_ = nullptr;
        return;
      }
    }
  }
  ~Worker() {
    if (region_ != nullptr) munmap(region_, bytes_);
  }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  bool ok() const { return region_ != nullptr; }

  void run(Block& b) {
    const Kernel& k = kernel_;
    const unsigned n = k.nthreads;
    b.fibers = fibers_.data();
    b.dynamic_shared = reinterpret_cast<unsigned char*>(shared_.data());
    b.done = 0;
    for (unsigned i = 0; i < n; ++i) {
      Fiber& f = fibers_[i];
      f.block = &b;
      f.linear = i;
      f.tid = {i % k.block.x, (i / k.block.x) % k.block.y, i / (k.block.x * k.block.y)};
      f.state = Fiber::kRunnable;
      f.op = Op::kNone;
      getcontext(&f.ctx);
      f.ctx.uc_stack.ss_sp = stack_base(i);
      f.ctx.uc_stack.ss_size = stack_;
      f.ctx.uc_link = &b.scheduler;
      makecontext(&f.ctx, fiber_entry, 0);
    }
    while (b.status == kOk) {
      for (unsigned i = 0; i < n && b.status == kOk; ++i) {
        if (fibers_[i].state != Fiber::kRunnable) continue;
        tls_fiber = &fibers_[i];
        swapcontext(&b.scheduler, &fibers_[i].ctx);
      }
      tls_fiber = nullptr;
      if (b.status != kOk || b.done == n) break;
      resolve(b);
    }
    tls_fiber = nullptr;
  }

 private:
  unsigned char* stack_base(unsigned i) const { return region_ + i * (stack_ + page_) + page_; }

  const Kernel& kernel_;
  std::size_t page_, stack_, bytes_ = 0;
  unsigned char* region_ = nullptr;
  std::vector<Fiber> fibers_;
  std::vector<std::max_align_t> shared_;
};

inline std::string config_error(const Kernel& k) {
  const dim3 g = k.grid, t = k.block;
  const unsigned long long threads = 1ull * t.x * t.y * t.z;
  const char* why = nullptr;
  if (g.x == 0 || g.y == 0 || g.z == 0)
    why = "a grid dimension is 0";
  else if (g.x > 0x7FFFFFFFu || g.y > 65535 || g.z > 65535)
    why = "the grid exceeds (2^31-1, 65535, 65535)";
  else if (t.x == 0 || t.y == 0 || t.z == 0)
    why = "a block dimension is 0";
  else if (t.x > 1024 || t.y > 1024 || t.z > 64 || threads > 1024)
    why = "the block exceeds 1024 threads (or (1024, 1024, 64))";
  else if (k.shmem > 48 * 1024)
    why = "more than 48 KiB of dynamic shared memory";
  if (why == nullptr) return {};
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "kernel '%s': invalid launch configuration grid (%u,%u,%u) block (%u,%u,%u) "
                "shared %zu: %s",
                k.name, g.x, g.y, g.z, t.x, t.y, t.z, k.shmem, why);
  return buf;
}

inline void run(Kernel& k) {
  if (tls_fiber != nullptr) {
    record(kInvalidConfiguration, std::string("kernel '") + k.name +
                                      "': launched from device code (not supported)");
    return;
  }
  if (const std::string why = config_error(k); !why.empty()) {
    record(kInvalidConfiguration, why);
    return;
  }
  k.nthreads = k.block.x * k.block.y * k.block.z;
  const unsigned long long nblocks = 1ull * k.grid.x * k.grid.y * k.grid.z;
  const unsigned long long nworkers =
      std::min<unsigned long long>(env_size("UCF_EMU_THREADS", 2, 1, 256), nblocks);
  std::atomic<unsigned long long> next{0};
  auto work = [&k, &next, nblocks] {
    Worker w(k);
    if (!w.ok()) {
      record(kOutOfResources, std::string("kernel '") + k.name +
                                  "': cannot allocate fiber stacks (lower UCF_EMU_STACK_KIB)");
      k.failed = true;
      return;
    }
    while (!k.failed) {
      const unsigned long long id = next++;
      if (id >= nblocks) break;
      Block b;
      b.kernel = &k;
      b.idx = {static_cast<unsigned>(id % k.grid.x),
               static_cast<unsigned>(id / k.grid.x % k.grid.y),
               static_cast<unsigned>(id / (1ull * k.grid.x * k.grid.y))};
      w.run(b);
      if (b.status != kOk) {
        record(b.status, b.message);
        k.failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned long long i = 1; i < nworkers; ++i) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
}

/* UCF_LAUNCH lands here. Arguments are evaluated once, at the launch, and
 * copied, as with <<<...>>>; every thread calls the kernel with the copies. */
template <typename K, typename... A>
void launch(const char* name, dim3 grid, dim3 block, std::size_t shmem, K kernel, A... args) {
  using Call = std::tuple<K, A...>;
  const Call call{kernel, args...};
  const auto body = [](const void* p) {
    std::apply([](K f, const A&... a) { f(a...); }, *static_cast<const Call*>(p));
  };
  Kernel k{name, grid, block, shmem, 0, body, &call};
  run(k);
}

}  // namespace ucf_emu

#define threadIdx (::ucf_emu::thread_idx())
#define blockIdx (::ucf_emu::block_idx())
#define blockDim (::ucf_emu::block_dim())
#define gridDim (::ucf_emu::grid_dim())
#define warpSize (::ucf_emu::warp_size())

/* ---- intrinsics --------------------------------------------------------- */

inline void __syncthreads() { ::ucf_emu::collective(::ucf_emu::Op::kSyncThreads, 0, 0, 32, 0, 0); }

inline void __syncwarp(unsigned mask = 0xFFFFFFFFu) {
  ::ucf_emu::collective(::ucf_emu::Op::kSyncWarp, mask, 0, 32, 0, 0);
}

inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return static_cast<unsigned>(
      ::ucf_emu::collective(::ucf_emu::Op::kBallot, mask, 0, 32, 4, predicate != 0));
}
/* The position of the lowest set bit, counting from 1; 0 for 0. */
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __any_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) != 0; }
inline int __all_sync(unsigned mask, int predicate) {
  return __ballot_sync(mask, predicate) == mask;
}

/* Exactly CUDA's overload set, so that overload resolution (and its failures)
 * match nvcc's. */
#define UCF_EMU_SHUFFLES(T)                                                              \
  inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {             \
    return ::ucf_emu::shuffle(::ucf_emu::Op::kShfl, mask, var, static_cast<unsigned>(src_lane), \
                              width);                                                    \
  }                                                                                      \
  inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {        \
    return ::ucf_emu::shuffle(::ucf_emu::Op::kShflUp, mask, var, delta, width);          \
  }                                                                                      \
  inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {      \
    return ::ucf_emu::shuffle(::ucf_emu::Op::kShflDown, mask, var, delta, width);        \
  }                                                                                      \
  inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {        \
    return ::ucf_emu::shuffle(::ucf_emu::Op::kShflXor, mask, var,                        \
                              static_cast<unsigned>(lane_mask), width);                  \
  }
UCF_EMU_SHUFFLES(int)
UCF_EMU_SHUFFLES(unsigned int)
UCF_EMU_SHUFFLES(long)
UCF_EMU_SHUFFLES(unsigned long)
UCF_EMU_SHUFFLES(long long)
UCF_EMU_SHUFFLES(unsigned long long)
UCF_EMU_SHUFFLES(float)
UCF_EMU_SHUFFLES(double)
#undef UCF_EMU_SHUFFLES

/* Blocks may run on several OS threads, so these are real atomics. CUDA has
 * no signed 64-bit atomicAdd; neither does the emulator. */
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline unsigned int atomicAdd(unsigned int* p, unsigned int v) {
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
inline float atomicAdd(float* p, float v) {
  return std::atomic_ref<float>(*p).fetch_add(v, std::memory_order_relaxed);
}
inline double atomicAdd(double* p, double v) {
  return std::atomic_ref<double>(*p).fetch_add(v, std::memory_order_relaxed);
}

/* ---- cooperative groups (the subset ucf uses) ----------------------------- */

namespace cooperative_groups {

class thread_block {
 public:
  static void sync() { __syncthreads(); }
  static unsigned int thread_rank() { return ::ucf_emu::self().linear; }
  static unsigned int num_threads() { return ::ucf_emu::self().block->kernel->nthreads; }
  static unsigned int size() { return num_threads(); }
  static dim3 group_index() { return blockIdx; }
  static dim3 thread_index() { return threadIdx; }
};

inline thread_block this_thread_block() { return thread_block(); }

/* A tile of Size consecutive lanes of a warp. ParentT only matters for the
 * type, as in CUDA: thread_block_tile<N, thread_block> converts to
 * thread_block_tile<N>, which keeps the meta-group rank and size. */
template <unsigned int Size, typename ParentT = void>
class thread_block_tile {
  static_assert(Size >= 1 && Size <= 32 && (Size & (Size - 1)) == 0,
                "Size must be one of 1/2/4/8/16/32");

 public:
  template <typename P>
  thread_block_tile(const thread_block_tile<Size, P>& other)
      : meta_rank_(other.meta_rank_), meta_size_(other.meta_size_) {}

  static unsigned int thread_rank() { return ::ucf_emu::self().linear & (Size - 1); }
  static constexpr unsigned int num_threads() { return Size; }
  static constexpr unsigned int size() { return Size; }
  unsigned int meta_group_rank() const { return meta_rank_; }
  unsigned int meta_group_size() const { return meta_size_; }

  static void sync() { __syncwarp(mask()); }

  template <typename T>
  T shfl(T var, int src_rank) const {
    return ::ucf_emu::shuffle(::ucf_emu::Op::kShfl, mask(), var, static_cast<unsigned>(src_rank),
                              Size);
  }
  template <typename T>
  T shfl_up(T var, unsigned int delta) const {
    return ::ucf_emu::shuffle(::ucf_emu::Op::kShflUp, mask(), var, delta, Size);
  }
  template <typename T>
  T shfl_down(T var, unsigned int delta) const {
    return ::ucf_emu::shuffle(::ucf_emu::Op::kShflDown, mask(), var, delta, Size);
  }
  template <typename T>
  T shfl_xor(T var, unsigned int lane_mask) const {
    return ::ucf_emu::shuffle(::ucf_emu::Op::kShflXor, mask(), var, lane_mask, Size);
  }

  /* Bits are relative to the tile: bit r is the lane of rank r. */
  unsigned int ballot(int predicate) const {
    return __ballot_sync(mask(), predicate) >> (lane() & ~(Size - 1));
  }
  int any(int predicate) const { return __ballot_sync(mask(), predicate) != 0; }
  int all(int predicate) const { return __ballot_sync(mask(), predicate) == mask(); }

 private:
  template <unsigned int, typename>
  friend class thread_block_tile;
  template <unsigned int N>
  friend thread_block_tile<N, thread_block> tiled_partition(const thread_block&);
  template <unsigned int N, unsigned int P, typename Q>
  friend thread_block_tile<N, thread_block_tile<P, Q>> tiled_partition(
      const thread_block_tile<P, Q>&);

  thread_block_tile(unsigned int meta_rank, unsigned int meta_size)
      : meta_rank_(meta_rank), meta_size_(meta_size) {}

  static unsigned int lane() { return ::ucf_emu::self().linear & 31u; }
  static unsigned int mask() {
    const unsigned int ones = Size == 32 ? 0xFFFFFFFFu : (1u << Size) - 1u;
    return ones << (lane() & ~(Size - 1));
  }

  unsigned int meta_rank_, meta_size_;
};

template <unsigned int Size>
thread_block_tile<Size, thread_block> tiled_partition(const thread_block& parent) {
  return {parent.thread_rank() / Size, (parent.num_threads() + Size - 1) / Size};
}

template <unsigned int Size, unsigned int P, typename Q>
thread_block_tile<Size, thread_block_tile<P, Q>> tiled_partition(
    const thread_block_tile<P, Q>& parent) {
  static_assert(Size < P, "Tile size bigger or equal to the parent group size");
  return {parent.thread_rank() / Size, P / Size};
}

}  // namespace cooperative_groups

/* C entry point for the message behind a nonzero ucf_launch_error(). `used`
 * makes the inline definition land in the shared library for ctypes. */
extern "C" __attribute__((used, visibility("default"))) inline const char* ucf_emu_message() {
  ::ucf_emu::ErrorState& s = ::ucf_emu::error_state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.message.c_str();
}

#endif /* UCF_CUDA_EMU_H */
