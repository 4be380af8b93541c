#include "quantization_error.h"

namespace fp8comm {

QuantizationError& QuantizationError::operator+=(const QuantizationError& other) {
  signal_energy += other.signal_energy;
  noise_energy += other.noise_energy;
  values += other.values;
  return *this;
}

namespace {

// Adds the energies of `values` (float32) against `decoded`, finite values only.
void add_energies(const at::Tensor& values, const at::Tensor& decoded, QuantizationError& error) {
  const at::Tensor finite = at::isfinite(values);
  const at::Tensor x = at::where(finite, values, 0.0f).to(at::kDouble);
  const at::Tensor d = at::where(finite, decoded, 0.0f).to(at::kDouble);
  error.signal_energy += x.square().sum().item<double>();
  error.noise_energy += (x - d).square().sum().item<double>();
  error.values += finite.sum().item<int64_t>();
}

void check_cpu(const at::Tensor& t) {
  TORCH_CHECK(t.is_cpu(), "fp8comm: track_error measures CPU tensors only, got ", t.device(),
              " (a group with a CUDA transport refuses track_error at creation)");
}

}  // namespace

QuantizedValues quantized_values(const at::Tensor& src, float premul, const std::optional<at::Tensor>& premul_tensor,
                                 const BlockCodes& codes) {
  // The codec multiplies in FP32 (float times float), as this does.
  at::Tensor values = src.reshape({-1}).to(at::kFloat);
  if (premul_tensor) {
    values = values.mul(*premul_tensor);
  } else if (premul != 1.0f) {
    values = values.mul(static_cast<double>(premul));
  }
  at::Tensor decoded = at::empty({src.numel()}, values.options());
  dequantize_into(codes, decoded);
  return {values, decoded};
}

QuantizedValues requantized_sum(const BlockCodes& pieces, const OwnAddendTensor& own, int post_div,
                                const BlockCodes& out) {
  // The same sum in FP32 (the own addend widened exactly, so the codec adds
  // the same floats in the same order), then the decoded bytes it became.
  at::Tensor sum = at::empty({own.src.numel()}, own.src.options().dtype(at::kFloat));
  dequant_sum_into(pieces, OwnAddendTensor{own.src.to(at::kFloat), own.premul, own.premul_tensor}, post_div, sum);
  at::Tensor decoded = at::empty_like(sum);
  dequantize_into(out, decoded);
  return {sum, decoded};
}

void measure_quantized(const at::Tensor& src, float premul, const std::optional<at::Tensor>& premul_tensor,
                       const BlockCodes& codes, QuantizationError& error) {
  check_cpu(src);
  if (src.numel() == 0) return;
  const QuantizedValues q = quantized_values(src, premul, premul_tensor, codes);
  add_energies(q.values, q.decoded, error);
}

void measure_requantized_sum(const BlockCodes& pieces, const OwnAddendTensor& own, int post_div,
                             const BlockCodes& out, QuantizationError& error) {
  check_cpu(own.src);
  if (own.src.numel() == 0) return;
  const QuantizedValues q = requantized_sum(pieces, own, post_div, out);
  add_energies(q.values, q.decoded, error);
}

}  // namespace fp8comm
