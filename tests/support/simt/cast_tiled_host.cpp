// The tiled fused casts (csrc/linear/cast_cuda_tiled.cu) compiled for the host
// SIMT emulator, behind cast_host.cpp's C interface with the prefix
// simt_tiled_ (tests/codec/test_kernels_on_host.py's cast tests run both
// sets). What the tiled kernels do not cover they hand to cast_cuda.cu's,
// which cast_host.cpp compiles into the same library.
#include "linear/cast_cuda_tiled.cu"
#include "cast_host_args.h"

extern "C" int simt_tiled_cast(const void* src, int64_t type, int64_t rows, int64_t cols, int64_t format,
                               int64_t rowwise, uint8_t* data, float* inv_scale, uint8_t* data_t, float* inv_scale_t,
                               const float* amax, uint32_t* workspace) {
  fp8comm::cast::CastArgs a =
      host_cast_args(src, type, rows, cols, format, data, inv_scale, data_t, inv_scale_t, workspace);
  a.rowwise = rowwise != 0;
  a.amax = amax;
  return fp8comm::cast::cast_fp8_cuda_tiled(a, nullptr);
}

// The delayed recipe's cast: tensorwise with a given scale (a float), this
// x's amax written to amax_out in the same pass.
extern "C" int simt_tiled_cast_scaled(const void* src, int64_t type, int64_t rows, int64_t cols, int64_t format,
                                      uint8_t* data, float* inv_scale, uint8_t* data_t, float* inv_scale_t,
                                      const float* scale, float* amax_out, uint32_t* workspace) {
  fp8comm::cast::CastArgs a =
      host_cast_args(src, type, rows, cols, format, data, inv_scale, data_t, inv_scale_t, workspace);
  a.scale = scale;
  a.amax_out = amax_out;
  return fp8comm::cast::cast_fp8_cuda_tiled(a, nullptr);
}
