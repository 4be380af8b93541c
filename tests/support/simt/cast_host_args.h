#pragma once
// The C interface's arguments of the emulated casts (cast_host.cpp,
// cast_tiled_host.cpp) as the launchers' CastArgs: the source and the
// outputs every cast takes; each entry adds what is its own.
#include <stdint.h>

#include "linear/cast.h"

namespace {

fp8comm::cast::CastArgs host_cast_args(const void* src, int64_t type, int64_t rows, int64_t cols, int64_t format,
                                       uint8_t* data, float* inv_scale, uint8_t* data_t, float* inv_scale_t,
                                       uint32_t* workspace) {
  fp8comm::cast::CastArgs a;
  a.src = src;
  a.type = static_cast<fp8comm::ElemType>(type);
  a.rows = rows;
  a.cols = cols;
  a.fp8_dtype = static_cast<fp8comm::Fp8Dtype>(format);
  a.data = data;
  a.inv_scale = inv_scale;
  a.data_t = data_t;
  a.inv_scale_t = inv_scale_t;
  a.workspace = workspace;
  return a;
}

}  // namespace
