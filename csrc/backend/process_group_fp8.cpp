// ProcessGroupFP8: per call, compress or pass through (DESIGN.md, "Exact
// passthrough"). Arguments of compressed calls are checked here, on the calling
// rank, before anything is sent.
#include "process_group_fp8.h"

#include <ATen/MemoryOverlap.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "../codec/codec_tensor.h"
#include "algorithm_parts.h"
#include "premul.h"

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

void check_same_device_and_dtype(const char* op, const at::Tensor& ref, const at::Tensor& t, const char* name,
                                 const char* ref_name = "the input") {
  TORCH_CHECK(t.device() == ref.device(), "fp8comm ", op, ": ", name, " is on ", t.device(), " but ", ref_name,
              " is on ", ref.device(), "; put all tensors of one call on one device");
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), "fp8comm ", op, ": ", name, " has dtype ", t.scalar_type(),
              " but ", ref_name, " has dtype ", ref.scalar_type(), "; use one dtype for input and output");
}

// Float8 values cannot be summed on the wire (NCCL and gloo have no float8
// reductions); say so where the call enters instead of failing in the transport.
void check_not_fp8_reduction(const char* op, const at::Tensor& t) {
  TORCH_CHECK(!is_fp8(t), "fp8comm ", op, ": cannot reduce ", t.scalar_type(),
              " tensors; reduce in float32 / bfloat16 (fp8comm compresses those to FP8 on the wire itself)");
}

void check_not_fp8_reduction(const char* op, const std::vector<at::Tensor>& ts) {
  for (const auto& t : ts) check_not_fp8_reduction(op, t);
}

// A dense tensor the call writes into must not have elements that share memory
// (an expand()ed tensor): plain gloo crashes the process on those; refuse them
// here. (Sparse tensors, which gloo all-reduces, are not strided: not checked.)
void check_writable(const char* op, const at::Tensor& t, const char* name) {
  TORCH_CHECK(!t.defined() || t.layout() != at::kStrided || at::has_internal_overlap(t) != at::MemOverlap::Yes,
              "fp8comm ", op, ": ", name,
              " has elements that share memory (e.g. made by expand()), so the call cannot write into it; "
              "pass a tensor with its own storage (clone() it)");
}

void check_writable(const char* op, const std::vector<at::Tensor>& ts, const char* name) {
  for (const auto& t : ts) check_writable(op, t, name);
}

void check_writable(const char* op, const std::vector<std::vector<at::Tensor>>& tss, const char* name) {
  for (const auto& ts : tss) check_writable(op, ts, name);
}

bool avg_or_premul(const c10d::ReduceOp& op) {
  return op.op_ == c10d::ReduceOp::AVG || op.op_ == c10d::ReduceOp::PREMUL_SUM;
}

// AVG / PREMUL_SUM are emulated around an exact SUM for floating-point and
// complex tensors when the transport (gloo) lacks them.
bool emulable(const at::Tensor& t) { return t.is_floating_point() || t.is_complex(); }

void check_dense(const char* op, const at::Tensor& t) {
  TORCH_CHECK(t.layout() == at::kStrided, "fp8comm ", op, ": expected a dense (strided) tensor, got layout ",
              t.layout());
}

at::Tensor contiguous_or_self(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

// Waits for a Work an inner backend returned. None means the call was
// synchronous (ProcessGroupNCCL with asyncOp false) and is already ordered.
void wait_for(const c10::intrusive_ptr<c10d::Work>& work) {
  if (work) work->wait();
}

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
  traits_[device_type] = TransportTraits::of(*inner, device_type);
  inner_[device_type] = std::move(inner);
}

TransportTraits ProcessGroupFP8::traitsFor(c10::DeviceType device_type) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = traits_.find(device_type);
  TORCH_CHECK(it != traits_.end(), "fp8comm: this process group has no transport for ", device_type);
  return it->second;
}

// A Work for the caller: `work` as the inner backend returned it, or, where
// it returned none (a synchronous call, already ordered), a completed one.
c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::passed(c10::intrusive_ptr<c10d::Work> work, c10d::OpType type,
                                                       const char* op, std::vector<at::Tensor> outputs) const {
  if (work) return work;
  return c10::make_intrusive<FP8Work>(rank_, type, op, std::move(outputs));
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
      const auto* supplement = premul_supplement(op);
      if (supplement == nullptr) return std::nullopt;
      const at::Tensor& factor = supplement->tensor_factor;
      if (factor.defined()) {
        TORCH_CHECK(factor.numel() == 1, "fp8comm: PREMUL_SUM factor must have one element, got ", factor.numel());
        if (factor.is_cpu()) {
          // Read on the host: copying it to a device would sync the host with it.
          red.premul = factor.to(at::kFloat).item<float>();
          return red;
        }
        // Read by the algorithm on its stream, after this call returns on
        // CUDA: withFactor() hands it to the Work, which keeps it alive and
        // marks it in use by that stream.
        red.premul_tensor = factor.to(t.device(), at::kFloat).reshape({1}).contiguous();
      } else {
        red.premul = static_cast<float>(supplement->double_factor);  // the compressed path scales in FP32
      }
      return red;
    }
    default:  // MIN, MAX, PRODUCT, bitwise: exact passthrough
      return std::nullopt;
  }
}

std::vector<at::Tensor> ProcessGroupFP8::withFactor(std::vector<at::Tensor> tensors, const c10d::ReduceOp& op,
                                                    const std::optional<Reduction>& red) {
  if (red && red->premul_tensor) tensors.push_back(*red->premul_tensor);
  const auto* supplement = premul_supplement(op);
  if (supplement != nullptr && supplement->tensor_factor.defined() && !tensors.empty() &&
      supplement->tensor_factor.device() == tensors[0].device()) {
    tensors.push_back(supplement->tensor_factor);  // the user's factor, read on the stream in coalesced calls
  }
  return tensors;
}

void ProcessGroupFP8::record(const char* op, bool compressed, int64_t bytes_sent, int64_t bytes_uncompressed) {
  stats_.record(op, compressed, bytes_sent, bytes_uncompressed);
}

bool ProcessGroupFP8::transportLacksAvgAndPremul(const at::Device& device) const {
  return hasTransport(device.type()) && !traitsFor(device.type()).reduces_avg_and_premul;
}

void ProcessGroupFP8::checkReduceOpSupported(const char* op, const c10d::ReduceOp& reduce_op,
                                             const at::Tensor& t) const {
  if (!avg_or_premul(reduce_op) || emulable(t) || !transportLacksAvgAndPremul(t.device())) return;
  TORCH_CHECK(false, "fp8comm ", op, ": ", reduce_op.op_ == c10d::ReduceOp::AVG ? "AVG" : "PREMUL_SUM", " of ",
              t.scalar_type(), " tensors: the gloo transport has neither AVG nor PREMUL_SUM, and fp8comm "
              "emulates them only for floating-point and complex tensors (sum, then divide yourself)");
}

// Stats are recorded after a call has been issued (enqueued on CUDA, done on
// the CPU): calls refused by a check, here or in the inner backend, and CPU
// calls that fail in the transport are not counted.

// ------------------------------------------------------------------ all_reduce
c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  const char* op = "all_reduce";
  TORCH_CHECK(tensors.size() == 1, "fp8comm ", op, ": expected one tensor per call, got ", tensors.size());
  at::Tensor tensor = tensors[0];
  check_not_fp8_reduction(op, tensor);
  check_writable(op, tensor, "the tensor");
  auto inner = innerFor(tensor.device(), op);
  checkReduceOpSupported(op, opts.reduceOp, tensor);
  const int64_t P = size_;
  const int64_t plain = 2 * (P - 1) * bytes_of(tensor) / P;
  auto red = reductionFor(opts.reduceOp, tensor);
  if (!red || !compressible(tensor, tensor.numel(), options_.compress_allreduce)) {
    auto work = allreducePassthrough(tensors, opts);
    record(op, false, plain, plain);
    return work;
  }
  auto work = run(c10d::OpType::ALLREDUCE, op, tensor.device(), opts.asyncOp, opts.timeout,
                  withFactor({tensor}, opts.reduceOp, red), {tensor}, [&](Transport& transport) {
                    at::Tensor buffer = contiguous_or_self(tensor);
                    allreduceCompressed(transport, buffer, *red, op);
                    write_back(tensor, buffer);
                  });
  record(op, true, allreduceWireBytes(tensor, tensor.numel()), plain);
  return work;
}

// gloo has no AVG / PREMUL_SUM: fp8gloo runs an exact SUM of a copy (multiplied
// by the factor in the tensor's own dtype for PREMUL_SUM), divides it for AVG
// and only then writes the user's tensor, so a failing SUM leaves it as it was.
c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::allreducePassthrough(std::vector<at::Tensor>& tensors,
                                                                     const c10d::AllreduceOptions& opts) {
  const char* op = "all_reduce";
  auto inner = innerFor(tensors[0].device(), op);
  const bool emulate =
      avg_or_premul(opts.reduceOp) && emulable(tensors[0]) && transportLacksAvgAndPremul(tensors[0].device());
  if (!emulate) return passed(inner->allreduce(tensors, opts), c10d::OpType::ALLREDUCE, op, tensors);
  at::Tensor& t = tensors[0];
  std::vector<at::Tensor> copy{opts.reduceOp.op_ == c10d::ReduceOp::PREMUL_SUM
                                   ? premultiplied(op, t, opts.reduceOp).contiguous()
                                   : t.clone(at::MemoryFormat::Contiguous)};
  c10d::AllreduceOptions sum = opts;
  sum.reduceOp = c10d::ReduceOp::SUM;
  wait_for(inner->allreduce(copy, sum));
  if (opts.reduceOp.op_ == c10d::ReduceOp::AVG) copy[0].div_(size_);
  t.copy_(copy[0]);
  return c10::make_intrusive<FP8Work>(rank_, c10d::OpType::ALLREDUCE, op, tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                    const c10d::AllreduceCoalescedOptions& opts) {
  const char* op = "all_reduce_coalesced";
  TORCH_CHECK(!tensors.empty(), "fp8comm ", op, ": got no tensors");
  int64_t total = 0;
  bool same_dtype = true;
  for (const auto& t : tensors) {
    check_dense(op, t);
    check_not_fp8_reduction(op, t);
    check_writable(op, t, "a tensor");
    TORCH_CHECK(t.device() == tensors[0].device(), "fp8comm ", op, ": tensors on ", tensors[0].device(), " and ",
                t.device(), "; put all tensors of one call on one device");
    same_dtype = same_dtype && t.scalar_type() == tensors[0].scalar_type();
    total += t.numel();
  }
  auto inner = innerFor(tensors[0].device(), op);
  for (const auto& t : tensors) checkReduceOpSupported(op, opts.reduceOp, t);
  const int64_t P = size_;
  const int64_t plain = 2 * (P - 1) * bytes_of(tensors) / P;
  auto red = reductionFor(opts.reduceOp, tensors[0]);
  const bool compress = red && same_dtype && compressible(tensors[0], total, options_.compress_allreduce);
  if (!compress) {
    c10::intrusive_ptr<c10d::Work> work;
    if (avg_or_premul(opts.reduceOp) && same_dtype && emulable(tensors[0]) &&
        transportLacksAvgAndPremul(tensors[0].device())) {
      // As allreducePassthrough, for all tensors in one exact SUM: none is
      // written before all have been reduced.
      std::vector<at::Tensor> copies;
      for (const auto& t : tensors) {
        copies.push_back(opts.reduceOp.op_ == c10d::ReduceOp::PREMUL_SUM
                             ? premultiplied(op, t, opts.reduceOp).contiguous()
                             : t.clone(at::MemoryFormat::Contiguous));
      }
      c10d::AllreduceCoalescedOptions sum = opts;
      sum.reduceOp = c10d::ReduceOp::SUM;
      wait_for(inner->allreduce_coalesced(copies, sum));
      for (size_t i = 0; i < tensors.size(); ++i) {
        if (opts.reduceOp.op_ == c10d::ReduceOp::AVG) copies[i].div_(size_);
        tensors[i].copy_(copies[i]);
      }
      work = c10::make_intrusive<FP8Work>(rank_, c10d::OpType::ALLREDUCE_COALESCED, op, tensors);
    } else {
      work = passed(inner->allreduce_coalesced(tensors, opts), c10d::OpType::ALLREDUCE_COALESCED, op, tensors);
    }
    record(op, false, plain, plain);
    return work;
  }
  // One compressed all_reduce of the concatenation, like a DDP bucket.
  auto work = run(c10d::OpType::ALLREDUCE_COALESCED, op, tensors[0].device(), opts.asyncOp, opts.timeout,
                  withFactor(tensors, opts.reduceOp, red), tensors, [&](Transport& transport) {
                    std::vector<at::Tensor> flat_views;
                    for (const auto& t : tensors) flat_views.push_back(t.reshape({-1}));
                    at::Tensor flat = at::cat(flat_views);
                    allreduceCompressed(transport, flat, *red, op);
                    int64_t offset = 0;
                    for (auto& t : tensors) {
                      t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
                      offset += t.numel();
                    }
                  });
  record(op, true, allreduceWireBytes(tensors[0], total), plain);
  return work;
}

// -------------------------------------------------------------- reduce_scatter
void ProcessGroupFP8::checkReduceScatterBase(const char* op, const at::Tensor& output, const at::Tensor& input,
                                             const c10d::ReduceScatterOptions& opts) {
  check_same_device_and_dtype(op, input, output, "output");
  check_not_fp8_reduction(op, input);
  check_writable(op, output, "the output");
  TORCH_CHECK(input.numel() == size_ * output.numel(), "fp8comm ", op, ": input has ", input.numel(),
              " elements but must have group size (", size_, ") x output numel (", output.numel(), ") = ",
              size_ * output.numel());
  innerFor(input.device(), op);
  checkReduceOpSupported(op, opts.reduceOp, input);
}

// As allreducePassthrough: the output is written only after the SUM is done.
c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::reduceScatterBasePassthrough(at::Tensor& output, at::Tensor& input,
                                                                            const c10d::ReduceScatterOptions& opts,
                                                                            const char* op) {
  auto inner = innerFor(input.device(), op);
  const bool emulate = avg_or_premul(opts.reduceOp) && emulable(input) && transportLacksAvgAndPremul(input.device());
  if (!emulate) {
    return passed(inner->_reduce_scatter_base(output, input, opts), c10d::OpType::_REDUCE_SCATTER_BASE, op, {output});
  }
  at::Tensor scaled = opts.reduceOp.op_ == c10d::ReduceOp::PREMUL_SUM
                          ? premultiplied(op, input, opts.reduceOp).contiguous()
                          : contiguous_or_self(input);
  at::Tensor result = at::empty(output.sizes(), output.options());
  c10d::ReduceScatterOptions sum = opts;
  sum.reduceOp = c10d::ReduceOp::SUM;
  wait_for(inner->_reduce_scatter_base(result, scaled, sum));
  if (opts.reduceOp.op_ == c10d::ReduceOp::AVG) result.div_(size_);
  output.copy_(result);
  return c10::make_intrusive<FP8Work>(rank_, c10d::OpType::_REDUCE_SCATTER_BASE, op, std::vector<at::Tensor>{output});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                     const c10d::ReduceScatterOptions& opts) {
  return reduceScatterBase(output, input, opts, "reduce_scatter_tensor");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::reduceScatterBase(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::ReduceScatterOptions& opts,
                                                                  const char* op) {
  checkReduceScatterBase(op, output, input, opts);
  auto inner = innerFor(input.device(), op);
  const int64_t P = size_;
  const int64_t plain = (P - 1) * bytes_of(output);
  auto red = reductionFor(opts.reduceOp, input);
  if (!red || !compressible(input, output.numel(), options_.compress_reduce_scatter)) {
    auto work = reduceScatterBasePassthrough(output, input, opts, op);
    record(op, false, plain, plain);
    return work;
  }
  check_dense(op, output);
  auto work = run(c10d::OpType::_REDUCE_SCATTER_BASE, op, input.device(), opts.asyncOp, opts.timeout,
                  withFactor({input, output}, opts.reduceOp, red), {output}, [&](Transport& transport) {
                    at::Tensor out = contiguous_or_self(output);
                    reduceScatterCompressed(transport, out, {contiguous_or_self(input)}, *red, op);
                    write_back(output, out);
                  });
  record(op, true, (P - 1) * wireSegmentBytes(output.device().type(), output.numel()), plain);
  return work;
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
  check_not_fp8_reduction(op, output);
  check_writable(op, output, "the output");
  for (const auto& in : inputs[0]) {
    check_same_device_and_dtype(op, output, in, "an input", "the output");
    TORCH_CHECK(in.numel() == output.numel(), "fp8comm ", op, ": every input must have the output's ",
                output.numel(), " elements, got ", in.numel());
  }
  auto inner = innerFor(output.device(), op);
  checkReduceOpSupported(op, opts.reduceOp, output);
  const int64_t P = size_;
  const int64_t plain = (P - 1) * bytes_of(output);
  auto red = reductionFor(opts.reduceOp, output);
  if (!red || !compressible(output, output.numel(), options_.compress_reduce_scatter)) {
    c10::intrusive_ptr<c10d::Work> work;
    if (avg_or_premul(opts.reduceOp) && emulable(output) && transportLacksAvgAndPremul(output.device())) {
      std::vector<at::Tensor> flat_inputs;
      for (const auto& in : inputs[0]) flat_inputs.push_back(in.reshape({-1}));
      at::Tensor flat = at::cat(flat_inputs);
      wait_for(reduceScatterBasePassthrough(output, flat, opts, op));
      work = c10::make_intrusive<FP8Work>(rank_, c10d::OpType::REDUCE_SCATTER, op, outputs);
    } else {
      work = passed(inner->reduce_scatter(outputs, inputs, opts), c10d::OpType::REDUCE_SCATTER, op, outputs);
    }
    record(op, false, plain, plain);
    return work;
  }
  std::vector<at::Tensor> user = inputs[0];
  user.push_back(output);
  auto work = run(c10d::OpType::REDUCE_SCATTER, op, output.device(), opts.asyncOp, opts.timeout,
                  withFactor(user, opts.reduceOp, red), outputs, [&](Transport& transport) {
                    std::vector<at::Tensor> segments;
                    for (const auto& in : inputs[0]) segments.push_back(contiguous_or_self(in));
                    at::Tensor out = contiguous_or_self(output);
                    reduceScatterCompressed(transport, out, segments, *red, op);
                    write_back(output, out);
                  });
  record(op, true, (P - 1) * wireSegmentBytes(output.device().type(), output.numel()), plain);
  return work;
}

// Each pair is its own collective (compressed or passed through, as it would
// be alone), counted under this op's name. Every pair is checked before any
// is issued, so a bad one never leaves the earlier ones written.
c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  const char* op = "reduce_scatter_tensor_coalesced";
  TORCH_CHECK(!inputs.empty() && outputs.size() == inputs.size(), "fp8comm ", op, ": got ", outputs.size(),
              " outputs for ", inputs.size(), " inputs");
  for (size_t i = 0; i < inputs.size(); ++i) {
    checkReduceScatterBase(op, outputs[i], inputs[i], opts);
    TORCH_CHECK(inputs[i].device() == inputs[0].device(), "fp8comm ", op, ": tensors on several devices");
  }
  auto inner = innerFor(inputs[0].device(), op);
  const bool emulate = avg_or_premul(opts.reduceOp) && transportLacksAvgAndPremul(inputs[0].device());
  auto red = reductionFor(opts.reduceOp, inputs[0]);
  bool any = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const bool compress = red && compressible(inputs[i], outputs[i].numel(), options_.compress_reduce_scatter);
    if (compress) check_dense(op, outputs[i]);
    any = any || compress;
  }
  if (!any && !emulate) {
    auto work = inner->reduce_scatter_tensor_coalesced(outputs, inputs, opts);
    for (const auto& out : outputs) record(op, false, (size_ - 1) * bytes_of(out), (size_ - 1) * bytes_of(out));
    return passed(std::move(work), c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED, op, outputs);
  }
  std::vector<at::Tensor> user = inputs;
  user.insert(user.end(), outputs.begin(), outputs.end());
  // Each pair runs after the previous one on this call's stream; its Work is
  // kept, so that its errors are this call's.
  c10d::ReduceScatterOptions one = opts;
  one.asyncOp = true;
  return run(c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED, op, inputs[0].device(), opts.asyncOp, opts.timeout,
             withFactor(user, opts.reduceOp, red), outputs, [&](Transport& transport) {
               for (size_t i = 0; i < inputs.size(); ++i) {
                 transport.wait(reduceScatterBase(outputs[i], inputs[i], one, op), "reduce_scatter");
               }
             });
}

// ------------------------------------------------------------------ all_gather
void ProcessGroupFP8::checkAllgatherBase(const char* op, const at::Tensor& output, const at::Tensor& input) const {
  check_same_device_and_dtype(op, input, output, "output");
  check_writable(op, output, "the output");
  TORCH_CHECK(output.numel() == size_ * input.numel(), "fp8comm ", op, ": output has ", output.numel(),
              " elements but must have group size (", size_, ") x input numel (", input.numel(), ") = ",
              size_ * input.numel());
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                const c10d::AllgatherOptions& opts) {
  return allgatherBase(output, input, opts, "all_gather_into_tensor");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::allgatherBase(at::Tensor& output, at::Tensor& input,
                                                              const c10d::AllgatherOptions& opts, const char* op) {
  checkAllgatherBase(op, output, input);
  auto inner = innerFor(input.device(), op);
  const int64_t P = size_;
  const int64_t plain = (P - 1) * bytes_of(input);
  if (!compressible(input, input.numel(), options_.compress_allgather)) {
    at::Tensor out = as_bytes_if_fp8(output);
    at::Tensor in = as_bytes_if_fp8(input);
    auto work = inner->_allgather_base(out, in, opts);
    record(op, false, plain, plain);
    return passed(std::move(work), c10d::OpType::_ALLGATHER_BASE, op, {output});
  }
  check_dense(op, output);
  auto work = run(c10d::OpType::_ALLGATHER_BASE, op, input.device(), opts.asyncOp, opts.timeout, {input, output},
                  {output}, [&](Transport& transport) {
    at::Tensor out = contiguous_or_self(output);
    allgatherCompressed(transport, {out}, contiguous_or_self(input), op);
    write_back(output, out);
  });
  record(op, true, (P - 1) * wireSegmentBytes(input.device().type(), input.numel()), plain);
  return work;
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
    check_writable(op, out, "an output");
    TORCH_CHECK(out.numel() == input.numel(), "fp8comm ", op, ": every output must have the input's ",
                input.numel(), " elements, got ", out.numel());
  }
  auto inner = innerFor(input.device(), op);
  const int64_t P = size_;
  const int64_t plain = (P - 1) * bytes_of(input);
  if (!compressible(input, input.numel(), options_.compress_allgather)) {
    auto outs = as_bytes_if_fp8(outputs);
    auto ins = as_bytes_if_fp8(inputs);
    auto work = inner->allgather(outs, ins, opts);
    record(op, false, plain, plain);
    return passed(std::move(work), c10d::OpType::ALLGATHER, op, outputs[0]);
  }
  std::vector<at::Tensor> user = outputs[0];
  user.push_back(input);
  auto work = run(c10d::OpType::ALLGATHER, op, input.device(), opts.asyncOp, opts.timeout, user, outputs[0],
                  [&](Transport& transport) {
    std::vector<at::Tensor> outs;
    for (const auto& out : outputs[0]) outs.push_back(contiguous_or_self(out));
    allgatherCompressed(transport, outs, contiguous_or_self(input), op);
    for (size_t r = 0; r < outs.size(); ++r) write_back(outputs[0][r], outs[r]);
  });
  record(op, true, (P - 1) * wireSegmentBytes(input.device().type(), input.numel()), plain);
  return work;
}

// As reduce_scatter_tensor_coalesced: one collective per pair, all checked first.
c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                std::vector<at::Tensor>& inputs,
                                                                                const c10d::AllgatherOptions& opts) {
  const char* op = "all_gather_into_tensor_coalesced";
  TORCH_CHECK(!inputs.empty() && outputs.size() == inputs.size(), "fp8comm ", op, ": got ", outputs.size(),
              " outputs for ", inputs.size(), " inputs");
  bool any = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    checkAllgatherBase(op, outputs[i], inputs[i]);
    TORCH_CHECK(inputs[i].device() == inputs[0].device(), "fp8comm ", op, ": tensors on several devices");
    const bool compress = compressible(inputs[i], inputs[i].numel(), options_.compress_allgather);
    if (compress) check_dense(op, outputs[i]);
    any = any || compress;
  }
  auto inner = innerFor(inputs[0].device(), op);
  if (!any) {
    auto outs = as_bytes_if_fp8(outputs);
    auto ins = as_bytes_if_fp8(inputs);
    auto work = inner->allgather_into_tensor_coalesced(outs, ins, opts);
    for (const auto& in : inputs) record(op, false, (size_ - 1) * bytes_of(in), (size_ - 1) * bytes_of(in));
    return passed(std::move(work), c10d::OpType::ALLGATHER_COALESCED, op, outputs);
  }
  std::vector<at::Tensor> user = inputs;
  user.insert(user.end(), outputs.begin(), outputs.end());
  c10d::AllgatherOptions one = opts;
  one.asyncOp = true;
  return run(c10d::OpType::ALLGATHER_COALESCED, op, inputs[0].device(), opts.asyncOp, opts.timeout, user, outputs,
             [&](Transport& transport) {
               for (size_t i = 0; i < inputs.size(); ++i) {
                 transport.wait(allgatherBase(outputs[i], inputs[i], one, op), "all_gather");
               }
             });
}

// ------------------------------------------------------------ exact passthrough
c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  check_writable("broadcast", tensors, "a tensor");
  auto ts = as_bytes_if_fp8(tensors);
  auto work = innerFor(tensors.at(0).device(), "broadcast")->broadcast(ts, opts);
  record("broadcast", false, 0, 0);
  return passed(std::move(work), c10d::OpType::BROADCAST, "broadcast", tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& opts) {
  check_not_fp8_reduction("reduce", tensors);
  check_writable("reduce", tensors, "a tensor");
  auto work = innerFor(tensors.at(0).device(), "reduce")->reduce(tensors, opts);
  record("reduce", false, 0, 0);
  return passed(std::move(work), c10d::OpType::REDUCE, "reduce", tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                    std::vector<at::Tensor>& inputs,
                                                                    const c10d::AllgatherOptions& opts) {
  check_writable("all_gather_coalesced", outputs, "an output");
  const int64_t plain = (size_ - 1) * bytes_of(inputs);
  auto outs = as_bytes_if_fp8(outputs);
  auto ins = as_bytes_if_fp8(inputs);
  auto work = innerFor(inputs.at(0).device(), "all_gather_coalesced")->allgather_coalesced(outs, ins, opts);
  record("all_gather_coalesced", false, plain, plain);
  return passed(std::move(work), c10d::OpType::ALLGATHER_COALESCED, "all_gather_coalesced", {});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::GatherOptions& opts) {
  check_writable("gather", outputs, "an output");
  auto outs = as_bytes_if_fp8(outputs);
  auto ins = as_bytes_if_fp8(inputs);
  auto work = innerFor(inputs.at(0).device(), "gather")->gather(outs, ins, opts);
  record("gather", false, 0, 0);
  return passed(std::move(work), c10d::OpType::GATHER, "gather", {});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::scatter(std::vector<at::Tensor>& outputs,
                                                        std::vector<std::vector<at::Tensor>>& inputs,
                                                        const c10d::ScatterOptions& opts) {
  check_writable("scatter", outputs, "the output");
  auto outs = as_bytes_if_fp8(outputs);
  auto ins = as_bytes_if_fp8(inputs);
  auto work = innerFor(outputs.at(0).device(), "scatter")->scatter(outs, ins, opts);
  record("scatter", false, 0, 0);
  return passed(std::move(work), c10d::OpType::SCATTER, "scatter", outputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                              std::vector<int64_t>& output_split_sizes,
                                                              std::vector<int64_t>& input_split_sizes,
                                                              const c10d::AllToAllOptions& opts) {
  check_writable("all_to_all", output, "the output");
  const int64_t plain = (size_ - 1) * bytes_of(input) / size_;
  at::Tensor out = as_bytes_if_fp8(output);
  at::Tensor in = as_bytes_if_fp8(input);
  auto work =
      innerFor(input.device(), "all_to_all")->alltoall_base(out, in, output_split_sizes, input_split_sizes, opts);
  record("all_to_all", false, plain, plain);
  return passed(std::move(work), c10d::OpType::ALLTOALL_BASE, "all_to_all", {output});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions& opts) {
  check_writable("all_to_all", outputs, "an output");
  const int64_t plain = (size_ - 1) * bytes_of(inputs) / size_;
  auto outs = as_bytes_if_fp8(outputs);
  auto ins = as_bytes_if_fp8(inputs);
  auto work = innerFor(inputs.at(0).device(), "all_to_all")->alltoall(outs, ins, opts);
  record("all_to_all", false, plain, plain);
  return passed(std::move(work), c10d::OpType::ALLTOALL, "all_to_all", outputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  auto ts = as_bytes_if_fp8(tensors);
  auto work = innerFor(tensors.at(0).device(), "send")->send(ts, dst_rank, tag);
  record("send", false, bytes_of(tensors), bytes_of(tensors));
  return passed(std::move(work), c10d::OpType::SEND, "send", tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  check_writable("recv", tensors, "the tensor");
  auto ts = as_bytes_if_fp8(tensors);
  auto work = innerFor(tensors.at(0).device(), "recv")->recv(ts, src_rank, tag);
  record("recv", false, 0, 0);
  return passed(std::move(work), c10d::OpType::RECV, "recv", tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  check_writable("recv", tensors, "the tensor");
  auto ts = as_bytes_if_fp8(tensors);
  auto work = innerFor(tensors.at(0).device(), "recv")->recvAnysource(ts, tag);
  record("recv", false, 0, 0);
  return passed(std::move(work), c10d::OpType::RECVANYSOURCE, "recv", tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::barrier(const c10d::BarrierOptions& opts) {
  auto work = opts.device ? innerFor(*opts.device, "barrier")->barrier(opts) : defaultInner("barrier")->barrier(opts);
  record("barrier", false, 0, 0);
  return passed(std::move(work), c10d::OpType::BARRIER, "barrier", {});
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
  if (!last) last = c10::make_intrusive<FP8Work>(rank_, c10d::OpType::COALESCED, "coalesced", std::vector<at::Tensor>{});
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
