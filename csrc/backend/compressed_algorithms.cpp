// The compressed algorithms (DESIGN.md, "Algorithms"), written once over the
// Transport so the logic CI runs on gloo is the logic that runs on NCCL.
// CUDA buffers are allocated inside the algorithm, i.e. on the stream it runs
// on, so the caching allocator keeps them until that stream is done; CPU ones
// come from the reusable Workspace.
#include "algorithm_parts.h"
#include "../codec/codec_tensor.h"

namespace fp8comm {

BlockCodes ProcessGroupFP8::wire(const at::Tensor& bytes, int64_t num_segments, int64_t segment_numel) const {
  return wire_segments(static_cast<uint8_t*>(bytes.data_ptr()), num_segments, segment_numel,
                       options_.block_size, options_.format);
}

c10::Stream ProcessGroupFP8::sideStream(const at::Device& device) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = side_streams_.find(device.index());
  if (it == side_streams_.end()) {
    c10::impl::VirtualGuardImpl impl(device.type());
    it = side_streams_.emplace(device.index(), impl.getStreamFromGlobalPool(device, /*isHighPriority=*/false)).first;
  }
  return it->second;
}

// reduce_scatter of the P segments of n/P elements each, the sum re-quantized,
// then all_gather of those bytes: every rank decodes the same bytes, so every
// rank ends with bitwise the same result.
void ProcessGroupFP8::allreduceCompressed(Transport& transport, const at::Tensor& tensor, const Reduction& red) {
  const int64_t P = size_;
  const int64_t B = options_.block_size;
  // Segments are whole blocks, so each starts 16-byte aligned in the tensor.
  const int64_t m = ceil_div(ceil_div(tensor.numel(), P), B) * B;
  const int64_t S = segment_bytes(m, B);
  at::Tensor send = workspace_.bytes(Workspace::kSend, P * S, tensor);
  at::Tensor recv = workspace_.bytes(Workspace::kRecv, P * S, tensor);
  quantize_into(tensor, red.premul, red.premul_tensor, wire(send, P, m));
  transport.allToAll(recv, send);
  at::Tensor mine = workspace_.bytes(Workspace::kReduced, S, tensor);
  dequant_sum_requantize_into(wire(recv, P, m), red.post_div, wire(mine, 1, m), tensor.device());
  at::Tensor gathered = workspace_.bytes(Workspace::kGathered, P * S, tensor);
  transport.allGather(gathered, mine);
  dequantize_into(wire(gathered, P, m), tensor);
}

// Segment r of the input goes to rank r, which sums the P pieces in FP32.
void ProcessGroupFP8::reduceScatterCompressed(Transport& transport, const at::Tensor& output,
                                              const std::vector<at::Tensor>& input_segments, const Reduction& red) {
  const int64_t P = size_;
  const int64_t k = output.numel();
  const int64_t S = segment_bytes(k, options_.block_size);
  at::Tensor send = workspace_.bytes(Workspace::kSend, P * S, output);
  if (input_segments.size() == 1) {  // one flat input of P * k elements
    quantize_into(input_segments[0], red.premul, red.premul_tensor, wire(send, P, k));
  } else {
    for (int64_t r = 0; r < P; ++r) {
      quantize_into(input_segments[r], red.premul, red.premul_tensor, wire(send.narrow(0, r * S, S), 1, k));
    }
  }
  at::Tensor recv = workspace_.bytes(Workspace::kRecv, P * S, output);
  transport.allToAll(recv, send);
  dequant_sum_into(wire(recv, P, k), red.post_div, output);
}

// Every rank decodes every segment, its own included, so all outputs agree.
void ProcessGroupFP8::allgatherCompressed(Transport& transport, const std::vector<at::Tensor>& output_segments,
                                          const at::Tensor& input) {
  const int64_t P = size_;
  const int64_t k = input.numel();
  const int64_t S = segment_bytes(k, options_.block_size);
  at::Tensor send = workspace_.bytes(Workspace::kSend, S, input);
  quantize_into(input, 1.0f, std::nullopt, wire(send, 1, k));
  at::Tensor recv = workspace_.bytes(Workspace::kRecv, P * S, input);
  transport.allGather(recv, send);
  if (output_segments.size() == 1) {  // one flat output of P * k elements
    dequantize_into(wire(recv, P, k), output_segments[0]);
  } else {
    for (int64_t r = 0; r < P; ++r) dequantize_into(wire(recv.narrow(0, r * S, S), 1, k), output_segments[r]);
  }
}

}  // namespace fp8comm
