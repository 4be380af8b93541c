#pragma once
// Bytes a rank sends, split by where they go: to ranks on its own node and
// to other nodes (stats; DESIGN.md, "Topology").
#include <stdint.h>

namespace fp8comm {

struct NodeBytes {
  int64_t intra_node = 0;
  int64_t inter_node = 0;
};

}  // namespace fp8comm
