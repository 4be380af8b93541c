// The compressed algorithms (DESIGN.md, "Algorithms"), written once over the
// Transport so the logic CI runs on gloo is the logic that runs on NCCL.
// CUDA buffers are allocated inside the algorithm, i.e. on the stream it runs
// on, so the caching allocator keeps them until that stream is done; CPU ones
// come from the reusable Workspace.
#include <algorithm>
#include <cstdlib>
#include <vector>

#include "algorithm_parts.h"
#include "segment_header.h"
#include "../codec/codec_tensor.h"

namespace fp8comm {

// A wire segment of m elements: the header (CPU only, segment_header.h), then
// the codec's [scales][codes]. Both are multiples of 16 bytes, so the codes of
// every segment stay 16-byte aligned.
int64_t ProcessGroupFP8::wireSegmentBytes(const at::Device& device, int64_t m) const {
  return header_bytes(device) + segment_bytes(m, options_.block_size);
}

BlockCodes ProcessGroupFP8::wire(const at::Tensor& bytes, int64_t num_segments, int64_t segment_numel) const {
  const int64_t header = header_bytes(bytes.device());
  BlockCodes codes = wire_segments(static_cast<uint8_t*>(bytes.data_ptr()) + header, num_segments, segment_numel,
                                   options_.block_size, options_.format);
  codes.stride = header + codes.stride;
  return codes;
}

namespace {

// The header every segment of `bytes` carries (nothing on CUDA).
void frame(const at::Tensor& bytes, int64_t count, int64_t stride, Phase phase, const FP8Options& o, int64_t n) {
  if (header_bytes(bytes.device()) == 0) return;
  write_headers(static_cast<uint8_t*>(bytes.data_ptr()), count, stride, SegmentHeader(phase, o.format, o.block_size, n));
}

void check_frames(const at::Tensor& bytes, int64_t count, int64_t stride, Phase phase, const FP8Options& o,
                  int64_t n, const char* op) {
  if (header_bytes(bytes.device()) == 0) return;
  check_headers(static_cast<const uint8_t*>(bytes.data_ptr()), count, stride,
                SegmentHeader(phase, o.format, o.block_size, n), op);
}

}  // namespace

c10::Stream ProcessGroupFP8::sideStream(const at::Device& device) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = side_streams_.find(device.index());
  if (it == side_streams_.end()) {
    c10::impl::VirtualGuardImpl impl(device.type());
    it = side_streams_.emplace(device.index(), impl.getStreamFromGlobalPool(device, /*isHighPriority=*/false)).first;
  }
  return it->second;
}

namespace {

// CPU all_reduces are cut into chunks of 2M elements (8 MiB of FP32), so that
// the codec works on one chunk while the transport moves another. On the
// 2-core CI machine, 1M-8M element chunks and no chunking measured within
// noise of each other (docs/performance.md); the gain needs idle cores.
// FP8COMM_CPU_CHUNK_ELEMENTS overrides it (for measuring). CUDA runs one
// chunk: its phases are ordered on one side stream.
int64_t cpu_chunk_elements() {
  static const int64_t chunk = [] {
    const char* env = std::getenv("FP8COMM_CPU_CHUNK_ELEMENTS");
    const int64_t v = env ? std::atoll(env) : 0;
    return v > 0 ? v : int64_t{1} << 21;
  }();
  return chunk;
}

}  // namespace

// Chunk k of an all_reduce: elements [offset, offset + numel) of the tensor,
// as P segments of m elements, S wire bytes each; `at` is where its P
// segments start in the send / recv / gathered buffers.
struct ProcessGroupFP8::Chunk {
  int64_t offset, numel, m, S, at;
};

std::vector<ProcessGroupFP8::Chunk> ProcessGroupFP8::allreduceChunks(const at::Device& device, int64_t n) const {
  const int64_t P = size_;
  const int64_t B = options_.block_size;
  const int64_t unit = P * B;
  const int64_t chunk = device.is_cpu() ? ceil_div(cpu_chunk_elements(), unit) * unit : ceil_div(n, unit) * unit;
  std::vector<Chunk> chunks;
  int64_t bytes = 0;
  for (int64_t offset = 0; offset < n; offset += chunk) {
    const int64_t numel = std::min(chunk, n - offset);
    // Segments are whole blocks, so each starts 16-byte aligned in the tensor.
    const int64_t m = ceil_div(ceil_div(numel, P), B) * B;
    const int64_t S = wireSegmentBytes(device, m);
    chunks.push_back({offset, numel, m, S, bytes});
    bytes += P * S;
  }
  return chunks;
}

int64_t ProcessGroupFP8::allreduceWireBytes(const at::Device& device, int64_t n) const {
  int64_t bytes = 0;
  for (const Chunk& c : allreduceChunks(device, n)) bytes += 2 * (size_ - 1) * c.S;
  return bytes;
}

// reduce_scatter of the P segments of n/P elements each, the sum re-quantized,
// then all_gather of those bytes: every rank decodes the same bytes, so every
// rank ends with bitwise the same result. Chunks are whole multiples of P
// blocks, so every block holds the elements it would hold unchunked: the
// result does not depend on the chunking.
void ProcessGroupFP8::allreduceCompressed(Transport& transport, const at::Tensor& tensor, const Reduction& red,
                                          const char* op) {
  const int64_t P = size_;
  const int64_t n = tensor.numel();
  const at::Tensor flat = tensor.view({-1});  // contiguous, any shape (complex64 arrives as [n, 2] floats)
  const std::vector<Chunk> chunks = allreduceChunks(tensor.device(), n);
  const int64_t C = static_cast<int64_t>(chunks.size());
  const int64_t bytes = chunks.back().at + P * chunks.back().S;
  int64_t gather_send_bytes = 0;
  for (const Chunk& c : chunks) gather_send_bytes = std::max(gather_send_bytes, transport.gatherSendBytes(c.S, P));
  at::Tensor send = workspace_.bytes(Workspace::kSend, bytes, tensor);
  at::Tensor recv = workspace_.bytes(Workspace::kRecv, bytes, tensor);
  at::Tensor gathered = workspace_.bytes(Workspace::kGathered, bytes, tensor);
  // One reduced segment per chunk in flight (two at most: see the schedule below).
  at::Tensor mine = workspace_.bytes(Workspace::kReduced, 2 * gather_send_bytes, tensor);
  auto slice = [](const at::Tensor& t, const Chunk& c, int64_t P) { return t.narrow(0, c.at, P * c.S); };
  InFlight all_to_all(C), all_gather(C);

  auto quantize = [&](int64_t k) {
    const Chunk& c = chunks[k];
    at::Tensor out = slice(send, c, P), in = slice(recv, c, P);
    quantize_into(flat.narrow(0, c.offset, c.numel), red.premul, red.premul_tensor, wire(out, P, c.m));
    frame(out, P, c.S, Phase::kAllReduceScatter, options_, n);
    all_to_all[k] = transport.startAllToAll(in, out);
  };
  auto reduce = [&](int64_t k) {
    const Chunk& c = chunks[k];
    transport.wait(all_to_all.take(k), "all_to_all");
    check_frames(slice(recv, c, P), P, c.S, Phase::kAllReduceScatter, options_, n, op);
    at::Tensor reduced = mine.narrow(0, (k % 2) * gather_send_bytes, transport.gatherSendBytes(c.S, P));
    dequant_sum_requantize_into(wire(slice(recv, c, P), P, c.m), red.post_div, wire(reduced, 1, c.m),
                                tensor.device());
    frame(reduced, 1, c.S, Phase::kAllReduceGather, options_, n);
    at::Tensor in = slice(gathered, c, P);
    all_gather[k] = transport.startAllGather(in, reduced, c.S);
  };
  auto decode = [&](int64_t k) {
    const Chunk& c = chunks[k];
    transport.wait(all_gather.take(k), "all_gather");
    check_frames(slice(gathered, c, P), P, c.S, Phase::kAllReduceGather, options_, n, op);
    dequantize_into(wire(slice(gathered, c, P), P, c.m), flat.narrow(0, c.offset, c.numel));
  };
  // Quantize chunk k while chunk k-1's all_to_all and chunk k-2's all_gather
  // are on the wire; chunk k-2's reduced segment is free again before k's is written.
  for (int64_t k = 0; k < C; ++k) {
    quantize(k);
    if (k >= 1) reduce(k - 1);
    if (k >= 2) decode(k - 2);
  }
  reduce(C - 1);
  for (int64_t k = std::max<int64_t>(0, C - 2); k < C; ++k) decode(k);
}

// Segment r of the input goes to rank r, which sums the P pieces in FP32.
void ProcessGroupFP8::reduceScatterCompressed(Transport& transport, const at::Tensor& output,
                                              const std::vector<at::Tensor>& input_segments, const Reduction& red,
                                              const char* op) {
  const int64_t P = size_;
  const int64_t k = output.numel();
  const int64_t S = wireSegmentBytes(output.device(), k);
  at::Tensor send = workspace_.bytes(Workspace::kSend, P * S, output);
  if (input_segments.size() == 1) {  // one flat input of P * k elements
    quantize_into(input_segments[0], red.premul, red.premul_tensor, wire(send, P, k));
  } else {
    for (int64_t r = 0; r < P; ++r) {
      quantize_into(input_segments[r], red.premul, red.premul_tensor, wire(send.narrow(0, r * S, S), 1, k));
    }
  }
  frame(send, P, S, Phase::kReduceScatter, options_, k);
  at::Tensor recv = workspace_.bytes(Workspace::kRecv, P * S, output);
  transport.wait(transport.startAllToAll(recv, send), "all_to_all");
  check_frames(recv, P, S, Phase::kReduceScatter, options_, k, op);
  dequant_sum_into(wire(recv, P, k), red.post_div, output);
}

// Every rank decodes every segment, its own included, so all outputs agree.
void ProcessGroupFP8::allgatherCompressed(Transport& transport, const std::vector<at::Tensor>& output_segments,
                                          const at::Tensor& input, const char* op) {
  const int64_t P = size_;
  const int64_t k = input.numel();
  const int64_t S = wireSegmentBytes(input.device(), k);
  at::Tensor send = workspace_.bytes(Workspace::kSend, transport.gatherSendBytes(S, P), input);
  quantize_into(input, 1.0f, std::nullopt, wire(send, 1, k));
  frame(send, 1, S, Phase::kAllGather, options_, k);
  at::Tensor recv = workspace_.bytes(Workspace::kRecv, P * S, input);
  transport.wait(transport.startAllGather(recv, send, S), "all_gather");
  check_frames(recv, P, S, Phase::kAllGather, options_, k, op);
  if (output_segments.size() == 1) {  // one flat output of P * k elements
    dequantize_into(wire(recv, P, k), output_segments[0]);
  } else {
    for (int64_t r = 0; r < P; ++r) dequantize_into(wire(recv.narrow(0, r * S, S), 1, k), output_segments[r]);
  }
}

}  // namespace fp8comm
