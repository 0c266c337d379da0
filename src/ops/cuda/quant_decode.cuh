// Device-side decoding of weight rows for the CUDA matrix kernels: decode8 turns 8 consecutive elements
// of a row into floats, decode1 one element (generic path). Layouts: quant/blocks.h; the definition
// of correct is quant::dequantize_row. Included by .cu files (production and the kernels/ workbench).
// Non-obvious choice: decode8 assumes the row start has the type's kRowAlign alignment, which makes
// Q4_K/Q5_K/F32/F16/BF16 reads 8- or 16-byte wide; Q4_0/Q5_0/Q8_0/Q6_K blocks are only 2-byte
// aligned (18/22/34/210-byte blocks), so their reads are built from 16-bit loads.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "core/dtype.h"

namespace ds::cuda::qdec {

struct TypeTraits {
  int block_elems;
  int block_bytes;
  int row_align;    // bytes: decode8 needs row starts aligned to this
  int chunk_elems;  // elements of a row staged per step by the matrix-vector kernel (~1-2 KB)
};

__host__ __device__ constexpr TypeTraits traits(DType t) {
  switch (t) {
    case DType::F32: return {1, 4, 16, 512};
    case DType::F16: return {1, 2, 16, 1024};
    case DType::BF16: return {1, 2, 16, 1024};
    case DType::Q4_0: return {32, 18, 2, 2048};
    case DType::Q5_0: return {32, 22, 2, 2048};
    case DType::Q8_0: return {32, 34, 2, 1024};
    case DType::Q4_K: return {256, 144, 16, 2048};
    case DType::Q5_K: return {256, 176, 16, 2048};
    case DType::Q6_K: return {256, 210, 2, 2048};
    default: return {0, 0, 0, 0};
  }
}

__device__ __forceinline__ float h2f(uint16_t u) { return __half2float(__ushort_as_half(u)); }
__device__ __forceinline__ float bf2f(uint16_t u) { return __uint_as_float(static_cast<uint32_t>(u) << 16); }
__device__ __forceinline__ uint16_t ld16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }
// 4 bytes from a 2-byte aligned address.
__device__ __forceinline__ uint32_t ld32_a2(const uint8_t* p) {
  return static_cast<uint32_t>(ld16(p)) | (static_cast<uint32_t>(ld16(p + 2)) << 16);
}
__device__ __forceinline__ uint2 ld64_a8(const uint8_t* p) { return *reinterpret_cast<const uint2*>(p); }
__device__ __forceinline__ int byte_of(uint32_t w, int i) { return (w >> (8 * i)) & 0xFF; }
// Unsigned byte i of w as a float, plus an integer bias, without an integer-to-float conversion (which
// runs at a quarter of the FMA rate): PRMT builds the bits of 2^23 + byte, one FADD removes 2^23.
__device__ __forceinline__ float byte_to_float(uint32_t w, int i, float bias) {
  return __uint_as_float(__byte_perm(w, 0x4B000000u, static_cast<uint32_t>(i) | 0x7540u)) + (bias - 8388608.0f);
}

// 6-bit scale and min j of a Q4_K/Q5_K block (12 packed bytes at q).
__device__ __forceinline__ void k_scale_min(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// v[0..8) = elements e..e+7 of the row at `row` (e a multiple of 8).
template <DType T>
__device__ __forceinline__ void decode8(const uint8_t* row, int64_t e, float v[8]) {
  if constexpr (T == DType::F32) {
    const float4 a = *reinterpret_cast<const float4*>(row + 4 * e);
    const float4 b = *reinterpret_cast<const float4*>(row + 4 * e + 16);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
  } else if constexpr (T == DType::F16 || T == DType::BF16) {
    const uint4 a = *reinterpret_cast<const uint4*>(row + 2 * e);
    const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (T == DType::F16) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
        v[2 * i] = f.x;
        v[2 * i + 1] = f.y;
      } else {
        v[2 * i] = __uint_as_float(w[i] << 16);
        v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
      }
    }
  } else if constexpr (T == DType::Q4_0) {
    const uint8_t* blk = row + (e >> 5) * 18;
    const int j0 = static_cast<int>(e & 31);
    const float d = h2f(ld16(blk));
    const uint8_t* qs = blk + 2 + (j0 & 15);
    const int shift = j0 < 16 ? 0 : 4;
    const uint32_t w[2] = {(ld32_a2(qs) >> shift) & 0x0F0F0F0Fu, (ld32_a2(qs + 4) >> shift) & 0x0F0F0F0Fu};
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = byte_to_float(w[i >> 2], i & 3, -8.0f) * d;
  } else if constexpr (T == DType::Q5_0) {
    const uint8_t* blk = row + (e >> 5) * 22;
    const int j0 = static_cast<int>(e & 31);
    const float d = h2f(ld16(blk));
    const uint32_t qh = ld32_a2(blk + 2) >> j0;  // 5th bits of elements j0 .. j0+7 in bits 0..7
    const uint8_t* qs = blk + 6 + (j0 & 15);
    const int shift = j0 < 16 ? 0 : 4;
    // Spread 8 bits to bit 4 of 8 bytes: bytes 0-3 from bits 0-3, bytes 4-7 from bits 4-7.
    const uint32_t h0 = ((qh & 1u) | ((qh & 2u) << 7) | ((qh & 4u) << 14) | ((qh & 8u) << 21)) << 4;
    const uint32_t h1 = (((qh >> 4) & 1u) | (((qh >> 4) & 2u) << 7) | (((qh >> 4) & 4u) << 14) |
                         (((qh >> 4) & 8u) << 21)) << 4;
    const uint32_t w[2] = {((ld32_a2(qs) >> shift) & 0x0F0F0F0Fu) | h0,
                           ((ld32_a2(qs + 4) >> shift) & 0x0F0F0F0Fu) | h1};
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = byte_to_float(w[i >> 2], i & 3, -16.0f) * d;
  } else if constexpr (T == DType::Q8_0) {
    const uint8_t* blk = row + (e >> 5) * 34;
    const float d = h2f(ld16(blk));
    const uint8_t* qs = blk + 2 + (e & 31);
    const uint32_t w[2] = {ld32_a2(qs) ^ 0x80808080u, ld32_a2(qs + 4) ^ 0x80808080u};  // int8 + 128
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = byte_to_float(w[i >> 2], i & 3, -128.0f) * d;
  } else if constexpr (T == DType::Q4_K || T == DType::Q5_K) {
    constexpr int kBytes = T == DType::Q4_K ? 144 : 176;
    constexpr int kQs = T == DType::Q4_K ? 16 : 48;
    const uint8_t* blk = row + (e >> 8) * kBytes;
    const int j = static_cast<int>(e & 255);
    const int c = j >> 6, half = (j >> 5) & 1, l0 = j & 31;
    const uint32_t dd = *reinterpret_cast<const uint32_t*>(blk);
    int sc, m;
    k_scale_min(2 * c + half, blk + 4, &sc, &m);
    const float d = h2f(dd & 0xFFFF) * sc, dm = h2f(dd >> 16) * m;
    const uint2 q = ld64_a8(blk + kQs + 32 * c + l0);
    uint32_t w[2] = {(q.x >> (4 * half)) & 0x0F0F0F0Fu, (q.y >> (4 * half)) & 0x0F0F0F0Fu};
    if constexpr (T == DType::Q5_K) {
      const uint2 hq = ld64_a8(blk + 16 + l0);
      const int bit = 2 * c + half;
      w[0] |= ((hq.x >> bit) & 0x01010101u) << 4;
      w[1] |= ((hq.y >> bit) & 0x01010101u) << 4;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = d * byte_to_float(w[i >> 2], i & 3, 0.0f) - dm;
  } else if constexpr (T == DType::Q6_K) {
    const uint8_t* blk = row + (e >> 8) * 210;
    const int j = static_cast<int>(e & 255);
    const int h = j >> 7, quarter = (j >> 5) & 3, l0 = j & 31;
    const uint8_t* ql = blk + 64 * h + 32 * (quarter & 1) + l0;
    const uint8_t* qh = blk + 128 + 32 * h + l0;
    const int lshift = 4 * (quarter >> 1), hshift = 2 * quarter;
    const uint32_t w[2] = {((ld32_a2(ql) >> lshift) & 0x0F0F0F0Fu) | (((ld32_a2(qh) >> hshift) & 0x03030303u) << 4),
                           ((ld32_a2(ql + 4) >> lshift) & 0x0F0F0F0Fu) |
                               (((ld32_a2(qh + 4) >> hshift) & 0x03030303u) << 4)};
    const int sc = static_cast<int8_t>(blk[192 + 8 * h + (l0 >> 4) + 2 * quarter]);
    const float d = h2f(ld16(blk + 208)) * static_cast<float>(sc);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = d * byte_to_float(w[i >> 2], i & 3, -32.0f);
  }
}

// Element k of the row at `row`, with byte loads only (any alignment): the generic path.
template <DType T>
__device__ __forceinline__ float decode1(const uint8_t* row, int64_t k) {
  auto u16 = [](const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); };
  if constexpr (T == DType::F32) {
    const uint8_t* p = row + 4 * k;
    return __uint_as_float(static_cast<uint32_t>(u16(p)) | (static_cast<uint32_t>(u16(p + 2)) << 16));
  } else if constexpr (T == DType::F16) {
    return h2f(u16(row + 2 * k));
  } else if constexpr (T == DType::BF16) {
    return bf2f(u16(row + 2 * k));
  } else if constexpr (T == DType::Q4_0) {
    const uint8_t* blk = row + (k >> 5) * 18;
    const int j = static_cast<int>(k & 31);
    const int q = j < 16 ? (blk[2 + j] & 15) : (blk[2 + j - 16] >> 4);
    return static_cast<float>(q - 8) * h2f(u16(blk));
  } else if constexpr (T == DType::Q5_0) {
    const uint8_t* blk = row + (k >> 5) * 22;
    const int j = static_cast<int>(k & 31);
    const uint32_t qh = blk[2] | (blk[3] << 8) | (blk[4] << 16) | (static_cast<uint32_t>(blk[5]) << 24);
    const int q = (j < 16 ? (blk[6 + j] & 15) : (blk[6 + j - 16] >> 4)) | (((qh >> j) & 1) << 4);
    return static_cast<float>(q - 16) * h2f(u16(blk));
  } else if constexpr (T == DType::Q8_0) {
    const uint8_t* blk = row + (k >> 5) * 34;
    return static_cast<float>(static_cast<int8_t>(blk[2 + (k & 31)])) * h2f(u16(blk));
  } else if constexpr (T == DType::Q4_K || T == DType::Q5_K) {
    constexpr int kBytes = T == DType::Q4_K ? 144 : 176;
    constexpr int kQs = T == DType::Q4_K ? 16 : 48;
    const uint8_t* blk = row + (k >> 8) * kBytes;
    const int j = static_cast<int>(k & 255);
    const int c = j >> 6, half = (j >> 5) & 1, l = j & 31;
    int sc, m;
    k_scale_min(2 * c + half, blk + 4, &sc, &m);
    int q = (blk[kQs + 32 * c + l] >> (4 * half)) & 15;
    if constexpr (T == DType::Q5_K) q += ((blk[16 + l] >> (2 * c + half)) & 1) << 4;
    return h2f(u16(blk)) * sc * static_cast<float>(q) - h2f(u16(blk + 2)) * m;
  } else if constexpr (T == DType::Q6_K) {
    const uint8_t* blk = row + (k >> 8) * 210;
    const int j = static_cast<int>(k & 255);
    const int h = j >> 7, quarter = (j >> 5) & 3, l = j & 31;
    const int q = ((blk[64 * h + 32 * (quarter & 1) + l] >> (4 * (quarter >> 1))) & 15) |
                  (((blk[128 + 32 * h + l] >> (2 * quarter)) & 3) << 4);
    const int sc = static_cast<int8_t>(blk[192 + 8 * h + (l >> 4) + 2 * quarter]);
    return h2f(u16(blk + 208)) * static_cast<float>(sc) * static_cast<float>(q - 32);
  } else {
    return 0.0f;
  }
}

}  // namespace ds::cuda::qdec
