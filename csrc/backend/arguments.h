#pragma once
// Checks of a call's arguments, made on the calling rank before anything is
// sent, so that a bad call raises where it enters, naming the op and the
// tensor; and the byte views float8 tensors travel as.
#include <ATen/ATen.h>

#include <vector>

namespace fp8comm {

int64_t bytes_of(const at::Tensor& t);
int64_t bytes_of(const std::vector<at::Tensor>& ts);

bool is_fp8(const at::Tensor& t);
// Float8 tensors move as bytes: gloo has no float8 types, and nothing is reduced.
at::Tensor as_bytes_if_fp8(const at::Tensor& t);
std::vector<at::Tensor> as_bytes_if_fp8(const std::vector<at::Tensor>& ts);
std::vector<std::vector<at::Tensor>> as_bytes_if_fp8(const std::vector<std::vector<at::Tensor>>& tss);

void check_same_device_and_dtype(const char* op, const at::Tensor& ref, const at::Tensor& t, const char* name,
                                 const char* ref_name = "the input");
void check_same_device(const char* op, const std::vector<at::Tensor>& ts);
// Float8 values cannot be summed on the wire (NCCL and gloo have no float8
// reductions); said where the call enters instead of failing in the transport.
void check_not_fp8_reduction(const char* op, const at::Tensor& t);
void check_not_fp8_reduction(const char* op, const std::vector<at::Tensor>& ts);
// A dense tensor the call writes into must not have elements that share
// memory (an expand()ed tensor): plain gloo crashes the process on those.
void check_writable(const char* op, const at::Tensor& t, const char* name);
void check_writable(const char* op, const std::vector<at::Tensor>& ts, const char* name);
void check_writable(const char* op, const std::vector<std::vector<at::Tensor>>& tss, const char* name);
void check_dense(const char* op, const at::Tensor& t);
// numel(big) == group_size x numel(small), for the tensor forms of
// reduce_scatter and all_gather.
void check_group_multiple(const char* op, const at::Tensor& big, const char* big_name, const at::Tensor& small,
                          const char* small_name, int64_t group_size);

// The list forms, as c10d gives them: reduce_scatter's P inputs, each like
// the output (device, dtype, numel), which it writes; all_gather's P
// outputs, each like the input, which it writes.
void check_reduce_scatter_list(const char* op, const at::Tensor& output, const std::vector<at::Tensor>& inputs,
                               int64_t group_size);
void check_all_gather_list(const char* op, const at::Tensor& input, const std::vector<at::Tensor>& outputs,
                           int64_t group_size);
// all_reduce_coalesced's tensors: dense, writable, not float8, on one
// device. Returns whether they share one dtype (else the call passes through).
bool check_all_reduce_coalesced(const char* op, const std::vector<at::Tensor>& tensors);
// Whether all_to_all's lists hold one tensor per rank each way, all strided
// and of the first input's device and dtype (else the call passes through).
bool all_to_all_lists_alike(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
                            int64_t group_size);

at::Tensor contiguous_or_self(const at::Tensor& t);
// Writes `result` back into the user's tensor when the algorithm worked on a copy.
void write_back(const at::Tensor& user, const at::Tensor& result);

}  // namespace fp8comm
