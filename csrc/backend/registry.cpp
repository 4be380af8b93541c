#include "registry.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <map>
#include <mutex>

namespace fp8comm {
namespace {

struct Entry {
  c10::weak_intrusive_ptr<ProcessGroupFp8> backend;
  c10::weak_intrusive_ptr<c10d::Store> group_store;
};

std::mutex registry_mutex;
std::map<std::string, Entry>& registry() {
  static std::map<std::string, Entry> entries;
  return entries;
}

// torch hands each device's creator PrefixStore("<device>/", group_store):
// the group store identifies one group creation.
c10::intrusive_ptr<c10d::Store> group_store_of(const c10::intrusive_ptr<c10d::Store>& store) {
  if (auto* prefix = dynamic_cast<c10d::PrefixStore*>(store.get())) return prefix->getUnderlyingStore();
  return store;
}

}  // namespace

c10::intrusive_ptr<ProcessGroupFp8> attach_or_create(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                     int size, const std::string& group_id,
                                                     c10::DeviceType device_type,
                                                     c10::intrusive_ptr<c10d::Backend> inner,
                                                     c10::intrusive_ptr<Options> options) {
  const auto group_store = group_store_of(store);
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto& entries = registry();
  for (auto it = entries.begin(); it != entries.end();) {  // forget destroyed groups
    it = it->second.backend.expired() ? entries.erase(it) : std::next(it);
  }
  auto found = entries.find(group_id);
  if (found != entries.end()) {
    auto existing = found->second.backend.lock();
    auto existing_store = found->second.group_store.lock();
    if (existing && existing_store && existing_store.get() == group_store.get() &&
        !existing->has_transport(device_type)) {
      existing->add_transport(device_type, std::move(inner));
      return existing;
    }
  }
  auto backend = c10::make_intrusive<ProcessGroupFp8>(rank, size, std::move(options), store);
  backend->add_transport(device_type, std::move(inner));
  entries.erase(group_id);
  entries.emplace(group_id, Entry{c10::weak_intrusive_ptr<ProcessGroupFp8>(backend),
                                  c10::weak_intrusive_ptr<c10d::Store>(group_store)});
  return backend;
}

}  // namespace fp8comm
