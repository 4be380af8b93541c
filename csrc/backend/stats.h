#pragma once
// Communication counters of one process group (DESIGN.md, "Stats").
// bytes_sent counts what this rank sends to its peers: what the transports
// sent for a compressed call, the ring volumes for a passthrough call
// (DESIGN.md, "Stats"); bytes_sent_uncompressed the same calls sent as they were.
//
// A call is recorded once it has been issued (done on the CPU, enqueued on
// CUDA): calls refused by a check, here or in the inner backend, and CPU calls
// that fail in the transport are not counted. Per-op counts are keyed by the
// entry point the caller used (c10d's name: all_reduce, all_reduce_coalesced,
// reduce_scatter_tensor, reduce_scatter, reduce_scatter_tensor_coalesced,
// all_gather_into_tensor, all_gather, all_gather_into_tensor_coalesced, ...).
// The *_tensor_coalesced forms count one collective per tensor (each
// compressed or passed through as it would be alone); all_reduce_coalesced
// counts one (one all_reduce of the concatenation).
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

namespace fp8comm {

class Stats {
 public:
  void record(const std::string& op, bool compressed, const NodeBytes& bytes_sent, int64_t bytes_sent_uncompressed);
  void record_error(const std::string& op, const QuantizationError& error);
  // Flat map: bytes_sent, bytes_sent_intra_node, bytes_sent_inter_node, bytes_sent_uncompressed, calls_compressed,
  // calls_passthrough, and "<op>.compressed" / "<op>.passthrough" counts.
  std::map<std::string, int64_t> snapshot() const;
  // The errors recorded since the last reset, by op.
  std::map<std::string, QuantizationError> errors() const;
  void reset();

 private:
  mutable std::mutex mutex_;
  NodeBytes bytes_sent_;
  int64_t bytes_sent_uncompressed_ = 0;
  int64_t calls_compressed_ = 0;
  int64_t calls_passthrough_ = 0;
  std::map<std::string, int64_t> per_op_;
  std::map<std::string, QuantizationError> errors_;
};

}  // namespace fp8comm
