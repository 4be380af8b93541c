#pragma once
// The one chunk plan of the compressed collectives (DESIGN.md, "Algorithms",
// "Chunks"): all_reduce, reduce_scatter, all_gather and the inter_node
// scope's phases inside a node all cut a call into the chunks this plan
// gives, so every rank issues the same phases in the same order, and the
// buffers of a call hold its chunks back to back.
//
// A chunk is about wire.chunk_numel() elements in all, set by the
// transport's traits (transport_traits.h): the codec works on one chunk
// while another travels, and several messages in flight let gloo use both
// directions of a link, which one large message does not.
#include <cstdint>
#include <vector>

#include "transport.h"
#include "wire_layout.h"

namespace fp8comm {

// What the plan cuts. kTensor: all_reduce's whole tensor; each chunk is cut
// into P wire segments of whole blocks, segment r owned by rank r.
// kEachRank: every rank's k-element segment of a reduce_scatter or
// all_gather; each chunk is one wire segment per rank.
enum class ChunkOf { kTensor, kEachRank };

// One chunk: elements [begin, begin + numel) of what the plan cuts, m
// elements and S bytes per wire segment, and where its bytes start in the
// call's buffers: the exchange buffers (P - 1 segments a chunk), the
// gathered buffer (P segments) and the gather's scratch
// (Transport::gather_scratch_bytes).
struct Chunk {
  int64_t begin, numel, m, S;
  int64_t exchanged_at, gathered_at, scratch_at;
};

// The chunks in the order every phase takes them (at least one: an empty
// one for no elements), and the bytes each of the call's buffers needs.
struct ChunkPlan {
  std::vector<Chunk> chunks;
  int64_t exchanged_bytes = 0, gathered_bytes = 0, scratch_bytes = 0;
};

// The plan of a collective over `numel` elements (the tensor's, or each
// rank's segment's: `of`) among the P ranks of `t`, on `wire`.
ChunkPlan chunk_plan(const Transport& t, const WireLayout& wire, ChunkOf of, int64_t numel);

}  // namespace fp8comm
