#include "ncclsim_transport.h"

#include "../backend/emulated_reduce.h"
#include "../backend/fp8_work.h"
#include "../backend/held_works.h"
#include "../backend/wait_for.h"
#include "../common/torch_compat.h"

namespace fp8comm {
namespace {

// The options of the exact SUM an emulated reduction runs over gloo.
template <typename Opts>
Opts as_sum(const Opts& opts) {
  Opts sum = opts;
  sum.reduceOp = c10d::ReduceOp::SUM;
  sum.asyncOp = true;
  return sum;
}

// gloo's Work, held until no one else holds it (held_works.h): this
// transport waits for some of them itself and lets go of them.
const c10::intrusive_ptr<c10d::Work>& held(const c10::intrusive_ptr<c10d::Work>& work) {
  return hold_inner_work(work, c10::DeviceType::CPU);
}

}  // namespace

NcclSimTransport::NcclSimTransport(c10::intrusive_ptr<c10d::Backend> gloo)
    : c10d::Backend(gloo->getRank(), gloo->getSize()), gloo_(std::move(gloo)) {
  TORCH_CHECK(gloo_->getBackendName() == "gloo", "fp8comm: the fp8ncclsim transport wraps gloo, got ",
              gloo_->getBackendName());
}

void NcclSimTransport::setGroupUid(const std::string& pg_uid) {
  c10d::Backend::setGroupUid(pg_uid);
  gloo_->setGroupUid(pg_uid);
}

c10::intrusive_ptr<c10d::Work> NcclSimTransport::returned(c10::intrusive_ptr<c10d::Work> work, bool async_op) const {
  if (async_op) return work;
  wait_for(held(work));
  return {};
}

c10::intrusive_ptr<c10d::Work> NcclSimTransport::done(bool async_op, c10d::OpType type,
                                                      std::vector<at::Tensor> outputs) const {
  if (!async_op) return {};
  return c10::make_intrusive<Fp8Work>(rank_, type, "fp8ncclsim transport", std::move(outputs));
}

// ---------------------------------------------------------------- reductions
// AVG and PREMUL_SUM: emulate_reduce around gloo's SUM, as ProcessGroupFp8
// emulates them over gloo (compressible_ops.cpp); any other op: gloo's.
c10::intrusive_ptr<c10d::Work> NcclSimTransport::allreduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::AllreduceOptions& opts) {
  if (!is_avg_or_premul(opts.reduceOp)) return returned(gloo_->allreduce(tensors, opts), opts.asyncOp);
  emulate_reduce("all_reduce", opts.reduceOp, size_, tensors, tensors, /*in_place=*/true,
                 [&](std::vector<at::Tensor>& copies, std::vector<at::Tensor>&) {
                   wait_for(held(gloo_->allreduce(copies, as_sum(opts))));
                 });
  return done(opts.asyncOp, c10d::OpType::ALLREDUCE, tensors);
}

c10::intrusive_ptr<c10d::Work> NcclSimTransport::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                     const c10d::AllreduceCoalescedOptions& opts) {
  if (!is_avg_or_premul(opts.reduceOp)) return returned(gloo_->allreduce_coalesced(tensors, opts), opts.asyncOp);
  emulate_reduce("all_reduce_coalesced", opts.reduceOp, size_, tensors, tensors, /*in_place=*/true,
                 [&](std::vector<at::Tensor>& copies, std::vector<at::Tensor>&) {
                   wait_for(held(gloo_->allreduce_coalesced(copies, as_sum(opts))));
                 });
  return done(opts.asyncOp, c10d::OpType::ALLREDUCE_COALESCED, tensors);
}

// Only the root's tensors are written, as NCCL's reduce leaves the others.
c10::intrusive_ptr<c10d::Work> NcclSimTransport::reduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::ReduceOptions& opts) {
  if (!is_avg_or_premul(opts.reduceOp)) return returned(gloo_->reduce(tensors, opts), opts.asyncOp);
  const std::vector<at::Tensor> written = rank_ == opts.rootRank ? tensors : std::vector<at::Tensor>{};
  emulate_reduce("reduce", opts.reduceOp, size_, tensors, written, /*in_place=*/true,
                 [&](std::vector<at::Tensor>& copies, std::vector<at::Tensor>&) {
                   wait_for(held(gloo_->reduce(copies, as_sum(opts))));
                 });
  return done(opts.asyncOp, c10d::OpType::REDUCE, tensors);
}

c10::intrusive_ptr<c10d::Work> NcclSimTransport::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                      const c10d::ReduceScatterOptions& opts) {
  if (!is_avg_or_premul(opts.reduceOp)) return returned(gloo_->_reduce_scatter_base(output, input, opts), opts.asyncOp);
  emulate_reduce("reduce_scatter_tensor", opts.reduceOp, size_, {input}, {output}, /*in_place=*/false,
                 [&](std::vector<at::Tensor>& ins, std::vector<at::Tensor>& results) {
                   wait_for(held(gloo_->_reduce_scatter_base(results[0], ins[0], as_sum(opts))));
                 });
  return done(opts.asyncOp, c10d::OpType::_REDUCE_SCATTER_BASE, {output});
}

// One flat input, as ProcessGroupFp8 emulates the list form over gloo (the
// same additions in the same order).
c10::intrusive_ptr<c10d::Work> NcclSimTransport::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                                const c10d::ReduceScatterOptions& opts) {
  if (!is_avg_or_premul(opts.reduceOp)) return returned(gloo_->reduce_scatter(outputs, inputs, opts), opts.asyncOp);
  TORCH_CHECK(outputs.size() == 1 && inputs.size() == 1,
              "fp8comm: the fp8ncclsim transport's reduce_scatter takes one output");
  std::vector<at::Tensor> flat_inputs;
  for (const auto& in : inputs[0]) flat_inputs.push_back(in.reshape({-1}));
  emulate_reduce("reduce_scatter", opts.reduceOp, size_, {at::cat(flat_inputs)}, outputs, /*in_place=*/false,
                 [&](std::vector<at::Tensor>& ins, std::vector<at::Tensor>& results) {
                   wait_for(held(gloo_->_reduce_scatter_base(results[0], ins[0], as_sum(opts))));
                 });
  return done(opts.asyncOp, c10d::OpType::REDUCE_SCATTER, outputs);
}

c10::intrusive_ptr<c10d::Work> NcclSimTransport::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  if (!is_avg_or_premul(opts.reduceOp)) {
    return returned(gloo_->reduce_scatter_tensor_coalesced(outputs, inputs, opts), opts.asyncOp);
  }
  emulate_reduce("reduce_scatter_tensor_coalesced", opts.reduceOp, size_, inputs, outputs, /*in_place=*/false,
                 [&](std::vector<at::Tensor>& ins, std::vector<at::Tensor>& results) {
                   wait_for(held(gloo_->reduce_scatter_tensor_coalesced(results, ins, as_sum(opts))));
                 });
  return done(opts.asyncOp, compat::reduce_scatter_tensor_coalesced_op(), outputs);
}

// ---------------------------------------------------------------- the rest: gloo's, NCCL's return contract
c10::intrusive_ptr<c10d::Work> NcclSimTransport::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  return returned(gloo_->broadcast(tensors, opts), opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> NcclSimTransport::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllgatherOptions& opts) {
  return returned(gloo_->allgather(outputs, inputs, opts), opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> NcclSimTransport::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                const c10d::AllgatherOptions& opts) {
  return returned(gloo_->_allgather_base(output, input, opts), opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> NcclSimTransport::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                    std::vector<at::Tensor>& inputs,
                                                                    const c10d::AllgatherOptions& opts) {
  return returned(gloo_->allgather_coalesced(outputs, inputs, opts), opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> NcclSimTransport::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                std::vector<at::Tensor>& inputs,
                                                                                const c10d::AllgatherOptions& opts) {
  return returned(gloo_->allgather_into_tensor_coalesced(outputs, inputs, opts), opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> NcclSimTransport::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::GatherOptions& opts) {
  return returned(gloo_->gather(outputs, inputs, opts), opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> NcclSimTransport::scatter(std::vector<at::Tensor>& outputs,
                                                        std::vector<std::vector<at::Tensor>>& inputs,
                                                        const c10d::ScatterOptions& opts) {
  return returned(gloo_->scatter(outputs, inputs, opts), opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> NcclSimTransport::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                              std::vector<int64_t>& output_split_sizes,
                                                              std::vector<int64_t>& input_split_sizes,
                                                              const c10d::AllToAllOptions& opts) {
  return returned(gloo_->alltoall_base(output, input, output_split_sizes, input_split_sizes, opts), opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> NcclSimTransport::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions& opts) {
  return returned(gloo_->alltoall(outputs, inputs, opts), opts.asyncOp);
}

// Point-to-point calls return their Work on NCCL too.
c10::intrusive_ptr<c10d::Work> NcclSimTransport::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  return gloo_->send(tensors, dst_rank, tag);
}

c10::intrusive_ptr<c10d::Work> NcclSimTransport::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  return gloo_->recv(tensors, src_rank, tag);
}

c10::intrusive_ptr<c10d::Work> NcclSimTransport::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return gloo_->recvAnysource(tensors, tag);
}

c10::intrusive_ptr<c10d::Work> NcclSimTransport::barrier(const c10d::BarrierOptions& opts) {
  {
    std::lock_guard<std::mutex> lock(barrier_mutex_);
    barrier_device_ids_ = opts.device_ids;
  }
  return returned(gloo_->barrier(opts), opts.asyncOp);
}

std::vector<int64_t> NcclSimTransport::barrier_device_ids() const {
  std::lock_guard<std::mutex> lock(barrier_mutex_);
  return barrier_device_ids_;
}

c10::intrusive_ptr<c10d::Backend> NcclSimTransport::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                         const std::vector<int>& ranks,
                                                         const c10::intrusive_ptr<c10d::Backend::Options>& opts) {
  auto gloo = gloo_->split(store, ranks, opts);
  if (!gloo) return {};
  return c10::make_intrusive<NcclSimTransport>(gloo);
}

}  // namespace fp8comm
