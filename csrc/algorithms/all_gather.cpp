// all_gather: each rank quantizes its input once into its slot of the
// gathered buffer and every rank decodes every slot, its own included; in
// chunks, output written last (DESIGN.md, "Algorithms"; ChunkHooks:
// algorithms.h).
#include "algorithms.h"
#include "chunk_plan.h"
#include "compressed_algorithms.h"
#include "segments.h"

namespace fp8comm {

void all_gather(Transport& t, const WireLayout& wire, Workspace& ws, const std::vector<at::Tensor>& output_segments,
                const at::Tensor& input, QuantizationError* error, const ChunkHooks* hooks) {
  const int64_t P = t.size(), k = input.numel();
  const ChunkPlan plan = chunk_plan(t, wire, ChunkOf::kEachRank, k);
  const std::vector<Chunk>& chunks = plan.chunks;
  at::Tensor gathered = ws.bytes(Workspace::kGathered, plan.gathered_bytes, input);
  at::Tensor scratch = ws.bytes(Workspace::kGatherScratch, plan.scratch_bytes, input);
  const at::Tensor in = input.view({-1});
  std::vector<Transport::Pending> gathers;
  for (const Chunk& c : chunks) {
    at::Tensor chunk_gathered = gathered.narrow(0, c.gathered_at, P * c.S);
    at::Tensor mine = chunk_gathered.narrow(0, t.gather_slot(t.rank()) * c.S, c.S);
    quantize_measured(in.narrow(0, c.begin, c.numel), Reduction{},
                      wire.at_chunk(c.begin).codes(mine, 1, c.m, t.rank()), error);
    wire.write_headers(mine, 1, c.m, compressed::kAllGather.phases[0], k);
    at::Tensor chunk_scratch = scratch.narrow(0, c.scratch_at, t.gather_scratch_bytes(c.S));
    gathers.push_back(t.start_all_gather(chunk_gathered, c.S, chunk_scratch));
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& c = chunks[i];
    t.wait(gathers[i], "all_gather");
    wire.check_headers(gathered.narrow(0, c.gathered_at, P * c.S), t.gathered_from(), c.m, compressed::kAllGather.phases[0],
                       k, t.op());
    if (hooks) {
      // Decoded where the caller's next phase reads it at once: no
      // streaming stores past the cache.
      decode_gathered(t, wire, gathered.narrow(0, c.gathered_at, P * c.S), c.m, 1, P * c.numel * input.element_size(),
                      [&](int64_t r, int64_t) { return hooks->place(i, r); });
      hooks->done(i);
    }
  }
  if (hooks) return;
  // Written only now: a call that failed in any phase has left the output as it was.
  const bool flat = output_segments.size() == 1;  // one flat output of P * k elements, else P of k
  const int64_t output_bytes = P * input.nbytes();
  for (const Chunk& c : chunks) {
    const at::Tensor chunk_gathered = gathered.narrow(0, c.gathered_at, P * c.S);
    if (flat && c.numel == k) {  // one chunk: runs of consecutive ranks are contiguous in the output
      decode_gathered(t, wire, chunk_gathered, k, P, output_bytes,
                      [&](int64_t r, int64_t count) { return segments_of(output_segments[0], r, count, k); });
    } else {
      decode_gathered(t, wire, chunk_gathered, c.m, 1, output_bytes, [&](int64_t r, int64_t) {
        return flat ? output_segments[0].view({-1}).narrow(0, r * k + c.begin, c.numel)
                    : output_segments[r].view({-1}).narrow(0, c.begin, c.numel);
      });
    }
  }
}

NodeBytes compressed::run_all_gather(Route& route, const WireLayout& wire, Workspace& ws, const CompressedArgs& a,
                                     QuantizationError* error) {
  const at::Tensor& input = a.inputs.at(0);
  TORCH_INTERNAL_ASSERT(!a.residual.defined(), "fp8comm all_gather: error feedback is for reductions");
  return route.run([&](Transport& t) { all_gather(t, wire, ws, a.outputs, input, error); },
                   [&](NodeTransports& g) { all_gather_by_node(g, wire, ws, a.outputs, input, error); });
}

}  // namespace fp8comm
