#pragma once
// The pieces the compressed algorithms are built from: how a reduce op maps
// onto the codec, and the inner backend reduced to the two calls they use.
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fp8_work.h"
#include "process_group_fp8.h"

namespace fp8comm {

// SUM: nothing; AVG: the FP32 sum is divided by the group size; PREMUL_SUM:
// each rank's input is multiplied (in FP32) before it is quantized, as NCCL
// applies the factor to each rank's input.
struct ProcessGroupFP8::Reduction {
  float premul = 1.0f;
  std::optional<at::Tensor> premul_tensor;  // float32, one element, on the tensors' device
  int post_div = 1;
};

// Only alltoall_base with equal splits and _allgather_base on uint8 buffers, so
// the multi-rank logic is the same on NCCL and gloo. A phase is started, then
// waited for: on CUDA the wait makes the current (side) stream wait, on the CPU
// it blocks until the bytes have arrived, so the next codec pass may read them.
// Between the two the CPU algorithms run the codec on other chunks (pipelining).
class ProcessGroupFP8::Transport {
 public:
  using Pending = c10::intrusive_ptr<c10d::Work>;

  Transport(c10::intrusive_ptr<c10d::Backend> inner, std::chrono::milliseconds timeout, const char* op)
      : inner_(std::move(inner)),
        timeout_(timeout),
        op_(op),
        // gloo moves an all_to_all faster than an all_gather of the same bytes
        // (docs/performance.md), so over gloo all_gather runs as one.
        gather_by_all_to_all_(inner_->getBackendName() == "gloo") {}

  Pending startAllToAll(at::Tensor& recv, at::Tensor& send) {
    std::vector<int64_t> equal_splits;
    c10d::AllToAllOptions opts;
    opts.timeout = timeout_;
    opts.asyncOp = false;
    return inner_->alltoall_base(recv, send, equal_splits, equal_splits, opts);
  }

  // Bytes the send buffer of an all_gather of `segment` bytes per rank needs.
  int64_t gatherSendBytes(int64_t segment, int64_t group_size) const {
    return gather_by_all_to_all_ ? group_size * segment : segment;
  }

  // All-gathers send[0, segment) of every rank into recv (P * segment bytes).
  // `send` has gatherSendBytes(segment) bytes; over gloo the segment is copied
  // into the rest of it and sent to every rank by one all_to_all.
  Pending startAllGather(at::Tensor& recv, at::Tensor& send, int64_t segment) {
    if (gather_by_all_to_all_) {
      const int64_t P = recv.numel() / segment;
      at::Tensor mine = send.narrow(0, 0, segment);
      for (int64_t r = 1; r < P; ++r) send.narrow(0, r * segment, segment).copy_(mine);
      return startAllToAll(recv, send);
    }
    c10d::AllgatherOptions opts;
    opts.timeout = timeout_;
    opts.asyncOp = false;
    at::Tensor mine = send.narrow(0, 0, segment);
    return inner_->_allgather_base(recv, mine, opts);
  }

  void wait(const Pending& work, const char* phase) {
    try {
      work->wait();
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "fp8comm ", op_, ": the ", phase, " phase of the compressed algorithm failed in the inner ",
                  inner_->getBackendName(), " backend: ", e.what());
    }
  }

 private:
  c10::intrusive_ptr<c10d::Backend> inner_;
  std::chrono::milliseconds timeout_;
  const char* op_;
  const bool gather_by_all_to_all_;
};

// Phases started and not yet waited for. If the algorithm throws, they are
// waited for (their own errors dropped) before the workspace they write into
// can be handed to the next call.
class InFlight {
 public:
  explicit InFlight(size_t slots) : works_(slots) {}
  ~InFlight() {
    for (auto& w : works_) {
      if (!w) continue;
      try {
        w->wait();
      } catch (...) {
      }
    }
  }
  c10::intrusive_ptr<c10d::Work>& operator[](size_t i) { return works_[i]; }
  // The work of slot i, which then no longer counts as in flight.
  c10::intrusive_ptr<c10d::Work> take(size_t i) { return std::exchange(works_[i], {}); }

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
};

// DESIGN.md, "Streams and Work": on CUDA with async_op the side stream first
// waits for the caller's stream, the algorithm runs there, and the user's
// tensors are marked in use by it; without async_op it runs on the caller's
// stream. On the CPU it runs inline and the Work is already complete.
template <typename Body>
c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::run(c10d::OpType op, const at::Device& device, bool async_op,
                                                    const std::vector<at::Tensor>& user_tensors,
                                                    std::vector<at::Tensor> outputs, Body&& body) {
  if (device.is_cpu()) {
    std::lock_guard<std::recursive_mutex> lock(cpu_mutex_);
    body();
    return c10::make_intrusive<FP8Work>(rank_, op, std::move(outputs));
  }
  c10::impl::VirtualGuardImpl impl(device.type());
  c10::DeviceGuard device_guard(device);
  const c10::Stream caller = impl.getStream(device);
  const c10::Stream stream = async_op ? sideStream(device) : caller;
  if (stream != caller) {
    c10::Event ready(device.type());
    ready.record(caller);
    ready.block(stream);
    for (const at::Tensor& t : user_tensors) {
      if (t.defined() && t.has_storage()) impl.recordDataPtrOnStream(t.storage().data_ptr(), stream);
    }
  }
  c10::StreamGuard stream_guard(stream);
  body();
  c10::Event end(device.type());
  end.record(stream);
  return c10::make_intrusive<FP8Work>(rank_, op, std::move(outputs), std::move(end), stream, user_tensors);
}

}  // namespace fp8comm
