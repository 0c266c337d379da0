// Round trips through every quantizer on normal and heavy-tailed data, with relative RMSE bounds,
// and a check that the K-quant scale search beats a plain min/max scale on the same data.
// Bounds were measured (see kBounds) and set with roughly 25% margin.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/half.h"
#include "quant/blocks.h"
#include "quant/quant.h"

namespace ds::quant {
namespace {

std::vector<float> normal_data(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = nd(rng);
  return x;
}

// Student-t with 3 degrees of freedom, plus 1% of elements scaled by 20 (outlier channels).
std::vector<float> heavy_data(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::student_t_distribution<float> td(3.0f);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = td(rng) * (u(rng) < 0.01f ? 20.0f : 1.0f) * 0.05f;
  return x;
}

double rel_rmse(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0.0, ref = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    err += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    ref += static_cast<double>(a[i]) * a[i];
  }
  return std::sqrt(err / ref);
}

double round_trip(DType t, const std::vector<float>& x) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> q(static_cast<size_t>(dtype_row_bytes(t, n)));
  quantize_row(t, x.data(), q.data(), n);
  std::vector<float> y(x.size());
  dequantize_row(t, q.data(), y.data(), n);
  return rel_rmse(x, y);
}

struct Bound {
  DType type;
  double normal;  // relative RMSE bound on N(0, 1) data
  double heavy;   // on heavy-tailed data
};

// Measured relative RMSE (normal / heavy): f16 0.00021/0.00019, bf16 0.0017/0.0016,
// q8_0 0.0054/0.0116, q8_K 0.0071/0.030, q6_K 0.0179/0.0306, q5_K 0.036/0.049, q5_0 0.043/0.068,
// q5_1 0.038/0.058, q4_K 0.072/0.078, q4_0 0.087/0.107. On N(0,1) these sit at step/sqrt(12) for a
// step of (block range)/(levels - 1), as expected of a uniform quantizer; heavy tails widen the range.
constexpr Bound kBounds[] = {
    {DType::F16, 3e-4, 3e-4},      {DType::BF16, 2.2e-3, 2.2e-3}, {DType::Q8_0, 0.007, 0.015},
    {DType::Q8_K, 0.009, 0.038},   {DType::Q6_K, 0.023, 0.038},   {DType::Q5_K, 0.045, 0.062},
    {DType::Q5_0, 0.054, 0.085},   {DType::Q5_1, 0.048, 0.073},   {DType::Q4_K, 0.09, 0.098},
    {DType::Q4_0, 0.11, 0.134},
};

TEST(QuantRoundTrip, RelativeRmseWithinBounds) {
  const int64_t n = 256 * 64;
  const auto normal = normal_data(n, 1);
  const auto heavy = heavy_data(n, 2);
  for (const Bound& b : kBounds) {
    const double en = round_trip(b.type, normal), eh = round_trip(b.type, heavy);
    std::printf("  %-5s rel rmse normal %.5f heavy %.5f\n", dtype_name(b.type), en, eh);
    EXPECT_LT(en, b.normal) << dtype_name(b.type);
    EXPECT_LT(eh, b.heavy) << dtype_name(b.type);
    EXPECT_GT(en, 0.0) << dtype_name(b.type);  // a lossy type that reproduces exactly is suspicious
  }
  EXPECT_EQ(round_trip(DType::F32, normal), 0.0);
}

TEST(QuantRoundTrip, ZerosAndConstantsStayExact) {
  for (DType t : {DType::Q4_0, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K,
                  DType::Q8_K}) {
    std::vector<float> zero(512, 0.0f);
    std::vector<uint8_t> q(static_cast<size_t>(dtype_row_bytes(t, 512)));
    quantize_row(t, zero.data(), q.data(), 512);
    std::vector<float> y(512, 1.0f);
    dequantize_row(t, q.data(), y.data(), 512);
    for (float v : y) ASSERT_EQ(v, 0.0f) << dtype_name(t);
  }
}

TEST(QuantRoundTrip, SymmetricTypesHitTheSignedMaxExactly) {
  // Q4_0 maps the largest-magnitude element to code 0 (value -8 d = that element), up to fp16 d.
  std::vector<float> x = normal_data(32, 3);
  x[5] = -3.0f;
  std::vector<uint8_t> q(18);
  quantize_row(DType::Q4_0, x.data(), q.data(), 32);
  std::vector<float> y(32);
  dequantize_row(DType::Q4_0, q.data(), y.data(), 32);
  EXPECT_EQ(y[5], -3.0f);
  x[5] = 3.0f;
  quantize_row(DType::Q4_0, x.data(), q.data(), 32);
  dequantize_row(DType::Q4_0, q.data(), y.data(), 32);
  EXPECT_EQ(y[5], 3.0f);
}

TEST(QuantRoundTrip, Q8_KBsumsAreGroupSums) {
  const auto x = heavy_data(512, 4);
  std::vector<BlockQ8_K> q(2);
  quantize_row(DType::Q8_K, x.data(), q.data(), 512);
  for (const auto& b : q) {
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += b.qs[16 * g + l];
      EXPECT_EQ(b.bsums[g], sum);
    }
  }
}

TEST(QuantRoundTrip, RowsHelpersMatchRowByRowOnThreads) {
  const int64_t n_rows = 7, n_per_row = 512;
  const auto x = heavy_data(n_rows * n_per_row, 5);
  for (DType t : {DType::Q4_K, DType::Q8_0, DType::BF16}) {
    const int64_t rb = dtype_row_bytes(t, n_per_row);
    std::vector<uint8_t> a(static_cast<size_t>(rb * n_rows)), b(a.size());
    quantize_rows(t, x.data(), a.data(), n_rows, n_per_row, 3);
    for (int64_t r = 0; r < n_rows; ++r) quantize_row(t, x.data() + r * n_per_row, b.data() + r * rb, n_per_row);
    EXPECT_EQ(a, b) << dtype_name(t);
    std::vector<float> ya(x.size()), yb(x.size());
    dequantize_rows(t, a.data(), ya.data(), n_rows, n_per_row, 2);
    for (int64_t r = 0; r < n_rows; ++r) {
      dequantize_row(t, a.data() + r * rb, yb.data() + r * n_per_row, n_per_row);
    }
    EXPECT_EQ(ya, yb) << dtype_name(t);
  }
}

// ---- K-quant search vs a plain min/max scale ----

void pack_k_scales(const int* sc, const int* m, uint8_t* out) {
  std::memset(out, 0, 12);
  for (int j = 0; j < 4; ++j) {
    out[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    out[j + 4] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
    out[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
  }
}

// Q4_K block with scale = (max - min) / 15 and min = min(x) per sub-block, no search.
void naive_q4_k(const float* x, BlockQ4_K* b) {
  float scale[8], mn[8], max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    const float lo = std::min(0.0f, *std::min_element(x + 32 * j, x + 32 * j + 32));
    const float hi = *std::max_element(x + 32 * j, x + 32 * j + 32);
    scale[j] = (hi - lo) / 15.0f;
    mn[j] = -lo;
    max_scale = std::max(max_scale, scale[j]);
    max_min = std::max(max_min, mn[j]);
  }
  int sc[8], m[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = std::min(63, static_cast<int>(std::lrintf(scale[j] / max_scale * 63.0f)));
    m[j] = max_min > 0 ? std::min(63, static_cast<int>(std::lrintf(mn[j] / max_min * 63.0f))) : 0;
  }
  pack_k_scales(sc, m, b->scales);
  b->d = f32_to_fp16(max_scale / 63.0f);
  b->dmin = f32_to_fp16(max_min / 63.0f);
  const float d = fp16_to_f32(b->d), dmin = fp16_to_f32(b->dmin);
  uint8_t L[256];
  for (int j = 0; j < 8; ++j) {
    for (int l = 0; l < 32; ++l) {
      const float v = d * sc[j] > 0 ? (x[32 * j + l] + dmin * m[j]) / (d * sc[j]) : 0.0f;
      L[32 * j + l] = static_cast<uint8_t>(std::clamp(static_cast<int>(std::lrintf(v)), 0, 15));
    }
  }
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) b->qs[32 * c + l] = static_cast<uint8_t>(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
  }
}

TEST(QuantRoundTrip, KQuantSearchBeatsMinMaxScale) {
  const int64_t n = 256 * 32;
  for (int kind = 0; kind < 2; ++kind) {
    const auto x = kind == 0 ? normal_data(n, 6) : heavy_data(n, 7);
    std::vector<BlockQ4_K> naive(static_cast<size_t>(n / 256));
    for (size_t i = 0; i < naive.size(); ++i) naive_q4_k(x.data() + 256 * i, &naive[i]);
    std::vector<float> y(x.size());
    dequantize_row(DType::Q4_K, naive.data(), y.data(), n);
    const double e_naive = rel_rmse(x, y);
    const double e_search = round_trip(DType::Q4_K, x);
    std::printf("  q4_K %s: min/max %.5f search %.5f\n", kind == 0 ? "normal" : "heavy", e_naive, e_search);
    EXPECT_LT(e_search, 0.9 * e_naive);
  }
}

// Q6_K block with each 16-element sub-block scaled by its signed max (x = scale * q, q in
// [-32, 31], the max element on -32), 8-bit sub-block scales, no search. Packed per the spec.
void naive_q6_k(const float* x, BlockQ6_K* b) {
  float scale[16], max_abs = 0.0f, max_scale = 0.0f;
  for (int s = 0; s < 16; ++s) {
    float amax = 0.0f, mx = 0.0f;
    for (int l = 0; l < 16; ++l) {
      if (std::fabs(x[16 * s + l]) > amax) amax = std::fabs(x[16 * s + l]), mx = x[16 * s + l];
    }
    scale[s] = mx / -32.0f;
    if (std::fabs(scale[s]) > max_abs) max_abs = std::fabs(scale[s]), max_scale = scale[s];
  }
  const float d = max_scale / -128.0f;
  b->d = f32_to_fp16(d);
  const float dd = fp16_to_f32(b->d);
  uint8_t L[256];
  for (int s = 0; s < 16; ++s) {
    b->scales[s] = static_cast<int8_t>(std::clamp(static_cast<int>(std::lrintf(scale[s] / d)), -128, 127));
    const float ds = dd * b->scales[s];
    for (int l = 0; l < 16; ++l) {
      const int q = ds != 0.0f ? static_cast<int>(std::lrintf(x[16 * s + l] / ds)) : 0;
      L[16 * s + l] = static_cast<uint8_t>(std::clamp(q, -32, 31) + 32);
    }
  }
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 32; ++l) {
      const int q1 = L[128 * h + l], q2 = L[128 * h + l + 32], q3 = L[128 * h + l + 64], q4 = L[128 * h + l + 96];
      b->ql[64 * h + l] = static_cast<uint8_t>((q1 & 0xF) | ((q3 & 0xF) << 4));
      b->ql[64 * h + l + 32] = static_cast<uint8_t>((q2 & 0xF) | ((q4 & 0xF) << 4));
      b->qh[32 * h + l] = static_cast<uint8_t>((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
    }
  }
}

TEST(QuantRoundTrip, Q6_KSearchBeatsMaxScale) {
  const int64_t n = 256 * 32;
  for (int kind = 0; kind < 2; ++kind) {
    const auto x = kind == 0 ? normal_data(n, 8) : heavy_data(n, 9);
    std::vector<BlockQ6_K> naive(static_cast<size_t>(n / 256));
    for (size_t i = 0; i < naive.size(); ++i) naive_q6_k(x.data() + 256 * i, &naive[i]);
    std::vector<float> y(x.size());
    dequantize_row(DType::Q6_K, naive.data(), y.data(), n);
    const double e_naive = rel_rmse(x, y);
    const double e_search = round_trip(DType::Q6_K, x);
    std::printf("  q6_K %s: max scale %.5f search %.5f\n", kind == 0 ? "normal" : "heavy", e_naive, e_search);
    // Measured gain: 6% (normal), 0.4% (heavy; there the 8-bit sub-block scales dominate the error).
    EXPECT_LT(e_search, (kind == 0 ? 0.97 : 1.0) * e_naive);
  }
}

}  // namespace
}  // namespace ds::quant
