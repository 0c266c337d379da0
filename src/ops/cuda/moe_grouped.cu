// Kernels and launchers of the grouped MoE path (moe_launch.h): the expert FFN of a prefill batch with
// the pairs grouped per expert on the device. moe_group_plan sorts the (token, slot) pairs by expert and
// cuts each expert's run into tiles of up to tile_m pairs (32, 64 or 128: moe_group_tile_m); moe_grouped_product
// multiplies a tile's activation rows with kGroupN rows of its expert on the tensor cores (BF16 operands, F32 sums, as the
// dense prefill GEMM), dequantizing the weights into shared memory step by step. The activations come
// in BF16, rounded once (round to nearest even, as any BF16 operand of the products): x per token for
// the gate/up products (f32_to_bf16), and h = silu(g) * u per pair for the down products
// (moe_swiglu_bf16, between them). Staged from F32 instead, every CTA would convert (and evaluate
// SwiGLU) again for its row block: same bits, many times the work.
// Non-obvious choice: the product's grid is sized for the most tiles any routing can produce (pairs /
// tile_m + experts) and CTAs past the plan's count exit at once, so the routing never reaches the
// host: a prefill chunk's MoE layers run without a synchronization and in a handful of launches.
#include <cuda_bf16.h>

#include <algorithm>

#include "ops/cuda/launch.cuh"
#include "ops/cuda/mma.cuh"
#include "ops/cuda/moe_launch.h"
#include "ops/cuda/quant_decode.cuh"

namespace ds::cuda {
namespace {

constexpr int kPlanThreads = 1024;
constexpr int kGroupN = 128;                // weight rows per CTA (4 warps of 32)
constexpr int kGroupK = 64;                 // elements of k per step
constexpr int kGroupThreads = 128;
// CTAs per SM the register budget allows: 4 (128 registers a thread) with tiles of 32 pairs, 3 (168) with
// 64, whose accumulators are twice as many (at 128 registers the K-quant decoders spilled), 2 (255) with
// 128.
constexpr int group_min_ctas(int m) { return m > 64 ? 2 : m > 32 ? 3 : 4; }
constexpr int kGroupPitch = kGroupK + 8;    // bf16 per shared row: 144 bytes, conflict-free fragment reads
constexpr int kGroupUnits = kGroupK / 8;    // 8-element units per row and step
static_assert(kGroupN == kGroupThreads, "one weight row per thread and step");

// Counts the valid pairs per expert, then lays the experts' runs out back to back in expert order:
// order[run(e) ...] = the slots routed to e (in no particular order within a run: every output row
// depends only on its own activation row, so the order changes no bit), tiles = one entry per
// tile_m pairs of a run. Slots whose id is outside [0, n_expert) are in no run.
__global__ void __launch_bounds__(kPlanThreads) moe_group_plan(const int32_t* ids, int n_slots, int n_expert,
                                                               int tile_m, int32_t* order, int4* tiles,
                                                               int* n_tiles) {
  extern __shared__ int plan_smem[];
  int* count = plan_smem;           // [n_expert]
  int* next = plan_smem + n_expert;  // [n_expert]: the next free place in each run
  kern::dependency_wait();
  for (int e = threadIdx.x; e < n_expert; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int s = threadIdx.x; s < n_slots; s += blockDim.x) {
    const int e = ids[s];
    if (e >= 0 && e < n_expert) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  if (threadIdx.x < 32) {  // one warp scans: lane l takes a contiguous share of the experts
    const int lane = threadIdx.x, per = (n_expert + 31) / 32;
    const int e0 = min(n_expert, lane * per), e1 = min(n_expert, e0 + per);
    int pairs = 0, n_t = 0;
    for (int e = e0; e < e1; ++e) {
      pairs += count[e];
      n_t += (count[e] + tile_m - 1) / tile_m;
    }
    int pairs_incl = pairs, tiles_incl = n_t;
    for (int o = 1; o < 32; o <<= 1) {
      const int a = __shfl_up_sync(0xFFFFFFFFu, pairs_incl, o), b = __shfl_up_sync(0xFFFFFFFFu, tiles_incl, o);
      if (lane >= o) {
        pairs_incl += a;
        tiles_incl += b;
      }
    }
    int begin = pairs_incl - pairs, t = tiles_incl - n_t;
    for (int e = e0; e < e1; ++e) {
      const int c = count[e];
      next[e] = begin;
      for (int b = 0; b < c; b += tile_m) tiles[t++] = make_int4(e, begin + b, min(tile_m, c - b), 0);
      begin += c;
    }
    if (lane == 31) *n_tiles = tiles_incl;
  }
  __syncthreads();
  for (int s = threadIdx.x; s < n_slots; s += blockDim.x) {
    const int e = ids[s];
    if (e >= 0 && e < n_expert) order[atomicAdd(&next[e], 1)] = s;
  }
  kern::allow_dependents();
}

// A weight row's step in two halves, so the next step's loads fly during this step's tensor-core work:
// step_load reads the bytes of elements [k0, k0 + kGroupK) into registers, step_decode writes them as
// BF16 at dst (the values decode8 gives, rounded to nearest; zeros past k). A K-quant step lies in one
// block (half of two 32-element sub-blocks of a Q4_K / Q5_K block, two 32-element quarters of a Q6_K
// half) and reads the block's header once; the other types load in step_decode, unit by unit.
template <DType T>
struct StepRaw {};
template <>
struct StepRaw<DType::Q4_K> {
  uint32_t dd, sc[3];
  uint4 q[2];
};
template <>
struct StepRaw<DType::Q5_K> {
  uint32_t dd, sc[3];
  uint4 q[2], qh[2];
};
template <>
struct StepRaw<DType::Q6_K> {
  uint32_t ql[16], qh[8], sc;
  uint16_t d;
};

template <DType T>
__device__ __forceinline__ void step_load(const uint8_t* row, int64_t k0, StepRaw<T>& r) {
  static_assert(kGroupK == 64, "a step is a quarter of a 256-element K-quant block");
  if constexpr (T == DType::Q4_K || T == DType::Q5_K) {
    constexpr int kBytes = T == DType::Q4_K ? 144 : 176;
    constexpr int kQs = T == DType::Q4_K ? 16 : 48;
    const uint8_t* blk = row + (k0 >> 8) * kBytes;
    const int c = static_cast<int>(k0 & 255) >> 6;
    r.dd = *reinterpret_cast<const uint32_t*>(blk);
#pragma unroll
    for (int i = 0; i < 3; ++i) r.sc[i] = *reinterpret_cast<const uint32_t*>(blk + 4 + 4 * i);
    r.q[0] = *reinterpret_cast<const uint4*>(blk + kQs + 32 * c);
    r.q[1] = *reinterpret_cast<const uint4*>(blk + kQs + 32 * c + 16);
    if constexpr (T == DType::Q5_K) {
      r.qh[0] = *reinterpret_cast<const uint4*>(blk + 16);
      r.qh[1] = *reinterpret_cast<const uint4*>(blk + 32);
    }
  } else if constexpr (T == DType::Q6_K) {
    const uint8_t* blk = row + (k0 >> 8) * 210;
    const int j0 = static_cast<int>(k0 & 255), h = j0 >> 7, qa = (j0 >> 5) & 3;
    // Blocks of 210 bytes are 2-byte aligned: aligned words, realigned by a funnel shift.
    const uintptr_t at = reinterpret_cast<uintptr_t>(blk + 64 * h);
    const auto* wl = reinterpret_cast<const uint32_t*>(at & ~uintptr_t{3});
    const unsigned sh = 8u * static_cast<unsigned>(at & 3);
    uint32_t raw[17];
#pragma unroll
    for (int i = 0; i < 17; ++i) raw[i] = wl[i];  // one word past the 64 bytes: still inside the block
#pragma unroll
    for (int i = 0; i < 16; ++i) r.ql[i] = __funnelshift_r(raw[i], raw[i + 1], sh);
    const uintptr_t ath = reinterpret_cast<uintptr_t>(blk + 128 + 32 * h);
    const auto* wh = reinterpret_cast<const uint32_t*>(ath & ~uintptr_t{3});
    const unsigned shh = 8u * static_cast<unsigned>(ath & 3);
    uint32_t rawh[9];
#pragma unroll
    for (int i = 0; i < 9; ++i) rawh[i] = wh[i];
#pragma unroll
    for (int i = 0; i < 8; ++i) r.qh[i] = __funnelshift_r(rawh[i], rawh[i + 1], shh);
    r.sc = qdec::ld32_a2(blk + 192 + 8 * h + 2 * qa);  // the int8 scales of 16-element groups 2qa .. 2qa+3
    r.d = qdec::ld16(blk + 208);
  } else {
    (void)row, (void)k0, (void)r;
  }
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

template <DType T>
__device__ __forceinline__ void step_decode(const StepRaw<T>& r, const uint8_t* row, int64_t k0, int64_t k,
                                            uint16_t* dst) {
  if constexpr (T == DType::Q4_K || T == DType::Q5_K) {
    const int c = static_cast<int>(k0 & 255) >> 6;
    uint8_t scales[12];
#pragma unroll
    for (int i = 0; i < 12; ++i) scales[i] = static_cast<uint8_t>(r.sc[i / 4] >> (8 * (i % 4)));
    int sc0, m0, sc1, m1;
    qdec::k_scale_min(2 * c, scales, &sc0, &m0);
    qdec::k_scale_min(2 * c + 1, scales, &sc1, &m1);
    const float dh = qdec::h2f(r.dd & 0xFFFF), mh = qdec::h2f(r.dd >> 16);
    const float d[2] = {dh * sc0, dh * sc1}, dm[2] = {mh * m0, mh * m1};
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // low nibbles: elements 0..31 of the step; high: 32..63
#pragma unroll
      for (int wi = 0; wi < 8; wi += 2) {
        uint32_t b[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          b[j] = (word_of(r.q[(wi + j) / 4], (wi + j) % 4) >> (4 * half)) & 0x0F0F0F0Fu;
          if constexpr (T == DType::Q5_K) {
            b[j] |= ((word_of(r.qh[(wi + j) / 4], (wi + j) % 4) >> (2 * c + half)) & 0x01010101u) << 4;
          }
        }
        float v[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = d[half] * qdec::byte_to_float(b[i >> 2], i & 3, 0.0f) - dm[half];
        kern::store_bf16x8(dst + 32 * half + 4 * wi, v);
      }
    }
  } else if constexpr (T == DType::Q6_K) {
    const int qa = static_cast<int>(k0 >> 5) & 3;  // quarters qa, qa + 1 of the half
    const int lshift = 4 * (qa >> 1);
    const float dh = qdec::h2f(r.d);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int quarter = qa + half;
#pragma unroll
      for (int l0 = 0; l0 < 32; l0 += 8) {
        const int sc_i = (l0 >> 4) + 2 * half;
        const float d = dh * static_cast<float>(static_cast<int8_t>(r.sc >> (8 * sc_i)));
        uint32_t b[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          b[j] = ((r.ql[8 * half + l0 / 4 + j] >> lshift) & 0x0F0F0F0Fu) |
                 (((r.qh[l0 / 4 + j] >> (2 * quarter)) & 0x03030303u) << 4);
        }
        float v[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = d * qdec::byte_to_float(b[i >> 2], i & 3, -32.0f);
        kern::store_bf16x8(dst + 32 * half + l0, v);
      }
    }
  } else {
    (void)r;
#pragma unroll
    for (int u = 0; u < kGroupUnits; ++u) {
      float v[8] = {};
      if (k0 + 8 * u < k) qdec::decode8<T>(row, k0 + 8 * u, v);
      kern::store_bf16x8(dst + 8 * u, v);
    }
  }
}

// h[place] = silu(g) * u of the gate/up products' row `place` (g at [0, n_ff), u at [n_ff, 2 n_ff)),
// rounded to BF16 once for every down product that reads it; one thread per 8 elements, the places the
// plan's runs hold (the last tile's end).
__global__ void moe_swiglu_bf16(const float* gu, int64_t n_ff, int64_t max_places, const int4* tiles,
                                const int* n_tiles, uint16_t* h) {
  kern::dependency_sync();
  const int n_t = *n_tiles;
  const int64_t places = n_t > 0 ? static_cast<int64_t>(tiles[n_t - 1].y) + tiles[n_t - 1].z : 0;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, units = n_ff / 8;
  if (i >= std::min(places, max_places) * units) return;
  const int64_t r = i / units, e0 = 8 * (i - r * units);
  const float* g = gu + r * 2 * n_ff + e0;
  const float4 g0 = *reinterpret_cast<const float4*>(g), g1 = *reinterpret_cast<const float4*>(g + 4);
  const float4 u0 = *reinterpret_cast<const float4*>(g + n_ff), u1 = *reinterpret_cast<const float4*>(g + n_ff + 4);
  const float gv[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
  const float uv[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
  float v[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = gv[j] / (1.0f + __expf(-gv[j])) * uv[j];
  kern::store_bf16x8(h + r * n_ff + e0, v);
}

// One tile of one expert times rows [n0, n0 + kGroupN) of its weights (grid: x = tile, y = row block).
// Activation row m of the tile (BF16 rows of h): order[p] / x_div (the pair's token), or p with x_div 0
// (the pair's place in the runs). Output row: y_by_slot ? the pair's slot : its place. A thread's
// activation units of a step (kAUnits of 8 elements) are loaded a step ahead like the weights.
// Warp w computes the tile's kM rows x 32 weight rows [32 w, 32 w + 32) of the block: kM / 16 m16 by
// four n8 tensor-core tiles per 16 elements of k. Every output element is the same sum in the same
// order for either kM: a tile's size changes no bit, only how often the weights are dequantized.
template <DType T, int kM>
__global__ void __launch_bounds__(kGroupThreads, group_min_ctas(kM)) moe_grouped_product(MoeGroupedLaunch p) {
  constexpr int kMT = kM / 16;                                 // m16 tiles
  constexpr int kAUnits = kM * kGroupUnits / kGroupThreads;  // activation units per thread and step
  static_assert(kM % 16 == 0 && kM <= kGroupThreads, "whole m16 tiles; one thread per pair for the rows");
  static_assert(kAUnits * kGroupThreads == kM * kGroupUnits, "whole activation units per thread");
  __shared__ __align__(16) uint16_t as[kM * kGroupPitch];
  __shared__ __align__(16) uint16_t bs[kGroupN * kGroupPitch];
  __shared__ int64_t src_row[kM], dst_row[kM];
  kern::dependency_wait();
  if (static_cast<int>(blockIdx.x) >= *p.n_tiles) return;
  const int4 tile = p.tiles[blockIdx.x];
  const int e = tile.x, begin = tile.y, count = tile.z;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kGroupN;
  if (threadIdx.x < kM) {
    int64_t src = -1, dst = -1;
    if (static_cast<int>(threadIdx.x) < count) {
      const int place = begin + static_cast<int>(threadIdx.x), slot = p.order[place];
      src = p.x_div > 0 ? slot / p.x_div : place;
      dst = p.y_by_slot ? slot : place;
    }
    src_row[threadIdx.x] = src;
    dst_row[threadIdx.x] = dst;
  }
  __syncthreads();
  const uint8_t* w = static_cast<const uint8_t*>(p.w) + static_cast<int64_t>(e) * p.w_expert_stride;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane >> 2, c = lane & 3;
  const int64_t my_row = n0 + threadIdx.x;
  const uint8_t* w_row = my_row < p.n_rows ? w + my_row * p.w_stride : nullptr;
  float acc[kMT][4][4] = {};
  const auto act_load = [&](int64_t k0, uint4 (&ar)[kAUnits]) {
#pragma unroll
    for (int it = 0; it < kAUnits; ++it) {
      const int i = static_cast<int>(threadIdx.x) + it * kGroupThreads;
      const int64_t kk = k0 + 8 * (i % kGroupUnits), r = src_row[i / kGroupUnits];
      ar[it] = r >= 0 && kk < p.k ? *reinterpret_cast<const uint4*>(p.h + r * p.h_stride + kk) : make_uint4(0, 0, 0, 0);
    }
  };
  uint4 ar[kAUnits];
  StepRaw<T> br;
  act_load(0, ar);
  if (w_row != nullptr) step_load<T>(w_row, 0, br);
  for (int64_t k0 = 0; k0 < p.k; k0 += kGroupK) {
#pragma unroll
    for (int it = 0; it < kAUnits; ++it) {
      const int i = static_cast<int>(threadIdx.x) + it * kGroupThreads;
      *reinterpret_cast<uint4*>(as + (i / kGroupUnits) * kGroupPitch + 8 * (i % kGroupUnits)) = ar[it];
    }
    // Thread n decodes weight row n0 + n (whole-block row lengths for K-quants: the step is complete).
    if (w_row != nullptr) {
      step_decode<T>(br, w_row, k0, p.k, bs + threadIdx.x * kGroupPitch);
    } else {
#pragma unroll
      for (int u = 0; u < kGroupUnits; ++u) {
        *reinterpret_cast<uint4*>(bs + threadIdx.x * kGroupPitch + 8 * u) = make_uint4(0, 0, 0, 0);
      }
    }
    __syncthreads();
    if (k0 + kGroupK < p.k) {  // the next step's loads fly during this step's tensor-core work
      act_load(k0 + kGroupK, ar);
      if (w_row != nullptr) step_load<T>(w_row, k0 + kGroupK, br);
    }
#pragma unroll
    for (int ks = 0; ks < kGroupK; ks += 16) {
      // Fragments by ldmatrix (four 8 x 8 matrices an instruction; lane l gives one 16-byte row):
      // a[mt] = rows 16 mt + (l & 15), elements ks + 8 (l >> 4); b[nt], b[nt + 1] = weight rows
      // 32 warp + 8 (nt + (l >> 4)) + (l & 7), elements ks + 8 ((l >> 3) & 1).
      uint32_t a[kMT][4], b[2][4];  // b[j]: n8 tiles 2 j (registers 0, 1) and 2 j + 1 (2, 3)
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        kern::ldsm_x4(a[mt], kern::smem_addr(as + (16 * mt + (lane & 15)) * kGroupPitch + ks + 8 * (lane >> 4)));
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int n = 32 * warp + 8 * (2 * j + (lane >> 4)) + (lane & 7);
        kern::ldsm_x4(b[j], kern::smem_addr(bs + n * kGroupPitch + ks + 8 * ((lane >> 3) & 1)));
      }
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          kern::mma_16816_bf16(acc[mt][nt], a[mt], b[nt / 2][2 * (nt % 2)], b[nt / 2][2 * (nt % 2) + 1]);
        }
      }
    }
    __syncthreads();
  }
  // Accumulator j of tile (mt, nt): pair row 16 mt + g + 8 (j / 2), weight row 32 warp + 8 nt + 2 c + j % 2.
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t dst = dst_row[16 * mt + g + 8 * half];
      if (dst < 0) continue;
      float* yr = p.y + dst * p.y_stride;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int64_t col = n0 + 32 * warp + 8 * nt + 2 * c;
        if (col < p.n_rows) yr[col] = acc[mt][nt][2 * half];
        if (col + 1 < p.n_rows) yr[col + 1] = acc[mt][nt][2 * half + 1];
      }
    }
  }
}

template <DType T>
cudaError_t launch_grouped(const MoeGroupedLaunch& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.max_tiles), static_cast<unsigned>((p.n_rows + kGroupN - 1) / kGroupN));
  if (p.tile_m == kMoeGroupMMax) {
    return launch_kernel(moe_grouped_product<T, kMoeGroupMMax>, grid, kGroupThreads, 0, stream, p);
  }
  if (p.tile_m == kMoeGroupMLarge) {
    return launch_kernel(moe_grouped_product<T, kMoeGroupMLarge>, grid, kGroupThreads, 0, stream, p);
  }
  return launch_kernel(moe_grouped_product<T, kMoeGroupM>, grid, kGroupThreads, 0, stream, p);
}

}  // namespace

int moe_group_tile_m(int64_t n_slots, int64_t n_expert) {
  if (n_slots >= kMoeGroupMMaxMinAvg * n_expert) return kMoeGroupMMax;
  return n_slots >= kMoeGroupMLargeMinAvg * n_expert ? kMoeGroupMLarge : kMoeGroupM;
}

int64_t moe_group_max_tiles(int64_t n_slots, int64_t n_expert, int tile_m) {
  return (n_slots + tile_m - 1) / tile_m + std::min(n_slots, n_expert);
}

cudaError_t moe_group_plan_launch(const int32_t* ids, int n_slots, int n_expert, int tile_m, int32_t* order,
                                  int4* tiles, int* n_tiles, cudaStream_t stream) {
  if (n_slots < 0 || n_expert < 1 || n_expert > kMoeGroupMaxExperts || tile_m < 1) return cudaErrorInvalidValue;
  return launch_kernel(moe_group_plan, 1, kPlanThreads, 2 * sizeof(int) * static_cast<size_t>(n_expert), stream,
                       ids, n_slots, n_expert, tile_m, order, tiles, n_tiles);
}

bool moe_grouped_fits(DType t, const void* w, int64_t w_stride, int64_t w_expert_stride, int64_t k) {
  // decode8's types (qdec::traits) but F32.
  if (t == DType::F32 || qdec::traits(t).block_elems == 0) return false;
  const int64_t align = qdec::traits(t).row_align;
  return k > 0 && k % 8 == 0 && k % qdec::traits(t).block_elems == 0 &&
         reinterpret_cast<uintptr_t>(w) % align == 0 && w_stride % align == 0 && w_expert_stride % align == 0;
}

cudaError_t moe_grouped_product_launch(DType t, const MoeGroupedLaunch& p, cudaStream_t stream) {
  if (p.n_rows <= 0 || p.max_tiles <= 0) return cudaSuccess;
  if (!moe_grouped_fits(t, p.w, p.w_stride, p.w_expert_stride, p.k) || p.x_div < 0 || p.h == nullptr ||
      !moe_group_tile_m_valid(p.tile_m) ||
      reinterpret_cast<uintptr_t>(p.h) % 16 != 0 || p.h_stride % 8 != 0 ||
      (p.n_rows + kGroupN - 1) / kGroupN > 65535) {
    return cudaErrorInvalidValue;
  }
  switch (t) {
    case DType::F16: return launch_grouped<DType::F16>(p, stream);
    case DType::BF16: return launch_grouped<DType::BF16>(p, stream);
    case DType::Q4_0: return launch_grouped<DType::Q4_0>(p, stream);
    case DType::Q5_0: return launch_grouped<DType::Q5_0>(p, stream);
    case DType::Q8_0: return launch_grouped<DType::Q8_0>(p, stream);
    case DType::Q4_K: return launch_grouped<DType::Q4_K>(p, stream);
    case DType::Q5_K: return launch_grouped<DType::Q5_K>(p, stream);
    case DType::Q6_K: return launch_grouped<DType::Q6_K>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t moe_swiglu_bf16_launch(const float* gu, int64_t n_ff, int64_t max_places, const int4* tiles,
                                   const int* n_tiles, uint16_t* h, cudaStream_t stream) {
  if (max_places <= 0 || n_ff <= 0) return cudaSuccess;
  if (n_ff % 8 != 0 || reinterpret_cast<uintptr_t>(gu) % 16 != 0 || reinterpret_cast<uintptr_t>(h) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  constexpr int kThreads = 256;
  const int64_t units = max_places * (n_ff / 8);
  return launch_kernel(moe_swiglu_bf16, static_cast<unsigned>((units + kThreads - 1) / kThreads), kThreads, 0, stream,
                       gu, n_ff, max_places, tiles, n_tiles, h);
}

}  // namespace ds::cuda
