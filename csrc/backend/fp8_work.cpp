#include "fp8_work.h"

#include <ATen/core/ivalue.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <memory>
#include <thread>

namespace fp8comm {
namespace {

c10::intrusive_ptr<c10::ivalue::Future> make_future(std::vector<c10::Device> devices) {
  return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                  std::move(devices));
}

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown error";
  }
}

}  // namespace

Fp8Work::Fp8Work(int rank, c10d::OpType type, std::string op, std::vector<at::Tensor> outputs, Inner inner)
    : c10d::Work(rank, type),
      op_(std::move(op)),
      outputs_(std::move(outputs)),
      inner_(std::move(inner)),
      future_(make_future({})) {
  completeFutureWithInner();
}

Fp8Work::Fp8Work(int rank, c10d::OpType type, std::string op, std::vector<at::Tensor> outputs, Inner inner,
                 c10::Event end, c10::Stream stream, std::vector<at::Tensor> keep_alive)
    : c10d::Work(rank, type),
      op_(std::move(op)),
      outputs_(std::move(outputs)),
      inner_(std::move(inner)),
      end_(std::move(end)),
      stream_(stream),
      keep_alive_(std::move(keep_alive)),
      future_(make_future({stream.device()})) {
  // As WorkNCCL's: completed at enqueue, on the side stream, so waiting on the
  // future waits for the work; errors surface through wait() and exception().
  c10::StreamGuard guard(stream);
  future_->markCompleted(c10::IValue(outputs_));
}

void Fp8Work::completeFutureWithInner() {
  auto finish_future = [future = future_, outputs = outputs_, op = op_](std::exception_ptr error) {
    if (error) {
      future->setError(std::make_exception_ptr(c10::DistBackendError(
          {__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, "fp8comm " + op + ": an inner collective failed: " + what_of(error))));
    } else {
      future->markCompleted(c10::IValue(outputs));
    }
  };
  if (innerCompleted()) {
    finish_future(innerException());
    return;
  }
  // Completed by the last inner future to complete, with the first error seen.
  auto remaining = std::make_shared<std::atomic<size_t>>(inner_.size());
  auto first_error = std::make_shared<std::exception_ptr>();
  auto error_mutex = std::make_shared<std::mutex>();
  for (const auto& w : inner_) {
    w->getFuture()->addCallback([=](c10::ivalue::Future& f) {
      if (f.hasError()) {
        std::lock_guard<std::mutex> lock(*error_mutex);
        if (!*first_error) *first_error = f.exception_ptr();
      }
      if (remaining->fetch_sub(1) == 1) finish_future(*first_error);
    });
  }
}

bool Fp8Work::innerCompleted() const {
  for (const auto& w : inner_) {
    if (!w->isCompleted()) return false;
  }
  return true;
}

std::exception_ptr Fp8Work::innerException() const {
  for (const auto& w : inner_) {
    if (auto e = w->exception()) return e;
  }
  return nullptr;
}

bool Fp8Work::isCompleted() {
  if (innerException()) return true;
  if (end_ && !end_->query()) return false;
  if (!innerCompleted()) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  keep_alive_.clear();
  return true;
}

bool Fp8Work::isSuccess() const { return !innerException(); }

std::exception_ptr Fp8Work::exception() const { return innerException(); }

bool Fp8Work::wait(std::chrono::milliseconds timeout) {
  // With a timeout, or with no device stream to order (the inner Works may
  // still be running on the host): wait here, until done, failed or late.
  // A CUDA Work without a timeout only orders streams, as WorkNCCL::wait.
  if (timeout != kNoTimeout || !end_) {
    const auto start = std::chrono::steady_clock::now();
    while (!isCompleted()) {
      if (timeout != kNoTimeout && std::chrono::steady_clock::now() - start >= timeout) {
        C10_THROW_ERROR(DistBackendError, "fp8comm " + op_ + ": not done after " + std::to_string(timeout.count()) +
                                              " ms (Work.wait timeout); a peer may be stuck or dead");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  if (auto e = innerException()) {
    C10_THROW_ERROR(DistBackendError, "fp8comm " + op_ + ": an inner collective failed: " + what_of(e));
  }
  // Each inner wait orders the current stream after its phase (WorkNCCL;
  // under TORCH_NCCL_BLOCKING_WAIT it also waits on the host) and rethrows.
  for (const auto& w : inner_) {
    try {
      w->wait();
    } catch (const std::exception& e) {
      C10_THROW_ERROR(DistBackendError, "fp8comm " + op_ + ": an inner collective failed: " + e.what());
    }
  }
  if (end_) {
    // Like WorkNCCL::wait: the caller's current stream waits; the host does not.
    c10::impl::VirtualGuardImpl impl(stream_->device_type());
    end_->block(impl.getStream(stream_->device()));
  }
  return true;
}

void Fp8Work::synchronize() { wait(); }

std::vector<at::Tensor> Fp8Work::result() { return outputs_; }

c10::intrusive_ptr<c10::ivalue::Future> Fp8Work::getFuture() { return future_; }

}  // namespace fp8comm
