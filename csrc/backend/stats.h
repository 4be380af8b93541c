#pragma once
// Communication counters of one process group (DESIGN.md, "Stats").
// bytes_sent counts what this rank sends to its peers under the standard
// algorithm volumes; bytes_sent_uncompressed the same calls sent as they were.
#include <stdint.h>

#include <map>
#include <mutex>
#include <string>

namespace fp8comm {

class Stats {
 public:
  void record(const std::string& op, bool compressed, int64_t bytes_sent, int64_t bytes_sent_uncompressed);
  // Flat map: bytes_sent, bytes_sent_uncompressed, calls_compressed,
  // calls_passthrough, and "<op>.compressed" / "<op>.passthrough" counts.
  std::map<std::string, int64_t> snapshot() const;
  void reset();

 private:
  mutable std::mutex mutex_;
  int64_t bytes_sent_ = 0;
  int64_t bytes_sent_uncompressed_ = 0;
  int64_t calls_compressed_ = 0;
  int64_t calls_passthrough_ = 0;
  std::map<std::string, int64_t> per_op_;
};

}  // namespace fp8comm
