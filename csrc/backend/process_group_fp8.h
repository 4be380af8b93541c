#pragma once
// ProcessGroupFp8: a c10d::Backend that compresses float all-reduce,
// reduce-scatter, all-gather and (where named) all-to-all and reduce to FP8 blocks and forwards everything else,
// untouched, to an inner transport backend — torch's ProcessGroupNCCL for CUDA
// tensors ("fp8nccl"), ProcessGroupGloo for CPU tensors ("fp8gloo").
//
// Per call it checks the arguments, decides from the collectives table
// (collectives.h) and the options whether to compress, and runs either the
// compressed algorithm (csrc/algorithms/) or the inner backend's own call.
//
// One object may hold one transport per device type: with
// "cpu:fp8gloo,cuda:fp8nccl" torch gives both devices the same CUSTOM backend
// object, so this class dispatches on the tensors' device.
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "../algorithms/route.h"
#include "../algorithms/transport.h"
#include "../algorithms/wire_layout.h"
#include "../algorithms/workspace.h"
#include "collectives.h"
#include "options.h"
#include "passthrough.h"
#include "stats.h"
#include "uncompressed_blocks.h"

namespace fp8comm {

class ProcessGroupFp8 : public c10d::Backend {
 public:
  // `options`: resolved (Options::resolved); `store`: the group's, for the
  // collective switches of uncompressed blocks (without one they are refused).
  ProcessGroupFp8(int rank, int size, c10::intrusive_ptr<fp8comm::Options> options,
                  c10::intrusive_ptr<c10d::Store> store = {});

  // Adds the transport for tensors of `device_type`; one per device type.
  void add_transport(c10::DeviceType device_type, c10::intrusive_ptr<c10d::Backend> inner);
  bool has_transport(c10::DeviceType device_type) const;
  c10::intrusive_ptr<c10d::Backend> transport(c10::DeviceType device_type) const;
  // What the algorithms know of that transport, and how they lay out FP8 data on it.
  TransportTraits traits_for(c10::DeviceType device_type) const;
  WireLayout wire_layout(c10::DeviceType device_type) const;

  // Where the group's ranks live (fp8comm/topology.py): `ranks_on_my_node`
  // of them on this rank's node; with `group_ranks` (node b, local index l
  // at b * local_size + l) when every node holds local_size of them.
  void set_topology(int64_t nodes, int64_t ranks_on_my_node, int64_t local_size, std::vector<int64_t> group_ranks);
  // The inter_node scope's inner backends for tensors of `device_type`: among
  // this node's ranks, and among the ranks of every node with this local index.
  void add_node_transports(c10::DeviceType device_type, c10::intrusive_ptr<c10d::Backend> intra,
                           c10::intrusive_ptr<c10d::Backend> inter);
  // Those backends, if the group has them for `device_type`: a compressed
  // call then takes the by-node route.
  struct NodeInner {
    c10::intrusive_ptr<c10d::Backend> intra, inter;
  };
  std::optional<NodeInner> node_inner(c10::DeviceType device_type) const;

  const fp8comm::Options& options() const { return *options_; }
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override { return options_; }
  Stats& stats() { return stats_; }

  // ---- uncompressed blocks (fp8comm.uncompressed, uncompressed_blocks.h):
  // while one is open every call passes through exactly. Both switches are
  // collective and wait for every rank (the store's timeout when none is
  // given); the mode changes between compressed calls, never during one.
  void enter_uncompressed(std::optional<std::chrono::milliseconds> timeout);
  // `together`: false when leaving on an exception, without waiting for the
  // other ranks. The mode is restored even when the wait fails.
  void leave_uncompressed(bool together, std::optional<std::chrono::milliseconds> timeout);
  int uncompressed_depth() const { return uncompressed_.depth(); }

  // Lets go of the inner Works it holds that no one else does (held_works.h).
  ~ProcessGroupFp8() override;

  const std::string getBackendName() const override;
  bool supportsCoalescing() const override;
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  void setTimeout(std::chrono::milliseconds timeout) override;
  void abort() override;
  void shutdown() override;
  void setGroupUid(const std::string& pg_uid) override;
  void eagerConnectSingleDevice(at::Device device) override;
  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks = false) override;

  // ---- subgroups (split.cpp): every transport split, wrapped with the same options
  bool supportsSplitting() const override;
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<c10d::Backend::Options>& opts) override;

  // ---- compressed when the op, dtype and size allow; else exact passthrough (compressible_ops.cpp,
  // all_to_all_ops.cpp, coalesced_ops.cpp)
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts = {}) override;
  // Compressed only where Options.compress names reduce (compress="all" does not).
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts = {}) override;
  // c10d's semantics: split sizes are rows of dim 0 (empty: equal parts).
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts = {}) override;

  // ---- error feedback (fp8comm.functional's residual=): the same calls,
  // keeping in `residual` (float32 or bfloat16, contiguous, the input's
  // numel) what the wire dropped of each input element (residual.h); zeros
  // where the call passes through exactly.
  c10::intrusive_ptr<c10d::Work> allreduce_keeping_residual(at::Tensor& tensor, const c10d::AllreduceOptions& opts,
                                                            const at::Tensor& residual);
  c10::intrusive_ptr<c10d::Work> reduce_scatter_keeping_residual(at::Tensor& output, at::Tensor& input,
                                                                 const c10d::ReduceScatterOptions& opts,
                                                                 const at::Tensor& residual);
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = {}) override;

  // ---- always exact passthrough (exact_ops.cpp)
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = {}) override;

 private:
  // The transport for tensors on `device`, with the group identity synced;
  // `op` names the call in the error when there is none.
  c10::intrusive_ptr<c10d::Backend> inner_for(const at::Device& device, const char* op);
  c10::intrusive_ptr<c10d::Backend> default_inner(const char* op);
  // Every inner backend the group holds, each once: each device type's
  // transport and, in the inter_node scope, its node transports.
  std::vector<c10::intrusive_ptr<c10d::Backend>> all_transports() const;
  // Why `c` on tensors like `t`, `per_rank_numel` elements per rank, passes
  // through (DESIGN.md, "Algorithms", exact passthrough), or
  // Passthrough::kCompressed. `call_rule`: the entry point's verdict on what
  // only it sees (the reduce op, mixed dtypes, unlike outputs), checked after
  // the group's and the tensor's rules. Warns once per op when a call passes
  // through for its size (warn_small).
  Passthrough passthrough(const Collective& c, const at::Tensor& t, int64_t per_rank_numel,
                          Passthrough call_rule = Passthrough::kCompressed) const;
  // The same by every rule but the size; and by the size alone.
  Passthrough passthrough_but_size(const Collective& c, const at::Tensor& t,
                                   Passthrough call_rule = Passthrough::kCompressed) const;
  Passthrough size_rule(const Collective& c, int64_t per_rank_numel) const;
  // The warning a call of `c` that Options.compress names gets, once per
  // op, when it passes through below min_numel (off: FP8COMM_WARN_PASSTHROUGH=0).
  void warn_small(const Collective& c, int64_t per_rank_numel) const;
  // The node of each group rank (Route::node_of); empty where nodes differ in size.
  std::vector<int64_t> node_of_rank() const;

  // Runs `body(Route&)` (a compressed algorithm) inline on the CPU or on
  // the side stream of a CUDA device, one call at a time, and returns its
  // Work, which holds the inner Works of its phases (run_compressed.h).
  template <typename Body>
  c10::intrusive_ptr<c10d::Work> run(const Collective& c, const at::Device& device, bool async_op,
                                     std::chrono::milliseconds timeout, const std::vector<at::Tensor>& user_tensors,
                                     std::vector<at::Tensor> outputs, Body&& body);
  c10::Stream side_stream(const at::Device& device);
  // One call of a collective that has a compressed algorithm, as its entry
  // point describes it once its arguments are checked.
  struct CallSpec {
    at::Tensor like;              // what the dtype and layout rules read; its device is the call's
    int64_t per_rank_numel = 0;   // what the size rule reads (the prepare step's, where the algorithm has one)
    Passthrough rule = Passthrough::kCompressed;  // the entry point's verdict on what only it sees
    Payload payload;              // for stats, as c's row counts it
    bool async_op = false;
    std::chrono::milliseconds timeout;
    std::vector<at::Tensor> user_tensors;  // every tensor the compressed call reads or writes
    std::vector<at::Tensor> outputs;       // what its Work returns
    bool dense_outputs = false;   // the compressed call writes `outputs` as dense tensors: checked before it runs
  };
  // The one generic entry (run_compressed.h): decides (passthrough, after
  // c's prepare step where its algorithm has one, run on every rank under
  // the call lock with `shape()`, the call's sizes), then either passes the
  // call through, exact() returning the inner backend's Work (or none, when
  // it waited), or makes the compressed call, body(algorithm) as in
  // compressed_call; and records it in stats, the bytes of the prepare step
  // included.
  template <typename Exact, typename Body, typename Shape>
  c10::intrusive_ptr<c10d::Work> call(const Collective& c, const CallSpec& spec, Exact&& exact, Body&& body,
                                      Shape&& shape);
  template <typename Exact, typename Body>
  c10::intrusive_ptr<c10d::Work> call(const Collective& c, const CallSpec& spec, Exact&& exact, Body&& body) {
    return call(c, spec, std::forward<Exact>(exact), std::forward<Body>(body), [] { return CompressedArgs{}; });
  }
  // The compressed call: runs (run()) body(algorithm) on the call's Route,
  // where body does the collective's own part (its contiguous buffers, the
  // write-back) and calls algorithm(CompressedArgs) once to run c's
  // compressed algorithm (compressed_algorithms.h); then records it in
  // stats with `payload` (record_compressed) and the bytes it sent,
  // `sent_before` (the prepare step's) included.
  template <typename Body>
  c10::intrusive_ptr<c10d::Work> compressed_call(const Collective& c, const at::Device& device, bool async_op,
                                                 std::chrono::milliseconds timeout,
                                                 const std::vector<at::Tensor>& user_tensors,
                                                 std::vector<at::Tensor> outputs, const Payload& payload, Body&& body,
                                                 const NodeBytes& sent_before = {});

  // A Work for the caller: `work` as the transport for `device_type`
  // returned it, held until no one else holds it (held_works.h), or, where
  // it returned none (a synchronous call, already ordered), a completed one.
  c10::intrusive_ptr<c10d::Work> passed_through(c10::intrusive_ptr<c10d::Work> work, c10::DeviceType device_type,
                                                const Collective& c, std::vector<at::Tensor> outputs) const;
  // Stats: `payload` as the collectives table counts it; a passthrough
  // call passed through for `why`; a compressed call sent `wire` bytes
  // instead of the plain volume, and measured `error` where the options
  // track it. `also`: bytes the call sent besides (a prepare step's).
  void record_passthrough(const Collective& c, Passthrough why, const Payload& payload, const NodeBytes& also = {});
  void record_compressed(const Collective& c, const Payload& payload, const NodeBytes& wire,
                         const QuantizationError& error);
  // Where a compressed call adds its quantization error: `error` with
  // Options.track_error, else nowhere (null).
  QuantizationError* error_if_tracked(QuantizationError& error) const { return *options_->track_error ? &error : nullptr; }

  // Passes a call of an op with no compressed form through: call(inner backend) for `device`, counted in stats.
  template <typename Call>
  c10::intrusive_ptr<c10d::Work> forward(const Collective& c, const at::Device& device, int64_t payload,
                                         std::vector<at::Tensor> outputs, Call&& call);
  // An exact all_reduce of `tensors` by inner(tensors, opts) (the inner
  // allreduce or allreduce_coalesced), with AVG / PREMUL_SUM emulated where
  // `emulate`: the inner Work, or none where it waited.
  template <typename Opts, typename Inner>
  c10::intrusive_ptr<c10d::Work> all_reduce_exact(const Collective& c, std::vector<at::Tensor>& tensors,
                                                  const Opts& opts, bool emulate, Inner&& inner);

  // A coalesced call as one collective per (output, input) pair, each
  // pair(output, input, opts) issued in order on this call's stream with its
  // Work kept (errors name the phase by c's algorithm), so that its errors
  // are this call's.
  template <typename Opts, typename Pair>
  c10::intrusive_ptr<c10d::Work> run_pairs(const Collective& c, std::vector<at::Tensor>& outputs,
                                           std::vector<at::Tensor>& inputs, const Opts& opts,
                                           const std::vector<at::Tensor>& user_tensors, Pair&& pair);

  // The tensor forms, also run per pair by their coalesced forms (named `c`).
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor(const Collective& c, at::Tensor& output, at::Tensor& input,
                                                       const c10d::ReduceScatterOptions& opts,
                                                       const at::Tensor& residual = {});
  c10::intrusive_ptr<c10d::Work> all_gather_into_tensor(const Collective& c, at::Tensor& output, at::Tensor& input,
                                                        const c10d::AllgatherOptions& opts);
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_exact(const Collective& c, at::Tensor& output,
                                                             at::Tensor& input, const c10d::ReduceScatterOptions& opts);
  // Every check of one (output, input) pair that can be made on this rank.
  void check_reduce_scatter_tensor(const Collective& c, const at::Tensor& output, const at::Tensor& input,
                                   const c10d::ReduceScatterOptions& opts);
  void check_all_gather_into_tensor(const Collective& c, const at::Tensor& output, const at::Tensor& input) const;
  // The device_ids a barrier on `inner` (for tensors of `device_type`) passes
  // on: the caller's; for NCCL, where the caller gave none, the group's bound
  // device or else the current device of that type, so that NCCL never
  // guesses one (exact_ops.cpp).
  std::vector<int64_t> barrier_device_ids(const c10d::BarrierOptions& opts, const c10d::Backend& inner,
                                          c10::DeviceType device_type) const;

  const c10::intrusive_ptr<fp8comm::Options> options_;
  Stats stats_;
  // FP8COMM_WARN_PASSTHROUGH, read at creation; the ops warn_small has warned of.
  const bool warn_small_;
  mutable std::mutex warned_mutex_;
  mutable std::set<std::string> warned_small_;
  UncompressedBlocks uncompressed_;
  mutable std::mutex mutex_;
  std::map<c10::DeviceType, c10::intrusive_ptr<c10d::Backend>> inner_;
  std::map<c10::DeviceType, TransportTraits> traits_;
  std::map<c10::DeviceType, NodeInner> node_inner_;
  int64_t nodes_ = 1;
  int64_t ranks_on_my_node_ = 1;
  std::vector<int64_t> node_group_ranks_;
  std::map<c10::DeviceIndex, c10::Stream> side_streams_;
  std::vector<c10::intrusive_ptr<c10d::Backend>> coalescing_;
  // Held by run(): one compressed call at a time (CPU ones also share the workspace).
  std::recursive_mutex call_mutex_;
  // Compressed calls issued so far (under call_mutex_): the same count on
  // every rank, part of stochastic rounding's key.
  uint64_t compressed_calls_ = 0;
  Workspace workspace_;
  // The compressed phases inside a node (node_wire_format), which run while
  // the hop's buffers in workspace_ are in flight.
  Workspace node_workspace_;
  // The last split() and what it made (none: this rank is outside it).
  struct LastSplit {
    c10::weak_intrusive_ptr<c10d::Store> store;
    std::optional<c10::weak_intrusive_ptr<c10d::Backend>> group;
  };
  std::mutex split_mutex_;
  std::optional<LastSplit> last_split_;
};

}  // namespace fp8comm
