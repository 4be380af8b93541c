// The collectives that have a compressed algorithm: each checks its
// arguments on the calling rank, decides (ProcessGroupFp8::passthrough), and
// runs the algorithm or passes the call through exactly (DESIGN.md,
// "Algorithms", exact passthrough).
#include "../algorithms/algorithms.h"
#include "../algorithms/all_to_all_splits.h"
#include "../algorithms/residual.h"
#include "arguments.h"
#include "emulated_reduce.h"
#include "held_works.h"
#include "process_group_fp8.h"
#include "run_compressed.h"
#include "wait_for.h"

namespace fp8comm {

namespace {

// The reduce op's verdict, for ProcessGroupFp8::passthrough.
Passthrough reducible(const std::optional<Reduction>& red) {
  return red ? Passthrough::kCompressed : Passthrough::kReduceOp;
}

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

// ------------------------------------------------------------------ all_reduce
template <typename Opts, typename Call>
c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::all_reduce_exact(const Collective& c, Passthrough why,
                                                                 std::vector<at::Tensor>& tensors, const Opts& opts,
                                                                 bool emulate, Call&& call) {
  c10::intrusive_ptr<c10d::Work> work;
  if (emulate) {
    Opts sum = opts;
    sum.reduceOp = c10d::ReduceOp::SUM;
    emulate_reduce(c.name, opts.reduceOp, size_, tensors, tensors, /*in_place=*/true,
                   [&](std::vector<at::Tensor>& copies, std::vector<at::Tensor>&) {
                     wait_for(hold_inner_work(call(copies, sum), tensors[0].device().type()));
                   });
    work = passed_through({}, tensors[0].device().type(), c, tensors);
  } else {
    work = passed_through(call(tensors, opts), tensors[0].device().type(), c, tensors);
  }
  record_passthrough(c, why, bytes_of(tensors));
  return work;
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
  const Passthrough why = passthrough(c, tensor, tensor.numel(), reducible(red));
  if (why != Passthrough::kCompressed) {
    if (residual.defined()) residual.zero_();  // exact: nothing dropped
    std::vector<at::Tensor> tensors{tensor};
    return all_reduce_exact(c, why, tensors, opts, needs_emulation(opts.reduceOp, tensor, traits),
                            [&](std::vector<at::Tensor>& ts, const c10d::AllreduceOptions& o) {
                              return inner->allreduce(ts, o);
                            });
  }
  std::vector<at::Tensor> user{tensor};
  if (residual.defined()) user.push_back(residual);
  return compressed_call(c, tensor.device(), opts.asyncOp, opts.timeout, with_factor(user, opts.reduceOp, red),
                         {tensor}, bytes_of(tensor), [&](auto&& algorithm) {
                           at::Tensor buffer = contiguous_or_self(tensor);
                           algorithm(CompressedArgs{{buffer}, {}, &*red, residual});
                           write_back(tensor, buffer);
                         });
}

// One all_reduce of the concatenation, like a DDP bucket.
c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                    const c10d::AllreduceCoalescedOptions& opts) {
  const Collective& c = collectives::kAllReduceCoalesced;
  TORCH_CHECK(!tensors.empty(), "fp8comm ", c.name, ": got no tensors");
  int64_t total = 0;
  bool same_dtype = true;
  for (const auto& t : tensors) {
    check_dense(c.name, t);
    check_not_fp8_reduction(c.name, t);
    check_writable(c.name, t, "a tensor");
    same_dtype = same_dtype && t.scalar_type() == tensors[0].scalar_type();
    total += t.numel();
  }
  check_same_device(c.name, tensors);
  auto inner = inner_for(tensors[0].device(), c.name);
  const TransportTraits traits = traits_for(tensors[0].device().type());
  for (const auto& t : tensors) check_reduce_op_supported(c.name, opts.reduceOp, t, traits);
  auto red = reduction_for(opts.reduceOp, tensors[0], size_);
  const Passthrough why =
      passthrough(c, tensors[0], total, same_dtype ? reducible(red) : Passthrough::kMixedDtypes);
  if (why != Passthrough::kCompressed) {
    return all_reduce_exact(c, why, tensors, opts, same_dtype && needs_emulation(opts.reduceOp, tensors[0], traits),
                            [&](std::vector<at::Tensor>& ts, const c10d::AllreduceCoalescedOptions& o) {
                              return inner->allreduce_coalesced(ts, o);
                            });
  }
  return compressed_call(c, tensors[0].device(), opts.asyncOp, opts.timeout, with_factor(tensors, opts.reduceOp, red),
                         tensors, bytes_of(tensors), [&](auto&& algorithm) {
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
    return passed_through(inner->_reduce_scatter_base(output, input, opts), input.device().type(), c, {output});
  }
  c10d::ReduceScatterOptions sum = opts;
  sum.reduceOp = c10d::ReduceOp::SUM;
  emulate_reduce(c.name, opts.reduceOp, size_, {input}, {output}, /*in_place=*/false,
                 [&](std::vector<at::Tensor>& ins, std::vector<at::Tensor>& results) {
                   auto work = inner->_reduce_scatter_base(results[0], ins[0], sum);
                   wait_for(hold_inner_work(work, input.device().type()));
                 });
  return passed_through({}, input.device().type(), c, {output});
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
  const Passthrough why = passthrough(c, input, output.numel(), reducible(red));
  if (why != Passthrough::kCompressed) {
    if (residual.defined()) residual.zero_();  // exact: nothing dropped
    auto work = reduce_scatter_tensor_exact(c, output, input, opts);
    record_passthrough(c, why, bytes_of(output));
    return work;
  }
  check_dense(c.name, output);
  std::vector<at::Tensor> user{input, output};
  if (residual.defined()) user.push_back(residual);
  return compressed_call(c, input.device(), opts.asyncOp, opts.timeout, with_factor(user, opts.reduceOp, red),
                         {output}, bytes_of(output), [&](auto&& algorithm) {
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
  TORCH_CHECK(static_cast<int64_t>(inputs[0].size()) == size_, "fp8comm ", c.name, ": the input list has ",
              inputs[0].size(), " tensors but the group has ", size_, " ranks");
  check_not_fp8_reduction(c.name, output);
  check_writable(c.name, output, "the output");
  for (const auto& in : inputs[0]) {
    check_same_device_and_dtype(c.name, output, in, "an input", "the output");
    TORCH_CHECK(in.numel() == output.numel(), "fp8comm ", c.name, ": every input must have the output's ",
                output.numel(), " elements, got ", in.numel());
  }
  auto inner = inner_for(output.device(), c.name);
  const TransportTraits traits = traits_for(output.device().type());
  check_reduce_op_supported(c.name, opts.reduceOp, output, traits);
  auto red = reduction_for(opts.reduceOp, output, size_);
  const Passthrough why = passthrough(c, output, output.numel(), reducible(red));
  if (why != Passthrough::kCompressed) {
    c10::intrusive_ptr<c10d::Work> work;
    if (needs_emulation(opts.reduceOp, output, traits)) {
      std::vector<at::Tensor> flat_inputs;
      for (const auto& in : inputs[0]) flat_inputs.push_back(in.reshape({-1}));
      at::Tensor flat = at::cat(flat_inputs);
      wait_for(reduce_scatter_tensor_exact(c, output, flat, opts));
      work = passed_through({}, output.device().type(), c, outputs);
    } else {
      work = passed_through(inner->reduce_scatter(outputs, inputs, opts), output.device().type(), c, outputs);
    }
    record_passthrough(c, why, bytes_of(output));
    return work;
  }
  std::vector<at::Tensor> user = inputs[0];
  user.push_back(output);
  return compressed_call(c, output.device(), opts.asyncOp, opts.timeout, with_factor(user, opts.reduceOp, red), outputs,
                         bytes_of(output), [&](auto&& algorithm) {
                           std::vector<at::Tensor> segments;
                           for (const auto& in : inputs[0]) segments.push_back(contiguous_or_self(in));
                           at::Tensor out = contiguous_or_self(output);
                           algorithm(CompressedArgs{{out}, segments, &*red});
                           write_back(output, out);
                         });
}

// Each pair is its own collective (compressed or passed through, as it would
// be alone), counted under this op's name. Every pair is checked before any
// is issued, so a bad one never leaves the earlier ones written.
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
  bool any = false;
  std::vector<Passthrough> whys;
  for (size_t i = 0; i < inputs.size(); ++i) {
    whys.push_back(passthrough(c, inputs[i], outputs[i].numel(), reducible(red)));
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
  const Passthrough why = passthrough(c, input, input.numel());
  if (why != Passthrough::kCompressed) {
    at::Tensor out = as_bytes_if_fp8(output);
    at::Tensor in = as_bytes_if_fp8(input);
    auto work = inner->_allgather_base(out, in, opts);
    record_passthrough(c, why, bytes_of(input));
    return passed_through(std::move(work), input.device().type(), c, {output});
  }
  check_dense(c.name, output);
  return compressed_call(c, input.device(), opts.asyncOp, opts.timeout, {input, output}, {output}, bytes_of(input),
                         [&](auto&& algorithm) {
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
  TORCH_CHECK(static_cast<int64_t>(outputs[0].size()) == size_, "fp8comm ", c.name, ": the output list has ",
              outputs[0].size(), " tensors but the group has ", size_, " ranks");
  for (const auto& out : outputs[0]) {
    check_same_device_and_dtype(c.name, input, out, "an output");
    check_writable(c.name, out, "an output");
    TORCH_CHECK(out.numel() == input.numel(), "fp8comm ", c.name, ": every output must have the input's ",
                input.numel(), " elements, got ", out.numel());
  }
  auto inner = inner_for(input.device(), c.name);
  const Passthrough why = passthrough(c, input, input.numel());
  if (why != Passthrough::kCompressed) {
    auto outs = as_bytes_if_fp8(outputs);
    auto ins = as_bytes_if_fp8(inputs);
    auto work = inner->allgather(outs, ins, opts);
    record_passthrough(c, why, bytes_of(input));
    return passed_through(std::move(work), input.device().type(), c, outputs[0]);
  }
  std::vector<at::Tensor> user = outputs[0];
  user.push_back(input);
  return compressed_call(c, input.device(), opts.asyncOp, opts.timeout, user, outputs[0], bytes_of(input),
                         [&](auto&& algorithm) {
                           std::vector<at::Tensor> outs;
                           for (const auto& out : outputs[0]) outs.push_back(contiguous_or_self(out));
                           algorithm(CompressedArgs{outs, {contiguous_or_self(input)}, nullptr});
                           for (size_t r = 0; r < outs.size(); ++r) write_back(outputs[0][r], outs[r]);
                         });
}

// As reduce_scatter_tensor_coalesced: one collective per pair, all checked first.
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

// ------------------------------------------------------------------ all_to_all
// Compressed only where Options.compress names all_to_all (compress="all"
// does not). Before any data moves the ranks gather every rank's slice sizes
// and check every pair, so sizes that disagree raise on every rank; the size
// rule (min_numel) then reads the group's mean input, the same on every rank.
template <typename Exact, typename Body>
c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::all_to_all_checked(const Collective& c, const at::Tensor& input,
                                                                   const std::vector<int64_t>& send_numels,
                                                                   const std::vector<int64_t>& recv_numels,
                                                                   const c10d::AllToAllOptions& opts,
                                                                   const std::vector<at::Tensor>& user_tensors,
                                                                   std::vector<at::Tensor> outputs, Exact&& exact,
                                                                   Body&& body) {
  // The size exchange and the call, one after the other on every rank.
  std::lock_guard<std::recursive_mutex> lock(call_mutex_);
  Transport t(inner_for(input.device(), c.name), traits_for(input.device().type()), rank_, size_, opts.timeout,
              c.name);
  const SplitTable table = gather_splits(t, send_numels, recv_numels, input.device());
  hold_inner_works(t.take_works(), input.device().type());
  check_splits(table, c.name);
  // The sizes' all_gather sends every peer the same bytes.
  const int64_t checked = t.bytes_sent();
  const int64_t intra = size_ > 1 ? checked * (ranks_on_my_node_ - 1) / (size_ - 1) : 0;
  const NodeBytes sent{intra, checked - intra};
  int64_t to_peers = 0;
  for (int64_t r = 0; r < size_; ++r) to_peers += r == rank_ ? 0 : send_numels[r];
  const int64_t payload = to_peers * input.element_size();
  const Passthrough why = passthrough(c, input, table.total_sent() / size_);
  if (why != Passthrough::kCompressed) {
    auto work = exact();
    record_passthrough(c, why, payload, sent);
    return passed_through(std::move(work), input.device().type(), c, std::move(outputs));
  }
  return compressed_call(c, input.device(), opts.asyncOp, opts.timeout, user_tensors, std::move(outputs), payload,
                         std::forward<Body>(body), sent);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                              std::vector<int64_t>& output_split_sizes,
                                                              std::vector<int64_t>& input_split_sizes,
                                                              const c10d::AllToAllOptions& opts) {
  const Collective& c = collectives::kAllToAllSingle;
  check_writable(c.name, output, "the output");
  auto exact = [&] {
    at::Tensor out = as_bytes_if_fp8(output);
    at::Tensor in = as_bytes_if_fp8(input);
    return inner_for(input.device(), c.name)->alltoall_base(out, in, output_split_sizes, input_split_sizes, opts);
  };
  const bool alike = input.device() == output.device() && input.scalar_type() == output.scalar_type() &&
                     output.layout() == at::kStrided;
  const Passthrough why = passthrough_but_size(c, input, alike ? Passthrough::kCompressed : Passthrough::kOutputUnlike);
  if (why != Passthrough::kCompressed) {
    auto work = exact();
    const int64_t own = input.dim() == 0 || input_split_sizes.empty()
                            ? bytes_of(input) / size_
                            : input_split_sizes.at(rank_) * (input.size(0) ? bytes_of(input) / input.size(0) : 0);
    record_passthrough(c, why, bytes_of(input) - own);
    return passed_through(std::move(work), input.device().type(), c, {output});
  }
  const auto send = slice_numels(input, input_split_sizes, size_, c.name, "input");
  const auto recv = slice_numels(output, output_split_sizes, size_, c.name, "output");
  return all_to_all_checked(c, input, send, recv, opts, {input, output}, {output}, exact, [&](auto&& algorithm) {
    at::Tensor out = contiguous_or_self(output);
    CompressedArgs args{{out}, {contiguous_or_self(input)}, nullptr};
    args.send_numels = send;
    args.recv_numels = recv;
    algorithm(args);
    write_back(output, out);
  });
}

// One tensor per rank each way: compressed as the single form over their
// concatenations, each output written once every phase is through.
c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions& opts) {
  const Collective& c = collectives::kAllToAll;
  check_writable(c.name, outputs, "an output");
  auto exact = [&] {
    auto outs = as_bytes_if_fp8(outputs);
    auto ins = as_bytes_if_fp8(inputs);
    return inner_for(inputs.at(0).device(), c.name)->alltoall(outs, ins, opts);
  };
  bool alike = static_cast<int64_t>(inputs.size()) == size_ && static_cast<int64_t>(outputs.size()) == size_;
  for (size_t i = 0; alike && i < inputs.size(); ++i) {
    for (const at::Tensor* t : {&inputs[i], &outputs[i]}) {
      alike = alike && t->device() == inputs[0].device() && t->scalar_type() == inputs[0].scalar_type() &&
              t->layout() == at::kStrided;
    }
  }
  const Passthrough why =
      passthrough_but_size(c, inputs.at(0), alike ? Passthrough::kCompressed : Passthrough::kOutputUnlike);
  if (why != Passthrough::kCompressed) {
    auto work = exact();
    record_passthrough(c, why,
                       bytes_of(inputs) - (static_cast<int64_t>(inputs.size()) == size_ ? bytes_of(inputs[rank_]) : 0));
    return passed_through(std::move(work), inputs.at(0).device().type(), c, outputs);
  }
  std::vector<int64_t> send, recv;
  for (int64_t r = 0; r < size_; ++r) {
    send.push_back(inputs[r].numel());
    recv.push_back(outputs[r].numel());
  }
  std::vector<at::Tensor> user = inputs;
  user.insert(user.end(), outputs.begin(), outputs.end());
  return all_to_all_checked(c, inputs[0], send, recv, opts, user, outputs, exact, [&](auto&& algorithm) {
    std::vector<at::Tensor> flat_inputs;
    for (const auto& in : inputs) flat_inputs.push_back(in.reshape({-1}));
    int64_t received = 0;
    for (int64_t n : recv) received += n;
    at::Tensor out = at::empty({received}, outputs[0].options().memory_format(at::MemoryFormat::Contiguous));
    CompressedArgs args{{out}, {at::cat(flat_inputs)}, nullptr};
    args.send_numels = send;
    args.recv_numels = recv;
    algorithm(args);
    int64_t offset = 0;
    for (int64_t r = 0; r < size_; ++r) {
      outputs[r].copy_(out.narrow(0, offset, recv[r]).view(outputs[r].sizes()));
      offset += recv[r];
    }
  });
}

}  // namespace fp8comm
