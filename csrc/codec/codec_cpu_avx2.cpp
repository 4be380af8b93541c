// The CPU codec's full blocks in hand-written AVX2: the same element math as
// fp8_block_math.h, eight lanes at a time, so the bytes are identical to the
// scalar loops' (tests/codec/test_codec_simd.py compares them on every bit pattern
// class). Torch-free, and every function here carries its own target
// attribute instead of a file-wide pragma, so nothing compiled for AVX2 can
// leak into code that runs on a CPU without it.
#include "codec_cpu_avx2.h"

#if FP8C_HAVE_AVX2_KERNELS
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <type_traits>

#include "codec_cpu_x86.h"

namespace fp8comm {
namespace avx2 {
namespace {

#define FP8C_AVX2 __attribute__((target("avx2,f16c")))
#define FP8C_AVX2_INLINE inline __attribute__((target("avx2,f16c"), always_inline))

// The block size: the one a format requires (NVFP4's 16; the codec has
// checked it) or the default 32 as a compile-time constant (loops unroll,
// constants stay in registers), any other multiple of 16 at run time.
using Block32 = std::integral_constant<int64_t, 32>;

template <WireFormat F, typename Fn>
void with_block(int block_size, Fn&& fn) {
  constexpr int kRequired = WireTraits<F>::kBlockSize;
  if constexpr (kRequired != 0) {
    fn(std::integral_constant<int64_t, kRequired>{});
  } else if (block_size == 32) {
    fn(Block32{});
  } else {
    fn(static_cast<int64_t>(block_size));
  }
}

// Whether a format's block scales are powers of two (E8M0): encoding is then
// an exact multiply by the inverse scale, and the encode of a block's maximum
// never exceeds the largest code below the code limit, so the kNormal and
// kFinite encodes and the grouped quantize apply. Other scale kinds divide,
// and a quotient may round onto the code past the largest: every lane clamps.
template <WireFormat F>
constexpr bool kPow2Scales = WireTraits<F>::kScaleKind == ScaleKind::kE8M0;

using x86::splat;

// ---------------------------------------------------------------- element I/O
template <ElemType E>
FP8C_AVX2_INLINE __m256 load8(const Storage<E>* p) {
  if constexpr (E == ElemType::F32) {
    return _mm256_loadu_ps(p);
  } else if constexpr (E == ElemType::BF16) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  } else {  // exact for every finite half; non-finite stays non-finite (all the encoder looks at)
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
}

// Eight uint32 lanes holding values < 2^16 -> eight uint16.
FP8C_AVX2_INLINE __m128i narrow16(__m256i v) {
  const __m256i packed = _mm256_packus_epi32(v, v);  // [0-3 0-3 | 4-7 4-7]
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

// Every NaN lane -> kCanonicalNanF32 (an unordered compare and a blend). As a
// 16-bit store's input it converts to that dtype's canonical NaN: its high
// half is kCanonicalNanBf16, and F16C narrows it to kCanonicalNanF16.
FP8C_AVX2_INLINE __m256 canonical_nan8(__m256 v) {
  return _mm256_blendv_ps(v, _mm256_castsi256_ps(splat(kCanonicalNanF32)), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}

// Elem<E>::store of eight lanes.
template <ElemType E>
FP8C_AVX2_INLINE void store8(Storage<E>* p, __m256 v) {
  v = canonical_nan8(v);
  if constexpr (E == ElemType::F32) {
    _mm256_storeu_ps(p, v);
  } else if constexpr (E == ElemType::BF16) {  // float_to_bf16's rounding (no NaN but the canonical one is left)
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), splat(1));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, splat(0x7FFF)), lsb), 16);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), narrow16(rounded));
  } else {  // float_to_f16: F16C rounds to nearest even like it
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
}

// ---------------------------------------------------------------- codes
// finite_abs_bits of eight lanes.
FP8C_AVX2_INLINE __m256i finite_abs(__m256 v) {
  const __m256i a = _mm256_and_si256(_mm256_castps_si256(v), splat(0x7FFFFFFF));
  return _mm256_and_si256(a, _mm256_cmpgt_epi32(splat(0x7F800000), a));
}

FP8C_AVX2_INLINE uint32_t max_lane(__m256i v) {
  __m128i m = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4E));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xB1));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(m));
}

FP8C_AVX2_INLINE uint32_t min_lane(__m256i v) {
  __m128i m = _mm_min_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  m = _mm_min_epu32(m, _mm_shuffle_epi32(m, 0x4E));
  m = _mm_min_epu32(m, _mm_shuffle_epi32(m, 0xB1));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(m));
}

// What a block's lanes are known to be, from most to least special-cased:
// kNormal: finite, each zero or in the code's normal range after scaling, and the
// code limit is the format's largest code; kFinite: finite with that limit
// (subnormals possible); kLimited: finite, any code limit (clamped to it);
// kAny: anything (Inf/NaN too).
enum class Lanes { kNormal, kFinite, kLimited, kAny };

// encode_code of eight lanes, as uint32 codes; the cases `L` excludes skipped.
template <WireFormat F, Lanes L>
FP8C_AVX2_INLINE __m256i encode8(__m256 v, __m256i limit) {
  using T = WireTraits<F>;
  constexpr int kDrop = 23 - T::kMantBits;
  const __m256i b = _mm256_castps_si256(v);
  const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(b, 32 - T::kCodeBits), splat(T::kSignBit));
  const __m256i a = _mm256_and_si256(b, splat(0x7FFFFFFF));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(a, kDrop), splat(1));
  const __m256i r = _mm256_add_epi32(_mm256_add_epi32(a, splat((1u << (kDrop - 1)) - 1u)), lsb);
  const __m256i normal = _mm256_sub_epi32(_mm256_srli_epi32(r, kDrop), splat(T::kRebias << T::kMantBits));
  // a zero lane's `normal` is negative: clamped to code 0
  if constexpr (L == Lanes::kNormal) return _mm256_or_si256(_mm256_max_epi32(normal, _mm256_setzero_si256()), sign);
  const __m256 t = _mm256_add_ps(_mm256_mul_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(T::kSubnormalInv)),
                                 _mm256_set1_ps(8388608.0f));
  const __m256i sub = _mm256_sub_epi32(_mm256_castps_si256(t), splat(0x4B000000u));
  __m256i code = _mm256_blendv_epi8(normal, sub, _mm256_cmpgt_epi32(splat(T::kMinNormalBits), a));
  if constexpr (L == Lanes::kFinite) return _mm256_or_si256(code, sign);
  code = _mm256_or_si256(_mm256_min_epu32(code, limit), sign);
  if constexpr (L == Lanes::kLimited) return code;
  __m256i special = splat(T::kNanCode);
  if constexpr (T::kHasInf) {
    special = _mm256_blendv_epi8(special, _mm256_or_si256(splat(T::kInfCode), sign),
                                 _mm256_cmpeq_epi32(a, splat(0x7F800000)));
  }
  return _mm256_blendv_epi8(code, special, _mm256_cmpgt_epi32(a, splat(0x7F7FFFFF)));
}

// ---------------------------------------------------------------- stochastic rounding
// rounding.h's lowbias32 and rounding_bits, eight lanes: the bits of elements
// run.first + i .. run.first + i + 7 of the run's segment.
FP8C_AVX2_INLINE __m256i lowbias8(__m256i x) {
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  x = _mm256_mullo_epi32(x, splat(0x7FEB352Du));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
  x = _mm256_mullo_epi32(x, splat(0x846CA68Bu));
  return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}

FP8C_AVX2_INLINE __m256i rounding_bits8(const StochasticRun& run, int64_t i) {
  const __m256i index =
      _mm256_add_epi32(splat(run.first + static_cast<uint32_t>(i)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  return lowbias8(_mm256_xor_si256(lowbias8(_mm256_xor_si256(index, splat(run.k0))), splat(run.k1)));
}

// encode_code_stochastic of eight lanes (any lanes), as uint32 codes.
template <WireFormat F>
FP8C_AVX2_INLINE __m256i encode8_stochastic(__m256 v, __m256i limit, __m256i rand) {
  using T = WireTraits<F>;
  constexpr int kDrop = 23 - T::kMantBits;
  constexpr int kFrac = kSubnormalFraction<F>;
  const __m256i b = _mm256_castps_si256(v);
  const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(b, 32 - T::kCodeBits), splat(T::kSignBit));
  const __m256i a = _mm256_and_si256(b, splat(0x7FFFFFFF));
  const __m256i subnormal = _mm256_cmpgt_epi32(splat(T::kMinNormalBits), a);
  const __m256i normal = _mm256_sub_epi32(
      _mm256_srli_epi32(_mm256_add_epi32(a, _mm256_srli_epi32(rand, 32 - kDrop)), kDrop), splat(T::kRebias << T::kMantBits));
  const __m256 scaled =
      _mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(a, subnormal)), _mm256_set1_ps(kSubnormalFixedScale<F>));
  const __m256i sub =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(scaled), _mm256_srli_epi32(rand, 32 - kFrac)), kFrac);
  __m256i code = _mm256_blendv_epi8(normal, sub, subnormal);
  code = _mm256_or_si256(_mm256_min_epu32(code, limit), sign);
  __m256i special = splat(T::kNanCode);
  if constexpr (T::kHasInf) {
    special = _mm256_blendv_epi8(special, _mm256_or_si256(splat(T::kInfCode), sign),
                                 _mm256_cmpeq_epi32(a, splat(0x7F800000)));
  }
  return _mm256_blendv_epi8(code, special, _mm256_cmpgt_epi32(a, splat(0x7F7FFFFF)));
}

// Two vectors of eight uint32 codes (< 256) -> their sixteen wire codes at p:
// a byte each, or two 4-bit codes per byte.
template <WireFormat F>
FP8C_AVX2_INLINE void store_codes16(uint8_t* p, __m256i lo, __m256i hi) {
  const __m256i w = _mm256_packus_epi32(lo, hi);  // [lo0-3 hi0-3 | lo4-7 hi4-7] as uint16
  const __m256i b = _mm256_packus_epi16(w, w);    // dwords: lo0-3 hi0-3 lo0-3 hi0-3 | lo4-7 hi4-7 ..
  const __m256i ordered = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 0, 4, 1, 5));
  const __m128i bytes = _mm256_castsi256_si128(ordered);
  if constexpr (WireTraits<F>::kCodeBits == 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), bytes);
  } else {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), x86::pack_nibbles16(bytes));
  }
}

// decode_code of eight 4-bit codes in the low bits of c's lanes (bits above
// ignored): the magnitude from a table of the eight values (the permute reads
// the low three bits), the sign from bit 3. Exact: the same floats as the
// scalar loops' table, whatever the rounding and denormal modes.
template <WireFormat F>
FP8C_AVX2_INLINE __m256 decode_nibbles8(__m256i c) {
  const __m256 magnitude = _mm256_setr_ps(decode_code<F>(0), decode_code<F>(1), decode_code<F>(2), decode_code<F>(3),
                                          decode_code<F>(4), decode_code<F>(5), decode_code<F>(6), decode_code<F>(7));
  const __m256i sign = _mm256_and_si256(_mm256_slli_epi32(c, 32 - WireTraits<F>::kCodeBits), splat(0x80000000u));
  return _mm256_or_ps(_mm256_permutevar8x32_ps(magnitude, c), _mm256_castsi256_ps(sign));
}

// The eight 4-bit codes of the four wire bytes at p, code i in the low bits
// of lane i (the later codes of its byte word above them).
FP8C_AVX2_INLINE __m256i nibbles8(const uint8_t* p) {
  uint32_t four;
  memcpy(&four, p, 4);
  return _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(four)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
}

// decode_code of eight 8-bit codes, one in each lane (any codes).
template <WireFormat F>
FP8C_AVX2_INLINE __m256 decode_bytes8(__m256i c) {
  using T = WireTraits<F>;
  const __m256i em = _mm256_and_si256(c, splat(0x7F));
  const __m256i normal = _mm256_add_epi32(_mm256_slli_epi32(em, 23 - T::kMantBits), splat(T::kRebias << 23));
  const __m256i mant = _mm256_and_si256(em, splat((1u << T::kMantBits) - 1u));
  const __m256i sub =
      _mm256_castps_si256(_mm256_mul_ps(_mm256_cvtepi32_ps(mant), _mm256_set1_ps(1.0f / T::kSubnormalInv)));
  __m256i bits = _mm256_blendv_epi8(normal, sub, _mm256_cmpgt_epi32(splat(1u << T::kMantBits), em));
  bits = _mm256_blendv_epi8(bits, splat(0x7FC00000u), _mm256_cmpgt_epi32(em, splat(T::kFirstNonFinite - 1)));
  if constexpr (T::kHasInf) {
    bits = _mm256_blendv_epi8(bits, splat(0x7F800000u), _mm256_cmpeq_epi32(em, splat(T::kInfCode)));
  }
  return _mm256_castsi256_ps(_mm256_or_si256(bits, _mm256_slli_epi32(_mm256_and_si256(c, splat(0x80)), 24)));
}

// decode_code of the eight codes at p (eight bytes, or four of 4-bit codes), any codes.
template <WireFormat F>
FP8C_AVX2_INLINE __m256 decode8(const uint8_t* p) {
  if constexpr (WireTraits<F>::kCodeBits == 4) {
    return decode_nibbles8<F>(nibbles8(p));
  } else {
    return decode_bytes8<F>(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
}

// The fast decode: eight codes placed as the top bits of fp32 lanes, so that
// lane = decode_code(code) * 2^-kRebias exactly (FP8 subnormals land on fp32
// subnormals). One multiply by 2^(kRebias + e) then gives decode * 2^e with
// the same single rounding as the scalar `decode * scale`. Valid when no code
// is Inf/NaN, 2^(kRebias + e) is a float, and denormals are not treated as zero.
// 4-bit codes decode exactly (decode8), and their factor is the scale
// (x86::raw_decode_factor).
template <WireFormat F>
FP8C_AVX2_INLINE __m256 decode8_raw(const uint8_t* p) {
  using T = WireTraits<F>;
  if constexpr (T::kCodeBits == 4) return decode8<F>(p);
  int64_t eight;
  memcpy(&eight, p, 8);
  // code i to the top byte of lane i: each 128-bit half of the shuffle sees all eight codes
  const __m256i top = _mm256_shuffle_epi8(
      _mm256_set1_epi64x(eight), _mm256_setr_epi8(-1, -1, -1, 0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3,  //
                                                  -1, -1, -1, 4, -1, -1, -1, 5, -1, -1, -1, 6, -1, -1, -1, 7));
  // sign stays at bit 31; exponent and mantissa move down to fp32's top exponent/mantissa bits
  constexpr int kShift = T::kMantBits + 1;  // bits 30..24 -> 30-kShift..24-kShift
  const uint32_t keep = 0x80000000u | (0x7Fu << (23 - T::kMantBits));
  return _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi32(top, kShift), splat(keep)));
}

// decode8_raw of sixteen codes, as two vectors: one 16-byte load, two shuffles
// (4-bit codes: two 4-byte loads).
template <WireFormat F>
FP8C_AVX2_INLINE void decode16_raw(const uint8_t* p, __m256& lo, __m256& hi) {
  using T = WireTraits<F>;
  if constexpr (T::kCodeBits == 4) {
    lo = decode8<F>(p);
    hi = decode8<F>(p + 4);
    return;
  }
  const __m256i c = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i to_lo = _mm256_setr_epi8(-1, -1, -1, 0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3,  //
                                         -1, -1, -1, 4, -1, -1, -1, 5, -1, -1, -1, 6, -1, -1, -1, 7);
  const __m256i to_hi = _mm256_setr_epi8(-1, -1, -1, 8, -1, -1, -1, 9, -1, -1, -1, 10, -1, -1, -1, 11,  //
                                         -1, -1, -1, 12, -1, -1, -1, 13, -1, -1, -1, 14, -1, -1, -1, 15);
  constexpr int kShift = T::kMantBits + 1;
  const __m256i keep = splat(0x80000000u | (0x7Fu << (23 - T::kMantBits)));
  lo = _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi32(_mm256_shuffle_epi8(c, to_lo), kShift), keep));
  hi = _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi32(_mm256_shuffle_epi8(c, to_hi), kShift), keep));
}

using x86::plain_codes;
using x86::denormals_are_zero;
using x86::raw_decode_factor;

// ---------------------------------------------------------------- blocks
// The lanes a block is quantized from, as functors (a lambda would not carry
// the target attribute, so the intrinsics could not be inlined into it).
template <ElemType E, bool kPremul>
struct ScaledInput {
  const Storage<E>* src;
  __m256 premul;
  FP8C_AVX2_INLINE __m256 operator()(int64_t i) const {
    const __m256 x = load8<E>(src + 8 * i);
    return kPremul ? _mm256_mul_ps(x, premul) : x;  // x * 1 is x (x86::premul_is_identity)
  }
};

struct Accumulated {
  const float* acc;
  FP8C_AVX2_INLINE __m256 operator()(int64_t i) const { return _mm256_load_ps(acc + 8 * i); }
};

// to_code_units of eight lanes: x times the inverse scale (E8M0, exact), or
// x divided by the scale (correctly rounded, as the scalar division).
template <WireFormat F>
FP8C_AVX2_INLINE __m256 to_code_units8(__m256 x, __m256 factor) {
  if constexpr (kPow2Scales<F>) {
    return _mm256_mul_ps(x, factor);
  } else {
    return _mm256_div_ps(x, factor);
  }
}

// One block of B (a multiple of 16) float lanes `x(i)` (i counts vectors of
// eight) quantized into codes with a block_encoding's factor and limit.
template <WireFormat F, Lanes L, typename Source>
FP8C_AVX2_INLINE void encode_scaled(Source x, int64_t vectors, __m256 factor, __m256i limit, uint8_t* codes) {
  for (int64_t i = 0; i < vectors; i += 2) {
    store_codes16<F>(codes + code_bytes<F>(8 * i), encode8<F, L>(to_code_units8<F>(x(i), factor), limit),
                     encode8<F, L>(to_code_units8<F>(x(i + 1), factor), limit));
  }
}

template <WireFormat F, Lanes L, typename Source>
FP8C_AVX2_INLINE void encode_block(Source x, int64_t vectors, const BlockEncoding& enc, uint8_t* codes) {
  encode_scaled<F, L>(x, vectors, _mm256_set1_ps(enc.factor), splat(enc.limit), codes);
}

// One block quantized; returns its scale byte. g: its segment's scale.
template <WireFormat F, typename Source>
FP8C_AVX2_INLINE uint8_t quantize_block(Source x, int64_t vectors, float g, uint8_t* codes) {
  // First the max of |x| over all lanes, non-finite ones included (when it is
  // finite it is the block amax), and the smallest non-zero |x| (a - 1 wraps
  // zeros to the top): they tell which encode applies.
  __m256i raw = _mm256_setzero_si256();
  __m256i low = _mm256_set1_epi32(-1);
  for (int64_t i = 0; i < vectors; ++i) {
    const __m256i a = _mm256_and_si256(_mm256_castps_si256(x(i)), splat(0x7FFFFFFF));
    raw = _mm256_max_epu32(raw, a);
    if constexpr (kPow2Scales<F>) low = _mm256_min_epu32(low, _mm256_sub_epi32(a, splat(1)));
  }
  const uint32_t raw_max = max_lane(raw);
  if (raw_max < 0x7F800000u) {
    const uint8_t sb = block_scale_byte<F>(raw_max, g);
    const BlockEncoding enc = block_encoding<F>(sb, g);
    if (kPow2Scales<F> && enc.limit == WireTraits<F>::kMaxCode) {
      // the smallest non-zero lane, scaled as encode_block scales it (monotonic)
      const uint32_t lowest = min_lane(low) + 1u;
      if (lowest == 0 || float_bits(bits_float(lowest) * enc.factor) >= WireTraits<F>::kMinNormalBits) {
        encode_block<F, Lanes::kNormal>(x, vectors, enc, codes);
      } else {
        encode_block<F, Lanes::kFinite>(x, vectors, enc, codes);
      }
    } else if (enc.factor != 0.0f) {
      encode_block<F, Lanes::kLimited>(x, vectors, enc, codes);
    } else {  // a subnormal amax under DAZ: quotients by 0 are not finite
      encode_block<F, Lanes::kAny>(x, vectors, enc, codes);
    }
    return sb;
  }
  __m256i amax = _mm256_setzero_si256();
  for (int64_t i = 0; i < vectors; ++i) amax = _mm256_max_epu32(amax, finite_abs(x(i)));
  const uint8_t sb = block_scale_byte<F>(max_lane(amax), g);
  encode_block<F, Lanes::kAny>(x, vectors, block_encoding<F>(sb, g), codes);
  return stored_scale_byte<F>(sb, raw_max >= 0x7F800000u);
}

// One block quantized with stochastic rounding: the scale from the finite
// maximum, as quantize_block's (the NaN scale for a block of a format without
// NaN codes holding a non-finite lane), then every lane through the stochastic encode;
// `at`: the block's first element from the run's start.
template <WireFormat F, typename Source>
FP8C_AVX2_INLINE uint8_t quantize_block_stochastic(Source x, int64_t vectors, float g, const StochasticRun& run,
                                                   int64_t at, uint8_t* codes) {
  __m256i raw = _mm256_setzero_si256();  // max |x| bits, non-finite lanes included
  __m256i amax = _mm256_setzero_si256();
  for (int64_t i = 0; i < vectors; ++i) {
    const __m256 v = x(i);
    raw = _mm256_max_epu32(raw, _mm256_and_si256(_mm256_castps_si256(v), splat(0x7FFFFFFF)));
    amax = _mm256_max_epu32(amax, finite_abs(v));
  }
  const uint8_t sb = block_scale_byte<F>(max_lane(amax), g);
  const BlockEncoding enc = block_encoding<F>(sb, g);
  const __m256 factor = _mm256_set1_ps(enc.factor);
  const __m256i limit = splat(enc.limit);
  for (int64_t i = 0; i < vectors; i += 2) {
    const __m256i lo =
        encode8_stochastic<F>(to_code_units8<F>(x(i), factor), limit, rounding_bits8(run, at + 8 * i));
    const __m256i hi =
        encode8_stochastic<F>(to_code_units8<F>(x(i + 1), factor), limit, rounding_bits8(run, at + 8 * i + 8));
    store_codes16<F>(codes + code_bytes<F>(8 * i), lo, hi);
  }
  return stored_scale_byte<F>(sb, max_lane(raw) >= 0x7F800000u);
}

// ---------------------------------------------------------------- 8 blocks of 32
// The default block size quantizes eight blocks at a time: their maxima come
// out of one transposing reduction and their scales out of vector math
// (codec_cpu_x86.h), so no block waits on a horizontal reduction and a
// scalar branch before it encodes. Groups where any block needs more than the
// kNormal encode (4-bit codes: the kFinite one, x86::kGroupTakesSubnormals)
// take quantize_block.
constexpr int64_t kGroup = x86::kGroupBlocks;

// The lanes of x from vector `by` on.
template <typename Source>
struct Shifted {
  Source x;
  int64_t by;
  FP8C_AVX2_INLINE __m256 operator()(int64_t i) const { return x(by + i); }
};

// Eight blocks of 32 lanes x(0..31) (block b: x(4b..4b+3)) into codes and
// scales; false (nothing written) when a block needs quantize_block.
template <WireFormat F, typename Source>
FP8C_AVX2_INLINE bool quantize_group_normal(Source x, uint8_t* codes, uint8_t* scales) {
  using T = WireTraits<F>;
  constexpr Lanes L = x86::kGroupTakesSubnormals<F> ? Lanes::kFinite : Lanes::kNormal;
  __m256i raw[kGroup], low[kGroup];
  for (int64_t b = 0; b < kGroup; ++b) {  // quantize_block's first pass, per block
    raw[b] = _mm256_setzero_si256();
    low[b] = _mm256_set1_epi32(-1);
    for (int64_t i = 4 * b; i < 4 * b + 4; ++i) {
      const __m256i a = _mm256_and_si256(_mm256_castps_si256(x(i)), splat(0x7FFFFFFF));
      raw[b] = _mm256_max_epu32(raw[b], a);
      low[b] = _mm256_min_epu32(low[b], _mm256_sub_epi32(a, splat(1)));
    }
  }
  alignas(32) float inv_of[kGroup];
  if (!x86::plain_scales<F>(raw, low, scales, inv_of)) return false;
  const __m256i limit = splat(T::kMaxCode);
  for (int64_t b = 0; b < kGroup; ++b) {
    encode_scaled<F, L>(Shifted<Source>{x, 4 * b}, 4, _mm256_set1_ps(inv_of[b]), limit, codes + code_bytes<F>(32 * b));
  }
  return true;
}

// ---------------------------------------------------------------- 8 blocks, E4M3 scales
// A format whose block scales are E4M3 bytes times the segment scale g
// (kE4M3TimesSegment) quantizes eight blocks at a time too: block_scale_byte
// and block_encoding of eight finite maxima in lanes, the same operations in
// the same order as the scalar functions, so the same bytes.

// Eight E4M3 scale bytes (lanes, < 256) -> scales[0, 8).
FP8C_AVX2_INLINE void store_bytes8(__m256i v, uint8_t* scales) {
  const __m256i w = _mm256_packus_epi32(v, v);
  const __m128i bytes = _mm256_castsi256_si128(
      _mm256_permutevar8x32_epi32(_mm256_packus_epi16(w, w), _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4)));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(scales), bytes);
}

// block_scale_byte of eight blocks (lanes: their finite amax bits) into
// scales[0, 8), and their scales block_scale into scale[0, 8), when every
// block's block_encoding limit is the format's largest code and no scale is
// 0; otherwise false, and nothing written.
template <WireFormat F>
FP8C_AVX2_INLINE bool e4m3_segment_scales8(__m256i amax, float g, uint8_t* scales, float* scale) {
  using T = WireTraits<F>;
  constexpr WireFormat S = WireFormat::E4M3;
  static_assert(T::kScaleKind == ScaleKind::kE4M3TimesSegment, "E4M3 block scales times a segment scale");
  const __m256 a = _mm256_castsi256_ps(amax);
  // c = encode(amax / (max * g)), one code higher where value(c) * kRoundsToMax * g < amax
  __m256i c = encode8<S, Lanes::kAny>(_mm256_div_ps(a, _mm256_set1_ps(T::kMax * g)), splat(WireTraits<S>::kMaxCode));
  const __m256 ceiling = _mm256_mul_ps(decode_bytes8<S>(c), _mm256_set1_ps(T::kRoundsToMax * g));
  c = _mm256_sub_epi32(c, _mm256_castps_si256(_mm256_cmp_ps(ceiling, a, _CMP_LT_OQ)));
  c = _mm256_blendv_epi8(c, splat(kE4M3One), _mm256_cmpeq_epi32(amax, _mm256_setzero_si256()));
  const __m256 s = _mm256_mul_ps(decode_bytes8<S>(c), _mm256_set1_ps(g));
  // block_encoding's limit: the largest code while its value times the scale is at most FLT_MAX;
  // and no scale 0 (a subnormal amax under DAZ), whose quotients are not finite
  const __m256 top = _mm256_mul_ps(_mm256_set1_ps(decode_code<F>(static_cast<uint8_t>(T::kMaxCode))), s);
  const __m256 within = _mm256_and_ps(_mm256_cmp_ps(top, _mm256_set1_ps(3.4028234663852886e38f), _CMP_LE_OQ),
                                      _mm256_cmp_ps(s, _mm256_setzero_ps(), _CMP_NEQ_OQ));
  if (_mm256_movemask_ps(within) != 0xFF) return false;
  store_bytes8(c, scales);
  _mm256_storeu_ps(scale, s);
  return true;
}

// Eight blocks of kB lanes from x(0) (block b: vectors b * kB / 8 on) into
// codes and scales, nearest or stochastic (`stochastic`: the run, `at` its
// first block's first element from the run's start); false (nothing
// written) when a block holds a non-finite lane or has a code limit below
// the largest code, which quantize_block takes.
template <WireFormat F, int64_t kB, typename Source>
FP8C_AVX2_INLINE bool quantize_group_e4m3_scaled(Source x, float g, const StochasticRun* stochastic, int64_t at,
                                                 uint8_t* codes, uint8_t* scales) {
  constexpr int64_t kVectors = kB / 8;  // per block
  __m256i raw[kGroup];
  for (int64_t b = 0; b < kGroup; ++b) {
    raw[b] = _mm256_setzero_si256();
    for (int64_t i = kVectors * b; i < kVectors * (b + 1); ++i) {
      raw[b] = _mm256_max_epu32(raw[b], _mm256_and_si256(_mm256_castps_si256(x(i)), splat(0x7FFFFFFF)));
    }
  }
  const __m256i amax = x86::reduce_8x8<true>(raw);
  if (!_mm256_testz_si256(_mm256_cmpgt_epi32(amax, splat(0x7F7FFFFF)), splat(0xFFFFFFFFu))) return false;
  alignas(32) float scale[kGroup];
  if (!e4m3_segment_scales8<F>(amax, g, scales, scale)) return false;
  const __m256i limit = splat(WireTraits<F>::kMaxCode);
  for (int64_t b = 0; b < kGroup; ++b) {
    const Shifted<Source> xb{x, kVectors * b};
    const __m256 factor = _mm256_set1_ps(scale[b]);
    uint8_t* c = codes + code_bytes<F>(kB * b);
    if (stochastic == nullptr) {
      encode_scaled<F, Lanes::kLimited>(xb, kVectors, factor, limit, c);
      continue;
    }
    for (int64_t i = 0; i < kVectors; i += 2) {
      const int64_t e = at + kB * b + 8 * i;
      store_codes16<F>(c + code_bytes<F>(8 * i),
                       encode8_stochastic<F>(to_code_units8<F>(xb(i), factor), limit, rounding_bits8(*stochastic, e)),
                       encode8_stochastic<F>(to_code_units8<F>(xb(i + 1), factor), limit,
                                             rounding_bits8(*stochastic, e + 8)));
    }
  }
  return true;
}

// Decoded FP32 outputs of at least kStreamBytes are written with streaming
// stores: they cannot stay in cache anyway, and a streaming store skips
// reading the line it overwrites. The size is the whole output, not one
// thread's part of it: the call's, or the collective's when it decodes
// chunk by chunk (dequantize's whole_output_bytes). The bytes written are
// the same either way.
constexpr int64_t kStreamBytes = int64_t{8} << 20;

FP8C_AVX2_INLINE bool stream_output(const void* dst, int64_t bytes) {
  return bytes >= kStreamBytes && reinterpret_cast<uintptr_t>(dst) % 32 == 0;
}

// Eight floats to p (32-byte aligned when streaming).
FP8C_AVX2_INLINE void store_f32(float* p, __m256 v, bool stream) {
  if (stream) {
    _mm256_stream_ps(p, v);
  } else {
    _mm256_storeu_ps(p, v);
  }
}

// acc[0, B) <- (own + the pieces' block j, added in rank order) / post_div;
// `own` (element type E) is null or holds the whole block. kOutput: acc is a
// float32 output, so its NaNs are written as Elem<F32>::store writes them.
template <ElemType E, WireFormat F, bool kOutput, typename Count>
FP8C_AVX2_INLINE void sum_block(const BlockCodes& pieces, const Storage<E>* own, float own_premul, Count B,
                                int post_div, int64_t j, bool daz, float* acc) {
  const __m256 div = _mm256_set1_ps(static_cast<float>(post_div));
  const __m256 premul = _mm256_set1_ps(own_premul);
  // Each lane's sum starts from the own addend, or else from piece 0.
  const int64_t first_piece = own != nullptr ? 0 : 1;
  if (own != nullptr) {  // the own input streams from memory: ask for it a few blocks ahead
    const char* ahead = reinterpret_cast<const char*>(own + (j + 8) * B);
    for (int64_t b = 0; b < static_cast<int64_t>(B * sizeof(Storage<E>)); b += 64) _mm_prefetch(ahead + b, _MM_HINT_T0);
  }
  // Fast when every piece's block decodes through decode8_raw (at most 64 pieces: larger groups
  // take the exact decode).
  constexpr int kMaxFastPieces = 64;
  float factor[kMaxFastPieces];
  bool fast = pieces.num_segments <= kMaxFastPieces;
  for (int64_t r = 0; fast && r < pieces.num_segments; ++r) {
    const int64_t at = r * pieces.stride;
    factor[r] = raw_decode_factor<F>(pieces.scales[at + j], load_segment_scale<F>(pieces.scales + at), daz);
    fast = factor[r] != 0.0f && plain_codes<F>(pieces.codes + at + code_bytes<F>(j * B), B);
  }
  if (fast) {
    const uint8_t* src[kMaxFastPieces];
    for (int64_t r = 0; r < pieces.num_segments; ++r) src[r] = pieces.codes + r * pieces.stride + code_bytes<F>(j * B);
    for (int64_t i = 0; i < B; i += 16) {  // sixteen lanes at a time: one load of each piece's codes
      __m256 s0, s1;
      if (own != nullptr) {
        s0 = _mm256_mul_ps(load8<E>(own + j * B + i), premul);
        s1 = _mm256_mul_ps(load8<E>(own + j * B + i + 8), premul);
      } else {
        decode16_raw<F>(src[0] + code_bytes<F>(i), s0, s1);
        s0 = _mm256_mul_ps(s0, _mm256_set1_ps(factor[0]));
        s1 = _mm256_mul_ps(s1, _mm256_set1_ps(factor[0]));
      }
      for (int64_t r = first_piece; r < pieces.num_segments; ++r) {
        __m256 d0, d1;
        decode16_raw<F>(src[r] + code_bytes<F>(i), d0, d1);
        const __m256 f = _mm256_set1_ps(factor[r]);
        s0 = _mm256_add_ps(s0, _mm256_mul_ps(d0, f));
        s1 = _mm256_add_ps(s1, _mm256_mul_ps(d1, f));
      }
      if (post_div != 1) {
        s0 = _mm256_div_ps(s0, div);
        s1 = _mm256_div_ps(s1, div);
      }
      if constexpr (kOutput) {
        s0 = canonical_nan8(s0);
        s1 = canonical_nan8(s1);
      }
      _mm256_storeu_ps(acc + i, s0);
      _mm256_storeu_ps(acc + i + 8, s1);
    }
    return;
  }
  const float scale0 = own != nullptr ? 0.0f : block_scale<F>(pieces.scales[j], load_segment_scale<F>(pieces.scales));
  for (int64_t i = 0; i < B; i += 8) {
    __m256 s = own != nullptr ? _mm256_mul_ps(load8<E>(own + j * B + i), premul)
                              : _mm256_mul_ps(decode8<F>(pieces.codes + code_bytes<F>(j * B + i)),
                                              _mm256_set1_ps(scale0));
    for (int64_t r = first_piece; r < pieces.num_segments; ++r) {
      const int64_t at = r * pieces.stride;
      const __m256 scale =
          _mm256_set1_ps(block_scale<F>(pieces.scales[at + j], load_segment_scale<F>(pieces.scales + at)));
      s = _mm256_add_ps(s, _mm256_mul_ps(decode8<F>(pieces.codes + at + code_bytes<F>(j * B + i)), scale));
    }
    if (post_div != 1) s = _mm256_div_ps(s, div);
    if constexpr (kOutput) s = canonical_nan8(s);
    _mm256_storeu_ps(acc + i, s);
  }
}

template <ElemType E, WireFormat F, bool kPremul, typename Count>
FP8C_AVX2 void quantize_run(const Storage<E>* src, int64_t blocks, Count B, float premul, float g, uint8_t* codes,
                            uint8_t* scales, const StochasticRun* stochastic) {
  const __m256 pm = _mm256_set1_ps(premul);
  int64_t j = 0;
  if constexpr (!kPow2Scales<F> && !std::is_same_v<Count, int64_t>) {  // E4M3 scales, eight blocks at a time
    for (; j + kGroup <= blocks; j += kGroup) {
      if (quantize_group_e4m3_scaled<F, Count::value>(ScaledInput<E, kPremul>{src + j * B, pm}, g, stochastic,
                                                      j * B, codes + code_bytes<F>(j * B), scales + j)) {
        continue;
      }
      for (int64_t b = j; b < j + kGroup; ++b) {
        const ScaledInput<E, kPremul> xb{src + b * B, pm};
        uint8_t* c = codes + code_bytes<F>(b * B);
        scales[b] = stochastic != nullptr ? quantize_block_stochastic<F>(xb, B / 8, g, *stochastic, b * B, c)
                                          : quantize_block<F>(xb, B / 8, g, c);
      }
    }
  }
  if (stochastic != nullptr) {
    for (; j < blocks; ++j) {
      scales[j] = quantize_block_stochastic<F>(ScaledInput<E, kPremul>{src + j * B, pm}, B / 8, g, *stochastic,
                                               j * B, codes + code_bytes<F>(j * B));
    }
    return;
  }
  if constexpr (std::is_same_v<Count, Block32> && kPow2Scales<F>) {
    for (; j + kGroup <= blocks; j += kGroup) {
      if (quantize_group_normal<F>(ScaledInput<E, kPremul>{src + j * B, pm}, codes + code_bytes<F>(j * B),
                                   scales + j)) {
        continue;
      }
      for (int64_t b = j; b < j + kGroup; ++b) {
        scales[b] =
            quantize_block<F>(ScaledInput<E, kPremul>{src + b * B, pm}, B / 8, g, codes + code_bytes<F>(b * B));
      }
    }
  }
  for (; j < blocks; ++j) {
    scales[j] = quantize_block<F>(ScaledInput<E, kPremul>{src + j * B, pm}, B / 8, g, codes + code_bytes<F>(j * B));
  }
}

template <ElemType E, WireFormat F, typename Count>
FP8C_AVX2 void dequantize_run(const uint8_t* codes, const uint8_t* scales, float g, int64_t blocks, Count B,
                              Storage<E>* dst, int64_t output_bytes) {
  const bool daz = denormals_are_zero();
  const bool stream = E == ElemType::F32 && stream_output(dst, std::max<int64_t>(blocks * B * 4, output_bytes));
  for (int64_t j = 0; j < blocks; ++j) {
    const uint8_t* c = codes + code_bytes<F>(j * B);
    Storage<E>* d = dst + j * B;
    const float factor = raw_decode_factor<F>(scales[j], g, daz);
    if (factor != 0.0f && plain_codes<F>(c, B)) {
      const __m256 f = _mm256_set1_ps(factor);
      if constexpr (E == ElemType::F32) {  // finite codes times a finite factor: no NaN, stored as they are
        for (int64_t i = 0; i < B; i += 8) {
          store_f32(d + i, _mm256_mul_ps(decode8_raw<F>(c + code_bytes<F>(i)), f), stream);
        }
        continue;
      }
      for (int64_t i = 0; i < B; i += 8) store8<E>(d + i, _mm256_mul_ps(decode8_raw<F>(c + code_bytes<F>(i)), f));
    } else {
      const __m256 scale = _mm256_set1_ps(block_scale<F>(scales[j], g));
      for (int64_t i = 0; i < B; i += 8) store8<E>(d + i, _mm256_mul_ps(decode8<F>(c + code_bytes<F>(i)), scale));
    }
  }
  if (stream) _mm_sfence();
}

template <ElemType E, WireFormat F, typename Count>
FP8C_AVX2 void dequant_sum_run(const BlockCodes& pieces, const Storage<E>* own, float own_premul, Count B,
                               int post_div, int64_t j0, int64_t blocks, Storage<E>* dst) {
  alignas(32) float acc[kMaxBlockSize];
  const bool daz = denormals_are_zero();
  if constexpr (E == ElemType::F32) {  // the sum is the output: no staging; plain stores (docs/performance.md)
    for (int64_t j = j0; j < j0 + blocks; ++j) {
      sum_block<E, F, true>(pieces, own, own_premul, B, post_div, j, daz, dst + (j - j0) * B);
    }
  } else {
    for (int64_t j = j0; j < j0 + blocks; ++j) {
      sum_block<E, F, false>(pieces, own, own_premul, B, post_div, j, daz, acc);
      for (int64_t i = 0; i < B; i += 8) store8<E>(dst + (j - j0) * B + i, _mm256_load_ps(acc + i));
    }
  }
}

template <ElemType E, WireFormat F, typename Count>
FP8C_AVX2 void dequant_sum_requantize_run(const BlockCodes& pieces, const Storage<E>* own, float own_premul, Count B,
                                          int post_div, int64_t j0, int64_t blocks, float g, uint8_t* codes,
                                          uint8_t* scales, const StochasticRun* stochastic) {
  alignas(32) float acc[kMaxBlockSize];
  static_assert(kMaxBlockSize >= kGroup * 32, "acc holds a group of eight blocks of 32");
  const bool daz = denormals_are_zero();
  int64_t j = j0;
  if constexpr (!kPow2Scales<F> && !std::is_same_v<Count, int64_t>) {  // E4M3 scales: eight blocks summed, quantized
    for (; j + kGroup <= j0 + blocks; j += kGroup) {
      for (int64_t b = 0; b < kGroup; ++b) {
        sum_block<E, F, false>(pieces, own, own_premul, B, post_div, j + b, daz, acc + b * B);
      }
      uint8_t* c = codes + code_bytes<F>((j - j0) * B);
      if (quantize_group_e4m3_scaled<F, Count::value>(Accumulated{acc}, g, stochastic, (j - j0) * B, c,
                                                      scales + (j - j0))) {
        continue;
      }
      for (int64_t b = 0; b < kGroup; ++b) {
        const Accumulated xb{acc + b * B};
        uint8_t* cb = c + code_bytes<F>(b * B);
        scales[j - j0 + b] = stochastic != nullptr
                                 ? quantize_block_stochastic<F>(xb, B / 8, g, *stochastic, (j - j0 + b) * B, cb)
                                 : quantize_block<F>(xb, B / 8, g, cb);
      }
    }
  }
  if (stochastic != nullptr) {
    for (; j < j0 + blocks; ++j) {
      sum_block<E, F, false>(pieces, own, own_premul, B, post_div, j, daz, acc);
      scales[j - j0] = quantize_block_stochastic<F>(Accumulated{acc}, B / 8, g, *stochastic, (j - j0) * B,
                                                    codes + code_bytes<F>((j - j0) * B));
    }
    return;
  }
  if constexpr (std::is_same_v<Count, Block32> && kPow2Scales<F>) {  // eight blocks summed, quantized as a group
    for (; j + kGroup <= j0 + blocks; j += kGroup) {
      for (int64_t b = 0; b < kGroup; ++b) {
        sum_block<E, F, false>(pieces, own, own_premul, B, post_div, j + b, daz, acc + b * B);
      }
      if (quantize_group_normal<F>(Accumulated{acc}, codes + code_bytes<F>((j - j0) * B), scales + (j - j0))) continue;
      for (int64_t b = 0; b < kGroup; ++b) {
        scales[j - j0 + b] =
            quantize_block<F>(Accumulated{acc + b * B}, B / 8, g, codes + code_bytes<F>((j - j0 + b) * B));
      }
    }
  }
  for (; j < j0 + blocks; ++j) {
    sum_block<E, F, false>(pieces, own, own_premul, B, post_div, j, daz, acc);
    scales[j - j0] = quantize_block<F>(Accumulated{acc}, B / 8, g, codes + code_bytes<F>((j - j0) * B));
  }
}

// finite_abs_bits' max over n lanes x(0 .. n / 8) and src[n & ~7 .. n) (scalar, times premul).
template <ElemType E, bool kPremul>
FP8C_AVX2 uint32_t finite_amax_run(const Storage<E>* src, int64_t n, float premul) {
  const ScaledInput<E, kPremul> x{src, _mm256_set1_ps(premul)};
  __m256i m0 = _mm256_setzero_si256(), m1 = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    m0 = _mm256_max_epu32(m0, finite_abs(x(i / 8)));
    m1 = _mm256_max_epu32(m1, finite_abs(x(i / 8 + 1)));
  }
  for (; i + 8 <= n; i += 8) m0 = _mm256_max_epu32(m0, finite_abs(x(i / 8)));
  uint32_t amax = max_lane(_mm256_max_epu32(m0, m1));
  for (; i < n; ++i) amax = std::max(amax, finite_abs_bits(Elem<E>::load(src[i]) * premul));
  return amax;
}

template <ElemType E, WireFormat F, typename Count>
FP8C_AVX2 uint32_t dequant_sum_amax_run(const BlockCodes& pieces, const Storage<E>* own, float own_premul, Count B,
                                        int post_div, int64_t j0, int64_t blocks) {
  alignas(32) float acc[kMaxBlockSize];
  const bool daz = denormals_are_zero();
  __m256i amax = _mm256_setzero_si256();
  for (int64_t j = j0; j < j0 + blocks; ++j) {
    sum_block<E, F, false>(pieces, own, own_premul, B, post_div, j, daz, acc);
    for (int64_t i = 0; i < B; i += 8) amax = _mm256_max_epu32(amax, finite_abs(_mm256_load_ps(acc + i)));
  }
  return max_lane(amax);
}

}  // namespace

bool supported() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return ok;
}

void quantize_full_blocks(const void* src, ElemType type, WireFormat format, int64_t blocks, int block_size,
                          float premul, float segment_scale, uint8_t* codes, uint8_t* scales,
                          const StochasticRun* stochastic) {
  with_codec_types(type, format, [&](auto e, auto f) {
    constexpr ElemType E = decltype(e)::value;
    constexpr WireFormat F = decltype(f)::value;
    auto* s = static_cast<const Storage<E>*>(src);
    with_block<F>(block_size, [&](auto B) {
      if (x86::premul_is_identity(premul)) {
        quantize_run<E, F, false>(s, blocks, B, premul, segment_scale, codes, scales, stochastic);
      } else {
        quantize_run<E, F, true>(s, blocks, B, premul, segment_scale, codes, scales, stochastic);
      }
    });
  });
}

void dequantize_full_blocks(const uint8_t* codes, const uint8_t* scales, float segment_scale, WireFormat format,
                            int64_t blocks, int block_size, void* dst, ElemType type, int64_t output_bytes) {
  with_codec_types(type, format, [&](auto e, auto f) {
    constexpr ElemType E = decltype(e)::value;
    constexpr WireFormat F = decltype(f)::value;
    with_block<F>(block_size, [&](auto B) {
      dequantize_run<E, F>(codes, scales, segment_scale, blocks, B, static_cast<Storage<E>*>(dst), output_bytes);
    });
  });
}

void dequant_sum_full_blocks(const BlockCodes& pieces, const OwnAddend& own, int post_div, int64_t first_block,
                             int64_t blocks, void* dst, ElemType type) {
  with_codec_types(type, pieces.format, [&](auto e, auto f) {
    constexpr ElemType E = decltype(e)::value;
    constexpr WireFormat F = decltype(f)::value;
    const auto* o = own.present ? static_cast<const Storage<E>*>(own.src) : nullptr;
    with_block<F>(pieces.block_size, [&](auto B) {
      dequant_sum_run<E, F>(pieces, o, own.premul, B, post_div, first_block, blocks, static_cast<Storage<E>*>(dst));
    });
  });
}

void dequant_sum_requantize_full_blocks(const BlockCodes& pieces, const OwnAddend& own, int post_div,
                                        int64_t first_block, int64_t blocks, float out_segment_scale,
                                        uint8_t* codes, uint8_t* scales, const StochasticRun* stochastic) {
  with_codec_types(own.type, pieces.format, [&](auto e, auto f) {
    constexpr ElemType E = decltype(e)::value;
    constexpr WireFormat F = decltype(f)::value;
    const auto* o = own.present ? static_cast<const Storage<E>*>(own.src) : nullptr;
    with_block<F>(pieces.block_size, [&](auto B) {
      dequant_sum_requantize_run<E, F>(pieces, o, own.premul, B, post_div, first_block, blocks, out_segment_scale,
                                       codes, scales, stochastic);
    });
  });
}

uint32_t finite_amax(const void* src, ElemType type, int64_t n, float premul) {
  return dispatch_elem_type(type, [&](auto e) {
    constexpr ElemType E = decltype(e)::value;
    auto* s = static_cast<const Storage<E>*>(src);
    return x86::premul_is_identity(premul) ? finite_amax_run<E, false>(s, n, premul)
                                           : finite_amax_run<E, true>(s, n, premul);
  });
}

uint32_t dequant_sum_amax_full_blocks(const BlockCodes& pieces, const OwnAddend& own, int post_div,
                                      int64_t first_block, int64_t blocks) {
  uint32_t amax = 0;
  with_codec_types(own.type, pieces.format, [&](auto e, auto f) {
    constexpr ElemType E = decltype(e)::value;
    constexpr WireFormat F = decltype(f)::value;
    const auto* o = own.present ? static_cast<const Storage<E>*>(own.src) : nullptr;
    with_block<F>(pieces.block_size, [&](auto B) {
      amax = dequant_sum_amax_run<E, F>(pieces, o, own.premul, B, post_div, first_block, blocks);
    });
  });
  return amax;
}

}  // namespace avx2
}  // namespace fp8comm

#endif  // FP8C_HAVE_AVX2_KERNELS
