#include "transport.h"

#include <string>
#include <utility>

namespace fp8comm {

namespace {

// Where another rank's segment lies in an exchange's buffer of P - 1
// segments (start_exchange): the other ranks in order, this one left out.
int64_t exchange_slot(int64_t r, int64_t rank) { return r < rank ? r : r - 1; }

}  // namespace

Transport::Transport(c10::intrusive_ptr<c10d::Backend> inner, const TransportTraits& traits, int64_t rank,
                     int64_t size, std::chrono::milliseconds timeout, const char* op)
    : inner_(std::move(inner)), traits_(traits), rank_(rank), size_(size), timeout_(timeout), op_(op) {}

Transport::Pending Transport::start_exchange(at::Tensor& recv, at::Tensor& send, int64_t S) {
  if (size_ == 1) return {};
  // Two vectors: ProcessGroupGloo moves each split list into its work.
  std::vector<int64_t> recv_splits(size_, S), send_splits(size_, S);
  recv_splits[rank_] = send_splits[rank_] = 0;
  c10d::AllToAllOptions opts;
  opts.timeout = timeout_;
  opts.asyncOp = true;
  return inner_->alltoall_base(recv, send, recv_splits, send_splits, opts);
}

int64_t Transport::gather_slot(int64_t r) const {
  if (!traits_.gather_by_all_to_all) return r;
  return r == rank_ ? size_ - 1 : exchange_slot(r, rank_);
}

std::vector<int64_t> Transport::gathered_from() const {
  std::vector<int64_t> from(size_, -1);
  for (int64_t r = 0; r < size_; ++r) {
    if (r != rank_) from[gather_slot(r)] = r;
  }
  return from;
}

std::vector<int64_t> Transport::peers() const {
  std::vector<int64_t> peers;
  for (int64_t r = 0; r < size_; ++r) {
    if (r != rank_) peers.push_back(r);
  }
  return peers;
}

int64_t Transport::gather_scratch_bytes(int64_t S) const {
  return traits_.gather_by_all_to_all && size_ > 2 ? (size_ - 1) * S : 0;
}

Transport::Pending Transport::start_all_gather(at::Tensor& gathered, int64_t S, at::Tensor& scratch) {
  if (size_ == 1) return {};
  at::Tensor mine = gathered.narrow(0, gather_slot(rank_) * S, S);
  if (traits_.gather_by_all_to_all) {
    at::Tensor peers = gathered.narrow(0, 0, (size_ - 1) * S);
    at::Tensor send = mine;
    if (size_ > 2) {
      send = scratch.narrow(0, 0, (size_ - 1) * S);
      for (int64_t i = 0; i < size_ - 1; ++i) send.narrow(0, i * S, S).copy_(mine);
    }
    return start_exchange(peers, send, S);
  }
  c10d::AllgatherOptions opts;
  opts.timeout = timeout_;
  opts.asyncOp = true;
  return inner_->_allgather_base(gathered, mine, opts);  // in place: NCCL reads this rank's slot
}

int64_t Transport::reduce_scatter_scratch_numel(int64_t k) const {
  return traits_.exact_by_all_to_all && size_ > 1 ? size_ * k : 0;  // every rank's piece of this rank's segment
}

int64_t Transport::all_gather_scratch_numel(int64_t k) const {
  if (size_ == 1) return 0;
  if (!traits_.exact_by_all_to_all) return size_ * k;  // the gathered slots
  // The other ranks' inputs, and the copies of this rank's sent to more than one peer.
  return (size_ > 2 ? 2 : 1) * (size_ - 1) * k;
}

Transport::Pending Transport::start_all_to_all(at::Tensor& recv, at::Tensor& send, int64_t k) {
  std::vector<int64_t> recv_splits(size_, k), send_splits(size_, k);
  c10d::AllToAllOptions opts;
  opts.timeout = timeout_;
  opts.asyncOp = true;
  return inner_->alltoall_base(recv, send, recv_splits, send_splits, opts);
}

void Transport::reduce_scatter_sum(at::Tensor& output, at::Tensor& input, at::Tensor& scratch, const char* phase) {
  if (size_ == 1) {
    output.copy_(input);
    return;
  }
  if (!traits_.exact_by_all_to_all) {
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    opts.timeout = timeout_;
    opts.asyncOp = true;
    wait(inner_->_reduce_scatter_base(output, input, opts), phase);
    return;
  }
  const int64_t k = output.numel();
  // Every rank's piece of my segment. Where the pieces for the other ranks
  // lie together (this rank first or last), an exchange sends only them and
  // this rank's own piece is read where it is; else an all_to_all moves all.
  std::vector<at::Tensor> piece(size_);
  if (rank_ == 0 || rank_ == size_ - 1) {
    at::Tensor received = scratch.narrow(0, 0, (size_ - 1) * k);
    at::Tensor others = input.narrow(0, rank_ == 0 ? k : 0, (size_ - 1) * k);
    wait(start_exchange(received, others, k), phase);
    for (int64_t r = 0; r < size_; ++r) {
      piece[r] = r == rank_ ? input.narrow(0, r * k, k) : received.narrow(0, exchange_slot(r, rank_) * k, k);
    }
  } else {
    at::Tensor pieces = scratch.narrow(0, 0, size_ * k);
    wait(start_all_to_all(pieces, input, k), phase);
    for (int64_t r = 0; r < size_; ++r) piece[r] = pieces.narrow(0, r * k, k);
  }
  // Added in rank order: one owner per segment, so the order only has to be
  // fixed, and two pieces add as a+b.
  at::add_out(output, piece[0], piece[1]);
  for (int64_t r = 2; r < size_; ++r) output.add_(piece[r]);
}

void Transport::all_gather_exact(const Deliver& deliver, at::Tensor& input, at::Tensor& scratch, const char* phase) {
  if (size_ == 1) {
    deliver(0, input);
    return;
  }
  const int64_t k = input.numel();
  if (!traits_.exact_by_all_to_all) {
    at::Tensor gathered = scratch.narrow(0, 0, size_ * k);
    c10d::AllgatherOptions opts;
    opts.timeout = timeout_;
    opts.asyncOp = true;
    wait(inner_->_allgather_base(gathered, input, opts), phase);
    for (int64_t r = 0; r < size_; ++r) deliver(r, gathered.narrow(0, r * k, k));
    return;
  }
  // An exchange: this rank's input never travels to itself, and with one
  // peer it is sent as it is.
  at::Tensor received = scratch.narrow(0, 0, (size_ - 1) * k);
  at::Tensor send = input;
  if (size_ > 2) {
    send = scratch.narrow(0, (size_ - 1) * k, (size_ - 1) * k);
    for (int64_t i = 0; i < size_ - 1; ++i) send.narrow(0, i * k, k).copy_(input);
  }
  wait(start_exchange(received, send, k), phase);
  for (int64_t r = 0; r < size_; ++r) {
    deliver(r, r == rank_ ? input : received.narrow(0, exchange_slot(r, rank_) * k, k));
  }
}

void Transport::wait(const Pending& work, const char* phase) {
  if (!work) return;
  works_.push_back(work);
  try {
    work->wait();
  } catch (const std::exception& e) {
    C10_THROW_ERROR(DistBackendError, std::string("fp8comm ") + op_ + ": the " + phase +
                                          " phase of the compressed algorithm failed in the inner " +
                                          inner_->getBackendName() + " backend: " + e.what());
  }
}

std::vector<Transport::Pending> Transport::take_works() { return std::exchange(works_, {}); }

void Transport::adopt_works(Transport& other) {
  for (auto& work : other.take_works()) works_.push_back(std::move(work));
}

}  // namespace fp8comm
