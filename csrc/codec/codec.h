#pragma once
// The block codec over raw pointers: the CPU entry points and the CUDA
// launchers share these signatures. Torch-free, so the .cu files compile with a
// bare `nvcc -c` (DESIGN.md, "The codec is torch-free where it must be").
#include <stdint.h>

#include <type_traits>

#include "fp8_block_math.h"
#include "rounding.h"

namespace fp8comm {

// Where the codes of P segments live. Element i of segment r is element
// r * segment_numel + i of the flat tensor; it is valid when that index is
// below the tensor's numel. Segment r's block scales start at scales + r *
// stride (its segment scale, for a format that has one, in the
// segment_scale_bytes(format) bytes before them) and its codes at codes + r *
// stride, so a wire segment `[segment scale][block scales][codes]` is one
// contiguous run of segment_bytes() bytes.
struct BlockCodes {
  uint8_t* scales = nullptr;
  uint8_t* codes = nullptr;
  int64_t stride = 0;          // bytes from one segment to the next (any, when P == 1)
  int64_t num_segments = 1;    // P
  int64_t segment_numel = 0;   // m
  // Codes written per segment: valid elements are encoded, the rest up to the
  // capacity are written as zeros. A wire segment has capacity m rounded up to
  // the block, so padding decodes to 0 and sums to 0.
  int64_t capacity = 0;
  // Zero bytes written after each segment's last block scale (wire
  // alignment), so no uninitialized memory ever goes on the wire.
  int64_t scale_padding = 0;
  int block_size = 32;
  WireFormat format = WireFormat::E4M3;
  // How a quantize into these segments rounds (rounding.h). Stochastic: the
  // bits of element i of segment r are rounding_bits(segment_key(rounding_key,
  // first_segment + r), i), so the bytes depend on neither threads nor SIMD
  // width, and a call quantizing segments r.. of a chunk names them.
  Rounding rounding = Rounding::kNearest;
  uint64_t rounding_key = 0;
  int64_t first_segment = 0;

  // The stochastic-rounding run of segment r from its element `first`.
  FP8C_HD StochasticRun stochastic_run(int64_t r, int64_t first) const {
    const SegmentKey k = segment_key(rounding_key, first_segment + r);
    return StochasticRun{k.k0, k.k1, static_cast<uint32_t>(first)};
  }
};

// A rank's own contribution to a sum, never quantized (DESIGN.md,
// "Decisions": the own segment). Element i
// is src[i] * premul for i < numel and 0 past it; it is added first, then the
// pieces in order.
struct OwnAddend {
  bool present = false;
  const void* src = nullptr;
  ElemType type = ElemType::F32;
  int64_t numel = 0;
  float premul = 1.0f;
  const float* premul_device = nullptr;  // CUDA: one float on the device that replaces premul
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t align16(int64_t a) { return (a + 15) & ~int64_t{15}; }

// Scale bytes of a wire segment of m elements (its segment scale, if any,
// and its block scales), padded so its codes start on a 16-byte boundary
// (vector loads and stores).
inline int64_t segment_scale_bytes(int64_t m, int64_t block, WireFormat format) {
  return align16(segment_scale_bytes(format) + ceil_div(m, block));
}
// Code bytes of a wire segment of m elements: whole blocks of codes (blocks
// are a multiple of 16 elements, so 4-bit codes fill whole bytes and every
// block's codes start on an 8-byte boundary).
inline int64_t segment_code_bytes(int64_t m, int64_t block, WireFormat format) {
  return ceil_div(m, block) * block * code_bits(format) / 8;
}
inline int64_t segment_bytes(int64_t m, int64_t block, WireFormat format) {
  return segment_scale_bytes(m, block, format) + segment_code_bytes(m, block, format);
}

// The layout of P wire segments of m elements each, back to back from `base`.
inline BlockCodes wire_segments(uint8_t* base, int64_t num_segments, int64_t m, int block,
                                WireFormat format) {
  BlockCodes c;
  const int64_t head = segment_scale_bytes(format);
  c.scales = base + head;
  c.codes = base + segment_scale_bytes(m, block, format);
  c.stride = segment_bytes(m, block, format);
  c.num_segments = num_segments;
  c.segment_numel = m;
  c.capacity = ceil_div(m, block) * block;
  c.scale_padding = segment_scale_bytes(m, block, format) - head - ceil_div(m, block);
  c.block_size = block;
  c.format = format;
  return c;
}

// ---------------------------------------------------------------- operations
// quantize:        codes(dst) <- q(src * premul), src has `numel` elements.
// dequantize:      dst[0, numel) <- d(src codes). whole_output_bytes: the
//                  bytes of the whole output this call writes part of (a
//                  collective decoding chunk by chunk; 0: this call's own),
//                  by which the CPU kernels choose streaming stores.
// dequant_sum:     dst[0, numel) <- (own + sum over r of d(piece r)) / post_div,
//                  where piece r is segment r of `pieces` (numel <=
//                  segment_numel); `pieces` may hold no segment when own is present.
// dequant_sum_requantize: the same sum over all `capacity` elements, quantized
//                  into the single segment `out` (same segment_numel).
// premul_device, when not null, points to one float on the device holding the
// pre-multiplier (PREMUL_SUM with a tensor factor) and replaces `premul`.

// Whether whole blocks go to the AVX2 kernels (default: when the CPU has
// AVX2 and F16C, unless FP8COMM_CPU_SIMD=0). set_cpu_simd returns the old value.
bool cpu_simd_enabled();
bool set_cpu_simd(bool enabled);
// Whether the default block size's quantize and sum + re-quantize take the
// AVX-512 kernels when the SIMD kernels are on (default: when the CPU has
// AVX-512 F and BW, unless FP8COMM_CPU_SIMD=avx2 or 0).
bool cpu_avx512_enabled();
bool set_cpu_avx512(bool enabled);

void quantize_cpu(const void* src, ElemType type, int64_t numel, float premul, const BlockCodes& dst);
void dequantize_cpu(const BlockCodes& src, void* dst, ElemType type, int64_t numel, int64_t whole_output_bytes = 0);
void dequant_sum_cpu(const BlockCodes& pieces, const OwnAddend& own, int post_div, void* dst, ElemType type,
                     int64_t numel);
void dequant_sum_requantize_cpu(const BlockCodes& pieces, const OwnAddend& own, int post_div, const BlockCodes& out);

// CUDA launchers (csrc/codec/codec_cuda.cu). `stream` is a cudaStream_t.
// Each is one kernel launch on `stream` (those that quantize into a format with
// a segment scale launch its segment-scale kernels first), asynchronous to the
// host; they return a CUDA error code (0 on success) instead of throwing, to
// stay torch-free.
int quantize_cuda(const void* src, ElemType type, int64_t numel, float premul,
                  const float* premul_device, const BlockCodes& dst, void* stream);
int dequantize_cuda(const BlockCodes& src, void* dst, ElemType type, int64_t numel, void* stream);
int dequant_sum_cuda(const BlockCodes& pieces, const OwnAddend& own, int post_div, void* dst, ElemType type,
                     int64_t numel, void* stream);
int dequant_sum_requantize_cuda(const BlockCodes& pieces, const OwnAddend& own, int post_div, const BlockCodes& out,
                                void* stream);
const char* cuda_error_string(int error);

// The tiled CUDA kernels (csrc/codec/codec_cuda_tiled.cu): the same
// launchers, the same bytes, a layout for the memory bound; what they do not
// cover they hand to the launchers above. Quantizing into long segments of a
// format with a segment scale (NVFP4) takes a workspace of
// *_workspace_words() 32-bit words of device memory on the device of the
// launch, any contents, not used by another stream meanwhile; without one
// (null) it goes to the launchers above.
namespace tiled {
int64_t quantize_workspace_words(const BlockCodes& dst);
int64_t dequant_sum_requantize_workspace_words(const BlockCodes& pieces, const BlockCodes& out);
int quantize_cuda(const void* src, ElemType type, int64_t numel, float premul,
                  const float* premul_device, const BlockCodes& dst, uint32_t* workspace, void* stream);
int dequantize_cuda(const BlockCodes& src, void* dst, ElemType type, int64_t numel, void* stream);
int dequant_sum_cuda(const BlockCodes& pieces, const OwnAddend& own, int post_div, void* dst, ElemType type,
                     int64_t numel, void* stream);
int dequant_sum_requantize_cuda(const BlockCodes& pieces, const OwnAddend& own, int post_div, const BlockCodes& out,
                                uint32_t* workspace, void* stream);
}  // namespace tiled

}  // namespace fp8comm
