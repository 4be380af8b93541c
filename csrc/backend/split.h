#pragma once
// Splitting an fp8 group (DESIGN.md, "Subgroups"): torch's
// ProcessGroup::splitGroup (behind torch.distributed.split_group, DeviceMesh
// under eager init) calls ProcessGroupFp8::split on every rank of the parent.
//
// What a split does is written once, in Python (fp8comm/subgroups.py): split
// each inner transport with options of its own kind (torch's NCCL split needs
// ProcessGroupNCCL::Options), then create the new group as any fp8 group is
// created (options agreed by every rank, CPU threads sized). The C++ side
// calls it through this hook, which fp8comm sets when it is imported.
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <functional>
#include <vector>

namespace fp8comm {

class ProcessGroupFp8;

// (parent, store, ranks, options) -> the new group on a member, null on a
// rank outside `ranks`; the arguments are those of c10d::Backend::split.
using Splitter = std::function<c10::intrusive_ptr<c10d::Backend>(
    const c10::intrusive_ptr<ProcessGroupFp8>& parent, const c10::intrusive_ptr<c10d::Store>& store,
    const std::vector<int>& ranks, const c10::intrusive_ptr<c10d::Backend::Options>& options)>;

void set_splitter(Splitter splitter);

}  // namespace fp8comm
