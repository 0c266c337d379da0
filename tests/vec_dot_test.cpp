// CPU dot products: every ISA path this machine has (scalar, AVX2, AVX-512 VNNI) against the
// scalar path and against dequantize + double-precision dot, over many sizes (including the real
// model widths), normal and heavy-tailed data, misaligned buffers; gemm_tile against a vec_dot loop.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "ops/cpu/membw.h"
#include "ops/cpu/vec_dot.h"
#include "ops/cpu/vec_dot_internal.h"
#include "quant/blocks.h"
#include "quant/quant.h"

namespace ds::cpu {
namespace {

std::vector<float> make_data(int64_t n, uint32_t seed, bool heavy) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::student_t_distribution<float> td(3.0f);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = heavy ? td(rng) * (u(rng) < 0.01f ? 20.0f : 1.0f) : nd(rng);
  return x;
}

std::vector<const char*> isas() {
  std::vector<const char*> out = {"scalar"};
  if (cpu_has_avx2()) out.push_back("avx2");
  if (cpu_has_avx512vnni()) out.push_back("avx512vnni");
  return out;
}

// Restores automatic dispatch when a test ends, even on failure.
struct IsaGuard {
  ~IsaGuard() { vec_dot_force_isa(nullptr); }
};

constexpr DType kWeightTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q4_0, DType::Q5_0,
                                  DType::Q5_1, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K};

std::vector<int64_t> sizes_for(DType t) {
  const int64_t bs = dtype_block_size(t);
  if (bs == 1) return {1, 7, 16, 33, 100, 1024, 4096, 5120};
  if (bs == 32) return {32, 64, 96, 160, 1024, 4096, 5120, 17408};
  return {256, 512, 768, 2048, 4096, 5120, 17408};
}

// A weight row and an activation row, stored one byte past an aligned address.
struct Case {
  DType type;
  int64_t n;
  std::vector<uint8_t> w_buf, a_buf;
  std::vector<float> w_deq, a_deq, x;
  const void* w() const { return w_buf.data() + 1; }
  const void* a() const { return a_buf.data() + 1; }
};

Case make_case(DType t, int64_t n, uint32_t seed, bool heavy) {
  Case c{t, n, {}, {}, {}, {}, {}};
  const auto wf = make_data(n, seed, heavy);
  c.x = make_data(n, seed + 1000, heavy);
  c.w_buf.resize(static_cast<size_t>(dtype_row_bytes(t, n)) + 1);
  quant::quantize_row(t, wf.data(), c.w_buf.data() + 1, n);
  c.w_deq.resize(static_cast<size_t>(n));
  quant::dequantize_row(t, c.w(), c.w_deq.data(), n);
  c.a_buf.resize(static_cast<size_t>(vec_dot_act_row_bytes(t, n)) + 1);
  vec_dot_quantize_act(t, c.x.data(), c.a_buf.data() + 1, n);
  c.a_deq.resize(static_cast<size_t>(n));
  quant::dequantize_row(vec_dot_act_type(t), c.a(), c.a_deq.data(), n);
  return c;
}

TEST(VecDot, ActivationTypes) {
  EXPECT_EQ(vec_dot_act_type(DType::Q4_0), DType::Q8_0);
  EXPECT_EQ(vec_dot_act_type(DType::Q5_1), DType::Q8_0);
  EXPECT_EQ(vec_dot_act_type(DType::Q8_0), DType::Q8_0);
  EXPECT_EQ(vec_dot_act_type(DType::Q4_K), DType::Q8_K);
  EXPECT_EQ(vec_dot_act_type(DType::Q6_K), DType::Q8_K);
  EXPECT_EQ(vec_dot_act_type(DType::BF16), DType::F32);
  EXPECT_EQ(vec_dot_act_row_bytes(DType::Q4_K, 512), 2 * 292);
  EXPECT_EQ(vec_dot_act_row_bytes(DType::F16, 10), 40);
}

TEST(VecDot, EveryPathMatchesScalarAndDequantizedDot) {
  IsaGuard guard;
  uint32_t seed = 1;
  for (DType t : kWeightTypes) {
    for (int64_t n : sizes_for(t)) {
      for (bool heavy : {false, true}) {
        const Case c = make_case(t, n, seed++, heavy);
        // Reference: the exact dot of the two dequantized rows, and its absolute-value sum, which
        // bounds float rounding of any summation order.
        double ref = 0.0, abs_sum = 0.0, ref_x = 0.0, err_scale = 0.0;
        for (int64_t k = 0; k < n; ++k) {
          ref += static_cast<double>(c.w_deq[k]) * c.a_deq[k];
          abs_sum += std::fabs(static_cast<double>(c.w_deq[k]) * c.a_deq[k]);
          ref_x += static_cast<double>(c.w_deq[k]) * c.x[k];
          const double e = static_cast<double>(c.w_deq[k]) * (c.a_deq[k] - c.x[k]);
          err_scale += e * e;
        }
        vec_dot_force_isa("scalar");
        const float scalar = vec_dot(t, n, c.w(), c.a());
        for (const char* isa : isas()) {
          vec_dot_force_isa(isa);
          const float got = vec_dot(t, n, c.w(), c.a());
          const std::string what = std::string(isa) + " " + dtype_name(t) + " n=" + std::to_string(n) +
                                   (heavy ? " heavy" : " normal");
          // Float sums of exact per-block integer sums: a few ulps of the absolute-value sum.
          EXPECT_NEAR(got, ref, 2e-6 * abs_sum + 1e-30) << what;
          EXPECT_NEAR(got, scalar, 2e-6 * abs_sum + 1e-30) << what;
          // Against the unquantized activations the error is the activation quantization error
          // sum_k w_k (a_k - x_k): bounded by 6 sigma of a sum of independent rounding errors.
          EXPECT_NEAR(got, ref_x, 6.0 * std::sqrt(err_scale) + 2e-6 * abs_sum) << what;
        }
      }
    }
  }
}

// gemm_tile over rows [2, 9) of an 11-row matrix, y with a stride wider than the matrix, against
// vec_dot row by row; every ISA path, token counts around the register tiles' sizes.
void check_gemm_tile(DType t, int64_t n, uint32_t* seed) {
  const int64_t n_rows = 11;
  const int64_t w_rb = dtype_row_bytes(t, n), a_rb = vec_dot_act_row_bytes(t, n);
  const auto wf = make_data(n * n_rows, (*seed)++, true);
  std::vector<uint8_t> w(static_cast<size_t>(w_rb * n_rows));
  quant::quantize_rows(t, wf.data(), w.data(), n_rows, n);
  std::vector<float> w_deq(static_cast<size_t>(n * n_rows)), a_deq(static_cast<size_t>(n));
  quant::dequantize_rows(t, w.data(), w_deq.data(), n_rows, n);
  for (int64_t n_tokens : {1, 2, 3, 4, 5, 9, 17}) {
    const auto xf = make_data(n * n_tokens, (*seed)++, false);
    std::vector<uint8_t> a(static_cast<size_t>(a_rb * n_tokens));
    for (int64_t tk = 0; tk < n_tokens; ++tk) vec_dot_quantize_act(t, xf.data() + tk * n, a.data() + tk * a_rb, n);
    for (const char* isa : isas()) {
      vec_dot_force_isa(isa);
      const int64_t y_stride = n_rows + 3, r0 = 2, r1 = 9;
      std::vector<float> y(static_cast<size_t>(y_stride * n_tokens), -7.0f);
      gemm_tile(t, n, w.data(), w_rb, r0, r1, a.data(), a_rb, n_tokens, y.data(), y_stride);
      for (int64_t tk = 0; tk < n_tokens; ++tk) {
        quant::dequantize_row(vec_dot_act_type(t), a.data() + tk * a_rb, a_deq.data(), n);
        for (int64_t r = 0; r < y_stride; ++r) {
          const float got = y[tk * y_stride + r];
          if (r < r0 || r >= r1) {
            EXPECT_EQ(got, -7.0f) << "wrote outside the tile: row " << r;
            continue;
          }
          double abs_sum = 0.0;
          for (int64_t k = 0; k < n; ++k) abs_sum += std::fabs(static_cast<double>(w_deq[r * n + k]) * a_deq[k]);
          const float want = vec_dot(t, n, w.data() + r * w_rb, a.data() + tk * a_rb);
          EXPECT_NEAR(got, want, 4e-6 * abs_sum + 1e-30) << isa << " " << dtype_name(t) << " n=" << n << " tokens "
                                                         << n_tokens << " row " << r << " token " << tk;
        }
      }
    }
  }
}

TEST(VecDot, GemmTileMatchesVecDotLoop) {
  IsaGuard guard;
  uint32_t seed = 500;
  for (DType t : kWeightTypes) {
    // Small rows, and rows spanning several of the kernels' column chunks (8 super-blocks, 128
    // blocks, 4096 floats) with a ragged last chunk.
    const int64_t bs = dtype_block_size(t);
    check_gemm_tile(t, bs == 256 ? 512 : 160, &seed);
    check_gemm_tile(t, bs == 256 ? 256 * 19 : bs == 32 ? 32 * 300 : 5003, &seed);
  }
}

// Q8_0 files from other tools may hold the code -128; with activations at +-127 the AVX2 pair
// sums reach 2 * 128 * 127, the most vpmaddubsw can hold without saturating.
TEST(VecDot, Q8_0ExtremeCodesDoNotSaturate) {
  IsaGuard guard;
  const int64_t n = 256;
  std::vector<uint8_t> w(static_cast<size_t>(dtype_row_bytes(DType::Q8_0, n)));
  std::vector<uint8_t> a(w.size());
  auto* wb = reinterpret_cast<quant::BlockQ8_0*>(w.data());
  auto* ab = reinterpret_cast<quant::BlockQ8_0*>(a.data());
  int64_t want = 0;
  for (int64_t i = 0; i < n / 32; ++i) {
    wb[i].d = 0x3C00;  // 1.0
    ab[i].d = 0x3C00;
    for (int j = 0; j < 32; ++j) {
      wb[i].qs[j] = static_cast<int8_t>(j % 2 == 0 ? -128 : 127);
      ab[i].qs[j] = static_cast<int8_t>(j % 3 == 0 ? 127 : -127);
      want += static_cast<int64_t>(wb[i].qs[j]) * ab[i].qs[j];
    }
  }
  for (const char* isa : isas()) {
    vec_dot_force_isa(isa);
    EXPECT_EQ(vec_dot(DType::Q8_0, n, w.data(), a.data()), static_cast<float>(want)) << isa;
  }
}

TEST(VecDot, ForceScalarSwitchesPath) {
  IsaGuard guard;
  vec_dot_force_scalar(true);
  EXPECT_STREQ(vec_dot_isa(), "scalar");
  vec_dot_force_scalar(false);
  if (cpu_has_avx512vnni()) {
    EXPECT_STREQ(vec_dot_isa(), "avx512vnni");
  }
}

TEST(MemBandwidth, ReportsAPlausibleFigure) {
  // 64 MiB is past this machine's caches per core; any real DRAM reads between 0.5 and 2000 GB/s.
  const double gbps = measure_read_bandwidth_gbps(2, int64_t{64} << 20);
  EXPECT_GT(gbps, 0.5);
  EXPECT_LT(gbps, 2000.0);
}

}  // namespace
}  // namespace ds::cpu
