#pragma once
// Every FP8COMM_* environment variable fp8comm reads at run time, declared
// once (as NCCL's NCCL_PARAM): its name, the value an unset variable stands
// for, what it sets, and a typed reader that checks the value. The variables
// of Options' knobs are their rows' (csrc/backend/options_table.h, expanded
// in csrc/backend/option_variables.h, which also lists every variable); the
// others are declared here. README.md's "Environment variables" table lists
// each (tests/backend/test_options.py holds the two in step); Python reads
// them through the same readers (fp8comm._C.env_flag / env_positive_int).
// Plain C++ (no torch): the codec reads them too. A bad value raises
// std::invalid_argument (ValueError in Python) naming the variable and what
// it takes; Options' variables are parsed as their knobs' values instead.
#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>

namespace fp8comm {

struct EnvVar {
  const char* name;
  const char* fallback;
  const char* doc;
  // The Options field it sets; null for the variables that are no knob's.
  const char* option = nullptr;

  // The variable's value; unset or empty: nullopt.
  std::optional<std::string> read() const {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') return std::nullopt;
    return std::string(v);
  }
  std::string value_or_fallback() const { return read().value_or(fallback); }

  // The value (else the fallback) as an integer.
  int64_t as_int() const { return parse_int(value_or_fallback(), "an integer"); }
  // The value (else the fallback) as a switch: 0 off, 1 on.
  bool as_flag() const {
    const std::string raw = value_or_fallback();
    if (raw != "0" && raw != "1") fail(raw, "0 (off) or 1 (on)");
    return raw == "1";
  }
  // The value (else the fallback), which must be one of `choices`.
  std::string as_choice(std::initializer_list<const char*> choices) const {
    const std::string raw = value_or_fallback();
    std::string names;
    for (const char* c : choices) {
      if (raw == c) return raw;
      names += names.empty() ? std::string("'") + c + "'" : std::string(" or '") + c + "'";
    }
    fail(raw, names.c_str());
  }
  // The value as an integer >= 1; unset: nullopt (for variables whose
  // fallback is a rule, not a value).
  std::optional<int64_t> as_positive_int() const {
    const auto raw = read();
    if (!raw) return std::nullopt;
    const int64_t v = parse_int(*raw, "a positive integer");
    if (v < 1) fail(*raw, "a positive integer");
    return v;
  }

 private:
  int64_t parse_int(const std::string& raw, const char* what) const {
    try {
      size_t used = 0;
      const int64_t v = std::stoll(raw, &used);
      if (used == raw.size()) return v;
    } catch (const std::exception&) {
    }
    fail(raw, what);
  }
  [[noreturn]] void fail(const std::string& raw, const char* what) const {
    throw std::invalid_argument(std::string("fp8comm: environment variable ") + name + " must be " + what +
                                ", got '" + raw + "'");
  }
};

namespace env {
// The knob variable the codec reads itself: its threads when no group has
// set them. The cpu_threads row's (option_variables.h checks they agree).
inline constexpr EnvVar kCpuThreads{"FP8COMM_CPU_THREADS", "cores / ranks on the host",
                                    "threads per process for the CPU codec", "cpu_threads"};

// clang-format off
inline constexpr EnvVar kFp8Dtype{"FP8COMM_FP8_DTYPE", "unset", "deprecated spelling of FP8COMM_WIRE_FORMAT (e4m3 or e5m2), read when that is unset"};
inline constexpr EnvVar kLocalSize{"FP8COMM_LOCAL_SIZE", "LOCAL_WORLD_SIZE, else host names", "ranks per node, numbered contiguously: simulated nodes on one host (tests, netlab)"};
inline constexpr EnvVar kCpuSimd{"FP8COMM_CPU_SIMD", "1", "CPU codec kernels: 1 every kernel the CPU runs, avx2 no AVX-512 kernels, 0 scalar loops (same bytes)"};
inline constexpr EnvVar kFusedCast{"FP8COMM_FUSED_CAST", "1", "Fp8Linear on CUDA: 0 casts through the eager chain of torch ops instead of the fused CUDA kernels (the CPU always uses the fused operator)"};
inline constexpr EnvVar kWarnPassthrough{"FP8COMM_WARN_PASSTHROUGH", "1", "0 (off) or 1 (on): a group warns once per op when a call Options.compress names passes through exactly for being below min_numel (get_stats' passthrough_reasons counts every such call); read at group creation"};
inline constexpr EnvVar kCudaCast{"FP8COMM_CUDA_CAST", "legacy", "Fp8Linear's fused CUDA cast kernels, read at every call: legacy (csrc/linear/cast_cuda.cu) or tiled (cast_cuda_tiled.cu, for the memory bound; what it does not cover runs the legacy kernels; the delayed recipe's casts run fused only here); the same bytes"};
inline constexpr EnvVar kCudaCodec{"FP8COMM_CUDA_CODEC", "legacy", "CUDA codec kernels, read at every call: legacy (csrc/codec/codec_cuda.cu) or tiled (codec_cuda_tiled.cu, for the memory bound; what it does not cover runs the legacy kernels); the same bytes"};
// clang-format on

}  // namespace env

}  // namespace fp8comm
