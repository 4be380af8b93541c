#pragma once
// Every FP8COMM_* environment variable fp8comm reads at run time, declared
// once (as NCCL's NCCL_PARAM): its name, the value an unset variable stands
// for, what it sets, and a typed reader that checks the value. README.md's
// "Environment variables" table lists each (tests/backend/test_options.py
// holds the two in step); Python reads them through the same readers
// (fp8comm._C.env_flag / env_positive_int). Plain C++ (no torch): the codec
// reads them too. A bad value raises std::invalid_argument (ValueError in
// Python) naming the variable and what it takes.
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>

#include "block_size.h"

namespace fp8comm {

struct EnvVar {
  const char* name;
  const char* fallback;
  const char* doc;

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
// clang-format off
inline constexpr EnvVar kBlockSize{"FP8COMM_BLOCK_SIZE", "32", "Options.block_size: elements per FP8 block, " FP8C_BLOCK_SIZE_RULE};
inline constexpr EnvVar kWireFormat{"FP8COMM_WIRE_FORMAT", "e4m3", "Options.wire_format: the element format on every compressed hop, e4m3, e5m2 or mxfp4 (4-bit)"};
inline constexpr EnvVar kFp8Dtype{"FP8COMM_FP8_DTYPE", "unset", "deprecated spelling of FP8COMM_WIRE_FORMAT (e4m3 or e5m2), read when that is unset"};
inline constexpr EnvVar kMinNumel{"FP8COMM_MIN_NUMEL", "16384", "Options.min_numel: per-rank element count below which a collective passes through exactly"};
inline constexpr EnvVar kCompress{"FP8COMM_COMPRESS", "all_reduce,reduce_scatter", "Options.compress: comma list of compressed algorithms (the Options doc lists them); or all / none"};
inline constexpr EnvVar kCpuSimd{"FP8COMM_CPU_SIMD", "1", "CPU codec kernels: 1 every kernel the CPU runs, avx2 no AVX-512 kernels, 0 scalar loops (same bytes)"};
inline constexpr EnvVar kCpuThreads{"FP8COMM_CPU_THREADS", "cores / ranks on the host", "Options.cpu_threads: threads per process for the CPU codec; unset: the process's share of its host's cores"};
inline constexpr EnvVar kScope{"FP8COMM_SCOPE", "all", "Options.scope: all compresses every link; inter_node only the hop between nodes (exact inside a node)"};
inline constexpr EnvVar kNodeWireFormat{"FP8COMM_NODE_WIRE_FORMAT", "exact", "Options.node_wire_format: the inter_node scope's phases inside a node, exact or compressed in e4m3, e5m2 or mxfp4"};
inline constexpr EnvVar kLocalSize{"FP8COMM_LOCAL_SIZE", "LOCAL_WORLD_SIZE, else host names", "ranks per node, numbered contiguously: simulated nodes on one host (tests, netlab)"};
inline constexpr EnvVar kRounding{"FP8COMM_ROUNDING", "nearest", "Options.rounding: how compressed collectives round to FP8, nearest (even) or stochastic (unbiased, keyed by the seed)"};
inline constexpr EnvVar kRoundingSeed{"FP8COMM_ROUNDING_SEED", "0", "Options.rounding_seed: the integer seed of stochastic rounding's random bits; the same seed gives the same bytes"};
inline constexpr EnvVar kTrackError{"FP8COMM_TRACK_ERROR", "0", "Options.track_error: 1 measures the quantization error of every compressed call on this rank (get_stats: SQNR per op); CPU groups only"};
inline constexpr EnvVar kFusedCast{"FP8COMM_FUSED_CAST", "0", "Fp8Linear on CUDA: 1 casts through the fused CUDA kernels (the CPU always does)"};
// clang-format on
inline constexpr const EnvVar* kAll[] = {&kBlockSize, &kWireFormat, &kFp8Dtype, &kMinNumel, &kCompress, &kCpuSimd, &kCpuThreads, &kScope, &kNodeWireFormat, &kRounding, &kRoundingSeed, &kLocalSize, &kTrackError, &kFusedCast};
}  // namespace env

}  // namespace fp8comm
