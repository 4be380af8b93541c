#pragma once
// Creating ProcessGroupFp8 objects for torch's backend creator functions.
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "process_group_fp8.h"

namespace fp8comm {

// torch calls the creator once per device of a process group. For
// "cpu:fp8gloo,cuda:fp8nccl" both calls must return one object, because torch
// files both under the single CUSTOM backend type; the second call of the same
// group creation (same group id, same group store) therefore adds its
// transport to the object the first call made.
c10::intrusive_ptr<ProcessGroupFp8> attach_or_create(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                     int size, const std::string& group_id,
                                                     c10::DeviceType device_type,
                                                     c10::intrusive_ptr<c10d::Backend> inner,
                                                     c10::intrusive_ptr<Options> options);

}  // namespace fp8comm
