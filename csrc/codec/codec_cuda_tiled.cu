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
// - A format with a segment scale (NVFP4) reads its source twice, the
//   minimum ("segment scales" below): an amax pass, then the quantize.
//
// What it does not cover goes to codec_cuda.cu's kernels, explicitly (the
// launchers at the end): a block size that is not a power of two or exceeds
// the tile; quantizing into segment-scaled segments whose headers are not
// 4-byte aligned; sizes whose tile numbers do not fit 31 bits.
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

// One warp a tile at a time: each block's amax (in-lane over its rows, then a
// butterfly over its lanes), its scale byte written by the lane holding its
// first element, its codes by every lane; zero codes from valid_end to the
// capacity, then scale_padding zero bytes after the segment's last scale.
template <class Source, WireFormat F, int kB>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) quantize_tiled_kernel(Source source, BlockCodes dst,
                                                                                TileGrid grid) {
  constexpr ElemType E = Source::kType;
  using G = Geometry<E>;
  const uint32_t lane = lane_id();
  const uint32_t lb = log2_block<kB>(grid);
  const uint32_t block_mask = (1u << lb) - 1u;
  const uint32_t capacity = static_cast<uint32_t>(dst.capacity);
  const uint32_t blocks_per_segment = (capacity + block_mask) >> lb;
  const uint32_t lanes_per_block = (1u << lb) / G::kVec;    // > 32: whole rows
  const uint32_t rows_per_block = (1u << lb) / G::kRowElems;  // 0: part of a row
  for (uint32_t w = first_item(); w < grid.items; w += item_stride()) {
    const Item it = item_of(w, grid);
    const uint32_t end = source.valid_end(it.r, capacity);
    float v[kLaneElems];
    source.load(it.r, it.i0, end, v);
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
    const float g = load_segment_scale<F>(scales);  // 1 without a segment scale
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
// A format with a segment scale (NVFP4; codec_cuda.cu, "segment scales"):
// every block scale depends on the segment's g, which depends on the finite
// amax of all the quantize encodes, so the source is read twice, the
// minimum: a tiled pass whose warps atomicMax their amax into each
// segment's header word (finite amaxes order as their bits; the word
// cleared first), then the quantize, which reads g from the header. Between
// them, one thread a segment turns its amax into g. The atomics need the
// headers 4-byte aligned; other layouts take codec_cuda.cu's kernels.
template <WireFormat F>
__device__ __forceinline__ uint32_t* segment_word(const BlockCodes& dst, uint32_t r) {
  return reinterpret_cast<uint32_t*>(dst.scales + int64_t{r} * dst.stride - WireTraits<F>::kSegmentScaleBytes);
}

template <WireFormat F>
__global__ void __launch_bounds__(kThreads) clear_segment_amax_tiled_kernel(BlockCodes dst, uint32_t segments) {
  for (uint32_t r = blockIdx.x * kThreads + threadIdx.x; r < segments; r += gridDim.x * kThreads) {
    *segment_word<F>(dst, r) = 0;
  }
}

template <class Source, WireFormat F>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) segment_amax_tiled_kernel(Source source, BlockCodes dst,
                                                                                    TileGrid grid) {
  constexpr ElemType E = Source::kType;
  using G = Geometry<E>;
  const uint32_t lane = lane_id();
  const uint32_t capacity = static_cast<uint32_t>(dst.capacity);
  for (uint32_t w = first_item(); w < grid.items; w += item_stride()) {
    const Item it = item_of(w, grid);
    const uint32_t end = source.valid_end(it.r, capacity);
    float v[kLaneElems];
    source.load(it.r, it.i0, end, v);
    uint32_t amax = 0;
#pragma unroll
    for (int k = 0; k < G::kRows; ++k) {
      const int n = run_count<G::kVec>(run_first<E>(it.i0, k, lane), end);
#pragma unroll
      for (int j = 0; j < G::kVec; ++j) {
        const uint32_t a = j < n ? finite_abs_bits(v[k * G::kVec + j]) : 0u;
        amax = a > amax ? a : amax;
      }
    }
    amax = block_max(amax, 32);
    if (lane == 0 && amax != 0) atomicMax(segment_word<F>(dst, it.r), amax);
  }
}

// Each segment's header word: its amax -> its g.
template <WireFormat F>
__global__ void __launch_bounds__(kThreads) segment_scale_tiled_kernel(BlockCodes dst, uint32_t segments) {
  for (uint32_t r = blockIdx.x * kThreads + threadIdx.x; r < segments; r += gridDim.x * kThreads) {
    const uint32_t amax = *segment_word<F>(dst, r);
    store_segment_scale<F>(dst.scales + int64_t{r} * dst.stride, segment_scale<F>(amax));
  }
}

// Whether a layout's segment headers take the atomics (4-byte aligned).
bool headers_aligned(const BlockCodes& dst) {
  const uintptr_t header = reinterpret_cast<uintptr_t>(dst.scales) - segment_scale_bytes(dst.format);
  return (header & 3u) == 0 && (dst.stride & 3) == 0;
}

template <class Source, WireFormat F>
int launch_segment_scales(const Source& source, const BlockCodes& dst, const TileGrid& grid, cudaStream_t stream) {
  const uint32_t segments = static_cast<uint32_t>(dst.num_segments);
  const uint32_t blocks = (segments + kThreads - 1) / kThreads;
  FP8C_LAUNCH(blocks, kThreads, 0, stream, clear_segment_amax_tiled_kernel<F>)(dst, segments);
  if (grid.items > 0) {
    FP8C_LAUNCH(grid_for(grid.items), kThreads, 0, stream, segment_amax_tiled_kernel<Source, F>)(source, dst, grid);
  }
  FP8C_LAUNCH(blocks, kThreads, 0, stream, segment_scale_tiled_kernel<F>)(dst, segments);
  return static_cast<int>(cudaGetLastError());
}

template <class Source, WireFormat F>
int launch_quantize(const Source& source, const BlockCodes& dst, const TileGrid& grid, cudaStream_t stream) {
  if constexpr (WireTraits<F>::kSegmentScaleBytes != 0) {
    if (dst.num_segments == 0) return 0;
    const int error = launch_segment_scales<Source, F>(source, dst, grid, stream);
    if (error != 0) return error;
  }
  if (grid.items == 0) return 0;
  return with_block(dst.block_size, [&](auto b) {
    constexpr int kB = decltype(b)::value;
    FP8C_LAUNCH(grid_for(grid.items), kThreads, 0, stream, quantize_tiled_kernel<Source, F, kB>)(source, dst, grid);
    return static_cast<int>(cudaGetLastError());
  });
}

}  // namespace

int quantize_cuda(const void* src, ElemType type, int64_t numel, float premul, const float* premul_device,
                  const BlockCodes& dst, void* stream) {
  TileGrid grid;
  if ((segment_scale_bytes(dst.format) != 0 && !headers_aligned(dst)) || !covers_block(dst.block_size) ||
      !tile_grid(dst.num_segments, dst.capacity, dst.block_size, grid) || dst.segment_numel > kMaxExtent) {
    return fp8comm::quantize_cuda(src, type, numel, premul, premul_device, dst, stream);
  }
  return with_codec_types(type, dst.format, [&](auto e, auto f) {
    constexpr ElemType E = decltype(e)::value;
    constexpr WireFormat F = decltype(f)::value;
    TensorSource<E> source{static_cast<const Storage<E>*>(src), numel, dst.segment_numel, premul, premul_device};
    return launch_quantize<TensorSource<E>, F>(source, dst, grid, static_cast<cudaStream_t>(stream));
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
                                void* stream) {
  TileGrid grid;
  if ((segment_scale_bytes(out.format) != 0 && !headers_aligned(out)) || !covers_block(out.block_size) ||
      !tile_grid(1, out.capacity, out.block_size, grid)) {
    return fp8comm::dequant_sum_requantize_cuda(pieces, own, post_div, out, stream);
  }
  return with_codec_types(own.type, pieces.format, [&](auto e, auto f) {
    constexpr ElemType E = decltype(e)::value;
    constexpr WireFormat F = decltype(f)::value;
    return with_pieces(pieces.num_segments, [&](auto p) {
      using Source = SumSource<E, F, decltype(p)::value, RequantizeBatch<F>::value>;
      return launch_quantize<Source, F>(Source{pieces, own, post_div, grid.log2_block}, out, grid,
                                        static_cast<cudaStream_t>(stream));
    });
  });
}

}  // namespace tiled
}  // namespace fp8comm
