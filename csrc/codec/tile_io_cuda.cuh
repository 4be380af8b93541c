#pragma once
// The lane-interleaved tile of the tiled CUDA codec (codec_cuda_tiled.cu;
// DESIGN.md, "Layout"): a warp handles a tile of kTile = 512 consecutive
// elements of one segment, 16 per lane, as kRows rows of 32 lanes x kVec
// elements: lane l's run of row k is tile elements k * kRowElems + l * kVec
// + [0, kVec), one 16-byte access of the wide side (FP32: 4 rows of 4, the
// warp's 512 bytes a row; 16-bit: 2 rows of 8). Its codes are the matching
// run of the code bytes (4 or 8 codes: 4, 8 or, 4-bit, 2, 4 bytes), so a
// warp's code accesses of a row are one contiguous 128-256 bytes.
//
// A run is whole (all kVec elements exist) or partial at a segment's end; an
// aligned whole run takes one vector access, anything else element accesses
// (source views and segment starts need not be aligned). Torch-free.
#include <stdint.h>
#include <string.h>

#include "fp8_block_math.h"

namespace fp8comm {
namespace tile_io {

constexpr int kLaneElems = 16;
constexpr int kTile = 32 * kLaneElems;

template <ElemType E>
struct Geometry {
  static constexpr int kVec = 16 / static_cast<int>(sizeof(Storage<E>));
  static constexpr int kRows = kLaneElems / kVec;
  static constexpr int kRowElems = 32 * kVec;
};

__device__ __forceinline__ bool aligned(const void* p, uintptr_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

// Elements of a run of kVec starting at `first` that lie below `end`.
template <int kVec>
__device__ __forceinline__ int run_count(uint32_t first, uint32_t end) {
  return first >= end ? 0 : (end - first >= static_cast<uint32_t>(kVec) ? kVec : static_cast<int>(end - first));
}

// The raw 16 bytes of a whole aligned run, or its first n elements one by
// one (the rest zero).
template <ElemType E>
struct ElemRun {
  static constexpr int kVec = Geometry<E>::kVec;
  uint32_t w[4];

  __device__ __forceinline__ void load(const Storage<E>* p, int n) {
    if (n == kVec && aligned(p, 16)) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else {
      Storage<E> e[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) e[j] = j < n ? p[j] : Storage<E>{};
      memcpy(w, e, 16);
    }
  }

  __device__ __forceinline__ float get(int j) const {
    if constexpr (sizeof(Storage<E>) == 4) {
      return bits_float(w[j]);
    } else {
      return Elem<E>::load(static_cast<Storage<E>>(w[j / 2] >> (16 * (j % 2))));
    }
  }
};

// v[0, n) to p as elements of type E (Elem<E>::store: one NaN), one 16-byte
// store when whole and aligned.
template <ElemType E>
__device__ __forceinline__ void store_run(Storage<E>* p, int n, const float* v) {
  constexpr int kVec = Geometry<E>::kVec;
  if (n == kVec && aligned(p, 16)) {
    uint32_t w[4];
    if constexpr (sizeof(Storage<E>) == 4) {
#pragma unroll
      for (int j = 0; j < 4; ++j) w[j] = float_bits(Elem<E>::store(v[j]));
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        w[j] = static_cast<uint32_t>(Elem<E>::store(v[2 * j])) |
               (static_cast<uint32_t>(Elem<E>::store(v[2 * j + 1])) << 16);
      }
    }
    uint4 q;
    q.x = w[0], q.y = w[1], q.z = w[2], q.w = w[3];
    *reinterpret_cast<uint4*>(p) = q;
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      if (j < n) p[j] = Elem<E>::store(v[j]);
    }
  }
}

// The codes of a run of kVec elements: kVec bytes, or kVec / 2 for 4-bit
// codes (element 2i in the low nibble), as little-endian words.
template <WireFormat F, int kVec>
struct CodeRun {
  static constexpr int kBits = WireTraits<F>::kCodeBits;
  static constexpr int kBytes = kVec * kBits / 8;  // 2, 4 or 8
  static constexpr int kWords = (kBytes + 3) / 4;
  uint32_t w[kWords];

  __device__ __forceinline__ uint32_t code(int j) const {
    return (w[j * kBits / 32] >> ((j * kBits) % 32)) & ((1u << kBits) - 1u);
  }

  // The codes of elements [0, n) at p, zero past n.
  __device__ __forceinline__ void load(const uint8_t* p, int n) {
    if (n == kVec && aligned(p, kBytes)) {
      if constexpr (kBytes == 8) {
        const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
        w[0] = v.x, w[1] = v.y;
      } else if constexpr (kBytes == 4) {
        w[0] = __ldg(reinterpret_cast<const uint32_t*>(p));
      } else {
        w[0] = __ldg(reinterpret_cast<const uint16_t*>(p));
      }
    } else {
      uint8_t b[kWords * 4] = {};
#pragma unroll
      for (int t = 0; t < kBytes; ++t) b[t] = t * 8 / kBits < n ? p[t] : 0;
      memcpy(w, b, sizeof w);
      if constexpr (kBits == 4) {  // an odd n: the last byte's high nibble is the next element's
#pragma unroll
        for (int j = 1; j < kVec; j += 2) {
          if (j >= n) w[j * 4 / 32] &= ~(0xFu << ((j * 4) % 32));
        }
      }
    }
  }

  // Sets code j (codes are set once each, from zeroed words).
  __device__ __forceinline__ void set(int j, uint32_t c) { w[j * kBits / 32] |= c << ((j * kBits) % 32); }

  __device__ __forceinline__ void clear() {
#pragma unroll
    for (int k = 0; k < kWords; ++k) w[k] = 0;
  }

  // The codes of elements [0, n) to p (4-bit: a last half byte with a zero
  // high nibble); one vector store when whole and aligned.
  __device__ __forceinline__ void store(uint8_t* p, int n) const {
    if (n == kVec && aligned(p, kBytes)) {
      if constexpr (kBytes == 8) {
        uint2 v;
        v.x = w[0], v.y = w[1];
        *reinterpret_cast<uint2*>(p) = v;
      } else if constexpr (kBytes == 4) {
        *reinterpret_cast<uint32_t*>(p) = w[0];
      } else {
        *reinterpret_cast<uint16_t*>(p) = static_cast<uint16_t>(w[0]);
      }
    } else {
#pragma unroll
      for (int t = 0; t < kBytes; ++t) {
        if (t * 8 / kBits < n) p[t] = static_cast<uint8_t>(w[t / 4] >> (8 * (t % 4)));
      }
    }
  }
};

}  // namespace tile_io
}  // namespace fp8comm
