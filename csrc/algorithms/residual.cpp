#include "residual.h"

#include <ATen/MemoryOverlap.h>

#include "quantization_error.h"

namespace fp8comm {

namespace {

// r / f in place, with f the factor as the codec applied it (FP32).
void divide_by_factor(at::Tensor& r, float premul, const std::optional<at::Tensor>& premul_tensor) {
  if (premul_tensor) {
    r.div_(*premul_tensor);
  } else if (premul != 1.0f) {
    r.div_(static_cast<double>(premul));
  }
}

// residual <- r (float32), 0 where r is not finite.
void store(const at::Tensor& r, const at::Tensor& residual) {
  residual.view({-1}).copy_(at::where(at::isfinite(r), r, at::zeros({}, r.options())));
}

}  // namespace

void keep_residual(const at::Tensor& src, const Reduction& red, const BlockCodes& codes, const at::Tensor& residual) {
  if (src.numel() == 0) return;
  const QuantizedValues q = quantized_values(src, red.premul, red.premul_tensor, codes);
  at::Tensor r = q.values - q.decoded;  // a new tensor: `values` may be the caller's input itself
  divide_by_factor(r, red.premul, red.premul_tensor);
  store(r, residual);
}

void keep_requantized_residual(const BlockCodes& pieces, const OwnAddendTensor& own, int post_div,
                               const BlockCodes& out, const at::Tensor& residual) {
  if (own.src.numel() == 0) return;
  const QuantizedValues q = requantized_sum(pieces, own, post_div, out);
  at::Tensor r = q.values.sub_(q.decoded);  // the sum is this call's own tensor
  if (post_div != 1) r.mul_(post_div);
  divide_by_factor(r, own.premul, own.premul_tensor);
  store(r, residual);
}

void unscale_residual_into(const at::Tensor& from, const Reduction& red, const at::Tensor& residual) {
  at::Tensor r = from.reshape({-1}).to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
  divide_by_factor(r, red.premul, red.premul_tensor);
  store(r, residual);
}

void check_residual(const char* op, const at::Tensor& residual, const at::Tensor& input) {
  TORCH_CHECK(residual.scalar_type() == at::kFloat || residual.scalar_type() == at::kBFloat16, "fp8comm ", op,
              ": the error-feedback residual must be float32 or bfloat16, got ", residual.scalar_type());
  TORCH_CHECK(residual.device() == input.device(), "fp8comm ", op, ": the error-feedback residual is on ",
              residual.device(), " but the input is on ", input.device(), "; keep it beside the input");
  TORCH_CHECK(residual.numel() == input.numel(), "fp8comm ", op, ": the error-feedback residual has ",
              residual.numel(), " elements but the input has ", input.numel(),
              "; it must be the input's size (one value per input element)");
  TORCH_CHECK(residual.is_contiguous(), "fp8comm ", op, ": the error-feedback residual must be contiguous");
  TORCH_CHECK(at::get_overlap_status(residual, input) == at::MemOverlapStatus::No, "fp8comm ", op,
              ": the error-feedback residual overlaps the input; give it its own memory");
}

}  // namespace fp8comm
