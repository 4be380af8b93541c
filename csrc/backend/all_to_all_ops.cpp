// all_to_all's entry points, compressed only where Options.compress names
// all_to_all (compress="all" does not): as compressible_ops.cpp's, with the
// algorithm's prepare step (all_to_all.cpp) checking every rank's split
// sizes before the call is decided.
#include <numeric>

#include "../algorithms/all_to_all_splits.h"
#include "arguments.h"
#include "process_group_fp8.h"
#include "run_compressed.h"

namespace fp8comm {

c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                              std::vector<int64_t>& output_split_sizes,
                                                              std::vector<int64_t>& input_split_sizes,
                                                              const c10d::AllToAllOptions& opts) {
  const Collective& c = collectives::kAllToAllSingle;
  check_writable(c.name, output, "the output");
  const bool alike = input.device() == output.device() && input.scalar_type() == output.scalar_type() &&
                     output.layout() == at::kStrided;
  const CallSpec spec{input, 0, alike ? Passthrough::kCompressed : Passthrough::kOutputUnlike,
                      {bytes_of(input), own_slice_bytes(input, input_split_sizes, rank_, size_)}, opts.asyncOp,
                      opts.timeout, {input, output}, {output}};
  auto exact = [&] {
    at::Tensor out = as_bytes_if_fp8(output);
    at::Tensor in = as_bytes_if_fp8(input);
    return inner_for(input.device(), c.name)->alltoall_base(out, in, output_split_sizes, input_split_sizes, opts);
  };
  CompressedArgs shape;
  auto sizes = [&] {
    shape.send_numels = slice_numels(input, input_split_sizes, size_, c.name, "input");
    shape.recv_numels = slice_numels(output, output_split_sizes, size_, c.name, "output");
    return shape;
  };
  auto body = [&](auto&& algorithm) {
    at::Tensor out = contiguous_or_self(output);
    CompressedArgs args = shape;
    args.outputs = {out};
    args.inputs = {contiguous_or_self(input)};
    algorithm(args);
    write_back(output, out);
  };
  return call(c, spec, exact, body, sizes);
}

// One tensor per rank each way: compressed as the single form over their
// concatenations, each output written once every phase is through.
c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions& opts) {
  const Collective& c = collectives::kAllToAll;
  check_writable(c.name, outputs, "an output");
  const bool alike = all_to_all_lists_alike(inputs, outputs, size_);
  const Payload payload{bytes_of(inputs), static_cast<int64_t>(inputs.size()) == size_ ? bytes_of(inputs[rank_]) : 0};
  std::vector<at::Tensor> user = inputs;
  user.insert(user.end(), outputs.begin(), outputs.end());
  const CallSpec spec{inputs.at(0), 0, alike ? Passthrough::kCompressed : Passthrough::kOutputUnlike, payload,
                      opts.asyncOp, opts.timeout, user, outputs};
  auto exact = [&] {
    auto outs = as_bytes_if_fp8(outputs);
    auto ins = as_bytes_if_fp8(inputs);
    return inner_for(inputs.at(0).device(), c.name)->alltoall(outs, ins, opts);
  };
  CompressedArgs shape;
  auto sizes = [&] {
    for (int64_t r = 0; r < size_; ++r) {
      shape.send_numels.push_back(inputs[r].numel());
      shape.recv_numels.push_back(outputs[r].numel());
    }
    return shape;
  };
  auto body = [&](auto&& algorithm) {
    std::vector<at::Tensor> flat_inputs;
    for (const auto& in : inputs) flat_inputs.push_back(in.reshape({-1}));
    const int64_t received = std::accumulate(shape.recv_numels.begin(), shape.recv_numels.end(), int64_t{0});
    at::Tensor out = at::empty({received}, outputs[0].options().memory_format(at::MemoryFormat::Contiguous));
    CompressedArgs args = shape;
    args.outputs = {out};
    args.inputs = {at::cat(flat_inputs)};
    algorithm(args);
    int64_t offset = 0;
    for (int64_t r = 0; r < size_; ++r) {
      outputs[r].copy_(out.narrow(0, offset, shape.recv_numels[r]).view(outputs[r].sizes()));
      offset += shape.recv_numels[r];
    }
  };
  return call(c, spec, exact, body, sizes);
}

}  // namespace fp8comm
