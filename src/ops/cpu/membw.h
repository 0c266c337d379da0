// Streaming read bandwidth of main memory: the ceiling for matrix-vector products, whose weights
// are read once per token: for benchmarks, and an input for placing work across devices.
#pragma once

#include <cstdint>

namespace ds::cpu {

// GB/s (1e9 bytes) of a streaming read of a `bytes`-sized buffer (choose far larger than the last
// level cache) split over n_threads threads of a ThreadPool; best of a few runs.
double measure_read_bandwidth_gbps(int n_threads, int64_t bytes);

}  // namespace ds::cpu
