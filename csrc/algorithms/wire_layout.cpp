#include "wire_layout.h"

namespace fp8comm {

namespace {
// Mixed into a call's key for the phases inside a node, less the phase: no
// chunk start (at_chunk's input) comes near it.
constexpr uint64_t kNodePhasesKey = ~uint64_t{0};
}  // namespace

WireLayout WireLayout::for_call(int64_t seed, uint64_t call, int64_t rank) const {
  WireLayout w = *this;
  w.rounding_key_ = mix_key(mix_key(mix_key(0, static_cast<uint64_t>(seed)), call), static_cast<uint64_t>(rank));
  return w;
}

WireLayout WireLayout::for_node_phase(WireFormat format, int phase) const {
  WireLayout w = *this;
  w.format_ = format;
  w.rounding_key_ = mix_key(rounding_key_, kNodePhasesKey - static_cast<uint64_t>(phase));
  return w;
}

WireLayout WireLayout::at_chunk(int64_t begin) const {
  WireLayout w = *this;
  w.rounding_key_ = mix_key(rounding_key_, static_cast<uint64_t>(begin));
  return w;
}

BlockCodes WireLayout::codes(const at::Tensor& bytes, int64_t count, int64_t m, int64_t first_segment) const {
  BlockCodes codes =
      wire_segments(static_cast<uint8_t*>(bytes.data_ptr()) + header_bytes(), count, m, block_size_, format_);
  codes.stride = segment_bytes(m);
  codes.rounding = rounding_;
  codes.rounding_key = rounding_key_;
  codes.first_segment = first_segment;
  return codes;
}

void WireLayout::write_headers(const at::Tensor& bytes, int64_t count, int64_t m, const Phase& phase, int64_t n) const {
  if (!headers_) return;
  fp8comm::write_headers(static_cast<uint8_t*>(bytes.data_ptr()), count, segment_bytes(m),
                         SegmentHeader(phase, format_, block_size_, n));
}

void WireLayout::check_headers(const at::Tensor& bytes, const std::vector<int64_t>& senders, int64_t m, const Phase& phase,
                               int64_t n, const char* op) const {
  if (!headers_) return;
  fp8comm::check_headers(static_cast<const uint8_t*>(bytes.data_ptr()), segment_bytes(m), senders, phase,
                         SegmentHeader(phase, format_, block_size_, n), op);
}

}  // namespace fp8comm
