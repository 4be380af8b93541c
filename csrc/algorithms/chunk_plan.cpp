#include "chunk_plan.h"

#include <algorithm>

#include "../codec/codec.h"

namespace fp8comm {

namespace {

// Elements of each rank's segment per chunk: whole blocks, about chunk_numel / P.
int64_t per_rank_chunk(int64_t P, const WireLayout& wire) {
  const int64_t block = wire.block_size();
  return ceil_div(ceil_div(wire.chunk_numel(), P), block) * block;
}

}  // namespace

ChunkPlan chunk_plan(const Transport& t, const WireLayout& wire, ChunkOf of, int64_t numel) {
  const int64_t P = t.size();
  const int64_t step = (of == ChunkOf::kTensor ? P : 1) * per_rank_chunk(P, wire);
  ChunkPlan plan;
  for (int64_t begin = 0; begin < numel || plan.chunks.empty(); begin += step) {
    Chunk c{begin, std::min(step, numel - begin), 0, 0, plan.exchanged_bytes, plan.gathered_bytes, plan.scratch_bytes};
    c.m = of == ChunkOf::kTensor ? wire.segment_numel(c.numel, P) : c.numel;
    c.S = wire.segment_bytes(c.m);
    plan.exchanged_bytes += (P - 1) * c.S;
    plan.gathered_bytes += P * c.S;
    plan.scratch_bytes += t.gather_scratch_bytes(c.S);
    plan.chunks.push_back(c);
  }
  return plan;
}

}  // namespace fp8comm
