// matmul / get_rows / moe_ffn: the fast CPU path (quantized activations, gemm_tile) against the
// reference (dequantized rows, double dot) for every weight type, several shapes.
#include <gtest/gtest.h>

#include <random>

#include "ops/get_rows.h"
#include "ops/matmul.h"
#include "ops/moe.h"
#include "ops/op_registry.h"
#include "ops_test_util.h"
#include "quant/quant.h"

namespace ds {
namespace {

using test::Host;

double tolerance(DType t) {
  if (t == DType::F32) return test::kTolF32;
  if (t == DType::F16 || t == DType::BF16) return test::kTolHalf;
  return test::kTolQuant;
}

std::vector<uint8_t> random_weights(DType t, int64_t n_in, int64_t n_rows, std::mt19937& rng) {
  std::vector<float> f(static_cast<size_t>(n_in * n_rows));
  std::uniform_real_distribution<float> d(-1, 1);
  for (float& x : f) x = d(rng);
  std::vector<uint8_t> q(static_cast<size_t>(dtype_row_bytes(t, n_in) * n_rows));
  quant::quantize_rows(t, f.data(), q.data(), n_rows, n_in);
  return q;
}

TEST(OpsMatmul, FastMatchesReferenceForEveryWeightType) {
  std::mt19937 rng(21);
  for (DType t : matmul_weight_dtypes()) {
    if (!quant::is_convertible(t)) continue;
    const int64_t blk = dtype_block_size(t);
    for (auto [n_in, n_out, n_tok] : {std::tuple<int64_t, int64_t, int64_t>{blk, 1, 1}, {2 * blk, 17, 3},
                                      {((1024 + blk - 1) / blk) * blk, 33, 5}, {5120, 8, 2}}) {
      auto wq = random_weights(t, n_in, n_out, rng);
      TensorView w = TensorView::contiguous(wq.data(), t, {n_in, n_out});
      Host x({n_in, n_tok}), yf({n_out, n_tok}), yr({n_out, n_tok});
      x.random(rng);
      ASSERT_TRUE(matmul(test::fast_ctx(), w, x.t, yf.t).is_ok());
      ASSERT_TRUE(matmul(test::ref_ctx(), w, x.t, yr.t).is_ok());
      EXPECT_LT(test::rel_err(yf.v, yr.v), tolerance(t)) << dtype_name(t) << " " << n_in << "x" << n_out;
    }
  }
}

TEST(OpsMatmul, RejectsBadShapes) {
  Host w({32, 4}), x({16, 2}), y({4, 2});
  Status s = matmul(test::fast_ctx(), w.t, x.t, y.t);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("matmul"), std::string::npos);
}

// A device layout (Q6_K_G4, made at CUDA upload) on the CPU: a clear error, not a computation.
TEST(OpsMatmul, RejectsADeviceLayoutOnTheCpu) {
  std::mt19937 rng(23);
  auto wq = random_weights(DType::Q6_K_G4, 1024, 2, rng);
  const TensorView w = TensorView::contiguous(wq.data(), DType::Q6_K_G4, {1024, 2});
  Host x({1024, 1}), y({2, 1});
  const Status s = matmul(test::fast_ctx(), w, x.t, y.t);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.to_string();
  EXPECT_NE(s.message().find("q6_K_g4"), std::string::npos) << s.to_string();
}

TEST(OpsMatmul, GetRowsDequantizesAndChecksIds) {
  std::mt19937 rng(22);
  for (DType t : matmul_weight_dtypes()) {
    if (!quant::is_convertible(t)) continue;
    const int64_t n = dtype_block_size(t) * 2;
    auto table = random_weights(t, n, 10, rng);
    TensorView tv = TensorView::contiguous(table.data(), t, {n, 10});
    std::vector<int32_t> ids = {3, 0, 9, 3};
    TensorView it = TensorView::contiguous(ids.data(), DType::I32, {4});
    Host yf({n, 4}), yr({n, 4});
    ASSERT_TRUE(get_rows(test::fast_ctx(), tv, it, yf.t).is_ok());
    ASSERT_TRUE(get_rows(test::ref_ctx(), tv, it, yr.t).is_ok());
    EXPECT_EQ(yf.v, yr.v);
    ids[2] = 10;
    EXPECT_EQ(get_rows(test::fast_ctx(), tv, it, yf.t).code(), StatusCode::kInvalidArgument);
  }
}

TEST(OpsMatmul, MoeFfnMatchesPerTokenDenseSum) {
  // moe_ffn against an explicit per-token loop over the selected experts with reference matmuls;
  // the fused gate_up layout must give the same result as separate gate / up.
  std::mt19937 rng(23);
  const int64_t E = 32, F = 16, n_exp = 5, k = 2, n = 6;
  Host gate({E, F, n_exp}), up({E, F, n_exp}), down({F, E, n_exp}), x({E, n});
  gate.random(rng);
  up.random(rng);
  down.random(rng);
  x.random(rng);
  std::vector<int32_t> ids = {0, 3, 3, 4, 1, 0, 2, 3, 4, 0, 1, 2};
  Host w({k, n});
  w.random(rng, 0.1f, 0.9f);
  TensorView it = TensorView::contiguous(ids.data(), DType::I32, {k, n});
  MoeExperts ex{gate.t, up.t, {}, down.t};
  Host y({E, n});
  ASSERT_TRUE(moe_ffn(test::fast_ctx(), x.t, ex, it, w.t, y.t).is_ok());
  std::vector<float> expect(static_cast<size_t>(E * n), 0.0f);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = ids[t * k + j];
      std::vector<float> h(F);
      for (int64_t f = 0; f < F; ++f) {
        double g = 0, u = 0;
        for (int64_t i = 0; i < E; ++i) {
          g += gate.v[(e * F + f) * E + i] * x.v[t * E + i];
          u += up.v[(e * F + f) * E + i] * x.v[t * E + i];
        }
        h[f] = static_cast<float>(g / (1 + std::exp(-g)) * u);
      }
      for (int64_t o = 0; o < E; ++o) {
        double acc = 0;
        for (int64_t f = 0; f < F; ++f) acc += down.v[(e * E + o) * F + f] * h[f];
        expect[t * E + o] += static_cast<float>(w.v[t * k + j] * acc);
      }
    }
  }
  EXPECT_LT(test::rel_err(y.v, expect), 1e-4);
  // Fused gate_up {E, 2F, n_exp}.
  Host gu({E, 2 * F, n_exp});
  for (int64_t e = 0; e < n_exp; ++e) {
    std::copy_n(gate.v.data() + e * F * E, F * E, gu.v.data() + e * 2 * F * E);
    std::copy_n(up.v.data() + e * F * E, F * E, gu.v.data() + e * 2 * F * E + F * E);
  }
  MoeExperts fused{{}, {}, gu.t, down.t};
  Host y2({E, n});
  ASSERT_TRUE(moe_ffn(test::fast_ctx(), x.t, fused, it, w.t, y2.t).is_ok());
  EXPECT_EQ(y.v, y2.v);
  ids[5] = 7;
  EXPECT_EQ(moe_ffn(test::fast_ctx(), x.t, ex, it, w.t, y2.t).code(), StatusCode::kInvalidArgument);
}

TEST(OpsMatmul, MoeFfnQuantizedExpertsMatchReference) {
  // The fast expert loop (all experts' row tiles in one parallel loop) against the reference
  // composite, with K-quant experts and mixed gate / up types.
  std::mt19937 rng(24);
  const int64_t E = 256, F = 256, X = 6, k = 2;
  for (int64_t n : {1, 7}) {
    auto gate = random_weights(DType::Q4_K, E, F * X, rng);
    auto up = random_weights(DType::Q6_K, E, F * X, rng);
    auto down = random_weights(DType::Q4_K, F, E * X, rng);
    MoeExperts ex{TensorView::contiguous(gate.data(), DType::Q4_K, {E, F, X}),
                  TensorView::contiguous(up.data(), DType::Q6_K, {E, F, X}), {},
                  TensorView::contiguous(down.data(), DType::Q4_K, {F, E, X})};
    Host x({E, n}), w({k, n}), yf({E, n}), yr({E, n});
    x.random(rng);
    w.random(rng, 0.2f, 0.8f);
    std::vector<int32_t> ids(static_cast<size_t>(k * n));
    for (int64_t t = 0; t < n; ++t) {
      ids[t * k] = static_cast<int32_t>(t % X);
      ids[t * k + 1] = static_cast<int32_t>((t + 3) % X);
    }
    TensorView it = TensorView::contiguous(ids.data(), DType::I32, {k, n});
    ASSERT_TRUE(moe_ffn(test::fast_ctx(), x.t, ex, it, w.t, yf.t).is_ok());
    ASSERT_TRUE(moe_ffn(test::ref_ctx(), x.t, ex, it, w.t, yr.t).is_ok());
    EXPECT_LT(test::rel_err(yf.v, yr.v), test::kTolQuant) << n;
  }
}

}  // namespace
}  // namespace ds
