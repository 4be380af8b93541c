#pragma once
// Reusable CPU wire buffers, one per role: a fresh multi-MiB allocation
// page-faults on first touch, a cost of the order of moving its bytes over
// loopback. CUDA buffers come from the caching allocator instead, allocated
// on the stream the algorithm runs on. Buffers above kMaxCachedBytes are not
// kept, so a group caches at most kSlots of them.
#include <ATen/ATen.h>

#include <array>

namespace fp8comm {

class Workspace {
 public:
  // kNodeStaging, kNodeChunk, kNodeExchange: the inter_node scope's data inside a node (by_node.cpp).
  enum Slot { kSend = 0, kRecv, kGathered, kGatherScratch, kNodeStaging, kNodeChunk, kNodeExchange, kSlots };
  static constexpr int64_t kMaxCachedBytes = int64_t{256} << 20;

  // A contiguous uint8 tensor of `bytes` bytes on `like`'s device. CPU
  // buffers stay valid until the same slot is asked for again.
  at::Tensor bytes(Slot slot, int64_t bytes, const at::Tensor& like);
  // Forgets every cached buffer, after a call that failed: phases it left in
  // flight keep theirs alive and may still write them, so the next call
  // must not reuse them.
  void release();

 private:
  std::array<at::Tensor, kSlots> cache_;
};

}  // namespace fp8comm
