// What the kernel workbenches (kernels/*.cu) share: CK, which exits with the failing call, file and line
// on any CUDA error, and the flat streaming read that measures the device's read bandwidth.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#define CK(call)                                                                                  \
  do {                                                                                            \
    cudaError_t e_ = (call);                                                                      \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

// Reads p[0, n) once with 16-byte loads, 4 independent loads in flight per thread, the grid striding
// over the buffer; XOR-reduces so the loads stay, and writes nothing back (the sink guard never holds
// on real data).
__global__ void flat_read(const uint4* __restrict__ p, int64_t n, unsigned* sink) {
  uint32_t acc = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * 4;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x * 4 + threadIdx.x; base < n; base += stride) {
    uint4 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int64_t i = base + static_cast<int64_t>(k) * blockDim.x;
      v[k] = i < n ? __ldg(p + i) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  }
  if (acc == 0x9E3779B9u) atomicAdd(sink, 1u);
}
