#pragma once
// The torch side of the format registries (fp8_block_math.h): the one table
// from Fp8Dtype (the linear casts' compute dtypes) to torch dtype, the one
// from WireFormat to the torch dtype of its codes, and the conversions every
// operator, option and binding uses, by torch dtype or by name ("e4m3").
#include <c10/core/ScalarType.h>

#include <optional>
#include <string>
#include <vector>

#include "fp8_block_math.h"

namespace fp8comm {

struct Fp8DtypeRow {
  Fp8Dtype fp8_dtype;
  c10::ScalarType scalar_type;
};

inline constexpr Fp8DtypeRow kFp8DtypeTable[] = {
    {Fp8Dtype::E4M3, c10::ScalarType::Float8_e4m3fn},
    {Fp8Dtype::E5M2, c10::ScalarType::Float8_e5m2},
};

// The codes and block scales of a wire format as torch tensors hold them
// (4-bit codes: two per float4_e2m1fn_x2 element, the low nibble first).
// Two formats may share a codes dtype, so a dtype never names a format.
struct WireFormatRow {
  WireFormat format;
  c10::ScalarType codes_type;
  c10::ScalarType scales_type;
};

inline constexpr WireFormatRow kWireFormatTable[] = {
    {WireFormat::E4M3, c10::ScalarType::Float8_e4m3fn, c10::ScalarType::Float8_e8m0fnu},
    {WireFormat::E5M2, c10::ScalarType::Float8_e5m2, c10::ScalarType::Float8_e8m0fnu},
    {WireFormat::MXFP4, c10::ScalarType::Float4_e2m1fn_x2, c10::ScalarType::Float8_e8m0fnu},
    {WireFormat::NVFP4, c10::ScalarType::Float4_e2m1fn_x2, c10::ScalarType::Float8_e4m3fn},
};

const WireFormatRow& wire_format_row(WireFormat format);
// By name, any case ("mxfp4").
std::optional<WireFormat> find_wire_format(const std::string& name);
// The format named `name`; raises the one "wire_format must be" error,
// naming `what`, when none is.
WireFormat wire_format_of(const std::string& name, const char* what);
// Every format's name, in kWireFormatTable's order, and as errors list them:
// "'e4m3', 'e5m2' or 'mxfp4'".
std::vector<std::string> wire_format_names();
std::string wire_format_choices();

c10::ScalarType scalar_type_of(Fp8Dtype fp8_dtype);
std::optional<Fp8Dtype> find_fp8_dtype(c10::ScalarType dtype);
// By name, any case: "e4m3" / "E4M3".
std::optional<Fp8Dtype> find_fp8_dtype(const std::string& name);
// The torch dtype's Fp8Dtype; raises an error naming `what` when it has none.
Fp8Dtype fp8_dtype_of(c10::ScalarType dtype, const char* what);
// "torch.float8_e4m3fn or torch.float8_e5m2"; with_names:
// "'e4m3' / torch.float8_e4m3fn or 'e5m2' / torch.float8_e5m2".
std::string fp8_dtype_choices(bool with_names);
// torch.float8_e4m3fn -> "float8_e4m3fn", as Python names it.
std::string python_dtype_name(c10::ScalarType dtype);

}  // namespace fp8comm
