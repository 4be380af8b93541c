// all_gather: each rank quantizes its input once into its slot of the
// gathered buffer; every rank decodes every slot, its own included, so all
// outputs agree bitwise. A large input runs in chunks (segments.h): every
// chunk is quantized and gathered, then, once every gather is through,
// decoded into the output, so a call that fails leaves it as it was (with
// ChunkHooks, each as soon as its gather is through: algorithms.h).
#include "algorithms.h"
#include "segments.h"

namespace fp8comm {

namespace {

// Elements [begin, begin + n) of every rank's k-element input; S bytes per
// slot on the wire, at byte `gathered_at` of the gathered buffer and
// `scratch_at` of the gather's scratch.
struct Chunk {
  int64_t begin, n, S, gathered_at, scratch_at;
};

std::vector<Chunk> chunks_of(int64_t P, const WireLayout& wire, int64_t k, const Transport* t = nullptr) {
  const int64_t step = per_rank_chunk(P, wire);
  std::vector<Chunk> chunks;
  int64_t gathered_at = 0, scratch_at = 0;
  for (int64_t begin = 0; begin < k || chunks.empty(); begin += step) {
    const int64_t n = std::min(step, k - begin);
    chunks.push_back(Chunk{begin, n, wire.segment_bytes(n), gathered_at, scratch_at});
    gathered_at += P * chunks.back().S;
    if (t) scratch_at += t->gather_scratch_bytes(chunks.back().S);
  }
  return chunks;
}

}  // namespace

std::vector<ChunkRange> all_gather_chunks(int64_t group_size, const WireLayout& wire, int64_t input_numel) {
  std::vector<ChunkRange> ranges;
  for (const Chunk& c : chunks_of(group_size, wire, input_numel)) ranges.push_back({c.begin, c.n});
  return ranges;
}

void all_gather(Transport& t, const WireLayout& wire, Workspace& ws, const std::vector<at::Tensor>& output_segments,
                const at::Tensor& input, QuantizationError* error, const ChunkHooks* hooks) {
  const int64_t P = t.size(), k = input.numel();
  const std::vector<Chunk> chunks = chunks_of(P, wire, k, &t);
  const Chunk& last = chunks.back();
  at::Tensor gathered = ws.bytes(Workspace::kGathered, last.gathered_at + P * last.S, input);
  at::Tensor scratch = ws.bytes(Workspace::kGatherScratch, last.scratch_at + t.gather_scratch_bytes(last.S), input);
  const at::Tensor in = input.view({-1});
  std::vector<Transport::Pending> gathers;
  for (const Chunk& c : chunks) {
    at::Tensor chunk_gathered = gathered.narrow(0, c.gathered_at, P * c.S);
    at::Tensor mine = chunk_gathered.narrow(0, t.gather_slot(t.rank()) * c.S, c.S);
    quantize_measured(in.narrow(0, c.begin, c.n), Reduction{}, wire.codes(mine, 1, c.n), error);
    wire.write_headers(mine, 1, c.n, Phase::kAllGatherInputs, k);
    at::Tensor chunk_scratch = scratch.narrow(0, c.scratch_at, t.gather_scratch_bytes(c.S));
    gathers.push_back(t.start_all_gather(chunk_gathered, c.S, chunk_scratch));
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& c = chunks[i];
    t.wait(gathers[i], "all_gather");
    wire.check_headers(gathered.narrow(0, c.gathered_at, P * c.S), t.gathered_from(), c.n, Phase::kAllGatherInputs,
                       k, t.op());
    if (hooks) {
      // Decoded where the caller's next phase reads it at once: no
      // streaming stores past the cache.
      decode_gathered(t, wire, gathered.narrow(0, c.gathered_at, P * c.S), c.n, 1, P * c.n * input.element_size(),
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
    if (flat && c.n == k) {  // one chunk: runs of consecutive ranks are contiguous in the output
      decode_gathered(t, wire, chunk_gathered, k, P, output_bytes,
                      [&](int64_t r, int64_t count) { return segments_of(output_segments[0], r, count, k); });
    } else {
      decode_gathered(t, wire, chunk_gathered, c.n, 1, output_bytes, [&](int64_t r, int64_t) {
        return flat ? output_segments[0].view({-1}).narrow(0, r * k + c.begin, c.n)
                    : output_segments[r].view({-1}).narrow(0, c.begin, c.n);
      });
    }
  }
}

}  // namespace fp8comm
