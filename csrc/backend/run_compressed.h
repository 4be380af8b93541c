#pragma once
// ProcessGroupFp8::call, the one generic entry of every collective that has
// a compressed algorithm, and its compressed_call over ProcessGroupFp8::run:
// the stream and Work contract and the one-call-at-a-time lock (recursive:
// coalesced calls run their parts through run() again) of DESIGN.md,
// "Streams and Work".
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <mutex>

#include "arguments.h"
#include "fp8_work.h"
#include "held_works.h"
#include "process_group_fp8.h"

namespace fp8comm {

template <typename Body>
c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::run(const Collective& c, const at::Device& device, bool async_op,
                                                    std::chrono::milliseconds timeout,
                                                    const std::vector<at::Tensor>& user_tensors,
                                                    std::vector<at::Tensor> outputs, Body&& body) {
  std::lock_guard<std::recursive_mutex> lock(call_mutex_);
  const TransportTraits traits = traits_for(device.type());
  Transport transport(inner_for(device, c.name), traits, rank_, size_, timeout, c.name);
  std::optional<NodeTransports> nodes;
  // The node transports are of the group transport's kind (add_node_transports)
  // and run with its traits: the call's one WireLayout, and so one chunk
  // plan, holds on all three.
  if (auto inner = node_inner(device.type())) {
    const int64_t L = static_cast<int64_t>(node_group_ranks_.size()) / nodes_;
    const auto at = std::find(node_group_ranks_.begin(), node_group_ranks_.end(), int64_t{rank_});
    const int64_t position = at - node_group_ranks_.begin();
    nodes.emplace(NodeTransports{Transport(inner->intra, traits, position % L, L, timeout, c.name),
                                 Transport(inner->inter, traits, position / L, nodes_, timeout, c.name),
                                 node_group_ranks_, options_->node_wire_format->format, &node_workspace_});
  }
  Route route{transport, nodes ? &*nodes : nullptr, ranks_on_my_node_, node_of_rank()};
  // The phases' inner Works, held past this call on a CPU device (held_works.h).
  auto hold_phases = [&] {
    hold_inner_works(transport.take_works(), device.type());
    if (nodes) {
      hold_inner_works(nodes->intra.take_works(), device.type());
      hold_inner_works(nodes->inter.take_works(), device.type());
    }
  };
  auto run_body = [&] {
    try {
      body(route);
    } catch (...) {
      workspace_.release();
      node_workspace_.release();
      hold_phases();
      throw;
    }
    if (nodes) {
      transport.adopt_works(nodes->intra);
      transport.adopt_works(nodes->inter);
    }
  };
  if (device.is_cpu()) {
    run_body();  // every phase waited for on the host: any error has been raised
    hold_phases();
    return c10::make_intrusive<Fp8Work>(rank_, c.type, c.name, std::move(outputs));
  }
  c10::impl::VirtualGuardImpl impl(device.type());
  c10::DeviceGuard device_guard(device);
  const c10::Stream caller = impl.getStream(device);
  const c10::Stream stream = async_op ? side_stream(device) : caller;
  if (stream != caller) {
    c10::Event ready(device.type());
    ready.record(caller);
    ready.block(stream);
    for (const at::Tensor& t : user_tensors) {
      if (t.defined() && t.has_storage()) impl.recordDataPtrOnStream(t.storage().data_ptr(), stream);
    }
  }
  c10::StreamGuard stream_guard(stream);
  run_body();
  c10::Event end(device.type());
  end.record(stream);
  return c10::make_intrusive<Fp8Work>(rank_, c.type, c.name, std::move(outputs), transport.take_works(),
                                      std::move(end), stream, user_tensors);
}

// The wire layout is the transport's; the bytes sent and the quantization
// error are the algorithm's, recorded once the call has been issued.
template <typename Body>
c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::compressed_call(const Collective& c, const at::Device& device,
                                                                bool async_op, std::chrono::milliseconds timeout,
                                                                const std::vector<at::Tensor>& user_tensors,
                                                                std::vector<at::Tensor> outputs, const Payload& payload,
                                                                Body&& body, const NodeBytes& sent_before) {
  TORCH_INTERNAL_ASSERT(c.compressed, "fp8comm ", c.name, ": the collectives table names no compressed algorithm");
  const CompressedAlgorithm& algorithm = *c.compressed;
  NodeBytes sent = sent_before;
  QuantizationError error;
  auto work = run(c, device, async_op, timeout, user_tensors, std::move(outputs), [&](Route& route) {
    // Numbered under the call lock, in the order every rank issues its calls.
    const WireLayout wire = wire_layout(device.type()).for_call(*options_->rounding_seed, compressed_calls_++, rank_);
    body([&](const CompressedArgs& args) {
      const NodeBytes run = algorithm.run(route, wire, workspace_, args, error_if_tracked(error));
      sent.intra_node += run.intra_node;
      sent.inter_node += run.inter_node;
    });
  });
  record_compressed(c, payload, sent, error);
  return work;
}

template <typename Exact, typename Body, typename Shape>
c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::call(const Collective& c, const CallSpec& spec, Exact&& exact,
                                                     Body&& body, Shape&& shape) {
  TORCH_INTERNAL_ASSERT(c.compressed, "fp8comm ", c.name, ": the collectives table names no compressed algorithm");
  const at::Device device = spec.like.device();
  Passthrough why = passthrough_but_size(c, spec.like, spec.rule);
  int64_t per_rank_numel = spec.per_rank_numel;
  NodeBytes prepared;
  // A prepare step's exchange and the call, one after the other on every rank.
  std::unique_lock<std::recursive_mutex> lock(call_mutex_, std::defer_lock);
  if (why == Passthrough::kCompressed && c.compressed->prepare) {
    lock.lock();
    Transport t(inner_for(device, c.name), traits_for(device.type()), rank_, size_, spec.timeout, c.name);
    Route route{t, nullptr, ranks_on_my_node_, node_of_rank()};
    // Its exchange's Works held past the call, raised or not (held_works.h).
    Prepared p;
    try {
      p = c.compressed->prepare(route, shape(), device);
    } catch (...) {
      hold_inner_works(t.take_works(), device.type());
      throw;
    }
    hold_inner_works(t.take_works(), device.type());
    per_rank_numel = p.per_rank_numel;
    prepared = p.sent;
  }
  if (why == Passthrough::kCompressed) why = size_rule(c, per_rank_numel);
  if (why != Passthrough::kCompressed) {
    auto work = exact();
    record_passthrough(c, why, spec.payload, prepared);
    return passed_through(std::move(work), device.type(), c, spec.outputs);
  }
  if (spec.dense_outputs) {
    for (const at::Tensor& out : spec.outputs) check_dense(c.name, out);
  }
  return compressed_call(c, device, spec.async_op, spec.timeout, spec.user_tensors, spec.outputs, spec.payload,
                         std::forward<Body>(body), prepared);
}

}  // namespace fp8comm
