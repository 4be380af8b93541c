#include "route.h"

namespace fp8comm {

NodeBytes Route::run(const std::function<void(Transport&)>& flat,
                     const std::function<void(NodeTransports&)>& by_node) {
  if (nodes) {
    const int64_t intra = nodes->intra.bytes_sent(), inter = nodes->inter.bytes_sent();
    by_node(*nodes);
    return {nodes->intra.bytes_sent() - intra, nodes->inter.bytes_sent() - inter};
  }
  const int64_t before = group.bytes_sent();
  flat(group);
  const int64_t bytes = group.bytes_sent() - before, peers = group.size() - 1;
  if (peers == 0) return {};
  const int64_t intra = bytes * (ranks_on_my_node - 1) / peers;
  return {intra, bytes - intra};
}

NodeBytes all_reduce(Route& route, const WireLayout& wire, Workspace& ws, const at::Tensor& tensor,
                     const Reduction& red, QuantizationError* error) {
  return route.run([&](Transport& t) { all_reduce(t, wire, ws, tensor, red, error); },
                   [&](NodeTransports& g) { all_reduce_by_node(g, wire, ws, tensor, red, error); });
}

NodeBytes reduce_scatter(Route& route, const WireLayout& wire, Workspace& ws, const at::Tensor& output,
                         const std::vector<at::Tensor>& input_segments, const Reduction& red, QuantizationError* error) {
  const std::vector<at::Tensor>& in = input_segments;
  return route.run([&](Transport& t) { reduce_scatter(t, wire, ws, output, in, red, error); },
                   [&](NodeTransports& g) { reduce_scatter_by_node(g, wire, ws, output, in, red, error); });
}

NodeBytes all_gather(Route& route, const WireLayout& wire, Workspace& ws, const std::vector<at::Tensor>& output_segments,
                     const at::Tensor& input, QuantizationError* error) {
  const std::vector<at::Tensor>& out = output_segments;
  return route.run([&](Transport& t) { all_gather(t, wire, ws, out, input, error); },
                   [&](NodeTransports& g) { all_gather_by_node(g, wire, ws, out, input, error); });
}

}  // namespace fp8comm
