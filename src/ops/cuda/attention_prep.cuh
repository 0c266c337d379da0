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

// The element type tags of the block-quantized KV caches: a (position, head) row of D elements is D / 32
// blocks (quant/blocks.h), each an fp16 scale d and then the codes: KvQ8 BlockQ8_0 (34 bytes, 32 int8
// codes), KvQ4 BlockQ4_0 (18 bytes, element j in the low nibble of byte j, element j + 16 in its high
// nibble, a code c meaning (c - 8) d).
struct KvQ8 {};
struct KvQ4 {};
template <typename T>
inline constexpr bool kKvBlocks = std::is_same_v<T, KvQ8> || std::is_same_v<T, KvQ4>;
constexpr int kKvBlock = quant::kQK8_0;  // elements of a block, both types
static_assert(quant::kQK4_0 == kKvBlock, "one block size");
constexpr int kKvQ8BlockBytes = static_cast<int>(sizeof(quant::BlockQ8_0));
constexpr int kKvQ4BlockBytes = static_cast<int>(sizeof(quant::BlockQ4_0));
template <typename T>
constexpr int kv_block_bytes() {
  return std::is_same_v<T, KvQ8> ? kKvQ8BlockBytes : kKvQ4BlockBytes;
}
// Whether the KV cache dtype t is one of the block types (Q8_0: KvQ8, Q4_0: KvQ4).
inline bool kv_dtype_blocks(DType t) { return t == DType::Q8_0 || t == DType::Q4_0; }

// Bytes of one (position, head) row of D elements of the KV cache.
template <typename T>
__host__ __device__ constexpr int kv_row_bytes(int D) {
  if constexpr (kKvBlocks<T>) {
    return D / kKvBlock * kv_block_bytes<T>();
  } else {
    return D * static_cast<int>(sizeof(T));
  }
}

// The arithmetic of quant::quantize_row_q8_0 and quantize_row_q4_0 for a block held by LB lanes (a
// power of two, aligned), each lane with some of its elements; every operation is rounded alone as the
// CPU's (nvcc would otherwise contract x * id + 8.5 into an FMA).
// Q8_0: d = amax / 127 from the lanes' largest |x| (NaN elements leave it as it is, std::max's order),
// codes lrintf(x / d) by the reciprocal (a NaN element: 0).
template <int LB>
__device__ __forceinline__ float q8_block_scale(float amax) {
#pragma unroll
  for (int o = LB / 2; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
  return amax / 127.0f;
}
__device__ __forceinline__ uint32_t q8_code(float x, float id) {
  return static_cast<uint8_t>(static_cast<int8_t>(__float2int_rn(x * id)));
}
// Q4_0: the scale from the signed value mx of the first element of largest |x| (a, its index at: each
// lane's own first largest; ties go to the lower index, so every lane agrees; NaN and zeros never are
// the largest: d = -0 for a block without a nonzero element), d = max / -8, codes min(15, trunc(x / d +
// 8.5)) by the reciprocal (a NaN element: 0, what the CPU's conversion gives it on x86).
template <int LB>
__device__ __forceinline__ float q4_block_scale(float a, float mx, int at) {
#pragma unroll
  for (int o = LB / 2; o > 0; o >>= 1) {
    const float oa = __shfl_xor_sync(0xFFFFFFFFu, a, o), om = __shfl_xor_sync(0xFFFFFFFFu, mx, o);
    const int oat = __shfl_xor_sync(0xFFFFFFFFu, at, o);
    if (oa > a || (oa == a && oat < at)) {
      a = oa;
      mx = om;
      at = oat;
    }
  }
  return (a > 0.0f ? mx : 0.0f) / -8.0f;
}
__device__ __forceinline__ int q4_code(float x, float id) {
  const float t = __fadd_rn(__fmul_rn(x, id), 8.5f);
  return min(15, static_cast<int>(static_cast<int8_t>(__float2int_rz(t))));
}
__device__ __forceinline__ float abs_or_zero(float x) { return x == x ? fabsf(x) : 0.0f; }  // NaN: 0

// One full warp quantizes 32 E elements (E = 1, 2, 4 or 8; lane l holds x[0, E), the elements [l E,
// l E + E)) into E KV blocks (KvQ8 or KvQ4) and stores them at dst and at dst2 (either may be
// null: only the other is written): the 32 / E lanes of a block reduce its scale in log2(32 / E) shuffle
// steps for every block at once, and a lane stores its E codes (Q4_0: lanes of the block's first half pair
// their codes with the second half's, elements j and j + 16 in one byte).
template <typename KV, int E>
__device__ __forceinline__ void quantize_store_blocks(const float (&x)[E], uint8_t* dst, uint8_t* dst2, int lane) {
  constexpr int LB = kKvBlock / E, BB = kv_block_bytes<KV>();  // lanes a block
  static_assert(E == 1 || E == 2 || E == 4 || E == 8, "a block is a power-of-two group of lanes");
  const int b = lane / LB, q = lane % LB;  // the block, and this lane's E-element piece of it
  uint32_t codes[(E + 3) / 4] = {};        // byte e % 4 of word e / 4: the code of element q E + e
  __half d_half;
  if constexpr (std::is_same_v<KV, KvQ8>) {
    float amax = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) amax = fmaxf(amax, abs_or_zero(x[e]));
    const float d = q8_block_scale<LB>(amax);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) codes[e / 4] |= q8_code(x[e], id) << (8 * (e % 4));
    d_half = __float2half_rn(d);
  } else {
    float a = 0.0f, mx = 0.0f;  // this lane's first largest |x|
    int at = q * E;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const float ae = abs_or_zero(x[e]);
      if (ae > a) {
        a = ae;
        mx = x[e];
        at = q * E + e;
      }
    }
    const float d = q4_block_scale<LB>(a, mx, at);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) codes[e / 4] |= static_cast<uint32_t>(q4_code(x[e], id)) << (8 * (e % 4));
#pragma unroll
    for (int k = 0; k < (E + 3) / 4; ++k) {  // elements + 16 live LB / 2 lanes on
      codes[k] |= __shfl_xor_sync(0xFFFFFFFFu, codes[k], LB / 2) << 4;
    }
    d_half = __float2half_rn(d);
  }
  constexpr int kCodeLanes = std::is_same_v<KV, KvQ8> ? LB : LB / 2;  // lanes of a block storing codes
  for (uint8_t* out : {dst, dst2}) {
    if (out == nullptr) continue;
    uint8_t* blk = out + b * BB;
    if (q < kCodeLanes) {
      uint8_t* at = blk + 2 + q * E;  // 2-byte aligned for E >= 2 (a block is)
      if constexpr (E == 1) {
        *at = static_cast<uint8_t>(codes[0]);
      } else {
#pragma unroll
        for (int e = 0; e < E; e += 2) {
          reinterpret_cast<uint16_t*>(at)[e / 2] = static_cast<uint16_t>(codes[e / 4] >> (8 * (e % 4)));
        }
      }
    }
    if (q == 0) *reinterpret_cast<__half*>(blk) = d_half;
  }
}

// One full warp quantizes the head row y[0, D) (D % 32 == 0; y in any memory, read at lane + 32 b) into
// KV blocks block after block, lane l holding element l of each (quantize_store_blocks with E = 1). The
// elements of up to 8 blocks are loaded before the first block's reduction: y is often another kernel's
// output, an L2 round trip each (and a store to dst may alias y for all the compiler knows, so it would
// not move a later load ahead).
template <typename KV>
__device__ __forceinline__ void store_kv_row_by_block(uint8_t* dst, uint8_t* dst2, const float* y, int D, int lane) {
  constexpr int kBatch = 8, BB = kv_block_bytes<KV>();
  const int nb = D / kKvBlock;
  for (int b0 = 0; b0 < nb; b0 += kBatch) {
    float x[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) x[k] = y[min(b0 + k, nb - 1) * kKvBlock + lane];  // past the row: unused
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      if (b0 + k >= nb) break;
      const float xk[1] = {x[k]};
      const int off = (b0 + k) * BB;
      quantize_store_blocks<KV, 1>(xk, dst != nullptr ? dst + off : nullptr, dst2 != nullptr ? dst2 + off : nullptr,
                                   lane);
    }
  }
}

// The head row y[0, 32 E) with the blocks spread over the lanes: lane l loads the E consecutive elements
// [l E, l E + E) (quantize_store_blocks).
template <typename KV, int E>
__device__ __forceinline__ void store_kv_row_spread(uint8_t* dst, uint8_t* dst2, const float* y, int lane) {
  float x[E];
#pragma unroll
  for (int e = 0; e < E; ++e) x[e] = y[lane * E + e];
  quantize_store_blocks<KV, E>(x, dst, dst2, lane);
}

// One full warp quantizes the head row y[0, D) (D % 32 == 0; y in any memory) into KV blocks (KvQ8 or
// KvQ4) and stores them at dst and at dst2 (either may be null: only the other is written): the blocks
// spread over the lanes where D is 32, 64, 128 or 256, else block after block; the same bits.
template <typename KV>
__device__ __forceinline__ void store_kv_row_blocks(uint8_t* dst, uint8_t* dst2, const float* y, int D, int lane) {
  switch (D) {
    case 32: return store_kv_row_spread<KV, 1>(dst, dst2, y, lane);
    case 64: return store_kv_row_spread<KV, 2>(dst, dst2, y, lane);
    case 128: return store_kv_row_spread<KV, 4>(dst, dst2, y, lane);
    case 256: return store_kv_row_spread<KV, 8>(dst, dst2, y, lane);
    default: return store_kv_row_by_block<KV>(dst, dst2, y, D, lane);
  }
}

// One full warp stores the head row y[0, D) (D % 32 == 0 for the block types; y in any memory, read at
// lane + 32 b) into a KV row at dst: converted element by element (F32, F16) or as blocks (Q8_0, Q4_0).
template <typename T>
__device__ __forceinline__ void store_kv_row(uint8_t* dst, const float* y, int D, int lane) {
  if constexpr (kKvBlocks<T>) {
    store_kv_row_blocks<T>(dst, nullptr, y, D, lane);
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
