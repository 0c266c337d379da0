// MoE top-k routing of one token by one warp, shared by moe_route_kernel (ops_kernels.cu, the
// moe_route op) and the fused router of moe_block_decode (moe_block.cu), so both route exactly alike.
// Lane j holds experts j, j + 32, ... in registers, each as a 64-bit key (the logit's order key, then
// the complement of the expert id); the softmax statistics are warp reductions in double (as the CPU
// reference). Each of the k selection rounds is a per-lane max over the lane's keys and two warp
// reductions (the largest logit, then the lowest expert id holding it: the CPU's first-maximum scan);
// the winner's key is cleared. Lane j keeps the j-th pick, so the probabilities of the k picks are
// computed together after the rounds.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

namespace ds::cuda::kern {

constexpr int kRouteMaxExpertsPerLane = 64;  // n_expert <= 32 * 64 = 2048
constexpr int kRouteMaxPicks = 32;           // k <= 32: lane j holds pick j

// An unsigned key whose order is the order of the float values (-0 and +0 equal, as they compare);
// nonzero for every non-NaN value. (NaN logits, from NaN activations only, may rank differently.)
__device__ __forceinline__ unsigned route_order_key(float v) {
  const unsigned u = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (u & 0x80000000u) != 0 ? ~u : u | 0x80000000u;
}

// The value of a route_order_key (+0 for either zero).
__device__ __forceinline__ float route_key_value(unsigned key) {
  return __uint_as_float((key & 0x80000000u) != 0 ? key & 0x7FFFFFFFu : ~key);
}

// route_warp with at most kPerLane experts per lane (n_expert <= 32 * kPerLane).
template <int kPerLane>
__device__ void route_warp_keys(const float* l, int n_expert, int k, float floor, int32_t* ids, float* w) {
  const int lane = threadIdx.x % 32;
  uint64_t key[kPerLane];  // 0: no expert (past n_expert, or already picked)
  float mxf = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    const float v = e < n_expert ? __ldcg(l + e) : -INFINITY;  // L2: possibly written by other CTAs
    key[i] = e < n_expert ? uint64_t{route_order_key(v)} << 32 | ~static_cast<uint32_t>(e) : 0;
    mxf = fmaxf(mxf, v);
  }
  double mx = mxf;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmax(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, o));
  double sum = 0.0;  // ascending e per lane (the exps are independent, the adds in order)
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    if (key[i] != 0) sum += exp(static_cast<double>(route_key_value(static_cast<unsigned>(key[i] >> 32))) - mx);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);

  int my_e = 0;
  float my_v = 0.0f;
  for (int j = 0; j < k; ++j) {
    uint64_t best = 0;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) best = key[i] > best ? key[i] : best;
    const unsigned hi = static_cast<unsigned>(best >> 32);
    const unsigned top_hi = __reduce_max_sync(0xFFFFFFFFu, hi);
    const unsigned top_lo = __reduce_max_sync(0xFFFFFFFFu, hi == top_hi ? static_cast<unsigned>(best) : 0u);
    const uint64_t top = uint64_t{top_hi} << 32 | top_lo;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) key[i] = key[i] == top ? 0 : key[i];
    if (lane == j) {
      my_e = static_cast<int>(~top_lo);
      my_v = route_key_value(top_hi);
    }
  }
  // Pick j's probability in lane j; their sum in pick order, as the CPU.
  const double q = lane < k ? exp(static_cast<double>(my_v) - mx) / sum : 0.0;
  double sel_sum = 0.0;
  for (int j = 0; j < k; ++j) sel_sum += __shfl_sync(0xFFFFFFFFu, q, j);
  const double denom = fmax(sel_sum, static_cast<double>(floor));
  if (lane < k) {
    ids[lane] = my_e;
    const float p = static_cast<float>(q);  // rounded to float first, as the CPU
    w[lane] = static_cast<float>(static_cast<double>(p) / denom);
  }
  __syncwarp();
}

// Every lane of a warp calls it. l: the token's n_expert logits (n_expert <= 32 * kRouteMaxExpertsPerLane,
// read through L2); writes the k (<= kRouteMaxPicks) picked expert ids (ids[j]) and their weights
// w[j] = p_j / max(sum of the picked p, floor), p_j the softmax probability rounded to float first (as
// the CPU). ids and w are visible to the whole warp on return.
__device__ inline void route_warp(const float* l, int n_expert, int k, float floor, int32_t* ids, float* w) {
  if (n_expert <= 32 * 8) {
    route_warp_keys<8>(l, n_expert, k, floor, ids, w);
  } else {
    route_warp_keys<kRouteMaxExpertsPerLane>(l, n_expert, k, floor, ids, w);
  }
}

}  // namespace ds::cuda::kern
