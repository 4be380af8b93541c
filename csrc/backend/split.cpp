// ProcessGroupFp8::split and the hook that does the work (split.h).
#include "split.h"

#include <mutex>

#include "process_group_fp8.h"

namespace fp8comm {
namespace {

std::mutex splitter_mutex;

Splitter& installed_splitter() {
  static Splitter splitter;
  return splitter;
}

Splitter current_splitter() {
  std::lock_guard<std::mutex> lock(splitter_mutex);
  return installed_splitter();
}

}  // namespace

void set_splitter(Splitter splitter) {
  std::lock_guard<std::mutex> lock(splitter_mutex);
  installed_splitter() = std::move(splitter);
}

bool ProcessGroupFp8::supportsSplitting() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (inner_.empty()) return false;
  for (const auto& [device, inner] : inner_) {
    if (!inner->supportsSplitting()) return false;
  }
  return true;
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupFp8::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                          const std::vector<int>& ranks,
                                                          const c10::intrusive_ptr<c10d::Backend::Options>& opts) {
  TORCH_CHECK(store, "fp8comm split: got no store; split a group through torch.distributed.split_group or "
              "ProcessGroup.split_group");
  TORCH_CHECK(supportsSplitting(), "fp8comm split: a transport of this ", getBackendName(),
              " group cannot be split; create the subgroup with torch.distributed.new_group instead");
  std::lock_guard<std::mutex> lock(split_mutex_);
  // torch calls split once per device type of the parent, every call with the
  // store of that one split; "cpu:fp8gloo,cuda:fp8nccl" gives both device
  // types this object, and the first call already split both transports.
  if (last_split_ && last_split_->store.lock().get() == store.get()) {
    return last_split_->group ? last_split_->group->lock() : c10::intrusive_ptr<c10d::Backend>();
  }
  Splitter splitter = current_splitter();
  TORCH_CHECK(splitter, "fp8comm split: ", getBackendName(), " groups are split by the fp8comm Python package; "
              "import fp8comm in this process before splitting");
  auto group = splitter(c10::intrusive_ptr<ProcessGroupFp8>::unsafe_reclaim_from_nonowning(this), store, ranks,
                        opts);
  LastSplit made{c10::weak_intrusive_ptr<c10d::Store>(store), std::nullopt};
  if (group) made.group = c10::weak_intrusive_ptr<c10d::Backend>(group);
  last_split_ = std::move(made);
  return group;
}

}  // namespace fp8comm
