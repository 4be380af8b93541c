#pragma once
// The Work of a compressed collective (DESIGN.md, "Streams and Work").
//
// CPU: the collective has run when the call returns, so the Work is complete.
// CUDA: the collective was enqueued on a side stream and `end` recorded after
// it; wait() makes the caller's current stream wait on `end` (no host block),
// and the future is CUDA-aware (marked complete on the side stream), as
// ProcessGroupNCCL's WorkNCCL does.
#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <optional>
#include <vector>

namespace fp8comm {

class FP8Work : public c10d::Work {
 public:
  // A completed Work (CPU, or nothing to do).
  FP8Work(int rank, c10d::OpType op, std::vector<at::Tensor> outputs);
  // A Work that completes when `end`, recorded on `stream`, is reached;
  // `keep_alive` holds tensors the stream still uses until then.
  FP8Work(int rank, c10d::OpType op, std::vector<at::Tensor> outputs, c10::Event end,
          c10::Stream stream, std::vector<at::Tensor> keep_alive);

  bool isCompleted() override;
  bool isSuccess() const override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void synchronize() override;
  std::vector<at::Tensor> result() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

 private:
  std::vector<at::Tensor> outputs_;
  std::optional<c10::Event> end_;
  std::optional<c10::Stream> stream_;
  std::vector<at::Tensor> keep_alive_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace fp8comm
