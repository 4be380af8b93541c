#include "fp8_work.h"

#include <ATen/core/ivalue.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace fp8comm {
namespace {

c10::intrusive_ptr<c10::ivalue::Future> make_future(std::vector<c10::Device> devices) {
  return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                  std::move(devices));
}

}  // namespace

FP8Work::FP8Work(int rank, c10d::OpType op, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, op), outputs_(std::move(outputs)), future_(make_future({})) {
  future_->markCompleted(c10::IValue(outputs_));
  finish();
}

FP8Work::FP8Work(int rank, c10d::OpType op, std::vector<at::Tensor> outputs, c10::Event end,
                 c10::Stream stream, std::vector<at::Tensor> keep_alive)
    : c10d::Work(rank, op),
      outputs_(std::move(outputs)),
      end_(std::move(end)),
      stream_(stream),
      keep_alive_(std::move(keep_alive)),
      future_(make_future({stream.device()})) {
  // The future records its own event on the current stream of its device:
  // make that the side stream, so waiting on the future waits for the work.
  c10::StreamGuard guard(stream);
  future_->markCompleted(c10::IValue(outputs_));
}

bool FP8Work::isCompleted() {
  if (!end_) return true;
  std::lock_guard<std::mutex> lock(mutex_);
  if (!completed_ && end_->query()) {
    completed_ = true;
    keep_alive_.clear();
  }
  return completed_;
}

bool FP8Work::isSuccess() const { return true; }

bool FP8Work::wait(std::chrono::milliseconds /*timeout*/) {
  if (end_) {
    // Like WorkNCCL::wait: the caller's current stream waits; the host does not.
    c10::impl::VirtualGuardImpl impl(stream_->device_type());
    end_->block(impl.getStream(stream_->device()));
  }
  return true;
}

void FP8Work::synchronize() { wait(); }

std::vector<at::Tensor> FP8Work::result() { return outputs_; }

c10::intrusive_ptr<c10::ivalue::Future> FP8Work::getFuture() { return future_; }

}  // namespace fp8comm
