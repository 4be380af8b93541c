#include "all_to_all_splits.h"

#include <algorithm>

namespace fp8comm {

std::vector<int64_t> slice_numels(const at::Tensor& t, const std::vector<int64_t>& split_sizes, int64_t P,
                                  const char* op, const char* what) {
  TORCH_CHECK(t.dim() >= 1, "fp8comm ", op, ": the ", what, " must have a dim 0 to split among the ", P,
              " ranks, got a tensor of ", t.dim(), " dims");
  const int64_t rows = t.size(0), row_numel = rows == 0 ? 0 : t.numel() / rows;
  std::vector<int64_t> numels;
  if (split_sizes.empty()) {
    TORCH_CHECK(rows % P == 0, "fp8comm ", op, ": the ", what, "'s dim 0 (", rows, ") does not divide among the ",
                P, " ranks; pass its split sizes");
    numels.assign(P, rows / P * row_numel);
    return numels;
  }
  TORCH_CHECK(static_cast<int64_t>(split_sizes.size()) == P, "fp8comm ", op, ": ", split_sizes.size(), " ", what,
              " split sizes for a group of ", P, " ranks; pass one per rank, or none for equal parts");
  int64_t sum = 0;
  for (int64_t s : split_sizes) {
    TORCH_CHECK(s >= 0, "fp8comm ", op, ": the ", what, " split sizes must be >= 0, got ", s);
    sum += s;
    numels.push_back(s * row_numel);
  }
  TORCH_CHECK(sum == rows, "fp8comm ", op, ": the ", what, " split sizes add up to ", sum, " rows but its dim 0 is ",
              rows);
  return numels;
}

int64_t own_slice_bytes(const at::Tensor& input, const std::vector<int64_t>& split_sizes, int64_t rank, int64_t P) {
  const int64_t bytes = input.numel() * input.element_size();
  if (input.dim() == 0 || split_sizes.empty()) return bytes / P;
  // A list of the wrong length counts nothing here: slice_numels (compressed)
  // or the inner backend (passthrough) refuses it, naming the op.
  if (static_cast<int64_t>(split_sizes.size()) != P) return 0;
  return split_sizes[rank] * (input.size(0) ? bytes / input.size(0) : 0);
}

int64_t SplitTable::total_sent() const {
  int64_t total = 0;
  for (int64_t from = 0; from < P; ++from) {
    for (int64_t to = 0; to < P; ++to) total += sends(from, to);
  }
  return total;
}

SplitTable gather_splits(Transport& t, const std::vector<int64_t>& send_numels,
                         const std::vector<int64_t>& recv_numels, const at::Device& device) {
  const int64_t P = t.size();
  std::vector<int64_t> mine = send_numels;
  mine.insert(mine.end(), recv_numels.begin(), recv_numels.end());
  const auto int64 = at::TensorOptions().dtype(at::kLong);
  const at::Tensor counts = at::tensor(mine, int64).to(device);
  const at::Tensor scratch = at::empty({t.all_gather_scratch_numel(2 * P)}, int64.device(device));
  t.wait(t.start_all_gather_exact(counts, scratch), "split sizes");
  SplitTable table{P, std::vector<int64_t>(P * 2 * P)};
  t.deliver_gathered(
      [&](int64_t r, const at::Tensor& row) {
        const at::Tensor host = row.to(at::kCPU).contiguous();
        std::copy_n(host.data_ptr<int64_t>(), 2 * P, table.rows.begin() + r * 2 * P);
      },
      counts, scratch);
  return table;
}

void check_splits(const SplitTable& table, const char* op) {
  for (int64_t s = 0; s < table.P; ++s) {
    for (int64_t d = 0; d < table.P; ++d) {
      TORCH_CHECK(table.sends(s, d) == table.expects(d, s), "fp8comm ", op, ": rank ", s, " sends ",
                  table.sends(s, d), " elements to rank ", d, " (its input split for rank ", d, "), but rank ", d,
                  " expects ", table.expects(d, s), " from rank ", s, " (its output split for rank ", s,
                  "); every rank's input_split_sizes[d] must give rank d's output_split_sizes[s] (in elements), "
                  "so pass split sizes that agree on every rank");
    }
  }
}

}  // namespace fp8comm
