#include "segment_header.h"

#include <c10/util/Exception.h>

#include <cstring>
#include <string>

#include "../codec/fp8_dtype_table.h"

namespace fp8comm {
namespace {

// A peer's header byte may hold any value: name it only when it is a format.
std::string wire_format_label(uint8_t v) {
  for (const auto& row : kWireFormatTable) {
    if (static_cast<uint8_t>(row.format) == v) return wire_format_name(row.format);
  }
  return "unknown (" + std::to_string(v) + ")";
}

}  // namespace

void write_headers(uint8_t* base, int64_t count, int64_t stride, const SegmentHeader& h) {
  for (int64_t r = 0; r < count; ++r) std::memcpy(base + r * stride, &h, sizeof(h));
}

void check_headers(const uint8_t* base, int64_t stride, const std::vector<int64_t>& senders, const Phase& phase,
                   const SegmentHeader& expected, const char* op) {
  for (size_t i = 0; i < senders.size(); ++i) {
    const int64_t r = senders[i];
    if (r < 0) continue;
    SegmentHeader got = expected;
    std::memcpy(&got, base + static_cast<int64_t>(i) * stride, sizeof(got));
    if (std::memcmp(&got, &expected, sizeof(got)) == 0) continue;
    TORCH_CHECK(got.magic == SegmentHeader::kMagic && got.phase == expected.phase, "fp8comm ", op, ": rank ", r,
                " sent bytes that are not a piece of ", phase.what,
                ": the ranks did not call the same collective; every rank must issue the same collectives in "
                "the same order (TORCH_DISTRIBUTED_DEBUG=DETAIL names the mismatched call)");
    TORCH_CHECK(false, "fp8comm ", op, ": rank ", r, " called it with ", got.numel, " elements, block_size ",
                got.block_size, " and wire_format ", wire_format_label(got.wire_format), ", but this rank with ", expected.numel,
                ", ", expected.block_size, " and ", wire_format_label(expected.wire_format),
                "; every rank must call a collective with the same sizes and the same fp8comm.Options");
  }
}

}  // namespace fp8comm
