// Workbench: quantized matrix-vector products for decode (y[t, r] = dot(W row r, x row t), 1..16
// activation rows) and the prefill GEMM path, checked against the CPU reference and timed against the
// measured device limits (streaming-read bandwidth over 4 GiB, cuBLAS BF16 8192^3 peak).
// Build (after the CMake build in build-gpu, for the CPU reference in libdeltaserve_lib):
//   nvcc -std=c++17 -O3 -arch=sm_90 --expt-relaxed-constexpr -Isrc -I.deps/include -DFMT_HEADER_ONLY=1 \
//     kernels/matvec_q.cu build-gpu/libdeltaserve_lib.a -lcublas -o build-gpu/matvec_q
// Run: build-gpu/matvec_q [out.tsv] [all|legacy|v5]   (legacy: v1..v4 and gemm; v5: the q8 section)
// Versions:
//   v1 generic: one warp per (row, token), byte loads, decode1 per element (the fallback path).
//   v2 staged:  CTA of 128 threads owns 4 rows, 16-byte loads of ~1-2 KB row chunks into shared memory,
//               next chunk prefetched into registers, activations loaded once per 4 rows; n_tokens
//               bucketed to 1/2/4/8/16; quant codes converted with I2F. Replaced by v3; its numbers are
//               in docs/perf-gpu.md (quant types 25-64% of read bandwidth at one token: I2F-bound).
//   v3 staged:  production kernel (ops/cuda/matvec_kernels.cuh): v2 with codes turned into floats by
//               PRMT + FADD (2^23 trick) instead of I2F, which runs at a quarter of the FMA rate.
//   v3r1/v3r2/v3r8: v3 with 1, 2 or 8 rows per CTA (activation reuse vs. CTA count).
//   v4 q8:      production kernel for quantized weights at 1..8 tokens (ops/cuda/matvec_q8.cuh): the
//               activations are quantized to int8 blocks of 32 by a small kernel, then each warp owns
//               4 rows, stages them through its own shared-memory ring with cp.async 16-byte copies
//               (a ring of 3 steps of 1024 elements; 2 for q8_0) and dots the weight codes with the int8
//               activations by __dp4a, applying the float scales once per 32 elements. Timed as the
//               pair (quantize + product, what production runs) and as the product alone (v4k).
//               Checked against the reference on the device-quantized activations (kernel error) and
//               on the original ones (end to end, bound 1e-2 of sum|w x|).
//   v4r2:       v4 with 2 rows per warp.
//   v5 section (run_v5_section; kernel in ops/cuda/matvec_q8v5.cuh): the q8 product without shared
//               memory: each lane loads its 32-element piece of kRows rows with 16-byte __ldg loads into
//               a register ring kDepth steps ahead of the dot products (2-byte aligned blocks realigned
//               in registers); CTAs of 4 warps. Against v4 on the same quantized activations, product
//               alone, at the 27B and 35B-A3B decode shapes, 1/2/4/8 tokens:
//     v5        2 rows per warp, prefetch 1 step, one warp per row group, grid = all row groups.
//     v5p       v5 on a persistent grid (resident CTAs stride over the row groups).
//     v5s2/v5s4 v5 with split-K: 2 / 4 warps share a row group's steps, summed in shared memory.
//     v5r1d2    1 row per warp, prefetch 2 steps (v5r1d2s4: split 4; v5r1d2p: persistent).
//     v5r1      1 row per warp, prefetch 1 step (fewest registers for q6_K; v5r1s4: split 4).
//     v5r4      4 rows per warp (q4_K, q4_0 at one token only: the others' rings need too many registers).
//   v7 (kernels/matvec_q8v7.cuh, workbench only): one CTA per SM streams its contiguous rows through a
//     ring of 32 bulk copies of ~3 KB (cp.async.bulk + mbarrier), each read by one of 16 consumer warps;
//     timed in the v5 section. Slower than v4 everywhere (the header says why).
//   gemm:       dequantize to BF16 tiles + cublasGemmEx (BF16 in, F32 accumulate), for prefill.
// Non-obvious choice: timed runs rotate over enough copies of the weights to exceed 4x the L2 size, so
// small matrices are timed from device memory, not from the 50 MB L2.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "core/thread_pool.h"
#include "ops/cuda/matvec_kernels.cuh"
#include "ops/cuda/matvec_q8.cuh"
#include "ops/cuda/matvec_q8v5.cuh"
#include "matvec_q8v7.cuh"
#include "quant/quant.h"
#include "workbench.cuh"

using namespace ds;
using ds::cuda::kern::MatvecArgs;

#define CB(call)                                                                         \
  do {                                                                                   \
    cublasStatus_t s_ = (call);                                                          \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                   \
      std::fprintf(stderr, "%s:%d: %s: %d\n", __FILE__, __LINE__, #call, static_cast<int>(s_)); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

namespace {

const DType kTypes[] = {DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q8_0,
                        DType::Q4_0, DType::Q5_0, DType::BF16, DType::F16, DType::F32};
FILE* g_tsv = nullptr;

// ---- device limits (the read bandwidth: workbench.cuh measure_read_gbs) ----
// Median ms of `reps` calls of launch(i) on the default stream, after 3 warm-up calls.
template <typename F>
float median_ms(F&& launch, int reps) {
  return median_event_ms(nullptr, reps, launch, 3);
}

double measure_bf16_tflops(cublasHandle_t h) {
  const int n = 8192;
  __nv_bfloat16 *a, *b;
  float* c;
  CK(cudaMalloc(&a, 2LL * n * n));
  CK(cudaMalloc(&b, 2LL * n * n));
  CK(cudaMalloc(&c, 4LL * n * n));
  std::vector<uint16_t> host(static_cast<size_t>(n) * n);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  for (auto& v : host) v = f32_to_bf16(nd(rng));  // random data: zeros run faster
  CK(cudaMemcpy(a, host.data(), 2LL * n * n, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(b, host.data(), 2LL * n * n, cudaMemcpyHostToDevice));
  const float alpha = 1, beta = 0;
  const float ms = median_ms([&](int) {
    CB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha, a, CUDA_R_16BF, n, b, CUDA_R_16BF, n, &beta, c,
                    CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }, 10);
  CK(cudaFree(a));
  CK(cudaFree(b));
  CK(cudaFree(c));
  return 2.0 * n * n * n / (ms * 1e-3) / 1e12;
}

// ---- data ----
std::vector<uint8_t> random_weights(DType t, int64_t n_rows, int64_t k, uint32_t seed) {
  const int64_t rb = dtype_row_bytes(t, k);
  std::vector<uint8_t> w(static_cast<size_t>(rb * n_rows));
  ThreadPool::global().parallel_for(n_rows, [&](int64_t r0, int64_t r1, int) {
    std::mt19937 rng(seed + static_cast<uint32_t>(r0) * 7919u);
    std::normal_distribution<float> nd;
    std::uniform_real_distribution<float> sc(0.002f, 0.02f);
    for (int64_t r = r0; r < r1; ++r) {
      uint8_t* row = w.data() + r * rb;
      auto put16 = [&](int64_t o, uint16_t v) { std::memcpy(row + o, &v, 2); };
      if (t == DType::F32) {
        for (int64_t i = 0; i < k; ++i) { float f = nd(rng); std::memcpy(row + 4 * i, &f, 4); }
      } else if (t == DType::F16 || t == DType::BF16) {
        for (int64_t i = 0; i < k; ++i) put16(2 * i, t == DType::F16 ? f32_to_fp16(nd(rng)) : f32_to_bf16(nd(rng)));
      } else {
        for (int64_t i = 0; i < rb; ++i) row[i] = static_cast<uint8_t>(rng());
        const int64_t bb = dtype_block_bytes(t);
        for (int64_t b = 0; b < k / dtype_block_size(t); ++b) {
          if (t == DType::Q6_K) {
            put16(b * bb + 208, f32_to_fp16(sc(rng)));
          } else {
            put16(b * bb, f32_to_fp16(sc(rng)));  // d of Q4_0/Q5_0/Q8_0/Q4_K/Q5_K
            if (t == DType::Q4_K || t == DType::Q5_K) put16(b * bb + 2, f32_to_fp16(sc(rng)));
          }
        }
      }
    }
  });
  return w;
}

// ---- versions ----
enum class Version { kV1, kV2, kV2R1, kV2R2, kV2R8, kV4, kV4R2 };
const char* version_name(Version v) {
  switch (v) {
    case Version::kV1: return "v1";
    case Version::kV2: return "v3";
    case Version::kV2R1: return "v3r1";
    case Version::kV2R2: return "v3r2";
    case Version::kV2R8: return "v3r8";
    case Version::kV4: return "v4";
    default: return "v4r2";
  }
}
bool is_v4(Version v) { return v == Version::kV4 || v == Version::kV4R2; }
bool q8_type(DType t) { return ds::cuda::qdec::q8_supported(t); }

// ---- v4: int8 activations ----
// The activations x [nt, k] into the q8 scratch `act` (q8_act_bytes(k, nt) layout).
void quantize(const float* x, int64_t k, int nt, uint8_t* act, cudaStream_t s) {
  using namespace ds::cuda::kern;
  QuantizeQ8Args a{x, k, nullptr, nt, k, reinterpret_cast<int8_t*>(act),
                   reinterpret_cast<float2*>(act + q8_ds_offset(k, nt)), nullptr, 0};
  const int64_t threads = nt * (k / kQ8Block) * 8;
  quantize_q8<false><<<static_cast<unsigned>((threads + kQuantThreads - 1) / kQuantThreads), kQuantThreads, 0, s>>>(a);
}

template <DType T, int kRows>
void launch_q8(const MatvecArgs& m, const uint8_t* act, cudaStream_t s) {
  using namespace ds::cuda::kern;
  if constexpr (ds::cuda::qdec::q8_supported(T)) {
    const MatvecQ8Args a{m.w, m.w_stride, reinterpret_cast<const int8_t*>(act),
                         reinterpret_cast<const float2*>(act + q8_ds_offset(m.k, m.n_tokens)), m.y, m.y_stride,
                         m.n_rows, m.k, m.n_tokens};
    const unsigned grid = static_cast<unsigned>((m.n_rows + kQ8Warps * kRows - 1) / (kQ8Warps * kRows));
    if (m.n_tokens <= 1) matvec_q8<T, 1, kRows><<<grid, kQ8Threads, 0, s>>>(a);
    else if (m.n_tokens <= 2) matvec_q8<T, 2, kRows><<<grid, kQ8Threads, 0, s>>>(a);
    else if (m.n_tokens <= 4) matvec_q8<T, 4, kRows><<<grid, kQ8Threads, 0, s>>>(a);
    else matvec_q8<T, 8, kRows><<<grid, kQ8Threads, 0, s>>>(a);
  } else {
    std::abort();
  }
}

template <DType T, int kRows>
void launch_staged(const MatvecArgs& a, cudaStream_t s) {
  using namespace ds::cuda::kern;
  const unsigned grid = static_cast<unsigned>((a.n_rows + kRows - 1) / kRows);
  if (a.n_tokens <= 1) matvec_staged<T, 1, kRows><<<grid, kStagedThreads, 0, s>>>(a);
  else if (a.n_tokens <= 2) matvec_staged<T, 2, kRows><<<grid, kStagedThreads, 0, s>>>(a);
  else if (a.n_tokens <= 4) matvec_staged<T, 4, kRows><<<grid, kStagedThreads, 0, s>>>(a);
  else if (a.n_tokens <= 8) matvec_staged<T, 8, kRows><<<grid, kStagedThreads, 0, s>>>(a);
  else matvec_staged<T, 16, kRows><<<grid, kStagedThreads, 0, s>>>(a);
}

// v4 versions expect the activations already quantized into `act` (see quantize).
template <DType T>
void launch_version(Version v, const MatvecArgs& a, const uint8_t* act, cudaStream_t s) {
  switch (v) {
    case Version::kV1: {
      const dim3 grid(static_cast<unsigned>((a.n_rows + 3) / 4), static_cast<unsigned>(a.n_tokens));
      ds::cuda::kern::matvec_generic<T><<<grid, 128, 0, s>>>(a);
      break;
    }
    case Version::kV2: launch_staged<T, 4>(a, s); break;
    case Version::kV2R1: launch_staged<T, 1>(a, s); break;
    case Version::kV2R2: launch_staged<T, 2>(a, s); break;
    case Version::kV2R8: launch_staged<T, 8>(a, s); break;
    case Version::kV4: launch_q8<T, 4>(a, act, s); break;
    case Version::kV4R2: launch_q8<T, 2>(a, act, s); break;
  }
}

void launch(DType t, Version v, const MatvecArgs& a, const uint8_t* act, cudaStream_t s) {
  switch (t) {
#define X(name) case DType::name: launch_version<DType::name>(v, a, act, s); break;
    X(F32) X(F16) X(BF16) X(Q4_0) X(Q5_0) X(Q8_0) X(Q4_K) X(Q5_K) X(Q6_K)
#undef X
    default: std::abort();
  }
}

void dequant(DType t, const uint8_t* w, int64_t stride, int64_t rows, int64_t k, __nv_bfloat16* out, cudaStream_t s) {
  const int64_t n = rows * (k / 8);
  const unsigned grid = static_cast<unsigned>((n + 255) / 256);
  switch (t) {
#define X(name) case DType::name: ds::cuda::kern::dequant_bf16<DType::name, true><<<grid, 256, 0, s>>>(w, stride, rows, k, out); break;
    X(F32) X(F16) X(BF16) X(Q4_0) X(Q5_0) X(Q8_0) X(Q4_K) X(Q5_K) X(Q6_K)
#undef X
    default: std::abort();
  }
}

struct Problem {
  DType t;
  int64_t k, n_rows;
  std::vector<uint8_t> w;
  std::vector<float> ref_w;  // dequantized on the CPU
  int copies = 1;
  uint8_t* dw = nullptr;     // copies * bytes
  int64_t bytes = 0;
};

int64_t copy_stride(const Problem& p) { return (p.bytes + 255) / 256 * 256; }

// Random weights, their CPU dequantization, and enough device copies (at most max_copies) to exceed
// 4x the L2.
void setup(Problem& p, int64_t l2_bytes, int64_t max_copies) {
  p.w = random_weights(p.t, p.n_rows, p.k, static_cast<uint32_t>(p.k + p.n_rows));
  p.bytes = static_cast<int64_t>(p.w.size());
  p.copies = static_cast<int>(std::min<int64_t>(max_copies, std::max<int64_t>(1, (4 * l2_bytes + p.bytes - 1) / p.bytes)));
  const int64_t stride = copy_stride(p);
  CK(cudaMalloc(&p.dw, stride * p.copies));
  CK(cudaMemcpy(p.dw, p.w.data(), p.bytes, cudaMemcpyHostToDevice));
  for (int c = 1; c < p.copies; ++c) CK(cudaMemcpy(p.dw + c * stride, p.dw, p.bytes, cudaMemcpyDeviceToDevice));
  p.ref_w.resize(static_cast<size_t>(p.k * p.n_rows));
  quant::dequantize_rows(p.t, p.w.data(), p.ref_w.data(), p.n_rows, p.k, ThreadPool::global().n_threads());
}

// Activations of up to max_tokens rows (normal random, seeded) on the host and device, the output and
// the q8 activation scratch.
struct DeviceIO {
  std::vector<float> x;
  float *dx = nullptr, *dy = nullptr;
  uint8_t* dact = nullptr;
};
DeviceIO make_io(const Problem& p, int max_tokens, uint32_t seed) {
  DeviceIO io;
  CK(cudaMalloc(&io.dx, 4 * max_tokens * p.k));
  CK(cudaMalloc(&io.dy, 4 * max_tokens * p.n_rows));
  CK(cudaMalloc(&io.dact, ds::cuda::kern::q8_act_bytes(p.k, max_tokens)));
  io.x.resize(static_cast<size_t>(max_tokens * p.k));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  for (auto& v : io.x) v = nd(rng);
  CK(cudaMemcpy(io.dx, io.x.data(), 4 * io.x.size(), cudaMemcpyHostToDevice));
  return io;
}
void free_problem(Problem& p, DeviceIO& io) {
  CK(cudaFree(io.dx));
  CK(cudaFree(io.dy));
  CK(cudaFree(io.dact));
  CK(cudaFree(p.dw));
}

// Worst |y - ref| / sum|w x| over all outputs; NaN (unwritten) counts as failure (returns inf).
double check(const Problem& p, const std::vector<float>& x, const std::vector<float>& y, int nt) {
  std::vector<double> worst(static_cast<size_t>(ThreadPool::global().n_threads()), 0.0);
  ThreadPool::global().parallel_for(p.n_rows * nt, [&](int64_t i0, int64_t i1, int th) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / p.n_rows, r = i % p.n_rows;
      double ref = 0, mag = 0;
      for (int64_t j = 0; j < p.k; ++j) {
        const double m = static_cast<double>(p.ref_w[r * p.k + j]) * x[t * p.k + j];
        ref += m;
        mag += std::fabs(m);
      }
      const double e = std::fabs(y[t * p.n_rows + r] - ref) / (mag + 1e-30);
      worst[th] = std::max(worst[th], std::isnan(e) ? INFINITY : e);
    }
  }, 64);
  return *std::max_element(worst.begin(), worst.end());
}

// The activations as the v4 kernel sees them: q * d per block, from the device scratch of nt rows.
std::vector<float> dequantized_act(const uint8_t* dact, int64_t k, int nt) {
  const int64_t bytes = ds::cuda::kern::q8_act_bytes(k, nt);
  std::vector<uint8_t> h(static_cast<size_t>(bytes));
  CK(cudaMemcpy(h.data(), dact, bytes, cudaMemcpyDeviceToHost));
  const int64_t ds_off = ds::cuda::kern::q8_ds_offset(k, nt);
  std::vector<float> x(static_cast<size_t>(nt * k));
  for (int64_t t = 0; t < nt; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      float d;
      std::memcpy(&d, h.data() + ds_off + 8 * (t * (k / 32) + j / 32), 4);
      x[static_cast<size_t>(t * k + j)] = static_cast<float>(static_cast<int8_t>(h[static_cast<size_t>(t * k + j)])) * d;
    }
  }
  return x;
}

struct V4Summary {
  std::string type;
  double v3_gbs = 0, v4_gbs = 0, v4k_gbs = 0, v4k_us = 0;
  double us[9] = {};  // v4 (quantize + product) by token count
};


// ---- v5 section: the int8-activation product, v4 against the v5 variants, at the model shapes ----
// Every version runs on the same device-quantized activations (the quantize kernel is timed once per
// shape and token count) and is timed as the product alone, from device memory (the weights rotate over
// copies totalling 4x the L2), then checked against references computed once per (shape, tokens).
struct V5Config {
  const char* name;
  int rows, depth, split;  // rows per warp, prefetch depth (steps), warps per row group
  bool persistent;         // grid capped at the resident CTAs
  int max_nt;              // token buckets instantiated
};
const V5Config kV5Configs[] = {
    {"v5", 2, 1, 1, false, 8},       {"v5p", 2, 1, 1, true, 8},          {"v5s2", 2, 1, 2, false, 8},
    {"v5s4", 2, 1, 4, false, 8},     {"v5r1d2", 1, 2, 1, false, 8},      {"v5r1d2s4", 1, 2, 4, false, 8},
    {"v5r1d2p", 1, 2, 1, true, 8},   {"v5r1", 1, 1, 1, false, 8},        {"v5r1s4", 1, 1, 4, false, 8},
    {"v5r4", 4, 1, 1, false, 1},  // q4_K and q4_0 only
    {"v7", 0, 0, 1, true, 8},     // rows 0: the bulk-copy stream of matvec_q8v7.cuh (one CTA per SM)
    // rows -1: v4 itself with `depth` shared-memory stages and a register budget of `split` CTAs per SM
    {"v4st2c8", -1, 2, 8, false, 1}, {"v4st2c6", -1, 2, 6, false, 1}, {"v4st4", -1, 4, 1, false, 1},
};
// v4 variants whose static shared memory fits the 48 KB limit.
bool v4_variant_fits(DType t, const V5Config& c) {
  using namespace ds::cuda::kern;
  return q8_ring_bytes(t, kQ8Rows, c.depth) <= kQ8StaticSmem;
}
bool v5_runs(DType t, const V5Config& c, int nt) {
  if (c.rows < 0) return nt <= c.max_nt && v4_variant_fits(t, c);
  return nt <= c.max_nt && (c.rows != 4 || t == DType::Q4_K || t == DType::Q4_0);
}
constexpr int kV5NumConfigs = sizeof(kV5Configs) / sizeof(kV5Configs[0]);

template <DType T, int kRows, int kDepth>
void launch_v5_rows(const ds::cuda::kern::MatvecQ8Args& a, const V5Config& c, cudaStream_t s) {
  using namespace ds::cuda::kern;
  if (a.n_tokens <= 1) {
    CK((q8v5_launch<T, 1, kRows, kDepth>(a, 1, c.split, c.persistent, s)));
  } else if constexpr (kRows <= 2) {
    if (a.n_tokens <= 2) CK((q8v5_launch<T, 2, kRows, kDepth>(a, 1, c.split, c.persistent, s)));
    else if (a.n_tokens <= 4) CK((q8v5_launch<T, 4, kRows, kDepth>(a, 1, c.split, c.persistent, s)));
    else CK((q8v5_launch<T, 8, kRows, kDepth>(a, 1, c.split, c.persistent, s)));
  } else {
    std::abort();  // more rows: one token only (v5_runs)
  }
}

// One token: v4 with the stage count and register budget of c (rows -1).
template <DType T, int kStages, int kMinCtas>
void launch_v4_variant(const ds::cuda::kern::MatvecQ8Args& a, cudaStream_t s) {
  using namespace ds::cuda::kern;
  if constexpr (q8_ring_bytes(T, kQ8Rows, kStages) <= kQ8StaticSmem) {
    const unsigned grid = static_cast<unsigned>((a.n_rows + kQ8Warps * kQ8Rows - 1) / (kQ8Warps * kQ8Rows));
    matvec_q8<T, 1, kQ8Rows, kStages, kMinCtas><<<grid, kQ8Threads, 0, s>>>(a);
    CK(cudaGetLastError());
  } else {
    std::abort();  // v5_runs keeps it out
  }
}

template <DType T>
void launch_v5_typed(const ds::cuda::kern::MatvecQ8Args& a, const V5Config& c, cudaStream_t s) {
  if constexpr (ds::cuda::qdec::q8_supported(T)) {
    using namespace ds::cuda::kern;
    if (c.rows < 0) {
      if (a.n_tokens != 1) std::abort();
      if (c.depth == 2 && c.split == 8) launch_v4_variant<T, 2, 8>(a, s);
      else if (c.depth == 2 && c.split == 6) launch_v4_variant<T, 2, 6>(a, s);
      else if (c.depth == 4 && c.split == 1) launch_v4_variant<T, 4, 1>(a, s);
      else std::abort();
    } else if (c.rows == 0) {
      if (a.n_tokens <= 1) CK((q8v7_launch<T, 1>(a, s)));
      else if (a.n_tokens <= 2) CK((q8v7_launch<T, 2>(a, s)));
      else if (a.n_tokens <= 4) CK((q8v7_launch<T, 4>(a, s)));
      else CK((q8v7_launch<T, 8>(a, s)));
    } else if (c.rows == 2 && c.depth == 1) launch_v5_rows<T, 2, 1>(a, c, s);
    else if (c.rows == 1 && c.depth == 2) launch_v5_rows<T, 1, 2>(a, c, s);
    else if (c.rows == 1 && c.depth == 1) launch_v5_rows<T, 1, 1>(a, c, s);
    else if constexpr (ds::cuda::kern::Q8v5Type<T>::kRaw <= 8) {  // 4 rows: only the light load rings
      if (c.rows == 4 && c.depth == 1) launch_v5_rows<T, 4, 1>(a, c, s);
      else std::abort();
    } else {
      std::abort();
    }
  } else {
    std::abort();
  }
}

void launch_v5(DType t, const ds::cuda::kern::MatvecQ8Args& a, const V5Config& c, cudaStream_t s) {
  switch (t) {
#define X(name) case DType::name: launch_v5_typed<DType::name>(a, c, s); break;
    X(Q4_0) X(Q5_0) X(Q8_0) X(Q4_K) X(Q5_K) X(Q6_K)
#undef X
    default: std::abort();
  }
}

// Per (shape, tokens): the float64 references, end to end (original activations) and on the
// device-quantized activations, with their magnitudes sum |w x|.
struct V5Refs {
  std::vector<double> ref, mag, ref_q, mag_q;  // [nt, rows]
};
V5Refs v5_refs(const Problem& p, const std::vector<float>& x, const std::vector<float>& xq, int nt) {
  V5Refs r;
  const size_t n = static_cast<size_t>(nt * p.n_rows);
  r.ref.assign(n, 0);
  r.mag.assign(n, 0);
  r.ref_q.assign(n, 0);
  r.mag_q.assign(n, 0);
  ThreadPool::global().parallel_for(p.n_rows, [&](int64_t r0, int64_t r1, int) {
    for (int64_t row = r0; row < r1; ++row) {
      const float* w = p.ref_w.data() + row * p.k;
      for (int t = 0; t < nt; ++t) {
        double a = 0, m = 0, aq = 0, mq = 0;
        const float* xr = x.data() + t * p.k;
        const float* xqr = xq.data() + t * p.k;
        for (int64_t j = 0; j < p.k; ++j) {
          const double e = static_cast<double>(w[j]) * xr[j], eq = static_cast<double>(w[j]) * xqr[j];
          a += e;
          m += std::fabs(e);
          aq += eq;
          mq += std::fabs(eq);
        }
        const size_t i = static_cast<size_t>(t * p.n_rows + row);
        r.ref[i] = a;
        r.mag[i] = m;
        r.ref_q[i] = aq;
        r.mag_q[i] = mq;
      }
    }
  }, 16);
  return r;
}

// Worst relative errors of y [nt, rows] (end to end, kernel); NaN (unwritten) gives inf. Prints the
// first output over the kernel bound.
void v5_errors(const V5Refs& r, const std::vector<float>& y, int nt, int64_t rows, double* err, double* err_q) {
  *err = 0;
  *err_q = 0;
  bool printed = false;
  for (int t = 0; t < nt; ++t) {
    for (int64_t row = 0; row < rows; ++row) {
      const size_t i = static_cast<size_t>(t * rows + row);
      const double e = std::fabs(y[i] - r.ref[i]) / (r.mag[i] + 1e-30);
      const double eq = std::fabs(y[i] - r.ref_q[i]) / (r.mag_q[i] + 1e-30);
      *err = std::max(*err, std::isnan(e) ? INFINITY : e);
      *err_q = std::max(*err_q, std::isnan(eq) ? INFINITY : eq);
      if (!(eq <= 5e-5) && !printed) {
        printed = true;
        std::printf("    first bad output: token %d row %lld got %.6g ref %.6g (quantized-activation ref)\n", t,
                    (long long)row, y[i], r.ref_q[i]);
      }
    }
  }
}

struct V5Row {
  std::string type;
  int64_t rows, k;
  int nt;
  double mb, quant_us, v4_us, us[kV5NumConfigs];
};

int run_v5_section(double read_gbs, int64_t l2_bytes) {
  struct Shape { int64_t n_rows, k; };  // rows x k, as in the brief
  std::vector<Shape> shapes = {{17408, 5120}, {5120, 17408}, {10240, 5120}, {6144, 5120}, {5120, 6144},
                               {48, 5120},    {1024, 5120},  {2048, 512},   {512, 2048},  {8192, 2048}};
  if (std::getenv("MATVEC_Q_VOCAB") != nullptr) {  // the output products of the 27B and 35B-A3B models
    shapes.push_back({248320, 5120});
    shapes.push_back({248320, 2048});
  }
  const DType types[] = {DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q8_0, DType::Q4_0, DType::Q5_0};
  const int token_counts_all[] = {1, 2, 4, 8};
  const char* tok_env = std::getenv("MATVEC_Q_TOKENS");  // e.g. "1": that many tokens only
  std::vector<int> token_counts;
  for (int nt : token_counts_all) {
    if (tok_env == nullptr || std::atoi(tok_env) == nt) token_counts.push_back(nt);
  }
  cudaStream_t s = nullptr;
  int failures = 0;
  std::vector<V5Row> rows;
  const char* only = std::getenv("MATVEC_Q_TYPES");  // e.g. "q4_K,q6_K": those types only
  for (DType t : types) {
    if (only != nullptr && std::strstr(only, dtype_name(t)) == nullptr) continue;
    for (const Shape& sh : shapes) {
      Problem p{t, sh.k, sh.n_rows};
      setup(p, l2_bytes, INT64_MAX);  // every small matrix from device memory, however many copies
      const int64_t cs = copy_stride(p);
      DeviceIO io = make_io(p, 8, 11);
      float *dx = io.dx, *dy = io.dy;
      uint8_t* dact = io.dact;
      const std::vector<float>& x = io.x;
      for (int nt : token_counts) {
        quantize(dx, p.k, nt, dact, s);
        CK(cudaDeviceSynchronize());
        const V5Refs refs = v5_refs(p, x, dequantized_act(dact, p.k, nt), nt);
        const float quant_ms = median_ms([&](int) { quantize(dx, p.k, nt, dact, s); }, 20);
        const double bytes = p.bytes + ds::cuda::kern::q8_act_bytes(p.k, nt) + 4.0 * nt * p.n_rows;
        V5Row row{dtype_name(t), p.n_rows, p.k, nt, p.bytes / 1e6, quant_ms * 1e3, 0, {}};
        const ds::cuda::kern::MatvecQ8Args a4{p.dw, dtype_row_bytes(t, p.k), reinterpret_cast<const int8_t*>(dact),
                                              reinterpret_cast<const float2*>(dact + ds::cuda::kern::q8_ds_offset(p.k, nt)),
                                              dy, p.n_rows, p.n_rows, p.k, nt};
        // index -1: v4, then the v5 configurations
        for (int vi = -1; vi < kV5NumConfigs; ++vi) {
          if (vi >= 0 && !v5_runs(t, kV5Configs[vi], nt)) continue;
          auto run = [&](const uint8_t* w) {
            ds::cuda::kern::MatvecQ8Args b = a4;
            b.w = w;
            if (vi < 0) {
              MatvecArgs m{w, b.w_stride, dx, p.k, dy, p.n_rows, p.n_rows, p.k, nt};
              launch(t, Version::kV4, m, dact, s);
            } else {
              launch_v5(t, b, kV5Configs[vi], s);
            }
          };
          CK(cudaMemset(dy, 0xFF, 4 * 8 * p.n_rows));
          run(p.dw);
          CK(cudaGetLastError());
          CK(cudaDeviceSynchronize());
          std::vector<float> y(static_cast<size_t>(nt * p.n_rows));
          CK(cudaMemcpy(y.data(), dy, 4 * y.size(), cudaMemcpyDeviceToHost));
          double err, err_q;
          const char* name = vi < 0 ? "v4" : kV5Configs[vi].name;
          v5_errors(refs, y, nt, p.n_rows, &err, &err_q);
          const bool ok = err <= 1e-2 && err_q <= 5e-5;
          if (!ok) failures++;
          const int reps = p.bytes > (16 << 20) ? 20 : 50;
          const float ms = median_ms([&](int i) { run(p.dw + (i % p.copies) * cs); }, reps);
          const double gbs = bytes / (ms * 1e-3) / 1e9;
          (vi < 0 ? row.v4_us : row.us[vi]) = ms * 1e3;
          std::printf("v5sec %-5s rows=%-6lld k=%-6lld t=%d %-9s %8.2f us %7.0f GB/s %5.1f%% of read  err %.1e kernel err %.1e %s\n",
                      dtype_name(t), (long long)p.n_rows, (long long)p.k, nt, name, ms * 1e3, gbs, 100 * gbs / read_gbs,
                      err, err_q, ok ? "ok" : "FAIL");
          std::fprintf(g_tsv, "q8\t%s\t%lld\t%lld\t%d\t%s\t%.3f\t%.1f\t%.4f\t%.2e\t%.2e\n", dtype_name(t),
                       (long long)p.n_rows, (long long)p.k, nt, name, ms * 1e3, gbs, gbs / read_gbs, err, err_q);
        }
        rows.push_back(row);
      }
      free_problem(p, io);
    }
  }
  // Summary: per (type, shape, tokens) the product time of v4 and each v5 version (us), % of the read
  // bandwidth of the best, and the quantize time that comes on top of any of them.
  std::printf("\n== q8 product (alone), v4 vs v5 versions: us; %% of read bandwidth %.0f GB/s for v4 and the best ==\n",
              read_gbs);
  std::printf("%-5s %6s x %-6s t  %7s %7s", "type", "rows", "k", "MB", "quant");
  std::printf(" %8s", "v4");
  for (const V5Config& c : kV5Configs) std::printf(" %8s", c.name);
  std::printf("  v4%%   best%%  best\n");
  for (const V5Row& r : rows) {
    const double bytes = r.mb * 1e6 + ds::cuda::kern::q8_act_bytes(r.k, r.nt) + 4.0 * r.nt * r.rows;
    auto pct = [&](double us) { return 100.0 * bytes / (us * 1e-6) / 1e9 / read_gbs; };
    std::printf("%-5s %6lld x %-6lld %d  %7.2f %7.2f %8.2f", r.type.c_str(), (long long)r.rows, (long long)r.k, r.nt,
                r.mb, r.quant_us, r.v4_us);
    int best = -1;
    double best_us = r.v4_us;
    for (int i = 0; i < kV5NumConfigs; ++i) {
      if (r.us[i] > 0) {
        std::printf(" %8.2f", r.us[i]);
        if (r.us[i] < best_us) {
          best_us = r.us[i];
          best = i;
        }
      } else {
        std::printf(" %8s", "-");
      }
    }
    std::printf("  %4.1f  %5.1f  %s\n", pct(r.v4_us), pct(best_us), best < 0 ? "v4" : kV5Configs[best].name);
  }
  std::printf("v5 section check failures: %d\n", failures);
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  g_tsv = std::fopen(argc > 1 ? argv[1] : "matvec_q.tsv", "w");
  const std::string section = argc > 2 ? argv[2] : "all";  // all | legacy (v1..v4, gemm) | v5
  if (section != "all" && section != "legacy" && section != "v5") {
    std::fprintf(stderr, "usage: matvec_q [out.tsv] [all|legacy|v5]\n");
    return 2;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  int driver = 0;
  CK(cudaDriverGetVersion(&driver));
  std::printf("device %s, %d SMs, L2 %d MB, driver API %d\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20, driver);
  cublasHandle_t blas;
  CB(cublasCreate(&blas));
  const double read_gbs = measure_read_gbs();
  const double peak_tf = measure_bf16_tflops(blas);
  std::printf("measured: streaming read %.0f GB/s (4 GiB), cuBLAS BF16 8192^3 %.0f TFLOP/s\n", read_gbs, peak_tf);
  std::fprintf(g_tsv, "limit\tread_GBs\t%.1f\nlimit\tbf16_TFLOPs\t%.1f\n", read_gbs, peak_tf);
  cudaStream_t s = nullptr;

  struct Shape { int64_t k, n_rows; };
  const Shape shapes[] = {{5120, 17408}, {17408, 5120}, {2048, 512}, {1280, 33}};
  const int token_counts[] = {1, 2, 4, 8, 16};
  const Version versions[] = {Version::kV1,   Version::kV2,   Version::kV2R1, Version::kV2R2,
                              Version::kV2R8, Version::kV4,   Version::kV4R2};
  int failures = 0;
  std::vector<std::string> summary;
  std::vector<V4Summary> v4_summary;

  for (DType t : kTypes) {
    if (section == "v5") break;
    for (const Shape& sh : shapes) {
      Problem p{t, sh.k, sh.n_rows};
      setup(p, prop.l2CacheSize, 64);
      const int64_t cs = copy_stride(p);
      DeviceIO io = make_io(p, 16, 7);
      float *dx = io.dx, *dy = io.dy;
      uint8_t* dact = io.dact;
      const std::vector<float>& x = io.x;
      double t1_v2_gbs = 0;
      V4Summary v4s{dtype_name(t)};
      for (int nt : token_counts) {
        for (Version v : versions) {
          if (v == Version::kV1 && nt > 1) continue;  // v1 is the fallback; timed at one token only
          if (is_v4(v) && (!q8_type(t) || nt > ds::cuda::kern::kQ8MaxTokens)) continue;
          MatvecArgs a{p.dw, dtype_row_bytes(t, p.k), dx, p.k, dy, p.n_rows, p.n_rows, p.k, nt};
          CK(cudaMemset(dy, 0xFF, 4 * 16 * p.n_rows));
          if (is_v4(v)) quantize(dx, p.k, nt, dact, s);
          launch(t, v, a, dact, s);
          CK(cudaGetLastError());
          CK(cudaDeviceSynchronize());
          std::vector<float> y(static_cast<size_t>(nt * p.n_rows));
          CK(cudaMemcpy(y.data(), dy, 4 * y.size(), cudaMemcpyDeviceToHost));
          const bool check_it = nt == 1 || nt == 16 || (is_v4(v) && nt == 8) || p.k * p.n_rows <= 2048 * 512;
          // v4: kernel error against the device-quantized activations (bound 5e-5 of sum|w x'|) and end
          // to end against the original ones (bound 1e-2 of sum|w x|); others: 2e-5 end to end.
          double err = check_it ? check(p, x, y, nt) : 0.0;
          bool ok = err <= (is_v4(v) ? 1e-2 : 2e-5);
          double err_q = 0.0;
          if (check_it && is_v4(v)) {
            err_q = check(p, dequantized_act(dact, p.k, nt), y, nt);
            ok = ok && err_q <= 5e-5;
          }
          if (!ok) failures++;
          const float ms = median_ms([&](int i) {
            MatvecArgs b = a;
            b.w = p.dw + (i % p.copies) * cs;
            if (is_v4(v)) quantize(dx, p.k, nt, dact, s);
            launch(t, v, b, dact, s);
          }, 20);
          const double bytes = p.bytes + 4.0 * nt * (p.k + p.n_rows);
          const double gbs = bytes / (ms * 1e-3) / 1e9;
          if (v == Version::kV2 && nt == 1) t1_v2_gbs = gbs;
          std::printf("%-5s k=%-6lld rows=%-6lld t=%-2d %-5s %8.2f us %7.0f GB/s %5.1f%% of read  err %.1e %s",
                      dtype_name(t), (long long)p.k, (long long)p.n_rows, nt, version_name(v), ms * 1e3, gbs,
                      100 * gbs / read_gbs, err, ok ? (check_it ? "ok" : "-") : "FAIL");
          std::fprintf(g_tsv, "matvec\t%s\t%lld\t%lld\t%d\t%s\t%.3f\t%.1f\t%.4f\t%.2e\n", dtype_name(t),
                       (long long)p.k, (long long)p.n_rows, nt, version_name(v), ms * 1e3, gbs, gbs / read_gbs, err);
          if (is_v4(v)) {
            // The product alone, on the activations quantized above.
            const float ms_k = median_ms([&](int i) {
              MatvecArgs b = a;
              b.w = p.dw + (i % p.copies) * cs;
              launch(t, v, b, dact, s);
            }, 20);
            const double gbs_k = bytes / (ms_k * 1e-3) / 1e9;
            std::printf("  | product alone %8.2f us %7.0f GB/s %5.1f%%  kernel err %.1e", ms_k * 1e3, gbs_k,
                        100 * gbs_k / read_gbs, err_q);
            std::fprintf(g_tsv, "matvec\t%s\t%lld\t%lld\t%d\t%sk\t%.3f\t%.1f\t%.4f\t%.2e\n", dtype_name(t),
                         (long long)p.k, (long long)p.n_rows, nt, version_name(v), ms_k * 1e3, gbs_k,
                         gbs_k / read_gbs, err_q);
            if (v == Version::kV4 && sh.k == 5120 && sh.n_rows == 17408) {
              v4s.us[nt] = ms * 1e3;
              if (nt == 1) {
                v4s.v4_gbs = gbs;
                v4s.v4k_gbs = gbs_k;
                v4s.v4k_us = ms_k * 1e3;
              }
            }
          }
          std::printf("\n");
        }
      }
      if (q8_type(t) && sh.k == 5120 && sh.n_rows == 17408) {
        v4s.v3_gbs = t1_v2_gbs;
        v4_summary.push_back(v4s);
      }
      // Prefill path: dequantize tiles + cuBLAS, on the big up-projection shape only.
      if (sh.k == 5120 && sh.n_rows == 17408) {
        for (int nt : {1, 5, 16, 64, 512, 2048}) {
          __nv_bfloat16 *wb, *xb;
          float* yb;
          CK(cudaMalloc(&wb, 2 * p.k * p.n_rows));
          CK(cudaMalloc(&xb, 2 * p.k * nt));
          CK(cudaMalloc(&yb, 4 * p.n_rows * nt));
          std::vector<uint16_t> xh(static_cast<size_t>(p.k * nt));
          for (size_t i = 0; i < xh.size(); ++i) xh[i] = f32_to_bf16(x[i % x.size()]);
          CK(cudaMemcpy(xb, xh.data(), 2 * xh.size(), cudaMemcpyHostToDevice));
          const float alpha = 1, beta = 0;
          auto gemm = [&]() {
            CB(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)p.n_rows, nt, (int)p.k, &alpha, wb, CUDA_R_16BF,
                            (int)p.k, xb, CUDA_R_16BF, (int)p.k, &beta, yb, CUDA_R_32F, (int)p.n_rows,
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
          };
          const float ms_dq = median_ms([&](int i) { dequant(t, p.dw + (i % p.copies) * cs, dtype_row_bytes(t, p.k), p.n_rows, p.k, wb, s); }, 10);
          const float ms_mm = median_ms([&](int) { gemm(); }, 10);
          const double flops = 2.0 * p.k * p.n_rows * nt;
          const double tf_all = flops / ((ms_dq + ms_mm) * 1e-3) / 1e12;
          const double dq_gbs = (p.bytes + 2.0 * p.k * p.n_rows) / (ms_dq * 1e-3) / 1e9;
          std::printf("%-5s gemm k=%lld rows=%lld t=%-4d dequant %7.1f us (%4.0f GB/s) + cublas %8.1f us = %6.1f TFLOP/s (%4.1f%% of bf16 peak; cublas alone %.1f%%)\n",
                      dtype_name(t), (long long)p.k, (long long)p.n_rows, nt, ms_dq * 1e3, dq_gbs, ms_mm * 1e3, tf_all,
                      100 * tf_all / peak_tf, 100 * flops / (ms_mm * 1e-3) / 1e12 / peak_tf);
          std::fprintf(g_tsv, "gemm\t%s\t%lld\t%lld\t%d\t%.3f\t%.3f\t%.2f\t%.4f\n", dtype_name(t), (long long)p.k,
                       (long long)p.n_rows, nt, ms_dq * 1e3, ms_mm * 1e3, tf_all, tf_all / peak_tf);
          if (nt == 2048) {
            summary.push_back(std::string(dtype_name(t)) + "\t" + std::to_string(t1_v2_gbs) + "\t" + std::to_string(tf_all));
          }
          CK(cudaFree(wb));
          CK(cudaFree(xb));
          CK(cudaFree(yb));
        }
      }
      free_problem(p, io);
    }
  }
  std::printf("\n== summary (k=5120 rows=17408): v3 decode GB/s at 1 token, prefill TFLOP/s at 2048 tokens ==\n");
  std::printf("read %.0f GB/s, bf16 peak %.0f TFLOP/s\n", read_gbs, peak_tf);
  for (auto& line : summary) {
    char name[16];
    double gbs, tf;
    std::sscanf(line.c_str(), "%15s %lf %lf", name, &gbs, &tf);
    std::printf("%-5s %6.0f GB/s (%4.1f%% of read)   %6.1f TFLOP/s (%4.1f%% of bf16 peak)\n", name, gbs,
                100 * gbs / read_gbs, tf, 100 * tf / peak_tf);
  }
  std::printf("\n== v4 (q8 activations, dp4a), k=5120 rows=17408: GB/s at 1 token (quantize + product, and the "
              "product alone), us by tokens ==\n");
  for (const V4Summary& v : v4_summary) {
    std::printf("%-5s t=1 %6.0f GB/s (%4.1f%%; v3 %4.1f%%)  product alone %6.0f GB/s (%4.1f%%, %5.1f us)  "
                "t=2 %6.1f us  t=4 %6.1f us  t=8 %6.1f us\n",
                v.type.c_str(), v.v4_gbs, 100 * v.v4_gbs / read_gbs, 100 * v.v3_gbs / read_gbs, v.v4k_gbs,
                100 * v.v4k_gbs / read_gbs, v.v4k_us, v.us[2], v.us[4], v.us[8]);
  }
  if (section != "legacy") failures += run_v5_section(read_gbs, prop.l2CacheSize);
  std::printf("check failures: %d\n", failures);
  std::fclose(g_tsv);
  CB(cublasDestroy(blas));
  return failures ? 1 : 0;
}
