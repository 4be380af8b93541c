#pragma once
// Waiting for a Work an inner backend returned. ProcessGroupNCCL returns none
// for a synchronous call (asyncOp false): that call is done, or has raised,
// when it returns, so there is nothing to wait for.
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace fp8comm {

inline void wait_for(const c10::intrusive_ptr<c10d::Work>& work) {
  if (work) work->wait();
}

}  // namespace fp8comm
