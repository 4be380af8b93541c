#pragma once
// The one block-size rule, shared by the codec (its loops and kernels), the
// options and the environment variables' descriptions: plain C++, also
// compiled by nvcc.
#include <stdint.h>

namespace fp8comm {

// Elements per block: a multiple of 16 (vector width, 16-byte aligned codes)
// in [16, 4096] (the CPU loops keep one block of float sums on the stack).
constexpr int kMinBlockSize = 16;
constexpr int kMaxBlockSize = 4096;
#define FP8C_BLOCK_SIZE_RULE "a multiple of 16 in [16, 4096]"
inline bool is_valid_block_size(int64_t b) { return b >= kMinBlockSize && b <= kMaxBlockSize && b % 16 == 0; }

}  // namespace fp8comm
