// The fused casts of Fp8Linear on CUDA, tiled for the memory bound: the same
// entry point contract and the same bytes as cast_cuda.cu (the CPU twin's, bit
// for bit). FP8COMM_CUDA_CAST chooses between the two (cast_ops.cpp);
// DESIGN.md, "The CUDA cast kernel sets", describes both.
//
// - Conversion: saturate(x * scale) to FP8 is one FP32 multiply and the
//   hardware conversion of sm_89+ (cvt.rn.satfinite, fp8_convert_cuda.cuh; its
//   software twin elsewhere). That is cast_math.h's cast_elem exactly: the
//   clamp to +-fp8_max before a round to nearest even is what satfinite does
//   (Inf included), -0 stays -0, and a NaN product is the code 0x7F.
// - Tensorwise: an amax pass in which every block writes its partial amax to
//   its own word (no clearing launch), then one cast pass whose blocks reduce
//   those partials first; with a given amax, the cast pass alone; with a
//   given scale (the delayed recipe), the cast pass records the partial
//   amaxes itself and a one-block kernel reduces them. The data + transpose
//   pass converts each element once and writes both layouts from the same
//   codes.
// - Rowwise, data only: one block per row, the row held in registers (read
//   once), its amax a block reduction, then its codes.
// - Rowwise with the transpose: the row and column amaxes in one pass
//   (atomicMax into cleared words), then the tile pass; each element is
//   converted with its row's scale (data) and its column's (data_t).
// - Accesses: 16-byte loads (tile_io_cuda.cuh's runs); flat and row codes a
//   lane's 4 or 8 contiguous bytes of a warp-contiguous row; tiles transposed
//   through shared memory as 4 x 4 byte blocks transposed in registers, each
//   stored as one 32-bit word into a padded, swizzled tile (conflict-free
//   writes) and read back as 16 bytes of one column (conflict-free), which go
//   out as one 16-byte store.
// - Index math in 32 bits (one 32-bit division per tile); element offsets are
//   64-bit products, never divided. The host checks that the numbers fit.
//
// What it does not cover goes to cast_fp8_cuda (cast_cuda.cu), explicitly:
// rows, columns or tile counts that do not fit 31 bits, and rowwise rows
// longer than one block holds in registers (kRowThreads x kMaxRowRuns runs of
// 16 bytes). A given scale there is an error (cast_cuda.cu has no such cast).
#include <cuda_runtime.h>
#include <stdint.h>

#include "../codec/fp8_convert_cuda.cuh"
#include "../codec/launch_cuda.cuh"
#include "../codec/tile_io_cuda.cuh"
#include "cast.h"

namespace fp8comm {
namespace cast {
namespace {

using tile_io::ElemRun;
using tile_io::Geometry;
using tile_io::kTile;
using tile_io::run_count;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Resident blocks per SM the flat and tile grids assume; __launch_bounds__
// holds those kernels to the 64 registers a thread this allows.
constexpr int kBlocksPerSm = 4;
// The row kernel: at most this many threads a block (one row each), holding
// kRowRuns 16-byte runs a thread; a row of more runs goes to cast_cuda.cu.
constexpr int kRowThreads = 1024;
constexpr int kMaxRowRuns = 8;

// The codec's wire format of the same FP8 codes (the hardware conversion's key).
template <Fp8Dtype F>
constexpr WireFormat kWire = F == Fp8Dtype::E4M3 ? WireFormat::E4M3 : WireFormat::E5M2;

__device__ __forceinline__ uint32_t lane_id() { return threadIdx.x & 31; }
__device__ __forceinline__ uint32_t max_u32(uint32_t a, uint32_t b) { return a > b ? a : b; }

__device__ __forceinline__ uint32_t warp_max(uint32_t v) {
#pragma unroll
  for (int off = 16; off >= 1; off /= 2) v = max_u32(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// |x| bits as a float (NaN above +Inf) of a run's elements, max. The
// magnitude bits of a half or bfloat16 order as its value does (NaN above
// Inf too), so 16-bit runs take the max of the raw halves and convert once.
template <ElemType E>
__device__ __forceinline__ uint32_t run_amax(const ElemRun<E>& run) {
  uint32_t m = 0;
  if constexpr (sizeof(Storage<E>) == 4) {
#pragma unroll
    for (int q = 0; q < 4; ++q) m = max_u32(m, run.w[q] & 0x7FFFFFFFu);
    return m;
  } else {
#pragma unroll
    for (int q = 0; q < 4; ++q) m = max_u32(m, max_u32(run.w[q] & 0x7FFFu, (run.w[q] >> 16) & 0x7FFFu));
    return abs_bits(Elem<E>::load(static_cast<Storage<E>>(m)));
  }
}

// Element j's magnitude bits in its own type (16-bit: the raw half), and a
// max of those as |x| bits of a float.
template <ElemType E>
__device__ __forceinline__ uint32_t magnitude(const ElemRun<E>& run, int j) {
  if constexpr (sizeof(Storage<E>) == 4) {
    return run.w[j] & 0x7FFFFFFFu;
  } else {
    return (run.w[j / 2] >> (16 * (j % 2))) & 0x7FFFu;
  }
}

template <ElemType E>
__device__ __forceinline__ uint32_t magnitude_as_float_bits(uint32_t m) {
  if constexpr (sizeof(Storage<E>) == 4) {
    return m;
  } else {
    return abs_bits(Elem<E>::load(static_cast<Storage<E>>(m)));
  }
}

// Four codes saturate(x * scale), element j0 + u in byte u.
template <Fp8Dtype F, ElemType E>
__device__ __forceinline__ uint32_t codes4(const ElemRun<E>& run, int j0, float s0, float s1, float s2, float s3) {
  const uint32_t lo = fp8_convert::float2_to_fp8x2<kWire<F>>(run.get(j0) * s0, run.get(j0 + 1) * s1);
  const uint32_t hi = fp8_convert::float2_to_fp8x2<kWire<F>>(run.get(j0 + 2) * s2, run.get(j0 + 3) * s3);
  return lo | (hi << 16);
}

// The run's codes with one scale, as kVec / 4 little-endian words.
template <Fp8Dtype F, ElemType E>
__device__ __forceinline__ void run_codes(const ElemRun<E>& run, float s, tile_io::CodeRun<kWire<F>, Geometry<E>::kVec>& out) {
#pragma unroll
  for (int q = 0; q < Geometry<E>::kVec / 4; ++q) out.w[q] = codes4<F>(run, 4 * q, s, s, s, s);
}

// ------------------------------------------------------------ the scale
// Tensorwise: the scale of a given amax, or of the max of the partial amaxes
// an amax pass wrote (|x| bits, one word per block of that pass), or a given
// scale (the delayed recipe), in which case the cast pass writes its own
// partial amaxes to `record` (count words, as amax_partials_kernel does).
struct ScaleIn {
  const float* amax;
  const uint32_t* partials;
  uint32_t count;
  const float* scale;
  uint32_t* record;
};

// Max of words[0, count) of the block, every thread of it calling.
__device__ __forceinline__ uint32_t block_max_of(const uint32_t* words, uint32_t count) {
  __shared__ uint32_t part[kWarps];
  uint32_t m = 0;
  for (uint32_t i = threadIdx.x; i < count; i += kThreads) m = max_u32(m, words[i]);
  m = warp_max(m);
  if (lane_id() == 0) part[threadIdx.x / 32] = m;
  __syncthreads();
  m = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) m = max_u32(m, part[w]);
  return m;
}

template <Fp8Dtype F>
__device__ __forceinline__ Scale block_scale(const ScaleIn& in) {
  if (in.scale != nullptr) return given_scale(*in.scale);
  return scale_of<F>(in.amax != nullptr ? *in.amax : bits_float(block_max_of(in.partials, in.count)));
}

// The block's max |x| bits m to record[blockIdx.x], the words of the blocks
// a smaller grid did not start zeroed (see amax_partials_kernel).
__device__ __forceinline__ void write_partial(uint32_t m, uint32_t* record, uint32_t count) {
  __shared__ uint32_t part[kWarps];
  m = warp_max(m);
  if (lane_id() == 0) part[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m = max_u32(m, part[w]);
    record[blockIdx.x] = m;
    for (uint32_t b = blockIdx.x + gridDim.x; b < count; b += gridDim.x) record[b] = 0;
  }
}

// ------------------------------------------------------------ tensorwise, flat
// A warp's items are tiles of 512 consecutive elements (tile_io_cuda.cuh):
// lane l's runs at tile element k * kRowElems + l * kVec.
struct FlatGrid {
  uint32_t tiles;  // < 2^31
  int64_t n;
};

__device__ __forceinline__ uint32_t first_warp_item() { return blockIdx.x * kWarps + threadIdx.x / 32; }
__device__ __forceinline__ uint32_t warp_item_stride() { return gridDim.x * kWarps; }

template <ElemType E>
__device__ __forceinline__ void load_flat_tile(const Storage<E>* src, const FlatGrid& g, uint32_t t,
                                               ElemRun<E> (&run)[Geometry<E>::kRows], uint32_t& end) {
  using G = Geometry<E>;
  const int64_t base = int64_t{t} * kTile;
  end = g.n - base >= kTile ? static_cast<uint32_t>(kTile) : static_cast<uint32_t>(g.n - base);
#pragma unroll
  for (int k = 0; k < G::kRows; ++k) {
    const uint32_t first = static_cast<uint32_t>(k * G::kRowElems) + lane_id() * G::kVec;
    run[k].load(src + base + first, run_count<G::kVec>(first, end));
  }
}

// partials[blockIdx.x] = this block's max |x| bits. Every word of [0, count)
// is written (count is the grid the launch asked for; a smaller grid, as the
// host emulator runs, zeroes the words of the blocks it did not start).
template <ElemType E>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) amax_partials_kernel(const Storage<E>* src, FlatGrid g,
                                                                               uint32_t* partials, uint32_t count) {
  using G = Geometry<E>;
  uint32_t m = 0;
  for (uint32_t t = first_warp_item(); t < g.tiles; t += warp_item_stride()) {
    ElemRun<E> run[G::kRows];
    uint32_t end;
    load_flat_tile<E>(src, g, t, run, end);
#pragma unroll
    for (int k = 0; k < G::kRows; ++k) m = max_u32(m, run_amax(run[k]));
  }
  write_partial(m, partials, count);
}

// *amax = the max of partials[0, count) as a float (one block).
__global__ void __launch_bounds__(kThreads) reduce_partials_kernel(const uint32_t* partials, uint32_t count,
                                                                     float* amax) {
  const uint32_t m = block_max_of(partials, count);
  if (threadIdx.x == 0) *amax = bits_float(m);
}

// data = cast(x); block 0 writes the inverse scale.
template <ElemType E, Fp8Dtype F>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) cast_flat_tiles_kernel(const Storage<E>* src, FlatGrid g,
                                                                           ScaleIn in, uint8_t* data, float* inv) {
  using G = Geometry<E>;
  const Scale s = block_scale<F>(in);
  if (blockIdx.x == 0 && threadIdx.x == 0) *inv = s.inv;
  uint32_t m = 0;
  for (uint32_t t = first_warp_item(); t < g.tiles; t += warp_item_stride()) {
    ElemRun<E> run[G::kRows];
    uint32_t end;
    load_flat_tile<E>(src, g, t, run, end);
    if (in.record != nullptr) {
#pragma unroll
      for (int k = 0; k < G::kRows; ++k) m = max_u32(m, run_amax(run[k]));
    }
    uint8_t* out = data + int64_t{t} * kTile;
#pragma unroll
    for (int k = 0; k < G::kRows; ++k) {
      const uint32_t first = static_cast<uint32_t>(k * G::kRowElems) + lane_id() * G::kVec;
      tile_io::CodeRun<kWire<F>, G::kVec> codes;
      run_codes<F>(run[k], s.scale, codes);
      codes.store(out + first, run_count<G::kVec>(first, end));
    }
  }
  if (in.record != nullptr) write_partial(m, in.record, in.count);
}

// ------------------------------------------------------------ rowwise, rows only
// One block per row (grid-stride over rows); thread t holds the row's runs
// t + k * blockDim.x, k < kR, in registers: the row is read once.
template <ElemType E, Fp8Dtype F, int kR>
__global__ void __launch_bounds__(kRowThreads) cast_rows_in_registers_kernel(const Storage<E>* src, uint32_t rows, uint32_t cols,
                                                                uint8_t* data, float* inv) {
  constexpr int kVec = Geometry<E>::kVec;
  __shared__ uint32_t part[2][kRowThreads / 32];  // by row parity: one barrier a row
  const uint32_t warps = blockDim.x / 32;
  int parity = 0;
  for (uint32_t r = blockIdx.x; r < rows; r += gridDim.x, parity ^= 1) {
    const Storage<E>* row = src + int64_t{r} * cols;
    ElemRun<E> run[kR];
    uint32_t m = 0;
#pragma unroll
    for (int k = 0; k < kR; ++k) {
      const uint32_t first = (k * blockDim.x + threadIdx.x) * kVec;
      run[k].load(row + first, run_count<kVec>(first, cols));
    }
#pragma unroll
    for (int k = 0; k < kR; ++k) m = max_u32(m, run_amax(run[k]));
    m = warp_max(m);
    if (lane_id() == 0) part[parity][threadIdx.x / 32] = m;
    __syncthreads();
    m = 0;
    for (uint32_t w = 0; w < warps; ++w) m = max_u32(m, part[parity][w]);
    const Scale s = scale_of<F>(bits_float(m));
    if (threadIdx.x == 0) inv[r] = s.inv;
    uint8_t* out = data + int64_t{r} * cols;
#pragma unroll
    for (int k = 0; k < kR; ++k) {
      const uint32_t first = (k * blockDim.x + threadIdx.x) * kVec;
      tile_io::CodeRun<kWire<F>, kVec> codes;
      run_codes<F>(run[k], s.scale, codes);
      codes.store(out + first, run_count<kVec>(first, cols));
    }
  }
}

// ------------------------------------------------------------ tiles
// A tile is 64 rows x 64 V columns of x (V = kVec / 4: 1 for FP32, 2 for
// 16-bit elements). Thread (a, b) of the block, a, b in [0, 16), holds rows
// 4a + [0, 4) of the columns kVec b + [0, kVec): 4 runs of 16 bytes, as V
// 4 x 4 blocks of codes. A warp's lanes are 4 a x 8 b (FP32: each load a
// warp's 4 rows x 128 bytes, each data store 4 rows x 32 bytes) or 8 a x 4 b
// (16-bit: 8 rows x 64 bytes, 8 rows x 32 bytes).
//
// The transposed codes: a 4 x 4 block transposed in registers is 4 words, the
// word of tile column c holding its rows 4a + [0, 4). Shared tile row P (one
// per tile column, c = 4 (V b + v) + i stored at P = 64 v + 4 b + i) is
// kSmemRow words: 16 (64 rows) and a 4-word pad; its 16-byte chunk j holds rows
// 16 j + [0, 16) and lies at chunk j ^ swizzle(P). A warp's word stores then
// hit 32 different banks, and 8 lanes reading chunk j of 8 consecutive rows P
// (aligned to 8: one swizzle) hit all 32 banks once.
constexpr int kTileRows = 64;
constexpr int kSmemRow = 20;  // words

template <ElemType E>
struct TileShape {
  static constexpr int kVec = Geometry<E>::kVec;
  static constexpr int kV = kVec / 4;
  static constexpr int kCols = 64 * kV;
  static constexpr int kLaneA = kV == 1 ? 4 : 8;  // a values a warp spans
  static constexpr int kLaneB = 32 / kLaneA;
  static constexpr int kWarpsA = 16 / kLaneA;
};

__device__ __forceinline__ uint32_t swizzle(uint32_t p) { return (((p >> 3) & 1u) << 1) | ((p >> 4) & 1u); }

// Per-launch constants, computed on the host.
struct TileGrid {
  uint32_t rows, cols;
  uint32_t tiles_c, total;  // total < 2^31
};

// Bytes t of the transposed 4 x 4 block: out[i] byte k = in[k] byte i.
__device__ __forceinline__ void transpose4x4(const uint32_t (&in)[4], uint32_t (&out)[4]) {
  const uint32_t lo01 = __byte_perm(in[0], in[1], 0x5140), hi01 = __byte_perm(in[0], in[1], 0x7362);
  const uint32_t lo23 = __byte_perm(in[2], in[3], 0x5140), hi23 = __byte_perm(in[2], in[3], 0x7362);
  out[0] = __byte_perm(lo01, lo23, 0x5410);
  out[1] = __byte_perm(lo01, lo23, 0x7632);
  out[2] = __byte_perm(hi01, hi23, 0x5410);
  out[3] = __byte_perm(hi01, hi23, 0x7632);
}

struct TileThread {
  uint32_t a, b;
};

template <ElemType E>
__device__ __forceinline__ TileThread tile_thread() {
  using S = TileShape<E>;
  const uint32_t w = threadIdx.x / 32, l = lane_id();
  return TileThread{S::kLaneA * (w % S::kWarpsA) + l / S::kLaneB, S::kLaneB * (w / S::kWarpsA) + l % S::kLaneB};
}

// The thread's 4 runs of tile (r0, c0), zero past x's edges.
template <ElemType E>
__device__ __forceinline__ void load_tile(const Storage<E>* src, const TileGrid& g, uint32_t r0, uint32_t c0,
                                          TileThread th, ElemRun<E> (&run)[4], int& n) {
  constexpr int kVec = Geometry<E>::kVec;
  const uint32_t c = c0 + kVec * th.b;
  n = run_count<kVec>(c, g.cols);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t r = r0 + 4 * th.a + k;
    run[k].load(src + int64_t{r < g.rows ? r : 0} * g.cols + c, r < g.rows ? n : 0);
  }
}

// Row amaxes (row_amax, may be null) and column amaxes (col_amax) of x, as
// |x| bits, into cleared words.
template <ElemType E>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) amax_rows_cols_kernel(const Storage<E>* src, TileGrid g,
                                                                           uint32_t* row_amax, uint32_t* col_amax) {
  using S = TileShape<E>;
  constexpr int kVec = S::kVec;
  __shared__ uint32_t col_part[S::kCols];
  const TileThread th = tile_thread<E>();
  for (uint32_t tile = blockIdx.x; tile < g.total; tile += gridDim.x) {
    const uint32_t tr = tile / g.tiles_c;
    const uint32_t r0 = tr * kTileRows, c0 = (tile - tr * g.tiles_c) * S::kCols;
    if (threadIdx.x < S::kCols) col_part[threadIdx.x] = 0;
    ElemRun<E> run[4];
    int n;
    load_tile<E>(src, g, r0, c0, th, run, n);
    if (row_amax != nullptr) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        uint32_t m = run_amax(run[k]);
#pragma unroll
        for (int off = 1; off < S::kLaneB; off *= 2) m = max_u32(m, __shfl_xor_sync(0xffffffffu, m, off));
        const uint32_t r = r0 + 4 * th.a + k;
        if (lane_id() % S::kLaneB == 0 && r < g.rows && m != 0) atomicMax(row_amax + r, m);
      }
    }
    __syncthreads();  // col_part cleared
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      uint32_t m = 0;
#pragma unroll
      for (int k = 0; k < 4; ++k) m = max_u32(m, magnitude(run[k], j));
#pragma unroll
      for (int off = S::kLaneB; off < 32; off *= 2) m = max_u32(m, __shfl_xor_sync(0xffffffffu, m, off));
      m = magnitude_as_float_bits<E>(m);
      if (lane_id() < S::kLaneB && m != 0) atomicMax(&col_part[kVec * th.b + j], m);
    }
    __syncthreads();
    if (threadIdx.x < S::kCols) {
      const uint32_t c = c0 + threadIdx.x, m = col_part[threadIdx.x];
      if (c < g.cols && m != 0) atomicMax(col_amax + c, m);
    }
    __syncthreads();  // col_part read before the next tile clears it
  }
}

// data (may be null) and data_t in one pass over x. Tensorwise: the scale of
// `amax`, one conversion per element for both layouts. Rowwise: row scales
// from row_amax (with data), column scales from col_amax. Inverse scales are
// written by the blocks of the first tile column (rows) and first tile row
// (columns); tensorwise by block 0.
template <ElemType E, Fp8Dtype F, bool kRowwise>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) cast_transpose_tiles_kernel(const Storage<E>* src, TileGrid g,
                                                                           ScaleIn in, const uint32_t* row_amax,
                                                                           const uint32_t* col_amax, uint8_t* data,
                                                                           float* inv, uint8_t* data_t, float* inv_t) {
  using S = TileShape<E>;
  constexpr int kVec = S::kVec, kV = S::kV;
  __shared__ __align__(16) uint32_t tile_t[S::kCols * kSmemRow];
  __shared__ float row_scale[kTileRows];
  __shared__ float col_scale[S::kCols];
  const TileThread th = tile_thread<E>();
  Scale s{0.0f, 0.0f};
  uint32_t m = 0;  // a given scale: this x's amax, recorded
  if (!kRowwise) {
    s = block_scale<F>(in);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      if (inv != nullptr) *inv = s.inv;
      *inv_t = s.inv;
    }
  }
  for (uint32_t tile = blockIdx.x; tile < g.total; tile += gridDim.x) {
    const uint32_t tr = tile / g.tiles_c, tc = tile - tr * g.tiles_c;
    const uint32_t r0 = tr * kTileRows, c0 = tc * S::kCols;
    if (kRowwise) {
      if (threadIdx.x < kTileRows) {
        const uint32_t r = r0 + threadIdx.x;
        if (data != nullptr && r < g.rows) {
          const Scale rs = scale_of<F>(bits_float(row_amax[r]));
          row_scale[threadIdx.x] = rs.scale;
          if (tc == 0) inv[r] = rs.inv;
        }
      } else if (threadIdx.x < kTileRows + S::kCols) {
        const uint32_t c = c0 + threadIdx.x - kTileRows;
        if (c < g.cols) {
          const Scale cs = scale_of<F>(bits_float(col_amax[c]));
          col_scale[threadIdx.x - kTileRows] = cs.scale;
          if (tr == 0) inv_t[c] = cs.inv;
        }
      }
      __syncthreads();
    }
    ElemRun<E> run[4];
    int n;
    load_tile<E>(src, g, r0, c0, th, run, n);
    if (!kRowwise && in.record != nullptr) {
#pragma unroll
      for (int k = 0; k < 4; ++k) m = max_u32(m, run_amax(run[k]));
    }
    // codes[v][k]: row 4a + k, columns kVec b + 4 v + [0, 4), for data_t
    uint32_t codes[kV][4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t r = r0 + 4 * th.a + k;
      tile_io::CodeRun<kWire<F>, kVec> row_codes;
      if (kRowwise) {
        const float* cs = col_scale + kVec * th.b;
#pragma unroll
        for (int v = 0; v < kV; ++v) codes[v][k] = codes4<F>(run[k], 4 * v, cs[4 * v], cs[4 * v + 1], cs[4 * v + 2], cs[4 * v + 3]);
        if (data != nullptr) run_codes<F>(run[k], row_scale[4 * th.a + k], row_codes);
      } else {
        run_codes<F>(run[k], s.scale, row_codes);
#pragma unroll
        for (int v = 0; v < kV; ++v) codes[v][k] = row_codes.w[v];
      }
      if (data != nullptr && r < g.rows) row_codes.store(data + int64_t{r} * g.cols + c0 + kVec * th.b, n);
    }
#pragma unroll
    for (int v = 0; v < kV; ++v) {
      uint32_t t[4];
      transpose4x4(codes[v], t);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t p = 64 * v + 4 * th.b + i;
        tile_t[p * kSmemRow + 4 * ((th.a / 4) ^ swizzle(p)) + th.a % 4] = t[i];
      }
    }
    __syncthreads();
    // Chunk j of shared row P: data_t row c0 + (column of P), its bytes r0 + 16 j + [0, 16).
#pragma unroll
    for (int u = 0; u < kV; ++u) {
      const uint32_t q = u * kThreads + threadIdx.x;
      const uint32_t p = (q / 32) * 8 + q % 8, j = (q % 32) / 8;
      const uint4 chunk = *reinterpret_cast<const uint4*>(&tile_t[p * kSmemRow + 4 * (j ^ swizzle(p))]);
      const uint32_t c = c0 + kVec * ((p % 64) / 4) + 4 * (p / 64) + p % 4, m0 = r0 + 16 * j;
      if (c < g.cols && m0 < g.rows) {
        uint8_t* out = data_t + int64_t{c} * g.rows + m0;
        const uint32_t valid = g.rows - m0;
        if (valid >= 16 && tile_io::aligned(out, 16)) {
          *reinterpret_cast<uint4*>(out) = chunk;
        } else {
          const uint32_t w[4] = {chunk.x, chunk.y, chunk.z, chunk.w};
#pragma unroll
          for (uint32_t t = 0; t < 16; ++t) {
            if (t < valid) out[t] = static_cast<uint8_t>(w[t / 4] >> (8 * (t % 4)));
          }
        }
      }
    }
    __syncthreads();  // tile_t read before the next tile writes it
  }
  if (!kRowwise && in.record != nullptr) write_partial(m, in.record, in.count);
}

// ------------------------------------------------------------ launch
uint32_t grid_for(int64_t work_items, int64_t per_block, int64_t cap) {
  const int64_t blocks = (work_items + per_block - 1) / per_block;
  return static_cast<uint32_t>(blocks < 1 ? 1 : (blocks > cap ? cap : blocks));
}

constexpr int64_t kMax32 = (int64_t{1} << 31) - 1;

template <ElemType E, Fp8Dtype F, int kR>
void launch_rows(const CastArgs& a, uint32_t threads, int sms, cudaStream_t stream) {
  const int64_t resident = int64_t{sms} * (2048 / threads);
  FP8C_LAUNCH(grid_for(a.rows, 1, resident), threads, 0, stream, cast_rows_in_registers_kernel<E, F, kR>)(
      static_cast<const Storage<E>*>(a.src), static_cast<uint32_t>(a.rows), static_cast<uint32_t>(a.cols), a.data,
      a.inv_scale);
}

// Whether the tiled kernels take these arguments (else cast_cuda.cu's do).
template <ElemType E>
bool covered(const CastArgs& a) {
  using S = TileShape<E>;
  if (a.rows > kMax32 || a.cols > kMax32) return false;
  const int64_t tiles = ((a.rows + kTileRows - 1) / kTileRows) * ((a.cols + S::kCols - 1) / S::kCols);
  if (tiles > kMax32 || (a.rows * a.cols + kTile - 1) / kTile > kMax32) return false;
  const int64_t runs = (a.cols + S::kVec - 1) / S::kVec;
  return !(a.rowwise && a.data_t == nullptr && runs > int64_t{kRowThreads} * kMaxRowRuns);
}

template <ElemType E, Fp8Dtype F>
int launch(const CastArgs& a, cudaStream_t stream) {
  using S = TileShape<E>;
  if (!covered<E>(a)) {
    if (a.scale != nullptr) return static_cast<int>(cudaErrorInvalidValue);  // the legacy set has no given scale
    return cast_fp8_cuda(a, stream);
  }
  int device = 0, sms = 132;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return static_cast<int>(err);
  const int64_t cap = int64_t{sms} * kBlocksPerSm;  // grid-stride loops beyond this many blocks
  const auto* src = static_cast<const Storage<E>*>(a.src);
  const uint32_t tiles_c = static_cast<uint32_t>((a.cols + S::kCols - 1) / S::kCols);
  const TileGrid g{static_cast<uint32_t>(a.rows), static_cast<uint32_t>(a.cols), tiles_c,
                   static_cast<uint32_t>(((a.rows + kTileRows - 1) / kTileRows) * tiles_c)};
  if (!a.rowwise) {
    const FlatGrid flat{static_cast<uint32_t>((a.rows * a.cols + kTile - 1) / kTile), a.rows * a.cols};
    const int64_t partials_cap = cap < kCastAmaxPartials ? cap : kCastAmaxPartials;
    ScaleIn in{a.amax, a.workspace, 0, a.scale, nullptr};
    if (a.scale != nullptr) {  // one pass: the cast records the amax
      in.record = a.workspace;
      in.count = a.data_t != nullptr ? grid_for(g.total, 1, partials_cap) : grid_for(flat.tiles, kWarps, partials_cap);
    } else if (a.amax == nullptr) {
      in.count = grid_for(flat.tiles, kWarps, partials_cap);
      FP8C_LAUNCH(in.count, kThreads, 0, stream, amax_partials_kernel<E>)(src, flat, a.workspace, in.count);
    }
    if (a.data_t != nullptr) {
      FP8C_LAUNCH(in.record != nullptr ? in.count : grid_for(g.total, 1, cap), kThreads, 0, stream,
                  cast_transpose_tiles_kernel<E, F, false>)(src, g, in, nullptr, nullptr, a.data, a.inv_scale,
                                                            a.data_t, a.inv_scale_t);
    } else {
      FP8C_LAUNCH(in.record != nullptr ? in.count : grid_for(flat.tiles, kWarps, cap), kThreads, 0, stream,
                  cast_flat_tiles_kernel<E, F>)(src, flat, in, a.data, a.inv_scale);
    }
    if (in.record != nullptr && a.amax_out != nullptr) {
      FP8C_LAUNCH(1, kThreads, 0, stream, reduce_partials_kernel)(in.record, in.count, a.amax_out);
    }
    return static_cast<int>(cudaGetLastError());
  }
  if (a.data_t == nullptr) {
    const int64_t runs = (a.cols + S::kVec - 1) / S::kVec;
    const bool four = runs <= int64_t{kRowThreads} * 4;
    const int64_t per_thread = four ? 4 : kMaxRowRuns;
    const uint32_t threads = static_cast<uint32_t>(((runs + per_thread - 1) / per_thread + 31) / 32 * 32);
    if (four) {
      launch_rows<E, F, 4>(a, threads, sms, stream);
    } else {
      launch_rows<E, F, kMaxRowRuns>(a, threads, sms, stream);
    }
    return static_cast<int>(cudaGetLastError());
  }
  uint32_t* row_amax = a.workspace;
  uint32_t* col_amax = a.workspace + a.rows;
  err = cudaMemsetAsync(a.workspace, 0, sizeof(uint32_t) * (a.rows + a.cols), stream);
  if (err != cudaSuccess) return static_cast<int>(err);
  FP8C_LAUNCH(grid_for(g.total, 1, cap), kThreads, 0, stream, amax_rows_cols_kernel<E>)(
      src, g, a.data != nullptr ? row_amax : nullptr, col_amax);
  FP8C_LAUNCH(grid_for(g.total, 1, cap), kThreads, 0, stream, cast_transpose_tiles_kernel<E, F, true>)(
      src, g, ScaleIn{nullptr, nullptr, 0, nullptr, nullptr}, row_amax, col_amax, a.data, a.inv_scale, a.data_t, a.inv_scale_t);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int cast_fp8_cuda_tiled(const CastArgs& a, void* stream) {
  if (a.rows <= 0 || a.cols <= 0 || (a.rowwise && (a.amax != nullptr || a.scale != nullptr)) ||
      (a.scale != nullptr && a.amax != nullptr) || a.workspace == nullptr) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const auto s = static_cast<cudaStream_t>(stream);
  return with_cast_types(a.type, a.fp8_dtype, [&](auto e, auto f) {
    return launch<decltype(e)::value, decltype(f)::value>(a, s);
  });
}

}  // namespace cast
}  // namespace fp8comm
