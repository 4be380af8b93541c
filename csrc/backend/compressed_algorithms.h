#pragma once
// The compressed algorithms a collective can take (DESIGN.md, "Algorithms"),
// as one table: each one's name (as Options.compress and FP8COMM_COMPRESS
// spell it, and as errors name its phases), the segment-header phases it puts
// on the wire, and the function that runs it over a Route. A row of the
// collectives table (collectives.h) points at the algorithm that serves it;
// the options' op names and errors, the `compress` doc string and the
// dispatch of a compressed call (ProcessGroupFp8::compressed_call) all read
// this table.
#include <ATen/core/Tensor.h>

#include <stddef.h>

#include <string>
#include <vector>

#include "../algorithms/route.h"
#include "../algorithms/segment_header.h"

namespace fp8comm {

// What a compressed call hands its algorithm: contiguous tensors; the
// algorithm writes the outputs only once every phase is through (algorithms.h).
struct CompressedArgs {
  // all_reduce: the buffer, reduced in place; reduce_scatter: one; all_gather: P segments
  std::vector<at::Tensor> outputs;
  std::vector<at::Tensor> inputs;        // all_reduce: none; reduce_scatter: P segments; all_gather: one
  const Reduction* reduction = nullptr;  // all_reduce, reduce_scatter
};

// Runs one algorithm over the call's Route; returns the bytes this rank sent.
// `error`: where the quantization error is added (Options.track_error), or null.
using RunCompressed = NodeBytes (*)(Route& route, const WireLayout& wire, Workspace& ws, const CompressedArgs& args,
                                    QuantizationError* error);

struct CompressedAlgorithm {
  static constexpr size_t kMaxPhases = 2;
  const char* name;
  Phase phases[kMaxPhases];  // the first num_phases, in the order they go on the wire
  size_t num_phases;
  RunCompressed run;
};

namespace compressed {

inline NodeBytes run_all_reduce(Route& route, const WireLayout& wire, Workspace& ws, const CompressedArgs& a,
                                QuantizationError* error) {
  return all_reduce(route, wire, ws, a.outputs.at(0), *a.reduction, error);
}
inline NodeBytes run_reduce_scatter(Route& route, const WireLayout& wire, Workspace& ws, const CompressedArgs& a,
                                    QuantizationError* error) {
  return reduce_scatter(route, wire, ws, a.outputs.at(0), a.inputs, *a.reduction, error);
}
inline NodeBytes run_all_gather(Route& route, const WireLayout& wire, Workspace& ws, const CompressedArgs& a,
                                QuantizationError* error) {
  return all_gather(route, wire, ws, a.outputs, a.inputs.at(0), error);
}

// clang-format off
inline constexpr CompressedAlgorithm kAllReduce{"all_reduce", {Phase::kAllReducePieces, Phase::kAllReduceSums}, 2, &run_all_reduce};
inline constexpr CompressedAlgorithm kReduceScatter{"reduce_scatter", {Phase::kReduceScatterPieces}, 1, &run_reduce_scatter};
inline constexpr CompressedAlgorithm kAllGather{"all_gather", {Phase::kAllGatherInputs}, 1, &run_all_gather};
// clang-format on

// Every compressed algorithm, in the order Options.compress lists them.
inline constexpr const CompressedAlgorithm* kAll[] = {&kAllReduce, &kReduceScatter, &kAllGather};

// Their names, in that order.
inline std::vector<std::string> names() {
  std::vector<std::string> out;
  for (const CompressedAlgorithm* a : kAll) out.emplace_back(a->name);
  return out;
}

}  // namespace compressed

}  // namespace fp8comm
