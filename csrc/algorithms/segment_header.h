#pragma once
// The 16 bytes in front of every wire segment where the transport has
// TransportTraits::segment_headers (gloo on the CPU), checked by the receiver
// before it reads a piece. Why, and what catches mismatches elsewhere:
// DESIGN.md, "Decisions" (the segment-header bullet).
#include <c10/core/Device.h>

#include <stdint.h>

#include <vector>

#include "../codec/fp8_block_math.h"

namespace fp8comm {

// What a segment carries: a step of a compressed collective, by the byte its
// header holds and what an error calls it. Each algorithm's phases are its
// row of compressed_algorithms.h.
struct Phase {
  uint8_t wire;
  const char* what;
};

struct SegmentHeader {
  static constexpr uint32_t kMagic = 0x38435046u;  // "FPC8"
  uint32_t magic = kMagic;
  uint8_t phase;        // Phase::wire
  uint8_t wire_format;  // WireFormat
  uint16_t block_size;  // <= 4096
  int64_t numel;        // the collective's size: all_reduce n, reduce_scatter / all_gather per-rank numel, all_to_all the slice's

  SegmentHeader(const Phase& p, WireFormat f, int block, int64_t n)
      : phase(p.wire), wire_format(static_cast<uint8_t>(f)), block_size(static_cast<uint16_t>(block)), numel(n) {}
};
static_assert(sizeof(SegmentHeader) == 16, "the header is 16 bytes on the wire");

// Writes `h` in front of `count` segments, `stride` bytes apart from `base`.
void write_headers(uint8_t* base, int64_t count, int64_t stride, const SegmentHeader& h);

// Checks that segment i (`stride` bytes apart from `base`), sent by rank
// senders[i], carries `expected`, a header of `phase` (a negative sender:
// not checked); raises an error naming `op`, the rank and the mismatch.
void check_headers(const uint8_t* base, int64_t stride, const std::vector<int64_t>& senders, const Phase& phase,
                   const SegmentHeader& expected, const char* op);

}  // namespace fp8comm
