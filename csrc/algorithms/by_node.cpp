// The inter_node scope: phases inside each node around the flat compressed
// algorithm among one rank per node (DESIGN.md, "Topology"). The phases
// inside are exact, overlapped chunk by chunk with the hop; or, with a node
// wire format, the flat compressed algorithms on the node's transport,
// each phase after the other.
#include <ATen/ScalarOps.h>

#include <algorithm>

#include "algorithms.h"
#include "chunk_plan.h"
#include "segments.h"

namespace fp8comm {

namespace {

// A contiguous tensor of `numel` elements of `like`'s dtype: a workspace slot
// on the CPU, a stream-ordered allocation on a device.
at::Tensor node_buffer(Workspace& ws, Workspace::Slot slot, int64_t numel, const at::Tensor& like) {
  const int64_t bytes = numel * like.element_size();
  return ws.bytes(slot, bytes, like).view(like.scalar_type()).view({numel});
}

// Multiplies `x` in place by the FP32 PREMUL_SUM factor, computed in FP32 and
// rounded once to x's dtype (DESIGN.md, "Decisions", AVG and PREMUL_SUM); SUM
// and AVG leave it. The factor goes in as a wrapped number: mul_ with a plain
// Scalar would round it to x's dtype first (BF16, FP16).
void premultiply(const at::Tensor& x, const Reduction& red) {
  if (red.premul_tensor) {
    x.mul_(*red.premul_tensor);
  } else if (red.premul != 1.0f) {
    x.mul_(at::native::wrapped_scalar_tensor(at::Scalar(static_cast<double>(red.premul))));
  }
}

// What the compressed phase among nodes reduces: the node sums, divided by
// the whole group's size for AVG.
Reduction between_nodes(const Reduction& red) { return Reduction{1.0f, std::nullopt, red.post_div}; }

// Segment r (k elements) of a flat tensor of P * k, or the r-th of P tensors.
at::Tensor segment(const std::vector<at::Tensor>& segments, int64_t r, int64_t k) {
  return segments.size() == 1 ? segments[0].view({-1}).narrow(0, r * k, k) : segments[r].view({-1});
}

// The input segments of the ranks with local index l, one per node in node
// order, as an [N, k] view of a flat input where those ranks are evenly
// spaced in the group (contiguous nodes); undefined otherwise.
at::Tensor local_index_view(const NodeTransports& g, const std::vector<at::Tensor>& input_segments, int64_t l,
                            int64_t k) {
  const int64_t N = g.inter.size();
  if (input_segments.size() != 1 || N < 2) return {};
  const int64_t first = g.rank_at(0, l), step = g.rank_at(1, l) - first;
  if (step <= 0) return {};
  for (int64_t b = 2; b < N; ++b) {
    if (g.rank_at(b, l) != first + b * step) return {};
  }
  const at::Tensor flat = input_segments[0].view({-1});
  return flat.as_strided({N, k}, {step * k, 1}, flat.storage_offset() + first * k);
}

// What all_reduce's node reduce_scatter reads, L * k elements: the tensor
// itself (it only reads it), or a staging copy where it needs padding or the
// PREMUL_SUM factor.
at::Tensor node_sum_source(Workspace& ws, const at::Tensor& tensor, const Reduction& red, int64_t padded_numel) {
  const at::Tensor flat = tensor.view({-1});
  const int64_t n = flat.numel();
  if (padded_numel == n && !red.premul_tensor && red.premul == 1.0f) return flat;
  at::Tensor source = node_buffer(ws, Workspace::kNodeStaging, padded_numel, tensor);
  source.narrow(0, 0, n).copy_(flat);
  if (padded_numel > n) source.narrow(0, n, padded_numel - n).zero_();
  premultiply(source, red);
  return source;
}

// Error feedback keeps what the hop between nodes drops; compressed phases
// inside a node would drop more, which it does not keep.
void check_no_residual(const NodeTransports& g, const at::Tensor& residual, const char* op) {
  TORCH_CHECK(!residual.defined(), "fp8comm ", op, ": error feedback keeps only the error of the hop between ",
              "nodes, and this group also compresses inside nodes (node_wire_format='",
              wire_format_name(*g.node_format), "'); use node_wire_format='exact' with error feedback");
}

// all_reduce with compressed phases inside the node, on the hop's chunks as
// the exact phases are: the node's reduce_scatter of chunk i runs while the
// hop's earlier chunks travel, and chunk i's all_gather inside the node once
// the hop has decoded it, while its later chunks travel. The all_gathers
// write a staging buffer; the tensor is written once every phase is done.
void all_reduce_compressed_inside(NodeTransports& g, const WireLayout& wire, Workspace& ws, const at::Tensor& tensor,
                                  const Reduction& red, QuantizationError* error) {
  TORCH_INTERNAL_ASSERT(g.node_workspace, "fp8comm: compressed node phases without their workspace");
  const WireLayout node_sum = wire.for_node_phase(*g.node_format, 0);
  const WireLayout node_gather = wire.for_node_phase(*g.node_format, 1);
  const int64_t L = g.intra.size(), n = tensor.numel();
  const int64_t k = (n + L - 1) / L;
  at::Tensor flat = tensor.view({-1});
  const at::Tensor source = node_sum_source(ws, tensor, red, L * k);
  at::Tensor chunk = node_buffer(ws, Workspace::kNodeChunk, k, tensor);
  at::Tensor gathered = node_buffer(ws, Workspace::kNodeExchange, L * k, tensor);
  // Piece l of hop chunk c: elements l * k + c.begin.. of a [L, k] buffer.
  auto pieces = [&](const at::Tensor& buffer, const Chunk& c) {
    std::vector<at::Tensor> out;
    for (int64_t l = 0; l < L; ++l) out.push_back(buffer.narrow(0, l * k + c.begin, c.numel));
    return out;
  };
  const std::vector<Chunk> hop_chunks = chunk_plan(g.inter, wire, ChunkOf::kTensor, k).chunks;
  ChunkHooks hooks;
  hooks.ready = [&](size_t i) {
    const Chunk& c = hop_chunks[i];
    reduce_scatter(g.intra, node_sum.at_chunk(c.begin), *g.node_workspace, chunk.narrow(0, c.begin, c.numel),
                   pieces(source, c), Reduction{}, error);
  };
  hooks.done = [&](size_t i) {
    const Chunk& c = hop_chunks[i];
    all_gather(g.intra, node_gather.at_chunk(c.begin), *g.node_workspace, pieces(gathered, c),
               chunk.narrow(0, c.begin, c.numel), error);
  };
  all_reduce(g.inter, wire, ws, chunk, between_nodes(red), error, &hooks);
  flat.copy_(gathered.narrow(0, 0, n));
}

}  // namespace

void all_reduce_by_node(NodeTransports& g, const WireLayout& wire, Workspace& ws, const at::Tensor& tensor,
                        const Reduction& red, QuantizationError* error, const at::Tensor& residual) {
  if (g.node_format) {
    check_no_residual(g, residual, "all_reduce");
    all_reduce_compressed_inside(g, wire, ws, tensor, red, error);
    return;
  }
  const int64_t L = g.intra.size(), n = tensor.numel();
  const int64_t k = (n + L - 1) / L;
  at::Tensor flat = tensor.view({-1});
  const at::Tensor source = node_sum_source(ws, tensor, red, L * k);
  at::Tensor chunk = node_buffer(ws, Workspace::kNodeChunk, k, tensor);
  // The three phases overlap chunk by chunk, in the chunks of the hop's
  // all_reduce: the node's sum of chunk i + 1 travels while chunk i is
  // quantized for the hop, and chunk i's all_gather inside the node starts
  // once the hop has decoded it. One chunk plan for both transports: `wire`
  // (the group transport's traits, which the node transports share:
  // run_compressed.h) cuts the hop, and the node's phases take its chunks.
  const std::vector<Chunk> hop_chunks = chunk_plan(g.inter, wire, ChunkOf::kTensor, k).chunks;
  const int64_t gather_numel = g.intra.all_gather_scratch_numel(k);
  const int64_t sum_numel = g.intra.reduce_scatter_scratch_numel(hop_chunks.front().numel);
  at::Tensor scratch = node_buffer(ws, Workspace::kNodeExchange, gather_numel + 2 * sum_numel, tensor);
  auto gather_scratch = [&](const Chunk& c) {
    return scratch.narrow(0, g.intra.all_gather_scratch_numel(c.begin), g.intra.all_gather_scratch_numel(c.numel));
  };

  std::vector<Transport::PendingSum> sums(hop_chunks.size());
  auto start_sum = [&](size_t i) {
    const Chunk& c = hop_chunks[i];
    std::vector<at::Tensor> pieces;
    for (int64_t l = 0; l < L; ++l) pieces.push_back(source.narrow(0, l * k + c.begin, c.numel));
    // Two sums in flight at most, each in its half of the scratch's end.
    sums[i] = g.intra.start_reduce_scatter_sum(chunk.narrow(0, c.begin, c.numel), pieces,
                                               scratch.narrow(0, gather_numel + (i % 2) * sum_numel, sum_numel));
  };
  std::vector<Transport::Pending> gathers;
  ChunkHooks hooks;
  hooks.ready = [&](size_t i) {
    if (i + 1 < hop_chunks.size()) start_sum(i + 1);
    g.intra.finish_reduce_scatter_sum(sums[i], "intra-node reduce_scatter");
  };
  hooks.done = [&](size_t i) {
    const Chunk& c = hop_chunks[i];
    gathers.push_back(g.intra.start_all_gather_exact(chunk.narrow(0, c.begin, c.numel), gather_scratch(c)));
  };
  start_sum(0);
  // Error feedback: only the hop between nodes drops anything, and only of
  // this rank's chunk of the node sum (elements l * k + i of the tensor).
  at::Tensor chunk_residual;
  if (residual.defined()) chunk_residual = at::empty({k}, chunk.options().dtype(at::kFloat));
  all_reduce(g.inter, wire, ws, chunk, between_nodes(red), error, &hooks, chunk_residual);
  for (const Transport::Pending& work : gathers) g.intra.wait(work, "intra-node all_gather");
  // Each rank's chunk goes straight to its place in the tensor (the last
  // one less its padding), once all have arrived: a failed phase leaves the
  // tensor as it was.
  for (const Chunk& c : hop_chunks) {
    g.intra.deliver_gathered(
        [&](int64_t l, const at::Tensor& piece) {
          const int64_t start = std::min(l * k + c.begin, n);
          const int64_t len = std::min(c.numel, n - start);
          if (len > 0) flat.narrow(0, start, len).copy_(piece.narrow(0, 0, len));
        },
        chunk.narrow(0, c.begin, c.numel), gather_scratch(c));
  }
  if (residual.defined()) {
    const at::Tensor kept = residual.view({-1});
    kept.zero_();
    const int64_t start = std::min(g.intra.rank() * k, n), len = std::min(k, n - start);
    if (len > 0) unscale_residual_into(chunk_residual.narrow(0, 0, len), red, kept.narrow(0, start, len));
  }
}

void reduce_scatter_by_node(NodeTransports& g, const WireLayout& wire, Workspace& ws, const at::Tensor& output,
                            const std::vector<at::Tensor>& input_segments, const Reduction& red,
                            QuantizationError* error, const at::Tensor& residual) {
  const int64_t L = g.intra.size(), N = g.inter.size(), k = output.numel();
  if (g.node_format) check_no_residual(g, residual, "reduce_scatter");
  // Local rank l reduces the segments of the ranks with local index l, one
  // per node in node order: read where they lie, else (a list input, ranks
  // not evenly spaced, a PREMUL_SUM factor to apply, compressed phases
  // inside the node: one flat input) copied into staging.
  const bool premul = red.premul_tensor || red.premul != 1.0f;
  const bool stage_all = premul || g.node_format.has_value();
  std::vector<at::Tensor> pieces(L);
  at::Tensor staging;
  for (int64_t l = 0; l < L; ++l) {
    if (!stage_all) pieces[l] = local_index_view(g, input_segments, l, k);
    if (pieces[l].defined()) continue;
    if (!staging.defined()) staging = node_buffer(ws, Workspace::kNodeStaging, L * N * k, output);
    pieces[l] = staging.narrow(0, l * N * k, N * k).view({N, k});
    for (int64_t b = 0; b < N; ++b) pieces[l][b].copy_(segment(input_segments, g.rank_at(b, l), k));
    premultiply(pieces[l], red);
  }
  at::Tensor chunk = node_buffer(ws, Workspace::kNodeChunk, N * k, output);
  if (g.node_format) {
    reduce_scatter(g.intra, wire.for_node_phase(*g.node_format, 0), ws, chunk, {staging}, Reduction{}, error);
    reduce_scatter(g.inter, wire, ws, output, {chunk}, between_nodes(red), error);
    return;
  }
  at::Tensor scratch = node_buffer(ws, Workspace::kNodeExchange, g.intra.reduce_scatter_scratch_numel(N * k), output);
  Transport::PendingSum sum = g.intra.start_reduce_scatter_sum(chunk, pieces, scratch);
  g.intra.finish_reduce_scatter_sum(sum, "intra-node reduce_scatter");
  // Error feedback: only the hop between nodes drops anything, of the node
  // sums of the segments of the ranks with this rank's local index.
  at::Tensor chunk_residual;
  if (residual.defined()) chunk_residual = at::empty({N * k}, chunk.options().dtype(at::kFloat));
  reduce_scatter(g.inter, wire, ws, output, {chunk}, between_nodes(red), error, chunk_residual);
  if (residual.defined()) {
    residual.zero_();
    const int64_t l = g.intra.rank();
    for (int64_t b = 0; b < N; ++b) {
      unscale_residual_into(chunk_residual.narrow(0, b * k, k), red, segment({residual}, g.rank_at(b, l), k));
    }
  }
}

void all_gather_by_node(NodeTransports& g, const WireLayout& wire, Workspace& ws,
                        const std::vector<at::Tensor>& output_segments, const at::Tensor& input,
                        QuantizationError* error) {
  const int64_t N = g.inter.size(), k = input.numel();
  if (g.node_format) {
    // The hop's output in node order, then the node's all_gather of it:
    // local rank l's piece holds the inputs of the ranks with local index l.
    const int64_t L = g.intra.size();
    at::Tensor chunks = node_buffer(ws, Workspace::kNodeChunk, N * k, input);
    at::Tensor gathered = node_buffer(ws, Workspace::kNodeExchange, L * N * k, input);
    all_gather(g.inter, wire, ws, {chunks}, input, error);
    all_gather(g.intra, wire.for_node_phase(*g.node_format, 1), ws, {gathered}, chunks, error);
    for (int64_t l = 0; l < L; ++l) {
      for (int64_t b = 0; b < N; ++b) {
        segment(output_segments, g.rank_at(b, l), k).copy_(gathered.narrow(0, (l * N + b) * k, k));
      }
    }
    return;
  }
  // The hop's output, the inputs of the ranks with this local index, chunk
  // by chunk: each chunk's N pieces together, in node order. Each chunk goes
  // to the node's other ranks once the hop has decoded it, while the next
  // travels between nodes: the node's phases take the hop's chunks, as in
  // all_reduce_by_node.
  const std::vector<Chunk> hop_chunks = chunk_plan(g.inter, wire, ChunkOf::kEachRank, k).chunks;
  at::Tensor chunks = node_buffer(ws, Workspace::kNodeChunk, N * k, input);
  at::Tensor scratch = node_buffer(ws, Workspace::kNodeExchange, g.intra.all_gather_scratch_numel(N * k), input);
  auto pieces = [&](const Chunk& c) { return chunks.narrow(0, N * c.begin, N * c.numel); };
  auto gather_scratch = [&](const Chunk& c) {
    return scratch.narrow(0, g.intra.all_gather_scratch_numel(N * c.begin),
                          g.intra.all_gather_scratch_numel(N * c.numel));
  };
  std::vector<Transport::Pending> gathers;
  ChunkHooks hooks;
  hooks.place = [&](size_t i, int64_t b) {
    return pieces(hop_chunks[i]).narrow(0, b * hop_chunks[i].numel, hop_chunks[i].numel);
  };
  hooks.done = [&](size_t i) {
    gathers.push_back(g.intra.start_all_gather_exact(pieces(hop_chunks[i]), gather_scratch(hop_chunks[i])));
  };
  all_gather(g.inter, wire, ws, {chunks}, input, error, &hooks);
  for (const Transport::Pending& work : gathers) g.intra.wait(work, "intra-node all_gather");
  // Local rank l's pieces are the inputs of the ranks with local index l, in
  // node order; each goes to its place once every chunk has arrived.
  for (const Chunk& c : hop_chunks) {
    g.intra.deliver_gathered(
        [&](int64_t l, const at::Tensor& piece) {
          for (int64_t b = 0; b < N; ++b) {
            segment(output_segments, g.rank_at(b, l), k)
                .narrow(0, c.begin, c.numel)
                .copy_(piece.narrow(0, b * c.numel, c.numel));
          }
        },
        pieces(c), gather_scratch(c));
  }
}

}  // namespace fp8comm
