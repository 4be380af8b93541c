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
#include "transport_traits.h"

namespace fp8comm {

// SUM: nothing; AVG: the FP32 sum is divided by the group size; PREMUL_SUM:
// each rank's input is multiplied (in FP32) before it is quantized, as NCCL
// applies the factor to each rank's input.
struct ProcessGroupFP8::Reduction {
  float premul = 1.0f;
  std::optional<at::Tensor> premul_tensor;  // float32, one element, on the tensors' device
  int post_div = 1;
};

// The inner backend reduced to the two exchanges the algorithms use, on uint8
// buffers of whole S-byte wire segments, so the multi-rank logic is the same
// on NCCL and gloo. A phase is started, then waited for: on CUDA the wait
// makes the current (side) stream wait, on the CPU it blocks until the bytes
// have arrived, so the next codec pass may read them. Between the two the CPU
// algorithms run the codec on other chunks (pipelining).
//
// Phases are started with asyncOp (ProcessGroupNCCL returns no Work for
// synchronous calls), and every inner Work is kept: the call's FP8Work reports
// their errors and timeouts (fp8_work.h). A transport that returns no Work
// anyway is waited for by nothing; its call was synchronous.
class ProcessGroupFP8::Transport {
 public:
  using Pending = c10::intrusive_ptr<c10d::Work>;

  Transport(c10::intrusive_ptr<c10d::Backend> inner, const TransportTraits& traits, int64_t rank, int64_t size,
            std::chrono::milliseconds timeout, const char* op)
      : inner_(std::move(inner)), traits_(traits), rank_(rank), size_(size), timeout_(timeout), op_(op) {}

  const TransportTraits& traits() const { return traits_; }
  const char* op() const { return op_; }

  // Sends segment i of `send` to the i-th other rank and receives the i-th
  // other rank's segment into segment i of `recv` (P - 1 segments of S bytes
  // each, ranks in order with this one left out: a rank's own segment never
  // travels). An alltoall_base with a zero split for this rank.
  Pending startExchange(at::Tensor& recv, at::Tensor& send, int64_t S) {
    if (size_ == 1) return {};
    // Two vectors: ProcessGroupGloo moves each split list into its work.
    std::vector<int64_t> recv_splits(size_, S), send_splits(size_, S);
    recv_splits[rank_] = send_splits[rank_] = 0;
    c10d::AllToAllOptions opts;
    opts.timeout = timeout_;
    opts.asyncOp = true;
    return inner_->alltoall_base(recv, send, recv_splits, send_splits, opts);
  }

  // The slot of an all_gather's P-slot buffer that holds rank r's segment:
  // slot r through an all_gather; by an exchange, the other ranks' segments
  // in order, then this rank's in the last slot.
  int64_t gatherSlot(int64_t r) const {
    if (!traits_.gather_by_all_to_all || r < rank_) return r;
    return r == rank_ ? size_ - 1 : r - 1;
  }

  // Bytes of scratch an all_gather of S-byte segments needs: by an exchange
  // with more than two ranks, the P - 1 copies of this rank's segment it sends.
  int64_t gatherScratchBytes(int64_t S) const {
    return traits_.gather_by_all_to_all && size_ > 2 ? (size_ - 1) * S : 0;
  }

  // All-gathers into `gathered` (P slots of S bytes) whose gatherSlot(rank)
  // this rank has written; `scratch` has gatherScratchBytes(S) bytes.
  Pending startAllGather(at::Tensor& gathered, int64_t S, at::Tensor& scratch) {
    if (size_ == 1) return {};
    at::Tensor mine = gathered.narrow(0, gatherSlot(rank_) * S, S);
    if (traits_.gather_by_all_to_all) {
      at::Tensor peers = gathered.narrow(0, 0, (size_ - 1) * S);
      at::Tensor send = mine;
      if (size_ > 2) {
        send = scratch.narrow(0, 0, (size_ - 1) * S);
        for (int64_t i = 0; i < size_ - 1; ++i) send.narrow(0, i * S, S).copy_(mine);
      }
      return startExchange(peers, send, S);
    }
    c10d::AllgatherOptions opts;
    opts.timeout = timeout_;
    opts.asyncOp = true;
    return inner_->_allgather_base(gathered, mine, opts);  // in place: NCCL reads this rank's slot
  }

  // Orders what follows after `work` (CPU: blocks until it is done) and keeps
  // it for the call's Work (CUDA: where it may still fail). An error names
  // the op and the phase.
  void wait(const Pending& work, const char* phase) {
    if (!work) return;
    works_.push_back(work);
    try {
      work->wait();
    } catch (const std::exception& e) {
      C10_THROW_ERROR(DistBackendError, std::string("fp8comm ") + op_ + ": the " + phase +
                                            " phase of the compressed algorithm failed in the inner " +
                                            inner_->getBackendName() + " backend: " + e.what());
    }
  }

  // The inner Works this call has waited for (run() hands them to FP8Work).
  std::vector<Pending> takeWorks() { return std::exchange(works_, {}); }

 private:
  c10::intrusive_ptr<c10d::Backend> inner_;
  const TransportTraits traits_;
  int64_t rank_, size_;
  std::chrono::milliseconds timeout_;
  const char* op_;
  std::vector<Pending> works_;
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
// One call at a time per group, on every device: two host threads would
// otherwise interleave the phases of their calls differently on each rank
// (recursive: coalesced calls run their parts through run() again).
template <typename Body>
c10::intrusive_ptr<c10d::Work> ProcessGroupFP8::run(c10d::OpType op_type, const char* op, const at::Device& device,
                                                    bool async_op, std::chrono::milliseconds timeout,
                                                    const std::vector<at::Tensor>& user_tensors,
                                                    std::vector<at::Tensor> outputs, Body&& body) {
  std::lock_guard<std::recursive_mutex> lock(call_mutex_);
  Transport transport(innerFor(device, op), traitsFor(device.type()), rank_, size_, timeout, op);
  if (device.is_cpu()) {
    body(transport);  // every phase waited for on the host: any error has been raised
    return c10::make_intrusive<FP8Work>(rank_, op_type, op, std::move(outputs));
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
  body(transport);
  c10::Event end(device.type());
  end.record(stream);
  return c10::make_intrusive<FP8Work>(rank_, op_type, op, std::move(outputs), transport.takeWorks(), std::move(end),
                                      stream, user_tensors);
}

}  // namespace fp8comm
