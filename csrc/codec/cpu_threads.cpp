#include "cpu_threads.h"

#include <c10/util/Exception.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../common/env.h"

namespace fp8comm {

namespace {

int threads_from_environment() {
  const auto raw = env::kCpuThreads.read();
  if (!raw) return available_cores();
  try {
    size_t used = 0;
    const int n = std::stoi(*raw, &used);
    if (used == raw->size() && n >= 1) return n;
  } catch (const std::exception&) {
  }
  TORCH_CHECK_VALUE(false, "fp8comm: ", env::kCpuThreads.name, " must be a positive integer (threads per process "
                    "for the CPU codec), got '", *raw, "'");
}

std::atomic<int>& thread_count() {
  static std::atomic<int> n{threads_from_environment()};
  return n;
}

// Workers wait for a new generation of work; the caller takes ranges too, so
// a call with k ranges wakes at most k - 1 workers.
class Pool {
 public:
  void run(int64_t total, int64_t chunk, int64_t ranges, const std::function<void(int64_t, int64_t)>& fn) {
    grow(static_cast<int>(ranges) - 1);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      fn_ = &fn;
      total_ = total;
      chunk_ = chunk;
      next_.store(0);
      needed_ = active_ = static_cast<int>(ranges) - 1;
      error_ = nullptr;
      ++generation_;
    }
    wake_.notify_all();
    take_ranges();
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return active_ == 0; });
    fn_ = nullptr;
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  void grow(int workers) {
    while (static_cast<int>(threads_.size()) < workers) {
      const int index = static_cast<int>(threads_.size());
      threads_.emplace_back([this, index] { work(index); });
      threads_.back().detach();  // the pool lives as long as the process
    }
  }

  void work(int index) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        if (index >= needed_) continue;  // this call needs fewer workers
      }
      take_ranges();
      std::lock_guard<std::mutex> lock(mutex_);
      if (--active_ == 0) done_.notify_one();
    }
  }

  void take_ranges() {
    for (;;) {
      const int64_t begin = next_.fetch_add(chunk_);
      if (begin >= total_) return;
      try {
        (*fn_)(begin, std::min(total_, begin + chunk_));
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!error_) error_ = std::current_exception();
      }
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> threads_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t total_ = 0, chunk_ = 1;
  std::atomic<int64_t> next_{0};
  int needed_ = 0;  // workers [0, needed_) take part in the current call
  int active_ = 0;  // of those, the ones still running
  uint64_t generation_ = 0;
  std::exception_ptr error_;
};

// One pool per process, and the lock that gives it to one call at a time. A
// forked child has none of the parent's threads (and maybe a held lock), so
// it forgets the parent's state, left allocated, and makes its own.
struct Shared {
  Pool pool;
  std::mutex call_mutex;
};
Shared* shared = nullptr;
std::mutex shared_mutex;

Shared& the_shared() {
  static const bool registered = [] {
    pthread_atfork(nullptr, nullptr, [] { shared = nullptr; });
    return true;
  }();
  (void)registered;
  std::lock_guard<std::mutex> lock(shared_mutex);
  if (shared == nullptr) shared = new Shared();
  return *shared;
}

}  // namespace

int available_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

int cpu_threads() { return thread_count().load(std::memory_order_relaxed); }

int set_cpu_threads(int n) {
  TORCH_CHECK_VALUE(n >= 1, "fp8comm: the CPU codec needs at least 1 thread, got ", n);
  return thread_count().exchange(n);
}

void parallel_blocks(int64_t total, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (total <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t ranges = std::min<int64_t>(cpu_threads(), (total + grain - 1) / grain);
  if (ranges <= 1) {
    fn(0, total);
    return;
  }
  Shared& s = the_shared();
  std::unique_lock<std::mutex> lock(s.call_mutex, std::try_to_lock);
  if (!lock.owns_lock()) {
    fn(0, total);
    return;
  }
  s.pool.run(total, (total + ranges - 1) / ranges, ranges, fn);
}

}  // namespace fp8comm
