#pragma once
// c10d names that differ between the torch versions fp8comm supports (README,
// "Supported torch"). Each is detected from the headers themselves, not from a
// version number, so a release that adds or renames one needs no edit here.
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <type_traits>

namespace fp8comm {
namespace compat {

template <typename E, typename = void>
struct HasReduceScatterTensorCoalesced : std::false_type {};
template <typename E>
struct HasReduceScatterTensorCoalesced<E, std::void_t<decltype(E::REDUCE_SCATTER_TENSOR_COALESCED)>>
    : std::true_type {};

// The OpType of reduce_scatter_tensor_coalesced: its own value where torch has
// one, else COALESCED, which older ProcessGroupNCCL reports for it.
template <typename E = c10d::OpType>
constexpr E reduce_scatter_tensor_coalesced_op() {
  if constexpr (HasReduceScatterTensorCoalesced<E>::value) {
    return E::REDUCE_SCATTER_TENSOR_COALESCED;
  } else {
    return E::COALESCED;
  }
}

}  // namespace compat
}  // namespace fp8comm
