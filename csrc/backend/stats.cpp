#include "stats.h"

namespace fp8comm {

void Stats::record(const std::string& op, bool compressed, const NodeBytes& bytes_sent,
                   int64_t bytes_sent_uncompressed) {
  std::lock_guard<std::mutex> lock(mutex_);
  bytes_sent_.intra_node += bytes_sent.intra_node;
  bytes_sent_.inter_node += bytes_sent.inter_node;
  bytes_sent_uncompressed_ += bytes_sent_uncompressed;
  (compressed ? calls_compressed_ : calls_passthrough_) += 1;
  per_op_[op + (compressed ? ".compressed" : ".passthrough")] += 1;
}

void Stats::record_error(const std::string& op, const QuantizationError& error) {
  std::lock_guard<std::mutex> lock(mutex_);
  errors_[op] += error;
}

std::map<std::string, QuantizationError> Stats::errors() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return errors_;
}

std::map<std::string, int64_t> Stats::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::map<std::string, int64_t> out = per_op_;
  out["bytes_sent"] = bytes_sent_.intra_node + bytes_sent_.inter_node;
  out["bytes_sent_intra_node"] = bytes_sent_.intra_node;
  out["bytes_sent_inter_node"] = bytes_sent_.inter_node;
  out["bytes_sent_uncompressed"] = bytes_sent_uncompressed_;
  out["calls_compressed"] = calls_compressed_;
  out["calls_passthrough"] = calls_passthrough_;
  return out;
}

void Stats::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  bytes_sent_ = {};
  bytes_sent_uncompressed_ = calls_compressed_ = calls_passthrough_ = 0;
  per_op_.clear();
  errors_.clear();
}

}  // namespace fp8comm
