// CUDA kernels and launchers of the non-matrix ops: element-wise family, strided copy, RMS/L2 norm,
// NeoX RoPE (also at a device-side position), get_rows, causal conv1d with state, DeltaNet gates, MoE
// routing and the row gather/scatter used by the expert FFN (the DeltaNet recurrence itself is in
// delta_net.cu). Host entries (checks, Status) are in cuda_ops.cpp and cuda_attention.cpp.
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "ops/cuda/attention_launch.h"
#include "ops/cuda/ops_launch.h"
#include "ops/cuda/quant_decode.cuh"

namespace ds::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGridY = 65535;  // launches with one grid row per token go in slices of this

unsigned blocks_for(int64_t n, int threads = kThreads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

__device__ __forceinline__ float sigmoidf(float v) { return 1.0f / (1.0f + __expf(-v)); }

__global__ void eltwise_kernel(EltKind kind, const float* a, const float* b, float* y, int64_t n, int64_t row,
                               bool b_per_row) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = a[i];
  const float u = b ? (b_per_row ? b[i / row] : b[i]) : 0.0f;
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

__global__ void copy_kernel(const uint8_t* src, uint8_t* dst, CopyShape sh) {
  const int64_t r = blockIdx.x;
  const int64_t i1 = r % sh.ne[1], i2 = (r / sh.ne[1]) % sh.ne[2], i3 = r / (sh.ne[1] * sh.ne[2]);
  const float* s = reinterpret_cast<const float*>(src + i1 * sh.src_nb[1] + i2 * sh.src_nb[2] + i3 * sh.src_nb[3]);
  float* d = reinterpret_cast<float*>(dst + i1 * sh.dst_nb[1] + i2 * sh.dst_nb[2] + i3 * sh.dst_nb[3]);
  for (int64_t i = threadIdx.x; i < sh.ne[0]; i += blockDim.x) d[i] = s[i];
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

__global__ void norm_kernel(const float* x, const float* w, float* y, int64_t n, float eps, bool l2) {
  const float* xr = x + blockIdx.x * n;
  float* yr = y + blockIdx.x * n;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
  ss = block_sum(ss);
  const float inv = l2 ? rsqrtf(ss + eps) : rsqrtf(ss / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = w ? xr[i] * inv * w[i] : xr[i] * inv;
}

// Angles in double: positions reach 2^18 and a float angle would be off by up to 1e-2 rad there.
// d_pos (when not null) adds a position read on the device (rope_neox_at).
__global__ void rope_kernel(float* x, int64_t head_dim, int64_t n_head, int64_t n_tokens, int64_t n_rot,
                            double log2_base, int64_t pos0, const int32_t* d_pos) {
  const int64_t half = n_rot / 2;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_tokens * n_head * half) return;
  if (d_pos) pos0 += *d_pos;
  const int64_t d = i % half, th = i / half, t = th / n_head;
  float* v = x + th * head_dim;
  const double theta = static_cast<double>(pos0 + t) * exp2(-2.0 * static_cast<double>(d) / n_rot * log2_base);
  double sn, cs;
  sincos(theta, &sn, &cs);
  const double x0 = v[d], x1 = v[d + half];
  v[d] = static_cast<float>(x0 * cs - x1 * sn);
  v[d + half] = static_cast<float>(x0 * sn + x1 * cs);
}

template <DType T>
__global__ void get_rows_kernel(const uint8_t* table, int64_t row_stride, int64_t n, const int32_t* ids,
                                float* y) {
  const int64_t t = blockIdx.y;
  const uint8_t* row = table + static_cast<int64_t>(ids[t]) * row_stride;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[t * n + i] = qdec::decode1<T>(row, i);
  }
}

__global__ void conv1d_kernel(const float* x, const float* w, float* state, float* y, int64_t n_ch,
                              int64_t n_tokens, int kernel) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= n_ch) return;
  float win[kConvMaxKernel];  // the last kernel-1 inputs, oldest first, then the current one
  float taps[kConvMaxKernel];
#pragma unroll
  for (int i = 0; i < kConvMaxKernel; ++i) {
    win[i] = i < kernel - 1 ? state[i * n_ch + c] : 0.0f;
    taps[i] = i < kernel ? w[c * kernel + i] : 0.0f;
  }
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float cur = x[t * n_ch + c];
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < kConvMaxKernel; ++i) {
      if (i < kernel - 1) acc = fmaf(taps[i], win[i], acc);
    }
    float last = 0.0f;
#pragma unroll
    for (int i = 0; i < kConvMaxKernel; ++i) {
      if (i == kernel - 1) last = taps[i];
    }
    acc = fmaf(last, cur, acc);
    y[t * n_ch + c] = acc;
#pragma unroll
    for (int i = 0; i + 1 < kConvMaxKernel; ++i) {
      if (i < kernel - 2) win[i] = win[i + 1];
      else if (i == kernel - 2) win[i] = cur;
    }
  }
#pragma unroll
  for (int i = 0; i < kConvMaxKernel; ++i) {
    if (i < kernel - 1) state[i * n_ch + c] = win[i];
  }
}

__global__ void gates_kernel(const float* alpha, const float* b, const float* dt_bias, const float* ssm_a,
                             float* g, float* beta, int64_t nv, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t h = i % nv;
  const float a = alpha[i] + dt_bias[h];
  const float softplus = a > 20.0f ? a : log1pf(expf(a));
  g[i] = ssm_a[h] * softplus;
  beta[i] = 1.0f / (1.0f + expf(-b[i]));
}

// One thread per token: n_expert is at most a few hundred and k at most kRouteMaxK.
__global__ void moe_route_kernel(const float* logits, int64_t n_expert, int64_t n_tokens, int64_t k,
                                 int32_t* ids, float* weights, float floor) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= n_tokens) return;
  const float* l = logits + t * n_expert;
  double mx = -INFINITY, sum = 0.0;
  for (int64_t e = 0; e < n_expert; ++e) mx = fmax(mx, static_cast<double>(l[e]));
  for (int64_t e = 0; e < n_expert; ++e) sum += exp(static_cast<double>(l[e]) - mx);
  int32_t sel[kRouteMaxK];
  double p[kRouteMaxK];
  double sel_sum = 0.0;
  for (int64_t j = 0; j < k; ++j) {
    int32_t best = -1;
    for (int64_t e = 0; e < n_expert; ++e) {
      bool taken = false;
      for (int64_t q = 0; q < j; ++q) taken |= sel[q] == e;
      if (!taken && (best < 0 || l[e] > l[best])) best = static_cast<int32_t>(e);
    }
    sel[j] = best;
    p[j] = exp(static_cast<double>(l[best]) - mx) / sum;
    sel_sum += p[j];
  }
  const double denom = fmax(sel_sum, static_cast<double>(floor));
  for (int64_t j = 0; j < k; ++j) {
    ids[t * k + j] = sel[j];
    weights[t * k + j] = static_cast<float>(p[j] / denom);
  }
}

__global__ void scatter_add_kernel(const float* x, const int32_t* dst_rows, const float* scale, float* y,
                                   int64_t n_embd) {
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
                           bool b_per_row, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  eltwise_kernel<<<blocks_for(n), kThreads, 0, s>>>(kind, a, b, y, n, row, b_per_row);
  return cudaGetLastError();
}

cudaError_t copy_launch(const void* src, void* dst, const CopyShape& shape, cudaStream_t s) {
  const int64_t rows = shape.ne[1] * shape.ne[2] * shape.ne[3];
  if (rows <= 0 || shape.ne[0] <= 0) return cudaSuccess;
  copy_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(static_cast<const uint8_t*>(src),
                                                               static_cast<uint8_t*>(dst), shape);
  return cudaGetLastError();
}

cudaError_t norm_launch(const float* x, const float* w, float* y, int64_t n, int64_t rows, float eps, bool l2,
                        cudaStream_t s) {
  if (rows <= 0) return cudaSuccess;
  norm_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(x, w, y, n, eps, l2);
  return cudaGetLastError();
}

cudaError_t rope_neox_launch(float* x, int64_t head_dim, int64_t n_head, int64_t n_tokens, int64_t n_rot,
                             float base, int64_t pos0, cudaStream_t s) {
  const int64_t n = n_tokens * n_head * (n_rot / 2);
  if (n <= 0) return cudaSuccess;
  rope_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, head_dim, n_head, n_tokens, n_rot,
                                                   std::log2(static_cast<double>(base)), pos0, nullptr);
  return cudaGetLastError();
}

cudaError_t rope_neox_at_launch(float* x, int64_t head_dim, int64_t n_head, int64_t n_tokens, int64_t n_rot,
                                float base, const int32_t* d_pos, cudaStream_t s) {
  const int64_t n = n_tokens * n_head * (n_rot / 2);
  if (n <= 0) return cudaSuccess;
  rope_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, head_dim, n_head, n_tokens, n_rot,
                                                   std::log2(static_cast<double>(base)), 0, d_pos);
  return cudaGetLastError();
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
#define X(name) \
  case DType::name: get_rows_kernel<DType::name><<<grid, kThreads, 0, s>>>(tb, row_stride, n, ids_t, y_t); break;
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
                          int64_t kernel, cudaStream_t s) {
  if (kernel < 1 || kernel > kConvMaxKernel) return cudaErrorInvalidValue;
  conv1d_kernel<<<blocks_for(n_ch, 128), 128, 0, s>>>(x, w, state, y, n_ch, n_tokens, static_cast<int>(kernel));
  return cudaGetLastError();
}

cudaError_t delta_net_gates_launch(const float* alpha, const float* b, const float* dt_bias, const float* ssm_a,
                                   float* g, float* beta, int64_t nv, int64_t rows, cudaStream_t s) {
  const int64_t n = nv * rows;
  if (n <= 0) return cudaSuccess;
  gates_kernel<<<blocks_for(n), kThreads, 0, s>>>(alpha, b, dt_bias, ssm_a, g, beta, nv, n);
  return cudaGetLastError();
}

cudaError_t moe_route_launch(const float* logits, int64_t n_expert, int64_t n_tokens, int64_t k, int32_t* ids,
                             float* weights, float floor, cudaStream_t s) {
  if (k < 1 || k > kRouteMaxK || k > n_expert) return cudaErrorInvalidValue;
  moe_route_kernel<<<blocks_for(n_tokens, 64), 64, 0, s>>>(logits, n_expert, n_tokens, k, ids, weights, floor);
  return cudaGetLastError();
}

cudaError_t scatter_add_rows_launch(const float* x, const int32_t* dst_rows, const float* scale, float* y,
                                    int64_t n, int64_t n_embd, cudaStream_t s) {
  for (int64_t i0 = 0; i0 < n; i0 += kMaxGridY) {
    const dim3 grid(row_blocks(n_embd), static_cast<unsigned>(std::min(kMaxGridY, n - i0)));
    scatter_add_kernel<<<grid, kThreads, 0, s>>>(x + i0 * n_embd, dst_rows + i0, scale + i0, y, n_embd);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t gather_rows_launch(const float* x, const int32_t* src_rows, float* y, int64_t n, int64_t n_embd,
                               cudaStream_t s) {
  for (int64_t i0 = 0; i0 < n; i0 += kMaxGridY) {
    const dim3 grid(row_blocks(n_embd), static_cast<unsigned>(std::min(kMaxGridY, n - i0)));
    gather_kernel<<<grid, kThreads, 0, s>>>(x, src_rows + i0, y + i0 * n_embd, n_embd);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace ds::cuda
