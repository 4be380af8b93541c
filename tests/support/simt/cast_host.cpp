// The fused casts' CUDA kernels (csrc/linear/cast_cuda.cu) compiled for the
// host SIMT emulator, behind a C interface that tests/codec/test_kernels_on_host.py
// calls through ctypes. One call is the launcher's whole sequence of launches.
#include "linear/cast_cuda.cu"
#include "cast_host_args.h"

extern "C" int simt_cast(const void* src, int64_t type, int64_t rows, int64_t cols, int64_t format, int64_t rowwise,
                         uint8_t* data, float* inv_scale, uint8_t* data_t, float* inv_scale_t, const float* amax,
                         uint32_t* workspace) {
  fp8comm::cast::CastArgs a =
      host_cast_args(src, type, rows, cols, format, data, inv_scale, data_t, inv_scale_t, workspace);
  a.rowwise = rowwise != 0;
  a.amax = amax;
  return fp8comm::cast::cast_fp8_cuda(a, nullptr);
}

extern "C" int64_t simt_cast_workspace_words(int64_t rows, int64_t cols, int64_t rowwise) {
  return fp8comm::cast::cast_workspace_words(rows, cols, rowwise != 0);
}
