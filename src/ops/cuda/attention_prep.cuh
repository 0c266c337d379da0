// attention_prep's arithmetic for one head row (RMSNorm with its weight, then the NeoX rotation of the
// first n_rot dims) and its KV store conversion, shared by the prep kernel (attention_prep.cu) and the
// fused decode kernel (attention.cu), so both give the bits of rms_norm, rope_neox_at and kv_append.
// Device code: include from CUDA sources only.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/attention_launch.h"
#include "ops/cuda/norm_warp.cuh"
#include "ops/cuda/rope.cuh"

namespace ds::cuda::kern {

__device__ __forceinline__ void store_kv(float* dst, float v) { *dst = v; }
__device__ __forceinline__ void store_kv(__half* dst, float v) { *dst = __float2half_rn(v); }

constexpr int kPrepPer = kern::kWarpRowPer;
static_assert(kAttnPrepMaxHeadDim == 32 * kPrepPer, "one warp holds a head");

// One full warp: y[0, D) = RMSNorm(src[0, D)) * w (norm_kernel's bits through kern::warp_row_rms_inv),
// then its first n_rot dims rotated (NeoX) at position pos (kern::rope_neox_pair), or by the angles
// cs[0, n_rot / 2) of that position (kern::rope_neox_cos_sin, computed ahead) where cs is given: the
// same bits. D <= 256; y: D floats of shared memory, complete in every lane on return.
__device__ __forceinline__ void prep_head_row(const float* src, const float* w, int D, float eps, int64_t pos,
                                              int n_rot, double log2_base, float* y, int lane,
                                              const double2* cs = nullptr) {
  float v[kPrepPer], wv[kPrepPer];
#pragma unroll
  for (int j = 0; j < kPrepPer; ++j) {  // unconditional loads (past D: element D - 1), selected after
    const int i = lane + 32 * j, ic = min(i, D - 1);
    const float x = src[ic], wx = w[ic];
    v[j] = i < D ? x : 0.0f;
    wv[j] = i < D ? wx : 1.0f;
  }
  const float inv = kern::warp_row_rms_inv(v, D, eps);
#pragma unroll
  for (int j = 0; j < kPrepPer; ++j) {
    const int i = lane + 32 * j;
    if (i < D) y[i] = v[j] * inv * wv[j];
  }
  __syncwarp();
  const int half = n_rot / 2;
  for (int d = lane; d < half; d += 32) {
    float x0 = y[d], x1 = y[d + half];
    kern::rope_neox_rotate(x0, x1, cs != nullptr ? cs[d] : kern::rope_neox_cos_sin(pos, d, n_rot, log2_base));
    y[d] = x0;
    y[d + half] = x1;
  }
  __syncwarp();
}

}  // namespace ds::cuda::kern
