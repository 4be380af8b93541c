#pragma once
// Hand-written AVX2 kernels for the CPU codec's full blocks (codec_cpu.cpp
// calls them for every block whose elements are all valid, and keeps its
// scalar loops for the rest). Same bytes as the scalar loops.
#include <stdint.h>

#include <cstdlib>

#include "codec.h"

// -DFP8C_HAVE_AVX2_KERNELS=0 builds the portable code alone on x86 too (how
// the non-x86 build is checked without a non-x86 compiler).
#ifndef FP8C_HAVE_AVX2_KERNELS
#if defined(__x86_64__) && defined(__GNUC__)
#define FP8C_HAVE_AVX2_KERNELS 1
#else
#define FP8C_HAVE_AVX2_KERNELS 0
#endif
#endif

namespace fp8comm {

namespace avx2 {

#if FP8C_HAVE_AVX2_KERNELS
// Whether this CPU runs them (AVX2 and F16C).
bool supported();

// `blocks` whole blocks of `block_size` (a multiple of 16) elements, all of
// one segment: codes and scales of block j at codes + j * block_size and
// scales[j]; `segment_scale`: the segment's g (load_segment_scale; 1 for a
// format without one). `stochastic`: null rounds to nearest even, else the
// run's random bits (its `first` is the segment index of the first block's
// first element; rounding.h).
void quantize_full_blocks(const void* src, ElemType type, WireFormat format, int64_t blocks, int block_size,
                          float premul, float segment_scale, uint8_t* codes, uint8_t* scales,
                          const StochasticRun* stochastic = nullptr);
// output_bytes: the size of the whole output, the call's or its collective's (streaming stores are chosen by it).
void dequantize_full_blocks(const uint8_t* codes, const uint8_t* scales, float segment_scale, WireFormat format,
                            int64_t blocks, int block_size, void* dst, ElemType type, int64_t output_bytes);
// Blocks [first_block, first_block + blocks) of the pieces, summed as
// dequant_sum_cpu sums them (each piece's segment scale read before its
// block scales); dst / codes / scales point at the first one's output, whose
// segment scale is out_segment_scale. The own addend, when present, holds
// all these blocks whole.
void dequant_sum_full_blocks(const BlockCodes& pieces, const OwnAddend& own, int post_div, int64_t first_block,
                             int64_t blocks, void* dst, ElemType type);
void dequant_sum_requantize_full_blocks(const BlockCodes& pieces, const OwnAddend& own, int post_div,
                                        int64_t first_block, int64_t blocks, float out_segment_scale,
                                        uint8_t* codes, uint8_t* scales, const StochasticRun* stochastic = nullptr);
// The finite amax (finite_abs_bits) of n >= 1 elements src[i] * premul, and of
// the sums of blocks [first_block, first_block + blocks) as
// dequant_sum_requantize_full_blocks sums them: a segment scale's input.
uint32_t finite_amax(const void* src, ElemType type, int64_t n, float premul);
uint32_t dequant_sum_amax_full_blocks(const BlockCodes& pieces, const OwnAddend& own, int post_div,
                                      int64_t first_block, int64_t blocks);
#else
// Not x86: supported() is false, so the SIMD switch stays off and these are
// never called; they exist so the dispatch in codec_cpu.cpp compiles anywhere,
// and stop the process if that guard ever broke (rather than leave an output
// unwritten).
inline bool supported() { return false; }
[[noreturn]] inline void unreachable() { std::abort(); }
inline void quantize_full_blocks(const void*, ElemType, WireFormat, int64_t, int, float, float, uint8_t*, uint8_t*,
                                 const StochasticRun* = nullptr) {
  unreachable();
}
inline void dequantize_full_blocks(const uint8_t*, const uint8_t*, float, WireFormat, int64_t, int, void*, ElemType,
                                   int64_t) {
  unreachable();
}
inline void dequant_sum_full_blocks(const BlockCodes&, const OwnAddend&, int, int64_t, int64_t, void*, ElemType) {
  unreachable();
}
inline void dequant_sum_requantize_full_blocks(const BlockCodes&, const OwnAddend&, int, int64_t, int64_t, float,
                                               uint8_t*, uint8_t*, const StochasticRun* = nullptr) {
  unreachable();
}
inline uint32_t finite_amax(const void*, ElemType, int64_t, float) { unreachable(); }
inline uint32_t dequant_sum_amax_full_blocks(const BlockCodes&, const OwnAddend&, int, int64_t, int64_t) {
  unreachable();
}
#endif

}  // namespace avx2
}  // namespace fp8comm
