#pragma once
// What the compressed algorithms need to know about an inner transport. Every
// choice between the CPU and the CUDA variant of an algorithm is made from
// these traits, never from the tensors' device, so that CI can run the exact
// path fp8nccl takes on CPU processes (a test transport that declares itself
// "nccl" over gloo: the fp8ncclsim transport, csrc/testing).
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <cstdint>
#include <string>


namespace fp8comm {

struct TransportTraits {
  // Each wire segment starts with a 16-byte header that the receiver checks
  // on the host (wire_layout.h): only where the bytes live in host memory.
  bool segment_headers = false;
  // all_gather runs as an all_to_all with a zero split for this rank, its own
  // segment in the last slot (gloo moves an all_to_all faster than its
  // all_gather, docs/performance.md); else one
  // in-place _allgather_base (NCCL).
  bool gather_by_all_to_all = false;
  // The transport reduces AVG and PREMUL_SUM itself; else fp8comm emulates
  // them around an exact SUM for passthrough calls.
  bool reduces_avg_and_premul = false;
  // The exact phases inside a node (inter_node scope) run as all_to_alls,
  // the reduce_scatter summing the pieces on this rank: gloo's own
  // reduce_scatter and all_gather move the same bytes two to three times slower
  // (docs/performance.md, "Shaped links"); else the transport's own
  // reduce_scatter and all_gather (NCCL).
  bool exact_by_all_to_all = false;
  // Elements of one chunk of a compressed collective, all ranks' segments
  // together (chunk_plan.h). Every rank of a group has the same transport, so
  // all cut a call into the same chunks and issue the same phases. gloo: 1M,
  // sized for the CPU codec's caches and to keep several gloo messages in
  // flight on a link (docs/performance.md). NCCL: 16M (64 MiB of FP32):
  // every chunk costs the host kernel launches and NCCL calls, and 1M would
  // make a 1 GiB FP32 all_reduce 256 chunks (about 512 of each), bound by the
  // host; 16M still gives a large call several chunks, so the codec still
  // works beside the wire.
  int64_t chunk_numel = int64_t{1} << 20;

  // The traits of torch's gloo on the CPU or on CUDA, and of NCCL (or a
  // transport that behaves as NCCL does). Any other transport: an error.
  static TransportTraits of(const c10d::Backend& inner, c10::DeviceType device) {
    const std::string name = inner.getBackendName();
    TransportTraits t;
    if (name == "gloo") {
      const bool host = device == c10::DeviceType::CPU;
      t.segment_headers = host;
      t.gather_by_all_to_all = true;
      t.reduces_avg_and_premul = false;
      t.exact_by_all_to_all = true;
    } else if (name == "nccl") {
      t.reduces_avg_and_premul = true;
      t.chunk_numel = int64_t{1} << 24;
    } else {
      TORCH_CHECK(false, "fp8comm: the inner transport must be torch's gloo or nccl backend, got \"", name, "\"");
    }
    return t;
  }
};

}  // namespace fp8comm
