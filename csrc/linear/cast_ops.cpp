// The fused casts as a torch.library operator, fp8comm::cast_fp8, registered
// for CPU (the twin, cast_cpu.cpp) and CUDA (cast_cuda.cu); its fake kernel
// lives in fp8comm/nn/scaling.py. The library itself is defined by
// csrc/codec/codec_ops.cpp (TORCH_LIBRARY); this file adds a FRAGMENT.
//
//   cast_fp8(x, fp8_dtype, rowwise, with_data=True, with_transpose=False, amax=None)
//     -> (data, inv_scale, data_t, inv_scale_t)
//
// (data, inv_scale) is the current-scaling cast of x ([M, K]); (data_t,
// inv_scale_t) the cast of x.t() ([K, M], contiguous), which for tensorwise is
// the transpose of data with the same scale. inv_scale is [] tensorwise, [M, 1]
// rowwise; inv_scale_t [] or [K, 1]. An output not asked for is an empty [0]
// tensor. `amax` (tensorwise only, one float32 element on x's device) replaces
// x's own amax.
//
//   cast_fp8_scaled(x, fp8_dtype, scale, with_data=True, with_transpose=False)
//     -> (data, inv_scale, data_t, inv_scale_t, amax)
//
// The delayed recipe's cast (fp8comm/nn/delayed.py): tensorwise with a given
// scale (one float32 element on x's device, from an amax history), inv_scale
// 1 / scale, and amax the max |x| of this x ([], NaN if x has one), taken in
// the same pass on CUDA. CUDA always runs the tiled kernels
// (cast_cuda_tiled.cu; the legacy set has no such cast).
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/library.h>

#include "../codec/codec_tensor.h"
#include "../common/env.h"
#include "cast.h"

namespace fp8comm {
namespace cast {
namespace {

constexpr const char* kOp = "fp8comm.cast_fp8";

float fp8_max(Fp8Dtype f) {
  return dispatch_fp8_dtype(f, [](auto c) { return Fp8Traits<decltype(c)::value>::kMax; });
}

// The eager chain on an amax tensor: what an empty x gets (amax 0, or the
// given one). Any device.
at::Tensor inv_of_amax(const at::Tensor& amax, Fp8Dtype fp8_dtype) {
  return (amax.clamp_min(1e-12).reciprocal() * fp8_max(fp8_dtype)).reciprocal();
}

}  // namespace

bool tiled_cuda_cast() { return env::kCudaCast.as_choice({"legacy", "tiled"}) == "tiled"; }

namespace {

#ifdef FP8COMM_WITH_CUDA
void launch_cuda(const CastArgs& args, const at::Device& device, const at::Tensor& like) {
  // (a given scale: the tiled set's alone)
  c10::DeviceGuard guard(device);
  c10::impl::VirtualGuardImpl impl(device.type());
  void* stream = impl.getStream(device).native_handle();
  at::Tensor workspace =
      at::empty({cast_workspace_words(args.rows, args.cols, args.rowwise)}, like.options().dtype(at::kInt));
  CastArgs a = args;
  a.workspace = reinterpret_cast<uint32_t*>(workspace.data_ptr<int32_t>());
  const int err =
      a.scale != nullptr || tiled_cuda_cast() ? cast_fp8_cuda_tiled(a, stream) : cast_fp8_cuda(a, stream);
  TORCH_CHECK(err == 0, kOp, ": CUDA kernel failed to launch: ", cast_cuda_error_string(err));
}
#else
void launch_cuda(const CastArgs&, const at::Device&, const at::Tensor&) {
  TORCH_CHECK(false, kOp, " got a CUDA tensor, but this build of fp8comm has no CUDA kernels; reinstall it "
              "on a machine with nvcc and a CUDA build of torch");
}
#endif

// What both casts pass the kernels: the source and the outputs asked for
// (an output not asked for is null).
CastArgs args_for(const at::Tensor& src, ElemType type, Fp8Dtype fp8_dtype, at::Tensor& data, at::Tensor& inv,
                  at::Tensor& data_t, at::Tensor& inv_t, bool with_data, bool with_transpose) {
  CastArgs args;
  args.src = src.data_ptr();
  args.type = type;
  args.rows = src.size(0);
  args.cols = src.size(1);
  args.fp8_dtype = fp8_dtype;
  args.data = with_data ? static_cast<uint8_t*>(data.data_ptr()) : nullptr;
  args.inv_scale = with_data ? inv.data_ptr<float>() : nullptr;
  args.data_t = with_transpose ? static_cast<uint8_t*>(data_t.data_ptr()) : nullptr;
  args.inv_scale_t = with_transpose ? inv_t.data_ptr<float>() : nullptr;
  return args;
}

void run_cast(const CastArgs& args, const at::Device& device, const at::Tensor& src) {
  if (device.is_cpu()) {
    cast_fp8_cpu(args);
  } else {
    launch_cuda(args, device, src);
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> cast_fp8(const at::Tensor& x, at::ScalarType fp8_scalar_type,
                                                                    bool rowwise, bool with_data, bool with_transpose,
                                                                    const std::optional<at::Tensor>& amax) {
  TORCH_CHECK(x.dim() == 2, kOp, ": x must be 2-D ([rows, cols]), got ", x.dim(), "-D of shape ", x.sizes());
  const ElemType type = elem_type_of(x.scalar_type(), "fp8comm.cast_fp8 x");
  const Fp8Dtype fp8_dtype = fp8_dtype_of(fp8_scalar_type, kOp);
  TORCH_CHECK(with_data || with_transpose, kOp, ": nothing to do (with_data and with_transpose are both False)");
  const at::Device device = x.device();
  TORCH_CHECK(device.is_cpu() || device.is_cuda(), kOp, ": supports CPU and CUDA tensors, got ", device);
  at::Tensor amax_t;
  if (amax.has_value()) {
    TORCH_CHECK(!rowwise, kOp, ": amax can only be given to the tensorwise cast (rowwise=False)");
    TORCH_CHECK(amax->numel() == 1 && amax->scalar_type() == at::kFloat && amax->device() == device, kOp,
                ": amax must be one float32 element on ", device, ", got ", amax->scalar_type(), " with ",
                amax->numel(), " elements on ", amax->device());
    amax_t = amax->reshape({}).contiguous();
  }
  const at::Tensor src = x.contiguous();
  const int64_t M = src.size(0), K = src.size(1);
  const auto f32 = src.options().dtype(at::kFloat);
  const auto f8 = src.options().dtype(fp8_scalar_type);
  at::Tensor empty8 = at::empty({0}, f8), empty32 = at::empty({0}, f32);
  at::Tensor data = with_data ? at::empty({M, K}, f8) : empty8;
  at::Tensor data_t = with_transpose ? at::empty({K, M}, f8) : at::empty({0}, f8);
  at::Tensor inv = with_data ? (rowwise ? at::empty({M, 1}, f32) : at::empty({}, f32)) : empty32;
  at::Tensor inv_t = with_transpose ? (rowwise ? at::empty({K, 1}, f32) : at::empty({}, f32)) : at::empty({0}, f32);

  if (M == 0 || K == 0) {  // nothing to cast; the scales of empty rows / columns see amax 0
    const at::Tensor a = amax_t.defined() ? amax_t : at::zeros({}, f32);
    const at::Tensor v = inv_of_amax(a, fp8_dtype);
    if (with_data) inv.copy_(v.expand_as(inv));
    if (with_transpose) inv_t.copy_(v.expand_as(inv_t));
    return {data, inv, data_t, inv_t};
  }

  CastArgs args = args_for(src, type, fp8_dtype, data, inv, data_t, inv_t, with_data, with_transpose);
  args.rowwise = rowwise;
  args.amax = amax_t.defined() ? amax_t.data_ptr<float>() : nullptr;
  run_cast(args, device, src);
  return {data, inv, data_t, inv_t};
}

constexpr const char* kScaledOp = "fp8comm.cast_fp8_scaled";

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> cast_fp8_scaled(
    const at::Tensor& x, at::ScalarType fp8_scalar_type, const at::Tensor& scale, bool with_data,
    bool with_transpose) {
  TORCH_CHECK(x.dim() == 2, kScaledOp, ": x must be 2-D ([rows, cols]), got ", x.dim(), "-D of shape ", x.sizes());
  const ElemType type = elem_type_of(x.scalar_type(), "fp8comm.cast_fp8_scaled x");
  const Fp8Dtype fp8_dtype = fp8_dtype_of(fp8_scalar_type, kScaledOp);
  TORCH_CHECK(with_data || with_transpose, kScaledOp, ": nothing to do (with_data and with_transpose are both False)");
  const at::Device device = x.device();
  TORCH_CHECK(device.is_cpu() || device.is_cuda(), kScaledOp, ": supports CPU and CUDA tensors, got ", device);
  TORCH_CHECK(scale.numel() == 1 && scale.scalar_type() == at::kFloat && scale.device() == device, kScaledOp,
              ": scale must be one float32 element on ", device, ", got ", scale.scalar_type(), " with ",
              scale.numel(), " elements on ", scale.device());
  const at::Tensor scale_t = scale.reshape({}).contiguous();
  const at::Tensor src = x.contiguous();
  const int64_t M = src.size(0), K = src.size(1);
  const auto f32 = src.options().dtype(at::kFloat);
  const auto f8 = src.options().dtype(fp8_scalar_type);
  at::Tensor data = with_data ? at::empty({M, K}, f8) : at::empty({0}, f8);
  at::Tensor data_t = with_transpose ? at::empty({K, M}, f8) : at::empty({0}, f8);
  at::Tensor inv = with_data ? at::empty({}, f32) : at::empty({0}, f32);
  at::Tensor inv_t = with_transpose ? at::empty({}, f32) : at::empty({0}, f32);
  at::Tensor amax = at::empty({}, f32);
  if (M == 0 || K == 0) {  // nothing to cast: amax 0
    amax.zero_();
    if (with_data) inv.copy_(scale_t.reciprocal());
    if (with_transpose) inv_t.copy_(scale_t.reciprocal());
    return {data, inv, data_t, inv_t, amax};
  }
  CastArgs args = args_for(src, type, fp8_dtype, data, inv, data_t, inv_t, with_data, with_transpose);
  args.scale = scale_t.data_ptr<float>();
  args.amax_out = amax.data_ptr<float>();
  run_cast(args, device, src);
  return {data, inv, data_t, inv_t, amax};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(fp8comm, m) {
  m.def(
      "cast_fp8(Tensor x, ScalarType fp8_dtype, bool rowwise, bool with_data=True, bool with_transpose=False, "
      "Tensor? amax=None) -> (Tensor data, Tensor inv_scale, Tensor data_t, Tensor inv_scale_t)");
  m.def(
      "cast_fp8_scaled(Tensor x, ScalarType fp8_dtype, Tensor scale, bool with_data=True, "
      "bool with_transpose=False) -> (Tensor data, Tensor inv_scale, Tensor data_t, Tensor inv_scale_t, "
      "Tensor amax)");
}

TORCH_LIBRARY_IMPL(fp8comm, CPU, m) {
  m.impl("cast_fp8", &cast_fp8);
  m.impl("cast_fp8_scaled", &cast_fp8_scaled);
}
TORCH_LIBRARY_IMPL(fp8comm, CUDA, m) {
  m.impl("cast_fp8", &cast_fp8);
  m.impl("cast_fp8_scaled", &cast_fp8_scaled);
}

}  // namespace cast
}  // namespace fp8comm
