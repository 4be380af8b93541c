#include "reduction.h"

#include "premul.h"

namespace fp8comm {

std::optional<Reduction> reduction_for(const c10d::ReduceOp& op, const at::Tensor& t, int64_t group_size) {
  Reduction red;
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return red;
    case c10d::ReduceOp::AVG:
      red.post_div = static_cast<int>(group_size);
      return red;
    case c10d::ReduceOp::PREMUL_SUM: {
      const auto* supplement = premul_supplement(op);
      if (supplement == nullptr) return std::nullopt;
      const at::Tensor& factor = supplement->tensor_factor;
      if (!factor.defined()) {
        red.premul = static_cast<float>(supplement->double_factor);  // the compressed path scales in FP32
        return red;
      }
      TORCH_CHECK(factor.numel() == 1, "fp8comm: PREMUL_SUM factor must have one element, got ", factor.numel());
      if (factor.is_cpu()) {
        // Read on the host: copying it to a device would sync the host with it.
        red.premul = factor.to(at::kFloat).item<float>();
        return red;
      }
      red.premul_tensor = factor.to(t.device(), at::kFloat).reshape({1}).contiguous();
      return red;
    }
    default:
      return std::nullopt;
  }
}

std::vector<at::Tensor> with_factor(std::vector<at::Tensor> tensors, const c10d::ReduceOp& op,
                                    const std::optional<Reduction>& red) {
  if (red && red->premul_tensor) tensors.push_back(*red->premul_tensor);
  const auto* supplement = premul_supplement(op);
  if (supplement != nullptr && supplement->tensor_factor.defined() && !tensors.empty() &&
      supplement->tensor_factor.device() == tensors[0].device()) {
    tensors.push_back(supplement->tensor_factor);  // the user's factor, read on the stream in coalesced calls
  }
  return tensors;
}

}  // namespace fp8comm
