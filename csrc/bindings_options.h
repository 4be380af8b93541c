#pragma once
// fp8comm.Options in Python, derived from the rows of options_table.h
// (bindings_options.cpp).
#include <torch/csrc/utils/pybind.h>

#include "backend/options.h"

namespace fp8comm {

// Binds Options (constructor, properties, repr, pickle, ==, resolved,
// fingerprint) and the module functions that describe the knobs.
void bind_options(py::module_& m);
// A resolved knob's value as Python sees it ("e4m3", 32, ("all_reduce",)).
py::object knob_value(const Options& options, const std::string& name);

}  // namespace fp8comm
