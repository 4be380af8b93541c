#pragma once
// The hardware FP8 conversions of sm_89 and later, behind one wrapper whose
// other builds (an older device, the host SIMT emulator of the tests) compute
// the very same bits in software:
//
//   float2_to_fp8x2<F>(lo, hi): cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32 — round to
//     nearest even, a finite value beyond the format's largest saturated to
//     it (sign kept), Inf saturated likewise, NaN to the positive NaN 0x7F;
//     `lo` in the low byte.
//   fp8x2_to_float2<F>(pair): cvt.rn.f16x2.{e4m3x2,e5m2x2} then cvt.f32.f16 —
//     exact: every E4M3 and E5M2 value is a half, every half a float; NaN
//     codes give a NaN, E5M2's Inf codes Inf.
//
// Where the codec may use them (codec_cuda_tiled.cu; DESIGN.md, "Layout"):
// the encode of a block whose elements are all finite and whose code limit is
// the format's largest code (code_limit), rounding to nearest. There x times
// the block's E8M0 inverse scale is one FP32 multiply, |x / S| <= max, and
// RNE of it with satfinite is exactly fp8_block_math.h's encode_code (which
// never needs to saturate there). Non-finite inputs (encode_code writes the
// positive NaN code for NaN and, in E4M3, for Inf; satfinite would write max),
// limited codes and stochastic rounding take encode_code's software path.
// Decode is exact for every code, so it always may.
//
// The software versions below are written independently of encode_code /
// decode_code (from the value grid, in double), so the emulated kernels'
// agreement with the CPU codec checks the claim above.
#include <math.h>
#include <stdint.h>

#include "fp8_block_math.h"

namespace fp8comm {
namespace fp8_convert {

// Whether a wire format's codes have a hardware conversion (8-bit FP8 codes).
template <WireFormat F>
constexpr bool kHasHardwareCvt = F == WireFormat::E4M3 || F == WireFormat::E5M2;

// ------------------------------------------------------------- software semantics
// RNE of v onto the format's grid with satfinite (see above).
template <WireFormat F>
FP8C_HD uint8_t satfinite_code(float v) {
  using T = WireTraits<F>;
  const uint32_t b = float_bits(v);
  const uint32_t sign = (b >> 24) & 0x80u;
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return 0x7F;  // NaN
  const double a = fabs(static_cast<double>(v));
  constexpr int kBias = static_cast<int>(127 - T::kRebias);
  constexpr int kM = T::kMantBits;
  const int min_exp = 1 - kBias;  // exponent of the smallest normal
  uint32_t code;
  if (a >= static_cast<double>(T::kMax)) {
    code = T::kMaxCode;  // saturated (Inf too)
  } else if (a == 0.0) {
    code = 0;
  } else {
    int e;
    frexp(a, &e);  // a = f * 2^e, f in [0.5, 1): a in [2^(e-1), 2^e)
    int exp = e - 1;
    exp = exp < min_exp ? min_exp : exp;  // subnormals share the smallest normal's step
    // a / step is exact; q in [0, 2^(kM+1)], ties to even (the default rounding mode)
    const double q = nearbyint(a / ldexp(1.0, exp - kM));
    // The binade's first code plus q's units above 2^kM: a carry to 2^(kM+1) lands on
    // the next binade's first code, a subnormal's q (exp == min_exp) on code q.
    code = (static_cast<uint32_t>(exp + kBias) << kM) + static_cast<uint32_t>(q) - (1u << kM);
    code = code > T::kMaxCode ? T::kMaxCode : code;
  }
  return static_cast<uint8_t>(code | sign);
}

// An FP8 code's value as a half's bits (exact).
template <WireFormat F>
FP8C_HD uint16_t code_to_half_bits(uint8_t c) {
  using T = WireTraits<F>;
  const uint16_t sign = static_cast<uint16_t>((c & 0x80u) << 8);
  const uint32_t em = c & 0x7Fu;
  if constexpr (F == WireFormat::E5M2) {
    return static_cast<uint16_t>(c) << 8;  // E5M2 is a half's top byte
  } else {
    if (em >= T::kFirstNonFinite) return static_cast<uint16_t>(sign | 0x7FFFu);  // NaN
    const uint32_t exp = em >> T::kMantBits;
    const uint32_t mant = em & ((1u << T::kMantBits) - 1u);
    if (exp == 0) return static_cast<uint16_t>(sign | float_to_f16(ldexpf(static_cast<float>(mant), -9)));
    return static_cast<uint16_t>(sign | ((exp + 15u - 7u) << 10) | (mant << 7));
  }
}

template <WireFormat F>
FP8C_HD uint16_t software_float2_to_fp8x2(float lo, float hi) {
  return static_cast<uint16_t>(satfinite_code<F>(lo) | (satfinite_code<F>(hi) << 8));
}

// ------------------------------------------------------------- the wrapper
template <WireFormat F>
__device__ __forceinline__ uint16_t float2_to_fp8x2(float lo, float hi) {
  static_assert(kHasHardwareCvt<F>, "a hardware conversion exists for E4M3 and E5M2 codes");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t r;
  if constexpr (F == WireFormat::E4M3) {
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %2, %1;" : "=h"(r) : "f"(lo), "f"(hi));
  } else {
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %2, %1;" : "=h"(r) : "f"(lo), "f"(hi));
  }
  return r;
#else
  return software_float2_to_fp8x2<F>(lo, hi);
#endif
}

// Two codes (`pair`'s low byte first) as floats.
template <WireFormat F>
__device__ __forceinline__ void fp8x2_to_float2(uint16_t pair, float& lo, float& hi) {
  static_assert(kHasHardwareCvt<F>, "a hardware conversion exists for E4M3 and E5M2 codes");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t h2;
  if constexpr (F == WireFormat::E4M3) {
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(pair));
  } else {
    asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(h2) : "h"(pair));
  }
  asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"(static_cast<uint16_t>(h2)));
  asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"(static_cast<uint16_t>(h2 >> 16)));
#else
  lo = f16_to_float(code_to_half_bits<F>(static_cast<uint8_t>(pair)));
  hi = f16_to_float(code_to_half_bits<F>(static_cast<uint8_t>(pair >> 8)));
#endif
}

}  // namespace fp8_convert
}  // namespace fp8comm
