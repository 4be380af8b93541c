// fp8comm._C: the Python face of the C++ parts. Importing it also registers the
// torch.library operators (csrc/codec/codec_ops.cpp). torch.distributed must be
// imported first: ProcessGroupFP8 derives from its c10d::Backend binding.
#include <torch/csrc/utils/pybind.h>
#include <torch/extension.h>

#include "backend/fp8_work.h"
#include "backend/registry.h"
#include "codec/codec.h"
#include "testing/nccl_like_backend.h"

namespace {

c10::DeviceType device_type_of(const std::string& device) {
  if (device == "cpu") return c10::DeviceType::CPU;
  if (device == "cuda") return c10::DeviceType::CUDA;
  TORCH_CHECK(false, "fp8comm: transports exist for \"cpu\" and \"cuda\", got \"", device, "\"");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using fp8comm::FP8Options;
  using fp8comm::ProcessGroupFP8;
  m.doc() = "fp8comm C++ extension: FP8 block codec and the fp8nccl / fp8gloo backend";
#ifdef FP8COMM_WITH_CUDA
  m.attr("has_cuda") = true;
#else
  m.attr("has_cuda") = false;
#endif
  m.def("segment_bytes", &fp8comm::segment_bytes, py::arg("segment_numel"), py::arg("block_size"),
        "Bytes of one wire segment [scales][codes] holding segment_numel elements.");

  m.def("cpu_simd_enabled", &fp8comm::cpu_simd_enabled,
        "Whether the CPU codec runs whole blocks through its AVX2 kernels.");
  m.def("set_cpu_simd", &fp8comm::set_cpu_simd, py::arg("enabled"),
        "Switch the CPU codec's AVX2 kernels on or off (same bytes either way); returns the old setting.");
  m.def("cpu_avx512_enabled", &fp8comm::cpu_avx512_enabled,
        "Whether the CPU codec's quantize and sum + re-quantize take AVX-512 kernels (block size 32) while its "
        "SIMD kernels are on (cpu_simd_enabled).");
  m.def("set_cpu_avx512", &fp8comm::set_cpu_avx512, py::arg("enabled"),
        "Switch the CPU codec's AVX-512 kernels on or off (same bytes either way); returns the old setting.");

  py::class_<ProcessGroupFP8, c10d::Backend, c10::intrusive_ptr<ProcessGroupFP8>>(m, "ProcessGroupFP8")
      .def("stats", [](ProcessGroupFP8& pg) { return pg.stats().snapshot(); })
      .def("reset_stats", [](ProcessGroupFP8& pg) { pg.stats().reset(); })
      .def(
          "transport",
          [](ProcessGroupFP8& pg, const std::string& device) { return pg.transport(device_type_of(device)); },
          py::arg("device"), "The inner backend for tensors on `device` (None if there is none).")
      .def(
          "transport_identity",
          [](ProcessGroupFP8& pg, const std::string& device) {
            auto inner = pg.transport(device_type_of(device));
            TORCH_CHECK(inner, "fp8comm: no transport for ", device);
            return std::make_pair(inner->getGroupUid(), inner->getGroupDesc());
          },
          py::arg("device"), "(group name, group description) as the inner backend knows them.")
      .def(
          "wire_segment_bytes",
          [](ProcessGroupFP8& pg, int64_t segment_numel, const std::string& device) {
            return pg.wire_layout(device_type_of(device)).segment_bytes(segment_numel);
          },
          py::arg("segment_numel"), py::arg("device"),
          "Bytes this group sends for one segment of segment_numel elements over its transport for `device`.")
      .def(
          "transport_traits",
          [](ProcessGroupFP8& pg, const std::string& device) {
            const fp8comm::TransportTraits t = pg.traits_for(device_type_of(device));
            return py::dict(py::arg("segment_headers") = t.segment_headers,
                            py::arg("gather_by_all_to_all") = t.gather_by_all_to_all,
                            py::arg("reduces_avg_and_premul") = t.reduces_avg_and_premul);
          },
          py::arg("device"), "What the algorithms know of the transport for `device` (transport_traits.h).")
      .def_property_readonly("block_size", [](ProcessGroupFP8& pg) { return pg.options().block_size; })
      .def_property_readonly("fp8_format",
                             [](ProcessGroupFP8& pg) {
                               return pg.options().format == fp8comm::Fp8Format::E4M3 ? "e4m3" : "e5m2";
                             })
      .def_property_readonly("min_numel", [](ProcessGroupFP8& pg) { return pg.options().min_numel; })
      .def_property_readonly("compressed_ops", [](ProcessGroupFP8& pg) {
        std::vector<std::string> ops;
        if (pg.options().compress_allreduce) ops.push_back("all_reduce");
        if (pg.options().compress_reduce_scatter) ops.push_back("reduce_scatter");
        if (pg.options().compress_allgather) ops.push_back("all_gather");
        return ops;
      });

  // ---- for tests (fp8comm.testing): NCCL's contracts on CPU processes
  py::class_<fp8comm::NcclLikeBackend, c10d::Backend, c10::intrusive_ptr<fp8comm::NcclLikeBackend>>(
      m, "NcclLikeBackend", "ProcessGroupGloo behaving as ProcessGroupNCCL does (csrc/testing/nccl_like_backend.h).")
      .def(py::init([](const c10::intrusive_ptr<c10d::Backend>& gloo) {
             return c10::make_intrusive<fp8comm::NcclLikeBackend>(gloo);
           }),
           py::arg("gloo"));
  m.def(
      "_work_over",
      [](const std::string& op, const std::vector<c10::intrusive_ptr<c10d::Work>>& inner) {
        return c10::intrusive_ptr<c10d::Work>(
            c10::make_intrusive<fp8comm::FP8Work>(-1, c10d::OpType::UNKNOWN, op, std::vector<at::Tensor>{}, inner));
      },
      py::arg("op"), py::arg("inner"),
      "The Work of a compressed CPU call whose phases are `inner` (tests of its error and timeout reporting).");

  m.def(
      "attach_or_create",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, const std::string& group_id,
         const std::string& device, const c10::intrusive_ptr<c10d::Backend>& inner, int block_size,
         const std::string& fp8_format, int64_t min_numel, bool compress_allreduce, bool compress_reduce_scatter,
         bool compress_allgather) {
        FP8Options options;
        options.block_size = block_size;
        TORCH_CHECK(fp8_format == "e4m3" || fp8_format == "e5m2", "fp8comm: fp8 format must be e4m3 or e5m2");
        options.format = fp8_format == "e4m3" ? fp8comm::Fp8Format::E4M3 : fp8comm::Fp8Format::E5M2;
        options.min_numel = min_numel;
        options.compress_allreduce = compress_allreduce;
        options.compress_reduce_scatter = compress_reduce_scatter;
        options.compress_allgather = compress_allgather;
        return fp8comm::attach_or_create(store, rank, size, group_id, device_type_of(device), inner, options);
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("group_id"), py::arg("device"), py::arg("inner"),
      py::arg("block_size"), py::arg("fp8_format"), py::arg("min_numel"), py::arg("compress_allreduce"),
      py::arg("compress_reduce_scatter"), py::arg("compress_allgather"),
      "The ProcessGroupFP8 of this group creation, with `inner` as its transport for `device`.");
}
