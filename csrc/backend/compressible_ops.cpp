// The collectives that have a compressed algorithm: each checks its
// arguments on the calling rank and hands the generic entry
// (ProcessGroupFp8::call, run_compressed.h) its exact form and its
// compressed one, which decides and runs one of them (DESIGN.md,
// "Algorithms", exact passthrough). all_to_all's are in all_to_all_ops.cpp,
// the *_tensor_coalesced forms in coalesced_ops.cpp.
#include "../algorithms/algorithms.h"
#include "../algorithms/residual.h"
#include "arguments.h"
#include "emulated_reduce.h"
#include "process_group_fp8.h"
#include "run_compressed.h"
#include "wait_for.h"

namespace fp8comm {

namespace {

// The reduce op's verdict, for ProcessGroupFp8::passthrough.
Passthrough reducible(const std::optional<Reduction>& red) {
  return red ? Passthrough::kCompressed : Passthrough::kReduceOp;
}

}  // namespace

// ------------------------------------------------------------------ all_reduce
template <typename Opts, typename Inner>
c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::all_reduce_exact(const Collective& c, std::vector<at::Tensor>& tensors,
                                                                 const Opts& opts, bool emulate, Inner&& inner) {
  if (!emulate) return inner(tensors, opts);
  Opts sum = opts;
  sum.reduceOp = c10d::ReduceOp::SUM;
  emulate_reduce(c.name, opts.reduceOp, size_, tensors, tensors, /*in_place=*/true,
                 [&](std::vector<at::Tensor>& copies, std::vector<at::Tensor>&) {
                   wait_for(hold_inner_work(inner(copies, sum), tensors[0].device().type()));
                 });
  return {};
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "fp8comm ", collectives::kAllReduce.name, ": expected one tensor per call, got ",
              tensors.size());
  return allreduce_keeping_residual(tensors[0], opts, {});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::allreduce_keeping_residual(at::Tensor& tensor,
                                                                           const c10d::AllreduceOptions& opts,
                                                                           const at::Tensor& residual) {
  const Collective& c = collectives::kAllReduce;
  check_not_fp8_reduction(c.name, tensor);
  check_writable(c.name, tensor, "the tensor");
  if (residual.defined()) check_residual(c.name, residual, tensor);
  auto inner = inner_for(tensor.device(), c.name);
  const TransportTraits traits = traits_for(tensor.device().type());
  check_reduce_op_supported(c.name, opts.reduceOp, tensor, traits);
  auto red = reduction_for(opts.reduceOp, tensor, size_);
  std::vector<at::Tensor> user{tensor};
  if (residual.defined()) user.push_back(residual);
  const CallSpec spec{tensor, tensor.numel(), reducible(red), bytes_of(tensor), opts.asyncOp, opts.timeout,
                      with_factor(user, opts.reduceOp, red), {tensor}};
  auto exact = [&] {
    if (residual.defined()) residual.zero_();  // exact: nothing dropped
    std::vector<at::Tensor> tensors{tensor};
    return all_reduce_exact(c, tensors, opts, needs_emulation(opts.reduceOp, tensor, traits),
                            [&](std::vector<at::Tensor>& ts, const c10d::AllreduceOptions& o) {
                              return inner->allreduce(ts, o);
                            });
  };
  return call(c, spec, exact, [&](auto&& algorithm) {
    at::Tensor buffer = contiguous_or_self(tensor);
    algorithm(CompressedArgs{{buffer}, {}, &*red, residual});
    write_back(tensor, buffer);
  });
}

// One all_reduce of the concatenation, like a DDP bucket.
c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                    const c10d::AllreduceCoalescedOptions& opts) {
  const Collective& c = collectives::kAllReduceCoalesced;
  const bool same_dtype = check_all_reduce_coalesced(c.name, tensors);
  int64_t total = 0;
  for (const auto& t : tensors) total += t.numel();
  auto inner = inner_for(tensors[0].device(), c.name);
  const TransportTraits traits = traits_for(tensors[0].device().type());
  for (const auto& t : tensors) check_reduce_op_supported(c.name, opts.reduceOp, t, traits);
  auto red = reduction_for(opts.reduceOp, tensors[0], size_);
  const CallSpec spec{tensors[0], total, same_dtype ? reducible(red) : Passthrough::kMixedDtypes, bytes_of(tensors),
                      opts.asyncOp, opts.timeout, with_factor(tensors, opts.reduceOp, red), tensors};
  auto exact = [&] {
    return all_reduce_exact(c, tensors, opts, same_dtype && needs_emulation(opts.reduceOp, tensors[0], traits),
                            [&](std::vector<at::Tensor>& ts, const c10d::AllreduceCoalescedOptions& o) {
                              return inner->allreduce_coalesced(ts, o);
                            });
  };
  return call(c, spec, exact, [&](auto&& algorithm) {
    std::vector<at::Tensor> flat_views;
    for (const auto& t : tensors) flat_views.push_back(t.reshape({-1}));
    at::Tensor flat = at::cat(flat_views);
    algorithm(CompressedArgs{{flat}, {}, &*red});
    int64_t offset = 0;
    for (auto& t : tensors) {
      t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  });
}

// ---------------------------------------------------------------------- reduce
// The tensor is read on every rank and written on the root only.
c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& opts) {
  const Collective& c = collectives::kReduce;
  TORCH_CHECK(tensors.size() == 1, "fp8comm ", c.name, ": expected one tensor per call, got ", tensors.size());
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "fp8comm ", c.name, ": the root is rank ", opts.rootRank,
              " of a group of ", size_, "; pass a group rank in [0, ", size_, ")");
  check_not_fp8_reduction(c.name, tensors);
  check_writable(c.name, tensors, "a tensor");
  at::Tensor& tensor = tensors[0];
  const TransportTraits traits = traits_for(tensor.device().type());
  check_reduce_op_supported(c.name, opts.reduceOp, tensor, traits);
  auto red = reduction_for(opts.reduceOp, tensor, size_);
  const CallSpec spec{tensor, tensor.numel(), reducible(red), bytes_of(tensor), opts.asyncOp, opts.timeout,
                      with_factor(tensors, opts.reduceOp, red), tensors};
  auto exact = [&]() -> c10::intrusive_ptr<c10d::Work> {
    auto inner = inner_for(tensor.device(), c.name);
    if (!needs_emulation(opts.reduceOp, tensor, traits)) return inner->reduce(tensors, opts);
    c10d::ReduceOptions sum = opts;
    sum.reduceOp = c10d::ReduceOp::SUM;
    const std::vector<at::Tensor> written = rank_ == opts.rootRank ? tensors : std::vector<at::Tensor>{};
    emulate_reduce(c.name, opts.reduceOp, size_, tensors, written, /*in_place=*/true,
                   [&](std::vector<at::Tensor>& copies, std::vector<at::Tensor>&) {
                     wait_for(hold_inner_work(inner->reduce(copies, sum), tensor.device().type()));
                   });
    return {};
  };
  return call(c, spec, exact, [&](auto&& algorithm) {
    at::Tensor buffer = contiguous_or_self(tensor);
    CompressedArgs args{{buffer}, {}, &*red};
    args.root = opts.rootRank;
    algorithm(args);
    if (rank_ == opts.rootRank) write_back(tensor, buffer);
  });
}

// -------------------------------------------------------------- reduce_scatter
void ProcessGroupFp8::check_reduce_scatter_tensor(const Collective& c, const at::Tensor& output,
                                                  const at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  check_same_device_and_dtype(c.name, input, output, "output");
  check_not_fp8_reduction(c.name, input);
  check_writable(c.name, output, "the output");
  check_group_multiple(c.name, input, "input", output, "output", size_);
  inner_for(input.device(), c.name);
  check_reduce_op_supported(c.name, opts.reduceOp, input, traits_for(input.device().type()));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::reduce_scatter_tensor_exact(const Collective& c, at::Tensor& output,
                                                                           at::Tensor& input,
                                                                           const c10d::ReduceScatterOptions& opts) {
  auto inner = inner_for(input.device(), c.name);
  if (!needs_emulation(opts.reduceOp, input, traits_for(input.device().type()))) {
    return inner->_reduce_scatter_base(output, input, opts);
  }
  c10d::ReduceScatterOptions sum = opts;
  sum.reduceOp = c10d::ReduceOp::SUM;
  emulate_reduce(c.name, opts.reduceOp, size_, {input}, {output}, /*in_place=*/false,
                 [&](std::vector<at::Tensor>& ins, std::vector<at::Tensor>& results) {
                   auto work = inner->_reduce_scatter_base(results[0], ins[0], sum);
                   wait_for(hold_inner_work(work, input.device().type()));
                 });
  return {};
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                     const c10d::ReduceScatterOptions& opts) {
  return reduce_scatter_tensor(collectives::kReduceScatterTensor, output, input, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::reduce_scatter_keeping_residual(at::Tensor& output, at::Tensor& input,
                                                                                const c10d::ReduceScatterOptions& opts,
                                                                                const at::Tensor& residual) {
  return reduce_scatter_tensor(collectives::kReduceScatterTensor, output, input, opts, residual);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::reduce_scatter_tensor(const Collective& c, at::Tensor& output,
                                                                      at::Tensor& input,
                                                                      const c10d::ReduceScatterOptions& opts,
                                                                      const at::Tensor& residual) {
  check_reduce_scatter_tensor(c, output, input, opts);
  if (residual.defined()) check_residual(c.name, residual, input);
  auto red = reduction_for(opts.reduceOp, input, size_);
  std::vector<at::Tensor> user{input, output};
  if (residual.defined()) user.push_back(residual);
  CallSpec spec{input, output.numel(), reducible(red), bytes_of(output), opts.asyncOp, opts.timeout,
                with_factor(user, opts.reduceOp, red), {output}};
  spec.dense_outputs = true;
  auto exact = [&] {
    if (residual.defined()) residual.zero_();  // exact: nothing dropped
    return reduce_scatter_tensor_exact(c, output, input, opts);
  };
  return call(c, spec, exact, [&](auto&& algorithm) {
    at::Tensor out = contiguous_or_self(output);
    algorithm(CompressedArgs{{out}, {contiguous_or_self(input)}, &*red, residual});
    write_back(output, out);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                               std::vector<std::vector<at::Tensor>>& inputs,
                                                               const c10d::ReduceScatterOptions& opts) {
  const Collective& c = collectives::kReduceScatter;
  TORCH_CHECK(outputs.size() == 1 && inputs.size() == 1, "fp8comm ", c.name,
              ": expected one output and one input list per call, got ", outputs.size(), " and ", inputs.size());
  at::Tensor& output = outputs[0];
  check_reduce_scatter_list(c.name, output, inputs[0], size_);
  auto inner = inner_for(output.device(), c.name);
  const TransportTraits traits = traits_for(output.device().type());
  check_reduce_op_supported(c.name, opts.reduceOp, output, traits);
  auto red = reduction_for(opts.reduceOp, output, size_);
  std::vector<at::Tensor> user = inputs[0];
  user.push_back(output);
  const CallSpec spec{output, output.numel(), reducible(red), bytes_of(output), opts.asyncOp, opts.timeout,
                      with_factor(user, opts.reduceOp, red), outputs};
  auto exact = [&]() -> c10::intrusive_ptr<c10d::Work> {
    if (!needs_emulation(opts.reduceOp, output, traits)) return inner->reduce_scatter(outputs, inputs, opts);
    std::vector<at::Tensor> flat_inputs;
    for (const auto& in : inputs[0]) flat_inputs.push_back(in.reshape({-1}));
    at::Tensor flat = at::cat(flat_inputs);
    wait_for(reduce_scatter_tensor_exact(c, output, flat, opts));
    return {};
  };
  return call(c, spec, exact, [&](auto&& algorithm) {
    std::vector<at::Tensor> segments;
    for (const auto& in : inputs[0]) segments.push_back(contiguous_or_self(in));
    at::Tensor out = contiguous_or_self(output);
    algorithm(CompressedArgs{{out}, segments, &*red});
    write_back(output, out);
  });
}

// ------------------------------------------------------------------ all_gather
void ProcessGroupFp8::check_all_gather_into_tensor(const Collective& c, const at::Tensor& output,
                                                   const at::Tensor& input) const {
  check_same_device_and_dtype(c.name, input, output, "output");
  check_writable(c.name, output, "the output");
  check_group_multiple(c.name, output, "output", input, "input", size_);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                const c10d::AllgatherOptions& opts) {
  return all_gather_into_tensor(collectives::kAllGatherIntoTensor, output, input, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::all_gather_into_tensor(const Collective& c, at::Tensor& output,
                                                                       at::Tensor& input,
                                                                       const c10d::AllgatherOptions& opts) {
  check_all_gather_into_tensor(c, output, input);
  auto inner = inner_for(input.device(), c.name);
  CallSpec spec{input, input.numel(), Passthrough::kCompressed, bytes_of(input), opts.asyncOp, opts.timeout,
                {input, output}, {output}};
  spec.dense_outputs = true;
  auto exact = [&] {
    at::Tensor out = as_bytes_if_fp8(output);
    at::Tensor in = as_bytes_if_fp8(input);
    return inner->_allgather_base(out, in, opts);
  };
  return call(c, spec, exact, [&](auto&& algorithm) {
    at::Tensor out = contiguous_or_self(output);
    algorithm(CompressedArgs{{out}, {contiguous_or_self(input)}, nullptr});
    write_back(output, out);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllgatherOptions& opts) {
  const Collective& c = collectives::kAllGather;
  TORCH_CHECK(outputs.size() == 1 && inputs.size() == 1, "fp8comm ", c.name,
              ": expected one input and one output list per call, got ", inputs.size(), " and ", outputs.size());
  at::Tensor& input = inputs[0];
  check_all_gather_list(c.name, input, outputs[0], size_);
  auto inner = inner_for(input.device(), c.name);
  std::vector<at::Tensor> user = outputs[0];
  user.push_back(input);
  const CallSpec spec{input, input.numel(), Passthrough::kCompressed, bytes_of(input), opts.asyncOp, opts.timeout,
                      user, outputs[0]};
  auto exact = [&] {
    auto outs = as_bytes_if_fp8(outputs);
    auto ins = as_bytes_if_fp8(inputs);
    return inner->allgather(outs, ins, opts);
  };
  return call(c, spec, exact, [&](auto&& algorithm) {
    std::vector<at::Tensor> outs;
    for (const auto& out : outputs[0]) outs.push_back(contiguous_or_self(out));
    algorithm(CompressedArgs{outs, {contiguous_or_self(input)}, nullptr});
    for (size_t r = 0; r < outs.size(); ++r) write_back(outputs[0][r], outs[r]);
  });
}

}  // namespace fp8comm
