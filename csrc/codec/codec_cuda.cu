// The block codec on CUDA: plain kernels over raw pointers (torch-free, so a
// bare `nvcc -c` builds them), one kernel per operation (a quantize into a
// format with a segment scale: its segment-scale kernels first), the element
// math from fp8_block_math.h so the bytes equal the CPU codec's bit for bit.
//
// Work unit: a *chunk* of 16 consecutive elements per thread — 64 bytes of
// fp32 / 32 bytes of bf16 read with 16-byte loads, 16 codes written with one
// 16-byte store (8-byte for 4-bit codes) — whenever the pointers are 16-byte aligned and the chunk is
// whole; otherwise the same thread falls back to element accesses (source
// views and segment starts need not be aligned).
//
// A block of B elements is B/16 chunks. When B/16 is a power of two <= 32 the
// block's chunks sit in adjacent lanes of one warp and the block amax is a
// butterfly of warp shuffles; otherwise one warp walks the block's chunks.
//
// Block scales come from the format's traits (fp8_block_math.h, "scales by
// kind"). A format with a segment scale (NVFP4) first finds each segment's
// scale g in kernels of its own and stores it in the segment's header, where
// the quantize kernels read it, as the CPU loops do ("segment scales" below).
#include <cuda_runtime.h>
#include <stdint.h>

#include "chunk_io_cuda.cuh"
#include "codec.h"
#include "launch_cuda.cuh"

namespace fp8comm {
namespace {

using namespace chunk_io;  // NOLINT: the chunk accesses every kernel here uses

constexpr int kThreads = 256;
constexpr int64_t kMaxGrid = int64_t{1} << 20;

template <ElemType E>
__device__ __forceinline__ void store_chunk(Storage<E>* p, int valid, const float (&v)[kChunk]) {
  if (valid == kChunk && aligned16(p)) {
    constexpr int kPer16B = 16 / sizeof(Storage<E>);
    uint4* q = reinterpret_cast<uint4*>(p);
#pragma unroll
    for (int k = 0; k < kChunk / kPer16B; ++k) {
      Storage<E> e[kPer16B];
#pragma unroll
      for (int t = 0; t < kPer16B; ++t) e[t] = Elem<E>::store(v[k * kPer16B + t]);
      uint4 w;
      memcpy(&w, e, 16);
      q[k] = w;
    }
  } else {
#pragma unroll
    for (int t = 0; t < kChunk; ++t) {
      if (t < valid) p[t] = Elem<E>::store(v[t]);  // static indices: v stays in registers
    }
  }
}

__device__ __forceinline__ bool aligned8(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 7u) == 0; }

// c[0, valid) <- the codes of a chunk's elements [0, valid), zeros past valid;
// `p` points at the chunk's first code byte.
template <WireFormat F>
__device__ __forceinline__ void load_codes(const uint8_t* p, int valid, uint8_t (&c)[kChunk]) {
  if constexpr (WireTraits<F>::kCodeBits == 8) {
    if (valid == kChunk && aligned16(p)) {
      const uint4 w = __ldg(reinterpret_cast<const uint4*>(p));
      memcpy(c, &w, 16);
    } else {
#pragma unroll
      for (int t = 0; t < kChunk; ++t) c[t] = t < valid ? p[t] : 0;
    }
  } else {
    uint8_t packed[kChunk / 2];
    if (valid == kChunk && aligned8(p)) {
      const uint2 w = __ldg(reinterpret_cast<const uint2*>(p));
      memcpy(packed, &w, 8);
    } else {
#pragma unroll
      for (int t = 0; t < kChunk / 2; ++t) packed[t] = 2 * t < valid ? p[t] : 0;
    }
#pragma unroll
    for (int t = 0; t < kChunk; ++t) c[t] = t < valid ? load_code<F>(packed, t) : 0;
  }
}

// The codes c[0, count) of a chunk to `p`, its first code byte (4-bit codes:
// two per byte, an odd count's last byte with its high nibble zero).
template <WireFormat F>
__device__ __forceinline__ void store_wire_codes(uint8_t* p, int count, const uint8_t (&c)[kChunk]) {
  if constexpr (WireTraits<F>::kCodeBits == 8) {
    store_codes(p, count, c);
  } else {
    uint8_t packed[kChunk / 2];
#pragma unroll
    for (int t = 0; t < kChunk / 2; ++t) packed[t] = static_cast<uint8_t>(c[2 * t] | (c[2 * t + 1] << 4));
    if (count == kChunk && aligned8(p)) {
      uint2 w;
      memcpy(&w, packed, 8);
      *reinterpret_cast<uint2*>(p) = w;
    } else {
#pragma unroll
      for (int t = 0; t < kChunk / 2; ++t) {
        if (2 * t < count) p[t] = packed[t];  // c is zero past count, so the last high nibble is too
      }
    }
  }
}

// ------------------------------------------------------------------ sources
// What a quantizing kernel encodes: chunk (segment r, offset i0) as floats.

// A tensor times premul (quantize).
template <ElemType E>
struct TensorSource {
  const Storage<E>* src;
  int64_t numel;
  int64_t segment_numel;
  float premul;
  const float* premul_device;

  __device__ int load(int64_t r, int64_t i0, float (&v)[kChunk]) const {
    const int64_t first = r * segment_numel + i0;
    const int64_t seg_end = (r + 1) * segment_numel < numel ? (r + 1) * segment_numel : numel;
    const int valid = clamp_chunk(seg_end - first);
    load_chunk<E>(src + first, valid, v);
    const float f = premul_device != nullptr ? *premul_device : premul;
#pragma unroll
    for (int t = 0; t < kChunk; ++t) v[t] = v[t] * f;
    return valid;
  }
};

// (own + the pieces, in piece order) / post_div (dequant-sum-requantize and
// dequant-sum); E is the own addend's element type. Padding codes are zeros,
// so the whole capacity is summed.
template <ElemType E, WireFormat F>
__device__ __forceinline__ void sum_pieces(const BlockCodes& pieces, const OwnAddend& own, int post_div, int64_t i0,
                                           int valid, float (&acc)[kChunk]) {
  const int64_t j = i0 / pieces.block_size;
  if (own.present) {
    const int own_valid = clamp_chunk(own.numel - i0);
    float v[kChunk];
    load_chunk<E>(static_cast<const Storage<E>*>(own.src) + (own_valid > 0 ? i0 : 0), own_valid, v);
    const float f = own.premul_device != nullptr ? *own.premul_device : own.premul;
#pragma unroll
    for (int t = 0; t < kChunk; ++t) acc[t] = t < own_valid ? v[t] * f : 0.0f;  // +0 past the end, as on the CPU
  }
  for (int64_t r = 0; r < pieces.num_segments; ++r) {
    const uint8_t* scales = pieces.scales + r * pieces.stride;
    const float scale = block_scale<F>(scales[j], load_segment_scale<F>(scales));
    uint8_t c[kChunk];
    load_codes<F>(pieces.codes + r * pieces.stride + code_bytes<F>(i0), valid, c);
    const bool first = r == 0 && !own.present;
#pragma unroll
    for (int t = 0; t < kChunk; ++t) {
      const float d = decode_code<F>(c[t]) * scale;
      acc[t] = first ? d : acc[t] + d;
    }
  }
  if (post_div != 1) {
#pragma unroll
    for (int t = 0; t < kChunk; ++t) acc[t] = sum_finish(acc[t], post_div);
  }
}

template <ElemType E, WireFormat F>
struct PiecesSource {
  BlockCodes pieces;
  OwnAddend own;
  int post_div;

  __device__ int load(int64_t /*r*/, int64_t i0, float (&v)[kChunk]) const {
    const int valid = clamp_chunk(pieces.capacity - i0);
    sum_pieces<E, F>(pieces, own, post_div, i0, valid, v);
    return valid;
  }
};

// ------------------------------------------------------------- quantizing
// Encodes one chunk with its block's encoding (block_encoding of its scale
// byte and segment scale); writes zero codes past the valid elements up to
// the capacity. Elements r, i0 + t of dst's segments, rounded as dst says
// (rounding.h: stochastic bits of the element's index in its segment).
template <WireFormat F>
__device__ __forceinline__ void encode_chunk(const float (&v)[kChunk], int valid, const BlockEncoding& enc,
                                             const BlockCodes& dst, int64_t r, int64_t i0, int count) {
  uint8_t c[kChunk];
  if (dst.rounding == Rounding::kStochastic) {
    const StochasticRun run = dst.stochastic_run(r, i0);
#pragma unroll
    for (int t = 0; t < kChunk; ++t) {
      c[t] = t < valid ? encode_code_stochastic<F>(to_code_units<F>(v[t], enc), enc.limit, run.bits(t)) : 0;
    }
  } else {
#pragma unroll
    for (int t = 0; t < kChunk; ++t) c[t] = t < valid ? encode_code<F>(to_code_units<F>(v[t], enc), enc.limit) : 0;
  }
  store_wire_codes<F>(dst.codes + r * dst.stride + code_bytes<F>(i0), count, c);
}

// The max (or the or) of v over the 32 lanes of a warp, on every lane: a
// butterfly of shuffles.
__device__ __forceinline__ uint32_t warp_max(uint32_t v) {
  for (int off = 16; off >= 1; off /= 2) {
    const uint32_t other = __shfl_xor_sync(0xffffffffu, v, off);
    v = other > v ? other : v;
  }
  return v;
}

__device__ __forceinline__ uint32_t warp_or(uint32_t v) {
  for (int off = 16; off >= 1; off /= 2) v |= __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

__device__ __forceinline__ uint32_t chunk_amax(const float (&v)[kChunk], int valid) {
  uint32_t amax = 0;
#pragma unroll
  for (int t = 0; t < kChunk; ++t) {
    const uint32_t a = t < valid ? finite_abs_bits(v[t]) : 0u;
    amax = a > amax ? a : amax;
  }
  return amax;
}

// Whether a chunk holds a non-finite value, for a format without NaN codes
// (stored_scale_byte); 0 otherwise.
template <WireFormat F>
__device__ __forceinline__ uint32_t chunk_nonfinite(const float (&v)[kChunk], int valid) {
  uint32_t nonfinite = 0;
  if constexpr (!WireTraits<F>::kHasNanCode) {
#pragma unroll
    for (int t = 0; t < kChunk; ++t) nonfinite |= t < valid ? nonfinite_bit(v[t]) : 0u;
  }
  return nonfinite;
}

__device__ __forceinline__ void write_scale(const BlockCodes& dst, int64_t r, int64_t j, int64_t blocks_per_segment,
                                            uint8_t sb) {
  uint8_t* scales = dst.scales + r * dst.stride;
  scales[j] = sb;
  if (j == blocks_per_segment - 1) {
    for (int64_t k = 1; k <= dst.scale_padding; ++k) scales[j + k] = 0;
  }
}

// Blocks of lanes_per_block (a power of two <= 32) adjacent lanes.
template <class Source, WireFormat F>
__global__ void __launch_bounds__(kThreads) quantize_shuffle_kernel(Source source, BlockCodes dst,
                                                                    int64_t total_blocks, int lanes_per_block) {
  const int64_t B = dst.block_size;
  const int64_t blocks_per_segment = (dst.capacity + B - 1) / B;
  const int64_t total_threads = total_blocks * lanes_per_block;
  // Grid-stride over whole warps, so every lane reaches every shuffle.
  for (int64_t base = int64_t{blockIdx.x} * blockDim.x; base < total_threads;
       base += int64_t{gridDim.x} * blockDim.x) {
    const int64_t tid = base + threadIdx.x;
    const bool active = tid < total_threads;
    const int64_t blk = active ? tid / lanes_per_block : 0;
    const int lane_in_block = static_cast<int>(tid % lanes_per_block);
    const int64_t r = blk / blocks_per_segment;
    const int64_t j = blk - r * blocks_per_segment;
    const int64_t i0 = j * B + int64_t{lane_in_block} * kChunk;  // offset in the segment
    float v[kChunk];
    int valid = 0;
    if (active && i0 < dst.capacity) valid = source.load(r, i0, v);
    uint32_t amax = valid > 0 ? chunk_amax(v, valid) : 0u;
    uint32_t nonfinite = valid > 0 ? chunk_nonfinite<F>(v, valid) : 0u;
    for (int off = lanes_per_block / 2; off >= 1; off /= 2) {
      const uint32_t other = __shfl_xor_sync(0xffffffffu, amax, off);
      amax = other > amax ? other : amax;
      if constexpr (!WireTraits<F>::kHasNanCode) nonfinite |= __shfl_xor_sync(0xffffffffu, nonfinite, off);
    }
    if (!active || i0 >= dst.capacity) continue;
    const float g = load_segment_scale<F>(dst.scales + r * dst.stride);
    const uint8_t sb = block_scale_byte<F>(amax, g);
    encode_chunk<F>(v, valid, block_encoding<F>(sb, g), dst, r, i0, clamp_chunk(dst.capacity - i0));
    if (lane_in_block == 0) write_scale(dst, r, j, blocks_per_segment, stored_scale_byte<F>(sb, nonfinite));
  }
}

// Any block size: one warp per block walks its chunks twice (amax, encode);
// the second pass re-reads the source, which is in L1/L2 by then.
template <class Source, WireFormat F>
__global__ void __launch_bounds__(kThreads) quantize_warp_kernel(Source source, BlockCodes dst,
                                                                 int64_t total_blocks) {
  const int64_t B = dst.block_size;
  const int64_t blocks_per_segment = (dst.capacity + B - 1) / B;
  const int lane = threadIdx.x & 31;
  const int64_t warps_per_grid = int64_t{gridDim.x} * (blockDim.x / 32);
  for (int64_t blk = int64_t{blockIdx.x} * (blockDim.x / 32) + threadIdx.x / 32; blk < total_blocks;
       blk += warps_per_grid) {
    const int64_t r = blk / blocks_per_segment;
    const int64_t j = blk - r * blocks_per_segment;
    const int64_t width = dst.capacity - j * B < B ? dst.capacity - j * B : B;
    uint32_t amax = 0;
    uint32_t nonfinite = 0;
    for (int64_t i = int64_t{lane} * kChunk; i < width; i += 32 * kChunk) {
      float v[kChunk];
      const int valid = source.load(r, j * B + i, v);
      const uint32_t a = chunk_amax(v, valid);
      amax = a > amax ? a : amax;
      nonfinite |= chunk_nonfinite<F>(v, valid);
    }
    amax = warp_max(amax);
    if constexpr (!WireTraits<F>::kHasNanCode) nonfinite = warp_or(nonfinite);
    const float g = load_segment_scale<F>(dst.scales + r * dst.stride);
    const uint8_t sb = block_scale_byte<F>(amax, g);
    const BlockEncoding enc = block_encoding<F>(sb, g);
    for (int64_t i = int64_t{lane} * kChunk; i < width; i += 32 * kChunk) {
      float v[kChunk];
      const int valid = source.load(r, j * B + i, v);
      encode_chunk<F>(v, valid, enc, dst, r, j * B + i, clamp_chunk(width - i));
    }
    if (lane == 0) write_scale(dst, r, j, blocks_per_segment, stored_scale_byte<F>(sb, nonfinite));
  }
}

int64_t grid_for(int64_t threads) {
  const int64_t blocks = (threads + kThreads - 1) / kThreads;
  return blocks < 1 ? 1 : (blocks > kMaxGrid ? kMaxGrid : blocks);
}

// ------------------------------------------------------------- segment scales
// A format with a segment scale (kSegmentScaleBytes != 0): every block scale
// of a segment depends on the segment's g, which depends on the finite amax
// of all that goes into the segment (the quantize source: the premultiplied
// tensor, or the sums of dequant_sum_requantize). So g is computed first, by
// the kernels below, and stored in the segment's header, where the quantize
// kernels read it (load_segment_scale) as the CPU loops do.
//
// Warps stride over a segment's chunks, `warps_per_segment` of them sharing
// one. With one warp per segment, the warp stores g itself. With more, each
// warp atomicMax-es its amax into the header word (finite amaxes are
// non-negative floats, which order as their bits), cleared first, and a last
// kernel replaces that amax by g. The atomics need the header 4-byte
// aligned; where it is not (segments at an odd address), each segment gets
// one warp.

// Enough warps to fill the GPU: a segment gets at most this many over the
// segment count, so a call makes at most this many atomics in all.
constexpr int64_t kSegmentAmaxWarps = 8192;

template <WireFormat F>
__device__ __forceinline__ uint8_t* segment_header(const BlockCodes& dst, int64_t r) {
  return dst.scales + r * dst.stride - WireTraits<F>::kSegmentScaleBytes;
}

template <WireFormat F>
__global__ void __launch_bounds__(kThreads) clear_segment_amax_kernel(BlockCodes dst) {
  for (int64_t r = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; r < dst.num_segments;
       r += int64_t{gridDim.x} * blockDim.x) {
    *reinterpret_cast<uint32_t*>(segment_header<F>(dst, r)) = 0;
  }
}

template <class Source, WireFormat F>
__global__ void __launch_bounds__(kThreads) segment_amax_kernel(Source source, BlockCodes dst,
                                                                int64_t warps_per_segment) {
  const int64_t chunks = (dst.capacity + kChunk - 1) / kChunk;
  const int lane = threadIdx.x & 31;
  const int64_t total_warps = dst.num_segments * warps_per_segment;
  const int64_t warps_per_grid = int64_t{gridDim.x} * (blockDim.x / 32);
  for (int64_t w = int64_t{blockIdx.x} * (blockDim.x / 32) + threadIdx.x / 32; w < total_warps;
       w += warps_per_grid) {
    const int64_t r = w / warps_per_segment;
    const int64_t k = w - r * warps_per_segment;
    uint32_t amax = 0;
    for (int64_t c = k * 32 + lane; c < chunks; c += warps_per_segment * 32) {
      float v[kChunk];
      const int valid = source.load(r, c * kChunk, v);
      const uint32_t a = chunk_amax(v, valid);
      amax = a > amax ? a : amax;
    }
    amax = warp_max(amax);
    if (lane != 0) continue;
    if (warps_per_segment == 1) {
      store_segment_scale<F>(dst.scales + r * dst.stride, segment_scale<F>(amax));
    } else if (amax != 0) {
      atomicMax(reinterpret_cast<unsigned*>(segment_header<F>(dst, r)), amax);
    }
  }
}

// The header word of each segment: its amax -> its g.
template <WireFormat F>
__global__ void __launch_bounds__(kThreads) segment_scale_kernel(BlockCodes dst) {
  for (int64_t r = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; r < dst.num_segments;
       r += int64_t{gridDim.x} * blockDim.x) {
    const uint32_t amax = *reinterpret_cast<const uint32_t*>(segment_header<F>(dst, r));
    store_segment_scale<F>(dst.scales + r * dst.stride, segment_scale<F>(amax));
  }
}

template <class Source, WireFormat F>
int launch_segment_scales(const Source& source, const BlockCodes& dst, cudaStream_t stream) {
  const int64_t P = dst.num_segments;
  if (P == 0) return 0;
  const int64_t chunks = (dst.capacity + kChunk - 1) / kChunk;
  const uintptr_t header = reinterpret_cast<uintptr_t>(dst.scales) - WireTraits<F>::kSegmentScaleBytes;
  const bool aligned = (header & 3u) == 0 && (dst.stride & 3) == 0;
  int64_t warps = (chunks + 31) / 32;
  const int64_t most = kSegmentAmaxWarps / P;
  warps = warps < most ? warps : most;
  warps = aligned && warps > 1 ? warps : 1;
  if (warps > 1) FP8C_LAUNCH(grid_for(P), kThreads, 0, stream, clear_segment_amax_kernel<F>)(dst);
  FP8C_LAUNCH(grid_for(P * warps * 32), kThreads, 0, stream, segment_amax_kernel<Source, F>)(source, dst, warps);
  if (warps > 1) FP8C_LAUNCH(grid_for(P), kThreads, 0, stream, segment_scale_kernel<F>)(dst);
  return static_cast<int>(cudaGetLastError());
}

template <class Source, WireFormat F>
int launch_quantize(const Source& source, const BlockCodes& dst, cudaStream_t stream) {
  if constexpr (WireTraits<F>::kSegmentScaleBytes != 0) {
    const int error = launch_segment_scales<Source, F>(source, dst, stream);
    if (error != 0) return error;
  }
  const int64_t blocks_per_segment = (dst.capacity + dst.block_size - 1) / dst.block_size;
  const int64_t total_blocks = dst.num_segments * blocks_per_segment;
  if (total_blocks == 0) return 0;
  const int lanes = dst.block_size / kChunk;
  if (lanes <= 32 && (lanes & (lanes - 1)) == 0) {
    FP8C_LAUNCH(grid_for(total_blocks * lanes), kThreads, 0, stream, quantize_shuffle_kernel<Source, F>)(
        source, dst, total_blocks, lanes);
  } else {
    FP8C_LAUNCH(grid_for(total_blocks * 32), kThreads, 0, stream, quantize_warp_kernel<Source, F>)(
        source, dst, total_blocks);
  }
  return static_cast<int>(cudaGetLastError());
}

// ------------------------------------------------------------- decoding
// One thread per chunk of 16 codes: dst[r * m + i0 + t] for the valid ones.
template <ElemType E, WireFormat F>
__global__ void __launch_bounds__(kThreads) dequantize_kernel(BlockCodes src, Storage<E>* dst, int64_t numel,
                                                              int64_t chunks_per_segment) {
  const int64_t m = src.segment_numel;
  const int64_t total = src.num_segments * chunks_per_segment;
  for (int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = idx / chunks_per_segment;
    const int64_t i0 = (idx - r * chunks_per_segment) * kChunk;
    const int64_t first = r * m + i0;
    const int64_t seg_end = (r + 1) * m < numel ? (r + 1) * m : numel;
    const int valid = clamp_chunk(seg_end - first);
    if (valid == 0) continue;
    const uint8_t* scales = src.scales + r * src.stride;
    const float scale = block_scale<F>(scales[i0 / src.block_size], load_segment_scale<F>(scales));
    uint8_t c[kChunk];
    load_codes<F>(src.codes + r * src.stride + code_bytes<F>(i0), valid, c);
    float v[kChunk];
#pragma unroll
    for (int t = 0; t < kChunk; ++t) v[t] = decode_code<F>(c[t]) * scale;
    store_chunk<E>(dst + first, valid, v);
  }
}

template <ElemType E, WireFormat F>
__global__ void __launch_bounds__(kThreads) dequant_sum_kernel(BlockCodes pieces, OwnAddend own, int post_div,
                                                               Storage<E>* dst, int64_t numel) {
  const int64_t total = (numel + kChunk - 1) / kChunk;
  for (int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t i0 = idx * kChunk;
    const int valid = clamp_chunk(numel - i0);
    float acc[kChunk];
    sum_pieces<E, F>(pieces, own, post_div, i0, valid, acc);
    store_chunk<E>(dst + i0, valid, acc);
  }
}

}  // namespace

int quantize_cuda(const void* src, ElemType type, int64_t numel, float premul, const float* premul_device,
                  const BlockCodes& dst, void* stream) {
  return with_codec_types(type, dst.format, [&](auto e, auto f) {
    constexpr ElemType E = decltype(e)::value;
    constexpr WireFormat F = decltype(f)::value;
    TensorSource<E> source{static_cast<const Storage<E>*>(src), numel, dst.segment_numel, premul, premul_device};
    return launch_quantize<TensorSource<E>, F>(source, dst, static_cast<cudaStream_t>(stream));
  });
}

int dequantize_cuda(const BlockCodes& src, void* dst, ElemType type, int64_t numel, void* stream) {
  const int64_t chunks_per_segment = (src.segment_numel + kChunk - 1) / kChunk;
  const int64_t total = src.num_segments * chunks_per_segment;
  if (total == 0 || numel == 0) return 0;
  return with_codec_types(type, src.format, [&](auto e, auto f) {
    constexpr ElemType E = decltype(e)::value;
    constexpr WireFormat F = decltype(f)::value;
    FP8C_LAUNCH(grid_for(total), kThreads, 0, static_cast<cudaStream_t>(stream), dequantize_kernel<E, F>)(
        src, static_cast<Storage<E>*>(dst), numel, chunks_per_segment);
    return static_cast<int>(cudaGetLastError());
  });
}

int dequant_sum_cuda(const BlockCodes& pieces, const OwnAddend& own, int post_div, void* dst, ElemType type,
                     int64_t numel, void* stream) {
  if (numel == 0) return 0;
  if (own.present && own.type != type) return static_cast<int>(cudaErrorInvalidValue);
  return with_codec_types(type, pieces.format, [&](auto e, auto f) {
    constexpr ElemType E = decltype(e)::value;
    constexpr WireFormat F = decltype(f)::value;
    FP8C_LAUNCH(grid_for((numel + kChunk - 1) / kChunk), kThreads, 0, static_cast<cudaStream_t>(stream),
                dequant_sum_kernel<E, F>)(pieces, own, post_div, static_cast<Storage<E>*>(dst), numel);
    return static_cast<int>(cudaGetLastError());
  });
}

int dequant_sum_requantize_cuda(const BlockCodes& pieces, const OwnAddend& own, int post_div, const BlockCodes& out,
                                void* stream) {
  return with_codec_types(own.type, pieces.format, [&](auto e, auto f) {
    constexpr ElemType E = decltype(e)::value;
    constexpr WireFormat F = decltype(f)::value;
    return launch_quantize<PiecesSource<E, F>, F>({pieces, own, post_div}, out, static_cast<cudaStream_t>(stream));
  });
}

const char* cuda_error_string(int error) { return cudaGetErrorString(static_cast<cudaError_t>(error)); }

}  // namespace fp8comm
