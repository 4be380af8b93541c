#pragma once
// Blocks of calls that pass through exactly (fp8comm.uncompressed), each
// switch agreed by every rank through the group's store: DESIGN.md,
// "Uncompressed blocks".
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <string>

namespace fp8comm {

class UncompressedBlocks {
 public:
  // Without a store every switch is refused.
  UncompressedBlocks(c10::intrusive_ptr<c10d::Store> store, int rank, int size);

  // Whether calls pass through now: inside at least one block.
  bool active() const { return depth_.load() > 0; }
  int depth() const { return depth_.load(); }

  // Waits until every rank has made this switch ("enter" or "leave"); the
  // store's timeout when none is given.
  void switch_together(const char* direction, std::optional<std::chrono::milliseconds> timeout);
  // A switch this rank makes without waiting (leaving a block on an
  // exception): numbered as the others, so the next switch still matches.
  void switch_alone();
  void enter() { ++depth_; }
  void leave();

 private:
  std::string prefix(int64_t number, const char* direction) const;
  // After a failed wait for switch `prefix`: whether every rank had come
  // after all (and, if not, that later ones will fail at once); which did not.
  bool every_rank_came(const std::string& prefix);
  std::string missing_ranks(const std::string& prefix);
  // Removes the keys of this rank's previous switch (every rank has passed it).
  void forget_previous(const std::string& current);

  c10::intrusive_ptr<c10d::Store> store_;
  int rank_, size_;
  std::atomic<int> depth_{0};
  std::mutex mutex_;  // one switch at a time
  int64_t switches_ = 0;
  std::string previous_;  // the key prefix of this rank's previous checked switch
  std::string failed_;    // why an earlier switch failed; then every switch is refused
};

}  // namespace fp8comm
