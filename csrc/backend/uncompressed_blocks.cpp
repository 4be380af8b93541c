#include "uncompressed_blocks.h"

#include <c10/util/Exception.h>

namespace fp8comm {

namespace {

const std::vector<uint8_t> kSet{'1'};

}  // namespace

UncompressedBlocks::UncompressedBlocks(c10::intrusive_ptr<c10d::Store> store, int rank, int size)
    : store_(std::move(store)), rank_(rank), size_(size) {}

std::string UncompressedBlocks::prefix(int64_t number, const char* direction) const {
  return "fp8comm/uncompressed/" + std::to_string(number) + "/" + direction + "/";
}

void UncompressedBlocks::leave() {
  TORCH_CHECK(depth_.load() > 0, "fp8comm.uncompressed: leaving a block that was not entered");
  --depth_;
}

void UncompressedBlocks::switch_alone() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++switches_;
}

void UncompressedBlocks::switch_together(const char* direction, std::optional<std::chrono::milliseconds> timeout) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(store_, "fp8comm.uncompressed: this process group was created without a store, which the ranks need to "
              "switch together; create it through init_process_group / new_group");
  const char* rule =
      " Every rank of the group must enter and leave fp8comm.uncompressed(group) at the same point of its calls "
      "on the group: it is collective (a rank that leaves a block on an exception does not wait for the others).";
  TORCH_CHECK(failed_.empty(), "fp8comm.uncompressed: this group switches no more, since an earlier switch failed (",
              failed_, "); destroy and recreate the group to use uncompressed blocks on it again.");
  const std::string p = prefix(switches_++, direction);
  store_->set(p + "rank/" + std::to_string(rank_), kSet);
  const int64_t arrived = store_->add(p + "arrived", 1);
  if (arrived > size_) {  // a rank gave up on this switch (below) before this one came
    failed_ = c10::str("rank ", rank_, " came to ", direction, " a block after another rank had stopped waiting");
    TORCH_CHECK(false, "fp8comm.uncompressed: ", failed_, ".", rule);
  }
  if (arrived == size_) store_->set(p + "all", kSet);
  const std::chrono::milliseconds wait_for = timeout.value_or(store_->getTimeout());
  bool came = true;
  std::string why;
  try {
    store_->wait({p + "all"}, wait_for);
  } catch (const c10::Error& e) {  // a timeout (TCPStore: DistStoreError; FileStore: a plain error)
    came = false;
    why = e.what_without_backtrace();
  }
  if (came || every_rank_came(p)) {
    forget_previous(p);
    return;
  }
  failed_ = c10::str("rank ", rank_, " waited ", wait_for.count() / 1000.0, " s for every rank to ", direction,
                     " a block; rank(s) ", missing_ranks(p), " did not (the store said: ", why, ")");
  TORCH_CHECK(false, "fp8comm.uncompressed: ", failed_, ".", rule);
}

// Pushes the count past P by P + 1 (so it still tells the arrivals, modulo
// P + 1): a rank that comes later fails at once instead of passing alone.
// Whether every rank had come by then.
bool UncompressedBlocks::every_rank_came(const std::string& prefix) {
  const int64_t mark = static_cast<int64_t>(size_) + 1;
  return store_->add(prefix + "arrived", mark) % mark == size_;
}

std::string UncompressedBlocks::missing_ranks(const std::string& prefix) {
  std::string missing;
  for (int r = 0; r < size_; ++r) {
    if (!store_->check({prefix + "rank/" + std::to_string(r)})) {
      missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
  }
  return missing;
}

void UncompressedBlocks::forget_previous(const std::string& current) {
  if (!previous_.empty()) {
    store_->deleteKey(previous_ + "rank/" + std::to_string(rank_));
    if (rank_ == 0) {
      store_->deleteKey(previous_ + "arrived");
      store_->deleteKey(previous_ + "all");
    }
  }
  previous_ = current;
}

}  // namespace fp8comm
