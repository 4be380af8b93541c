#pragma once
// The codec over at::Tensors: picks the CPU loops or the CUDA launchers by the
// tensors' device. CUDA work is enqueued on the device's *current* stream, so
// callers choose the stream with a guard (the backend runs it on a side stream).
#include <ATen/ATen.h>

#include <optional>

#include "codec.h"
#include "fp8_dtype_table.h"

namespace fp8comm {

// dtype -> ElemType; raises an error naming `what` when unsupported (the FP8
// dtypes: fp8_dtype_of in fp8_dtype_table.h).
ElemType elem_type_of(at::ScalarType dtype, const char* what);
bool is_codec_dtype(at::ScalarType dtype);  // float32, bfloat16, float16
// The one block-size rule (is_valid_block_size); raises ValueError naming `what`.
void check_block_size(int64_t block_size, const char* what);
// The same, and the block size `format` requires (WireTraits::kBlockSize).
void check_block_size(int64_t block_size, WireFormat format, const char* what);

// Whether the CUDA codec runs the tiled kernels (codec_cuda_tiled.cu) rather
// than the legacy ones (codec_cuda.cu): FP8COMM_CUDA_CODEC, read at every
// call (ValueError for a value other than legacy or tiled).
bool tiled_cuda_codec();

// The same operations as codec.h; `src`/`dst` are contiguous tensors on the
// device whose memory `codes` points into. premul_tensor (one float32 element
// on that device) replaces premul when given.
void quantize_into(const at::Tensor& src, float premul, const std::optional<at::Tensor>& premul_tensor,
                   const BlockCodes& dst);
// whole_output_bytes: codec.h, dequantize (the CPU's choice of stores only).
void dequantize_into(const BlockCodes& src, const at::Tensor& dst, int64_t whole_output_bytes = 0);

// The own addend of a sum (codec.h, OwnAddend) as a tensor: `src` undefined
// for none, else contiguous on the sum's device; premul_tensor as above.
struct OwnAddendTensor {
  at::Tensor src;
  float premul = 1.0f;
  std::optional<at::Tensor> premul_tensor;
};

void dequant_sum_into(const BlockCodes& pieces, const OwnAddendTensor& own, int post_div, const at::Tensor& dst);
void dequant_sum_requantize_into(const BlockCodes& pieces, const OwnAddendTensor& own, int post_div, const BlockCodes& out,
                                 const at::Device& device);

}  // namespace fp8comm
