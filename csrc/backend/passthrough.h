#pragma once
// Why a call passes through exactly instead of being compressed: one value
// per rule of DESIGN.md, "Algorithms", exact passthrough, in the order
// ProcessGroupFp8::passthrough checks them (the first that fails is the
// call's reason). Stats count passthrough calls per op by reason
// (get_stats' passthrough_reasons); kCompressed is no reason.
#include <stdint.h>

namespace fp8comm {

enum class Passthrough : uint8_t {
  kCompressed,
  kNoCompressedForm,   // broadcast, gather, scatter, send / recv, barrier, all_gather_coalesced
  kNotInCompress,      // Options.compress does not name the op's algorithm
  kUncompressedBlock,  // fp8comm.uncompressed(group) is open
  kCoalescing,         // a coalescing block is open
  kOneNode,            // the inter_node scope on a group within one node
  kExactScope,         // the calling thread gathers a state dict (exact_scope.h)
  kDtype,              // not float32, bfloat16 or float16
  kNotDense,           // not a strided tensor
  kMixedDtypes,        // all_reduce_coalesced over tensors of several dtypes
  kOutputUnlike,       // all_to_all: outputs of another dtype, device or layout than the input
  kReduceOp,           // MIN, MAX, PRODUCT, bitwise: no compressed form
  kEmpty,              // no elements per rank
  kBelowMinNumel,      // fewer elements per rank than Options.min_numel
};

// The reason as get_stats names it.
constexpr const char* passthrough_name(Passthrough why) {
  switch (why) {
    case Passthrough::kCompressed: return "compressed";
    case Passthrough::kNoCompressedForm: return "no compressed form";
    case Passthrough::kNotInCompress: return "op not in compress";
    case Passthrough::kUncompressedBlock: return "uncompressed block";
    case Passthrough::kCoalescing: return "coalescing";
    case Passthrough::kOneNode: return "inter_node scope: one node";
    case Passthrough::kExactScope: return "exact scope";
    case Passthrough::kDtype: return "dtype";
    case Passthrough::kNotDense: return "not dense";
    case Passthrough::kMixedDtypes: return "mixed dtypes";
    case Passthrough::kOutputUnlike: return "output unlike input";
    case Passthrough::kReduceOp: return "reduce op";
    case Passthrough::kEmpty: return "empty";
    case Passthrough::kBelowMinNumel: return "below min_numel";
  }
  return "unknown";
}

}  // namespace fp8comm
