// Workbench: what holds the one-token products of a 27B decode step below the streaming bandwidth:
// the launches, the dependency between consecutive products, or the decoding itself. It times the
// product sequence of `layers` 27B layers (DeltaNet qkv, z, output, FFN gate+up, FFN down; the qkv and
// down weights alternate Q6_K / Q4_K by layer as in Q4_K_M), each form captured in a CUDA graph with
// programmatic dependent launch and replayed:
//   prod:        the production launcher (matvec_q8_product_launch: at one token, v4 capped at 4 CTAs
//                per SM, and v5p for the Q4_K gate+up);
//   split:       one launch per product of the CTA-balanced kernel below (one CTA of kWarps warps per
//                SM: each CTA takes an equal contiguous share of the row groups, its warps an equal
//                contiguous share of that share's (row group, 1024-element chunk) units, partial sums
//                combined in shared memory in chunk order; v4's rings and unit decoding);
//   chain:       the same kernel running the whole sequence in one launch: between two products every
//                CTA signals a device counter and waits for all CTAs (the dependency a real step has),
//                while its warps' rings already stream the next product's weights;
//   chain+L2 N:  chain, each warp pulling the N units past its ring into L2 when it reaches a product's end;
//   chain-nobar: chain without the barrier (as if the products were independent);
//   read, read-nobar, read+L2: chain's weight streaming without the decoding and the products.
// Then per product kind, prod against split. Every form's outputs are checked against prod (1e-4 of the
// product's largest |y|); the second argument writes prod's outputs, for a bit-for-bit comparison of
// two builds of the library. Findings (H100, docs/perf-gpu.md): one launch for the whole sequence
// gains nothing over a launch per product; the barrier costs ~2.7 us a product and the decoding as
// much again (read-nobar 90%, read 78%, chain-nobar 76-80%, chain 66-67% of the flat read); L2 pulls lose.
// Build (after the CMake build in build-gpu; scripts/gpu-check builds it so):
//   nvcc -std=c++17 -O3 -arch=sm_90 --expt-relaxed-constexpr -Isrc -I.deps/include -DFMT_HEADER_ONLY=1 \
//     kernels/chain_bench.cu build-gpu/libdeltaserve_lib.a build-gpu/libdeltaserve_cuda.a -lcublas \
//     -o build-gpu/chain_bench
// Run:   build-gpu/chain_bench [layers] [file for the production outputs]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "ops/cuda/matvec_launch.h"
#include "ops/cuda/matvec_q8.cuh"
#include "quant/quant.h"
#include "workbench.cuh"

using namespace ds;
namespace kern = ds::cuda::kern;

namespace {

constexpr int kRows = kern::kQ8Rows;  // 4 weight rows per warp unit
constexpr int kRowBytesMax = kern::q8_row_bytes(DType::Q6_K);

struct Item {
  kern::MatvecQ8Args a;  // one token (kern::q8_args)
  int type;              // DType
};

// A warp's position in its sequence of (product, unit): unit u of product p covers row group g
// (g0 + u / n_chunks) and chunk ch (u % n_chunks), both advanced incrementally; [u, u1) is what is left
// of the warp's share of p. 32-bit: a CTA's share of one product has far fewer than 2^31 units.
struct Cursor {
  int p;
  int u, u1, g, ch, n_chunks;
};

__device__ __forceinline__ void cursor_load(Cursor& c, const Item* items, int n, int warp, int n_warps) {
  while (c.p < n) {
    const Item& it = items[c.p];
    const int groups = static_cast<int>((it.a.n_rows + kRows - 1) / kRows);
    const int g0 = static_cast<int>(static_cast<int64_t>(groups) * blockIdx.x / gridDim.x);
    const int g1 = static_cast<int>(static_cast<int64_t>(groups) * (blockIdx.x + 1) / gridDim.x);
    c.n_chunks = static_cast<int>((it.a.k + kern::kQ8ChunkElems - 1) / kern::kQ8ChunkElems);
    const int units = (g1 - g0) * c.n_chunks;
    c.u = units * warp / n_warps;
    c.u1 = units * (warp + 1) / n_warps;
    c.g = g0 + c.u / c.n_chunks;
    c.ch = c.u % c.n_chunks;
    if (c.u < c.u1) return;
    ++c.p;
  }
}

__device__ __forceinline__ void cursor_next(Cursor& c, const Item* items, int n, int warp, int n_warps) {
  if (++c.ch == c.n_chunks) {
    c.ch = 0;
    ++c.g;
  }
  if (++c.u < c.u1) return;
  ++c.p;
  cursor_load(c, items, n, warp, n_warps);
}

template <DType T>
__device__ __forceinline__ void issue_t(uint8_t* stage, const kern::MatvecQ8Args& a, int64_t r0, int c, int lane) {
  using Stage = uint8_t(*)[kern::Q8Smem<T, kRows>::kRowBytes];
  const uintptr_t w_base = reinterpret_cast<uintptr_t>(a.w);
  kern::q8_issue_chunk<T, kRows>(reinterpret_cast<Stage>(stage), w_base, kern::q8_weights_end<T>(w_base, a), a, r0, c,
                                 lane);
}

template <DType T>
__device__ __forceinline__ void dot_t(const uint8_t* stage, const kern::MatvecQ8Args& a, int64_t r0, int c, int lane,
                                      float (&acc)[kRows][1]) {
  using Stage = const uint8_t(*)[kern::Q8Smem<T, kRows>::kRowBytes];
  kern::q8_chunk_dot<T, 1, kRows>(reinterpret_cast<Stage>(stage), reinterpret_cast<uintptr_t>(a.w), a, a.xq,
                                  static_cast<const float2*>(a.xds), r0, c, lane, acc);
}

__device__ __forceinline__ void issue_unit(uint8_t* stage, const Item& it, const Cursor& c, int lane) {
  const int64_t r0 = static_cast<int64_t>(c.g) * kRows;
  const int ch = c.ch;
  if (it.type == static_cast<int>(DType::Q6_K)) {
    issue_t<DType::Q6_K>(stage, it.a, r0, ch, lane);
  } else {
    issue_t<DType::Q4_K>(stage, it.a, r0, ch, lane);
  }
}

// Row `lane` of the unit at c pulled into L2 (16-byte aligned span around its chunk bytes).
__device__ __forceinline__ void l2_prefetch_unit(const Item& it, const Cursor& c, int lane) {
  const int64_t row = static_cast<int64_t>(c.g) * kRows + lane;
  if (row >= it.a.n_rows) return;
  const int bb = ds::cuda::qdec::traits(static_cast<DType>(it.type)).block_bytes;
  const int cb = kern::kQ8ChunkElems / 256 * bb;
  const int64_t left = (it.a.k - static_cast<int64_t>(c.ch) * kern::kQ8ChunkElems) / 256 * bb;
  const uintptr_t src = reinterpret_cast<uintptr_t>(it.a.w) + row * it.a.w_stride + static_cast<int64_t>(c.ch) * cb;
  const uintptr_t a0 = src & ~uintptr_t{15};
  const uint32_t bytes = static_cast<uint32_t>((src + (left < cb ? left : cb) - a0 + 15) & ~uintptr_t{15});
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a0), "r"(bytes) : "memory");
}

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// The CTA-balanced product kernel (see the header); n products in sequence, a grid-wide barrier on
// `counter` (zero at launch) between consecutive ones. Dynamic shared memory: the rings, then
// part_cap units x kRows partial sums.
// kReadOnly: stream the weights without the products (the ring's ceiling); kNoBarrier: no grid barrier
// between products (as if independent); kL2Ahead: when a warp moves on to the next product, it pulls
// the kL2Ahead units past its ring into L2 (cp.async.bulk.prefetch.L2), so the weights flow while its
// CTA waits at the barrier.
template <int kWarps, int kStages, bool kReadOnly = false, bool kNoBarrier = false, int kL2Ahead = 0>
__global__ void __launch_bounds__(32 * kWarps, 1)
    chain_kernel(const Item* items, int n, unsigned* counter, int part_cap) {
  extern __shared__ __align__(16) uint8_t smem[];
  float* part = reinterpret_cast<float*>(smem + kWarps * kStages * kRows * kRowBytesMax);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint8_t* ring = smem + warp * kStages * kRows * kRowBytesMax;
  auto stage_of = [&](int64_t i) { return ring + (i % kStages) * kRows * kRowBytesMax; };

  Cursor ic{0, 0, 0, 0, 0, 1}, cc{0, 0, 0, 0, 0, 1};
  cursor_load(ic, items, n, warp, kWarps);
  cc = ic;
  for (int s = 0; s < kStages - 1; ++s) {
    if (ic.p < n) {
      issue_unit(stage_of(s), items[ic.p], ic, lane);
      cursor_next(ic, items, n, warp, kWarps);
    }
    kern::cp_async_commit();
  }
  kern::dependency_wait();
  kern::allow_dependents();

  float acc[kRows][1] = {};
  int done = 0;  // products this CTA has finished
  for (int64_t i = 0;; ++i) {
    while (done < cc.p && done < n) {  // every warp is past product `done`: combine its sums, then barrier
      __syncthreads();
      const Item& it = items[done];
      const int64_t groups = (it.a.n_rows + kRows - 1) / kRows;
      const int64_t g0 = groups * blockIdx.x / gridDim.x, g1 = groups * (blockIdx.x + 1) / gridDim.x;
      const int nc = static_cast<int>((it.a.k + kern::kQ8ChunkElems - 1) / kern::kQ8ChunkElems);
      for (int64_t j = threadIdx.x; j < (g1 - g0) * kRows; j += blockDim.x) {
        const int64_t gl = j / kRows, row = (g0 + gl) * kRows + j % kRows;
        float s = 0.0f;
        for (int c = 0; c < nc; ++c) s += part[(gl * nc + c) * kRows + j % kRows];
        if (row < it.a.n_rows) it.a.y[row] = s;
      }
      __syncthreads();
      if (done + 1 < n) {
        if (threadIdx.x == 0 && !kNoBarrier) {
          __threadfence();
          atomicAdd(counter, 1u);
          const unsigned target = static_cast<unsigned>(done + 1) * gridDim.x;
          while (ld_acquire(counter) < target) {
          }
        }
        __syncthreads();
      }
      ++done;
    }
    if (cc.p >= n) break;
    if (ic.p < n) {
      issue_unit(stage_of(i + kStages - 1), items[ic.p], ic, lane);
      cursor_next(ic, items, n, warp, kWarps);
    }
    kern::cp_async_commit();
    kern::cp_async_wait<kStages - 1>();
    __syncwarp();
    const Item& it = items[cc.p];
    const int64_t r0 = static_cast<int64_t>(cc.g) * kRows;
    const int ch = cc.ch;
    if constexpr (kReadOnly) {  // the streaming alone: one word of the staged rows per lane
      acc[0][0] += __int_as_float(*reinterpret_cast<const int*>(stage_of(i) + 4 * lane) & 0x3F800000);
    } else if (it.type == static_cast<int>(DType::Q6_K)) {
      dot_t<DType::Q6_K>(stage_of(i), it.a, r0, ch, lane, acc);
    } else {
      dot_t<DType::Q4_K>(stage_of(i), it.a, r0, ch, lane, acc);
    }
    const bool flush = ch == cc.n_chunks - 1 || cc.u + 1 == cc.u1;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float s = flush ? kern::warp_sum(acc[r][0]) : 0.0f;
      if (lane == 0 && cc.u < part_cap) part[cc.u * kRows + r] = s;
      if (flush) acc[r][0] = 0.0f;
    }
    __syncwarp();
    const int was = cc.p;
    cursor_next(cc, items, n, warp, kWarps);
    if (kL2Ahead > 0 && cc.p != was && lane < kRows) {
      Cursor pc = ic;
      for (int d = 0; d < kL2Ahead && pc.p < n; ++d) {
        l2_prefetch_unit(items[pc.p], pc, lane);
        cursor_next(pc, items, n, warp, kWarps);
      }
    }
  }
}

// ---- host ----

struct Product {
  const char* name;
  DType t;
  int64_t rows, k;
  uint8_t* w = nullptr;
  float* y[3] = {nullptr, nullptr, nullptr};
};

struct Act {
  int8_t* q = nullptr;
  float2* ds = nullptr;
};

Act make_act(int64_t k, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<int8_t> q(k);
  std::vector<float> ds(k / 16);
  for (int64_t b = 0; b < k / 32; ++b) {
    float v[32], amax = 0.0f;
    for (float& x : v) amax = std::max(amax, std::fabs(x = nd(rng)));
    const float d = amax / 127.0f;
    int sum = 0;
    for (int i = 0; i < 32; ++i) sum += q[32 * b + i] = static_cast<int8_t>(std::nearbyint(v[i] / d));
    ds[2 * b] = d;
    ds[2 * b + 1] = d * static_cast<float>(sum);
  }
  Act a;
  CK(cudaMalloc(&a.q, kern::q8_act_bytes(k, 1)));
  a.ds = reinterpret_cast<float2*>(reinterpret_cast<uint8_t*>(a.q) + kern::q8_ds_offset(k, 1));
  CK(cudaMemcpy(a.q, q.data(), k, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(a.ds, ds.data(), ds.size() * sizeof(float), cudaMemcpyHostToDevice));
  return a;
}

uint8_t* make_weights(DType t, int64_t rows, int64_t k, std::mt19937& rng) {
  const int64_t rb = dtype_row_bytes(t, k), bb = dtype_block_bytes(t);
  std::vector<uint8_t> h(static_cast<size_t>(rows) * rb);
  for (size_t i = 0; i + 4 <= h.size(); i += 4) {
    const uint32_t v = rng();
    std::memcpy(h.data() + i, &v, 4);
  }
  std::uniform_real_distribution<float> sd(0.001f, 0.01f);
  for (size_t blk = 0; blk < h.size() / bb; ++blk) {
    uint8_t* p = h.data() + blk * bb;
    const uint16_t d = f32_to_fp16(sd(rng)), dm = f32_to_fp16(sd(rng));
    if (t == DType::Q6_K) {
      std::memcpy(p + 208, &d, 2);
    } else {
      std::memcpy(p, &d, 2);
      std::memcpy(p + 2, &dm, 2);
    }
  }
  uint8_t* w = nullptr;
  CK(cudaMalloc(&w, h.size()));
  CK(cudaMemcpy(w, h.data(), h.size(), cudaMemcpyHostToDevice));
  return w;
}

int g_sms = 0;

template <int kWarps, int kStages>
void run_chain_variant(const char* label, std::vector<Product>& prods, Item* d_items_split, Item* d_items_all,
                       unsigned* counter, int part_cap, cudaStream_t s, int reps, double bytes, double bw,
                       const std::function<void(const std::string&)>& check) {
  auto kernel = chain_kernel<kWarps, kStages>;
  const size_t smem =
      static_cast<size_t>(kWarps) * kStages * kRows * kRowBytesMax + static_cast<size_t>(part_cap) * kRows * 4;
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const int n = static_cast<int>(prods.size());
  const float ms_split = graph_median_ms(
      s,
      [&] {
        for (int p = 0; p < n; ++p)
          CK(ds::cuda::launch_kernel(kernel, dim3(g_sms), dim3(32 * kWarps), smem, s, d_items_split + p, 1, counter,
                                     part_cap));
      },
      reps);
  std::printf("%-22s %9.3f ms  %7.1f GB/s  %5.1f%% of flat\n", (std::string("split ") + label).c_str(), ms_split,
              bytes / ms_split / 1e6, 100.0 * bytes / ms_split / 1e6 / bw);
  const float ms_chain = graph_median_ms(
      s,
      [&] {
        CK(cudaMemsetAsync(counter, 0, sizeof(unsigned), s));
        CK(ds::cuda::launch_kernel(kernel, dim3(g_sms), dim3(32 * kWarps), smem, s, d_items_all, n, counter, part_cap));
      },
      reps);
  std::printf("%-22s %9.3f ms  %7.1f GB/s  %5.1f%% of flat\n", (std::string("chain ") + label).c_str(), ms_chain,
              bytes / ms_chain / 1e6, 100.0 * bytes / ms_chain / 1e6 / bw);
  check(std::string("chain ") + label);
  auto other = [&](auto rk, const char* what) {
    CK(cudaFuncSetAttribute(rk, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    const float ms_x = graph_median_ms(
        s,
        [&] {
          CK(cudaMemsetAsync(counter, 0, sizeof(unsigned), s));
          CK(ds::cuda::launch_kernel(rk, dim3(g_sms), dim3(32 * kWarps), smem, s, d_items_all, n, counter, part_cap));
        },
        reps);
    std::printf("%-22s %9.3f ms  %7.1f GB/s  %5.1f%% of flat\n", (std::string(what) + " " + label).c_str(), ms_x,
                bytes / ms_x / 1e6, 100.0 * bytes / ms_x / 1e6 / bw);
    if (std::string(what).rfind("read", 0) != 0) check(std::string(what) + " " + label);
  };
  other(chain_kernel<kWarps, kStages, false, false, 4>, "chain+L2 4");
  other(chain_kernel<kWarps, kStages, false, false, 8>, "chain+L2 8");
  other(chain_kernel<kWarps, kStages, false, true, 0>, "chain-nobar");
  other(chain_kernel<kWarps, kStages, true, false, 0>, "read");
  other(chain_kernel<kWarps, kStages, true, true, 0>, "read-nobar");
  other(chain_kernel<kWarps, kStages, true, false, 8>, "read+L2 8");
}

}  // namespace

int main(int argc, char** argv) {
  // scripts/gpu-check passes a .tsv path as the first argument: only a positive number counts as layers.
  const bool numeric = argc > 1 && std::atoi(argv[1]) > 0;
  const int layers = numeric ? std::atoi(argv[1]) : 8;
  const char* dump = numeric && argc > 2 ? argv[2] : nullptr;
  int dev = 0;
  CK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  g_sms = prop.multiProcessorCount;
  std::printf("%s, %d SMs, %d layers\n", prop.name, g_sms, layers);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  // Streaming read bandwidth, measured in this run (2 GiB, as ops/cuda/membw.cu).
  double bw = 0.0;
  {
    const int64_t n16 = (int64_t{2} << 30) / 16;
    uint4* buf = nullptr;
    unsigned* sink = nullptr;
    CK(cudaMalloc(&buf, n16 * 16));
    CK(cudaMalloc(&sink, 4));
    CK(cudaMemset(buf, 1, n16 * 16));
    const float ms = graph_median_ms(
        s, [&] { flat_read<<<g_sms * 4, 512, 0, s>>>(buf, n16, sink); }, 10);
    bw = static_cast<double>(n16) * 16 / ms / 1e6;
    std::printf("flat read: %.1f GB/s\n", bw);
    CK(cudaFree(buf));
  }

  std::mt19937 rng(42);
  const Act act5120 = make_act(5120, rng), act6144 = make_act(6144, rng), act17408 = make_act(17408, rng);
  auto act_for = [&](int64_t k) -> const Act& { return k == 5120 ? act5120 : k == 6144 ? act6144 : act17408; };
  std::vector<Product> prods;
  for (int l = 0; l < layers; ++l) {
    const DType big = l % 2 == 0 ? DType::Q6_K : DType::Q4_K;
    prods.push_back({"qkv", big, 10240, 5120});
    prods.push_back({"z+ba", DType::Q4_K, 6240, 5120});
    prods.push_back({"out", DType::Q4_K, 5120, 6144});
    prods.push_back({"gate+up", DType::Q4_K, 34816, 5120});
    prods.push_back({"down", big, 5120, 17408});
  }
  double bytes = 0.0;
  int part_cap = 0;
  std::vector<Item> items;
  for (auto& p : prods) {
    p.w = make_weights(p.t, p.rows, p.k, rng);
    for (auto& y : p.y) CK(cudaMalloc(&y, p.rows * sizeof(float)));
    bytes += static_cast<double>(p.rows) * dtype_row_bytes(p.t, p.k);
    const Act& a = act_for(p.k);
    items.push_back(
        {kern::q8_args(p.w, dtype_row_bytes(p.t, p.k), a.q, p.k, 1, p.y[1], p.rows, p.rows, 1), static_cast<int>(p.t)});
    const int64_t groups = (p.rows + kRows - 1) / kRows;
    const int64_t units = (groups + g_sms - 1) / g_sms * ((p.k + 1023) / 1024);
    part_cap = std::max(part_cap, static_cast<int>(units));
  }
  std::printf("%zu products, %.1f MB of weights\n", prods.size(), bytes / 1e6);
  Item* d_split = nullptr;
  Item* d_all = nullptr;
  unsigned* counter = nullptr;
  CK(cudaMalloc(&d_split, items.size() * sizeof(Item)));
  CK(cudaMalloc(&d_all, items.size() * sizeof(Item)));
  CK(cudaMalloc(&counter, sizeof(unsigned)));
  CK(cudaMemcpy(d_split, items.data(), items.size() * sizeof(Item), cudaMemcpyHostToDevice));
  for (size_t i = 0; i < items.size(); ++i) items[i].a.y = prods[i].y[2];
  CK(cudaMemcpy(d_all, items.data(), items.size() * sizeof(Item), cudaMemcpyHostToDevice));

  const int reps = 20;
  auto launch_args = [&](const Product& p) {  // one token into y[0], on the product's activations
    ds::cuda::MatvecLaunch l{p.w, dtype_row_bytes(p.t, p.k), nullptr, p.k, p.y[0], p.rows, p.rows, p.k, 1};
    l.act = act_for(p.k).q;
    l.act_bytes = kern::q8_act_bytes(p.k, 1);
    return l;
  };
  auto launch_production = [&](const Product& p) {  // the version matvec_q8_pick_version picks
    CK(ds::cuda::matvec_q8_product_launch(p.t, launch_args(p), s));
  };
  // The graph of products ps[i], i in idx, launched as production does: median ms.
  auto time_production = [&](const std::vector<Product>& ps, const std::vector<size_t>& idx) {
    return graph_median_ms(
        s,
        [&] {
          for (size_t i : idx) launch_production(ps[i]);
        },
        reps);
  };
  const float ms_prod = graph_median_ms(
      s,
      [&] {
        for (const auto& p : prods) launch_production(p);
      },
      reps);
  std::printf("%-22s %9.3f ms  %7.1f GB/s  %5.1f%% of flat\n", "prod (production pick)", ms_prod, bytes / ms_prod / 1e6,
              100.0 * bytes / ms_prod / 1e6 / bw);

  if (dump != nullptr) {  // the production outputs, for a bit-for-bit comparison between builds
    FILE* f = std::fopen(dump, "wb");
    if (f == nullptr) {
      std::fprintf(stderr, "cannot write %s\n", dump);
      return 1;
    }
    for (auto& p : prods) {
      std::vector<float> y(p.rows);
      CK(cudaMemcpy(y.data(), p.y[0], p.rows * 4, cudaMemcpyDeviceToHost));
      std::fwrite(y.data(), 4, y.size(), f);
    }
    std::fclose(f);
  }
  bool failed = false;
  auto check = [&](const std::string& label) {
    int bad = 0;
    for (auto& p : prods) {
      std::vector<float> y0(p.rows), y1(p.rows), y2(p.rows);
      CK(cudaMemcpy(y0.data(), p.y[0], p.rows * 4, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(y1.data(), p.y[1], p.rows * 4, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(y2.data(), p.y[2], p.rows * 4, cudaMemcpyDeviceToHost));
      float ymax = 0.0f, e1 = 0.0f, e2 = 0.0f;
      for (int64_t r = 0; r < p.rows; ++r) {
        ymax = std::max(ymax, std::fabs(y0[r]));
        e1 = std::max(e1, std::fabs(y1[r] - y0[r]));
        e2 = std::max(e2, std::fabs(y2[r] - y0[r]));
      }
      if (!(e1 <= 1e-4f * ymax) || !(e2 <= 1e-4f * ymax) || !(ymax > 0.0f)) {
        if (bad++ < 5)
          std::printf("FAIL %s %s %s: |y| %.3g, split err %.3g, chain err %.3g\n", label.c_str(), p.name,
                      p.t == DType::Q6_K ? "q6_K" : "q4_K", ymax, e1, e2);
      }
    }
    std::printf("check %s: %s\n", label.c_str(), bad == 0 ? "ok" : "FAILED");
    failed = failed || bad != 0;
  };

  auto reset = [&] {
    for (auto& p : prods) {
      CK(cudaMemset(p.y[1], 0xFF, p.rows * 4));
      CK(cudaMemset(p.y[2], 0xFF, p.rows * 4));
    }
  };
  reset();
  run_chain_variant<16, 3>("w16 s3", prods, d_split, d_all, counter, part_cap, s, reps, bytes, bw, check);
  reset();
  run_chain_variant<14, 4>("w14 s4", prods, d_split, d_all, counter, part_cap, s, reps, bytes, bw, check);
  reset();
  run_chain_variant<20, 3>("w20 s3", prods, d_split, d_all, counter, part_cap, s, reps, bytes, bw, check);
  reset();
  run_chain_variant<12, 5>("w12 s5", prods, d_split, d_all, counter, part_cap, s, reps, bytes, bw, check);
  // Per product kind, one launch each: where the balanced split wins alone.
  {
    constexpr int kW = 16, kS = 3;
    auto kernel = chain_kernel<kW, kS>;
    const size_t smem = static_cast<size_t>(kW) * kS * kRows * kRowBytesMax + static_cast<size_t>(part_cap) * kRows * 4;
    std::printf("%-10s %-5s %10s %10s %8s %8s\n", "kind", "type", "prod us", "split us", "prod %", "split %");
    for (size_t kind = 0; kind < 5; ++kind) {
      for (int tt = 0; tt < 2; ++tt) {
        const DType t = tt == 0 ? DType::Q4_K : DType::Q6_K;
        std::vector<size_t> idx;
        double kb = 0.0;
        for (size_t i = kind; i < prods.size(); i += 5) {
          if (prods[i].t == t) {
            idx.push_back(i);
            kb += static_cast<double>(prods[i].rows) * dtype_row_bytes(t, prods[i].k);
          }
        }
        if (idx.empty()) continue;
        const float mp = time_production(prods, idx);
        const float ms = graph_median_ms(
            s,
            [&] {
              for (size_t i : idx)
                CK(ds::cuda::launch_kernel(kernel, dim3(g_sms), dim3(32 * kW), smem, s, d_split + i, 1, counter,
                                           part_cap));
            },
            reps);
        const double n = static_cast<double>(idx.size());
        std::printf("%-10s %-5s %10.2f %10.2f %7.1f%% %7.1f%%\n", prods[kind].name, tt == 0 ? "q4_K" : "q6_K",
                    1e3 * mp / n, 1e3 * ms / n, 100.0 * kb / mp / 1e6 / bw, 100.0 * kb / ms / 1e6 / bw);
      }
    }
  }
  // The same chain with the Q6_K weights in the device layout Q6_K_G4 (what the model upload makes of
  // them): the production pick on the regrouped bytes, whole chain and per kind. The one-token product
  // decodes both layouts to the same codes and scales, so the outputs must be equal bit for bit.
  {
    std::vector<Product> g4 = prods;
    double g4_bytes = 0.0;
    for (auto& p : g4) {
      if (p.t == DType::Q6_K) {
        const int64_t src = dtype_row_bytes(DType::Q6_K, p.k), dst = dtype_row_bytes(DType::Q6_K_G4, p.k);
        std::vector<uint8_t> h(static_cast<size_t>(src * p.rows)), r(static_cast<size_t>(dst * p.rows));
        CK(cudaMemcpy(h.data(), p.w, h.size(), cudaMemcpyDeviceToHost));
        for (int64_t i = 0; i < p.rows; ++i) ds::quant::q6_k_to_g4(h.data() + i * src, r.data() + i * dst, p.k);
        p.t = DType::Q6_K_G4;
        CK(cudaMalloc(&p.w, r.size()));
        CK(cudaMemcpy(p.w, r.data(), r.size(), cudaMemcpyHostToDevice));
        CK(cudaMalloc(&p.y[0], p.rows * sizeof(float)));
      }
      g4_bytes += static_cast<double>(p.rows) * dtype_row_bytes(p.t, p.k);
    }
    const float ms_g4 = graph_median_ms(
        s,
        [&] {
          for (const auto& p : g4) launch_production(p);
        },
        reps);
    std::printf("%-22s %9.3f ms  %7.1f GB/s  %5.1f%% of flat (%.1f MB)\n", "prod, Q6_K as q6_K_g4", ms_g4,
                g4_bytes / ms_g4 / 1e6, 100.0 * g4_bytes / ms_g4 / 1e6 / bw, g4_bytes / 1e6);
    // And each q6_K_g4 qkv with the z+ba after it in one launch (matvec_q8_pair, as matmul_many runs them).
    const float ms_pair = graph_median_ms(
        s,
        [&] {
          for (size_t i = 0; i < g4.size(); ++i) {
            const Product& p = g4[i];
            const Product* q = i + 1 < g4.size() ? &g4[i + 1] : nullptr;
            if (q != nullptr && ds::cuda::matvec_q8_pair_applies(p.t, launch_args(p), q->t, launch_args(*q))) {
              CK(ds::cuda::matvec_q8_pair_launch(p.t, launch_args(p), q->t, launch_args(*q), s));
              ++i;
            } else {
              launch_production(p);
            }
          }
        },
        reps);
    std::printf("%-22s %9.3f ms  %7.1f GB/s  %5.1f%% of flat\n", "prod, g4, qkv+z paired", ms_pair,
                g4_bytes / ms_pair / 1e6, 100.0 * g4_bytes / ms_pair / 1e6 / bw);
    for (const auto& p : prods) launch_production(p);
    CK(cudaStreamSynchronize(s));
    int differ = 0;
    for (size_t i = 0; i < prods.size(); ++i) {
      std::vector<float> a(prods[i].rows), b(prods[i].rows);
      CK(cudaMemcpy(a.data(), prods[i].y[0], a.size() * 4, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(b.data(), g4[i].y[0], b.size() * 4, cudaMemcpyDeviceToHost));
      differ += std::memcmp(a.data(), b.data(), a.size() * 4) != 0;
    }
    std::printf("check q6_K_g4 outputs equal q6_K bit for bit: %s\n", differ == 0 ? "ok" : "FAILED");
    failed = failed || differ != 0;
    std::printf("%-10s %12s %12s %8s %8s\n", "kind", "q6_K us", "q6_K_g4 us", "q6_K %", "g4 %");
    for (size_t kind = 0; kind < 5; ++kind) {
      std::vector<size_t> idx;
      double b6 = 0.0, b4 = 0.0;
      for (size_t i = kind; i < prods.size(); i += 5) {
        if (prods[i].t != DType::Q6_K) continue;
        idx.push_back(i);
        b6 += static_cast<double>(prods[i].rows) * dtype_row_bytes(DType::Q6_K, prods[i].k);
        b4 += static_cast<double>(prods[i].rows) * dtype_row_bytes(DType::Q6_K_G4, prods[i].k);
      }
      if (idx.empty()) continue;
      const float m6 = time_production(prods, idx), m4 = time_production(g4, idx);
      const double n = static_cast<double>(idx.size());
      std::printf("%-10s %12.2f %12.2f %7.1f%% %7.1f%%\n", prods[kind].name, 1e3 * m6 / n, 1e3 * m4 / n,
                  100.0 * b6 / m6 / 1e6 / bw, 100.0 * b4 / m4 / 1e6 / bw);
    }
  }
  std::printf("byte limit at the flat rate: %.3f ms\n", bytes / bw / 1e6);
  return failed ? 1 : 0;
}
