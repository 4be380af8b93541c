#pragma once
// The fp8ncclsim transport (tests only; DESIGN.md, "Testing strategy"):
// torch's ProcessGroupGloo made to behave as ProcessGroupNCCL does wherever a
// backend that wraps it can tell, so that CI runs fp8nccl's exact algorithm
// path on CPU processes. fp8comm._testing registers the "fp8ncclsim" backend:
// ProcessGroupFp8 over this transport, its node transports included.
//
// - getBackendName() is "nccl", so TransportTraits::of gives it NCCL's
//   traits (transport_traits.h): no segment headers, all_gather as one
//   in-place _allgather_base, the exact phases inside a node as its own
//   reduce_scatter and all_gather, AVG and PREMUL_SUM handed to it, and
//   NCCL's chunk of 16M elements.
// - AVG and PREMUL_SUM, which gloo lacks, it reduces for all_reduce,
//   all_reduce_coalesced, reduce and the three reduce_scatter forms with the
//   backend's own emulation (emulated_reduce.h): an exact SUM over gloo,
//   waited for, of premultiplied copies, divided for AVG, written into the
//   outputs (for reduce, the root's only) once the SUM is through.
// - A synchronous call (asyncOp false) returns no Work, as ProcessGroupNCCL
//   does: its op is done, or has raised, when it returns.
// - An asynchronous call returns gloo's Work, so wait(), exception(),
//   isSuccess() and the future report a dead peer or a timeout, as WorkNCCL
//   does under TORCH_NCCL_BLOCKING_WAIT. An emulated reduction waits for its
//   SUM inside the call, so it raises there and returns a completed Work.
//   send, recv and recvAnysource always return gloo's Work, as on NCCL.
// - split() splits gloo and wraps the result, as ProcessGroupNCCL::split
//   returns a ProcessGroupNCCL (its options are gloo's).
// - barrier() keeps the device_ids it was given (barrier_device_ids()), so
//   tests can see what fp8nccl hands NCCL; abort() and shutdown() count
//   their calls (aborts(), shutdowns()) before passing them to gloo, so
//   tests can see which transports fp8nccl reaches.
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <atomic>
#include <mutex>

namespace fp8comm {

class NcclSimTransport : public c10d::Backend {
 public:
  explicit NcclSimTransport(c10::intrusive_ptr<c10d::Backend> gloo);

  const std::string getBackendName() const override { return "nccl"; }
  c10::intrusive_ptr<c10d::Backend> inner() const { return gloo_; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts = {}) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts = {}) override;
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

  bool supportsSplitting() const override { return gloo_->supportsSplitting(); }
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<c10d::Backend::Options>& opts) override;
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override { return gloo_->getBackendOptions(); }
  // The device_ids of the last barrier() call.
  std::vector<int64_t> barrier_device_ids() const;

  void setTimeout(std::chrono::milliseconds timeout) override { gloo_->setTimeout(timeout); }
  void abort() override {
    ++aborts_;
    gloo_->abort();
  }
  void shutdown() override {
    ++shutdowns_;
    gloo_->shutdown();
  }
  // How often abort() and shutdown() were called.
  int64_t aborts() const { return aborts_; }
  int64_t shutdowns() const { return shutdowns_; }
  void setGroupUid(const std::string& pg_uid) override;
  void setSequenceNumberForGroup() override { gloo_->setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override { return gloo_->getSequenceNumberForGroup(); }
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks = false) override {
    gloo_->monitoredBarrier(opts, wait_all_ranks);
  }

 private:
  // What ProcessGroupNCCL returns for a call with `async_op`: the Work, or
  // none once the op is through.
  c10::intrusive_ptr<c10d::Work> returned(c10::intrusive_ptr<c10d::Work> work, bool async_op) const;
  // A completed Work for the reductions this class emulates.
  c10::intrusive_ptr<c10d::Work> done(bool async_op, c10d::OpType type, std::vector<at::Tensor> outputs) const;

  c10::intrusive_ptr<c10d::Backend> gloo_;
  mutable std::mutex barrier_mutex_;
  std::vector<int64_t> barrier_device_ids_;
  std::atomic<int64_t> aborts_{0}, shutdowns_{0};
};

}  // namespace fp8comm
