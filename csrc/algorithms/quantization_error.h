#pragma once
// The quantization error of the values one rank puts on the wire
// (Options.track_error, DESIGN.md "Stats"): for every finite value x the
// rank quantizes (its input times the PREMUL_SUM factor, and the FP32 sums it
// re-quantizes) the signal energy x^2 and the noise energy (x - decoded)^2,
// summed in double. Non-finite values travel as non-finite codes and are left
// out. Measured by decoding the bytes already written, so the wire is the
// same with or without it. CPU tensors only: reading the sums of device
// tensors would sync the host.
#include <ATen/ATen.h>

#include <optional>

#include "../codec/codec.h"
#include "../codec/codec_tensor.h"

namespace fp8comm {

struct QuantizationError {
  double signal_energy = 0.0;  // sum of x^2
  double noise_energy = 0.0;   // sum of (x - decoded x)^2
  int64_t values = 0;          // how many values were measured

  QuantizationError& operator+=(const QuantizationError& other);
};

// What the codec quantized, and what its bytes decode to, both float32 on
// the tensors' device: the measurement below and error feedback's residual
// (residual.h) compare the two.
struct QuantizedValues {
  at::Tensor values;   // may be `src` itself (float32, no factor): read only
  at::Tensor decoded;
};

// `src` times the factor (as the codec multiplied it: in FP32), which the
// codec quantized into the first src.numel() elements of `codes`.
QuantizedValues quantized_values(const at::Tensor& src, float premul, const std::optional<at::Tensor>& premul_tensor,
                                 const BlockCodes& codes);

// The FP32 sum of `own` and the decoded `pieces`, divided by post_div, that
// dequant_sum_requantize wrote into `out`, over own.src.numel() elements.
QuantizedValues requantized_sum(const BlockCodes& pieces, const OwnAddendTensor& own, int post_div,
                                const BlockCodes& out);

// Adds `src` times the factor (as the codec multiplied it: in FP32), which
// the codec quantized into the first src.numel() elements of `codes`.
void measure_quantized(const at::Tensor& src, float premul, const std::optional<at::Tensor>& premul_tensor,
                       const BlockCodes& codes, QuantizationError& error);

// Adds the sum that dequant_sum_requantize wrote into `out`: the FP32 sum of
// `own` and the decoded `pieces`, divided by post_div, over the first
// own.src.numel() elements (the rest of the segment is padding).
void measure_requantized_sum(const BlockCodes& pieces, const OwnAddendTensor& own, int post_div,
                             const BlockCodes& out, QuantizationError& error);

}  // namespace fp8comm
