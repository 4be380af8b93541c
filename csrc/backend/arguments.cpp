#include "arguments.h"

#include <ATen/MemoryOverlap.h>

namespace fp8comm {

int64_t bytes_of(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

int64_t bytes_of(const std::vector<at::Tensor>& ts) {
  int64_t total = 0;
  for (const auto& t : ts) total += bytes_of(t);
  return total;
}

bool is_fp8(const at::Tensor& t) {
  const auto d = t.scalar_type();
  return d == at::kFloat8_e4m3fn || d == at::kFloat8_e5m2 || d == at::kFloat8_e4m3fnuz ||
         d == at::kFloat8_e5m2fnuz || d == at::kFloat8_e8m0fnu;
}

at::Tensor as_bytes_if_fp8(const at::Tensor& t) { return is_fp8(t) ? t.view(at::kByte) : t; }

std::vector<at::Tensor> as_bytes_if_fp8(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(as_bytes_if_fp8(t));
  return out;
}

std::vector<std::vector<at::Tensor>> as_bytes_if_fp8(const std::vector<std::vector<at::Tensor>>& tss) {
  std::vector<std::vector<at::Tensor>> out;
  out.reserve(tss.size());
  for (const auto& ts : tss) out.push_back(as_bytes_if_fp8(ts));
  return out;
}

void check_same_device_and_dtype(const char* op, const at::Tensor& ref, const at::Tensor& t, const char* name,
                                 const char* ref_name) {
  TORCH_CHECK(t.device() == ref.device(), "fp8comm ", op, ": ", name, " is on ", t.device(), " but ", ref_name,
              " is on ", ref.device(), "; put all tensors of one call on one device");
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), "fp8comm ", op, ": ", name, " has dtype ", t.scalar_type(),
              " but ", ref_name, " has dtype ", ref.scalar_type(), "; use one dtype for input and output");
}

void check_same_device(const char* op, const std::vector<at::Tensor>& ts) {
  for (const auto& t : ts) {
    TORCH_CHECK(t.device() == ts[0].device(), "fp8comm ", op, ": tensors on ", ts[0].device(), " and ", t.device(),
                "; put all tensors of one call on one device");
  }
}

void check_not_fp8_reduction(const char* op, const at::Tensor& t) {
  TORCH_CHECK(!is_fp8(t), "fp8comm ", op, ": cannot reduce ", t.scalar_type(),
              " tensors; reduce in float32 / bfloat16 (fp8comm compresses those to FP8 on the wire itself)");
}

void check_not_fp8_reduction(const char* op, const std::vector<at::Tensor>& ts) {
  for (const auto& t : ts) check_not_fp8_reduction(op, t);
}

// (Sparse tensors, which gloo all-reduces, are not strided: not checked.)
void check_writable(const char* op, const at::Tensor& t, const char* name) {
  TORCH_CHECK(!t.defined() || t.layout() != at::kStrided || at::has_internal_overlap(t) != at::MemOverlap::Yes,
              "fp8comm ", op, ": ", name,
              " has elements that share memory (e.g. made by expand()), so the call cannot write into it; "
              "pass a tensor with its own storage (clone() it)");
}

void check_writable(const char* op, const std::vector<at::Tensor>& ts, const char* name) {
  for (const auto& t : ts) check_writable(op, t, name);
}

void check_writable(const char* op, const std::vector<std::vector<at::Tensor>>& tss, const char* name) {
  for (const auto& ts : tss) check_writable(op, ts, name);
}

void check_dense(const char* op, const at::Tensor& t) {
  TORCH_CHECK(t.layout() == at::kStrided, "fp8comm ", op, ": expected a dense (strided) tensor, got layout ",
              t.layout());
}

void check_group_multiple(const char* op, const at::Tensor& big, const char* big_name, const at::Tensor& small,
                          const char* small_name, int64_t group_size) {
  TORCH_CHECK(big.numel() == group_size * small.numel(), "fp8comm ", op, ": ", big_name, " has ", big.numel(),
              " elements but must have group size (", group_size, ") x ", small_name, " numel (", small.numel(),
              ") = ", group_size * small.numel());
}

at::Tensor contiguous_or_self(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

void write_back(const at::Tensor& user, const at::Tensor& result) {
  if (!result.is_same(user)) user.copy_(result.view(user.sizes()));
}

void check_reduce_scatter_list(const char* op, const at::Tensor& output, const std::vector<at::Tensor>& inputs,
                               int64_t group_size) {
  TORCH_CHECK(static_cast<int64_t>(inputs.size()) == group_size, "fp8comm ", op, ": the input list has ",
              inputs.size(), " tensors but the group has ", group_size, " ranks");
  check_not_fp8_reduction(op, output);
  check_writable(op, output, "the output");
  for (const auto& in : inputs) {
    check_same_device_and_dtype(op, output, in, "an input", "the output");
    TORCH_CHECK(in.numel() == output.numel(), "fp8comm ", op, ": every input must have the output's ",
                output.numel(), " elements, got ", in.numel());
  }
}

void check_all_gather_list(const char* op, const at::Tensor& input, const std::vector<at::Tensor>& outputs,
                           int64_t group_size) {
  TORCH_CHECK(static_cast<int64_t>(outputs.size()) == group_size, "fp8comm ", op, ": the output list has ",
              outputs.size(), " tensors but the group has ", group_size, " ranks");
  for (const auto& out : outputs) {
    check_same_device_and_dtype(op, input, out, "an output");
    check_writable(op, out, "an output");
    TORCH_CHECK(out.numel() == input.numel(), "fp8comm ", op, ": every output must have the input's ",
                input.numel(), " elements, got ", out.numel());
  }
}

bool check_all_reduce_coalesced(const char* op, const std::vector<at::Tensor>& tensors) {
  TORCH_CHECK(!tensors.empty(), "fp8comm ", op, ": got no tensors");
  bool same_dtype = true;
  for (const auto& t : tensors) {
    check_dense(op, t);
    check_not_fp8_reduction(op, t);
    check_writable(op, t, "a tensor");
    same_dtype = same_dtype && t.scalar_type() == tensors[0].scalar_type();
  }
  check_same_device(op, tensors);
  return same_dtype;
}

bool all_to_all_lists_alike(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
                            int64_t group_size) {
  bool alike = static_cast<int64_t>(inputs.size()) == group_size && static_cast<int64_t>(outputs.size()) == group_size;
  for (size_t i = 0; alike && i < inputs.size(); ++i) {
    for (const at::Tensor* t : {&inputs[i], &outputs[i]}) {
      alike = alike && t->device() == inputs[0].device() && t->scalar_type() == inputs[0].scalar_type() &&
              t->layout() == at::kStrided;
    }
  }
  return alike;
}

}  // namespace fp8comm
