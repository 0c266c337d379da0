// Device-side decoding of weight rows for the CUDA matrix kernels: decode8 turns 8 consecutive elements
// of a row into floats, decode1 one element (generic path), decode_unit_q8 the integer codes and scales
// of one 32-element unit for the int8-activation kernel (matvec_q8.cuh). Layouts: quant/blocks.h; the
// definition of correct is quant::dequantize_row. Included by .cu files (production and kernels/).
// Non-obvious choice: decode8 assumes the row start has the type's kRowAlign alignment, which makes
// Q4_K/Q5_K/F32/F16/BF16 reads 8- or 16-byte wide; Q4_0/Q5_0/Q8_0/Q6_K blocks are only 2-byte
// aligned (18/22/34/210-byte blocks), so their reads are built from 16-bit loads (decode8) or from
// aligned 32-bit loads realigned with a funnel shift (decode_unit_q8). Q6_K_G4, the device layout of
// Q6_K made at upload (quant/blocks.h GroupQ6_K4), has every part of a block 16-byte aligned: the
// one-token product reads it in 16-byte words with no realignment.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "core/dtype.h"
#include "quant/blocks.h"

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
    case DType::Q6_K_G4: return {1024, quant::kGroupQ6K4Bytes, 16, 2048};
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

// Q6_K and its device layout Q6_K_G4: the same 256-element blocks, whose parts lie together (Q6_K) or
// in the parts' arrays of a 4-block group (Q6_K_G4).
__host__ __device__ constexpr bool is_q6_k(DType t) { return t == DType::Q6_K || t == DType::Q6_K_G4; }

// Where the parts of 256-element block i of a row lie.
struct Q6Parts {
  const uint8_t* ql;  // [128] low 4 bits
  const uint8_t* qh;  // [64] high 2 bits
  const uint8_t* sc;  // [16] int8 sub-block scales
  const uint8_t* d;   // fp16 block scale
};
template <DType T>
__device__ __forceinline__ Q6Parts q6_parts(const uint8_t* row, int64_t i) {
  static_assert(is_q6_k(T));
  if constexpr (T == DType::Q6_K) {
    const uint8_t* p = row + i * 210;
    return {p, p + 128, p + 192, p + 208};
  } else {
    const uint8_t* g = row + (i >> 2) * quant::kGroupQ6K4Bytes;
    const int b = static_cast<int>(i & 3);
    return {g + 128 * b, g + quant::kGroupQ6K4Qh + 64 * b, g + quant::kGroupQ6K4Scales + 16 * b,
            g + quant::kGroupQ6K4D + 2 * b};
  }
}
// 4 bytes of a Q6_K part at an offset that is a multiple of 4: 2-byte aligned in Q6_K, 4-byte in Q6_K_G4.
template <DType T>
__device__ __forceinline__ uint32_t q6_ld32(const uint8_t* p) {
  if constexpr (T == DType::Q6_K) {
    return ld32_a2(p);
  } else {
    return *reinterpret_cast<const uint32_t*>(p);
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
  } else if constexpr (is_q6_k(T)) {
    const Q6Parts b = q6_parts<T>(row, e >> 8);
    const int j = static_cast<int>(e & 255);
    const int h = j >> 7, quarter = (j >> 5) & 3, l0 = j & 31;
    const uint8_t* ql = b.ql + 64 * h + 32 * (quarter & 1) + l0;
    const uint8_t* qh = b.qh + 32 * h + l0;
    const int lshift = 4 * (quarter >> 1), hshift = 2 * quarter;
    const uint32_t w[2] = {((q6_ld32<T>(ql) >> lshift) & 0x0F0F0F0Fu) | (((q6_ld32<T>(qh) >> hshift) & 0x03030303u) << 4),
                           ((q6_ld32<T>(ql + 4) >> lshift) & 0x0F0F0F0Fu) |
                               (((q6_ld32<T>(qh + 4) >> hshift) & 0x03030303u) << 4)};
    const int sc = static_cast<int8_t>(b.sc[8 * h + (l0 >> 4) + 2 * quarter]);
    const float d = h2f(ld16(b.d)) * static_cast<float>(sc);
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
  } else if constexpr (is_q6_k(T)) {
    const Q6Parts b = q6_parts<T>(row, k >> 8);
    const int j = static_cast<int>(k & 255);
    const int h = j >> 7, quarter = (j >> 5) & 3, l = j & 31;
    const int q = ((b.ql[64 * h + 32 * (quarter & 1) + l] >> (4 * (quarter >> 1))) & 15) |
                  (((b.qh[32 * h + l] >> (2 * quarter)) & 3) << 4);
    const int sc = static_cast<int8_t>(b.sc[8 * h + (l >> 4) + 2 * quarter]);
    return h2f(u16(b.d)) * static_cast<float>(sc) * static_cast<float>(q - 32);
  } else {
    return 0.0f;
  }
}

// ---- int8-activation units (matvec_q8.cuh) ----
// One 32-element unit of a weight row as integer codes for __dp4a against 32 int8 activations:
// dot(row unit, x block) = dw * d_x * isum + mw * s_x, with isum = dot(codes, q_x) (Q6_K: sc0 * dot
// of elements 0-15 + sc1 * dot of 16-31), d_x the activation block's scale and s_x = d_x * sum(q_x).
struct Q8Unit {
  uint32_t q[8];  // codes of elements 4i .. 4i+3 in the bytes of q[i] (int8; unsigned types are < 128);
                  // Q4_K: unsigned bytes, the codes times 2^shift; Q6_K (and _G4): unsigned bytes, the
                  // codes plus 32
  float dw;       // multiplies d_x * isum
  float mw;       // multiplies s_x: the min (Q4_K, Q5_K) or offset (Q4_0 -8 d, Q5_0 -16 d) term; else 0
  int sc0, sc1;   // Q6_K sub-block scales; 1 otherwise
  int shift;      // Q4_K: the dot of q with the activations is isum * 2^shift (0 or 4); else 0
};

// Types with an int8-activation unit decoder, and the ones whose blocks are 16-byte multiples.
__host__ __device__ constexpr bool q8_supported(DType t) {
  return t == DType::Q4_0 || t == DType::Q5_0 || t == DType::Q8_0 || t == DType::Q4_K || t == DType::Q5_K ||
         is_q6_k(t);
}
__host__ __device__ constexpr bool q8_aligned16(DType t) {
  return t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K_G4;
}

// n 32-bit words of the bytes at p, a 2-byte aligned address: aligned loads of the n+1 words around
// them, realigned by a funnel shift of 0 or 16 bits (reads up to 3 bytes past p + 4n).
template <int N>
__device__ __forceinline__ void words_a2(const uint8_t* p, uint32_t (&out)[N]) {
  const int mis = static_cast<int>(reinterpret_cast<uintptr_t>(p) & 3);
  const uint32_t* w = reinterpret_cast<const uint32_t*>(p - mis);
  const uint32_t sh = 8u * static_cast<uint32_t>(mis);
  uint32_t prev = w[0];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const uint32_t next = w[i + 1];
    out[i] = __funnelshift_r(prev, next, sh);
    prev = next;
  }
}

// Bits 0..3 of v to bit 4 of bytes 0..3 (the shifted copies of v do not overlap, so no carries).
__device__ __forceinline__ uint32_t spread4_bit4(uint32_t v) { return (v * 0x02040810u) & 0x10101010u; }

// The float scales of sub-block j of a Q4_K / Q5_K block whose first 16 bytes (d, dmin, scales[12])
// are h: dw = d * sc and mw = -dmin * m, each rounded once. The 6-bit scale and min (see k_scale_min)
// are bytes j % 4 of scales[0..3], [4..7], [8..11], each moved to byte 0 by one byte permute.
__device__ __forceinline__ void k_unit_scales(const uint4& h, int j, float& dw, float& mw) {
  const uint32_t sel = 0x4440u | static_cast<uint32_t>(j & 3);
  const uint32_t b1 = __byte_perm(h.y, 0u, sel), b2 = __byte_perm(h.z, 0u, sel), b3 = __byte_perm(h.w, 0u, sel);
  const uint32_t sc = j < 4 ? (b1 & 63u) : ((b3 & 0xFu) | ((b1 >> 6) << 4));
  const uint32_t m = j < 4 ? (b2 & 63u) : ((b3 >> 4) | ((b2 >> 6) << 4));
  dw = h2f(static_cast<uint16_t>(h.x & 0xFFFFu)) * static_cast<float>(sc);
  mw = -h2f(static_cast<uint16_t>(h.x >> 16)) * static_cast<float>(m);
}

// Unit u (elements 32u .. 32u+31) of the row bytes at `row`. Q4_K / Q5_K need `row` 16-byte aligned
// (16-byte loads); the other types 2-byte aligned.
template <DType T>
__device__ __forceinline__ void decode_unit_q8(const uint8_t* row, int u, Q8Unit& o) {
  o.sc0 = 1;
  o.sc1 = 1;
  o.mw = 0.0f;
  o.shift = 0;
  if constexpr (T == DType::Q4_K || T == DType::Q5_K) {
    constexpr int kBytes = T == DType::Q4_K ? 144 : 176;
    constexpr int kQs = T == DType::Q4_K ? 16 : 48;
    const uint8_t* p = row + (u >> 3) * kBytes;
    const int j = u & 7, c = j >> 1, half = j & 1;
    k_unit_scales(*reinterpret_cast<const uint4*>(p), j, o.dw, o.mw);
    const uint4* qs = reinterpret_cast<const uint4*>(p + kQs + 32 * c);  // 32 bytes: sub-blocks 2c, 2c+1
    const uint4 q0 = qs[0], q1 = qs[1];
    const uint32_t w[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
    if constexpr (T == DType::Q4_K) {
      // The high nibbles stay in place (16 times the code, an unsigned byte): one mask per word, and the
      // dot is shifted back once (q8_unit_dot).
      const uint32_t mask = 0x0F0F0F0Fu << (4 * half);
#pragma unroll
      for (int i = 0; i < 8; ++i) o.q[i] = w[i] & mask;
      o.shift = 4 * half;
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) o.q[i] = (w[i] >> (4 * half)) & 0x0F0F0F0Fu;
    }
    if constexpr (T == DType::Q5_K) {
      const uint4* qh = reinterpret_cast<const uint4*>(p + 16);  // bit j of qh[l]: 5th bit of element l
      const uint4 h0 = qh[0], h1 = qh[1];
      const uint32_t hw[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) o.q[i] |= ((hw[i] >> j) & 0x01010101u) << 4;
    }
  } else if constexpr (is_q6_k(T)) {
    const Q6Parts b = q6_parts<T>(row, u >> 3);
    const int j = u & 7, hh = j >> 2, quarter = j & 3;
    // The 2 high bits of each code sit at bits hs, hs + 1 of each byte of hi; a rotation by 4 - hs
    // (mod 32) puts them at bits 4, 5, and whatever wraps around is masked off.
    const int ls = 4 * (quarter >> 1);
    const uint32_t rot = static_cast<uint32_t>(4 - 2 * quarter) & 31u;
    auto code = [&](uint32_t lo, uint32_t hi) {  // 4 codes, 0..63
      return ((lo >> ls) & 0x0F0F0F0Fu) | (__funnelshift_l(hi, hi, rot) & 0x30303030u);
    };
    if constexpr (T == DType::Q6_K) {
      uint32_t lo[8], hi[8];
      words_a2<8>(b.ql + 64 * hh + 32 * (quarter & 1), lo);
      words_a2<8>(b.qh + 32 * hh, hi);
#pragma unroll
      for (int i = 0; i < 8; ++i) o.q[i] = code(lo[i], hi[i]);
    } else {  // 16-byte aligned parts: four 16-byte loads, no realignment; each pair decoded at once
      const uint4* l4 = reinterpret_cast<const uint4*>(b.ql + 64 * hh + 32 * (quarter & 1));
      const uint4* h4 = reinterpret_cast<const uint4*>(b.qh + 32 * hh);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const uint4 l = l4[half], h = h4[half];
        o.q[4 * half] = code(l.x, h.x);
        o.q[4 * half + 1] = code(l.y, h.y);
        o.q[4 * half + 2] = code(l.z, h.z);
        o.q[4 * half + 3] = code(l.w, h.w);
      }
    }
    const uint32_t s = ld16(b.sc + 8 * hh + 2 * quarter);  // scales of elements 0-15 and 16-31
    o.sc0 = static_cast<int8_t>(s & 0xFFu);
    o.sc1 = static_cast<int8_t>(s >> 8);
    o.dw = h2f(ld16(b.d));
  } else if constexpr (T == DType::Q8_0) {
    const uint8_t* p = row + u * 34;
    o.dw = h2f(ld16(p));
    words_a2<8>(p + 2, o.q);
  } else if constexpr (T == DType::Q4_0) {
    const uint8_t* p = row + u * 18;
    const float d = h2f(ld16(p));
    uint32_t w[4];
    words_a2<4>(p + 2, w);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      o.q[i] = w[i] & 0x0F0F0F0Fu;             // elements 4i .. 4i+3: low nibbles
      o.q[4 + i] = (w[i] >> 4) & 0x0F0F0F0Fu;  // elements 16+4i ..: high nibbles
    }
    o.dw = d;
    o.mw = -8.0f * d;
  } else if constexpr (T == DType::Q5_0) {
    const uint8_t* p = row + u * 22;
    const float d = h2f(ld16(p));
    uint32_t w[5];  // qh, then qs[16]
    words_a2<5>(p + 2, w);
    const uint32_t qh = w[0];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      o.q[i] = (w[1 + i] & 0x0F0F0F0Fu) | spread4_bit4((qh >> (4 * i)) & 0xFu);
      o.q[4 + i] = ((w[1 + i] >> 4) & 0x0F0F0F0Fu) | spread4_bit4((qh >> (16 + 4 * i)) & 0xFu);
    }
    o.dw = d;
    o.mw = -16.0f * d;
  }
}

}  // namespace ds::cuda::qdec
