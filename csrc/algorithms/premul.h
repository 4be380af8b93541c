#pragma once
// PREMUL_SUM's factor as c10d carries it, and the factor applied in the
// tensor's own dtype for the exact emulation (DESIGN.md, "Decisions", AVG and
// PREMUL_SUM).
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

namespace fp8comm {

inline const c10d::NCCLPreMulSumSupplement* premul_supplement(const c10d::ReduceOp& op) {
  if (op.op_ != c10d::ReduceOp::PREMUL_SUM) return nullptr;
  return dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
}

// t times the PREMUL_SUM factor, as a new tensor, computed in t's own dtype
// (the double factor is kept as a double; a tensor factor is cast to t's
// dtype). Used where an exact SUM carries the reduction.
inline at::Tensor premultiplied(const char* op_name, const at::Tensor& t, const c10d::ReduceOp& op) {
  const auto* supplement = premul_supplement(op);
  TORCH_CHECK(supplement != nullptr, "fp8comm ", op_name, ": PREMUL_SUM without a factor");
  if (supplement->tensor_factor.defined()) {
    return t * supplement->tensor_factor.to(t.device(), t.scalar_type()).reshape({});
  }
  return t.mul(at::Scalar(supplement->double_factor));
}

}  // namespace fp8comm
