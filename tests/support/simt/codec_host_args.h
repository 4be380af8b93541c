#pragma once
// The C interface's arguments of the emulated codecs (codec_host.cpp,
// codec_tiled_host.cpp): BlockCodes and OwnAddend in the layout ctypes mirrors.
#include <stdint.h>

#include "codec/codec.h"

namespace {

// BlockCodes with every field 64 bits wide: the layout ctypes mirrors.
struct HostCodes {
  uint8_t* scales;
  uint8_t* codes;
  int64_t stride, num_segments, segment_numel, capacity, scale_padding, block_size, format;
  int64_t rounding;
  uint64_t rounding_key;
  int64_t first_segment;
};

fp8comm::BlockCodes to_codes(const HostCodes& h) {
  fp8comm::BlockCodes c;
  c.scales = h.scales;
  c.codes = h.codes;
  c.stride = h.stride;
  c.num_segments = h.num_segments;
  c.segment_numel = h.segment_numel;
  c.capacity = h.capacity;
  c.scale_padding = h.scale_padding;
  c.block_size = static_cast<int>(h.block_size);
  c.format = static_cast<fp8comm::WireFormat>(h.format);
  c.rounding = static_cast<fp8comm::Rounding>(h.rounding);
  c.rounding_key = h.rounding_key;
  c.first_segment = h.first_segment;
  return c;
}

fp8comm::OwnAddend to_own(int64_t present, const void* src, int64_t type, int64_t numel, float premul,
                          const float* premul_device) {
  fp8comm::OwnAddend a;
  a.present = present != 0;  // src may be null when numel is 0
  a.src = src;
  a.type = static_cast<fp8comm::ElemType>(type);
  a.numel = numel;
  a.premul = premul;
  a.premul_device = premul_device;
  return a;
}

}  // namespace
