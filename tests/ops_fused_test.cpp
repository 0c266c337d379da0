// Fused ops on the CPU against the unfused chains they replace: matmul_many (one input, several
// weights), matmul_swiglu (SwiGLU + down projection). The CPU forms run the same arithmetic, so
// results must be bit-identical (fast and reference paths); bad arguments come back as a Status
// naming the op.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops_test_util.h"
#include "quant/quant.h"

namespace ds {
namespace {

using test::Host;

struct QWeight {
  std::vector<uint8_t> bytes;
  TensorView t;
};

QWeight random_weight(DType type, int64_t n_in, int64_t n_out, std::mt19937& rng) {
  std::vector<float> f(static_cast<size_t>(n_in * n_out));
  std::uniform_real_distribution<float> d(-1, 1);
  for (float& x : f) x = d(rng);
  QWeight w;
  w.bytes.resize(static_cast<size_t>(dtype_row_bytes(type, n_in) * n_out));
  quant::quantize_rows(type, f.data(), w.bytes.data(), n_out, n_in);
  w.t = TensorView::contiguous(w.bytes.data(), type, {n_in, n_out});
  return w;
}

// First index where a and b differ bitwise (NaN patterns included), or -1.
int64_t first_bit_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], 4) != 0) return static_cast<int64_t>(i);
  }
  return -1;
}

TEST(OpsFused, MatmulManyEqualsSeparateProducts) {
  std::mt19937 rng(31);
  const int64_t n_in = 512;
  const DType types[] = {DType::Q4_K, DType::Q8_0, DType::F32, DType::Q6_K};
  const int64_t rows[] = {40, 17, 3, 1};
  std::vector<QWeight> ws;
  for (int i = 0; i < 4; ++i) ws.push_back(random_weight(types[i], n_in, rows[i], rng));
  for (const OpContext& ctx : {test::fast_ctx(), test::ref_ctx()}) {
    for (int64_t n_tok : {1, 3, 20}) {
      Host x({n_in, n_tok});
      x.random(rng);
      std::vector<Host> fused, single;
      std::vector<TensorView> wv, yv;
      for (int i = 0; i < 4; ++i) {
        fused.emplace_back(std::initializer_list<int64_t>{rows[i], n_tok});
        single.emplace_back(std::initializer_list<int64_t>{rows[i], n_tok});
        wv.push_back(ws[i].t);
      }
      for (int i = 0; i < 4; ++i) yv.push_back(fused[i].t);
      ASSERT_TRUE(matmul_many(ctx, wv, x.t, yv).is_ok());
      for (int i = 0; i < 4; ++i) {
        ASSERT_TRUE(matmul(ctx, ws[i].t, x.t, single[i].t).is_ok());
        const int64_t bad = first_bit_difference(fused[i].v, single[i].v);
        EXPECT_EQ(bad, -1) << "product " << i << " (" << dtype_name(types[i]) << ") tokens " << n_tok
                           << " reference " << ctx.reference << ": first difference at " << bad;
      }
    }
  }
}

TEST(OpsFused, MatmulManyChecksEveryProduct) {
  std::mt19937 rng(32);
  QWeight a = random_weight(DType::Q8_0, 64, 8, rng), b = random_weight(DType::Q8_0, 64, 4, rng);
  Host x({64, 2}), ya({8, 2}), yb({4, 2}), wrong({5, 2});
  const TensorView ws[] = {a.t, b.t};
  {
    const TensorView ys[] = {ya.t};
    const Status s = matmul_many(test::fast_ctx(), ws, x.t, ys);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("matmul_many"), std::string::npos) << s.message();
  }
  {
    const TensorView ys[] = {ya.t, wrong.t};
    const Status s = matmul_many(test::fast_ctx(), ws, x.t, ys);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("product 1"), std::string::npos) << s.message();
  }
  {
    QWeight c = random_weight(DType::Q8_0, 64, 8, rng);
    const TensorView ws2[] = {a.t, c.t};
    const TensorView ys[] = {ya.t, ya.t};
    const Status s = matmul_many(test::fast_ctx(), ws2, x.t, ys);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("alias"), std::string::npos) << s.message();
  }
  const TensorView none[] = {ya.t};
  EXPECT_TRUE(matmul_many(test::fast_ctx(), std::span<const TensorView>(), x.t,
                          std::span<const TensorView>(none, 0)).is_ok());
}

TEST(OpsFused, MatmulSwigluEqualsSwigluThenMatmul) {
  std::mt19937 rng(33);
  for (DType type : {DType::Q4_K, DType::Q6_K, DType::F32, DType::BF16}) {
    for (auto [n_ff, n_out, n_tok] : {std::tuple<int64_t, int64_t, int64_t>{256, 1, 1}, {512, 33, 3}, {1024, 16, 17}}) {
      QWeight w = random_weight(type, n_ff, n_out, rng);
      for (const OpContext& ctx : {test::fast_ctx(), test::ref_ctx()}) {
        Host gate({n_ff, n_tok}), up({n_ff, n_tok}), y({n_out, n_tok}), y_ref({n_out, n_tok});
        gate.random(rng, -4, 4);
        up.random(rng, -2, 2);
        Host gate2 = gate;
        gate2.t.data = gate2.v.data();
        ASSERT_TRUE(matmul_swiglu(ctx, w.t, gate.t, up.t, y.t).is_ok());
        ASSERT_TRUE(swiglu(ctx, gate2.t, up.t, gate2.t).is_ok());
        ASSERT_TRUE(matmul(ctx, w.t, gate2.t, y_ref.t).is_ok());
        const int64_t bad = first_bit_difference(y.v, y_ref.v);
        EXPECT_EQ(bad, -1) << dtype_name(type) << " " << n_ff << "x" << n_out << " tokens " << n_tok << " reference "
                           << ctx.reference << ": first difference at " << bad;
      }
    }
  }
}

TEST(OpsFused, MatmulSwigluRejectsMismatchedUp) {
  std::mt19937 rng(34);
  QWeight w = random_weight(DType::Q8_0, 64, 8, rng);
  Host gate({64, 2}), up({64, 3}), y({8, 2});
  const Status s = matmul_swiglu(test::fast_ctx(), w.t, gate.t, up.t, y.t);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("matmul_swiglu"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace ds
