// The inter_node scope (DESIGN.md, "Topology"): a group spread over N nodes
// of L ranks each reduces exactly inside each node over the inner transport,
// runs the compressed algorithm among the N ranks that share a local index
// (one per node) on 1/L of the data, and gathers exactly inside each node;
// all_reduce runs these phases chunk by chunk, overlapped.
// Only the hop between nodes carries FP8, each element quantized as often as
// in the flat algorithm. Each chunk of the node's exact sum has one owner,
// and the exact phases only copy, so every rank ends with the same bits.
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

// The pieces of the node's segments that one step of the by-node all_reduce
// reduces: [begin, begin + q) of every local rank's segment of k elements.
struct NodeChunk {
  int64_t begin, q;
};

// Each node chunk is a whole number of the inter-node all_reduce's chunks, so
// calling it chunk by chunk gives the bits one call over the segment gives.
constexpr int64_t kInterChunksPerNodeChunk = 2;

std::vector<NodeChunk> node_chunks(int64_t k, int64_t step) {
  std::vector<NodeChunk> chunks;
  for (int64_t begin = 0; begin < k || chunks.empty(); begin += step) chunks.push_back({begin, std::min(step, k - begin)});
  return chunks;
}

void all_reduce_by_node(NodeTransports& g, const WireLayout& wire, Workspace& ws, const at::Tensor& tensor,
                        const Reduction& red, QuantizationError* error) {
  const int64_t L = g.intra.size(), n = tensor.numel();
  const int64_t k = (n + L - 1) / L;  // local rank l owns elements [l k, (l + 1) k) of the node's sum
  const at::Tensor flat = tensor.view({-1});
  const std::vector<NodeChunk> chunks =
      node_chunks(k, kInterChunksPerNodeChunk * all_reduce_chunk_numel(g.inter.size(), wire));
  // Chunk-major copies: chunk c holds, for each local rank l in turn, the q
  // elements of l's segment it reduces, so each exchange sends one run.
  at::Tensor staging = node_buffer(ws, Workspace::kNodeStaging, L * k, tensor);
  auto in_chunk = [&](const at::Tensor& buffer, const NodeChunk& c) { return buffer.narrow(0, L * c.begin, L * c.q); };
  auto for_each_piece = [&](auto&& visit) {  // (piece of staging, elements of the tensor it holds, or fewer at the end)
    for (const NodeChunk& c : chunks) {
      for (int64_t l = 0; l < L; ++l) {
        const int64_t from = std::min(l * k + c.begin, n), count = std::min(l * k + c.begin + c.q, n) - from;
        visit(staging.narrow(0, L * c.begin + l * c.q, c.q), flat.narrow(0, from, count));
      }
    }
  };
  for_each_piece([](const at::Tensor& piece, const at::Tensor& elements) {
    piece.narrow(0, 0, elements.numel()).copy_(elements);
    if (piece.numel() > elements.numel()) piece.narrow(0, elements.numel(), piece.numel() - elements.numel()).zero_();
  });
  premultiply(staging, red);
  at::Tensor mine = node_buffer(ws, Workspace::kNodeChunk, k, tensor);  // this rank's segment of the node's sum
  at::Tensor scratch = node_buffer(ws, Workspace::kNodeExchange, g.intra.exact_scratch_numel(k), tensor);
  auto scratch_of = [&](const NodeChunk& c) { return scratch.numel() == 0 ? scratch : in_chunk(scratch, c); };

  // Chunk c + 1 is reduced inside the node and chunk c - 1 gathered while
  // chunk c crosses between nodes.
  std::vector<Transport::Pending> gathers;
  at::Tensor first = mine.narrow(0, chunks[0].begin, chunks[0].q), first_in = in_chunk(staging, chunks[0]),
             first_scratch = scratch_of(chunks[0]);
  Transport::Pending reducing = g.intra.start_reduce_scatter_sum(first, first_in, first_scratch);
  for (size_t i = 0; i < chunks.size(); ++i) {
    const NodeChunk& c = chunks[i];
    at::Tensor sum = mine.narrow(0, c.begin, c.q), chunk_staging = in_chunk(staging, c), chunk_scratch = scratch_of(c);
    g.intra.finish_reduce_scatter_sum(reducing, sum, chunk_scratch, "intra-node reduce_scatter");
    if (i + 1 < chunks.size()) {
      const NodeChunk& next = chunks[i + 1];
      at::Tensor next_sum = mine.narrow(0, next.begin, next.q), next_in = in_chunk(staging, next),
                 next_scratch = scratch_of(next);
      reducing = g.intra.start_reduce_scatter_sum(next_sum, next_in, next_scratch);
    }
    all_reduce(g.inter, wire, ws, sum, among_nodes(red), error);
    // Into the staging and scratch of this chunk, which its reduce_scatter no longer uses.
    gathers.push_back(g.intra.start_all_gather_exact(chunk_staging, sum, chunk_scratch));
  }
  for (const auto& work : gathers) g.intra.wait(work, "intra-node all_gather");
  // Written only now: a call that failed in any phase has left the tensor as it was.
  for_each_piece([](const at::Tensor& piece, const at::Tensor& elements) {
    elements.copy_(piece.narrow(0, 0, elements.numel()));
  });
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
  at::Tensor scratch = node_buffer(ws, Workspace::kNodeExchange, g.intra.exact_scratch_numel(N * k), output);
  g.intra.reduce_scatter_sum(chunk, staging, scratch, "intra-node reduce_scatter");
  reduce_scatter(g.inter, wire, ws, output, {chunk}, among_nodes(red), error);
}

void all_gather_by_node(NodeTransports& g, const WireLayout& wire, Workspace& ws,
                        const std::vector<at::Tensor>& output_segments, const at::Tensor& input,
                        QuantizationError* error) {
  const int64_t L = g.intra.size(), N = g.inter.size(), k = input.numel();
  at::Tensor chunk = node_buffer(ws, Workspace::kNodeChunk, N * k, input);
  all_gather(g.inter, wire, ws, {chunk}, input, error);
  at::Tensor staging = node_buffer(ws, Workspace::kNodeStaging, L * N * k, input);
  at::Tensor scratch = node_buffer(ws, Workspace::kNodeExchange, g.intra.exact_scratch_numel(N * k), input);
  g.intra.all_gather_exact(staging, chunk, scratch, "intra-node all_gather");
  for (int64_t l = 0; l < L; ++l) {
    for (int64_t b = 0; b < N; ++b) {
      segment(output_segments, g.rank_at(b, l), k).copy_(staging.narrow(0, (l * N + b) * k, k));
    }
  }
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
