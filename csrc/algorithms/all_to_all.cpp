// all_to_all: each slice for a peer is its own wire segment, quantized once
// (or, inside a node in the inter_node scope, sent as its exact bytes);
// this rank's own slice is copied, never quantized; one exchange with bytes
// of their own for each peer; the output written only once it is through
// (DESIGN.md, "Algorithms"). Its prepare step checks the split sizes on
// every rank before any data moves (all_to_all_splits.h). One phase: the
// call is not cut into chunks.
#include <ATen/MemoryOverlap.h>

#include <utility>

#include "algorithms.h"
#include "all_to_all_splits.h"
#include "compressed_algorithms.h"
#include "segments.h"

namespace fp8comm {

namespace {

// The raw bytes of a contiguous tensor.
at::Tensor bytes_of_tensor(const at::Tensor& t) { return t.view({-1}).view(at::kByte); }

}  // namespace

std::vector<int64_t> all_to_all(Transport& t, const std::vector<std::optional<WireLayout>>& wires, Workspace& ws,
                                const at::Tensor& output, const at::Tensor& input,
                                const std::vector<int64_t>& send_numels, const std::vector<int64_t>& recv_numels,
                                QuantizationError* error, const Phase* phase) {
  const Phase& kPhase = phase ? *phase : compressed::kAllToAll.phases[0];
  const int64_t P = t.size(), rank = t.rank(), element = input.element_size();
  // A slice's bytes on the wire: none for this rank's own or an empty one;
  // exact slices padded to 16 bytes so every segment after them stays aligned.
  auto wire_bytes = [&](int64_t r, int64_t n) -> int64_t {
    if (r == rank || n == 0) return 0;
    return wires[r] ? wires[r]->segment_bytes(n) : align16(n * element);
  };
  std::vector<int64_t> send_bytes(P), recv_bytes(P), send_at(P), recv_at(P), input_at(P), output_at(P);
  int64_t send_total = 0, recv_total = 0, input_total = 0, output_total = 0;
  for (int64_t r = 0; r < P; ++r) {
    send_bytes[r] = wire_bytes(r, send_numels[r]);
    recv_bytes[r] = wire_bytes(r, recv_numels[r]);
    send_at[r] = std::exchange(send_total, send_total + send_bytes[r]);
    recv_at[r] = std::exchange(recv_total, recv_total + recv_bytes[r]);
    input_at[r] = std::exchange(input_total, input_total + send_numels[r]);
    output_at[r] = std::exchange(output_total, output_total + recv_numels[r]);
  }
  TORCH_INTERNAL_ASSERT(input_total == input.numel() && output_total == output.numel(), "fp8comm ", t.op(),
                        ": the slices do not cover the tensors");
  at::Tensor send = ws.bytes(Workspace::kSend, send_total, input);
  at::Tensor recv = ws.bytes(Workspace::kRecv, recv_total, input);
  const at::Tensor in = input.view({-1}), out = output.view({-1});

  for (int64_t r = 0; r < P; ++r) {
    const int64_t n = send_numels[r];
    if (send_bytes[r] == 0) continue;
    const at::Tensor segment = send.narrow(0, send_at[r], send_bytes[r]);
    const at::Tensor slice = in.narrow(0, input_at[r], n);
    if (wires[r]) {  // the segment's rounding bits are keyed by the receiving rank
      quantize_measured(slice, Reduction{}, wires[r]->codes(segment, 1, n, r), error);
      wires[r]->write_headers(segment, 1, n, kPhase, n);
    } else {
      segment.narrow(0, 0, n * element).copy_(bytes_of_tensor(slice));
      segment.narrow(0, n * element, send_bytes[r] - n * element).zero_();  // no uninitialized byte is sent
    }
  }
  t.wait(t.start_exchange(recv, send, recv_bytes, send_bytes), "all_to_all");
  for (int64_t r = 0; r < P; ++r) {
    if (recv_bytes[r] > 0 && wires[r]) {
      wires[r]->check_headers(recv.narrow(0, recv_at[r], recv_bytes[r]), {r}, recv_numels[r], kPhase,
                              recv_numels[r], t.op());
    }
  }

  // Written only now: a call that failed has left the output as it was.
  at::Tensor own = in.narrow(0, input_at[rank], send_numels[rank]);
  if (at::get_overlap_status(own, output) != at::MemOverlapStatus::No) own = own.clone();
  for (int64_t r = 0; r < P; ++r) {
    if (recv_bytes[r] == 0) continue;
    const int64_t n = recv_numels[r];
    const at::Tensor segment = recv.narrow(0, recv_at[r], recv_bytes[r]);
    const at::Tensor slice = out.narrow(0, output_at[r], n);
    if (wires[r]) {
      dequantize_into(wires[r]->codes(segment, 1, n), slice, output.nbytes());
    } else {
      bytes_of_tensor(slice).copy_(segment.narrow(0, 0, n * element));
    }
  }
  out.narrow(0, output_at[rank], recv_numels[rank]).copy_(own);
  return send_bytes;
}

NodeBytes compressed::run_all_to_all(Route& route, const WireLayout& wire, Workspace& ws, const CompressedArgs& a,
                                     QuantizationError* error) {
  TORCH_CHECK_VALUE(!a.residual.defined(), "fp8comm all_to_all: error feedback (a residual) does not apply to "
                    "all_to_all: each slice crosses the wire once, to another rank, so nothing of what it drops "
                    "comes back to be added to the next call; call it without a residual");
  Transport& t = route.group_transport;
  const int64_t before = t.bytes_sent();
  const std::vector<int64_t> to_rank =
      all_to_all(t, route.slice_wires(wire), ws, a.outputs.at(0), a.inputs.at(0), a.send_numels, a.recv_numels, error);
  return route.split(t.bytes_sent() - before, to_rank);
}

// The ranks gather every rank's slice sizes and check every pair, so sizes
// that disagree raise on every rank; the size rule then reads the group's
// mean input, the same on every rank. The sizes' all_gather sends every
// peer the same bytes.
Prepared compressed::prepare_all_to_all(Route& route, const CompressedArgs& shape, const at::Device& device) {
  Transport& t = route.group_transport;
  const int64_t before = t.bytes_sent();
  const SplitTable table = gather_splits(t, shape.send_numels, shape.recv_numels, device);
  check_splits(table, t.op());
  return {table.total_sent() / t.size(), route.split(t.bytes_sent() - before, {})};
}

}  // namespace fp8comm
