#pragma once
// The inner backend as the compressed algorithms use it: two exchanges on
// uint8 buffers of whole S-byte wire segments, started with asyncOp and waited
// for, every inner Work kept for the call's Fp8Work (DESIGN.md, "Streams and
// Work"); it counts the bytes it sends (DESIGN.md, "Stats").
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <chrono>
#include <functional>
#include <vector>

#include "transport_traits.h"

namespace fp8comm {

class Transport {
 public:
  using Pending = c10::intrusive_ptr<c10d::Work>;

  // `op` names the collective in errors.
  Transport(c10::intrusive_ptr<c10d::Backend> inner, const TransportTraits& traits, int64_t rank, int64_t size,
            std::chrono::milliseconds timeout, const char* op);

  const TransportTraits& traits() const { return traits_; }
  int64_t rank() const { return rank_; }
  int64_t size() const { return size_; }
  const char* op() const { return op_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // Sends segment i of `send` to the i-th other rank and receives the i-th
  // other rank's segment into segment i of `recv` (P - 1 segments of S
  // elements each, bytes on the wire buffers; ranks in order with this one
  // left out: a rank's own segment never travels). An alltoall_base with a
  // zero split for this rank.
  Pending start_exchange(at::Tensor& recv, at::Tensor& send, int64_t S);
  // The same with bytes of its own for each rank (all_to_all's slices):
  // send_bytes[r] from `send` to rank r and recv_bytes[r] from rank r into
  // `recv`, back to back in rank order; zero for this rank.
  Pending start_exchange(at::Tensor& recv, at::Tensor& send, std::vector<int64_t> recv_bytes,
                         std::vector<int64_t> send_bytes);

  // The slot of an all_gather's P-slot buffer that holds rank r's segment:
  // slot r through an all_gather; by an exchange, the other ranks' segments
  // in order, then this rank's in the last slot.
  int64_t gather_slot(int64_t r) const;
  // The rank whose segment each slot holds (-1 for this rank's own).
  std::vector<int64_t> gathered_from() const;
  // The senders of an exchange's segments: the other ranks, in order.
  std::vector<int64_t> peers() const;

  // Bytes of scratch an all_gather of S-byte segments needs: by an exchange
  // with more than two ranks, the P - 1 copies of this rank's segment it sends.
  int64_t gather_scratch_bytes(int64_t S) const;
  // All-gathers into `gathered` (P slots of S bytes) whose gather_slot(rank)
  // this rank has written; `scratch` has gather_scratch_bytes(S) bytes.
  Pending start_all_gather(at::Tensor& gathered, int64_t S, at::Tensor& scratch);

  // Exact collectives on flat tensors of any dtype (the inter_node scope's
  // phases inside a node), started, then finished once their Work is
  // waited for. `scratch` holds the *_scratch_numel(k) elements of their
  // dtype that each needs, untouched by others until it is finished.
  //
  // reduce_scatter_sum: `output` (k elements) <- the SUM of every rank's
  // pieces[rank], where pieces[r] (k elements, any strides) is this rank's
  // addend of rank r's segment; added in rank order.
  struct PendingSum {
    Pending work;
    at::Tensor output, received;  // received: the other ranks' pieces, in exchange order (gloo)
    at::Tensor own;               // this rank's piece, read in place (gloo)
  };
  int64_t reduce_scatter_scratch_numel(int64_t k) const;
  PendingSum start_reduce_scatter_sum(const at::Tensor& output, const std::vector<at::Tensor>& pieces,
                                      const at::Tensor& scratch);
  void finish_reduce_scatter_sum(PendingSum& pending, const char* phase);

  // start_all_gather_exact: every rank's `input` (k elements each) into
  // `scratch`; once its Work is waited for, deliver_gathered calls
  // deliver(r, rank r's input) for every rank r, so the caller copies each
  // straight to where it belongs and writes nothing if a phase fails.
  using Deliver = std::function<void(int64_t rank, const at::Tensor& input)>;
  int64_t all_gather_scratch_numel(int64_t k) const;
  Pending start_all_gather_exact(const at::Tensor& input, const at::Tensor& scratch);
  void deliver_gathered(const Deliver& deliver, const at::Tensor& input, const at::Tensor& scratch) const;

  // Orders what follows after `work` (CPU: blocks until it is done) and keeps
  // it for the call's Work (CUDA: where it may still fail). An error names
  // the op and the phase.
  void wait(const Pending& work, const char* phase);
  // The inner Works this call has waited for, for the call's Work.
  std::vector<Pending> take_works();
  // Keeps `other`'s inner Works with this call's (a call over several transports).
  void adopt_works(Transport& other);

  // Bytes this rank has sent to the other ranks through this transport: the
  // P - 1 segments (or all_to_all's slices) of each exchange, the P - 1 copies of its slot each
  // all_gather delivers, the P - 1 pieces each reduce_scatter delivers to
  // their owners. Counted from what each phase is given to send, so the
  // stats are what the transport carried (route.h).
  int64_t bytes_sent() const { return bytes_sent_; }

 private:
  c10::intrusive_ptr<c10d::Backend> inner_;
  const TransportTraits traits_;
  int64_t rank_, size_;
  std::chrono::milliseconds timeout_;
  const char* op_;
  std::vector<Pending> works_;
  int64_t bytes_sent_ = 0;
};

}  // namespace fp8comm
