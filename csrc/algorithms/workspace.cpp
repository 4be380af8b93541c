#include "workspace.h"

namespace fp8comm {

at::Tensor Workspace::bytes(Slot slot, int64_t bytes, const at::Tensor& like) {
  const auto options = like.options().dtype(at::kByte).memory_format(at::MemoryFormat::Contiguous);
  if (!like.device().is_cpu() || bytes > kMaxCachedBytes) return at::empty({bytes}, options);
  at::Tensor& cached = cache_[slot];
  if (!cached.defined() || cached.numel() < bytes) cached = at::empty({bytes}, options);
  return cached.narrow(0, 0, bytes);
}

void Workspace::release() {
  for (auto& buffer : cache_) buffer = at::Tensor();
}

}  // namespace fp8comm
