#pragma once
// The scalar math of the FP8 block format (DESIGN.md, "Wire format"), shared by
// the CPU and CUDA codecs so that both produce bit-identical bytes.
//
// Torch-free. The element math is branch-free: plain integer / IEEE float
// arithmetic with selects, so the CPU loops vectorize and the CUDA kernels do
// not diverge. Nothing here may depend on FMA contraction or on flush-to-zero:
// every product below is exact or is a single correctly rounded operation.
// It also holds the registry of wire formats (WireTraits) and FP8 compute
// dtypes (Fp8Traits), and the host-side dispatch that instantiates code over
// them and element types.
#include <stdint.h>
#include <string.h>

#include <stdexcept>
#include <string>
#include <type_traits>

#include "../common/block_size.h"

#if defined(__CUDACC__)
#define FP8C_HD __host__ __device__ __forceinline__
#else
#define FP8C_HD inline __attribute__((always_inline))
#endif

namespace fp8comm {

// Element types the codec reads and writes.
enum class ElemType : int { F32 = 0, BF16 = 1, F16 = 2 };

// The E8M0 byte of a scale 2^e is e + 127. Scales are kept in [2^-126, 2^127]
// so that they and their inverses are normal floats.
constexpr int kScaleBias = 127;
constexpr int kMinScaleExp = -126;
constexpr uint8_t kUnitScaleByte = 127;  // 2^0: blocks that are all zero / non-finite
// E8M0's NaN: the scale of a block of a format without NaN codes that holds
// a non-finite input (never written for a format with NaN codes).
constexpr uint8_t kNanScaleByte = 0xFF;

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

// ---------------------------------------------------------------- element formats
// A small float format by its bits: code width (8 or 4; the sign is the top
// bit), exponent bias, mantissa bits, the largest finite magnitude code,
// whether the code above it is Inf (else, with a NaN code, every code above
// is NaN), whether it has NaN codes at all, and the one NaN code the codec
// writes (positive: which NaN a sum of NaNs yields differs by device, the
// bytes must not). The rest follows.
template <int CodeBits, int Bias, int MantBits, uint32_t MaxCode, bool HasInf, bool HasNan, uint32_t NanCode>
struct MiniFloatBits {
  static constexpr int kCodeBits = CodeBits;
  static constexpr uint32_t kSignBit = 1u << (CodeBits - 1);
  static constexpr uint32_t kMagnitudeMask = kSignBit - 1u;
  static constexpr int kMantBits = MantBits;
  static constexpr uint32_t kRebias = 127 - Bias;  // fp32 bias - format bias
  static constexpr uint32_t kMaxCode = MaxCode;    // the largest finite magnitude
  static constexpr bool kHasInf = HasInf;
  static constexpr bool kHasNanCode = HasNan;
  static constexpr uint32_t kFirstNonFinite = MaxCode + 1;  // Inf when kHasInf, else NaN (with kHasNanCode)
  static constexpr uint32_t kInfCode = MaxCode + 1;         // with kHasInf
  static constexpr uint32_t kNanCode = NanCode;             // without kHasNanCode: the code non-finite inputs get
  static constexpr uint32_t kMinNormalBits = static_cast<uint32_t>(128 - Bias) << 23;  // 2^(1 - Bias)
  static constexpr float kSubnormalInv = static_cast<float>(uint64_t{1} << (Bias - 1 + MantBits));  // 1 / min subnormal
  // max = 1.m * 2^kMaxExp; kMaxMantissa: its m as fp32 mantissa bits.
  static constexpr int kMaxExp = static_cast<int>(MaxCode >> MantBits) - Bias;
  static constexpr uint32_t kMaxMantissa = (MaxCode & ((1u << MantBits) - 1u)) << (23 - MantBits);
  static constexpr float kMax = static_cast<float>((MaxCode & ((1u << MantBits) - 1u)) | (1u << MantBits)) *
                                static_cast<float>(uint64_t{1} << (kMaxExp - MantBits));
  // kMax plus half the step below it: the largest value that rounds to kMax
  // on the grid continued past it (E2M1: 7, halfway to 8; E4M3: 464).
  static_assert(kMaxExp - MantBits - 1 >= 0, "a top step of at least 2");
  static constexpr float kRoundsToMax = kMax + static_cast<float>(uint64_t{1} << (kMaxExp - MantBits - 1));
};

// The FP8 compute dtypes (Fp8Linear's casts, csrc/linear/): each has one
// Fp8Traits entry, one case in dispatch_fp8_dtype and one row in the torch
// table (fp8_dtype_table.h).
enum class Fp8Dtype : int { E4M3 = 0, E5M2 = 1 };

template <Fp8Dtype F>
struct Fp8Traits;

template <>
struct Fp8Traits<Fp8Dtype::E4M3> : MiniFloatBits<8, 7, 3, 0x7E, false, true, 0x7F> {
  static constexpr const char* kName = "e4m3";
};

template <>
struct Fp8Traits<Fp8Dtype::E5M2> : MiniFloatBits<8, 15, 2, 0x7B, true, true, 0x7E> {
  static constexpr const char* kName = "e5m2";
};

static_assert(Fp8Traits<Fp8Dtype::E4M3>::kMax == 448.0f && Fp8Traits<Fp8Dtype::E5M2>::kMax == 57344.0f,
              "fp8_max of the OCP FP8 formats");

// How a wire format stores the scales of its blocks (DESIGN.md, "Wire
// format"); the scale functions below (block_scale_byte, block_encoding,
// block_scale) are the one place that reads it.
enum class ScaleKind : int {
  // One E8M0 byte per block: the power of two 2^(byte - 127); 0xFF is NaN.
  kE8M0 = 0,
  // One E4M3 byte per block times one FP32 power of two per segment, stored
  // in the 4 bytes before the segment's block scales; E4M3's 0x7F is NaN.
  kE4M3TimesSegment = 1,
};

// The wire element formats of the block codec (DESIGN.md, "Wire format"). A
// format is one WireTraits entry (its element bits, code width included; its
// scale kind; the block size it requires, 0 for any valid one), one case in
// dispatch_wire_format and one row in the torch table (fp8_dtype_table.h);
// the codec reaches it through those alone. The enum values are the segment
// header's format byte.
enum class WireFormat : int { E4M3 = 0, E5M2 = 1, MXFP4 = 2, NVFP4 = 3 };

// The scale part of a format's traits.
template <ScaleKind S, int BlockSize>
struct ScaleTraits {
  static constexpr ScaleKind kScaleKind = S;
  static constexpr int kBlockSize = BlockSize;  // 0: any valid block size
  static constexpr int kSegmentScaleBytes = S == ScaleKind::kE4M3TimesSegment ? 4 : 0;
  static constexpr uint8_t kNanScale = S == ScaleKind::kE8M0 ? 0xFF : 0x7F;
};

template <WireFormat W>
struct WireTraits;

template <>
struct WireTraits<WireFormat::E4M3> : Fp8Traits<Fp8Dtype::E4M3>, ScaleTraits<ScaleKind::kE8M0, 0> {};

template <>
struct WireTraits<WireFormat::E5M2> : Fp8Traits<Fp8Dtype::E5M2>, ScaleTraits<ScaleKind::kE8M0, 0> {};

// E2M1 codes {0, 0.5, 1, 1.5, 2, 3, 4, 6} and sign, two per byte (element 2i
// in the low nibble, 2i + 1 in the high one). No Inf or NaN code: a block
// holding a non-finite input gets its scale kind's NaN scale, so all of it
// decodes to NaN; its codes are those of its finite elements, 0 for the
// non-finite ones.
using E2M1Bits = MiniFloatBits<4, 1, 1, 0x7, false, false, 0x0>;

// OCP MX FP4: E2M1 with an E8M0 scale per block.
template <>
struct WireTraits<WireFormat::MXFP4> : E2M1Bits, ScaleTraits<ScaleKind::kE8M0, 0> {
  static constexpr const char* kName = "mxfp4";
};

// NVFP4: E2M1 in blocks of 16, each with an E4M3 scale, times one FP32 scale
// per segment.
template <>
struct WireTraits<WireFormat::NVFP4> : E2M1Bits, ScaleTraits<ScaleKind::kE4M3TimesSegment, 16> {
  static constexpr const char* kName = "nvfp4";
};

static_assert(WireTraits<WireFormat::MXFP4>::kMax == 6.0f, "E2M1's largest value");

template <Fp8Dtype F>
using Fp8Constant = std::integral_constant<Fp8Dtype, F>;
template <WireFormat W>
using WireConstant = std::integral_constant<WireFormat, W>;

// Calls fn(Fp8Constant<f>{}) with f as a compile-time constant and returns
// its result: every instantiation over FP8 dtypes goes through here, so a
// value without a case raises instead of taking another dtype's code.
template <typename Fn>
decltype(auto) dispatch_fp8_dtype(Fp8Dtype f, Fn&& fn) {
  switch (f) {
    case Fp8Dtype::E4M3: return fn(Fp8Constant<Fp8Dtype::E4M3>{});
    case Fp8Dtype::E5M2: return fn(Fp8Constant<Fp8Dtype::E5M2>{});
  }
  throw std::invalid_argument("fp8comm: unknown Fp8Dtype " + std::to_string(static_cast<int>(f)));
}

// The same over wire formats.
template <typename Fn>
decltype(auto) dispatch_wire_format(WireFormat w, Fn&& fn) {
  switch (w) {
    case WireFormat::E4M3: return fn(WireConstant<WireFormat::E4M3>{});
    case WireFormat::E5M2: return fn(WireConstant<WireFormat::E5M2>{});
    case WireFormat::MXFP4: return fn(WireConstant<WireFormat::MXFP4>{});
    case WireFormat::NVFP4: return fn(WireConstant<WireFormat::NVFP4>{});
  }
  throw std::invalid_argument("fp8comm: unknown WireFormat " + std::to_string(static_cast<int>(w)));
}

// The same over element types.
template <typename Fn>
decltype(auto) dispatch_elem_type(ElemType e, Fn&& fn) {
  switch (e) {
    case ElemType::F32: return fn(std::integral_constant<ElemType, ElemType::F32>{});
    case ElemType::BF16: return fn(std::integral_constant<ElemType, ElemType::BF16>{});
    case ElemType::F16: return fn(std::integral_constant<ElemType, ElemType::F16>{});
  }
  throw std::invalid_argument("fp8comm: unknown ElemType " + std::to_string(static_cast<int>(e)));
}

// Calls fn(e, w) with the element type and wire format as compile-time
// constants (std::integral_constant) and returns its result; every codec
// loop and kernel is instantiated through it.
template <typename Fn>
decltype(auto) with_codec_types(ElemType type, WireFormat format, Fn&& fn) {
  return dispatch_elem_type(type, [&](auto e) -> decltype(auto) {
    return dispatch_wire_format(format, [&](auto w) -> decltype(auto) { return fn(e, w); });
  });
}

// with_codec_types for kernels written for one scale kind (the x86 SIMD
// kernels: E8M0); a format of another kind raises instead of instantiating them.
template <ScaleKind K, typename Fn>
void with_codec_types_of_kind(ElemType type, WireFormat format, Fn&& fn) {
  with_codec_types(type, format, [&](auto e, auto w) {
    if constexpr (WireTraits<decltype(w)::value>::kScaleKind == K) {
      fn(e, w);
    } else {
      throw std::invalid_argument(std::string("fp8comm: no kernel of this scale kind for wire format ") +
                                  WireTraits<decltype(w)::value>::kName);
    }
  });
}

// The same over element types and FP8 compute dtypes (the linear casts).
template <typename Fn>
decltype(auto) with_cast_types(ElemType type, Fp8Dtype fp8_dtype, Fn&& fn) {
  return dispatch_elem_type(type, [&](auto e) -> decltype(auto) {
    return dispatch_fp8_dtype(fp8_dtype, [&](auto f) -> decltype(auto) { return fn(e, f); });
  });
}

// "e4m3", "e5m2": the name options and errors use.
inline const char* fp8_dtype_name(Fp8Dtype f) {
  return dispatch_fp8_dtype(f, [](auto c) { return Fp8Traits<decltype(c)::value>::kName; });
}

// "e4m3", "e5m2", "mxfp4", "nvfp4".
inline const char* wire_format_name(WireFormat w) {
  return dispatch_wire_format(w, [](auto c) { return WireTraits<decltype(c)::value>::kName; });
}

// Bits of one code.
inline int code_bits(WireFormat w) {
  return dispatch_wire_format(w, [](auto c) { return WireTraits<decltype(c)::value>::kCodeBits; });
}

// The block size a format requires; 0: any valid block size.
inline int required_block_size(WireFormat w) {
  return dispatch_wire_format(w, [](auto c) { return WireTraits<decltype(c)::value>::kBlockSize; });
}

inline ScaleKind scale_kind(WireFormat w) {
  return dispatch_wire_format(w, [](auto c) { return WireTraits<decltype(c)::value>::kScaleKind; });
}

// Bytes before a segment's block scales (its segment scale).
inline int segment_scale_bytes(WireFormat w) {
  return dispatch_wire_format(w, [](auto c) { return WireTraits<decltype(c)::value>::kSegmentScaleBytes; });
}

// Bytes holding the codes of n >= 0 elements (n a multiple of two for 4-bit codes).
template <WireFormat W>
FP8C_HD constexpr int64_t code_bytes(int64_t n) {
  static_assert(WireTraits<W>::kCodeBits == 8 || WireTraits<W>::kCodeBits == 4, "codes of 8 or 4 bits");
  // A shift, not n * bits / 8: under -fwrapv the compiler may not fold that to n.
  return WireTraits<W>::kCodeBits == 8 ? n : n >> 1;
}

// ---------------------------------------------------------------- E8M0 scales
// Smallest e with amax <= max * 2^e (the block maximum never saturates),
// clamped to the scale range. amax_bits: bits of a finite non-negative float.
template <WireFormat F>
FP8C_HD int scale_exponent(uint32_t amax_bits) {
  static_assert(WireTraits<F>::kScaleKind == ScaleKind::kE8M0, "an E8M0 format's scale");
  int exp = static_cast<int>(amax_bits >> 23) - 127;
  // amax = 1.m * 2^exp; max = 1.m' * 2^kMaxExp: one more when m > m'.
  int e = exp - WireTraits<F>::kMaxExp + ((amax_bits & 0x7FFFFFu) > WireTraits<F>::kMaxMantissa ? 1 : 0);
  e = e < kMinScaleExp ? kMinScaleExp : e;
  return amax_bits == 0 ? 0 : e;
}

template <WireFormat F>
FP8C_HD uint8_t scale_byte(uint32_t amax_bits) {
  return static_cast<uint8_t>(scale_exponent<F>(amax_bits) + kScaleBias);
}

// The scale byte a block stores: the scale byte of its finite maximum, or,
// for a format without NaN codes, its scale kind's NaN when the block holds a
// non-finite input (`nonfinite` non-zero). Its codes are encoded with the
// finite scale either way.
template <WireFormat F>
FP8C_HD uint8_t stored_scale_byte(uint8_t finite_scale_byte, uint32_t nonfinite) {
  if constexpr (WireTraits<F>::kHasNanCode) return finite_scale_byte;
  return nonfinite != 0 ? WireTraits<F>::kNanScale : finite_scale_byte;
}

// 1 when v is Inf or NaN, else 0 (or-reduced over a block for
// stored_scale_byte; a mask, so the loops vectorize).
FP8C_HD uint32_t nonfinite_bit(float v) { return (float_bits(v) & 0x7FFFFFFFu) >= 0x7F800000u ? 1u : 0u; }

// The largest code whose value times 2^e is a finite float. It is kMaxCode
// except for blocks whose amax is within a rounding step of FLT_MAX: there
// RNE could round up to 2^128, and such values round down instead.
template <WireFormat F>
FP8C_HD uint32_t code_limit(uint8_t scale_byte) {
  using T = WireTraits<F>;
  static_assert(T::kScaleKind == ScaleKind::kE8M0, "an E8M0 format's scale");
  // exponent field of the binade just below 2^128 / 2^e.
  const int top = 127 - (static_cast<int>(scale_byte) - kScaleBias) + static_cast<int>(127 - T::kRebias);
  const int full = (top << T::kMantBits) | ((1 << T::kMantBits) - 1);
  return top > static_cast<int>(T::kMaxCode >> T::kMantBits) || full > static_cast<int>(T::kMaxCode)
             ? T::kMaxCode
             : static_cast<uint32_t>(full);
}

// Scale and its inverse from a stored byte; kNanScaleByte decodes to NaN.
// inv_scale_from_byte takes scale_byte's bytes only.
FP8C_HD float scale_from_byte(uint8_t b) {
  return b == kNanScaleByte ? bits_float(0x7FC00000u) : pow2f(static_cast<int>(b) - kScaleBias);
}
FP8C_HD float inv_scale_from_byte(uint8_t b) { return pow2f(kScaleBias - static_cast<int>(b)); }

// fp32 -> code, round to nearest even. v is already divided by the block
// scale, so |v| <= max for every finite element; `limit` (code_limit) caps the
// magnitude code. NaN -> NaN; Inf -> Inf where the format has one (E5M2), else
// NaN; a format without NaN codes writes kNanCode (its block scale says NaN).
// NaN is always written as the one positive NaN code: which NaN a sum of NaNs
// yields (its sign) differs between compilers and devices, the bytes must not.
template <WireFormat F>
FP8C_HD uint8_t encode_code(float v, uint32_t limit) {
  using T = WireTraits<F>;
  constexpr int kDrop = 23 - T::kMantBits;
  const uint32_t b = float_bits(v);
  const uint32_t sign = (b >> (32 - T::kCodeBits)) & T::kSignBit;
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
  uint32_t special = T::kNanCode;
  if constexpr (T::kHasInf) special = a == 0x7F800000u ? (T::kInfCode | sign) : special;
  code = a >= 0x7F800000u ? special : code;
  return static_cast<uint8_t>(code);
}

// code -> fp32, exact (the block scale applied by the caller).
template <WireFormat F>
FP8C_HD float decode_code(uint8_t c) {
  using T = WireTraits<F>;
  const uint32_t sign = static_cast<uint32_t>(c & T::kSignBit) << (32 - T::kCodeBits);
  const uint32_t em = c & T::kMagnitudeMask;
  const uint32_t exp = em >> T::kMantBits;
  const uint32_t mant = em & ((1u << T::kMantBits) - 1u);
  const uint32_t normal_bits = (em << (23 - T::kMantBits)) + (T::kRebias << 23);
  const uint32_t sub_bits = float_bits(static_cast<float>(mant) * (1.0f / T::kSubnormalInv));
  uint32_t bits = exp == 0 ? sub_bits : normal_bits;
  if constexpr (T::kHasNanCode) bits = em >= T::kFirstNonFinite ? 0x7FC00000u : bits;
  if constexpr (T::kHasInf) bits = em == T::kInfCode ? 0x7F800000u : bits;
  return bits_float(bits | sign);
}

// ---------------------------------------------------------------- scales by kind
// What every codec path calls, for a format of any scale kind. A block's
// scale S comes from its stored byte and its segment's scale g (1 for E8M0
// formats); its codes are q(x / S), decoded as value(code) * S.
//
// kE4M3TimesSegment: g is the smallest power of two with segment amax <=
// max * 448 * g, in [2^-117, 2^117] so every S is a normal float; the block's
// byte is the E4M3 code c nearest to amax / (max * g), one code higher where
// amax / S would exceed kRoundsToMax (E4M3 subnormals, whose steps are
// coarse). So S = value(c) * g is exact, and the block maximum, at most max
// + 1/16 of it in code units, always rounds to its nearest code on the
// format's grid continued past max (E2M1: 6, the next code would be 8): it
// never saturates beyond a rounding step. A block of zeros stores 1.0 (0x38).
constexpr int kSegmentScaleMinExp = -117;
constexpr int kSegmentScaleMaxExp = 117;
constexpr uint8_t kE4M3One = 0x38;

// The segment scale g of a segment whose finite amax has bits amax_bits.
template <WireFormat F>
FP8C_HD float segment_scale(uint32_t amax_bits) {
  using T = WireTraits<F>;
  if constexpr (T::kScaleKind == ScaleKind::kE8M0) {
    return 1.0f;
  } else {
    using S = WireTraits<WireFormat::E4M3>;
    // limit = max * 448 = 1.m * 2^k (exact); e = exp - k, one more when m' > m.
    const uint32_t limit_bits = float_bits(T::kMax * S::kMax);
    const int exp = static_cast<int>(amax_bits >> 23) - 127;
    int e = exp - (static_cast<int>(limit_bits >> 23) - 127) +
            ((amax_bits & 0x7FFFFFu) > (limit_bits & 0x7FFFFFu) ? 1 : 0);
    e = e < kSegmentScaleMinExp ? kSegmentScaleMinExp : e;
    e = e > kSegmentScaleMaxExp ? kSegmentScaleMaxExp : e;
    return amax_bits == 0 ? 1.0f : pow2f(e);
  }
}

// A segment's g, stored in the 4 bytes before its block scales (none for E8M0).
template <WireFormat F>
FP8C_HD float load_segment_scale(const uint8_t* block_scales) {
  if constexpr (WireTraits<F>::kSegmentScaleBytes == 0) {
    return 1.0f;
  } else {
    uint32_t u;
    memcpy(&u, block_scales - 4, 4);
    return bits_float(u);
  }
}

template <WireFormat F>
FP8C_HD void store_segment_scale(uint8_t* block_scales, float g) {
  if constexpr (WireTraits<F>::kSegmentScaleBytes != 0) {
    const uint32_t u = float_bits(g);
    memcpy(block_scales - 4, &u, 4);
  }
}

// The byte of a block whose finite amax has bits amax_bits (before
// stored_scale_byte).
template <WireFormat F>
FP8C_HD uint8_t block_scale_byte(uint32_t amax_bits, float g) {
  using T = WireTraits<F>;
  if constexpr (T::kScaleKind == ScaleKind::kE8M0) {
    return scale_byte<F>(amax_bits);
  } else {
    constexpr WireFormat S = WireFormat::E4M3;
    const float amax = bits_float(amax_bits);
    const float unit = T::kMax * g;  // exact: a power of two times max
    uint32_t c = encode_code<S>(amax / unit, WireTraits<S>::kMaxCode);
    // value(c) has 4 significant bits and kRoundsToMax few, so their product times g is exact.
    c = decode_code<S>(static_cast<uint8_t>(c)) * (T::kRoundsToMax * g) < amax ? c + 1 : c;
    return amax_bits == 0 ? kE4M3One : static_cast<uint8_t>(c);
  }
}

// The scale S of a stored byte (NaN for its kind's NaN byte).
template <WireFormat F>
FP8C_HD float block_scale(uint8_t b, float g) {
  if constexpr (WireTraits<F>::kScaleKind == ScaleKind::kE8M0) {
    return scale_from_byte(b);
  } else {
    return decode_code<WireFormat::E4M3>(b) * g;  // NaN for 0x7F
  }
}

// How a block's elements become codes: x * factor (E8M0: 1 / S, exact) or
// x / factor (S), and the largest magnitude code (one whose value times S
// stays finite).
struct BlockEncoding {
  float factor;
  uint32_t limit;
};

template <WireFormat F>
FP8C_HD BlockEncoding block_encoding(uint8_t finite_byte, float g) {
  using T = WireTraits<F>;
  if constexpr (T::kScaleKind == ScaleKind::kE8M0) {
    return BlockEncoding{inv_scale_from_byte(finite_byte), code_limit<F>(finite_byte)};
  } else {
    const float s = block_scale<F>(finite_byte, g);
    uint32_t limit = T::kMaxCode;
    while (limit > 0 && !(decode_code<F>(static_cast<uint8_t>(limit)) * s <= 3.4028234663852886e38f)) --limit;
    return BlockEncoding{s, limit};
  }
}

// x in code units of its block.
template <WireFormat F>
FP8C_HD float to_code_units(float x, const BlockEncoding& enc) {
  if constexpr (WireTraits<F>::kScaleKind == ScaleKind::kE8M0) {
    return x * enc.factor;
  } else {
#if defined(__CUDA_ARCH__)
    return __fdiv_rn(x, enc.factor);
#else
    return x / enc.factor;
#endif
  }
}

// Codes of element i in a block's code bytes: one byte each, or two 4-bit
// codes per byte, element 2i in the low nibble. store_code must be called for
// i in increasing order from an even i (the low nibble's store clears the high one).
template <WireFormat F>
FP8C_HD uint8_t load_code(const uint8_t* codes, int64_t i) {
  if constexpr (WireTraits<F>::kCodeBits == 8) {
    return codes[i];
  } else {
    return static_cast<uint8_t>((codes[i >> 1] >> ((i & 1) * 4)) & 0xFu);
  }
}

template <WireFormat F>
FP8C_HD void store_code(uint8_t* codes, int64_t i, uint8_t code) {
  if constexpr (WireTraits<F>::kCodeBits == 8) {
    codes[i] = code;
  } else if (i & 1) {
    codes[i >> 1] = static_cast<uint8_t>(codes[i >> 1] | (code << 4));
  } else {
    codes[i >> 1] = code;
  }
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

// The C type an element of type E is stored as.
template <ElemType E>
using Storage = typename Elem<E>::storage;

// ---------------------------------------------------------------- the sum
// Pieces are added in rank order starting from piece 0 (so -0 stays -0), then
// divided by post_div (AVG). Both codecs call exactly these two functions.
FP8C_HD float sum_finish(float sum, int post_div) {
  return post_div == 1 ? sum : sum / static_cast<float>(post_div);
}

}  // namespace fp8comm
