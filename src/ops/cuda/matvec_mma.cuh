// The tensor-core matrix-vector product for 1..8 tokens (matvec_mma_q4k) and its activation packer
// (mma_pack), included by ops/cuda/matvec.cu and the kernels/matvec_mma_bench.cu workbench.
//
// What it computes: y[t, r] = sum_k w[r, k] x[t, k] for Q4_K weights, as mma.sync m16n8k16 products
// (FP16 operands, F32 accumulators): 16 weight rows by 8 token slots, so every token up to 8 costs the
// same instructions. The int8 kernels (matvec_q8.cuh) take one dp4a per 4 weights and token, so their
// time grows with the tokens of a speculative verify; here it does not.
//  - Weights: a CTA owns 16 rows; its 4 warps split the row's 256-element blocks (warp w takes blocks
//    w, w + 4, ...), each staging its blocks of the 16 rows through its own cp.async ring (the v4 way:
//    no CTA barrier until the final sum). ldmatrix hands each thread 4 bytes of rows g and g + 8
//    (g = lane / 4) of a 16-byte segment; their nibbles become FP16 weights q * (d * sc) by one mask
//    (the code into the mantissa of 1024 or 64) and one fused multiply-add, rounded once.
//  - The min term (-dmin * m per 32-element sub-block) is one more m16n8k16 product per block, of the
//    rows' FP16 mins with the activations' FP16 sub-block sums.
//  - Activations: mma_pack writes x as FP16 in the B-fragment order (8 bytes per lane and 16-element
//    step, zeros past n_tokens) and the sub-block sums, once per input; a warp's lanes of live token
//    slots then read 32 contiguous bytes per slot and step.
// Non-obvious choices:
//  - The k order inside a 16-element step is permuted (thread tig holds elements 4 tig and 4 tig + 2 in
//    its first register, 4 tig + 1 and 4 tig + 3 in its second), the same for weights and activations,
//    so the nibbles come out of the raw Q4_K bytes by masks and one shift, with no shuffle.
//  - The activations are the int8 kernels' (quantize_q8's codes times their block's d), in FP16: a
//    verify step's rows then differ from the one-token decode step's by the FP16 roundings of the
//    scale (d * sc), the weight (q * d * sc) and q_x * d_x (about 2^-11 relative each), not by another
//    rounding of the activations, so speculative decoding keeps the plain decode's output but at
//    near-ties. |x| above 65504 becomes infinite (and the output with it): never silently clamped.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/launch.cuh"
#include "ops/cuda/matvec_cp_async.cuh"
#include "ops/cuda/mma.cuh"

namespace ds::cuda::kern {

constexpr int kMmaTokens = 8;       // token slots of one n8 tile
constexpr int kMmaRows = 16;        // weight rows per CTA: one m16 tile
constexpr int kMmaWarps = 4;        // warps per CTA, splitting k
constexpr int kMmaStages = 4;       // ring depth per warp (256-element blocks)
constexpr int kMmaBlock = 256;      // elements of a Q4_K block
constexpr int kMmaBlockBytes = 144;  // bytes of a Q4_K block: rows staged at this stride
constexpr int kMmaPackThreads = 256;

// Packed activations of k elements (k % 256 == 0): per 256-element block, 16 steps of 32 lanes' uint2
// (4 KB), then per block 32 lanes' half2 sub-block sums (128 bytes).
__host__ __device__ constexpr int64_t mma_act_x_bytes(int64_t k) { return k / kMmaBlock * 4096; }
__host__ __device__ constexpr int64_t mma_act_bytes(int64_t k) { return mma_act_x_bytes(k) + k / kMmaBlock * 128; }

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
// 32-element block it rounds the values as quantize_q8 does, then writes the two lanes' fragments of
// its elements and the block's sum.
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
  // The values the int8 kernels multiply: quantize_q8's codes of the 32-element block (threads
  // i = 4 sb .. 4 sb + 3 hold its 32 elements), times its d; the sub-block sum is d * sum of the codes.
  float amax = 0.0f;
  int nan = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    amax = fmaxf(amax, fabsf(v[j]));
    nan |= v[j] != v[j];
  }
#pragma unroll
  for (int o = 1; o < 4; o <<= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
    nan |= __shfl_xor_sync(0xFFFFFFFFu, nan, o);
  }
  const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  const float d = nan ? __int_as_float(0x7FC00000) : amax / 127.0f;
  int sum = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int q = max(-127, min(127, __float2int_rn(v[j] * id)));
    sum += q;
    v[j] = static_cast<float>(q) * d;
  }
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
  sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 1);
  sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 2);
  if (i % 4 == 0) {
    const int sb = i / 4;  // 0..7: lane 4 g + sb / 2, half sb % 2 of its sum pair
    __half* so = reinterpret_cast<__half*>(a.act + mma_act_x_bytes(a.k) + blk * 128) + 2 * (4 * g + sb / 2) + sb % 2;
    *so = __float2half_rn(d * static_cast<float>(sum));
  }
}

struct MatvecMmaArgs {
  const uint8_t* w;     // [n_rows] Q4_K rows of k elements
  int64_t w_stride;     // bytes between rows, a multiple of 16
  const uint8_t* act;   // mma_pack's output for these k
  float* y;             // [n_tokens, y_stride]
  int64_t y_stride;
  int64_t n_rows;
  int64_t k;            // multiple of 256
  int n_tokens;         // 1 .. 8
};

__device__ __forceinline__ uint32_t h2_bits(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }
__device__ __forceinline__ __half2 bits_h2(uint32_t u) { return *reinterpret_cast<__half2*>(&u); }

// c += a * b, m16n8k16, FP16 operands (a: 4 registers, b: 2), F32 accumulators. Not volatile (unlike
// mma.cuh's): it reads registers only, so the compiler may interleave independent products with the
// decoding of the next ones instead of issuing each after the one before.
__device__ __forceinline__ void mma_f16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Weights q * s (one rounding) of a register of 1024 + q or 64 + q codes: fma(h, s, -base * s).
__device__ __forceinline__ uint32_t mma_weights(uint32_t codes, __half2 s, __half2 bias) {
  return h2_bits(__hfma2(bits_h2(codes), s, bias));
}

// One 256-element block of the warp's 16 rows, staged at `stage` (rows of kMmaBlockBytes bytes), into
// acc; xf: the block's activation fragments (16 steps), xs: its sub-block sums fragment.
// acc[i]: kMmaChains independent accumulator sets (the block's products alternate between them, so
// consecutive products do not wait on each other's result).
constexpr int kMmaChains = 4;
__device__ __forceinline__ void mma_q4k_block(const uint8_t* stage, const uint2 (&xf)[16], uint32_t xs, int lane,
                                              float (&acc)[kMmaChains][4]) {
  const int g = lane / 4, tig = lane % 4;
  const uint4 ha = *reinterpret_cast<const uint4*>(stage + g * kMmaBlockBytes);
  const uint4 hb = *reinterpret_cast<const uint4*>(stage + (g + 8) * kMmaBlockBytes);
  const __half2 neg1024 = __float2half2_rn(-1024.0f), neg64 = __float2half2_rn(-64.0f);
  // Per row: d and dmin as half2 pairs, the 8 scales and mins as bytes (k_scale_min, 4 per word).
  struct RowScales {
    __half2 d, dbias;     // (d, d), (-1024 d, -1024 d)
    uint32_t sc03, sc47;  // 6-bit scales of sub-blocks 0-3 and 4-7, one per byte
  };
  auto row_scales = [&](const uint4& h) {
    RowScales r;
    r.d = bits_h2(__byte_perm(h.x, 0u, 0x1010));
    r.dbias = __hmul2(r.d, neg1024);
    r.sc03 = h.y & 0x3F3F3F3Fu;
    r.sc47 = (h.w & 0x0F0F0F0Fu) | ((h.y >> 2) & 0x30303030u);
    return r;
  };
  const RowScales sa = row_scales(ha), sb = row_scales(hb);
  // The min term: -dmin * m of sub-blocks 2 tig, 2 tig + 1 for rows g and g + 8 (k slots 2 tig, 2 tig + 1
  // of a step whose slots 8..15 are zero), times the sub-block sums.
  auto mins = [&](const uint4& h) {
    const uint32_t m03 = h.z & 0x3F3F3F3Fu;
    const uint32_t m47 = ((h.w >> 4) & 0x0F0F0F0Fu) | ((h.z >> 2) & 0x30303030u);
    const uint32_t word = tig < 2 ? m03 : m47;
    const uint32_t codes = __byte_perm(word, 0x64646464u, (tig & 1) ? 0x4342u : 0x4140u);  // 1024 + m
    const __half2 dmin = bits_h2(__byte_perm(h.x, 0u, 0x3232));
    return h2_bits(__hfma2(bits_h2(codes), __hneg2(dmin), __hmul2(dmin, __float2half2_rn(1024.0f))));
  };
  mma_f16(acc[0], mins(ha), mins(hb), 0u, 0u, xs, 0u);
  const uint32_t base = smem_addr(stage) + static_cast<uint32_t>(((lane & 7) + 8 * ((lane >> 3) & 1)) * kMmaBlockBytes +
                                                                   16 + 16 * (lane >> 4));
#pragma unroll
  for (int c = 0; c < 4; ++c) {  // 32 bytes of each row: sub-blocks 2c (low nibbles) and 2c + 1 (high)
    uint32_t r[4];  // rows g, g + 8 of bytes 4 tig .. + 3, then of bytes 16 + 4 tig .. + 3
    ldsm_x4(r, base + 32u * c);
    const uint32_t sel = (c & 1) ? 0x4342u : 0x4140u;  // bytes 2c', 2c' + 1 of a scale word, as 1024 + sc
    const uint32_t ca = __byte_perm(c < 2 ? sa.sc03 : sa.sc47, 0x64646464u, sel);
    const uint32_t cb = __byte_perm(c < 2 ? sb.sc03 : sb.sc47, 0x64646464u, sel);
    const __half2 s2a = __hfma2(bits_h2(ca), sa.d, sa.dbias), s2b = __hfma2(bits_h2(cb), sb.d, sb.dbias);  // (s_lo, s_hi)
    const __half2 loa = __low2half2(s2a), hia = __high2half2(s2a), lob = __low2half2(s2b), hib = __high2half2(s2b);
    const __half2 loa_b = __hmul2(loa, neg1024), hia_b = __hmul2(hia, neg64);
    const __half2 lob_b = __hmul2(lob, neg1024), hib_b = __hmul2(hib, neg64);
#pragma unroll
    for (int seg = 0; seg < 2; ++seg) {
      const uint32_t ra = r[2 * seg], rb = r[2 * seg + 1];  // row g, row g + 8
      const uint32_t ra1 = ra >> 8, rb1 = rb >> 8;
      // Low nibbles: elements 64 c + 16 seg + (4 tig, 4 tig + 2) and (4 tig + 1, 4 tig + 3).
      mma_f16(acc[2 * seg], mma_weights((ra & 0x000F000Fu) | 0x64006400u, loa, loa_b),
              mma_weights((rb & 0x000F000Fu) | 0x64006400u, lob, lob_b),
              mma_weights((ra1 & 0x000F000Fu) | 0x64006400u, loa, loa_b),
              mma_weights((rb1 & 0x000F000Fu) | 0x64006400u, lob, lob_b), xf[4 * c + seg].x, xf[4 * c + seg].y);
      // High nibbles (64 + q): elements 32 further.
      mma_f16(acc[2 * seg + 1], mma_weights((ra & 0x00F000F0u) | 0x54005400u, hia, hia_b),
              mma_weights((rb & 0x00F000F0u) | 0x54005400u, hib, hib_b),
              mma_weights((ra1 & 0x00F000F0u) | 0x54005400u, hia, hia_b),
              mma_weights((rb1 & 0x00F000F0u) | 0x54005400u, hib, hib_b), xf[4 * c + 2 + seg].x,
              xf[4 * c + 2 + seg].y);
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
__device__ __forceinline__ void mma_issue_block(uint8_t* stage, const MatvecMmaArgs& a, const MmaCopies& c, int64_t j) {
  const uint32_t s0 = smem_addr(stage);
  const uintptr_t wj = reinterpret_cast<uintptr_t>(a.w) + static_cast<uintptr_t>(j * kMmaBlockBytes);
#pragma unroll
  for (int i = 0; i < 5; ++i) {
    if (c.src[i] >= 0) cp_async16_full(s0 + c.dst[i], wj + static_cast<uintptr_t>(c.src[i]));
  }
}

// Needs (host-checked, matvec_mma_ok): w and w_stride 16-byte aligned, k % 256 == 0, act from mma_pack.
// kWarps (the k split of a CTA), kStages (ring depth) and kMinCtas (CTAs per SM the registers must
// allow) are the knobs the workbench times; production runs the defaults.
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
  float acc[kMmaChains][4] = {};
  const bool token_live = lane / 4 < a.n_tokens;
  const uint2* xact = reinterpret_cast<const uint2*>(a.act);
  const uint32_t* xsum = reinterpret_cast<const uint32_t*>(a.act + mma_act_x_bytes(a.k));
  for (int i = 0; i < n_mine; ++i) {
    const int next = i + kStages - 1;
    if (next < n_mine) {
      mma_issue_block(ring[warp][next % kStages], a, copies, warp + static_cast<int64_t>(next) * kWarps);
    }
    cp_async_commit();
    const int64_t j = warp + static_cast<int64_t>(i) * kWarps;
    // Lanes of token slots past n_tokens hold zeros without reading them (the packed zeros): at one
    // token a warp reads 512 bytes of activations a block instead of 4 KB.
    uint2 xf[16];
    uint32_t xs = 0;
#pragma unroll
    for (int s = 0; s < 16; ++s) xf[s] = make_uint2(0u, 0u);
    if (token_live) {
#pragma unroll
      for (int s = 0; s < 16; ++s) xf[s] = __ldg(xact + (j * 16 + s) * 32 + lane);
      xs = __ldg(xsum + j * 32 + lane);
    }
    cp_async_wait<kStages - 1>();
    __syncwarp();
    mma_q4k_block(ring[warp][i % kStages], xf, xs, lane, acc);
    __syncwarp();
  }
  // Sum the warps' partial products: lane (g, tig) holds rows g, g + 8 of tokens 2 tig, 2 tig + 1.
#pragma unroll
  for (int q = 0; q < 4; ++q) part[warp][lane][q] = (acc[0][q] + acc[1][q]) + (acc[2][q] + acc[3][q]);
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
    if (t < a.n_tokens && r < a.n_rows) a.y[t * a.y_stride + r] = s[q];
  }
}

}  // namespace ds::cuda::kern
