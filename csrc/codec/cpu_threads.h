#pragma once
// The CPU codec's threads: a pool of its own, sized per process, whose idle
// threads sleep on a condition variable. OpenMP's idle threads spin after
// each parallel region, and a codec pass is followed by the transport's
// socket work on the same cores, so spinning threads would slow the wire
// phase they wait for. The size is the codec's share of the host's cores
// (set by the backend at group creation, DESIGN.md "CPU threads"), not
// OMP_NUM_THREADS or torch's thread count.
#include <stdint.h>

#include <functional>

namespace fp8comm {

// Threads one codec call may use (the caller included), >= 1. Until
// set_cpu_threads is called: FP8COMM_CPU_THREADS when set, else the cores
// this process may run on.
int cpu_threads();
// Sets it (n >= 1) and returns the previous value.
int set_cpu_threads(int n);
// The cores this process may run on (its CPU affinity).
int available_cores();

// Runs fn(begin, end) over [0, total) in contiguous ranges of at least
// `grain` items, on up to cpu_threads() threads; returns when all are done
// and rethrows the first exception any range threw. A call made while
// another thread's call is running runs on the calling thread alone.
void parallel_blocks(int64_t total, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace fp8comm
