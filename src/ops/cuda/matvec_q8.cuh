// Kernels of the int8-activation matrix-vector product for quantized weights (workbench v4), included
// by ops/cuda/matvec.cu, ops/cuda/moe_gathered.cu, ops/cuda/moe_block.cu, ops/cuda/ops_kernels.cu (the
// norms that write int8 activations) and the kernels/matvec_q.cu workbench:
//  - quantize_q8: activation rows (or SwiGLU of two halves, for the MoE down projection) -> blocks of 32
//    int8 codes q with d = amax / 127 and s = d * sum(q) per block (quantize_block_q8, 8 lanes a block;
//    quantize_block_q8_warp gives the same bits for a block held by a whole warp).
//  - matvec_q8: y[t, r] = sum over the row's 32-element units of dw * d_x * isum + mw * s_x
//    (qdec::decode_unit_q8), the integer dot isum taken with __dp4a (4 int8 products per instruction).
//    Per-element work is one 4-byte mask or shift per 4 weights and one dp4a per 4 weights and token;
//    the float scales are applied once per 32 elements.
// Work layout: a warp owns kRows weight rows; each lane takes one 32-element unit of all kRows rows
// (an activation block is loaded once per kRows rows and each weight unit is decoded once for all
// tokens), 1024 elements of each row per step. Optional gathered mode (MoE): blockIdx.y is a slot whose
// expert id is read on the device, offsetting the weight base; invalid ids skip the slot.
// Non-obvious choice: each warp stages its rows through its own shared-memory ring (kStages steps deep)
// with cp.async 16-byte copies from 16-byte aligned addresses: no registers hold loads in flight, no CTA
// barrier is needed, and shared memory keeps every byte's address mod 16, so Q4_K/Q5_K units read
// 16-byte words and the 2-byte aligned blocks (Q4_0 18, Q5_0 22, Q8_0 34, Q6_K 210 bytes) read aligned
// words that a funnel shift realigns, which no direct 16-byte global load could do.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/matvec_cp_async.cuh"
#include "ops/cuda/matvec_q8_args.h"
#include "ops/cuda/matvec_kernels.cuh"
#include "ops/cuda/quant_decode.cuh"

namespace ds::cuda::kern {

constexpr int kQ8Block = 32;         // activation block (elements) = one weight unit
constexpr int kQ8Threads = 128;      // 4 warps per CTA, independent of each other
constexpr int kQ8Warps = kQ8Threads / 32;
constexpr int kQ8Rows = 4;           // weight rows per warp (activation reuse)
constexpr int kQ8ChunkElems = 1024;  // elements of a row per pipeline step: one unit per lane
constexpr int kQ8MaxTokens = 8;
constexpr int kQuantThreads = 256;   // quantize_q8: 8 lanes per 32-element block

// Activation scratch of n_rows rows of k elements (k % 32 == 0): int8 codes [n_rows, k] at offset 0,
// then float2 (d, d * sum q) [n_rows, k / 32] at q8_ds_offset (16-byte aligned).
__host__ __device__ constexpr int64_t q8_act_bytes(int64_t k, int64_t n_rows) {
  return q8_ds_offset(k, n_rows) + n_rows * (k / kQ8Block) * 8;
}

struct QuantizeQ8Args {
  const float* x;             // [n_rows] rows of k floats, row stride x_stride elements
  int64_t x_stride;
  const float* up = nullptr;  // SwiGLU mode: value = silu(x) * up (up rows at the same stride)
  int64_t n_rows = 0;
  int64_t k = 0;              // multiple of 32
  int8_t* q = nullptr;        // [n_rows, k]
  float2* ds = nullptr;       // [n_rows, k / 32]
  const int32_t* ids = nullptr;  // optional: row r is all zeros when ids[r] is outside [0, n_expert)
  int n_expert = 0;
};

// One 32-element block held by 32 / N consecutive lanes, N values each (N = 4: 8 lanes, quantize_q8;
// N = 8: 4 lanes, matvec_mma.cuh's mma_pack); every lane of the warp calls it, for the shuffles: the
// int8 codes qi = round(v * 127 / amax), the block's d = amax / 127 (NaN when the block holds a NaN)
// and the sum of its codes (the same on the block's lanes).
template <int N>
__device__ __forceinline__ void quantize_block_q8(const float (&v)[N], int (&qi)[N], float& d, int& sum) {
  static_assert(N == 4 || N == 8, "a 32-element block over 8 or 4 lanes");
  constexpr int kLanes = 32 / N;
  float amax = 0.0f;
  int nan = 0;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    amax = fmaxf(amax, fabsf(v[i]));
    nan |= v[i] != v[i];
  }
#pragma unroll
  for (int o = 1; o < kLanes; o <<= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
    nan |= __shfl_xor_sync(0xFFFFFFFFu, nan, o);
  }
  const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  sum = 0;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    qi[i] = max(-127, min(127, __float2int_rn(v[i] * id)));
    sum += qi[i];
  }
#pragma unroll
  for (int o = 1; o < kLanes; o <<= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
  d = nan ? __int_as_float(0x7FC00000) : amax / 127.0f;
}

// One 32-element block held by a whole warp (one value per lane): the same codes, d and code sum as
// quantize_block_q8 gives for those 32 values (max and the integer sum do not depend on the grouping).
// Each reduction is one redux.sync: the bit patterns of non-negative floats order as their values, so
// the integer max of |v| over the non-NaN lanes is fmaxf's amax.
__device__ __forceinline__ void quantize_block_q8_warp(float v, int& code, float& d, int& sum) {
  const bool nan_here = v != v;
  const float amax = __uint_as_float(__reduce_max_sync(0xFFFFFFFFu, nan_here ? 0u : __float_as_uint(fabsf(v))));
  const bool nan = __any_sync(0xFFFFFFFFu, nan_here);
  const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  code = max(-127, min(127, __float2int_rn(v * id)));
  sum = __reduce_add_sync(0xFFFFFFFFu, code);
  d = nan ? __int_as_float(0x7FC00000) : amax / 127.0f;
}

// Quantizes the warp's block (lane l holds element e0 + l of a q8 activation scratch whose codes start at
// q8 and scale pairs at q8_ds) and stores the codes and (d, d * sum) as quantize_q8 does: the q8 output
// of the fused kernels (norms, the DeltaNet output norm, the attention output gate). Every lane calls it.
__device__ __forceinline__ void store_q8_block_warp(float v, int8_t* q8, float2* q8_ds, int64_t e0) {
  int code = 0, sum = 0;
  float d = 0.0f;
  quantize_block_q8_warp(v, code, d, sum);
  q8[e0 + threadIdx.x % 32] = static_cast<int8_t>(code);
  if (threadIdx.x % 32 == 0) q8_ds[e0 / kQ8Block] = make_float2(d, d * static_cast<float>(sum));
}

// 8 lanes per block of 32, 4 elements per lane. A block holding a NaN gets d = NaN, so NaN activations
// still give NaN outputs (fmaxf alone would drop them).
template <bool kSwiglu>
__global__ void __launch_bounds__(kQuantThreads) quantize_q8(QuantizeQ8Args a) {
  dependency_sync();
  const int64_t gt = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t blocks_per_row = a.k / kQ8Block;
  const int64_t blk = gt >> 3;
  const int sub = static_cast<int>(gt & 7);
  const bool live = blk < a.n_rows * blocks_per_row;
  const int64_t row = live ? blk / blocks_per_row : 0, b = live ? blk % blocks_per_row : 0;
  const int64_t e0 = b * kQ8Block + 4 * sub;
  bool zero = !live;
  if (live && a.ids != nullptr) {
    const int32_t e = a.ids[row];
    zero = e < 0 || e >= a.n_expert;
  }
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (!zero) {
    const float* xr = a.x + row * a.x_stride + e0;
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = xr[i];
    if constexpr (kSwiglu) {
      const float* ur = a.up + row * a.x_stride + e0;
#pragma unroll
      for (int i = 0; i < 4; ++i) v[i] = v[i] * (1.0f / (1.0f + __expf(-v[i]))) * ur[i];  // as EltKind::kSwiglu
    }
  }
  int qi[4];
  float d;
  int sum;
  quantize_block_q8(v, qi, d, sum);
  if (!live) return;
  *reinterpret_cast<char4*>(a.q + row * a.k + e0) =
      make_char4(static_cast<signed char>(qi[0]), static_cast<signed char>(qi[1]), static_cast<signed char>(qi[2]),
                 static_cast<signed char>(qi[3]));
  if (sub == 0) a.ds[row * blocks_per_row + b] = make_float2(d, d * static_cast<float>(sum));
  timeline_mark(0);
}


constexpr int kQ8StaticSmem = 48 * 1024;  // static shared memory a CTA may declare

// Bytes of one chunk of a row of type t.
__host__ __device__ constexpr int q8_chunk_bytes(DType t) {
  return kQ8ChunkElems / qdec::traits(t).block_elems * qdec::traits(t).block_bytes;
}
// 16-byte pieces that cover a chunk at any phase mod 16.
__host__ __device__ constexpr int q8_chunk_pieces(DType t) { return (q8_chunk_bytes(t) + 30) / 16; }
// Bytes of one staged chunk of a row: its pieces, plus the word words_a2 may read past the end.
__host__ __device__ constexpr int q8_row_bytes(DType t) { return 16 * q8_chunk_pieces(t) + 16; }
// Bytes of matvec_q8's rings: kQ8Warps warps of `stages` chunks of `rows` rows.
__host__ __device__ constexpr int q8_ring_bytes(DType t, int rows, int stages) {
  return kQ8Warps * stages * rows * q8_row_bytes(t);
}

// Shared-memory shape of matvec_q8<T, *, kRows> (the workbench sizes its variants with q8_ring_bytes).
template <DType T, int kRows>
struct Q8Smem {
  static constexpr qdec::TypeTraits tr = qdec::traits(T);
  static constexpr int kPiecesPerLane = (q8_chunk_pieces(T) + 31) / 32;
  static constexpr int kRowBytes = q8_row_bytes(T);
  static constexpr int kStages = q8_ring_bytes(T, kRows, 3) <= kQ8StaticSmem ? 3 : 2;
};

// Start address of chunk c (elements [c * kQ8ChunkElems, ...)) of weight row `row`.
template <DType T>
__device__ __forceinline__ uintptr_t q8_chunk_src(uintptr_t w_base, int64_t w_stride, int64_t row, int c) {
  return w_base + row * w_stride + static_cast<int64_t>(c) * q8_chunk_bytes(T);
}
// A weight address mod 16 (from its low bits): where a staged copy of the bytes there starts in its
// shared-memory row. Always 0 for the types whose blocks are 16-byte multiples (Q4_K, Q5_K): their
// launches need 16-byte aligned weights and strides.
template <DType T>
__device__ __forceinline__ uint32_t q8_phase(uint32_t addr_low) {
  return qdec::q8_aligned16(T) ? 0u : addr_low & 15u;
}
// The phase of q8_chunk_src, by 32-bit arithmetic (once per row and step on the dot path).
template <DType T>
__device__ __forceinline__ uint32_t q8_chunk_phase(uintptr_t w_base, int64_t w_stride, int64_t row, int c) {
  return q8_phase<T>(static_cast<uint32_t>(w_base) + static_cast<uint32_t>(row) * static_cast<uint32_t>(w_stride) +
                     static_cast<uint32_t>(c) * static_cast<uint32_t>(q8_chunk_bytes(T)));
}

// The copies of q8_issue_chunk for rows [0, rows) starting at src (row stride `stride`), cb bytes of each
// from its aligned-down start, into shared rows from s0 (this lane's offset included). kClamp: rows may
// be fewer than kRows and a piece may reach past w_hi (zero-filled there); without it neither happens.
template <DType T, int kRows, bool kClamp>
__device__ __forceinline__ void q8_issue_rows(uint32_t s0, uintptr_t src, uintptr_t stride, uint32_t cb, int rows,
                                              uintptr_t w_hi, int lane) {
  using S = Q8Smem<T, kRows>;
#pragma unroll
  for (int r = 0; r < kRows; ++r, src += stride) {
    if (kClamp && r >= rows) break;
    const uint32_t phase = q8_phase<T>(static_cast<uint32_t>(src));
    const uint32_t n16 = (phase + cb + 15u) >> 4;
    const uintptr_t first = src - phase + 16u * static_cast<uint32_t>(lane);
#pragma unroll
    for (int j = 0; j < S::kPiecesPerLane; ++j) {
      if (static_cast<uint32_t>(lane + 32 * j) < n16) {
        const uintptr_t g = first + 512u * j;
        const uint32_t sa = s0 + static_cast<uint32_t>(r * S::kRowBytes + 512 * j);
        if constexpr (kClamp) {
          cp_async16_s(sa, g, g + 16 <= w_hi ? 16u : static_cast<uint32_t>(w_hi - g));
        } else {
          cp_async16_full(sa, g);
        }
      }
    }
  }
}

// One warp copies chunk c of rows [r0, r0 + kRows) (those below n_rows) into `stage` ([kRows] rows of
// kRowBytes): the 16-byte pieces from the aligned-down start to the end of the chunk; a piece past
// w_hi (the end of the tensor) is zero-filled, not read. Needs a cp_async_commit after it.
// Non-obvious choice: lean address arithmetic. This runs at the top of every step of every warp, and
// the products are bound by the instructions they issue per weight byte, not by the bytes alone
// (kernels/chain_bench.cu). Written plainly (64-bit sizes and the end-of-tensor clamp per piece, a
// branch per row) it was about 200 of the 480 instructions of a one-token Q4_K step; now whether every
// row is present and no piece reaches past w_hi is decided once per call, and only a warp for which
// that fails (the last rows of a tensor) takes the path with the per-row and per-piece tests.
template <DType T, int kRows>
__device__ __forceinline__ void q8_issue_chunk(uint8_t (*stage)[Q8Smem<T, kRows>::kRowBytes], uintptr_t w_base,
                                               uintptr_t w_hi, const MatvecQ8Args& a, int64_t r0, int c, int lane) {
  constexpr qdec::TypeTraits tr = Q8Smem<T, kRows>::tr;
  const int kn = static_cast<int>(min(static_cast<int64_t>(kQ8ChunkElems), a.k - static_cast<int64_t>(c) * kQ8ChunkElems));
  const uint32_t cb = static_cast<uint32_t>(kn / tr.block_elems * tr.block_bytes);
  const int rows = static_cast<int>(min(static_cast<int64_t>(kRows), a.n_rows - r0));
  const uint32_t s0 = static_cast<uint32_t>(__cvta_generic_to_shared(&stage[0][0])) + 16u * static_cast<uint32_t>(lane);
  const uintptr_t src0 = q8_chunk_src<T>(w_base, a.w_stride, r0, c);
  const uintptr_t stride = static_cast<uintptr_t>(a.w_stride);
  // The pieces of the last row present end at the chunk's end rounded up to 16 bytes; earlier rows end
  // earlier, so when that is inside the tensor no piece needs the clamp.
  const bool clamp = ((src0 + static_cast<uintptr_t>(rows - 1) * stride + cb + 15u) & ~uintptr_t{15}) > w_hi;
  if (rows == kRows && !clamp) {
    q8_issue_rows<T, kRows, false>(s0, src0, stride, cb, rows, w_hi, lane);
  } else {
    q8_issue_rows<T, kRows, true>(s0, src0, stride, cb, rows, w_hi, lane);
  }
}

// Q4_K's and Q6_K's codes are unsigned bytes (qdec::Q8Unit): dp4a of unsigned by signed bytes.
__device__ __forceinline__ int dp4a_us(uint32_t a, int b, int c) {
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// What q8_unit_dot<T> reads of an activation block besides its codes: for Q6_K (its offset term) the
// sums of the codes over elements 0-15 and 16-31; zeros, and no work, for the other types.
template <DType T>
__device__ __forceinline__ int2 q8_half_sums(const int (&xv)[8]) {
  if constexpr (!qdec::is_q6_k(T)) return make_int2(0, 0);
  int s0 = 0, s1 = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) s0 = __dp4a(0x01010101, xv[i], s0);
#pragma unroll
  for (int i = 0; i < 4; ++i) s1 = __dp4a(0x01010101, xv[4 + i], s1);
  return make_int2(s0, s1);
}

// acc plus the product of one decoded weight unit with one activation block: its 32 codes as 8 words
// of 4 int8 (xv), their half sums (xs, q8_half_sums<T>) and (d, d * sum of the codes) (ds).
template <DType T>
__device__ __forceinline__ float q8_unit_dot(const qdec::Q8Unit& wu, const int (&xv)[8], int2 xs, float2 ds,
                                             float acc) {
  constexpr bool kMin = T == DType::Q4_K || T == DType::Q5_K || T == DType::Q4_0 || T == DType::Q5_0;
  int d0 = 0, d1 = 0;
  if constexpr (T == DType::Q4_K || qdec::is_q6_k(T)) {
#pragma unroll
    for (int i = 0; i < 4; ++i) d0 = dp4a_us(wu.q[i], xv[i], d0);
#pragma unroll
    for (int i = 0; i < 4; ++i) d1 = dp4a_us(wu.q[4 + i], xv[4 + i], d1);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) d0 = __dp4a(static_cast<int>(wu.q[i]), xv[i], d0);
#pragma unroll
    for (int i = 0; i < 4; ++i) d1 = __dp4a(static_cast<int>(wu.q[4 + i]), xv[4 + i], d1);
  }
  int isum;
  if constexpr (qdec::is_q6_k(T)) {
    isum = wu.sc0 * (d0 - 32 * xs.x) + wu.sc1 * (d1 - 32 * xs.y);  // the codes are stored plus 32
  } else if constexpr (T == DType::Q4_K) {
    isum = (d0 + d1) >> wu.shift;  // every term is a multiple of 2^shift: exact
  } else {
    isum = d0 + d1;
  }
  const float s = fmaf(wu.dw, ds.x * static_cast<float>(isum), acc);
  return kMin ? fmaf(wu.mw, ds.y, s) : s;
}

// Adds to acc[r][t] the products of chunk c of the staged rows r0 + r with activation rows t: each lane
// decodes its 32-element unit of every row and takes the dp4a dot with the activation block. Rows past
// n_rows decode stale shared memory; their sums are never written.
template <DType T, int kNT, int kRows>
__device__ __forceinline__ void q8_chunk_dot(const uint8_t (*stage)[Q8Smem<T, kRows>::kRowBytes], uintptr_t w_base,
                                             const MatvecQ8Args& a, const int8_t* xq, const float2* xds, int64_t r0,
                                             int c, int lane, float (&acc)[kRows][kNT]) {
  const int64_t k0 = static_cast<int64_t>(c) * kQ8ChunkElems;
  const int units = static_cast<int>(min(static_cast<int64_t>(kQ8ChunkElems), a.k - k0) / kQ8Block);
  if (lane >= units) return;
  qdec::Q8Unit wu[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    qdec::decode_unit_q8<T>(&stage[r][q8_chunk_phase<T>(w_base, a.w_stride, r0 + r, c)], lane, wu[r]);
  }
  const int64_t gu = k0 / kQ8Block + lane;  // activation block index
#pragma unroll
  for (int t = 0; t < kNT; ++t) {
    if (t < a.n_tokens) {
      const int4* xp = reinterpret_cast<const int4*>(xq + t * a.k + kQ8Block * gu);
      const int4 x0 = __ldg(xp), x1 = __ldg(xp + 1);
      const float2 ds = __ldg(xds + t * (a.k / kQ8Block) + gu);
      const int xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
      const int2 xs = q8_half_sums<T>(xv);  // once for the kRows rows
#pragma unroll
      for (int r = 0; r < kRows; ++r) acc[r][t] = q8_unit_dot<T>(wu[r], xv, xs, ds, acc[r][t]);
    }
  }
}

// The end of the weight bytes (last row's last block) for the zero-fill guard of q8_issue_chunk.
template <DType T>
__device__ __forceinline__ uintptr_t q8_weights_end(uintptr_t w_base, const MatvecQ8Args& a) {
  constexpr qdec::TypeTraits tr = qdec::traits(T);
  return w_base + (a.n_rows - 1) * a.w_stride + a.k / tr.block_elems * tr.block_bytes;
}

// The rings of matvec_q8_cta: kWarps warps of kStages chunks of kRows rows.
template <DType T, int kRows, int kStages, int kWarps>
using Q8Ring = uint8_t[kWarps][kStages][kRows][Q8Smem<T, kRows>::kRowBytes];

// CTA `cta` of the product: rows from (cta * kWarps + warp) * kRows, its rings in `smem` (16-byte
// aligned, sizeof(Q8Ring<...>) bytes). The body of matvec_q8 and matvec_q8_pair. kSelGiven: gathered
// with the slot's expert id `sel` found by the caller, which has waited for the previous kernel.
template <DType T, int kNT, int kRows, int kStages, int kWarps, bool kSelGiven = false>
__device__ __forceinline__ void matvec_q8_cta(const MatvecQ8Args& a, int64_t cta, uint8_t* smem_raw,
                                              int32_t sel = 0) {
  auto& smem = *reinterpret_cast<Q8Ring<T, kRows, kStages, kWarps>*>(smem_raw);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r0 = (cta * kWarps + warp) * kRows;
  const bool gathered = kSelGiven || a.ids != nullptr;
  if (gathered && !kSelGiven) dependency_wait();  // the expert ids are an earlier kernel's output
  if (r0 >= a.n_rows) return;                     // warps never synchronize with each other
  const uint8_t* w = a.w;
  const int8_t* xq = a.xq;
  const float2* xds = static_cast<const float2*>(a.xds);
  float* y = a.y;
  if (gathered) {
    const int slot = blockIdx.y;
    const int32_t e = kSelGiven ? sel : a.ids[slot];
    if (e < 0 || e >= a.n_expert) return;
    w += e * a.w_expert_stride;
    const int64_t xr = slot / a.x_div;
    xq += xr * a.k;
    xds += xr * (a.k / kQ8Block);
    y += slot * a.y_stride;
  }
  const uintptr_t w_base = reinterpret_cast<uintptr_t>(w);
  const uintptr_t w_hi = q8_weights_end<T>(w_base, a);
  const int n_chunks = static_cast<int>((a.k + kQ8ChunkElems - 1) / kQ8ChunkElems);

  float acc[kRows][kNT];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < kNT; ++t) acc[r][t] = 0.0f;

#pragma unroll
  for (int c = 0; c < kStages - 1; ++c) {
    if (c < n_chunks) q8_issue_chunk<T, kRows>(smem[warp][c], w_base, w_hi, a, r0, c, lane);
    cp_async_commit();  // empty groups keep the count uniform
  }
  // The first stages' weight copies are in flight (weights are no kernel's output) while the previous
  // kernel drains; the activations are read only after the wait (launch.cuh).
  if (!gathered) dependency_wait();
  allow_dependents();
  for (int c = 0; c < n_chunks; ++c) {
    const int next = c + kStages - 1;  // into the stage read in step c - 1
    if (next < n_chunks) q8_issue_chunk<T, kRows>(smem[warp][next % kStages], w_base, w_hi, a, r0, next, lane);
    cp_async_commit();
    cp_async_wait<kStages - 1>();  // this lane's copies of chunk c have landed
    __syncwarp();                     // ... and every lane's
    q8_chunk_dot<T, kNT, kRows>(smem[warp][c % kStages], w_base, a, xq, xds, r0, c, lane, acc);
    __syncwarp();  // stage c % kStages is refilled in the next step
  }
  timeline_mark(2);  // CTA 0's warp 0 has its dots

#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int t = 0; t < kNT; ++t) {
      const float s = warp_sum(acc[r][t]);
      if (lane == 0 && t < a.n_tokens && r0 + r < a.n_rows) y[t * a.y_stride + r0 + r] = s;
    }
  }
  timeline_mark(3);  // and stored them
}

// kNT: activation rows per launch (n_tokens <= kNT, the rest predicated off). Needs (host-checked):
// w 16-byte aligned, w_stride and w_expert_stride multiples of 16 (Q4_K, Q5_K, Q6_K_G4) or 2 (others),
// k a multiple of the block size, xq / xds from quantize_q8 (16-byte aligned).
// kStagesWant (0: Q8Smem's choice) and kMinCtas (__launch_bounds__' CTAs per SM, i.e. the register
// budget) are occupancy knobs the matvec_q workbench times; kWarps is the CTA's warps (each its own rows
// and ring). Production uses the defaults, except v4w (matvec.cu): a deep ring in CTAs of 1 or 2 warps.
template <DType T, int kNT, int kRows = kQ8Rows, int kStagesWant = 0, int kMinCtas = 1, int kWarps = kQ8Warps>
__global__ void __launch_bounds__(32 * kWarps, kMinCtas) matvec_q8(MatvecQ8Args a) {
  constexpr int kStages = kStagesWant > 0 ? kStagesWant : Q8Smem<T, kRows>::kStages;
  __shared__ __align__(16) Q8Ring<T, kRows, kStages, kWarps> smem;
  matvec_q8_cta<T, kNT, kRows, kStages, kWarps>(a, blockIdx.x, &smem[0][0][0][0]);
}

// Static shared memory of matvec_q8_pair<T1, T2>: the larger of the two products' rings.
template <DType T1, DType T2>
constexpr int q8_pair_smem() {
  constexpr int b1 = q8_ring_bytes(T1, kQ8Rows, Q8Smem<T1, kQ8Rows>::kStages);
  constexpr int b2 = q8_ring_bytes(T2, kQ8Rows, Q8Smem<T2, kQ8Rows>::kStages);
  return b1 > b2 ? b1 : b2;
}

// Two independent one-token products of one input in one launch (matmul_many: a layer's input
// products whose weights differ in type, so they cannot run as one product): CTAs [0, ctas1) run
// (T1, a1) and the rest (T2, a2), each exactly as matvec_q8<T, 1> runs it, so the outputs equal two
// launches bit for bit. One launch waits for the kernel before it once, where two launches would
// make the second product wait for the whole first (its last CTAs' tail and a ring refill).
template <DType T1, DType T2>
__global__ void __launch_bounds__(kQ8Threads) matvec_q8_pair(MatvecQ8Args a1, MatvecQ8Args a2, unsigned ctas1) {
  __shared__ __align__(16) uint8_t smem[q8_pair_smem<T1, T2>()];
  if (blockIdx.x < ctas1) {
    matvec_q8_cta<T1, 1, kQ8Rows, Q8Smem<T1, kQ8Rows>::kStages, kQ8Warps>(a1, blockIdx.x, smem);
  } else {
    matvec_q8_cta<T2, 1, kQ8Rows, Q8Smem<T2, kQ8Rows>::kStages, kQ8Warps>(a2, blockIdx.x - ctas1, smem);
  }
}

}  // namespace ds::cuda::kern
