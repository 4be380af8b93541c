#pragma once
// Which algorithm a compressed call runs (DESIGN.md, "Topology"): the flat
// one over the whole group, or, in the inter_node scope on a group of several
// nodes of several ranks, the by-node one. Each returns what this rank sends,
// split into bytes to ranks on its own node and to other nodes.
#include "algorithms.h"

namespace fp8comm {

struct Route {
  Transport& group;
  NodeTransports* nodes = nullptr;  // set: the by-node algorithms
  int64_t ranks_on_my_node = 1;     // this rank's node's ranks in the group, itself included

  // Bytes the flat algorithms send, evenly to every peer, split by where the peers are.
  NodeBytes evenly(int64_t bytes) const;
};

// `error`: where the quantization error is added (Options.track_error), or null.
NodeBytes all_reduce(Route& route, const WireLayout& wire, Workspace& ws, const at::Tensor& tensor,
                     const Reduction& red, QuantizationError* error);
NodeBytes reduce_scatter(Route& route, const WireLayout& wire, Workspace& ws, const at::Tensor& output,
                         const std::vector<at::Tensor>& input_segments, const Reduction& red, QuantizationError* error);
NodeBytes all_gather(Route& route, const WireLayout& wire, Workspace& ws, const std::vector<at::Tensor>& output_segments,
                     const at::Tensor& input, QuantizationError* error);

}  // namespace fp8comm
