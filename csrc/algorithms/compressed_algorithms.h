#pragma once
// The compressed algorithms (DESIGN.md, "Algorithms"), as one table: each
// one's name (as Options.compress and FP8COMM_COMPRESS spell it), the
// segment-header phases it puts on the wire (their bytes and what errors call
// them), whether compress="all" names it, its entry over a Route (flat,
// or by node where the route says), and its prepare step where it has one.
// A row of the collectives table (csrc/backend/collectives.h) points at the
// algorithm that serves it; the options' op names and errors, the `compress`
// doc string and the dispatch of a compressed call all read this table.
//
// A new compressed algorithm is its file here (the algorithm, and its entry
// over a Route defined beside it, with its prepare step if it needs one) and
// its row below.
#include <ATen/core/Tensor.h>

#include <stddef.h>

#include <string>
#include <vector>

#include "route.h"
#include "segment_header.h"

namespace fp8comm {

// What a compressed call hands its algorithm: contiguous tensors; the
// algorithm writes the outputs only once every phase is through (algorithms.h).
struct CompressedArgs {
  // all_reduce: the buffer, reduced in place; reduce_scatter: one; all_gather: P segments; all_to_all: one
  std::vector<at::Tensor> outputs;
  // all_reduce: none; reduce_scatter: P segments; all_gather: one; all_to_all: one
  std::vector<at::Tensor> inputs;
  const Reduction* reduction = nullptr;  // all_reduce, reduce_scatter
  // Error feedback (all_reduce, reduce_scatter of one flat input): where the
  // call keeps what the wire dropped of each input element (algorithms.h);
  // undefined: nothing kept.
  at::Tensor residual;
  // all_to_all: the elements of the input for each rank and of the output
  // from each rank, in rank order (checked against every rank's: all_to_all_splits.h).
  std::vector<int64_t> send_numels, recv_numels;
  int64_t root = 0;  // reduce: the group rank whose tensor receives the result
};

// Runs one algorithm over the call's Route; returns the bytes this rank sent.
// `error`: where the quantization error is added (Options.track_error), or null.
using RunCompressed = NodeBytes (*)(Route& route, const WireLayout& wire, Workspace& ws, const CompressedArgs& args,
                                    QuantizationError* error);

// What a prepare step found: the elements per rank the size rule
// (Options.min_numel) reads, the same on every rank, and the bytes it sent.
struct Prepared {
  int64_t per_rank_numel = 0;
  NodeBytes sent;
};

// A collective step every rank runs before a call is decided, where every
// rule but the size lets it be compressed (all_to_all: the ranks gather and
// check each other's slice sizes, so that sizes that disagree raise on every
// rank and every rank decides on the group's mean size). `shape`: the call's
// arguments without their tensors (CompressedArgs' sizes); `device`: the
// tensors'. Raises, the same on every rank, where the call cannot run.
using PrepareCompressed = Prepared (*)(Route& route, const CompressedArgs& shape, const at::Device& device);

struct CompressedAlgorithm {
  static constexpr size_t kMaxPhases = 2;
  const char* name;
  Phase phases[kMaxPhases];  // the first num_phases, in the order they go on the wire
  size_t num_phases;
  // Whether compress="all" (and FP8COMM_COMPRESS=all) names it. A compressed
  // algorithm added later is not: "all" keeps meaning what it meant, and the
  // new one compresses only where it is named (DESIGN.md, "Options").
  bool in_all;
  RunCompressed run;
  PrepareCompressed prepare = nullptr;  // none: the call is decided on this rank's own arguments
};

namespace compressed {

// Each algorithm's entry over a Route, defined in its file.
NodeBytes run_all_reduce(Route& route, const WireLayout& wire, Workspace& ws, const CompressedArgs& args,
                         QuantizationError* error);
NodeBytes run_reduce_scatter(Route& route, const WireLayout& wire, Workspace& ws, const CompressedArgs& args,
                             QuantizationError* error);
NodeBytes run_all_gather(Route& route, const WireLayout& wire, Workspace& ws, const CompressedArgs& args,
                         QuantizationError* error);
NodeBytes run_all_to_all(Route& route, const WireLayout& wire, Workspace& ws, const CompressedArgs& args,
                         QuantizationError* error);
Prepared prepare_all_to_all(Route& route, const CompressedArgs& shape, const at::Device& device);
NodeBytes run_reduce(Route& route, const WireLayout& wire, Workspace& ws, const CompressedArgs& args,
                     QuantizationError* error);

// A phase's byte never changes: ranks of different builds must read each other's headers.
// clang-format off
inline constexpr CompressedAlgorithm kAllReduce{"all_reduce", {{1, "the reduce phase of an all_reduce"}, {2, "the gather phase of an all_reduce"}}, 2, true, &run_all_reduce};
inline constexpr CompressedAlgorithm kReduceScatter{"reduce_scatter", {{3, "a reduce_scatter"}}, 1, true, &run_reduce_scatter};
inline constexpr CompressedAlgorithm kAllGather{"all_gather", {{4, "an all_gather"}}, 1, true, &run_all_gather};
inline constexpr CompressedAlgorithm kAllToAll{"all_to_all", {{5, "an all_to_all"}}, 1, false, &run_all_to_all, &prepare_all_to_all};
// Its reduce_scatter phase is reduce_scatter's (3) and goes on the wire as one.
inline constexpr CompressedAlgorithm kReduce{"reduce", {{6, "the gather phase of a reduce"}}, 1, false, &run_reduce};
// clang-format on

// Every compressed algorithm, in the order Options.compress lists them.
inline constexpr const CompressedAlgorithm* kAll[] = {&kAllReduce, &kReduceScatter, &kAllGather, &kAllToAll, &kReduce};

// No two phases of any algorithms share a byte, and none is 0 (never written).
constexpr bool phases_distinct() {
  for (const CompressedAlgorithm* a : kAll) {
    for (size_t i = 0; i < a->num_phases; ++i) {
      if (a->phases[i].wire == 0) return false;
      for (const CompressedAlgorithm* b : kAll) {
        for (size_t j = 0; j < b->num_phases; ++j) {
          if ((a != b || i != j) && a->phases[i].wire == b->phases[j].wire) return false;
        }
      }
    }
  }
  return true;
}
static_assert(phases_distinct(), "each phase of each compressed algorithm needs its own nonzero byte");

// Their names, in that order; with in_all_only, those compress="all" names.
inline std::vector<std::string> names(bool in_all_only = false) {
  std::vector<std::string> out;
  for (const CompressedAlgorithm* a : kAll) {
    if (a->in_all || !in_all_only) out.emplace_back(a->name);
  }
  return out;
}

}  // namespace compressed

}  // namespace fp8comm
