#pragma once
// The one way the CUDA sources launch a kernel, so that the same .cu files
// build with nvcc and, under the host SIMT emulator of the tests
// (tests/support/simt/simt_host.h, which defines FP8C_LAUNCH itself), with a host C++
// compiler:
//
//   FP8C_LAUNCH(grid, block, smem, stream, kernel<T...>)(args...);
//
// The kernel comes last so that its template arguments may hold commas.
#if defined(__CUDACC__)
#define FP8C_LAUNCH(grid, block, smem, stream, ...) __VA_ARGS__<<<(grid), (block), (smem), (stream)>>>
#elif !defined(FP8C_LAUNCH)
#error "FP8C_LAUNCH: expected nvcc, or the host SIMT emulator (tests/support/simt/simt_host.h) included first"
#endif
