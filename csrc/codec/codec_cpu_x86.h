#pragma once
// Vector pieces shared by the AVX2 and AVX-512 kernels (codec_cpu_avx2.cpp,
// codec_cpu_avx512.cpp): the scales of a group of eight 32-element blocks
// (their maxima out of one transposing reduction, the scale bytes out of
// eight-lane integer math, the same as fp8_block_math.h's scalar scale_byte),
// the fast decode's factor and precondition, and the packing of 4-bit codes.
// Include only where FP8C_HAVE_AVX2_KERNELS.
#include <immintrin.h>
#include <stdint.h>


#include "codec_cpu_avx2.h"
#include "fp8_block_math.h"

namespace fp8comm {
namespace x86 {

#define FP8C_GROUP_INLINE inline __attribute__((target("avx2,f16c"), always_inline))

constexpr int64_t kGroupBlocks = 8;  // blocks of 32 per group

FP8C_GROUP_INLINE __m256i splat(uint32_t v) { return _mm256_set1_epi32(static_cast<int>(v)); }

template <bool kMax>
FP8C_GROUP_INLINE __m256i combine(__m256i a, __m256i b) {
  return kMax ? _mm256_max_epu32(a, b) : _mm256_min_epu32(a, b);
}

// Lane b of the result: the max (min) over the eight lanes of v[b].
template <bool kMax>
FP8C_GROUP_INLINE __m256i reduce_8x8(const __m256i* v) {
  __m256i a[4], b[2];
  for (int k = 0; k < 4; ++k) {
    a[k] = combine<kMax>(_mm256_unpacklo_epi32(v[2 * k], v[2 * k + 1]), _mm256_unpackhi_epi32(v[2 * k], v[2 * k + 1]));
  }
  for (int k = 0; k < 2; ++k) {
    b[k] = combine<kMax>(_mm256_unpacklo_epi64(a[2 * k], a[2 * k + 1]), _mm256_unpackhi_epi64(a[2 * k], a[2 * k + 1]));
  }
  return combine<kMax>(_mm256_permute2x128_si256(b[0], b[1], 0x20), _mm256_permute2x128_si256(b[0], b[1], 0x31));
}

// The largest scale exponent whose code_limit is the format's largest code.
template <WireFormat F>
constexpr int largest_unlimited_exp() {
  using T = WireTraits<F>;
  int e = 127;
  for (;; --e) {  // code_limit's arithmetic, for the exponent e
    const int top = 127 - e + static_cast<int>(127 - T::kRebias);
    const int full = (top << T::kMantBits) | ((1 << T::kMantBits) - 1);
    if (top > static_cast<int>(T::kMaxCode >> T::kMantBits) || full >= static_cast<int>(T::kMaxCode)) return e;
  }
}

// Whether the grouped encode takes code subnormals too, so plain_scales lets
// them through: E2M1's one subnormal (0.5) is in nearly every block, and its
// encode is one multiply-add more; FP8 subnormals are rare.
template <WireFormat F>
constexpr bool kGroupTakesSubnormals = WireTraits<F>::kCodeBits == 4;

// From raw[b] / low[b] (per block b: eight lanes of max |x| bits, and of
// |x| bits - 1, whose min wraps zeros to the top), the eight blocks' scale
// bytes into scales[0, 8) and their inverse scales into inv[0, 8), when every
// block takes the plain encode: finite, no code limit, and (unless
// kGroupTakesSubnormals) its smallest non-zero |x| (if any) a code normal
// after scaling. Otherwise false, and nothing written.
template <WireFormat F>
FP8C_GROUP_INLINE bool plain_scales(const __m256i* raw, const __m256i* low, uint8_t* scales, float* inv) {
  using T = WireTraits<F>;
  static_assert(T::kScaleKind == ScaleKind::kE8M0, "power-of-two scales: exact inverses, no code limit below 2^127");
  const __m256i amax = reduce_8x8<true>(raw);
  const __m256i lowest = _mm256_add_epi32(reduce_8x8<false>(low), splat(1));
  // scale_exponent, eight lanes (abs bits compare as signed)
  const __m256i bump = _mm256_cmpgt_epi32(_mm256_and_si256(amax, splat(0x7FFFFF)), splat(T::kMaxMantissa));
  __m256i e = _mm256_sub_epi32(_mm256_srli_epi32(amax, 23), splat(127 + T::kMaxExp));
  e = _mm256_max_epi32(_mm256_sub_epi32(e, bump), _mm256_set1_epi32(kMinScaleExp));
  e = _mm256_andnot_si256(_mm256_cmpeq_epi32(amax, _mm256_setzero_si256()), e);
  // 2^-e, a normal float for every e in [kMinScaleExp, 127)
  const __m256 inv_scale = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_sub_epi32(splat(127), e), 23));
  const __m256i scaled_low = _mm256_castps_si256(_mm256_mul_ps(_mm256_castsi256_ps(lowest), inv_scale));
  __m256i low_ok = _mm256_or_si256(_mm256_cmpeq_epi32(lowest, _mm256_setzero_si256()),
                                   _mm256_cmpgt_epi32(scaled_low, splat(T::kMinNormalBits - 1)));
  if constexpr (kGroupTakesSubnormals<F>) low_ok = splat(0xFFFFFFFFu);
  const __m256i bad = _mm256_or_si256(
      _mm256_or_si256(_mm256_cmpgt_epi32(amax, splat(0x7F7FFFFF)),
                      _mm256_cmpgt_epi32(e, _mm256_set1_epi32(largest_unlimited_exp<F>()))),
      _mm256_andnot_si256(low_ok, splat(0xFFFFFFFFu)));
  if (!_mm256_testz_si256(bad, bad)) return false;
  const __m256i sb = _mm256_add_epi32(e, _mm256_set1_epi32(kScaleBias));
  const __m256i w = _mm256_packus_epi32(sb, sb);
  const __m128i bytes = _mm256_castsi256_si128(
      _mm256_permutevar8x32_epi32(_mm256_packus_epi16(w, w), _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4)));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(scales), bytes);
  _mm256_storeu_ps(inv, inv_scale);
  return true;
}

// decode_code of every E4M3 byte: the block scales of a kE4M3TimesSegment
// format (NVFP4) by table lookup, the same floats as the bit math.
struct E4M3Values {
  float value[256];
  E4M3Values() {
    for (int b = 0; b < 256; ++b) value[b] = decode_code<WireFormat::E4M3>(static_cast<uint8_t>(b));
  }
};

inline const float* e4m3_values() {
  static const E4M3Values table;
  return table.value;
}

// block_scale(b, g), an E4M3 byte's value from the table.
template <WireFormat F>
FP8C_GROUP_INLINE float block_scale_of(uint8_t b, float g) {
  if constexpr (WireTraits<F>::kScaleKind == ScaleKind::kE4M3TimesSegment) {
    return e4m3_values()[b] * g;
  } else {
    return block_scale<F>(b, g);
  }
}

// The multiplier of the fast decode for a block scale byte (and its
// segment's scale g), or 0 when the block must take the exact decode. FP8
// (E8M0 scales): codes placed as the top bits of fp32 lanes, so lane =
// decode_code(code) * 2^-kRebias and the factor is 2^(kRebias + e) (an
// E4M3 scale: S * 2^kRebias); 0 when that is no float, or DAZ is set in this
// thread (FP8 subnormal codes land on fp32 subnormals). 4-bit: lanes looked up in a table of exact values, lane =
// decode_code(code), so the factor is the scale block_scale itself, whatever
// the mode; 0 where that is NaN, Inf or 0 (the NaN scale, E8M0's byte 0, a
// segment scale no quantize writes): finite codes times it could be NaN, so
// those blocks take the exact decode, which writes the canonical NaN.
template <WireFormat F>
FP8C_GROUP_INLINE float raw_decode_factor(uint8_t scale_byte, float g, bool daz) {
  if constexpr (WireTraits<F>::kCodeBits == 4) {
    const float s = block_scale_of<F>(scale_byte, g);
    const uint32_t a = float_bits(s) & 0x7FFFFFFFu;
    return a == 0 || a >= 0x7F800000u ? 0.0f : s;
  } else if constexpr (WireTraits<F>::kScaleKind == ScaleKind::kE8M0) {
    const int exp = static_cast<int>(WireTraits<F>::kRebias) + static_cast<int>(scale_byte) - kScaleBias;
    return daz || exp > 127 ? 0.0f : pow2f(exp);
  } else {
    // S * 2^kRebias, exact where finite: one rounding of the same product as decode_code(code) * S.
    const float s = block_scale_of<F>(scale_byte, g) * pow2f(static_cast<int>(WireTraits<F>::kRebias));
    const uint32_t a = float_bits(s) & 0x7FFFFFFFu;
    return daz || a == 0 || a >= 0x7F800000u ? 0.0f : s;
  }
}

// Whether a block's codes hold no Inf/NaN code (so the fast decode applies);
// a format without NaN codes has none.
template <WireFormat F, typename Count>
FP8C_GROUP_INLINE bool plain_codes(const uint8_t* codes, Count B) {
  if constexpr (!WireTraits<F>::kHasNanCode) return true;
  __m128i special = _mm_setzero_si128();
  for (int64_t i = 0; i < B; i += 16) {
    const __m128i em = _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i)), _mm_set1_epi8(0x7F));
    // em >= kFirstNonFinite, unsigned
    const __m128i first = _mm_set1_epi8(static_cast<char>(WireTraits<F>::kFirstNonFinite));
    special = _mm_or_si128(special, _mm_cmpeq_epi8(_mm_max_epu8(em, first), em));
  }
  return _mm_testz_si128(special, special);
}

// Sixteen 4-bit codes, one per byte in element order, as the eight bytes the
// wire holds (element 2i in the low nibble of byte i) in the low half.
FP8C_GROUP_INLINE __m128i pack_nibbles16(__m128i bytes) {
  const __m128i pairs = _mm_maddubs_epi16(bytes, _mm_set1_epi16(0x1001));  // byte 2i + 16 * byte 2i+1
  return _mm_packus_epi16(pairs, pairs);
}

// Whether DAZ is set in this thread. Baseline x86-64 (SSE), no target
// attribute: the kernels' untargeted entry points call these two too.
inline bool denormals_are_zero() { return (_mm_getcsr() & 0x0040u) != 0; }

// Whether the kernels may skip the scalar loops' `x * premul`: premul is 1
// and denormals are not treated as zero (under DAZ, x * 1 is 0 for a
// denormal x, and the block's scale byte sees that zero).
inline bool premul_is_identity(float premul) { return premul == 1.0f && !denormals_are_zero(); }

#undef FP8C_GROUP_INLINE

}  // namespace x86
}  // namespace fp8comm
