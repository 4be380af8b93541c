// The CPU twin of the fused casts (cast.h): the same scalar math as the CUDA
// kernels (cast_math.h), so CI checks, on the CPU, the bytes the GPU writes and
// the operator plumbing around them. Loops are branch-free so that gcc
// vectorizes them (AVX2 clone picked at load time); work is spread over threads
// with at::parallel_for.
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "cast.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FP8C_CAST_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define FP8C_CAST_CLONES
#endif

namespace fp8comm {
namespace cast {
namespace {

// Transposes go through tiles of kTileRows x kTileCols: each output row gets a
// run of kTileRows bytes (a cache line), and few output rows are open at a time
// (power-of-two strides alias in the cache).
constexpr int64_t kTileRows = 64;
constexpr int64_t kTileCols = 32;
constexpr int64_t kColBlock = 64;  // columns per task of the column amax
constexpr int64_t kGrainElems = 1 << 15;  // elements per task, about

template <ElemType E>
FP8C_CAST_CLONES uint32_t amax_run(const Storage<E>* s, int64_t n) {
  uint32_t m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, abs_bits(Elem<E>::load(s[i])));
  return m;
}

template <ElemType E, Fp8Dtype F>
FP8C_CAST_CLONES void cast_run(const Storage<E>* s, int64_t n, float scale, uint8_t* d) {
  for (int64_t i = 0; i < n; ++i) d[i] = cast_elem<F>(Elem<E>::load(s[i]), scale);
}

// acc[j] <- max(acc[j], |x[r, c0 + j]|) over rows r of [0, rows), j in [0, w).
template <ElemType E>
FP8C_CAST_CLONES void col_amax_run(const Storage<E>* s, int64_t rows, int64_t cols, int64_t c0, int64_t w,
                                   uint32_t* acc) {
  for (int64_t r = 0; r < rows; ++r) {
    const Storage<E>* row = s + r * cols + c0;
    for (int64_t j = 0; j < w; ++j) acc[j] = std::max(acc[j], abs_bits(Elem<E>::load(row[j])));
  }
}

// Row i of a tile, each column with its own scale (rowwise data_t).
template <ElemType E, Fp8Dtype F>
FP8C_CAST_CLONES void cast_run_scales(const Storage<E>* s, int64_t n, const float* scales, uint8_t* d) {
  for (int64_t i = 0; i < n; ++i) d[i] = cast_elem<F>(Elem<E>::load(s[i]), scales[i]);
}

// The tile [r0, r0 + h) x [c0, c0 + w) of x, cast and written transposed into
// data_t ([cols, rows]). col_scales: per column of x (rowwise), else null.
template <ElemType E, Fp8Dtype F>
void cast_tile_transposed(const CastArgs& a, int64_t r0, int64_t h, int64_t c0, int64_t w, float scale,
                          const float* col_scales) {
  const auto* src = static_cast<const Storage<E>*>(a.src);
  uint8_t buf[kTileRows][kTileCols];
  for (int64_t i = 0; i < h; ++i) {
    const Storage<E>* row = src + (r0 + i) * a.cols + c0;
    if (col_scales != nullptr) {
      cast_run_scales<E, F>(row, w, col_scales + c0, buf[i]);
    } else {
      cast_run<E, F>(row, w, scale, buf[i]);
    }
  }
  for (int64_t j = 0; j < w; ++j) {
    uint8_t* out = a.data_t + (c0 + j) * a.rows + r0;
    for (int64_t i = 0; i < h; ++i) out[i] = buf[i][j];
  }
}

// data_t <- data^T (tensorwise: the transpose of the cast is the same bytes),
// through the same tiles as the transposed cast.
void transpose_bytes(const CastArgs& a) {
  const int64_t tr = (a.rows + kTileRows - 1) / kTileRows;
  const int64_t tc = (a.cols + kTileCols - 1) / kTileCols;
  at::parallel_for(0, tr * tc, std::max<int64_t>(1, 4 * kGrainElems / (kTileRows * kTileCols)),
                   [&](int64_t b, int64_t e) {
                     for (int64_t t = b; t < e; ++t) {
                       const int64_t r0 = (t / tc) * kTileRows, c0 = (t % tc) * kTileCols;
                       const int64_t h = std::min(kTileRows, a.rows - r0), w = std::min(kTileCols, a.cols - c0);
                       uint8_t buf[kTileRows][kTileCols];  // rows read whole: no strided reads
                       for (int64_t i = 0; i < h; ++i) {
                         std::copy_n(a.data + (r0 + i) * a.cols + c0, w, buf[i]);
                       }
                       for (int64_t j = 0; j < w; ++j) {
                         uint8_t* out = a.data_t + (c0 + j) * a.rows + r0;
                         for (int64_t i = 0; i < h; ++i) out[i] = buf[i][j];
                       }
                     }
                   });
}

template <ElemType E, Fp8Dtype F>
void transposed_pass(const CastArgs& a, float scale, const float* col_scales) {
  const int64_t tr = (a.rows + kTileRows - 1) / kTileRows;
  const int64_t tc = (a.cols + kTileCols - 1) / kTileCols;
  at::parallel_for(0, tr * tc, std::max<int64_t>(1, kGrainElems / (kTileRows * kTileCols)), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t r0 = (t / tc) * kTileRows;
      const int64_t c0 = (t % tc) * kTileCols;
      cast_tile_transposed<E, F>(a, r0, std::min(kTileRows, a.rows - r0), c0, std::min(kTileCols, a.cols - c0), scale,
                                 col_scales);
    }
  });
}

template <ElemType E, Fp8Dtype F>
void cast_tensorwise(const CastArgs& a) {
  const auto* src = static_cast<const Storage<E>*>(a.src);
  const int64_t n = a.rows * a.cols;
  float amax;
  if (a.amax != nullptr) {
    amax = *a.amax;
  } else {  // x's own (also recorded when the scale is given)
    const uint32_t bits = at::parallel_reduce(
        0, n, kGrainElems, uint32_t{0},
        [&](int64_t b, int64_t e, uint32_t m) { return std::max(m, amax_run<E>(src + b, e - b)); },
        [](uint32_t x, uint32_t y) { return std::max(x, y); });
    amax = bits_float(bits);
  }
  const Scale s = a.scale != nullptr ? given_scale(*a.scale) : scale_of<F>(amax);
  if (a.amax_out != nullptr) *a.amax_out = amax;
  if (a.data != nullptr) {
    at::parallel_for(0, n, kGrainElems, [&](int64_t b, int64_t e) {
      cast_run<E, F>(src + b, e - b, s.scale, a.data + b);
    });
    a.inv_scale[0] = s.inv;
  }
  if (a.data_t != nullptr) {
    if (a.data != nullptr) {
      transpose_bytes(a);
    } else {
      transposed_pass<E, F>(a, s.scale, nullptr);
    }
    a.inv_scale_t[0] = s.inv;
  }
}

template <ElemType E, Fp8Dtype F>
void cast_rowwise(const CastArgs& a) {
  const auto* src = static_cast<const Storage<E>*>(a.src);
  const int64_t rows = a.rows, cols = a.cols;
  if (a.data != nullptr) {
    at::parallel_for(0, rows, std::max<int64_t>(1, kGrainElems / cols), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const Storage<E>* row = src + r * cols;
        const Scale s = scale_of<F>(bits_float(amax_run<E>(row, cols)));
        cast_run<E, F>(row, cols, s.scale, a.data + r * cols);
        a.inv_scale[r] = s.inv;
      }
    });
  }
  if (a.data_t != nullptr) {
    std::vector<float> col_scales(cols);
    at::parallel_for(0, (cols + kColBlock - 1) / kColBlock, std::max<int64_t>(1, kGrainElems / (kColBlock * rows)),
                     [&](int64_t b, int64_t e) {
                       uint32_t acc[kColBlock];
                       for (int64_t t = b; t < e; ++t) {
                         const int64_t c0 = t * kColBlock, w = std::min(kColBlock, cols - c0);
                         std::fill(acc, acc + kColBlock, 0u);
                         col_amax_run<E>(src, rows, cols, c0, w, acc);
                         for (int64_t j = 0; j < w; ++j) {
                           const Scale s = scale_of<F>(bits_float(acc[j]));
                           col_scales[c0 + j] = s.scale;
                           a.inv_scale_t[c0 + j] = s.inv;
                         }
                       }
                     });
    transposed_pass<E, F>(a, 0.0f, col_scales.data());
  }
}

}  // namespace

void cast_fp8_cpu(const CastArgs& a) {
  TORCH_CHECK(a.rows > 0 && a.cols > 0, "fp8comm cast: empty tensors are handled by the operator");
  TORCH_CHECK(!(a.rowwise && (a.amax != nullptr || a.scale != nullptr)),
              "fp8comm cast: a given amax or scale is for the tensorwise cast");
  TORCH_CHECK(a.amax == nullptr || a.scale == nullptr, "fp8comm cast: give an amax or a scale, not both");
  with_cast_types(a.type, a.fp8_dtype, [&](auto e, auto f) {
    constexpr ElemType E = decltype(e)::value;
    constexpr Fp8Dtype F = decltype(f)::value;
    if (a.rowwise) {
      cast_rowwise<E, F>(a);
    } else {
      cast_tensorwise<E, F>(a);
    }
  });
}

}  // namespace cast
}  // namespace fp8comm
