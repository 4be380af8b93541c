// reduce_scatter: segment r of every rank's input goes, quantized, to rank r,
// which adds the pieces in FP32 onto its own segment; in chunks, output
// written last (DESIGN.md, "Algorithms").
#include <ATen/MemoryOverlap.h>

#include "algorithms.h"
#include "chunk_plan.h"
#include "compressed_algorithms.h"
#include "segments.h"

namespace fp8comm {

void reduce_scatter(Transport& t, const WireLayout& wire, Workspace& ws, const at::Tensor& output,
                    const std::vector<at::Tensor>& input_segments, const Reduction& red, QuantizationError* error,
                    const at::Tensor& residual) {
  const int64_t P = t.size(), rank = t.rank(), k = output.numel();
  TORCH_INTERNAL_ASSERT(!residual.defined() || input_segments.size() == 1,
                        "fp8comm reduce_scatter: error feedback needs one flat input");
  // Error feedback: the peers' pieces keep what their quantization dropped; the own segment is exact.
  auto kept = [&](int64_t r, int64_t begin, int64_t n) {
    return residual.defined() ? residual.view({-1}).narrow(0, r * k + begin, n) : at::Tensor();
  };
  if (residual.defined()) kept(rank, 0, k).zero_();
  // Segment r's elements [begin, begin + n): of one flat input of P * k elements, or of the r-th of P tensors.
  auto piece = [&](int64_t r, int64_t begin, int64_t n) {
    return input_segments.size() == 1 ? input_segments[0].view({-1}).narrow(0, r * k + begin, n)
                                      : input_segments[r].view({-1}).narrow(0, begin, n);
  };
  at::Tensor own = piece(rank, 0, k);
  // The sum reads own[i] before it writes output[i]; any other overlap reads a copy.
  if (at::get_overlap_status(own, output) == at::MemOverlapStatus::Partial) own = own.clone();

  const ChunkPlan plan = chunk_plan(t, wire, ChunkOf::kEachRank, k);
  const std::vector<Chunk>& chunks = plan.chunks;
  at::Tensor send = ws.bytes(Workspace::kSend, plan.exchanged_bytes, output);
  at::Tensor recv = ws.bytes(Workspace::kRecv, plan.exchanged_bytes, output);
  std::vector<Transport::Pending> exchanges;
  for (const Chunk& c : chunks) {
    at::Tensor chunk_send = send.narrow(0, c.exchanged_at, (P - 1) * c.S);
    at::Tensor chunk_recv = recv.narrow(0, c.exchanged_at, (P - 1) * c.S);
    int64_t slot = 0;
    for (int64_t r : t.peers()) {
      const BlockCodes codes = wire.at_chunk(c.begin).codes(chunk_send.narrow(0, slot++ * c.S, c.S), 1, c.m, r);
      quantize_measured(piece(r, c.begin, c.numel), red, codes, error, kept(r, c.begin, c.numel));
    }
    wire.write_headers(chunk_send, P - 1, c.m, compressed::kReduceScatter.phases[0], k);
    exchanges.push_back(t.start_exchange(chunk_recv, chunk_send, c.S));
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& c = chunks[i];
    t.wait(exchanges[i], "all_to_all");
    wire.check_headers(recv.narrow(0, c.exchanged_at, (P - 1) * c.S), t.peers(), c.m, compressed::kReduceScatter.phases[0],
                       k, t.op());
  }
  const at::Tensor out = output.view({-1});
  for (const Chunk& c : chunks) {
    dequant_sum_into(wire.codes(recv.narrow(0, c.exchanged_at, (P - 1) * c.S), P - 1, c.m),
                     OwnAddendTensor{own.view({-1}).narrow(0, c.begin, c.numel), red.premul, red.premul_tensor},
                     red.post_div, out.narrow(0, c.begin, c.numel));
  }
}

NodeBytes compressed::run_reduce_scatter(Route& route, const WireLayout& wire, Workspace& ws, const CompressedArgs& a,
                                         QuantizationError* error) {
  const at::Tensor& output = a.outputs.at(0);
  const Reduction& red = *a.reduction;
  return route.run([&](Transport& t) { reduce_scatter(t, wire, ws, output, a.inputs, red, error, a.residual); },
                   [&](NodeTransports& g) {
                     reduce_scatter_by_node(g, wire, ws, output, a.inputs, red, error, a.residual);
                   });
}

}  // namespace fp8comm
