#pragma once
// The knobs of fp8comm.Options, declared once (DESIGN.md, "Options"), in the
// spirit of NCCL's NCCL_PARAM: one row per knob, and everything else expands
// the rows. X(name, type, values, variable, unset, share, doc):
//   name      the field: Options(name=...), its property, its fingerprint key;
//   type      the field's C++ type (std::optional<type>; option_values.h);
//   values    what it takes: an int range, flag(), choices() of an enum type
//             (their names come from that type's own table, e.g.
//             kWireFormatTable), op_list();
//   variable  the FP8COMM_* variable read when the field is unset
//             (option_variables.h);
//   unset     the value an unset variable stands for, as the variable spells
//             it; `unset_is_rule()` on the values: a rule the backend applies;
//   share     kGroup: every rank must agree (the fingerprint); kRank: per process;
//   doc       what it sets, one sentence (no choices or default: generated).
// Expanded by option_variables.h (the variables), options.h (the fields),
// options.cpp (resolve, fingerprint, docs) and bindings_options.cpp
// (constructor, properties, repr, pickle, ==). A new knob: its row, the code
// that uses it, its test; the README and DESIGN tables are generated from the
// rows (fp8comm/options/; tests/backend/test_options.py shows the expected
// text). It sits on the floor of the types and values it names
// (option_values.h) and includes them: every column compiles wherever the
// table is expanded. The codec, a floor below, does not include it: the one
// knob variable it reads itself is declared for it in common/env.h.

#include "../common/block_size.h"
#include "option_values.h"

// clang-format off
#define FP8C_OPTIONS(X)                                                                                                \
  X(block_size, int64_t, multiple_in(16, kMinBlockSize, kMaxBlockSize), "FP8COMM_BLOCK_SIZE", "32", kGroup,            \
    "elements per block; each block has one scale (unset, a wire format that has one size takes it: nvfp4's 16)") \
  X(wire_format, WireFormat, choices(), "FP8COMM_WIRE_FORMAT", "e4m3", kGroup,                                         \
    "the element format of every compressed hop (in the inter_node scope, of the hop between nodes)")                  \
  X(min_numel, int64_t, at_least(0), "FP8COMM_MIN_NUMEL", "16384", kGroup,                                             \
    "per-rank element count below which a collective passes through exactly (scalars such as the loss or a "           \
    "grad norm stay exact)")                                                                                           \
  X(compress, OpList, op_list(), "FP8COMM_COMPRESS", "all_reduce,reduce_scatter", kGroup,                              \
    "which collectives are compressed")                                                                                \
  X(cpu_threads, int64_t, at_least(1).unset_is_rule(), "FP8COMM_CPU_THREADS", "cores / ranks on the host", kRank,      \
    "threads per process for the CPU codec (its own pool, whose idle threads sleep); unset, the process's share "      \
    "of its host's cores: its ranks are LOCAL_WORLD_SIZE, else the group's ranks with this host name, whatever "       \
    "OMP_NUM_THREADS says")                                                                                            \
  X(scope, Scope, choices(), "FP8COMM_SCOPE", "all", kGroup,                                                           \
    "all compresses every link; inter_node only the hop between nodes (exact inside a node)")                          \
  X(node_wire_format, NodeWire, choices(), "FP8COMM_NODE_WIRE_FORMAT", "exact", kGroup,                                \
    "the inter_node scope's phases inside a node: exact, or compressed in this wire format; anything but exact "       \
    "needs scope inter_node (the variable is not applied to a group given scope all)")                                 \
  X(rounding, Rounding, choices(), "FP8COMM_ROUNDING", "nearest", kGroup,                                              \
    "how compressed collectives round: nearest (even), or stochastic (unbiased, keyed by rounding_seed)")              \
  X(rounding_seed, int64_t, any_int(), "FP8COMM_ROUNDING_SEED", "0", kGroup,                                           \
    "the seed of stochastic rounding's random bits; with the call counter, rank, chunk and segment it keys them, "     \
    "so the same seed gives the same bytes")                                                                           \
  X(track_error, bool, flag(), "FP8COMM_TRACK_ERROR", "0", kRank,                                                      \
    "measures the quantization error of every compressed call on this rank (get_stats: SQNR per op); CPU groups "      \
    "only")
// clang-format on
