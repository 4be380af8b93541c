// reduce: the all_reduce's algorithm with its gather going to the root alone
// (DESIGN.md, "Algorithms"). A compressed reduce_scatter leaves each rank the
// sum of its 1 / P of the tensor (elements r * k.. of the tensor padded with
// zeros to P * k), added in FP32 from the others' quantized pieces onto its
// own; each rank then sends that sum, quantized once more, to the root as an
// all_to_all slice (exact or in the node's format inside the root's node in
// the inter_node scope, as all_to_all's are), and the root keeps its own
// exact. Only the root's tensor is written, once every phase is through;
// every other rank's is only read.
#include "algorithms.h"
#include "compressed_algorithms.h"

namespace fp8comm {

namespace {

// A contiguous tensor of `numel` elements of `like`'s dtype in a workspace slot.
at::Tensor buffer(Workspace& ws, Workspace::Slot slot, int64_t numel, const at::Tensor& like) {
  return ws.bytes(slot, numel * like.element_size(), like).view(like.scalar_type()).view({numel});
}

}  // namespace

NodeBytes compressed::run_reduce(Route& route, const WireLayout& wire, Workspace& ws, const CompressedArgs& a,
                                 QuantizationError* error) {
  TORCH_CHECK_VALUE(!a.residual.defined(), "fp8comm reduce: error feedback (a residual) is kept for all_reduce and "
                    "reduce_scatter only; call reduce without a residual");
  Transport& t = route.group_transport;
  const at::Tensor& tensor = a.outputs.at(0);
  const int64_t P = t.size(), rank = t.rank(), root = a.root, n = tensor.numel(), k = (n + P - 1) / P;
  const at::Tensor flat = tensor.view({-1});

  // What the reduce_scatter reads, P segments of k elements: the tensor, or
  // a copy padded with zeros, in the all_gather's slots, which neither the
  // reduce_scatter nor the all_to_all below uses.
  at::Tensor input = flat;
  if (P * k != n) {
    input = buffer(ws, Workspace::kGathered, P * k, tensor);
    input.narrow(0, 0, n).copy_(flat);
    input.narrow(0, n, P * k - n).zero_();
  }
  const at::Tensor sum = buffer(ws, Workspace::kGatherScratch, k, tensor);
  NodeBytes sent = route.run(
      [&](Transport& group) { reduce_scatter(group, wire, ws, sum, {input}, *a.reduction, error); },
      [&](NodeTransports& g) { reduce_scatter_by_node(g, wire, ws, sum, {input}, *a.reduction, error); });

  // Each rank's sum to the root, which receives P slices of k elements (its
  // own copied): into the tensor where it has no padding, else into a copy.
  std::vector<int64_t> send_numels(P, 0), recv_numels(P, 0);
  send_numels[root] = k;
  if (rank == root) recv_numels.assign(P, k);
  at::Tensor gathered = flat.narrow(0, 0, 0);
  if (rank == root) gathered = P * k == n ? flat : at::empty({P * k}, tensor.options());
  const int64_t before = t.bytes_sent();
  const std::vector<int64_t> to_rank = all_to_all(t, route.slice_wires(wire), ws, gathered, sum, send_numels,
                                                  recv_numels, error, &kReduce.phases[0]);
  const NodeBytes to_root = route.split(t.bytes_sent() - before, to_rank);
  if (rank == root && P * k != n) flat.copy_(gathered.narrow(0, 0, n));
  return {sent.intra_node + to_root.intra_node, sent.inter_node + to_root.inter_node};
}

}  // namespace fp8comm
