#pragma once
// The collectives of a ProcessGroupFp8, as one table: each c10d entry point's
// name (as errors and stats name it), its OpType, the compressed algorithm
// that serves it (csrc/algorithms/compressed_algorithms.h; none: always
// exact passthrough), and how many bytes this rank sends for it as a plain
// collective (the standard ring volumes, for stats). A new compressed
// collective is its algorithm file and row in compressed_algorithms.h, rows
// here that point at it, and its entry point, which checks, decides and
// makes one compressed_call.
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <stdint.h>

#include "../common/torch_compat.h"
#include "../algorithms/compressed_algorithms.h"

namespace fp8comm {

// Bytes this rank sends in the plain collective, for `bytes` of payload
// (all_reduce: the tensor; reduce_scatter: the output; all_gather: the input;
// all_to_all: the input less this rank's own slice; send: the tensors) in a
// group of P ranks.
enum class Volume : uint8_t {
  kNotCounted,  // broadcast, reduce, gather, scatter, recv, barrier: rooted or receive-only
  kAllReduce,   // 2 (P - 1) / P x bytes
  kToEachPeer,  // (P - 1) x bytes: the same bytes to each other rank (reduce_scatter, all_gather)
  kSent,        // bytes (all_to_all, send)
};

struct Collective {
  const char* name;
  c10d::OpType type;
  const CompressedAlgorithm* compressed;  // null: always exact passthrough
  Volume volume;

  int64_t plain_bytes_sent(int64_t bytes, int64_t P) const {
    switch (volume) {
      case Volume::kAllReduce: return 2 * (P - 1) * bytes / P;
      case Volume::kToEachPeer: return (P - 1) * bytes;
      case Volume::kSent: return bytes;
      case Volume::kNotCounted: break;
    }
    return 0;
  }
};

namespace collectives {
using c10d::OpType;
// clang-format off
constexpr Collective kAllReduce{"all_reduce", OpType::ALLREDUCE, &compressed::kAllReduce, Volume::kAllReduce};
constexpr Collective kAllReduceCoalesced{"all_reduce_coalesced", OpType::ALLREDUCE_COALESCED, &compressed::kAllReduce, Volume::kAllReduce};
constexpr Collective kReduceScatterTensor{"reduce_scatter_tensor", OpType::_REDUCE_SCATTER_BASE, &compressed::kReduceScatter, Volume::kToEachPeer};
constexpr Collective kReduceScatter{"reduce_scatter", OpType::REDUCE_SCATTER, &compressed::kReduceScatter, Volume::kToEachPeer};
constexpr Collective kReduceScatterTensorCoalesced{"reduce_scatter_tensor_coalesced", compat::reduce_scatter_tensor_coalesced_op(), &compressed::kReduceScatter, Volume::kToEachPeer};
constexpr Collective kAllGatherIntoTensor{"all_gather_into_tensor", OpType::_ALLGATHER_BASE, &compressed::kAllGather, Volume::kToEachPeer};
constexpr Collective kAllGather{"all_gather", OpType::ALLGATHER, &compressed::kAllGather, Volume::kToEachPeer};
constexpr Collective kAllGatherIntoTensorCoalesced{"all_gather_into_tensor_coalesced", OpType::ALLGATHER_COALESCED, &compressed::kAllGather, Volume::kToEachPeer};
constexpr Collective kAllGatherCoalesced{"all_gather_coalesced", OpType::ALLGATHER_COALESCED, nullptr, Volume::kToEachPeer};
constexpr Collective kBroadcast{"broadcast", OpType::BROADCAST, nullptr, Volume::kNotCounted};
constexpr Collective kReduce{"reduce", OpType::REDUCE, nullptr, Volume::kNotCounted};
constexpr Collective kGather{"gather", OpType::GATHER, nullptr, Volume::kNotCounted};
constexpr Collective kScatter{"scatter", OpType::SCATTER, nullptr, Volume::kNotCounted};
constexpr Collective kAllToAllSingle{"all_to_all", OpType::ALLTOALL_BASE, &compressed::kAllToAll, Volume::kSent};
constexpr Collective kAllToAll{"all_to_all", OpType::ALLTOALL, &compressed::kAllToAll, Volume::kSent};
constexpr Collective kSend{"send", OpType::SEND, nullptr, Volume::kSent};
constexpr Collective kRecv{"recv", OpType::RECV, nullptr, Volume::kNotCounted};
constexpr Collective kRecvAnySource{"recv", OpType::RECVANYSOURCE, nullptr, Volume::kNotCounted};
constexpr Collective kBarrier{"barrier", OpType::BARRIER, nullptr, Volume::kNotCounted};
// clang-format on
}  // namespace collectives

}  // namespace fp8comm
