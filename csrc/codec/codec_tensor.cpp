#include "codec_tensor.h"

#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "../common/env.h"

namespace fp8comm {

ElemType elem_type_of(at::ScalarType dtype, const char* what) {
  switch (dtype) {
    case at::kFloat: return ElemType::F32;
    case at::kBFloat16: return ElemType::BF16;
    case at::kHalf: return ElemType::F16;
    default:
      TORCH_CHECK(false, what, ": expected a float32, bfloat16 or float16 tensor, got ", dtype,
                  "; convert it first (fp8comm encodes only these dtypes)");
  }
}

bool is_codec_dtype(at::ScalarType dtype) {
  return dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf;
}

void check_block_size(int64_t block_size, const char* what) {
  TORCH_CHECK_VALUE(is_valid_block_size(block_size), what, ": block_size must be " FP8C_BLOCK_SIZE_RULE ", got ",
                    block_size);
}

void check_block_size(int64_t block_size, WireFormat format, const char* what) {
  check_block_size(block_size, what);
  const int required = required_block_size(format);
  TORCH_CHECK_VALUE(required == 0 || block_size == required, what, ": wire_format '", wire_format_name(format),
                    "' has blocks of ", required, " elements, got block_size=", block_size, "; use block_size=",
                    required, " (or leave it unset) with it");
}

bool tiled_cuda_codec() { return env::kCudaCodec.as_choice({"legacy", "tiled"}) == "tiled"; }

namespace {

// The device's current stream as a cudaStream_t, with the device made current.
struct CudaLaunch {
  explicit CudaLaunch(const at::Device& device) : guard(device) {
    c10::impl::VirtualGuardImpl impl(device.type());
    stream = impl.getStream(device).native_handle();
  }
  c10::DeviceGuard guard;
  void* stream = nullptr;
};

void check_cuda(int error, const char* op) {
#ifdef FP8COMM_WITH_CUDA
  TORCH_CHECK(error == 0, "fp8comm: CUDA kernel ", op, " failed to launch: ", cuda_error_string(error));
#else
  (void)error;
  TORCH_CHECK(false, "fp8comm: ", op, " got a CUDA tensor, but this build of fp8comm has no CUDA "
              "kernels; reinstall it on a machine with nvcc and a CUDA build of torch");
#endif
}

bool on_cuda(const at::Device& device, const char* op) {
  if (device.is_cpu()) return false;
  TORCH_CHECK(device.is_cuda(), "fp8comm: ", op, " supports CPU and CUDA tensors, got ", device);
  return true;
}

}  // namespace

#ifdef FP8COMM_WITH_CUDA
#define FP8C_CUDA_CALL(expr) (expr)
#else
#define FP8C_CUDA_CALL(expr) 0
#endif

namespace {

// A tiled launch's workspace (codec.h): `words` 32-bit words from the caching
// allocator on the current stream of `device` (the launch's), or none.
struct TiledWorkspace {
  TiledWorkspace(int64_t words, const at::Device& device)
      : tensor(words > 0 ? at::empty({words}, at::TensorOptions().dtype(at::kInt).device(device)) : at::Tensor()) {}
  uint32_t* words() const {
    return tensor.defined() ? reinterpret_cast<uint32_t*>(tensor.data_ptr<int32_t>()) : nullptr;
  }
  at::Tensor tensor;
};

}  // namespace

void quantize_into(const at::Tensor& src, float premul, const std::optional<at::Tensor>& premul_tensor,
                   const BlockCodes& dst) {
  const ElemType type = elem_type_of(src.scalar_type(), "fp8comm quantize input");
  if (!on_cuda(src.device(), "quantize")) {
    if (premul_tensor) premul = premul_tensor->item<float>();
    quantize_cpu(src.data_ptr(), type, src.numel(), premul, dst);
    return;
  }
  CudaLaunch launch(src.device());
  const float* premul_device = premul_tensor ? premul_tensor->data_ptr<float>() : nullptr;
  if (tiled_cuda_codec()) {
    const TiledWorkspace workspace(FP8C_CUDA_CALL(tiled::quantize_workspace_words(dst)), src.device());
    check_cuda(FP8C_CUDA_CALL(tiled::quantize_cuda(src.data_ptr(), type, src.numel(), premul, premul_device, dst,
                                                   workspace.words(), launch.stream)),
               "quantize");
  } else {
    check_cuda(FP8C_CUDA_CALL(quantize_cuda(src.data_ptr(), type, src.numel(), premul, premul_device, dst,
                                            launch.stream)),
               "quantize");
  }
}

void dequantize_into(const BlockCodes& src, const at::Tensor& dst, int64_t whole_output_bytes) {
  const ElemType type = elem_type_of(dst.scalar_type(), "fp8comm dequantize output");
  if (!on_cuda(dst.device(), "dequantize")) {
    dequantize_cpu(src, dst.data_ptr(), type, dst.numel(), whole_output_bytes);
    return;
  }
  CudaLaunch launch(dst.device());
  check_cuda(FP8C_CUDA_CALL(tiled_cuda_codec()
                                ? tiled::dequantize_cuda(src, dst.data_ptr(), type, dst.numel(), launch.stream)
                                : dequantize_cuda(src, dst.data_ptr(), type, dst.numel(), launch.stream)),
             "dequantize");
}

namespace {

OwnAddend addend_of(const OwnAddendTensor& own, bool cuda) {
  OwnAddend a;
  if (!own.src.defined()) return a;
  a.present = true;
  a.src = own.src.data_ptr();
  a.type = elem_type_of(own.src.scalar_type(), "fp8comm dequant_sum own addend");
  a.numel = own.src.numel();
  a.premul = own.premul;
  if (own.premul_tensor) {
    if (cuda) {
      a.premul_device = own.premul_tensor->data_ptr<float>();
    } else {
      a.premul = own.premul_tensor->item<float>();
    }
  }
  return a;
}

}  // namespace

void dequant_sum_into(const BlockCodes& pieces, const OwnAddendTensor& own, int post_div, const at::Tensor& dst) {
  const ElemType type = elem_type_of(dst.scalar_type(), "fp8comm dequant_sum output");
  if (!on_cuda(dst.device(), "dequant_sum")) {
    dequant_sum_cpu(pieces, addend_of(own, false), post_div, dst.data_ptr(), type, dst.numel());
    return;
  }
  CudaLaunch launch(dst.device());
  const OwnAddend addend = addend_of(own, true);
  check_cuda(FP8C_CUDA_CALL(tiled_cuda_codec() ? tiled::dequant_sum_cuda(pieces, addend, post_div, dst.data_ptr(),
                                                                         type, dst.numel(), launch.stream)
                                               : dequant_sum_cuda(pieces, addend, post_div, dst.data_ptr(), type,
                                                                  dst.numel(), launch.stream)),
             "dequant_sum");
}

void dequant_sum_requantize_into(const BlockCodes& pieces, const OwnAddendTensor& own, int post_div, const BlockCodes& out,
                                 const at::Device& device) {
  if (!on_cuda(device, "dequant_sum_requantize")) {
    dequant_sum_requantize_cpu(pieces, addend_of(own, false), post_div, out);
    return;
  }
  CudaLaunch launch(device);
  const OwnAddend addend = addend_of(own, true);
  if (tiled_cuda_codec()) {
    const TiledWorkspace workspace(FP8C_CUDA_CALL(tiled::dequant_sum_requantize_workspace_words(pieces, out)),
                                   device);
    check_cuda(FP8C_CUDA_CALL(tiled::dequant_sum_requantize_cuda(pieces, addend, post_div, out, workspace.words(),
                                                                 launch.stream)),
               "dequant_sum_requantize");
  } else {
    check_cuda(FP8C_CUDA_CALL(dequant_sum_requantize_cuda(pieces, addend, post_div, out, launch.stream)),
               "dequant_sum_requantize");
  }
}

}  // namespace fp8comm
