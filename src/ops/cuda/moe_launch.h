// Launchers of the MoE kernels (ops/cuda/moe_gathered.cu, moe_block.cu, moe_grouped.cu), for the host
// entries moe_ffn_gathered and moe_ffn_grouped (ops/cuda/cuda_moe.cpp) and moe_block_decode
// (ops/cuda/cuda_moe_block.cpp).
// Needs the CUDA runtime headers: include only under DS_HAVE_CUDA. Launchers return cudaError_t; the
// host entry names the op and shapes.
// Non-obvious choice: a projection runs as one launch over all (token, slot) pairs, grid.y = slot, and
// each slot reads its expert id from device memory, so nothing depends on the routing on the host.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"
#include "ops/cuda/matvec_launch.h"
#include "ops/cuda/ops_launch.h"

namespace ds::cuda {

// One projection of every slot: y[s, 0 .. n_rows) = rows of expert ids[s] times activation row s / x_div.
// Slots whose id is outside [0, n_expert) are skipped (their y row is not written, no weight is read).
struct MoeMatvecLaunch {
  const void* w;            // expert 0, first row of this projection
  int64_t w_stride;         // bytes between rows
  int64_t w_expert_stride;  // bytes between experts
  int64_t n_rows = 0;
  int64_t k = 0;
  const int32_t* ids = nullptr;  // [n_slots] expert ids (device)
  int n_expert = 0;
  int n_slots = 0;
  int x_div = 1;                 // slot s reads activation row s / x_div
  const float* x = nullptr;      // F32 activation rows (staged and generic kernels)
  int64_t x_stride = 0;          // elements between rows of x
  const void* act = nullptr;     // q8 activations of the same rows (q8 kernel; quantize_q8_launch layout)
  int64_t act_rows = 0;          // rows in act
  float* y = nullptr;            // slot s writes y + s * y_stride
  int64_t y_stride = 0;          // elements
};

// Whether the q8 kernel fits (given q8 activations), and the staged F32 kernel (x set); the generic
// kernel always fits a supported type.
bool moe_matvec_q8_fits(DType t, const MoeMatvecLaunch& m);
bool moe_matvec_staged_fits(DType t, const MoeMatvecLaunch& m);
// Runs `kernel` for the projection; cudaErrorInvalidValue when it does not fit.
cudaError_t moe_matvec_launch(DType t, const MoeMatvecLaunch& m, MatvecKernel kernel, cudaStream_t stream);

// y[t, :] = sum over the slots j < k of token t whose id is in [0, n_expert) of
// weights[t, j] * d[t * k + j, :] (rows of n_embd), in slot order; tokens without a valid slot get 0.
cudaError_t moe_combine_launch(const float* d, const int32_t* ids, const float* weights, int64_t n_tokens,
                               int64_t k, int64_t n_embd, int n_expert, float* y, cudaStream_t stream);

// ---- moe_block_decode (ops/cuda/moe_block.cu) ----
// The block's pairs: token t has k + 1 (routed experts in routing order, then the shared expert), pair
// p = t * (k + 1) + j. Its gate / up products are slots 2 p and 2 p + 1 of one gathered launch, its down
// product slot p. A slot's "expert id" is a selector: the weight rows start at the launch's base plus
// selector * kMoeSelUnit bytes (MoeMatvecLaunch with w_expert_stride = kMoeSelUnit, n_expert =
// INT32_MAX), so routed experts and the shared expert, separate tensors, share one launch; -1 skips.
constexpr int64_t kMoeSelUnit = 16;         // bytes; every weight base and expert stride is a multiple
constexpr int kMoeBlockMaxExperts = static_cast<int>(kRouteMaxExperts);  // routed as by moe_route
constexpr int kMoeBlockMaxK = 32;

// Where a projection's weights sit in a launch: selector = base_units + e * expert_units (e = expert id,
// 0 for the shared expert), in the launch `group` (0, or 1 when the shared expert's type differs).
struct MoeWeightSel {
  int group = 0;
  int64_t base_units = 0;
  int64_t expert_units = 0;
};

// Router + routing + shared-expert gate + int8 quantization of x, one launch (moe_route_fused_launch).
struct MoeRouteFusedLaunch {
  const float* x = nullptr;           // [n_tokens, n_embd] contiguous (unused with the input norm)
  // The input norm (norm_w set): x = RMSNorm(res + delta; norm_w, eps) with add_rms_norm's bits, and
  // res += delta, as add_rms_norm. Needs moe_route_norm_fits; res, delta [n_tokens, n_embd] contiguous,
  // 16-byte aligned, res not aliasing delta.
  float* res = nullptr;
  const float* delta = nullptr;
  const float* norm_w = nullptr;      // [n_embd]
  float eps = 0.0f;
  int64_t n_embd = 0;                 // multiple of 32
  int n_tokens = 0;
  const float* router = nullptr;      // [n_expert] rows of n_embd F32
  int64_t router_stride = 0;          // elements between router rows
  const float* shexp_gate = nullptr;  // [n_embd] F32
  int n_expert = 0;                   // 1 .. kMoeBlockMaxExperts
  int k = 0;                          // 1 .. min(n_expert, kMoeBlockMaxK)
  float floor = 0.0f;                 // the renormalization floor (kMoeWeightSumFloor)
  // Outputs (device).
  float* logits = nullptr;            // [n_tokens, n_expert] scratch
  float* shexp_logit = nullptr;       // [n_tokens] scratch: shexp_gate . x
  void* xq = nullptr;                 // q8 rows of x (quantize_q8_launch layout, n_tokens rows)
  int32_t* ids = nullptr;             // [n_tokens, k] as moe_route
  float* weights = nullptr;           // [n_tokens, k] as moe_route
  float* coef = nullptr;              // [n_tokens, k + 1]: weights, then sigmoid(shexp_logit)
  int32_t* sel_gu[2] = {};            // [n_tokens, 2 (k + 1)] per gate/up launch ([1] null: one launch)
  int32_t* sel_down[2] = {};          // [n_tokens, k + 1] per down launch ([1] null: one launch)
  MoeWeightSel gate, up, shexp_gate_w, shexp_up_w, down, shexp_down_w;
  unsigned int* counter = nullptr;    // 0 before the launch, 0 again after it (blocks count themselves)
  // false: logits, shexp_logit and xq only (no counter, no routing, res left as it is): the gate/up
  // products route (moe_gate_up_routed_launch) and moe_down_combine writes res += delta.
  bool route = true;
};

// Grid of one warp per router row (+ one for shexp_gate); each CTA also quantizes a share of x; the
// CTA that finishes last routes every token (softmax in double, top-k by logit, ties to the lower id,
// w = p / max(sum p, floor), as moe_route) and writes ids, weights, coef and the selectors.
// With the input norm, every CTA stages the normalized rows in shared memory first (no norm launch before
// the block), and the routing CTA writes res += delta last (every CTA has read res by then).
cudaError_t moe_route_fused_launch(const MoeRouteFusedLaunch& a, cudaStream_t stream);

// The gathered gate/up launch of moe_block_decode (m as for moe_matvec_launch with the kQ8 kernel: one
// group, slot 2 pair (+ 1) the gate (up) of the pair, activation row = token) with the routing in every
// CTA: each routes its token from r's logits (route_block, as the router kernel's last CTA would) and
// takes its slot's expert; the first CTA of each pair's gate slot writes r's ids, weights, coef and
// sel_down[0] (the shared expert's coef and selector too). After moe_route_fused_launch with route =
// false: no ticket, fence or selector round trip between the router and these products. Needs
// moe_gate_up_routed_fits.
bool moe_gate_up_routed_fits(DType t, int n_expert, int k);
cudaError_t moe_gate_up_routed_launch(DType t, const MoeMatvecLaunch& m, const MoeRouteFusedLaunch& r,
                                      cudaStream_t stream);
// Whether the input norm takes the shape: rows of a multiple of 32 up to 8192 (the norm's), every
// token's row within the kernel's shared memory next to the routing's (2048 elements of 256 experts:
// up to 5 tokens).
bool moe_route_norm_fits(int64_t n_embd, int n_tokens, int n_expert);

// y[t, :] = sum_{j < k} coef[t, j] d[t (k+1) + j, :] + coef[t, k] d[t (k+1) + k, :] (rows of n_embd).
cudaError_t moe_block_combine_launch(const float* d, const float* coef, int64_t n_tokens, int64_t k,
                                     int64_t n_embd, float* y, cudaStream_t stream);

// The down products of every pair and their weighted sum in one launch: the bits of the gathered down
// launch (one group) followed by moe_block_combine, without the pairs' rows d in memory. A CTA takes
// kQ8Rows output rows of one token; warp j multiplies pair j's rows with its h, the CTA sums the pairs.
struct MoeDownCombineLaunch {
  const void* w = nullptr;       // the launch's weight base: pair p's rows start selector * kMoeSelUnit on
  int64_t w_stride = 0;          // bytes between rows
  const int32_t* sel = nullptr;  // [n_tokens, k + 1] selectors (moe_route_fused's sel_down[0])
  const void* hq = nullptr;      // q8 rows of h: n_tokens * (k + 1) rows of n_ff (quantize_q8_launch layout)
  const float* coef = nullptr;   // [n_tokens, k + 1]
  float* y = nullptr;            // [n_tokens, n_embd]
  int64_t n_embd = 0, n_ff = 0;
  int n_tokens = 0, k = 0;
  // The input norm's residual add where the router did not route (MoeRouteFusedLaunch::route false):
  // res += delta, each CTA its rows ([n_tokens, n_embd]); null: none.
  float* res = nullptr;
  const float* delta = nullptr;
};
// The kernel reads sel, coef, res and delta before its dependency wait (and issues the weight copies
// then), h after it: those four must be outputs of kernels two or more launches back on the stream
// (moe_block_decode launches the SwiGLU quantization between the gate/up products and this), or of no
// kernel in flight.
// Whether the fused launch takes the shape: an int8-activation type, a row of one 1024-element step
// (n_ff <= 1024, whole blocks), k + 1 <= 16 pairs, rings within the 48 KB of shared memory.
bool moe_down_combine_fits(DType t, int64_t n_ff, int k);
cudaError_t moe_down_combine_launch(DType t, const MoeDownCombineLaunch& a, cudaStream_t stream);

// ---- moe_ffn_grouped (ops/cuda/moe_grouped.cu): many pairs, grouped per expert on the device ----
// A pair is a (token, slot) with an expert id in [0, n_expert); its place is its index in the runs of
// pairs that moe_group_plan lays out expert after expert. A tile is up to tile_m pairs of one run:
// {expert, first place, pairs, 0}; tile_m is kMoeGroupM, kMoeGroupMLarge or kMoeGroupMMax
// (moe_group_tile_m, moe_group_tile_m_valid).
constexpr int kMoeGroupM = 32;
constexpr int kMoeGroupMLarge = 64;
constexpr int kMoeGroupMMax = 128;
constexpr int kMoeGroupMaxExperts = 4096;  // the plan's per-expert counters live in shared memory
// The tile size for n_slots pairs over n_expert experts: the largest whose minimum average of pairs an
// expert they reach, where most experts' runs pass the next smaller size (a tile dequantizes its
// expert's rows once for all its pairs, so fewer, fuller tiles dequantize less).
constexpr int64_t kMoeGroupMLargeMinAvg = 28;
constexpr int64_t kMoeGroupMMaxMinAvg = 112;
int moe_group_tile_m(int64_t n_slots, int64_t n_expert);
constexpr bool moe_group_tile_m_valid(int m) {
  return m == kMoeGroupM || m == kMoeGroupMLarge || m == kMoeGroupMMax;
}
// The most tiles of tile_m pairs a routing of n_slots slots over n_expert experts can produce.
int64_t moe_group_max_tiles(int64_t n_slots, int64_t n_expert, int tile_m);
// order[place] = slot, tiles[0 .. *n_tiles) (max_tiles entries allocated) of at most tile_m pairs, from
// ids [n_slots] (device); one CTA. 1 <= n_expert <= kMoeGroupMaxExperts, tile_m >= 1.
cudaError_t moe_group_plan_launch(const int32_t* ids, int n_slots, int n_expert, int tile_m, int32_t* order,
                                  int4* tiles, int* n_tiles, cudaStream_t stream);

// One projection of every tile of a plan: y[out row, 0 .. n_rows) = (rows of expert e) * (activation row),
// on the tensor cores (BF16 activations, weights rounded to BF16, F32 sums).
struct MoeGroupedLaunch {
  const void* w = nullptr;      // expert 0, first row of this projection
  int64_t w_stride = 0;         // bytes between rows
  int64_t w_expert_stride = 0;  // bytes between experts
  int64_t n_rows = 0;
  int64_t k = 0;                // multiple of 8 and of the type's block
  // Activation rows h (BF16 bits, 16-byte aligned, h_stride a multiple of 8): the product reads row
  // slot / x_div (the pair's token: x as f32_to_bf16_launch makes it) or, with x_div 0, row `place`
  // (moe_swiglu_bf16_launch's h of the down products).
  const uint16_t* h = nullptr;
  int64_t h_stride = 0;         // elements between rows of h
  int x_div = 1;
  const int32_t* order = nullptr;  // the plan (device)
  const int4* tiles = nullptr;
  const int* n_tiles = nullptr;
  int64_t max_tiles = 0;           // grid size: moe_group_max_tiles
  int tile_m = kMoeGroupM;         // the plan's tile size (moe_group_tile_m_valid)
  float* y = nullptr;
  int64_t y_stride = 0;         // elements between output rows
  bool y_by_slot = false;       // output row = the pair's slot (else its place)
};
// Whether the grouped product takes weights of type t at w with these strides (bytes) and row length k:
// F16, BF16 and the quantized types (F32 weights keep F32 products elsewhere), rows aligned for decode8.
bool moe_grouped_fits(DType t, const void* w, int64_t w_stride, int64_t w_expert_stride, int64_t k);
cudaError_t moe_grouped_product_launch(DType t, const MoeGroupedLaunch& p, cudaStream_t stream);
// h[place, 0 .. n_ff) = silu(g) * u rounded to BF16 for the places of the plan's runs, from gu [max_places,
// 2 n_ff] by place (g at [0, n_ff), u after it, as the gate/up products write them); n_ff a multiple of 8.
cudaError_t moe_swiglu_bf16_launch(const float* gu, int64_t n_ff, int64_t max_places, const int4* tiles,
                                   const int* n_tiles, uint16_t* h, cudaStream_t stream);

}  // namespace ds::cuda
