#include "route.h"

namespace fp8comm {

NodeBytes Route::run(const std::function<void(Transport&)>& flat,
                     const std::function<void(NodeTransports&)>& by_node) {
  if (nodes) {
    const int64_t intra = nodes->intra.bytes_sent(), inter = nodes->inter.bytes_sent();
    by_node(*nodes);
    return {nodes->intra.bytes_sent() - intra, nodes->inter.bytes_sent() - inter};
  }
  const int64_t before = group_transport.bytes_sent();
  flat(group_transport);
  return split(group_transport.bytes_sent() - before, {});
}

std::vector<std::optional<WireLayout>> Route::slice_wires(const WireLayout& wire) const {
  std::vector<std::optional<WireLayout>> wires(group_transport.size(), wire);
  if (!nodes) return wires;
  for (int64_t r = 0; r < group_transport.size(); ++r) {
    if (!on_my_node(r)) continue;
    wires[r] = nodes->node_format ? std::optional<WireLayout>(wire.for_node_phase(*nodes->node_format, 0))
                                  : std::nullopt;
  }
  return wires;
}

bool Route::on_my_node(int64_t r) const {
  return !node_of.empty() && node_of.at(r) == node_of.at(group_transport.rank());
}

NodeBytes Route::split(int64_t bytes, const std::vector<int64_t>& to_rank) const {
  if (group_transport.size() <= 1) return {};
  if (node_of.empty() || to_rank.empty()) return split_evenly(bytes, group_transport.size(), ranks_on_my_node);
  int64_t intra = 0;
  for (size_t r = 0; r < to_rank.size(); ++r) {
    if (static_cast<int64_t>(r) != group_transport.rank() && on_my_node(r)) intra += to_rank[r];
  }
  return {intra, bytes - intra};
}

NodeBytes Route::split_evenly(int64_t bytes, int64_t P, int64_t ranks_on_my_node) {
  if (P <= 1) return {};
  const int64_t intra = bytes * (ranks_on_my_node - 1) / (P - 1);
  return {intra, bytes - intra};
}

}  // namespace fp8comm
