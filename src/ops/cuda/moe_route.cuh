// MoE top-k routing of one token by one warp, shared by moe_route_kernel (ops_kernels.cu, the
// moe_route op) and the fused router of moe_block_decode (moe_block.cu), so both route exactly alike.
// Lane j holds experts j, j + 32, ...; the softmax statistics are warp reductions in double (as the
// CPU reference), then k rounds of a warp-wide arg-max whose ties go to the lowest expert id (the CPU's
// first-maximum scan). Taken experts are remembered in a per-lane bit mask; lane j keeps pick j, so the
// picks' probabilities are computed together after the rounds, not one per round.
// Non-obvious choice: compact, rolled loops. One warp of one CTA runs this once per launch, on whichever
// SM finished last, so its code is usually not in that SM's instruction cache: unrolling the scans
// (registers instead of `l`) made the MoE router 5 us slower per layer in the decode graph.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>

namespace ds::cuda::kern {

constexpr int kRouteMaxExpertsPerLane = 64;  // the taken mask's bits: n_expert <= 2048
constexpr int kRouteMaxPicks = 32;           // k <= 32: lane j keeps pick j

// An unsigned key whose order is the order of the float values (-0 and +0 equal, as they compare);
// nonzero for every non-NaN value. (NaN logits, from NaN activations only, may rank differently.)
__device__ __forceinline__ unsigned route_order_key(float v) {
  const unsigned u = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (u & 0x80000000u) != 0 ? ~u : u | 0x80000000u;
}

// Every lane of a warp calls it. l: the token's n_expert logits (memory every lane reads). Lane j < k
// (k <= kRouteMaxPicks) gets pick j: the expert id pick_e and its weight pick_w = p_j / max(sum of the
// picked p, floor), p_j the softmax probability rounded to float first (as the CPU); the other lanes
// get pick_w = 0. The caller stores what it needs from the picking lanes.
__device__ inline void route_warp(const float* l, int n_expert, int k, float floor, int& pick_e, float& pick_w) {
  const int lane = threadIdx.x % 32;
  double mx = -INFINITY;
  for (int e = lane; e < n_expert; e += 32) mx = fmax(mx, static_cast<double>(l[e]));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmax(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, o));
  double sum = 0.0;
  for (int e = lane; e < n_expert; e += 32) sum += exp(static_cast<double>(l[e]) - mx);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
  uint64_t taken = 0;  // bit i: expert lane + 32 i is selected
  int my_e = 0;        // lane j: pick j
  float my_v = 0.0f;
  for (int j = 0; j < k; ++j) {
    float best_v = -INFINITY;
    int best_e = INT_MAX;
    int i = 0;
    for (int e = lane; e < n_expert; e += 32, ++i) {
      if ((taken >> i) & 1u) continue;
      const float v = l[e];
      if (best_e == INT_MAX || v > best_v) {  // ascending e per lane: strict > keeps the lowest id
        best_v = v;
        best_e = e;
      }
    }
    // Warp arg-max, ties to the lower id: the largest order key, then the lowest id holding it.
    const unsigned key = best_e == INT_MAX ? 0u : route_order_key(best_v);
    const unsigned top = __reduce_max_sync(0xFFFFFFFFu, key);
    best_e = static_cast<int>(__reduce_min_sync(0xFFFFFFFFu, key == top ? static_cast<unsigned>(best_e) : UINT_MAX));
    if (best_e % 32 == lane) taken |= uint64_t{1} << (best_e / 32);
    if (lane == j) my_e = best_e;
  }
  if (lane < k) my_v = l[my_e];
  // p_j = exp(l_j - mx) / sum in lane j; their sum in pick order, as the CPU.
  const double q = lane < k ? exp(static_cast<double>(my_v) - mx) / sum : 0.0;
  double sel_sum = 0.0;
  for (int j = 0; j < k; ++j) sel_sum += __shfl_sync(0xFFFFFFFFu, q, j);
  const double denom = fmax(sel_sum, static_cast<double>(floor));
  pick_e = my_e;
  const float p = static_cast<float>(q);  // rounded to float first, as the CPU
  pick_w = lane < k ? static_cast<float>(static_cast<double>(p) / denom) : 0.0f;
}

}  // namespace ds::cuda::kern
