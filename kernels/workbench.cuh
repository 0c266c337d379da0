// What the kernel workbenches (kernels/*.cu) share: CK, which exits with the failing call, file and line
// on any CUDA error, the flat streaming read that measures the device's read bandwidth, and the median
// timing of launches and of captured graphs.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

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

// f(i) for i < warmups to warm up, then f(i) for i < runs between events on s (i lets a caller rotate
// over copies of its data): the median time in ms.
template <typename F>
float median_event_ms(cudaStream_t s, int runs, F f, int warmups = 1) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < warmups; ++i) f(i);
  CK(cudaGetLastError());
  std::vector<float> ms;
  for (int r = 0; r < runs; ++r) {
    CK(cudaEventRecord(a, s));
    f(r);
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float t = 0;
    CK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CK(cudaGetLastError());
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// One 16-byte load per thread and step, the grid striding over p[0, n): the plain read the matrix
// workbenches compare their products with.
__global__ void read_stream(const uint4* p, int64_t n, unsigned long long* sink) {
  uint32_t acc = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint4 v = __ldg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345679u) atomicAdd(sink, 1ull);  // keeps the loads alive
}

// The device's read bandwidth in GB/s: read_stream over 4 GiB (8 CTAs of 512 per SM), median of 10.
inline double measure_read_gbs() {
  const int64_t bytes = int64_t{4} << 30;
  uint4* p;
  unsigned long long* sink;
  CK(cudaMalloc(&p, bytes));
  CK(cudaMalloc(&sink, 8));
  CK(cudaMemset(p, 0x5A, bytes));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const float ms = median_event_ms(nullptr, 10, [&](int) { read_stream<<<sms * 8, 512>>>(p, bytes / 16, sink); }, 3);
  CK(cudaFree(p));
  CK(cudaFree(sink));
  return bytes / (ms * 1e-3) / 1e9;
}

// body()'s launches on s captured as one graph, replayed as median_event_ms times it: the median replay
// in ms.
inline float graph_median_ms(cudaStream_t s, const std::function<void()>& body, int runs) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  body();
  CK(cudaStreamEndCapture(s, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  const float ms = median_event_ms(s, runs, [&](int) { CK(cudaGraphLaunch(exec, s)); });
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  return ms;
}
