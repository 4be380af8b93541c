#include "fp8_dtype_table.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>

#include "../common/choices.h"

namespace fp8comm {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

}  // namespace

const WireFormatRow& wire_format_row(WireFormat format) {
  for (const auto& row : kWireFormatTable) {
    if (row.format == format) return row;
  }
  TORCH_CHECK(false, "fp8comm: wire format ", wire_format_name(format), " has no row in kWireFormatTable");
}

std::optional<WireFormat> find_wire_format(const std::string& name) {
  for (const auto& row : kWireFormatTable) {
    if (lower(name) == wire_format_name(row.format)) return row.format;
  }
  return std::nullopt;
}

std::vector<std::string> wire_format_names() {
  std::vector<std::string> names;
  for (const auto& row : kWireFormatTable) names.emplace_back(wire_format_name(row.format));
  return names;
}

std::string wire_format_choices() { return listed(wire_format_names()); }

WireFormat wire_format_of(const std::string& name, const char* what) {
  const auto found = find_wire_format(name);
  TORCH_CHECK_VALUE(found, must_be(what, "wire_format", wire_format_choices(), "'" + name + "'"));
  return *found;
}

c10::ScalarType scalar_type_of(Fp8Dtype fp8_dtype) {
  for (const auto& row : kFp8DtypeTable) {
    if (row.fp8_dtype == fp8_dtype) return row.scalar_type;
  }
  TORCH_CHECK(false, "fp8comm: FP8 dtype ", fp8_dtype_name(fp8_dtype), " has no row in kFp8DtypeTable");
}

std::optional<Fp8Dtype> find_fp8_dtype(c10::ScalarType dtype) {
  for (const auto& row : kFp8DtypeTable) {
    if (row.scalar_type == dtype) return row.fp8_dtype;
  }
  return std::nullopt;
}

std::optional<Fp8Dtype> find_fp8_dtype(const std::string& name) {
  for (const auto& row : kFp8DtypeTable) {
    if (lower(name) == fp8_dtype_name(row.fp8_dtype)) return row.fp8_dtype;
  }
  return std::nullopt;
}

std::string python_dtype_name(c10::ScalarType dtype) {
  std::string s = c10::toString(dtype);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

std::string fp8_dtype_choices(bool with_names) {
  std::string out;
  const size_t n = std::size(kFp8DtypeTable);
  for (size_t i = 0; i < n; ++i) {
    const auto& row = kFp8DtypeTable[i];
    if (i > 0) out += i + 1 == n ? " or " : ", ";
    if (with_names) out += std::string("'") + fp8_dtype_name(row.fp8_dtype) + "' / ";
    out += "torch." + python_dtype_name(row.scalar_type);
  }
  return out;
}

Fp8Dtype fp8_dtype_of(c10::ScalarType dtype, const char* what) {
  const auto found = find_fp8_dtype(dtype);
  TORCH_CHECK(found, what, ": fp8_dtype must be ", fp8_dtype_choices(false), ", got ", dtype);
  return *found;
}

}  // namespace fp8comm
