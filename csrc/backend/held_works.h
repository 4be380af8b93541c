#pragma once
// The inner Works of CPU transports, held until no one else holds them
// (DESIGN.md, "Exit").
//
// ProcessGroupGloo's worker thread drops its reference to a Work after it
// has run it, and the caller may have dropped its own first: an async
// handle not kept, a phase waited for. Whoever drops the last reference
// destroys the Work's tensors, and a tensor Python also holds then takes the
// GIL to release its Python object. When that is a gloo worker while the
// interpreter finalizes, Python ends the thread (pthread_exit), whose unwind
// through the Work's noexcept destructor calls std::terminate: the process
// aborts at exit with "terminate called without an active exception"
// (pytorch/pytorch#190489; plain gloo does it too). So every Work fp8comm gets
// from a CPU transport and returns or waits for is held here (a phase started
// but never waited for, when an earlier one failed, is not: its tensors are
// the call's own buffers and views, made in C++), and let go of on a caller's
// thread once it alone holds it: at the next call into any fp8 group, or
// when a group is shut down or destroyed. Works still shared when the process exits stay
// held, so no gloo worker ever drops a last reference.
#include <c10/core/DeviceType.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <cstdint>
#include <vector>

namespace fp8comm {

// Holds `work` if it came from the transport for `device_type` CPU (NCCL's
// Works are left alone: holding one would hold its tensors' device memory);
// first lets go of the held Works no one else holds. Returns `work`.
const c10::intrusive_ptr<c10d::Work>& hold_inner_work(const c10::intrusive_ptr<c10d::Work>& work,
                                                      c10::DeviceType device_type);
void hold_inner_works(const std::vector<c10::intrusive_ptr<c10d::Work>>& works, c10::DeviceType device_type);
// Lets go, on the calling thread, of the held Works no one else holds.
void release_unshared_inner_works();
// How many Works are held (tests).
int64_t held_inner_works();

}  // namespace fp8comm
