#pragma once
// The scalar math of Fp8Linear's current-scaling casts (fp8comm/nn/scaling.py),
// shared by the CPU twin (cast_cpu.cpp) and the CUDA kernels (cast_cuda.cu), so
// that both write the very bytes of the eager torch chain they replace:
//
//   x32   = x.float()
//   amax  = x32.abs().amax()              (or .amax(dim=-1, keepdim=True): rowwise)
//   scale = fp8_max / amax.clamp(min=1e-12)
//   data  = (x32 * scale).clamp(-fp8_max, fp8_max).to(fp8_dtype)
//   inv   = scale.reciprocal()
//
// Three facts of that chain are mirrored exactly:
// - `fp8_max / tensor` is Tensor.__rdiv__, which torch implements as
//   `tensor.reciprocal() * fp8_max`: two float32 roundings, not one division
//   (they differ in ~20% of the cases). So scale = fl(fl(1 / a) * fp8_max).
// - The float32 -> fp8 conversion is c10's (torch/headeronly/util/Float8_*.h),
//   round to nearest even, copied here branch-free; the clamp before it keeps
//   every finite value in range, -0 stays -0, NaN passes through.
// - NaN: amax propagates it (torch.amax does), so a NaN anywhere gives a NaN
//   scale and every code of that tensor (row) is NaN; Inf with no NaN gives
//   scale 0, and Inf * 0 is NaN at the Inf's index. NaN lands exactly where
//   the eager chain puts it. Its *sign* in the eager chain is an accident of
//   torch's kernel paths (on x86: a contiguous amax gives +NaN, a strided one
//   -NaN; a scalar multiply keeps the scale's NaN, a broadcast one x's; Inf * 0
//   is -NaN), and on CUDA every NaN is the canonical +NaN. So here every NaN
//   code is 0x7F and a NaN scale is 0x7FFFFFFF, what torch's eager cast writes
//   on CUDA, on both of our paths.
//
// Nothing here may be contracted into an FMA (the codec's flags forbid it:
// -ffp-contract=off, --fmad=false); every operation is one correctly rounded
// IEEE operation, and subnormals are kept (no flush-to-zero on either side).
#include "../codec/fp8_block_math.h"

namespace fp8comm {
namespace cast {

// float32(1e-12): the `clamp(min=1e-12)` bound after torch rounds it to float.
constexpr float kAmaxEps = 1e-12f;

// |v| as bits, NaN kept. Unsigned order of these bits is the order of |v| with
// every NaN above +Inf, so their max is torch's NaN-propagating amax.
FP8C_HD uint32_t abs_bits(float v) { return float_bits(v) & 0x7FFFFFFFu; }

FP8C_HD bool is_nan(float v) { return abs_bits(v) > 0x7F800000u; }

struct Scale {
  float scale;  // what x is multiplied by
  float inv;    // what _scaled_mm multiplies back: 1 / scale
};

// The NaN scale and code of these casts (see the header comment).
constexpr uint32_t kCanonicalNan = 0x7FFFFFFFu;  // CUDA's NaN
constexpr uint8_t kNanCode = 0x7F;                 // torch's NaN code: the all-ones magnitude

// scale = reciprocal(clamp(amax, min=eps)) * fp8_max; inv = reciprocal(scale).
// A NaN amax gives NaN for both.
template <Fp8Dtype F>
FP8C_HD Scale scale_of(float amax) {
  const float a = amax < kAmaxEps ? kAmaxEps : amax;  // NaN compares false: stays NaN
  const float r = 1.0f / a;
  const float s = r * Fp8Traits<F>::kMax;
  const float inv = 1.0f / s;
  const float q = bits_float(kCanonicalNan);
  const bool nan = is_nan(amax);
  return Scale{nan ? q : s, nan ? q : inv};
}

// A given scale (the delayed recipe's) and its inverse; a NaN scale's
// inverse is the canonical NaN on every path, whatever the scale's NaN bits.
FP8C_HD Scale given_scale(float s) { return Scale{s, is_nan(s) ? bits_float(kCanonicalNan) : 1.0f / s}; }

// c10's fp32 -> fp8 conversion, branch-free (the same integer steps), from
// the dtype's bits: round to nearest even; past the range Inf where the dtype
// has one, else its largest finite code; NaN the all-ones code 0x7F.
template <Fp8Dtype F>
FP8C_HD uint32_t torch_fp8_bits(float f) {
  using T = Fp8Traits<F>;
  constexpr int kDrop = 23 - T::kMantBits;
  // The fp32 bits of the value code kMaxCode + 1 would have: the first past the range.
  constexpr uint32_t kPastMax = (T::kFirstNonFinite << kDrop) + (T::kRebias << 23);
  constexpr uint32_t kDenormMask = (T::kRebias + kDrop + 1) << 23;
  const uint32_t bits = float_bits(f);
  const uint32_t sign = bits & 0x80000000u;
  const uint32_t a = bits ^ sign;
  const uint32_t sub = float_bits(bits_float(a) + bits_float(kDenormMask)) - kDenormMask;
  uint32_t normal = ((a - (T::kRebias << 23) + ((1u << (kDrop - 1)) - 1u) + ((a >> kDrop) & 1u)) >> kDrop) & 0xFFu;
  if constexpr (!T::kHasInf) normal = normal == T::kFirstNonFinite ? T::kMaxCode : normal;
  uint32_t r = a < T::kMinNormalBits ? (sub & 0xFFu) : normal;
  r = a >= kPastMax ? (a > 0x7F800000u ? 0x7Fu : (T::kHasInf ? T::kInfCode : T::kMaxCode)) : r;
  return r | (sign >> 24);
}

// One element: saturate(x * scale) as fp8; NaN as kNanCode.
template <Fp8Dtype F>
FP8C_HD uint8_t cast_elem(float x, float scale) {
  constexpr float m = Fp8Traits<F>::kMax;
  float y = x * scale;
  y = y < -m ? -m : y;  // clamp(-m, m): NaN and -0 pass unchanged
  y = y > m ? m : y;
  const uint32_t code = torch_fp8_bits<F>(y);
  return static_cast<uint8_t>(is_nan(y) ? kNanCode : code);
}

}  // namespace cast
}  // namespace fp8comm
