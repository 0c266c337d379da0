// CUDA kernels and launchers of the non-matrix ops: element-wise family, strided copy, RMS/L2 norm
// (strided input rows, optional SiLU gate: rms_norm_gated), NeoX RoPE (also at a device-side
// position), get_rows, causal conv1d with state (optional SiLU output: conv1d_causal_silu), DeltaNet
// gates, the fused DeltaNet decode prologue (gates + conv + SiLU + q/k L2 norms of one token: the same
// device helpers as the separate kernels, so the same values up to the order of the q/k sums of
// squares), MoE routing and the row gather/scatter used by the expert FFN (the DeltaNet recurrence itself
// is in delta_net.cu). Host entries (checks, Status) are in cuda_ops.cpp and cuda_attention.cpp.
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>

#include "ops/cuda/activation.cuh"
#include "ops/cuda/attention_launch.h"
#include "ops/cuda/delta_net_prep.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/matvec_q8.cuh"
#include "ops/cuda/moe_route.cuh"
#include "ops/cuda/norm_warp.cuh"
#include "ops/cuda/ops_launch.h"
#include "ops/cuda/quant_decode.cuh"
#include "ops/cuda/rope.cuh"

namespace ds::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGridY = 65535;  // launches with one grid row per token go in slices of this

unsigned blocks_for(int64_t n, int threads = kThreads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

using kern::sigmoidf;

__global__ void eltwise_kernel(EltKind kind, const float* a, const float* b, float* y, int64_t n, int64_t row,
                               bool b_per_row, int64_t b_row_stride) {
  kern::dependency_sync();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = a[i];
  float u = 0.0f;
  if (b) {
    if (b_per_row) {
      u = b[i / row];
    } else if (b_row_stride > 0) {
      u = b[(i / row) * b_row_stride + i % row];
    } else {
      u = b[i];
    }
  }
  float r;
  switch (kind) {
    case EltKind::kAdd: r = x + u; break;
    case EltKind::kMul: r = x * u; break;
    case EltKind::kSilu: r = x * sigmoidf(x); break;
    case EltKind::kSigmoid: r = sigmoidf(x); break;
    case EltKind::kSwiglu: r = x * sigmoidf(x) * u; break;
    default: r = x * sigmoidf(u); break;
  }
  y[i] = r;
}

// One block per (row, tile of kCopyTile elements): a lone long row (a decode step's one token) still
// spreads over many blocks, and each thread's kCopyTile / kThreads loads are independent.
constexpr int kCopyTile = 4 * kThreads;
__global__ void copy_kernel(const uint8_t* src, uint8_t* dst, CopyShape sh) {
  kern::dependency_sync();
  const int64_t r = blockIdx.x;
  const int64_t i1 = r % sh.ne[1], i2 = (r / sh.ne[1]) % sh.ne[2], i3 = r / (sh.ne[1] * sh.ne[2]);
  const float* s = reinterpret_cast<const float*>(src + i1 * sh.src_nb[1] + i2 * sh.src_nb[2] + i3 * sh.src_nb[3]);
  float* d = reinterpret_cast<float*>(dst + i1 * sh.dst_nb[1] + i2 * sh.dst_nb[2] + i3 * sh.dst_nb[3]);
  const int64_t i0 = static_cast<int64_t>(blockIdx.y) * kCopyTile + threadIdx.x;
  float v[kCopyTile / kThreads];
#pragma unroll
  for (int j = 0; j < kCopyTile / kThreads; ++j) {
    const int64_t i = i0 + j * kThreads;
    v[j] = i < sh.ne[0] ? s[i] : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kCopyTile / kThreads; ++j) {
    const int64_t i = i0 + j * kThreads;
    if (i < sh.ne[0]) d[i] = v[j];
  }
}

__device__ float block_sum(float v) {
  __shared__ float part[32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // part[] may still be read by a previous call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  float s = 0.0f;
  for (int w = 0; w < (blockDim.x + 31) / 32; ++w) s += part[w];
  return s;
}

// One block per row, sized to the row (kern::norm_threads): a thread keeps its kNormPer elements in
// registers between the sum and the scaling, so the row is read once and all its loads are in flight
// together. x rows are found through the RowMap (strided views: no copy first); y and gate are contiguous.
// Fused kernels that must give its bits emulate its sums with norm_warp.cuh.
using kern::kNormPer;
using kern::norm_threads;
// Every load of the row (x, the residual, the weight and the gate) is issued before the first store and
// before the block reduction: x is written back in place (add_rms_norm) and y may alias the weight or
// gate as far as the compiler knows, so interleaved loads and stores would each wait a full memory
// latency (8 round trips per thread instead of one).
// q8 output (q8 != nullptr, norm_q8_fits): blockDim.x is a multiple of 32, so the j-th values of one warp
// are the 32-element block (threadIdx.x + j * blockDim.x) / 32, quantized as quantize_q8 does.
__global__ void norm_kernel(const float* x, RowMap xmap, const float* w, const float* gate, float* y, int64_t n,
                            float eps, bool l2, const float* res, int8_t* q8, float2* q8_ds) {
  // The weight is no kernel's output, and by the time a decode step comes back to a layer the products
  // have pushed it out of L2: start fetching it while the previous kernel drains (launch.cuh). Every
  // row shares it, so the first block alone fetches it.
  if (w != nullptr && blockIdx.x == 0) {
    for (int64_t i = 32 * static_cast<int64_t>(threadIdx.x); i < n; i += 32 * static_cast<int64_t>(blockDim.x)) {
      asm volatile("prefetch.global.L2 [%0];" ::"l"(w + i));  // one 128-byte line a thread
    }
  }
  kern::dependency_sync();
  const int64_t r = blockIdx.x;
  const int64_t i1 = r % xmap.ne1, i2 = r / xmap.ne1 % xmap.ne2, i3 = r / (xmap.ne1 * xmap.ne2);
  const float* xr = x + i1 * xmap.s1 + i2 * xmap.s2 + i3 * xmap.s3;
  float* yr = y + r * n;
  const float* gr = gate ? gate + r * n : nullptr;
  const float* rr = res ? res + r * n : nullptr;
  float* xo = res ? const_cast<float*>(xr) : nullptr;  // add_rms_norm: x is contiguous and updated in place
  float v[kNormPer], wv[kNormPer], gv[kNormPer];
#pragma unroll
  for (int j = 0; j < kNormPer; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
    const bool in = i < n;
    v[j] = in ? xr[i] : 0.0f;
    if (rr) v[j] += in ? rr[i] : 0.0f;
    wv[j] = w && in ? w[i] : 1.0f;
    gv[j] = gr && in ? gr[i] : 0.0f;
  }
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kNormPer; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
    if (rr && i < n) xo[i] = v[j];
    ss = fmaf(v[j], v[j], ss);
  }
  // Rows longer than kNormPer * 1024: each thread re-reads (after writing back) only its own elements.
  for (int64_t i = threadIdx.x + static_cast<int64_t>(kNormPer) * blockDim.x; i < n; i += blockDim.x) {
    const float e = rr ? xr[i] + rr[i] : xr[i];
    if (rr) xo[i] = e;
    ss = fmaf(e, e, ss);
  }
  ss = block_sum(ss);
  kern::timeline_mark(0);  // the row's sum
  const float inv = l2 ? rsqrtf(ss + eps) : rsqrtf(ss / static_cast<float>(n) + eps);
  auto gated = [&](float o, float g) { return gr ? g * sigmoidf(g) * o : o; };  // as EltKind::kSwiglu(gate, o)
#pragma unroll
  for (int j = 0; j < kNormPer; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
    const float o = gated(v[j] * inv * wv[j], gv[j]);
    if (i < n) yr[i] = o;
    // Warp-uniform: blockDim.x and n are multiples of 32, so a warp's 32 elements are all in the row or
    // all past it.
    if (q8 != nullptr && i < n) kern::store_q8_block_warp(o, q8, q8_ds, r * n + i - threadIdx.x % 32);
  }
  for (int64_t i = threadIdx.x + static_cast<int64_t>(kNormPer) * blockDim.x; i < n; i += blockDim.x) {
    yr[i] = gated(w ? xr[i] * inv * w[i] : xr[i] * inv, gr ? gr[i] : 0.0f);
  }
  kern::timeline_mark(1);  // stored
}

// d_pos (when not null) adds a position read on the device (rope_neox_at).
__global__ void rope_kernel(float* x, int64_t head_dim, int64_t n_head, int64_t n_tokens, int64_t n_rot,
                            double log2_base, int64_t pos0, const int32_t* d_pos) {
  kern::dependency_sync();
  const int64_t half = n_rot / 2;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_tokens * n_head * half) return;
  if (d_pos) pos0 += *d_pos;
  const int64_t d = i % half, th = i / half, t = th / n_head;
  float* v = x + th * head_dim;
  float x0 = v[d], x1 = v[d + half];
  kern::rope_neox_pair(x0, x1, pos0 + t, d, n_rot, log2_base);
  v[d] = x0;
  v[d + half] = x1;
}

template <DType T>
__global__ void get_rows_kernel(const uint8_t* table, int64_t row_stride, int64_t n, const int32_t* ids,
                                float* y) {
  kern::dependency_sync();
  const int64_t t = blockIdx.y;
  const uint8_t* row = table + static_cast<int64_t>(ids[t]) * row_stride;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[t * n + i] = qdec::decode1<T>(row, i);
  }
}

// One thread per (channel, tile of kConvTileTokens tokens): y[t] depends only on inputs, so tiles are
// independent; a tile reads the kernel-1 inputs before it from x (or from the carried state for the
// first tokens). The tile holding the last token writes the new state after every tile has read the
// old one (a second launch, conv1d_state_kernel).
constexpr int kConvTileTokens = 32;

using kern::conv_out;

__global__ void conv1d_kernel(const float* x, const float* w, const float* state, float* y, int64_t n_ch,
                              int64_t n_tokens, int kernel, bool silu) {
  kern::dependency_sync();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= n_ch) return;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kConvTileTokens;
  float win[kConvMaxKernel];  // inputs t-kernel+1 .. t-1 of the current token, oldest first
  float taps[kConvMaxKernel];
#pragma unroll
  for (int i = 0; i < kConvMaxKernel; ++i) {
    taps[i] = i < kernel ? w[c * kernel + i] : 0.0f;
    win[i] = 0.0f;
    if (i < kernel - 1) {
      const int64_t t = t0 - (kernel - 1) + i;  // absolute index of this window entry (negative: state)
      win[i] = t >= 0 ? x[t * n_ch + c] : state[(t + kernel - 1) * n_ch + c];
    }
  }
  const int64_t t_end = t0 + kConvTileTokens < n_tokens ? t0 + kConvTileTokens : n_tokens;
  for (int64_t t = t0; t < t_end; ++t) {
    const float cur = x[t * n_ch + c];
    y[t * n_ch + c] = conv_out(taps, win, cur, kernel, silu);
#pragma unroll
    for (int i = 0; i + 1 < kConvMaxKernel; ++i) {
      if (i < kernel - 2) win[i] = win[i + 1];
      else if (i == kernel - 2) win[i] = cur;
    }
  }
}

// New state = the last kernel-1 inputs of (old state ++ x).
__global__ void conv1d_state_kernel(const float* x, float* state, int64_t n_ch, int64_t n_tokens, int kernel) {
  kern::dependency_sync();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= n_ch) return;
  float win[kConvMaxKernel];
#pragma unroll
  for (int i = 0; i < kConvMaxKernel; ++i) {
    win[i] = 0.0f;
    if (i < kernel - 1) {
      const int64_t t = n_tokens - (kernel - 1) + i;
      win[i] = t >= 0 ? x[t * n_ch + c] : state[(t + kernel - 1) * n_ch + c];
    }
  }
#pragma unroll
  for (int i = 0; i < kConvMaxKernel; ++i) {
    if (i < kernel - 1) state[i * n_ch + c] = win[i];
  }
}

// Gate i of head h.
__device__ __forceinline__ void gate_values(const float* alpha, const float* b, const float* dt_bias,
                                            const float* ssm_a, float* g, float* beta, int64_t i, int64_t h) {
  const kern::DeltaNetGate v = kern::gate_of(alpha[i], b[i], dt_bias[h], ssm_a[h]);
  g[i] = v.g;
  beta[i] = v.beta;
}

__global__ void gates_kernel(const float* alpha, const float* b, const float* dt_bias, const float* ssm_a,
                             float* g, float* beta, int64_t nv, int64_t n) {
  kern::dependency_sync();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  gate_values(alpha, b, dt_bias, ssm_a, g, beta, i, i % nv);
}

// Channel c of a one-token step: conv + SiLU into conv[c], the state shifted by one (the channel's
// state is read and rewritten by this thread only, hence no second launch as conv1d_state_kernel).
__device__ __forceinline__ float prep_conv_channel(const DeltaNetPrepArgs& a, int64_t c) {
  float taps[kConvMaxKernel], win[kConvMaxKernel];
#pragma unroll
  for (int i = 0; i < kConvMaxKernel; ++i) {
    taps[i] = i < a.kernel ? a.conv_w[c * a.kernel + i] : 0.0f;
    win[i] = i < a.kernel - 1 ? a.conv_state[i * a.n_ch + c] : 0.0f;
  }
  const float cur = a.mixed[c];
  const float y = conv_out(taps, win, cur, a.kernel, true);
  a.conv[c] = y;
#pragma unroll
  for (int i = 0; i + 1 < kConvMaxKernel; ++i) {
    if (i < a.kernel - 2) a.conv_state[i * a.n_ch + c] = win[i + 1];
    else if (i == a.kernel - 2) a.conv_state[i * a.n_ch + c] = cur;
  }
  return y;
}

// Blocks [0, nk): q heads, [nk, 2 nk): k heads (thread i: channel i of the head, then the block's L2
// norm as norm_kernel's l2: y * rsqrtf(sum y^2 + eps)); the next v_blocks: blockDim.x v channels each;
// the last block: the nv gates. blockDim.x >= dk (delta_net_prep_threads). The branches depend on the
// block only, so block_sum's barriers are reached by the whole block.
__global__ void delta_net_prep_kernel(DeltaNetPrepArgs a, int64_t v_blocks) {
  kern::dependency_sync();
  const int64_t blk = blockIdx.x, qk_blocks = 2 * a.nk;
  if (blk < qk_blocks) {
    const bool in = threadIdx.x < a.dk;
    const float y = in ? prep_conv_channel(a, blk * a.dk + threadIdx.x) : 0.0f;
    const float ss = block_sum(y * y);
    if (in) {
      float* out = blk < a.nk ? a.q + blk * a.dk : a.k + (blk - a.nk) * a.dk;
      out[threadIdx.x] = y * rsqrtf(ss + a.eps);
    }
  } else if (blk < qk_blocks + v_blocks) {
    const int64_t c = qk_blocks * a.dk + (blk - qk_blocks) * blockDim.x + threadIdx.x;
    if (c < a.n_ch) prep_conv_channel(a, c);
  } else {
    for (int64_t h = threadIdx.x; h < a.nv; h += blockDim.x) {
      gate_values(a.alpha, a.b, a.dt_bias, a.ssm_a, a.g, a.beta, h, h);
    }
  }
}

// One CTA per token (kern::route_block); dynamic shared memory kern::route_block_smem_bytes(n_expert).
static_assert(kern::route_block_smem_bytes(static_cast<int>(kRouteMaxExperts)) <= 48 * 1024,
              "route_block's shared memory needs no opt-in at kRouteMaxExperts");
__global__ void __launch_bounds__(kern::kRouteBlockThreads)
    moe_route_kernel(const float* logits, int64_t n_expert, int64_t k, int32_t* ids, float* weights, float floor) {
  extern __shared__ double route_smem[];
  kern::dependency_sync();
  const int64_t t = blockIdx.x;
  int pick_e;
  float pick_w;
  kern::route_block(logits + t * n_expert, static_cast<int>(n_expert), static_cast<int>(k), floor, route_smem, pick_e,
                    pick_w);
  const int j = static_cast<int>(threadIdx.x);
  if (j < k) {
    ids[t * k + j] = pick_e;
    weights[t * k + j] = pick_w;
  }
}

__global__ void scatter_add_kernel(const float* x, const int32_t* dst_rows, const float* scale, float* y,
                                   int64_t n_embd) {
  kern::dependency_sync();
  const int64_t i = blockIdx.y;
  const float sc = scale[i];
  float* yr = y + static_cast<int64_t>(dst_rows[i]) * n_embd;
  const float* xr = x + i * n_embd;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < n_embd;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    yr[c] = fmaf(sc, xr[c], yr[c]);
  }
}

__global__ void gather_kernel(const float* x, const int32_t* src_rows, float* y, int64_t n_embd) {
  kern::dependency_sync();
  const int64_t i = blockIdx.y;
  const float* xr = x + static_cast<int64_t>(src_rows[i]) * n_embd;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < n_embd;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i * n_embd + c] = xr[c];
  }
}

unsigned row_blocks(int64_t n) { return static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 64)); }

}  // namespace

cudaError_t eltwise_launch(EltKind kind, const float* a, const float* b, float* y, int64_t n, int64_t row,
                           bool b_per_row, cudaStream_t s, int64_t b_row_stride) {
  if (n <= 0) return cudaSuccess;
  if (row <= 0 || b_row_stride < 0) return cudaErrorInvalidValue;
  return launch_kernel(eltwise_kernel, blocks_for(n), kThreads, 0, s, kind, a, b, y, n, row, b_per_row, b_row_stride);
}

cudaError_t copy_launch(const void* src, void* dst, const CopyShape& shape, cudaStream_t s) {
  const int64_t rows = shape.ne[1] * shape.ne[2] * shape.ne[3];
  if (rows <= 0 || shape.ne[0] <= 0) return cudaSuccess;
  const int64_t tiles = (shape.ne[0] + kCopyTile - 1) / kCopyTile;
  if (tiles > kMaxGridY) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(tiles));
  return launch_kernel(copy_kernel, grid, kThreads, 0, s, static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst),
                       shape);
}

int device_code_ptx_version() {
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(copy_kernel)) != cudaSuccess) return 0;
  return attr.ptxVersion;
}

bool norm_q8_fits(int64_t n) { return n > 0 && n % kern::kQ8Block == 0 && n <= kNormPer * 1024; }

cudaError_t norm_launch(const float* x, const RowMap& xmap, const float* w, const float* gate, float* y, int64_t n,
                        int64_t rows, float eps, bool l2, cudaStream_t s, const float* res, void* act) {
  if (rows <= 0) return cudaSuccess;
  if (rows > INT_MAX || n <= 0 || xmap.ne1 <= 0 || xmap.ne2 <= 0) return cudaErrorInvalidValue;
  if (act != nullptr && !norm_q8_fits(n)) return cudaErrorInvalidValue;
  auto* q8 = static_cast<int8_t*>(act);
  auto* q8_ds = act != nullptr ? reinterpret_cast<float2*>(static_cast<uint8_t*>(act) + kern::q8_ds_offset(n, rows))
                               : nullptr;
  return launch_kernel(norm_kernel, static_cast<unsigned>(rows), norm_threads(n), 0, s, x, xmap, w, gate, y, n, eps, l2,
                       res, q8, q8_ds);
}

cudaError_t rope_neox_launch(float* x, int64_t head_dim, int64_t n_head, int64_t n_tokens, int64_t n_rot,
                             float base, int64_t pos0, cudaStream_t s) {
  const int64_t n = n_tokens * n_head * (n_rot / 2);
  if (n <= 0) return cudaSuccess;
  return launch_kernel(rope_kernel, blocks_for(n), kThreads, 0, s, x, head_dim, n_head, n_tokens, n_rot,
                       std::log2(static_cast<double>(base)), pos0, nullptr);
}

cudaError_t rope_neox_at_launch(float* x, int64_t head_dim, int64_t n_head, int64_t n_tokens, int64_t n_rot,
                                float base, const int32_t* d_pos, cudaStream_t s) {
  const int64_t n = n_tokens * n_head * (n_rot / 2);
  if (n <= 0) return cudaSuccess;
  return launch_kernel(rope_kernel, blocks_for(n), kThreads, 0, s, x, head_dim, n_head, n_tokens, n_rot,
                       std::log2(static_cast<double>(base)), 0, d_pos);
}

cudaError_t get_rows_launch(DType t, const void* table, int64_t row_stride, int64_t n, const int32_t* ids,
                            int64_t n_tokens, float* y, cudaStream_t s) {
  if (n_tokens <= 0 || n <= 0) return cudaSuccess;
  const auto* tb = static_cast<const uint8_t*>(table);
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kMaxGridY) {
    const dim3 grid(row_blocks(n), static_cast<unsigned>(std::min(kMaxGridY, n_tokens - t0)));
    const int32_t* ids_t = ids + t0;
    float* y_t = y + t0 * n;
    switch (t) {
#define X(name)                                                                             \
  case DType::name:                                                                         \
    launch_kernel(get_rows_kernel<DType::name>, grid, kThreads, 0, s, tb, row_stride, n, ids_t, y_t); \
    break;
      X(F32) X(F16) X(BF16) X(Q4_0) X(Q5_0) X(Q8_0) X(Q4_K) X(Q5_K) X(Q6_K)
#undef X
      default: return cudaErrorInvalidValue;
    }
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t conv1d_launch(const float* x, const float* w, float* state, float* y, int64_t n_ch, int64_t n_tokens,
                          int64_t kernel, cudaStream_t s, bool silu) {
  if (kernel < 1 || kernel > kConvMaxKernel) return cudaErrorInvalidValue;
  const int64_t tiles = (n_tokens + kConvTileTokens - 1) / kConvTileTokens;
  if (tiles > kMaxGridY) return cudaErrorInvalidValue;
  const dim3 grid(blocks_for(n_ch, 128), static_cast<unsigned>(tiles));
  launch_kernel(conv1d_kernel, grid, 128, 0, s, x, w, state, y, n_ch, n_tokens, static_cast<int>(kernel), silu);
  return launch_kernel(conv1d_state_kernel, blocks_for(n_ch, 128), 128, 0, s, x, state, n_ch, n_tokens,
                       static_cast<int>(kernel));
}

cudaError_t delta_net_gates_launch(const float* alpha, const float* b, const float* dt_bias, const float* ssm_a,
                                   float* g, float* beta, int64_t nv, int64_t rows, cudaStream_t s) {
  const int64_t n = nv * rows;
  if (n <= 0) return cudaSuccess;
  return launch_kernel(gates_kernel, blocks_for(n), kThreads, 0, s, alpha, b, dt_bias, ssm_a, g, beta, nv, n);
}

cudaError_t delta_net_prep_launch(const DeltaNetPrepArgs& a, cudaStream_t s) {
  if (!delta_net_prep_fits(a.n_ch, a.kernel, a.dk, a.nk, a.nv)) return cudaErrorInvalidValue;
  const int threads = delta_net_prep_threads(a.dk);
  const int64_t v_blocks = (a.n_ch - 2 * a.nk * a.dk + threads - 1) / threads;
  const int64_t blocks = 2 * a.nk + v_blocks + 1;
  return launch_kernel(delta_net_prep_kernel, static_cast<unsigned>(blocks), threads, 0, s, a, v_blocks);
}

cudaError_t moe_route_launch(const float* logits, int64_t n_expert, int64_t n_tokens, int64_t k, int32_t* ids,
                             float* weights, float floor, cudaStream_t s) {
  if (k < 1 || k > kRouteMaxK || k > n_expert) return cudaErrorInvalidValue;
  if (n_expert > kRouteMaxExperts || n_tokens > INT_MAX) return cudaErrorInvalidValue;
  static_assert(kRouteMaxK <= kern::kRouteMaxPicks, "route_block keeps pick j in thread j");
  if (n_tokens <= 0) return cudaSuccess;
  return launch_kernel(moe_route_kernel, static_cast<unsigned>(n_tokens), kern::kRouteBlockThreads,
                       kern::route_block_smem_bytes(static_cast<int>(n_expert)), s, logits, n_expert, k, ids, weights,
                       floor);
}

cudaError_t scatter_add_rows_launch(const float* x, const int32_t* dst_rows, const float* scale, float* y,
                                    int64_t n, int64_t n_embd, cudaStream_t s) {
  for (int64_t i0 = 0; i0 < n; i0 += kMaxGridY) {
    const dim3 grid(row_blocks(n_embd), static_cast<unsigned>(std::min(kMaxGridY, n - i0)));
    launch_kernel(scatter_add_kernel, grid, kThreads, 0, s, x + i0 * n_embd, dst_rows + i0, scale + i0, y, n_embd);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t gather_rows_launch(const float* x, const int32_t* src_rows, float* y, int64_t n, int64_t n_embd,
                               cudaStream_t s) {
  for (int64_t i0 = 0; i0 < n; i0 += kMaxGridY) {
    const dim3 grid(row_blocks(n_embd), static_cast<unsigned>(std::min(kMaxGridY, n - i0)));
    launch_kernel(gather_kernel, grid, kThreads, 0, s, x, src_rows + i0, y + i0 * n_embd, n_embd);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace ds::cuda
