#pragma once
// The scalar math of the FP8 block format (DESIGN.md, "Wire format"), shared by
// the CPU and CUDA codecs so that both produce bit-identical bytes.
//
// Torch-free and branch-free: every function is plain integer / IEEE float
// arithmetic with selects, so the CPU loops vectorize and the CUDA kernels do
// not diverge. Nothing here may depend on FMA contraction or on flush-to-zero:
// every product below is exact or is a single correctly rounded operation.
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define FP8C_HD __host__ __device__ __forceinline__
#else
#define FP8C_HD inline __attribute__((always_inline))
#endif

namespace fp8comm {

enum class Fp8Format : int { E4M3 = 0, E5M2 = 1 };

// Element types the codec reads and writes.
enum class ElemType : int { F32 = 0, BF16 = 1, F16 = 2 };

// The E8M0 byte of a scale 2^e is e + 127. Scales are kept in [2^-126, 2^127]
// so that they and their inverses are normal floats.
constexpr int kScaleBias = 127;
constexpr int kMinScaleExp = -126;
constexpr uint8_t kUnitScaleByte = 127;  // 2^0: blocks that are all zero / non-finite

FP8C_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
#endif
}

FP8C_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  memcpy(&f, &u, 4);
  return f;
#endif
}

// 2^e as a float, e in [-126, 127].
FP8C_HD float pow2f(int e) {
  return bits_float(static_cast<uint32_t>(e + 127) << 23);
}

// |v| as bits when v is finite, else 0: the block amax is the max of these
// (IEEE ordering of non-negative floats equals their unsigned bit ordering).
// (A mask, not a select: gcc vectorizes a max-reduction only in this form.)
FP8C_HD uint32_t finite_abs_bits(float v) {
  const uint32_t a = float_bits(v) & 0x7FFFFFFFu;
  return a & (0u - static_cast<uint32_t>(a < 0x7F800000u));
}

// ---------------------------------------------------------------- formats
// fp8_max = 1.75 * 2^kMaxExp for both formats (448 and 57344).
template <Fp8Format F>
struct Fp8Traits;

template <>
struct Fp8Traits<Fp8Format::E4M3> {
  static constexpr int kMaxExp = 8;
  static constexpr int kMantBits = 3;
  static constexpr uint32_t kRebias = 127 - 7;      // fp32 bias - fp8 bias
  static constexpr uint32_t kMinNormalBits = 0x3C800000u;  // 2^-6
  static constexpr float kSubnormalInv = 512.0f;    // 1 / 2^-9
  static constexpr uint32_t kMaxCode = 0x7E;        // 448
};

template <>
struct Fp8Traits<Fp8Format::E5M2> {
  static constexpr int kMaxExp = 15;
  static constexpr int kMantBits = 2;
  static constexpr uint32_t kRebias = 127 - 15;
  static constexpr uint32_t kMinNormalBits = 0x38800000u;  // 2^-14
  static constexpr float kSubnormalInv = 65536.0f;  // 1 / 2^-16
  static constexpr uint32_t kMaxCode = 0x7B;        // 57344
};

// Smallest e with amax <= fp8_max * 2^e (the block maximum never saturates),
// clamped to the scale range. amax_bits: bits of a finite non-negative float.
template <Fp8Format F>
FP8C_HD int scale_exponent(uint32_t amax_bits) {
  int exp = static_cast<int>(amax_bits >> 23) - 127;
  // amax = 1.m * 2^exp; fp8_max = 1.75 * 2^kMaxExp; 0.75 * 2^23 = 0x600000.
  int e = exp - Fp8Traits<F>::kMaxExp + ((amax_bits & 0x7FFFFFu) > 0x600000u ? 1 : 0);
  e = e < kMinScaleExp ? kMinScaleExp : e;
  return amax_bits == 0 ? 0 : e;
}

template <Fp8Format F>
FP8C_HD uint8_t scale_byte(uint32_t amax_bits) {
  return static_cast<uint8_t>(scale_exponent<F>(amax_bits) + kScaleBias);
}

// The largest code whose value times 2^e is a finite float. It is kMaxCode
// except for blocks whose amax is within an FP8 rounding step of FLT_MAX: there
// RNE could round up to 2^128, and such values round down instead.
template <Fp8Format F>
FP8C_HD uint32_t code_limit(uint8_t scale_byte) {
  using T = Fp8Traits<F>;
  // fp8 exponent field of the binade just below 2^128 / 2^e.
  const int top = 127 - (static_cast<int>(scale_byte) - kScaleBias) + static_cast<int>(127 - T::kRebias);
  const int full = (top << T::kMantBits) | ((1 << T::kMantBits) - 1);
  return top > static_cast<int>(T::kMaxCode >> T::kMantBits) || full > static_cast<int>(T::kMaxCode)
             ? T::kMaxCode
             : static_cast<uint32_t>(full);
}

// Scale and its inverse from a stored byte.
FP8C_HD float scale_from_byte(uint8_t b) { return pow2f(static_cast<int>(b) - kScaleBias); }
FP8C_HD float inv_scale_from_byte(uint8_t b) { return pow2f(kScaleBias - static_cast<int>(b)); }

// fp32 -> fp8, round to nearest even. v is already divided by the block scale,
// so |v| <= fp8_max for every finite element; `limit` (code_limit) caps the
// magnitude code. NaN -> NaN; Inf -> NaN (E4M3, which has no Inf) or Inf (E5M2).
// NaN is always written as the one positive NaN code: which NaN a sum of NaNs
// yields (its sign) differs between compilers and devices, the bytes must not.
template <Fp8Format F>
FP8C_HD uint8_t encode_fp8(float v, uint32_t limit) {
  using T = Fp8Traits<F>;
  constexpr int kDrop = 23 - T::kMantBits;
  const uint32_t b = float_bits(v);
  const uint32_t sign = (b >> 24) & 0x80u;
  const uint32_t a = b & 0x7FFFFFFFu;
  // Normal range: round the mantissa at bit kDrop (RNE), then rebias.
  const uint32_t r = a + ((1u << (kDrop - 1)) - 1u) + ((a >> kDrop) & 1u);
  const uint32_t normal = (r >> kDrop) - (T::kRebias << T::kMantBits);
  // Subnormal range: the FPU rounds |v| / 2^-k to an integer (RNE) by adding
  // 2^23; |v| * kSubnormalInv is exact, so an FMA here changes nothing.
  const float t = bits_float(a) * T::kSubnormalInv + 8388608.0f;
  const uint32_t sub = float_bits(t) - 0x4B000000u;
  uint32_t code = a < T::kMinNormalBits ? sub : normal;
  code = code > limit ? limit : code;
  code |= sign;
  uint32_t special;
  if constexpr (F == Fp8Format::E4M3) {
    special = 0x7Fu;
  } else {
    special = a == 0x7F800000u ? (0x7Cu | sign) : 0x7Eu;
  }
  code = a >= 0x7F800000u ? special : code;
  return static_cast<uint8_t>(code);
}

// fp8 -> fp32, exact.
template <Fp8Format F>
FP8C_HD float decode_fp8(uint8_t c) {
  using T = Fp8Traits<F>;
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t em = c & 0x7Fu;
  const uint32_t exp = em >> T::kMantBits;
  const uint32_t mant = em & ((1u << T::kMantBits) - 1u);
  const uint32_t normal_bits = (em << (23 - T::kMantBits)) + (T::kRebias << 23);
  const uint32_t sub_bits = float_bits(static_cast<float>(mant) * (1.0f / T::kSubnormalInv));
  uint32_t bits = exp == 0 ? sub_bits : normal_bits;
  if constexpr (F == Fp8Format::E4M3) {
    bits = em == 0x7Fu ? 0x7FC00000u : bits;
  } else {
    bits = em == 0x7Cu ? 0x7F800000u : bits;
    bits = em > 0x7Cu ? 0x7FC00000u : bits;
  }
  return bits_float(bits | sign);
}

// ---------------------------------------------------------------- element outputs
// The one NaN each element output holds (Elem<E>::store writes it for every NaN):
// positive, quiet, zero payload, because which NaN arithmetic yields differs by
// device (CUDA: 0x7FFFFFFF; x86 keeps a sign and payload, Inf - Inf is -NaN).
constexpr uint32_t kCanonicalNanF32 = 0x7FC00000u;
constexpr uint16_t kCanonicalNanBf16 = 0x7FC0u;
constexpr uint16_t kCanonicalNanF16 = 0x7E00u;

FP8C_HD bool is_nan_bits(uint32_t u) { return (u & 0x7FFFFFFFu) > 0x7F800000u; }

// ---------------------------------------------------------------- 16-bit floats
FP8C_HD float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

// float -> bfloat16, round to nearest even; every NaN -> kCanonicalNanBf16.
FP8C_HD uint16_t float_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(is_nan_bits(u) ? kCanonicalNanBf16 : rounded);
}

// IEEE half -> float, exact (subnormals renormalized by an exact subtraction).
FP8C_HD float f16_to_float(uint16_t h) {
  const uint32_t shifted_exp = 0x7C00u << 13;
  uint32_t o = (static_cast<uint32_t>(h) & 0x7FFFu) << 13;
  const uint32_t exp = shifted_exp & o;
  o += (127u - 15u) << 23;
  const uint32_t inf_nan = o + ((128u - 16u) << 23);
  const float denorm = bits_float(o + (1u << 23)) - bits_float(113u << 23);
  o = exp == shifted_exp ? inf_nan : o;
  o = exp == 0 ? float_bits(denorm) : o;
  return bits_float(o | (static_cast<uint32_t>(h & 0x8000u) << 16));
}

// float -> IEEE half, round to nearest even; overflow -> Inf; every NaN ->
// kCanonicalNanF16.
FP8C_HD uint16_t float_to_f16(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7FFFFFFFu;
  // Subnormal half: align the 10 mantissa bits at the bottom with a magic add.
  const uint32_t denorm_magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  const uint32_t sub = float_bits(bits_float(a) + bits_float(denorm_magic)) - denorm_magic;
  const uint32_t normal = (a + ((15u - 127u) << 23) + 0xFFFu + ((a >> 13) & 1u)) >> 13;
  uint32_t o = a < (113u << 23) ? sub : normal;
  o = a >= ((127u + 16u) << 23) ? 0x7C00u : o;  // Inf, or too large for a half
  o |= sign;
  return static_cast<uint16_t>(a > 0x7F800000u ? kCanonicalNanF16 : o);
}

template <ElemType E>
struct Elem;
template <>
struct Elem<ElemType::F32> {
  using storage = float;
  static FP8C_HD float load(float x) { return x; }
  static FP8C_HD float store(float x) { return is_nan_bits(float_bits(x)) ? bits_float(kCanonicalNanF32) : x; }
};
template <>
struct Elem<ElemType::BF16> {
  using storage = uint16_t;
  static FP8C_HD float load(uint16_t x) { return bf16_to_float(x); }
  static FP8C_HD uint16_t store(float x) { return float_to_bf16(x); }
};
template <>
struct Elem<ElemType::F16> {
  using storage = uint16_t;
  static FP8C_HD float load(uint16_t x) { return f16_to_float(x); }
  static FP8C_HD uint16_t store(float x) { return float_to_f16(x); }
};

// ---------------------------------------------------------------- the sum
// Pieces are added in rank order starting from piece 0 (so -0 stays -0), then
// divided by post_div (AVG). Both codecs call exactly these two functions.
FP8C_HD float sum_finish(float sum, int post_div) {
  return post_div == 1 ? sum : sum / static_cast<float>(post_div);
}

}  // namespace fp8comm
