#pragma once
// How a c10d reduce op maps onto the codec. SUM: nothing; AVG: the FP32 sum
// is divided by the group size; PREMUL_SUM: each rank's input is multiplied
// (in FP32) before it is quantized, as NCCL applies the factor to each rank's
// input. Other ops (MIN, MAX, PRODUCT, bitwise) have no compressed form.
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <optional>
#include <vector>

namespace fp8comm {

struct Reduction {
  float premul = 1.0f;
  std::optional<at::Tensor> premul_tensor;  // float32, one element, on the tensors' device; replaces premul
  int post_div = 1;
};

// The Reduction of `op` on tensors like `t` in a group of `group_size`
// ranks, or none when the op has no compressed form. A CPU factor tensor is
// read on the host; a device one is read by the algorithm on its stream.
std::optional<Reduction> reduction_for(const c10d::ReduceOp& op, const at::Tensor& t, int64_t group_size);

// `tensors` plus the PREMUL_SUM factor tensors a call reads on its stream,
// so that the call's Work keeps them alive and marks them in use.
std::vector<at::Tensor> with_factor(std::vector<at::Tensor> tensors, const c10d::ReduceOp& op,
                                    const std::optional<Reduction>& red);

}  // namespace fp8comm
