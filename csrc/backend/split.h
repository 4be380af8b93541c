#pragma once
// The hook through which ProcessGroupFp8::split calls the split written in
// Python (fp8comm/subgroups.py); DESIGN.md, "Subgroups".
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
