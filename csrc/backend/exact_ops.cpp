// The collectives fp8comm always passes through exactly to the inner
// backend (float8 tensors as bytes), counted in stats.
#include "arguments.h"
#include "process_group_fp8.h"

namespace fp8comm {

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  check_writable("broadcast", tensors, "a tensor");
  auto ts = as_bytes_if_fp8(tensors);
  auto work = inner_for(tensors.at(0).device(), "broadcast")->broadcast(ts, opts);
  record_passthrough(collectives::kBroadcast, bytes_of(tensors));
  return passed(std::move(work), collectives::kBroadcast, tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& opts) {
  check_not_fp8_reduction("reduce", tensors);
  check_writable("reduce", tensors, "a tensor");
  auto work = inner_for(tensors.at(0).device(), "reduce")->reduce(tensors, opts);
  record_passthrough(collectives::kReduce, bytes_of(tensors));
  return passed(std::move(work), collectives::kReduce, tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                    std::vector<at::Tensor>& inputs,
                                                                    const c10d::AllgatherOptions& opts) {
  check_writable("all_gather_coalesced", outputs, "an output");
  auto outs = as_bytes_if_fp8(outputs);
  auto ins = as_bytes_if_fp8(inputs);
  auto work = inner_for(inputs.at(0).device(), "all_gather_coalesced")->allgather_coalesced(outs, ins, opts);
  record_passthrough(collectives::kAllGatherCoalesced, bytes_of(inputs));
  return passed(std::move(work), collectives::kAllGatherCoalesced, {});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::GatherOptions& opts) {
  check_writable("gather", outputs, "an output");
  auto outs = as_bytes_if_fp8(outputs);
  auto ins = as_bytes_if_fp8(inputs);
  auto work = inner_for(inputs.at(0).device(), "gather")->gather(outs, ins, opts);
  record_passthrough(collectives::kGather, bytes_of(inputs));
  return passed(std::move(work), collectives::kGather, {});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::scatter(std::vector<at::Tensor>& outputs,
                                                        std::vector<std::vector<at::Tensor>>& inputs,
                                                        const c10d::ScatterOptions& opts) {
  check_writable("scatter", outputs, "the output");
  auto outs = as_bytes_if_fp8(outputs);
  auto ins = as_bytes_if_fp8(inputs);
  auto work = inner_for(outputs.at(0).device(), "scatter")->scatter(outs, ins, opts);
  record_passthrough(collectives::kScatter, bytes_of(outputs));
  return passed(std::move(work), collectives::kScatter, outputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                              std::vector<int64_t>& output_split_sizes,
                                                              std::vector<int64_t>& input_split_sizes,
                                                              const c10d::AllToAllOptions& opts) {
  check_writable("all_to_all", output, "the output");
  at::Tensor out = as_bytes_if_fp8(output);
  at::Tensor in = as_bytes_if_fp8(input);
  auto work =
      inner_for(input.device(), "all_to_all")->alltoall_base(out, in, output_split_sizes, input_split_sizes, opts);
  record_passthrough(collectives::kAllToAllSingle, bytes_of(input));
  return passed(std::move(work), collectives::kAllToAllSingle, {output});
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions& opts) {
  check_writable("all_to_all", outputs, "an output");
  auto outs = as_bytes_if_fp8(outputs);
  auto ins = as_bytes_if_fp8(inputs);
  auto work = inner_for(inputs.at(0).device(), "all_to_all")->alltoall(outs, ins, opts);
  record_passthrough(collectives::kAllToAll, bytes_of(inputs));
  return passed(std::move(work), collectives::kAllToAll, outputs);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  auto ts = as_bytes_if_fp8(tensors);
  auto work = inner_for(tensors.at(0).device(), "send")->send(ts, dst_rank, tag);
  record_passthrough(collectives::kSend, bytes_of(tensors));
  return passed(std::move(work), collectives::kSend, tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  check_writable("recv", tensors, "the tensor");
  auto ts = as_bytes_if_fp8(tensors);
  auto work = inner_for(tensors.at(0).device(), "recv")->recv(ts, src_rank, tag);
  record_passthrough(collectives::kRecv, bytes_of(tensors));
  return passed(std::move(work), collectives::kRecv, tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  check_writable("recv", tensors, "the tensor");
  auto ts = as_bytes_if_fp8(tensors);
  auto work = inner_for(tensors.at(0).device(), "recv")->recvAnysource(ts, tag);
  record_passthrough(collectives::kRecvAnySource, bytes_of(tensors));
  return passed(std::move(work), collectives::kRecvAnySource, tensors);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::barrier(const c10d::BarrierOptions& opts) {
  auto work = opts.device ? inner_for(*opts.device, "barrier")->barrier(opts) : default_inner("barrier")->barrier(opts);
  record_passthrough(collectives::kBarrier, 0);
  return passed(std::move(work), collectives::kBarrier, {});
}

void ProcessGroupFP8::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  inner_for(at::Device(c10::DeviceType::CPU), "monitored_barrier")->monitoredBarrier(opts, wait_all_ranks);
}

}  // namespace fp8comm
