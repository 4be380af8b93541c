// reduce_scatter: segment r of every rank's input goes, quantized, to rank r,
// which adds the pieces in FP32 onto its own segment (never quantized).
#include <ATen/MemoryOverlap.h>

#include "algorithms.h"
#include "segments.h"

namespace fp8comm {

void reduce_scatter(Transport& t, const WireLayout& wire, Workspace& ws, const at::Tensor& output,
                    const std::vector<at::Tensor>& input_segments, const Reduction& red, QuantizationError* error) {
  const int64_t P = t.size(), rank = t.rank(), k = output.numel();
  const int64_t S = wire.segment_bytes(k);
  at::Tensor send = ws.bytes(Workspace::kSend, (P - 1) * S, output);
  at::Tensor own;
  if (input_segments.size() == 1) {  // one flat input of P * k elements
    quantize_for_peers(t, wire, input_segments[0], k, red, send, error);
    own = segments_of(input_segments[0], rank, 1, k);
  } else {
    for (int64_t r = 0, slot = 0; r < P; ++r) {
      if (r == rank) continue;
      quantize_measured(input_segments[r], red, wire.codes(send.narrow(0, slot++ * S, S), 1, k), error);
    }
    own = input_segments[rank];
  }
  // The sum reads own[i] before it writes output[i]; any other overlap reads a copy.
  if (at::get_overlap_status(own, output) == at::MemOverlapStatus::Partial) own = own.clone();
  wire.write_headers(send, P - 1, k, Phase::kReduceScatterPieces, k);
  at::Tensor recv = ws.bytes(Workspace::kRecv, (P - 1) * S, output);
  t.wait(t.start_exchange(recv, send, S), "all_to_all");
  wire.check_headers(recv, t.peers(), k, Phase::kReduceScatterPieces, k, t.op());
  dequant_sum_into(wire.codes(recv, P - 1, k), OwnAddendTensor{own, red.premul, red.premul_tensor}, red.post_div, output);
}

int64_t reduce_scatter_bytes_sent(int64_t group_size, const WireLayout& wire, int64_t output_numel) {
  return (group_size - 1) * wire.segment_bytes(output_numel);
}

}  // namespace fp8comm
