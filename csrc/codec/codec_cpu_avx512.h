#pragma once
// AVX-512 kernels for the CPU codec's default block size (32), for the two
// passes that are compute-bound: quantize, and all_reduce's sum +
// re-quantize. Sixteen lanes, eight blocks at a time, held in registers from
// load to codes. Same bytes as the AVX2 kernels and the scalar loops
// (tests/codec/test_codec_simd.py runs every case through each); a group of eight
// blocks they do not take (a block with Inf/NaN, FP8 subnormals, a code
// limit, or a piece that needs the exact decode) goes to the AVX2 kernels.
#include <stdint.h>

#include "codec.h"
#include "codec_cpu_avx2.h"

namespace fp8comm {
namespace avx512 {

#if FP8C_HAVE_AVX2_KERNELS
// Whether this CPU runs them (AVX-512 F and BW, besides AVX2 and F16C).
bool supported();

// As avx2::quantize_full_blocks with block_size 32.
void quantize_blocks32(const void* src, ElemType type, WireFormat format, int64_t blocks, float premul,
                       uint8_t* codes, uint8_t* scales, const StochasticRun* stochastic = nullptr);
// As avx2::dequant_sum_requantize_full_blocks with pieces.block_size 32.
void dequant_sum_requantize_blocks32(const BlockCodes& pieces, const OwnAddend& own, int post_div,
                                     int64_t first_block, int64_t blocks, uint8_t* codes, uint8_t* scales,
                                     const StochasticRun* stochastic = nullptr);
#else
// Not x86: never called (supported() is false); see codec_cpu_avx2.h.
inline bool supported() { return false; }
inline void quantize_blocks32(const void*, ElemType, WireFormat, int64_t, float, uint8_t*, uint8_t*,
                              const StochasticRun* = nullptr) {
  avx2::unreachable();
}
inline void dequant_sum_requantize_blocks32(const BlockCodes&, const OwnAddend&, int, int64_t, int64_t, uint8_t*,
                                            uint8_t*, const StochasticRun* = nullptr) {
  avx2::unreachable();
}
#endif

}  // namespace avx512
}  // namespace fp8comm
