#pragma once
// What the compressed algorithms need to know about an inner transport. Every
// choice between the CPU and the CUDA variant of an algorithm is made from
// these traits, never from the tensors' device, so that CI can run the exact
// path fp8nccl takes on CPU processes (a test transport that declares itself
// "nccl" over gloo, fp8comm.testing).
#include <torch/csrc/distributed/c10d/Backend.hpp>

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
    } else {
      TORCH_CHECK(false, "fp8comm: the inner transport must be torch's gloo or nccl backend, got \"", name, "\"");
    }
    return t;
  }
};

}  // namespace fp8comm
