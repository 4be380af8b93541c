// fp8comm._C: the Python face of the C++ parts. Importing it also registers the
// torch.library operators (csrc/codec/codec_ops.cpp). torch.distributed must be
// imported first: ProcessGroupFp8 derives from its c10d::Backend binding.
#include <torch/csrc/utils/pybind.h>
#include <pybind11/chrono.h>  // timeouts as datetime.timedelta
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>

#include "backend/fp8_work.h"
#include "backend/options.h"
#include "backend/registry.h"
#include "backend/split.h"
#include "common/env.h"
#include "codec/codec.h"
#include "codec/cpu_threads.h"
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

// wire_format as given: a name ("mxfp4").
std::optional<fp8comm::WireFormat> wire_format_option(const py::object& v) {
  if (v.is_none()) return std::nullopt;
  std::optional<fp8comm::WireFormat> found;
  if (py::isinstance<py::str>(v)) found = fp8comm::find_wire_format(v.cast<std::string>());
  TORCH_CHECK_VALUE(found, "fp8comm.Options: wire_format must be ", fp8comm::wire_format_choices(), ", got ",
                    py::repr(v).cast<std::string>());
  return found;
}

// The deprecated fp8_dtype as given: a name ("e4m3") or a torch dtype
// (torch.float8_e4m3fn); a DeprecationWarning points to wire_format.
std::optional<fp8comm::WireFormat> fp8_dtype_option(const py::object& v) {
  if (v.is_none()) return std::nullopt;
  std::optional<fp8comm::Fp8Dtype> found;
  if (THPDtype_Check(v.ptr())) {
    found = fp8comm::find_fp8_dtype(reinterpret_cast<THPDtype*>(v.ptr())->scalar_type);
  } else if (py::isinstance<py::str>(v)) {
    found = fp8comm::find_fp8_dtype(v.cast<std::string>());
  }
  TORCH_CHECK_VALUE(found, "fp8comm.Options: fp8_dtype must be ", fp8comm::fp8_dtype_choices(true), ", got ",
                    py::repr(v).cast<std::string>(), " (fp8_dtype is deprecated: use wire_format)");
  const std::string name = fp8comm::fp8_dtype_name(*found);
  const std::string msg = "fp8comm.Options(fp8_dtype=...) is deprecated; use wire_format='" + name + "'";
  if (PyErr_WarnEx(PyExc_DeprecationWarning, msg.c_str(), 1) != 0) throw py::error_already_set();
  return fp8comm::find_wire_format(name);
}

// node_wire_format as given: "exact" or a wire format's name.
std::optional<std::string> node_wire_format_option(const py::object& v) {
  if (v.is_none()) return std::nullopt;
  TORCH_CHECK_VALUE(py::isinstance<py::str>(v), "fp8comm.Options: node_wire_format must be 'exact' or ",
                    fp8comm::wire_format_choices(), ", got ", py::repr(v).cast<std::string>());
  const std::string name = v.cast<std::string>();
  fp8comm::check_node_wire_format(name, "");
  return name;
}

std::optional<std::string> wire_format_name(const std::optional<fp8comm::WireFormat>& f) {
  if (!f) return std::nullopt;
  return std::string(fp8comm::wire_format_name(*f));
}

std::optional<bool> bool_option(const py::object& v, const char* name) {
  if (v.is_none()) return std::nullopt;
  TORCH_CHECK_VALUE(py::isinstance<py::bool_>(v), "fp8comm.Options: ", name, " must be True or False, got ",
                    py::repr(v).cast<std::string>());
  return v.cast<bool>();
}

std::optional<std::chrono::milliseconds> timeout_option(const std::optional<std::chrono::milliseconds>& t) {
  TORCH_CHECK_VALUE(!t || t->count() > 0, "fp8comm.uncompressed: timeout must be positive, got ", t->count(), " ms");
  return t;
}

std::optional<int64_t> int_option(const py::object& v, const char* name, const char* rule) {
  if (v.is_none()) return std::nullopt;
  TORCH_CHECK_VALUE(py::isinstance<py::int_>(v) && !py::isinstance<py::bool_>(v), "fp8comm.Options: ", name,
                    " must be ", rule, ", got ", py::repr(v).cast<std::string>());
  return v.cast<int64_t>();
}

// scope as given: "all" or "inter_node".
std::optional<fp8comm::Scope> scope_option(const py::object& v) {
  if (v.is_none()) return std::nullopt;
  std::optional<fp8comm::Scope> found;
  if (py::isinstance<py::str>(v)) found = fp8comm::find_scope(v.cast<std::string>());
  TORCH_CHECK_VALUE(found, "fp8comm.Options: scope must be 'all' or 'inter_node', got ",
                    py::repr(v).cast<std::string>());
  return found;
}

// rounding as given: "nearest" or "stochastic".
std::optional<fp8comm::Rounding> rounding_option(const py::object& v) {
  if (v.is_none()) return std::nullopt;
  fp8comm::Rounding found;
  TORCH_CHECK_VALUE(py::isinstance<py::str>(v) && fp8comm::find_rounding(v.cast<std::string>(), found),
                    "fp8comm.Options: rounding must be 'nearest' or 'stochastic', got ", py::repr(v).cast<std::string>());
  return found;
}

py::object rounding_value(const std::optional<fp8comm::Rounding>& r) {
  return r ? py::object(py::str(fp8comm::rounding_name(*r))) : py::object(py::none());
}

// compress as given: a comma-separated string or an iterable of op names.
std::optional<std::vector<std::string>> compress_items(const py::object& v) {
  if (v.is_none()) return std::nullopt;
  std::vector<std::string> items;
  if (py::isinstance<py::str>(v)) return fp8comm::split_commas(v.cast<std::string>());
  for (const auto& item : v) items.push_back(py::str(item).cast<std::string>());
  return items;
}

// The Options doc string; the ops `compress` takes and its default are the
// compressed algorithms table's and env.h's.
const char* options_doc() {
  static const std::string ops = [] {
    std::string list;
    for (const auto& name : fp8comm::compressed::names()) list += (list.empty() ? "" : ", ") + name;
    return list;
  }();
  static const std::string doc = std::string(R"(
Options of one fp8nccl / fp8gloo process group; pass as ``pg_options`` to
``init_process_group`` or ``new_group``. A field left as None takes its
FP8COMM_* environment variable when the group is created, then the default.

block_size: elements per FP8 block, )" FP8C_BLOCK_SIZE_RULE R"( (FP8COMM_BLOCK_SIZE, 32).
wire_format: the element format of every compressed hop: "e4m3" or "e5m2" (8-bit FP8
    codes) or "mxfp4" (OCP MX FP4: 4-bit E2M1 codes, two per byte; use block_size=32
    for the MX format's blocks) (FP8COMM_WIRE_FORMAT, e4m3). In the "inter_node" scope
    it is the hop between nodes; inside a node, node_wire_format.
fp8_dtype: deprecated spelling of wire_format for the FP8 formats ("e4m3" /
    torch.float8_e4m3fn, "e5m2" / torch.float8_e5m2).
min_numel: per-rank element count below which a collective passes through exactly
    (FP8COMM_MIN_NUMEL, 16384: scalars such as the loss or a grad norm stay exact).
)") +
                                 "compress: which of " + ops + " are compressed: a list, or a\n"
                                 "    comma-separated string; \"all\" or \"none\" (FP8COMM_COMPRESS, " +
                                 fp8comm::env::kCompress.fallback + ")." + R"(
cpu_threads: threads per process for the CPU codec (FP8COMM_CPU_THREADS; unset: the
    process's share of its host's cores). Per process: ranks may differ.
scope: "all" compresses every link; "inter_node" only the hop between nodes, exact
    inside a node (FP8COMM_SCOPE, all).
node_wire_format: the inter_node scope's phases inside a node: "exact", or compressed in
    "e4m3", "e5m2" or "mxfp4" where the link inside a node costs more than the codec
    (FP8COMM_NODE_WIRE_FORMAT, exact). Any other value needs scope="inter_node".
rounding: "nearest" (even) or "stochastic": every quantization of a compressed collective
    rounds each element up or down at random, unbiased (FP8COMM_ROUNDING, nearest).
rounding_seed: the integer seed of stochastic rounding's random bits; with the call
    counter, rank, chunk and segment it keys them, so runs are reproducible
    (FP8COMM_ROUNDING_SEED, 0).
track_error: True measures the quantization error of every compressed call on this rank;
    fp8comm.get_stats then reports SQNR per op (FP8COMM_TRACK_ERROR, 0). Per process:
    ranks may differ. CPU groups (fp8gloo) only: a CUDA group refuses it at creation.)";
  return doc.c_str();
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
        for (const auto* v : fp8comm::env::kAll) vars.emplace_back(v->name, v->fallback, v->doc);
        return vars;
      },
      "(name, value when unset, what it sets) of every FP8COMM_* variable fp8comm reads (csrc/common/env.h).");
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
        std::vector<std::pair<std::string, std::vector<int>>> rows;
        for (const auto* a : fp8comm::compressed::kAll) {
          std::vector<int> phases;
          for (size_t i = 0; i < a->num_phases; ++i) phases.push_back(static_cast<int>(a->phases[i].wire));
          rows.emplace_back(a->name, phases);
        }
        return rows;
      },
      "(name, segment-header phases) of every compressed algorithm, in the order Options.compress lists them "
      "(csrc/algorithms/compressed_algorithms.h).");

  py::class_<Options, c10d::Backend::Options, c10::intrusive_ptr<Options>>(m, "Options", options_doc())
      .def(py::init([](const py::object& block_size, const py::object& fp8_dtype, const py::object& min_numel,
                       const py::object& compress, const py::object& cpu_threads, const py::object& scope,
                       const py::object& track_error, const py::object& rounding, const py::object& rounding_seed,
                       const py::object& wire_format, const py::object& node_wire_format) {
             auto o = c10::make_intrusive<Options>();
             o->block_size = int_option(block_size, "block_size", FP8C_BLOCK_SIZE_RULE);
             o->wire_format = wire_format_option(wire_format);
             const auto old = fp8_dtype_option(fp8_dtype);
             TORCH_CHECK_VALUE(!old || !o->wire_format || *old == *o->wire_format, "fp8comm.Options: fp8_dtype=",
                               py::repr(fp8_dtype).cast<std::string>(), " and wire_format=",
                               py::repr(wire_format).cast<std::string>(),
                               " disagree; give wire_format alone (fp8_dtype is its deprecated spelling)");
             if (old) o->wire_format = old;
             o->min_numel = int_option(min_numel, "min_numel", "an int >= 0");
             o->compress = compress_items(compress);
             o->cpu_threads = int_option(cpu_threads, "cpu_threads", "an int >= 1");
             o->scope = scope_option(scope);
             o->track_error = bool_option(track_error, "track_error");
             o->rounding = rounding_option(rounding);
             o->rounding_seed = int_option(rounding_seed, "rounding_seed", "an int");
             o->node_wire_format = node_wire_format_option(node_wire_format);
             return o;
           }),
           py::arg("block_size") = py::none(), py::arg("fp8_dtype") = py::none(), py::arg("min_numel") = py::none(),
           py::arg("compress") = py::none(), py::arg("cpu_threads") = py::none(), py::arg("scope") = py::none(),
           py::arg("track_error") = py::none(), py::arg("rounding") = py::none(),
           py::arg("rounding_seed") = py::none(), py::arg("wire_format") = py::none(),
           py::arg("node_wire_format") = py::none())
      .def_property_readonly("block_size", [](const Options& o) { return o.block_size; })
      .def_property_readonly("wire_format", [](const Options& o) { return wire_format_name(o.wire_format); })
      .def_property_readonly("fp8_dtype", [](const Options& o) { return wire_format_name(o.wire_format); },
                             "Deprecated: wire_format.")
      .def_property_readonly("min_numel", [](const Options& o) { return o.min_numel; })
      .def_property_readonly("cpu_threads", [](const Options& o) { return o.cpu_threads; })
      .def_property_readonly("scope",
                             [](const Options& o) -> py::object {
                               if (!o.scope) return py::none();
                               return py::str(fp8comm::scope_name(*o.scope));
                             })
      .def_property_readonly("node_wire_format", [](const Options& o) { return o.node_wire_format; })
      .def_property_readonly("track_error", [](const Options& o) { return o.track_error; })
      .def_property_readonly("rounding", [](const Options& o) { return rounding_value(o.rounding); })
      .def_property_readonly("rounding_seed", [](const Options& o) { return o.rounding_seed; })
      .def_property_readonly("compress",
                             [](const Options& o) -> py::object {
                               if (!o.compress) return py::none();
                               return py::tuple(py::cast(*o.compress));
                             })
      .def("resolved", &Options::resolved,
           "A copy with every field set from the environment where unset, and checked (ValueError otherwise).")
      .def("fingerprint", &Options::fingerprint,
           "Of resolved options: what every rank of a group must agree on, by name.")
      .def("__repr__", [](const Options& o) {
        auto show = [](const auto& v) { return v ? py::repr(py::cast(*v)).template cast<std::string>() : std::string("None"); };
        return "fp8comm.Options(block_size=" + show(o.block_size) + ", wire_format=" + show(wire_format_name(o.wire_format)) +
               ", min_numel=" + show(o.min_numel) + ", compress=" + show(o.compress) +
               ", cpu_threads=" + show(o.cpu_threads) +
               ", scope=" + (o.scope ? "'" + std::string(fp8comm::scope_name(*o.scope)) + "'" : std::string("None")) +
               ", node_wire_format=" + show(o.node_wire_format) +
               ", track_error=" + show(o.track_error) +
               ", rounding=" + py::repr(rounding_value(o.rounding)).cast<std::string>() +
               ", rounding_seed=" + show(o.rounding_seed) + ")";
      })
      .def(py::pickle(
          [](const Options& o) {  // copy.deepcopy(parent.options) when torch splits a group
            return py::make_tuple(o.block_size, wire_format_name(o.wire_format), o.min_numel, o.compress, o.timeout.count(),
                                  o.group_name, o.global_ranks_in_group, o.cpu_threads,
                                  o.scope ? py::object(py::str(fp8comm::scope_name(*o.scope))) : py::object(py::none()),
                                  o.track_error, rounding_value(o.rounding), o.rounding_seed, o.node_wire_format);
          },
          [](const py::tuple& t) {
            TORCH_CHECK_VALUE(t.size() == 13, "fp8comm.Options: cannot unpickle a state of ", t.size(), " fields");
            auto o = c10::make_intrusive<Options>();
            o->block_size = t[0].cast<std::optional<int64_t>>();
            o->wire_format = wire_format_option(t[1]);
            o->min_numel = t[2].cast<std::optional<int64_t>>();
            o->compress = t[3].cast<std::optional<std::vector<std::string>>>();
            o->timeout = std::chrono::milliseconds(t[4].cast<int64_t>());
            o->group_name = t[5].cast<std::string>();
            o->global_ranks_in_group = t[6].cast<std::vector<uint64_t>>();
            o->cpu_threads = t[7].cast<std::optional<int64_t>>();
            o->scope = scope_option(t[8]);
            o->track_error = t[9].cast<std::optional<bool>>();
            o->rounding = rounding_option(t[10]);
            o->rounding_seed = t[11].cast<std::optional<int64_t>>();
            o->node_wire_format = node_wire_format_option(t[12]);
            return o;
          }))
      .def("__eq__", [](const Options& a, const Options& b) {
        return a.block_size == b.block_size && a.wire_format == b.wire_format && a.min_numel == b.min_numel &&
               a.compress == b.compress && a.cpu_threads == b.cpu_threads && a.scope == b.scope &&
               a.track_error == b.track_error && a.rounding == b.rounding && a.rounding_seed == b.rounding_seed &&
               a.node_wire_format == b.node_wire_format;
      });

  py::class_<ProcessGroupFp8, c10d::Backend, c10::intrusive_ptr<ProcessGroupFp8>>(m, "ProcessGroupFp8")
      .def("stats", [](ProcessGroupFp8& pg) { return pg.stats().snapshot(); })
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
      .def_property_readonly("track_error", [](ProcessGroupFp8& pg) { return *pg.options().track_error; })
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
      // The resolved options' fields, as the group uses them.
      .def_property_readonly("block_size", [](ProcessGroupFp8& pg) { return *pg.options().block_size; })
      .def_property_readonly("wire_format",
                             [](ProcessGroupFp8& pg) { return fp8comm::wire_format_name(*pg.options().wire_format); })
      .def_property_readonly("fp8_dtype",
                             [](ProcessGroupFp8& pg) { return fp8comm::wire_format_name(*pg.options().wire_format); },
                             "Deprecated: wire_format.")
      .def_property_readonly("node_wire_format", [](ProcessGroupFp8& pg) { return *pg.options().node_wire_format; })
      .def_property_readonly("min_numel", [](ProcessGroupFp8& pg) { return *pg.options().min_numel; })
      .def_property_readonly("compressed_ops", [](ProcessGroupFp8& pg) { return *pg.options().compress; });

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
