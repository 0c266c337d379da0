// The attention kernels' launch arguments (KParams) and row stores (attention.cu): the split length,
// the packed-row mapping, and the final rows (gated with their q8 codes where asked) or a split's
// partial. Device code: include from CUDA sources only.
// Non-obvious choice: a split's length comes from the position on the device (split_len), not from the
// host bound the grid was sized by (see attention.cu).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "ops/cuda/activation.cuh"
#include "ops/cuda/matvec_q8.cuh"

namespace ds::cuda::attn {

constexpr int kBN = 64;  // KV positions per tensor-core tile; split lengths are multiples of it

// Everything a kernel needs, passed by value.
struct KParams {
  const float* q;
  float* o;
  float* part_ml;  // [n_split][RT][2]: m (log2 domain), l
  float* part_o;   // [n_split][RT][D]: unnormalized accumulator
  const uint8_t* const* k_base;
  const uint8_t* const* v_base;
  int64_t k_off, v_off;
  const int32_t* d_pos;
  int pos0_host;
  int C, Hkv, D, H, G, n_tokens, R;  // R = n_tokens * G rows per KV head
  int64_t RT;                        // n_tokens * H output rows
  int n_split;
  float scale_log2;
  // Output gate (attention_paged_gated_q8; null otherwise): o = o * sigmoid(gate), gate of head h of
  // token t at gate + t * gate_ts + h * gate_hs, and the q8 activations of o's [n_tokens, H * D] rows.
  const float* gate;
  int64_t gate_hs, gate_ts;
  int8_t* q8;
  float2* q8_ds;
  // The fused decode (attn_decode_kernel; unset otherwise): attention_prep's inputs and outputs
  // (AttnPrepArgs).
  const float* q_in;  // q head h of token t at q_in + t * q_ts + h * q_hs
  int64_t q_hs, q_ts;
  const float* q_norm;
  const float* k_norm;
  float* q_out;        // [n_tokens, H, D]: the normalized, rotated q
  const float* k_in;   // [n_tokens, Hkv, D]
  float* k_out;        // [n_tokens, Hkv, D]: k normalized and rotated (not k_in)
  const float* v_in;   // [n_tokens, Hkv, D]
  int n_rot;
  double log2_base;
  float eps;
};

__device__ __forceinline__ int read_pos(const KParams& p) { return p.d_pos ? *p.d_pos : p.pos0_host; }

// Positions per split for n_kv keys over n_split splits: equal shares rounded up to kBN.
__device__ __forceinline__ int split_len(int n_kv, int n_split) {
  const int per = (n_kv + n_split - 1) / n_split;
  return (per + kBN - 1) / kBN * kBN;
}

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

// Output row of packed row rho of KV head g.
__device__ __forceinline__ int64_t out_row(const KParams& p, int rho, int g) {
  const int t = rho / p.G;
  return static_cast<int64_t>(t) * p.H + g * p.G + (rho - t * p.G);
}

// The output gate of o's element (row, d), row = t * H + h (gate of head h of token t). The gate is
// written by an earlier kernel and read-only here, so its loads may be batched ahead of the stores.
__device__ __forceinline__ float gate_at(const KParams& p, int64_t row, int d) {
  const int64_t t = row / p.H, h = row - t * p.H;
  return __ldg(p.gate + t * p.gate_ts + h * p.gate_hs + d);
}

// Stores o[row][d] = v; with the output gate (its value `gate`, from gate_at), v * sigmoid(gate) and its
// q8 code (the bits of mul_sigmoid then quantize_q8: kern::sigmoidf, and store_q8_block_warp writes
// quantize_q8's codes and scales). Gated: every lane of a warp calls it at once with the 32 dims of one
// block (D % 32 == 0).
template <bool kGatedQ8>
__device__ __forceinline__ void store_o(const KParams& p, int64_t row, int d, float v, float gate) {
  if constexpr (kGatedQ8) {
    v = v * kern::sigmoidf(gate);
    // Element (t, h * D + d) of o's [n_tokens, H * D] rows; d % 32 is the lane (blockDim.x % 32 == 0).
    kern::store_q8_block_warp(v, p.q8, p.q8_ds, row * p.D + d - d % 32);
  }
  p.o[row * p.D + d] = v;
}

// Final rows: o[row][d] = v, gated with q8 codes where p.gate is set (uniform over the launch).
__device__ __forceinline__ void store_final(const KParams& p, int64_t row, int d, float v, float gate) {
  if (p.gate != nullptr) {
    store_o<true>(p, row, d, v, gate);
  } else {
    store_o<false>(p, row, d, v, 0.0f);
  }
}

// Rows [row0, row_end) of KV head g become NaN (an invalid position), as final rows.
__device__ inline void write_nan_rows(const KParams& p, int row0, int row_end, int g) {
  const int n = (row_end - row0) * p.D;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {  // a warp: 32 dims of one row where gated
    const int r = i / p.D, d = i - r * p.D;
    const int64_t row = out_row(p, row0 + r, g);
    store_final(p, row, d, NAN, p.gate != nullptr ? gate_at(p, row, d) : 0.0f);
  }
}

// A CTA with no positions in its split: empty partials (m = -inf, l = 0); with a single split this
// happens only for an invalid position, whose rows become NaN.
__device__ inline void write_empty(const KParams& p, int row0, int row_end, int g, int s) {
  if (p.n_split == 1) {
    write_nan_rows(p, row0, row_end, g);
    return;
  }
  for (int rho = row0 + static_cast<int>(threadIdx.x); rho < row_end; rho += blockDim.x) {
    const int64_t prow = static_cast<int64_t>(s) * p.RT + out_row(p, rho, g);
    p.part_ml[2 * prow] = -INFINITY;
    p.part_ml[2 * prow + 1] = 0.0f;
  }
}

// What CTA (KV head blockIdx.x, row block blockIdx.y, split blockIdx.z) of an attention kernel with BM
// packed rows per CTA attends: rows [row0, row_end) (the row blocks in reverse, so the longest causal
// rows start first) over positions [kv_begin, kv_end) of its split. live is false for a CTA with no
// positions (an invalid position, or a split past what its rows see), which has written its empty
// partials or NaN rows (write_empty) and has nothing left to do.
struct CtaWork {
  bool live;
  int g, s, row0, row_end, pos0, kv_begin, kv_end;
};
// cta_range: the same without writing anything (for use before the dependency wait).
__device__ inline CtaWork cta_range(const KParams& p, int BM) {
  CtaWork w{};
  w.g = blockIdx.x;
  w.s = blockIdx.z;
  w.row0 = (gridDim.y - 1 - blockIdx.y) * BM;
  w.row_end = min(w.row0 + BM, p.R);
  w.pos0 = read_pos(p);
  if (w.pos0 >= 0) {
    const int t_last = (w.row_end - 1) / p.G;
    const int L = split_len(w.pos0 + p.n_tokens, p.n_split);
    w.kv_begin = w.s * L;
    w.kv_end = min(w.pos0 + t_last + 1, w.kv_begin + L);
    w.live = w.kv_begin < w.kv_end;
  }
  return w;
}
__device__ inline CtaWork cta_work(const KParams& p, int BM) {
  const CtaWork w = cta_range(p, BM);
  if (!w.live) write_empty(p, w.row0, w.row_end, w.g, w.s);
  return w;
}

// Merges the KW per-warp partials staged in shared memory (sM / sL [KW][BM], sO [KW][BM][ostride])
// of rows [row0, row_end) and writes the final rows (one split; gated with their q8 codes where p.gate
// is set) or this split's partial. Each row's largest warp maximum M, warp weights 2^(m_k - M) (in
// place of sM; 0 for a warp that saw nothing) and L are computed once, then a thread takes kBatch
// elements at a time, their gate values loaded together. Called by every thread of the CTA; BM <= 64.
__device__ inline void write_rows(const KParams& p, const float* sO, float* sM, const float* sL, int KW, int BM,
                                  int ostride, int row0, int row_end, int g, int s) {
  constexpr int kBatch = 4;
  __shared__ float s_rowM[64], s_rowL[64];
  const int D = p.D;
  const int n = (row_end - row0) * D;
  for (int r = static_cast<int>(threadIdx.x); r < row_end - row0; r += static_cast<int>(blockDim.x)) {
    float M = -INFINITY;
    for (int k = 0; k < KW; ++k) M = fmaxf(M, sM[k * BM + r]);
    float L = 0.0f;
    for (int k = 0; k < KW; ++k) {
      const float lk = sL[k * BM + r];
      float w = 0.0f;
      if (lk > 0.0f) {
        w = exp2f(sM[k * BM + r] - M);
        L += lk * w;
      }
      sM[k * BM + r] = w;
    }
    s_rowM[r] = M;
    s_rowL[r] = L;
  }
  __syncthreads();
  const bool gated = p.n_split == 1 && p.gate != nullptr;
  for (int i0 = threadIdx.x; i0 < n; i0 += kBatch * blockDim.x) {
    float gv[kBatch] = {};
    if (gated) {  // unconditional loads (past n: the last element's), so all kBatch are in flight at once
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int i = min(i0 + u * static_cast<int>(blockDim.x), n - 1);
        const int r = i / D, d = i - r * D;
        gv[u] = gate_at(p, out_row(p, row0 + r, g), d);
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = i0 + u * blockDim.x;
      if (i >= n) break;  // warp-uniform where gated (n % 32 == 0)
      const int r = i / D, d = i - r * D;
      const int64_t row = out_row(p, row0 + r, g);
      float acc = 0.0f;
      for (int k = 0; k < KW; ++k) {
        if (sL[k * BM + r] > 0.0f) acc += sO[(k * BM + r) * ostride + d] * sM[k * BM + r];
      }
      if (p.n_split == 1) {
        store_final(p, row, d, acc / s_rowL[r], gv[u]);
      } else {
        const int64_t prow = static_cast<int64_t>(s) * p.RT + row;
        p.part_o[prow * D + d] = acc;
        if (d == 0) {
          p.part_ml[2 * prow] = s_rowM[r];
          p.part_ml[2 * prow + 1] = s_rowL[r];
        }
      }
    }
  }
}

}  // namespace ds::cuda::attn
