#pragma once
// The pieces the compressed algorithms are built from: how a reduce op maps
// onto the codec, and the inner backend reduced to the two calls they use.
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <optional>
#include <string>

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
// the multi-rank logic is the same on NCCL and gloo. Each call waits for its
// inner Work: on CUDA that makes the current (side) stream wait, on the CPU it
// blocks until the bytes have arrived, so the next codec pass may read them.
class ProcessGroupFP8::Transport {
 public:
  Transport(c10::intrusive_ptr<c10d::Backend> inner, std::chrono::milliseconds timeout, const char* op)
      : inner_(std::move(inner)), timeout_(timeout), op_(op) {}

  void allToAll(at::Tensor& recv, at::Tensor& send) {
    std::vector<int64_t> equal_splits;
    c10d::AllToAllOptions opts;
    opts.timeout = timeout_;
    opts.asyncOp = false;
    finish(inner_->alltoall_base(recv, send, equal_splits, equal_splits, opts), "all_to_all");
  }

  void allGather(at::Tensor& recv, at::Tensor& send) {
    c10d::AllgatherOptions opts;
    opts.timeout = timeout_;
    opts.asyncOp = false;
    finish(inner_->_allgather_base(recv, send, opts), "all_gather");
  }

 private:
  void finish(const c10::intrusive_ptr<c10d::Work>& work, const char* phase) {
    try {
      work->wait();
    } catch (const std::exception& e) {
      TORCH_CHECK(false, "fp8comm ", op_, ": the ", phase, " phase of the compressed algorithm failed in the inner ",
                  inner_->getBackendName(), " backend: ", e.what());
    }
  }

  c10::intrusive_ptr<c10d::Backend> inner_;
  std::chrono::milliseconds timeout_;
  const char* op_;
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
