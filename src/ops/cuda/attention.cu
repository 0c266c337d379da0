// CUDA causal GQA attention over a chunked (paged) KV cache (the KV append and the layer's prep are in
// attention_prep.cu; the launch arguments and row stores in attention_rows.cuh).
// Two attention kernels share one work decomposition: a CTA takes a block of packed query rows (row
// = token * group + head-in-group, so every query head of a GQA group shares each K/V load), one KV
// head and one KV range (split); it streams its range once with an online softmax (running max m,
// normalizer l, accumulator o, in the log2 domain) and writes either the final rows (one split) or
// partial (m, l, o) that attn_combine_kernel merges. With the output gate (attention_paged_gated_q8) the
// kernel that writes the final rows (the attention kernel with one split, else the combine) also gates
// o and writes its int8 activations. attn_decode_kernel (the layer's one-token decode) is the
// tensor-core kernel with attention_prep's work done by its own CTAs: one launch fewer.
//   attn_tc_kernel<D, RW>: F16 KV, D in {32, 64, 128, 256}; 4 warps; K/V tiles of 64 positions
//     double-buffered in shared memory by cp.async (16-byte loads); Q K^T and P V with
//     mma.sync.m16n8k16 (f16 in, f32 accumulate), each warp owning 16 rows. RW = row warps: 4 for
//     prefill (64 rows, every warp all positions of a tile); 1 or 2 for decode (16 / 32 rows, the
//     other warps take other positions of each tile and are merged at the end).
//   attn_tc_kernel<D, RW, kern::KvQ8 / kern::KvQ4>: the same over a Q8_0 or Q4_0 cache (D in {64, 128,
//     256}): each tile's blocks go raw into a ring of three stages by cp.async; with RW > 1 a landed
//     tile is converted into one half tile before its products, with RW = 1 (decode, and
//     attn_decode_kernel) each warp converts its positions' codes straight into the mma fragments
//     (tc_attend_frag);
//   attn_simt_kernel<T, E, RB>: F32, F16, Q8_0 or Q4_0 KV, any D <= 512 (the block types: a multiple of
//     32; E = ceil(D / 32)
//     values per lane); warps stride over positions, a lane holds E dims of RB query rows; F32 FMA
//     throughout.
// Non-obvious choice: the split length is computed on the device from the actual position
// (split_len), not from the host bound max_kv: the grid (sized on the host from the SM count and
// occupancy) stays fixed while every CTA gets an equal share of the real KV, so a decode graph
// captured for a long context does not leave most of the GPU idle at short positions.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>

#include "ops/cuda/attention_launch.h"
#include "ops/cuda/attention_prep.cuh"
#include "ops/cuda/attention_rows.cuh"
#include "ops/cuda/launch.cuh"
#include "ops/cuda/mma.cuh"

namespace ds::cuda {
namespace {

using namespace attn;  // NOLINT(google-build-using-namespace): the attention kernels' shared pieces

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kOPad = 4;         // floats of padding per staged output row (bank spread)
constexpr int kMaxSplit = 1024;
constexpr int kCombineWarps = 8;
constexpr int kFuseRows = 16;  // attn_decode_kernel: packed rows per KV head (RW = 1)
constexpr int kRowsT = 8;      // the transposed forms (one token's rows of a KV head): rows per CTA
constexpr int kMinCtasT = 3;   // ... and the CTAs an SM the Q8_0 / Q4_0 one is budgeted for (164 registers at head_dim 256)

// ---- tensor-core path (F16 KV) ----

using kern::ldsm_x4;
using kern::ldsm_x4_trans;
using kern::mma_16816_f16;
using kern::smem_addr;

// 16 bytes global -> shared, bypassing L1.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// A tile of a block-quantized cache (KV = kern::KvQ8 or kern::KvQ4): a head row is RB bytes of blocks,
// copied by cp.async in pieces of P bytes (16, 8 or 4: what RB and so every row's address allow) into a
// staged row of RS bytes; a stage holds the K then the V rows of one tile, and kBlockStages stages form a
// ring (a Q8_0 tile is half an F16 tile's bytes, so two in flight keep as many bytes in flight per SM as
// the F16 kernel's one). head_dim 32 (34- or 18-byte rows: 2-byte pieces) has no tensor-core path.
constexpr int kBlockStages = 3;  // two tiles in flight while one is converted and attended
template <typename KV>
constexpr int block_stage_bytes(int D) {
  return 2 * kBN * ((kern::kv_row_bytes<KV>(D) + 15) / 16 * 16);
}
template <int D, typename KV>
struct BlockTile {
  static constexpr int RB = kern::kv_row_bytes<KV>(D);
  static constexpr int P = RB % 16 == 0 ? 16 : RB % 8 == 0 ? 8 : 4;
  static constexpr int NP = RB / P;
  static constexpr int RS = (RB + 15) / 16 * 16;
  static constexpr int kStageBytes = block_stage_bytes<KV>(D);
  static constexpr int kStages = kBlockStages;
  static_assert(RB % 4 == 0, "cp.async pieces of at least 4 bytes");
};

// The fused decode's prep staging in the ring of the fragment form, before the attention fills it past
// its first stage: the new positions' rotation angles from the second stage on, then (from the next
// stage boundary) its warps' rows.
template <typename KV>
constexpr size_t prep_y_at(int D) {
  const size_t sb = block_stage_bytes<KV>(D), cs = static_cast<size_t>(kFuseRows) * D / 2 * 16;  // double2s
  return sb * (1 + (cs + sb - 1) / sb);
}

// The shared memory the fragment form's ring takes, or more where the partials (over it at the end) or
// the fused decode's prep staging need more (Q4_0's ring is the smaller), with the 16 bytes past it that
// a word's load may read.
template <typename KV>
constexpr size_t frag_ring_bytes(int D) {
  const size_t part = (static_cast<size_t>(kWarps) * 16 * (D + kOPad) + 2 * kWarps * 16) * 4;
  const size_t ring = static_cast<size_t>(kBlockStages) * block_stage_bytes<KV>(D);
  const size_t prep = prep_y_at<KV>(D) + static_cast<size_t>(kWarps) * D * 4;
  const size_t most = ring > part ? ring : part;
  return (most > prep ? most : prep) + 16;
}

// Shared memory of attn_tc_kernel<D, RW, KV> (and of attn_decode_kernel<D, KV>, RW = 1): Q [BM][D + 8]
// half, then
//  - F16: K and V [2 stages][kBN][D + 8] half;
//  - Q8_0 or Q4_0, RW > 1: K and V [kBN][D + 8] half (the converted tile), then the ring of
//    BlockTile<D, KV> (and 16 bytes, as the conversion reads whole words past a row's last block);
//  - Q8_0 or Q4_0, RW = 1 or 0 (on fragments; RW = 0: kRowsT rows, transposed): the ring alone, or the partials where they take more
//    (frag_ring_bytes; and the same 16 bytes);
// the half K/V area (on fragments the ring) is reused at the end for the per-warp partials.
template <typename KV>
constexpr size_t tc_smem_bytes(int D, int RW) {
  const int BM = RW == 0 ? kRowsT : 16 * RW, KW = RW == 0 ? kWarps : kWarps / RW, SK = D + 8;
  const size_t q = static_cast<size_t>(BM) * SK * 2;
  const size_t part = (static_cast<size_t>(KW) * BM * (D + kOPad) + 2 * KW * BM) * 4;
  if constexpr (kern::kKvBlocks<KV>) {
    if (RW <= 1) return q + frag_ring_bytes<KV>(D);
    const size_t raw = static_cast<size_t>(kBlockStages) * block_stage_bytes<KV>(D);
    const size_t kv = static_cast<size_t>(2) * kBN * SK * 2;
    return q + (kv > part ? kv : part) + raw + 16;
  } else {
    const size_t kv = static_cast<size_t>(4) * kBN * SK * 2;
    return q + (kv > part ? kv : part);
  }
}

template <int P>
__device__ __forceinline__ void cp_async_piece(void* dst, const void* src) {
  if constexpr (P == 16) {
    cp_async16(dst, src);
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(smem_addr(dst)), "l"(src), "n"(P));
  }
}

// Loads positions [j0, j0 + kBN) of KV head g into one stage; rows at or past kv_end become zeros.
// With copy_end < kv_end (the fused decode's first tile, issued before the new rows exist) rows
// [copy_end, kv_end) are left to the caller. A tile inside one KV chunk (every tile with chunks of a
// multiple of kBN) takes the short path: thread i copies 16-byte piece i % (D / 8) of rows i / (D / 8)
// + k kThreads / (D / 8), its source and destination advancing by fixed strides. The general path
// locates every piece on its own (chunk, row, zero fill), several times the instructions, which the
// CTA's 4 warps issue between their tiles' products (or, for the one tile of a short context, on the
// step's critical path).
template <int D>
__device__ __forceinline__ void tc_load_tile(const KParams& p, __half* sK, __half* sV, int j0, int kv_end, int g,
                                             int copy_end) {
  constexpr int kPieces = D / 8;  // 16-byte pieces per row
  constexpr int SK = D + 8;
  const int c0 = j0 / p.C, r0 = j0 - c0 * p.C;
  if (r0 + kBN <= p.C) {
    constexpr int kRowStep = kThreads / kPieces;
    static_assert(kThreads % kPieces == 0 && kBN % kRowStep == 0, "pieces tile the CTA");
    const int pc = static_cast<int>(threadIdx.x) % kPieces, rr = static_cast<int>(threadIdx.x) / kPieces;
    const int64_t row_bytes = static_cast<int64_t>(p.Hkv) * D * 2;
    const int64_t off = (static_cast<int64_t>(r0 + rr) * p.Hkv + g) * D * 2 + pc * 16;
    const uint8_t* ks = p.k_base[c0] + p.k_off + off;
    const uint8_t* vs = p.v_base[c0] + p.v_off + off;
    __half* dk = sK + rr * SK + pc * 8;
    __half* dv = sV + rr * SK + pc * 8;
    if (j0 + kBN <= copy_end) {
#pragma unroll
      for (int i = 0; i < kBN / kRowStep; ++i) {
        cp_async16(dk + i * kRowStep * SK, ks + i * kRowStep * row_bytes);
        cp_async16(dv + i * kRowStep * SK, vs + i * kRowStep * row_bytes);
      }
    } else {  // the range ends inside the tile: rows past it become zeros (P V sees 0 * 0)
      const int n_copy = copy_end - j0, n_rows = kv_end - j0;
#pragma unroll
      for (int i = 0; i < kBN / kRowStep; ++i) {
        const int row = rr + i * kRowStep;
        if (row < n_copy) {
          cp_async16(dk + i * kRowStep * SK, ks + i * kRowStep * row_bytes);
          cp_async16(dv + i * kRowStep * SK, vs + i * kRowStep * row_bytes);
        } else if (row >= n_rows) {
          *reinterpret_cast<uint4*>(dk + i * kRowStep * SK) = make_uint4(0, 0, 0, 0);
          *reinterpret_cast<uint4*>(dv + i * kRowStep * SK) = make_uint4(0, 0, 0, 0);
        }
      }
    }
    return;
  }
#pragma unroll 4
  for (int i = threadIdx.x; i < kBN * kPieces; i += kThreads) {
    const int rr = i / kPieces, pc = i - rr * kPieces;
    const int j = j0 + rr;
    __half* dk = sK + rr * SK + pc * 8;
    __half* dv = sV + rr * SK + pc * 8;
    if (j < copy_end) {
      const int c = j / p.C, r = j - c * p.C;
      const int64_t off = ((static_cast<int64_t>(r) * p.Hkv + g) * D + pc * 8) * 2;
      cp_async16(dk, p.k_base[c] + p.k_off + off);
      cp_async16(dv, p.v_base[c] + p.v_off + off);
    } else if (j >= kv_end) {  // past the range (possibly past the cache): zeros, so P V sees 0 * 0
      *reinterpret_cast<uint4*>(dk) = make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(dv) = make_uint4(0, 0, 0, 0);
    }
  }
}

// Issues the copies of positions [j0, min(j0 + kBN, copy_end)) of KV head g into the stage `raw` (K rows,
// then V rows); the rows past copy_end are left (tc_convert_blocks zeroes those past the range, the fused
// decode's prep writes the new positions' rows). A tile inside one KV chunk (every tile with chunks of a
// multiple of kBN) steps thread i through pieces i, i + kThreads, ... of its rows by fixed increments;
// the general path locates every piece on its own.
template <int D, typename KV>
__device__ __forceinline__ void tc_load_tile_blocks(const KParams& p, uint8_t* raw, int j0, int g, int copy_end) {
  using Q = BlockTile<D, KV>;
  const int n = min(kBN, copy_end - j0) * Q::NP;
  const int c0 = j0 / p.C, r0 = j0 - c0 * p.C;
  if (r0 + kBN <= p.C) {
    constexpr int kRowStep = kThreads / Q::NP, kPieceStep = kThreads % Q::NP;
    const int64_t stride = static_cast<int64_t>(p.Hkv) * Q::RB;
    const uint8_t* ks = p.k_base[c0] + p.k_off + (static_cast<int64_t>(r0) * p.Hkv + g) * Q::RB;
    const uint8_t* vs = p.v_base[c0] + p.v_off + (static_cast<int64_t>(r0) * p.Hkv + g) * Q::RB;
    int rr = static_cast<int>(threadIdx.x) / Q::NP, pc = static_cast<int>(threadIdx.x) % Q::NP;
    for (int i = threadIdx.x; i < n; i += kThreads) {
      cp_async_piece<Q::P>(raw + rr * Q::RS + pc * Q::P, ks + rr * stride + pc * Q::P);
      cp_async_piece<Q::P>(raw + (kBN + rr) * Q::RS + pc * Q::P, vs + rr * stride + pc * Q::P);
      rr += kRowStep;
      pc += kPieceStep;
      if (pc >= Q::NP) {
        pc -= Q::NP;
        ++rr;
      }
    }
    return;
  }
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const int rr = i / Q::NP, pc = i - rr * Q::NP;
    const int j = j0 + rr, c = j / p.C, r = j - c * p.C;
    const int64_t off = (static_cast<int64_t>(r) * p.Hkv + g) * Q::RB + pc * Q::P;
    cp_async_piece<Q::P>(raw + rr * Q::RS + pc * Q::P, p.k_base[c] + p.k_off + off);
    cp_async_piece<Q::P>(raw + (kBN + rr) * Q::RS + pc * Q::P, p.v_base[c] + p.v_off + off);
  }
}

// 4 bytes (one word) u_j as 2 half2 of (u_j - bias) * d, each rounded once: a byte becomes the half
// 1024 + u_j by byte permutes (exact), less the half `bias` (1024 + the code's offset: exact), times d.
__device__ __forceinline__ void bytes_to_half(uint32_t u, unsigned short bias, __half2 d2, uint32_t& lo, uint32_t& hi) {
  const __half2 b2 = __half2half2(__ushort_as_half(bias));
  uint32_t a = __byte_perm(u, 0x64646464u, 0x4140), b = __byte_perm(u, 0x64646464u, 0x4342);
  const __half2 ha = __hmul2(__hsub2(*reinterpret_cast<__half2*>(&a), b2), d2);
  const __half2 hb = __hmul2(__hsub2(*reinterpret_cast<__half2*>(&b), b2), d2);
  lo = *reinterpret_cast<const uint32_t*>(&ha);
  hi = *reinterpret_cast<const uint32_t*>(&hb);
}

// 4 int8 codes (one word) as 2 half2 of code * d, each rounded once (the product of an int8 and a half
// is exact before rounding, so the bits of __float2half_rn(code * d)): a code c is the byte c ^ 0x80,
// less 128 (the half 1152).
__device__ __forceinline__ void q8_codes_to_half(uint32_t q, __half2 d2, uint32_t& lo, uint32_t& hi) {
  bytes_to_half(q ^ 0x80808080u, 0x6480u, d2, lo, hi);
}

// 4 Q4_0 codes, one in the low 4 bits of each byte of n (the others zero), as 2 half2 of (c - 8) * d,
// each rounded once (exact before rounding, as q8_codes_to_half): less 8 (the half 1032).
__device__ __forceinline__ void q4_codes_to_half(uint32_t n, __half2 d2, uint32_t& lo, uint32_t& hi) {
  bytes_to_half(n, 0x6408u, d2, lo, hi);
}

// The staged tile `raw` of a block-quantized cache as the half tiles sK / sV the products read: element =
// half(code * d) (Q8_0) or half((code - 8) * d) (Q4_0); rows [n_rows, kBN) become zeros (P V then sees
// 0 * 0). A thread converts 8 elements at a time into one 16-byte store (consecutive threads,
// consecutive stores: no bank conflicts). Its pieces are one column c8 of every kRowStep-th staged row,
// so the piece's offset in a row, and with it the alignment of its codes (a block is 2-byte aligned;
// they come as 4-byte words from the aligned address at or below them, realigned by one byte permute
// whose selector is fixed per thread), is the same for all of them. A Q8_0 piece is 8 consecutive code
// bytes; a Q4_0 piece is the low (elements 0-15 of a block) or high (16-31) nibbles of 8 consecutive
// bytes. The loads of kConvertBatch pieces are issued before the first of their conversions: a CTA of 4
// warps has no other warp to hide a piece's shared-load latency behind.
constexpr int kConvertBatch = 8;
template <int D, typename KV>
__device__ __forceinline__ void tc_convert_blocks(const uint8_t* raw, __half* sK, __half* sV, int n_rows) {
  using Q = BlockTile<D, KV>;
  constexpr bool kQ8 = std::is_same_v<KV, kern::KvQ8>;
  constexpr int NC = D / 8, SK = D + 8;  // 8-element pieces a row
  constexpr int kRowStep = kThreads / NC;
  constexpr int kPieces = 2 * kBN / kRowStep;  // a thread's pieces: K rows, then V rows
  static_assert(kThreads % NC == 0 && kBN % kRowStep == 0 && kPieces % kConvertBatch == 0, "pieces tile the CTA");
  const int c8 = static_cast<int>(threadIdx.x) % NC, r0 = static_cast<int>(threadIdx.x) / NC;
  const int blk_off = (c8 / 4) * kern::kv_block_bytes<KV>();
  const int code_off = blk_off + 2 + (kQ8 ? c8 % 4 : c8 % 2) * 8;
  const int nib_shift = !kQ8 && c8 % 4 >= 2 ? 4 : 0;  // Q4_0: the high nibbles hold elements 16-31
  const uint8_t* first = raw + r0 * Q::RS;
  const int sh = static_cast<int>(reinterpret_cast<uintptr_t>(first + code_off) & 3);  // 0 or 2, every row
  const uint32_t sel = sh != 0 ? 0x5432u : 0x3210u;  // 0x3210: the first word as it is
  const int word_off = code_off - sh;
#pragma unroll
  for (int b = 0; b < kPieces; b += kConvertBatch) {
    uint32_t w[kConvertBatch][3];
    __half d[kConvertBatch];
#pragma unroll
    for (int k = 0; k < kConvertBatch; ++k) {
      const uint8_t* row = first + (b + k) * kRowStep * Q::RS;
      d[k] = *reinterpret_cast<const __half*>(row + blk_off);
      const uint32_t* wp = reinterpret_cast<const uint32_t*>(row + word_off);
      w[k][0] = wp[0];
      w[k][1] = wp[1];
      w[k][2] = wp[2];  // past a row's last block: the next row's or the ring's padding, unused
    }
#pragma unroll
    for (int k = 0; k < kConvertBatch; ++k) {
      const int rr = r0 + (b + k) * kRowStep;  // staged row: K rows [0, kBN), then V rows
      const bool is_k = (b + k) * kRowStep < kBN;  // known at compile time (r0 < kRowStep)
      const int row = is_k ? rr : rr - kBN;
      const __half2 d2 = __half2half2(d[k]);
      const uint32_t c0 = __byte_perm(w[k][0], w[k][1], sel), c1 = __byte_perm(w[k][1], w[k][2], sel);
      uint4 out;
      if constexpr (kQ8) {
        q8_codes_to_half(c0, d2, out.x, out.y);
        q8_codes_to_half(c1, d2, out.z, out.w);
      } else {
        q4_codes_to_half((c0 >> nib_shift) & 0x0F0F0F0Fu, d2, out.x, out.y);
        q4_codes_to_half((c1 >> nib_shift) & 0x0F0F0F0Fu, d2, out.z, out.w);
      }
      if (row >= n_rows) out = make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>((is_k ? sK : sV) + row * SK + c8 * 8) = out;
    }
  }
}

// One row's step of the online softmax: the running maximum m (log2 domain) takes this tile's maximum mx;
// returns the offset the tile's scores are exponentiated against (0 while the row sees nothing yet, so it
// stays at zero) and sets corr, the factor of the sums and accumulators so far.
__device__ __forceinline__ float online_max_step(float& m, float mx, float& corr) {
  const float mn = fmaxf(m, mx);
  const float mu = mn == -INFINITY ? 0.0f : mn;
  corr = exp2f(m - mu);
  m = mn;
  return mu;
}

// One tile's scores S (NT n-tiles of a warp's mma layout: this lane's positions jb + 8 nt + {0, 1}, rows a
// and b = a + 8) into the log2 domain, the causal future masked (positions past lim_a / lim_b), then the
// online softmax: the running maxima m and per-lane partial sums l updated, the accumulators O rescaled,
// S replaced by the probabilities.
template <int NT, int DT>
__device__ __forceinline__ void online_softmax_tile(float (&S)[NT][4], float (&O)[DT][4], int jb, int lim_a, int lim_b,
                                                    float scale_log2, float& m_a, float& m_b, float& l_a, float& l_b) {
  float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int j = jb + nt * 8 + e;
      S[nt][e] = j <= lim_a ? S[nt][e] * scale_log2 : -INFINITY;
      S[nt][2 + e] = j <= lim_b ? S[nt][2 + e] * scale_log2 : -INFINITY;
      mx_a = fmaxf(mx_a, S[nt][e]);
      mx_b = fmaxf(mx_b, S[nt][2 + e]);
    }
  }
#pragma unroll
  for (int o = 1; o <= 2; o <<= 1) {  // the 4 lanes of a quad share a row
    mx_a = fmaxf(mx_a, __shfl_xor_sync(0xFFFFFFFFu, mx_a, o));
    mx_b = fmaxf(mx_b, __shfl_xor_sync(0xFFFFFFFFu, mx_b, o));
  }
  float corr_a, corr_b;
  const float mu_a = online_max_step(m_a, mx_a, corr_a), mu_b = online_max_step(m_b, mx_b, corr_b);
  float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    S[nt][0] = exp2f(S[nt][0] - mu_a);
    S[nt][1] = exp2f(S[nt][1] - mu_a);
    S[nt][2] = exp2f(S[nt][2] - mu_b);
    S[nt][3] = exp2f(S[nt][3] - mu_b);
    sum_a += S[nt][0] + S[nt][1];
    sum_b += S[nt][2] + S[nt][3];
  }
  l_a = l_a * corr_a + sum_a;  // per-lane partial sums; the quad is reduced at the end
  l_b = l_b * corr_b + sum_b;
#pragma unroll
  for (int i = 0; i < DT; ++i) {
    O[i][0] *= corr_a;
    O[i][1] *= corr_a;
    O[i][2] *= corr_b;
    O[i][3] *= corr_b;
  }
}

// The end of a tensor-core attention: the warps' partials (O, the quad's l reduced here, m) staged at sO
// ([KW][BM][D + kOPad] floats, then m and l), merged and written by write_rows. col(i, n): the head dim
// of column n of output n-tile i.
template <int D, int KW, int BM, typename Col>
__device__ __forceinline__ void stage_and_write(const KParams& p, const float (&O)[D / 8][4], float m_a, float m_b,
                                                float l_a, float l_b, float* sO, int kw, int ra, int lane,
                                                const CtaWork& w, Col col) {
  float* sM = sO + KW * BM * (D + kOPad);
  float* sL = sM + KW * BM;
  l_a += __shfl_xor_sync(0xFFFFFFFFu, l_a, 1);
  l_a += __shfl_xor_sync(0xFFFFFFFFu, l_a, 2);
  l_b += __shfl_xor_sync(0xFFFFFFFFu, l_b, 1);
  l_b += __shfl_xor_sync(0xFFFFFFFFu, l_b, 2);
  float* oa = sO + (kw * BM + ra) * (D + kOPad);
  float* ob = oa + 8 * (D + kOPad);
#pragma unroll
  for (int i = 0; i < D / 8; ++i) {
    const int c0 = col(i, (lane & 3) * 2), c1 = col(i, (lane & 3) * 2 + 1);
    oa[c0] = O[i][0];
    oa[c1] = O[i][1];
    ob[c0] = O[i][2];
    ob[c1] = O[i][3];
  }
  if ((lane & 3) == 0) {
    sM[kw * BM + ra] = m_a;
    sL[kw * BM + ra] = l_a;
    sM[kw * BM + ra + 8] = m_b;
    sL[kw * BM + ra + 8] = l_b;
  }
  __syncthreads();
  write_rows(p, sO, sM, sL, KW, BM, D + kOPad, w.row0, w.row_end, w.g, w.s);
}

// The F16 tiles' double buffer over the CTA's positions [w.kv_begin, w.kv_end): f16_ring_begin issues the
// first tile's group (the caller's group holds it when kTile0Issued); f16_ring_next issues tile + 1's
// copies into the other stage, waits until tile `tile` has landed for this thread and returns its stage
// (the caller's barrier then makes it every thread's).
template <int D, bool kTile0Issued>
__device__ __forceinline__ void f16_ring_begin(const KParams& p, __half* sK, __half* sV, const CtaWork& w) {
  if constexpr (!kTile0Issued) {
    tc_load_tile<D>(p, sK, sV, w.kv_begin, w.kv_end, w.g, w.kv_end);
    cp_async_commit();
  }
}
template <int D>
__device__ __forceinline__ int f16_ring_next(const KParams& p, __half* sK, __half* sV, const CtaWork& w, int tile,
                                             int n_tiles) {
  constexpr int SK = D + 8;
  if (tile + 1 < n_tiles) {
    const int nx = (tile + 1) & 1;
    tc_load_tile<D>(p, sK + nx * kBN * SK, sV + nx * kBN * SK, w.kv_begin + (tile + 1) * kBN, w.kv_end, w.g,
                    w.kv_end);
  }
  cp_async_commit();
  cp_async_wait<1>();  // this tile's group has landed (the next one may be in flight)
  return tile & 1;
}

// The tensor-core attention of packed rows [row0, row_end) of KV head g over the positions [kv_begin,
// kv_end) of split s, with the CTA's query rows in sQ as half (zeros past row_end): writes the final rows
// or the split's partial (write_rows). sK / sV: the two K/V stages; reused for the partials at the end.
// KV: __half (F16 tiles, double-buffered by cp.async) or kern::KvQ8 / kern::KvQ4 (raw: the ring of
// BlockTile<D, KV>, each stage converted into the one half tile sK / sV after it lands).
template <int D, int RW, typename KV, bool kTile0Issued = false>
__device__ __forceinline__ void tc_attend(const KParams& p, const __half* sQ, __half* sK, __half* sV, uint8_t* raw,
                                          const CtaWork& w) {
  constexpr bool kBlocks = kern::kKvBlocks<KV>;
  const int g = w.g, pos0 = w.pos0, row0 = w.row0, kv_begin = w.kv_begin, kv_end = w.kv_end;
  constexpr int KW = kWarps / RW;  // warps sharing the same rows, splitting each tile's positions
  constexpr int BM = 16 * RW;      // rows per CTA
  constexpr int PW = kBN / KW;     // positions per warp per tile
  constexpr int NT = PW / 8;       // score n-tiles per warp
  constexpr int DT = D / 8;        // output n-tiles per warp
  constexpr int SK = D + 8;        // shared row stride (halves): 16 bytes of padding spreads banks
  static_assert(PW % 16 == 0 && D % 16 == 0, "tile shape");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rw = warp / KW, kw = warp - rw * KW;
  const int ra = rw * 16 + lane / 4;  // local rows of this lane's accumulators: ra and ra + 8
  const int lim_a = pos0 + min(row0 + ra, p.R - 1) / p.G;
  const int lim_b = pos0 + min(row0 + ra + 8, p.R - 1) / p.G;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;
  float O[DT][4];
#pragma unroll
  for (int i = 0; i < DT; ++i) O[i][0] = O[i][1] = O[i][2] = O[i][3] = 0.0f;

  const uint32_t q_addr = smem_addr(sQ + (rw * 16 + (lane & 15)) * SK + (lane >> 4) * 8);
  const int k_row = kw * PW + (lane & 7) + ((lane >> 4) << 3), k_col = ((lane >> 3) & 1) * 8;
  const int v_row = kw * PW + (lane & 7) + (((lane >> 3) & 1) << 3), v_col = (lane >> 4) * 8;

  const int n_tiles = (kv_end - kv_begin + kBN - 1) / kBN;
  using Q = BlockTile<D, KV>;
  if constexpr (kBlocks) {
    if constexpr (!kTile0Issued) {  // else the caller's group of copies holds the first tile
      tc_load_tile_blocks<D, KV>(p, raw, kv_begin, g, kv_end);
      cp_async_commit();
    }
    // the second tile's group (empty where there is none)
    if (n_tiles > 1) tc_load_tile_blocks<D, KV>(p, raw + Q::kStageBytes, kv_begin + kBN, g, kv_end);
    cp_async_commit();
  } else {
    f16_ring_begin<D, kTile0Issued>(p, sK, sV, w);
  }
  for (int tile = 0; tile < n_tiles; ++tile) {
    int stage = 0;  // blocks: one half tile, converted from raw stage tile % 3
    if constexpr (kBlocks) {
      if (tile + 2 < n_tiles) {
        tc_load_tile_blocks<D, KV>(p, raw + (tile + 2) % Q::kStages * Q::kStageBytes, kv_begin + (tile + 2) * kBN,
                                   g, kv_end);
      }
      cp_async_commit();
      cp_async_wait<2>();  // this tile's group has landed (the next two may be in flight)
    } else {
      stage = f16_ring_next<D>(p, sK, sV, w, tile, n_tiles);
    }
    __syncthreads();
    if constexpr (kBlocks) {
      tc_convert_blocks<D, KV>(raw + tile % Q::kStages * Q::kStageBytes, sK, sV,
                               min(kBN, kv_end - kv_begin - tile * kBN));
      __syncthreads();
    }

    const uint32_t k_addr = smem_addr(sK + stage * kBN * SK + k_row * SK + k_col);
    const uint32_t v_addr = smem_addr(sV + stage * kBN * SK + v_row * SK + v_col);
    float S[NT][4];
#pragma unroll
    for (int i = 0; i < NT; ++i) S[i][0] = S[i][1] = S[i][2] = S[i][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      uint32_t a[4];
      ldsm_x4(a, q_addr + ks * 32);
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        uint32_t b[4];
        ldsm_x4(b, k_addr + (np * 16 * SK + ks * 16) * 2);
        mma_16816_f16(S[2 * np], a, b[0], b[1]);
        mma_16816_f16(S[2 * np + 1], a, b[2], b[3]);
      }
    }

    online_softmax_tile(S, O, kv_begin + tile * kBN + kw * PW + (lane & 3) * 2, lim_a, lim_b, p.scale_log2, m_a, m_b, l_a,
                        l_b);
    // O += P V: the score accumulators of two n-tiles are the A fragment of one k-step.
#pragma unroll
    for (int kk = 0; kk < PW / 16; ++kk) {
      const uint32_t a[4] = {pack_half2(S[2 * kk][0], S[2 * kk][1]), pack_half2(S[2 * kk][2], S[2 * kk][3]),
                             pack_half2(S[2 * kk + 1][0], S[2 * kk + 1][1]),
                             pack_half2(S[2 * kk + 1][2], S[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t b[4];
        ldsm_x4_trans(b, v_addr + (kk * 16 * SK + dp * 16) * 2);
        mma_16816_f16(O[2 * dp], a, b[0], b[1]);
        mma_16816_f16(O[2 * dp + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }
  cp_async_wait<0>();

  // Stage the per-warp partials over the (now free) K/V area and merge them.
  stage_and_write<D, KW, BM>(p, O, m_a, m_b, l_a, l_b, reinterpret_cast<float*>(sK), kw, ra, lane, w,
                             [](int i, int n) { return i * 8 + n; });
}

// ---- Q8_0 and Q4_0 decode on fragments (RW = 1): no half tile ----
// Each warp converts the codes of its own 16 positions straight into the mma's B fragments, so the CTA
// needs no half K / V tile (its shared memory is Q and the ring, about 110 KB at head_dim 256 with Q8_0:
// two CTAs an SM) and a tile costs one CTA barrier instead of three. Both products run on a permutation
// of their 16-element k or 8-column n groups that makes a lane's codes one word of a row:
//  - Q K^T: the k index 2t, 2t + 1, 2t + 8, 2t + 9 of a k16 step (lane t = lane % 4) is head dim 4t .. 4t + 3
//    of its 16, so Q is staged with its columns permuted (frag_q_col) and a lane's B fragment is one
//    word of codes of its position (Q4_0: one word of nibbles holds both k16 steps of a block, the low
//    nibbles dims 4t .. 4t + 3, the high ones 16 + 4t .. 16 + 4t + 3);
//  - P V: the output column n = lane / 4 of n-tile 4 b + j is head dim 32 b + 4 n + j, so a lane's B
//    fragments of four n-tiles come from one word of each of its four positions (Q4_0: word n % 4 of
//    the block, the low nibbles for n < 4), and the partials are stored back by frag_o_col.
// The elements are those tc_convert_blocks makes; only the products' summation order differs.
__device__ __forceinline__ int frag_q_col(int d) {
  const int p = d & 15, t = p >> 2, j = p & 3;
  return (d & ~15) + 2 * t + (j & 1) + 8 * (j >> 1);
}
__device__ __forceinline__ int frag_o_col(int i, int n) { return 32 * (i >> 2) + 4 * n + (i & 3); }

// The 4 codes at `at` in a staged row (a 4-byte aligned address when kAligned, else 2 bytes past one).
template <bool kAligned>
__device__ __forceinline__ uint32_t frag_word(const uint8_t* at) {
  if constexpr (kAligned) {
    return *reinterpret_cast<const uint32_t*>(at);
  } else {
    const uint32_t* w = reinterpret_cast<const uint32_t*>(at - 2);
    return __byte_perm(w[0], w[1], 0x5432);
  }
}

// The word of codes at byte off (a multiple of 4) past block b's scale in a staged row of blocks: one
// aligned load where the block's codes start on a word (b * block bytes + 2 a multiple of 4), else two.
template <typename KV>
__device__ __forceinline__ uint32_t block_code_word(const uint8_t* row, int b, int off) {
  constexpr int BB = kern::kv_block_bytes<KV>();
  const uint8_t* at = row + b * BB + 2 + off;
  return (b * BB + 2) % 4 == 0 ? frag_word<true>(at) : frag_word<false>(at);
}

// Two positions' words of biased bytes ua (scale da) and ub (db) as the four half2 {(ua_j - bias) * da,
// (ub_j - bias) * db}, j = 0..3, each rounded once, as bytes_to_half.
__device__ __forceinline__ void pair_to_half(uint32_t ua, uint32_t ub, unsigned short bias, __half2 dab,
                                             uint32_t (&out)[4]) {
  const uint32_t x01 = __byte_perm(ua, ub, 0x5140), x23 = __byte_perm(ua, ub, 0x7362);
  const __half2 b2 = __half2half2(__ushort_as_half(bias));
  uint32_t h[4] = {__byte_perm(x01, 0x64646464u, 0x4140), __byte_perm(x01, 0x64646464u, 0x4342),
                   __byte_perm(x23, 0x64646464u, 0x4140), __byte_perm(x23, 0x64646464u, 0x4342)};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const __half2 v = __hmul2(__hsub2(*reinterpret_cast<__half2*>(&h[j]), b2), dab);
    out[j] = *reinterpret_cast<const uint32_t*>(&v);
  }
}

// The fragment forms' ring of BlockTile<D, KV> stages over the CTA's positions [w.kv_begin, w.kv_end):
// frag_ring_begin issues the groups of the first two tiles (the first one is the caller's when
// kTile0Issued); frag_ring_next waits until tile `tile` has landed for every thread (and every warp is done
// with the stage it refills), issues tile + 2's copies and returns tile's stage.
template <int D, typename KV, bool kTile0Issued>
__device__ __forceinline__ void frag_ring_begin(const KParams& p, uint8_t* raw, const CtaWork& w, int n_tiles) {
  using Q = BlockTile<D, KV>;
  if constexpr (!kTile0Issued) {
    tc_load_tile_blocks<D, KV>(p, raw, w.kv_begin, w.g, w.kv_end);
    cp_async_commit();
  }
  if (n_tiles > 1) tc_load_tile_blocks<D, KV>(p, raw + Q::kStageBytes, w.kv_begin + kBN, w.g, w.kv_end);
  cp_async_commit();
}
template <int D, typename KV>
__device__ __forceinline__ const uint8_t* frag_ring_next(const KParams& p, uint8_t* raw, const CtaWork& w, int tile,
                                                         int n_tiles) {
  using Q = BlockTile<D, KV>;
  cp_async_wait<1>();  // this tile's group has landed (the next one may be in flight)
  __syncthreads();     // ... for every thread, and every warp is done with the stage refilled next
  if (tile + 2 < n_tiles) {
    tc_load_tile_blocks<D, KV>(p, raw + (tile + 2) % Q::kStages * Q::kStageBytes, w.kv_begin + (tile + 2) * kBN, w.g,
                               w.kv_end);
  }
  cp_async_commit();
  return raw + tile % Q::kStages * Q::kStageBytes;
}

// P V on fragments, a lane's V values: the staged V rows of positions kw * 16 + 2t + {0, 1, 8, 9} of the tile
// (valid below n_rows), and of block b the word of lane group c (Q8_0: word c; Q4_0: the low nibbles of
// word c for c < 4, the high ones of word c - 4) as biased bytes (Q8_0 codes c ^ 0x80, bias 128; Q4_0
// nibbles, bias 8) times the positions' scales (0 past n_rows: P V then sees 0 * 0), as half2:
// lo[j] = {position 2t, 2t + 1} and hi[j] = {2t + 8, 2t + 9} of the word's dim j (pair_to_half).
template <int D, typename KV>
__device__ __forceinline__ void frag_v_rows(const uint8_t* kst, int kw, int t, int n_rows, const uint8_t* (&vrow)[4],
                                            bool (&vvalid)[4]) {
  constexpr int PW = kBN / kWarps;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int r = kw * PW + 2 * t + (k & 1) + 8 * (k >> 1);
    vrow[k] = kst + (kBN + r) * BlockTile<D, KV>::RS;
    vvalid[k] = r < n_rows;
  }
}
template <typename KV>
__device__ __forceinline__ void frag_v_halves(const uint8_t* const (&vrow)[4], const bool (&vvalid)[4], int b, int c,
                                              uint32_t (&lo)[4], uint32_t (&hi)[4]) {
  constexpr bool kQ8 = std::is_same_v<KV, kern::KvQ8>;
  constexpr int BB = kern::kv_block_bytes<KV>();
  constexpr unsigned short kBias = kQ8 ? 0x6480u : 0x6408u;  // the halves 1152 and 1032
  uint32_t wv[4];
  __half dv[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t word = block_code_word<KV>(vrow[k], b, 4 * (kQ8 ? c : c & 3));
    wv[k] = kQ8 ? word ^ 0x80808080u : (word >> (4 * (c >> 2))) & 0x0F0F0F0Fu;
    const __half d = *reinterpret_cast<const __half*>(vrow[k] + b * BB);
    dv[k] = vvalid[k] ? d : __ushort_as_half(0);
  }
  pair_to_half(wv[0], wv[1], kBias, __halves2half2(dv[0], dv[1]), lo);
  pair_to_half(wv[2], wv[3], kBias, __halves2half2(dv[2], dv[3]), hi);
}

// tc_attend for RW = 1 over a Q8_0 or Q4_0 cache, on fragments: sQ holds the rows with frag_q_col's
// columns, raw the ring (the first tile's group issued by the caller when kTile0Issued).
template <int D, typename KV, bool kTile0Issued>
__device__ __forceinline__ void tc_attend_frag(const KParams& p, const __half* sQ, uint8_t* raw, const CtaWork& w) {
  using Q = BlockTile<D, KV>;
  constexpr bool kQ8 = std::is_same_v<KV, kern::KvQ8>;
  constexpr int KW = kWarps, BM = 16, PW = kBN / KW, NT = PW / 8, DT = D / 8, SK = D + 8;
  constexpr int BB = kern::kv_block_bytes<KV>();
  static_assert(PW == 16 && NT == 2 && Q::RS % 4 == 0, "a warp's 16 positions are one k16 step of P V");
  const int pos0 = w.pos0, row0 = w.row0, kv_begin = w.kv_begin, kv_end = w.kv_end;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, kw = warp, t = lane & 3, c = lane >> 2;
  const int ra = lane / 4;
  const int lim_a = pos0 + min(row0 + ra, p.R - 1) / p.G;
  const int lim_b = pos0 + min(row0 + ra + 8, p.R - 1) / p.G;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;
  float O[DT][4];
#pragma unroll
  for (int i = 0; i < DT; ++i) O[i][0] = O[i][1] = O[i][2] = O[i][3] = 0.0f;
  const uint32_t q_addr = smem_addr(sQ + (lane & 15) * SK + (lane >> 4) * 8);

  const int n_tiles = (kv_end - kv_begin + kBN - 1) / kBN;
  frag_ring_begin<D, KV, kTile0Issued>(p, raw, w, n_tiles);
  for (int tile = 0; tile < n_tiles; ++tile) {
    const uint8_t* kst = frag_ring_next<D, KV>(p, raw, w, tile, n_tiles);
    const int n_rows = min(kBN, kv_end - kv_begin - tile * kBN);  // rows past it: stale bytes, zeroed here

    // S = Q K^T over the warp's positions kw * 16 + nt * 8 + c (as this lane's B column).
    float S[NT][4];
#pragma unroll
    for (int i = 0; i < NT; ++i) S[i][0] = S[i][1] = S[i][2] = S[i][3] = 0.0f;
    const uint8_t* krow[NT];
    bool kvalid[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int r = kw * PW + nt * 8 + c;
      krow[nt] = kst + r * Q::RS;
      kvalid[nt] = r < n_rows;
    }
#pragma unroll
    for (int b = 0; b < D / 32; ++b) {
      __half2 d2[NT];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const __half d = *reinterpret_cast<const __half*>(krow[nt] + b * BB);
        d2[nt] = __half2half2(kvalid[nt] ? d : __ushort_as_half(0));
      }
      uint32_t kword[NT];  // Q4_0: one word of nibbles a position, both k16 steps of the block
#pragma unroll
      for (int nt = 0; nt < NT && !kQ8; ++nt) {
        kword[nt] = block_code_word<KV>(krow[nt], b, 4 * t);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t a[4];
        ldsm_x4(a, q_addr + (2 * b + h) * 32);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          uint32_t b0, b1;
          if constexpr (kQ8) {
            q8_codes_to_half(block_code_word<KV>(krow[nt], b, 16 * h + 4 * t), d2[nt], b0, b1);
          } else {
            q4_codes_to_half((kword[nt] >> (4 * h)) & 0x0F0F0F0Fu, d2[nt], b0, b1);
          }
          kern::mma_16816_f16_pure(S[nt], a, b0, b1);
        }
      }
    }

    online_softmax_tile(S, O, kv_begin + tile * kBN + kw * PW + t * 2, lim_a, lim_b, p.scale_log2, m_a, m_b, l_a, l_b);

    // O += P V: this lane's B rows are the positions kw * 16 + 2t + {0, 1} (b0) and + {8, 9} (b1).
    const uint32_t a[4] = {pack_half2(S[0][0], S[0][1]), pack_half2(S[0][2], S[0][3]), pack_half2(S[1][0], S[1][1]),
                           pack_half2(S[1][2], S[1][3])};
    const uint8_t* vrow[4];
    bool vvalid[4];
    frag_v_rows<D, KV>(kst, kw, t, n_rows, vrow, vvalid);
#pragma unroll
    for (int b = 0; b < D / 32; ++b) {
      uint32_t b0[4], b1[4];
      frag_v_halves<KV>(vrow, vvalid, b, c, b0, b1);
#pragma unroll
      for (int j = 0; j < 4; ++j) kern::mma_16816_f16_pure(O[4 * b + j], a, b0[j], b1[j]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the ring before the partials go over it

  static_assert((static_cast<size_t>(KW) * BM * (D + kOPad) + 2 * KW * BM) * 4 < frag_ring_bytes<KV>(D),
                "the partials fit in the ring's room");
  stage_and_write<D, KW, BM>(p, O, m_a, m_b, l_a, l_b, reinterpret_cast<float*>(raw), kw, ra, lane, w,
                             [](int i, int n) { return frag_o_col(i, n); });
}

// The transposed forms' online softmax of one tile: S2 holds this lane's scores S^T (two partial
// accumulators summed here) of the warp's positions j0 (c0, c1) and j0 + 8 (c2, c3) for rows 2t (c0, c2)
// and 2t + 1 (c1, c3), t = lane % 4. Masks the causal future (past lim0 / lim1), updates the running
// maxima and per-lane sums (the 8 lanes of a t share a row), rescales O^T (columns 2t, 2t + 1) and returns
// P^T as P V's B fragments: {P[2t][gid], P[2t + 1][gid]} (b0) and {P[2t + 8][gid], P[2t + 9][gid]} (b1),
// positions of the warp, gid = lane / 4: four shuffles from the lanes of positions 2t and 2t + 1.
template <int MT>
__device__ __forceinline__ void online_softmax_t(const float (&S2)[2][4], int j0, int lim0, int lim1, float scale_log2,
                                                 float& m0, float& m1, float& l0, float& l1, float (&O)[MT][4],
                                                 uint32_t& b0, uint32_t& b1) {
  const int lane = threadIdx.x % 32, t = lane & 3, gid = lane >> 2;
  const int j1 = j0 + 8;
  float s00 = j0 <= lim0 ? (S2[0][0] + S2[1][0]) * scale_log2 : -INFINITY;  // position j0, row 2t
  float s01 = j0 <= lim1 ? (S2[0][1] + S2[1][1]) * scale_log2 : -INFINITY;  // position j0, row 2t + 1
  float s10 = j1 <= lim0 ? (S2[0][2] + S2[1][2]) * scale_log2 : -INFINITY;
  float s11 = j1 <= lim1 ? (S2[0][3] + S2[1][3]) * scale_log2 : -INFINITY;
  float mx0 = fmaxf(s00, s10), mx1 = fmaxf(s01, s11);
#pragma unroll
  for (int o = 4; o <= 16; o <<= 1) {
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xFFFFFFFFu, mx0, o));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xFFFFFFFFu, mx1, o));
  }
  float corr0, corr1;
  const float mu0 = online_max_step(m0, mx0, corr0), mu1 = online_max_step(m1, mx1, corr1);
  s00 = exp2f(s00 - mu0);
  s10 = exp2f(s10 - mu0);
  s01 = exp2f(s01 - mu1);
  s11 = exp2f(s11 - mu1);
  l0 = l0 * corr0 + (s00 + s10);  // per-lane partial sums; the 8 lanes of a t are reduced at the end
  l1 = l1 * corr1 + (s01 + s11);
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    O[i][0] *= corr0;
    O[i][1] *= corr1;
    O[i][2] *= corr0;
    O[i][3] *= corr1;
  }
  const int src_a = 8 * t + gid / 2;      // the lanes of positions 2t and 2t + 1 ...
  const bool odd_row = (gid & 1) != 0;    // ... holding row gid as their odd or even column
  const uint32_t pe = pack_half2(s00, s10), po = pack_half2(s01, s11);  // rows 2t, 2t + 1: positions gid, gid + 8
  const uint32_t ea = __shfl_sync(0xFFFFFFFFu, pe, src_a), oa = __shfl_sync(0xFFFFFFFFu, po, src_a);
  const uint32_t eb = __shfl_sync(0xFFFFFFFFu, pe, src_a + 4), ob = __shfl_sync(0xFFFFFFFFu, po, src_a + 4);
  const uint32_t pa = odd_row ? oa : ea, pb = odd_row ? ob : eb;  // positions 2t, 2t + 8 / 2t + 1, 2t + 9
  b0 = __byte_perm(pa, pb, 0x5410);
  b1 = __byte_perm(pa, pb, 0x7632);
}

// The end of a transposed attention: the warps' partials O^T (m-tile i, rows gid and gid + 8 of it are
// head dims dim(i) and dim(i) + ddim; columns 2t, 2t + 1 the CTA's rows), their sums (reduced over the 8
// lanes of a t here) and maxima staged at sO ([kWarps][kRowsT][D + kOPad] floats, then m and l), merged
// and written by write_rows.
template <int D, typename Dim>
__device__ __forceinline__ void stage_and_write_t(const KParams& p, const float (&O)[D / 16][4], float m0, float m1,
                                                  float l0, float l1, float* sO, int kw, int lane, const CtaWork& w,
                                                  Dim dim, int ddim = 1) {
  constexpr int KW = kWarps, BM = kRowsT;
  const int t = lane & 3, gid = lane >> 2;
#pragma unroll
  for (int o = 4; o <= 16; o <<= 1) {
    l0 += __shfl_xor_sync(0xFFFFFFFFu, l0, o);
    l1 += __shfl_xor_sync(0xFFFFFFFFu, l1, o);
  }
  float* sM = sO + KW * BM * (D + kOPad);
  float* sL = sM + KW * BM;
  float* o0 = sO + (kw * BM + 2 * t) * (D + kOPad);
  float* o1 = o0 + (D + kOPad);
#pragma unroll
  for (int i = 0; i < D / 16; ++i) {
    const int d = dim(i);
    o0[d] = O[i][0];
    o1[d] = O[i][1];
    o0[d + ddim] = O[i][2];
    o1[d + ddim] = O[i][3];
  }
  if (gid == 0) {
    sM[kw * BM + 2 * t] = m0;
    sM[kw * BM + 2 * t + 1] = m1;
    sL[kw * BM + 2 * t] = l0;
    sL[kw * BM + 2 * t + 1] = l1;
  }
  __syncthreads();
  write_rows(p, sO, sM, sL, KW, BM, D + kOPad, w.row0, w.row_end, w.g, w.s);
}

// tc_attend_frag for at most kRowsT rows (one token's query heads of a KV head: 6 on the 27B, 8 on the
// 35B-A3B), transposed: S^T = K Q^T and O^T = V^T P^T, so the 16 positions of a warp and 16 head dims
// are the products' M side and the rows their N side of 8, where the untransposed form spends an M side
// of 16 rows on at most 8. Half the products and half the accumulators (O^T: D / 16 m-tiles of 4
// floats a lane), so more CTAs fit an SM. The fragments:
//  - Q K^T: A is a warp's 16 positions (rows gid, gid + 8) by a k16 step of head dims permuted as
//    frag_q_col (a lane's k indices 2t, 2t + 1, 2t + 8, 2t + 9 are head dims 4t .. 4t + 3: one word of
//    codes a position; Q4_0: one word of nibbles holds both k16 steps of a block); B is Q's rows as
//    staged (frag_q_col columns), by ldmatrix;
//  - the probabilities: lane (gid, t) holds P of positions gid, gid + 8 for rows 2t, 2t + 1, and P V's
//    B operand wants positions 2t, 2t + 1, 2t + 8, 2t + 9 for row gid: four shuffles from the lanes of
//    positions 2t and 2t + 1;
//  - P V: A is V^T, 16 head dims by the warp's 16 positions; m-tiles 2b and 2b + 1 are block b's 32
//    dims, lane gid taking the 4 dims of one word of codes (kv_lane_dim): rows gid and gid + 8 of m-tile
//    2b are its dims 0 and 1, of m-tile 2b + 1 its dims 2 and 3.
// The elements are those of tc_attend_frag; the sums' order differs.
template <typename KV>
__device__ __forceinline__ int kv_lane_dim(int gid) {  // the first of lane group gid's 4 dims of a block
  return std::is_same_v<KV, kern::KvQ8> ? 4 * gid : 16 * (gid >> 2) + 4 * (gid & 3);
}

template <int D, typename KV, bool kTile0Issued>
__device__ __forceinline__ void tc_attend_frag_t(const KParams& p, const __half* sQ, uint8_t* raw, const CtaWork& w) {
  using Q = BlockTile<D, KV>;
  constexpr bool kQ8 = std::is_same_v<KV, kern::KvQ8>;
  constexpr int KW = kWarps, BM = kRowsT, PW = kBN / KW, MT = D / 16, SK = D + 8;
  constexpr int BB = kern::kv_block_bytes<KV>();
  static_assert(PW == 16 && Q::RS % 4 == 0, "a warp's 16 positions are one m-tile of Q K^T, one k16 step of P V");
  const int pos0 = w.pos0, row0 = w.row0, kv_begin = w.kv_begin, kv_end = w.kv_end;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, kw = warp, t = lane & 3, gid = lane >> 2;
  const int lim0 = pos0 + min(row0 + 2 * t, p.R - 1) / p.G;  // this lane's score columns: rows 2t, 2t + 1
  const int lim1 = pos0 + min(row0 + 2 * t + 1, p.R - 1) / p.G;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  float O[MT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i) O[i][0] = O[i][1] = O[i][2] = O[i][3] = 0.0f;
  const uint32_t q_addr = smem_addr(sQ + (lane & 7) * SK + (lane >> 3) * 8);

  const int n_tiles = (kv_end - kv_begin + kBN - 1) / kBN;
  frag_ring_begin<D, KV, kTile0Issued>(p, raw, w, n_tiles);
  for (int tile = 0; tile < n_tiles; ++tile) {
    const uint8_t* kst = frag_ring_next<D, KV>(p, raw, w, tile, n_tiles);
    const int n_rows = min(kBN, kv_end - kv_begin - tile * kBN);  // rows past it: stale bytes, zeroed here

    // S^T = K Q^T: this lane's positions kw * 16 + gid (c0, c1) and + 8 (c2, c3); even and odd blocks
    // in two accumulators, so the products' chain is half as long.
    const uint8_t* krow0 = kst + (kw * PW + gid) * Q::RS;
    const uint8_t* krow1 = krow0 + 8 * Q::RS;
    const bool kvalid0 = kw * PW + gid < n_rows, kvalid1 = kw * PW + gid + 8 < n_rows;
    float S2[2][4];
#pragma unroll
    for (int i = 0; i < 2; ++i) S2[i][0] = S2[i][1] = S2[i][2] = S2[i][3] = 0.0f;
#pragma unroll
    for (int b = 0; b < D / 32; ++b) {
      const __half d0 = *reinterpret_cast<const __half*>(krow0 + b * BB);
      const __half d1 = *reinterpret_cast<const __half*>(krow1 + b * BB);
      const __half2 d20 = __half2half2(kvalid0 ? d0 : __ushort_as_half(0));
      const __half2 d21 = __half2half2(kvalid1 ? d1 : __ushort_as_half(0));
      uint32_t qb[4];  // B of k16 steps 2b (qb[0], qb[1]) and 2b + 1 (qb[2], qb[3])
      ldsm_x4(qb, q_addr + b * 64);
      uint32_t kword0 = 0, kword1 = 0;  // Q4_0: one word of nibbles a position, both k16 steps
      if constexpr (!kQ8) {
        kword0 = block_code_word<KV>(krow0, b, 4 * t);
        kword1 = block_code_word<KV>(krow1, b, 4 * t);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t a[4];
        if constexpr (kQ8) {
          q8_codes_to_half(block_code_word<KV>(krow0, b, 16 * h + 4 * t), d20, a[0], a[2]);
          q8_codes_to_half(block_code_word<KV>(krow1, b, 16 * h + 4 * t), d21, a[1], a[3]);
        } else {
          q4_codes_to_half((kword0 >> (4 * h)) & 0x0F0F0F0Fu, d20, a[0], a[2]);
          q4_codes_to_half((kword1 >> (4 * h)) & 0x0F0F0F0Fu, d21, a[1], a[3]);
        }
        kern::mma_16816_f16_pure(S2[b & 1], a, qb[2 * h], qb[2 * h + 1]);
      }
    }

    uint32_t b0, b1;
    online_softmax_t(S2, kv_begin + tile * kBN + kw * PW + gid, lim0, lim1, p.scale_log2, m0, m1, l0, l1, O, b0, b1);

    // O^T += V^T P^T: this lane's k positions kw * 16 + 2t + {0, 1} and + {8, 9}.
    const uint8_t* vrow[4];
    bool vvalid[4];
    frag_v_rows<D, KV>(kst, kw, t, n_rows, vrow, vvalid);
#pragma unroll
    for (int b = 0; b < D / 32; ++b) {
      uint32_t x[4], y[4];  // dim j of the lane's word: positions 2t, 2t + 1 (x) and 2t + 8, 2t + 9 (y)
      frag_v_halves<KV>(vrow, vvalid, b, gid, x, y);
      const uint32_t a_lo[4] = {x[0], x[1], y[0], y[1]}, a_hi[4] = {x[2], x[3], y[2], y[3]};
      kern::mma_16816_f16_pure(O[2 * b], a_lo, b0, b1);
      kern::mma_16816_f16_pure(O[2 * b + 1], a_hi, b0, b1);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the ring before the partials go over it

  // The warps' partials over the ring: O^T[m-tile 2b + j][row gid (+ 8)] of column 2t (+ 1) is row 2t (+ 1)
  // of head dim 32 b + kv_lane_dim(gid) + 2 j (+ 1).
  static_assert((static_cast<size_t>(KW) * BM * (D + kOPad) + 2 * KW * BM) * 4 < frag_ring_bytes<KV>(D),
                "the partials fit in the ring's room");
  const int dd = kv_lane_dim<KV>(gid);
  stage_and_write_t<D>(p, O, m0, m1, l0, l1, reinterpret_cast<float*>(raw), kw, lane, w,
                       [dd](int i) { return 32 * (i >> 1) + dd + 2 * (i & 1); });
}

// tc_attend for at most kRowsT rows over an F16 cache, transposed as tc_attend_frag_t: S^T = K Q^T and
// O^T = V^T P^T, the warp's 16 positions and 16 head dims on the M side, the rows on N (8). The F16 tiles
// and their double-buffered copies are tc_attend's; the fragments come by ldmatrix:
//  - Q K^T: A is the warp's 16 K rows by a k16 step (ldmatrix, as tc_attend's Q), B is Q's rows as
//    staged (plain columns);
//  - P V: A is V^T, 16 head dims by the warp's 16 positions (ldmatrix.trans of the V rows, as tc_attend's
//    V), B is P^T from online_softmax_t.
// O^T's m-tile i holds head dims 16 i + gid (c0, c1) and 16 i + gid + 8 (c2, c3).
template <int D, bool kTile0Issued>
__device__ __forceinline__ void tc_attend_t(const KParams& p, const __half* sQ, __half* sK, __half* sV,
                                            const CtaWork& w) {
  constexpr int KW = kWarps, BM = kRowsT, PW = kBN / KW, MT = D / 16, SK = D + 8;
  static_assert(PW == 16 && D % 32 == 0, "a warp's 16 positions are one m-tile of Q K^T, one k16 step of P V");
  static_assert((static_cast<size_t>(KW) * BM * (D + kOPad) + 2 * KW * BM) * 4 <= static_cast<size_t>(4) * kBN * SK * 2,
                "the partials fit in the K / V stages");
  const int pos0 = w.pos0, row0 = w.row0, kv_begin = w.kv_begin, kv_end = w.kv_end;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, kw = warp, t = lane & 3, gid = lane >> 2;
  const int lim0 = pos0 + min(row0 + 2 * t, p.R - 1) / p.G;  // this lane's score columns: rows 2t, 2t + 1
  const int lim1 = pos0 + min(row0 + 2 * t + 1, p.R - 1) / p.G;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  float O[MT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i) O[i][0] = O[i][1] = O[i][2] = O[i][3] = 0.0f;
  const uint32_t q_addr = smem_addr(sQ + (lane & 7) * SK + (lane >> 3) * 8);
  const int k_row = kw * PW + (lane & 15), k_col = (lane >> 4) * 8;
  const int v_row = kw * PW + (lane & 7) + ((lane >> 4) << 3), v_col = ((lane >> 3) & 1) * 8;

  const int n_tiles = (kv_end - kv_begin + kBN - 1) / kBN;
  f16_ring_begin<D, kTile0Issued>(p, sK, sV, w);
  for (int tile = 0; tile < n_tiles; ++tile) {
    const int stage = f16_ring_next<D>(p, sK, sV, w, tile, n_tiles);
    __syncthreads();

    // S^T = K Q^T: this lane's positions kw * 16 + gid (c0, c1) and + 8 (c2, c3); the two k16 steps of
    // each 32 head dims in two accumulators, so the products' chain is half as long.
    const uint32_t k_addr = smem_addr(sK + stage * kBN * SK + k_row * SK + k_col);
    const uint32_t v_addr = smem_addr(sV + stage * kBN * SK + v_row * SK + v_col);
    float S2[2][4];
#pragma unroll
    for (int i = 0; i < 2; ++i) S2[i][0] = S2[i][1] = S2[i][2] = S2[i][3] = 0.0f;
#pragma unroll
    for (int b = 0; b < D / 32; ++b) {
      uint32_t qb[4];  // B of k16 steps 2b (qb[0], qb[1]) and 2b + 1 (qb[2], qb[3])
      ldsm_x4(qb, q_addr + b * 64);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t a[4];
        ldsm_x4(a, k_addr + (32 * b + 16 * h) * 2);
        kern::mma_16816_f16_pure(S2[h], a, qb[2 * h], qb[2 * h + 1]);
      }
    }
    uint32_t b0, b1;
    online_softmax_t(S2, kv_begin + tile * kBN + kw * PW + gid, lim0, lim1, p.scale_log2, m0, m1, l0, l1, O, b0, b1);

    // O^T += V^T P^T: m-tile i is head dims 16 i .. 16 i + 15 of the warp's 16 positions.
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      uint32_t a[4];
      ldsm_x4_trans(a, v_addr + 16 * i * 2);
      kern::mma_16816_f16_pure(O[i], a, b0, b1);
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
  }
  cp_async_wait<0>();

  stage_and_write_t<D>(p, O, m0, m1, l0, l1, reinterpret_cast<float*>(sK), kw, lane, w,
                       [gid](int i) { return 16 * i + gid; }, 8);
}

// RW = 0: at most kRowsT rows a CTA, transposed (tc_attend_frag_t on Q8_0 / Q4_0 fragments, tc_attend_t on
// F16 tiles).
template <int D, int RW, typename KV>
__global__ void __launch_bounds__(kThreads, RW == 0 && kern::kKvBlocks<KV> ? kMinCtasT : 1)
    attn_tc_kernel(const KParams p) {
  kern::dependency_sync();
  constexpr bool kT = RW == 0;
  constexpr bool kFrag = (RW <= 1 && kern::kKvBlocks<KV>);  // Q8_0 / Q4_0 decode: on fragments
  constexpr int BM = kT ? kRowsT : 16 * RW, SK = D + 8;
  constexpr int kStages = kFrag ? 0 : kern::kKvBlocks<KV> ? 1 : 2;  // half tiles (see tc_smem_bytes)
  extern __shared__ float4 smem_f4[];
  __half* sQ = reinterpret_cast<__half*>(smem_f4);
  __half* sK = sQ + BM * SK;              // [kStages][kBN][SK]
  __half* sV = sK + kStages * kBN * SK;   // [kStages][kBN][SK]
  auto* raw = reinterpret_cast<uint8_t*>(sV + kStages * kBN * SK);  // blocks: the ring of BlockTile<D, KV>

  const CtaWork w = cta_work(p, BM);
  if (!w.live) return;

  // Q rows as half (zeros past the last row).
  for (int i = threadIdx.x; i < BM * D; i += kThreads) {
    const int r = i / D, d = i - r * D;
    const int rho = w.row0 + r;
    float v = 0.0f;
    if (rho < p.R) v = p.q[out_row(p, rho, w.g) * D + d];
    sQ[r * SK + (kFrag ? frag_q_col(d) : d)] = __float2half_rn(v);
  }
  if constexpr (kT && kFrag) {
    tc_attend_frag_t<D, KV, false>(p, sQ, raw, w);  // its first barrier also covers sQ
  } else if constexpr (kT) {
    tc_attend_t<D, false>(p, sQ, sK, sV, w);  // its first barrier also covers sQ
  } else if constexpr (kFrag) {
    tc_attend_frag<D, KV, false>(p, sQ, raw, w);  // its first barrier also covers sQ
  } else {
    tc_attend<D, RW, KV>(p, sQ, sK, sV, raw, w);
  }
}

// ---- split combine ----
// One output row merges the partials of the splits [0, last] that hold positions it sees: weights
// w_s = 2^(m_s - M) (M the largest m_s of a split with l_s > 0; 0 where l_s is not positive), then
// o[d] = (sum_s w_s part_o[s][d]) / (sum_s w_s l_s), each sum in split order. With the weights computed
// first, a thread's loads of its dims in successive splits do not wait on each other. Partials are read
// once, through L2 (__ldcg).

// One full warp: fills w[0..last] with row's weights (lw[0..last]: scratch) and returns the weights'
// sum over l, the same bits in every lane (a butterfly adds the same pairs in every lane).
__device__ float combine_weights(const KParams& p, int64_t row, int last, float* w, float* lw, int lane) {
  float M = -INFINITY;
  for (int s = lane; s <= last; s += 32) {
    const int64_t prow = static_cast<int64_t>(s) * p.RT + row;
    const float ms = __ldcg(p.part_ml + 2 * prow), ls = __ldcg(p.part_ml + 2 * prow + 1);
    w[s] = ms;
    lw[s] = ls;
    if (ls > 0.0f) M = fmaxf(M, ms);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xFFFFFFFFu, M, o));
  float L = 0.0f;
  for (int s = lane; s <= last; s += 32) {
    const float ws = lw[s] > 0.0f ? exp2f(w[s] - M) : 0.0f;
    w[s] = ws;
    L = fmaf(lw[s], ws, L);
  }
  __syncwarp();
  return kern::warp_sum(L);
}

// One CTA per output row: a warp computes the row's weights, then every thread sums dims.
template <bool kGatedQ8>
__global__ void __launch_bounds__(32 * kCombineWarps) attn_combine_kernel(const KParams p) {
  kern::dependency_sync();
  __shared__ float s_w[kMaxSplit], s_lw[kMaxSplit];
  __shared__ float s_L;
  const int64_t row = blockIdx.x;
  const int D = p.D;
  const int pos0 = read_pos(p);
  if (pos0 < 0) {
    for (int d = threadIdx.x; d < D; d += blockDim.x) store_o<kGatedQ8>(p, row, d, NAN, kGatedQ8 ? gate_at(p, row, d) : 0.0f);
    return;
  }
  const int t = static_cast<int>(row / p.H);
  const int L = split_len(pos0 + p.n_tokens, p.n_split);
  const int last = min(p.n_split - 1, (pos0 + t) / L);  // splits holding positions this row sees
  if (threadIdx.x < 32) {
    const float Ls = combine_weights(p, row, last, s_w, s_lw, static_cast<int>(threadIdx.x));
    if (threadIdx.x == 0) s_L = Ls;
  }
  __syncthreads();
  const int64_t stride = p.RT * D;  // between splits
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    const float gv = kGatedQ8 ? gate_at(p, row, d) : 0.0f;
    const float* po = p.part_o + row * D + d;
    float acc = 0.0f;
#pragma unroll 16
    for (int s = 0; s <= last; ++s) {  // a weight of 0 adds nothing, whatever the partial holds
      const float x = __ldcg(po + s * stride), ws = s_w[s];
      acc = ws > 0.0f ? fmaf(x, ws, acc) : acc;
    }
    store_o<kGatedQ8>(p, row, d, acc / s_L, gv);
  }
}

// ---- fused decode: prep, attention and output gate in one launch ----
// attn_decode_kernel<D>: the tensor-core path (RW = 1) with attention_prep's work done by its CTAs, in
// one of two decompositions (attention_decode_plan):
//  - row blocks: one block of at most 16 packed rows per KV head, the positions in splits; the new
//    positions inside a CTA's range get k normalized and rotated (into k_out and, as half, into the
//    cache) and v appended, each new position by exactly one CTA (the splits partition the positions);
//  - rows (one token, launch bounds up to kAttnDecodeRowMaxKv): one CTA per query row and one split,
//    so a short context's prep, attention and output rows are spread over n_head CTAs instead of
//    n_head_kv; the CTA of the KV head's first row appends the new k and v and writes k_out, and the
//    others append them too (the same bytes) only where they read them back from a later tile.
// Each CTA normalizes and rotates its query rows straight into shared memory, then attends over its
// range: with one split the final rows, gated, with their q8 codes; with several, partials that
// attn_combine_kernel merges and gates. Before the dependency wait, beside the previous kernel, it
// computes the new positions' rotation angles (double-precision sin and cos) and issues the copies of
// its first tile's old positions; the new rows of that tile go from the prep into shared memory as well
// as into the cache, so only new rows of later tiles are read back (after a fence).
// Not taken: the last CTA of a KV head merging the splits itself (a ticket counter) instead of the
// combine kernel: 21 us slower a launch on the H100 at one split holding positions (37 against 16),
// for reasons not found (unconditional loads and one fence per CTA changed nothing; a compact merge
// through short loops, a quarter of the code, was still 7-10 us slower).


// The prep of a CTA with work w (rows [w.row0, w.row_end) of its KV head); ends with a CTA barrier.
// y: kWarps * D floats of shared memory (a warp's staging row); cs: the rotation angles of the new
// positions, n_rot / 2 per token; sK / sV: the first tile's stage, whose copies (issued before the
// dependency wait) leave the new positions' rows to this function.
// KV = kern::KvQ8 / kern::KvQ4: the new rows of the first tile go into its raw stage as blocks (sK / sV
// unused here).
template <int D, typename KV>
__device__ void decode_prep(const KParams& p, __half* sQ, __half* sK, __half* sV, uint8_t* raw, float* y_all,
                            const double2* cs, const CtaWork& w) {
  constexpr int SK = D + 8;
  const int g = w.g, pos0 = w.pos0, kv_begin = w.kv_begin, kv_end = w.kv_end, half = p.n_rot / 2;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* y = y_all + warp * D;
  const int n_kv = pos0 + p.n_tokens;
  const bool k_out = w.row0 == 0;  // row plans: the CTA of the head's first row
  const bool q_out = kv_begin <= n_kv - 1 && n_kv - 1 < kv_end;  // one CTA per row writes q_out
  // The work items, one a warp in turn: the new k row and the new v row of each position in the range,
  // then the query rows (one token's k, v and first query row on three warps).
  const int j0 = max(kv_begin, pos0), n_kv_items = 2 * max(0, kv_end - j0);
  const int n_items = n_kv_items + (w.row_end - w.row0);
  bool fence = false;
  for (int item = warp; item < n_items; item += kWarps) {
    if (item >= n_kv_items) {  // a query row
      const int rho = w.row0 + item - n_kv_items;
      const int t = rho / p.G, h = g * p.G + (rho - t * p.G);
      kern::prep_head_row(p.q_in + t * p.q_ts + h * p.q_hs, p.q_norm, D, p.eps, static_cast<int64_t>(pos0) + t,
                          p.n_rot, p.log2_base, y, lane, cs + t * half);
      for (int d = lane; d < D; d += 32) {
        sQ[(rho - w.row0) * SK + (kern::kKvBlocks<KV> ? frag_q_col(d) : d)] = __float2half_rn(y[d]);
        if (q_out) p.q_out[(static_cast<int64_t>(t) * p.H + h) * D + d] = y[d];
      }
      __syncwarp();  // y is rewritten by the next row
      continue;
    }
    const int j = j0 + item / 2;
    const bool is_v = item & 1;
    const int64_t in = (static_cast<int64_t>(j - pos0) * p.Hkv + g) * D;
    const int c = j / p.C, r = j - c * p.C;
    const bool first_tile = j < kv_begin + kBN;  // its row goes straight into the first tile's stage
    // Into the cache: by the k_out CTA, and by any CTA that reads the row back from a later tile (row
    // plans: the same bytes).
    const bool append = k_out || !first_tile;
    const float* src = p.v_in + in;  // v as it is; k normalized and rotated into y
    if (!is_v) {
      kern::prep_head_row(p.k_in + in, p.k_norm, D, p.eps, j, p.n_rot, p.log2_base, y, lane, cs + (j - pos0) * half);
      if (k_out) {
        for (int i = lane; i < D; i += 32) p.k_out[in + i] = y[i];
      }
      src = y;
    }
    if constexpr (kern::kKvBlocks<KV>) {
      // Quantized once, into the cache and / or the first tile's stage.
      using Q = BlockTile<D, KV>;
      const int64_t off = (static_cast<int64_t>(r) * p.Hkv + g) * Q::RB;
      uint8_t* cache = const_cast<uint8_t*>(is_v ? p.v_base[c] : p.k_base[c]) + (is_v ? p.v_off : p.k_off) + off;
      uint8_t* stage = raw + ((is_v ? kBN : 0) + j - kv_begin) * Q::RS;
      kern::store_kv_row_blocks<KV>(append ? cache : nullptr, first_tile ? stage : nullptr, src, D, lane);
    } else {
      const int64_t off = (static_cast<int64_t>(r) * p.Hkv + g) * D;
      __half* cache = reinterpret_cast<__half*>(const_cast<uint8_t*>(is_v ? p.v_base[c] : p.k_base[c]) +
                                                (is_v ? p.v_off : p.k_off)) + off;
      __half* stage = (is_v ? sV : sK) + (j - kv_begin) * SK;
      for (int i = lane; i < D; i += 32) {
        const float x = src[i];
        if (append) kern::store_kv(cache + i, x);
        if (first_tile) stage[i] = __float2half_rn(x);
      }
    }
    __syncwarp();  // y is rewritten by the next row
    fence = fence || !first_tile;
  }
  if (fence) __threadfence();  // the new rows of later tiles are in L2 before their copies (cp.async.cg) read them
  for (int i = (w.row_end - w.row0) * D + static_cast<int>(threadIdx.x); i < kFuseRows * D; i += kThreads) {
    sQ[(i / D) * SK + i % D] = __float2half_rn(0.0f);
  }
  __syncthreads();
}

// kT: at most kRowsT rows a CTA, transposed (tc_attend_frag_t on Q8_0 / Q4_0, tc_attend_t on F16).
template <int D, typename KV, bool kT = false>
__global__ void __launch_bounds__(kThreads, kT && kern::kKvBlocks<KV> ? kMinCtasT : 1) attn_decode_kernel(const KParams p) {
  constexpr int SK = D + 8;
  constexpr bool kFrag = kern::kKvBlocks<KV>;  // Q8_0 and Q4_0 run on fragments
  constexpr int kStages = kFrag ? 0 : 2;         // F16 tiles (see tc_smem_bytes)
  extern __shared__ float4 smem_f4[];
  __half* sQ = reinterpret_cast<__half*>(smem_f4);
  __half* sK = sQ + kFuseRows * SK;     // [kStages][kBN][SK]
  __half* sV = sK + kStages * kBN * SK;  // [kStages][kBN][SK]
  auto* raw = reinterpret_cast<uint8_t*>(sV + kStages * kBN * SK);  // blocks: the ring of BlockTile<D, KV>
  // Before the dependency wait (the position is written by a copy ahead of the step's kernels, the KV
  // rows before it by earlier steps): the new positions' rotation angles and the copies of the first
  // tile's old positions. Until the prep is done the angles live in the second V stage (F16) or from the
  // ring's second stage on (blocks: the attention fills it after the prep), the prep's staging rows in
  // the second K stage or after the angles' stages (prep_y_at; frag_ring_bytes leaves room).
  static_assert(kFrag || (kFuseRows * D / 2 * sizeof(double2) <= kBN * SK * 2 &&
                          kWarps * D * sizeof(float) <= kBN * SK * 2),
                "the prep's staging fits an F16 stage");
  double2* cs = reinterpret_cast<double2*>(kFrag ? raw + block_stage_bytes<KV>(D)
                                                 : reinterpret_cast<uint8_t*>(sV + kBN * SK));
  float* y_all = reinterpret_cast<float*>(kFrag ? raw + prep_y_at<KV>(D) : reinterpret_cast<uint8_t*>(sK + kBN * SK));
  const CtaWork w = cta_range(p, gridDim.y > 1 ? 1 : kFuseRows);  // rows: one per CTA; row blocks: [0, R)
  if (w.live) {
    const int half = p.n_rot / 2;
    for (int i = static_cast<int>(threadIdx.x); i < p.n_tokens * half; i += kThreads) {
      const int t = i / half;
      cs[i] = kern::rope_neox_cos_sin(static_cast<int64_t>(w.pos0) + t, i - t * half, p.n_rot, p.log2_base);
    }
    if constexpr (kFrag) {
      tc_load_tile_blocks<D, KV>(p, raw, w.kv_begin, w.g, min(w.kv_end, w.pos0));
    } else {
      tc_load_tile<D>(p, sK, sV, w.kv_begin, w.kv_end, w.g, min(w.kv_end, w.pos0));
    }
  }
  cp_async_commit();
  __syncthreads();
  kern::dependency_sync();
  if (!w.live) {
    write_empty(p, w.row0, w.row_end, w.g, w.s);
    return;
  }
  decode_prep<D, KV>(p, sQ, sK, sV, raw, y_all, cs, w);
  kern::timeline_mark(0);  // q / k normalized and rotated, k / v appended
  if constexpr (kT && kFrag) {
    tc_attend_frag_t<D, KV, true>(p, sQ, raw, w);
  } else if constexpr (kT) {
    tc_attend_t<D, true>(p, sQ, sK, sV, w);
  } else if constexpr (kFrag) {
    tc_attend_frag<D, KV, true>(p, sQ, raw, w);
  } else {
    tc_attend<D, 1, KV, true>(p, sQ, sK, sV, raw, w);
  }
  kern::timeline_mark(1);  // attended, gated, stored
}

// ---- SIMT path (F32 or F16 KV, any head_dim <= 512; Q8_0 and Q4_0, head_dim a multiple of 32) ----

// Element d of a KV row (a head's row of the cache) as a float.
template <typename T>
__device__ __forceinline__ float kv_element(const uint8_t* row, int d) {
  if constexpr (std::is_same_v<T, kern::KvQ8>) {
    const uint8_t* blk = row + d / kern::kKvBlock * kern::kKvQ8BlockBytes;
    return static_cast<float>(static_cast<int8_t>(blk[2 + d % kern::kKvBlock])) *
           __half2float(*reinterpret_cast<const __half*>(blk));
  } else if constexpr (std::is_same_v<T, kern::KvQ4>) {
    const uint8_t* blk = row + d / kern::kKvBlock * kern::kKvQ4BlockBytes;
    const int i = d % kern::kKvBlock, b = blk[2 + i % 16];
    return static_cast<float>((i < 16 ? b & 0xF : b >> 4) - 8) * __half2float(*reinterpret_cast<const __half*>(blk));
  } else {
    return to_float(reinterpret_cast<const T*>(row)[d]);
  }
}

constexpr int simt_lanes(int D) { return D <= 32 ? 1 : D <= 64 ? 2 : D <= 128 ? 4 : D <= 256 ? 8 : 16; }
constexpr int simt_rows(int E) { return E >= 16 ? 4 : 8; }
constexpr size_t simt_smem_bytes(int D, int RB) {
  return (static_cast<size_t>(kWarps) * RB * (D + kOPad) + 2 * kWarps * RB) * 4;
}

template <typename T, int E, int RB>
__global__ void __launch_bounds__(kThreads) attn_simt_kernel(const KParams p) {
  kern::dependency_sync();
  extern __shared__ float4 smem_f4[];
  const CtaWork w = cta_work(p, RB);
  if (!w.live) return;
  const int g = w.g, s = w.s, pos0 = w.pos0, row0 = w.row0, row_end = w.row_end, kv_begin = w.kv_begin,
            kv_end = w.kv_end;
  const int D = p.D;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float q[RB][E], acc[RB][E], m[RB], l[RB];
  int lim[RB];
#pragma unroll
  for (int r = 0; r < RB; ++r) {
    const int rho = row0 + r;
    const bool valid = rho < p.R;
    lim[r] = valid ? pos0 + rho / p.G : -1;
    const float* qr = p.q + (valid ? out_row(p, rho, g) * D : 0);
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int d = lane + 32 * e;
      q[r][e] = valid && d < D ? qr[d] * p.scale_log2 : 0.0f;
      acc[r][e] = 0.0f;
    }
    m[r] = -INFINITY;
    l[r] = 0.0f;
  }
  for (int j = kv_begin + warp; j < kv_end; j += kWarps) {
    const int c = j / p.C, rr = j - c * p.C;
    const int64_t off = (static_cast<int64_t>(rr) * p.Hkv + g) * kern::kv_row_bytes<T>(D);
    const uint8_t* kr = p.k_base[c] + p.k_off + off;
    const uint8_t* vr = p.v_base[c] + p.v_off + off;
    float kf[E], vf[E];
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int d = lane + 32 * e;
      kf[e] = d < D ? kv_element<T>(kr, d) : 0.0f;
      vf[e] = d < D ? kv_element<T>(vr, d) : 0.0f;
    }
#pragma unroll
    for (int r = 0; r < RB; ++r) {
      if (j > lim[r]) continue;  // uniform across the warp
      float sc = 0.0f;
#pragma unroll
      for (int e = 0; e < E; ++e) sc = fmaf(q[r][e], kf[e], sc);
      sc = kern::warp_sum(sc);
      const float mn = fmaxf(m[r], sc);
      const float corr = exp2f(m[r] - mn), pj = exp2f(sc - mn);
      l[r] = l[r] * corr + pj;
#pragma unroll
      for (int e = 0; e < E; ++e) acc[r][e] = fmaf(pj, vf[e], acc[r][e] * corr);
      m[r] = mn;
    }
  }
  float* sO = reinterpret_cast<float*>(smem_f4);
  float* sM = sO + kWarps * RB * (D + kOPad);
  float* sL = sM + kWarps * RB;
#pragma unroll
  for (int r = 0; r < RB; ++r) {
    float* orow = sO + (warp * RB + r) * (D + kOPad);
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const int d = lane + 32 * e;
      if (d < D) orow[d] = acc[r][e];
    }
    if (lane == 0) {
      sM[warp * RB + r] = m[r];
      sL[warp * RB + r] = l[r];
    }
  }
  __syncthreads();
  write_rows(p, sO, sM, sL, kWarps, RB, D + kOPad, row0, row_end, g, s);
}

// ---- host side: kernel choice, one-time configuration, launch ----

struct KernelPick {
  const void* fn = nullptr;
  size_t smem = 0;
};

// rows: the rows a CTA takes (8: the transposed form; 16, 32 or 64).
template <int D, typename KV>
KernelPick pick_tc(int rows) {
  if (rows == kRowsT) return {reinterpret_cast<const void*>(attn_tc_kernel<D, 0, KV>), tc_smem_bytes<KV>(D, 0)};
  switch (rows / 16) {
    case 1: return {reinterpret_cast<const void*>(attn_tc_kernel<D, 1, KV>), tc_smem_bytes<KV>(D, 1)};
    case 2: return {reinterpret_cast<const void*>(attn_tc_kernel<D, 2, KV>), tc_smem_bytes<KV>(D, 2)};
    default: return {reinterpret_cast<const void*>(attn_tc_kernel<D, 4, KV>), tc_smem_bytes<KV>(D, 4)};
  }
}

// One kernel serves every head_dim of its lane bucket (D <= 32 * E), and configure() sets its shared
// memory limit once per kernel: size the staging for the bucket's largest D, not for this call's D.
template <typename T>
KernelPick pick_simt(int D) {
  switch (simt_lanes(D)) {
#define X(E)                                                                                  \
  case E:                                                                                     \
    return {reinterpret_cast<const void*>(attn_simt_kernel<T, E, simt_rows(E)>), simt_smem_bytes(32 * E, simt_rows(E))};
    X(1) X(2) X(4) X(8) X(16)
#undef X
    default: return {};
  }
}

// The tensor-core kernels of a block-quantized cache: head_dim 64, 128 or 256.
template <typename KV>
KernelPick pick_tc_blocks(int D, int rows) {
  switch (D) {
    case 64: return pick_tc<64, KV>(rows);
    case 128: return pick_tc<128, KV>(rows);
    case 256: return pick_tc<256, KV>(rows);
    default: return {};
  }
}

KernelPick pick_kernel(AttnPath path, DType dtype, int D, int rows_per_cta) {
  if (path == AttnPath::kTensorCore) {
    if (dtype == DType::Q8_0) return pick_tc_blocks<kern::KvQ8>(D, rows_per_cta);
    if (dtype == DType::Q4_0) return pick_tc_blocks<kern::KvQ4>(D, rows_per_cta);
    switch (D) {
      case 32: return pick_tc<32, __half>(rows_per_cta);
      case 64: return pick_tc<64, __half>(rows_per_cta);
      case 128: return pick_tc<128, __half>(rows_per_cta);
      case 256: return pick_tc<256, __half>(rows_per_cta);
      default: return {};
    }
  }
  if (dtype == DType::Q8_0) return D % kern::kKvBlock == 0 ? pick_simt<kern::KvQ8>(D) : KernelPick{};
  if (dtype == DType::Q4_0) return D % kern::kKvBlock == 0 ? pick_simt<kern::KvQ4>(D) : KernelPick{};
  return dtype == DType::F16 ? pick_simt<__half>(D) : pick_simt<float>(D);
}

// Sets the dynamic shared memory limit of fn once per device and returns how many CTAs of it fit on
// the whole device.
cudaError_t configure(const KernelPick& k, int device, int* device_slots, int* per_sm_out = nullptr) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, std::pair<int, int>> slots;  // guarded by mu
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(k.fn, device);
  const auto it = slots.find(key);
  if (it != slots.end()) {
    *device_slots = it->second.first;
    if (per_sm_out != nullptr) *per_sm_out = it->second.second;
    return cudaSuccess;
  }
  cudaError_t e = cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(k.smem));
  if (e != cudaSuccess) return e;
  int sms = 0, per_sm = 0;
  e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return e;
  e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k.fn, kThreads, k.smem);
  if (e != cudaSuccess) return e;
  if (per_sm < 1) return cudaErrorInvalidConfiguration;
  slots[key] = {sms * per_sm, per_sm};
  *device_slots = sms * per_sm;
  if (per_sm_out != nullptr) *per_sm_out = per_sm;
  return cudaSuccess;
}

bool tc_allowed(const AttnPagedArgs& a) {
  const int D = a.kv.head_dim;
  const bool shape = a.kv.dtype == DType::F16   ? D == 32 || D == 64 || D == 128 || D == 256
                     : kern::kv_dtype_blocks(a.kv.dtype) ? D == 64 || D == 128 || D == 256
                                                         : false;
  return shape && a.kv.k_offset % 16 == 0 && a.kv.v_offset % 16 == 0;
}

KParams make_params(const AttnPagedArgs& a, const AttnPlan& plan) {
  KParams p{};
  const int G = a.n_head / a.kv.n_head_kv;
  const int64_t RT = static_cast<int64_t>(a.n_tokens) * a.n_head;
  p.q = a.q;
  p.o = a.o;
  p.part_ml = plan.n_split > 1 ? a.scratch : nullptr;
  p.part_o = plan.n_split > 1 ? a.scratch + 2 * plan.n_split * RT : nullptr;
  p.k_base = a.kv.k_base;
  p.v_base = a.kv.v_base;
  p.k_off = a.kv.k_offset;
  p.v_off = a.kv.v_offset;
  p.d_pos = a.d_pos;
  p.pos0_host = a.pos0_host;
  p.C = a.kv.chunk_tokens;
  p.Hkv = a.kv.n_head_kv;
  p.D = a.kv.head_dim;
  p.H = a.n_head;
  p.G = G;
  p.n_tokens = a.n_tokens;
  p.R = a.n_tokens * G;
  p.RT = RT;
  p.n_split = plan.n_split;
  p.scale_log2 = a.scale * 1.4426950408889634f;
  p.gate = a.gate;
  p.gate_hs = a.gate_hs;
  p.gate_ts = a.gate_ts;
  if (a.q8 != nullptr) {
    const int64_t K = static_cast<int64_t>(a.n_head) * a.kv.head_dim;
    p.q8 = static_cast<int8_t*>(a.q8);
    p.q8_ds = reinterpret_cast<float2*>(static_cast<uint8_t*>(a.q8) + kern::q8_ds_offset(K, a.n_tokens));
  }
  return p;
}

// A Q8_0 or Q4_0 plan fills one CTA an SM where its splits would hold fewer than kFragMinSplitTiles tiles
// of the bound each at full occupancy: the second CTA an SM of the fragment kernels (about 110 KB of
// shared memory at head_dim 256 with Q8_0, 75 KB with Q4_0) pays at 32K positions, and below that the
// splits' fixed work (prep, partials, the combine's reads) costs more than it gives (measured with Q8_0).
constexpr int kFragMinSplitTiles = 4;

// The split count and scratch of a plan whose kernel fits `slots` CTAs on the device, per_sm an SM.
void fill_plan(const AttnPagedArgs& a, AttnPath path, int rows, int64_t n_row_blocks, int slots, int per_sm,
               AttnPlan* plan) {
  const int64_t base = n_row_blocks * a.kv.n_head_kv;
  const int64_t tiles = (std::max<int64_t>(a.max_kv, 1) + kBN - 1) / kBN;
  if (kern::kv_dtype_blocks(a.kv.dtype) && per_sm > 1 && tiles * base < static_cast<int64_t>(kFragMinSplitTiles) * slots) {
    slots /= per_sm;
  }
  // Fill the device once: the split count is fixed here, each CTA's share of the real KV is computed
  // on the device. More splits than kBN tiles of the bound would only add empty CTAs.
  int64_t n_split = base < slots ? slots / base : 1;
  n_split = std::min<int64_t>({n_split, tiles, kMaxSplit});
  n_split = std::max<int64_t>(n_split, 1);
  plan->path = path;
  plan->rows_per_cta = rows;
  plan->n_row_blocks = n_row_blocks;
  plan->n_split = static_cast<int>(n_split);
  plan->scratch_bytes = n_split > 1 ? n_split * static_cast<int64_t>(a.n_tokens) * a.n_head * (a.kv.head_dim + 2) *
                                          static_cast<int64_t>(4)
                                    : 0;
}

// rows_t: the transposed form (at most kRowsT rows a KV head); both forms stage sQ for kFuseRows rows.
template <int D, typename KV>
KernelPick pick_decode(bool rows_t) {
  const void* fn = rows_t ? reinterpret_cast<const void*>(attn_decode_kernel<D, KV, true>)
                          : reinterpret_cast<const void*>(attn_decode_kernel<D, KV, false>);
  return {fn, tc_smem_bytes<KV>(D, 1)};
}

template <typename KV>
KernelPick pick_decode_d(int D, bool rows_t) {  // head_dim 64, 128 or 256
  switch (D) {
    case 64: return pick_decode<64, KV>(rows_t);
    case 128: return pick_decode<128, KV>(rows_t);
    case 256: return pick_decode<256, KV>(rows_t);
    default: return {};
  }
}

// R: the packed rows of a KV head (n_tokens * G); at most kRowsT take the transposed form.
KernelPick pick_decode_kernel(DType dtype, int D, int64_t R) {
  const bool rows_t = R <= kRowsT;
  if (dtype == DType::Q8_0) return pick_decode_d<kern::KvQ8>(D, rows_t);
  if (dtype == DType::Q4_0) return pick_decode_d<kern::KvQ4>(D, rows_t);
  if (dtype != DType::F16) return {};
  if (D == 32) return pick_decode<32, __half>(rows_t);
  return pick_decode_d<__half>(D, rows_t);
}

}  // namespace

bool attention_decode_fits(DType kv_dtype, int head_dim, int n_head, int n_head_kv, int n_tokens) {
  if (n_head_kv < 1 || n_head_kv > kAttnDecodeMaxKvHeads || n_head % n_head_kv != 0 || n_tokens < 1 ||
      static_cast<int64_t>(n_tokens) * (n_head / n_head_kv) > kFuseRows) {
    return false;
  }
  const KernelPick k = pick_decode_kernel(kv_dtype, head_dim, static_cast<int64_t>(n_tokens) * (n_head / n_head_kv));
  const long long smem_limit = smem_optin_limit();
  return k.fn != nullptr && (smem_limit == 0 || k.smem <= static_cast<size_t>(smem_limit));
}

cudaError_t attention_decode_plan(const AttnPagedArgs& a, int device, AttnPlan* plan) {
  if (!attention_decode_fits(a.kv.dtype, a.kv.head_dim, a.n_head, a.kv.n_head_kv, a.n_tokens) ||
      a.kv.chunk_tokens <= 0 || a.kv.k_offset % 16 != 0 || a.kv.v_offset % 16 != 0) {
    return cudaErrorNotSupported;
  }
  const int R = a.n_tokens * (a.n_head / a.kv.n_head_kv);
  int slots = 0, per_sm = 1;
  const cudaError_t e = configure(pick_decode_kernel(a.kv.dtype, a.kv.head_dim, R), device, &slots, &per_sm);
  if (e != cudaSuccess) return e;
  if (a.n_tokens == 1 && R > 1 && a.max_kv <= kAttnDecodeRowMaxKv) {  // one CTA per query row, one split
    fill_plan(a, AttnPath::kTensorCore, 1, R, slots, per_sm, plan);
    plan->n_split = 1;
    plan->scratch_bytes = 0;
    return cudaSuccess;
  }
  fill_plan(a, AttnPath::kTensorCore, kFuseRows, 1, slots, per_sm, plan);
  return cudaSuccess;
}

cudaError_t attention_decode_launch(const AttnDecodeArgs& a, const AttnPlan& plan, cudaStream_t s) {
  const AttnPagedArgs& at = a.attn;
  const int64_t R = static_cast<int64_t>(at.n_tokens) * (at.n_head / std::max(at.kv.n_head_kv, 1));
  const KernelPick k = pick_decode_kernel(at.kv.dtype, at.kv.head_dim, R);
  const bool row_blocks = plan.rows_per_cta == kFuseRows && plan.n_row_blocks == 1;
  const bool rows = plan.rows_per_cta == 1 && plan.n_row_blocks == R && plan.n_split == 1 && at.n_tokens == 1;
  if (k.fn == nullptr || plan.path != AttnPath::kTensorCore || !(row_blocks || rows) ||
      (plan.n_split > 1 && at.scratch == nullptr) || at.gate == nullptr || at.q8 == nullptr ||
      reinterpret_cast<uintptr_t>(at.q8) % 16 != 0 || a.prep.q == nullptr || a.prep.k == nullptr ||
      a.k_out == nullptr || a.k_out == a.prep.k || a.prep.v == nullptr || a.prep.q_in == nullptr || a.prep.n_rot < 2 ||
      a.prep.n_rot % 2 != 0 || a.prep.n_rot > at.kv.head_dim || at.kv.n_head_kv < 1 || R > kFuseRows) {
    return cudaErrorInvalidValue;
  }
  // attention_decode_plan configured the kernel's shared-memory limit on this device.
  KParams p = make_params(at, plan);
  p.q = nullptr;  // the kernel prepares q itself
  p.q_in = a.prep.q_in;
  p.q_hs = a.prep.q_hs;
  p.q_ts = a.prep.q_ts;
  p.q_norm = a.prep.q_norm;
  p.k_norm = a.prep.k_norm;
  p.q_out = a.prep.q;
  p.k_in = a.prep.k;
  p.k_out = a.k_out;
  p.v_in = a.prep.v;
  p.n_rot = a.prep.n_rot;
  p.log2_base = a.prep.log2_base;
  p.eps = a.prep.eps;
  void* args[] = {&p};
  const dim3 grid(static_cast<unsigned>(at.kv.n_head_kv), static_cast<unsigned>(plan.n_row_blocks),
                  static_cast<unsigned>(plan.n_split));
  cudaError_t e = launch_kernel_packed(k.fn, grid, dim3(kThreads), args, k.smem, s);
  if (e != cudaSuccess) return e;
  if (plan.n_split > 1) {
    e = launch_kernel_packed(reinterpret_cast<const void*>(attn_combine_kernel<true>), dim3(static_cast<unsigned>(p.RT)),
                             dim3(32 * kCombineWarps), args, 0, s);
    if (e != cudaSuccess) return e;
  }
  return cudaGetLastError();
}

cudaError_t attention_paged_plan(
const AttnPagedArgs& a, AttnPath force, int device, AttnPlan* plan) {
  const int D = a.kv.head_dim, Hkv = a.kv.n_head_kv;
  const bool dtype_ok = a.kv.dtype == DType::F16 || a.kv.dtype == DType::F32 ||
                        (kern::kv_dtype_blocks(a.kv.dtype) && D % kern::kKvBlock == 0);
  if (D <= 0 || D > kAttnMaxHeadDim || Hkv <= 0 || a.n_head % Hkv != 0 || a.n_tokens <= 0 ||
      a.kv.chunk_tokens <= 0 || !dtype_ok) {
    return cudaErrorInvalidValue;
  }
  const int64_t R = static_cast<int64_t>(a.n_tokens) * (a.n_head / Hkv);
  if (R > INT32_MAX / 2) return cudaErrorInvalidValue;
  // The tensor-core kernel where its staging fits the device (head_dim 256 needs ~140 KB: not on the
  // 99 KB of sm_86 / sm_89), else the SIMT kernel; at most kRowsT rows a KV head take the transposed form.
  const int tc_rows = R <= kRowsT ? kRowsT : R <= 16 ? 16 : R <= 32 ? 32 : 64;
  const KernelPick tc_pick = tc_allowed(a) ? pick_kernel(AttnPath::kTensorCore, a.kv.dtype, D, tc_rows) : KernelPick{};
  const long long smem_limit = smem_optin_limit();
  const bool tc = tc_pick.fn != nullptr && (smem_limit == 0 || tc_pick.smem <= static_cast<size_t>(smem_limit));
  AttnPath path = force == AttnPath::kAuto ? (tc ? AttnPath::kTensorCore : AttnPath::kSimt) : force;
  if (path == AttnPath::kTensorCore && !tc) return cudaErrorInvalidValue;
  const int rows = path == AttnPath::kTensorCore ? tc_rows : simt_rows(simt_lanes(D));
  const KernelPick k = path == AttnPath::kTensorCore ? tc_pick : pick_kernel(path, a.kv.dtype, D, rows);
  if (k.fn == nullptr) return cudaErrorInvalidValue;
  int slots = 0, per_sm = 1;
  const cudaError_t e = configure(k, device, &slots, &per_sm);
  if (e != cudaSuccess) return e;
  const int64_t n_row_blocks = (R + rows - 1) / rows;
  if (n_row_blocks > 65535) return cudaErrorInvalidValue;  // grid y: callers prefill in pieces
  fill_plan(a, path, rows, n_row_blocks, slots, per_sm, plan);
  return cudaSuccess;
}

cudaError_t attention_paged_launch(const AttnPagedArgs& a, const AttnPlan& plan, cudaStream_t s) {
  const KernelPick k = pick_kernel(plan.path, a.kv.dtype, a.kv.head_dim, plan.rows_per_cta);
  if (k.fn == nullptr || (plan.n_split > 1 && a.scratch == nullptr) || plan.n_row_blocks > 65535) {
    return cudaErrorInvalidValue;
  }
  if (a.gate != nullptr && (a.q8 == nullptr || reinterpret_cast<uintptr_t>(a.q8) % 16 != 0 || a.kv.head_dim % 32 != 0)) {
    return cudaErrorInvalidValue;
  }
  // attention_paged_plan configured k's shared-memory limit on this device (once per kernel).
  KParams p = make_params(a, plan);
  void* args[] = {&p};
  const dim3 grid(static_cast<unsigned>(a.kv.n_head_kv), static_cast<unsigned>(plan.n_row_blocks),
                  static_cast<unsigned>(plan.n_split));
  cudaError_t e = launch_kernel_packed(k.fn, grid, dim3(kThreads), args, k.smem, s);
  if (e != cudaSuccess) return e;
  if (plan.n_split > 1) {  // one split: the attention kernel wrote the final rows, gated where asked
    const void* combine = a.gate != nullptr ? reinterpret_cast<const void*>(attn_combine_kernel<true>)
                                            : reinterpret_cast<const void*>(attn_combine_kernel<false>);
    e = launch_kernel_packed(combine, dim3(static_cast<unsigned>(p.RT)), dim3(32 * kCombineWarps), args, 0, s);
    if (e != cudaSuccess) return e;
  }
  return cudaGetLastError();
}

}  // namespace ds::cuda
