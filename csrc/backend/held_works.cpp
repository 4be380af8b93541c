#include "held_works.h"

#include <pthread.h>

#include <mutex>
#include <utility>

namespace fp8comm {

namespace {

struct Held {
  std::mutex mutex;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
};

// Never destroyed: a Work held at exit is never released. A forked child
// holds none of the parent's Works' threads, so it forgets the parent's,
// left allocated, and starts afresh. fork() waits for held_mutex, so the
// child never starts with it locked by a thread it does not have.
Held* held = nullptr;
std::mutex held_mutex;

Held& the_held() {
  static const bool registered = [] {
    pthread_atfork([] { held_mutex.lock(); }, [] { held_mutex.unlock(); },
                   [] {
                     held = nullptr;
                     held_mutex.unlock();
                   });
    return true;
  }();
  (void)registered;
  std::lock_guard<std::mutex> lock(held_mutex);
  if (held == nullptr) held = new Held();
  return *held;
}

// Adds `more` (may be empty) and takes out the Works only the list holds.
// The caller destroys those after the lock is released: destroying one
// may take the GIL.
std::vector<c10::intrusive_ptr<c10d::Work>> add_and_take_unshared(
    const std::vector<c10::intrusive_ptr<c10d::Work>>& more) {
  Held& h = the_held();
  std::vector<c10::intrusive_ptr<c10d::Work>> unshared;
  std::lock_guard<std::mutex> lock(h.mutex);
  auto& works = h.works;
  size_t kept = 0;
  for (auto& work : works) {
    if (work.use_count() == 1) {
      unshared.push_back(std::move(work));
    } else {
      works[kept++] = std::move(work);
    }
  }
  works.resize(kept);
  for (const auto& work : more) {
    if (work) works.push_back(work);
  }
  return unshared;
}

}  // namespace

// Every device's calls let go of the unshared Works: a group whose CPU
// calls stop (a state dict broadcast at start) still frees them.
const c10::intrusive_ptr<c10d::Work>& hold_inner_work(const c10::intrusive_ptr<c10d::Work>& work,
                                                      c10::DeviceType device_type) {
  if (work && device_type == c10::DeviceType::CPU) {
    add_and_take_unshared({work});
  } else {
    add_and_take_unshared({});
  }
  return work;
}

void hold_inner_works(const std::vector<c10::intrusive_ptr<c10d::Work>>& works, c10::DeviceType device_type) {
  add_and_take_unshared(device_type == c10::DeviceType::CPU ? works : std::vector<c10::intrusive_ptr<c10d::Work>>{});
}

void release_unshared_inner_works() { add_and_take_unshared({}); }

int64_t held_inner_works() {
  Held& h = the_held();
  std::lock_guard<std::mutex> lock(h.mutex);
  return static_cast<int64_t>(h.works.size());
}

}  // namespace fp8comm
