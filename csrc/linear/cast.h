#pragma once
// The fused current-scaling casts of Fp8Linear over raw pointers: the CPU twin
// and the CUDA launchers share one description of the work. Torch-free, so
// cast_cuda.cu compiles with a bare `nvcc -c` (DESIGN.md, "The codec is
// torch-free where it must be"); the torch.library operator is cast_ops.cpp.
//
// x is a contiguous row-major [rows, cols] tensor of float32 / bfloat16 /
// float16. Outputs (each optional, null when not wanted):
//   data        [rows, cols] fp8: the cast of x
//   data_t      [cols, rows] fp8: the cast of x.t() (row-major, i.e. the
//               transpose `_scaled_mm` wants for a backward GEMM)
// Tensorwise: one scale from the amax of all of x (or the given `amax`); data
//   and data_t hold the same codes, transposed; inv_scale and inv_scale_t (one
//   float each) the same inverse scale.
// Rowwise: data has one scale per row of x (inv_scale: rows floats) and
//   data_t one per row of x.t(), i.e. per column of x (inv_scale_t: cols floats),
//   exactly what casting x.t().contiguous() rowwise gives.
#include <stdint.h>

#include "cast_math.h"

namespace fp8comm {
namespace cast {

struct CastArgs {
  const void* src = nullptr;
  ElemType type = ElemType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  Fp8Dtype fp8_dtype = Fp8Dtype::E4M3;
  bool rowwise = false;
  uint8_t* data = nullptr;
  float* inv_scale = nullptr;    // with data
  uint8_t* data_t = nullptr;
  float* inv_scale_t = nullptr;  // with data_t
  // Tensorwise only: the amax to scale with (one float, in the memory of the
  // device the cast runs on) instead of x's own: the FSDP2 FP8 all-gather casts
  // a shard with the amax of the whole weight.
  const float* amax = nullptr;
  // Tensorwise only, the CPU twin and the tiled CUDA kernels only
  // (cast_fp8_cuda_tiled; the delayed recipe's cast, the operator
  // cast_fp8_scaled): the scale to multiply by (one float in the memory of
  // the device the cast runs on, from an amax history) instead of one from an
  // amax; inv_scale gets 1 / scale, and amax_out (one float, there too) this
  // x's amax, taken in the same pass on CUDA (|x| as torch.amax gives it;
  // NaN if x has one). amax must be null with it.
  const float* scale = nullptr;
  float* amax_out = nullptr;
  // CUDA only: cast_workspace_words() 32-bit words of device memory, any
  // contents (the amax reductions; the launcher clears what it uses).
  uint32_t* workspace = nullptr;
};

// The most blocks a tiled tensorwise amax pass writes a partial amax for (one
// word each, no clearing: cast_cuda_tiled.cu).
constexpr int64_t kCastAmaxPartials = 1024;

inline int64_t cast_workspace_words(int64_t rows, int64_t cols, bool rowwise) {
  return rowwise ? rows + cols : kCastAmaxPartials;
}

// rows * cols > 0 for both (the operator handles empty tensors).
void cast_fp8_cpu(const CastArgs& args);

// Launches on `stream` (a cudaStream_t), asynchronous to the host; returns a
// CUDA error code (0 on success) instead of throwing, to stay torch-free.
int cast_fp8_cuda(const CastArgs& args, void* stream);
// The same casts, the same bytes, by the tiled kernels (cast_cuda_tiled.cu),
// which hand what they do not cover to cast_fp8_cuda's.
int cast_fp8_cuda_tiled(const CastArgs& args, void* stream);
// Whether FP8COMM_CUDA_CAST names the tiled kernels now (read at every call;
// std::invalid_argument for a value that is neither legacy nor tiled).
bool tiled_cuda_cast();
const char* cast_cuda_error_string(int error);

}  // namespace cast
}  // namespace fp8comm
