// The tiled CUDA codec (csrc/codec/codec_cuda_tiled.cu) compiled for the host
// SIMT emulator, behind the C interface of codec_host.cpp with the prefix
// simt_tiled_ (tests/codec/test_tiled_kernels_on_host.py). What the tiled
// kernels do not cover they hand to the legacy kernels, which codec_host.cpp
// compiles into the same library.
#include "codec/codec_cuda_tiled.cu"

#include <vector>

#include "codec_host_args.h"

namespace {

// A launch's workspace (codec.h, tiled): the words it asks for, poisoned,
// since the kernels must not read anything they did not write.
std::vector<uint32_t> poisoned_words(int64_t words) { return std::vector<uint32_t>(words, 0xA5A5A5A5u); }

}  // namespace

extern "C" {

int simt_tiled_quantize(const void* src, int64_t type, int64_t numel, float premul, const float* premul_device,
                        const HostCodes* dst) {
  const fp8comm::BlockCodes codes = to_codes(*dst);
  std::vector<uint32_t> workspace = poisoned_words(fp8comm::tiled::quantize_workspace_words(codes));
  return fp8comm::tiled::quantize_cuda(src, static_cast<fp8comm::ElemType>(type), numel, premul, premul_device,
                                       codes, workspace.empty() ? nullptr : workspace.data(), nullptr);
}

int simt_tiled_dequantize(const HostCodes* src, void* dst, int64_t type, int64_t numel) {
  return fp8comm::tiled::dequantize_cuda(to_codes(*src), dst, static_cast<fp8comm::ElemType>(type), numel, nullptr);
}

int simt_tiled_dequant_sum(const HostCodes* pieces, int64_t own_present, const void* own, int64_t own_type,
                           int64_t own_numel, float own_premul, const float* own_premul_device, int64_t post_div,
                           void* dst, int64_t type, int64_t numel) {
  return fp8comm::tiled::dequant_sum_cuda(
      to_codes(*pieces), to_own(own_present, own, own_type, own_numel, own_premul, own_premul_device),
      static_cast<int>(post_div), dst, static_cast<fp8comm::ElemType>(type), numel, nullptr);
}

int simt_tiled_dequant_sum_requantize(const HostCodes* pieces, int64_t own_present, const void* own,
                                      int64_t own_type, int64_t own_numel, float own_premul,
                                      const float* own_premul_device, int64_t post_div, const HostCodes* out) {
  const fp8comm::BlockCodes codes = to_codes(*out);
  const fp8comm::BlockCodes in = to_codes(*pieces);
  std::vector<uint32_t> workspace = poisoned_words(fp8comm::tiled::dequant_sum_requantize_workspace_words(in, codes));
  return fp8comm::tiled::dequant_sum_requantize_cuda(
      in, to_own(own_present, own, own_type, own_numel, own_premul, own_premul_device),
      static_cast<int>(post_div), codes, workspace.empty() ? nullptr : workspace.data(), nullptr);
}

// fp8_convert_cuda.cuh's software semantics of the hardware conversions:
// two values to a pair of codes, a pair of codes to two values.
uint16_t simt_float2_to_fp8x2(int64_t format, float lo, float hi) {
  return format == 0 ? fp8comm::fp8_convert::float2_to_fp8x2<fp8comm::WireFormat::E4M3>(lo, hi)
                     : fp8comm::fp8_convert::float2_to_fp8x2<fp8comm::WireFormat::E5M2>(lo, hi);
}

void simt_fp8x2_to_float2(int64_t format, uint16_t pair, float* out) {
  if (format == 0) {
    fp8comm::fp8_convert::fp8x2_to_float2<fp8comm::WireFormat::E4M3>(pair, out[0], out[1]);
  } else {
    fp8comm::fp8_convert::fp8x2_to_float2<fp8comm::WireFormat::E5M2>(pair, out[0], out[1]);
  }
}

}  // extern "C"
