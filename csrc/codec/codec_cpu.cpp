// The block codec on the CPU: blocks spread over the codec's own threads
// (cpu_threads.h); runs of whole blocks go to the hand-written AVX2 kernels
// (codec_cpu_avx2.cpp) when the CPU has them, and for block size 32's
// quantize and sum + re-quantize to the AVX-512 ones (codec_cpu_avx512.cpp)
// when it has those; everything else (tails, or no AVX2) to branch-free scalar
// loops that the compiler vectorizes. The element
// math is fp8_block_math.h, the same header the CUDA kernels use, so every
// path produces the same bytes.
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "../common/env.h"
#include "codec.h"
#include "codec_tensor.h"
#include "codec_cpu_avx2.h"
#include "codec_cpu_avx512.h"
#include "cpu_threads.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FP8C_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define FP8C_VECTOR_CLONES
#endif

namespace fp8comm {
namespace {

// FP8COMM_CPU_SIMD=0 keeps the scalar loops, =avx2 the AVX2 kernels without
// the AVX-512 ones, =1 (or unset) every kernel the CPU runs (the tests
// compare every path). Any other value is an error, not a silent default.
bool simd_env_is(const char* value) {
  const auto env = env::kCpuSimd.read();
  if (env) {
    const bool known = *env == "0" || *env == "1" || *env == "avx2";
    TORCH_CHECK(known, "fp8comm codec: ", env::kCpuSimd.name, " must be 0 (scalar loops), avx2 (no AVX-512 kernels) "
                "or 1 (all kernels the CPU runs), got '", *env, "'");
  }
  return env && *env == value;
}

std::atomic<bool>& simd_flag() {
  static std::atomic<bool> flag{avx2::supported() && !simd_env_is("0")};
  return flag;
}

std::atomic<bool>& avx512_flag() {
  static std::atomic<bool> flag{avx512::supported() && !simd_env_is("0") && !simd_env_is("avx2")};
  return flag;
}

// Which kernels take whole blocks: read once per call.
enum class Simd { kOff, kAvx2, kAvx512 };

Simd simd_level() {
  if (!simd_flag().load(std::memory_order_relaxed)) return Simd::kOff;
  return avx512_flag().load(std::memory_order_relaxed) ? Simd::kAvx512 : Simd::kAvx2;
}

// Enough blocks per task that a task moves ~64 KiB of input.
int64_t grain_blocks(int block_size) { return std::max<int64_t>(1, 16384 / block_size); }

// The per-block element loops. `n` is either a compile-time 32 or 16 (a
// full block of the default size or of NVFP4's: the loops unroll into a few
// AVX2 registers with no remainder handling) or a run-time count.
template <typename Fn>
FP8C_HD decltype(auto) with_count(int64_t n, Fn&& fn) {
  if (n == 32) return fn(std::integral_constant<int64_t, 32>{});
  if (n == 16) return fn(std::integral_constant<int64_t, 16>{});
  return fn(n);
}

// The encode of element i of a block: to nearest even, or stochastically
// with the bits of the block's run (rounding.h).
template <WireFormat F>
struct NearestEncode {
  FP8C_HD uint8_t operator()(float v, uint32_t limit, int64_t) const { return encode_code<F>(v, limit); }
};

template <WireFormat F>
struct StochasticEncode {
  StochasticRun run;
  FP8C_HD uint8_t operator()(float v, uint32_t limit, int64_t i) const {
    return encode_code_stochastic<F>(v, limit, run.bits(i));
  }
};

// Whether any of n values is non-finite, for a format without NaN codes
// (stored_scale_byte); 0 without reading them otherwise.
template <WireFormat F, typename Count, typename Value>
FP8C_HD uint32_t any_nonfinite(Count n, Value value) {
  uint32_t nonfinite = 0;
  if constexpr (!WireTraits<F>::kHasNanCode) {
    for (int64_t i = 0; i < n; ++i) nonfinite |= nonfinite_bit(value(i));
  }
  return nonfinite;
}

// The finite amax of a block's n elements x * premul, as bits.
template <ElemType E, typename Count>
FP8C_HD uint32_t run_amax(const Storage<E>* s, Count n, float premul) {
  uint32_t amax = 0;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, finite_abs_bits(Elem<E>::load(s[i]) * premul));
  return amax;
}

// Two passes over the (cache-hot) block: a pure max-reduction, then the
// encode; gcc vectorizes each, but not a reduction fused with stores. g: the
// segment's scale (block_encoding).
template <ElemType E, WireFormat F, typename Count, typename Encode = NearestEncode<F>>
FP8C_HD uint8_t quantize_run(const Storage<E>* s, Count n, float premul, float g, uint8_t* codes,
                             Encode encode = {}) {
  const uint8_t sb = block_scale_byte<F>(run_amax<E>(s, n, premul), g);
  const BlockEncoding enc = block_encoding<F>(sb, g);
  for (int64_t i = 0; i < n; ++i) {
    store_code<F>(codes, i, encode(to_code_units<F>(Elem<E>::load(s[i]) * premul, enc), enc.limit, i));
  }
  return stored_scale_byte<F>(sb, any_nonfinite<F>(n, [&](int64_t i) { return Elem<E>::load(s[i]) * premul; }));
}

// Codes i in [from, to) of a block written as zeros (padding).
template <WireFormat F>
FP8C_HD void zero_codes(uint8_t* codes, int64_t from, int64_t to) {
  for (int64_t i = from; i < to; ++i) store_code<F>(codes, i, 0);
}

// decode_code of every code: on the CPU a table lookup (an AVX2 gather) is
// cheaper than the branch-free bit math, and gives the same floats.
template <WireFormat F>
struct DecodeTable {
  float value[1 << WireTraits<F>::kCodeBits];
  DecodeTable() {
    for (int c = 0; c < (1 << WireTraits<F>::kCodeBits); ++c) value[c] = decode_code<F>(static_cast<uint8_t>(c));
  }
};

template <WireFormat F>
const float* decode_table() {
  static const DecodeTable<F> table;
  return table.value;
}

template <ElemType E, WireFormat F, typename Count>
FP8C_HD void dequantize_run(const uint8_t* codes, float scale, Count n, Storage<E>* d) {  // scale: block_scale
  const float* lut = decode_table<F>();
  for (int64_t i = 0; i < n; ++i) d[i] = Elem<E>::store(lut[load_code<F>(codes, i)] * scale);
}

template <WireFormat F, typename Count, typename Encode = NearestEncode<F>>
FP8C_HD uint8_t requantize_run(const float* acc, Count n, float g, uint8_t* codes, Encode encode = {}) {
  const uint8_t sb = block_scale_byte<F>(run_amax<ElemType::F32>(acc, n, 1.0f), g);
  const BlockEncoding enc = block_encoding<F>(sb, g);
  for (int64_t i = 0; i < n; ++i) store_code<F>(codes, i, encode(to_code_units<F>(acc[i], enc), enc.limit, i));
  return stored_scale_byte<F>(sb, any_nonfinite<F>(n, [&](int64_t i) { return acc[i]; }));
}

// Whether the AVX-512 kernels (codec_cpu_avx512.cpp, block size 32) take a
// format's whole blocks: they are written for E8M0 scales; other scale kinds
// take the AVX2 ones (codec_cpu_avx2.cpp), which serve every kind.
template <WireFormat F>
constexpr bool kAvx512Kernels = WireTraits<F>::kScaleKind == ScaleKind::kE8M0;

// For a format with a segment scale: each segment's g, from the finite amax
// of what goes into it (amax_of(r, j, end): blocks [j, end) of segment r),
// stored before the segment's block scales. A pass of its own, since every
// block's scale depends on it.
template <WireFormat F, typename AmaxOf>
void store_segment_scales(const BlockCodes& dst, int64_t blocks_per_segment, int64_t grain, AmaxOf amax_of) {
  if constexpr (WireTraits<F>::kSegmentScaleBytes != 0) {
    std::vector<std::atomic<uint32_t>> amax(dst.num_segments);
    for (auto& a : amax) a.store(0, std::memory_order_relaxed);
    parallel_blocks(dst.num_segments * blocks_per_segment, grain, [&](int64_t b, int64_t end) {
      for (int64_t blk = b; blk < end;) {
        const int64_t r = blk / blocks_per_segment;
        const int64_t stop = std::min(end, (r + 1) * blocks_per_segment);
        const uint32_t m = amax_of(r, blk - r * blocks_per_segment, stop - r * blocks_per_segment);
        blk = stop;
        uint32_t seen = amax[r].load(std::memory_order_relaxed);
        while (m > seen && !amax[r].compare_exchange_weak(seen, m, std::memory_order_relaxed)) {
        }
      }
    });
    for (int64_t r = 0; r < dst.num_segments; ++r) {
      store_segment_scale<F>(dst.scales + r * dst.stride, segment_scale<F>(amax[r].load()));
    }
  }
}

// Blocks [begin, end) of all segments, numbered segment-major; with `simd`,
// each run of whole blocks goes to a SIMD kernel in one call.
template <ElemType E, WireFormat F>
FP8C_VECTOR_CLONES void quantize_blocks(const Storage<E>* src, int64_t numel, float premul,
                                        const BlockCodes dst, int64_t begin, int64_t end, Simd simd) {
  const int64_t B = dst.block_size;
  const int64_t blocks_per_segment = ceil_div(dst.capacity, B);
  for (int64_t blk = begin; blk < end;) {
    const int64_t r = blk / blocks_per_segment;
    const int64_t j = blk - r * blocks_per_segment;
    const int64_t first = r * dst.segment_numel + j * B;  // flat index of the block start
    const int64_t width = std::min(B, dst.capacity - j * B);
    const int64_t seg_valid = std::min(dst.segment_numel, numel - r * dst.segment_numel);
    const int64_t valid = std::max<int64_t>(0, std::min(width, seg_valid - j * B));
    const Storage<E>* s = src + first;
    uint8_t* codes = dst.codes + r * dst.stride + code_bytes<F>(j * B);
    uint8_t* scales = dst.scales + r * dst.stride + j;
    const float g = load_segment_scale<F>(dst.scales + r * dst.stride);
    int64_t run = 1;
    const bool stochastic = dst.rounding == Rounding::kStochastic;
    const StochasticRun sr = stochastic ? dst.stochastic_run(r, j * B) : StochasticRun{};
    if (simd != Simd::kOff && valid == B) {
      run = std::min(end - blk, (seg_valid - j * B) / B);  // whole blocks left in this segment
      if (kAvx512Kernels<F> && simd == Simd::kAvx512 && B == 32) {
        avx512::quantize_blocks32(s, E, F, run, premul, codes, scales, stochastic ? &sr : nullptr);
      } else {
        avx2::quantize_full_blocks(s, E, F, run, static_cast<int>(B), premul, g, codes, scales,
                                   stochastic ? &sr : nullptr);
      }
    } else if (stochastic) {
      *scales = quantize_run<E, F>(s, valid, premul, g, codes, StochasticEncode<F>{sr});
      zero_codes<F>(codes, valid, width);
    } else {
      *scales = with_count(valid, [&](auto n) { return quantize_run<E, F>(s, n, premul, g, codes); });
      zero_codes<F>(codes, valid, width);
    }
    if (j + run == blocks_per_segment) {
      for (int64_t k = 0; k < dst.scale_padding; ++k) scales[run + k] = 0;
    }
    blk += run;
  }
}

template <ElemType E, WireFormat F>
FP8C_VECTOR_CLONES void dequantize_blocks(const BlockCodes src, Storage<E>* dst, int64_t numel,
                                          int64_t begin, int64_t end, bool simd, int64_t output_bytes) {
  const int64_t B = src.block_size;
  const int64_t blocks_per_segment = ceil_div(src.segment_numel, B);
  for (int64_t blk = begin; blk < end;) {
    const int64_t r = blk / blocks_per_segment;
    const int64_t j = blk - r * blocks_per_segment;
    const int64_t first = r * src.segment_numel + j * B;
    const int64_t width = std::min(B, src.segment_numel - j * B);
    const int64_t valid = std::max<int64_t>(0, std::min(width, numel - first));
    const uint8_t* scales = src.scales + r * src.stride + j;
    const uint8_t* codes = src.codes + r * src.stride + code_bytes<F>(j * B);
    if (simd && valid == B) {
      const int64_t run = std::min(end - blk, std::min(src.segment_numel - j * B, numel - first) / B);
      avx2::dequantize_full_blocks(codes, scales, load_segment_scale<F>(src.scales + r * src.stride), F, run,
                                   static_cast<int>(B), dst + first, E, output_bytes);
      blk += run;
      continue;
    }
    ++blk;
    const float scale = block_scale<F>(*scales, load_segment_scale<F>(src.scales + r * src.stride));
    with_count(valid, [&](auto n) { dequantize_run<E, F>(codes, scale, n, dst + first); });
  }
}

// acc[0, width) <- (own + the pieces' block j, added in order) / post_div. E is
// the own addend's element type (unused without one).
template <ElemType E, WireFormat F, typename Count>
FP8C_HD void sum_run(const BlockCodes& pieces, const OwnAddend& own, int post_div, int64_t j, Count width,
                     float* acc) {
  const int64_t B = pieces.block_size;
  const float* lut = decode_table<F>();
  int64_t first_piece = 0;
  if (own.present) {
    const Storage<E>* s = static_cast<const Storage<E>*>(own.src) + j * B;
    const int64_t valid = std::max<int64_t>(0, std::min<int64_t>(width, own.numel - j * B));
    if (valid == static_cast<int64_t>(width)) {
      for (int64_t i = 0; i < width; ++i) acc[i] = Elem<E>::load(s[i]) * own.premul;
    } else {
      for (int64_t i = 0; i < valid; ++i) acc[i] = Elem<E>::load(s[i]) * own.premul;
      for (int64_t i = valid; i < width; ++i) acc[i] = 0.0f;
    }
  } else {
    const float scale = block_scale<F>(pieces.scales[j], load_segment_scale<F>(pieces.scales));
    const uint8_t* codes = pieces.codes + code_bytes<F>(j * B);
    for (int64_t i = 0; i < width; ++i) acc[i] = lut[load_code<F>(codes, i)] * scale;
    first_piece = 1;
  }
  for (int64_t r = first_piece; r < pieces.num_segments; ++r) {
    const float g = load_segment_scale<F>(pieces.scales + r * pieces.stride);
    const float scale = block_scale<F>(pieces.scales[r * pieces.stride + j], g);
    const uint8_t* codes = pieces.codes + r * pieces.stride + code_bytes<F>(j * B);
    for (int64_t i = 0; i < width; ++i) acc[i] += lut[load_code<F>(codes, i)] * scale;
  }
  if (post_div != 1) {
    for (int64_t i = 0; i < width; ++i) acc[i] = sum_finish(acc[i], post_div);
  }
}

template <ElemType E, WireFormat F>
FP8C_HD void sum_block(const BlockCodes& pieces, const OwnAddend& own, int post_div, int64_t j, int64_t width,
                       float* acc) {
  with_count(width, [&](auto n) { sum_run<E, F>(pieces, own, post_div, j, n, acc); });
}

// Blocks from j on that the AVX2 kernels may take: whole blocks of the output
// whose own addend (if any) is whole too.
int64_t whole_blocks_from(int64_t j, int64_t B, int64_t numel, const OwnAddend& own) {
  int64_t whole = (numel - j * B) / B;
  if (own.present) whole = std::min(whole, std::max<int64_t>(0, (own.numel - j * B) / B));
  return whole;
}

// E is the output's element type and the own addend's.
template <ElemType E, WireFormat F>
FP8C_VECTOR_CLONES void dequant_sum_blocks(const BlockCodes pieces, const OwnAddend own, int post_div,
                                           Storage<E>* dst, int64_t numel, int64_t begin, int64_t end, bool simd) {
  const int64_t B = pieces.block_size;
  float acc[kMaxBlockSize];
  for (int64_t j = begin; j < end; ++j) {
    const int64_t width = std::min(B, numel - j * B);
    const int64_t whole = simd ? std::min(end - j, whole_blocks_from(j, B, numel, own)) : 0;
    if (whole > 0) {
      avx2::dequant_sum_full_blocks(pieces, own, post_div, j, whole, dst + j * B, E);
      j += whole - 1;
      continue;
    }
    sum_block<E, F>(pieces, own, post_div, j, width, acc);
    Storage<E>* d = dst + j * B;
    for (int64_t i = 0; i < width; ++i) d[i] = Elem<E>::store(acc[i]);  // width is 32 but for the tail
  }
}

// The output capacity is whole blocks, so every block here is a full one; E
// is the own addend's element type.
template <ElemType E, WireFormat F>
FP8C_VECTOR_CLONES void dequant_sum_requantize_blocks(const BlockCodes pieces, const OwnAddend own, int post_div,
                                                      const BlockCodes out, int64_t begin, int64_t end,
                                                      Simd simd) {
  const int64_t B = pieces.block_size;
  const int64_t total_blocks = ceil_div(out.capacity, B);
  int64_t j = begin;
  const bool stochastic = out.rounding == Rounding::kStochastic;
  const float g = load_segment_scale<F>(out.scales);
  if (simd != Simd::kOff) {
    const int64_t whole = std::min(end - begin, whole_blocks_from(begin, B, out.capacity, own));
    const StochasticRun sr = stochastic ? out.stochastic_run(0, begin * B) : StochasticRun{};
    if (whole > 0 && kAvx512Kernels<F> && simd == Simd::kAvx512 && B == 32) {
      avx512::dequant_sum_requantize_blocks32(pieces, own, post_div, begin, whole,
                                              out.codes + code_bytes<F>(begin * B), out.scales + begin,
                                              stochastic ? &sr : nullptr);
    } else if (whole > 0) {
      avx2::dequant_sum_requantize_full_blocks(pieces, own, post_div, begin, whole, g,
                                               out.codes + code_bytes<F>(begin * B), out.scales + begin,
                                               stochastic ? &sr : nullptr);
    }
    j += std::max<int64_t>(0, whole);
  }
  float acc[kMaxBlockSize];
  for (; j < end; ++j) {
    const int64_t width = std::min(B, out.capacity - j * B);
    sum_block<E, F>(pieces, own, post_div, j, width, acc);
    uint8_t* codes = out.codes + code_bytes<F>(j * B);
    if (stochastic) {
      out.scales[j] = requantize_run<F>(acc, width, g, codes, StochasticEncode<F>{out.stochastic_run(0, j * B)});
    } else {
      out.scales[j] = with_count(width, [&](auto n) { return requantize_run<F>(acc, n, g, codes); });
    }
  }
  if (end == total_blocks) {
    for (int64_t k = 0; k < out.scale_padding; ++k) out.scales[total_blocks + k] = 0;
  }
}

}  // namespace

namespace {

// Switches one kernel level; returns the old setting.
bool switch_kernels(std::atomic<bool>& flag, bool enabled, bool supported, const char* what, const char* needs,
                    const char* fallback) {
  TORCH_CHECK(!enabled || supported, "fp8comm codec: ", what, "(True) needs a CPU with ", needs,
              ", and this one lacks them; ", fallback, " stay in use (same bytes). Switch it on only where the CPU "
              "has them (catch this error to find out).");
  return flag.exchange(enabled);
}

}  // namespace

bool cpu_simd_enabled() { return simd_flag().load(std::memory_order_relaxed); }

bool set_cpu_simd(bool enabled) {
  return switch_kernels(simd_flag(), enabled, avx2::supported(), "set_cpu_simd", "AVX2 and F16C", "the scalar loops");
}

bool cpu_avx512_enabled() { return avx512_flag().load(std::memory_order_relaxed); }

bool set_cpu_avx512(bool enabled) {
  return switch_kernels(avx512_flag(), enabled, avx512::supported(), "set_cpu_avx512",
                        "AVX-512 F and BW (and AVX2, F16C)", "the AVX2 kernels");
}

void quantize_cpu(const void* src, ElemType type, int64_t numel, float premul, const BlockCodes& dst) {
  check_block_size(dst.block_size, dst.format, "fp8comm codec");
  const int64_t total = dst.num_segments * ceil_div(dst.capacity, dst.block_size);
  with_codec_types(type, dst.format, [&](auto e, auto f) {
    constexpr ElemType E = decltype(e)::value;
    constexpr WireFormat F = decltype(f)::value;
    auto* s = static_cast<const Storage<E>*>(src);
    const Simd simd = simd_level();
    const int64_t B = dst.block_size;
    const auto amax_of = [&](int64_t r, int64_t j, int64_t end) {
      const int64_t seg_valid = std::min(dst.segment_numel, numel - r * dst.segment_numel);
      const int64_t n = std::min(end * B, seg_valid) - j * B;  // valid elements of the blocks
      const Storage<E>* first = s + r * dst.segment_numel + j * B;
      if (n <= 0) return 0u;
      return simd != Simd::kOff ? avx2::finite_amax(first, E, n, premul) : run_amax<E>(first, n, premul);
    };
    store_segment_scales<F>(dst, ceil_div(dst.capacity, B), grain_blocks(dst.block_size), amax_of);
    parallel_blocks(total, grain_blocks(dst.block_size), [&](int64_t b, int64_t end) {
      quantize_blocks<E, F>(s, numel, premul, dst, b, end, simd);
    });
  });
}

void dequantize_cpu(const BlockCodes& src, void* dst, ElemType type, int64_t numel, int64_t whole_output_bytes) {
  check_block_size(src.block_size, src.format, "fp8comm codec");
  const int64_t total = src.num_segments * ceil_div(src.segment_numel, src.block_size);
  with_codec_types(type, src.format, [&](auto e, auto f) {
    constexpr ElemType E = decltype(e)::value;
    constexpr WireFormat F = decltype(f)::value;
    auto* d = static_cast<Storage<E>*>(dst);
    const bool simd = simd_level() != Simd::kOff;
    const int64_t output_bytes = std::max(numel * static_cast<int64_t>(sizeof(Storage<E>)), whole_output_bytes);
    parallel_blocks(total, grain_blocks(src.block_size), [&](int64_t b, int64_t end) {
      dequantize_blocks<E, F>(src, d, numel, b, end, simd, output_bytes);
    });
  });
}

void dequant_sum_cpu(const BlockCodes& pieces, const OwnAddend& own, int post_div, void* dst, ElemType type,
                     int64_t numel) {
  check_block_size(pieces.block_size, pieces.format, "fp8comm codec");
  TORCH_CHECK(numel <= pieces.segment_numel, "fp8comm codec: dequant_sum output larger than a piece");
  TORCH_CHECK(!own.present || own.type == type, "fp8comm codec: dequant_sum's own addend must have the output's dtype");
  TORCH_CHECK(own.present || pieces.num_segments >= 1, "fp8comm codec: dequant_sum of no pieces and no own addend");
  const int64_t total = ceil_div(numel, pieces.block_size);
  with_codec_types(type, pieces.format, [&](auto e, auto f) {
    constexpr ElemType E = decltype(e)::value;
    constexpr WireFormat F = decltype(f)::value;
    auto* d = static_cast<Storage<E>*>(dst);
    const int64_t addends = pieces.num_segments + (own.present ? 1 : 0);
    const int64_t grain = std::max<int64_t>(1, grain_blocks(pieces.block_size) / addends);
    const bool simd = simd_level() != Simd::kOff;
    parallel_blocks(total, grain, [&](int64_t b, int64_t end) {
      dequant_sum_blocks<E, F>(pieces, own, post_div, d, numel, b, end, simd);
    });
  });
}

void dequant_sum_requantize_cpu(const BlockCodes& pieces, const OwnAddend& own, int post_div, const BlockCodes& out) {
  check_block_size(pieces.block_size, pieces.format, "fp8comm codec");
  TORCH_CHECK(out.block_size == pieces.block_size && out.format == pieces.format &&
                  out.capacity <= pieces.capacity,
              "fp8comm codec: dequant_sum_requantize output layout does not match its pieces");
  TORCH_CHECK(own.present || pieces.num_segments >= 1,
              "fp8comm codec: dequant_sum_requantize of no pieces and no own addend");
  const int64_t total = ceil_div(out.capacity, out.block_size);
  const int64_t addends = pieces.num_segments + (own.present ? 1 : 0);
  const int64_t grain = std::max<int64_t>(1, grain_blocks(pieces.block_size) / addends);
  const Simd simd = simd_level();
  with_codec_types(own.type, pieces.format, [&](auto e, auto f) {
    constexpr ElemType E = decltype(e)::value;
    constexpr WireFormat F = decltype(f)::value;
    const int64_t B = out.block_size;
    store_segment_scales<F>(out, total, grain, [&](int64_t, int64_t j, int64_t end) {
      uint32_t amax = 0;
      if (simd != Simd::kOff) {  // the sums of whole blocks as dequant_sum_requantize_blocks' kernels sum them
        const int64_t whole = std::min(end - j, whole_blocks_from(j, B, out.capacity, own));
        if (whole > 0) amax = avx2::dequant_sum_amax_full_blocks(pieces, own, post_div, j, whole);
        j += std::max<int64_t>(0, whole);
      }
      float acc[kMaxBlockSize];
      for (; j < end; ++j) {
        const int64_t width = std::min(B, out.capacity - j * B);
        sum_block<E, F>(pieces, own, post_div, j, width, acc);
        amax = std::max(amax, run_amax<ElemType::F32>(acc, width, 1.0f));
      }
      return amax;
    });
    parallel_blocks(total, grain, [&](int64_t b, int64_t end) {
      dequant_sum_requantize_blocks<E, F>(pieces, own, post_div, out, b, end, simd);
    });
  });
}

}  // namespace fp8comm
