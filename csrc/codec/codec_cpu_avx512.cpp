// The AVX-512 kernels of codec_cpu_avx512.h: the AVX2 kernels' element math
// (codec_cpu_avx2.cpp) on sixteen lanes. A group of eight 32-element blocks
// is sixteen vectors, loaded (or summed) into registers once, reduced to its
// scales (codec_cpu_x86.h) and encoded from the same registers; one vpmovdb
// packs sixteen codes (4-bit codes: then two to a byte). Every function carries its own target attribute, so
// nothing compiled for AVX-512 runs on a CPU without it; the sums are a
// multiply, then an add, as in the AVX2 and scalar loops (setup.py compiles
// with -ffp-contract=off, so no FMA fuses them).
#include "codec_cpu_avx512.h"

#if FP8C_HAVE_AVX2_KERNELS
// gcc 12 reports the self-initialized placeholder of its unmasked AVX-512
// intrinsics (_mm512_undefined_epi32's __Y) as maybe uninitialized where the
// stochastic kernels inline them (GCC PR 105593, fixed in gcc 13): noise.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include "codec_cpu_x86.h"

namespace fp8comm {
namespace avx512 {
namespace {

#define FP8C_AVX512 __attribute__((target("avx512f,avx512bw,avx2,f16c")))
#define FP8C_AVX512_INLINE inline __attribute__((target("avx512f,avx512bw,avx2,f16c"), always_inline))

constexpr int64_t kBlock = 32;
constexpr int64_t kGroup = x86::kGroupBlocks;  // blocks per group
constexpr int64_t kVectors = 2 * kGroup;       // vectors of sixteen per group
// The segment scale of the formats here (E8M0 scales, no segment scale), as
// the AVX2 kernels they hand blocks to take it.
constexpr float kUnitSegmentScale = 1.0f;


FP8C_AVX512_INLINE __m512i splat(uint32_t v) { return _mm512_set1_epi32(static_cast<int>(v)); }

template <ElemType E>
FP8C_AVX512_INLINE __m512 load16(const Storage<E>* p) {
  if constexpr (E == ElemType::F32) {
    return _mm512_loadu_ps(p);
  } else if constexpr (E == ElemType::BF16) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  } else {  // the same conversion as the AVX2 kernels' _mm256_cvtph_ps
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
}

// A block's two vectors -> eight lanes of its max |x| bits and of its
// |x| bits - 1 (whose min wraps zeros to the top): x86::plain_scales' input.
FP8C_AVX512_INLINE void block_extremes(__m512 v0, __m512 v1, __m256i& raw, __m256i& low) {
  const __m512i a0 = _mm512_and_si512(_mm512_castps_si512(v0), splat(0x7FFFFFFF));
  const __m512i a1 = _mm512_and_si512(_mm512_castps_si512(v1), splat(0x7FFFFFFF));
  const __m512i r = _mm512_max_epu32(a0, a1);
  const __m512i l = _mm512_min_epu32(_mm512_sub_epi32(a0, splat(1)), _mm512_sub_epi32(a1, splat(1)));
  raw = _mm256_max_epu32(_mm512_castsi512_si256(r), _mm512_extracti64x4_epi64(r, 1));
  low = _mm256_min_epu32(_mm512_castsi512_si256(l), _mm512_extracti64x4_epi64(l, 1));
}

// encode_code of sixteen scaled lanes that are finite and each zero or a
// code normal (the AVX2 kernels' Lanes::kNormal case), or, with
// x86::kGroupTakesSubnormals, finite (Lanes::kFinite): round to nearest even
// by integer arithmetic on the bits (subnormals: by the FPU, as encode_code),
// sign to the code's top bit, one byte per lane.
template <WireFormat F>
FP8C_AVX512_INLINE __m128i encode16(__m512 v) {
  using T = WireTraits<F>;
  constexpr int kDrop = 23 - T::kMantBits;
  const __m512i b = _mm512_castps_si512(v);
  const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(b, 32 - T::kCodeBits), splat(T::kSignBit));
  const __m512i a = _mm512_and_si512(b, splat(0x7FFFFFFF));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(a, kDrop), splat(1));
  const __m512i r = _mm512_add_epi32(_mm512_add_epi32(a, splat((1u << (kDrop - 1)) - 1u)), lsb);
  const __m512i normal = _mm512_sub_epi32(_mm512_srli_epi32(r, kDrop), splat(T::kRebias << T::kMantBits));
  // a zero lane's `normal` is negative: clamped to code 0
  __m512i code = _mm512_max_epi32(normal, _mm512_setzero_si512());
  if constexpr (x86::kGroupTakesSubnormals<F>) {
    const __m512 t = _mm512_add_ps(_mm512_mul_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(T::kSubnormalInv)),
                                   _mm512_set1_ps(8388608.0f));
    const __m512i sub = _mm512_sub_epi32(_mm512_castps_si512(t), splat(0x4B000000u));
    code = _mm512_mask_blend_epi32(_mm512_cmplt_epu32_mask(a, splat(T::kMinNormalBits)), code, sub);
  }
  return _mm512_cvtepi32_epi8(_mm512_or_si512(code, sign));
}

// Sixteen codes, a byte each in element order, to the wire at p: as they
// are, or two 4-bit codes per byte.
template <WireFormat F>
FP8C_AVX512_INLINE void store_codes16(uint8_t* p, __m128i bytes) {
  if constexpr (WireTraits<F>::kCodeBits == 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), bytes);
  } else {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), x86::pack_nibbles16(bytes));
  }
}

// ---------------------------------------------------------------- stochastic rounding
// The AVX2 kernels' rounding_bits8 and encode8_stochastic on sixteen lanes.
FP8C_AVX512_INLINE __m512i lowbias16(__m512i x) {
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  x = _mm512_mullo_epi32(x, splat(0x7FEB352Du));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
  x = _mm512_mullo_epi32(x, splat(0x846CA68Bu));
  return _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
}

FP8C_AVX512_INLINE __m512i rounding_bits16(const StochasticRun& run, int64_t i) {
  const __m512i index = _mm512_add_epi32(splat(run.first + static_cast<uint32_t>(i)),
                                         _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  return lowbias16(_mm512_xor_si512(lowbias16(_mm512_xor_si512(index, splat(run.k0))), splat(run.k1)));
}

template <WireFormat F>
FP8C_AVX512_INLINE __m128i encode16_stochastic(__m512 v, __m512i limit, __m512i rand) {
  using T = WireTraits<F>;
  constexpr int kDrop = 23 - T::kMantBits;
  constexpr int kFrac = kSubnormalFraction<F>;
  const __m512i b = _mm512_castps_si512(v);
  const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(b, 32 - T::kCodeBits), splat(T::kSignBit));
  const __m512i a = _mm512_and_si512(b, splat(0x7FFFFFFF));
  const __mmask16 subnormal = _mm512_cmplt_epu32_mask(a, splat(T::kMinNormalBits));
  const __m512i normal = _mm512_sub_epi32(
      _mm512_srli_epi32(_mm512_add_epi32(a, _mm512_srli_epi32(rand, 32 - kDrop)), kDrop), splat(T::kRebias << T::kMantBits));
  const __m512 scaled =
      _mm512_mul_ps(_mm512_castsi512_ps(_mm512_mask_blend_epi32(subnormal, _mm512_setzero_si512(), a)),
                    _mm512_set1_ps(kSubnormalFixedScale<F>));
  const __m512i sub =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(scaled), _mm512_srli_epi32(rand, 32 - kFrac)), kFrac);
  __m512i code = _mm512_mask_blend_epi32(subnormal, normal, sub);
  code = _mm512_or_si512(_mm512_min_epu32(code, limit), sign);
  __m512i special = splat(T::kNanCode);
  if constexpr (T::kHasInf) {
    special = _mm512_mask_blend_epi32(_mm512_cmpeq_epi32_mask(a, splat(0x7F800000)), special,
                                      _mm512_or_si512(splat(T::kInfCode), sign));
  }
  code = _mm512_mask_blend_epi32(_mm512_cmpgt_epu32_mask(a, splat(0x7F7FFFFF)), code, special);
  return _mm512_cvtepi32_epi8(code);
}

// One block of 32 (two vectors) quantized with stochastic rounding: the
// scale from the finite maximum (the NaN scale for a block of a format
// without NaN codes holding a non-finite lane), every lane through the stochastic encode;
// `at`: the block's first element from the run's start.
template <WireFormat F>
FP8C_AVX512_INLINE uint8_t quantize_block_stochastic(__m512 v0, __m512 v1, const StochasticRun& run, int64_t at,
                                                     uint8_t* codes) {
  const __m512i a0 = _mm512_and_si512(_mm512_castps_si512(v0), splat(0x7FFFFFFF));
  const __m512i a1 = _mm512_and_si512(_mm512_castps_si512(v1), splat(0x7FFFFFFF));
  const __m512i zero = _mm512_setzero_si512();
  const __m512i f0 = _mm512_mask_blend_epi32(_mm512_cmplt_epu32_mask(a0, splat(0x7F800000)), zero, a0);
  const __m512i f1 = _mm512_mask_blend_epi32(_mm512_cmplt_epu32_mask(a1, splat(0x7F800000)), zero, a1);
  const __m512i both = _mm512_max_epu32(f0, f1);
  const __m256i half = _mm256_max_epu32(_mm512_castsi512_si256(both), _mm512_extracti64x4_epi64(both, 1));
  __m128i m = _mm_max_epu32(_mm256_castsi256_si128(half), _mm256_extracti128_si256(half, 1));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4E));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xB1));
  const uint8_t sb = scale_byte<F>(static_cast<uint32_t>(_mm_cvtsi128_si32(m)));
  const __m512 inv = _mm512_set1_ps(inv_scale_from_byte(sb));
  const __m512i limit = splat(code_limit<F>(sb));
  store_codes16<F>(codes, encode16_stochastic<F>(_mm512_mul_ps(v0, inv), limit, rounding_bits16(run, at)));
  store_codes16<F>(codes + code_bytes<F>(16),
                   encode16_stochastic<F>(_mm512_mul_ps(v1, inv), limit, rounding_bits16(run, at + 16)));
  const __mmask16 nonfinite =
      _mm512_cmpge_epu32_mask(a0, splat(0x7F800000)) | _mm512_cmpge_epu32_mask(a1, splat(0x7F800000));
  return stored_scale_byte<F>(sb, nonfinite);
}

// The group's sixteen vectors (block b: v[2b], v[2b + 1]) into codes and
// scales; false (nothing written) unless every block takes the plain encode.
template <WireFormat F>
FP8C_AVX512_INLINE bool quantize_group(const __m512* v, uint8_t* codes, uint8_t* scales) {
  __m256i raw[kGroup], low[kGroup];
  for (int64_t b = 0; b < kGroup; ++b) block_extremes(v[2 * b], v[2 * b + 1], raw[b], low[b]);
  alignas(32) float inv[kGroup];
  if (!x86::plain_scales<F>(raw, low, scales, inv)) return false;
  for (int64_t b = 0; b < kGroup; ++b) {
    const __m512 s = _mm512_set1_ps(inv[b]);
    store_codes16<F>(codes + code_bytes<F>(kBlock * b), encode16<F>(_mm512_mul_ps(v[2 * b], s)));
    store_codes16<F>(codes + code_bytes<F>(kBlock * b + 16), encode16<F>(_mm512_mul_ps(v[2 * b + 1], s)));
  }
  return true;
}

template <ElemType E, WireFormat F, bool kPremul>
FP8C_AVX512 void quantize_run(const Storage<E>* src, int64_t blocks, float premul, uint8_t* codes, uint8_t* scales,
                              const StochasticRun* stochastic) {
  const __m512 pm = _mm512_set1_ps(premul);
  int64_t j = 0;
  if (stochastic != nullptr) {
    for (; j < blocks; ++j) {
      __m512 v0 = load16<E>(src + j * kBlock), v1 = load16<E>(src + j * kBlock + 16);
      if constexpr (kPremul) {
        v0 = _mm512_mul_ps(v0, pm);
        v1 = _mm512_mul_ps(v1, pm);
      }
      scales[j] = quantize_block_stochastic<F>(v0, v1, *stochastic, j * kBlock, codes + code_bytes<F>(j * kBlock));
    }
    return;
  }
  for (; j + kGroup <= blocks; j += kGroup) {
    __m512 v[kVectors];
    for (int64_t i = 0; i < kVectors; ++i) {
      v[i] = load16<E>(src + j * kBlock + 16 * i);
      if constexpr (kPremul) v[i] = _mm512_mul_ps(v[i], pm);  // x * 1 is x (x86::premul_is_identity)
    }
    uint8_t* c = codes + code_bytes<F>(j * kBlock);
    if (quantize_group<F>(v, c, scales + j)) continue;
    avx2::quantize_full_blocks(src + j * kBlock, E, F, kGroup, kBlock, premul, kUnitSegmentScale, c, scales + j);
  }
  if (j < blocks) {
    avx2::quantize_full_blocks(src + j * kBlock, E, F, blocks - j, kBlock, premul, kUnitSegmentScale,
                               codes + code_bytes<F>(j * kBlock), scales + j);
  }
}

// ---------------------------------------------------------------- sums
// The fast decode of sixteen codes (the AVX2 kernels' decode16_raw): code i
// placed as the top bits of an fp32 lane, so lane = decode_code(code) *
// 2^-kRebias exactly; 4-bit codes (eight bytes) looked up in a table of
// their sixteen values, lane = decode_code(code) (x86::raw_decode_factor).
template <WireFormat F>
FP8C_AVX512_INLINE __m512 decode16_raw(const uint8_t* p) {
  using T = WireTraits<F>;
  if constexpr (T::kCodeBits == 4) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    // byte 2i: byte i (its low nibble is code 2i), byte 2i + 1: byte i >> 4 (code 2i + 1); the permute reads
    // the low four bits
    const __m512i c = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(bytes, _mm_srli_epi16(bytes, 4)));
    const __m512 values = _mm512_setr_ps(
        decode_code<F>(0), decode_code<F>(1), decode_code<F>(2), decode_code<F>(3), decode_code<F>(4),
        decode_code<F>(5), decode_code<F>(6), decode_code<F>(7), decode_code<F>(8), decode_code<F>(9),
        decode_code<F>(10), decode_code<F>(11), decode_code<F>(12), decode_code<F>(13), decode_code<F>(14),
        decode_code<F>(15));
    return _mm512_permutexvar_ps(c, values);
  }
  constexpr int kShift = T::kMantBits + 1;
  const __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m512i keep = splat(0x80000000u | (0x7Fu << (23 - T::kMantBits)));
  return _mm512_castsi512_ps(_mm512_and_si512(_mm512_srai_epi32(_mm512_slli_epi32(c, 24), kShift), keep));
}

// Blocks [j, j + 8) of the sum, formed as the AVX2 kernels' sum_block forms it
// (the own addend times its factor, or else piece 0; then the other pieces in
// rank order; then the division), into v; false when a piece's block needs
// the exact decode (then the AVX2 kernels take the group).
template <ElemType E, WireFormat F>
FP8C_AVX512_INLINE bool sum_group(const BlockCodes& pieces, const Storage<E>* own, float own_premul, int post_div,
                                  int64_t j, bool daz, __m512* v) {
  constexpr int64_t kMaxFastPieces = 64;  // as the AVX2 kernels
  if (pieces.num_segments > kMaxFastPieces) return false;
  if (own != nullptr) {  // the own input streams from memory: ask for it two groups ahead
    const char* ahead = reinterpret_cast<const char*>(own + (j + 2 * kGroup) * kBlock);
    for (int64_t b = 0; b < static_cast<int64_t>(kGroup * kBlock * sizeof(Storage<E>)); b += 64) {
      _mm_prefetch(ahead + b, _MM_HINT_T0);
    }
  }
  const __m512 premul = _mm512_set1_ps(own_premul);
  for (int64_t b = 0; b < kGroup; ++b) {
    const int64_t blk = j + b;
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    if (own != nullptr) {
      s0 = _mm512_mul_ps(load16<E>(own + blk * kBlock), premul);
      s1 = _mm512_mul_ps(load16<E>(own + blk * kBlock + 16), premul);
    }
    for (int64_t r = 0; r < pieces.num_segments; ++r) {
      const int64_t at = r * pieces.stride;
      const uint8_t* c = pieces.codes + at + code_bytes<F>(blk * kBlock);
      const float g = load_segment_scale<F>(pieces.scales + at);
      const float factor = x86::raw_decode_factor<F>(pieces.scales[at + blk], g, daz);
      if (factor == 0.0f || !x86::plain_codes<F>(c, kBlock)) return false;
      const __m512 f = _mm512_set1_ps(factor);
      const __m512 d0 = _mm512_mul_ps(decode16_raw<F>(c), f);
      const __m512 d1 = _mm512_mul_ps(decode16_raw<F>(c + code_bytes<F>(16)), f);
      if (own == nullptr && r == 0) {
        s0 = d0;
        s1 = d1;
      } else {
        s0 = _mm512_add_ps(s0, d0);
        s1 = _mm512_add_ps(s1, d1);
      }
    }
    if (post_div != 1) {
      const __m512 div = _mm512_set1_ps(static_cast<float>(post_div));
      s0 = _mm512_div_ps(s0, div);
      s1 = _mm512_div_ps(s1, div);
    }
    v[2 * b] = s0;
    v[2 * b + 1] = s1;
  }
  return true;
}

// The run from block j on (stochastic rounding's bits continue where they are).
FP8C_AVX512_INLINE const StochasticRun* run_from(const StochasticRun* run, int64_t blocks_in, StochasticRun& at) {
  if (run == nullptr) return nullptr;
  at = *run;
  at.first += static_cast<uint32_t>(blocks_in * kBlock);
  return &at;
}

template <ElemType E, WireFormat F>
FP8C_AVX512 void sum_requantize_run(const BlockCodes& pieces, const OwnAddend& addend, int post_div, int64_t j0,
                                    int64_t blocks, uint8_t* codes, uint8_t* scales, const StochasticRun* stochastic) {
  const auto* own = addend.present ? static_cast<const Storage<E>*>(addend.src) : nullptr;
  const bool daz = x86::denormals_are_zero();
  StochasticRun rest;
  int64_t j = j0;
  for (; j + kGroup <= j0 + blocks; j += kGroup) {
    uint8_t* c = codes + code_bytes<F>((j - j0) * kBlock);
    uint8_t* s = scales + (j - j0);
    __m512 v[kVectors];
    if (sum_group<E, F>(pieces, own, addend.premul, post_div, j, daz, v)) {
      if (stochastic == nullptr && quantize_group<F>(v, c, s)) continue;
      if (stochastic != nullptr) {
        for (int64_t b = 0; b < kGroup; ++b) {
          s[b] = quantize_block_stochastic<F>(v[2 * b], v[2 * b + 1], *stochastic, (j - j0 + b) * kBlock,
                                              c + code_bytes<F>(b * kBlock));
        }
        continue;
      }
    }
    avx2::dequant_sum_requantize_full_blocks(pieces, addend, post_div, j, kGroup, kUnitSegmentScale, c, s,
                                             run_from(stochastic, j - j0, rest));
  }
  if (j < j0 + blocks) {
    avx2::dequant_sum_requantize_full_blocks(pieces, addend, post_div, j, j0 + blocks - j, kUnitSegmentScale,
                                             codes + code_bytes<F>((j - j0) * kBlock), scales + (j - j0),
                                             run_from(stochastic, j - j0, rest));
  }
}

}  // namespace

bool supported() {
  static const bool ok =
      avx2::supported() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  return ok;
}

void quantize_blocks32(const void* src, ElemType type, WireFormat format, int64_t blocks, float premul,
                       uint8_t* codes, uint8_t* scales, const StochasticRun* stochastic) {
  with_codec_types_of_kind<ScaleKind::kE8M0>(type, format, [&](auto e, auto f) {
    constexpr ElemType E = decltype(e)::value;
    constexpr WireFormat F = decltype(f)::value;
    auto* s = static_cast<const Storage<E>*>(src);
    if (x86::premul_is_identity(premul)) {
      quantize_run<E, F, false>(s, blocks, premul, codes, scales, stochastic);
    } else {
      quantize_run<E, F, true>(s, blocks, premul, codes, scales, stochastic);
    }
  });
}

void dequant_sum_requantize_blocks32(const BlockCodes& pieces, const OwnAddend& own, int post_div,
                                     int64_t first_block, int64_t blocks, uint8_t* codes, uint8_t* scales,
                                     const StochasticRun* stochastic) {
  with_codec_types_of_kind<ScaleKind::kE8M0>(own.type, pieces.format, [&](auto e, auto f) {
    sum_requantize_run<decltype(e)::value, decltype(f)::value>(pieces, own, post_div, first_block, blocks, codes,
                                                               scales, stochastic);
  });
}

}  // namespace avx512
}  // namespace fp8comm

#endif  // FP8C_HAVE_AVX2_KERNELS
