#pragma once
// Communication counters of one process group (DESIGN.md, "Stats").
// bytes_sent counts what this rank sends to its peers: what the transports
// sent for a compressed call, nccl-tests' bus volume of the plain collective
// for a passthrough call (DESIGN.md, "Stats"); bytes_sent_uncompressed the
// same calls sent as they were.
//
// A call is recorded once it has been issued (done on the CPU, enqueued on
// CUDA): calls refused by a check, here or in the inner backend, and CPU calls
// that fail in the transport are not counted. Per-op counts are keyed by the
// entry point the caller used (c10d's name: all_reduce, all_reduce_coalesced,
// reduce_scatter_tensor, reduce_scatter, reduce_scatter_tensor_coalesced,
// all_gather_into_tensor, all_gather, all_gather_into_tensor_coalesced, ...).
// The *_tensor_coalesced forms count one collective per tensor (each
// compressed or passed through as it would be alone); all_reduce_coalesced
// counts one (one all_reduce of the concatenation). A passthrough call is
// also counted under its reason (passthrough.h).
//
// With Options.track_error, each compressed call also adds the quantization
// error of the values this rank quantized (algorithms/quantization_error.h)
// under its op's name; fp8comm.get_stats turns the sums into SQNR.
#include <stdint.h>

#include <map>
#include <mutex>
#include <string>

#include "../algorithms/quantization_error.h"
#include "../common/node_bytes.h"
#include "passthrough.h"

namespace fp8comm {

struct OpStats {
  int64_t compressed = 0;
  int64_t passthrough = 0;
  NodeBytes bytes_sent;
  int64_t bytes_sent_uncompressed = 0;
  std::map<Passthrough, int64_t> passthrough_reasons;
};

struct StatsSnapshot {
  NodeBytes bytes_sent;
  int64_t bytes_sent_uncompressed = 0;
  int64_t calls_compressed = 0;
  int64_t calls_passthrough = 0;
  std::map<std::string, OpStats> per_op;
};

class Stats {
 public:
  // One call of `op`: compressed (`why` is Passthrough::kCompressed) or passed through for `why`.
  void record(const std::string& op, Passthrough why, const NodeBytes& bytes_sent, int64_t bytes_sent_uncompressed);
  void record_error(const std::string& op, const QuantizationError& error);
  StatsSnapshot snapshot() const;
  // The errors recorded since the last reset, by op.
  std::map<std::string, QuantizationError> errors() const;
  void reset();

 private:
  mutable std::mutex mutex_;
  StatsSnapshot counts_;
  std::map<std::string, QuantizationError> errors_;
};

}  // namespace fp8comm
