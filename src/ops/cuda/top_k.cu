// The best logits of a decode step on the device (top_k_launch in ops/cuda/top_k_launch.h): the
// kTopKMax largest of n floats, ordered by value descending and index ascending, so a step whose
// sampling needs no more than its best logits copies about 0.5 KB back instead of the 993 KB row.
// Two kernels:
//   topk_block_max_kernel: the maximum of each block of kTopKBlock values (NaN ignored), one warp a
//     block.
//   topk_select_kernel: one CTA. It sorts the block maxima (bitonic, in shared memory); the k-th
//     largest block maximum tau is at most the k-th largest value (the k best blocks each hold a value
//     at least their maximum), so every value of the top k is >= tau and lies in a block whose maximum
//     is >= tau. It collects those values from those blocks, sorts them and writes the first kTopKMax.
//     More than kTopKMaxCandidates of them (values tied across many blocks) is an overflow: the result
//     says so and the caller copies the whole row instead.
// Each output entry is the same value and index the host's sort gives (the order is total: value, then
// index), whatever order the collecting warps append in.
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "ops/cuda/launch.cuh"
#include "ops/cuda/top_k_launch.h"

namespace ds::cuda {
namespace {

constexpr int kSelectThreads = 1024;

// a before b in the output order: larger value first, then smaller index.
__device__ __forceinline__ bool before(float av, int32_t ai, float bv, int32_t bi) {
  return av > bv || (av == bv && ai < bi);
}

__global__ void __launch_bounds__(256) topk_block_max_kernel(const float* __restrict__ x, int n, float* bmax) {
  kern::dependency_sync();
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int b = static_cast<int>(blockIdx.x) * 8 + warp, nb = (n + kTopKBlock - 1) / kTopKBlock;
  if (b >= nb) return;
  float m = -INFINITY;
  for (int i = b * kTopKBlock + lane; i < min(n, (b + 1) * kTopKBlock); i += 32) m = fmaxf(m, x[i]);  // NaN ignored
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  if (lane == 0) bmax[b] = m;
}

// Sorts v / idx [0, p) (p a power of two) into the output order; every thread of the CTA calls it.
__device__ void bitonic_sort(float* v, int32_t* idx, int p) {
  for (int size = 2; size <= p; size <<= 1) {
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      __syncthreads();
      for (int t = static_cast<int>(threadIdx.x); t < p / 2; t += static_cast<int>(blockDim.x)) {
        const int i = 2 * t - (t & (stride - 1)), j = i + stride;
        const bool up = (i & size) == 0;  // this run in output order, else reversed
        const bool swap = up ? before(v[j], idx[j], v[i], idx[i]) : before(v[i], idx[i], v[j], idx[j]);
        if (swap) {
          const float tv = v[i];
          v[i] = v[j];
          v[j] = tv;
          const int32_t ti = idx[i];
          idx[i] = idx[j];
          idx[j] = ti;
        }
      }
    }
  }
  __syncthreads();
}

__device__ __forceinline__ int pow2_at_least(int n) {
  int p = 1;
  while (p < n) p <<= 1;
  return p;
}

__global__ void __launch_bounds__(kSelectThreads) topk_select_kernel(const float* __restrict__ x, int n,
                                                                    const float* __restrict__ bmax, int k,
                                                                    TopKResult* out) {
  extern __shared__ float4 smem_f4[];
  float* bv = reinterpret_cast<float*>(smem_f4);               // [kTopKMaxBlocks] block maxima
  int32_t* bi = reinterpret_cast<int32_t*>(bv + kTopKMaxBlocks);  // their block indices
  float* cv = reinterpret_cast<float*>(bi + kTopKMaxBlocks);      // [kTopKMaxCandidates] candidates
  int32_t* ci = reinterpret_cast<int32_t*>(cv + kTopKMaxCandidates);
  __shared__ int n_cand;
  kern::dependency_sync();
  const int tid = static_cast<int>(threadIdx.x);
  const int nb = (n + kTopKBlock - 1) / kTopKBlock, pb = pow2_at_least(nb);
  for (int i = tid; i < pb; i += kSelectThreads) {
    bv[i] = i < nb ? bmax[i] : -INFINITY;
    bi[i] = i < nb ? i : INT_MAX;
  }
  if (tid == 0) n_cand = 0;
  bitonic_sort(bv, bi, pb);
  const float tau = k <= nb ? bv[k - 1] : -INFINITY;
  // The blocks whose maximum reaches tau are a prefix of the sorted maxima; a warp takes one at a time.
  const int warp = tid / 32, lane = tid % 32;
  for (int j = warp; j < nb && bv[j] >= tau; j += kSelectThreads / 32) {
    const int b = bi[j];
    for (int i = b * kTopKBlock + lane; i < min(n, (b + 1) * kTopKBlock); i += 32) {
      const float v = x[i];
      if (v >= tau) {  // never NaN
        const int at = atomicAdd(&n_cand, 1);
        if (at < kTopKMaxCandidates) {
          cv[at] = v;
          ci[at] = i;
        }
      }
    }
  }
  __syncthreads();
  const int total = n_cand;
  if (total > kTopKMaxCandidates) {
    if (tid == 0) out->n = -1;
    return;
  }
  const int pc = pow2_at_least(total);
  for (int i = total + tid; i < pc; i += kSelectThreads) {
    cv[i] = -INFINITY;
    ci[i] = INT_MAX;
  }
  bitonic_sort(cv, ci, pc);
  if (tid < kTopKMax) {
    out->values[tid] = tid < total ? cv[tid] : -INFINITY;
    out->ids[tid] = tid < total ? ci[tid] : -1;
  }
  if (tid == 0) out->n = min(total, kTopKMax);
}

constexpr size_t select_smem_bytes() {
  return static_cast<size_t>(kTopKMaxBlocks + kTopKMaxCandidates) * (sizeof(float) + sizeof(int32_t));
}

}  // namespace

bool top_k_fits(int64_t n) { return n >= 1 && n <= static_cast<int64_t>(kTopKMaxBlocks) * kTopKBlock; }

int64_t top_k_scratch_floats(int64_t n) { return (n + kTopKBlock - 1) / kTopKBlock; }

cudaError_t top_k_launch(const float* x, int64_t n, float* scratch, TopKResult* out, cudaStream_t s) {
  if (!top_k_fits(n)) return cudaErrorInvalidValue;
  cudaError_t e = cudaFuncSetAttribute(topk_select_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(select_smem_bytes()));  // per device: every call
  if (e != cudaSuccess) return e;
  const int ni = static_cast<int>(n), nb = static_cast<int>(top_k_scratch_floats(n));
  e = launch_kernel(topk_block_max_kernel, dim3(static_cast<unsigned>((nb + 7) / 8)), dim3(256), 0, s, x,
                                ni, scratch);
  if (e != cudaSuccess) return e;
  return launch_kernel(topk_select_kernel, dim3(1), dim3(kSelectThreads), select_smem_bytes(), s, x, ni,
                       static_cast<const float*>(scratch), kTopKMax, out);
}

}  // namespace ds::cuda
