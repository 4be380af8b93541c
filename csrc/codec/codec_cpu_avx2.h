#pragma once
// Hand-written AVX2 kernels for the CPU codec's full blocks (codec_cpu.cpp
// calls them for every block whose elements are all valid, and keeps its
// scalar loops for the rest). Same bytes as the scalar loops.
#include <stdint.h>

#include "codec.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define FP8C_HAVE_AVX2_KERNELS 1
#else
#define FP8C_HAVE_AVX2_KERNELS 0
#endif

namespace fp8comm {

constexpr int kMaxCpuBlock = 4096;

namespace avx2 {

#if FP8C_HAVE_AVX2_KERNELS
// Whether this CPU runs them (AVX2 and F16C).
bool supported();

// `blocks` whole blocks of `block_size` (a multiple of 16) elements: codes and
// scales of block j at codes + j * block_size and scales[j].
void quantize_full_blocks(const void* src, ElemType type, Fp8Format format, int64_t blocks, int block_size,
                          float premul, uint8_t* codes, uint8_t* scales);
// output_bytes: as dequantize_cpu's (0: these blocks are the whole output).
void dequantize_full_blocks(const uint8_t* codes, const uint8_t* scales, Fp8Format format, int64_t blocks,
                            int block_size, void* dst, ElemType type, int64_t output_bytes);
// Blocks [first_block, first_block + blocks) of the pieces, summed as
// dequant_sum_cpu sums them; dst / codes / scales point at the first one's
// output. The own addend, when present, holds all these blocks whole.
void dequant_sum_full_blocks(const BlockCodes& pieces, const OwnAddend& own, int post_div, int64_t first_block,
                             int64_t blocks, void* dst, ElemType type);
void dequant_sum_requantize_full_blocks(const BlockCodes& pieces, const OwnAddend& own, int post_div,
                                        int64_t first_block, int64_t blocks, uint8_t* codes, uint8_t* scales);
#else
inline bool supported() { return false; }
#endif

}  // namespace avx2
}  // namespace fp8comm
