// Int8-activation matrix-vector product, version 5 (workbench v5), included by ops/cuda/matvec.cu, the
// kernels/matvec_q.cu workbench and (host part only) tests/cuda_matmul_test.cpp. Same activations as
// v4 (matvec_q8.cuh: quantize_q8, q8_act_bytes, q8_ds_offset) and the same MatvecQ8Args, gathered
// (MoE) mode included: y[t, r] = sum over the row's 32-element blocks of dw * d_x * isum + mw * s_x.
//  - No shared memory on the weight path: each lane loads its weight bytes with 16-byte non-coherent
//    loads (__ldg) straight into registers; the loads of the next kDepth steps are issued before the
//    current step's dot products (a register ring, unrolled so that every ring index is a constant).
//  - A "piece" is 32 elements of one row and belongs to one lane; a warp step is 32 consecutive pieces
//    (1024 elements) of kRows rows. K-quants: 8 lanes per 256-element block, lane i reads the 16 code
//    bytes [16 i, 16 i + 16) of the block's code array, i.e. half of two sub-blocks (two activation
//    blocks), plus the scales it needs; 32-element types (Q4_0, Q5_0, Q8_0): one block per lane.
//  - Blocks that are only 2-byte aligned (Q4_0 18 B, Q5_0 22 B, Q8_0 34 B, Q6_K 210 B) are read as the
//    16-byte aligned granules covering the bytes needed and realigned in registers (word selects and a
//    funnel shift). A granule holding no needed byte is not read; one reaching past the end of the
//    tensor is read bytewise up to the end (never past it).
//  - Split-K (runtime `split` of 1, 2 or 4 warps per row group, for matrices with few rows): the warps
//    of a group take every split-th step and add their sums through shared memory in warp order, so
//    results do not depend on timing. The grid may be smaller than the work (a persistent grid): CTAs
//    stride over the row groups.
// Non-obvious choice: the per-lane work (loads, realignment, decode, dot products) is written as
// __host__ __device__ functions over plain integers, so tests run the same indexing on the CPU
// (q8v5_emulate, loads checked against the tensor bounds) without a GPU; the CPU compile of this header
// includes no CUDA header, and the kernel itself is only compiled by nvcc.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/dtype.h"
#include "core/half.h"
#include "ops/cuda/matvec_q8_args.h"
#include "quant/blocks.h"

#ifdef __CUDACC__
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "ops/cuda/matvec_kernels.cuh"
#include "ops/cuda/matvec_q8.cuh"
#define DS_Q8V5_HD __host__ __device__ __forceinline__
#define DS_Q8V5_UNROLL _Pragma("unroll")
#else
#define DS_Q8V5_HD inline
#define DS_Q8V5_UNROLL
#endif

namespace ds::cuda::kern {

constexpr int kQ8v5Threads = 128;  // 4 warps per CTA
constexpr int kQ8v5Warps = kQ8v5Threads / 32;
constexpr int kQ8v5MaxSplit = kQ8v5Warps;
constexpr int kQ8v5StepPieces = 32;  // pieces (of 32 elements) per warp step: one per lane

// What one lane reads of the weights and activations; raw pointers as integers so that the host
// emulation and the device run the same arithmetic.
struct Q8v5View {
  uintptr_t w = 0;      // weight rows (gathered: the slot's expert)
  int64_t w_stride = 0; // bytes between rows
  uintptr_t w_hi = 0;   // end of the last row's bytes: no load reaches past it
  uintptr_t xq = 0;     // int8 codes [n_tokens, k] (the slot's activation row in gathered mode)
  uintptr_t xds = 0;    // float2 (d, d * sum q) [n_tokens, k / 32]
  int64_t n_rows = 0;
  int64_t k = 0;        // multiple of the type's block
  int n_tokens = 1;
};

struct Q8v5U4 {
  uint32_t x, y, z, w;
};
struct Q8v5F2 {
  float x, y;
};

#ifndef __CUDA_ARCH__
// Host emulation only: address ranges that loads must stay inside (empty = unchecked). Set by tests
// around q8v5_emulate, single-threaded use.
struct Q8v5HostRanges {
  uintptr_t lo[4] = {}, hi[4] = {};
  int n = 0;
};
inline Q8v5HostRanges& q8v5_host_ranges() {
  static Q8v5HostRanges r;
  return r;
}
inline void q8v5_host_check(uintptr_t p, int bytes) {
  const Q8v5HostRanges& r = q8v5_host_ranges();
  if (r.n == 0) return;
  for (int i = 0; i < r.n; ++i) {
    if (p >= r.lo[i] && p + static_cast<uintptr_t>(bytes) <= r.hi[i]) return;
  }
  std::fprintf(stderr, "q8v5 emulation: load of %d bytes at %#llx is outside every tensor range\n", bytes,
               static_cast<unsigned long long>(p));
  std::abort();
}
#endif

// ---- loads and integer helpers (device intrinsics, or their host equivalents) ----
DS_Q8V5_HD Q8v5U4 q8v5_ld16(uintptr_t p) {
#ifdef __CUDA_ARCH__
  const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
  return {v.x, v.y, v.z, v.w};
#else
  q8v5_host_check(p, 16);
  Q8v5U4 v;
  std::memcpy(&v, reinterpret_cast<const void*>(p), 16);
  return v;
#endif
}
DS_Q8V5_HD Q8v5F2 q8v5_ldf2(uintptr_t p) {
#ifdef __CUDA_ARCH__
  const float2 v = __ldg(reinterpret_cast<const float2*>(p));
  return {v.x, v.y};
#else
  q8v5_host_check(p, 8);
  Q8v5F2 v;
  std::memcpy(&v, reinterpret_cast<const void*>(p), 8);
  return v;
#endif
}
DS_Q8V5_HD uint32_t q8v5_ld8(uintptr_t p) {
#ifdef __CUDA_ARCH__
  return __ldg(reinterpret_cast<const unsigned char*>(p));
#else
  q8v5_host_check(p, 1);
  return *reinterpret_cast<const uint8_t*>(p);
#endif
}
DS_Q8V5_HD uint32_t q8v5_ld_u16(uintptr_t p) {  // p 2-byte aligned
#ifdef __CUDA_ARCH__
  return __ldg(reinterpret_cast<const unsigned short*>(p));
#else
  q8v5_host_check(p, 2);
  uint16_t v;
  std::memcpy(&v, reinterpret_cast<const void*>(p), 2);
  return v;
#endif
}
// 16 bytes at the aligned granule g, bytes at or past `hi` read as zero (and not read).
DS_Q8V5_HD Q8v5U4 q8v5_ld16_upto(uintptr_t g, uintptr_t hi) {
  if (g + 16 <= hi) return q8v5_ld16(g);
  uint32_t w[4] = {0, 0, 0, 0};
  for (int b = 0; b < 16; ++b) {
    if (g + b < hi) w[b / 4] |= q8v5_ld8(g + b) << (8 * (b % 4));
  }
  return {w[0], w[1], w[2], w[3]};
}
DS_Q8V5_HD int q8v5_dp4a(uint32_t a, uint32_t b, int c) {
#ifdef __CUDA_ARCH__
  return __dp4a(static_cast<int>(a), static_cast<int>(b), c);
#else
  for (int i = 0; i < 4; ++i) {
    c += static_cast<int>(static_cast<int8_t>(a >> (8 * i))) * static_cast<int>(static_cast<int8_t>(b >> (8 * i)));
  }
  return c;
#endif
}
// Bits [sh, sh + 32) of the 64-bit value hi:lo (sh in 0..31).
DS_Q8V5_HD uint32_t q8v5_funnel(uint32_t lo, uint32_t hi, uint32_t sh) {
#ifdef __CUDA_ARCH__
  return __funnelshift_r(lo, hi, sh);
#else
  return static_cast<uint32_t>(((static_cast<uint64_t>(hi) << 32) | lo) >> (sh & 31));
#endif
}
DS_Q8V5_HD float q8v5_h2f(uint32_t bits) {
#ifdef __CUDA_ARCH__
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits & 0xFFFFu)));
#else
  return fp16_to_f32(static_cast<uint16_t>(bits & 0xFFFFu));
#endif
}
DS_Q8V5_HD uint32_t q8v5_byte(uint32_t w, int i) { return (w >> (8 * i)) & 0xFFu; }
// Bits 0..3 of v to bit 4 of bytes 0..3 (the shifted copies do not overlap: no carries).
DS_Q8V5_HD uint32_t q8v5_spread4_bit4(uint32_t v) { return (v * 0x02040810u) & 0x10101010u; }

// out[j] = bytes [m + 4j, m + 4j + 4) of the little-endian byte string w[0..NIn) (m <= kMaxM; bytes
// past the end of w read as zero): selects by 16, 8 and 4 bytes, then a funnel shift by m % 4 bytes.
template <int NOut, int kMaxM, int NIn>
DS_Q8V5_HD void q8v5_realign(const uint32_t (&w)[NIn], uint32_t m, uint32_t (&out)[NOut]) {
  static_assert(kMaxM < 32, "q8v5_realign: shift of at most 31 bytes");
  uint32_t v[NIn + 1];
DS_Q8V5_UNROLL
  for (int j = 0; j < NIn; ++j) v[j] = w[j];
  v[NIn] = 0;
  // In place, ascending: v[j + s] is read before it is overwritten.
  if constexpr (kMaxM >= 16) {
    const bool s = (m & 16u) != 0;
DS_Q8V5_UNROLL
    for (int j = 0; j <= NIn; ++j) v[j] = s ? (j + 4 <= NIn ? v[j + 4] : 0u) : v[j];
  }
  if constexpr (kMaxM >= 8) {
    const bool s = (m & 8u) != 0;
DS_Q8V5_UNROLL
    for (int j = 0; j <= NIn; ++j) v[j] = s ? (j + 2 <= NIn ? v[j + 2] : 0u) : v[j];
  }
  if constexpr (kMaxM >= 4) {
    const bool s = (m & 4u) != 0;
DS_Q8V5_UNROLL
    for (int j = 0; j <= NIn; ++j) v[j] = s ? (j + 1 <= NIn ? v[j + 1] : 0u) : v[j];
  }
  const uint32_t sh = 8u * (m & 3u);
DS_Q8V5_UNROLL
  for (int j = 0; j < NOut; ++j) out[j] = q8v5_funnel(j < NIn + 1 ? v[j] : 0u, j + 1 <= NIn ? v[j + 1] : 0u, sh);
}

// The G aligned granules a + 16 j (a = p rounded down to 16) covering the n bytes at p, into raw. A
// granule that holds none of the n bytes is not read (it repeats the previous one: never used);
// kCheckEnd: a granule reaching past hi is read bytewise up to hi.
template <int G, bool kCheckEnd>
DS_Q8V5_HD void q8v5_load_span(uintptr_t p, int n, uintptr_t hi, uint32_t (&raw)[4 * G]) {
  const uintptr_t a = p & ~uintptr_t{15};
  Q8v5U4 prev{0, 0, 0, 0};
DS_Q8V5_UNROLL
  for (int j = 0; j < G; ++j) {
    const uintptr_t g = a + 16 * static_cast<uintptr_t>(j);
    Q8v5U4 v = prev;
    if (j == 0 || g < p + static_cast<uintptr_t>(n)) v = kCheckEnd ? q8v5_ld16_upto(g, hi) : q8v5_ld16(g);
    raw[4 * j] = v.x;
    raw[4 * j + 1] = v.y;
    raw[4 * j + 2] = v.z;
    raw[4 * j + 3] = v.w;
    prev = v;
  }
}

// One decoded piece of a row: 32 int8 codes in two halves of 16 (q[0..4) and q[4..8)), each half
// multiplying 16 activations of one activation block: dot = dw_h * d_x * isum_h (+ mw_h * s_x).
struct Q8v5Dec {
  uint32_t q[8];
  float dw0, dw1;  // per half (32-element types: dw0 for the whole block)
  float mw0, mw1;  // min / offset terms, applied once per activation block (0 where not applied)
};

// 6-bit scale and min of sub-block j of a Q4_K / Q5_K block from its header words (h1 = scales[0..3],
// h2 = scales[4..7], h3 = scales[8..11]); as qdec::k_scale_min.
DS_Q8V5_HD void q8v5_k_scale_min(int j, uint32_t h1, uint32_t h2, uint32_t h3, uint32_t* sc, uint32_t* m) {
  const int jj = j & 3;
  const uint32_t b1 = q8v5_byte(h1, jj), b2 = q8v5_byte(h2, jj), b3 = q8v5_byte(h3, jj);
  *sc = j < 4 ? (b1 & 63u) : ((b3 & 0xFu) | ((b1 >> 6) << 4));
  *m = j < 4 ? (b2 & 63u) : ((b3 >> 4) | ((b2 >> 6) << 4));
}

// Per type: kRaw registers of loads per piece, load(), decode(), and the elements the two halves cover.
template <DType T>
struct Q8v5Type;

// Q4_K (144 B: d, dmin, scales[12], qs[128]) / Q5_K (176 B: d, dmin, scales[12], qh[32], qs[128]).
// Lane i of a block: qs bytes [16 i, 16 i + 16) = elements l0 .. l0 + 15 (l0 = 16 (i & 1)) of
// sub-blocks 2c (low nibbles) and 2c + 1 (high nibbles), c = i / 2. Q5_K: qh bytes l0 .. l0 + 15 hold
// the fifth bits (bit j for sub-block j). The mins are applied by the even lane of each pair.
template <DType T>
struct Q8v5KQuant {
  static constexpr bool kQ5 = T == DType::Q5_K;
  static constexpr int kBlockBytes = kQ5 ? 176 : 144;
  static constexpr int kQs = kQ5 ? 48 : 16;
  static constexpr int kRaw = kQ5 ? 12 : 8;
  static constexpr bool kTwoBlocks = true;
  static constexpr bool kCheckEnd = false;
  DS_Q8V5_HD static void elems(int piece, int* e0, int* e1) {
    const int i = piece & 7;
    *e0 = 256 * (piece >> 3) + 64 * (i >> 1) + 16 * (i & 1);
    *e1 = *e0 + 32;
  }
  DS_Q8V5_HD static void load(uintptr_t row, int piece, uintptr_t /*hi*/, uint32_t (&raw)[kRaw]) {
    const int i = piece & 7;
    const uintptr_t blk = row + static_cast<uint32_t>((piece >> 3) * kBlockBytes);
    const Q8v5U4 h = q8v5_ld16(blk);
    const Q8v5U4 q = q8v5_ld16(blk + kQs + 16 * i);
    raw[0] = h.x; raw[1] = h.y; raw[2] = h.z; raw[3] = h.w;
    raw[4] = q.x; raw[5] = q.y; raw[6] = q.z; raw[7] = q.w;
    if constexpr (kQ5) {
      const Q8v5U4 qh = q8v5_ld16(blk + 16 + 16 * (i & 1));
      raw[8] = qh.x; raw[9] = qh.y; raw[10] = qh.z; raw[11] = qh.w;
    }
  }
  DS_Q8V5_HD static void decode(const uint32_t (&raw)[kRaw], uintptr_t /*row*/, int piece, Q8v5Dec& o) {
    const int i = piece & 7, c = i >> 1;
    uint32_t sc0, m0, sc1, m1;
    q8v5_k_scale_min(2 * c, raw[1], raw[2], raw[3], &sc0, &m0);
    q8v5_k_scale_min(2 * c + 1, raw[1], raw[2], raw[3], &sc1, &m1);
    const float d = q8v5_h2f(raw[0]), dmin = q8v5_h2f(raw[0] >> 16);
    o.dw0 = d * static_cast<float>(sc0);
    o.dw1 = d * static_cast<float>(sc1);
    const bool mins = (i & 1) == 0;
    o.mw0 = mins ? -dmin * static_cast<float>(m0) : 0.0f;
    o.mw1 = mins ? -dmin * static_cast<float>(m1) : 0.0f;
DS_Q8V5_UNROLL
    for (int j = 0; j < 4; ++j) {
      o.q[j] = raw[4 + j] & 0x0F0F0F0Fu;
      o.q[4 + j] = (raw[4 + j] >> 4) & 0x0F0F0F0Fu;
    }
    if constexpr (kQ5) {
DS_Q8V5_UNROLL
      for (int j = 0; j < 4; ++j) {
        o.q[j] |= ((raw[8 + j] >> (2 * c)) & 0x01010101u) << 4;
        o.q[4 + j] |= ((raw[8 + j] >> (2 * c + 1)) & 0x01010101u) << 4;
      }
    }
  }
};
template <>
struct Q8v5Type<DType::Q4_K> : Q8v5KQuant<DType::Q4_K> {};
template <>
struct Q8v5Type<DType::Q5_K> : Q8v5KQuant<DType::Q5_K> {};

// A Q6_K piece from its 16 ql bytes (quarters qa and qa + 2 in the low / high nibbles), its 16 qh bytes,
// its two scale bytes and the block's d: codes c - 32 per byte as int8 (c + 0x60 never carries).
DS_Q8V5_HD void q8v5_q6_decode(const uint32_t (&ql)[4], const uint32_t (&qh)[4], int qa, uint32_t sc0, uint32_t sc1,
                               uint32_t d_bits, Q8v5Dec& o) {
DS_Q8V5_UNROLL
  for (int j = 0; j < 4; ++j) {
    const uint32_t c0 = (ql[j] & 0x0F0F0F0Fu) | (((qh[j] >> (2 * qa)) & 0x03030303u) << 4);
    const uint32_t c1 = ((ql[j] >> 4) & 0x0F0F0F0Fu) | (((qh[j] >> (2 * qa + 4)) & 0x03030303u) << 4);
    o.q[j] = (c0 + 0x60606060u) ^ 0x80808080u;
    o.q[4 + j] = (c1 + 0x60606060u) ^ 0x80808080u;
  }
  const float d = q8v5_h2f(d_bits);
  o.dw0 = d * static_cast<float>(static_cast<int8_t>(sc0 & 0xFFu));
  o.dw1 = d * static_cast<float>(static_cast<int8_t>(sc1 & 0xFFu));
  o.mw0 = 0.0f;
  o.mw1 = 0.0f;
}

// Q6_K (210 B: ql[128], qh[64], scales[16] int8, d). Element 128 h + 32 q + l (quarter q, l < 32) has
// low 4 bits in ql[64 h + 32 (q & 1) + l] (nibble q / 2), high 2 bits in qh[32 h + l] (bits 2q, 2q+1),
// scale scales[8 h + 2 q + l / 16]. Lane i of a block: h = i / 4, qa = (i / 2) & 1, l0 = 16 (i & 1):
// ql bytes [16 i, 16 i + 16) hold quarters qa (low nibbles) and qa + 2 (high) at l0 .. l0 + 15; qh bytes
// 32 h + l0 .. + 15; scales 8 h + (i & 3) and + 4. Both 16-byte spans are realigned from two granules;
// they never reach the tensor end (scales and d follow them).
template <>
struct Q8v5Type<DType::Q6_K> {
  static constexpr int kBlockBytes = 210;
  static constexpr int kRaw = 19;  // ql granules 0..7, qh granules 8..15, sc0, sc1, d
  static constexpr bool kTwoBlocks = true;
  DS_Q8V5_HD static void elems(int piece, int* e0, int* e1) {
    const int i = piece & 7;
    *e0 = 256 * (piece >> 3) + 128 * (i >> 2) + 32 * ((i >> 1) & 1) + 16 * (i & 1);
    *e1 = *e0 + 64;
  }
  DS_Q8V5_HD static void load(uintptr_t row, int piece, uintptr_t hi, uint32_t (&raw)[kRaw]) {
    const int i = piece & 7;
    const uintptr_t blk = row + static_cast<uint32_t>((piece >> 3) * kBlockBytes);
    uint32_t ql[8], qh[8];
    q8v5_load_span<2, false>(blk + 16 * i, 16, hi, ql);
    q8v5_load_span<2, false>(blk + 128 + 32 * (i >> 2) + 16 * (i & 1), 16, hi, qh);
DS_Q8V5_UNROLL
    for (int j = 0; j < 8; ++j) {
      raw[j] = ql[j];
      raw[8 + j] = qh[j];
    }
    const uintptr_t sc = blk + 192 + 8 * (i >> 2) + (i & 3);
    raw[16] = q8v5_ld8(sc);
    raw[17] = q8v5_ld8(sc + 4);
    raw[18] = q8v5_ld_u16(blk + 208);
  }
  DS_Q8V5_HD static void decode(const uint32_t (&raw)[kRaw], uintptr_t row, int piece, Q8v5Dec& o) {
    const int i = piece & 7, qa = (i >> 1) & 1;
    const uintptr_t blk = row + static_cast<uint32_t>((piece >> 3) * kBlockBytes);
    const uint32_t m = static_cast<uint32_t>(blk & 15);  // the same for both spans (offsets are 16-multiples)
    uint32_t gl[8], gh[8], ql[4], qh[4];
DS_Q8V5_UNROLL
    for (int j = 0; j < 8; ++j) {
      gl[j] = raw[j];
      gh[j] = raw[8 + j];
    }
    q8v5_realign<4, 15>(gl, m, ql);
    q8v5_realign<4, 15>(gh, m, qh);
    q8v5_q6_decode(ql, qh, qa, raw[16], raw[17], raw[18], o);
  }
};

// Q6_K_G4 (quant/blocks.h GroupQ6_K4: the parts of four Q6_K blocks gathered, 848 bytes per 1024
// elements): the pieces of Q6_K, each span one aligned 16-byte load (no realignment); decodes to the
// same codes and scales as Q6_K.
template <>
struct Q8v5Type<DType::Q6_K_G4> {
  static constexpr int kGroupBytes = quant::kGroupQ6K4Bytes;
  static constexpr int kRaw = 11;  // ql, qh (4 words each), sc0, sc1, d
  static constexpr bool kTwoBlocks = true;
  DS_Q8V5_HD static void elems(int piece, int* e0, int* e1) { Q8v5Type<DType::Q6_K>::elems(piece, e0, e1); }
  DS_Q8V5_HD static void load(uintptr_t row, int piece, uintptr_t /*hi*/, uint32_t (&raw)[kRaw]) {
    const int i = piece & 7, b = piece >> 3, sub = b & 3;
    const uintptr_t grp = row + static_cast<uint32_t>((b >> 2) * kGroupBytes);
    const Q8v5U4 ql = q8v5_ld16(grp + 128 * sub + 16 * i);
    const Q8v5U4 qh = q8v5_ld16(grp + quant::kGroupQ6K4Qh + 64 * sub + 32 * (i >> 2) + 16 * (i & 1));
    raw[0] = ql.x; raw[1] = ql.y; raw[2] = ql.z; raw[3] = ql.w;
    raw[4] = qh.x; raw[5] = qh.y; raw[6] = qh.z; raw[7] = qh.w;
    const uintptr_t sc = grp + quant::kGroupQ6K4Scales + 16 * sub + 8 * (i >> 2) + (i & 3);
    raw[8] = q8v5_ld8(sc);
    raw[9] = q8v5_ld8(sc + 4);
    raw[10] = q8v5_ld_u16(grp + quant::kGroupQ6K4D + 2 * sub);
  }
  DS_Q8V5_HD static void decode(const uint32_t (&raw)[kRaw], uintptr_t /*row*/, int piece, Q8v5Dec& o) {
    const int qa = ((piece & 7) >> 1) & 1;
    const uint32_t ql[4] = {raw[0], raw[1], raw[2], raw[3]}, qh[4] = {raw[4], raw[5], raw[6], raw[7]};
    q8v5_q6_decode(ql, qh, qa, raw[8], raw[9], raw[10], o);
  }
};

// 32-element blocks, one per lane (piece = block): Q4_0 (18 B: d, qs[16]; element l < 16 low nibble of
// qs[l], l >= 16 high nibble of qs[l - 16]; value (q - 8) d), Q5_0 (22 B: d, qh (u32), qs[16]; fifth bit
// l of qh; (q - 16) d), Q8_0 (34 B: d, qs[32] int8). Half 0 = elements 0..15, half 1 = 16..31, one
// activation block. The block is read as 2 or 3 granules, realigned by its address mod 16.
template <DType T>
struct Q8v5Small {
  static constexpr int kBlockBytes = T == DType::Q4_0 ? 18 : T == DType::Q5_0 ? 22 : 34;
  static constexpr int kGranules = T == DType::Q4_0 ? 2 : 3;  // (15 + bytes) / 16 rounded up
  static constexpr int kRaw = 4 * kGranules;
  static constexpr bool kTwoBlocks = false;
  DS_Q8V5_HD static void elems(int piece, int* e0, int* e1) {
    *e0 = 32 * piece;
    *e1 = *e0 + 16;
  }
  DS_Q8V5_HD static void load(uintptr_t row, int piece, uintptr_t hi, uint32_t (&raw)[kRaw]) {
    q8v5_load_span<kGranules, true>(row + static_cast<uint32_t>(piece * kBlockBytes), kBlockBytes, hi, raw);
  }
  DS_Q8V5_HD static void decode(const uint32_t (&raw)[kRaw], uintptr_t row, int piece, Q8v5Dec& o) {
    const uint32_t m = static_cast<uint32_t>((row + static_cast<uint32_t>(piece * kBlockBytes)) & 15);
    constexpr int kWords = (kBlockBytes + 3) / 4 + 1;  // the block from its first byte, + 1 for the shift by 2
    uint32_t b[kWords];
    q8v5_realign<kWords, 15>(raw, m, b);
    const float d = q8v5_h2f(b[0]);
    uint32_t w[kWords - 1];  // the bytes after d
DS_Q8V5_UNROLL
    for (int j = 0; j + 1 < kWords; ++j) w[j] = q8v5_funnel(b[j], b[j + 1], 16);
    o.dw0 = d;
    o.dw1 = d;
    o.mw1 = 0.0f;
    if constexpr (T == DType::Q8_0) {
DS_Q8V5_UNROLL
      for (int j = 0; j < 8; ++j) o.q[j] = w[j];
      o.mw0 = 0.0f;
    } else if constexpr (T == DType::Q4_0) {
DS_Q8V5_UNROLL
      for (int j = 0; j < 4; ++j) {
        o.q[j] = w[j] & 0x0F0F0F0Fu;
        o.q[4 + j] = (w[j] >> 4) & 0x0F0F0F0Fu;
      }
      o.mw0 = -8.0f * d;
    } else {
      const uint32_t qh = w[0];
DS_Q8V5_UNROLL
      for (int j = 0; j < 4; ++j) {
        o.q[j] = (w[1 + j] & 0x0F0F0F0Fu) | q8v5_spread4_bit4((qh >> (4 * j)) & 0xFu);
        o.q[4 + j] = ((w[1 + j] >> 4) & 0x0F0F0F0Fu) | q8v5_spread4_bit4((qh >> (16 + 4 * j)) & 0xFu);
      }
      o.mw0 = -16.0f * d;
    }
  }
};
template <>
struct Q8v5Type<DType::Q4_0> : Q8v5Small<DType::Q4_0> {};
template <>
struct Q8v5Type<DType::Q5_0> : Q8v5Small<DType::Q5_0> {};
template <>
struct Q8v5Type<DType::Q8_0> : Q8v5Small<DType::Q8_0> {};

// The rows r0 .. r0 + kRows - 1 (rows past n_rows repeat the last row; their sums are not stored),
// steps step0, step0 + stride, ... of this lane: acc[r][t] += the lane's pieces of row r times token t.
template <DType T, int kNT, int kRows, int kDepth>
DS_Q8V5_HD void q8v5_lane(const Q8v5View& v, int64_t r0, int step0, int stride, int lane,
                          float (&acc)[kRows][kNT]) {
  static_assert(kRows * kNT <= 32 && kDepth >= 1, "q8v5: one lane stores each (row, token) sum");
  using Ty = Q8v5Type<T>;
  constexpr int kRing = kDepth + 1;
  const int n_pieces = static_cast<int>(v.k / 32);  // also the activation blocks per token
  const int n_steps = (n_pieces + kQ8v5StepPieces - 1) / kQ8v5StepPieces;
  uintptr_t rows[kRows];
DS_Q8V5_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const int64_t rr = r0 + r < v.n_rows ? r0 + r : v.n_rows - 1;
    rows[r] = v.w + static_cast<uintptr_t>(rr * v.w_stride);
  }
  uint32_t raw[kRing][kRows][Ty::kRaw];

  auto issue = [&](uint32_t (&dst)[kRows][Ty::kRaw], int s) {
    const int piece = s * kQ8v5StepPieces + lane;
    if (s < n_steps && piece < n_pieces) {
DS_Q8V5_UNROLL
      for (int r = 0; r < kRows; ++r) Ty::load(rows[r], piece, v.w_hi, dst[r]);
    }
  };
  auto compute = [&](const uint32_t (&src)[kRows][Ty::kRaw], int s) {
    const int piece = s * kQ8v5StepPieces + lane;
    if (piece >= n_pieces) return;
    int e0, e1;
    Ty::elems(piece, &e0, &e1);
    Q8v5Dec d[kRows];
DS_Q8V5_UNROLL
    for (int r = 0; r < kRows; ++r) Ty::decode(src[r], rows[r], piece, d[r]);
DS_Q8V5_UNROLL
    for (int t = 0; t < kNT; ++t) {
      if (t < v.n_tokens) {
        const uintptr_t xr = v.xq + static_cast<uintptr_t>(t * n_pieces * 32);
        const Q8v5U4 a0 = q8v5_ld16(xr + static_cast<uint32_t>(e0));
        const Q8v5U4 a1 = q8v5_ld16(xr + static_cast<uint32_t>(e1));
        const uintptr_t dsr = v.xds + static_cast<uintptr_t>(8 * t * n_pieces);
        const Q8v5F2 s0 = q8v5_ldf2(dsr + static_cast<uint32_t>(8 * (e0 >> 5)));
        Q8v5F2 s1 = s0;
        if constexpr (Ty::kTwoBlocks) s1 = q8v5_ldf2(dsr + static_cast<uint32_t>(8 * (e1 >> 5)));
DS_Q8V5_UNROLL
        for (int r = 0; r < kRows; ++r) {
          const Q8v5Dec& w = d[r];
          int i0 = q8v5_dp4a(w.q[0], a0.x, 0);
          i0 = q8v5_dp4a(w.q[1], a0.y, i0);
          i0 = q8v5_dp4a(w.q[2], a0.z, i0);
          i0 = q8v5_dp4a(w.q[3], a0.w, i0);
          int i1 = q8v5_dp4a(w.q[4], a1.x, 0);
          i1 = q8v5_dp4a(w.q[5], a1.y, i1);
          i1 = q8v5_dp4a(w.q[6], a1.z, i1);
          i1 = q8v5_dp4a(w.q[7], a1.w, i1);
          float s = acc[r][t];
          if constexpr (Ty::kTwoBlocks) {
            s = fmaf(w.dw0 * s0.x, static_cast<float>(i0), s);
            s = fmaf(w.dw1 * s1.x, static_cast<float>(i1), s);
            s = fmaf(w.mw0, s0.y, s);
            s = fmaf(w.mw1, s1.y, s);
          } else {
            s = fmaf(w.dw0 * s0.x, static_cast<float>(i0 + i1), s);
            s = fmaf(w.mw0, s0.y, s);
          }
          acc[r][t] = s;
        }
      }
    }
  };

  // Prologue: steps step0 + j * stride into ring slots j < kDepth.
DS_Q8V5_UNROLL
  for (int j = 0; j < kDepth; ++j) issue(raw[j], step0 + j * stride);
  for (int base = step0; base < n_steps; base += kRing * stride) {
DS_Q8V5_UNROLL
    for (int u = 0; u < kRing; ++u) {
      const int s = base + u * stride;
      if (s < n_steps) {
        issue(raw[(u + kDepth) % kRing], s + kDepth * stride);  // into the slot read in the previous step
        compute(raw[u], s);
      }
    }
  }
}

// Bytes of the k elements of one weight row.
template <DType T>
DS_Q8V5_HD constexpr int64_t q8v5_row_bytes(int64_t k) {
  if constexpr (T == DType::Q6_K_G4) {
    return k / 1024 * Q8v5Type<T>::kGroupBytes;
  } else {
    constexpr int kBlockElems = T == DType::Q4_K || T == DType::Q5_K || T == DType::Q6_K ? 256 : 32;
    return k / kBlockElems * Q8v5Type<T>::kBlockBytes;
  }
}

// The view of output slot `slot` (gathered mode) or of the whole launch, and its output base; false
// for a slot whose expert id is out of range (nothing to compute or write).
template <DType T>
DS_Q8V5_HD bool q8v5_make_view(const MatvecQ8Args& a, int slot, Q8v5View* v, float** y) {
  v->w = reinterpret_cast<uintptr_t>(a.w);
  v->xq = reinterpret_cast<uintptr_t>(a.xq);
  v->xds = reinterpret_cast<uintptr_t>(a.xds);
  *y = a.y;
  if (a.ids != nullptr) {
    const int32_t e = a.ids[slot];
    if (e < 0 || e >= a.n_expert) return false;
    v->w += static_cast<uintptr_t>(e * a.w_expert_stride);
    const int64_t xr = slot / a.x_div;
    v->xq += static_cast<uintptr_t>(xr * a.k);
    v->xds += static_cast<uintptr_t>(8 * xr * (a.k / 32));
    *y += slot * a.y_stride;
  }
  v->w_stride = a.w_stride;
  v->n_rows = a.n_rows;
  v->k = a.k;
  v->n_tokens = a.n_tokens;
  v->w_hi = v->w + static_cast<uintptr_t>((a.n_rows - 1) * a.w_stride + q8v5_row_bytes<T>(a.k));
  return true;
}

// Host emulation of a launch with `split` warps per row group, over slots [0, n_slots) (1 unless
// gathered) and row groups [g_begin, g_end) of kRows rows: every lane of every warp, the lane sums added
// in lane order. For tests: the device adds in another order, so the results agree to rounding only.
template <DType T, int kNT, int kRows, int kDepth>
void q8v5_emulate(const MatvecQ8Args& a, int split, int n_slots, int64_t g_begin, int64_t g_end) {
  for (int slot = 0; slot < n_slots; ++slot) {
    Q8v5View v;
    float* y;
    if (!q8v5_make_view<T>(a, slot, &v, &y)) continue;
    for (int64_t r0 = g_begin * kRows; r0 < v.n_rows && r0 < g_end * kRows; r0 += kRows) {
      float sum[kRows][kNT] = {};
      for (int sub = 0; sub < split; ++sub) {
        for (int lane = 0; lane < 32; ++lane) {
          float acc[kRows][kNT] = {};
          q8v5_lane<T, kNT, kRows, kDepth>(v, r0, sub, split, lane, acc);
          for (int r = 0; r < kRows; ++r)
            for (int t = 0; t < kNT; ++t) sum[r][t] += acc[r][t];
        }
      }
      for (int r = 0; r < kRows && r0 + r < v.n_rows; ++r)
        for (int t = 0; t < v.n_tokens; ++t) y[t * a.y_stride + r0 + r] = sum[r][t];
    }
  }
}

// CTAs per SM the kernel is compiled for (__launch_bounds__), i.e. its register budget: 64 registers
// per thread (8 CTAs, 32 warps per SM) for one token and a small load ring, else 80 (6) or 128 (4).
template <DType T, int kNT, int kRows, int kDepth>
constexpr int q8v5_min_ctas() {
  constexpr int ring = (kDepth + 1) * kRows * Q8v5Type<T>::kRaw;  // registers holding loads in flight
  return kNT == 1 && ring <= 32 ? 8 : ring + 4 * kRows * kNT <= 56 ? 6 : 4;
}

// Row groups (of kRows rows) per CTA iteration and CTA iterations of a launch.
constexpr int64_t q8v5_iterations(int64_t n_rows, int k_rows, int split) {
  const int64_t groups = (n_rows + k_rows - 1) / k_rows;
  const int per_cta = kQ8v5Warps / split;
  return (groups + per_cta - 1) / per_cta;
}

#ifdef __CUDACC__
// Launch shape: kQ8v5Threads threads; `split` (1, 2, 4) warps per group of kRows rows, so a CTA holds
// kQ8v5Warps / split groups; CTA c takes iterations c, c + gridDim.x, ... of q8v5_iterations (a grid
// smaller than that is a persistent grid); grid.y = slots in gathered mode. Needs (host-checked):
// w 16-byte aligned, w_stride and w_expert_stride multiples of 16 (Q4_K, Q5_K, Q6_K_G4) or 2, k a multiple of
// the block, xq / xds from quantize_q8 (16-byte aligned).
template <DType T, int kNT, int kRows, int kDepth>
__global__ void __launch_bounds__(kQ8v5Threads, (q8v5_min_ctas<T, kNT, kRows, kDepth>()))
    matvec_q8v5(MatvecQ8Args a, int split) {
  __shared__ float part[kQ8v5Warps][kRows * kNT];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int groups_per_cta = kQ8v5Warps / split;
  const int slot_in_cta = warp / split, sub = warp % split;
  const bool gathered = a.ids != nullptr;
  if (gathered) {
    dependency_wait();  // the expert ids are an earlier kernel's output
  } else {
    // While the previous kernel drains (launch.cuh), pull this warp's first row group into L2: weights
    // are no kernel's output.
    const int64_t row_bytes = q8v5_row_bytes<T>(a.k);
    const int64_t r0 = (static_cast<int64_t>(blockIdx.x) * groups_per_cta + slot_in_cta) * kRows;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t off = 128 * static_cast<int64_t>(sub * 32 + lane);
      if (r0 + r < a.n_rows && off < row_bytes) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(a.w + (r0 + r) * a.w_stride + off));
      }
    }
    dependency_wait();
  }
  allow_dependents();
  Q8v5View v;
  float* y;
  if (!q8v5_make_view<T>(a, blockIdx.y, &v, &y)) return;  // the whole CTA: no barrier is left waiting
  const int64_t n_iters = q8v5_iterations(a.n_rows, kRows, split);
  for (int64_t it = blockIdx.x; it < n_iters; it += gridDim.x) {  // uniform over the CTA
    const int64_t r0 = (it * groups_per_cta + slot_in_cta) * kRows;
    float acc[kRows][kNT];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int t = 0; t < kNT; ++t) acc[r][t] = 0.0f;
    if (r0 < a.n_rows) q8v5_lane<T, kNT, kRows, kDepth>(v, r0, sub, split, lane, acc);
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int t = 0; t < kNT; ++t) acc[r][t] = warp_sum(acc[r][t]);  // every lane holds every sum
    if (split == 1) {
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int t = 0; t < kNT; ++t) {
          if (lane == r * kNT + t && t < a.n_tokens && r0 + r < a.n_rows) y[t * a.y_stride + r0 + r] = acc[r][t];
        }
    } else {
      if (lane == 0) {
#pragma unroll
        for (int r = 0; r < kRows; ++r)
#pragma unroll
          for (int t = 0; t < kNT; ++t) part[warp][r * kNT + t] = acc[r][t];
      }
      __syncthreads();
      if (sub == 0 && lane < kRows * kNT) {
        const int r = lane / kNT, t = lane % kNT;
        float s = 0.0f;
        for (int j = 0; j < split; ++j) s += part[warp + j][lane];  // warp order: deterministic
        if (t < a.n_tokens && r0 + r < a.n_rows) y[t * a.y_stride + r0 + r] = s;
      }
      __syncthreads();  // part is rewritten in the next iteration
    }
  }
}


// Launches matvec_q8v5<T, kNT, kRows, kDepth> over n_slots slots (1 unless gathered) with `split` warps
// per row group (1, 2 or 4); `persistent` caps the grid at the CTAs resident on the device at once.
template <DType T, int kNT, int kRows, int kDepth>
cudaError_t q8v5_launch(const MatvecQ8Args& a, int n_slots, int split, bool persistent, cudaStream_t stream) {
  if (split != 1 && split != 2 && split != 4) return cudaErrorInvalidValue;
  const int64_t iters = q8v5_iterations(a.n_rows, kRows, split);
  int64_t grid = iters;
  if (persistent) {
    static const int per_sm = [] {
      int n = 0;
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, matvec_q8v5<T, kNT, kRows, kDepth>, kQ8v5Threads, 0) !=
          cudaSuccess) {
        n = 0;
      }
      return n;
    }();
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    const int64_t resident = static_cast<int64_t>(per_sm) * sms;
    if (resident > 0 && resident < grid) grid = resident;
  }
  if (grid > 0x7FFFFFFF || n_slots > 65535) return cudaErrorInvalidValue;
  return launch_kernel(matvec_q8v5<T, kNT, kRows, kDepth>,
                       dim3(static_cast<unsigned>(grid), static_cast<unsigned>(n_slots)), kQ8v5Threads, 0, stream, a,
                       split);
}
#endif  // __CUDACC__

}  // namespace ds::cuda::kern

#undef DS_Q8V5_HD
#undef DS_Q8V5_UNROLL
