// Kernels of the CUDA matrix products (templates, included by ops/cuda/matvec.cu and by the
// kernels/matvec_q.cu workbench): y[t, r] = dot(W row r, x row t).
//  - matvec_staged: decode path for a few activation rows. A CTA owns kRows weight rows; per step its
//    threads copy a ~1-2 KB chunk of each row into shared memory with 16-byte loads (each weight byte
//    read once), then every thread decodes 8-element units for all kRows rows and multiplies them with
//    the matching activations, which it loads once for kRows rows. Needs qdec::traits(T).row_align.
//  - matvec_generic: one warp per (row, token), byte loads, any alignment (fallback and workbench v1).
//    matvec_staged and matvec_generic have a gathered mode (MoE: MatvecArgs::ids set, n_tokens = 1):
//    blockIdx.y is a slot whose expert id is read on the device and offsets the weight base; slots with
//    invalid ids are skipped.
//  - dequant_bf16 / f32_to_bf16: prefill path, weight tiles and activations to BF16 for cuBLAS.
// Non-obvious choice: staging through shared memory is what allows 16-byte loads for types whose
// blocks (18, 34, 210 bytes) are not 16-byte aligned; shared memory keeps each byte's address mod 16.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/launch.cuh"
#include "ops/cuda/mma.cuh"
#include "ops/cuda/quant_decode.cuh"

namespace ds::cuda::kern {

struct MatvecArgs {
  const uint8_t* w;     // [n_rows] rows of k elements of the weight type
  int64_t w_stride;     // bytes between weight rows
  const float* x;       // [n_tokens, k] activations
  int64_t x_stride;     // elements between activation rows
  float* y;             // [n_tokens, n_rows] outputs
  int64_t y_stride;     // elements between output rows
  int64_t n_rows;
  int64_t k;
  int n_tokens;
  const int32_t* ids = nullptr;  // gathered: expert id of slot blockIdx.y; ids outside [0, n_expert) skip it
  int64_t w_expert_stride = 0;   // bytes between experts
  int n_expert = 0;
  int x_div = 1;                 // gathered: slot s multiplies activation row s / x_div, writes y row s
};

// Gathered mode: the weight, activation and output bases of slot blockIdx.y; false for an unused slot.
__device__ __forceinline__ bool gather_slot(const MatvecArgs& a, const uint8_t** w, const float** x, float** y) {
  const int slot = blockIdx.y;
  const int32_t e = a.ids[slot];
  if (e < 0 || e >= a.n_expert) return false;
  *w = a.w + e * a.w_expert_stride;
  *x = a.x + (slot / a.x_div) * a.x_stride;
  *y = a.y + slot * a.y_stride;
  return true;
}

constexpr int kStagedThreads = 128;
constexpr int kStagedRows = 4;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}

// 16 bytes at p, read without touching memory outside [lo, hi) (the ends of the weight tensor).
__device__ __forceinline__ uint4 load16_clamped(uintptr_t p, uintptr_t lo, uintptr_t hi) {
  if (p >= lo && p + 16 <= hi) return __ldg(reinterpret_cast<const uint4*>(p));
  uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
  for (int b = 0; b < 16; ++b) {
    if (p + b >= lo && p + b < hi) w[b / 4] |= static_cast<uint32_t>(*reinterpret_cast<const uint8_t*>(p + b)) << (8 * (b % 4));
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// kNT: activation rows handled per launch (n_tokens <= kNT; the rest are predicated off).
// kRows: weight rows per CTA (activation reuse vs. CTAs for small row counts).
// The next chunk's 16-byte loads are issued into registers before the current chunk is decoded, so
// memory latency overlaps the arithmetic.
template <DType T, int kNT, int kRows = kStagedRows>
__global__ void __launch_bounds__(kStagedThreads) matvec_staged(MatvecArgs a) {
  dependency_sync();
  constexpr qdec::TypeTraits tr = qdec::traits(T);
  constexpr int kChunkBytes = tr.chunk_elems / tr.block_elems * tr.block_bytes;
  constexpr int kRowSmem = (kChunkBytes + 32 + 15) / 16 * 16;  // +32: 16-byte rounding at both ends
  constexpr int kPerThread = (kRowSmem / 16 + kStagedThreads - 1) / kStagedThreads;
  __shared__ __align__(16) uint8_t smem[kRows][kRowSmem];
  __shared__ float red[kStagedThreads / 32][kRows * kNT];

  const int tid = threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const uint8_t* wb = a.w;
  const float* xb = a.x;
  float* yb = a.y;
  if (a.ids != nullptr && !gather_slot(a, &wb, &xb, &yb)) return;  // uniform per CTA, before any barrier
  const uintptr_t w_lo = reinterpret_cast<uintptr_t>(wb);
  const uintptr_t w_hi = w_lo + (a.n_rows - 1) * a.w_stride + a.k / tr.block_elems * tr.block_bytes;

  float acc[kRows][kNT];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < kNT; ++t) acc[r][t] = 0.0f;

  // Loads of chunk k0 into registers: row r's bytes start at address mod 16 = offset[r].
  uint4 buf[kRows][kPerThread];
  int offset[kRows], n16[kRows];
  auto issue = [&](int64_t k0) {
    const int kn = static_cast<int>(a.k - k0 < tr.chunk_elems ? a.k - k0 : tr.chunk_elems);
    const int64_t chunk_bytes = kn / tr.block_elems * tr.block_bytes;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t row = r0 + r < a.n_rows ? r0 + r : a.n_rows - 1;
      const uintptr_t src = w_lo + row * a.w_stride + k0 / tr.block_elems * tr.block_bytes;
      const uintptr_t first = src & ~uintptr_t{15};
      offset[r] = static_cast<int>(src & 15);
      n16[r] = static_cast<int>((src + chunk_bytes + 15 - first) / 16);
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) {
        const int u = tid + j * kStagedThreads;
        if (u < n16[r]) buf[r][j] = load16_clamped(first + 16 * static_cast<uintptr_t>(u), w_lo, w_hi);
      }
    }
  };

  issue(0);
  for (int64_t k0 = 0; k0 < a.k; k0 += tr.chunk_elems) {
    const int kn = static_cast<int>(a.k - k0 < tr.chunk_elems ? a.k - k0 : tr.chunk_elems);
    int off[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      off[r] = offset[r];
#pragma unroll
      for (int j = 0; j < kPerThread; ++j) {
        const int u = tid + j * kStagedThreads;
        if (u < n16[r]) *reinterpret_cast<uint4*>(&smem[r][16 * u]) = buf[r][j];
      }
    }
    __syncthreads();
    if (k0 + tr.chunk_elems < a.k) issue(k0 + tr.chunk_elems);
    for (int u = tid; u < kn / 8; u += kStagedThreads) {
      float v[kRows][8];
#pragma unroll
      for (int r = 0; r < kRows; ++r) qdec::decode8<T>(&smem[r][off[r]], 8 * u, v[r]);
#pragma unroll
      for (int t = 0; t < kNT; ++t) {
        if (t < a.n_tokens) {
          const float* xp = xb + t * a.x_stride + k0 + 8 * u;
          const float4 x0 = __ldg(reinterpret_cast<const float4*>(xp));
          const float4 x1 = __ldg(reinterpret_cast<const float4*>(xp + 4));
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            float s = acc[r][t];
            s = fmaf(v[r][0], x0.x, s); s = fmaf(v[r][1], x0.y, s);
            s = fmaf(v[r][2], x0.z, s); s = fmaf(v[r][3], x0.w, s);
            s = fmaf(v[r][4], x1.x, s); s = fmaf(v[r][5], x1.y, s);
            s = fmaf(v[r][6], x1.z, s); s = fmaf(v[r][7], x1.w, s);
            acc[r][t] = s;
          }
        }
      }
    }
    __syncthreads();
  }

  const int warp = tid / 32, lane = tid % 32;
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < kNT; ++t) {
      const float s = warp_sum(acc[r][t]);
      if (lane == 0) red[warp][r * kNT + t] = s;
    }
  __syncthreads();
  for (int i = tid; i < kRows * kNT; i += kStagedThreads) {
    const int r = i / kNT, t = i % kNT;
    if (t < a.n_tokens && r0 + r < a.n_rows) {
      float s = 0.0f;
#pragma unroll
      for (int w = 0; w < kStagedThreads / 32; ++w) s += red[w][i];
      yb[t * a.y_stride + r0 + r] = s;
    }
  }
}

// One warp per (row, token) (gathered: per (row, slot)); any alignment, any k that is a multiple of the
// block size.
template <DType T>
__global__ void matvec_generic(MatvecArgs a) {
  dependency_sync();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  int t = blockIdx.y;
  if (row >= a.n_rows) return;
  const uint8_t* wb = a.w;
  const float* xb = a.x;
  float* yb = a.y;
  if (a.ids != nullptr) {
    if (!gather_slot(a, &wb, &xb, &yb)) return;
    t = 0;
  }
  const uint8_t* w = wb + row * a.w_stride;
  const float* x = xb + t * a.x_stride;
  float s = 0.0f;
  for (int64_t k = threadIdx.x % 32; k < a.k; k += 32) s = fmaf(qdec::decode1<T>(w, k), x[k], s);
  s = warp_sum(s);
  if (threadIdx.x % 32 == 0) yb[t * a.y_stride + row] = s;
}

// out[r, k] (BF16, rows of k) = weight rows 0 .. n_rows. kAligned: 8 elements per thread through
// decode8 (row_align holds, k % 8 == 0); otherwise one element per thread through decode1.
template <DType T, bool kAligned>
__global__ void dequant_bf16(const uint8_t* w, int64_t w_stride, int64_t n_rows, int64_t k,
                             __nv_bfloat16* out) {
  dependency_sync();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if constexpr (kAligned) {
    const int64_t units_per_row = k / 8;
    if (i >= units_per_row * n_rows) return;
    const int64_t r = i / units_per_row, e = (i % units_per_row) * 8;
    float v[8];
    qdec::decode8<T>(w + r * w_stride, e, v);
    store_bf16x8(out + r * k + e, v);
  } else {
    if (i >= k * n_rows) return;
    const int64_t r = i / k, e = i % k;
    out[i] = __float2bfloat16_rn(qdec::decode1<T>(w + r * w_stride, e));
  }
}

// out[t, k] (BF16, contiguous) = x[t, k] (F32 with row stride x_stride).
static __global__ void f32_to_bf16(const float* x, int64_t x_stride, int64_t n_rows, int64_t k,
                                   __nv_bfloat16* out) {
  dependency_sync();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_rows * k) return;
  const int64_t t = i / k, j = i % k;
  out[i] = __float2bfloat16_rn(x[t * x_stride + j]);
}

}  // namespace ds::cuda::kern
