#pragma once
// How the compressed algorithms lay out quantized data on one transport. A wire
// segment of m elements is [header][scales][codes]: the header only where the
// transport's traits want one (segment_header.h), then the codec's block
// layout (codec.h). Every part is a multiple of 16 bytes, so the codes of
// every segment in a buffer of back-to-back segments stay 16-byte aligned.
// A collective runs in chunks of the traits' chunk_numel elements
// (chunk_plan.h): the one layout of a call gives the chunk plan of each of
// its transports. The layout also says how a call's quantizes round
// (DESIGN.md, "Stochastic rounding"): for_call keys it by call, at_chunk by
// chunk, and codes() of a quantize names the segments' numbers.
#include <ATen/ATen.h>

#include <vector>

#include "../codec/codec.h"
#include "segment_header.h"
#include "transport_traits.h"

namespace fp8comm {

class WireLayout {
 public:
  WireLayout(const TransportTraits& traits, int block_size, WireFormat format,
             Rounding rounding = Rounding::kNearest)
      : headers_(traits.segment_headers),
        chunk_numel_(traits.chunk_numel),
        block_size_(block_size),
        format_(format),
        rounding_(rounding) {}

  // This layout for one compressed call: stochastic rounding keyed by the
  // group's seed, the call's number among the group's compressed calls and
  // the quantizing rank.
  WireLayout for_call(int64_t seed, uint64_t call, int64_t rank) const;
  // This call's layout for a phase inside a node (inter_node scope) in
  // `format`: random bits of its own, apart from the hop's and from the
  // node's other phase (0: its reduce_scatter, 1: its all_gather).
  WireLayout for_node_phase(WireFormat format, int phase) const;
  // This layout for the chunk whose first element is `begin` in its plan.
  WireLayout at_chunk(int64_t begin) const;
  Rounding rounding() const { return rounding_; }

  int block_size() const { return block_size_; }
  // Elements of one chunk of a collective, all ranks' segments together.
  int64_t chunk_numel() const { return chunk_numel_; }
  WireFormat format() const { return format_; }
  int64_t header_bytes() const { return headers_ ? int64_t{sizeof(SegmentHeader)} : 0; }
  // S: the bytes of one wire segment of m elements.
  int64_t segment_bytes(int64_t m) const { return header_bytes() + fp8comm::segment_bytes(m, block_size_, format_); }
  // Elements per segment when n elements are cut into `parts` segments of whole blocks.
  int64_t segment_numel(int64_t n, int64_t parts) const {
    return ceil_div(ceil_div(n, parts), block_size_) * block_size_;
  }

  // The codec's view of `count` segments of m elements at the start of
  // `bytes`; a quantize into them rounds with their numbers in the chunk,
  // first_segment on (so no two segments of a call on a rank share bits).
  BlockCodes codes(const at::Tensor& bytes, int64_t count, int64_t m, int64_t first_segment = 0) const;

  // Writes the header of `count` segments of m elements at the start of
  // `bytes`: they carry `phase` of a collective of size n. No-op without headers.
  void write_headers(const at::Tensor& bytes, int64_t count, int64_t m, const Phase& phase, int64_t n) const;
  // Checks those headers; segment i came from rank senders[i] (negative: not
  // checked). Raises an error naming `op` and the sender on a mismatch.
  void check_headers(const at::Tensor& bytes, const std::vector<int64_t>& senders, int64_t m, const Phase& phase,
                     int64_t n, const char* op) const;

 private:
  bool headers_;
  int64_t chunk_numel_;
  int block_size_;
  WireFormat format_;
  Rounding rounding_;
  uint64_t rounding_key_ = 0;
};

}  // namespace fp8comm
