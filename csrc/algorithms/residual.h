#pragma once
// Error feedback (DESIGN.md, "Error feedback"): per element, what the wire
// dropped of the values this rank quantizes, in the units of its input, so
// that a caller who adds it to its next input puts it back into the next
// result. Written from the bytes already encoded, like the quantization
// error (quantization_error.h): the wire is the same with or without it.
// Tensor ops on the call's stream, on any device. Nothing non-finite is kept:
// where the input (or the value over a zero PREMUL_SUM factor) is not finite
// the residual is 0.
#include <ATen/ATen.h>

#include "../codec/codec_tensor.h"
#include "reduction.h"

namespace fp8comm {

// residual <- (src * f - decoded) / f, the error of the src.numel() values
// the codec quantized into `codes` (f: the PREMUL_SUM factor, else 1).
// `residual`: float32 or bfloat16, src.numel() elements, contiguous.
void keep_residual(const at::Tensor& src, const Reduction& red, const BlockCodes& codes, const at::Tensor& residual);

// residual <- (sum - decoded) * post_div / f for the sum that
// dequant_sum_requantize_into wrote into `out` (the FP32 sum of `own` and the
// decoded `pieces`, divided by post_div), over own.src.numel() elements: on
// the owner's next input it adds the error to the next sum.
void keep_requantized_residual(const BlockCodes& pieces, const OwnAddendTensor& own, int post_div, const BlockCodes& out,
                               const at::Tensor& residual);

// residual <- from / f (non-finite: 0): the residual of a buffer the call
// multiplied by the PREMUL_SUM factor itself (the inter_node scope's node
// sums), in the units of the caller's input.
void unscale_residual_into(const at::Tensor& from, const Reduction& red, const at::Tensor& residual);

// Checks a caller's residual tensor for `op` against the input it belongs to:
// float32 or bfloat16, contiguous, the input's device and numel, not
// overlapping it.
void check_residual(const char* op, const at::Tensor& residual, const at::Tensor& input);

}  // namespace fp8comm
