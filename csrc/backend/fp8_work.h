#pragma once
// The Work of a compressed collective (DESIGN.md, "Streams and Work").
//
// CPU: the collective has run when the call returns, so the Work is complete.
// CUDA: the collective was enqueued on a side stream and `end` recorded after
// it; wait() makes the caller's current stream wait on `end` (no host block),
// and the future is CUDA-aware, completed at enqueue as WorkNCCL's is.
//
// Either way the Work holds the inner transport's Works of the call's phases:
// their errors and timeouts are this Work's (isCompleted, isSuccess,
// exception, wait); only a CPU Work's future carries them too.
#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <optional>
#include <string>
#include <vector>

namespace fp8comm {

class Fp8Work : public c10d::Work {
 public:
  using Inner = std::vector<c10::intrusive_ptr<c10d::Work>>;

  // A Work that is done when its inner Works are (CPU: they already are).
  // `op` names the collective in errors.
  Fp8Work(int rank, c10d::OpType type, std::string op, std::vector<at::Tensor> outputs, Inner inner = {});
  // A Work that is done when `end`, recorded on `stream`, is reached (CUDA);
  // `keep_alive` holds tensors the stream still uses until then.
  Fp8Work(int rank, c10d::OpType type, std::string op, std::vector<at::Tensor> outputs, Inner inner,
          c10::Event end, c10::Stream stream, std::vector<at::Tensor> keep_alive);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  // Rethrows an inner error, naming the op. With a timeout, waits on the host
  // for at most that long and raises DistBackendError past it.
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void synchronize() override;
  std::vector<at::Tensor> result() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

 private:
  bool innerCompleted() const;
  std::exception_ptr innerException() const;
  // The future of a Work with no end event: completed (or failed) with the
  // inner Works, at once if they are done.
  void completeFutureWithInner();

  std::string op_;
  std::vector<at::Tensor> outputs_;
  Inner inner_;
  std::optional<c10::Event> end_;
  std::optional<c10::Stream> stream_;
  std::vector<at::Tensor> keep_alive_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace fp8comm
