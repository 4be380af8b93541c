// The inter_node scope (DESIGN.md, "Topology"): a group spread over N nodes
// of L ranks each reduces exactly inside each node over the inner transport,
// runs the compressed algorithm among the N ranks that share a local index
// (one per node) on 1/L of the data, and gathers exactly inside each node.
// Only the hop between nodes carries FP8, each element quantized as often as
// in the flat algorithm. Each chunk of the node's exact sum has one owner,
// and the exact phases only copy, so every rank ends with the same bits.
#include <algorithm>

#include "algorithms.h"
#include "segments.h"

namespace fp8comm {

namespace {

// A contiguous tensor of `numel` elements of `like`'s dtype: a workspace slot
// on the CPU, a stream-ordered allocation on a device.
at::Tensor node_buffer(Workspace& ws, Workspace::Slot slot, int64_t numel, const at::Tensor& like) {
  const int64_t bytes = numel * like.element_size();
  return ws.bytes(slot, bytes, like).view(like.scalar_type()).view({numel});
}

// Multiplies `x` in place by the PREMUL_SUM factor (computed in FP32 and
// rounded once to x's dtype, as the exact path emulates it); SUM and AVG
// leave it.
void premultiply(const at::Tensor& x, const Reduction& red) {
  if (red.premul_tensor) {
    x.mul_(*red.premul_tensor);
  } else if (red.premul != 1.0f) {
    x.mul_(static_cast<double>(red.premul));
  }
}

// What the compressed phase among nodes reduces: the node sums, divided by
// the whole group's size for AVG.
Reduction among_nodes(const Reduction& red) { return Reduction{1.0f, std::nullopt, red.post_div}; }

// Segment r (k elements) of a flat tensor of P * k, or the r-th of P tensors.
at::Tensor segment(const std::vector<at::Tensor>& segments, int64_t r, int64_t k) {
  return segments.size() == 1 ? segments[0].view({-1}).narrow(0, r * k, k) : segments[r].view({-1});
}

}  // namespace

void all_reduce_by_node(NodeTransports& g, const WireLayout& wire, Workspace& ws, const at::Tensor& tensor,
                        const Reduction& red, QuantizationError* error) {
  const int64_t L = g.intra.size(), n = tensor.numel();
  const int64_t k = (n + L - 1) / L;
  at::Tensor flat = tensor.view({-1});
  // The node reduce_scatter only reads its input, so it reads the tensor
  // itself unless it needs padding or the PREMUL_SUM factor.
  at::Tensor source = flat;
  if (L * k != n || red.premul_tensor || red.premul != 1.0f) {
    source = node_buffer(ws, Workspace::kNodeStaging, L * k, tensor);
    source.narrow(0, 0, n).copy_(flat);
    if (L * k > n) source.narrow(0, n, L * k - n).zero_();
    premultiply(source, red);
  }
  at::Tensor chunk = node_buffer(ws, Workspace::kNodeChunk, k, tensor);
  at::Tensor scratch = node_buffer(
      ws, Workspace::kNodeExchange,
      std::max(g.intra.reduce_scatter_scratch_numel(k), g.intra.all_gather_scratch_numel(k)), tensor);
  g.intra.reduce_scatter_sum(chunk, source, scratch, "intra-node reduce_scatter");
  all_reduce(g.inter, wire, ws, chunk, among_nodes(red), error);
  // Each rank's chunk goes straight to its place in the tensor (the last
  // one less its padding), once all have arrived: a failed phase leaves the
  // tensor as it was.
  g.intra.all_gather_exact(
      [&](int64_t l, const at::Tensor& piece) {
        const int64_t start = std::min(l * k, n);
        const int64_t len = std::min(k, n - start);
        if (len > 0) flat.narrow(0, start, len).copy_(piece.narrow(0, 0, len));
      },
      chunk, scratch, "intra-node all_gather");
}

void reduce_scatter_by_node(NodeTransports& g, const WireLayout& wire, Workspace& ws, const at::Tensor& output,
                            const std::vector<at::Tensor>& input_segments, const Reduction& red,
                            QuantizationError* error) {
  const int64_t L = g.intra.size(), N = g.inter.size(), k = output.numel();
  // Local rank l reduces the segments of the ranks with local index l, one per node in node order.
  at::Tensor staging = node_buffer(ws, Workspace::kNodeStaging, L * N * k, output);
  for (int64_t l = 0; l < L; ++l) {
    for (int64_t b = 0; b < N; ++b) {
      staging.narrow(0, (l * N + b) * k, k).copy_(segment(input_segments, g.rank_at(b, l), k));
    }
  }
  premultiply(staging, red);
  at::Tensor chunk = node_buffer(ws, Workspace::kNodeChunk, N * k, output);
  at::Tensor scratch = node_buffer(ws, Workspace::kNodeExchange, g.intra.reduce_scatter_scratch_numel(N * k), output);
  g.intra.reduce_scatter_sum(chunk, staging, scratch, "intra-node reduce_scatter");
  reduce_scatter(g.inter, wire, ws, output, {chunk}, among_nodes(red), error);
}

void all_gather_by_node(NodeTransports& g, const WireLayout& wire, Workspace& ws,
                        const std::vector<at::Tensor>& output_segments, const at::Tensor& input,
                        QuantizationError* error) {
  const int64_t N = g.inter.size(), k = input.numel();
  at::Tensor chunk = node_buffer(ws, Workspace::kNodeChunk, N * k, input);
  all_gather(g.inter, wire, ws, {chunk}, input, error);
  at::Tensor scratch = node_buffer(ws, Workspace::kNodeExchange, g.intra.all_gather_scratch_numel(N * k), input);
  // Local rank l's chunk holds the inputs of the ranks with local index l, in node order.
  g.intra.all_gather_exact(
      [&](int64_t l, const at::Tensor& piece) {
        for (int64_t b = 0; b < N; ++b) segment(output_segments, g.rank_at(b, l), k).copy_(piece.narrow(0, b * k, k));
      },
      chunk, scratch, "intra-node all_gather");
}

NodeBytes all_reduce_by_node_bytes_sent(int64_t nodes, int64_t local_size, const WireLayout& wire, int64_t numel,
                                        int64_t element_size) {
  const int64_t L = local_size, k = (numel + L - 1) / L;
  return {2 * (L - 1) * k * element_size, all_reduce_bytes_sent(nodes, wire, k)};
}

NodeBytes reduce_scatter_by_node_bytes_sent(int64_t nodes, int64_t local_size, const WireLayout& wire,
                                            int64_t output_numel, int64_t element_size) {
  return {(local_size - 1) * nodes * output_numel * element_size, reduce_scatter_bytes_sent(nodes, wire, output_numel)};
}

NodeBytes all_gather_by_node_bytes_sent(int64_t nodes, int64_t local_size, const WireLayout& wire,
                                        int64_t input_numel, int64_t element_size) {
  return {(local_size - 1) * nodes * input_numel * element_size, all_gather_bytes_sent(nodes, wire, input_numel)};
}

}  // namespace fp8comm
