#include "stats.h"

namespace fp8comm {

namespace {

void add(NodeBytes& to, const NodeBytes& bytes) {
  to.intra_node += bytes.intra_node;
  to.inter_node += bytes.inter_node;
}

}  // namespace

void Stats::record(const std::string& op, Passthrough why, const NodeBytes& bytes_sent,
                   int64_t bytes_sent_uncompressed) {
  const bool compressed = why == Passthrough::kCompressed;
  std::lock_guard<std::mutex> lock(mutex_);
  add(counts_.bytes_sent, bytes_sent);
  counts_.bytes_sent_uncompressed += bytes_sent_uncompressed;
  (compressed ? counts_.calls_compressed : counts_.calls_passthrough) += 1;
  OpStats& of_op = counts_.per_op[op];
  (compressed ? of_op.compressed : of_op.passthrough) += 1;
  add(of_op.bytes_sent, bytes_sent);
  of_op.bytes_sent_uncompressed += bytes_sent_uncompressed;
  if (!compressed) of_op.passthrough_reasons[why] += 1;
}

void Stats::record_error(const std::string& op, const QuantizationError& error) {
  std::lock_guard<std::mutex> lock(mutex_);
  errors_[op] += error;
}

std::map<std::string, QuantizationError> Stats::errors() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return errors_;
}

StatsSnapshot Stats::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counts_;
}

void Stats::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  counts_ = {};
  errors_.clear();
}

}  // namespace fp8comm
