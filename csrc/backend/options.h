#pragma once
// Per-process-group options (DESIGN.md, "Options"). Built in Python from
// fp8comm.Options and the FP8COMM_* environment defaults.
#include <stdint.h>

#include "../codec/fp8_block_math.h"

namespace fp8comm {

struct FP8Options {
  int block_size = 32;
  Fp8Format format = Fp8Format::E4M3;
  // Tensors with fewer elements per rank pass through exactly.
  int64_t min_numel = 0;
  bool compress_allreduce = true;
  bool compress_reduce_scatter = true;
  bool compress_allgather = false;
};

}  // namespace fp8comm
