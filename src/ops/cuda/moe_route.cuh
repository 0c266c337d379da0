// MoE top-k routing of one token by one CTA of kRouteBlockThreads threads, shared by moe_route_kernel
// (ops_kernels.cu, the moe_route op) and the fused router of moe_block_decode (moe_block.cu), so both
// route exactly alike. The picks are the k largest logits, in descending order, ties to the lowest
// expert id (the CPU's order), found without serial selection rounds:
//  1. each warp ranks the experts of its segment (n_expert / kRouteBlockWarps of them) against the
//     segment; those of local rank r < k are its candidates, at slot r;
//  2. the candidates (at most kRouteBlockWarps * k) are ranked against each other: an expert of global
//     rank j < k is beaten only by experts of global rank < j, each a candidate of its own segment, so
//     its rank among the candidates is j; a candidate outside the top k is beaten by at least k of them;
//  3. the softmax statistics are reductions in double (as the CPU reference, which is float: the double
//     sums make the order of the additions irrelevant at float precision), and thread j computes pick
//     j's probability and weight.
// Non-obvious choice: one warp routing alone (k rounds of a warp arg-max over all logits) cost 6.3 us a
// MoE layer in the 35B-A3B decode graph; ranks across the CTA need three barriers and no rounds.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>

namespace ds::cuda::kern {

constexpr int kRouteBlockWarps = 4;
constexpr int kRouteBlockThreads = 32 * kRouteBlockWarps;
constexpr int kRouteMaxPicks = 32;  // k <= 32: kRouteBlockWarps * k candidates, one thread each

// An unsigned key whose order is the order of the float values (-0 and +0 equal, as they compare).
// (NaN logits, from NaN activations only, rank by their bits.)
__device__ __forceinline__ unsigned route_order_key(float v) {
  const unsigned u = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (u & 0x80000000u) != 0 ? ~u : u | 0x80000000u;
}

// The value of a key (+0 for either zero).
__device__ __forceinline__ float route_key_value(unsigned key) {
  return __uint_as_float((key & 0x80000000u) != 0 ? key & 0x7FFFFFFFu : ~key);
}

// True if expert (ka, ea) comes before expert (kb, eb): larger logit, ties to the lower id.
__device__ __forceinline__ bool route_before(unsigned ka, int ea, unsigned kb, int eb) {
  return ka > kb || (ka == kb && ea < eb);
}

// Shared memory route_block needs for n_expert experts, in bytes.
constexpr size_t route_block_smem_bytes(int n_expert) {
  return sizeof(double) * (kRouteBlockWarps + static_cast<size_t>(n_expert)) + sizeof(float) * kRouteBlockWarps +
         sizeof(int) * kRouteMaxPicks + 2 * sizeof(unsigned) * kRouteBlockWarps * kRouteMaxPicks +
         sizeof(unsigned) * static_cast<size_t>(n_expert);
}

// Every thread of a CTA of kRouteBlockThreads calls it (CTA-uniform arguments). lg: the token's n_expert
// logits in global memory (read through L2: other CTAs may have just written them). smem: 8-byte aligned,
// route_block_smem_bytes(n_expert). Thread j < k (k <= kRouteMaxPicks, k <= n_expert) gets pick j: the
// expert id pick_e and its weight pick_w = p_j / max(sum of the picked p, floor), p_j the softmax
// probability rounded to float first (as the CPU); other threads get pick_w = 0. Ends with a barrier, so
// the caller may reuse smem at once. kWeights false: the picks only (pick_w = 0 everywhere), without the
// softmax's exps and sums; the same picks.
template <bool kWeights = true>
__device__ inline void route_block(const float* lg, int n_expert, int k, float floor, void* smem, int& pick_e,
                                   float& pick_w) {
  constexpr int W = kRouteBlockWarps;
  auto* wsum = static_cast<double*>(smem);                        // [W] per-warp sums of exp
  double* ex = wsum + W;                                          // [n_expert] exp(l - max)
  auto* wmax = reinterpret_cast<float*>(ex + n_expert);           // [W] per-warp maxima
  auto* pick = reinterpret_cast<int*>(wmax + W);                  // [kRouteMaxPicks] pick j's expert
  auto* cand_key = reinterpret_cast<unsigned*>(pick + kRouteMaxPicks);  // [W * k] warp w's slot r
  auto* cand_id = reinterpret_cast<int*>(cand_key + W * kRouteMaxPicks);
  auto* keys = reinterpret_cast<unsigned*>(cand_id + W * kRouteMaxPicks);  // [n_expert]
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int seg = (n_expert + W - 1) / W, s0 = min(n_expert, warp * seg), s1 = min(n_expert, s0 + seg);

  for (int e = tid; e < n_expert; e += kRouteBlockThreads) keys[e] = route_order_key(__ldcg(lg + e));
  for (int i = tid; i < W * k; i += kRouteBlockThreads) {
    cand_key[i] = 0u;
    cand_id[i] = INT_MAX;  // an empty slot comes before no expert
  }
  __syncthreads();

  // 1. Local ranks within the warp's segment; the segment's maximum.
  // Two experts of a lane at a time (e and e + 32), one pass over the segment for both.
  float mx = -INFINITY;
  for (int e = s0 + lane; e < s1; e += 64) {
    const int e2 = e + 32 < s1 ? e + 32 : -1;
    const unsigned ke = keys[e], ke2 = e2 >= 0 ? keys[e2] : 0u;
    if constexpr (kWeights) {
      mx = fmaxf(mx, route_key_value(ke));
      if (e2 >= 0) mx = fmaxf(mx, route_key_value(ke2));
    }
    int r = 0, r2 = 0;
    for (int i = s0; i < s1; ++i) {
      const unsigned ki = keys[i];
      r += route_before(ki, i, ke, e);
      r2 += route_before(ki, i, ke2, e2);
    }
    if (r < k) {
      cand_key[warp * k + r] = ke;
      cand_id[warp * k + r] = e;
    }
    if (e2 >= 0 && r2 < k) {
      cand_key[warp * k + r2] = ke2;
      cand_id[warp * k + r2] = e2;
    }
  }
  if constexpr (kWeights) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, o));
    if (lane == 0) wmax[warp] = mx;
  }
  __syncthreads();

  // 2. The sum of exp(l - max) over the segment; the candidates' ranks among themselves.
  if constexpr (kWeights) {
    mx = wmax[0];
#pragma unroll
    for (int w = 1; w < W; ++w) mx = fmaxf(mx, wmax[w]);
    double s = 0.0;
    for (int e = s0 + lane; e < s1; e += 32) {
      ex[e] = exp(static_cast<double>(route_key_value(keys[e])) - mx);
      s += ex[e];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xFFFFFFFFu, s, o);
    if (lane == 0) wsum[warp] = s;
  }
  if (tid < W * k && cand_id[tid] != INT_MAX) {
    const unsigned kc = cand_key[tid];
    const int ec = cand_id[tid];
    int r = 0;
    for (int i = 0; i < W * k; ++i) r += route_before(cand_key[i], cand_id[i], kc, ec);
    if (r < k) pick[r] = ec;
  }
  __syncthreads();

  // 3. Thread j: p_j = exp(l_j - max) / sum; the picks' sum in pick order, as the CPU.
  pick_e = 0;
  pick_w = 0.0f;
  if (!kWeights && warp == 0) pick_e = lane < k ? pick[lane] : 0;
  if (kWeights && warp == 0) {
    double sum = wsum[0];
#pragma unroll
    for (int w = 1; w < W; ++w) sum += wsum[w];
    const int e = lane < k ? pick[lane] : 0;
    const double q = lane < k ? ex[e] / sum : 0.0;
    double sel_sum = 0.0;
    for (int j = 0; j < k; ++j) sel_sum += __shfl_sync(0xFFFFFFFFu, q, j);
    const double denom = fmax(sel_sum, static_cast<double>(floor));
    const float p = static_cast<float>(q);  // rounded to float first, as the CPU
    pick_e = e;
    pick_w = lane < k ? static_cast<float>(static_cast<double>(p) / denom) : 0.0f;
  }
  __syncthreads();
}

}  // namespace ds::cuda::kern
