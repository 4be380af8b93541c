#pragma once
// The options of one fp8nccl / fp8gloo process group (DESIGN.md, "Options"),
// c10d style: a c10d::Backend::Options, bound to Python as fp8comm.Options
// and passed as `pg_options`. A field left unset takes its FP8COMM_*
// environment variable (csrc/common/env.h), then that variable's fallback;
// resolved() fills and checks every field, once, at group creation.
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "../codec/fp8_dtype_table.h"
#include "../codec/rounding.h"
#include "collectives.h"

namespace fp8comm {

// Which links carry FP8 (DESIGN.md, "Topology"): every link, or only the
// hop between nodes (exact inside a node).
enum class Scope : uint8_t { kAll, kInterNode };
const char* scope_name(Scope scope);
std::optional<Scope> find_scope(const std::string& name);

struct Options : c10d::Backend::Options {
  static constexpr const char* kBackendName = "fp8comm";
  // The collectives that have a compressed algorithm, as `compress` names
  // them: the names of compressed::kAll (compressed_algorithms.h), in its order.
  static const std::vector<std::string>& compressible_ops();

  Options() : c10d::Backend::Options(kBackendName) {}

  std::optional<int64_t> block_size;
  // The element format of every compressed hop (fp8_block_math.h, WireTraits).
  std::optional<WireFormat> wire_format;
  std::optional<int64_t> min_numel;                 // per-rank elements below which calls pass through
  std::optional<std::vector<std::string>> compress;  // a subset of compressible_ops(), in their order
  std::optional<Scope> scope;
  // The inter_node scope's phases inside a node: "exact", or the name of the
  // wire format they are compressed in (DESIGN.md, "Topology").
  std::optional<std::string> node_wire_format;
  // How compressed collectives round to FP8 (DESIGN.md, "Stochastic
  // rounding"), and the seed of stochastic rounding's random bits.
  std::optional<Rounding> rounding;
  std::optional<int64_t> rounding_seed;
  // Threads per process for the CPU codec; unset after resolved(): the
  // process's share of its host's cores (backend.py). Per process, so not
  // in the fingerprint.
  std::optional<int64_t> cpu_threads;
  // Whether each compressed call measures the quantization error of what
  // this rank put on the wire (Stats). Per process and it changes no byte
  // on the wire, so not in the fingerprint; CPU transports only.
  std::optional<bool> track_error;

  // A copy with every field set (from the environment where unset) and
  // checked; raises ValueError naming the field or variable otherwise.
  c10::intrusive_ptr<Options> resolved() const;

  // Of a resolved Options:
  // Whether `algorithm` (null: none, never) is switched on.
  bool compresses(const CompressedAlgorithm* algorithm) const;
  // The wire format of the phases inside a node; none: exact.
  std::optional<WireFormat> node_format() const;
  // What every rank of a group must agree on, by name: each changes the
  // bytes or the calls on the wire (device segments carry no header).
  std::map<std::string, std::string> fingerprint() const;
};

// "all_reduce,reduce_scatter", "all", "none" or a list -> the ops, checked
// against compressible_ops(); `where` names the source in errors.
std::vector<std::string> parse_compress(const std::vector<std::string>& items, const std::string& where);
std::vector<std::string> split_commas(const std::string& s);
// Checks a node_wire_format name ("exact" or a wire format's); `where` names the source.
void check_node_wire_format(const std::string& name, const std::string& where);

}  // namespace fp8comm
