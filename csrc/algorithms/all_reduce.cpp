// all_reduce as reduce-scatter + all-gather of FP8 segments. The tensor is
// cut into P segments of whole blocks; segment r's owner is rank r. Each rank
// sends every other owner its quantized piece; the owner sums them onto its
// own input, which never leaves it (it is added exactly), re-quantizes the
// sum into its slot of the gathered buffer, and all-gathers those bytes:
// every rank decodes the same bytes, so every rank ends with bitwise the same
// result, and each element is quantized twice on its way.
#include "algorithms.h"
#include "segments.h"

namespace fp8comm {

void all_reduce(Transport& t, const WireLayout& wire, Workspace& ws, const at::Tensor& tensor, const Reduction& red,
                QuantizationError* error) {
  const int64_t P = t.size(), rank = t.rank(), n = tensor.numel();
  const at::Tensor flat = tensor.view({-1});  // contiguous, any shape (complex64 arrives as [n, 2] floats)
  const int64_t m = wire.segment_numel(n, P);
  const int64_t S = wire.segment_bytes(m);
  at::Tensor send = ws.bytes(Workspace::kSend, (P - 1) * S, tensor);
  at::Tensor recv = ws.bytes(Workspace::kRecv, (P - 1) * S, tensor);
  at::Tensor gathered = ws.bytes(Workspace::kGathered, P * S, tensor);
  at::Tensor scratch = ws.bytes(Workspace::kGatherScratch, t.gather_scratch_bytes(S), tensor);

  quantize_for_peers(t, wire, flat, m, red, send, error);
  wire.write_headers(send, P - 1, m, Phase::kAllReducePieces, n);
  t.wait(t.start_exchange(recv, send, S), "all_to_all");
  wire.check_headers(recv, t.peers(), m, Phase::kAllReducePieces, n, t.op());

  at::Tensor sum = gathered.narrow(0, t.gather_slot(rank) * S, S);
  const OwnAddendTensor own{segments_of(flat, rank, 1, m), red.premul, red.premul_tensor};
  dequant_sum_requantize_into(wire.codes(recv, P - 1, m), own, red.post_div, wire.codes(sum, 1, m), tensor.device());
  if (error) measure_requantized_sum(wire.codes(recv, P - 1, m), own, red.post_div, wire.codes(sum, 1, m), *error);
  wire.write_headers(sum, 1, m, Phase::kAllReduceSums, n);
  t.wait(t.start_all_gather(gathered, S, scratch), "all_gather");
  wire.check_headers(gathered, t.gathered_from(), m, Phase::kAllReduceSums, n, t.op());

  decode_gathered(t, wire, gathered, m, P, [&](int64_t r, int64_t count) { return segments_of(flat, r, count, m); });
}

int64_t all_reduce_bytes_sent(int64_t group_size, const WireLayout& wire, int64_t numel) {
  return 2 * (group_size - 1) * wire.segment_bytes(wire.segment_numel(numel, group_size));
}

}  // namespace fp8comm
