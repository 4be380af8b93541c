#pragma once
// The split sizes of an all_to_all (DESIGN.md, "Algorithms", all_to_all):
// c10d's rules for one rank's split lists, and the check, made on every rank
// before any data moves, that what each rank sends each peer is what that
// peer expects (plain torch hangs or corrupts where they differ).
#include <ATen/ATen.h>

#include <vector>

#include "transport.h"

namespace fp8comm {

// The elements of `t` for each of the P ranks, by c10d's rule for
// `split_sizes` (rows of dim 0): empty, dim 0 in P equal parts; else P sizes
// >= 0 that add up to dim 0. Raises naming `op` and `what` (e.g. "input")
// otherwise.
std::vector<int64_t> slice_numels(const at::Tensor& t, const std::vector<int64_t>& split_sizes, int64_t P,
                                  const char* op, const char* what);

// The bytes of this rank's own slice of `input` (slice `rank` of P, by
// c10d's rule for `split_sizes` as above; a tensor without dims: 1 / P of
// it), which an all_to_all keeps here.
int64_t own_slice_bytes(const at::Tensor& input, const std::vector<int64_t>& split_sizes, int64_t rank, int64_t P);

// Every rank's counts: row r holds the elements rank r sends to each rank,
// then those it receives from each.
struct SplitTable {
  int64_t P = 0;
  std::vector<int64_t> rows;  // P x 2P

  int64_t sends(int64_t from, int64_t to) const { return rows[from * 2 * P + to]; }
  int64_t expects(int64_t at, int64_t from) const { return rows[at * 2 * P + P + from]; }
  // Every rank's input elements together.
  int64_t total_sent() const;
};

// Gathers every rank's counts through `t` (one exact all_gather of P x 2P
// int64s, on `device`: read back on the host, which waits for it there).
SplitTable gather_splits(Transport& t, const std::vector<int64_t>& send_numels,
                         const std::vector<int64_t>& recv_numels, const at::Device& device);

// Raises, the same error on every rank that holds the same table, at the
// first pair (in rank order) where rank s sends rank d another count than d
// expects from s, naming `op`, both ranks and both counts.
void check_splits(const SplitTable& table, const char* op);

}  // namespace fp8comm
