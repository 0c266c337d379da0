// CUDA kernels and launchers of the gated delta rule (ops/delta_net.h): a chunked form for prefill and
// a recurrent form for decode, both following ops/cpu/delta_net.cpp. Host entry: cuda_ops.cpp.
//
// Chunked form, per v-head h and chunk of 64 tokens (local index t, cumulative log decay G_t, chunk
// start state S0 [dk, dv], last token L; tokens past the end are padded with k = q = v = g = beta = 0,
// which leaves every real result unchanged):
//   A  = strict_lower(beta_t e^{G_t-G_s} k_t.k_s),  T = (I + A)^-1,  Tb = T diag(beta)
//   D  = Tb (V - diag(e^G) K S0)                                      [64, dv]
//   O  = scale diag(e^G) Q S0 + QKm D,  QKm = lower(scale e^{G_t-G_s} q_t.k_s)
//   S  = e^{G_L} S0 + sum_s e^{G_L-G_s} k_s D_s^T
// (D solves the CPU form's forward substitution (I + A) D = diag(beta)(V - diag(e^G) K S0).)
// dn_prep_kernel computes Tb, QKm and G for every (chunk, v-head) in parallel (they do not depend on
// the state); dn_scan_kernel walks the chunks of a head in order with the state slice [dk, 32] of its
// dv columns in shared memory: the state's dv columns are independent given Tb, QKm and G.
// Every exponent is <= 0 (G is non-increasing), so exp never overflows; it may underflow to 0.
//
// Recurrent form: dn_recurrent_kernel gives a CTA 32 dv columns of one head with the state slice in
// registers (read and written once per call, 16-byte accesses), so a decode step of nv = 48 heads of
// 128 x 128 runs on 192 CTAs. dn_generic_kernel (one CTA per head, state in device memory) covers
// every other shape.
// v may be a strided view (head and token strides, e.g. the v columns of the conv output rows); every
// other operand is contiguous.
// Non-obvious choice: F32 CUDA-core arithmetic throughout (no tensor cores) to stay within 1e-4 of the
// recurrent reference; the chunk matrices are staged in shared memory with rows padded by 4 floats so
// column-parallel float4 reads are free of bank conflicts.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "ops/cuda/activation.cuh"
#include "ops/cuda/delta_net_launch.h"
#include "ops/cuda/delta_net_prep.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/matvec_q8.cuh"
#include "ops/cuda/norm_warp.cuh"

namespace ds::cuda {
namespace {

constexpr int kChunk = static_cast<int>(kDeltaNetChunk);
constexpr int kBV = 32;             // dv columns per scan / recurrent CTA
constexpr int kPrepThreads = 256;   // 4 threads per column of T in the triangular solve
constexpr int kScanThreads = 256;   // 16 row groups x 16 column pairs
constexpr int kRecThreads = 128;    // 16 row groups x 8 column quads
constexpr int kRecNormGroups = static_cast<int>(kDeltaNetNormQ8MaxDv / kBV);  // column blocks of the fused form
constexpr int kMat = kChunk * kChunk;
constexpr int64_t kScratchPerHead = 2 * kMat + kChunk;  // Tb, QKm, G (floats) per (chunk, v-head)
static_assert(kPrepThreads == 4 * kChunk, "the solve maps 4 threads to each column of T");
static_assert(kScanThreads == 16 * (kBV / 2), "the scan maps 16 row groups x kBV / 2 column pairs");
static_assert(kDeltaNetWindowTokens % kDeltaNetChunk == 0, "windows hold whole chunks");

__device__ __forceinline__ float dot4(const float4 a, const float4 b, float acc) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}

// Stages rows [t0, t0 + 64) of head hk of x [n, nk, DK] into dst[64][DK + 4]; rows past n_in are 0.
template <int DK>
__device__ __forceinline__ void stage_rows(const float* __restrict__ x, float* dst, int t0, int n_in, int nk,
                                           int hk, int tid, int n_threads) {
  constexpr int kVec = DK / 4, kLd = DK + 4;
  for (int idx = tid; idx < kChunk * kVec; idx += n_threads) {
    const int t = idx / kVec, i = (idx % kVec) * 4;
    float4 val = make_float4(0.f, 0.f, 0.f, 0.f);
    if (t < n_in) val = __ldg(reinterpret_cast<const float4*>(x + ((static_cast<int64_t>(t0 + t) * nk + hk) * DK + i)));
    *reinterpret_cast<float4*>(dst + t * kLd + i) = val;
  }
}

// ---- chunked form: prep ----

template <int DK>
struct PrepSmem {
  static constexpr int kLdk = DK + 4;       // K / Q rows
  static constexpr int kLda = kChunk + 1;   // A rows (read along rows as broadcasts)
  static constexpr int kLdt = kChunk + 8;   // T rows: the 4 threads of a column read rows m..m+3
  static constexpr int kKQ = 2 * kChunk * kLdk;
  static constexpr int kAT = kChunk * kLda + kChunk * kLdt;
  static constexpr int kUnion = kKQ > kAT ? kKQ : kAT;  // K, Q, then A, T over them
  static constexpr int kFloats = kUnion + 2 * kChunk;    // + G, beta
};

// grid (chunks of the window, nv). Writes, per (chunk c, head h), scratch[(c * nv + h) * kScratchPerHead]:
// Tb [64][64], QKm [64][64], G [64].
template <int DK>
__global__ void __launch_bounds__(kPrepThreads, 2)
    dn_prep_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ g,
                   const float* __restrict__ beta, float* __restrict__ scratch, int nk, int nv, int n_tokens,
                   float scale) {
  kern::dependency_sync();
  using L = PrepSmem<DK>;
  extern __shared__ __align__(16) float sm[];
  float* Ks = sm;
  float* Qs = sm + kChunk * L::kLdk;
  float* A = sm;                         // after the dot products
  float* T = sm + kChunk * L::kLda;
  float* Gs = sm + L::kUnion;
  float* Bs = Gs + kChunk;
  const int c = blockIdx.x, h = blockIdx.y, hk = h % nk, tid = threadIdx.x;
  const int t0 = c * kChunk, n_in = min(kChunk, n_tokens - t0);

  stage_rows<DK>(k, Ks, t0, n_in, nk, hk, tid, kPrepThreads);
  stage_rows<DK>(q, Qs, t0, n_in, nk, hk, tid, kPrepThreads);
  if (tid < kChunk) {
    const bool in = tid < n_in;
    const int64_t gi = static_cast<int64_t>(t0 + tid) * nv + h;
    Gs[tid] = in ? g[gi] : 0.f;
    Bs[tid] = in ? beta[gi] : 0.f;
  }
  __syncthreads();
  if (tid == 0) {  // G_t = sum_{s<=t} g_s, in token order like the CPU form
    float acc = 0.f;
    for (int t = 0; t < kChunk; ++t) Gs[t] = (acc += Gs[t]);
  }

  // kk = K K^T, qk = Q K^T on a 4 x 4 tile per thread: rows ty + 16a, columns tx + 16b.
  const int tx = tid & 15, ty = tid >> 4;
  float kk[4][4], qk[4][4];
#pragma unroll
  for (int a = 0; a < 4; ++a) {
#pragma unroll
    for (int b = 0; b < 4; ++b) kk[a][b] = qk[a][b] = 0.f;
  }
#pragma unroll 2
  for (int i = 0; i < DK; i += 4) {
    float4 kr[4], qr[4], kc[4];
#pragma unroll
    for (int a = 0; a < 4; ++a) {
      kr[a] = *reinterpret_cast<const float4*>(Ks + (ty + 16 * a) * L::kLdk + i);
      qr[a] = *reinterpret_cast<const float4*>(Qs + (ty + 16 * a) * L::kLdk + i);
      kc[a] = *reinterpret_cast<const float4*>(Ks + (tx + 16 * a) * L::kLdk + i);
    }
#pragma unroll
    for (int a = 0; a < 4; ++a) {
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        kk[a][b] = dot4(kr[a], kc[b], kk[a][b]);
        qk[a][b] = dot4(qr[a], kc[b], qk[a][b]);
      }
    }
  }
  __syncthreads();  // K and Q reads done (A, T overwrite them); G complete

  float* out = scratch + (static_cast<int64_t>(c) * nv + h) * kScratchPerHead;
  float* out_tb = out;
  float* out_qk = out + kMat;
  float* out_g = out + 2 * kMat;
#pragma unroll
  for (int a = 0; a < 4; ++a) {
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int t = ty + 16 * a, s = tx + 16 * b;
      const float e = s <= t ? expf(Gs[t] - Gs[s]) : 0.f;  // only exponents <= 0
      A[t * L::kLda + s] = s < t ? Bs[t] * e * kk[a][b] : 0.f;
      out_qk[t * kChunk + s] = s <= t ? scale * e * qk[a][b] : 0.f;
    }
  }
  if (tid < kChunk) out_g[tid] = Gs[tid];
  __syncthreads();

  // T = (I + A)^-1 by forward substitution, row by row: T[i][:] = e_i - sum_{m<i} A[i][m] T[m][:].
  // Column j belongs to the 4 lanes 4j..4j+3 of one warp, which split the sum over m.
  {
    const int j = tid >> 2, sub = tid & 3;
    for (int i = 0; i < kChunk; ++i) {
      float acc = 0.f;
      for (int m = sub; m < i; m += 4) acc = fmaf(A[i * L::kLda + m], T[m * L::kLdt + j], acc);
      acc += __shfl_xor_sync(0xffffffffu, acc, 1);
      acc += __shfl_xor_sync(0xffffffffu, acc, 2);
      if (sub == 0) T[i * L::kLdt + j] = i == j ? 1.f : (i < j ? 0.f : -acc);
      __syncwarp();
    }
  }
  __syncthreads();
  for (int idx = tid; idx < kMat; idx += kPrepThreads) {
    const int t = idx / kChunk, s = idx % kChunk;
    out_tb[idx] = T[t * L::kLdt + s] * Bs[s];
  }
}

// ---- chunked form: scan ----

template <int DK>
struct ScanSmem {
  static constexpr int kLdk = DK + 4;
  static constexpr int kLdm = kChunk + 4;    // M rows: the two rows a warp reads sit in different banks
  static constexpr int kS = DK * kBV;        // state slice [DK][32]
  static constexpr int kK = kChunk * kLdk;   // K or Q chunk
  static constexpr int kM = kChunk * kLdm;   // Tb, then QKm
  static constexpr int kX = kChunk * kBV;    // V, then V - e^G K S0, then D
  static constexpr int kFloats = kS + 2 * kK + kM + kX + 2 * kChunk;  // + e^G, e^{G_L - G}
};

__device__ __forceinline__ float2 lds2(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ float4 lds4(const float* p) { return *reinterpret_cast<const float4*>(p); }

// acc[0..1] += a (row vector of 4) . [b0; b1; b2; b3] (4 rows of 2 columns).
__device__ __forceinline__ void fma_4x2(const float4 a, const float2 b0, const float2 b1, const float2 b2,
                                        const float2 b3, float* acc) {
  acc[0] = fmaf(a.x, b0.x, acc[0]);
  acc[1] = fmaf(a.x, b0.y, acc[1]);
  acc[0] = fmaf(a.y, b1.x, acc[0]);
  acc[1] = fmaf(a.y, b1.y, acc[1]);
  acc[0] = fmaf(a.z, b2.x, acc[0]);
  acc[1] = fmaf(a.z, b2.y, acc[1]);
  acc[0] = fmaf(a.w, b3.x, acc[0]);
  acc[1] = fmaf(a.w, b3.y, acc[1]);
}

// grid (dv / 32, nv); CTA (jb, h) owns state columns [32 jb, 32 jb + 32) of head h for the window.
// Thread (ty, tx) = (tid / 16, tid % 16) owns columns 2tx, 2tx + 1 of the slice: rows ty + 16r (r < 4)
// of the chunk products and state rows [ty DK/16, (ty + 1) DK/16) of the state update.
template <int DK>
__global__ void __launch_bounds__(kScanThreads, 2)
    dn_scan_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                   const float* __restrict__ scratch, float* __restrict__ state, float* __restrict__ out, int nk,
                   int nv, int dv, int n_tokens, float scale, int64_t v_hs, int64_t v_ts) {
  kern::dependency_sync();
  using L = ScanSmem<DK>;
  constexpr int kRowsUpd = DK / 16;
  static_assert(kRowsUpd % 2 == 0, "state-update rows are read in pairs");
  extern __shared__ __align__(16) float sm[];
  float* Ss = sm;
  float* Ks = Ss + L::kS;
  float* Qs = Ks + L::kK;
  float* M = Qs + L::kK;
  float* X = M + L::kM;
  float* Eg = X + L::kX;
  float* Wl = Eg + kChunk;
  const int jb = blockIdx.x, h = blockIdx.y, hk = h % nk, tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  const int j0 = jb * kBV, jc = 2 * tx;  // this thread's columns in the slice: jc, jc + 1
  float* Sg = state + static_cast<int64_t>(h) * DK * dv + j0;
  for (int idx = tid; idx < DK * kBV; idx += kScanThreads) {
    Ss[idx] = Sg[static_cast<int64_t>(idx / kBV) * dv + idx % kBV];
  }

  const int n_chunks = (n_tokens + kChunk - 1) / kChunk;
  for (int c = 0; c < n_chunks; ++c) {
    const int t0 = c * kChunk, n_in = min(kChunk, n_tokens - t0);
    const float* sc = scratch + (static_cast<int64_t>(c) * nv + h) * kScratchPerHead;
    __syncthreads();  // the previous chunk is done with Ks, Qs, M, X (and the state load is visible)
    stage_rows<DK>(k, Ks, t0, n_in, nk, hk, tid, kScanThreads);
    stage_rows<DK>(q, Qs, t0, n_in, nk, hk, tid, kScanThreads);
    for (int idx = tid; idx < kChunk * kBV; idx += kScanThreads) {
      const int t = idx / kBV, jj = idx % kBV;
      X[idx] = t < n_in ? __ldg(v + static_cast<int64_t>(t0 + t) * v_ts + static_cast<int64_t>(h) * v_hs + j0 + jj)
                        : 0.f;
    }
    for (int idx = tid; idx < kMat / 4; idx += kScanThreads) {  // Tb [64][64] -> M [64][kLdm]
      *reinterpret_cast<float4*>(M + (idx / 16) * L::kLdm + (idx % 16) * 4) =
          __ldg(reinterpret_cast<const float4*>(sc) + idx);
    }
    if (tid < kChunk) {
      const float G = sc[2 * kMat + tid], G_last = sc[2 * kMat + kChunk - 1];
      Eg[tid] = expf(G);
      Wl[tid] = expf(G_last - G);
    }
    __syncthreads();

    // K S0 and Q S0 for this thread's rows and columns; X = V - e^G K S0 (D's right-hand side before Tb).
    float ak[4][2], o[4][2];
#pragma unroll
    for (int r = 0; r < 4; ++r) ak[r][0] = ak[r][1] = o[r][0] = o[r][1] = 0.f;
#pragma unroll 2
    for (int i = 0; i < DK; i += 4) {
      const float2 s0 = lds2(Ss + i * kBV + jc), s1 = lds2(Ss + (i + 1) * kBV + jc);
      const float2 s2 = lds2(Ss + (i + 2) * kBV + jc), s3 = lds2(Ss + (i + 3) * kBV + jc);
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int t = ty + 16 * r;
        fma_4x2(lds4(Ks + t * L::kLdk + i), s0, s1, s2, s3, ak[r]);
        fma_4x2(lds4(Qs + t * L::kLdk + i), s0, s1, s2, s3, o[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int t = ty + 16 * r;
      const float eg = Eg[t];
      X[t * kBV + jc] -= eg * ak[r][0];
      X[t * kBV + jc + 1] -= eg * ak[r][1];
      o[r][0] *= scale * eg;
      o[r][1] *= scale * eg;
    }
    __syncthreads();

    // D = Tb X (M holds Tb).
    float d[4][2];
#pragma unroll
    for (int r = 0; r < 4; ++r) d[r][0] = d[r][1] = 0.f;
#pragma unroll 2
    for (int s = 0; s < kChunk; s += 4) {
      const float2 x0 = lds2(X + s * kBV + jc), x1 = lds2(X + (s + 1) * kBV + jc);
      const float2 x2 = lds2(X + (s + 2) * kBV + jc), x3 = lds2(X + (s + 3) * kBV + jc);
#pragma unroll
      for (int r = 0; r < 4; ++r) fma_4x2(lds4(M + (ty + 16 * r) * L::kLdm + s), x0, x1, x2, x3, d[r]);
    }
    __syncthreads();  // every read of X and M is done
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      X[(ty + 16 * r) * kBV + jc] = d[r][0];
      X[(ty + 16 * r) * kBV + jc + 1] = d[r][1];
    }
    for (int idx = tid; idx < kMat / 4; idx += kScanThreads) {  // QKm -> M
      *reinterpret_cast<float4*>(M + (idx / 16) * L::kLdm + (idx % 16) * 4) =
          __ldg(reinterpret_cast<const float4*>(sc + kMat) + idx);
    }
    __syncthreads();

    // O = scale e^G Q S0 + QKm D (M holds QKm, X holds D).
#pragma unroll 2
    for (int s = 0; s < kChunk; s += 4) {
      const float2 x0 = lds2(X + s * kBV + jc), x1 = lds2(X + (s + 1) * kBV + jc);
      const float2 x2 = lds2(X + (s + 2) * kBV + jc), x3 = lds2(X + (s + 3) * kBV + jc);
#pragma unroll
      for (int r = 0; r < 4; ++r) fma_4x2(lds4(M + (ty + 16 * r) * L::kLdm + s), x0, x1, x2, x3, o[r]);
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int t = ty + 16 * r;
      if (t < n_in) {
        float* dst = out + (static_cast<int64_t>(t0 + t) * nv + h) * dv + j0 + jc;
        dst[0] = o[r][0];
        dst[1] = o[r][1];
      }
    }

    // S = e^{G_L} S0 + sum_s K[s]^T (e^{G_L - G_s} D[s]); this thread's rows and columns only.
    const int i0 = ty * kRowsUpd;
    const float eg_last = Eg[kChunk - 1];
    float acc[kRowsUpd][2];
#pragma unroll
    for (int m = 0; m < kRowsUpd; ++m) {
      const float2 s2 = lds2(Ss + (i0 + m) * kBV + jc);
      acc[m][0] = eg_last * s2.x;
      acc[m][1] = eg_last * s2.y;
    }
#pragma unroll 4
    for (int s = 0; s < kChunk; ++s) {
      const float w = Wl[s];
      const float2 x = lds2(X + s * kBV + jc);
      const float d0 = w * x.x, d1 = w * x.y;
#pragma unroll
      for (int m = 0; m < kRowsUpd; m += 2) {
        const float2 k2 = lds2(Ks + s * L::kLdk + i0 + m);
        acc[m][0] = fmaf(k2.x, d0, acc[m][0]);
        acc[m][1] = fmaf(k2.x, d1, acc[m][1]);
        acc[m + 1][0] = fmaf(k2.y, d0, acc[m + 1][0]);
        acc[m + 1][1] = fmaf(k2.y, d1, acc[m + 1][1]);
      }
    }
#pragma unroll
    for (int m = 0; m < kRowsUpd; ++m) {
      *reinterpret_cast<float2*>(Ss + (i0 + m) * kBV + jc) = make_float2(acc[m][0], acc[m][1]);
    }
  }
  __syncthreads();
  for (int idx = tid; idx < DK * kBV; idx += kScanThreads) {
    Sg[static_cast<int64_t>(idx / kBV) * dv + idx % kBV] = Ss[idx];
  }
}

// ---- recurrent form ----

__device__ __forceinline__ float4 f4_add(float4 a, float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}
// Sums over the 4 row groups of a warp (lanes l, l ^ 8, l ^ 16, l ^ 24 share a column quad).
__device__ __forceinline__ float4 reduce_row_groups(float4 p) {
#pragma unroll
  for (int off = 8; off < 32; off <<= 1) {
    p.x += __shfl_xor_sync(0xffffffffu, p.x, off);
    p.y += __shfl_xor_sync(0xffffffffu, p.y, off);
    p.z += __shfl_xor_sync(0xffffffffu, p.z, off);
    p.w += __shfl_xor_sync(0xffffffffu, p.w, off);
  }
  return p;
}

// The gated output norm of one (token, v-head) row o[0, dv) in shared memory, by one warp, with
// norm_kernel's arithmetic for a row of at most 256 (kern::warp_row_rms_inv) and its q8 output: the bits
// of rms_norm_gated_q8 on that row.
__device__ void gated_norm_q8_row(const float* o, const DeltaNetNormQ8& nq, int dv, int64_t row) {
  constexpr int kPer = kern::kWarpRowPer;
  const int lane = threadIdx.x % 32;
  const float* zr = nq.z + row * dv;
  float v[kPer], wv[kPer], gv[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = lane + 32 * j;
    const bool in = i < dv;
    v[j] = in ? o[i] : 0.0f;
    wv[j] = in ? nq.w[i] : 1.0f;
    gv[j] = in ? zr[i] : 0.0f;
  }
  const float inv = kern::warp_row_rms_inv(v, dv, nq.eps);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = lane + 32 * j;
    if (32 * j >= dv) break;  // warp-uniform: dv % 32 == 0
    const float y = gv[j] * kern::sigmoidf(gv[j]) * (v[j] * inv * wv[j]);  // as norm_kernel's gated()
    nq.y[row * dv + i] = y;
    kern::store_q8_block_warp(y, nq.q8, nq.q8_ds, row * dv + 32 * j);
  }
}

// The prologue of a one-token step (kStepQ8 below) for thread `tid` of a CTA of at least 2 DK + dv
// threads: threads [0, DK) are the channels of q head hk, [DK, 2 DK) those of k head hk, the next dv
// those of v head h; the rest idle. Split in the loads that precede the dependency wait (the taps and
// the carried inputs: no kernel before the step writes them) and the arithmetic after it.
struct StepChannel {
  int64_t c = -1;  // conv channel, -1 for an idle thread
  float taps[kConvMaxKernel], win[kConvMaxKernel];
};
template <int DK>
__device__ __forceinline__ StepChannel step_channel_load(const DeltaNetPrepArgs& p, int tid, int hk, int h, int dv) {
  StepChannel ch;
  if (tid < 2 * DK) ch.c = (tid < DK ? 0 : p.nk * DK) + static_cast<int64_t>(hk) * DK + tid % DK;
  else if (tid < 2 * DK + dv) ch.c = 2 * p.nk * DK + static_cast<int64_t>(h) * dv + (tid - 2 * DK);
#pragma unroll
  for (int i = 0; i < kConvMaxKernel; ++i) {
    ch.taps[i] = ch.c >= 0 && i < p.kernel ? p.conv_w[ch.c * p.kernel + i] : 0.0f;
    ch.win[i] = ch.c >= 0 && i < p.kernel - 1 ? p.conv_state[i * p.n_ch + ch.c] : 0.0f;
  }
  return ch;
}
// The carried inputs after this token: the last kernel - 1 of (win ++ cur), as prep_conv_channel.
__device__ __forceinline__ void step_channel_store_state(const DeltaNetPrepArgs& p, const StepChannel& ch, float cur) {
#pragma unroll
  for (int i = 0; i + 1 < kConvMaxKernel; ++i) {
    if (i < p.kernel - 2) p.conv_state[i * p.n_ch + ch.c] = ch.win[i + 1];
    else if (i == p.kernel - 2) p.conv_state[i * p.n_ch + ch.c] = cur;
  }
}

// grid (dv / 32, nv). Thread (rg, cq) = (tid / 8, tid % 8) holds state rows rg + 16m (m < DK/16) of
// columns [32 blockIdx.x + 4cq, +4) in registers for all n_tokens.
// kNormQ8 (the fused output norm): grid (1, nv), dv / 32 groups of kRecThreads, group b in the place of
// CTA b above (same arithmetic, so the same o); then each token's o row, staged in shared memory, goes
// through gated_norm_q8_row in warp 0.
// kStepQ8 (one token, delta_net_prep fused in front of kNormQ8): clusters of r = nv / nk CTAs, CTA
// (cluster c, rank i) taking v-head i nk + c, so a cluster shares q/k head c. Before the dependency wait
// a CTA loads its state, the conv taps and the carried conv inputs of its channels; after it each CTA
// runs the prologue of its q/k head (all r the same, so nothing crosses CTAs) and v head with
// delta_net_prep_kernel's arithmetic into shared memory. Rank 0 writes the q/k outputs and, after the
// cluster barrier (every CTA has read the carried inputs by then), their new carried inputs.
enum class RecForm { kPlain, kNormQ8, kStepQ8 };
template <int DK, RecForm kForm>
__global__ void __launch_bounds__(kForm == RecForm::kPlain ? kRecThreads : kRecThreads * kRecNormGroups)
    dn_recurrent_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                        const float* __restrict__ g, const float* __restrict__ beta, float* __restrict__ state,
                        float* __restrict__ out, int nk, int nv, int dv, int64_t n_tokens, float scale, int64_t v_hs,
                        int64_t v_ts, DeltaNetNormQ8 nq, DeltaNetPrepArgs sp) {
  constexpr bool kNormQ8 = kForm != RecForm::kPlain;
  constexpr bool kStep = kForm == RecForm::kStepQ8;
  constexpr int kRows = DK / 16;
  constexpr int kWarps = kRecThreads / 32;
  constexpr int kGroups = kNormQ8 ? kRecNormGroups : 1;
  __shared__ float qs[DK], ks[DK];
  __shared__ float4 red_k[kGroups][kWarps][8], red_o[kGroups][kWarps][8];
  __shared__ float o_row[kNormQ8 ? kBV * kRecNormGroups : 1];
  __shared__ __align__(16) float vs[kStep ? kBV * kRecNormGroups : 1];  // the step's v row
  __shared__ float qk_part[kStep ? 2 * 32 : 1];                         // its q / k sums of squares
  __shared__ float step_gate[2];                                        // its decay, beta
  const int grp = kNormQ8 ? static_cast<int>(threadIdx.x) / kRecThreads : 0;
  const int tid = static_cast<int>(threadIdx.x) % kRecThreads, cq = tid & 7, rg = tid >> 3, lane = tid & 31,
            warp = tid >> 5;
  const int r = kStep ? nv / nk : 1, rank = kStep ? static_cast<int>(blockIdx.y) % r : 0;
  const int hk = kStep ? static_cast<int>(blockIdx.y) / r : static_cast<int>(blockIdx.y) % nk;
  const int h = kStep ? rank * nk + hk : static_cast<int>(blockIdx.y);
  const int j = (kNormQ8 ? grp : static_cast<int>(blockIdx.x)) * kBV + cq * 4;
  float* Sg = state + static_cast<int64_t>(h) * DK * dv + j;
  float4 st[kRows];
  StepChannel ch;
  float cur = 0.0f;
  if constexpr (kStep) {
    // Read before the wait: the state, and the conv taps and carried inputs (no earlier kernel in flight
    // writes them: the step follows its input products).
#pragma unroll
    for (int m = 0; m < kRows; ++m) {
      st[m] = *reinterpret_cast<const float4*>(Sg + static_cast<int64_t>(rg + 16 * m) * dv);
    }
    const int ctid = static_cast<int>(threadIdx.x);
    ch = step_channel_load<DK>(sp, ctid, hk, h, dv);
    const float dt_bias = ctid == 0 ? sp.dt_bias[h] : 0.0f, ssm_a = ctid == 0 ? sp.ssm_a[h] : 0.0f;
    kern::cluster_arrive();  // this CTA's reads of the carried inputs are done
    kern::dependency_sync();
    if (ch.c >= 0) {
      cur = sp.mixed[ch.c];
      const float y = kern::conv_out(ch.taps, ch.win, cur, sp.kernel, true);
      if (ctid < 2 * DK) {
        (ctid < DK ? qs : ks)[ctid % DK] = y;  // raw; normalized below
        if (rank == 0) sp.conv[ch.c] = y;
      } else {
        vs[ctid - 2 * DK] = y;
        sp.conv[ch.c] = y;
        step_channel_store_state(sp, ch, cur);  // a v channel belongs to this CTA alone
      }
    }
    if (ctid == 0) {
      const kern::DeltaNetGate gt = kern::gate_of(sp.alpha[h], sp.b[h], dt_bias, ssm_a);
      sp.g[h] = gt.g;
      sp.beta[h] = gt.beta;
      step_gate[0] = expf(gt.g);
      step_gate[1] = gt.beta;
    }
    __syncthreads();
    // The q / k L2 norms: block_sum (ops_kernels.cu) over delta_net_prep_threads(DK) threads, emulated
    // warp part by warp part (zeros past DK), the parts added in warp order.
    constexpr int kPartWarps = (DK + 31) / 32 < 4 ? 4 : (DK + 31) / 32;
    const int cwarp = ctid / 32, n_warps = static_cast<int>(blockDim.x) / 32;
    for (int w = cwarp; w < 2 * kPartWarps; w += n_warps) {
      const int i = 32 * (w % kPartWarps) + lane;
      const float y = i < DK ? (w < kPartWarps ? qs : ks)[i] : 0.0f;
      float ss = y * y;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, o);
      if (lane == 0) qk_part[w] = ss;
    }
    __syncthreads();
    if (ctid < 2 * DK) {
      const int base = ctid < DK ? 0 : kPartWarps;
      float ss = 0.0f;
      for (int w = 0; w < kPartWarps; ++w) ss += qk_part[base + w];
      float* row = ctid < DK ? qs : ks;
      const float y = row[ctid % DK] * rsqrtf(ss + sp.eps);
      row[ctid % DK] = y;
      if (rank == 0) (ctid < DK ? sp.q : sp.k)[static_cast<int64_t>(hk) * DK + ctid % DK] = y;
    }
    kern::timeline_mark(0);  // the prologue: conv, gates, q / k norms
  } else {
    kern::dependency_sync();
#pragma unroll
    for (int m = 0; m < kRows; ++m) {
      st[m] = *reinterpret_cast<const float4*>(Sg + static_cast<int64_t>(rg + 16 * m) * dv);
    }
  }

  for (int64_t t = 0; t < n_tokens; ++t) {
    __syncthreads();  // the previous token is done with qs, ks, red_k, o_row (kStep: the prologue is done)
    if constexpr (!kStep) {
      for (int i = static_cast<int>(threadIdx.x); i < DK; i += static_cast<int>(blockDim.x)) {
        qs[i] = q[(t * nk + hk) * DK + i];
        ks[i] = k[(t * nk + hk) * DK + i];
      }
      __syncthreads();
    }
    const float decay = kStep ? step_gate[0] : expf(g[t * nv + h]), bt = kStep ? step_gate[1] : beta[t * nv + h];
    float4 p = make_float4(0.f, 0.f, 0.f, 0.f);  // partial S_old^T k
#pragma unroll
    for (int m = 0; m < kRows; ++m) {
      const float ki = ks[rg + 16 * m];
      p.x = fmaf(st[m].x, ki, p.x);
      p.y = fmaf(st[m].y, ki, p.y);
      p.z = fmaf(st[m].z, ki, p.z);
      p.w = fmaf(st[m].w, ki, p.w);
    }
    p = reduce_row_groups(p);
    if (lane < 8) red_k[grp][warp][cq] = p;
    __syncthreads();
    float4 kv = red_k[grp][0][cq];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) kv = f4_add(kv, red_k[grp][w][cq]);
    const int64_t row = (t * nv + h) * dv + j;
    const float4 vt = kStep ? *reinterpret_cast<const float4*>(vs + j)
                            : *reinterpret_cast<const float4*>(v + t * v_ts + h * v_hs + j);
    const float4 d = make_float4(bt * (vt.x - decay * kv.x), bt * (vt.y - decay * kv.y),
                                 bt * (vt.z - decay * kv.z), bt * (vt.w - decay * kv.w));
    float4 po = make_float4(0.f, 0.f, 0.f, 0.f);  // partial S_new^T q
#pragma unroll
    for (int m = 0; m < kRows; ++m) {
      const float ki = ks[rg + 16 * m], qi = qs[rg + 16 * m];
      st[m].x = fmaf(ki, d.x, decay * st[m].x);
      st[m].y = fmaf(ki, d.y, decay * st[m].y);
      st[m].z = fmaf(ki, d.z, decay * st[m].z);
      st[m].w = fmaf(ki, d.w, decay * st[m].w);
      po.x = fmaf(st[m].x, qi, po.x);
      po.y = fmaf(st[m].y, qi, po.y);
      po.z = fmaf(st[m].z, qi, po.z);
      po.w = fmaf(st[m].w, qi, po.w);
    }
    po = reduce_row_groups(po);
    if (lane < 8) red_o[grp][warp][cq] = po;
    __syncthreads();
    if (rg == 0) {
      float4 o = red_o[grp][0][cq];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) o = f4_add(o, red_o[grp][w][cq]);
      const float4 os = make_float4(o.x * scale, o.y * scale, o.z * scale, o.w * scale);
      *reinterpret_cast<float4*>(out + row) = os;
      if constexpr (kNormQ8) *reinterpret_cast<float4*>(o_row + j) = os;
    }
    if constexpr (kNormQ8) {
      __syncthreads();
      if (threadIdx.x < 32) gated_norm_q8_row(o_row, nq, dv, t * nv + h);
    }
  }
  kern::timeline_mark(1);  // the recurrence and the output norm
#pragma unroll
  for (int m = 0; m < kRows; ++m) *reinterpret_cast<float4*>(Sg + static_cast<int64_t>(rg + 16 * m) * dv) = st[m];
  if constexpr (kStep) {
    kern::cluster_wait();  // every CTA of the cluster has read the q/k head's carried inputs
    if (rank == 0 && static_cast<int>(threadIdx.x) < 2 * DK) step_channel_store_state(sp, ch, cur);
  }
  kern::timeline_mark(2);  // the state stored, the cluster barrier passed
}

// Any shape: CTA h = v-head; thread j = column j of the head's state S[dk][dv] in device memory.
__global__ void dn_generic_kernel(const float* q, const float* k, const float* v, const float* g,
                                  const float* beta, float* state, float* out, int64_t dk, int64_t nk, int64_t dv,
                                  int64_t nv, int64_t n_tokens, int64_t v_hs, int64_t v_ts) {
  kern::dependency_sync();
  extern __shared__ float qk[];  // [2 * dk]: q then k of the current token
  const int64_t h = blockIdx.x, hk = h % nk;
  float* S = state + h * dk * dv;
  const float scale = rsqrtf(static_cast<float>(dk));
  for (int64_t t = 0; t < n_tokens; ++t) {
    __syncthreads();
    for (int64_t i = threadIdx.x; i < dk; i += blockDim.x) {
      qk[i] = q[(t * nk + hk) * dk + i];
      qk[dk + i] = k[(t * nk + hk) * dk + i];
    }
    __syncthreads();
    const float decay = expf(g[t * nv + h]), bt = beta[t * nv + h];
    for (int64_t j = threadIdx.x; j < dv; j += blockDim.x) {
      float kv = 0.0f;
      for (int64_t i = 0; i < dk; ++i) {
        const float s = S[i * dv + j] * decay;
        S[i * dv + j] = s;
        kv = fmaf(s, qk[dk + i], kv);
      }
      const float d = bt * (v[t * v_ts + h * v_hs + j] - kv);
      float o = 0.0f;
      for (int64_t i = 0; i < dk; ++i) {
        const float s = fmaf(qk[dk + i], d, S[i * dv + j]);
        S[i * dv + j] = s;
        o = fmaf(s, qk[i], o);
      }
      out[(t * nv + h) * dv + j] = o * scale;
    }
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
// v's strides in elements (0 in the args = contiguous).
int64_t v_head_stride(const DeltaNetArgs& a) { return a.v_head_stride > 0 ? a.v_head_stride : a.dv; }
int64_t v_token_stride(const DeltaNetArgs& a) { return a.v_token_stride > 0 ? a.v_token_stride : a.nv * a.dv; }

template <int DK>
cudaError_t recurrent_fast(const DeltaNetArgs& a, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(a.dv / kBV), static_cast<unsigned>(a.nv));
  return launch_kernel(dn_recurrent_kernel<DK, RecForm::kPlain>, grid, kRecThreads, 0, s, a.q, a.k, a.v, a.g,
                       a.beta, a.state, a.out, static_cast<int>(a.nk), static_cast<int>(a.nv), static_cast<int>(a.dv),
                       a.n_tokens, 1.0f / sqrtf(static_cast<float>(DK)), v_head_stride(a), v_token_stride(a),
                       DeltaNetNormQ8{}, DeltaNetPrepArgs{});
}

template <int DK>
cudaError_t recurrent_norm_q8(const DeltaNetArgs& a, const DeltaNetNormQ8& nq, cudaStream_t s) {
  const dim3 grid(1, static_cast<unsigned>(a.nv));
  return launch_kernel(dn_recurrent_kernel<DK, RecForm::kNormQ8>, grid,
                       static_cast<unsigned>(kRecThreads * (a.dv / kBV)), 0, s, a.q, a.k, a.v, a.g, a.beta, a.state,
                       a.out, static_cast<int>(a.nk), static_cast<int>(a.nv), static_cast<int>(a.dv), a.n_tokens,
                       1.0f / sqrtf(static_cast<float>(DK)), v_head_stride(a), v_token_stride(a), nq,
                       DeltaNetPrepArgs{});
}

template <int DK>
cudaError_t step_q8(const DeltaNetPrepArgs& p, const DeltaNetArgs& a, const DeltaNetNormQ8& nq, cudaStream_t s) {
  const unsigned r = static_cast<unsigned>(a.nv / a.nk);
  return launch_kernel_cluster(dn_recurrent_kernel<DK, RecForm::kStepQ8>, dim3(1, static_cast<unsigned>(a.nv)),
                               dim3(1, r), static_cast<unsigned>(kRecThreads * (a.dv / kBV)), 0, s, a.q, a.k, a.v,
                               a.g, a.beta, a.state, a.out, static_cast<int>(a.nk), static_cast<int>(a.nv),
                               static_cast<int>(a.dv), int64_t{1}, 1.0f / sqrtf(static_cast<float>(DK)), int64_t{0},
                               int64_t{0}, nq, p);
}

// The dynamic shared memory the chunked form needs: the larger of its two kernels'.
template <int DK>
constexpr size_t chunked_smem_bytes() {
  return sizeof(float) * std::max(PrepSmem<DK>::kFloats, ScanSmem<DK>::kFloats);
}

template <int DK>
cudaError_t chunked(const DeltaNetArgs& a, float* scratch, cudaStream_t s) {
  const size_t prep_smem = sizeof(float) * PrepSmem<DK>::kFloats;
  const size_t scan_smem = sizeof(float) * ScanSmem<DK>::kFloats;
  cudaError_t e = cudaFuncSetAttribute(dn_prep_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(prep_smem));
  if (e != cudaSuccess) return e;
  e = cudaFuncSetAttribute(dn_scan_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(scan_smem));
  if (e != cudaSuccess) return e;
  const float scale = 1.0f / sqrtf(static_cast<float>(DK));
  for (int64_t t0 = 0; t0 < a.n_tokens; t0 += kDeltaNetWindowTokens) {
    const int n = static_cast<int>(std::min(kDeltaNetWindowTokens, a.n_tokens - t0));
    const unsigned n_chunks = static_cast<unsigned>((n + kChunk - 1) / kChunk);
    const float* q = a.q + t0 * a.nk * DK;
    const float* k = a.k + t0 * a.nk * DK;
    const int nk = static_cast<int>(a.nk), nv = static_cast<int>(a.nv), dv = static_cast<int>(a.dv);
    launch_kernel(dn_prep_kernel<DK>, dim3(n_chunks, static_cast<unsigned>(nv)), kPrepThreads, prep_smem, s, q, k,
                  a.g + t0 * a.nv, a.beta + t0 * a.nv, scratch, nk, nv, n, scale);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    launch_kernel(dn_scan_kernel<DK>, dim3(static_cast<unsigned>(dv / kBV), static_cast<unsigned>(nv)), kScanThreads,
                  scan_smem, s, q, k, a.v + t0 * v_token_stride(a), scratch, a.state, a.out + t0 * a.nv * a.dv, nk, nv,
                  dv, n, scale, v_head_stride(a), v_token_stride(a));
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace

bool delta_net_recurrent_fast(const DeltaNetArgs& a) {
  const bool dk_ok = a.dk == 32 || a.dk == 64 || a.dk == 128 || a.dk == 256;
  return dk_ok && a.dv % kBV == 0 && a.nv <= kDeltaNetMaxHeads && aligned16(a.state) && aligned16(a.v) &&
         aligned16(a.out) && v_head_stride(a) % 4 == 0 && v_token_stride(a) % 4 == 0;
}

bool delta_net_chunked_ok(const DeltaNetArgs& a) {
  size_t smem = 0;  // the larger of the two kernels' staging
  switch (a.dk) {
    case 32: smem = chunked_smem_bytes<32>(); break;
    case 64: smem = chunked_smem_bytes<64>(); break;
    case 128: smem = chunked_smem_bytes<128>(); break;
    default: return false;
  }
  const long long limit = smem_optin_limit();  // dk 128 needs 110 KB: not on the 99 KB of sm_86 / sm_89
  return (limit == 0 || smem <= static_cast<size_t>(limit)) && a.dv % kBV == 0 && a.nv <= kDeltaNetMaxHeads &&
         aligned16(a.q) && aligned16(a.k);
}

int64_t delta_net_chunked_scratch_bytes(const DeltaNetArgs& a) {
  const int64_t window = std::min(a.n_tokens, kDeltaNetWindowTokens);
  const int64_t n_chunks = (window + kDeltaNetChunk - 1) / kDeltaNetChunk;
  return static_cast<int64_t>(sizeof(float)) * n_chunks * a.nv * kScratchPerHead;
}

cudaError_t delta_net_recurrent_launch(const DeltaNetArgs& a, cudaStream_t s) {
  if (a.n_tokens <= 0) return cudaSuccess;
  if (a.nv > kDeltaNetMaxHeads) return cudaErrorInvalidValue;
  if (delta_net_recurrent_fast(a)) {
    switch (a.dk) {
      case 32: return recurrent_fast<32>(a, s);
      case 64: return recurrent_fast<64>(a, s);
      case 128: return recurrent_fast<128>(a, s);
      case 256: return recurrent_fast<256>(a, s);
      default: break;
    }
  }
  if (a.dk > kDeltaNetGenericMaxDk) return cudaErrorInvalidValue;
  const int threads = static_cast<int>(std::min<int64_t>(1024, (a.dv + 31) / 32 * 32));
  const size_t smem = static_cast<size_t>(2 * a.dk) * sizeof(float);
  return launch_kernel(dn_generic_kernel, static_cast<unsigned>(a.nv), threads, smem, s, a.q, a.k, a.v, a.g, a.beta,
                       a.state, a.out, a.dk, a.nk, a.dv, a.nv, a.n_tokens, v_head_stride(a), v_token_stride(a));
}

cudaError_t delta_net_chunked_launch(const DeltaNetArgs& a, float* scratch, cudaStream_t s) {
  if (a.n_tokens <= 0) return cudaSuccess;
  if (!delta_net_chunked_ok(a) || !aligned16(scratch)) return cudaErrorInvalidValue;
  switch (a.dk) {
    case 32: return chunked<32>(a, scratch, s);
    case 64: return chunked<64>(a, scratch, s);
    case 128: return chunked<128>(a, scratch, s);
    default: return cudaErrorInvalidValue;
  }
}

bool delta_net_norm_q8_fused(const DeltaNetArgs& a) {
  return delta_net_recurrent_fast(a) && a.dk <= 128 && a.dv <= kDeltaNetNormQ8MaxDv;
}

cudaError_t delta_net_norm_q8_launch(const DeltaNetArgs& a, const DeltaNetNormQ8& nq, cudaStream_t s) {
  if (a.n_tokens <= 0) return cudaSuccess;
  if (!delta_net_norm_q8_fused(a) || nq.w == nullptr || nq.z == nullptr || nq.y == nullptr || nq.q8 == nullptr ||
      nq.q8_ds == nullptr) {
    return cudaErrorInvalidValue;
  }
  switch (a.dk) {
    case 32: return recurrent_norm_q8<32>(a, nq, s);
    case 64: return recurrent_norm_q8<64>(a, nq, s);
    case 128: return recurrent_norm_q8<128>(a, nq, s);
    default: return cudaErrorInvalidValue;
  }
}

bool delta_net_step_q8_fits(const DeltaNetPrepArgs& p, const DeltaNetArgs& a) {
  if (a.n_tokens != 1 || !delta_net_norm_q8_fused(a) || a.nk < 1 || a.nv % a.nk != 0) return false;
  if (a.nv / a.nk > kDeltaNetStepMaxCluster || kRecThreads * (a.dv / kBV) < 2 * a.dk + a.dv) return false;
  if (p.dk != a.dk || p.nk != a.nk || p.nv != a.nv || p.n_ch != 2 * a.nk * a.dk + a.nv * a.dv) return false;
  return p.kernel >= 1 && p.kernel <= kConvMaxKernel && cluster_launch_enabled();
}

cudaError_t delta_net_step_q8_launch(const DeltaNetPrepArgs& p, const DeltaNetArgs& a, const DeltaNetNormQ8& nq,
                                     cudaStream_t s) {
  if (!delta_net_step_q8_fits(p, a) || nq.w == nullptr || nq.z == nullptr || nq.y == nullptr || nq.q8 == nullptr ||
      nq.q8_ds == nullptr) {
    return cudaErrorInvalidValue;
  }
  switch (a.dk) {
    case 32: return step_q8<32>(p, a, nq, s);
    case 64: return step_q8<64>(p, a, nq, s);
    case 128: return step_q8<128>(p, a, nq, s);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace ds::cuda
