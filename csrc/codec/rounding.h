#pragma once
// Stochastic rounding (DESIGN.md, "Stochastic rounding"): the counter-based
// generator and the stochastic encode, shared by the CPU loops, the AVX2 and
// AVX-512 kernels (which redo the same integer steps in lanes) and the CUDA
// kernels, so every path writes the same bytes.
//
// The random 32 bits of an element are a keyed integer hash, stateless:
// rounding_bits(segment key, element index in its segment). The segment key
// comes from the codec call's 64-bit rounding_key (BlockCodes; the host mixes
// seed, call counter, rank and chunk into it) and the segment's number. The
// per-element hash uses 32-bit multiply / xor / shift only.
#include "fp8_block_math.h"

namespace fp8comm {

// How a quantize rounds to FP8: to nearest even, or stochastically (each
// element rounds up with probability equal to its distance from the code
// below, in units of the code step: unbiased).
enum class Rounding : int { kNearest = 0, kStochastic = 1 };

// "nearest", "stochastic": the names options, operators and errors use.
inline const char* rounding_name(Rounding r) { return r == Rounding::kStochastic ? "stochastic" : "nearest"; }

// The Rounding named `name`; false when it names none.
inline bool find_rounding(const std::string& name, Rounding& out) {
  for (Rounding r : {Rounding::kNearest, Rounding::kStochastic}) {
    if (name == rounding_name(r)) {
      out = r;
      return true;
    }
  }
  return false;
}

// splitmix64's finalizer: a bijection of 64 bits with full avalanche.
FP8C_HD uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}

// A key combined with one more value (the host chains it over seed, call
// counter, rank, chunk; the codec adds the segment number).
FP8C_HD uint64_t mix_key(uint64_t key, uint64_t value) { return mix64(key ^ mix64(value + 0x9E3779B97F4A7C15ull)); }

// The key of segment `segment` of a codec call keyed `rounding_key`, as the
// two 32-bit words the per-element hash takes.
struct SegmentKey {
  uint32_t k0, k1;
};

FP8C_HD SegmentKey segment_key(uint64_t rounding_key, int64_t segment) {
  const uint64_t k = mix_key(rounding_key, static_cast<uint64_t>(segment));
  return SegmentKey{static_cast<uint32_t>(k), static_cast<uint32_t>(k >> 32)};
}

// lowbias32 (Chris Wellons' hash prospector): a bijection of 32 bits.
FP8C_HD uint32_t lowbias32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

// The random bits of element i of a segment (i taken modulo 2^32). For a
// fixed i they are uniform over random keys; one key gives a permutation of i.
FP8C_HD uint32_t rounding_bits(uint32_t k0, uint32_t k1, uint32_t i) { return lowbias32(lowbias32(i ^ k0) ^ k1); }

// Fraction bits of the fixed-point form of an FP8-subnormal |v| (in units of
// the smallest subnormal, below 2^kMantBits): the largest that fits an int32.
template <WireFormat F>
constexpr int kSubnormalFraction = 31 - WireTraits<F>::kMantBits;

// 1 / (smallest subnormal) * 2^kSubnormalFraction, a power of two.
template <WireFormat F>
constexpr float kSubnormalFixedScale =
    WireTraits<F>::kSubnormalInv * static_cast<float>(uint32_t{1} << kSubnormalFraction<F>);

// fp32 -> code, rounded stochastically with the random bits `rand`; otherwise
// exactly encode_code (v already divided by the block scale, `limit` caps the
// magnitude code, the same NaN / Inf codes). Normal range: rand's top kDrop
// bits are added below the kept mantissa, so the carry happens with
// probability (dropped bits) / 2^kDrop, the exact distance to the code below.
// FP8-subnormal range: |v| in fixed point with kSubnormalFraction bits
// (|v| * a power of two, exact, truncated), the same carry from rand's top
// bits; the probability is exact to 2^-kSubnormalFraction of a step.
template <WireFormat F>
FP8C_HD uint8_t encode_code_stochastic(float v, uint32_t limit, uint32_t rand) {
  using T = WireTraits<F>;
  constexpr int kDrop = 23 - T::kMantBits;
  constexpr int kFrac = kSubnormalFraction<F>;
  const uint32_t b = float_bits(v);
  const uint32_t sign = (b >> (32 - T::kCodeBits)) & T::kSignBit;
  const uint32_t a = b & 0x7FFFFFFFu;
  const bool subnormal = a < T::kMinNormalBits;
  const uint32_t normal = ((a + (rand >> (32 - kDrop))) >> kDrop) - (T::kRebias << T::kMantBits);
  // Only subnormal lanes are converted (others as 0), so the conversion stays in int32 range.
  const float scaled = bits_float(subnormal ? a : 0u) * kSubnormalFixedScale<F>;
  const uint32_t fixed = static_cast<uint32_t>(static_cast<int32_t>(scaled));
  const uint32_t sub = (fixed + (rand >> (32 - kFrac))) >> kFrac;
  uint32_t code = subnormal ? sub : normal;
  code = code > limit ? limit : code;
  code |= sign;
  uint32_t special = T::kNanCode;
  if constexpr (T::kHasInf) special = a == 0x7F800000u ? (T::kInfCode | sign) : special;
  code = a >= 0x7F800000u ? special : code;
  return static_cast<uint8_t>(code);
}

// What a stochastic quantize of one run of a segment needs: the segment's
// key and the index in the segment of the run's first element.
struct StochasticRun {
  uint32_t k0, k1;
  uint32_t first;
  FP8C_HD uint32_t bits(int64_t i) const { return rounding_bits(k0, k1, first + static_cast<uint32_t>(i)); }
};

}  // namespace fp8comm
