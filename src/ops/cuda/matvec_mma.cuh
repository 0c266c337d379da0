// The tensor-core matrix-vector products for 1..8 tokens: Q4_K (matvec_mma_q4k, on activations packed by
// mma_pack) and Q6_K_G4 (matvec_mma_q6k, on quantize_q8's; its section below), included by
// ops/cuda/matvec.cu and the kernels/matvec_mma_bench.cu workbench.
//
// What it computes: the int8 kernels' product (matvec_q8.cuh) for Q4_K weights, with the integer dots
// of codes taken by mma.sync m16n8k16 (FP16 operands holding small integers exactly, F32
// accumulators, which hold the sums exactly): 16 weight rows by 8 token slots, so every token up to 8
// costs the same instructions, where the int8 kernels take one dp4a per 4 weights and token and grow
// with the tokens of a speculative verify.
//  - Weights: a CTA owns 16 rows; its 4 or 8 warps split the row's 256-element blocks (warp w of W takes
//    blocks w, w + W, ...), each staging its blocks of the 16 rows through its own cp.async ring (the v4 way:
//    no CTA barrier until the final sum). ldmatrix hands each thread 4 bytes of rows g and g + 8
//    (g = lane / 4) of a 16-byte segment; one mask puts a nibble q into the mantissa of an FP16 1024
//    (low nibbles: 1024 + q) or 64 (high: 64 + q): the operand is exact, and the dot is exact plus
//    base times the activation codes' sum, taken off in F32 (exact: all are integers below 2^24).
//  - Activations: mma_pack quantizes x as quantize_q8 does (quantize_block_q8: int8 codes in blocks
//    of 32 with d) and writes the codes as FP16 in the B-fragment order, with (d, sum of the codes)
//    per block and token.
//  - Per 32-element sub-block and (row, token) the kernel then applies q8_unit_dot's float arithmetic
//    to the exact integer dot: acc = fma(d * sc, d_x * isum, acc), then fma(-dmin * m, d_x * sum, ..).
//    So a product equals the int8 kernels' up to the order of the F32 sums, and a verify step's rows
//    the decode step's (speculative decoding keeps the plain decode's output but at float-order ties).
// Non-obvious choice: the k order inside a 16-element step is permuted (thread tig holds elements
// 4 tig and 4 tig + 2 in its first register, 4 tig + 1 and 4 tig + 3 in its second), the same for
// weights and activations, so the nibbles come out of the raw Q4_K bytes by masks and one shift.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/launch.cuh"
#include "ops/cuda/matvec_cp_async.cuh"
#include "ops/cuda/matvec_q8.cuh"
#include "ops/cuda/mma.cuh"
#include "ops/cuda/quant_decode.cuh"

namespace ds::cuda::kern {

constexpr int kMmaTokens = 8;       // token slots of one n8 tile
constexpr int kMmaRows = 16;        // weight rows per CTA: one m16 tile
constexpr int kMmaWarps = 4;        // warps per CTA, splitting k (matvec.cu picks 4 or 8 by the rows)
constexpr int kMmaStages = 3;       // ring depth per warp (256-element blocks)
constexpr int kMmaBlock = 256;      // elements of a Q4_K block
constexpr int kMmaBlockBytes = 144;  // bytes of a Q4_K block: rows staged at this stride
constexpr int kMmaPackThreads = 256;

// Packed activations of k elements (k % 256 == 0): per 256-element block, 16 steps of 32 lanes' uint2
// of FP16 codes (4 KB), then per block its 8 sub-blocks' float2 (d, sum of the codes) per token slot
// (512 bytes: [sub-block][slot]).
__host__ __device__ constexpr int64_t mma_act_x_bytes(int64_t k) { return k / kMmaBlock * 4096; }
__host__ __device__ constexpr int64_t mma_act_bytes(int64_t k) { return mma_act_x_bytes(k) + k / kMmaBlock * 512; }

struct MmaPackArgs {
  const float* x;             // [n_tokens] rows of k floats, row stride x_stride elements
  int64_t x_stride;
  const float* up = nullptr;  // mma_pack<true>: the value is silu(x) * up (up rows at the same stride)
  int n_tokens = 0;           // 1 .. 8
  int64_t k = 0;              // multiple of 256
  uint8_t* act = nullptr;     // mma_act_bytes(k), 16-byte aligned
};

// One CTA per 256-element block: thread i takes token i / 32 (a slot; zeros past n_tokens) and the 8
// elements 8 (i % 32) .. + 7, i.e. half of a 16-element step. With the three other threads of its
// 32-element block it quantizes them as quantize_q8 does (the same codes and d), then writes the two
// lanes' fragments of its codes and the block's (d, sum).
template <bool kSwiglu>
__global__ void __launch_bounds__(kMmaPackThreads) mma_pack(MmaPackArgs a) {
  dependency_sync();
  const int64_t blk = blockIdx.x;
  const int g = static_cast<int>(threadIdx.x) / 32, i = static_cast<int>(threadIdx.x) % 32;
  const int step = i / 2, half = i % 2;  // 16-element step of the block, and which 8 of its elements
  float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (g < a.n_tokens) {
    const int64_t e0 = blk * kMmaBlock + 16 * step + 8 * half;
    const float4* xp = reinterpret_cast<const float4*>(a.x + g * a.x_stride + e0);
    const bool aligned = (reinterpret_cast<uintptr_t>(a.x + g * a.x_stride + e0) & 15) == 0;
    if (aligned) {
      const float4 p = xp[0], q = xp[1];
      v[0] = p.x; v[1] = p.y; v[2] = p.z; v[3] = p.w; v[4] = q.x; v[5] = q.y; v[6] = q.z; v[7] = q.w;
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = a.x[g * a.x_stride + e0 + j];
    }
    if constexpr (kSwiglu) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float u = a.up[g * a.x_stride + e0 + j];
        v[j] = v[j] * (1.0f / (1.0f + __expf(-v[j]))) * u;  // as EltKind::kSwiglu
      }
    }
  }
  // quantize_q8's codes of the 32-element block (threads i = 4 sb .. 4 sb + 3 hold its 32 elements).
  int qi[8], sum;
  float d;
  quantize_block_q8(v, qi, d, sum);
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = static_cast<float>(qi[j]);  // exact in FP16
  // Lanes 4 g + tig of step `step`: tig = 2 half + j holds elements 4 tig .. 4 tig + 3 of the step.
  uint2 out[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const float* e = v + 4 * j;
    const __half2 b0 = __floats2half2_rn(e[0], e[2]), b1 = __floats2half2_rn(e[1], e[3]);
    out[j] = make_uint2(*reinterpret_cast<const uint32_t*>(&b0), *reinterpret_cast<const uint32_t*>(&b1));
  }
  uint2* xo = reinterpret_cast<uint2*>(a.act) + (blk * 16 + step) * 32 + 4 * g + 2 * half;
  *reinterpret_cast<uint4*>(xo) = make_uint4(out[0].x, out[0].y, out[1].x, out[1].y);
  if (i % 4 == 0) {
    const int sb = i / 4;
    float2* so = reinterpret_cast<float2*>(a.act + mma_act_x_bytes(a.k)) + (blk * 8 + sb) * kMmaTokens + g;
    *so = make_float2(d, static_cast<float>(sum));
  }
}

constexpr int kMmaMaxParts = 4;  // outputs of one launch
struct MatvecMmaArgs {
  const uint8_t* w;     // [n_rows] Q4_K rows of k elements
  int64_t w_stride;     // bytes between rows, a multiple of 16
  const uint8_t* act;   // mma_pack's output for these k
  float* y;             // [n_tokens, y_stride]
  int64_t y_stride;
  int64_t n_rows;
  int64_t k;            // multiple of 256
  int n_tokens;         // 1 .. 8
  // Further outputs (products whose weights follow each other in memory, run as one launch): rows from
  // part_row[p] (a multiple of 16, increasing) on go to part_y[p] (row r at part_y[p][t * part_y_stride[p]
  // + r - part_row[p]]) up to the next part's first row; rows before part_row[1] to y.
  int n_parts = 1;
  int64_t part_row[kMmaMaxParts] = {};
  float* part_y[kMmaMaxParts] = {};
  int64_t part_y_stride[kMmaMaxParts] = {};
};

// c += a * b and c = a * b (a fresh accumulator), m16n8k16 (mma.cuh's mma_16816_f16_pure).
__device__ __forceinline__ void mma_f16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
  const uint32_t a[4] = {a0, a1, a2, a3};
  mma_16816_f16_pure(c, a, b0, b1);
}
__device__ __forceinline__ void mma_f16_first(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint2 b) {
  c[0] = c[1] = c[2] = c[3] = 0.0f;
  mma_f16(c, a0, a1, a2, a3, b.x, b.y);
}

// One 256-element block of the warp's 16 rows, staged at `stage` (rows of kMmaBlockBytes bytes), into
// acc (rows g, g + 8 by tokens 2 tig, 2 tig + 1); xf: the block's code fragments (16 steps); xs: the
// block's (d, sum) pairs [sub-block][slot] (read for live tokens only: `live` = 2 tig < n_tokens).
__device__ __forceinline__ void mma_q4k_block(const uint8_t* stage, const uint2 (&xf)[16], const float2* xs, bool live,
                                              int lane, float (&acc)[4]) {
  const int g = lane / 4;
  const uint4 ha = *reinterpret_cast<const uint4*>(stage + g * kMmaBlockBytes);
  const uint4 hb = *reinterpret_cast<const uint4*>(stage + (g + 8) * kMmaBlockBytes);
  // Per row: d and dmin, the 8 scales and mins as bytes (k_scale_min, 4 per word), as decode_unit_q8.
  struct RowScales {
    float d, dmin;
    uint32_t sc03, sc47, m03, m47;
  };
  auto row_scales = [](const uint4& h) {
    RowScales r;
    r.d = qdec::h2f(static_cast<uint16_t>(h.x & 0xFFFFu));
    r.dmin = qdec::h2f(static_cast<uint16_t>(h.x >> 16));
    r.sc03 = h.y & 0x3F3F3F3Fu;
    r.sc47 = (h.w & 0x0F0F0F0Fu) | ((h.y >> 2) & 0x30303030u);
    r.m03 = h.z & 0x3F3F3F3Fu;
    r.m47 = ((h.w >> 4) & 0x0F0F0F0Fu) | ((h.z >> 2) & 0x30303030u);
    return r;
  };
  const RowScales sa = row_scales(ha), sb = row_scales(hb);
  const uint32_t base = smem_addr(stage) + static_cast<uint32_t>(((lane & 7) + 8 * ((lane >> 3) & 1)) * kMmaBlockBytes +
                                                                   16 + 16 * (lane >> 4));
#pragma unroll
  for (int c = 0; c < 4; ++c) {  // 32 bytes of each row: sub-blocks 2c (low nibbles) and 2c + 1 (high)
    uint32_t r[4];  // rows g, g + 8 of bytes 4 tig .. + 3, then of bytes 16 + 4 tig .. + 3
    ldsm_x4(r, base + 32u * c);
    float lo[4], hi[4];  // exact integer dots plus base * (sum of the activation codes)
    mma_f16_first(lo, (r[0] & 0x000F000Fu) | 0x64006400u, (r[1] & 0x000F000Fu) | 0x64006400u,
                  ((r[0] >> 8) & 0x000F000Fu) | 0x64006400u, ((r[1] >> 8) & 0x000F000Fu) | 0x64006400u, xf[4 * c]);
    mma_f16_first(hi, (r[0] & 0x00F000F0u) | 0x54005400u, (r[1] & 0x00F000F0u) | 0x54005400u,
                  ((r[0] >> 8) & 0x00F000F0u) | 0x54005400u, ((r[1] >> 8) & 0x00F000F0u) | 0x54005400u,
                  xf[4 * c + 2]);
    mma_f16(lo, (r[2] & 0x000F000Fu) | 0x64006400u, (r[3] & 0x000F000Fu) | 0x64006400u,
            ((r[2] >> 8) & 0x000F000Fu) | 0x64006400u, ((r[3] >> 8) & 0x000F000Fu) | 0x64006400u, xf[4 * c + 1].x,
            xf[4 * c + 1].y);
    mma_f16(hi, (r[2] & 0x00F000F0u) | 0x54005400u, (r[3] & 0x00F000F0u) | 0x54005400u,
            ((r[2] >> 8) & 0x00F000F0u) | 0x54005400u, ((r[3] >> 8) & 0x00F000F0u) | 0x54005400u, xf[4 * c + 3].x,
            xf[4 * c + 3].y);
    // q8_unit_dot's arithmetic per (row, token): the scale and min of sub-blocks 2c, 2c + 1, as
    // decode_unit_q8 makes them (d * sc, -dmin * m, each rounded once): byte j of a scale word goes into
    // the mantissa of 2^23 by one byte permute (no int-to-float conversion, a quarter-rate
    // instruction), and fma(2^23 + b, d, -2^23 d) = b * d exactly before its one rounding.
    const int jl = 2 * c, jh = 2 * c + 1;
    auto mul_byte = [](uint32_t w03, uint32_t w47, int j, float f) {
      const float m = __uint_as_float(__byte_perm(j < 4 ? w03 : w47, 0x4B000000u, 0x7440u | (j & 3)));
      return fmaf(m, f, -8388608.0f * f);
    };
    const float dwl[2] = {mul_byte(sa.sc03, sa.sc47, jl, sa.d), mul_byte(sb.sc03, sb.sc47, jl, sb.d)};
    const float dwh[2] = {mul_byte(sa.sc03, sa.sc47, jh, sa.d), mul_byte(sb.sc03, sb.sc47, jh, sb.d)};
    const float mwl[2] = {mul_byte(sa.m03, sa.m47, jl, -sa.dmin), mul_byte(sb.m03, sb.m47, jl, -sb.dmin)};
    const float mwh[2] = {mul_byte(sa.m03, sa.m47, jh, -sa.dmin), mul_byte(sb.m03, sb.m47, jh, -sb.dmin)};
    // (d, sum) of tokens 2 tig, 2 tig + 1 for sub-blocks jl, jh.
    float4 xl = make_float4(0.0f, 0.0f, 0.0f, 0.0f), xh = xl;
    if (live) {
      xl = __ldg(reinterpret_cast<const float4*>(xs + jl * kMmaTokens + 2 * (lane % 4)));
      xh = __ldg(reinterpret_cast<const float4*>(xs + jh * kMmaTokens + 2 * (lane % 4)));
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int row = q >> 1, t = q & 1;
      const float dl = t ? xl.z : xl.x, sl = t ? xl.w : xl.y, dh = t ? xh.z : xh.x, sh = t ? xh.w : xh.y;
      const float il = fmaf(-1024.0f, sl, lo[q]), ih = fmaf(-64.0f, sh, hi[q]);  // the integer dots
      acc[q] = fmaf(mwl[row], dl * sl, fmaf(dwl[row], dl * il, acc[q]));
      acc[q] = fmaf(mwh[row], dh * sh, fmaf(dwh[row], dh * ih, acc[q]));
    }
  }
}

// A lane's share of the copies of one block of the CTA's 16 rows: 144 16-byte pieces, lane l the pieces
// l + 32 i (row p / 9, 16-byte piece p % 9 of the row's block); the same for every block, so the
// offsets are computed once. A piece of a row past n_rows is not copied.
struct MmaCopies {
  int64_t src[5];  // bytes from the weights to piece i of block 0 (or -1: no piece)
  uint32_t dst[5];  // bytes from the stage's start
};
__device__ __forceinline__ MmaCopies mma_copies(const MatvecMmaArgs& a, int64_t r0, int lane) {
  MmaCopies c;
#pragma unroll
  for (int i = 0; i < 5; ++i) {
    const int p = lane + 32 * i, row = p / 9, seg = p % 9;
    const bool live = p < kMmaRows * 9 && r0 + row < a.n_rows;
    c.src[i] = live ? (r0 + row) * a.w_stride + 16 * seg : -1;
    c.dst[i] = static_cast<uint32_t>(16 * p);  // row * 144 + 16 seg
  }
  return c;
}
__device__ __forceinline__ void mma_issue_block(uint8_t* stage, const MatvecMmaArgs& a, const MmaCopies& c,
                                                int64_t j) {
  const uint32_t s0 = smem_addr(stage);
  const uintptr_t wj = reinterpret_cast<uintptr_t>(a.w) + static_cast<uintptr_t>(j * kMmaBlockBytes);
#pragma unroll
  for (int i = 0; i < 5; ++i) {
    if (c.src[i] >= 0) cp_async16_full(s0 + c.dst[i], wj + static_cast<uintptr_t>(c.src[i]));
  }
}

// The CTA's 16 rows: each warp's acc (lane (g, tig): rows g, g + 8 of tokens 2 tig, 2 tig + 1) summed
// over the warps in warp order through `part`, and written by warp 0 where row and token are live.
template <int kWarps>
__device__ __forceinline__ void mma_store_rows(float (&part)[kWarps][32][4], const float (&acc)[4], int warp, int lane,
                                               int64_t r0, float* y, int64_t y_stride, int64_t n_rows, int n_tokens) {
#pragma unroll
  for (int q = 0; q < 4; ++q) part[warp][lane][q] = acc[q];
  __syncthreads();
  if (warp != 0) return;
  float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
#pragma unroll
    for (int q = 0; q < 4; ++q) s[q] += part[w][lane][q];
  }
  const int g = lane / 4, tig = lane % 4;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int t = 2 * tig + (q & 1);
    const int64_t r = r0 + g + 8 * (q >> 1);
    if (t < n_tokens && r < n_rows) y[t * y_stride + r] = s[q];
  }
}

// Needs (host-checked, matvec_mma_ok): w and w_stride 16-byte aligned, k % 256 == 0, act from mma_pack.
// kWarps (the k split of a CTA), kStages (ring depth) and kMinCtas (CTAs per SM the registers must
// allow) are the knobs the workbench times; production runs <4, 3> and <8, 2> (matvec.cu).
template <int kWarps = kMmaWarps, int kStages = kMmaStages, int kMinCtas = 16 / kWarps>
__global__ void __launch_bounds__(32 * kWarps, kMinCtas) matvec_mma_q4k(MatvecMmaArgs a) {
  __shared__ __align__(16) uint8_t ring[kWarps][kStages][kMmaRows * kMmaBlockBytes];
  __shared__ float part[kWarps][32][4];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kMmaRows;
  const int64_t n_blocks = a.k / kMmaBlock;
  const int n_mine = static_cast<int>((n_blocks - warp + kWarps - 1) / kWarps);  // blocks warp + 4 i
  const MmaCopies copies = mma_copies(a, r0, lane);
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < n_mine) mma_issue_block(ring[warp][i], a, copies, warp + static_cast<int64_t>(i) * kWarps);
    cp_async_commit();
  }
  // The first blocks' weight copies are in flight before the wait; the activations are read after it.
  dependency_wait();
  allow_dependents();
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const bool codes_live = lane / 4 < a.n_tokens;
  const uint2* xact = reinterpret_cast<const uint2*>(a.act);
  const bool scales_live = 2 * (lane % 4) < a.n_tokens;
  const float2* xscale = reinterpret_cast<const float2*>(a.act + mma_act_x_bytes(a.k));
  for (int i = 0; i < n_mine; ++i) {
    const int next = i + kStages - 1;
    if (next < n_mine) {
      mma_issue_block(ring[warp][next % kStages], a, copies, warp + static_cast<int64_t>(next) * kWarps);
    }
    cp_async_commit();
    const int64_t j = warp + static_cast<int64_t>(i) * kWarps;
    // Lanes of token slots past n_tokens hold zeros without reading them: at one token a warp reads
    // 512 bytes of codes a block instead of 4 KB.
    uint2 xf[16];
#pragma unroll
    for (int s = 0; s < 16; ++s) xf[s] = make_uint2(0u, 0u);
    if (codes_live) {
#pragma unroll
      for (int s = 0; s < 16; ++s) xf[s] = __ldg(xact + (j * 16 + s) * 32 + lane);
    }
    cp_async_wait<kStages - 1>();
    __syncwarp();
    mma_q4k_block(ring[warp][i % kStages], xf, xscale + j * 8 * kMmaTokens, scales_live, lane, acc);
    __syncwarp();
  }
  // The output part of the CTA's rows (parts start at multiples of 16: a CTA's rows are in one).
  float* y = a.y;
  int64_t y_stride = a.y_stride, first = 0, end = a.n_parts > 1 ? a.part_row[1] : a.n_rows;
#pragma unroll
  for (int p = 1; p < kMmaMaxParts; ++p) {
    if (p < a.n_parts && r0 >= a.part_row[p]) {
      y = a.part_y[p];
      y_stride = a.part_y_stride[p];
      first = a.part_row[p];
      end = p + 1 < a.n_parts ? a.part_row[p + 1] : a.n_rows;
    }
  }
  mma_store_rows<kWarps>(part, acc, warp, lane, r0 - first, y, y_stride, end - first, a.n_tokens);
}

// A lane's reads of quantize_q8's activations in the int8 tensor-core kernel (matvec_mma_q6k): the B
// fragment of token g = lane / 4 for each 16-element step (its 4 codes from element 4 tig) and the
// (d, s) pairs of tokens 2 tig and 2 tig + 1 (tig = lane % 4), two units per 16-byte load; for token
// slots past n_tokens the caller skips the codes (codes_live) and unit_pair gives zeros, without a read.
struct MmaQ8Act {
  const uint32_t* codes;  // token g's codes, from element 4 tig
  const float4* ds[2];    // (d, s) pairs of tokens 2 tig, 2 tig + 1
  bool codes_live;
  int t0, n_tokens;
  __device__ __forceinline__ MmaQ8Act(const MatvecQ8Args& a, int lane) {
    const int g = lane / 4;
    const int64_t units = a.k / kQ8Block;
    t0 = 2 * (lane % 4);
    n_tokens = a.n_tokens;
    codes_live = g < a.n_tokens;
    codes = reinterpret_cast<const uint32_t*>(a.xq + g * a.k) + (lane % 4);
    ds[0] = reinterpret_cast<const float4*>(static_cast<const float2*>(a.xds) + t0 * units);
    ds[1] = reinterpret_cast<const float4*>(static_cast<const float2*>(a.xds) + (t0 + 1) * units);
  }
  // Token g's codes of 256-element block j: step s at [4 s].
  __device__ __forceinline__ const uint32_t* block_codes(int64_t j) const { return codes + j * 64; }
  // Units 2 p, 2 p + 1 of block j for token 2 tig + i: (d, s, d, s).
  __device__ __forceinline__ float4 unit_pair(int64_t j, int p, int i) const {
    return t0 + i < n_tokens ? __ldg(ds[i] + j * 4 + p) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
};

// ---- Q6_K_G4 on int8 tensor cores: matvec_mma_q6k ----
// What it computes: the int8 kernels' product for Q6_K_G4 weights (matvec_q8<Q6_K_G4>) on the same
// activations (quantize_q8's int8 codes and d, MatvecQ8Args), with each 16-element integer dot (one
// Q6_K scale's elements) taken by an int8 m16n8k16 mma.sync with exact int32 sums: 16 weight rows by 8
// token slots. The weight codes become q - 32 as int8 (two masks, an add and an xor per 4 codes); the
// B fragment of a step is 4 activation codes of one token, read straight from quantize_q8's rows (the
// mma's k order is the bytes' order, as ldmatrix hands them out). Per 32-element unit and (row, token)
// the kernel then takes q8_unit_dot's arithmetic on those exact dots: isum = sc0 * dot0 + sc1 * dot1
// (exact in int32 and in F32: |isum| < 2^24), acc = fma(d, d_x * isum, acc). So a product equals the
// int8 kernels' up to the order of the F32 sums over units, as matvec_mma_q4k's does.
// Layout as matvec_mma_q4k's: a CTA owns 16 rows; warp w of W takes the rows' 256-element blocks w,
// w + W, ..., staging each block's parts of the 16 rows (ql 128 bytes, qh 64, scales 16, and the 16
// bytes of its group that hold the four blocks' d) through its own cp.async ring in dynamic shared
// memory (mma_q6k_smem).
constexpr int kMmaQ6Pieces = 14;     // 16-byte pieces of a row a block stages: ql 8, qh 4, scales, d
constexpr int kMmaQ6RowBytes = 240;  // a staged row: the 224 bytes of its pieces and 16 of padding, so
                                     // ldmatrix's 8 rows (60 words apart) fall in distinct banks
constexpr int kMmaQ6Scales = 192, kMmaQ6D = 208;  // where a staged row's scales and d piece start

__host__ __device__ constexpr int mma_q6k_smem(int warps, int stages) {
  return warps * stages * kMmaRows * kMmaQ6RowBytes;
}

// A lane's share of the copies of one block of the CTA's 16 rows: 224 pieces, lane l the pieces l + 32 i
// (row p / 14, piece p % 14). src holds the offsets of block 0 of group 0 from the CTA's first row
// (`w0`); block b of group G adds G times the group's 848 bytes and b times the part's bytes per block
// (mma_q6k_step: 0 for the d piece, which holds all four). The pieces' stage offsets and steps are
// recomputed from the lane at each issue, which keeps the registers for the products.
struct MmaQ6Copies {
  uintptr_t w0;     // the CTA's first row
  uint32_t src[7];  // bytes from w0 (kMmaQ6NoCopy: a row past n_rows)
};
constexpr uint32_t kMmaQ6NoCopy = 0xFFFFFFFFu;
__device__ __forceinline__ uint32_t mma_q6k_step(int seg) {
  return seg < 8 ? 128u : seg < 12 ? 64u : seg == 12 ? 16u : 0u;
}
__device__ __forceinline__ MmaQ6Copies mma_q6k_copies(const MatvecQ8Args& a, int64_t r0, int lane) {
  MmaQ6Copies c;
  c.w0 = reinterpret_cast<uintptr_t>(a.w) + static_cast<uintptr_t>(r0 * a.w_stride);
#pragma unroll
  for (int i = 0; i < 7; ++i) {
    const int p = lane + 32 * i, row = p / kMmaQ6Pieces, seg = p % kMmaQ6Pieces;
    const int off = seg < 8    ? 16 * seg
                    : seg < 12 ? quant::kGroupQ6K4Qh + 16 * (seg - 8)
                    : seg == 12 ? quant::kGroupQ6K4Scales
                                : quant::kGroupQ6K4D;
    c.src[i] = r0 + row < a.n_rows ? static_cast<uint32_t>(row * a.w_stride + off) : kMmaQ6NoCopy;
  }
  return c;
}
__device__ __forceinline__ void mma_q6k_issue(uint8_t* stage, const MmaQ6Copies& c, int64_t j, int lane) {
  const uint32_t s0 = smem_addr(stage);
  const uintptr_t gj = c.w0 + static_cast<uintptr_t>((j >> 2) * quant::kGroupQ6K4Bytes);
  const uint32_t b = static_cast<uint32_t>(j & 3);
#pragma unroll
  for (int i = 0; i < 7; ++i) {
    const int p = lane + 32 * i, row = p / kMmaQ6Pieces, seg = p - kMmaQ6Pieces * row;
    const uint32_t dst = static_cast<uint32_t>(row * kMmaQ6RowBytes + 16 * seg);
    if (c.src[i] != kMmaQ6NoCopy) cp_async16_full(s0 + dst, gj + (c.src[i] + b * mma_q6k_step(seg)));
  }
}

// Byte m of v as a signed int (a Q6_K scale). (__byte_perm takes 3 bits of a selector, so it cannot
// replicate the sign.)
__device__ __forceinline__ int mma_q6k_scale(const uint4& v, int m) {
  const uint32_t w = m < 4 ? v.x : m < 8 ? v.y : m < 12 ? v.z : v.w;
  return static_cast<int>(static_cast<int8_t>(w >> (8 * (m & 3))));
}

// Block b (of its group) of the warp's 16 rows, staged at `stage`, into acc (rows g, g + 8 by tokens
// 2 tig, 2 tig + 1); xb[s]: the B fragment of the block's 16-element step s; xd[u]: the activation d of
// unit u for tokens 2 tig (.x) and 2 tig + 1 (.y).
__device__ __forceinline__ void mma_q6k_block(const uint8_t* stage, int b, const uint32_t* xcodes, bool codes_live,
                                              const float2 (&xd)[8], int lane, float (&acc)[4]) {
  const int g = lane / 4;
  const uint8_t* ra = stage + g * kMmaQ6RowBytes;
  const uint8_t* rb = ra + 8 * kMmaQ6RowBytes;
  const uint4 sca = *reinterpret_cast<const uint4*>(ra + kMmaQ6Scales);
  const uint4 scb = *reinterpret_cast<const uint4*>(rb + kMmaQ6Scales);
  const float dw[2] = {qdec::h2f(*reinterpret_cast<const uint16_t*>(ra + kMmaQ6D + 2 * b)),
                       qdec::h2f(*reinterpret_cast<const uint16_t*>(rb + kMmaQ6D + 2 * b))};
  // ldmatrix rows: lanes 0-7 rows 0-7 of the first 16 bytes, 8-15 rows 8-15, 16-31 the same of the next 16.
  const uint32_t base = smem_addr(stage) +
                        static_cast<uint32_t>(((lane & 7) + 8 * ((lane >> 3) & 1)) * kMmaQ6RowBytes + 16 * (lane >> 4));
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {  // elements 128 hh .. + 127: ql bytes 64 hh .., qh bytes 32 hh ..
    uint32_t xb[8];  // the B fragments of the half's 8 steps (zeros for token slots past n_tokens)
#pragma unroll
    for (int s = 0; s < 8; ++s) xb[s] = codes_live ? __ldg(xcodes + 32 * hh + 4 * s) : 0u;
    uint32_t l0[4], l1[4], h[4];  // [2 s + r]: bytes 16 s + 4 tig .. + 3 of row g (r = 0) or g + 8 (r = 1)
    ldsm_x4(l0, base + 64u * hh);
    ldsm_x4(l1, base + 64u * hh + 32u);
    ldsm_x4(h, base + 128u + 32u * hh);
#pragma unroll
    for (int q = 0; q < 4; ++q) {  // unit 4 hh + q: element 32 q + l of the half is ql byte 32 (q & 1) + l's
                                   // nibble q >> 1 and bits 2q, 2q + 1 of qh byte l
      const uint32_t* lo = (q & 1) ? l1 : l0;
      int dot[2][4];
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        uint32_t w[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const uint32_t ql = (q >> 1) ? lo[2 * s + r] >> 4 : lo[2 * s + r];
          const uint32_t hw = h[2 * s + r];
          const uint32_t qh = q == 0 ? hw << 4 : q == 1 ? hw << 2 : q == 2 ? hw : hw >> 2;
          const uint32_t code = (ql & 0x0F0F0F0Fu) | (qh & 0x30303030u);  // 4 codes 0..63
          w[r] = (code + 0x60606060u) ^ 0x80808080u;  // code - 32 as int8 (no carries: code + 96 < 256)
        }
        mma_16816_s8(dot[s], w[0], w[1], xb[2 * q + s]);
      }
      const int u = 4 * hh + q;
      const int sc0[2] = {mma_q6k_scale(sca, 2 * u), mma_q6k_scale(scb, 2 * u)};
      const int sc1[2] = {mma_q6k_scale(sca, 2 * u + 1), mma_q6k_scale(scb, 2 * u + 1)};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = i >> 1;
        const int isum = sc0[row] * dot[0][i] + sc1[row] * dot[1][i];
        acc[i] = fmaf(dw[row], ((i & 1) ? xd[u].y : xd[u].x) * static_cast<float>(isum), acc[i]);
      }
    }
  }
}

// Needs (host-checked: matvec_q8_ok and launch_q8_product's kMma case): w and w_stride 16-byte aligned,
// 16 rows of w_stride under 4 GB, k % 1024 == 0, the activations of quantize_q8 for n_tokens <= 8 rows
// of k, and mma_q6k_smem(kWarps, kStages) bytes of dynamic shared memory.
template <int kWarps, int kStages, int kMinCtas = 16 / kWarps>
__global__ void __launch_bounds__(32 * kWarps, kMinCtas) matvec_mma_q6k(MatvecQ8Args a) {
  extern __shared__ __align__(16) uint8_t mma_q6k_ring[];
  __shared__ float part[kWarps][32][4];
  constexpr int kStageBytes = kMmaRows * kMmaQ6RowBytes;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint8_t* ring = mma_q6k_ring + warp * kStages * kStageBytes;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kMmaRows;
  const int64_t n_blocks = a.k / kMmaBlock;
  const int n_mine = static_cast<int>((n_blocks - warp + kWarps - 1) / kWarps);  // blocks warp + kWarps i
  const MmaQ6Copies copies = mma_q6k_copies(a, r0, lane);
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < n_mine) mma_q6k_issue(ring + i * kStageBytes, copies, warp + static_cast<int64_t>(i) * kWarps, lane);
    cp_async_commit();
  }
  // The first blocks' weight copies are in flight before the wait; the activations are read after it.
  dependency_wait();
  allow_dependents();
  const MmaQ8Act act(a, lane);
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int i = 0; i < n_mine; ++i) {
    const int next = i + kStages - 1;
    if (next < n_mine) {
      mma_q6k_issue(ring + (next % kStages) * kStageBytes, copies, warp + static_cast<int64_t>(next) * kWarps, lane);
    }
    cp_async_commit();
    const int64_t j = warp + static_cast<int64_t>(i) * kWarps;
    float2 xd[8];
#pragma unroll
    for (int p = 0; p < 4; ++p) {  // units 2p, 2p + 1: (d, s) pairs of two units in one 16-byte load
      const float4 v0 = act.unit_pair(j, p, 0), v1 = act.unit_pair(j, p, 1);
      xd[2 * p] = make_float2(v0.x, v1.x);
      xd[2 * p + 1] = make_float2(v0.z, v1.z);
    }
    cp_async_wait<kStages - 1>();
    __syncwarp();
    mma_q6k_block(ring + (i % kStages) * kStageBytes, static_cast<int>(j & 3), act.block_codes(j), act.codes_live, xd,
                  lane, acc);
    __syncwarp();
  }
  mma_store_rows<kWarps>(part, acc, warp, lane, r0, a.y, a.y_stride, a.n_rows, a.n_tokens);
}

}  // namespace ds::cuda::kern
