#pragma once
// The collectives of a ProcessGroupFp8, as one table: each c10d entry point's
// name (as errors and stats name it), its OpType, the compressed algorithm
// that serves it (csrc/algorithms/compressed_algorithms.h; none: always
// exact passthrough), and how many bytes this rank sends for it as a plain
// collective (nccl-tests' bus volumes, for stats; DESIGN.md, "Stats"), split
// by node as Route::split splits them. A new compressed collective is its
// algorithm file and row in compressed_algorithms.h, rows here that point at
// it, and its entry point, which checks its arguments and hands
// ProcessGroupFp8::call its exact and compressed forms.
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <stdint.h>

#include "../common/torch_compat.h"
#include "../algorithms/compressed_algorithms.h"
#include "../algorithms/route.h"

namespace fp8comm {

// Bytes this rank sends in the plain collective, for `bytes` of payload
// (all_reduce, broadcast, reduce: the tensor; reduce_scatter, scatter: the
// output; all_gather, gather: the input; all_to_all: the input, of which
// `own` bytes, this rank's own slice, stay here; send: the tensors) in a
// group of P ranks: nccl-tests' bus volume (its busBw x time), the same on
// every rank, roots included. A group of one rank sends nothing.
enum class Volume : uint8_t {
  kNone,        // recv (its sender counts the bytes), barrier (no payload)
  kAllReduce,   // 2 (P - 1) / P x bytes
  kToEachPeer,  // (P - 1) x bytes: reduce_scatter, all_gather, gather, scatter
  kSent,        // bytes: send, broadcast, reduce
  kToPeers,     // bytes - own: all_to_all
};

// A call's payload as its row's volume reads it: its bytes and, for
// all_to_all, those of this rank's own slice, which stay here.
struct Payload {
  int64_t bytes = 0;
  int64_t own = 0;
  Payload(int64_t bytes_ = 0, int64_t own_ = 0) : bytes(bytes_), own(own_) {}  // NOLINT: a plain count is a payload
};

struct Collective {
  const char* name;
  c10d::OpType type;
  const CompressedAlgorithm* compressed;  // null: always exact passthrough
  Volume volume;

  int64_t plain_bytes_sent(const Payload& payload, int64_t P) const {
    if (P <= 1) return 0;
    const int64_t bytes = payload.bytes;
    switch (volume) {
      case Volume::kAllReduce: return 2 * (P - 1) * bytes / P;
      case Volume::kToEachPeer: return (P - 1) * bytes;
      case Volume::kSent: return bytes;
      case Volume::kToPeers: return bytes - payload.own;
      case Volume::kNone: break;
    }
    return 0;
  }
  // Those bytes by node: the inner backend's ring spreads them evenly over
  // the peers, ranks_on_my_node - 1 of which are on this rank's node.
  NodeBytes plain_node_bytes(const Payload& payload, int64_t P, int64_t ranks_on_my_node) const {
    return Route::split_evenly(plain_bytes_sent(payload, P), P, ranks_on_my_node);
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
constexpr Collective kBroadcast{"broadcast", OpType::BROADCAST, nullptr, Volume::kSent};
constexpr Collective kReduce{"reduce", OpType::REDUCE, &compressed::kReduce, Volume::kSent};
constexpr Collective kGather{"gather", OpType::GATHER, nullptr, Volume::kToEachPeer};
constexpr Collective kScatter{"scatter", OpType::SCATTER, nullptr, Volume::kToEachPeer};
constexpr Collective kAllToAllSingle{"all_to_all", OpType::ALLTOALL_BASE, &compressed::kAllToAll, Volume::kToPeers};
constexpr Collective kAllToAll{"all_to_all", OpType::ALLTOALL, &compressed::kAllToAll, Volume::kToPeers};
constexpr Collective kSend{"send", OpType::SEND, nullptr, Volume::kSent};
constexpr Collective kRecv{"recv", OpType::RECV, nullptr, Volume::kNone};
constexpr Collective kRecvAnySource{"recv", OpType::RECVANYSOURCE, nullptr, Volume::kNone};
constexpr Collective kBarrier{"barrier", OpType::BARRIER, nullptr, Volume::kNone};
// clang-format on
}  // namespace collectives

}  // namespace fp8comm
