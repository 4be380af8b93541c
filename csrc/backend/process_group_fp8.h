#pragma once
// ProcessGroupFP8: a c10d::Backend that compresses float all-reduce,
// reduce-scatter and all-gather to FP8 blocks and forwards everything else,
// untouched, to an inner transport backend — torch's ProcessGroupNCCL for CUDA
// tensors ("fp8nccl"), ProcessGroupGloo for CPU tensors ("fp8gloo").
//
// One object may hold one transport per device type: with
// "cpu:fp8gloo,cuda:fp8nccl" torch gives both devices the same CUSTOM backend
// object, so this class dispatches on the tensors' device.
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <map>
#include <mutex>
#include <optional>

#include "../codec/codec.h"
#include "options.h"
#include "stats.h"
#include "transport_traits.h"
#include "workspace.h"

namespace fp8comm {

class ProcessGroupFP8 : public c10d::Backend {
 public:
  ProcessGroupFP8(int rank, int size, FP8Options options);

  // Adds the transport for tensors of `device_type`; one per device type.
  void addTransport(c10::DeviceType device_type, c10::intrusive_ptr<c10d::Backend> inner);
  bool hasTransport(c10::DeviceType device_type) const;
  c10::intrusive_ptr<c10d::Backend> transport(c10::DeviceType device_type) const;
  // What the algorithms know of that transport (transport_traits.h).
  TransportTraits traitsFor(c10::DeviceType device_type) const;
  // Bytes one wire segment of m elements takes over that transport.
  int64_t wireSegmentBytes(c10::DeviceType device_type, int64_t m) const;

  const FP8Options& options() const { return options_; }
  Stats& stats() { return stats_; }

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

  // ---- compressed when the op, dtype and size allow; else exact passthrough
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts = {}) override;
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
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = {}) override;

  // ---- always exact passthrough
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = {}) override;

 private:
  struct Reduction;  // how SUM / AVG / PREMUL_SUM map onto the codec
  class Transport;   // the inner backend as the algorithms use it

  // The transport for tensors on `device`, with the group identity synced.
  c10::intrusive_ptr<c10d::Backend> innerFor(const at::Device& device, const char* op);
  c10::intrusive_ptr<c10d::Backend> defaultInner(const char* op);
  // Whether a collective on `per_rank_numel` elements of `t`'s dtype is compressed.
  bool compressible(const at::Tensor& t, int64_t per_rank_numel, bool op_enabled) const;
  std::optional<Reduction> reductionFor(const c10d::ReduceOp& op, const at::Tensor& t) const;
  // `tensors` plus the PREMUL_SUM factor tensors a compressed call reads on
  // its stream, so that run() keeps them alive and in use until it is done.
  static std::vector<at::Tensor> withFactor(std::vector<at::Tensor> tensors, const c10d::ReduceOp& op,
                                            const std::optional<Reduction>& red);

  // Runs `body(Transport&)` (the compressed algorithm) inline on the CPU or
  // on the side stream of a CUDA device, one call at a time, and returns its
  // Work, which holds the inner Works of its phases.
  template <typename Body>
  c10::intrusive_ptr<c10d::Work> run(c10d::OpType op_type, const char* op, const at::Device& device, bool async_op,
                                     std::chrono::milliseconds timeout, const std::vector<at::Tensor>& user_tensors,
                                     std::vector<at::Tensor> outputs, Body&& body);
  c10::Stream sideStream(const at::Device& device);

  // The compressed algorithms (DESIGN.md, "Algorithms"); tensors contiguous.
  // `op` names the entry point in errors.
  void allreduceCompressed(Transport& t, const at::Tensor& tensor, const Reduction& red, const char* op);
  void allreducePair(Transport& t, const at::Tensor& tensor, const Reduction& red, const char* op);
  bool allreduceByPair(const at::Tensor& like) const;
  void reduceScatterCompressed(Transport& t, const at::Tensor& output,
                               const std::vector<at::Tensor>& input_segments, const Reduction& red,
                               const char* op);
  void allgatherCompressed(Transport& t, const std::vector<at::Tensor>& output_segments,
                           const at::Tensor& input, const char* op);
  std::vector<int64_t> gatheredFrom(const Transport& t) const;
  template <typename Out>
  void decodeGathered(const Transport& t, const at::Tensor& all, int64_t m, int64_t S, int64_t max_run,
                      int64_t output_bytes, Out&& out) const;
  // What the algorithms send: a wire segment of m elements on `device`, the
  // chunks of an all_reduce, and the bytes this rank sends for one (stats).
  struct Chunk;
  // (`like`: the tensor's device and dtype)
  std::vector<Chunk> allreduceChunks(const at::Tensor& like, int64_t numel) const;
  int64_t allreduceWireBytes(const at::Tensor& like, int64_t numel) const;

  // Exact forwarding, emulating AVG / PREMUL_SUM where the transport lacks them.
  c10::intrusive_ptr<c10d::Work> allreducePassthrough(std::vector<at::Tensor>& tensors,
                                                      const c10d::AllreduceOptions& opts);
  c10::intrusive_ptr<c10d::Work> reduceScatterBasePassthrough(at::Tensor& output, at::Tensor& input,
                                                              const c10d::ReduceScatterOptions& opts, const char* op);
  // The tensor forms, counted in stats under `op` (the entry point called).
  c10::intrusive_ptr<c10d::Work> reduceScatterBase(at::Tensor& output, at::Tensor& input,
                                                   const c10d::ReduceScatterOptions& opts, const char* op);
  c10::intrusive_ptr<c10d::Work> allgatherBase(at::Tensor& output, at::Tensor& input,
                                               const c10d::AllgatherOptions& opts, const char* op);
  // Every check of one (output, input) pair that can be made on this rank.
  void checkReduceScatterBase(const char* op, const at::Tensor& output, const at::Tensor& input,
                              const c10d::ReduceScatterOptions& opts);
  // AVG / PREMUL_SUM of tensors the gloo transport cannot emulate them for: a clear error.
  void checkReduceOpSupported(const char* op, const c10d::ReduceOp& reduce_op, const at::Tensor& t) const;
  void checkAllgatherBase(const char* op, const at::Tensor& output, const at::Tensor& input) const;
  bool transportLacksAvgAndPremul(const at::Device& device) const;

  c10::intrusive_ptr<c10d::Work> passed(c10::intrusive_ptr<c10d::Work> work, c10d::OpType type, const char* op,
                                        std::vector<at::Tensor> outputs) const;
  BlockCodes wire(const Transport& t, const at::Tensor& bytes, int64_t num_segments, int64_t segment_numel) const;
  void record(const char* op, bool compressed, int64_t bytes_sent, int64_t bytes_uncompressed);

  const FP8Options options_;
  Stats stats_;
  mutable std::mutex mutex_;
  std::map<c10::DeviceType, c10::intrusive_ptr<c10d::Backend>> inner_;
  std::map<c10::DeviceType, TransportTraits> traits_;
  std::map<c10::DeviceIndex, c10::Stream> side_streams_;
  std::vector<c10::intrusive_ptr<c10d::Backend>> coalescing_;
  // Held by run(): one compressed call at a time (CPU ones also share the workspace).
  std::recursive_mutex call_mutex_;
  Workspace workspace_;
};

}  // namespace fp8comm
