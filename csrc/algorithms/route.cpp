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
  const int64_t bytes = group_transport.bytes_sent() - before, peers = group_transport.size() - 1;
  if (peers == 0) return {};
  const int64_t intra = bytes * (ranks_on_my_node - 1) / peers;
  return {intra, bytes - intra};
}

}  // namespace fp8comm
