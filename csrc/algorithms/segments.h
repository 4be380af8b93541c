#pragma once
// Segment bookkeeping shared by the compressed algorithms: which elements of
// a flat tensor a segment holds, and how the segments of one buffer map onto
// ranks.
#include <ATen/ATen.h>

#include <algorithm>

#include "../codec/codec_tensor.h"
#include "quantization_error.h"
#include "reduction.h"
#include "residual.h"
#include "transport.h"
#include "wire_layout.h"

namespace fp8comm {

// Segments [r, r + count) of m elements of `t`, clipped to its end (empty
// past it): the elements a codec call over those segments reads or writes.
inline at::Tensor segments_of(const at::Tensor& t, int64_t r, int64_t count, int64_t m) {
  const at::Tensor flat = t.view({-1});  // contiguous; complex64 arrives as [n, 2] floats
  const int64_t n = flat.numel();
  const int64_t begin = std::min(r * m, n);
  return flat.narrow(0, begin, std::min((r + count) * m, n) - begin);
}

// Quantizes `src` (times the reduction's factor) into `codes`, adds its
// error to `error` when there is one (Options.track_error) and keeps it per
// element in `residual` when that is defined (error feedback).
inline void quantize_measured(const at::Tensor& src, const Reduction& red, const BlockCodes& codes,
                              QuantizationError* error, const at::Tensor& residual = {}) {
  quantize_into(src, red.premul, red.premul_tensor, codes);
  if (error) measure_quantized(src, red.premul, red.premul_tensor, codes, *error);
  if (residual.defined()) keep_residual(src, red, codes, residual);
}

// Quantizes every segment of `flat` (P segments of m elements) but this
// rank's own into `send`: the other ranks' segments in order (the exchange's
// layout). `residual` (defined: error feedback) is laid out like `flat`.
inline void quantize_for_peers(const Transport& t, const WireLayout& wire, const at::Tensor& flat, int64_t m,
                               const Reduction& red, const at::Tensor& send, QuantizationError* error,
                               const at::Tensor& residual = {}) {
  const int64_t rank = t.rank(), P = t.size(), S = wire.segment_bytes(m);
  auto kept = [&](int64_t r, int64_t count) {
    return residual.defined() ? segments_of(residual, r, count, m) : at::Tensor();
  };
  if (rank > 0) {
    quantize_measured(segments_of(flat, 0, rank, m), red, wire.codes(send.narrow(0, 0, rank * S), rank, m, 0), error,
                      kept(0, rank));
  }
  if (rank + 1 < P) {
    const int64_t count = P - 1 - rank;
    quantize_measured(segments_of(flat, rank + 1, count, m), red,
                      wire.codes(send.narrow(0, rank * S, count * S), count, m, rank + 1), error,
                      kept(rank + 1, count));
  }
}

// Decodes the P segments of m elements of an all_gather's buffer `gathered`
// into out(r, count), the elements of ranks [r, r + count), in runs of at
// most max_run ranks whose slots are consecutive (Transport::gather_slot: at
// most three runs). whole_output_bytes: the collective's whole output, of
// which these runs are part (codec.h, dequantize).
template <typename Out>
void decode_gathered(const Transport& t, const WireLayout& wire, const at::Tensor& gathered, int64_t m,
                     int64_t max_run, int64_t whole_output_bytes, Out&& out) {
  const int64_t P = t.size(), S = wire.segment_bytes(m);
  for (int64_t r = 0; r < P;) {
    int64_t count = 1;
    while (count < max_run && r + count < P && t.gather_slot(r + count) == t.gather_slot(r) + count) ++count;
    const at::Tensor dst = out(r, count);
    if (dst.numel() > 0) {
      dequantize_into(wire.codes(gathered.narrow(0, t.gather_slot(r) * S, count * S), count, m), dst,
                      whole_output_bytes);
    }
    r += count;
  }
}

}  // namespace fp8comm
