#include "residual.h"

#include <ATen/MemoryOverlap.h>

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
  // The values as the codec quantized them: multiplied in FP32 (float times float).
  at::Tensor values = src.reshape({-1}).to(at::kFloat);
  if (red.premul_tensor) {
    values = values.mul(*red.premul_tensor);
  } else if (red.premul != 1.0f) {
    values = values.mul(static_cast<double>(red.premul));
  }
  at::Tensor decoded = at::empty({src.numel()}, values.options());
  dequantize_into(codes, decoded);
  at::Tensor r = values - decoded;  // a new tensor: `values` may be the caller's input itself
  divide_by_factor(r, red.premul, red.premul_tensor);
  store(r, residual);
}

void keep_requantized_residual(const BlockCodes& pieces, const OwnAddendTensor& own, int post_div,
                               const BlockCodes& out, const at::Tensor& residual) {
  const int64_t n = own.src.numel();
  if (n == 0) return;
  // The same FP32 sum the codec requantized (the own addend widened exactly,
  // so the same floats are added in the same order), then what it became.
  at::Tensor sum = at::empty({n}, own.src.options().dtype(at::kFloat));
  dequant_sum_into(pieces, OwnAddendTensor{own.src.to(at::kFloat), own.premul, own.premul_tensor}, post_div, sum);
  at::Tensor decoded = at::empty_like(sum);
  dequantize_into(out, decoded);
  at::Tensor r = sum.sub_(decoded);
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
