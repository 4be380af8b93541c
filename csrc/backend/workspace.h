#pragma once
// Reusable CPU wire buffers. A fresh multi-MiB allocation page-faults on first
// touch (~5 ms per 16 MiB here), as much as moving the bytes over loopback, so
// the CPU algorithms reuse one buffer per role. CUDA buffers come from the
// caching allocator instead. Buffers above kMaxCachedBytes are not kept (a
// group holds at most 4 x 256 MiB, for collectives of ~1 GiB of FP32).
#include <ATen/ATen.h>

#include <array>

namespace fp8comm {

class Workspace {
 public:
  enum Slot { kSend = 0, kRecv, kReduced, kGathered, kSlots };
  static constexpr int64_t kMaxCachedBytes = int64_t{256} << 20;

  // A contiguous uint8 tensor of `bytes` bytes on `like`'s device. CPU
  // buffers stay valid until the same slot is asked for again.
  at::Tensor bytes(Slot slot, int64_t bytes, const at::Tensor& like);

 private:
  std::array<at::Tensor, kSlots> cache_;
};

}  // namespace fp8comm
