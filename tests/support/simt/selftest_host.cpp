// Kernels that break the rules the SIMT emulator enforces, and two that keep
// them: tests/codec/test_kernels_on_host.py runs each (a rule breaker in a child
// process, expecting an abort with a message) to show that the checks work.
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "codec/launch_cuda.cuh"

namespace {

__global__ void misaligned_load_kernel(const uint8_t* p, unsigned* out) {
  const uint4 w = __ldg(reinterpret_cast<const uint4*>(p + 4));
  out[threadIdx.x] = w.x;
}

__global__ void misaligned_store_kernel(uint8_t* p) {
  uint4 w;
  w.x = w.y = w.z = w.w = threadIdx.x;
  *reinterpret_cast<uint4*>(p + 8) = w;
}

__global__ void exit_before_shuffle_kernel(unsigned* out) {
  if (threadIdx.x == 37) return;  // lane 5 of warp 1
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, threadIdx.x, 1);
}

__global__ void divergent_shuffle_kernel(unsigned* out) {
  unsigned v = threadIdx.x;
  if (threadIdx.x % 32 < 16) {
    v = __shfl_xor_sync(0xffffffffu, v, 1);
  } else {
    v = __shfl_xor_sync(0xffffffffu, v, 1);
  }
  out[threadIdx.x] = v;
}

__global__ void divergent_sync_kernel(unsigned* out) {
  if (threadIdx.x < 64) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

__global__ void out_of_bounds_kernel(const unsigned* p, unsigned* out) {
  out[threadIdx.x] = p[threadIdx.x == 40 ? -(int64_t{1} << 40) : threadIdx.x];  // thread 40 reads unmapped memory
}

// out[t] <- the value of lane t ^ lane_mask of t's warp.
__global__ void xor_kernel(unsigned* out, int lane_mask) {
  out[blockIdx.x * blockDim.x + threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1000u * threadIdx.x, lane_mask);
}

// Grid-stride over n items: visits[i] += 1 each; *amax <- max of in (warp
// butterflies, then the block's warps through shared memory); *grid <- gridDim.x.
__global__ void reduce_kernel(const unsigned* in, int64_t n, unsigned* visits, unsigned* amax, unsigned* grid) {
  unsigned m = 0;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    visits[i] += 1;
    m = in[i] > m ? in[i] : m;
  }
  for (int off = 16; off >= 1; off /= 2) {
    const unsigned o = __shfl_xor_sync(0xffffffffu, m, off);
    m = o > m ? o : m;
  }
  __shared__ unsigned part[32];
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (unsigned w = 0; w < blockDim.x / 32; ++w) atomicMax(amax, part[w]);
    *grid = gridDim.x;
  }
}

}  // namespace

// Runs the named kernel; returns cudaGetLastError() (0: launched). a, b, c:
// the kernel's buffers; n: its size argument.
extern "C" int simt_selftest(const char* name, void* a, void* b, void* c, void* d, int64_t n) {
  const auto u8 = static_cast<uint8_t*>(a);
  const auto u32 = static_cast<unsigned*>(a);
  if (strcmp(name, "misaligned_load") == 0) {
    FP8C_LAUNCH(1, 32, 0, nullptr, misaligned_load_kernel)(u8, static_cast<unsigned*>(b));
  } else if (strcmp(name, "misaligned_store") == 0) {
    FP8C_LAUNCH(1, 32, 0, nullptr, misaligned_store_kernel)(u8);
  } else if (strcmp(name, "exit_before_shuffle") == 0) {
    FP8C_LAUNCH(1, 64, 0, nullptr, exit_before_shuffle_kernel)(u32);
  } else if (strcmp(name, "divergent_shuffle") == 0) {
    FP8C_LAUNCH(1, 64, 0, nullptr, divergent_shuffle_kernel)(u32);
  } else if (strcmp(name, "divergent_sync") == 0) {
    FP8C_LAUNCH(1, 128, 0, nullptr, divergent_sync_kernel)(u32);
  } else if (strcmp(name, "out_of_bounds") == 0) {
    FP8C_LAUNCH(2, 64, 0, nullptr, out_of_bounds_kernel)(u32, static_cast<unsigned*>(b));
  } else if (strcmp(name, "xor") == 0) {
    FP8C_LAUNCH(2, 64, 0, nullptr, xor_kernel)(u32, static_cast<int>(n));
  } else if (strcmp(name, "reduce") == 0) {
    FP8C_LAUNCH(1000, 256, 0, nullptr, reduce_kernel)(u32, n, static_cast<unsigned*>(b), static_cast<unsigned*>(c),
                                                      static_cast<unsigned*>(d));
  } else if (strcmp(name, "empty_grid") == 0) {
    FP8C_LAUNCH(0, 256, 0, nullptr, reduce_kernel)(u32, n, static_cast<unsigned*>(b), static_cast<unsigned*>(c),
                                                   static_cast<unsigned*>(d));
  } else {
    return -1;
  }
  return static_cast<int>(cudaGetLastError());
}
