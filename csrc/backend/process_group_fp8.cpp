// ProcessGroupFp8: the group, its transports, and the calls that concern the
// whole group. The collectives are in compressible_ops.cpp and exact_ops.cpp.
#include "process_group_fp8.h"

#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>

#include "../codec/codec_tensor.h"
#include "../common/env.h"
#include "exact_scope.h"
#include "fp8_work.h"
#include "held_works.h"

namespace fp8comm {

ProcessGroupFp8::ProcessGroupFp8(int rank, int size, c10::intrusive_ptr<fp8comm::Options> options,
                                 c10::intrusive_ptr<c10d::Store> store)
    : c10d::Backend(rank, size),
      options_(std::move(options)),
      warn_small_(env::kWarnPassthrough.as_flag()),
      uncompressed_(std::move(store), rank, size) {
  TORCH_CHECK(options_ && options_->is_resolved(),
              "fp8comm: ProcessGroupFp8 needs resolved options (fp8comm.Options(...).resolved())");
  check_block_size(*options_->block_size, "fp8comm.Options");
}

ProcessGroupFp8::~ProcessGroupFp8() { release_unshared_inner_works(); }

void ProcessGroupFp8::add_transport(c10::DeviceType device_type, c10::intrusive_ptr<c10d::Backend> inner) {
  TORCH_CHECK(inner, "fp8comm: the inner backend for ", device_type, " is null");
  // The error is measured with host reads (quantization_error.h), which on
  // a device would sync the host in every call: refused rather than silent.
  TORCH_CHECK_VALUE(!*options_->track_error || device_type == c10::DeviceType::CPU,
                    "fp8comm.Options: track_error=True measures the quantization error on CPU transports only "
                    "(fp8gloo), and this group has a ", device_type, " transport (", inner->getBackendName(),
                    "). Create it without track_error (and with FP8COMM_TRACK_ERROR unset or 0), or measure on "
                    "an fp8gloo group.");
  TORCH_CHECK(inner->getRank() == rank_ && inner->getSize() == size_, "fp8comm: the inner ",
              inner->getBackendName(), " backend has rank ", inner->getRank(), " of ", inner->getSize(),
              " but this group has rank ", rank_, " of ", size_);
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(inner_.count(device_type) == 0, "fp8comm: this process group already has a transport for ",
              device_type);
  traits_[device_type] = TransportTraits::of(*inner, device_type);
  inner_[device_type] = std::move(inner);
}

void ProcessGroupFp8::set_topology(int64_t nodes, int64_t ranks_on_my_node, int64_t local_size,
                                   std::vector<int64_t> group_ranks) {
  TORCH_CHECK(nodes >= 1 && ranks_on_my_node >= 1 && ranks_on_my_node <= size_,
              "fp8comm: a topology of ", nodes, " nodes with ", ranks_on_my_node, " ranks on this one does not fit a group of ",
              size_);
  TORCH_CHECK(group_ranks.empty() || static_cast<int64_t>(group_ranks.size()) == nodes * local_size,
              "fp8comm: a topology of ", nodes, " nodes x ", local_size, " ranks lists ", group_ranks.size(), " ranks");
  std::lock_guard<std::mutex> lock(mutex_);
  nodes_ = nodes;
  ranks_on_my_node_ = ranks_on_my_node;
  node_group_ranks_ = std::move(group_ranks);
}

void ProcessGroupFp8::add_node_transports(c10::DeviceType device_type, c10::intrusive_ptr<c10d::Backend> intra,
                                          c10::intrusive_ptr<c10d::Backend> inter) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(*options_->scope == Scope::kInterNode, "fp8comm: node transports for a group whose scope is ",
              scope_name(*options_->scope));
  TORCH_CHECK(!node_group_ranks_.empty() && intra && inter &&
                  intra->getSize() * inter->getSize() == static_cast<int64_t>(node_group_ranks_.size()),
              "fp8comm: node transports of ", intra ? intra->getSize() : 0, " x ", inter ? inter->getSize() : 0,
              " ranks do not match the group's topology (set_topology first)");
  // A call runs its node phases with the group transport's traits, chunk
  // plan included (run_compressed.h): they must be of its kind.
  auto flat = inner_.find(device_type);
  TORCH_CHECK(flat != inner_.end(), "fp8comm: node transports for ", device_type,
              " before the group's own transport for it (add_transport first)");
  const std::string kind = flat->second->getBackendName();
  TORCH_CHECK(intra->getBackendName() == kind && inter->getBackendName() == kind, "fp8comm: node transports \"",
              intra->getBackendName(), "\" and \"", inter->getBackendName(), "\" for ", device_type,
              " differ from the group's own \"", kind, "\"; create them with the group transport's factory");
  node_inner_[device_type] = NodeInner{std::move(intra), std::move(inter)};
}

std::optional<ProcessGroupFp8::NodeInner> ProcessGroupFp8::node_inner(c10::DeviceType device_type) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = node_inner_.find(device_type);
  if (it == node_inner_.end()) return std::nullopt;
  return it->second;
}

TransportTraits ProcessGroupFp8::traits_for(c10::DeviceType device_type) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = traits_.find(device_type);
  TORCH_CHECK(it != traits_.end(), "fp8comm: this process group has no transport for ", device_type);
  return it->second;
}

WireLayout ProcessGroupFp8::wire_layout(c10::DeviceType device_type) const {
  return WireLayout(traits_for(device_type), static_cast<int>(*options_->block_size), *options_->wire_format,
                    *options_->rounding);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::passed_through(c10::intrusive_ptr<c10d::Work> work,
                                                               c10::DeviceType device_type, const Collective& c,
                                                               std::vector<at::Tensor> outputs) const {
  if (work) return hold_inner_work(work, device_type);
  return c10::make_intrusive<Fp8Work>(rank_, c.type, c.name, std::move(outputs));
}

bool ProcessGroupFp8::has_transport(c10::DeviceType device_type) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return inner_.count(device_type) > 0;
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupFp8::transport(c10::DeviceType device_type) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = inner_.find(device_type);
  return it == inner_.end() ? c10::intrusive_ptr<c10d::Backend>() : it->second;
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupFp8::inner_for(const at::Device& device, const char* op) {
  auto inner = transport(device.type());
  TORCH_CHECK(inner, "fp8comm ", op, ": got ", device, " tensors, but this process group has no transport for ",
              device.type(), " (", getBackendName(), "); create it with e.g. \"cpu:fp8gloo,cuda:fp8nccl\"");
  // The group description and bound device reach us after creation, through
  // non-virtual setters; pass them on before the inner backend is used.
  if (inner->getGroupDesc() != getGroupDesc()) inner->setGroupDesc(getGroupDesc());
  if (getBoundDeviceId() && getBoundDeviceId()->type() == device.type() &&
      inner->getBoundDeviceId() != getBoundDeviceId()) {
    inner->setBoundDeviceId(getBoundDeviceId());
  }
  return inner;
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupFp8::default_inner(const char* op) {
  if (has_transport(c10::DeviceType::CUDA)) return inner_for(at::Device(c10::DeviceType::CUDA), op);
  return inner_for(at::Device(c10::DeviceType::CPU), op);
}

const std::string ProcessGroupFp8::getBackendName() const {
  return has_transport(c10::DeviceType::CUDA) ? "fp8nccl" : "fp8gloo";
}

Passthrough ProcessGroupFp8::passthrough(const Collective& c, const at::Tensor& t, int64_t per_rank_numel,
                                         Passthrough call_rule) const {
  const Passthrough why = passthrough_but_size(c, t, call_rule);
  if (why != Passthrough::kCompressed) return why;
  return size_rule(c, per_rank_numel);
}

Passthrough ProcessGroupFp8::size_rule(const Collective& c, int64_t per_rank_numel) const {
  if (per_rank_numel <= 0) return Passthrough::kEmpty;
  if (per_rank_numel < *options_->min_numel) {
    warn_small(c, per_rank_numel);
    return Passthrough::kBelowMinNumel;
  }
  return Passthrough::kCompressed;
}

Passthrough ProcessGroupFp8::passthrough_but_size(const Collective& c, const at::Tensor& t,
                                                  Passthrough call_rule) const {
  if (c.compressed == nullptr) return Passthrough::kNoCompressedForm;
  if (!options_->compresses(c.compressed)) return Passthrough::kNotInCompress;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (uncompressed_.active()) return Passthrough::kUncompressedBlock;
    // Inside a coalescing block the inner backend defers its ops until
    // endCoalescing, so the multi-phase algorithms cannot run there.
    if (!coalescing_.empty()) return Passthrough::kCoalescing;
    // A group on one node in the inter_node scope has no hop to compress.
    if (*options_->scope == Scope::kInterNode && nodes_ == 1) return Passthrough::kOneNode;
  }
  // The calling thread gathers a state dict (exact_scope.h).
  if (exact_scope::active()) return Passthrough::kExactScope;
  if (!is_codec_dtype(t.scalar_type())) return Passthrough::kDtype;
  if (t.layout() != at::kStrided) return Passthrough::kNotDense;
  return call_rule;
}

void ProcessGroupFp8::warn_small(const Collective& c, int64_t per_rank_numel) const {
  if (!warn_small_) return;
  {
    std::lock_guard<std::mutex> lock(warned_mutex_);
    if (!warned_small_.insert(c.name).second) return;
  }
  // torch names a group without a description "undefined".
  const std::string desc = getGroupDesc() == "undefined" ? "" : getGroupDesc();
  TORCH_WARN("fp8comm: ", c.name, " on group \"", getGroupUid(), "\"", desc.empty() ? "" : " (", desc,
             desc.empty() ? "" : ")", " passed through exactly: Options.compress names it, "
             "but this call has ", per_rank_numel, " elements per rank, below min_numel (", *options_->min_numel,
             "). Every such call stays exact (fp8comm.get_stats(group)[\"per_op\"][\"", c.name,
             "\"][\"passthrough_reasons\"] counts them); lower Options.min_numel (FP8COMM_MIN_NUMEL) to compress "
             "them. This group warns once per op; FP8COMM_WARN_PASSTHROUGH=0 turns the warning off.");
}

std::vector<int64_t> ProcessGroupFp8::node_of_rank() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<int64_t> node_of;
  if (node_group_ranks_.empty()) return node_of;
  const int64_t L = static_cast<int64_t>(node_group_ranks_.size()) / nodes_;
  node_of.assign(size_, 0);
  for (size_t i = 0; i < node_group_ranks_.size(); ++i) node_of.at(node_group_ranks_[i]) = static_cast<int64_t>(i) / L;
  return node_of;
}

// Stats are recorded after a call has been issued (enqueued on CUDA, done on
// the CPU): calls refused by a check, here or in the inner backend, and CPU
// calls that fail in the transport are not counted.
void ProcessGroupFp8::record_passthrough(const Collective& c, Passthrough why, const Payload& payload,
                                         const NodeBytes& also) {
  const NodeBytes plain = c.plain_node_bytes(payload, size_, ranks_on_my_node_);
  stats_.record(c.name, why, NodeBytes{plain.intra_node + also.intra_node, plain.inter_node + also.inter_node},
                c.plain_bytes_sent(payload, size_));
}

void ProcessGroupFp8::record_compressed(const Collective& c, const Payload& payload, const NodeBytes& wire,
                                        const QuantizationError& error) {
  stats_.record(c.name, Passthrough::kCompressed, wire, c.plain_bytes_sent(payload, size_));
  if (*options_->track_error) stats_.record_error(c.name, error);
}

// --------------------------------------------------------- uncompressed blocks
// The depth changes under the call lock, so never inside a compressed call
// that another thread is running; the wait for the other ranks runs outside it.
void ProcessGroupFp8::enter_uncompressed(std::optional<std::chrono::milliseconds> timeout) {
  uncompressed_.switch_together("enter", timeout);
  std::lock_guard<std::recursive_mutex> lock(call_mutex_);
  uncompressed_.enter();
}

void ProcessGroupFp8::leave_uncompressed(bool together, std::optional<std::chrono::milliseconds> timeout) {
  {
    std::lock_guard<std::recursive_mutex> lock(call_mutex_);
    uncompressed_.leave();
  }
  if (together) {
    uncompressed_.switch_together("leave", timeout);
  } else {
    uncompressed_.switch_alone();
  }
}

c10::Stream ProcessGroupFp8::side_stream(const at::Device& device) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = side_streams_.find(device.index());
  if (it == side_streams_.end()) {
    c10::impl::VirtualGuardImpl impl(device.type());
    it = side_streams_.emplace(device.index(), impl.getStreamFromGlobalPool(device, /*isHighPriority=*/false)).first;
  }
  return it->second;
}

// --------------------------------------------------------- group-level calls
bool ProcessGroupFp8::supportsCoalescing() const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [device, inner] : inner_) {
    if (inner->supportsCoalescing()) return true;
  }
  return false;
}

// Inside a coalescing block the inner backend defers its ops until
// endCoalescing (NCCL groups them), so the multi-step compressed algorithms
// cannot run: collectives issued there pass through exactly.
void ProcessGroupFp8::startCoalescing() {
  std::vector<c10::intrusive_ptr<c10d::Backend>> started;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [device, inner] : inner_) {
      if (inner->supportsCoalescing()) started.push_back(inner);
    }
  }
  TORCH_CHECK(!started.empty(), "Backend ", getBackendName(), " does not implement startCoalescing");
  for (auto& inner : started) inner->startCoalescing();
  std::lock_guard<std::mutex> lock(mutex_);
  coalescing_ = std::move(started);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupFp8::endCoalescing() {
  std::vector<c10::intrusive_ptr<c10d::Backend>> started;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    started.swap(coalescing_);
  }
  TORCH_CHECK(!started.empty(), "fp8comm: endCoalescing without startCoalescing");
  c10::intrusive_ptr<c10d::Work> last;
  for (auto& inner : started) {
    auto work = inner->endCoalescing();
    if (!work) continue;
    if (last) last->wait();
    last = work;
  }
  if (!last) last = c10::make_intrusive<Fp8Work>(rank_, c10d::OpType::COALESCED, "coalesced", std::vector<at::Tensor>{});
  return last;
}

std::vector<c10::intrusive_ptr<c10d::Backend>> ProcessGroupFp8::all_transports() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<c10::intrusive_ptr<c10d::Backend>> all;
  auto add = [&](const c10::intrusive_ptr<c10d::Backend>& backend) {
    const bool seen = std::any_of(all.begin(), all.end(), [&](const auto& b) { return b.get() == backend.get(); });
    if (backend && !seen) all.push_back(backend);
  };
  for (const auto& [device, inner] : inner_) add(inner);
  for (const auto& [device, nodes] : node_inner_) {
    add(nodes.intra);
    add(nodes.inter);
  }
  return all;
}

// These reach every transport the group holds, the inter_node scope's
// included: a hang there must be abortable, and destroy_process_group
// (which shuts the group down) must leave no NCCL communicator behind.
void ProcessGroupFp8::setTimeout(std::chrono::milliseconds timeout) {
  for (auto& inner : all_transports()) inner->setTimeout(timeout);
}

void ProcessGroupFp8::abort() {
  for (auto& inner : all_transports()) inner->abort();
}

void ProcessGroupFp8::shutdown() {
  for (auto& inner : all_transports()) inner->shutdown();
  release_unshared_inner_works();
}

void ProcessGroupFp8::setGroupUid(const std::string& pg_uid) {
  c10d::Backend::setGroupUid(pg_uid);
  for (auto device : {c10::DeviceType::CPU, c10::DeviceType::CUDA}) {
    if (auto inner = transport(device)) inner->setGroupUid(pg_uid);
  }
}

void ProcessGroupFp8::eagerConnectSingleDevice(at::Device device) {
  if (auto inner = transport(device.type())) {
    if (getBoundDeviceId()) inner->setBoundDeviceId(getBoundDeviceId());
    inner->eagerConnectSingleDevice(device);
  }
}

void ProcessGroupFp8::setSequenceNumberForGroup() {
  for (auto device : {c10::DeviceType::CPU, c10::DeviceType::CUDA}) {
    if (auto inner = transport(device)) inner->setSequenceNumberForGroup();
  }
}

uint64_t ProcessGroupFp8::getSequenceNumberForGroup() {
  return default_inner("get_sequence_number")->getSequenceNumberForGroup();
}

}  // namespace fp8comm
