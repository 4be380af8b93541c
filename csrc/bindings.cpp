// fp8comm._C: the Python face of the C++ parts. Importing it also registers the
// torch.library operators (csrc/codec/codec_ops.cpp).
#include <torch/extension.h>

#include "codec/codec.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "fp8comm C++ extension: FP8 block codec and the fp8nccl / fp8gloo backend";
#ifdef FP8COMM_WITH_CUDA
  m.attr("has_cuda") = true;
#else
  m.attr("has_cuda") = false;
#endif
  m.def("segment_bytes", &fp8comm::segment_bytes, py::arg("segment_numel"), py::arg("block_size"),
        "Bytes of one wire segment [scales][codes] holding segment_numel elements.");
}
