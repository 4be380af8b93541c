// ProcessGroupFP8: per call, compress or pass through (DESIGN.md, "Exact
// passthrough"). Arguments of compressed calls are checked here, on the calling
// rank, before anything is sent.
#include "process_group_fp8.h"

#include <torch/csrc/distributed/c10d/Types.hpp>

#include "../codec/codec_tensor.h"
#include "algorithm_parts.h"

namespace fp8comm {
namespace {

int64_t bytes_of(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

int64_t bytes_of(const std::vector<at::Tensor>& ts) {
  int64_t total = 0;
  for (const auto& t : ts) total += bytes_of(t);
  return total;
}

bool is_fp8(const at::Tensor& t) {
  const auto d = t.scalar_type();
  return d == at::kFloat8_e4m3fn || d == at::kFloat8_e5m2 || d == at::kFloat8_e4m3fnuz ||
         d == at::kFloat8_e5m2fnuz || d == at::kFloat8_e8m0fnu;
}

// Float8 tensors move as bytes: gloo has no float8 types, and nothing is reduced.
at::Tensor as_bytes_if_fp8(const at::Tensor& t) { return is_fp8(t) ? t.view(at::kByte) : t; }

std::vector<at::Tensor> as_bytes_if_fp8(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(as_bytes_if_fp8(t));
  return out;
}

std::vector<std::vector<at::Tensor>> as_bytes_if_fp8(const std::vector<std::vector<at::Tensor>>& tss) {
  std::vector<std::vector<at::Tensor>> out;
  out.reserve(tss.size());
  for (const auto& ts : tss) out.push_back(as_bytes_if_fp8(ts));
  return out;
}

void check_same_device_and_dtype(const char* op, const at::Tensor& ref, const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device() == ref.device(), "fp8comm ", op, ": ", name, " is on ", t.device(), " but the input is on ",
              ref.device(), "; put all tensors of one call on one device");
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), "fp8comm ", op, ": ", name, " has dtype ", t.scalar_type(),
              " but the input has dtype ", ref.scalar_type(), "; use one dtype for input and output");
}

// Float8 values cannot be summed on the wire (NCCL and gloo have no float8
// reductions); say so where the call enters instead of failing in the transport.
void check_not_fp8_reduction(const char* op, const at::Tensor& t) {
  TORCH_CHECK(!is_fp8(t), "fp8comm ", op, ": cannot reduce ", t.scalar_type(),
              " tensors; reduce in float32 / bfloat16 (fp8comm compresses those to FP8 on the wire itself)");
}

void check_dense(const char* op, const at::Tensor& t) {
  TORCH_CHECK(t.layout() == at::kStrided, "fp8comm ", op, ": expected a dense (strided) tensor, got layout ",
              t.layout());
}

at::Tensor contiguous_or_self(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

// Writes `result` back into the user's tensor when the algorithm worked on a copy.
void write_back(const at::Tensor& user, const at::Tensor& result) {
  if (!result.is_same(user)) user.copy_(result.view(user.sizes()));
}

}  // namespace

ProcessGroupFP8::ProcessGroupFP8(int rank, int size, FP8Options options)
    : c10d::Backend(rank, size), options_(options) {
  check_block_size(options_.block_size, "fp8comm.Options");
}

void ProcessGroupFP8::addTransport(c10::DeviceType device_type, c10::intrusive_ptr<c10d::Backend> inner) {
  TORCH_CHECK(inner, "fp8comm: the inner backend for ", device_type, " is null");
  TORCH_CHECK(inner->getRank() == rank_ && inner->getSize() == size_, "fp8comm: the inner ",
              inner->getBackendName(), " backend has rank ", inner->getRank(), " of ", inner->getSize(),
              " but this group has rank ", rank_, " of ", size_);
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(inner_.count(device_type) == 0, "fp8comm: this process group already has a transport for ",
              device_type);
  inner_[device_type] = std::move(inner);
}

bool ProcessGroupFP8::hasTransport(c10::DeviceType device_type) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return inner_.count(device_type) > 0;
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupFP8::transport(c10::DeviceType device_type) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = inner_.find(device_type);
  return it == inner_.end() ? c10::intrusive_ptr<c10d::Backend>() : it->second;
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupFP8::innerFor(const at::Device& device, const char* op) {
  auto inner = transport(device.type());
  TORCH_CHECK(inner, "fp8comm ", op, ": got ", device, " tensors, but this process group has no transport for ",
              device.type(), " (", getBackendName(), "); create it with e.g. \"cpu:fp8gloo,cuda:fp8nccl\"");
  // The group description and bound device reach us after creation, through
  // non-virtual setters; pass them on before the inner backend is used.
  if (inner->getGroupDesc() != getGroupDesc()) inner->setGroupDesc(getGroupDesc());
  if (getBoundDeviceId() && getBoundDeviceId()->type() == device.type() &&
      inner->getBoundDeviceId() != getBoundDeviceId()) {
    inner->setBoundDeviceId(getBoundDeviceId());
  }
  return inner;
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupFP8::defaultInner(const char* op) {
  if (hasTransport(c10::DeviceType::CUDA)) return innerFor(at::Device(c10::DeviceType::CUDA), op);
  return innerFor(at::Device(c10::DeviceType::CPU), op);
}

const std::string ProcessGroupFP8::getBackendName() const {
  return hasTransport(c10::DeviceType::CUDA) ? "fp8nccl" : "fp8gloo";
}

bool ProcessGroupFP8::compressible(const at::Tensor& t, int64_t per_rank_numel, bool op_enabled) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return op_enabled && coalescing_.empty() && t.layout() == at::kStrided && is_codec_dtype(t.scalar_type()) &&
         per_rank_numel > 0 && per_rank_numel >= options_.min_numel;
}

std::optional<ProcessGroupFP8::Reduction> ProcessGroupFP8::reductionFor(const c10d::ReduceOp& op,
                                                                        const at::Tensor& t) const {
  Reduction red;
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return red;
    case c10d::ReduceOp::AVG:
      red.post_div = size_;
      return red;
    case c10d::ReduceOp::PREMUL_SUM: {
      auto* supplement = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
      if (supplement == nullptr) return std::nullopt;
      if (supplement->tensor_factor.defined()) {
        TORCH_CHECK(supplement->tensor_factor.numel() == 1, "fp8comm: PREMUL_SUM factor must have one element");
        red.premul_tensor = supplement->tensor_factor.to(t.device(), at::kFloat).reshape({1}).contiguous();
      } else {
        red.premul = static_cast<float>(supplement->double_factor);
      }
      return red;
    }
    default:  // MIN, MAX, PRODUCT, bitwise: exact passthrough
      return std::nullopt;
  }
}

void ProcessGroupFP8::record(const char* op, bool compressed, int64_t bytes_sent, int64_t bytes_uncompressed) {
  stats_.record(op, compressed, bytes_sent, bytes_uncompressed);
}

bool ProcessGroupFP8::transportLacksAvgAndPremul(const at::Device& device) const {
  auto inner = transport(device.type());
  return inner && inner->getBackendName() == "gloo";
}

// ------------------------------------------------------------------ all_reduce
c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  const char* op = "all_reduce";
  TORCH_CHECK(tensors.size() == 1, "fp8comm ", op, ": expected one tensor per call, got ", tensors.size());
  at::Tensor tensor = tensors[0];
  check_not_fp8_reduction(op, tensor);
  auto inner = innerFor(tensor.device(), op);
  const int64_t P = size_;
  const int64_t plain = 2 * (P - 1) * bytes_of(tensor) / P;
  auto red = reductionFor(opts.reduceOp, tensor);
  if (!red || !compressible(tensor, tensor.numel(), options_.compress_allreduce)) {
    record(op, false, plain, plain);
    return allreducePassthrough(tensors, opts);
  }
  const int64_t m = ceil_div(ceil_div(tensor.numel(), P), options_.block_size) * options_.block_size;
  record(op, true, 2 * (P - 1) * segment_bytes(m, options_.block_size), plain);
  return run(c10d::OpType::ALLREDUCE, tensor.device(), opts.asyncOp, {tensor}, {tensor}, [&] {
    Transport transport(inner, opts.timeout, op);
    at::Tensor work = contiguous_or_self(tensor);
    allreduceCompressed(transport, work, *red);
    write_back(tensor, work);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::allreducePassthrough(std::vector<at::Tensor>& tensors,
                                                                     const c10d::AllreduceOptions& opts) {
  auto inner = innerFor(tensors[0].device(), "all_reduce");
  const auto kind = opts.reduceOp.op_;
  const bool emulate = (kind == c10d::ReduceOp::AVG || kind == c10d::ReduceOp::PREMUL_SUM) &&
                       tensors[0].is_floating_point() && transportLacksAvgAndPremul(tensors[0].device());
  if (!emulate) return inner->allreduce(tensors, opts);
  // gloo has no AVG / PREMUL_SUM: scale locally around an exact SUM.
  auto red = reductionFor(opts.reduceOp, tensors[0]);
  TORCH_CHECK(red, "fp8comm all_reduce: PREMUL_SUM without a factor");
  at::Tensor& t = tensors[0];
  if (red->premul_tensor) {
    t.mul_(red->premul_tensor->to(t.scalar_type()));
  } else if (kind == c10d::ReduceOp::PREMUL_SUM) {
    t.mul_(red->premul);
  }
  c10d::AllreduceOptions sum = opts;
  sum.reduceOp = c10d::ReduceOp::SUM;
  inner->allreduce(tensors, sum)->wait();
  if (kind == c10d::ReduceOp::AVG) t.div_(size_);
  return c10::make_intrusive<FP8Work>(rank_, c10d::OpType::ALLREDUCE, tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                    const c10d::AllreduceCoalescedOptions& opts) {
  const char* op = "all_reduce_coalesced";
  TORCH_CHECK(!tensors.empty(), "fp8comm ", op, ": got no tensors");
  auto inner = innerFor(tensors[0].device(), op);
  const int64_t P = size_;
  const int64_t plain = 2 * (P - 1) * bytes_of(tensors) / P;
  int64_t total = 0;
  bool same_dtype = true;
  for (const auto& t : tensors) {
    check_dense(op, t);
    TORCH_CHECK(t.device() == tensors[0].device(), "fp8comm ", op, ": tensors on ", tensors[0].device(), " and ",
                t.device(), "; put all tensors of one call on one device");
    same_dtype = same_dtype && t.scalar_type() == tensors[0].scalar_type();
    total += t.numel();
  }
  auto red = reductionFor(opts.reduceOp, tensors[0]);
  const bool compress = red && same_dtype && compressible(tensors[0], total, options_.compress_allreduce);
  if (!compress) {
    record(op, false, plain, plain);
    const auto kind = opts.reduceOp.op_;
    if ((kind == c10d::ReduceOp::AVG || kind == c10d::ReduceOp::PREMUL_SUM) &&
        transportLacksAvgAndPremul(tensors[0].device())) {
      for (auto& t : tensors) {
        std::vector<at::Tensor> one{t};
        allreducePassthrough(one, opts)->wait();
      }
      return c10::make_intrusive<FP8Work>(rank_, c10d::OpType::ALLREDUCE_COALESCED, tensors);
    }
    return inner->allreduce_coalesced(tensors, opts);
  }
  const int64_t m = ceil_div(ceil_div(total, P), options_.block_size) * options_.block_size;
  record(op, true, 2 * (P - 1) * segment_bytes(m, options_.block_size), plain);
  // One compressed all_reduce of the concatenation, like a DDP bucket.
  return run(c10d::OpType::ALLREDUCE_COALESCED, tensors[0].device(), opts.asyncOp, tensors, tensors, [&] {
    Transport transport(inner, opts.timeout, op);
    std::vector<at::Tensor> flat_views;
    for (const auto& t : tensors) flat_views.push_back(t.reshape({-1}));
    at::Tensor flat = at::cat(flat_views);
    allreduceCompressed(transport, flat, *red);
    int64_t offset = 0;
    for (auto& t : tensors) {
      t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  });
}

// -------------------------------------------------------------- reduce_scatter
c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::reduceScatterBasePassthrough(at::Tensor& output, at::Tensor& input,
                                                                            const c10d::ReduceScatterOptions& opts) {
  auto inner = innerFor(input.device(), "reduce_scatter");
  const auto kind = opts.reduceOp.op_;
  const bool emulate = (kind == c10d::ReduceOp::AVG || kind == c10d::ReduceOp::PREMUL_SUM) &&
                       input.is_floating_point() && transportLacksAvgAndPremul(input.device());
  if (!emulate) return inner->_reduce_scatter_base(output, input, opts);
  auto red = reductionFor(opts.reduceOp, input);
  TORCH_CHECK(red, "fp8comm reduce_scatter: PREMUL_SUM without a factor");
  at::Tensor scaled = input;
  if (red->premul_tensor) {
    scaled = input * red->premul_tensor->to(input.scalar_type());
  } else if (kind == c10d::ReduceOp::PREMUL_SUM) {
    scaled = input * red->premul;
  }
  c10d::ReduceScatterOptions sum = opts;
  sum.reduceOp = c10d::ReduceOp::SUM;
  inner->_reduce_scatter_base(output, scaled, sum)->wait();
  if (kind == c10d::ReduceOp::AVG) output.div_(size_);
  return c10::make_intrusive<FP8Work>(rank_, c10d::OpType::_REDUCE_SCATTER_BASE, std::vector<at::Tensor>{output});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                     const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter_tensor";
  check_same_device_and_dtype(op, input, output, "output");
  check_not_fp8_reduction(op, input);
  TORCH_CHECK(input.numel() == size_ * output.numel(), "fp8comm ", op, ": input has ", input.numel(),
              " elements but must have group size (", size_, ") x output numel (", output.numel(), ") = ",
              size_ * output.numel());
  auto inner = innerFor(input.device(), op);
  const int64_t P = size_;
  const int64_t plain = (P - 1) * bytes_of(output);
  auto red = reductionFor(opts.reduceOp, input);
  if (!red || !compressible(input, output.numel(), options_.compress_reduce_scatter)) {
    record(op, false, plain, plain);
    return reduceScatterBasePassthrough(output, input, opts);
  }
  check_dense(op, output);
  record(op, true, (P - 1) * segment_bytes(output.numel(), options_.block_size), plain);
  return run(c10d::OpType::_REDUCE_SCATTER_BASE, input.device(), opts.asyncOp, {input, output}, {output}, [&] {
    Transport transport(inner, opts.timeout, op);
    at::Tensor out = contiguous_or_self(output);
    reduceScatterCompressed(transport, out, {contiguous_or_self(input)}, *red);
    write_back(output, out);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                               std::vector<std::vector<at::Tensor>>& inputs,
                                                               const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter";
  TORCH_CHECK(outputs.size() == 1 && inputs.size() == 1, "fp8comm ", op,
              ": expected one output and one input list per call, got ", outputs.size(), " and ", inputs.size());
  at::Tensor& output = outputs[0];
  TORCH_CHECK(static_cast<int64_t>(inputs[0].size()) == size_, "fp8comm ", op, ": the input list has ",
              inputs[0].size(), " tensors but the group has ", size_, " ranks");
  for (const auto& in : inputs[0]) {
    check_same_device_and_dtype(op, output, in, "an input");
    TORCH_CHECK(in.numel() == output.numel(), "fp8comm ", op, ": every input must have the output's ",
                output.numel(), " elements, got ", in.numel());
  }
  auto inner = innerFor(output.device(), op);
  const int64_t P = size_;
  const int64_t plain = (P - 1) * bytes_of(output);
  auto red = reductionFor(opts.reduceOp, output);
  if (!red || !compressible(output, output.numel(), options_.compress_reduce_scatter)) {
    record(op, false, plain, plain);
    if ((opts.reduceOp.op_ == c10d::ReduceOp::AVG || opts.reduceOp.op_ == c10d::ReduceOp::PREMUL_SUM) &&
        output.is_floating_point() && transportLacksAvgAndPremul(output.device())) {
      at::Tensor flat = at::cat(inputs[0]);
      at::Tensor out = contiguous_or_self(output);
      reduceScatterBasePassthrough(out, flat, opts)->wait();
      write_back(output, out);
      return c10::make_intrusive<FP8Work>(rank_, c10d::OpType::REDUCE_SCATTER, outputs);
    }
    return inner->reduce_scatter(outputs, inputs, opts);
  }
  record(op, true, (P - 1) * segment_bytes(output.numel(), options_.block_size), plain);
  std::vector<at::Tensor> user = inputs[0];
  user.push_back(output);
  return run(c10d::OpType::REDUCE_SCATTER, output.device(), opts.asyncOp, user, outputs, [&] {
    Transport transport(inner, opts.timeout, op);
    std::vector<at::Tensor> segments;
    for (const auto& in : inputs[0]) segments.push_back(contiguous_or_self(in));
    at::Tensor out = contiguous_or_self(output);
    reduceScatterCompressed(transport, out, segments, *red);
    write_back(output, out);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter_tensor_coalesced";
  TORCH_CHECK(!inputs.empty() && outputs.size() == inputs.size(), "fp8comm ", op, ": got ", outputs.size(),
              " outputs for ", inputs.size(), " inputs");
  auto inner = innerFor(inputs[0].device(), op);
  auto red = reductionFor(opts.reduceOp, inputs[0]);
  bool any = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_same_device_and_dtype(op, inputs[i], outputs[i], "an output");
    TORCH_CHECK(inputs[i].device() == inputs[0].device(), "fp8comm ", op, ": tensors on several devices");
    TORCH_CHECK(inputs[i].numel() == size_ * outputs[i].numel(), "fp8comm ", op, ": input ", i, " has ",
                inputs[i].numel(), " elements but must have ", size_, " x ", outputs[i].numel());
    any = any || (red && compressible(inputs[i], outputs[i].numel(), options_.compress_reduce_scatter));
  }
  const auto kind = opts.reduceOp.op_;
  const bool emulate = (kind == c10d::ReduceOp::AVG || kind == c10d::ReduceOp::PREMUL_SUM) &&
                       transportLacksAvgAndPremul(inputs[0].device());
  if (!any && !emulate) {
    const int64_t plain = (size_ - 1) * bytes_of(outputs);
    record(op, false, plain, plain);
    return inner->reduce_scatter_tensor_coalesced(outputs, inputs, opts);
  }
  std::vector<at::Tensor> user = inputs;
  user.insert(user.end(), outputs.begin(), outputs.end());
  c10d::ReduceScatterOptions one = opts;
  one.asyncOp = false;  // each step runs on this call's stream
  return run(c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED, inputs[0].device(), opts.asyncOp, user, outputs, [&] {
    for (size_t i = 0; i < inputs.size(); ++i) _reduce_scatter_base(outputs[i], inputs[i], one)->wait();
  });
}

// ------------------------------------------------------------------ all_gather
c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                const c10d::AllgatherOptions& opts) {
  const char* op = "all_gather_into_tensor";
  check_same_device_and_dtype(op, input, output, "output");
  TORCH_CHECK(output.numel() == size_ * input.numel(), "fp8comm ", op, ": output has ", output.numel(),
              " elements but must have group size (", size_, ") x input numel (", input.numel(), ") = ",
              size_ * input.numel());
  auto inner = innerFor(input.device(), op);
  const int64_t P = size_;
  const int64_t plain = (P - 1) * bytes_of(input);
  if (!compressible(input, input.numel(), options_.compress_allgather)) {
    record(op, false, plain, plain);
    at::Tensor out = as_bytes_if_fp8(output);
    at::Tensor in = as_bytes_if_fp8(input);
    return inner->_allgather_base(out, in, opts);
  }
  check_dense(op, output);
  record(op, true, (P - 1) * segment_bytes(input.numel(), options_.block_size), plain);
  return run(c10d::OpType::_ALLGATHER_BASE, input.device(), opts.asyncOp, {input, output}, {output}, [&] {
    Transport transport(inner, opts.timeout, op);
    at::Tensor out = contiguous_or_self(output);
    allgatherCompressed(transport, {out}, contiguous_or_self(input));
    write_back(output, out);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllgatherOptions& opts) {
  const char* op = "all_gather";
  TORCH_CHECK(outputs.size() == 1 && inputs.size() == 1, "fp8comm ", op,
              ": expected one input and one output list per call, got ", inputs.size(), " and ", outputs.size());
  at::Tensor& input = inputs[0];
  TORCH_CHECK(static_cast<int64_t>(outputs[0].size()) == size_, "fp8comm ", op, ": the output list has ",
              outputs[0].size(), " tensors but the group has ", size_, " ranks");
  for (const auto& out : outputs[0]) {
    check_same_device_and_dtype(op, input, out, "an output");
    TORCH_CHECK(out.numel() == input.numel(), "fp8comm ", op, ": every output must have the input's ",
                input.numel(), " elements, got ", out.numel());
  }
  auto inner = innerFor(input.device(), op);
  const int64_t P = size_;
  const int64_t plain = (P - 1) * bytes_of(input);
  if (!compressible(input, input.numel(), options_.compress_allgather)) {
    record(op, false, plain, plain);
    auto outs = as_bytes_if_fp8(outputs);
    auto ins = as_bytes_if_fp8(inputs);
    return inner->allgather(outs, ins, opts);
  }
  record(op, true, (P - 1) * segment_bytes(input.numel(), options_.block_size), plain);
  std::vector<at::Tensor> user = outputs[0];
  user.push_back(input);
  return run(c10d::OpType::ALLGATHER, input.device(), opts.asyncOp, user, outputs[0], [&] {
    Transport transport(inner, opts.timeout, op);
    std::vector<at::Tensor> outs;
    for (const auto& out : outputs[0]) outs.push_back(contiguous_or_self(out));
    allgatherCompressed(transport, outs, contiguous_or_self(input));
    for (size_t r = 0; r < outs.size(); ++r) write_back(outputs[0][r], outs[r]);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                std::vector<at::Tensor>& inputs,
                                                                                const c10d::AllgatherOptions& opts) {
  const char* op = "all_gather_into_tensor_coalesced";
  TORCH_CHECK(!inputs.empty() && outputs.size() == inputs.size(), "fp8comm ", op, ": got ", outputs.size(),
              " outputs for ", inputs.size(), " inputs");
  auto inner = innerFor(inputs[0].device(), op);
  bool any = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_same_device_and_dtype(op, inputs[i], outputs[i], "an output");
    TORCH_CHECK(inputs[i].device() == inputs[0].device(), "fp8comm ", op, ": tensors on several devices");
    TORCH_CHECK(outputs[i].numel() == size_ * inputs[i].numel(), "fp8comm ", op, ": output ", i, " has ",
                outputs[i].numel(), " elements but must have ", size_, " x ", inputs[i].numel());
    any = any || compressible(inputs[i], inputs[i].numel(), options_.compress_allgather);
  }
  if (!any) {
    const int64_t plain = (size_ - 1) * bytes_of(inputs);
    record(op, false, plain, plain);
    auto outs = as_bytes_if_fp8(outputs);
    auto ins = as_bytes_if_fp8(inputs);
    return inner->allgather_into_tensor_coalesced(outs, ins, opts);
  }
  std::vector<at::Tensor> user = inputs;
  user.insert(user.end(), outputs.begin(), outputs.end());
  c10d::AllgatherOptions one = opts;
  one.asyncOp = false;
  return run(c10d::OpType::ALLGATHER_COALESCED, inputs[0].device(), opts.asyncOp, user, outputs, [&] {
    for (size_t i = 0; i < inputs.size(); ++i) _allgather_base(outputs[i], inputs[i], one)->wait();
  });
}

// ------------------------------------------------------------ exact passthrough
c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  record("broadcast", false, 0, 0);
  auto ts = as_bytes_if_fp8(tensors);
  return innerFor(tensors.at(0).device(), "broadcast")->broadcast(ts, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& opts) {
  record("reduce", false, 0, 0);
  return innerFor(tensors.at(0).device(), "reduce")->reduce(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                    std::vector<at::Tensor>& inputs,
                                                                    const c10d::AllgatherOptions& opts) {
  const int64_t plain = (size_ - 1) * bytes_of(inputs);
  record("all_gather_coalesced", false, plain, plain);
  auto outs = as_bytes_if_fp8(outputs);
  auto ins = as_bytes_if_fp8(inputs);
  return innerFor(inputs.at(0).device(), "all_gather_coalesced")->allgather_coalesced(outs, ins, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::GatherOptions& opts) {
  record("gather", false, 0, 0);
  auto outs = as_bytes_if_fp8(outputs);
  auto ins = as_bytes_if_fp8(inputs);
  return innerFor(inputs.at(0).device(), "gather")->gather(outs, ins, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::scatter(std::vector<at::Tensor>& outputs,
                                                        std::vector<std::vector<at::Tensor>>& inputs,
                                                        const c10d::ScatterOptions& opts) {
  record("scatter", false, 0, 0);
  auto outs = as_bytes_if_fp8(outputs);
  auto ins = as_bytes_if_fp8(inputs);
  return innerFor(outputs.at(0).device(), "scatter")->scatter(outs, ins, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                              std::vector<int64_t>& output_split_sizes,
                                                              std::vector<int64_t>& input_split_sizes,
                                                              const c10d::AllToAllOptions& opts) {
  const int64_t plain = (size_ - 1) * bytes_of(input) / size_;
  record("all_to_all", false, plain, plain);
  at::Tensor out = as_bytes_if_fp8(output);
  at::Tensor in = as_bytes_if_fp8(input);
  return innerFor(input.device(), "all_to_all")->alltoall_base(out, in, output_split_sizes, input_split_sizes, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions& opts) {
  const int64_t plain = (size_ - 1) * bytes_of(inputs) / size_;
  record("all_to_all", false, plain, plain);
  auto outs = as_bytes_if_fp8(outputs);
  auto ins = as_bytes_if_fp8(inputs);
  return innerFor(inputs.at(0).device(), "all_to_all")->alltoall(outs, ins, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  record("send", false, bytes_of(tensors), bytes_of(tensors));
  auto ts = as_bytes_if_fp8(tensors);
  return innerFor(tensors.at(0).device(), "send")->send(ts, dst_rank, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  record("recv", false, 0, 0);
  auto ts = as_bytes_if_fp8(tensors);
  return innerFor(tensors.at(0).device(), "recv")->recv(ts, src_rank, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  record("recv", false, 0, 0);
  auto ts = as_bytes_if_fp8(tensors);
  return innerFor(tensors.at(0).device(), "recv")->recvAnysource(ts, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::barrier(const c10d::BarrierOptions& opts) {
  record("barrier", false, 0, 0);
  if (opts.device) return innerFor(*opts.device, "barrier")->barrier(opts);
  return defaultInner("barrier")->barrier(opts);
}

void ProcessGroupFP8::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  innerFor(at::Device(c10::DeviceType::CPU), "monitored_barrier")->monitoredBarrier(opts, wait_all_ranks);
}

// --------------------------------------------------------- group-level calls
bool ProcessGroupFP8::supportsCoalescing() const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [device, inner] : inner_) {
    if (inner->supportsCoalescing()) return true;
  }
  return false;
}

// Inside a coalescing block the inner backend defers its ops until
// endCoalescing (NCCL groups them), so the multi-step compressed algorithms
// cannot run: collectives issued there pass through exactly.
void ProcessGroupFP8::startCoalescing() {
  std::vector<c10::intrusive_ptr<c10d::Backend>> started;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [device, inner] : inner_) {
      if (inner->supportsCoalescing()) started.push_back(inner);
    }
  }
  TORCH_CHECK(!started.empty(), "Backend ", getBackendName(), " does not implement startCoalescing");
  for (auto& inner : started) inner->startCoalescing();
  std::lock_guard<std::mutex> lock(mutex_);
  coalescing_ = std::move(started);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::endCoalescing() {
  std::vector<c10::intrusive_ptr<c10d::Backend>> started;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    started.swap(coalescing_);
  }
  TORCH_CHECK(!started.empty(), "fp8comm: endCoalescing without startCoalescing");
  c10::intrusive_ptr<c10d::Work> last;
  for (auto& inner : started) {
    auto work = inner->endCoalescing();
    if (!work) continue;
    if (last) last->wait();
    last = work;
  }
  if (!last) last = c10::make_intrusive<FP8Work>(rank_, c10d::OpType::COALESCED, std::vector<at::Tensor>{});
  return last;
}

void ProcessGroupFP8::setTimeout(std::chrono::milliseconds timeout) {
  for (auto device : {c10::DeviceType::CPU, c10::DeviceType::CUDA}) {
    if (auto inner = transport(device)) inner->setTimeout(timeout);
  }
}

void ProcessGroupFP8::abort() {
  for (auto device : {c10::DeviceType::CPU, c10::DeviceType::CUDA}) {
    if (auto inner = transport(device)) inner->abort();
  }
}

void ProcessGroupFP8::shutdown() {
  for (auto device : {c10::DeviceType::CPU, c10::DeviceType::CUDA}) {
    if (auto inner = transport(device)) inner->shutdown();
  }
}

void ProcessGroupFP8::setGroupUid(const std::string& pg_uid) {
  c10d::Backend::setGroupUid(pg_uid);
  for (auto device : {c10::DeviceType::CPU, c10::DeviceType::CUDA}) {
    if (auto inner = transport(device)) inner->setGroupUid(pg_uid);
  }
}

void ProcessGroupFP8::eagerConnectSingleDevice(at::Device device) {
  if (auto inner = transport(device.type())) {
    if (getBoundDeviceId()) inner->setBoundDeviceId(getBoundDeviceId());
    inner->eagerConnectSingleDevice(device);
  }
}

void ProcessGroupFP8::setSequenceNumberForGroup() {
  for (auto device : {c10::DeviceType::CPU, c10::DeviceType::CUDA}) {
    if (auto inner = transport(device)) inner->setSequenceNumberForGroup();
  }
}

uint64_t ProcessGroupFP8::getSequenceNumberForGroup() {
  return defaultInner("get_sequence_number")->getSequenceNumberForGroup();
}

}  // namespace fp8comm
