// CUDA causal attention with GQA over a chunked KV cache (ops/attention.h): one CTA per (head, token),
// each warp walks a strided subset of the visible positions with its own online softmax, and the warps'
// partial results are merged at the end. Correct for any head_dim <= kAttnMaxHeadDim.
// Non-obvious choice: the warp-per-position split gives a decode step (one token) n_head CTAs of 8
// warps that each stream 1/8 of the cache; a split over CTAs (flash-decoding) is the next step for long
// contexts, and prefill would tile queries (flash attention) instead of one query per CTA.
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/ops_launch.h"

namespace ds::cuda {
namespace {

constexpr int kAttnWarps = 8;
constexpr int kAttnMaxHeadDim = 512;
constexpr int kPerLane = kAttnMaxHeadDim / 32;

__global__ void __launch_bounds__(32 * kAttnWarps)
attention_kernel(const float* q, const float* const* k_ptrs, const float* const* v_ptrs, int64_t chunk_tokens,
                 float* o, int64_t head_dim, int64_t n_head, int64_t n_head_kv, int64_t pos0, float scale) {
  __shared__ float qs[kAttnMaxHeadDim];
  __shared__ float part_m[kAttnWarps], part_l[kAttnWarps];
  __shared__ float part_o[kAttnWarps][kAttnMaxHeadDim];
  const int64_t h = blockIdx.x, t = blockIdx.y;
  const int64_t g = h / (n_head / n_head_kv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float* qr = q + (t * n_head + h) * head_dim;
  for (int64_t d = threadIdx.x; d < head_dim; d += blockDim.x) qs[d] = qr[d] * scale;
  __syncthreads();

  float m = -INFINITY, l = 0.0f, acc[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) acc[i] = 0.0f;
  const int64_t n_visible = pos0 + t + 1;
  for (int64_t j = warp; j < n_visible; j += kAttnWarps) {
    const int64_t c = j / chunk_tokens, r = j % chunk_tokens;
    const float* kr = k_ptrs[c] + (r * n_head_kv + g) * head_dim;
    const float* vr = v_ptrs[c] + (r * n_head_kv + g) * head_dim;
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < head_dim) s = fmaf(qs[d], kr[d], s);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xFFFFFFFFu, s, off);
    const float m_new = fmaxf(m, s);
    const float corr = __expf(m - m_new), p = __expf(s - m_new);
    l = l * corr + p;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < head_dim) acc[i] = fmaf(p, vr[d], acc[i] * corr);
    }
    m = m_new;
  }
  if (lane == 0) {
    part_m[warp] = m;
    part_l[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int64_t d = lane + 32 * i;
    if (d < head_dim) part_o[warp][d] = acc[i];
  }
  __syncthreads();
  float m_all = -INFINITY;
  for (int w = 0; w < kAttnWarps; ++w) m_all = fmaxf(m_all, part_m[w]);
  float l_all = 0.0f;
  for (int w = 0; w < kAttnWarps; ++w) {
    if (part_l[w] > 0.0f) l_all += part_l[w] * __expf(part_m[w] - m_all);
  }
  float* orow = o + (t * n_head + h) * head_dim;
  for (int64_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < kAttnWarps; ++w) {
      if (part_l[w] > 0.0f) sum += part_o[w][d] * __expf(part_m[w] - m_all);
    }
    orow[d] = sum / l_all;
  }
}

}  // namespace

cudaError_t attention_launch(const float* q, const float* const* k_ptrs, const float* const* v_ptrs,
                             int64_t chunk_tokens, float* o, int64_t head_dim, int64_t n_head, int64_t n_head_kv,
                             int64_t n_tokens, int64_t pos0, float scale, cudaStream_t s) {
  if (head_dim > kAttnMaxHeadDim || n_head_kv <= 0 || n_head % n_head_kv != 0) return cudaErrorInvalidValue;
  constexpr int64_t kMaxGridY = 65535;  // one grid row per query token, in slices
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kMaxGridY) {
    const int64_t nt = n_tokens - t0 < kMaxGridY ? n_tokens - t0 : kMaxGridY;
    const dim3 grid(static_cast<unsigned>(n_head), static_cast<unsigned>(nt));
    const int64_t off = t0 * n_head * head_dim;
    attention_kernel<<<grid, 32 * kAttnWarps, 0, s>>>(q + off, k_ptrs, v_ptrs, chunk_tokens, o + off, head_dim,
                                                      n_head, n_head_kv, pos0 + t0, scale);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace ds::cuda
