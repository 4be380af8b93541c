#include "transport.h"

#include <string>
#include <utility>

namespace fp8comm {

namespace {

// Where another rank's segment lies in an exchange's buffer of P - 1
// segments (start_exchange): the other ranks in order, this one left out.
int64_t exchange_slot(int64_t r, int64_t rank) { return r < rank ? r : r - 1; }

// The pieces (k elements each) as one flat tensor: a view where each is
// contiguous and follows the one before in memory, else copied into
// `staging`.
at::Tensor flat_or_staged(const std::vector<at::Tensor>& pieces, int64_t k, const at::Tensor& staging) {
  const int64_t count = static_cast<int64_t>(pieces.size());
  bool adjacent = true;
  for (int64_t i = 0; i < count && adjacent; ++i) {
    adjacent = pieces[i].is_contiguous() &&
               (i == 0 || static_cast<const char*>(pieces[i].data_ptr()) ==
                              static_cast<const char*>(pieces[i - 1].data_ptr()) + k * pieces[i].element_size());
  }
  if (adjacent) return pieces[0].as_strided({count * k}, {1});
  at::Tensor flat = staging.narrow(0, 0, count * k);
  for (int64_t i = 0; i < count; ++i) flat.narrow(0, i * k, k).view(pieces[i].sizes()).copy_(pieces[i]);
  return flat;
}

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
  Pending work = inner_->alltoall_base(recv, send, recv_splits, send_splits, opts);
  bytes_sent_ += (size_ - 1) * S * send.element_size();  // every split but this rank's own (zero)
  return work;
}

Transport::Pending Transport::start_exchange(at::Tensor& recv, at::Tensor& send, std::vector<int64_t> recv_bytes,
                                             std::vector<int64_t> send_bytes) {
  TORCH_INTERNAL_ASSERT(recv_bytes[rank_] == 0 && send_bytes[rank_] == 0, "fp8comm ", op_,
                        ": a rank's own slice never travels");
  if (size_ == 1) return {};
  c10d::AllToAllOptions opts;
  opts.timeout = timeout_;
  opts.asyncOp = true;
  int64_t sent = 0;
  for (int64_t b : send_bytes) sent += b;
  Pending work = inner_->alltoall_base(recv, send, recv_bytes, send_bytes, opts);
  bytes_sent_ += sent;
  return work;
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
  Pending work = inner_->_allgather_base(gathered, mine, opts);  // in place: NCCL reads this rank's slot
  bytes_sent_ += (size_ - 1) * S;  // this rank's slot, to each other rank
  return work;
}

int64_t Transport::reduce_scatter_scratch_numel(int64_t k) const {
  if (size_ == 1) return 0;
  // NCCL: the P pieces together; gloo: the other ranks' pieces as they
  // arrive and, where they do not lie together, as they are sent.
  return traits_.exact_by_all_to_all ? 2 * (size_ - 1) * k : size_ * k;
}

Transport::PendingSum Transport::start_reduce_scatter_sum(const at::Tensor& output,
                                                          const std::vector<at::Tensor>& pieces,
                                                          const at::Tensor& scratch) {
  TORCH_INTERNAL_ASSERT(static_cast<int64_t>(pieces.size()) == size_);
  const int64_t k = output.numel();
  PendingSum pending{{}, output, {}, pieces[rank_]};
  if (size_ == 1) return pending;
  if (!traits_.exact_by_all_to_all) {
    at::Tensor input = flat_or_staged(pieces, k, scratch.narrow(0, 0, size_ * k));
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    opts.timeout = timeout_;
    opts.asyncOp = true;
    at::Tensor out = output;
    pending.work = inner_->_reduce_scatter_base(out, input, opts);
    bytes_sent_ += (size_ - 1) * output.nbytes();  // the other ranks' pieces, to their owners
    return pending;
  }
  // An exchange of the other ranks' pieces, in exchange order; this rank's
  // own never travels.
  std::vector<at::Tensor> others;
  for (int64_t r = 0; r < size_; ++r) {
    if (r != rank_) others.push_back(pieces[r]);
  }
  pending.received = scratch.narrow(0, 0, (size_ - 1) * k);
  at::Tensor send = flat_or_staged(others, k, scratch.narrow(0, (size_ - 1) * k, (size_ - 1) * k));
  pending.work = start_exchange(pending.received, send, k);
  return pending;
}

void Transport::finish_reduce_scatter_sum(PendingSum& pending, const char* phase) {
  at::Tensor& output = pending.output;
  if (size_ == 1) {
    output.view(pending.own.sizes()).copy_(pending.own);
    return;
  }
  wait(pending.work, phase);
  if (!traits_.exact_by_all_to_all) return;
  // Added in rank order: one owner per segment, so the order only has to be
  // fixed, and two pieces add as a+b.
  const int64_t k = output.numel();
  at::Tensor out = output.view(pending.own.sizes());
  auto piece = [&](int64_t r) {
    return r == rank_ ? pending.own : pending.received.narrow(0, exchange_slot(r, rank_) * k, k).view(out.sizes());
  };
  at::add_out(out, piece(0), piece(1));
  for (int64_t r = 2; r < size_; ++r) out.add_(piece(r));
}

int64_t Transport::all_gather_scratch_numel(int64_t k) const {
  if (size_ == 1) return 0;
  if (!traits_.exact_by_all_to_all) return size_ * k;  // the gathered slots
  // The other ranks' inputs, and the copies of this rank's sent to more than one peer.
  return (size_ > 2 ? 2 : 1) * (size_ - 1) * k;
}

Transport::Pending Transport::start_all_gather_exact(const at::Tensor& input, const at::Tensor& scratch) {
  if (size_ == 1) return {};
  const int64_t k = input.numel();
  at::Tensor in = input;
  if (!traits_.exact_by_all_to_all) {
    at::Tensor gathered = scratch.narrow(0, 0, size_ * k);
    c10d::AllgatherOptions opts;
    opts.timeout = timeout_;
    opts.asyncOp = true;
    Pending work = inner_->_allgather_base(gathered, in, opts);
    bytes_sent_ += (size_ - 1) * in.nbytes();  // this rank's input, to each other rank
    return work;
  }
  // An exchange: this rank's input never travels to itself, and with one
  // peer it is sent as it is.
  at::Tensor received = scratch.narrow(0, 0, (size_ - 1) * k);
  at::Tensor send = in;
  if (size_ > 2) {
    send = scratch.narrow(0, (size_ - 1) * k, (size_ - 1) * k);
    for (int64_t i = 0; i < size_ - 1; ++i) send.narrow(0, i * k, k).copy_(input);
  }
  return start_exchange(received, send, k);
}

void Transport::deliver_gathered(const Deliver& deliver, const at::Tensor& input, const at::Tensor& scratch) const {
  const int64_t k = input.numel();
  for (int64_t r = 0; r < size_; ++r) {
    if (r == rank_ && (size_ == 1 || traits_.exact_by_all_to_all)) {
      deliver(r, input);
    } else {
      deliver(r, scratch.narrow(0, (traits_.exact_by_all_to_all ? exchange_slot(r, rank_) : r) * k, k));
    }
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
