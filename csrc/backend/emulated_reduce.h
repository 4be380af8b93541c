#pragma once
// AVG and PREMUL_SUM over a transport that lacks them (gloo), for exact
// passthrough calls and for the fp8ncclsim transport (csrc/testing), which
// reduces them over gloo as NCCL would: an exact SUM of copies (premultiplied
// in the tensor's own dtype for PREMUL_SUM), divided for AVG, and only then
// written into the user's tensors, so a failing SUM leaves them as they were.
// The rule: DESIGN.md, "Decisions", AVG and PREMUL_SUM.
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <vector>

#include "../algorithms/transport_traits.h"

namespace fp8comm {

bool is_avg_or_premul(const c10d::ReduceOp& op);

// Whether a passthrough `op` on tensors like `t` must be emulated.
bool needs_emulation(const c10d::ReduceOp& op, const at::Tensor& t, const TransportTraits& traits);

// Raises, naming `name`, when AVG / PREMUL_SUM of `t` can be neither reduced
// by the transport nor emulated (over gloo: PREMUL_SUM of integers, AVG of bools).
void check_reduce_op_supported(const char* name, const c10d::ReduceOp& op, const at::Tensor& t,
                               const TransportTraits& traits);

// Runs sum(inputs, results): an exact SUM, waited for, that reads the
// prepared `inputs` (emulation_input) and writes `results`. With `in_place` the results are
// the copies themselves; else fresh tensors shaped like `outputs`. Then
// divides for AVG and copies each result into outputs[i].
template <typename Sum>
void emulate_reduce(const char* name, const c10d::ReduceOp& op, int64_t group_size,
                    const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs, bool in_place,
                    Sum&& sum);

// What the exact SUM reads for `t`: premultiplied for PREMUL_SUM; for AVG a
// copy when the SUM writes into it, else `t` itself (contiguous).
at::Tensor emulation_input(const char* name, const at::Tensor& t, const c10d::ReduceOp& op, bool written);

template <typename Sum>
void emulate_reduce(const char* name, const c10d::ReduceOp& op, int64_t group_size,
                    const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs, bool in_place,
                    Sum&& sum) {
  std::vector<at::Tensor> copies;
  for (const auto& t : inputs) copies.push_back(emulation_input(name, t, op, in_place));
  std::vector<at::Tensor> results = copies;
  if (!in_place) {
    results.clear();
    for (const auto& out : outputs) results.push_back(at::empty(out.sizes(), out.options()));
  }
  sum(copies, results);
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (op.op_ == c10d::ReduceOp::AVG) {
      if (at::isIntegralType(results[i].scalar_type(), /*includeBool=*/false)) {
        results[i].div_(group_size, "trunc");
      } else {
        results[i].div_(group_size);
      }
    }
    outputs[i].copy_(results[i]);
  }
}

}  // namespace fp8comm
