// all_reduce as reduce-scatter + all-gather of FP8 segments: the owner of
// each segment sums the others' pieces onto its own input, re-quantizes the
// sum and all-gathers those bytes, so every rank decodes the same bytes; in
// chunks, output written last (DESIGN.md, "Algorithms").
#include "algorithms.h"
#include "chunk_plan.h"
#include "compressed_algorithms.h"
#include "segments.h"

namespace fp8comm {

void all_reduce(Transport& t, const WireLayout& wire, Workspace& ws, const at::Tensor& tensor, const Reduction& red,
                QuantizationError* error, const ChunkHooks* hooks, const at::Tensor& residual) {
  const int64_t P = t.size(), rank = t.rank(), n = tensor.numel();
  const at::Tensor flat = tensor.view({-1});  // contiguous, any shape (complex64 arrives as [n, 2] floats)
  const ChunkPlan plan = chunk_plan(t, wire, ChunkOf::kTensor, n);
  const std::vector<Chunk>& chunks = plan.chunks;
  at::Tensor send = ws.bytes(Workspace::kSend, plan.exchanged_bytes, tensor);
  at::Tensor recv = ws.bytes(Workspace::kRecv, plan.exchanged_bytes, tensor);
  at::Tensor gathered = ws.bytes(Workspace::kGathered, plan.gathered_bytes, tensor);
  at::Tensor scratch = ws.bytes(Workspace::kGatherScratch, plan.scratch_bytes, tensor);
  auto part = [](const at::Tensor& buffer, int64_t at, int64_t bytes) { return buffer.narrow(0, at, bytes); };
  auto elements = [&](const Chunk& c) { return flat.narrow(0, c.begin, c.numel); };
  // Error feedback: the chunk's residual, its peers' segments kept as they are
  // quantized, its own segment once its sum is.
  auto kept = [&](const Chunk& c) {
    return residual.defined() ? residual.view({-1}).narrow(0, c.begin, c.numel) : at::Tensor();
  };

  std::vector<Transport::Pending> exchanges, gathers;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& c = chunks[i];
    if (hooks) hooks->ready(i);
    at::Tensor chunk_send = part(send, c.exchanged_at, (P - 1) * c.S);
    at::Tensor chunk_recv = part(recv, c.exchanged_at, (P - 1) * c.S);
    quantize_for_peers(t, wire.at_chunk(c.begin), elements(c), c.m, red, chunk_send, error, kept(c));
    wire.write_headers(chunk_send, P - 1, c.m, compressed::kAllReduce.phases[0], n);
    exchanges.push_back(t.start_exchange(chunk_recv, chunk_send, c.S));
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& c = chunks[i];
    at::Tensor chunk_recv = part(recv, c.exchanged_at, (P - 1) * c.S);
    at::Tensor chunk_gathered = part(gathered, c.gathered_at, P * c.S);
    at::Tensor chunk_scratch = part(scratch, c.scratch_at, t.gather_scratch_bytes(c.S));
    t.wait(exchanges[i], "all_to_all");
    wire.check_headers(chunk_recv, t.peers(), c.m, compressed::kAllReduce.phases[0], n, t.op());
    at::Tensor sum = chunk_gathered.narrow(0, t.gather_slot(rank) * c.S, c.S);
    const OwnAddendTensor own{segments_of(elements(c), rank, 1, c.m), red.premul, red.premul_tensor};
    dequant_sum_requantize_into(wire.codes(chunk_recv, P - 1, c.m), own, red.post_div,
                                wire.at_chunk(c.begin).codes(sum, 1, c.m, rank), tensor.device());
    if (error) measure_requantized_sum(wire.codes(chunk_recv, P - 1, c.m), own, red.post_div, wire.codes(sum, 1, c.m), *error);
    if (residual.defined()) {
      keep_requantized_residual(wire.codes(chunk_recv, P - 1, c.m), own, red.post_div, wire.codes(sum, 1, c.m),
                                segments_of(kept(c), rank, 1, c.m));
    }
    wire.write_headers(sum, 1, c.m, compressed::kAllReduce.phases[1], n);
    gathers.push_back(t.start_all_gather(chunk_gathered, c.S, chunk_scratch));
  }
  auto decode = [&](const Chunk& c, int64_t whole_output_bytes) {
    const at::Tensor chunk = elements(c);
    decode_gathered(t, wire, part(gathered, c.gathered_at, P * c.S), c.m, P, whole_output_bytes,
                    [&](int64_t r, int64_t count) { return segments_of(chunk, r, count, c.m); });
  };
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& c = chunks[i];
    t.wait(gathers[i], "all_gather");
    wire.check_headers(part(gathered, c.gathered_at, P * c.S), t.gathered_from(), c.m, compressed::kAllReduce.phases[1], n,
                       t.op());
    if (hooks) {
      // Decoded for the caller's next phase, which reads it at once: no
      // streaming stores past the cache.
      decode(c, c.numel * tensor.element_size());
      hooks->done(i);
    }
  }
  if (hooks) return;
  // Written only now: a call that failed in any phase has left the tensor as it was.
  for (const Chunk& c : chunks) decode(c, tensor.nbytes());
}

NodeBytes compressed::run_all_reduce(Route& route, const WireLayout& wire, Workspace& ws, const CompressedArgs& a,
                                     QuantizationError* error) {
  const at::Tensor& tensor = a.outputs.at(0);
  const Reduction& red = *a.reduction;
  return route.run([&](Transport& t) { all_reduce(t, wire, ws, tensor, red, error, nullptr, a.residual); },
                   [&](NodeTransports& g) { all_reduce_by_node(g, wire, ws, tensor, red, error, a.residual); });
}

}  // namespace fp8comm
