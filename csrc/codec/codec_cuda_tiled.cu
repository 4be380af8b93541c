// The block codec on CUDA, tiled for the memory bound: the same entry points
// and the same bytes as codec_cuda.cu (the CPU codec's, bit for bit), in a
// layout that keeps HBM busy. FP8COMM_CUDA_CODEC chooses between the two
// (codec_tensor.cpp); DESIGN.md, "Layout", describes both.
//
// - A warp handles tiles of 512 elements of one segment (tile_io_cuda.cuh):
//   lane l's 16-byte accesses of the wide side at base + 16 l + 512 k, its
//   codes the matching 2-8 bytes, so every warp access is contiguous.
// - The grid covers the device (SM count x kBlocksPerSm blocks), each warp
//   striding over (segment, tile) items numbered in 32 bits: one 32-bit
//   division per tile, no 64-bit division or remainder in any kernel. The
//   host checks that the numbers fit and computes the per-launch constants.
// - A tile's loads are all issued before its math (2-4 16-byte loads a lane;
//   the sum: every piece's codes of a row, then the decodes in piece order).
// - A block of B elements (a power of two up to the tile) is a group of
//   adjacent lanes of a row, or whole rows: its amax is an in-lane max over
//   rows and a butterfly of shuffles over B / kVec lanes.
// - E4M3 / E5M2 codes go through the hardware conversions of sm_89+
//   (fp8_convert_cuda.cuh) where they are exact: rounding to nearest in a
//   lane's run of finite elements whose block's code limit is the format's
//   largest code; every other element takes fp8_block_math.h's software
//   encode. Decode always may.
//
// - A format with a segment scale (NVFP4; "segment scales" below): segments
//   of at most one block of tiles in one launch that reads the source once,
//   the amax in the block; longer ones in two launches that read it twice,
//   the minimum: an amax pass writing one partial amax per slice of a
//   segment to a workspace, then the quantize, whose warps reduce them to g.
//
// What it does not cover goes to codec_cuda.cu's kernels, explicitly (the
// launchers at the end): a block size that is not a power of two or exceeds
// the tile; quantizing into long segment-scaled segments without a
// workspace; sizes whose tile numbers do not fit 31 bits.
#include <cuda_runtime.h>
#include <stdint.h>

#include "codec.h"
#include "fp8_convert_cuda.cuh"
#include "launch_cuda.cuh"
#include "tile_io_cuda.cuh"

namespace fp8comm {
namespace tiled {
namespace {

using tile_io::CodeRun;
using tile_io::ElemRun;
using tile_io::Geometry;
using tile_io::kLaneElems;
using tile_io::kTile;
using tile_io::run_count;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Resident blocks per SM the grid assumes; __launch_bounds__ holds every
// kernel to the 64 registers a thread this allows.
constexpr int kBlocksPerSm = 4;
// Pieces whose codes a lane loads together, before decoding them in order:
// all of them up to the batch a 64-register budget holds beside the sum
// (dequant-sum: 8 words of codes; sum + re-quantize, which also holds the
// tile's values: 4 pieces, 2 with segment scales); a count without kernels
// of its own, 4 at a time.
constexpr int kGenericBatch = 4;
template <WireFormat F, ElemType E>
struct SumBatch {
  static constexpr int value =
      WireTraits<F>::kSegmentScaleBytes != 0 ? 4 : 8 / tile_io::CodeRun<F, Geometry<E>::kVec>::kWords;
};
// The re-quantize also holds the block's codes and scales: 4-bit formats
// (whose decode unpacks more registers) take smaller batches, so that every
// kernel stays within 64 registers without spilling on sm_90 and sm_100.
template <WireFormat F>
struct RequantizeBatch {
  static constexpr int value =
      WireTraits<F>::kSegmentScaleBytes != 0 ? 1 : (WireTraits<F>::kCodeBits == 4 ? 2 : 4);
};

// Per-launch constants, computed on the host.
struct TileGrid {
  uint32_t tiles_per_segment;
  uint32_t items;  // segments x tiles_per_segment, < 2^31
  uint32_t log2_block;
};

FP8C_HD constexpr uint32_t log2_of(uint32_t b) { return b <= 1 ? 0u : 1u + log2_of(b / 2); }

// The block size: a template constant (kB > 0) or the launch's (kB == 0).
template <int kB>
__device__ __forceinline__ uint32_t log2_block(const TileGrid& grid) {
  if constexpr (kB > 0) {
    return log2_of(kB);
  } else {
    return grid.log2_block;
  }
}

// The warp's items: (segment r, first tile element i0).
struct Item {
  uint32_t r, i0;
};

__device__ __forceinline__ uint32_t first_item() { return blockIdx.x * kWarps + threadIdx.x / 32; }
__device__ __forceinline__ uint32_t item_stride() { return gridDim.x * kWarps; }
__device__ __forceinline__ Item item_of(uint32_t w, const TileGrid& grid) {
  const uint32_t r = w / grid.tiles_per_segment;
  return Item{r, (w - r * grid.tiles_per_segment) * static_cast<uint32_t>(kTile)};
}

__device__ __forceinline__ uint32_t lane_id() { return threadIdx.x & 31; }

// Tile element of lane l's run in row k.
template <ElemType E>
__device__ __forceinline__ uint32_t run_first(uint32_t i0, int k, uint32_t lane) {
  return i0 + static_cast<uint32_t>(k * Geometry<E>::kRowElems) + lane * Geometry<E>::kVec;
}

__device__ __forceinline__ uint32_t clamp_u32(int64_t n, uint32_t hi) {
  return n <= 0 ? 0u : (n >= hi ? hi : static_cast<uint32_t>(n));
}

// ------------------------------------------------------------------ sources
// What a quantizing kernel encodes, a lane's 16 values of a tile at a time:
// v[k * kVec + j] for run k's element j; values at or past valid_end(r) are
// not used.

// A tensor times premul (quantize).
template <ElemType E>
struct TensorSource {
  static constexpr ElemType kType = E;
  const Storage<E>* src;
  int64_t numel;
  int64_t segment_numel;
  float premul;
  const float* premul_device;

  __device__ __forceinline__ uint32_t valid_end(uint32_t r, uint32_t capacity) const {
    return clamp_u32(numel - int64_t{r} * segment_numel, capacity < segment_numel ? capacity : static_cast<uint32_t>(segment_numel));
  }

  __device__ __forceinline__ void load(uint32_t r, uint32_t i0, uint32_t end, float (&v)[kLaneElems]) const {
    using G = Geometry<E>;
    const Storage<E>* base = src + int64_t{r} * segment_numel;
    const uint32_t lane = lane_id();
    ElemRun<E> run[G::kRows];
#pragma unroll
    for (int k = 0; k < G::kRows; ++k) {
      const uint32_t first = run_first<E>(i0, k, lane);
      const int n = run_count<G::kVec>(first, end);
      run[k].load(base + first, n);
    }
    const float f = premul_device != nullptr ? *premul_device : premul;
#pragma unroll
    for (int k = 0; k < G::kRows; ++k) {
#pragma unroll
      for (int j = 0; j < G::kVec; ++j) v[k * G::kVec + j] = run[k].get(j) * f;
    }
  }
};

// A piece's decoded run: codes times the block's scale.
template <WireFormat F, int kVec>
__device__ __forceinline__ void decode_run(const CodeRun<F, kVec>& c, float scale, float (&d)[kVec]) {
  if constexpr (fp8_convert::kHasHardwareCvt<F> && kVec % 2 == 0) {
#pragma unroll
    for (int j = 0; j < kVec; j += 2) {
      float lo, hi;
      fp8_convert::fp8x2_to_float2<F>(static_cast<uint16_t>(c.code(j) | (c.code(j + 1) << 8)), lo, hi);
      d[j] = lo * scale;
      d[j + 1] = hi * scale;
    }
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j) d[j] = decode_code<F>(static_cast<uint8_t>(c.code(j))) * scale;
  }
}

// (own + the pieces, in piece order) / post_div, E the own addend's type;
// kP pieces (0: any count), loaded kBatch at a time. Padding codes are
// zeros, so every element below `end` is summed.
template <ElemType E, WireFormat F, int kP, int kMaxBatch>
struct SumSource {
  static constexpr int kBatch = kP > 0 && kP < kMaxBatch ? kP : (kP > 0 || kMaxBatch < kGenericBatch ? kMaxBatch : kGenericBatch);
  static constexpr ElemType kType = E;
  BlockCodes pieces;
  OwnAddend own;
  int post_div;
  uint32_t log2_block;

  __device__ __forceinline__ uint32_t valid_end(uint32_t /*r*/, uint32_t capacity) const { return capacity; }

  __device__ __forceinline__ void add_pieces(int p0, uint32_t first, int n, float (&acc)[Geometry<E>::kVec]) const {
    constexpr int kVec = Geometry<E>::kVec;
    CodeRun<F, kVec> c[kBatch];
    uint8_t sb[kBatch];
    float g[kBatch];
    const int count = static_cast<int>(pieces.num_segments);
#pragma unroll
    for (int q = 0; q < kBatch; ++q) {
      if ((kP == 0 || kP % kBatch != 0) && p0 + q >= count) break;
      const int64_t off = int64_t{p0 + q} * pieces.stride;
      c[q].load(pieces.codes + off + code_bytes<F>(first), n);
      sb[q] = n > 0 ? pieces.scales[off + (first >> log2_block)] : uint8_t{0};  // no block past the capacity
      g[q] = load_segment_scale<F>(pieces.scales + off);
    }
#pragma unroll
    for (int q = 0; q < kBatch; ++q) {
      if ((kP == 0 || kP % kBatch != 0) && p0 + q >= count) break;
      float d[kVec];
      decode_run<F, kVec>(c[q], block_scale<F>(sb[q], g[q]), d);
      const bool first_term = p0 + q == 0 && !own.present;
#pragma unroll
      for (int j = 0; j < kVec; ++j) acc[j] = first_term ? d[j] : acc[j] + d[j];
    }
  }

  // The run of kVec sums from segment element `first`, n of them below end.
  __device__ __forceinline__ void sum_run(uint32_t first, int n, float (&acc)[Geometry<E>::kVec]) const {
    constexpr int kVec = Geometry<E>::kVec;
    if (own.present) {
      const int own_n = run_count<kVec>(first, clamp_u32(own.numel, 0xFFFFFFFFu));
      ElemRun<E> o;
      o.load(static_cast<const Storage<E>*>(own.src) + (own_n > 0 ? first : 0), own_n);
      const float f = own.premul_device != nullptr ? *own.premul_device : own.premul;
#pragma unroll
      for (int j = 0; j < kVec; ++j) acc[j] = j < own_n ? o.get(j) * f : 0.0f;  // +0 past the end, as on the CPU
    }
    if constexpr (kP > 0) {
#pragma unroll 1  // a batch's registers serve the next
      for (int p0 = 0; p0 < kP; p0 += kBatch) add_pieces(p0, first, n, acc);
    } else {
      for (int p0 = 0; p0 < pieces.num_segments; p0 += kBatch) add_pieces(p0, first, n, acc);
    }
    if (post_div != 1) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) acc[j] = sum_finish(acc[j], post_div);
    }
  }

  __device__ __forceinline__ void load(uint32_t /*r*/, uint32_t i0, uint32_t end, float (&v)[kLaneElems]) const {
    using G = Geometry<E>;
    const uint32_t lane = lane_id();
#pragma unroll
    for (int k = 0; k < G::kRows; ++k) {
      const uint32_t first = run_first<E>(i0, k, lane);
      float acc[G::kVec];
      sum_run(first, run_count<G::kVec>(first, end), acc);
#pragma unroll
      for (int j = 0; j < G::kVec; ++j) v[k * G::kVec + j] = acc[j];
    }
  }
};

// Whether a source's short segment-scaled segments take the one-launch
// kernel ("segment scales"): all but the generic piece count's sum, whose
// one-launch kernel would exceed 64 registers (it takes the two launches).
template <class Source>
struct OnePass {
  static constexpr bool value = true;
};
template <ElemType E, WireFormat F, int kMaxBatch>
struct OnePass<SumSource<E, F, 0, kMaxBatch>> {
  static constexpr bool value = false;
};

// ------------------------------------------------------------- quantizing
// Max (or or) over the lanes of a block: a butterfly over lanes_per_block
// adjacent lanes (a power of two; the same for every lane of the warp).
__device__ __forceinline__ uint32_t block_max(uint32_t v, uint32_t lanes_per_block) {
#pragma unroll
  for (uint32_t off = 16; off >= 1; off /= 2) {
    if (off < lanes_per_block) {
      const uint32_t other = __shfl_xor_sync(0xffffffffu, v, static_cast<int>(off));
      v = other > v ? other : v;
    }
  }
  return v;
}

__device__ __forceinline__ uint32_t block_or(uint32_t v, uint32_t lanes_per_block) {
#pragma unroll
  for (uint32_t off = 16; off >= 1; off /= 2) {
    if (off < lanes_per_block) v |= __shfl_xor_sync(0xffffffffu, v, static_cast<int>(off));
  }
  return v;
}

// The codes of a run of n valid values (zeros past n), with its block's
// encoding; `hardware`: the run may take the hardware conversion.
template <WireFormat F, int kVec>
__device__ __forceinline__ void encode_run(const float* v, int n, const BlockEncoding& enc, bool hardware,
                                           const BlockCodes& dst, const StochasticRun& sr, uint32_t first,
                                           CodeRun<F, kVec>& out) {
  out.clear();
  if (dst.rounding == Rounding::kStochastic) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      if (j < n) out.set(j, encode_code_stochastic<F>(to_code_units<F>(v[j], enc), enc.limit, sr.bits(first + j)));
    }
    return;
  }
  if constexpr (fp8_convert::kHasHardwareCvt<F>) {
    if (hardware) {
#pragma unroll
      for (int j = 0; j < kVec; j += 2) {
        const float lo = j < n ? to_code_units<F>(v[j], enc) : 0.0f;
        const float hi = j + 1 < n ? to_code_units<F>(v[j + 1], enc) : 0.0f;
        const uint16_t pair = fp8_convert::float2_to_fp8x2<F>(lo, hi);
        out.set(j, pair & 0xFFu);
        out.set(j + 1, static_cast<uint32_t>(pair) >> 8);
      }
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    if (j < n) out.set(j, encode_code<F>(to_code_units<F>(v[j], enc), enc.limit));
  }
}

// The finite amax of a lane's values of tile i0 below end.
template <ElemType E>
__device__ __forceinline__ uint32_t lane_amax(const float (&v)[kLaneElems], uint32_t i0, uint32_t end) {
  using G = Geometry<E>;
  const uint32_t lane = lane_id();
  uint32_t amax = 0;
#pragma unroll
  for (int k = 0; k < G::kRows; ++k) {
    const int n = run_count<G::kVec>(run_first<E>(i0, k, lane), end);
#pragma unroll
    for (int j = 0; j < G::kVec; ++j) {
      const uint32_t a = j < n ? finite_abs_bits(v[k * G::kVec + j]) : 0u;
      amax = a > amax ? a : amax;
    }
  }
  return amax;
}

// One warp's tile of segment it.r, its values in v (valid below end), under
// segment scale g (1 without one): each block's amax (in-lane over its rows,
// then a butterfly over its lanes), its scale byte written by the lane
// holding its first element, its codes by every lane; zero codes from end to
// the capacity, then scale_padding zero bytes after the segment's last scale.
template <ElemType E, WireFormat F, int kB>
__device__ __forceinline__ void quantize_tile(const BlockCodes& dst, const TileGrid& grid, Item it, uint32_t end,
                                              const float (&v)[kLaneElems], float g) {
  using G = Geometry<E>;
  const uint32_t lane = lane_id();
  const uint32_t lb = log2_block<kB>(grid);
  const uint32_t block_mask = (1u << lb) - 1u;
  const uint32_t capacity = static_cast<uint32_t>(dst.capacity);
  const uint32_t blocks_per_segment = (capacity + block_mask) >> lb;
  const uint32_t lanes_per_block = (1u << lb) / G::kVec;    // > 32: whole rows
  const uint32_t rows_per_block = (1u << lb) / G::kRowElems;  // 0: part of a row
  uint32_t amax[G::kRows], nonfinite[G::kRows];
  bool finite_run[G::kRows];
#pragma unroll
  for (int k = 0; k < G::kRows; ++k) {
    const int n = run_count<G::kVec>(run_first<E>(it.i0, k, lane), end);
    amax[k] = 0;
    nonfinite[k] = 0;
#pragma unroll
    for (int j = 0; j < G::kVec; ++j) {
      const uint32_t a = j < n ? finite_abs_bits(v[k * G::kVec + j]) : 0u;
      amax[k] = a > amax[k] ? a : amax[k];
      nonfinite[k] |= j < n ? nonfinite_bit(v[k * G::kVec + j]) : 0u;
    }
    finite_run[k] = nonfinite[k] == 0;
  }
  // Blocks of whole rows: rows k and k ^ s share a block for s < rows_per_block.
#pragma unroll
  for (int s = 1; s < G::kRows; s *= 2) {
    if (static_cast<uint32_t>(s) < rows_per_block) {
#pragma unroll
      for (int k = 0; k < G::kRows; ++k) {
        amax[k] = amax[k ^ s] > amax[k] ? amax[k ^ s] : amax[k];
        nonfinite[k] |= nonfinite[k ^ s];
      }
    }
  }
#pragma unroll
  for (int k = 0; k < G::kRows; ++k) {
    amax[k] = block_max(amax[k], lanes_per_block);
    if constexpr (!WireTraits<F>::kHasNanCode) nonfinite[k] = block_or(nonfinite[k], lanes_per_block);
  }
  uint8_t* scales = dst.scales + int64_t{it.r} * dst.stride;
  uint8_t* codes = dst.codes + int64_t{it.r} * dst.stride;
  const StochasticRun sr = dst.rounding == Rounding::kStochastic ? dst.stochastic_run(it.r, 0) : StochasticRun{};
#pragma unroll
  for (int k = 0; k < G::kRows; ++k) {
    const uint32_t first = run_first<E>(it.i0, k, lane);
    if (first >= capacity) continue;
    const uint8_t sb = block_scale_byte<F>(amax[k], g);
    const BlockEncoding enc = block_encoding<F>(sb, g);
    const bool hardware = finite_run[k] && enc.limit == WireTraits<F>::kMaxCode;
    CodeRun<F, G::kVec> c;
    encode_run<F, G::kVec>(v + k * G::kVec, run_count<G::kVec>(first, end), enc, hardware, dst, sr, first, c);
    c.store(codes + code_bytes<F>(first), run_count<G::kVec>(first, capacity));
    if ((first & block_mask) == 0) {
      const uint32_t j = first >> lb;
      scales[j] = stored_scale_byte<F>(sb, nonfinite[k]);
      if (j == blocks_per_segment - 1) {
        for (int64_t q = 1; q <= dst.scale_padding; ++q) scales[j + q] = 0;
      }
    }
  }
}

// A segment-scaled format's partial amaxes (`segment scales` below): the
// amax of slice s of segment r at partials[r * slices + s], slice s being
// tiles [s * tiles_per_slice, (s + 1) * tiles_per_slice) of the segment.
// Unused (null) for the other formats.
struct SegmentAmaxes {
  uint32_t* partials;
  uint32_t slices;
  uint32_t tiles_per_slice;
};

// Segment r's g from its slices' partial amaxes (the warp's lanes together;
// a max, so the same g whatever order the slices were written in).
template <WireFormat F>
__device__ __forceinline__ float segment_scale_of(const SegmentAmaxes& amaxes, uint32_t r) {
  const uint32_t* p = amaxes.partials + r * amaxes.slices;  // < 2^31 words: the host checks
  uint32_t amax = 0;
  for (uint32_t s = lane_id(); s < amaxes.slices; s += 32) amax = p[s] > amax ? p[s] : amax;
  return segment_scale<F>(block_max(amax, 32));
}

// One warp a tile at a time; a segment-scaled format's g from `amaxes`,
// reduced when the warp reaches a segment and kept in shared memory (every
// lane writes the same values there; registers are at the 64 limit), its
// header stored by the warp of the segment's first tile.
template <class Source, WireFormat F, int kB>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) quantize_tiled_kernel(Source source, BlockCodes dst,
                                                                                TileGrid grid,
                                                                                SegmentAmaxes amaxes) {
  constexpr ElemType E = Source::kType;
  constexpr bool kSegmentScaled = WireTraits<F>::kSegmentScaleBytes != 0;
  __shared__ uint32_t warp_segment[kSegmentScaled ? kWarps : 1];  // the segment whose g warp_g holds
  __shared__ float warp_g[kSegmentScaled ? kWarps : 1];
  const uint32_t warp = kSegmentScaled ? threadIdx.x / 32 : 0;
  if constexpr (kSegmentScaled) warp_segment[warp] = 0xFFFFFFFFu;
  (void)warp_segment;  // (unused without a segment scale)
  const uint32_t capacity = static_cast<uint32_t>(dst.capacity);
  for (uint32_t w = first_item(); w < grid.items; w += item_stride()) {
    const Item it = item_of(w, grid);
    if constexpr (kSegmentScaled) {
      const bool reached = warp_segment[warp] != it.r;
      __syncwarp();  // every lane has read warp_segment before any writes it
      if (reached) {  // the same for every lane of the warp
        const float g = segment_scale_of<F>(amaxes, it.r);
        warp_g[warp] = g;
        warp_segment[warp] = it.r;
        if (it.i0 == 0 && lane_id() == 0) store_segment_scale<F>(dst.scales + int64_t{it.r} * dst.stride, g);
      }
    }
    const uint32_t end = source.valid_end(it.r, capacity);
    float v[kLaneElems];
    source.load(it.r, it.i0, end, v);
    quantize_tile<E, F, kB>(dst, grid, it, end, v, kSegmentScaled ? warp_g[warp] : 1.0f);
  }
}

// ------------------------------------------------------------- decoding
// dst[r * m + i] for the valid elements of each segment's tiles.
template <ElemType E, WireFormat F, int kB>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) dequantize_tiled_kernel(BlockCodes src, Storage<E>* dst,
                                                                                  int64_t numel, TileGrid grid) {
  using G = Geometry<E>;
  const uint32_t lane = lane_id();
  const uint32_t lb = log2_block<kB>(grid);
  const int64_t m = src.segment_numel;
  for (uint32_t w = first_item(); w < grid.items; w += item_stride()) {
    const Item it = item_of(w, grid);
    const uint32_t end = clamp_u32(numel - int64_t{it.r} * m, static_cast<uint32_t>(m));
    const uint8_t* scales = src.scales + int64_t{it.r} * src.stride;
    const uint8_t* codes = src.codes + int64_t{it.r} * src.stride;
    CodeRun<F, G::kVec> c[G::kRows];
    uint8_t sb[G::kRows];
#pragma unroll
    for (int k = 0; k < G::kRows; ++k) {
      const uint32_t first = run_first<E>(it.i0, k, lane);
      const int n = run_count<G::kVec>(first, end);
      c[k].load(codes + code_bytes<F>(first), n);
      sb[k] = n > 0 ? scales[first >> lb] : uint8_t{0};
    }
    const float g = load_segment_scale<F>(scales);
    Storage<E>* out = dst + int64_t{it.r} * m;
#pragma unroll
    for (int k = 0; k < G::kRows; ++k) {
      const uint32_t first = run_first<E>(it.i0, k, lane);
      const int n = run_count<G::kVec>(first, end);
      if (n == 0) continue;
      float d[G::kVec];
      decode_run<F, G::kVec>(c[k], block_scale<F>(sb[k], g), d);
      tile_io::store_run<E>(out + first, n, d);
    }
  }
}

template <class Source>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) dequant_sum_tiled_kernel(Source source,
                                                                                   Storage<Source::kType>* dst,
                                                                                   uint32_t numel, TileGrid grid) {
  constexpr ElemType E = Source::kType;
  using G = Geometry<E>;
  const uint32_t lane = lane_id();
  for (uint32_t w = first_item(); w < grid.items; w += item_stride()) {
    const uint32_t i0 = w * static_cast<uint32_t>(kTile);
#pragma unroll
    for (int k = 0; k < G::kRows; ++k) {
      const uint32_t first = run_first<E>(i0, k, lane);
      const int n = run_count<G::kVec>(first, numel);
      if (n == 0) continue;
      float acc[G::kVec];
      source.sum_run(first, n, acc);
      tile_io::store_run<E>(dst + first, n, acc);
    }
  }
}

// ------------------------------------------------------------- launching
int sm_count() {
  int device = 0, count = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || count < 1) {
    cudaGetLastError();  // a query that failed is no launch error
    return 1;
  }
  return count;
}

uint32_t grid_for(uint32_t items) {
  const uint32_t blocks = (items + kWarps - 1) / kWarps;
  const uint32_t cap = static_cast<uint32_t>(sm_count()) * kBlocksPerSm;
  return blocks < 1 ? 1 : (blocks > cap ? cap : blocks);
}

constexpr int64_t kMaxExtent = (int64_t{1} << 31) - kTile;

// Whether the tiled kernels cover a block size: a power of two up to the tile.
bool covers_block(int block_size) { return block_size <= kTile && (block_size & (block_size - 1)) == 0; }

// The tile numbers of `segments` segments of `extent` elements; false when
// they do not fit 31 bits.
bool tile_grid(int64_t segments, int64_t extent, int block_size, TileGrid& grid) {
  if (segments < 0 || extent < 0 || extent > kMaxExtent) return false;
  const int64_t tiles = (extent + kTile - 1) / kTile;
  if (tiles * segments >= (int64_t{1} << 31)) return false;
  grid.tiles_per_segment = static_cast<uint32_t>(tiles < 1 ? 1 : tiles);
  grid.items = static_cast<uint32_t>(tiles * segments);
  grid.log2_block = log2_of(static_cast<uint32_t>(block_size));
  return true;
}

// Calls fn(std::integral_constant<int, kB>) with kB the block size where it
// has kernels of its own (16, 32), else 0.
template <typename Fn>
decltype(auto) with_block(int block_size, Fn&& fn) {
  switch (block_size) {
    case 16: return fn(std::integral_constant<int, 16>{});
    case 32: return fn(std::integral_constant<int, 32>{});
    default: return fn(std::integral_constant<int, 0>{});
  }
}

// The same over piece counts with kernels of their own (2, 4, 8, 16), else 0.
template <typename Fn>
decltype(auto) with_pieces(int64_t pieces, Fn&& fn) {
  switch (pieces) {
    case 2: return fn(std::integral_constant<int, 2>{});
    case 4: return fn(std::integral_constant<int, 4>{});
    case 8: return fn(std::integral_constant<int, 8>{});
    case 16: return fn(std::integral_constant<int, 16>{});
    default: return fn(std::integral_constant<int, 0>{});
  }
}

// ------------------------------------------------------------- segment scales
// A format with a segment scale (NVFP4): every block scale of a segment
// depends on its g, which depends on the finite amax of all the quantize
// encodes into it. Two ways, both without atomics, so g never depends on the
// order blocks run in:
//
// - Short segments (at most kWarps tiles): one launch, one read. A block's
//   warps hold a segment's tiles in registers, their amaxes meet in shared
//   memory, and every warp turns the max into g and quantizes.
// - Longer ones: two launches, two reads, the minimum when the amax spans
//   blocks. The amax pass gives each block a slice of a segment (enough
//   slices for the device's blocks, up to kMaxSlices) and writes its amax
//   to the workspace, every word of it each time (no clear); the quantize's
//   warps reduce a segment's slices when they reach it (a max: the same g in
//   any order) and the warp of its first tile stores g in its header.
constexpr uint32_t kMaxSlices = 1024;

// Short segments: a block a segment, warp k its tile k.
template <class Source, WireFormat F, int kB>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) quantize_short_segments_tiled_kernel(Source source,
                                                                                               BlockCodes dst,
                                                                                               TileGrid grid) {
  constexpr ElemType E = Source::kType;
  __shared__ uint32_t warp_amax[kWarps];
  const uint32_t warp = threadIdx.x / 32;
  const uint32_t capacity = static_cast<uint32_t>(dst.capacity);
  // The same trip count for every thread of the block (its __syncthreads).
  for (uint32_t r = blockIdx.x; r < static_cast<uint32_t>(dst.num_segments); r += gridDim.x) {
    const Item it{r, warp * static_cast<uint32_t>(kTile)};
    const bool active = warp < grid.tiles_per_segment;  // the same for every lane of the warp
    const uint32_t end = active ? source.valid_end(r, capacity) : 0u;
    float v[kLaneElems];
    if (active) {
      source.load(r, it.i0, end, v);
    } else {
#pragma unroll
      for (int j = 0; j < kLaneElems; ++j) v[j] = 0.0f;
    }
    const uint32_t amax = block_max(lane_amax<E>(v, it.i0, end), 32);
    if (lane_id() == 0) warp_amax[warp] = amax;
    __syncthreads();
    uint32_t segment_amax = 0;
#pragma unroll
    for (int k = 0; k < kWarps; ++k) segment_amax = warp_amax[k] > segment_amax ? warp_amax[k] : segment_amax;
    __syncthreads();  // every warp has read warp_amax before the next segment writes it
    if (active) {
      const float g = segment_scale<F>(segment_amax);
      if (warp == 0 && lane_id() == 0) store_segment_scale<F>(dst.scales + int64_t{r} * dst.stride, g);
      quantize_tile<E, F, kB>(dst, grid, it, end, v, g);
    }
  }
}

// Longer segments' amax pass: a block a slice (segment r, slice s) at a
// time, its warps striding over the slice's tiles; the block's amax, through
// shared memory, to partials[r * slices + s].
template <class Source>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) segment_amax_tiled_kernel(Source source, BlockCodes dst,
                                                                                    TileGrid grid,
                                                                                    SegmentAmaxes amaxes) {
  constexpr ElemType E = Source::kType;
  __shared__ uint32_t warp_amax[kWarps];
  const uint32_t warp = threadIdx.x / 32;
  const uint32_t capacity = static_cast<uint32_t>(dst.capacity);
  const uint32_t slice_items = static_cast<uint32_t>(dst.num_segments) * amaxes.slices;  // < 2^31: the host checks
  // The same trip count for every thread of the block (its __syncthreads).
  for (uint32_t q = blockIdx.x; q < slice_items; q += gridDim.x) {
    const uint32_t r = q / amaxes.slices;
    const uint32_t t0 = (q - r * amaxes.slices) * amaxes.tiles_per_slice;
    const uint32_t t1 = t0 + amaxes.tiles_per_slice < grid.tiles_per_segment ? t0 + amaxes.tiles_per_slice
                                                                              : grid.tiles_per_segment;
    const uint32_t end = source.valid_end(r, capacity);
    uint32_t amax = 0;
    for (uint32_t t = t0 + warp; t < t1; t += kWarps) {
      const uint32_t i0 = t * static_cast<uint32_t>(kTile);
      float v[kLaneElems];
      source.load(r, i0, end, v);
      const uint32_t a = lane_amax<E>(v, i0, end);
      amax = a > amax ? a : amax;
    }
    amax = block_max(amax, 32);
    if (lane_id() == 0) warp_amax[warp] = amax;
    __syncthreads();
    if (threadIdx.x == 0) {
      uint32_t m = 0;
      for (int k = 0; k < kWarps; ++k) m = warp_amax[k] > m ? warp_amax[k] : m;
      amaxes.partials[q] = m;
    }
    __syncthreads();  // warp_amax is read before the next slice writes it
  }
}

// How the launches of a quantize into `segments` segment-scaled segments of
// grid.tiles_per_segment tiles split them: none (short segments, where
// `one_pass`), else slices of enough blocks for the device, at most
// kMaxSlices a segment and at least kWarps tiles a slice where the segment
// has them.
SegmentAmaxes slices_of(uint32_t segments, const TileGrid& grid, bool one_pass) {
  const uint32_t tiles = grid.tiles_per_segment;
  if ((one_pass && tiles <= static_cast<uint32_t>(kWarps)) || segments == 0) return SegmentAmaxes{nullptr, 0, 0};
  const uint32_t blocks = static_cast<uint32_t>(sm_count()) * kBlocksPerSm;
  uint32_t slices = (blocks + segments - 1) / segments;
  const uint32_t most = (tiles + kWarps - 1) / kWarps;
  slices = slices < most ? slices : most;
  slices = slices < kMaxSlices ? slices : kMaxSlices;
  slices = slices < 1 ? 1 : slices;
  const uint32_t per_slice = (tiles + slices - 1) / slices;
  return SegmentAmaxes{nullptr, (tiles + per_slice - 1) / per_slice, per_slice};  // no empty slice
}

// The tile grid of a quantize into `segments` of dst's segments (false:
// codec_cuda.cu's kernels). A format of one block size (NVFP4) has kernels
// for that one.
bool quantize_grid(const BlockCodes& dst, int64_t segments, TileGrid& grid) {
  const int required = required_block_size(dst.format);
  return covers_block(dst.block_size) && (required == 0 || dst.block_size == required) &&
         tile_grid(segments, dst.capacity, dst.block_size, grid) && dst.segment_numel <= kMaxExtent;
}

// The workspace words a quantize into `segments` of dst's segments needs.
int64_t workspace_words(const BlockCodes& dst, int64_t segments, bool one_pass) {
  TileGrid grid;
  if (segment_scale_bytes(dst.format) == 0 || !quantize_grid(dst, segments, grid)) return 0;
  return int64_t{slices_of(static_cast<uint32_t>(segments), grid, one_pass).slices} * segments;
}

// Whether a sum + re-quantize of `pieces` pieces has kernels of its own (with_pieces).
bool own_piece_kernels(int64_t pieces) { return pieces == 2 || pieces == 4 || pieces == 8 || pieces == 16; }

template <class Source, WireFormat F, int kB>
int launch_segment_scaled(const Source& source, const BlockCodes& dst, const TileGrid& grid, uint32_t* workspace,
                          cudaStream_t stream) {
  const uint32_t segments = static_cast<uint32_t>(dst.num_segments);
  SegmentAmaxes amaxes = slices_of(segments, grid, OnePass<Source>::value);
  const uint32_t cap = static_cast<uint32_t>(sm_count()) * kBlocksPerSm;
  if constexpr (OnePass<Source>::value) {
    if (amaxes.slices == 0) {
      FP8C_LAUNCH(segments < cap ? segments : cap, kThreads, 0, stream,
                  quantize_short_segments_tiled_kernel<Source, F, kB>)(source, dst, grid);
      return static_cast<int>(cudaGetLastError());
    }
  }
  amaxes.partials = workspace;
  const uint32_t slice_items = segments * amaxes.slices;
  FP8C_LAUNCH(slice_items < cap ? slice_items : cap, kThreads, 0, stream, segment_amax_tiled_kernel<Source>)(
      source, dst, grid, amaxes);
  TileGrid tiles = grid;
  if (tiles.items == 0) tiles.items = segments;  // empty segments: one empty tile each, for the header's g = 1
  FP8C_LAUNCH(grid_for(tiles.items), kThreads, 0, stream, quantize_tiled_kernel<Source, F, kB>)(source, dst, tiles,
                                                                                               amaxes);
  return static_cast<int>(cudaGetLastError());
}

template <class Source, WireFormat F>
int launch_quantize(const Source& source, const BlockCodes& dst, const TileGrid& grid, uint32_t* workspace,
                    cudaStream_t stream) {
  if constexpr (WireTraits<F>::kSegmentScaleBytes != 0) {
    static_assert(WireTraits<F>::kBlockSize > 0, "a segment-scaled format has one block size (quantize_grid)");
    if (dst.num_segments == 0) return 0;
    return launch_segment_scaled<Source, F, WireTraits<F>::kBlockSize>(source, dst, grid, workspace, stream);
  } else {
    if (grid.items == 0) return 0;
    return with_block(dst.block_size, [&](auto b) {
      constexpr int kB = decltype(b)::value;
      FP8C_LAUNCH(grid_for(grid.items), kThreads, 0, stream, quantize_tiled_kernel<Source, F, kB>)(
          source, dst, grid, SegmentAmaxes{nullptr, 0, 0});
      return static_cast<int>(cudaGetLastError());
    });
  }
}

}  // namespace

int64_t quantize_workspace_words(const BlockCodes& dst) { return workspace_words(dst, dst.num_segments, true); }

int64_t dequant_sum_requantize_workspace_words(const BlockCodes& pieces, const BlockCodes& out) {
  return workspace_words(out, 1, own_piece_kernels(pieces.num_segments));
}

int quantize_cuda(const void* src, ElemType type, int64_t numel, float premul, const float* premul_device,
                  const BlockCodes& dst, uint32_t* workspace, void* stream) {
  TileGrid grid;
  if (!quantize_grid(dst, dst.num_segments, grid) ||
      (workspace == nullptr && quantize_workspace_words(dst) > 0)) {
    return fp8comm::quantize_cuda(src, type, numel, premul, premul_device, dst, stream);
  }
  return with_codec_types(type, dst.format, [&](auto e, auto f) {
    constexpr ElemType E = decltype(e)::value;
    constexpr WireFormat F = decltype(f)::value;
    TensorSource<E> source{static_cast<const Storage<E>*>(src), numel, dst.segment_numel, premul, premul_device};
    return launch_quantize<TensorSource<E>, F>(source, dst, grid, workspace, static_cast<cudaStream_t>(stream));
  });
}

int dequantize_cuda(const BlockCodes& src, void* dst, ElemType type, int64_t numel, void* stream) {
  TileGrid grid;
  if (!covers_block(src.block_size) || !tile_grid(src.num_segments, src.segment_numel, src.block_size, grid)) {
    return fp8comm::dequantize_cuda(src, dst, type, numel, stream);
  }
  if (grid.items == 0 || numel == 0) return 0;
  return with_codec_types(type, src.format, [&](auto e, auto f) {
    constexpr ElemType E = decltype(e)::value;
    constexpr WireFormat F = decltype(f)::value;
    return with_block(src.block_size, [&](auto b) {
      constexpr int kB = decltype(b)::value;
      FP8C_LAUNCH(grid_for(grid.items), kThreads, 0, static_cast<cudaStream_t>(stream),
                  dequantize_tiled_kernel<E, F, kB>)(src, static_cast<Storage<E>*>(dst), numel, grid);
      return static_cast<int>(cudaGetLastError());
    });
  });
}

int dequant_sum_cuda(const BlockCodes& pieces, const OwnAddend& own, int post_div, void* dst, ElemType type,
                     int64_t numel, void* stream) {
  if (numel == 0) return 0;
  if (own.present && own.type != type) return static_cast<int>(cudaErrorInvalidValue);
  TileGrid grid;
  if (!covers_block(pieces.block_size) || !tile_grid(1, numel, pieces.block_size, grid)) {
    return fp8comm::dequant_sum_cuda(pieces, own, post_div, dst, type, numel, stream);
  }
  return with_codec_types(type, pieces.format, [&](auto e, auto f) {
    constexpr ElemType E = decltype(e)::value;
    constexpr WireFormat F = decltype(f)::value;
    return with_pieces(pieces.num_segments, [&](auto p) {
      using Source = SumSource<E, F, decltype(p)::value, SumBatch<F, E>::value>;
      const Source source{pieces, own, post_div, grid.log2_block};
      FP8C_LAUNCH(grid_for(grid.items), kThreads, 0, static_cast<cudaStream_t>(stream),
                  dequant_sum_tiled_kernel<Source>)(source, static_cast<Storage<E>*>(dst),
                                                    static_cast<uint32_t>(numel), grid);
      return static_cast<int>(cudaGetLastError());
    });
  });
}

int dequant_sum_requantize_cuda(const BlockCodes& pieces, const OwnAddend& own, int post_div, const BlockCodes& out,
                                uint32_t* workspace, void* stream) {
  TileGrid grid;
  if (!quantize_grid(out, 1, grid) ||
      (workspace == nullptr && dequant_sum_requantize_workspace_words(pieces, out) > 0)) {
    return fp8comm::dequant_sum_requantize_cuda(pieces, own, post_div, out, stream);
  }
  return with_codec_types(own.type, pieces.format, [&](auto e, auto f) {
    constexpr ElemType E = decltype(e)::value;
    constexpr WireFormat F = decltype(f)::value;
    return with_pieces(pieces.num_segments, [&](auto p) {
      using Source = SumSource<E, F, decltype(p)::value, RequantizeBatch<F>::value>;
      BlockCodes one = out;  // the sum is one segment
      one.num_segments = 1;
      return launch_quantize<Source, F>(Source{pieces, own, post_div, grid.log2_block}, one, grid, workspace,
                                        static_cast<cudaStream_t>(stream));
    });
  });
}

}  // namespace tiled
}  // namespace fp8comm
