#include "emulated_reduce.h"

#include "../algorithms/premul.h"

namespace fp8comm {

bool is_avg_or_premul(const c10d::ReduceOp& op) {
  return op.op_ == c10d::ReduceOp::AVG || op.op_ == c10d::ReduceOp::PREMUL_SUM;
}

namespace {
// Floating-point and complex tensors take both; integer tensors take AVG as
// NCCL computes it for them (the sum divided by the group size, truncated
// toward zero): frameworks ask for AVG of integer counters on any backend
// not named "gloo".
bool emulable(const c10d::ReduceOp& op, const at::Tensor& t) {
  if (t.is_floating_point() || t.is_complex()) return true;
  return op.op_ == c10d::ReduceOp::AVG && at::isIntegralType(t.scalar_type(), /*includeBool=*/false);
}
}  // namespace

bool needs_emulation(const c10d::ReduceOp& op, const at::Tensor& t, const TransportTraits& traits) {
  return is_avg_or_premul(op) && emulable(op, t) && !traits.reduces_avg_and_premul;
}

void check_reduce_op_supported(const char* name, const c10d::ReduceOp& op, const at::Tensor& t,
                               const TransportTraits& traits) {
  if (!is_avg_or_premul(op) || emulable(op, t) || traits.reduces_avg_and_premul) return;
  TORCH_CHECK(false, "fp8comm ", name, ": ", op.op_ == c10d::ReduceOp::AVG ? "AVG" : "PREMUL_SUM", " of ",
              t.scalar_type(), " tensors: the gloo transport has neither AVG nor PREMUL_SUM, and fp8comm emulates "
              "AVG for numbers and PREMUL_SUM for floating-point and complex tensors only (reduce with SUM, then "
              "scale yourself)");
}

at::Tensor emulation_input(const char* name, const at::Tensor& t, const c10d::ReduceOp& op, bool written) {
  if (op.op_ == c10d::ReduceOp::PREMUL_SUM) return premultiplied(name, t, op).contiguous();
  if (written) return t.clone(at::MemoryFormat::Contiguous);
  return t.is_contiguous() ? t : t.contiguous();
}

}  // namespace fp8comm
