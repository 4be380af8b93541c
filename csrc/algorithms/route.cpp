#include "route.h"

namespace fp8comm {

NodeBytes Route::evenly(int64_t bytes) const {
  const int64_t peers = group.size() - 1;
  if (peers == 0) return {};
  const int64_t intra = bytes * (ranks_on_my_node - 1) / peers;
  return {intra, bytes - intra};
}

NodeBytes all_reduce(Route& route, const WireLayout& wire, Workspace& ws, const at::Tensor& tensor,
                     const Reduction& red, QuantizationError* error) {
  if (route.nodes) {
    all_reduce_by_node(*route.nodes, wire, ws, tensor, red, error);
    return all_reduce_by_node_bytes_sent(route.nodes->inter.size(), route.nodes->intra.size(), wire, tensor.numel(),
                                         tensor.element_size());
  }
  all_reduce(route.group, wire, ws, tensor, red, error);
  return route.evenly(all_reduce_bytes_sent(route.group.size(), wire, tensor.numel()));
}

NodeBytes reduce_scatter(Route& route, const WireLayout& wire, Workspace& ws, const at::Tensor& output,
                         const std::vector<at::Tensor>& input_segments, const Reduction& red, QuantizationError* error) {
  if (route.nodes) {
    reduce_scatter_by_node(*route.nodes, wire, ws, output, input_segments, red, error);
    return reduce_scatter_by_node_bytes_sent(route.nodes->inter.size(), route.nodes->intra.size(), wire,
                                             output.numel(), output.element_size());
  }
  reduce_scatter(route.group, wire, ws, output, input_segments, red, error);
  return route.evenly(reduce_scatter_bytes_sent(route.group.size(), wire, output.numel()));
}

NodeBytes all_gather(Route& route, const WireLayout& wire, Workspace& ws, const std::vector<at::Tensor>& output_segments,
                     const at::Tensor& input, QuantizationError* error) {
  if (route.nodes) {
    all_gather_by_node(*route.nodes, wire, ws, output_segments, input, error);
    return all_gather_by_node_bytes_sent(route.nodes->inter.size(), route.nodes->intra.size(), wire, input.numel(),
                                         input.element_size());
  }
  all_gather(route.group, wire, ws, output_segments, input, error);
  return route.evenly(all_gather_bytes_sent(route.group.size(), wire, input.numel()));
}

}  // namespace fp8comm
