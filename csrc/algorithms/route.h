#pragma once
// Which variant of an algorithm a compressed call runs (DESIGN.md,
// "Topology"): the flat one over the whole group, or, in the inter_node scope
// on a group of several nodes of several ranks, the by-node one. Either way
// the Route returns what this rank sent in it, as its transports counted it
// (Transport::bytes_sent), split into bytes to ranks on its own node and to
// other nodes (stats). Each algorithm's entry over a Route is its row of
// compressed_algorithms.h.
#include <functional>
#include <optional>
#include <vector>

#include "../common/node_bytes.h"
#include "algorithms.h"

namespace fp8comm {

struct Route {
  Transport& group_transport;
  NodeTransports* nodes = nullptr;  // set: the by-node algorithms
  int64_t ranks_on_my_node = 1;     // this rank's node's ranks in the group, itself included
  // The node of each group rank, where every node holds as many of them
  // (the topology's group ranks); empty: not known.
  std::vector<int64_t> node_of;

  // Runs `flat` over the group's transport, or `by_node` over the node
  // transports where there are some; returns the bytes they sent in it. By
  // node: the intra transport's to this node, the inter transport's to
  // others. Flat: every exchange sends each peer the same bytes, so the
  // group transport's count splits by the share of peers on this node.
  NodeBytes run(const std::function<void(Transport&)>& flat, const std::function<void(NodeTransports&)>& by_node);

  // The wire of a slice for each group rank, sent over the group transport
  // (all_to_all's slices): `wire`; in the inter_node scope, for ranks on
  // this node the node's own format (node_wire_format) or none (exact).
  std::vector<std::optional<WireLayout>> slice_wires(const WireLayout& wire) const;
  // Whether group rank r is on this rank's node (false where not known).
  bool on_my_node(int64_t r) const;
  // `bytes` the group transport sent, of which to_rank[r] went to rank r:
  // split by node where node_of is known, else by the share of peers on
  // this node.
  NodeBytes split(int64_t bytes, const std::vector<int64_t>& to_rank) const;
  // `bytes` spread evenly over the P - 1 peers of a rank with
  // ranks_on_my_node - 1 of them on its node (split's rule where to_rank is
  // not given, also for the bytes of a plain collective: collectives.h).
  static NodeBytes split_evenly(int64_t bytes, int64_t P, int64_t ranks_on_my_node);
};

}  // namespace fp8comm
