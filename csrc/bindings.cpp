// fp8comm._C: the Python face of the C++ parts. Importing it also registers the
// torch.library operators (csrc/codec/codec_ops.cpp). torch.distributed must be
// imported first: ProcessGroupFp8 derives from its c10d::Backend binding.
#include <torch/csrc/utils/pybind.h>
#include <pybind11/chrono.h>  // timeouts as datetime.timedelta
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>

#include "backend/exact_scope.h"
#include "backend/fp8_work.h"
#include "backend/held_works.h"
#include "backend/option_variables.h"
#include "backend/registry.h"
#include "backend/split.h"
#include "bindings_options.h"
#include "common/env.h"
#include "codec/codec.h"
#include "codec/codec_tensor.h"
#include "codec/cpu_threads.h"
#include "linear/cast.h"
#include "testing/ncclsim_transport.h"

namespace {

const fp8comm::EnvVar& env_var(const std::string& name) {
  for (const auto* v : fp8comm::env::kAll) {
    if (name == v->name) return *v;
  }
  throw std::invalid_argument("fp8comm: " + name + " is not an FP8COMM_* variable fp8comm declares (csrc/common/env.h)");
}

c10::DeviceType device_type_of(const std::string& device) {
  if (device == "cpu") return c10::DeviceType::CPU;
  if (device == "cuda") return c10::DeviceType::CUDA;
  TORCH_CHECK(false, "fp8comm: transports exist for \"cpu\" and \"cuda\", got \"", device, "\"");
}

// A group's counters as fp8comm.get_stats reads them (fp8comm/stats.py).
py::dict stats_dict(const fp8comm::StatsSnapshot& s) {
  auto bytes = [](py::dict& d, const fp8comm::NodeBytes& sent, int64_t uncompressed) {
    d["bytes_sent"] = sent.intra_node + sent.inter_node;
    d["bytes_sent_intra_node"] = sent.intra_node;
    d["bytes_sent_inter_node"] = sent.inter_node;
    d["bytes_sent_uncompressed"] = uncompressed;
  };
  py::dict out;
  bytes(out, s.bytes_sent, s.bytes_sent_uncompressed);
  out["calls_compressed"] = s.calls_compressed;
  out["calls_passthrough"] = s.calls_passthrough;
  py::dict per_op;
  for (const auto& [op, o] : s.per_op) {
    py::dict entry;
    entry["compressed"] = o.compressed;
    entry["passthrough"] = o.passthrough;
    bytes(entry, o.bytes_sent, o.bytes_sent_uncompressed);
    py::dict reasons;
    for (const auto& [why, n] : o.passthrough_reasons) reasons[fp8comm::passthrough_name(why)] = n;
    entry["passthrough_reasons"] = reasons;
    per_op[py::str(op)] = entry;
  }
  out["per_op"] = per_op;
  return out;
}

std::optional<std::chrono::milliseconds> timeout_option(const std::optional<std::chrono::milliseconds>& t) {
  TORCH_CHECK_VALUE(!t || t->count() > 0, "fp8comm.uncompressed: timeout must be positive, got ", t->count(), " ms");
  return t;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using fp8comm::Options;
  using fp8comm::ProcessGroupFp8;
  m.doc() = "fp8comm C++ extension: FP8 block codec and the fp8nccl / fp8gloo backend";
#ifdef FP8COMM_WITH_CUDA
  m.attr("has_cuda") = true;
#else
  m.attr("has_cuda") = false;
#endif
  m.def(
      "segment_bytes",
      [](int64_t segment_numel, int64_t block_size, const std::string& wire_format) {
        return fp8comm::segment_bytes(segment_numel, block_size,
                                      fp8comm::wire_format_of(wire_format, "fp8comm.segment_bytes"));
      },
      py::arg("segment_numel"), py::arg("block_size"), py::arg("wire_format") = "e4m3",
      "Bytes of one wire segment [scales][codes] holding segment_numel elements.");

  m.def(
      "wire_format_name",
      [](const std::string& name, const std::string& what) {
        return std::string(fp8comm::wire_format_name(fp8comm::wire_format_of(name, what.c_str())));
      },
      py::arg("name"), py::arg("what"),
      "The wire format `name` names, as its table spells it (\"MXFP4\" -> \"mxfp4\"); ValueError naming `what` "
      "when it names none.");

  m.def(
      "wire_formats",
      [] {
        std::vector<py::tuple> rows;
        for (const auto& row : fp8comm::kWireFormatTable) {
          const auto [bits, max] = fp8comm::dispatch_wire_format(row.format, [](auto c) {
            using T = fp8comm::WireTraits<decltype(c)::value>;
            return std::pair<int, float>(T::kCodeBits, T::kMax);
          });
          auto dtype = [](c10::ScalarType t) {
            return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(t)));
          };
          rows.push_back(py::make_tuple(fp8comm::wire_format_name(row.format), dtype(row.codes_type), bits, max,
                                        dtype(row.scales_type), fp8comm::required_block_size(row.format),
                                        fp8comm::segment_scale_bytes(row.format)));
        }
        return rows;
      },
      "(name, torch dtype of its codes, bits per code, largest finite value, torch dtype of its block scales, "
      "the block size it requires (0: any), bytes of its segment scale) of every wire format "
      "(csrc/codec/fp8_block_math.h, fp8_dtype_table.h).");

  m.def(
      "fp8_dtypes",
      [] {
        std::vector<std::tuple<std::string, py::object, float>> rows;
        for (const auto& row : fp8comm::kFp8DtypeTable) {
          const float max = fp8comm::dispatch_fp8_dtype(
              row.fp8_dtype, [](auto c) { return fp8comm::Fp8Traits<decltype(c)::value>::kMax; });
          auto dtype =
              py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(row.scalar_type)));
          rows.emplace_back(fp8comm::fp8_dtype_name(row.fp8_dtype), dtype, max);
        }
        return rows;
      },
      "(name, torch dtype, largest finite value) of every FP8 dtype fp8comm knows (csrc/codec/fp8_dtype_table.h).");

  m.def("enter_exact_scope", &fp8comm::exact_scope::enter,
        "Opens an exact scope on this thread: its calls on every fp8 group pass through (csrc/backend/exact_scope.h).");
  m.def("leave_exact_scope", &fp8comm::exact_scope::leave, "Closes this thread's innermost exact scope.");
  m.def("exact_scope_depth", [] { return fp8comm::exact_scope::depth; }, "This thread's open exact scopes.");
  m.def("held_inner_works", &fp8comm::held_inner_works,
        "Inner Works of CPU transports fp8comm holds until no one else does (csrc/backend/held_works.h).");
  m.def("release_unshared_inner_works", &fp8comm::release_unshared_inner_works,
        py::call_guard<py::gil_scoped_release>(),
        "Lets go of the held inner Works no one else holds (csrc/backend/held_works.h).");
  m.def("cpu_threads", &fp8comm::cpu_threads, "Threads one CPU codec call may use (csrc/codec/cpu_threads.h).");
  m.def("set_cpu_threads", &fp8comm::set_cpu_threads, py::arg("n"),
        "Sets the CPU codec's threads per process (n >= 1); returns the previous count.");
  m.def("available_cores", &fp8comm::available_cores, "The cores this process may run on (its CPU affinity).");
  m.def("cpu_simd_enabled", &fp8comm::cpu_simd_enabled,
        "Whether the CPU codec runs whole blocks through its AVX2 kernels.");
  m.def("set_cpu_simd", &fp8comm::set_cpu_simd, py::arg("enabled"),
        "Switch the CPU codec's AVX2 kernels on or off (same bytes either way); returns the old setting.");
  m.def("cpu_avx512_enabled", &fp8comm::cpu_avx512_enabled,
        "Whether the CPU codec's quantize and sum + re-quantize take AVX-512 kernels (block size 32) while its "
        "SIMD kernels are on (cpu_simd_enabled).");
  m.def("set_cpu_avx512", &fp8comm::set_cpu_avx512, py::arg("enabled"),
        "Switch the CPU codec's AVX-512 kernels on or off (same bytes either way); returns the old setting.");

  m.def(
      "environment_variables",
      [] {
        std::vector<std::tuple<std::string, std::string, std::string>> vars;
        for (const auto* v : fp8comm::env::kAll) vars.emplace_back(v->name, v->fallback, fp8comm::variable_doc(*v));
        return vars;
      },
      "(name, value when unset, what it sets) of every FP8COMM_* variable fp8comm reads (csrc/common/env.h).");
  m.def(
      "cuda_codec", [] { return fp8comm::tiled_cuda_codec() ? "tiled" : "legacy"; },
      "The CUDA codec's kernel set, as FP8COMM_CUDA_CODEC names it now: 'legacy' (codec_cuda.cu) or 'tiled' "
      "(codec_cuda_tiled.cu); ValueError for another value.");
  m.def(
      "cuda_cast", [] { return fp8comm::cast::tiled_cuda_cast() ? "tiled" : "legacy"; },
      "Fp8Linear's CUDA cast kernel set, as FP8COMM_CUDA_CAST names it now: 'legacy' (cast_cuda.cu) or 'tiled' "
      "(cast_cuda_tiled.cu); ValueError for another value.");
  m.def(
      "env_flag", [](const std::string& name) { return env_var(name).as_flag(); }, py::arg("name"),
      "An FP8COMM_* switch as csrc/common/env.h reads it: its value, else its default, 0 or 1 "
      "(ValueError otherwise).");
  m.def(
      "env_positive_int", [](const std::string& name) { return env_var(name).as_positive_int(); }, py::arg("name"),
      "An FP8COMM_* count as csrc/common/env.h reads it: None when unset, else an integer >= 1 "
      "(ValueError otherwise).");
  m.def(
      "compressed_algorithms",
      [] {
        std::vector<std::tuple<std::string, std::vector<int>, bool>> rows;
        for (const auto* a : fp8comm::compressed::kAll) {
          std::vector<int> phases;
          for (size_t i = 0; i < a->num_phases; ++i) phases.push_back(static_cast<int>(a->phases[i].wire));
          rows.emplace_back(a->name, phases, a->in_all);
        }
        return rows;
      },
      "(name, segment-header phases, whether compress='all' names it) of every compressed algorithm, in the "
      "order Options.compress lists them (csrc/algorithms/compressed_algorithms.h).");

  m.def(
      "passthrough_reasons",
      [] {
        std::vector<std::string> names;
        for (int i = static_cast<int>(fp8comm::Passthrough::kCompressed) + 1;
             i <= static_cast<int>(fp8comm::Passthrough::kBelowMinNumel); ++i) {
          names.push_back(fp8comm::passthrough_name(static_cast<fp8comm::Passthrough>(i)));
        }
        return names;
      },
      "Every reason a call may pass through exactly, as get_stats' passthrough_reasons names it, in the order "
      "they are checked (csrc/backend/passthrough.h).");

  fp8comm::bind_options(m);

  py::class_<ProcessGroupFp8, c10d::Backend, c10::intrusive_ptr<ProcessGroupFp8>> pg_class(m, "ProcessGroupFp8");
  pg_class
      .def(
          "stats", [](ProcessGroupFp8& pg) { return stats_dict(pg.stats().snapshot()); },
          "The group's counters: totals and per_op {op: counts, bytes and passthrough_reasons} "
          "(csrc/backend/stats.h; fp8comm.get_stats).")
      .def("reset_stats", [](ProcessGroupFp8& pg) { pg.stats().reset(); })
      .def("set_topology", &ProcessGroupFp8::set_topology, py::arg("nodes"), py::arg("ranks_on_my_node"),
           py::arg("local_size"), py::arg("group_ranks"),
           "Where the group's ranks live (fp8comm/topology.py); group_ranks[b * local_size + l] is the rank of "
           "node b with local index l, or empty when nodes differ in size.")
      .def(
          "add_node_transports",
          [](ProcessGroupFp8& pg, const std::string& device, const c10::intrusive_ptr<c10d::Backend>& intra,
             const c10::intrusive_ptr<c10d::Backend>& inter) {
            pg.add_node_transports(device_type_of(device), intra, inter);
          },
          py::arg("device"), py::arg("intra"), py::arg("inter"),
          "The inter_node scope's inner backends for `device`: among this node's ranks, and among the ranks "
          "that share this rank's local index.")
      .def(
          "quantization_errors",
          [](ProcessGroupFp8& pg) {
            std::map<std::string, std::tuple<double, double, int64_t>> out;
            for (const auto& [op, e] : pg.stats().errors()) out[op] = {e.signal_energy, e.noise_energy, e.values};
            return out;
          },
          "{op: (signal energy, noise energy, values)} measured since the last reset (Options.track_error).")
      .def("enter_uncompressed",
           [](ProcessGroupFp8& pg, std::optional<std::chrono::milliseconds> timeout) {
             pg.enter_uncompressed(timeout_option(timeout));
           },
           py::arg("timeout") = py::none(), py::call_guard<py::gil_scoped_release>(),
           "Opens an uncompressed block once every rank has (collective; fp8comm.uncompressed).")
      .def("leave_uncompressed",
           [](ProcessGroupFp8& pg, bool together, std::optional<std::chrono::milliseconds> timeout) {
             pg.leave_uncompressed(together, timeout_option(timeout));
           },
           py::arg("together"), py::arg("timeout") = py::none(), py::call_guard<py::gil_scoped_release>(),
           "Closes the innermost uncompressed block; with together, waits for every rank to close it.")
      .def_property_readonly("uncompressed_depth", &ProcessGroupFp8::uncompressed_depth,
                             "How many uncompressed blocks are open on this group (0: calls may be compressed).")
      .def("_allreduce_keeping_residual", &ProcessGroupFp8::allreduce_keeping_residual, py::arg("tensor"),
           py::arg("opts"), py::arg("residual"), py::call_guard<py::gil_scoped_release>(),
           "allreduce of one tensor that keeps in `residual` what the wire dropped of each element (error "
           "feedback: fp8comm.functional.all_reduce's residual=).")
      .def("_reduce_scatter_keeping_residual", &ProcessGroupFp8::reduce_scatter_keeping_residual, py::arg("output"),
           py::arg("input"), py::arg("opts"), py::arg("residual"), py::call_guard<py::gil_scoped_release>(),
           "_reduce_scatter_base that keeps in `residual` what the wire dropped of each input element (error "
           "feedback: fp8comm.functional.reduce_scatter_tensor's residual=).")
      .def(
          "transport",
          [](ProcessGroupFp8& pg, const std::string& device) { return pg.transport(device_type_of(device)); },
          py::arg("device"), "The inner backend for tensors on `device` (None if there is none).")
      .def(
          "node_transports",
          [](ProcessGroupFp8& pg, const std::string& device) -> py::object {
            auto nodes = pg.node_inner(device_type_of(device));
            if (!nodes) return py::none();
            return py::make_tuple(nodes->intra, nodes->inter);
          },
          py::arg("device"),
          "The inter_node scope's inner backends for tensors on `device`: (among this node's ranks, among the "
          "ranks with this rank's local index), or None where the group has none.")
      .def(
          "transport_identity",
          [](ProcessGroupFp8& pg, const std::string& device) {
            auto inner = pg.transport(device_type_of(device));
            TORCH_CHECK(inner, "fp8comm: no transport for ", device);
            return std::make_pair(inner->getGroupUid(), inner->getGroupDesc());
          },
          py::arg("device"), "(group name, group description) as the inner backend knows them.")
      .def(
          "wire_segment_bytes",
          [](ProcessGroupFp8& pg, int64_t segment_numel, const std::string& device) {
            return pg.wire_layout(device_type_of(device)).segment_bytes(segment_numel);
          },
          py::arg("segment_numel"), py::arg("device"),
          "Bytes this group sends for one segment of segment_numel elements over its transport for `device`.")
      .def(
          "transport_traits",
          [](ProcessGroupFp8& pg, const std::string& device) {
            const fp8comm::TransportTraits t = pg.traits_for(device_type_of(device));
            return py::dict(py::arg("segment_headers") = t.segment_headers,
                            py::arg("gather_by_all_to_all") = t.gather_by_all_to_all,
                            py::arg("reduces_avg_and_premul") = t.reduces_avg_and_premul,
                            py::arg("chunk_numel") = t.chunk_numel);
          },
          py::arg("device"), "What the algorithms know of the transport for `device` (transport_traits.h).")
      .def_property_readonly("options", [](ProcessGroupFp8& pg) { return pg.getBackendOptions(); },
                             "The group's resolved fp8comm.Options.")
      // The deprecated and the older spellings of two resolved knobs.
      .def_property_readonly("fp8_dtype",
                             [](ProcessGroupFp8& pg) { return fp8comm::knob_value(pg.options(), "wire_format"); },
                             "Deprecated: wire_format.")
      .def_property_readonly("compressed_ops", [](ProcessGroupFp8& pg) { return *pg.options().compress; });
  // Every knob of the group's resolved options, as the group uses it.
  for (const auto& name : fp8comm::knob_names()) {
    pg_class.def_property_readonly(name.c_str(),
                                   [name](ProcessGroupFp8& pg) { return fp8comm::knob_value(pg.options(), name); });
  }

  // ---- for tests (fp8comm._testing): the fp8ncclsim transport, NCCL's contracts on CPU processes
  py::class_<fp8comm::NcclSimTransport, c10d::Backend, c10::intrusive_ptr<fp8comm::NcclSimTransport>>(
      m, "_NcclSimTransport",
      "The fp8ncclsim transport: ProcessGroupGloo behaving as ProcessGroupNCCL does (csrc/testing/ncclsim_transport.h).")
      .def(py::init([](const c10::intrusive_ptr<c10d::Backend>& gloo) {
             return c10::make_intrusive<fp8comm::NcclSimTransport>(gloo);
           }),
           py::arg("gloo"))
      .def("barrier_device_ids", &fp8comm::NcclSimTransport::barrier_device_ids,
           "The device_ids of the last barrier this transport was given.")
      .def("aborts", &fp8comm::NcclSimTransport::aborts, "How often abort() was called on this transport.")
      .def("shutdowns", &fp8comm::NcclSimTransport::shutdowns, "How often shutdown() was called on this transport.");
  m.def(
      "_work_over",
      [](const std::string& op, const std::vector<c10::intrusive_ptr<c10d::Work>>& inner) {
        return c10::intrusive_ptr<c10d::Work>(
            c10::make_intrusive<fp8comm::Fp8Work>(-1, c10d::OpType::UNKNOWN, op, std::vector<at::Tensor>{}, inner));
      },
      py::arg("op"), py::arg("inner"),
      "The Work of a compressed CPU call whose phases are `inner` (tests of its error and timeout reporting).");

  m.def(
      "split_transport",
      [](const c10::intrusive_ptr<c10d::Backend>& inner, const c10::intrusive_ptr<c10d::Store>& store,
         const std::vector<int>& ranks, const c10::intrusive_ptr<c10d::Backend::Options>& options) {
        return inner->split(store, ranks, options);
      },
      py::arg("inner"), py::arg("store"), py::arg("ranks"), py::arg("options"),
      py::call_guard<py::gil_scoped_release>(),
      "c10d::Backend::split of an inner transport: the new backend, or None on a rank outside `ranks`.");
  m.def(
      "transport_options",
      [](const c10::intrusive_ptr<c10d::Backend>& inner) { return inner->getBackendOptions(); },
      py::arg("inner"), "An inner transport's own options (ProcessGroupGloo / ProcessGroupNCCL Options).");
  m.def(
      "_set_splitter",
      [](py::function fn) {
        // Kept for the life of the process: torch may split groups until exit.
        auto* keep = new py::function(std::move(fn));
        fp8comm::set_splitter([keep](const c10::intrusive_ptr<ProcessGroupFp8>& parent,
                                     const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                     const c10::intrusive_ptr<c10d::Backend::Options>& options) {
          py::gil_scoped_acquire gil;
          std::string error;
          bool value_error = false;
          try {
            py::object group = (*keep)(parent, store, ranks, options);
            if (group.is_none()) return c10::intrusive_ptr<c10d::Backend>();
            return group.cast<c10::intrusive_ptr<c10d::Backend>>();
          } catch (py::error_already_set& e) {
            value_error = e.matches(PyExc_ValueError);
            error = value_error ? py::str(e.value()).cast<std::string>()
                                : py::str(e.type().attr("__name__")).cast<std::string>() + ": " +
                                      py::str(e.value()).cast<std::string>();
          }
          // Raised as torch raises, so that Python sees a ValueError as one.
          TORCH_CHECK_VALUE(!value_error, error);
          TORCH_CHECK(false, error);
        });
      },
      py::arg("fn"), "Sets what ProcessGroupFp8.split runs: fn(parent, store, ranks, options) (split.h).");
  m.def(
      "attach_or_create",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, const std::string& group_id,
         const std::string& device, const c10::intrusive_ptr<c10d::Backend>& inner,
         const c10::intrusive_ptr<Options>& options) {
        return fp8comm::attach_or_create(store, rank, size, group_id, device_type_of(device), inner, options);
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("group_id"), py::arg("device"), py::arg("inner"),
      py::arg("options"),
      "The ProcessGroupFp8 of this group creation, with `inner` as its transport for `device`.");
}
