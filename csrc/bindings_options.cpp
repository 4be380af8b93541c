// fp8comm.Options in Python: every method walks the rows of options_table.h
// (for_each_knob), so a new knob needs nothing here.
#include "bindings_options.h"

#include <torch/csrc/Dtype.h>

#include "algorithms/compressed_algorithms.h"
#include "common/choices.h"

namespace fp8comm {

namespace {

template <class T, class V>
py::object to_python(const Knob<T, V>& k, const T& v) {
  if constexpr (std::is_same_v<V, Choices>) {
    return py::str(k.text(v));
  } else if constexpr (std::is_same_v<T, OpList>) {
    return py::tuple(py::cast(v));
  } else {
    return py::cast(v);
  }
}

template <class T, class V>
py::object to_python(const Knob<T, V>& k, const std::optional<T>& v) {
  return v ? to_python(k, *v) : py::none();
}

// The value Python gave a knob, as the knob's type; ValueError when it takes
// no such value.
template <class T, class V>
T from_python(const Knob<T, V>& k, const py::handle& v) {
  std::optional<T> found;
  if constexpr (std::is_same_v<V, Ints>) {
    if (py::isinstance<py::int_>(v) && !py::isinstance<py::bool_>(v)) {
      const auto i = v.cast<int64_t>();
      if (k.admits(i)) found = i;
    }
  } else if constexpr (std::is_same_v<V, Flag>) {
    if (py::isinstance<py::bool_>(v)) found = v.cast<bool>();
  } else if constexpr (std::is_same_v<V, Ops>) {
    if (py::isinstance<py::str>(v)) {
      found = k.parse(v.cast<std::string>());
    } else if (py::isinstance<py::iterable>(v)) {
      std::vector<std::string> items;
      for (const auto& item : v) items.push_back(py::str(item).cast<std::string>());
      found = select_ops(items);
    }
  } else {
    if (py::isinstance<py::str>(v)) found = k.parse(v.cast<std::string>());
  }
  if (!found) k.refuse(py::repr(v).cast<std::string>(), "");
  return *found;
}

// The deprecated fp8_dtype as given: a name ("e4m3") or a torch dtype
// (torch.float8_e4m3fn); a DeprecationWarning points to wire_format.
WireFormat fp8_dtype_option(const py::handle& v) {
  std::optional<Fp8Dtype> found;
  if (THPDtype_Check(v.ptr())) {
    found = find_fp8_dtype(reinterpret_cast<THPDtype*>(v.ptr())->scalar_type);
  } else if (py::isinstance<py::str>(v)) {
    found = find_fp8_dtype(v.cast<std::string>());
  }
  TORCH_CHECK_VALUE(found, must_be("fp8comm.Options", "fp8_dtype", fp8_dtype_choices(true),
                                   py::repr(v).cast<std::string>()),
                    " (fp8_dtype is deprecated: use wire_format)");
  const std::string name = fp8_dtype_name(*found);
  const std::string msg = "fp8comm.Options(fp8_dtype=...) is deprecated; use wire_format='" + name + "'";
  if (PyErr_WarnEx(PyExc_DeprecationWarning, msg.c_str(), 1) != 0) throw py::error_already_set();
  return *find_wire_format(name);
}

// Options(**kwargs): each knob by its name, None for unset; fp8_dtype, the
// deprecated spelling of wire_format.
c10::intrusive_ptr<Options> options_from(const py::dict& kwargs) {
  auto o = c10::make_intrusive<Options>();
  py::object fp8_dtype = py::none();
  for (const auto& [key, value] : kwargs) {
    const std::string name = py::str(key).cast<std::string>();
    if (name == "fp8_dtype") {
      fp8_dtype = py::reinterpret_borrow<py::object>(value);
      continue;
    }
    bool known = false;
    for_each_knob([&](const auto& k) {
      if (name != k.name) return;
      known = true;
      if (!value.is_none()) (*o).*k.field = from_python(k, value);
    });
    TORCH_CHECK_TYPE(known, "fp8comm.Options: unknown option '", name, "'; the options are ",
                     listed(knob_names(), "and", false), " (and fp8_dtype, deprecated: wire_format)");
  }
  if (!fp8_dtype.is_none()) {
    const WireFormat old = fp8_dtype_option(fp8_dtype);
    TORCH_CHECK_VALUE(!o->wire_format || old == *o->wire_format, "fp8comm.Options: fp8_dtype=",
                      py::repr(fp8_dtype).cast<std::string>(), " and wire_format='",
                      wire_format_name(*o->wire_format),
                      "' disagree; give wire_format alone (fp8_dtype is its deprecated spelling)");
    o->wire_format = old;
  }
  return o;
}

// {name: value or None} of every knob: Options(**it) rebuilds them.
py::dict knob_values(const Options& o) {
  py::dict out;
  for_each_knob([&](const auto& k) { out[k.name] = to_python(k, o.*k.field); });
  return out;
}

std::string repr(const Options& o) {
  std::string fields;
  for_each_knob([&](const auto& k) {
    fields += (fields.empty() ? "" : ", ") + std::string(k.name) + "=" +
              py::repr(to_python(k, o.*k.field)).template cast<std::string>();
  });
  return "fp8comm.Options(" + fields + ")";
}

// One row of options_table.h as a dict, for the README and DESIGN tables
// (fp8comm/options/).
template <class T, class V>
py::dict row_of(const Knob<T, V>& k) {
  py::dict row;
  row["name"] = k.name;
  row["variable"] = k.variable.name;
  row["unset"] = k.variable.fallback;
  row["default"] = k.rule_when_unset() ? py::none() : to_python(k, k.parse(k.variable.fallback));
  row["per_rank"] = k.share == Share::kRank;
  row["takes"] = k.takes(Source::kPython);
  row["takes_variable"] = k.takes(Source::kVariable);
  row["doc"] = k.variable.doc;
  // For the typed signature (fp8comm/options/): the kind of value, and the
  // names a choice or an op list takes.
  if constexpr (std::is_same_v<V, Choices>) {
    row["kind"] = "choices";
    row["choices"] = Names<T>::all();
  } else if constexpr (std::is_same_v<V, Ops>) {
    row["kind"] = "ops";
    std::vector<std::string> names = compressed::names();
    names.insert(names.begin(), {"all", "none"});
    row["choices"] = names;
  } else if constexpr (std::is_same_v<V, Flag>) {
    row["kind"] = "flag";
  } else {
    row["kind"] = "int";
  }
  return row;
}

}  // namespace

py::object knob_value(const Options& options, const std::string& name) {
  py::object out = py::none();
  for_each_knob([&](const auto& k) {
    if (name == k.name) out = to_python(k, options.*k.field);
  });
  return out;
}

void bind_options(py::module_& m) {
  py::class_<Options, c10d::Backend::Options, c10::intrusive_ptr<Options>> cls(m, "Options");
  static const std::string doc = options_doc();
  cls.doc() = doc.c_str();
  cls.def(py::init([](const py::args& args, const py::kwargs& kwargs) {
            TORCH_CHECK_TYPE(args.empty(), "fp8comm.Options takes keyword arguments only (",
                             listed(knob_names(), "and", false), "), got ", args.size(), " positional");
            return options_from(kwargs);
          }))
      .def("resolved", &Options::resolved,
           "A copy with every field set from the environment where unset, and checked (ValueError otherwise).")
      .def("fingerprint", &Options::fingerprint,
           "Of resolved options: what every rank of a group must agree on, by name.")
      .def("__repr__", &repr)
      .def("__eq__",
           [](const Options& a, const Options& b) {
             bool equal = true;
             for_each_knob([&](const auto& k) { equal = equal && a.*k.field == b.*k.field; });
             return equal;
           })
      .def(py::pickle(
          [](const Options& o) {  // copy.deepcopy(parent.options) when torch splits a group
            return py::make_tuple(knob_values(o), o.timeout.count(), o.group_name, o.global_ranks_in_group);
          },
          [](const py::tuple& t) {
            TORCH_CHECK_VALUE(t.size() == 4, "fp8comm.Options: cannot unpickle a state of ", t.size(), " fields");
            auto o = options_from(t[0].cast<py::dict>());
            o->timeout = std::chrono::milliseconds(t[1].cast<int64_t>());
            o->group_name = t[2].cast<std::string>();
            o->global_ranks_in_group = t[3].cast<std::vector<uint64_t>>();
            return o;
          }));
  for_each_knob([&](const auto& k) {
    cls.def_property_readonly(k.name, [k](const Options& o) { return to_python(k, o.*k.field); });
  });
  cls.def_property_readonly(
      "fp8_dtype", [](const Options& o) { return knob_value(o, "wire_format"); }, "Deprecated: wire_format.");

  m.def(
      "option_table",
      [] {
        py::list rows;
        for_each_knob([&](const auto& k) { rows.append(row_of(k)); });
        return rows;
      },
      "Every knob of fp8comm.Options, in order: name, variable, unset (its text), default (Python), per_rank, "
      "takes, takes_variable, doc, kind (int, flag, choices, ops) and choices (csrc/backend/options_table.h).");
  m.def("fingerprint_mismatch", &fingerprint_mismatch, py::arg("by_rank"), py::arg("rank"),
        "The error every rank raises when the ranks' option fingerprints differ; None when they agree.");
}

}  // namespace fp8comm
