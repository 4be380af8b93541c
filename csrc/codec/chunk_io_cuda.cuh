#pragma once
// Chunk I/O shared by the CUDA kernels (codec_cuda.cu, ../linear/cast_cuda.cu):
// each thread handles 16 consecutive elements, read with 16-byte loads and
// written as 16 FP8 bytes with one 16-byte store when the address is aligned
// and the chunk is whole; otherwise element by element. Torch-free.
#include <stdint.h>
#include <string.h>

#include "fp8_block_math.h"

namespace fp8comm {
namespace chunk_io {

constexpr int kChunk = 16;

__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Elements of a chunk that exist when `n` remain.
__device__ __forceinline__ int clamp_chunk(int64_t n) {
  return n <= 0 ? 0 : (n >= kChunk ? kChunk : static_cast<int>(n));
}

// v[0, 16) <- elements [0, valid) of p as float, zeros past valid.
template <ElemType E>
__device__ __forceinline__ void load_chunk(const typename Elem<E>::storage* p, int valid, float (&v)[kChunk]) {
  using S = typename Elem<E>::storage;
  if (valid == kChunk && aligned16(p)) {
    constexpr int kPer16B = 16 / sizeof(S);
    const uint4* q = reinterpret_cast<const uint4*>(p);
#pragma unroll
    for (int k = 0; k < kChunk / kPer16B; ++k) {
      const uint4 w = __ldg(q + k);
      S e[kPer16B];
      memcpy(e, &w, 16);
#pragma unroll
      for (int t = 0; t < kPer16B; ++t) v[k * kPer16B + t] = Elem<E>::load(e[t]);
    }
  } else {
#pragma unroll
    for (int t = 0; t < kChunk; ++t) v[t] = t < valid ? Elem<E>::load(p[t]) : 0.0f;
  }
}

// p[0, count) <- c[0, count).
__device__ __forceinline__ void store_codes(uint8_t* p, int count, const uint8_t (&c)[kChunk]) {
  if (count == kChunk && aligned16(p)) {
    uint4 w;
    memcpy(&w, c, 16);
    *reinterpret_cast<uint4*>(p) = w;
  } else {
#pragma unroll
    for (int t = 0; t < kChunk; ++t) {
      if (t < count) p[t] = c[t];  // static indices: c stays in registers
    }
  }
}

}  // namespace chunk_io
}  // namespace fp8comm
