// Kernels of moe_block_decode (launchers in moe_launch.h):
//  - moe_route_fused: one warp per router row (F32) and one for the shared-expert gate row computes the
//    logits of every token; each CTA also quantizes a share of x into int8 blocks (the quantize_q8
//    format and arithmetic of matvec_q8.cuh, bit for bit); the CTA that finishes last then routes every
//    token with kern::route_block (as moe_route_kernel in ops_kernels.cu) and writes the weight selectors
//    of the gathered gate/up and down launches and the combine coefficients. With the input norm, every
//    CTA first computes x = RMSNorm(res + delta) itself into shared memory (norm_kernel's bits, through
//    norm_warp.cuh), so the block needs no norm launch before it; the routing CTA writes res += delta.
//    With route = false the kernel stops after the logits: moe_gate_up_routed routes in its CTAs.
//  - moe_gate_up_routed: the gathered gate/up products with the routing in every CTA (kern::route_block
//    on the token's logits, the picks only except in the CTA that writes the pair's routing).
//  - moe_block_combine: y = sum of the routed experts' weighted down rows + sigmoid-gated shared row.
//  - moe_down_combine: the down products of a token's pairs and that sum in one kernel (rows of at most
//    1024 elements: the 35B-A3B's 512), so the pairs' rows never go to memory.
// Non-obvious choice: "last CTA routes" (each CTA fences its writes, then takes a ticket with
// atomicInc, which wraps the counter back to 0 for the next launch) instead of a second launch: the
// routing costs the same in either place, and a second launch adds a kernel boundary to the chain.
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "ops/cuda/activation.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/matvec_q8.cuh"
#include "ops/cuda/moe_launch.h"
#include "ops/cuda/moe_route.cuh"
#include "ops/cuda/norm_warp.cuh"

namespace ds::cuda {
namespace {

static_assert(kMoeBlockMaxK <= kern::kRouteMaxPicks, "route_block keeps pick j in thread j");

constexpr int kRouteWarps = kern::kRouteBlockWarps;  // the CTA that routes is route_block's CTA
constexpr int kRouteThreads = kern::kRouteBlockThreads;
constexpr int kRouteTokenGroup = 8;  // accumulators per lane in the router dot products
constexpr int kRouteUnroll = 8;      // float4 loads of a router row in flight per lane
constexpr size_t kRouteNormSmem = 47 * 1024;  // dynamic shared memory: 48 KB without the opt-in, less the static

// x's loads: from shared memory where the CTA staged x (the input norm), else through the read-only path.
template <bool kShared>
__device__ __forceinline__ float4 load_x4(const float* p) {
  if constexpr (kShared) {
    return *reinterpret_cast<const float4*>(p);
  } else {
    return __ldg(reinterpret_cast<const float4*>(p));
  }
}
template <bool kShared>
__device__ __forceinline__ float load_x(const float* p) {
  if constexpr (kShared) {
    return *p;
  } else {
    return __ldg(p);
  }
}

// Blocks of 32 elements of x ([n_tokens, n_embd], global or shared), 8 lanes each, grid-strided over the
// warps of the grid (warp-uniform loop: the shuffles need every lane). The block arithmetic is
// kern::quantize_block_q8, as in kern::quantize_q8.
template <bool kShared>
__device__ void quantize_x(const MoeRouteFusedLaunch& a, const float* x, bool vec4) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t blocks_per_row = a.n_embd / kern::kQ8Block;
  const int64_t n_blocks = a.n_tokens * blocks_per_row;
  auto* q = static_cast<int8_t*>(a.xq);
  auto* ds = reinterpret_cast<float2*>(static_cast<uint8_t*>(a.xq) + kern::q8_ds_offset(a.n_embd, a.n_tokens));
  const int64_t step = static_cast<int64_t>(gridDim.x) * kRouteWarps * 4;
  for (int64_t first = (static_cast<int64_t>(blockIdx.x) * kRouteWarps + warp) * 4; first < n_blocks; first += step) {
    const int64_t blk = first + lane / 8;
    const int sub = lane % 8;
    const bool live = blk < n_blocks;
    const int64_t row = live ? blk / blocks_per_row : 0, b = live ? blk % blocks_per_row : 0;
    const int64_t e0 = b * kern::kQ8Block + 4 * sub;
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (live) {
      const float* xr = x + row * a.n_embd + e0;
      if (vec4) {
        const float4 f = load_x4<kShared>(xr);
        v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = load_x<kShared>(xr + i);
      }
    }
    int qi[4];
    float d;
    int sum;
    kern::quantize_block_q8(v, qi, d, sum);
    if (!live) continue;
    *reinterpret_cast<char4*>(q + row * a.n_embd + e0) =
        make_char4(static_cast<signed char>(qi[0]), static_cast<signed char>(qi[1]), static_cast<signed char>(qi[2]),
                   static_cast<signed char>(qi[3]));
    if (sub == 0) ds[row * blocks_per_row + b] = make_float2(d, d * static_cast<float>(sum));
  }
}

// Row `row` (< n_expert: router row; == n_expert: shexp_gate) times every token of x; lane 0 writes.
template <bool kShared>
__device__ void router_row(const MoeRouteFusedLaunch& a, const float* x, int row, bool vec4) {
  const int lane = threadIdx.x % 32;
  const float* w = row < a.n_expert ? a.router + static_cast<int64_t>(row) * a.router_stride : a.shexp_gate;
  for (int t0 = 0; t0 < a.n_tokens; t0 += kRouteTokenGroup) {
    float acc[kRouteTokenGroup];
#pragma unroll
    for (int t = 0; t < kRouteTokenGroup; ++t) acc[t] = 0.0f;
    if (vec4) {  // kRouteUnroll float4 of the row in flight per lane, then the tokens' products
      for (int64_t base = 4 * lane; base < a.n_embd; base += 128 * kRouteUnroll) {
        float4 wv[kRouteUnroll];
#pragma unroll
        for (int u = 0; u < kRouteUnroll; ++u) {
          const int64_t i = base + 128 * u;
          wv[u] = i < a.n_embd ? __ldg(reinterpret_cast<const float4*>(w + i)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int t = 0; t < kRouteTokenGroup; ++t) {
          if (t0 + t >= a.n_tokens) break;
          const float* xt = x + (t0 + t) * a.n_embd;
#pragma unroll
          for (int u = 0; u < kRouteUnroll; ++u) {
            const int64_t i = base + 128 * u;
            if (i < a.n_embd) {
              const float4 xv = load_x4<kShared>(xt + i);
              acc[t] = fmaf(wv[u].x, xv.x, fmaf(wv[u].y, xv.y, fmaf(wv[u].z, xv.z, fmaf(wv[u].w, xv.w, acc[t]))));
            }
          }
        }
      }
    } else {
      for (int64_t i = lane; i < a.n_embd; i += 32) {
        const float wv = __ldg(w + i);
#pragma unroll
        for (int t = 0; t < kRouteTokenGroup; ++t) {
          if (t0 + t < a.n_tokens) acc[t] = fmaf(wv, load_x<kShared>(x + (t0 + t) * a.n_embd + i), acc[t]);
        }
      }
    }
#pragma unroll
    for (int t = 0; t < kRouteTokenGroup; ++t) {
      const float s = kern::warp_sum(acc[t]);
      if (lane == 0 && t0 + t < a.n_tokens) {
        if (row < a.n_expert) {
          a.logits[static_cast<int64_t>(t0 + t) * a.n_expert + row] = s;
        } else {
          a.shexp_logit[t0 + t] = s;
        }
      }
    }
  }
}

// The input norm: xs[t] = RMSNorm(res[t] + delta[t]; norm_w, eps) for every token, with norm_kernel's
// arithmetic (the element sum, kern::cta_row_sum_squares, (v * inv) * w), so xs has add_rms_norm's bits.
// Every thread of the CTA calls it; xs: n_tokens * n_embd floats of shared memory, part: the sums' scratch.
__device__ void stage_norm_input(const MoeRouteFusedLaunch& a, float* xs, float* part) {
  const int64_t n4 = a.n_tokens * a.n_embd / 4;  // n_embd is a multiple of 32
  const auto* r4 = reinterpret_cast<const float4*>(a.res);
  const auto* d4 = reinterpret_cast<const float4*>(a.delta);
  auto* x4 = reinterpret_cast<float4*>(xs);
  constexpr int kInFlight = 4;  // float4 pairs a thread loads before its first store
  for (int64_t i0 = threadIdx.x; i0 < n4; i0 += kInFlight * kRouteThreads) {
    float4 r[kInFlight], d[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int64_t i = i0 + u * kRouteThreads;
      if (i < n4) r[u] = __ldcg(r4 + i), d[u] = __ldcg(d4 + i);
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int64_t i = i0 + u * kRouteThreads;
      if (i < n4) x4[i] = make_float4(r[u].x + d[u].x, r[u].y + d[u].y, r[u].z + d[u].z, r[u].w + d[u].w);
    }
  }
  const int n = static_cast<int>(a.n_embd);
  for (int t = 0; t < a.n_tokens; ++t) {
    float* row = xs + static_cast<int64_t>(t) * n;
    const float inv = rsqrtf(kern::cta_row_sum_squares(row, n, part) / static_cast<float>(n) + a.eps);
    for (int i = threadIdx.x; i < n; i += kRouteThreads) row[i] = row[i] * inv * __ldg(a.norm_w + i);
  }
  __syncthreads();
}

// The residual add of the input norm, by the CTA that routes (every CTA has read res by then).
__device__ void write_residual(const MoeRouteFusedLaunch& a) {
  const int64_t n4 = a.n_tokens * a.n_embd / 4;
  auto* r4 = reinterpret_cast<float4*>(a.res);
  const auto* d4 = reinterpret_cast<const float4*>(a.delta);
  for (int64_t i = threadIdx.x; i < n4; i += kRouteThreads) {
    const float4 r = __ldcg(r4 + i), d = __ldcg(d4 + i);
    r4[i] = make_float4(r.x + d.x, r.y + d.y, r.z + d.z, r.w + d.w);
  }
}

// The selector of expert e's rows of projection w: the launch's weight base + selector * kMoeSelUnit.
__device__ __forceinline__ int32_t sel_of(const MoeWeightSel& w, int32_t e) {
  return static_cast<int32_t>(w.base_units + static_cast<int64_t>(e) * w.expert_units);
}

__device__ __forceinline__ void write_sel(int32_t* const* sel, int64_t slot, const MoeWeightSel& w, int32_t e) {
  const int32_t v = sel_of(w, e);
  sel[0][slot] = w.group == 0 ? v : -1;
  if (sel[1] != nullptr) sel[1][slot] = w.group == 1 ? v : -1;
}

// What the block's later kernels read of routed pair j < k of token t (expert e, weight w): ids, weights,
// coef and the down selectors; kGateUp: the gate/up selectors too (where the router kernel routes).
template <bool kGateUp>
__device__ void write_pick(const MoeRouteFusedLaunch& a, int t, int j, int32_t e, float w) {
  const int64_t s = static_cast<int64_t>(t) * a.k + j, pair = static_cast<int64_t>(t) * (a.k + 1) + j;
  a.ids[s] = e;
  a.weights[s] = w;
  a.coef[pair] = w;
  if constexpr (kGateUp) {
    write_sel(a.sel_gu, 2 * pair, a.gate, e);
    write_sel(a.sel_gu, 2 * pair + 1, a.up, e);
  }
  write_sel(a.sel_down, pair, a.down, e);
}

// The same of token t's shared pair, from its gate logit g.
template <bool kGateUp>
__device__ void write_shared_pair(const MoeRouteFusedLaunch& a, int t, float g) {
  const int64_t pair = static_cast<int64_t>(t) * (a.k + 1) + a.k;
  a.coef[pair] = kern::sigmoidf(g);  // as mul_sigmoid on CUDA
  if constexpr (kGateUp) {
    write_sel(a.sel_gu, 2 * pair, a.shexp_gate_w, 0);
    write_sel(a.sel_gu, 2 * pair + 1, a.shexp_up_w, 0);
  }
  write_sel(a.sel_down, pair, a.shexp_down_w, 0);
}

// Routing of token t by the CTA (kern::route_block), then the ids, weights, selectors and combine
// coefficients of its pairs, stored by the threads route_block leaves the picks in (no read back of what
// was just written: one memory round trip less on the critical path).
__device__ void route_token(const MoeRouteFusedLaunch& a, int t, void* smem) {
  const float g = threadIdx.x == 0 ? __ldcg(a.shexp_logit + t) : 0.0f;  // in flight with the logits
  int pick_e;
  float pick_w;
  kern::route_block(a.logits + static_cast<int64_t>(t) * a.n_expert, a.n_expert, a.k, a.floor, smem, pick_e, pick_w);
  if (static_cast<int>(threadIdx.x) < a.k) write_pick<true>(a, t, static_cast<int>(threadIdx.x), pick_e, pick_w);
  if (threadIdx.x == 0) write_shared_pair<true>(a, t, g);
}

// The dynamic shared memory: the last CTA's routing (kern::route_block_smem_bytes), then with the input
// norm the staged x of every token.
__host__ __device__ constexpr size_t route_xs_offset(int n_expert) {
  return (kern::route_block_smem_bytes(n_expert) + 15) / 16 * 16;
}
size_t route_fused_smem(int n_expert, int64_t n_embd, int n_tokens, bool norm) {
  return route_xs_offset(n_expert) + (norm ? sizeof(float) * static_cast<size_t>(n_embd) * n_tokens : 0);
}

// kNorm: x is the input norm of res and delta (MoeRouteFusedLaunch), staged by every CTA in shared memory.
// kRoute: the last CTA routes (else the kernel ends with the logits).
template <bool kNorm, bool kRoute = true>
__global__ void __launch_bounds__(kRouteThreads) moe_route_fused(MoeRouteFusedLaunch a, bool vec4) {
  extern __shared__ __align__(16) double route_smem[];
  __shared__ unsigned int is_last;
  __shared__ float norm_part[1024 / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = blockIdx.x * kRouteWarps + warp;
  // While the previous kernel drains (launch.cuh), pull this warp's router row (and the first CTA the
  // norm weight) into L2: weights are no kernel's output.
  if (row <= a.n_expert) {
    const float* w = row < a.n_expert ? a.router + static_cast<int64_t>(row) * a.router_stride : a.shexp_gate;
    for (int64_t i = 32 * static_cast<int64_t>(lane); i < a.n_embd; i += 32 * 32) {  // one 128-byte line a lane
      asm volatile("prefetch.global.L2 [%0];" ::"l"(w + i));
    }
  }
  if (kNorm && blockIdx.x == 0) {
    for (int64_t i = 32 * static_cast<int64_t>(threadIdx.x); i < a.n_embd; i += 32 * kRouteThreads) {
      asm volatile("prefetch.global.L2 [%0];" ::"l"(a.norm_w + i));
    }
  }
  kern::dependency_sync();

  const float* x = a.x;
  if constexpr (kNorm) {
    float* xs = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(route_smem) + route_xs_offset(a.n_expert));
    stage_norm_input(a, xs, norm_part);
    x = xs;
  }
  kern::timeline_mark(0);  // the input norm staged
  quantize_x<kNorm>(a, x, vec4);
  kern::timeline_mark(1);  // this CTA's share of x quantized
  if (row <= a.n_expert) router_row<kNorm>(a, x, row, vec4);
  kern::timeline_mark(2);  // its router rows
  if constexpr (!kRoute) return;

  // Publish this CTA's logits and codes, then take a ticket; the last ticket routes.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicInc(a.counter, gridDim.x - 1) == gridDim.x - 1 ? 1u : 0u;
  __syncthreads();
  if (is_last == 0) return;
  __threadfence();
  for (int t = 0; t < a.n_tokens; ++t) route_token(a, t, route_smem);
  if constexpr (kNorm) write_residual(a);
}

// One thread per output element; the routed pairs in routing order, then the shared expert.
__global__ void moe_block_combine(const float* d, const float* coef, int64_t n_tokens, int64_t k, int64_t n_embd,
                                  float* y) {
  kern::dependency_sync();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_tokens * n_embd) return;
  const int64_t t = i / n_embd, c = i % n_embd, P = k + 1;
  const float* dt = d + t * P * n_embd + c;
  const float* ct = coef + t * P;
  float acc = 0.0f;
  for (int64_t j = 0; j < k; ++j) acc += ct[j] * dt[j * n_embd];
  y[i] = acc + ct[k] * dt[k * n_embd];
}

// Pairs per CTA of moe_down_combine (one warp each).
constexpr int kDownCombineMaxPairs = 16;

// Shared memory of moe_down_combine's rings: one step of kQ8Rows rows per pair.
template <DType T>
constexpr int down_combine_ring_bytes(int pairs) {
  return pairs * kern::kQ8Rows * kern::Q8Smem<T, kern::kQ8Rows>::kRowBytes;
}

// Rows [r0, r0 + kQ8Rows) of token blockIdx.y: warp j takes pair j's one-step product exactly as
// matvec_q8 takes a row group of k <= 1024 (one chunk, its copy and the dot), the sums go through shared
// memory, and the combine's arithmetic (moe_block_combine, same order) gives y. Everything but h is read
// before the dependency wait: the selectors and coefficients (so the weight copies are in flight while
// the SwiGLU launch before this one runs) and the residual's two rows, all written two or more kernels
// back (launch.cuh: when a kernel starts, every kernel before the previous one has completed); only h
// is read after it.
template <DType T>
__global__ void __launch_bounds__(32 * kDownCombineMaxPairs) moe_down_combine(MoeDownCombineLaunch a) {
  constexpr int kRows = kern::kQ8Rows;
  using S = kern::Q8Smem<T, kRows>;
  extern __shared__ __align__(16) uint8_t ring_raw[];
  __shared__ float part[kDownCombineMaxPairs][kRows];
  __shared__ float coef_s[kDownCombineMaxPairs];
  auto* ring = reinterpret_cast<uint8_t(*)[kRows][S::kRowBytes]>(ring_raw);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, P = a.k + 1, t = blockIdx.y, r = threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kRows, pair = static_cast<int64_t>(t) * P + warp;
  const bool out_thread = r < kRows && r0 + r < a.n_embd;
  const int64_t i = static_cast<int64_t>(t) * a.n_embd + r0 + r;  // out_thread's element
  float res_v = 0.0f, delta_v = 0.0f;
  if (out_thread && a.res != nullptr) {
    res_v = __ldcg(a.res + i);
    delta_v = __ldcg(a.delta + i);
  }
  if (r < P) coef_s[r] = __ldcg(a.coef + static_cast<int64_t>(t) * P + r);
  const int32_t sel = __ldcg(a.sel + pair);
  kern::MatvecQ8Args m{};
  m.w_stride = a.w_stride;
  m.k = a.n_ff;
  m.n_rows = a.n_embd;
  m.n_tokens = 1;
  const uintptr_t w_base = reinterpret_cast<uintptr_t>(a.w) + static_cast<uintptr_t>(sel) * kMoeSelUnit;
  if (sel >= 0) {
    kern::q8_issue_chunk<T, kRows>(ring[warp], w_base, kern::q8_weights_end<T>(w_base, m), m, r0, 0, lane);
    kern::cp_async_commit();
  }
  kern::dependency_wait();  // h is the previous kernel's output
  kern::allow_dependents();
  float acc[kRows][1];
#pragma unroll
  for (int q = 0; q < kRows; ++q) acc[q][0] = 0.0f;
  if (sel >= 0) {
    const auto* hq = static_cast<const uint8_t*>(a.hq);
    const int8_t* xq = reinterpret_cast<const int8_t*>(hq) + pair * a.n_ff;
    const float2* xds = reinterpret_cast<const float2*>(hq + kern::q8_ds_offset(a.n_ff, static_cast<int64_t>(a.n_tokens) * P)) +
                        pair * (a.n_ff / kern::kQ8Block);
    kern::cp_async_wait<0>();
    __syncwarp();
    kern::timeline_mark(0);  // warp 0's weights have landed
    kern::q8_chunk_dot<T, 1, kRows>(ring[warp], w_base, m, xq, xds, r0, 0, lane, acc);
  }
#pragma unroll
  for (int q = 0; q < kRows; ++q) {
    const float s = kern::warp_sum(acc[q][0]);
    if (lane == 0) part[warp][q] = s;
  }
  __syncthreads();  // part and coef_s
  kern::timeline_mark(1);  // every pair's sums
  if (out_thread) {
    float y = 0.0f;
    for (int j = 0; j < a.k; ++j) y += coef_s[j] * part[j][r];
    if (a.res != nullptr) a.res[i] = res_v + delta_v;  // y may be delta: its value was read before
    a.y[i] = y + coef_s[a.k] * part[a.k][r];
  }
}

// The gathered gate/up products of moe_block_decode, routing in every CTA (moe_gate_up_routed_launch):
// slot 2 pair (+ 1) is the gate (up) of pair j of token t. A routed pair's CTA ranks the token's logits
// with route_block's CTA (its shared memory in the product's ring, free until the first copy) and takes
// pick j; the shared expert's needs no routing. The first CTA of a pair's gate slot writes what the
// router kernel's last CTA writes for the pair but the gate/up selectors (write_pick, write_shared_pair),
// the only CTA of the pair that computes the weights. Then the slot's product exactly as the
// gathered matvec_q8<T, 1> runs it (matvec_q8_cta with the expert id given).
template <DType T>
__global__ void __launch_bounds__(kern::kQ8Threads) moe_gate_up_routed(kern::MatvecQ8Args a, MoeRouteFusedLaunch r) {
  constexpr int kStages = kern::Q8Smem<T, kern::kQ8Rows>::kStages;
  static_assert(kern::kQ8Threads == kern::kRouteBlockThreads, "the product's CTA routes as route_block's");
  __shared__ __align__(16) kern::Q8Ring<T, kern::kQ8Rows, kStages, kern::kQ8Warps> ring;
  __shared__ int32_t sel_s;
  kern::dependency_wait();  // the logits are the router kernel's output
  const int slot = static_cast<int>(blockIdx.y), P = r.k + 1, pair = slot / 2, t = pair / P, j = pair - t * P;
  const bool is_up = (slot & 1) != 0;
  const bool writer = blockIdx.x == 0 && !is_up;
  int32_t sel;
  if (j == r.k) {
    sel = sel_of(is_up ? r.shexp_up_w : r.shexp_gate_w, 0);
    if (writer && threadIdx.x == 0) write_shared_pair<false>(r, t, __ldcg(r.shexp_logit + t));
  } else {
    int pick_e;
    float pick_w;
    const float* lg = r.logits + static_cast<int64_t>(t) * r.n_expert;
    if (writer) {
      kern::route_block<true>(lg, r.n_expert, r.k, r.floor, &ring, pick_e, pick_w);
    } else {
      kern::route_block<false>(lg, r.n_expert, r.k, r.floor, &ring, pick_e, pick_w);
    }
    if (static_cast<int>(threadIdx.x) == j) {
      sel_s = sel_of(is_up ? r.up : r.gate, pick_e);
      if (writer) write_pick<false>(r, t, j, pick_e, pick_w);
    }
    __syncthreads();
    sel = sel_s;
  }
  kern::timeline_mark(0);  // routed
  kern::matvec_q8_cta<T, 1, kern::kQ8Rows, kStages, kern::kQ8Warps, true>(a, blockIdx.x, &ring[0][0][0][0], sel);
}

// Under a diagnostic kernel filter (set_kernel_filter) that drops these products, every pair becomes "no
// expert" for the down products and its coefficient 0, as for a filtered router, so nothing addresses
// weights at a stale selector.
template <DType T>
cudaError_t launch_gate_up_routed(const MoeMatvecLaunch& m, const MoeRouteFusedLaunch& r, cudaStream_t stream) {
  if (kernel_filtered(reinterpret_cast<const void*>(moe_gate_up_routed<T>))) {
    const size_t pairs = static_cast<size_t>(m.n_slots / 2);
    if (const cudaError_t e = cudaMemsetAsync(r.coef, 0, pairs * 4, stream); e != cudaSuccess) return e;
    return cudaMemsetAsync(r.sel_down[0], 0xFF, pairs * 4, stream);
  }
  const dim3 grid(static_cast<unsigned>((m.n_rows + kern::kQ8Warps * kern::kQ8Rows - 1) /
                                        (kern::kQ8Warps * kern::kQ8Rows)),
                  static_cast<unsigned>(m.n_slots));
  kern::MatvecQ8Args a = kern::q8_args(m.w, m.w_stride, m.act, m.k, m.act_rows, m.y, m.y_stride, m.n_rows, 1);
  a.w_expert_stride = m.w_expert_stride;
  a.n_expert = INT32_MAX;  // the selectors are offsets in kMoeSelUnit, not expert ids
  a.x_div = m.x_div;
  return launch_kernel(moe_gate_up_routed<T>, grid, kern::kQ8Threads, 0, stream, a, r);
}

// The ring of moe_gate_up_routed<T>, in bytes.
template <DType T>
constexpr size_t gate_up_routed_ring_bytes() {
  return sizeof(kern::Q8Ring<T, kern::kQ8Rows, kern::Q8Smem<T, kern::kQ8Rows>::kStages, kern::kQ8Warps>);
}

template <DType T>
cudaError_t launch_down_combine(const MoeDownCombineLaunch& a, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((a.n_embd + kern::kQ8Rows - 1) / kern::kQ8Rows), static_cast<unsigned>(a.n_tokens));
  const int pairs = a.k + 1;
  return launch_kernel(moe_down_combine<T>, grid, 32 * pairs, static_cast<size_t>(down_combine_ring_bytes<T>(pairs)),
                       stream, a);
}

}  // namespace

bool moe_down_combine_fits(DType t, int64_t n_ff, int k) {
  if (!qdec::q8_supported(t) || n_ff <= 0 || n_ff > kern::kQ8ChunkElems || n_ff % qdec::traits(t).block_elems != 0 ||
      k < 1 || k + 1 > kDownCombineMaxPairs) {
    return false;
  }
  int bytes = 0;
  switch (t) {
#define X(name) \
  case DType::name: bytes = down_combine_ring_bytes<DType::name>(k + 1); break;
    X(Q4_0) X(Q5_0) X(Q8_0) X(Q4_K) X(Q5_K) X(Q6_K)
#undef X
    default: return false;
  }
  return bytes <= kern::kQ8StaticSmem;
}

cudaError_t moe_down_combine_launch(DType t, const MoeDownCombineLaunch& a, cudaStream_t stream) {
  if (a.n_tokens <= 0 || a.n_embd <= 0) return cudaSuccess;
  const int64_t row_align = qdec::q8_aligned16(t) ? 16 : 2;
  if (!moe_down_combine_fits(t, a.n_ff, a.k) || a.n_tokens > 65535 || a.sel == nullptr || a.coef == nullptr ||
      a.y == nullptr || reinterpret_cast<uintptr_t>(a.w) % 16 != 0 || a.w_stride % row_align != 0 ||
      reinterpret_cast<uintptr_t>(a.hq) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  switch (t) {
#define X(name) \
  case DType::name: return launch_down_combine<DType::name>(a, stream);
    X(Q4_0) X(Q5_0) X(Q8_0) X(Q4_K) X(Q5_K) X(Q6_K)
#undef X
    default: return cudaErrorInvalidValue;
  }
}

bool moe_route_norm_fits(int64_t n_embd, int n_tokens, int n_expert) {
  return n_embd > 0 && n_embd % kern::kQ8Block == 0 && n_embd <= kern::kNormPer * 1024 && n_tokens > 0 &&
         n_expert >= 1 && n_expert <= kMoeBlockMaxExperts &&
         route_fused_smem(n_expert, n_embd, n_tokens, true) <= kRouteNormSmem;
}

cudaError_t moe_route_fused_launch(const MoeRouteFusedLaunch& a, cudaStream_t stream) {
  if (a.n_tokens <= 0) return cudaSuccess;
  const auto a16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool norm = a.norm_w != nullptr;
  if (a.n_expert < 1 || a.n_expert > kMoeBlockMaxExperts || a.k < 1 || a.k > kMoeBlockMaxK || a.k > a.n_expert ||
      a.n_embd <= 0 || a.n_embd % kern::kQ8Block != 0 || a.sel_down[0] == nullptr || !a16(a.xq) ||
      (a.route && (a.counter == nullptr || a.sel_gu[0] == nullptr))) {
    return cudaErrorInvalidValue;
  }
  if (norm && (!moe_route_norm_fits(a.n_embd, a.n_tokens, a.n_expert) || a.res == nullptr || a.delta == nullptr || !a16(a.res) ||
               !a16(a.delta))) {
    return cudaErrorInvalidValue;
  }
  const bool vec4 = a.n_embd % 4 == 0 && a.router_stride % 4 == 0 && (norm || a16(a.x)) && a16(a.router) &&
                    a16(a.shexp_gate);
  const unsigned grid = static_cast<unsigned>((a.n_expert + 1 + kRouteWarps - 1) / kRouteWarps);
  const size_t smem = route_fused_smem(a.n_expert, a.n_embd, a.n_tokens, norm);
  if (!a.route) {  // logits only: a filter dropping this kernel leaves the products routing stale logits
    return norm ? launch_kernel(moe_route_fused<true, false>, grid, kRouteThreads, smem, stream, a, vec4)
                : launch_kernel(moe_route_fused<false, false>, grid, kRouteThreads, smem, stream, a, vec4);
  }
  const void* fn = norm ? reinterpret_cast<const void*>(moe_route_fused<true>)
                        : reinterpret_cast<const void*>(moe_route_fused<false>);
  if (kernel_filtered(fn)) {
    // A diagnostic run without the router (set_kernel_filter): the selectors are whatever the scratch
    // held, so make every pair "no expert" (-1), which the gathered products skip, instead of letting
    // them address weights at stale offsets; zero coefficients make the block's output 0.
    const size_t pairs = static_cast<size_t>(a.n_tokens) * (a.k + 1);
    if (const cudaError_t e = cudaMemsetAsync(a.coef, 0, pairs * 4, stream); e != cudaSuccess) return e;
    for (int g = 0; g < 2; ++g) {
      cudaError_t e = a.sel_gu[g] != nullptr ? cudaMemsetAsync(a.sel_gu[g], 0xFF, 2 * pairs * 4, stream) : cudaSuccess;
      if (e == cudaSuccess && a.sel_down[g] != nullptr) e = cudaMemsetAsync(a.sel_down[g], 0xFF, pairs * 4, stream);
      if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
  }
  return norm ? launch_kernel(moe_route_fused<true>, grid, kRouteThreads, smem, stream, a, vec4)
              : launch_kernel(moe_route_fused<false>, grid, kRouteThreads, smem, stream, a, vec4);
}

bool moe_gate_up_routed_fits(DType t, int n_expert, int k) {
  if (n_expert < 1 || n_expert > kMoeBlockMaxExperts || k < 1 || k > kMoeBlockMaxK || k > n_expert) return false;
  size_t ring = 0;
  switch (t) {
#define X(name) \
  case DType::name: ring = gate_up_routed_ring_bytes<DType::name>(); break;
    X(Q4_0) X(Q5_0) X(Q8_0) X(Q4_K) X(Q5_K) X(Q6_K)
#undef X
    default: return false;
  }
  return kern::route_block_smem_bytes(n_expert) <= ring;
}

cudaError_t moe_gate_up_routed_launch(DType t, const MoeMatvecLaunch& m, const MoeRouteFusedLaunch& r,
                                      cudaStream_t stream) {
  if (m.n_rows <= 0 || m.n_slots <= 0) return cudaSuccess;
  if (!moe_gate_up_routed_fits(t, r.n_expert, r.k) || m.n_slots > 65535 || m.n_slots % (2 * (r.k + 1)) != 0 ||
      m.x_div != 2 * (r.k + 1) || m.act == nullptr || reinterpret_cast<uintptr_t>(m.act) % 16 != 0 ||
      !moe_matvec_q8_fits(t, m) || r.logits == nullptr || r.shexp_logit == nullptr || r.ids == nullptr ||
      r.weights == nullptr || r.coef == nullptr || r.sel_down[0] == nullptr || r.sel_down[1] != nullptr) {
    return cudaErrorInvalidValue;
  }
  switch (t) {
#define X(name) \
  case DType::name: return launch_gate_up_routed<DType::name>(m, r, stream);
    X(Q4_0) X(Q5_0) X(Q8_0) X(Q4_K) X(Q5_K) X(Q6_K)
#undef X
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t moe_block_combine_launch(const float* d, const float* coef, int64_t n_tokens, int64_t k, int64_t n_embd,
                                     float* y, cudaStream_t stream) {
  const int64_t n = n_tokens * n_embd;
  if (n <= 0) return cudaSuccess;
  constexpr int kThreads = 256;
  return launch_kernel(moe_block_combine, static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream, d,
                       coef, n_tokens, k, n_embd, y);
}

}  // namespace ds::cuda
