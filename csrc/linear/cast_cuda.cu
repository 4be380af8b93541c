// The fused casts of Fp8Linear on CUDA (cast.h): plain kernels over raw
// pointers (torch-free, so a bare `nvcc -c` builds them), the element math of
// cast_math.h, so the bytes equal the CPU twin's bit for bit.
//
// Tensorwise:  [clear 1 word] amax_flat_kernel -> one float of amax bits
//              then cast_flat_kernel (data only) or cast_tile_kernel (data_t,
//              and data in the same pass).
// Rowwise:     data only: cast_rows_kernel, one warp per row (amax, then cast;
//              the second read of the row hits L1/L2).
//              with data_t: [clear rows + cols words] amax_tile_kernel (row and
//              column amaxes in one read) then cast_tile_kernel.
//
// Amaxes are reduced as the bits of |x| (NaN kept: above +Inf in unsigned order,
// so a NaN propagates as in torch.amax) with warp shuffles and one atomicMax per
// block (tensorwise) or per tile row / column (rowwise). Every kernel works in
// chunks of 16 consecutive elements per thread, read with 16-byte loads and
// written as 16 FP8 bytes with one 16-byte store when the addresses are aligned
// and the chunk is whole; otherwise element by element. Tiles are 64 x 64 and
// go through shared memory for the transposed write.
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

#include "../codec/chunk_io_cuda.cuh"
#include "../codec/launch_cuda.cuh"
#include "cast.h"

namespace fp8comm {
namespace cast {
namespace {

using namespace chunk_io;  // NOLINT: the chunk accesses every kernel here uses

constexpr int kThreads = 256;
constexpr int kTile = 64;        // tile kernels: thread t covers row t / 4, columns (t % 4) * 16 + [0, 16)
constexpr int kTileStride = 68;  // shared tile row (bytes): 4-byte writes, fewer bank conflicts on the column reads

__device__ __forceinline__ uint32_t max_u32(uint32_t a, uint32_t b) { return a > b ? a : b; }

__device__ __forceinline__ uint32_t warp_max(uint32_t v) {
#pragma unroll
  for (int off = 16; off >= 1; off /= 2) v = max_u32(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

__device__ __forceinline__ uint32_t chunk_amax(const float (&v)[kChunk]) {
  uint32_t m = 0;
#pragma unroll
  for (int t = 0; t < kChunk; ++t) m = max_u32(m, abs_bits(v[t]));
  return m;
}

// ------------------------------------------------------------ tensorwise
template <ElemType E>
__global__ void __launch_bounds__(kThreads) amax_flat_kernel(const Storage<E>* src, int64_t n, uint32_t* out) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  uint32_t m = 0;
  for (int64_t c = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; c < chunks;
       c += int64_t{gridDim.x} * blockDim.x) {
    float v[kChunk];
    load_chunk<E>(src + c * kChunk, clamp_chunk(n - c * kChunk), v);
    m = max_u32(m, chunk_amax(v));
  }
  __shared__ uint32_t part[kThreads / 32];
  m = warp_max(m);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x < 32) {
    m = threadIdx.x < kThreads / 32 ? part[threadIdx.x] : 0u;
    m = warp_max(m);
    if (threadIdx.x == 0 && m != 0) atomicMax(out, m);
  }
}

// data = cast(x) with the scale of *amax; block 0 writes the inverse scale.
template <ElemType E, Fp8Dtype F>
__global__ void __launch_bounds__(kThreads) cast_flat_kernel(const Storage<E>* src, int64_t n, const float* amax,
                                                             uint8_t* data, float* inv) {
  const Scale s = scale_of<F>(*amax);
  if (blockIdx.x == 0 && threadIdx.x == 0) *inv = s.inv;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  for (int64_t c = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; c < chunks;
       c += int64_t{gridDim.x} * blockDim.x) {
    const int valid = clamp_chunk(n - c * kChunk);
    float v[kChunk];
    load_chunk<E>(src + c * kChunk, valid, v);
    uint8_t codes[kChunk];
#pragma unroll
    for (int t = 0; t < kChunk; ++t) codes[t] = cast_elem<F>(v[t], s.scale);
    store_codes(data + c * kChunk, valid, codes);
  }
}

// ------------------------------------------------------------ rowwise, rows only
// One warp per row: the row's amax, then its cast.
template <ElemType E, Fp8Dtype F>
__global__ void __launch_bounds__(kThreads) cast_rows_kernel(const Storage<E>* src, int64_t rows, int64_t cols,
                                                             uint8_t* data, float* inv) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t{gridDim.x} * (blockDim.x / 32);
  for (int64_t r = int64_t{blockIdx.x} * (blockDim.x / 32) + threadIdx.x / 32; r < rows; r += warps) {
    const Storage<E>* row = src + r * cols;
    uint32_t m = 0;
    for (int64_t i = int64_t{lane} * kChunk; i < cols; i += 32 * kChunk) {
      float v[kChunk];
      load_chunk<E>(row + i, clamp_chunk(cols - i), v);
      m = max_u32(m, chunk_amax(v));
    }
    const Scale s = scale_of<F>(bits_float(warp_max(m)));
    if (lane == 0) inv[r] = s.inv;
    for (int64_t i = int64_t{lane} * kChunk; i < cols; i += 32 * kChunk) {
      const int valid = clamp_chunk(cols - i);
      float v[kChunk];
      load_chunk<E>(row + i, valid, v);
      uint8_t codes[kChunk];
#pragma unroll
      for (int t = 0; t < kChunk; ++t) codes[t] = cast_elem<F>(v[t], s.scale);
      store_codes(data + r * cols + i, valid, codes);
    }
  }
}

// ------------------------------------------------------------ tiles
struct TileGrid {
  int64_t rows, cols, tiles_c, total;
  __host__ __device__ TileGrid(int64_t r, int64_t c)
      : rows(r), cols(c), tiles_c((c + kTile - 1) / kTile), total(((r + kTile - 1) / kTile) * tiles_c) {}
};

// Row amaxes (row_amax, may be null) and column amaxes (col_amax, may be null)
// of x, as |x| bits, into zeroed words.
template <ElemType E>
__global__ void __launch_bounds__(kThreads) amax_tile_kernel(const Storage<E>* src, TileGrid g, uint32_t* row_amax,
                                                             uint32_t* col_amax) {
  __shared__ uint32_t col_part[kTile];
  const int rr = threadIdx.x / 4, cc = (threadIdx.x % 4) * kChunk, lane = threadIdx.x & 31;
  for (int64_t tile = blockIdx.x; tile < g.total; tile += gridDim.x) {
    const int64_t r0 = (tile / g.tiles_c) * kTile, c0 = (tile % g.tiles_c) * kTile;
    const int64_t r = r0 + rr, c = c0 + cc;
    if (threadIdx.x < kTile) col_part[threadIdx.x] = 0;
    __syncthreads();
    float v[kChunk];
    load_chunk<E>(src + (r < g.rows ? r : 0) * g.cols + c, r < g.rows ? clamp_chunk(g.cols - c) : 0, v);
    if (row_amax != nullptr) {
      uint32_t m = chunk_amax(v);
      m = max_u32(m, __shfl_xor_sync(0xffffffffu, m, 1));
      m = max_u32(m, __shfl_xor_sync(0xffffffffu, m, 2));
      if (cc == 0 && r < g.rows && m != 0) atomicMax(row_amax + r, m);
    }
    if (col_amax != nullptr) {
#pragma unroll
      for (int t = 0; t < kChunk; ++t) {
        uint32_t m = abs_bits(v[t]);  // the 8 lanes of this warp with these columns: 8 rows
        m = max_u32(m, __shfl_xor_sync(0xffffffffu, m, 4));
        m = max_u32(m, __shfl_xor_sync(0xffffffffu, m, 8));
        m = max_u32(m, __shfl_xor_sync(0xffffffffu, m, 16));
        if (lane < 4 && m != 0) atomicMax(&col_part[cc + t], m);
      }
      __syncthreads();
      if (threadIdx.x < kTile) {
        const int64_t cx = c0 + threadIdx.x;
        const uint32_t m = col_part[threadIdx.x];
        if (cx < g.cols && m != 0) atomicMax(col_amax + cx, m);
      }
    }
    __syncthreads();
  }
}

// data (may be null) and data_t in one pass over x. Tensorwise: the scale of
// *amax. Rowwise: row scales from row_amax (when data), column scales from
// col_amax. Inverse scales are written by the blocks of the first tile column
// (rows) and first tile row (columns).
template <ElemType E, Fp8Dtype F, bool Rowwise>
__global__ void __launch_bounds__(kThreads) cast_tile_kernel(const Storage<E>* src, TileGrid g, const float* amax,
                                                             const uint32_t* row_amax, const uint32_t* col_amax,
                                                             uint8_t* data, float* inv, uint8_t* data_t,
                                                             float* inv_t) {
  __shared__ __align__(16) uint8_t tile[kTile * kTileStride];
  __shared__ float row_scale[kTile];
  __shared__ float col_scale[kTile];
  const int rr = threadIdx.x / 4, cc = (threadIdx.x % 4) * kChunk;
  Scale s{0.0f, 0.0f};
  if (!Rowwise) {
    s = scale_of<F>(*amax);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      if (inv != nullptr) *inv = s.inv;
      *inv_t = s.inv;
    }
  }
  for (int64_t tile_idx = blockIdx.x; tile_idx < g.total; tile_idx += gridDim.x) {
    const int64_t tr = tile_idx / g.tiles_c, tc = tile_idx % g.tiles_c;
    const int64_t r0 = tr * kTile, c0 = tc * kTile;
    if (Rowwise) {
      if (threadIdx.x < kTile) {
        const int64_t r = r0 + threadIdx.x;
        if (data != nullptr && r < g.rows) {
          const Scale rs = scale_of<F>(bits_float(row_amax[r]));
          row_scale[threadIdx.x] = rs.scale;
          if (tc == 0) inv[r] = rs.inv;
        }
      } else if (threadIdx.x < 2 * kTile) {
        const int64_t c = c0 + threadIdx.x - kTile;
        if (c < g.cols) {
          const Scale cs = scale_of<F>(bits_float(col_amax[c]));
          col_scale[threadIdx.x - kTile] = cs.scale;
          if (tr == 0) inv_t[c] = cs.inv;
        }
      }
      __syncthreads();
    }
    const int64_t r = r0 + rr, c = c0 + cc;
    const int valid = r < g.rows ? clamp_chunk(g.cols - c) : 0;
    float v[kChunk];
    load_chunk<E>(src + (r < g.rows ? r : 0) * g.cols + c, valid, v);
    if (data != nullptr && valid > 0) {
      const float rs = Rowwise ? row_scale[rr] : s.scale;
      uint8_t codes[kChunk];
#pragma unroll
      for (int t = 0; t < kChunk; ++t) codes[t] = cast_elem<F>(v[t], rs);
      store_codes(data + r * g.cols + c, valid, codes);
    }
#pragma unroll
    for (int t = 0; t < kChunk; t += 4) {
      uint32_t word = 0;
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const float cs = Rowwise ? col_scale[cc + t + u] : s.scale;
        word |= static_cast<uint32_t>(cast_elem<F>(v[t + u], cs)) << (8 * u);
      }
      *reinterpret_cast<uint32_t*>(tile + rr * kTileStride + cc + t) = word;
    }
    __syncthreads();
    // data_t row k = c0 + rr holds tile column rr; this thread writes its rows r0 + cc + [0, 16).
    const int64_t k = c0 + rr, m0 = r0 + cc;
    const int valid_t = k < g.cols ? clamp_chunk(g.rows - m0) : 0;
    if (valid_t > 0) {
      uint8_t codes[kChunk];
#pragma unroll
      for (int t = 0; t < kChunk; ++t) codes[t] = tile[(cc + t) * kTileStride + rr];
      store_codes(data_t + k * g.rows + m0, valid_t, codes);
    }
    __syncthreads();
  }
}

// ------------------------------------------------------------ launch
int64_t grid_for(int64_t work_items, int64_t per_block, int64_t cap) {
  const int64_t blocks = (work_items + per_block - 1) / per_block;
  return blocks < 1 ? 1 : (blocks > cap ? cap : blocks);
}

template <ElemType E, Fp8Dtype F>
int launch(const CastArgs& a, cudaStream_t stream) {
  int device = 0, sms = 132;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return static_cast<int>(err);
  const int64_t cap = int64_t{sms} * 16;  // grid-stride loops beyond this many blocks
  const auto* src = static_cast<const Storage<E>*>(a.src);
  const int64_t n = a.rows * a.cols;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  const TileGrid g(a.rows, a.cols);
  if (!a.rowwise) {
    const float* amax = a.amax;
    if (amax == nullptr) {
      err = cudaMemsetAsync(a.workspace, 0, sizeof(uint32_t), stream);
      if (err != cudaSuccess) return static_cast<int>(err);
      FP8C_LAUNCH(grid_for(chunks, kThreads, cap), kThreads, 0, stream, amax_flat_kernel<E>)(src, n, a.workspace);
      amax = reinterpret_cast<const float*>(a.workspace);
    }
    if (a.data_t != nullptr) {
      FP8C_LAUNCH(grid_for(g.total, 1, cap), kThreads, 0, stream, cast_tile_kernel<E, F, false>)(
          src, g, amax, nullptr, nullptr, a.data, a.inv_scale, a.data_t, a.inv_scale_t);
    } else {
      FP8C_LAUNCH(grid_for(chunks, kThreads, cap), kThreads, 0, stream, cast_flat_kernel<E, F>)(src, n, amax, a.data,
                                                                                               a.inv_scale);
    }
    return static_cast<int>(cudaGetLastError());
  }
  if (a.data_t == nullptr) {
    FP8C_LAUNCH(grid_for(a.rows, kThreads / 32, cap), kThreads, 0, stream, cast_rows_kernel<E, F>)(
        src, a.rows, a.cols, a.data, a.inv_scale);
    return static_cast<int>(cudaGetLastError());
  }
  uint32_t* row_amax = a.workspace;
  uint32_t* col_amax = a.workspace + a.rows;
  err = cudaMemsetAsync(a.workspace, 0, sizeof(uint32_t) * (a.rows + a.cols), stream);
  if (err != cudaSuccess) return static_cast<int>(err);
  FP8C_LAUNCH(grid_for(g.total, 1, cap), kThreads, 0, stream, amax_tile_kernel<E>)(
      src, g, a.data != nullptr ? row_amax : nullptr, col_amax);
  FP8C_LAUNCH(grid_for(g.total, 1, cap), kThreads, 0, stream, cast_tile_kernel<E, F, true>)(
      src, g, nullptr, row_amax, col_amax, a.data, a.inv_scale, a.data_t, a.inv_scale_t);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int cast_fp8_cuda(const CastArgs& a, void* stream) {
  if (a.rows <= 0 || a.cols <= 0 || (a.rowwise && a.amax != nullptr) || a.scale != nullptr ||
      a.workspace == nullptr) {  // a given scale: the tiled set's (cast_cuda_tiled.cu)
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const auto s = static_cast<cudaStream_t>(stream);
  return with_cast_types(a.type, a.fp8_dtype, [&](auto e, auto f) {
    return launch<decltype(e)::value, decltype(f)::value>(a, s);
  });
}

const char* cast_cuda_error_string(int error) { return cudaGetErrorString(static_cast<cudaError_t>(error)); }

}  // namespace cast
}  // namespace fp8comm
