#pragma once
// A SIMT emulator that runs the project's CUDA kernels on the host, so CI
// machines without a GPU execute them (tests/codec/test_kernels_on_host.py).
//
// Every CUDA thread is a fiber (ucontext); the fibers of one block run round
// robin in the calling OS thread, one block after the other. Warp shuffles,
// __syncwarp and __syncthreads are barriers: a shuffle (or __syncwarp) waits
// for all 32 lanes of its warp at the same one, __syncthreads for every
// thread of the block at the same __syncthreads. A barrier that can never complete (a lane has exited, or waits
// at another barrier) aborts with a message naming the kernel and the barrier:
// a divergence bug is an error, never a hang. 16- and 8-byte vector accesses
// (__ldg, stores through uint4 / uint2 pointers) abort when misaligned; a fault (an access out
// of bounds) ends the launch with cudaErrorIllegalAddress and a message. The
// grid is capped at kMaxBlocks blocks, so grid-stride loops loop.
//
// Use: put this directory first on the include path (its cuda_runtime.h
// includes this header) and compile the .cu sources as C++17. Kernels are
// launched by FP8C_LAUNCH (csrc/codec/launch_cuda.cuh) and run synchronously.
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

// ------------------------------------------------------------ keywords
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __shared__ static  // one block runs at a time
#define __align__(n) __attribute__((aligned(n)))

namespace simt {

inline const char* current_kernel = "";
// The kernels launched, one name a line (the tests read and clear it).
inline std::string launch_log;

[[noreturn]] inline void fail(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  fprintf(stderr, "simt: kernel %s: ", current_kernel);
  vfprintf(stderr, fmt, args);
  fputc('\n', stderr);
  va_end(args);
  fflush(stderr);
  abort();
}

inline void check_aligned(const void* p, size_t bytes, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % bytes != 0) {
    fail("misaligned %zu-byte %s at %p (expected a %zu-byte aligned address)", bytes, what, p, bytes);
  }
}

}  // namespace simt

// ------------------------------------------------------------ types
struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint4 {
  unsigned x, y, z, w;
  uint4() = default;
  uint4(const uint4&) = default;
  uint4& operator=(const uint4& o) {  // a store through a uint4 pointer: a vector store
    simt::check_aligned(this, 16, "vector store (uint4)");
    x = o.x, y = o.y, z = o.z, w = o.w;
    return *this;
  }
};

struct uint2 {
  unsigned x, y;
  uint2() = default;
  uint2(const uint2&) = default;
  uint2& operator=(const uint2& o) {  // a store through a uint2 pointer: an 8-byte vector store
    simt::check_aligned(this, 8, "vector store (uint2)");
    x = o.x, y = o.y;
    return *this;
  }
};

inline uint3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

// ------------------------------------------------------------ runtime API
enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorIllegalAddress = 700
};
typedef enum cudaError cudaError_t;
typedef struct CUstream_st* cudaStream_t;
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };

namespace simt {
inline cudaError_t last_error = cudaSuccess;
}

inline cudaError_t cudaGetLastError() {
  const cudaError_t e = simt::last_error;
  simt::last_error = cudaSuccess;
  return e;
}
inline const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
  }
  return "unrecognized error code";
}
inline cudaError_t cudaGetDevice(int* device) { return *device = 0, cudaSuccess; }
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr, int) { return *value = 132, cudaSuccess; }
inline cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
  memset(p, value, bytes);
  return cudaSuccess;
}

// ------------------------------------------------------------ fibers
namespace simt {

constexpr unsigned kMaxBlocks = 3;
constexpr size_t kStackBytes = 64 << 10;

enum class State { kRunnable, kShuffle, kSync, kExited };

struct Site {  // where a barrier is called
  const char* file;
  int line;
};

struct Fiber {
  ucontext_t ctx;
  State state;
  Site site;        // of the barrier it waits at
  uint64_t value;   // shuffle operand, then its result
  int lane_mask;
};

struct Runtime {
  ucontext_t scheduler;
  std::vector<Fiber> fibers;  // never resized while a block runs: contexts point into themselves
  Fiber* current = nullptr;
  void (*body)(void*) = nullptr;
  void* body_arg = nullptr;
  char* stacks = nullptr;  // one stack per fiber, each above a guard page
  size_t stack_slots = 0;
};
inline Runtime rt;

inline size_t page_bytes() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

inline char* stack_of(size_t i) { return rt.stacks + i * (page_bytes() + kStackBytes) + page_bytes(); }

inline void reserve_stacks(size_t n) {
  if (n <= rt.stack_slots) return;
  const size_t slot = page_bytes() + kStackBytes;
  void* p = mmap(nullptr, n * slot, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) fail("could not map %zu fiber stacks", n);
  for (size_t i = 0; i < n; ++i) mprotect(static_cast<char*>(p) + i * slot, page_bytes(), PROT_NONE);
  if (rt.stacks != nullptr) munmap(rt.stacks, rt.stack_slots * slot);
  rt.stacks = static_cast<char*>(p);
  rt.stack_slots = n;
}

inline void fiber_main() {
  rt.body(rt.body_arg);
  rt.current->state = State::kExited;  // uc_link resumes the scheduler
}

// The calling fiber waits at a barrier until the scheduler releases it.
inline void wait_at(State s, Site site) {
  Fiber& f = *rt.current;
  f.state = s;
  f.site = site;
  swapcontext(&f.ctx, &rt.scheduler);
}

inline bool same_place(const Fiber& a, const Fiber& b) {
  return a.state == b.state &&
         (a.state == State::kExited || (a.site.line == b.site.line && strcmp(a.site.file, b.site.file) == 0));
}

// Releases every complete barrier; false when none is.
inline bool release_barriers() {
  std::vector<Fiber>& f = rt.fibers;
  bool block_synced = true;
  for (const Fiber& t : f) block_synced = block_synced && t.state == State::kSync && same_place(t, f[0]);
  if (block_synced) {
    for (Fiber& t : f) t.state = State::kRunnable;
    return true;
  }
  bool released = false;
  for (size_t w = 0; w < f.size(); w += 32) {
    Fiber* lane = &f[w];
    bool complete = true;
    for (int l = 0; l < 32; ++l) {
      complete = complete && lane[l].state == State::kShuffle && same_place(lane[l], lane[0]);
    }
    if (!complete) continue;
    uint64_t in[32];
    for (int l = 0; l < 32; ++l) in[l] = lane[l].value;
    for (int l = 0; l < 32; ++l) {
      const int src = l ^ lane[l].lane_mask;
      lane[l].value = src < 32 ? in[src] : in[l];
      lane[l].state = State::kRunnable;
    }
    released = true;
  }
  return released;
}

inline std::string describe(const Fiber& f) {
  if (f.state == State::kExited) return "exited";
  const char* file = strrchr(f.site.file, '/');
  return std::string(f.state == State::kShuffle ? "at __shfl_xor_sync " : "at __syncthreads ") +
         (file != nullptr ? file + 1 : f.site.file) + ":" + std::to_string(f.site.line);
}

// No fiber can run and no barrier can complete: where each warp's lanes are.
[[noreturn]] inline void report_stuck() {
  std::string where;
  for (size_t w = 0; w < rt.fibers.size(); w += 32) {
    where += "\n  warp " + std::to_string(w / 32) + ":";
    for (int l = 0, e; l < 32; l = e + 1) {
      for (e = l; e + 1 < 32 && same_place(rt.fibers[w + e + 1], rt.fibers[w + l]);) ++e;
      where += (l == e ? " lane " + std::to_string(l) : " lanes " + std::to_string(l) + "-" + std::to_string(e)) +
               " " + describe(rt.fibers[w + l]) + ";";
    }
  }
  fail("block %u: a barrier can never complete (a lane exited or waits at another barrier):%s", blockIdx.x,
       where.c_str());
}

// A fault inside a kernel (an access out of bounds) abandons the launch, which
// then reports cudaErrorIllegalAddress, as a GPU does; the message names the
// kernel and the thread. Faults outside kernels go to the previous handler.
inline struct sigaction previous_fault_action[2];
inline bool faulted = false;

inline void on_fault(int sig, siginfo_t* info, void*) {
  if (rt.current == nullptr) {
    sigaction(sig, &previous_fault_action[sig == SIGSEGV ? 0 : 1], nullptr);  // the fault repeats there
    return;
  }
  fprintf(stderr, "simt: kernel %s: %s at address %p in block %u, thread %u\n", current_kernel,
          sig == SIGSEGV ? "segmentation fault (an access out of bounds)" : "bus error", info->si_addr, blockIdx.x,
          threadIdx.x);
  faulted = true;
  setcontext(&rt.scheduler);
}

inline void catch_faults() {
  static char alt_stack[64 << 10];  // the faulting fiber's stack may be the one that overflowed
  static bool installed = false;
  if (installed) return;
  installed = true;
  stack_t ss{};
  ss.ss_sp = alt_stack;
  ss.ss_size = sizeof alt_stack;
  sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigaction(SIGSEGV, &sa, &previous_fault_action[0]);
  sigaction(SIGBUS, &sa, &previous_fault_action[1]);
}

inline void run_block() {
  const size_t n = blockDim.x;
  rt.fibers.assign(n, Fiber{});
  reserve_stacks(n);
  for (size_t i = 0; i < n; ++i) {
    Fiber& f = rt.fibers[i];
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = stack_of(i);
    f.ctx.uc_stack.ss_size = kStackBytes;
    f.ctx.uc_link = &rt.scheduler;
    makecontext(&f.ctx, fiber_main, 0);
    f.state = State::kRunnable;
  }
  for (;;) {
    bool live = false;
    for (size_t i = 0; i < n; ++i) {
      Fiber& f = rt.fibers[i];
      if (f.state == State::kRunnable) {
        threadIdx = uint3{static_cast<unsigned>(i), 0, 0};
        rt.current = &f;
        swapcontext(&rt.scheduler, &f.ctx);
        rt.current = nullptr;
        if (faulted) return;
      }
      live = live || f.state != State::kExited;
    }
    if (!live) break;
    if (!release_barriers()) report_stuck();
  }
}

// FP8C_LAUNCH(...)(args): checks the configuration as CUDA does, then runs
// the (capped) grid block by block.
template <class... P>
struct Launch {
  const char* name;
  dim3 grid, block;
  size_t smem;
  void (*kernel)(P...);

  template <class... A>
  void operator()(A&&... args) const {
    current_kernel = name;
    launch_log.append(name).push_back('\n');
    if (rt.current != nullptr) fail("launched from inside a kernel (not emulated)");
    if (grid.x == 0 || block.x == 0 || block.x > 1024) {
      last_error = cudaErrorInvalidConfiguration;
      return;
    }
    if (grid.y != 1 || grid.z != 1 || block.y != 1 || block.z != 1 || smem != 0) {
      fail("expected a 1-D launch without dynamic shared memory");
    }
    if (block.x % 32 != 0) fail("expected whole warps, got %u threads per block", block.x);
    catch_faults();
    std::tuple<P...> params(std::forward<A>(args)...);  // converted once, copied into each thread
    auto call = [&] { std::apply(kernel, params); };
    rt.body = [](void* c) { (*static_cast<decltype(call)*>(c))(); };
    rt.body_arg = &call;
    gridDim = dim3(grid.x < kMaxBlocks ? grid.x : kMaxBlocks);
    blockDim = dim3(block.x);
    for (unsigned b = 0; b < gridDim.x && !faulted; ++b) {
      blockIdx = uint3{b, 0, 0};
      run_block();
    }
    if (faulted) last_error = cudaErrorIllegalAddress;
    faulted = false;
  }
};

template <class... P>
Launch<P...> launch(const char* name, dim3 grid, dim3 block, size_t smem, cudaStream_t, void (*kernel)(P...)) {
  return Launch<P...>{name, grid, block, smem, kernel};
}

}  // namespace simt

#define FP8C_LAUNCH(grid, block, smem, stream, ...) \
  ::simt::launch(#__VA_ARGS__, (grid), (block), (smem), (stream), __VA_ARGS__)

// ------------------------------------------------------------ device functions
// (file, line: the call site, which identifies the barrier.)
template <class T>
inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32, const char* file = __builtin_FILE(),
                         int line = __builtin_LINE()) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "shuffled values are at most 8 bytes");
  if (mask != 0xffffffffu || width != 32) {
    simt::fail("expected a full-warp shuffle (mask 0xffffffff, width 32), got mask %#x, width %d at %s:%d", mask,
               width, file, line);
  }
  simt::Fiber& f = *simt::rt.current;
  f.value = 0;
  memcpy(&f.value, &var, sizeof(T));
  f.lane_mask = lane_mask;
  simt::wait_at(simt::State::kShuffle, simt::Site{file, line});
  T out;
  memcpy(&out, &f.value, sizeof(T));
  return out;
}

// A barrier of the warp's 32 lanes (a shuffle that exchanges nothing).
inline void __syncwarp(unsigned mask = 0xffffffffu, const char* file = __builtin_FILE(),
                       int line = __builtin_LINE()) {
  __shfl_xor_sync(mask, 0u, 0, 32, file, line);
}

inline void __syncthreads(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  simt::wait_at(simt::State::kSync, simt::Site{file, line});
}

inline unsigned atomicMax(unsigned* p, unsigned v) {
  const unsigned old = *p;
  *p = v > old ? v : old;
  return old;
}

// prmt: byte n of the result is byte (s >> 4n) & 7 of y:x (selectors 0-7 only).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const uint64_t v = (static_cast<uint64_t>(y) << 32) | x;
  unsigned r = 0;
  for (int n = 0; n < 4; ++n) r |= static_cast<unsigned>((v >> (8 * ((s >> (4 * n)) & 7u))) & 0xFFu) << (8 * n);
  return r;
}

template <class T>
inline T __ldg(const T* p) {  // 16 bytes for uint4: a vector load
  simt::check_aligned(p, sizeof(T), "load (__ldg)");
  return *p;
}
