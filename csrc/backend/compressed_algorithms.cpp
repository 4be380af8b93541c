// The compressed algorithms (DESIGN.md, "Algorithms"), written once over the
// Transport so the logic CI runs on gloo is the logic that runs on NCCL.
// CUDA buffers are allocated inside the algorithm, i.e. on the stream it runs
// on, so the caching allocator keeps them until that stream is done; CPU ones
// come from the reusable Workspace.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include <ATen/MemoryOverlap.h>

#include "algorithm_parts.h"
#include "segment_header.h"
#include "../codec/codec_tensor.h"

namespace fp8comm {

// A wire segment of m elements: the header (where the transport's traits
// want one, segment_header.h), then the codec's [scales][codes]. Both are
// multiples of 16 bytes, so the codes of every segment stay 16-byte aligned.
int64_t ProcessGroupFP8::wireSegmentBytes(c10::DeviceType device_type, int64_t m) const {
  return traitsFor(device_type).headerBytes() + segment_bytes(m, options_.block_size);
}

BlockCodes ProcessGroupFP8::wire(const Transport& t, const at::Tensor& bytes, int64_t num_segments,
                                 int64_t segment_numel) const {
  const int64_t header = t.traits().headerBytes();
  BlockCodes codes = wire_segments(static_cast<uint8_t*>(bytes.data_ptr()) + header, num_segments, segment_numel,
                                   options_.block_size, options_.format);
  codes.stride = header + codes.stride;
  return codes;
}

namespace {

// The header every segment of `bytes` carries, where the transport has them.
void frame(const TransportTraits& traits, const at::Tensor& bytes, int64_t count, int64_t stride, Phase phase,
           const FP8Options& o, int64_t n) {
  if (!traits.segment_headers) return;
  write_headers(static_cast<uint8_t*>(bytes.data_ptr()), count, stride, SegmentHeader(phase, o.format, o.block_size, n));
}

// Checks the headers of the segments of `bytes`; segment i came from rank senders[i].
void check_frames(const TransportTraits& traits, const at::Tensor& bytes, const std::vector<int64_t>& senders,
                  int64_t stride, Phase phase, const FP8Options& o, int64_t n, const char* op) {
  if (!traits.segment_headers) return;
  check_headers(static_cast<const uint8_t*>(bytes.data_ptr()), stride, senders,
                SegmentHeader(phase, o.format, o.block_size, n), op);
}

// The senders of an exchange's segments: the other ranks, in order.
std::vector<int64_t> peers_of(int64_t rank, int64_t P) {
  std::vector<int64_t> peers;
  for (int64_t r = 0; r < P; ++r) {
    if (r != rank) peers.push_back(r);
  }
  return peers;
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
// 2-core CI machine, 2M-16M element chunks and no chunking measured within
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
// as P segments of m elements, S wire bytes each; `at` is where its segments
// start in the send / recv / gathered buffers (P slots each; send and recv use
// P - 1 of them).
struct ProcessGroupFP8::Chunk {
  int64_t offset, numel, m, S, at;
};

// With FP8COMM_PAIR_ALLREDUCE=1, two ranks exchange whole FP32 chunks
// (allreducePair); otherwise, and for 16-bit dtypes, each chunk is cut into
// P segments, one per owner. Opt-in, because the choice depends on the
// dtype: ranks that all_reduce the same numel in different dtypes would take
// different algorithms (docs/performance.md has the measurements). For 16-bit
// tensors the codec works twice as hard per wire byte, and there the reduce +
// gather algorithm's lighter codec passes measured faster.
bool ProcessGroupFP8::allreduceByPair(const at::Tensor& like) const {
  static const bool enabled = [] {
    const char* env = std::getenv("FP8COMM_PAIR_ALLREDUCE");
    return env != nullptr && std::string(env) == "1";
  }();
  return size_ == 2 && enabled && c10::toRealValueType(like.scalar_type()) == at::kFloat;
}

std::vector<ProcessGroupFP8::Chunk> ProcessGroupFP8::allreduceChunks(const at::Tensor& like, int64_t n) const {
  const TransportTraits traits = traitsFor(like.device().type());
  const int64_t P = size_;
  const int64_t B = options_.block_size;
  const int64_t parts = allreduceByPair(like) ? 1 : P;
  const int64_t unit = parts * B;
  const int64_t chunk =
      traits.chunked_all_reduce ? ceil_div(cpu_chunk_elements(), unit) * unit : ceil_div(n, unit) * unit;
  std::vector<Chunk> chunks;
  int64_t bytes = 0;
  for (int64_t offset = 0; offset < n; offset += chunk) {
    const int64_t numel = std::min(chunk, n - offset);
    // Segments are whole blocks, so each starts 16-byte aligned in the tensor.
    const int64_t m = ceil_div(ceil_div(numel, parts), B) * B;
    const int64_t S = traits.headerBytes() + segment_bytes(m, B);
    chunks.push_back({offset, numel, m, S, bytes});
    bytes += P * S;
  }
  return chunks;
}

int64_t ProcessGroupFP8::allreduceWireBytes(const at::Tensor& like, int64_t n) const {
  int64_t bytes = 0;
  const int64_t phases = allreduceByPair(like) ? 1 : 2;
  for (const Chunk& c : allreduceChunks(like, n)) bytes += phases * (size_ - 1) * c.S;
  return bytes;
}

namespace {

// Segments [r, r + count) of m elements of `flat`, clipped to its end (empty
// past it): the elements a codec call over those segments reads or writes.
at::Tensor segments_of(const at::Tensor& t, int64_t r, int64_t count, int64_t m) {
  const at::Tensor flat = t.view({-1});  // contiguous; complex64 arrives as [n, 2] floats
  const int64_t n = flat.numel();
  const int64_t begin = std::min(r * m, n);
  return flat.narrow(0, begin, std::min((r + count) * m, n) - begin);
}

// Quantizes every segment of `flat` but this rank's own into `send`: the
// other ranks' segments in order, S bytes each (the exchange's layout).
template <typename Wire>
void quantize_for_peers(const at::Tensor& flat, int64_t rank, int64_t P, int64_t m, int64_t S, float premul,
                        const std::optional<at::Tensor>& premul_tensor, const at::Tensor& send, Wire&& wire) {
  if (rank > 0) {
    quantize_into(segments_of(flat, 0, rank, m), premul, premul_tensor, wire(send.narrow(0, 0, rank * S), rank));
  }
  if (rank + 1 < P) {
    const int64_t count = P - 1 - rank;
    quantize_into(segments_of(flat, rank + 1, count, m), premul, premul_tensor,
                  wire(send.narrow(0, rank * S, count * S), count));
  }
}

}  // namespace

// The owner of each segment sums the other ranks' quantized pieces onto its own
// input, which never leaves it (DESIGN.md, "Algorithms"), re-quantizes the sum
// into its slot of the gathered buffer, and all-gathers those bytes: every
// rank decodes the same bytes, so every rank ends with bitwise the same
// result. Each chunk is P segments of whole blocks; which rank owns (adds
// exactly) an element follows its chunk, so the bytes depend on the fixed
// chunk size (tests/test_allreduce_chunks.py models it chunk by chunk).
void ProcessGroupFP8::allreduceCompressed(Transport& transport, const at::Tensor& tensor, const Reduction& red,
                                          const char* op) {
  if (allreduceByPair(tensor)) return allreducePair(transport, tensor, red, op);
  const int64_t P = size_;
  const int64_t n = tensor.numel();
  const at::Tensor flat = tensor.view({-1});  // contiguous, any shape (complex64 arrives as [n, 2] floats)
  const std::vector<Chunk> chunks = allreduceChunks(tensor, n);
  const int64_t C = static_cast<int64_t>(chunks.size());
  const int64_t bytes = chunks.back().at + P * chunks.back().S;
  int64_t scratch_bytes = 0;
  for (const Chunk& c : chunks) scratch_bytes = std::max(scratch_bytes, transport.gatherScratchBytes(c.S));
  at::Tensor send = workspace_.bytes(Workspace::kSend, bytes, tensor);
  at::Tensor recv = workspace_.bytes(Workspace::kRecv, bytes, tensor);
  at::Tensor gathered = workspace_.bytes(Workspace::kGathered, bytes, tensor);
  // One all_gather scratch per chunk in flight (two at most: see the schedule below).
  at::Tensor scratch = workspace_.bytes(Workspace::kReduced, 2 * scratch_bytes, tensor);
  auto slice = [](const at::Tensor& t, const Chunk& c, int64_t count) { return t.narrow(0, c.at, count * c.S); };
  auto chunk_of = [&](const Chunk& c) { return flat.narrow(0, c.offset, c.numel); };
  const std::vector<int64_t> peers = peers_of(rank_, P), gathered_from = gatheredFrom(transport);
  InFlight exchange(C), all_gather(C);

  auto quantize = [&](int64_t k) {
    const Chunk& c = chunks[k];
    at::Tensor out = slice(send, c, P - 1), in = slice(recv, c, P - 1);
    quantize_for_peers(chunk_of(c), rank_, P, c.m, c.S, red.premul, red.premul_tensor, out,
                       [&](const at::Tensor& bytes, int64_t count) { return wire(transport, bytes, count, c.m); });
    frame(transport.traits(), out, P - 1, c.S, Phase::kAllReduceScatter, options_, n);
    exchange[k] = transport.startExchange(in, out, c.S);
  };
  auto reduce = [&](int64_t k) {
    const Chunk& c = chunks[k];
    transport.wait(exchange.take(k), "all_to_all");
    check_frames(transport.traits(), slice(recv, c, P - 1), peers, c.S, Phase::kAllReduceScatter, options_, n, op);
    at::Tensor all = slice(gathered, c, P);
    at::Tensor reduced = all.narrow(0, transport.gatherSlot(rank_) * c.S, c.S);
    const OwnInput own{segments_of(chunk_of(c), rank_, 1, c.m), red.premul, red.premul_tensor};
    dequant_sum_requantize_into(wire(transport, slice(recv, c, P - 1), P - 1, c.m), own, red.post_div, wire(transport, reduced, 1, c.m),
                                tensor.device());
    frame(transport.traits(), reduced, 1, c.S, Phase::kAllReduceGather, options_, n);
    at::Tensor room = scratch.narrow(0, (k % 2) * scratch_bytes, scratch_bytes);
    all_gather[k] = transport.startAllGather(all, c.S, room);
  };
  auto gathered_ok = [&](int64_t k) {
    const Chunk& c = chunks[k];
    transport.wait(all_gather.take(k), "all_gather");
    check_frames(transport.traits(), slice(gathered, c, P), gathered_from, c.S, Phase::kAllReduceGather, options_, n, op);
  };
  // Quantize chunk k while chunk k-1's exchange and chunk k-2's all_gather are
  // on the wire; chunk k-2's scratch is free again before k's is written.
  for (int64_t k = 0; k < C; ++k) {
    quantize(k);
    if (k >= 1) reduce(k - 1);
    if (k >= 2) gathered_ok(k - 2);
  }
  reduce(C - 1);
  for (int64_t k = std::max<int64_t>(0, C - 2); k < C; ++k) gathered_ok(k);
  // Only now, with every phase of every chunk through, is the tensor written:
  // a call that fails leaves it as it was (docs/reliability.md).
  for (const Chunk& c : chunks) {
    decodeGathered(transport, slice(gathered, c, P), c.m, c.S, P, tensor.nbytes(), [&](int64_t r, int64_t count) {
      return segments_of(chunk_of(c), r, count, c.m);
    });
  }
}

// Two ranks: each quantizes its whole input once and sends it to the other;
// both add the two pieces in rank order, so both hold bitwise the same sum.
// The bytes on the wire are those of the reduce + gather algorithm at P = 2
// (n each way), with one exchange instead of two, one quantization instead of
// two, and no re-quantization pass (DESIGN.md, "Algorithms").
void ProcessGroupFP8::allreducePair(Transport& transport, const at::Tensor& tensor, const Reduction& red,
                                    const char* op) {
  const int64_t n = tensor.numel();
  const at::Tensor flat = tensor.view({-1});
  const std::vector<Chunk> chunks = allreduceChunks(tensor, n);
  const int64_t C = static_cast<int64_t>(chunks.size());
  // Each chunk's two segments in rank order: this rank's slot is what it sends.
  at::Tensor pairs = workspace_.bytes(Workspace::kGathered, chunks.back().at + 2 * chunks.back().S, tensor);
  const int64_t peer = 1 - rank_;
  auto slot = [&](const Chunk& c, int64_t r) { return pairs.narrow(0, c.at + r * c.S, c.S); };
  auto chunk_of = [&](const Chunk& c) { return flat.narrow(0, c.offset, c.numel); };
  InFlight exchange(C);
  auto received = [&](int64_t k) {
    const Chunk& c = chunks[k];
    transport.wait(exchange.take(k), "all_to_all");
    check_frames(transport.traits(), slot(c, peer), {peer}, c.S, Phase::kAllReducePair, options_, n, op);
  };
  // Quantize chunk k while chunk k-1 is on the wire.
  for (int64_t k = 0; k < C; ++k) {
    const Chunk& c = chunks[k];
    at::Tensor mine = slot(c, rank_), theirs = slot(c, peer);
    quantize_into(chunk_of(c), red.premul, red.premul_tensor, wire(transport, mine, 1, c.m));
    frame(transport.traits(), mine, 1, c.S, Phase::kAllReducePair, options_, n);
    exchange[k] = transport.startExchange(theirs, mine, c.S);
    if (k >= 1) received(k - 1);
  }
  received(C - 1);
  // As allreduceCompressed: the tensor is written only once every chunk is through.
  for (const Chunk& c : chunks) {
    dequant_sum_into(wire(transport, pairs.narrow(0, c.at, 2 * c.S), 2, c.m), OwnInput{}, red.post_div, chunk_of(c));
  }
}

// The rank whose segment each slot of an all_gather's buffer holds (-1 for
// this rank's own: nothing to check).
std::vector<int64_t> ProcessGroupFP8::gatheredFrom(const Transport& transport) const {
  std::vector<int64_t> from(size_, -1);
  for (int64_t r = 0; r < size_; ++r) {
    if (r != rank_) from[transport.gatherSlot(r)] = r;
  }
  return from;
}

// Decodes the P segments of m elements of an all_gather's buffer `all` into
// out(r, count), the elements of ranks [r, r + count), in runs of at most
// max_run ranks whose slots are consecutive (Transport::gatherSlot: at most
// three runs). output_bytes: the whole output's size, of which these runs are
// parts; the CPU codec picks its stores by it (codec.h, dequantize_cpu).
template <typename Out>
void ProcessGroupFP8::decodeGathered(const Transport& transport, const at::Tensor& all, int64_t m, int64_t S,
                                     int64_t max_run, int64_t output_bytes, Out&& out) const {
  const int64_t P = size_;
  for (int64_t r = 0; r < P;) {
    int64_t count = 1;
    while (count < max_run && r + count < P && transport.gatherSlot(r + count) == transport.gatherSlot(r) + count) {
      ++count;
    }
    const at::Tensor dst = out(r, count);
    if (dst.numel() > 0) {
      dequantize_into(wire(transport, all.narrow(0, transport.gatherSlot(r) * S, count * S), count, m), dst, output_bytes);
    }
    r += count;
  }
}

// Segment r of the input goes to rank r, which adds the other ranks' pieces to
// its own segment in FP32.
void ProcessGroupFP8::reduceScatterCompressed(Transport& transport, const at::Tensor& output,
                                              const std::vector<at::Tensor>& input_segments, const Reduction& red,
                                              const char* op) {
  const int64_t P = size_;
  const int64_t k = output.numel();
  const int64_t S = wireSegmentBytes(output.device().type(), k);
  at::Tensor send = workspace_.bytes(Workspace::kSend, (P - 1) * S, output);
  auto wire_of = [&](const at::Tensor& bytes, int64_t count) { return wire(transport, bytes, count, k); };
  at::Tensor own;
  if (input_segments.size() == 1) {  // one flat input of P * k elements
    quantize_for_peers(input_segments[0], rank_, P, k, S, red.premul, red.premul_tensor, send, wire_of);
    own = segments_of(input_segments[0], rank_, 1, k);
  } else {
    for (int64_t r = 0, slot = 0; r < P; ++r) {
      if (r == rank_) continue;
      quantize_into(input_segments[r], red.premul, red.premul_tensor, wire_of(send.narrow(0, slot++ * S, S), 1));
    }
    own = input_segments[rank_];
  }
  // The sum reads own[i] before it writes output[i]; any other overlap reads a copy.
  if (at::get_overlap_status(own, output) == at::MemOverlapStatus::Partial) own = own.clone();
  frame(transport.traits(), send, P - 1, S, Phase::kReduceScatter, options_, k);
  at::Tensor recv = workspace_.bytes(Workspace::kRecv, (P - 1) * S, output);
  transport.wait(transport.startExchange(recv, send, S), "all_to_all");
  check_frames(transport.traits(), recv, peers_of(rank_, P), S, Phase::kReduceScatter, options_, k, op);
  dequant_sum_into(wire(transport, recv, P - 1, k), OwnInput{own, red.premul, red.premul_tensor}, red.post_div, output);
}

// Every rank decodes every segment, its own included, so all outputs agree.
void ProcessGroupFP8::allgatherCompressed(Transport& transport, const std::vector<at::Tensor>& output_segments,
                                          const at::Tensor& input, const char* op) {
  const int64_t P = size_;
  const int64_t k = input.numel();
  const int64_t S = wireSegmentBytes(input.device().type(), k);
  at::Tensor all = workspace_.bytes(Workspace::kGathered, P * S, input);
  at::Tensor mine = all.narrow(0, transport.gatherSlot(rank_) * S, S);
  quantize_into(input, 1.0f, std::nullopt, wire(transport, mine, 1, k));
  frame(transport.traits(), mine, 1, S, Phase::kAllGather, options_, k);
  at::Tensor scratch = workspace_.bytes(Workspace::kSend, transport.gatherScratchBytes(S), input);
  transport.wait(transport.startAllGather(all, S, scratch), "all_gather");
  check_frames(transport.traits(), all, gatheredFrom(transport), S, Phase::kAllGather, options_, k, op);
  if (output_segments.size() == 1) {  // one flat output of P * k elements
    decodeGathered(transport, all, k, S, P, output_segments[0].nbytes(), [&](int64_t r, int64_t count) {
      return segments_of(output_segments[0], r, count, k);
    });
  } else {
    decodeGathered(transport, all, k, S, 1, P * input.nbytes(), [&](int64_t r, int64_t) { return output_segments[r]; });
  }
}

}  // namespace fp8comm
