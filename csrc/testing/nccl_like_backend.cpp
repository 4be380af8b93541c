#include "nccl_like_backend.h"

#include "../backend/fp8_work.h"
#include "../algorithms/premul.h"
#include "../common/torch_compat.h"

namespace fp8comm {
namespace {

bool avg_or_premul(const c10d::ReduceOp& op) {
  return op.op_ == c10d::ReduceOp::AVG || op.op_ == c10d::ReduceOp::PREMUL_SUM;
}

template <typename Opts>
Opts as_sum(const Opts& opts) {
  Opts sum = opts;
  sum.reduceOp = c10d::ReduceOp::SUM;
  sum.asyncOp = true;
  return sum;
}

std::vector<at::Tensor> empty_like_all(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  for (const auto& t : ts) out.push_back(at::empty_like(t, at::MemoryFormat::Contiguous));
  return out;
}

void wait_for(const c10::intrusive_ptr<c10d::Work>& work) {
  if (work) work->wait();
}

}  // namespace

NcclLikeBackend::NcclLikeBackend(c10::intrusive_ptr<c10d::Backend> gloo)
    : c10d::Backend(gloo->getRank(), gloo->getSize()), gloo_(std::move(gloo)) {
  TORCH_CHECK(gloo_->getBackendName() == "gloo", "fp8comm.testing: the NCCL-like transport wraps gloo, got ",
              gloo_->getBackendName());
}

void NcclLikeBackend::setGroupUid(const std::string& pg_uid) {
  c10d::Backend::setGroupUid(pg_uid);
  gloo_->setGroupUid(pg_uid);
}

c10::intrusive_ptr<c10d::Work> NcclLikeBackend::returned(c10::intrusive_ptr<c10d::Work> work, bool async_op) const {
  if (async_op) return work;
  wait_for(work);
  return {};
}

c10::intrusive_ptr<c10d::Work> NcclLikeBackend::done(bool async_op, c10d::OpType type,
                                                     std::vector<at::Tensor> outputs) const {
  if (!async_op) return {};
  return c10::make_intrusive<Fp8Work>(rank_, type, "nccl-like transport", std::move(outputs));
}

std::vector<at::Tensor> NcclLikeBackend::sumInputs(const char* op, const std::vector<at::Tensor>& inputs,
                                                   const c10d::ReduceOp& reduce_op) {
  std::vector<at::Tensor> out;
  for (const auto& t : inputs) {
    out.push_back(reduce_op.op_ == c10d::ReduceOp::PREMUL_SUM ? premultiplied(op, t, reduce_op).contiguous()
                                                              : t.clone(at::MemoryFormat::Contiguous));
  }
  return out;
}

void NcclLikeBackend::writeResults(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& sums,
                                   const c10d::ReduceOp& reduce_op) const {
  for (size_t i = 0; i < outputs.size(); ++i) {
    at::Tensor r = reduce_op.op_ == c10d::ReduceOp::AVG ? sums[i].div(size_) : sums[i];
    outputs[i].copy_(r.view(outputs[i].sizes()));
  }
}

// ---------------------------------------------------------------- reductions
c10::intrusive_ptr<c10d::Work> NcclLikeBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  if (!avg_or_premul(opts.reduceOp)) return returned(gloo_->allreduce(tensors, opts), opts.asyncOp);
  auto sums = sumInputs("all_reduce", tensors, opts.reduceOp);
  wait_for(gloo_->allreduce(sums, as_sum(opts)));
  writeResults(tensors, sums, opts.reduceOp);
  return done(opts.asyncOp, c10d::OpType::ALLREDUCE, tensors);
}

c10::intrusive_ptr<c10d::Work> NcclLikeBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                    const c10d::AllreduceCoalescedOptions& opts) {
  if (!avg_or_premul(opts.reduceOp)) return returned(gloo_->allreduce_coalesced(tensors, opts), opts.asyncOp);
  auto sums = sumInputs("all_reduce_coalesced", tensors, opts.reduceOp);
  wait_for(gloo_->allreduce_coalesced(sums, as_sum(opts)));
  writeResults(tensors, sums, opts.reduceOp);
  return done(opts.asyncOp, c10d::OpType::ALLREDUCE_COALESCED, tensors);
}

c10::intrusive_ptr<c10d::Work> NcclLikeBackend::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& opts) {
  if (!avg_or_premul(opts.reduceOp)) return returned(gloo_->reduce(tensors, opts), opts.asyncOp);
  auto sums = sumInputs("reduce", tensors, opts.reduceOp);
  wait_for(gloo_->reduce(sums, as_sum(opts)));
  if (rank_ == opts.rootRank) writeResults(tensors, sums, opts.reduceOp);
  return done(opts.asyncOp, c10d::OpType::REDUCE, tensors);
}

c10::intrusive_ptr<c10d::Work> NcclLikeBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                     const c10d::ReduceScatterOptions& opts) {
  if (!avg_or_premul(opts.reduceOp)) return returned(gloo_->_reduce_scatter_base(output, input, opts), opts.asyncOp);
  at::Tensor in = sumInputs("reduce_scatter_tensor", {input}, opts.reduceOp)[0];
  at::Tensor sum = at::empty_like(output, at::MemoryFormat::Contiguous);
  wait_for(gloo_->_reduce_scatter_base(sum, in, as_sum(opts)));
  writeResults({output}, {sum}, opts.reduceOp);
  return done(opts.asyncOp, c10d::OpType::_REDUCE_SCATTER_BASE, {output});
}

c10::intrusive_ptr<c10d::Work> NcclLikeBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                               std::vector<std::vector<at::Tensor>>& inputs,
                                                               const c10d::ReduceScatterOptions& opts) {
  if (!avg_or_premul(opts.reduceOp)) return returned(gloo_->reduce_scatter(outputs, inputs, opts), opts.asyncOp);
  TORCH_CHECK(outputs.size() == 1 && inputs.size() == 1, "fp8comm.testing: reduce_scatter takes one output");
  // One flat input, as fp8gloo's own emulation sums it (the same order of additions).
  std::vector<at::Tensor> flat;
  for (const auto& t : sumInputs("reduce_scatter", inputs[0], opts.reduceOp)) flat.push_back(t.reshape({-1}));
  at::Tensor in = at::cat(flat);
  std::vector<at::Tensor> sums = empty_like_all(outputs);
  wait_for(gloo_->_reduce_scatter_base(sums[0], in, as_sum(opts)));
  writeResults(outputs, sums, opts.reduceOp);
  return done(opts.asyncOp, c10d::OpType::REDUCE_SCATTER, outputs);
}

c10::intrusive_ptr<c10d::Work> NcclLikeBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  if (!avg_or_premul(opts.reduceOp)) {
    return returned(gloo_->reduce_scatter_tensor_coalesced(outputs, inputs, opts), opts.asyncOp);
  }
  auto ins = sumInputs("reduce_scatter_tensor_coalesced", inputs, opts.reduceOp);
  std::vector<at::Tensor> sums = empty_like_all(outputs);
  wait_for(gloo_->reduce_scatter_tensor_coalesced(sums, ins, as_sum(opts)));
  writeResults(outputs, sums, opts.reduceOp);
  return done(opts.asyncOp, compat::reduce_scatter_tensor_coalesced_op(), outputs);
}

// ---------------------------------------------------------------- the rest: gloo's, NCCL's return contract
c10::intrusive_ptr<c10d::Work> NcclLikeBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  return returned(gloo_->broadcast(tensors, opts), opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> NcclLikeBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllgatherOptions& opts) {
  return returned(gloo_->allgather(outputs, inputs, opts), opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> NcclLikeBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                const c10d::AllgatherOptions& opts) {
  return returned(gloo_->_allgather_base(output, input, opts), opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> NcclLikeBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                    std::vector<at::Tensor>& inputs,
                                                                    const c10d::AllgatherOptions& opts) {
  return returned(gloo_->allgather_coalesced(outputs, inputs, opts), opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> NcclLikeBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                std::vector<at::Tensor>& inputs,
                                                                                const c10d::AllgatherOptions& opts) {
  return returned(gloo_->allgather_into_tensor_coalesced(outputs, inputs, opts), opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> NcclLikeBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::GatherOptions& opts) {
  return returned(gloo_->gather(outputs, inputs, opts), opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> NcclLikeBackend::scatter(std::vector<at::Tensor>& outputs,
                                                        std::vector<std::vector<at::Tensor>>& inputs,
                                                        const c10d::ScatterOptions& opts) {
  return returned(gloo_->scatter(outputs, inputs, opts), opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> NcclLikeBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                              std::vector<int64_t>& output_split_sizes,
                                                              std::vector<int64_t>& input_split_sizes,
                                                              const c10d::AllToAllOptions& opts) {
  return returned(gloo_->alltoall_base(output, input, output_split_sizes, input_split_sizes, opts), opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> NcclLikeBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions& opts) {
  return returned(gloo_->alltoall(outputs, inputs, opts), opts.asyncOp);
}

// Point-to-point calls return their Work on NCCL too.
c10::intrusive_ptr<c10d::Work> NcclLikeBackend::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  return gloo_->send(tensors, dst_rank, tag);
}

c10::intrusive_ptr<c10d::Work> NcclLikeBackend::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  return gloo_->recv(tensors, src_rank, tag);
}

c10::intrusive_ptr<c10d::Work> NcclLikeBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return gloo_->recvAnysource(tensors, tag);
}

c10::intrusive_ptr<c10d::Work> NcclLikeBackend::barrier(const c10d::BarrierOptions& opts) {
  {
    std::lock_guard<std::mutex> lock(barrier_mutex_);
    barrier_device_ids_ = opts.device_ids;
  }
  return returned(gloo_->barrier(opts), opts.asyncOp);
}

std::vector<int64_t> NcclLikeBackend::barrier_device_ids() const {
  std::lock_guard<std::mutex> lock(barrier_mutex_);
  return barrier_device_ids_;
}

c10::intrusive_ptr<c10d::Backend> NcclLikeBackend::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                         const std::vector<int>& ranks,
                                                         const c10::intrusive_ptr<c10d::Backend::Options>& opts) {
  auto gloo = gloo_->split(store, ranks, opts);
  if (!gloo) return {};
  return c10::make_intrusive<NcclLikeBackend>(gloo);
}

}  // namespace fp8comm
