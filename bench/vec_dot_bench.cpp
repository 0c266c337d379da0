// CPU dot-product micro-benchmarks at real Qwen3.5 weight shapes: matrix-vector (one token,
// weight-bandwidth bound; reported as GB/s of weight bytes) on 1 and 2 threads, gemm_tile with 64
// tokens (compute bound; GOP/s counting a multiply-add as 2), and the machine's streaming read
// bandwidth as the ceiling for the matrix-vector figures. Weight matrices repeat 64 distinct
// quantized rows: the bytes streamed are the same as for real weights, and setup stays quick.
// Rates are over the benchmark's CPU time (Google Benchmark's default), which on a shared machine
// is closer to the unloaded figure than wall time; fma_peak, measured the same way, is the
// compute ceiling to compare the GOP/s against.
#include <benchmark/benchmark.h>

#include <immintrin.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "ops/cpu/membw.h"
#include "ops/cpu/vec_dot.h"
#include "quant/quant.h"

namespace {

using ds::DType;

struct Matrix {
  DType type;
  int64_t rows, n;
  int64_t row_bytes;
  std::vector<uint8_t> w;
};

// Keeps one matrix alive at a time so memory stays bounded.
const Matrix& get_matrix(DType t, int64_t rows, int64_t n) {
  static std::unique_ptr<Matrix> cached;
  if (cached && cached->type == t && cached->rows == rows && cached->n == n) return *cached;
  cached.reset();
  auto m = std::make_unique<Matrix>();
  m->type = t, m->rows = rows, m->n = n, m->row_bytes = ds::dtype_row_bytes(t, n);
  constexpr int64_t kDistinct = 64;
  std::mt19937 rng(42);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<float> src(static_cast<size_t>(kDistinct * n));
  for (auto& v : src) v = nd(rng);
  std::vector<uint8_t> distinct(static_cast<size_t>(kDistinct * m->row_bytes));
  ds::quant::quantize_rows(t, src.data(), distinct.data(), kDistinct, n, 2);
  m->w.resize(static_cast<size_t>(rows * m->row_bytes));
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(m->w.data() + r * m->row_bytes, distinct.data() + (r % kDistinct) * m->row_bytes,
                static_cast<size_t>(m->row_bytes));
  }
  cached = std::move(m);
  return *cached;
}

std::vector<uint8_t> make_acts(DType t, int64_t n, int64_t n_tokens) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  const int64_t rb = ds::cpu::vec_dot_act_row_bytes(t, n);
  std::vector<uint8_t> a(static_cast<size_t>(rb * n_tokens));
  for (int64_t tk = 0; tk < n_tokens; ++tk) {
    for (auto& v : x) v = nd(rng);
    ds::cpu::vec_dot_quantize_act(t, x.data(), a.data() + tk * rb, n);
  }
  return a;
}

void run_tiles(ds::ThreadPool& pool, const Matrix& m, const std::vector<uint8_t>& act, int64_t n_tokens,
               std::vector<float>& y) {
  const int64_t arb = ds::cpu::vec_dot_act_row_bytes(m.type, m.n);
  pool.parallel_for(
      m.rows,
      [&](int64_t b, int64_t e, int) {
        ds::cpu::gemm_tile(m.type, m.n, m.w.data(), static_cast<size_t>(m.row_bytes), b, e, act.data(),
                           static_cast<size_t>(arb), n_tokens, y.data(), m.rows);
      },
      16);
}

void bm_matvec(benchmark::State& state, DType t, int64_t rows, int64_t n, int threads) {
  const Matrix& m = get_matrix(t, rows, n);
  const auto act = make_acts(t, n, 1);
  std::vector<float> y(static_cast<size_t>(rows));
  ds::ThreadPool pool(threads);
  for (auto _ : state) {
    run_tiles(pool, m, act, 1, y);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(m.w.size()) / 1e9,
                                              benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(ds::cpu::vec_dot_isa());
}

void bm_gemm(benchmark::State& state, DType t, int64_t rows, int64_t n, int threads) {
  constexpr int64_t kTokens = 64;
  const Matrix& m = get_matrix(t, rows, n);
  const auto act = make_acts(t, n, kTokens);
  std::vector<float> y(static_cast<size_t>(rows * kTokens));
  ds::ThreadPool pool(threads);
  for (auto _ : state) {
    run_tiles(pool, m, act, kTokens, y);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GOP/s"] = benchmark::Counter(2.0 * static_cast<double>(rows * n * kTokens) / 1e9,
                                               benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(ds::cpu::vec_dot_isa());
}

void bm_read_bandwidth(benchmark::State& state, int threads) {
  double gbps = 0.0;
  for (auto _ : state) gbps = ds::cpu::measure_read_bandwidth_gbps(threads, int64_t{1} << 30);
  state.counters["GB/s"] = gbps;
}

// Reference ceiling for the GOP/s figures: twelve independent 512-bit FMA chains, no memory.
__attribute__((target("avx512f,fma"))) void bm_fma_peak(benchmark::State& state) {
  __m512 acc[12];
  for (int k = 0; k < 12; ++k) acc[k] = _mm512_set1_ps(0.001f * static_cast<float>(k));
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  constexpr int64_t kIters = 1 << 20;
  for (auto _ : state) {
    for (int64_t i = 0; i < kIters; ++i) {
      for (int k = 0; k < 12; ++k) acc[k] = _mm512_fmadd_ps(acc[k], m, c);
    }
    benchmark::DoNotOptimize(acc);
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(kIters * 12.0 * 32.0 / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

void bm_quantize_act(benchmark::State& state, DType t, int64_t n) {
  std::vector<float> x(static_cast<size_t>(n), 0.5f);
  std::vector<uint8_t> a(static_cast<size_t>(ds::cpu::vec_dot_act_row_bytes(t, n)));
  for (auto _ : state) {
    ds::cpu::vec_dot_quantize_act(t, x.data(), a.data(), n);
    benchmark::DoNotOptimize(a.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
}

// ffn_up/gate of the 27B-class dense model: 17408 rows of 5120; ffn_down: 5120 rows of 17408.
struct Shape {
  int64_t rows, n;
};
constexpr Shape kShapes[] = {{17408, 5120}, {5120, 17408}};
constexpr DType kTypes[] = {DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q8_0, DType::Q4_0,
                            DType::Q5_0, DType::F16,  DType::BF16, DType::F32};

const bool kRegistered = [] {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) benchmark::RegisterBenchmark("fma_peak/avx512", bm_fma_peak);
  for (int threads : {1, 2}) {
    benchmark::RegisterBenchmark(("read_bandwidth/threads:" + std::to_string(threads)).c_str(), bm_read_bandwidth,
                                 threads)
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
  }
  for (DType t : kTypes) {
    for (const Shape& s : kShapes) {
      for (int threads : {1, 2}) {
        const std::string name = std::string("matvec/") + ds::dtype_name(t) + "/" + std::to_string(s.rows) + "x" +
                                 std::to_string(s.n) + "/threads:" + std::to_string(threads);
        benchmark::RegisterBenchmark(name.c_str(), bm_matvec, t, s.rows, s.n, threads)
            ->Unit(benchmark::kMillisecond)
            ->MinTime(0.5);
      }
    }
    for (int threads : {1, 2}) {
      const std::string name = std::string("gemm64/") + ds::dtype_name(t) + "/17408x5120/threads:" +
                               std::to_string(threads);
      benchmark::RegisterBenchmark(name.c_str(), bm_gemm, t, int64_t{17408}, int64_t{5120}, threads)
          ->Unit(benchmark::kMillisecond)
          ->MinTime(0.5);
    }
  }
  for (DType t : {DType::Q4_K, DType::Q8_0}) {
    benchmark::RegisterBenchmark((std::string("quantize_act/") + ds::dtype_name(t) + "/5120").c_str(),
                                 bm_quantize_act, t, int64_t{5120});
  }
  return true;
}();

}  // namespace
