// all_gather: each rank quantizes its input once into its slot of the
// gathered buffer; every rank decodes every slot, its own included, so all
// outputs agree bitwise.
#include "algorithms.h"
#include "segments.h"

namespace fp8comm {

void all_gather(Transport& t, const WireLayout& wire, Workspace& ws, const std::vector<at::Tensor>& output_segments,
                const at::Tensor& input, QuantizationError* error) {
  const int64_t P = t.size(), k = input.numel();
  const int64_t S = wire.segment_bytes(k);
  at::Tensor gathered = ws.bytes(Workspace::kGathered, P * S, input);
  at::Tensor mine = gathered.narrow(0, t.gather_slot(t.rank()) * S, S);
  quantize_measured(input, Reduction{}, wire.codes(mine, 1, k), error);
  wire.write_headers(mine, 1, k, Phase::kAllGatherInputs, k);
  at::Tensor scratch = ws.bytes(Workspace::kGatherScratch, t.gather_scratch_bytes(S), input);
  t.wait(t.start_all_gather(gathered, S, scratch), "all_gather");
  wire.check_headers(gathered, t.gathered_from(), k, Phase::kAllGatherInputs, k, t.op());
  if (output_segments.size() == 1) {  // one flat output of P * k elements
    decode_gathered(t, wire, gathered, k, P,
                    [&](int64_t r, int64_t count) { return segments_of(output_segments[0], r, count, k); });
  } else {
    decode_gathered(t, wire, gathered, k, 1, [&](int64_t r, int64_t) { return output_segments[r]; });
  }
}

int64_t all_gather_bytes_sent(int64_t group_size, const WireLayout& wire, int64_t input_numel) {
  return (group_size - 1) * wire.segment_bytes(input_numel);
}

}  // namespace fp8comm
