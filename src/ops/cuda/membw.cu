// Kernels of the device-limit measurements (ops/cuda/cuda_limits.h): a streaming read of a large
// buffer with 16-byte loads, and a fill of BF16 GEMM operands with hashed pseudo-random values (on
// the device, so the 8192^3 peak measurement needs no 128 MB host-side generation and copy).
// Host side (buffers, events, cuBLAS, Status) is in cuda_limits.cpp.
// Non-obvious choice: the read kernel XORs what it loads and writes only when the result equals a
// constant the data never produces, so the loads cannot be removed but nothing is written back; each
// thread keeps four independent 16-byte loads in flight per iteration to cover the memory latency.
#include <cuda_runtime.h>

#include <cstdint>

namespace ds::cuda::limits_detail {
namespace {

constexpr int kReadUnroll = 4;     // independent 16-byte loads in flight per thread and iteration
constexpr int kReadThreads = 512;  // 4 CTAs of 512 threads fill an sm_90 SM (2048 threads)
constexpr int kFillThreads = 256;
constexpr unsigned kMaxFillBlocks = 4096;

__global__ void read_stream_kernel(const uint4* __restrict__ p, int64_t n, unsigned long long* sink) {
  uint32_t acc = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * kReadUnroll;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x * kReadUnroll + threadIdx.x; base < n;
       base += stride) {
    uint4 v[kReadUnroll];
#pragma unroll
    for (int k = 0; k < kReadUnroll; ++k) {
      const int64_t i = base + static_cast<int64_t>(k) * blockDim.x;
      v[k] = i < n ? __ldg(p + i) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int k = 0; k < kReadUnroll; ++k) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  }
  // The buffer is filled with one repeated byte, so every uint4 XORs to 0 and this never fires.
  if (acc == 0x9E3779B9u) atomicAdd(sink, 1ull);
}

__device__ __forceinline__ uint32_t hash32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// p[i] = BF16 bits of a value uniform in [-1, 1) (truncated from F32).
__global__ void fill_bf16_kernel(uint16_t* p, int64_t n, uint32_t seed) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const uint32_t h = hash32(static_cast<uint32_t>(i) * 0x9E3779B1u ^ static_cast<uint32_t>(i >> 32) ^ seed);
    const float f = static_cast<float>(h >> 8) * (2.0f / 16777216.0f) - 1.0f;
    p[i] = static_cast<uint16_t>(__float_as_uint(f) >> 16);
  }
}

}  // namespace

// n_vec16 16-byte elements at p (16-byte aligned); one wave of CTAs per SM, grid-stride beyond it.
cudaError_t read_stream_launch(const void* p, int64_t n_vec16, unsigned long long* sink, int sm_count,
                               cudaStream_t s) {
  const unsigned blocks = static_cast<unsigned>(sm_count) * 4u;
  read_stream_kernel<<<blocks, kReadThreads, 0, s>>>(static_cast<const uint4*>(p), n_vec16, sink);
  return cudaGetLastError();
}

cudaError_t fill_bf16_random_launch(void* p, int64_t n, uint32_t seed, cudaStream_t s) {
  int64_t blocks = (n + kFillThreads - 1) / kFillThreads;
  if (blocks > kMaxFillBlocks) blocks = kMaxFillBlocks;
  if (blocks < 1) blocks = 1;
  fill_bf16_kernel<<<static_cast<unsigned>(blocks), kFillThreads, 0, s>>>(static_cast<uint16_t*>(p), n, seed);
  return cudaGetLastError();
}

}  // namespace ds::cuda::limits_detail
