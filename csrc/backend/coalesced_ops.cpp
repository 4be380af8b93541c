// The *_tensor_coalesced forms: each (output, input) pair is its own
// collective, compressed or passed through as it would be alone (the tensor
// forms in compressible_ops.cpp), counted under the coalesced op's name.
// Every pair is checked before any is issued, so a bad one never leaves the
// earlier ones written.
#include "arguments.h"
#include "emulated_reduce.h"
#include "process_group_fp8.h"
#include "run_compressed.h"

namespace fp8comm {

namespace {

std::vector<at::Tensor> pair_tensors(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs) {
  std::vector<at::Tensor> all = inputs;
  all.insert(all.end(), outputs.begin(), outputs.end());
  return all;
}

}  // namespace

template <typename Opts, typename Pair>
c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::run_pairs(const Collective& c, std::vector<at::Tensor>& outputs,
                                                          std::vector<at::Tensor>& inputs, const Opts& opts,
                                                          const std::vector<at::Tensor>& user_tensors,
                                                          Pair&& pair) {
  Opts one = opts;
  one.asyncOp = true;
  return run(c, inputs[0].device(), opts.asyncOp, opts.timeout, user_tensors, outputs, [&](Route& route) {
    for (size_t i = 0; i < inputs.size(); ++i) route.group_transport.wait(pair(outputs[i], inputs[i], one), c.compressed->name);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  const Collective& c = collectives::kReduceScatterTensorCoalesced;
  TORCH_CHECK(!inputs.empty() && outputs.size() == inputs.size(), "fp8comm ", c.name, ": got ", outputs.size(),
              " outputs for ", inputs.size(), " inputs");
  for (size_t i = 0; i < inputs.size(); ++i) check_reduce_scatter_tensor(c, outputs[i], inputs[i], opts);
  check_same_device(c.name, inputs);
  auto inner = inner_for(inputs[0].device(), c.name);
  const bool emulate = is_avg_or_premul(opts.reduceOp) && !traits_for(inputs[0].device().type()).reduces_avg_and_premul;
  auto red = reduction_for(opts.reduceOp, inputs[0], size_);
  const Passthrough reducible = red ? Passthrough::kCompressed : Passthrough::kReduceOp;
  bool any = false;
  std::vector<Passthrough> whys;
  for (size_t i = 0; i < inputs.size(); ++i) {
    whys.push_back(passthrough(c, inputs[i], outputs[i].numel(), reducible));
    const bool compress = whys.back() == Passthrough::kCompressed;
    if (compress) check_dense(c.name, outputs[i]);
    any = any || compress;
  }
  if (!any && !emulate) {
    auto work = inner->reduce_scatter_tensor_coalesced(outputs, inputs, opts);
    for (size_t i = 0; i < outputs.size(); ++i) record_passthrough(c, whys[i], bytes_of(outputs[i]));
    return passed_through(std::move(work), inputs[0].device().type(), c, outputs);
  }
  return run_pairs(c, outputs, inputs, opts, with_factor(pair_tensors(inputs, outputs), opts.reduceOp, red),
                   [&](at::Tensor& out, at::Tensor& in, const c10d::ReduceScatterOptions& one) {
                     return reduce_scatter_tensor(c, out, in, one);
                   });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                std::vector<at::Tensor>& inputs,
                                                                                const c10d::AllgatherOptions& opts) {
  const Collective& c = collectives::kAllGatherIntoTensorCoalesced;
  TORCH_CHECK(!inputs.empty() && outputs.size() == inputs.size(), "fp8comm ", c.name, ": got ", outputs.size(),
              " outputs for ", inputs.size(), " inputs");
  bool any = false;
  std::vector<Passthrough> whys;
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_all_gather_into_tensor(c, outputs[i], inputs[i]);
    whys.push_back(passthrough(c, inputs[i], inputs[i].numel()));
    const bool compress = whys.back() == Passthrough::kCompressed;
    if (compress) check_dense(c.name, outputs[i]);
    any = any || compress;
  }
  check_same_device(c.name, inputs);
  auto inner = inner_for(inputs[0].device(), c.name);
  if (!any) {
    auto outs = as_bytes_if_fp8(outputs);
    auto ins = as_bytes_if_fp8(inputs);
    auto work = inner->allgather_into_tensor_coalesced(outs, ins, opts);
    for (size_t i = 0; i < inputs.size(); ++i) record_passthrough(c, whys[i], bytes_of(inputs[i]));
    return passed_through(std::move(work), inputs[0].device().type(), c, outputs);
  }
  return run_pairs(c, outputs, inputs, opts, pair_tensors(inputs, outputs),
                   [&](at::Tensor& out, at::Tensor& in, const c10d::AllgatherOptions& one) {
                     return all_gather_into_tensor(c, out, in, one);
                   });
}

}  // namespace fp8comm
