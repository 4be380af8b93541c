#pragma once
// The compressed collectives (DESIGN.md, "Algorithms"), written once over a
// Transport so the logic CI runs on gloo is the logic that runs on NCCL.
// Tensors are contiguous; each algorithm writes its output only once every
// phase is through, so a call that fails leaves it as it was
// (docs/reliability.md). CUDA buffers are allocated inside the algorithm, on
// the stream it runs on; CPU ones come from the Workspace.
//
// The bytes each sends are counted where they are sent, by its transports
// (Transport::bytes_sent; stats: route.h). With `error`
// (Options.track_error) each adds the quantization error of every value this
// rank quantizes (quantization_error.h); null: nothing is measured. With a
// defined `residual` (error feedback: float32 or bfloat16, contiguous, laid
// out like the tensor or the one flat input) all_reduce and reduce_scatter
// write, for every element, what the wire dropped of it (residual.h): 0
// where this rank's part was exact. A call that fails may leave it half
// written.
#include <ATen/ATen.h>

#include <functional>
#include <optional>
#include <vector>

#include "quantization_error.h"
#include "reduction.h"
#include "transport.h"
#include "wire_layout.h"
#include "workspace.h"

namespace fp8comm {

// A caller's own phases run beside all_reduce's or all_gather's, chunk by
// chunk (the inter_node scope's phases inside a node): ready(i) before chunk
// i's elements are first read (all_reduce), done(i) once they hold the
// result. With hooks, each chunk is decoded as soon as its gather is
// through, so the output must be a buffer of the caller's that a failed call
// may leave half written.
struct ChunkHooks {
  std::function<void(size_t chunk)> ready, done;
  // all_gather (required there): where chunk i of rank r's input is
  // decoded, in place of the output.
  std::function<at::Tensor(size_t chunk, int64_t rank)> place;
};

// `tensor` <- the reduction of every rank's `tensor`, bitwise the same on every rank.
void all_reduce(Transport& t, const WireLayout& wire, Workspace& ws, const at::Tensor& tensor, const Reduction& red,
                QuantizationError* error = nullptr, const ChunkHooks* hooks = nullptr,
                const at::Tensor& residual = {});

// `output` <- the reduction of segment `rank` of every rank's input, given as
// one flat tensor of P * k elements or as P tensors of k.
void reduce_scatter(Transport& t, const WireLayout& wire, Workspace& ws, const at::Tensor& output,
                    const std::vector<at::Tensor>& input_segments, const Reduction& red,
                    QuantizationError* error = nullptr, const at::Tensor& residual = {});

// Segment r of the output <- rank r's input (decoded from FP8 on every rank,
// its own included), given as one flat tensor of P * k elements or as P of k.
void all_gather(Transport& t, const WireLayout& wire, Workspace& ws, const std::vector<at::Tensor>& output_segments,
                const at::Tensor& input, QuantizationError* error = nullptr, const ChunkHooks* hooks = nullptr);

// Slice r of `input` (send_numels[r] elements) -> rank r, which writes it
// as slice `rank` of its output; recv_numels[r]: the elements of slice r of
// `output`, from rank r (both in rank order; every rank's checked to agree
// before: all_to_all_splits.h). Each slice for a peer goes in wires[r] (none:
// its exact bytes); this rank's own is copied. The segments carry `phase`
// (null: all_to_all's). Returns the bytes sent to each rank.
std::vector<int64_t> all_to_all(Transport& t, const std::vector<std::optional<WireLayout>>& wires, Workspace& ws,
                                const at::Tensor& output, const at::Tensor& input,
                                const std::vector<int64_t>& send_numels, const std::vector<int64_t>& recv_numels,
                                QuantizationError* error = nullptr, const Phase* phase = nullptr);

// ---- the inter_node scope (by_node.cpp): exact inside each node, compressed between nodes.
// A group of N nodes x L ranks, as one call sees it: the transport among
// this node's L ranks (rank = local index), the one among the N ranks that
// share this rank's local index (rank = node index), and the group rank of
// each (node, local index).
struct NodeTransports {
  Transport intra;
  Transport inter;
  std::vector<int64_t> group_ranks;  // (node b, local index l) at b * L + l
  // The phases inside a node: exact, or compressed in this format with the
  // flat algorithms (Options.node_wire_format).
  std::optional<WireFormat> node_format;
  // Their buffers, apart from the hop's (whose chunks are in flight while
  // they run); set with node_format.
  Workspace* node_workspace = nullptr;

  int64_t rank_at(int64_t node, int64_t local) const { return group_ranks[node * intra.size() + local]; }
};

// The same results, with the same contracts, as all_reduce, reduce_scatter
// and all_gather above.
void all_reduce_by_node(NodeTransports& g, const WireLayout& wire, Workspace& ws, const at::Tensor& tensor,
                        const Reduction& red, QuantizationError* error = nullptr, const at::Tensor& residual = {});
void reduce_scatter_by_node(NodeTransports& g, const WireLayout& wire, Workspace& ws, const at::Tensor& output,
                            const std::vector<at::Tensor>& input_segments, const Reduction& red,
                            QuantizationError* error = nullptr, const at::Tensor& residual = {});
void all_gather_by_node(NodeTransports& g, const WireLayout& wire, Workspace& ws,
                        const std::vector<at::Tensor>& output_segments, const at::Tensor& input,
                        QuantizationError* error = nullptr);

}  // namespace fp8comm
