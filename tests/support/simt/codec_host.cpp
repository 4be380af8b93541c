// The CUDA codec (csrc/codec/codec_cuda.cu) compiled for the host SIMT
// emulator, behind a C interface that tests/codec/test_kernels_on_host.py calls
// through ctypes. Every call is one emulated launch on a null stream.
#include "codec/codec_cuda.cu"

#include "codec_host_args.h"

extern "C" {

// codec.h's wire_segments, so the tests use the layout the backend uses.
void simt_wire_segments(uint8_t* base, int64_t num_segments, int64_t m, int64_t block, int64_t format,
                        HostCodes* out) {
  const fp8comm::BlockCodes c =
      fp8comm::wire_segments(base, num_segments, m, static_cast<int>(block), static_cast<fp8comm::WireFormat>(format));
  *out = HostCodes{c.scales, c.codes, c.stride, c.num_segments, c.segment_numel, c.capacity, c.scale_padding,
                   c.block_size, static_cast<int64_t>(c.format), static_cast<int64_t>(c.rounding),
                   c.rounding_key, c.first_segment};
}

int simt_quantize(const void* src, int64_t type, int64_t numel, float premul, const float* premul_device,
                  const HostCodes* dst) {
  return fp8comm::quantize_cuda(src, static_cast<fp8comm::ElemType>(type), numel, premul, premul_device,
                                to_codes(*dst), nullptr);
}

int simt_dequantize(const HostCodes* src, void* dst, int64_t type, int64_t numel) {
  return fp8comm::dequantize_cuda(to_codes(*src), dst, static_cast<fp8comm::ElemType>(type), numel, nullptr);
}

int simt_dequant_sum(const HostCodes* pieces, int64_t own_present, const void* own, int64_t own_type,
                     int64_t own_numel, float own_premul, const float* own_premul_device, int64_t post_div, void* dst,
                     int64_t type, int64_t numel) {
  return fp8comm::dequant_sum_cuda(to_codes(*pieces),
                                   to_own(own_present, own, own_type, own_numel, own_premul, own_premul_device),
                                   static_cast<int>(post_div), dst, static_cast<fp8comm::ElemType>(type), numel,
                                   nullptr);
}

int simt_dequant_sum_requantize(const HostCodes* pieces, int64_t own_present, const void* own, int64_t own_type,
                                int64_t own_numel, float own_premul, const float* own_premul_device, int64_t post_div,
                                const HostCodes* out) {
  return fp8comm::dequant_sum_requantize_cuda(
      to_codes(*pieces), to_own(own_present, own, own_type, own_numel, own_premul, own_premul_device),
      static_cast<int>(post_div), to_codes(*out), nullptr);
}

const char* simt_codec_error_string(int error) { return fp8comm::cuda_error_string(error); }

// The kernels launched since the last call, one name a line.
const char* simt_take_launches() {
  static std::string taken;
  taken.swap(simt::launch_log);
  simt::launch_log.clear();
  return taken.c_str();
}

}  // extern "C"
