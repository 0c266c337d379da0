// norm_kernel's arithmetic (ops_kernels.cu) for the fused kernels that must give the norm's bits:
//  - warp_row_rms_inv: the RMS scale of a row of at most 256 elements held by one warp (norm_kernel with
//    one warp: lane l holds elements l + 32 j, zeros past n; the same fmaf chain and butterfly), for
//    attention_prep (attention.cu) and the DeltaNet output norm (delta_net.cu);
//  - cta_row_sum_squares: the sum of squares of a longer row in shared memory, norm_kernel's CTA of
//    norm_threads(n) threads emulated by a CTA of any size, for the MoE router's input norm (moe_block.cu).
#pragma once

#include <cuda_runtime.h>

namespace ds::cuda::kern {

constexpr int kNormPer = 8;                // elements a thread of norm_kernel holds
constexpr int kWarpRowPer = kNormPer;      // so one warp holds rows of up to 32 * 8, as norm_kernel's one warp

// norm_kernel's CTA for a row of n: a multiple of 32 threads covering n in kNormPer elements each, 32 .. 1024.
__host__ __device__ constexpr int norm_threads(long long n) {
  const long long t = (n + kNormPer - 1) / kNormPer;
  const long long w = (t + 31) / 32 * 32;
  return static_cast<int>(w < 32 ? 32 : w > 1024 ? 1024 : w);
}

// 1 / sqrt(mean(v^2) + eps) over the warp's row of n elements; every lane gets it.
__device__ __forceinline__ float warp_row_rms_inv(const float (&v)[kWarpRowPer], int n, float eps) {
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kWarpRowPer; ++j) ss = fmaf(v[j], v[j], ss);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, o);
  return rsqrtf(ss / static_cast<float>(n) + eps);
}

// The sum of squares of a row of n <= kNormPer * 1024 elements in shared memory, as norm_kernel sums it:
// its thread t (of norm_threads(n)) chains fmaf over elements t + j * norm_threads(n), each warp's 32
// chains go through the butterfly, then the warp sums are added in warp order. Here thread i takes
// norm_kernel's threads i, i + blockDim.x, ... (blockDim.x a multiple of 32, so a warp takes whole warps
// of norm_kernel). part: shared, norm_threads(n) / 32 floats. Every thread of the CTA calls it and gets
// the sum; it starts with a barrier (part may still be read by a previous call) and ends with one.
__device__ inline float cta_row_sum_squares(const float* row, int n, float* part) {
  const int nt = norm_threads(n);
  __syncthreads();
  for (int t0 = threadIdx.x - threadIdx.x % 32; t0 < nt; t0 += blockDim.x) {  // warp-uniform
    const int t = t0 + threadIdx.x % 32;
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kNormPer; ++j) {
      const int i = t + j * nt;
      if (i < n) ss = fmaf(row[i], row[i], ss);  // norm_kernel's zeros past n leave ss as it is
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, o);
    if (threadIdx.x % 32 == 0) part[t0 / 32] = ss;
  }
  __syncthreads();
  float s = 0.0f;
  for (int w = 0; w < nt / 32; ++w) s += part[w];
  __syncthreads();
  return s;
}

}  // namespace ds::cuda::kern
