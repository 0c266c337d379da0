// Workbench: causal GQA attention over the paged KV cache (ops/cuda/attention.cu), checked against a
// CPU reference (double precision, plain softmax) and timed against the measured streaming-read
// bandwidth (decode) or as TFLOP/s (prefill, counting 4 * n * n_kv * D * H / 2 FLOPs for the causal half).
// Build (after the CMake build in build-gpu, for the production kernels in libdeltaserve_cuda; as
// scripts/gpu-check builds it):
//   nvcc -std=c++17 -O3 -arch=sm_90 --expt-relaxed-constexpr -Isrc -I.deps/include -DFMT_HEADER_ONLY=1 \
//     kernels/attention_bench.cu build-gpu/libdeltaserve_lib.a build-gpu/libdeltaserve_cuda.a -lcublas \
//     -o build-gpu/attention_bench
// Run: build-gpu/attention_bench [--kv f16|q8_0|q4_0] [--layer N] [out.tsv]   (about 10-20 s; --kv q8_0 / q4_0:
//      the Q8_0 or Q4_0 cache, timings only, no check against the reference but the layer decode's
//      fused-against-chain bits, no v1; --layer N: only the layer decode at N positions, for a profiler)
// Versions:
//   v1 simple: the first production kernel: one CTA per (head, token), its 8 warps stride over the
//              visible positions with their own online softmax, merged at the end; every query head
//              re-reads its KV head (no GQA sharing, no split over CTAs). Here with F16 KV.
//   simt:      production SIMT kernel: CTA per (8 packed (token, head-in-group) rows, KV head, split),
//              warps stride positions, F32 FMA; split partials merged by a combine kernel.
//   tc:        production tensor-core kernel: same decomposition with 16/32/64 rows per CTA, K/V tiles
//              of 64 positions double-buffered by cp.async, mma.sync m16n8k16 for Q K^T and P V.
// Shape: Qwen3.5 27B full-attention layer: head_dim 256, 24 query heads over 4 KV heads, F16 KV in
// chunks of 64 positions. Decode at 4K and 32K positions (also with a 32K graph bound at 4K), prefill
// of 4096 tokens from position 0. Layer decode: attention_prep, the gated split kernel and its combine
// (the chain) against the fused decode kernel, at 64 and 200 positions under a bound of 256 (one CTA per
// query row), and at 64, 1000, 4096 and 32768 positions.
// Non-obvious choice: timed runs rotate over enough copies of the KV to exceed 4x the L2 size, and each
// timing replays a CUDA graph of many launches, so the numbers are device time from memory, not
// launch overhead or L2 hits.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/half.h"
#include "ops/cuda/attention_launch.h"
#include "ops/cuda/matvec_launch.h"
#include "workbench.cuh"

using namespace ds;
using ds::cuda::AttnPagedArgs;
using ds::cuda::AttnPath;
using ds::cuda::AttnPlan;


namespace {

constexpr int kD = 256, kH = 24, kHkv = 4, kChunk = 64;
FILE* g_tsv = nullptr;
bool g_fail = false;
DType g_kv = DType::F16;  // --kv q8_0 / q4_0: Q8_0 or Q4_0 blocks

// Bytes of one head's row of the cache.
int64_t kv_row_bytes() { return dtype_row_bytes(g_kv, kD); }

// ---- v1: the first production kernel, with F16 KV ----
constexpr int kV1Warps = 8;
constexpr int kV1PerLane = kD / 32;

__global__ void __launch_bounds__(32 * kV1Warps)
v1_kernel(const float* q, const uint8_t* const* k_base, int64_t k_off, int64_t v_off, int chunk, float* o,
          int n_head, int n_head_kv, const int32_t* d_pos, float scale) {
  __shared__ float qs[kD];
  __shared__ float part_m[kV1Warps], part_l[kV1Warps];
  __shared__ float part_o[kV1Warps][kD];
  const int h = blockIdx.x, t = blockIdx.y;
  const int g = h / (n_head / n_head_kv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float* qr = q + (static_cast<int64_t>(t) * n_head + h) * kD;
  for (int d = threadIdx.x; d < kD; d += blockDim.x) qs[d] = qr[d] * scale;
  __syncthreads();
  float m = -INFINITY, l = 0.0f, acc[kV1PerLane];
#pragma unroll
  for (int i = 0; i < kV1PerLane; ++i) acc[i] = 0.0f;
  const int n_visible = *d_pos + t + 1;
  for (int j = warp; j < n_visible; j += kV1Warps) {
    const int c = j / chunk, r = j % chunk;
    const int64_t row = (static_cast<int64_t>(r) * n_head_kv + g) * kD;
    const __half* kr = reinterpret_cast<const __half*>(k_base[c] + k_off) + row;
    const __half* vr = reinterpret_cast<const __half*>(k_base[c] + v_off) + row;
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < kV1PerLane; ++i) s = fmaf(qs[lane + 32 * i], __half2float(kr[lane + 32 * i]), s);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xFFFFFFFFu, s, off);
    const float m_new = fmaxf(m, s);
    const float corr = __expf(m - m_new), p = __expf(s - m_new);
    l = l * corr + p;
#pragma unroll
    for (int i = 0; i < kV1PerLane; ++i) acc[i] = fmaf(p, __half2float(vr[lane + 32 * i]), acc[i] * corr);
    m = m_new;
  }
  if (lane == 0) {
    part_m[warp] = m;
    part_l[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kV1PerLane; ++i) part_o[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  float m_all = -INFINITY;
  for (int w = 0; w < kV1Warps; ++w) m_all = fmaxf(m_all, part_m[w]);
  float l_all = 0.0f;
  for (int w = 0; w < kV1Warps; ++w) {
    if (part_l[w] > 0.0f) l_all += part_l[w] * __expf(part_m[w] - m_all);
  }
  float* orow = o + (static_cast<int64_t>(t) * n_head + h) * kD;
  for (int d = threadIdx.x; d < kD; d += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < kV1Warps; ++w) {
      if (part_l[w] > 0.0f) sum += part_o[w][d] * __expf(part_m[w] - m_all);
    }
    orow[d] = sum / l_all;
  }
}

// ---- data (the read bandwidth: workbench.cuh measure_read_gbs) ----
__global__ void fill_random_half(__half* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 0x9E3779B1u ^ seed ^ static_cast<uint32_t>(i >> 32) * 0x85EBCA77u;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    p[i] = __float2half_rn(static_cast<float>(h & 0xFFFF) / 32768.0f - 1.0f);
  }
}

__global__ void fill_random_float(float* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 0x9E3779B1u ^ seed;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    p[i] = static_cast<float>(h & 0xFFFF) / 16384.0f - 2.0f;
  }
}

// Q8_0 (Q4_0) blocks of bb = 34 (18) bytes: the scale 1/64, random codes.
__global__ void fill_random_blocks(uint8_t* p, int64_t n_blocks, int bb, uint32_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n_blocks * bb;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 0x9E3779B1u ^ seed;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    const int64_t b = i % bb;
    p[i] = b == 0 ? 0x00 : b == 1 ? 0x24 : static_cast<uint8_t>(h);  // fp16 0x2400 = 1/64, little-endian
  }
}

// One copy of a layer's KV for n_kv positions: chunk c in slot c of one allocation (K then V per slot),
// and the device slot array.
struct KvCopy {
  uint8_t* slots = nullptr;
  const uint8_t** d_base = nullptr;
  int64_t n_chunks = 0;
  static int64_t per() { return int64_t{kChunk} * kHkv * kv_row_bytes(); }  // bytes of K (or V) per chunk
};

KvCopy make_copy(int64_t n_kv, uint32_t seed) {
  KvCopy c;
  c.n_chunks = (n_kv + kChunk - 1) / kChunk;
  CK(cudaMalloc(&c.slots, c.n_chunks * 2 * KvCopy::per()));
  if (g_kv != DType::F16) {
    const int bb = static_cast<int>(dtype_block_bytes(g_kv));
    fill_random_blocks<<<1024, 256>>>(c.slots, c.n_chunks * 2 * KvCopy::per() / bb, bb, seed);
  } else {
    fill_random_half<<<1024, 256>>>(reinterpret_cast<__half*>(c.slots), c.n_chunks * KvCopy::per(), seed);
  }
  CK(cudaGetLastError());
  std::vector<const uint8_t*> base(static_cast<size_t>(c.n_chunks));
  for (int64_t i = 0; i < c.n_chunks; ++i) base[i] = c.slots + i * 2 * KvCopy::per();
  CK(cudaMalloc(&c.d_base, 8 * c.n_chunks));
  CK(cudaMemcpy(c.d_base, base.data(), 8 * c.n_chunks, cudaMemcpyHostToDevice));
  return c;
}

void free_copy(KvCopy& c) {
  CK(cudaFree(c.slots));
  CK(cudaFree(c.d_base));
}

AttnPagedArgs args_for(const KvCopy& c, const float* q, float* o, int n_tokens, const int32_t* d_pos, int64_t max_kv) {
  AttnPagedArgs a;
  a.q = q;
  a.o = o;
  a.kv.k_base = a.kv.v_base = c.d_base;
  a.kv.k_offset = 0;
  a.kv.v_offset = KvCopy::per();
  a.kv.dtype = g_kv;
  a.kv.chunk_tokens = kChunk;
  a.kv.n_head_kv = kHkv;
  a.kv.head_dim = kD;
  a.n_head = kH;
  a.n_tokens = n_tokens;
  a.d_pos = d_pos;
  a.max_kv = max_kv;
  a.scale = 1.0f / std::sqrt(static_cast<float>(kD));
  return a;
}

// A launcher of one version for (copy, q, o, n_tokens, d_pos, max_kv); scratch reused across copies.
struct Version {
  const char* name;
  AttnPath path;  // kAuto = v1
};
const Version kVersions[] = {{"v1", AttnPath::kAuto}, {"simt", AttnPath::kSimt}, {"tc", AttnPath::kTensorCore}};

struct Runner {
  float* scratch = nullptr;
  int64_t scratch_bytes = 0;
  void launch(const Version& v, const KvCopy& c, const float* q, float* o, int n_tokens, const int32_t* d_pos,
              int64_t max_kv, cudaStream_t s, AttnPlan* plan_out = nullptr) {
    AttnPagedArgs a = args_for(c, q, o, n_tokens, d_pos, max_kv);
    if (v.path == AttnPath::kAuto) {
      v1_kernel<<<dim3(kH, n_tokens), 32 * kV1Warps, 0, s>>>(q, c.d_base, 0, KvCopy::per(), kChunk, o, kH, kHkv,
                                                             d_pos, a.scale);
      CK(cudaGetLastError());
      return;
    }
    AttnPlan plan;
    CK(cuda::attention_paged_plan(a, v.path, 0, &plan));
    if (plan.scratch_bytes > scratch_bytes) {
      CK(cudaDeviceSynchronize());
      if (scratch) CK(cudaFree(scratch));
      CK(cudaMalloc(&scratch, plan.scratch_bytes));
      scratch_bytes = plan.scratch_bytes;
    }
    a.scratch = scratch;
    CK(cuda::attention_paged_launch(a, plan, s));
    if (plan_out) *plan_out = plan;
  }
};

// ---- CPU reference: o = softmax(scale q k^T) v over positions <= pos0 + t, in double; one thread
// per query head ----
void reference(const std::vector<uint16_t>& kv, const std::vector<float>& q, int pos0, int n, std::vector<float>& o) {
  const int G = kH / kHkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(kD));
  auto at = [&](int j, int g, int d, bool v) {  // chunk j / kChunk: K then V, each [kChunk, kHkv, kD]
    const int64_t i = (static_cast<int64_t>(j / kChunk) * 2 + (v ? 1 : 0)) * (KvCopy::per() / 2) +
                      (static_cast<int64_t>(j % kChunk) * kHkv + g) * kD + d;
    return static_cast<double>(fp16_to_f32(kv[static_cast<size_t>(i)]));
  };
  std::vector<std::thread> threads;
  for (int h = 0; h < kH; ++h) {
    threads.emplace_back([&, h] {
      const int g = h / G;
      std::vector<double> p;
      for (int t = 0; t < n; ++t) {
        const float* qr = q.data() + (static_cast<int64_t>(t) * kH + h) * kD;
        const int n_vis = pos0 + t + 1;
        p.assign(static_cast<size_t>(n_vis), 0.0);
        double mx = -INFINITY, sum = 0.0;
        for (int j = 0; j < n_vis; ++j) {
          double s = 0.0;
          for (int d = 0; d < kD; ++d) s += qr[d] * at(j, g, d, false);
          p[j] = s * scale;
          mx = std::max(mx, p[j]);
        }
        for (int j = 0; j < n_vis; ++j) sum += (p[j] = std::exp(p[j] - mx));
        for (int d = 0; d < kD; ++d) {
          double acc = 0.0;
          for (int j = 0; j < n_vis; ++j) acc += p[j] * at(j, g, d, true);
          o[(static_cast<int64_t>(t) * kH + h) * kD + d] = static_cast<float>(acc / sum);
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
}

// ---- correctness of every version against the reference ----
void check_versions(Runner& run, cudaStream_t s) {
  for (auto [pos0, n] : {std::pair<int, int>{1000, 1}, {1000, 7}, {200, 100}}) {
    const int64_t n_kv = pos0 + n;
    KvCopy c = make_copy(n_kv, 77u + pos0);
    std::vector<uint16_t> host(static_cast<size_t>(c.n_chunks * 2 * KvCopy::per() / 2));
    CK(cudaMemcpy(host.data(), c.slots, 2 * host.size(), cudaMemcpyDeviceToHost));
    std::vector<float> q(static_cast<size_t>(kD) * kH * n), ref(q.size()), got(q.size());
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> u(-3.0f, 3.0f);
    for (float& x : q) x = u(rng);
    reference(host, q, pos0, n, ref);
    float *dq, *dout;
    int32_t* d_pos;
    CK(cudaMalloc(&dq, 4 * q.size()));
    CK(cudaMalloc(&dout, 4 * q.size()));
    CK(cudaMalloc(&d_pos, 4));
    CK(cudaMemcpy(dq, q.data(), 4 * q.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_pos, &pos0, 4, cudaMemcpyHostToDevice));
    for (const Version& v : kVersions) {
      CK(cudaMemset(dout, 0xFF, 4 * q.size()));  // NaN
      run.launch(v, c, dq, dout, n, d_pos, 32768, s);
      CK(cudaStreamSynchronize(s));
      CK(cudaMemcpy(got.data(), dout, 4 * q.size(), cudaMemcpyDeviceToHost));
      double mx = 0, err = 0;
      for (size_t i = 0; i < q.size(); ++i) {
        mx = std::max(mx, static_cast<double>(std::fabs(ref[i])));
        err = std::max(err, std::isnan(got[i]) ? INFINITY : static_cast<double>(std::fabs(got[i] - ref[i])));
      }
      const double rel = err / mx, tol = v.path == AttnPath::kTensorCore ? 2e-3 : 1e-4;
      std::printf("check %-5s pos0 %5d n %4d: max err / max|o| = %.2e %s\n", v.name, pos0, n, rel,
                  rel <= tol ? "ok" : "FAIL");
      if (!(rel <= tol)) g_fail = true;
    }
    CK(cudaFree(dq));
    CK(cudaFree(dout));
    CK(cudaFree(d_pos));
    free_copy(c);
  }
}

// ---- timing ----
// Times `iters` launches rotating over the copies, captured as one graph; returns us per launch.
double time_graph(const std::function<void(int, cudaStream_t)>& one, int iters, cudaStream_t s) {
  return 1e3 * graph_median_ms(s, [&] { for (int i = 0; i < iters; ++i) one(i, s); }, 5) / iters;
}

void bench_decode(Runner& run, int64_t n_kv, int64_t max_kv, double read_gbs, int64_t l2_bytes, cudaStream_t s) {
  const int64_t kv_bytes = n_kv * kHkv * kv_row_bytes() * 2;
  const int n_copies = static_cast<int>(std::max<int64_t>(2, (4 * l2_bytes + kv_bytes - 1) / kv_bytes));
  std::vector<KvCopy> copies;
  for (int i = 0; i < n_copies; ++i) copies.push_back(make_copy(n_kv, 1000u + i));
  float *dq, *dout;
  int32_t* d_pos;
  const int pos0 = static_cast<int>(n_kv - 1);
  CK(cudaMalloc(&dq, 4 * kD * kH));
  CK(cudaMalloc(&dout, 4 * kD * kH));
  CK(cudaMalloc(&d_pos, 4));
  fill_random_float<<<64, 256>>>(dq, kD * kH, 11u);
  CK(cudaMemcpy(d_pos, &pos0, 4, cudaMemcpyHostToDevice));
  for (const Version& v : kVersions) {
    if (v.path == AttnPath::kAuto && g_kv != DType::F16) continue;  // v1 reads F16
    AttnPlan plan;
    run.launch(v, copies[0], dq, dout, 1, d_pos, max_kv, s, &plan);  // sizes the scratch outside the capture
    CK(cudaStreamSynchronize(s));
    const double us = time_graph(
        [&](int i, cudaStream_t st) { run.launch(v, copies[i % n_copies], dq, dout, 1, d_pos, max_kv, st); }, 40, s);
    const double gbs = kv_bytes / (us * 1e-6) / 1e9;
    std::printf("decode %-5s n_kv %6lld bound %6lld: %8.1f us %7.0f GB/s %5.1f%% of read bw  (splits %d)\n", v.name,
                static_cast<long long>(n_kv), static_cast<long long>(max_kv), us, gbs, 100.0 * gbs / read_gbs,
                v.path == AttnPath::kAuto ? 1 : plan.n_split);
    if (g_tsv) {
      std::fprintf(g_tsv, "decode\t%s\t%lld\t%lld\t%.2f\t%.1f\t%.4f\n", v.name, static_cast<long long>(n_kv),
                   static_cast<long long>(max_kv), us, gbs, gbs / read_gbs);
    }
  }
  CK(cudaFree(dq));
  CK(cudaFree(dout));
  CK(cudaFree(d_pos));
  for (KvCopy& c : copies) free_copy(c);
}

// ---- one attention layer's decode: attention_prep then the gated split kernel and its combine, against
// attention_decode_kernel (prep, attention and gate in one launch) and the combine ----
void bench_decode_layer(int64_t n_kv, int64_t max_kv, cudaStream_t s) {
  const int64_t kv_bytes = n_kv * kHkv * kv_row_bytes() * 2;
  const int n_copies = 4;
  std::vector<KvCopy> copies;
  for (int i = 0; i < n_copies; ++i) copies.push_back(make_copy(n_kv, 2000u + i));
  const int pos0 = static_cast<int>(n_kv - 1);
  const int64_t HD = int64_t{kH} * kD, act_bytes = cuda::matvec_q8_act_bytes(HD, 1);
  float *qg, *k_src, *k, *k_out, *v, *norms, *q, *o, *o_chain;
  int8_t *act, *act_chain;
  int32_t* d_pos;
  float* scratch;
  CK(cudaMalloc(&qg, 8 * HD));
  CK(cudaMalloc(&k_src, 4 * kHkv * kD));
  CK(cudaMalloc(&k, 4 * kHkv * kD));
  CK(cudaMalloc(&k_out, 4 * kHkv * kD));
  CK(cudaMalloc(&v, 4 * kHkv * kD));
  CK(cudaMalloc(&norms, 8 * kD));
  CK(cudaMalloc(&q, 4 * HD));
  CK(cudaMalloc(&o, 4 * HD));
  CK(cudaMalloc(&o_chain, 4 * HD));
  CK(cudaMalloc(&act, act_bytes));
  CK(cudaMalloc(&act_chain, act_bytes));
  CK(cudaMalloc(&d_pos, 4));
  fill_random_float<<<64, 256>>>(qg, 2 * HD, 21u);
  fill_random_float<<<64, 256>>>(k_src, kHkv * kD, 22u);
  fill_random_float<<<64, 256>>>(v, kHkv * kD, 23u);
  const std::vector<float> ones(2 * kD, 1.0f);
  CK(cudaMemcpy(norms, ones.data(), 8 * kD, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_pos, &pos0, 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(k, k_src, 4 * kHkv * kD, cudaMemcpyDeviceToDevice));

  auto prep_for = [&](const KvCopy& c) {
    cuda::AttnPrepArgs a;
    a.q_in = qg;
    a.q_hs = 2 * kD;
    a.q_ts = 2 * HD;
    a.q_norm = norms;
    a.k_norm = norms + kD;
    a.q = q;
    a.k = k;
    a.v = v;
    a.kv = args_for(c, q, o, 1, d_pos, max_kv).kv;
    a.n_head = kH;
    a.n_rot = 64;
    a.log2_base = std::log2(1e7);
    a.eps = 1e-6f;
    a.d_pos = d_pos;
    return a;
  };
  auto gated_for = [&](const KvCopy& c, float* out, int8_t* out_q8) {
    AttnPagedArgs a = args_for(c, q, out, 1, d_pos, max_kv);
    a.gate = qg + kD;
    a.gate_hs = 2 * kD;
    a.gate_ts = 2 * HD;
    a.q8 = out_q8;
    return a;
  };
  AttnPlan chain_plan, fused_plan;
  CK(cuda::attention_paged_plan(gated_for(copies[0], o, act), AttnPath::kAuto, 0, &chain_plan));
  CK(cuda::attention_decode_plan(gated_for(copies[0], o, act), 0, &fused_plan));
  CK(cudaMalloc(&scratch, std::max<int64_t>({chain_plan.scratch_bytes, fused_plan.scratch_bytes, 4})));
  auto chain = [&](int i, cudaStream_t st, float* out, int8_t* out_q8) {
    const KvCopy& c = copies[i % n_copies];
    CK(cuda::attention_prep_launch(prep_for(c), 1, st));
    AttnPagedArgs a = gated_for(c, out, out_q8);
    a.scratch = scratch;
    CK(cuda::attention_paged_launch(a, chain_plan, st));
  };
  auto fused = [&](int i, cudaStream_t st, float* out, int8_t* out_q8) {
    const KvCopy& c = copies[i % n_copies];
    cuda::AttnDecodeArgs a;
    a.prep = prep_for(c);
    a.attn = gated_for(c, out, out_q8);
    a.attn.scratch = scratch;
    a.k_out = k_out;
    CK(cuda::attention_decode_launch(a, fused_plan, st));
  };
  // Same bits (k reloaded before each: the prep normalizes it in place).
  chain(0, s, o_chain, act_chain);
  CK(cudaMemcpyAsync(k, k_src, 4 * kHkv * kD, cudaMemcpyDeviceToDevice, s));
  fused(0, s, o, act);
  CK(cudaStreamSynchronize(s));
  std::vector<float> h1(HD), h2(HD);
  std::vector<int8_t> a1(act_bytes), a2(act_bytes);
  CK(cudaMemcpy(h1.data(), o_chain, 4 * HD, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(h2.data(), o, 4 * HD, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(a1.data(), act_chain, act_bytes, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(a2.data(), act, act_bytes, cudaMemcpyDeviceToHost));
  const bool same = h1 == h2 && a1 == a2;
  // One CTA per query row (one split) against the chain's splits past 64 positions: within rounding.
  float big = 0.0f, worst = 0.0f;
  for (size_t i = 0; i < h1.size(); ++i) {
    big = std::max(big, std::fabs(h1[i]));
    worst = std::max(worst, std::fabs(h1[i] - h2[i]));
  }
  const bool close = fused_plan.rows_per_cta == 1 && n_kv > 64 && worst <= 5e-3f * big;
  std::printf("check layer decode n_kv %6lld bound %6lld: fused %s the chain\n", static_cast<long long>(n_kv),
              static_cast<long long>(max_kv), same ? "equals" : close ? "is within rounding of" : "DIFFERS FROM");
  if (!same && !close) g_fail = true;
  const double us_chain = time_graph([&](int i, cudaStream_t st) { chain(i, st, o, act); }, 40, s);
  const double us_fused = time_graph([&](int i, cudaStream_t st) { fused(i, st, o, act); }, 40, s);
  std::printf("layer decode n_kv %6lld bound %6lld: chain %7.1f us, fused %7.1f us (splits %d); KV %.1f MB\n",
              static_cast<long long>(n_kv), static_cast<long long>(max_kv), us_chain, us_fused, fused_plan.n_split,
              kv_bytes / 1e6);
  if (g_tsv) {
    std::fprintf(g_tsv, "layer_decode\t%lld\t%lld\t%.2f\t%.2f\n", static_cast<long long>(n_kv),
                 static_cast<long long>(max_kv), us_chain, us_fused);
  }
  for (void* ptr : {static_cast<void*>(qg), static_cast<void*>(k_src), static_cast<void*>(k), static_cast<void*>(k_out),
                    static_cast<void*>(v),
                    static_cast<void*>(norms), static_cast<void*>(q), static_cast<void*>(o), static_cast<void*>(o_chain),
                    static_cast<void*>(act), static_cast<void*>(act_chain), static_cast<void*>(d_pos),
                    static_cast<void*>(scratch)}) {
    CK(cudaFree(ptr));
  }
  for (KvCopy& c : copies) free_copy(c);
}

void bench_prefill(Runner& run, int n, cudaStream_t s) {
  KvCopy c = make_copy(n, 9u);
  float *dq, *dout;
  int32_t* d_pos;
  const int pos0 = 0;
  CK(cudaMalloc(&dq, 4LL * kD * kH * n));
  CK(cudaMalloc(&dout, 4LL * kD * kH * n));
  CK(cudaMalloc(&d_pos, 4));
  fill_random_float<<<1024, 256>>>(dq, static_cast<int64_t>(kD) * kH * n, 3u);
  CK(cudaMemcpy(d_pos, &pos0, 4, cudaMemcpyHostToDevice));
  const double flops = 4.0 * n * n * kD * kH / 2;
  for (const Version& v : kVersions) {
    if (v.path == AttnPath::kAuto && g_kv != DType::F16) continue;  // v1 reads F16
    AttnPlan plan;
    run.launch(v, c, dq, dout, n, d_pos, n, s, &plan);
    CK(cudaStreamSynchronize(s));
    const double us = time_graph([&](int, cudaStream_t st) { run.launch(v, c, dq, dout, n, d_pos, n, st); }, 3, s);
    const double tflops = flops / (us * 1e-6) / 1e12;
    std::printf("prefill %-5s n %5d over n_kv %5d: %9.1f us %7.1f TFLOP/s\n", v.name, n, n, us, tflops);
    if (g_tsv) std::fprintf(g_tsv, "prefill\t%s\t%d\t%d\t%.2f\t%.2f\n", v.name, n, n, us, tflops);
  }
  CK(cudaFree(dq));
  CK(cudaFree(dout));
  CK(cudaFree(d_pos));
  free_copy(c);
}

}  // namespace

int main(int argc, char** argv) {
  int argi = 1;
  if (argc > argi + 1 && std::string(argv[argi]) == "--kv") {
    const std::string kv = argv[argi + 1];
    if (kv != "q8_0" && kv != "q4_0" && kv != "f16") {
      std::fprintf(stderr, "attention_bench: --kv %s: expected f16, q8_0 or q4_0\n", kv.c_str());
      return 2;
    }
    g_kv = kv == "q8_0" ? DType::Q8_0 : kv == "q4_0" ? DType::Q4_0 : DType::F16;
    argi += 2;
  }
  int64_t layer_only = 0;
  if (argc > argi + 1 && std::string(argv[argi]) == "--layer") {
    layer_only = std::atoll(argv[argi + 1]);
    if (layer_only < 1 || layer_only > (1 << 20)) {
      std::fprintf(stderr, "attention_bench: --layer %s: expected a position count of 1 to 1048576\n", argv[argi + 1]);
      return 2;
    }
    argi += 2;
  }
  if (argc > argi) g_tsv = std::fopen(argv[argi], "w");
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::printf("KV cache %s\n", dtype_name(g_kv));
  if (layer_only > 0) {
    bench_decode_layer(layer_only, layer_only, s);
  } else {
    Runner run;
    if (g_kv == DType::F16) check_versions(run, s);  // the reference reads F16
    const double read_gbs = measure_read_gbs();
    std::printf("streaming read: %.0f GB/s\n", read_gbs);
    bench_decode(run, 4096, 4096, read_gbs, prop.l2CacheSize, s);
    bench_decode(run, 4096, 32768, read_gbs, prop.l2CacheSize, s);
    bench_decode(run, 32768, 32768, read_gbs, prop.l2CacheSize, s);
    for (auto [n_kv, bound] : {std::pair<int64_t, int64_t>{64, 256}, {200, 256}, {64, 1024}, {1000, 1024},
                               {4096, 5120}, {32768, 32768}}) {
      bench_decode_layer(n_kv, bound, s);
    }
    bench_prefill(run, 4096, s);
    if (run.scratch) CK(cudaFree(run.scratch));
  }
  CK(cudaStreamDestroy(s));
  if (g_tsv) std::fclose(g_tsv);
  std::printf("== summary: %s\n", g_fail ? "FAIL" : "all checks ok");
  return g_fail ? 1 : 0;
}
