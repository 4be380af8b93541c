#pragma once
// The FP8COMM_* variables of Options' knobs, one per row of options_table.h
// (an EnvVar of common/env.h: name, unset value, doc, knob), and the list of
// every variable fp8comm reads: the knobs' in their rows' order, then the
// others (env.h). Python's environment_variables() and README.md's
// "Environment variables" table are that list.
#include <string_view>

#include "../common/env.h"
#include "options_table.h"

namespace fp8comm {
namespace env {

// The variables of Options' knobs, by the knob's name.
namespace of_option {
#define FP8C_OPTION_VAR(name, type, values, variable, unset, share, doc) \
  inline constexpr EnvVar name{variable, unset, doc, #name};
FP8C_OPTIONS(FP8C_OPTION_VAR)
#undef FP8C_OPTION_VAR
}  // namespace of_option

// The codec reads the cpu_threads row's variable through its own declaration
// (it does not include the table): the same name and unset value.
static_assert(std::string_view(kCpuThreads.name) == of_option::cpu_threads.name &&
                  std::string_view(kCpuThreads.fallback) == of_option::cpu_threads.fallback &&
                  std::string_view(kCpuThreads.option) == "cpu_threads",
              "env::kCpuThreads (common/env.h) must be the cpu_threads row's variable (options_table.h)");

// Every variable: the knobs' in their rows' order, then the others.
#define FP8C_OPTION_VAR_REF(name, type, values, variable, unset, share, doc) &of_option::name,
inline constexpr const EnvVar* kAll[] = {FP8C_OPTIONS(FP8C_OPTION_VAR_REF) &kFp8Dtype, &kLocalSize, &kCpuSimd,
                                         &kFusedCast, &kWarnPassthrough, &kCudaCodec, &kCudaCast};
#undef FP8C_OPTION_VAR_REF

}  // namespace env
}  // namespace fp8comm
