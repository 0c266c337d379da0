// attention_prep's arithmetic for one head row (RMSNorm with its weight, then the NeoX rotation of the
// first n_rot dims) and its KV store conversion, shared by the prep kernel (attention_prep.cu) and the
// fused decode kernel (attention.cu), so both give the bits of rms_norm, rope_neox_at and kv_append.
// Device code: include from CUDA sources only.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "ops/cuda/attention_launch.h"
#include "ops/cuda/norm_warp.cuh"
#include "ops/cuda/rope.cuh"
#include "quant/blocks.h"

namespace ds::cuda::kern {

__device__ __forceinline__ void store_kv(float* dst, float v) { *dst = v; }
__device__ __forceinline__ void store_kv(__half* dst, float v) { *dst = __float2half_rn(v); }

// The element type tag of a Q8_0 KV cache: a (position, head) row of D elements is D / 32 blocks of 34
// bytes (an fp16 scale d, then 32 int8 codes), quant/blocks.h BlockQ8_0.
struct KvQ8 {};
constexpr int kKvQ8Block = quant::kQK8_0;
constexpr int kKvQ8BlockBytes = static_cast<int>(sizeof(quant::BlockQ8_0));

// Bytes of one (position, head) row of D elements of the KV cache.
template <typename T>
__host__ __device__ constexpr int kv_row_bytes(int D) {
  if constexpr (std::is_same_v<T, KvQ8>) {
    return D / kKvQ8Block * kKvQ8BlockBytes;
  } else {
    return D * static_cast<int>(sizeof(T));
  }
}

// One Q8_0 block of a row quantized by a full warp, lane l holding element l: quant::quantize_row_q8_0's
// bits (d = amax / 127, codes lrintf(x / d) by the reciprocal, d stored as fp16). NaN elements leave amax
// as it is (std::max's order) and code 0.
__device__ __forceinline__ void quantize_kv_q8_block(float x, int8_t& code, __half& d_out) {
  float amax = x == x ? fabsf(x) : 0.0f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  code = static_cast<int8_t>(__float2int_rn(x * id));
  d_out = __float2half_rn(d);
}

// One full warp quantizes the head row y[0, D) (D % 32 == 0; y in any memory, read at lane + 32 b) into
// Q8_0 blocks and stores them at dst and at dst2 (either may be null: only the other is written). The
// elements of up to 8 blocks are loaded before the first block's reduction: y is often another kernel's
// output, an L2 round trip each (and a store to dst may alias y for all the compiler knows, so it would
// not move a later load ahead).
__device__ __forceinline__ void store_kv_row_q8(uint8_t* dst, uint8_t* dst2, const float* y, int D, int lane) {
  constexpr int kBatch = 8;
  const int nb = D / kKvQ8Block;
  for (int b0 = 0; b0 < nb; b0 += kBatch) {
    float x[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) x[k] = y[min(b0 + k, nb - 1) * kKvQ8Block + lane];  // past the row: unused
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      if (b0 + k >= nb) break;
      int8_t code;
      __half d;
      quantize_kv_q8_block(x[k], code, d);
      for (uint8_t* out : {dst, dst2}) {
        if (out == nullptr) continue;
        uint8_t* blk = out + (b0 + k) * kKvQ8BlockBytes;
        blk[2 + lane] = static_cast<uint8_t>(code);
        if (lane == 0) *reinterpret_cast<__half*>(blk) = d;
      }
    }
  }
}

// One full warp stores the head row y[0, D) (D % 32 == 0; y in any memory, read at lane + 32 b) into a KV
// row at dst: converted element by element (F32, F16) or as Q8_0 blocks.
template <typename T>
__device__ __forceinline__ void store_kv_row(uint8_t* dst, const float* y, int D, int lane) {
  if constexpr (std::is_same_v<T, KvQ8>) {
    store_kv_row_q8(dst, nullptr, y, D, lane);
  } else {
    for (int i = lane; i < D; i += 32) store_kv(reinterpret_cast<T*>(dst) + i, y[i]);
  }
}

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
