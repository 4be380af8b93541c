// The collectives fp8comm always passes through exactly to the inner
// backend (float8 tensors as bytes), counted in stats ("no compressed form").
#include <c10/core/impl/VirtualGuardImpl.h>

#include "arguments.h"
#include "process_group_fp8.h"

namespace fp8comm {

using namespace collectives;  // the rows: kBroadcast, kReduce, ...

template <typename Call>
c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::forward(const Collective& collective, const at::Device& device,
                                                        int64_t payload, std::vector<at::Tensor> outputs,
                                                        Call&& call) {
  auto work = call(*inner_for(device, collective.name));
  record_passthrough(collective, Passthrough::kNoCompressedForm, payload);
  return passed_through(std::move(work), device.type(), collective, std::move(outputs));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  check_writable(kBroadcast.name, tensors, "a tensor");
  auto ts = as_bytes_if_fp8(tensors);
  return forward(kBroadcast, tensors.at(0).device(), bytes_of(tensors), tensors,
                 [&](c10d::Backend& inner) { return inner.broadcast(ts, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                    std::vector<at::Tensor>& inputs,
                                                                    const c10d::AllgatherOptions& opts) {
  check_writable(kAllGatherCoalesced.name, outputs, "an output");
  auto outs = as_bytes_if_fp8(outputs);
  auto ins = as_bytes_if_fp8(inputs);
  return forward(kAllGatherCoalesced, inputs.at(0).device(), bytes_of(inputs), {},
                 [&](c10d::Backend& inner) { return inner.allgather_coalesced(outs, ins, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::GatherOptions& opts) {
  check_writable(kGather.name, outputs, "an output");
  auto outs = as_bytes_if_fp8(outputs);
  auto ins = as_bytes_if_fp8(inputs);
  return forward(kGather, inputs.at(0).device(), bytes_of(inputs), {},
                 [&](c10d::Backend& inner) { return inner.gather(outs, ins, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::scatter(std::vector<at::Tensor>& outputs,
                                                        std::vector<std::vector<at::Tensor>>& inputs,
                                                        const c10d::ScatterOptions& opts) {
  check_writable(kScatter.name, outputs, "the output");
  auto outs = as_bytes_if_fp8(outputs);
  auto ins = as_bytes_if_fp8(inputs);
  return forward(kScatter, outputs.at(0).device(), bytes_of(outputs), outputs,
                 [&](c10d::Backend& inner) { return inner.scatter(outs, ins, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  auto ts = as_bytes_if_fp8(tensors);
  return forward(kSend, tensors.at(0).device(), bytes_of(tensors), tensors,
                 [&](c10d::Backend& inner) { return inner.send(ts, dst_rank, tag); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  check_writable(kRecv.name, tensors, "the tensor");
  auto ts = as_bytes_if_fp8(tensors);
  return forward(kRecv, tensors.at(0).device(), bytes_of(tensors), tensors,
                 [&](c10d::Backend& inner) { return inner.recv(ts, src_rank, tag); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  check_writable(kRecvAnySource.name, tensors, "the tensor");
  auto ts = as_bytes_if_fp8(tensors);
  return forward(kRecvAnySource, tensors.at(0).device(), bytes_of(tensors), tensors,
                 [&](c10d::Backend& inner) { return inner.recvAnysource(ts, tag); });
}

// Frameworks pass device_ids to barrier() only for a backend named "nccl"
// (Lightning); without them NCCL takes its bound device, then one it used
// before, then global rank % devices per host: a guess, which hangs or builds
// a communicator on another rank's GPU where it is wrong. fp8nccl names the
// device instead.
std::vector<int64_t> ProcessGroupFp8::barrier_device_ids(const c10d::BarrierOptions& opts,
                                                         const c10d::Backend& inner,
                                                         c10::DeviceType device_type) const {
  if (!opts.device_ids.empty() || inner.getBackendName() != "nccl") return opts.device_ids;
  const auto bound = getBoundDeviceId();
  if (bound && bound->type() == device_type) return {bound->index()};
  const c10::Device current = c10::impl::VirtualGuardImpl(device_type).getDevice();
  if (current.has_index()) return {current.index()};
  return {};
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::barrier(const c10d::BarrierOptions& opts) {
  const c10::DeviceType device_type =
      opts.device ? opts.device->type()
                  : (has_transport(c10::DeviceType::CUDA) ? c10::DeviceType::CUDA : c10::DeviceType::CPU);
  auto inner = inner_for(opts.device ? *opts.device : at::Device(device_type), kBarrier.name);
  c10d::BarrierOptions forwarded = opts;
  forwarded.device_ids = barrier_device_ids(opts, *inner, device_type);
  auto work = inner->barrier(forwarded);
  record_passthrough(kBarrier, Passthrough::kNoCompressedForm, 0);
  return passed_through(std::move(work), device_type, kBarrier, {});
}

void ProcessGroupFp8::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  inner_for(at::Device(c10::DeviceType::CPU), "monitored_barrier")->monitoredBarrier(opts, wait_all_ranks);
}

}  // namespace fp8comm
