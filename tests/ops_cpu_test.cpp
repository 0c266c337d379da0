// Fast CPU ops against the scalar references on random inputs (sizes 1, odd, and real model
// shapes), with outputs poisoned by NaN first so unwritten elements fail. Also checks that bad
// shapes come back as a Status naming the op.
#include <gtest/gtest.h>

#include <random>

#include "ops/attention.h"
#include "ops/conv1d.h"
#include "ops/delta_net.h"
#include "ops/elementwise.h"
#include "ops/moe.h"
#include "ops/op_registry.h"
#include "ops/rms_norm.h"
#include "ops/rope.h"
#include "ops_test_util.h"
#include "quant/quant.h"

namespace ds {
namespace {

using test::Host;
using test::kTolF32;

TEST(OpsCpu, RmsNormAndL2NormMatchReference) {
  std::mt19937 rng(1);
  for (auto [n, rows] : {std::pair<int64_t, int64_t>{1, 1}, {7, 3}, {256, 5}, {2048, 2}, {5120, 1}}) {
    Host x({n, rows}), w({n}), yf({n, rows}), yr({n, rows});
    x.random(rng, -3, 3);
    w.random(rng, 0.5, 1.5);
    ASSERT_TRUE(rms_norm(test::fast_ctx(), x.t, w.t, 1e-6f, yf.t).is_ok());
    ASSERT_TRUE(rms_norm(test::ref_ctx(), x.t, w.t, 1e-6f, yr.t).is_ok());
    EXPECT_LT(test::rel_err(yf.v, yr.v), kTolF32) << n;
    yf.poison();
    yr.poison();
    ASSERT_TRUE(l2_norm(test::fast_ctx(), x.t, 1e-6f, yf.t).is_ok());
    ASSERT_TRUE(l2_norm(test::ref_ctx(), x.t, 1e-6f, yr.t).is_ok());
    EXPECT_LT(test::rel_err(yf.v, yr.v), kTolF32) << n;
  }
  // In place is allowed; the L2 norm of a row is 1.
  Host x({16, 2});
  x.random(rng);
  ASSERT_TRUE(l2_norm(test::fast_ctx(), x.t, 0.0f, x.t).is_ok());
  double ss = 0;
  for (int i = 0; i < 16; ++i) ss += x.v[i] * x.v[i];
  EXPECT_NEAR(ss, 1.0, 1e-5);
}

TEST(OpsCpu, RmsNormRejectsMismatchedWeight) {
  Host x({8, 2}), w({7}), y({8, 2});
  Status s = rms_norm(test::fast_ctx(), x.t, w.t, 1e-6f, y.t);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("rms_norm"), std::string::npos) << s.message();
}

TEST(OpsCpu, RopeMatchesReference) {
  std::mt19937 rng(2);
  struct Case { int64_t d, h, t, rot, pos0; };
  for (Case c : {Case{2, 1, 1, 2, 0}, Case{16, 3, 5, 8, 7}, Case{256, 4, 9, 64, 1000}}) {
    Host a({c.d, c.h, c.t}), b({c.d, c.h, c.t});
    a.random(rng);
    b.v = a.v;
    ASSERT_TRUE(rope_neox(test::fast_ctx(), a.t, c.rot, 1e7f, c.pos0).is_ok());
    ASSERT_TRUE(rope_neox(test::ref_ctx(), b.t, c.rot, 1e7f, c.pos0).is_ok());
    EXPECT_LT(test::rel_err(a.v, b.v), 1e-5);
  }
  // Position 0 is the identity; dims past n_rot never change.
  Host x({16, 1, 2}), y({16, 1, 2});
  x.random(rng);
  y.v = x.v;
  ASSERT_TRUE(rope_neox(test::fast_ctx(), x.t, 8, 10000.0f, 0).is_ok());
  for (int i = 0; i < 16; ++i) EXPECT_EQ(x.v[i], y.v[i]);
  for (int i = 24; i < 32; ++i) EXPECT_EQ(x.v[i], y.v[i]);
  EXPECT_NE(x.v[16], y.v[16]);
}

TEST(OpsCpu, ElementwiseMatchReference) {
  std::mt19937 rng(3);
  for (int64_t n : {1, 13, 10000}) {
    Host a({n, 3}), b({n, 3}), g({1, 3}), yf({n, 3}), yr({n, 3});
    a.random(rng, -6, 6);
    b.random(rng, -6, 6);
    g.random(rng, -6, 6);
    using Fn = Status (*)(const OpContext&, const TensorView&, const TensorView&, const TensorView&);
    for (Fn fn : {Fn(add), Fn(mul), Fn(swiglu), Fn(mul_sigmoid)}) {
      yf.poison();
      yr.poison();
      ASSERT_TRUE(fn(test::fast_ctx(), a.t, b.t, yf.t).is_ok());
      ASSERT_TRUE(fn(test::ref_ctx(), a.t, b.t, yr.t).is_ok());
      EXPECT_LT(test::rel_err(yf.v, yr.v), kTolF32);
    }
    ASSERT_TRUE(mul_sigmoid(test::fast_ctx(), a.t, g.t, yf.t).is_ok());
    ASSERT_TRUE(mul_sigmoid(test::ref_ctx(), a.t, g.t, yr.t).is_ok());
    EXPECT_LT(test::rel_err(yf.v, yr.v), kTolF32);
    for (auto fn : {&silu, &sigmoid}) {
      yf.poison();
      yr.poison();
      ASSERT_TRUE(fn(test::fast_ctx(), a.t, yf.t).is_ok());
      ASSERT_TRUE(fn(test::ref_ctx(), a.t, yr.t).is_ok());
      EXPECT_LT(test::rel_err(yf.v, yr.v), kTolF32);
    }
  }
  Host a({4, 2}), b({5, 2}), y({4, 2});
  EXPECT_EQ(add(test::fast_ctx(), a.t, b.t, y.t).code(), StatusCode::kInvalidArgument);
}

TEST(OpsCpu, CopyHandlesStridedSource) {
  Host src({8, 3});
  for (int i = 0; i < 24; ++i) src.v[i] = static_cast<float>(i);
  TensorView s = src.t;  // the first 4 columns of each row
  s.ne[0] = 4;
  Host dst({4, 3});
  ASSERT_TRUE(copy(test::fast_ctx(), s, dst.t).is_ok());
  EXPECT_EQ(dst.v[4], 8.0f);
  EXPECT_EQ(dst.v[11], 19.0f);
}

// The block-quantized KV append (Q8_0, Q4_0): each row's blocks are quant::quantize_row's bytes (the
// bits the CUDA append writes too), whatever the source's row stride.
class OpsCpuCopyQuant : public ::testing::TestWithParam<DType> {};

TEST_P(OpsCpuCopyQuant, CopyIsQuantizeRow) {
  const DType dt = GetParam();
  std::mt19937 rng(6);
  for (auto [n, rows] : {std::pair<int64_t, int64_t>{32, 2}, {64, 5}, {256, 3}, {1024, 2}}) {
    Host src({n + 8, rows});  // the first n columns of each row
    src.random(rng, -3, 3);
    std::fill_n(src.v.begin(), 32, 0.0f);  // an all-zero block: d = 0
    src.v[static_cast<size_t>((rows - 1) * (n + 8) + n - 1)] = -1e4f;  // a block with one large value
    TensorView s = src.t;
    s.ne[0] = n;
    const int64_t row_bytes = dtype_row_bytes(dt, n);
    std::vector<uint8_t> got(static_cast<size_t>(row_bytes * rows), 0xAB), want(got.size());
    ASSERT_TRUE(copy(test::fast_ctx(), s, TensorView::contiguous(got.data(), dt, {n, rows})).is_ok());
    for (int64_t r = 0; r < rows; ++r) {
      quant::quantize_row(dt, src.v.data() + r * (n + 8), want.data() + r * row_bytes, n);
    }
    EXPECT_EQ(got, want) << n << " x " << rows;
  }
  // Rows that are not whole blocks, or not contiguous, are refused.
  Host src({48, 2});
  std::vector<uint8_t> dst(256);
  TensorView bad = TensorView::contiguous(dst.data(), dt, {64, 2});
  bad.ne[0] = 48;
  EXPECT_EQ(copy(test::fast_ctx(), src.t, bad).code(), StatusCode::kInvalidArgument);
  Host src64({64, 2});
  TensorView strided = TensorView::contiguous(dst.data(), dt, {64, 2});
  strided.nb[0] = 17;
  EXPECT_EQ(copy(test::fast_ctx(), src64.t, strided).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(copy(test::fast_ctx(), src64.t, TensorView::contiguous(dst.data(), dt, {32, 4})).code(),
            StatusCode::kInvalidArgument);
  // A block type that is no KV cache type.
  EXPECT_EQ(copy(test::fast_ctx(), src64.t, TensorView::contiguous(dst.data(), DType::Q5_0, {64, 2})).code(),
            StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(KvTypes, OpsCpuCopyQuant, ::testing::Values(DType::Q8_0, DType::Q4_0),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

TEST(OpsCpu, Conv1dMatchesReferenceAndCarriesState) {
  std::mt19937 rng(4);
  for (auto [ch, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 4}, {7, 3, 4}, {40, 17, 4}, {6, 2, 1}, {10240, 3, 4}}) {
    Host x({ch, n}), w({k, ch}), s1({ch, k - 1}), yf({ch, n}), yr({ch, n});
    x.random(rng);
    w.random(rng);
    s1.random(rng);
    Host s2 = s1;
    s2.t.data = s2.v.data();
    ASSERT_TRUE(conv1d_causal(test::fast_ctx(), x.t, w.t, s1.t, yf.t).is_ok());
    ASSERT_TRUE(conv1d_causal(test::ref_ctx(), x.t, w.t, s2.t, yr.t).is_ok());
    EXPECT_LT(test::rel_err(yf.v, yr.v), kTolF32);
    EXPECT_LT(test::rel_err(s1.v, s2.v), kTolF32);
  }
  // One pass over 11 tokens == 5 + 1 + 5 tokens with the state carried.
  const int64_t ch = 9, k = 4;
  Host x({ch, 11}), w({k, ch}), s({ch, k - 1}, 0.0f), y({ch, 11});
  x.random(rng);
  w.random(rng);
  ASSERT_TRUE(conv1d_causal(test::fast_ctx(), x.t, w.t, s.t, y.t).is_ok());
  Host s_split({ch, k - 1}, 0.0f), y_split({ch, 11});
  int64_t t0 = 0;
  for (int64_t len : {5, 1, 5}) {
    TensorView xs = TensorView::contiguous(x.v.data() + t0 * ch, DType::F32, {ch, len});
    TensorView ys = TensorView::contiguous(y_split.v.data() + t0 * ch, DType::F32, {ch, len});
    ASSERT_TRUE(conv1d_causal(test::fast_ctx(), xs, w.t, s_split.t, ys).is_ok());
    t0 += len;
  }
  EXPECT_EQ(y.v, y_split.v);
  EXPECT_EQ(s.v, s_split.v);
}

TEST(OpsCpu, MoeRouteMatchesReference) {
  std::mt19937 rng(5);
  for (auto [n_exp, k, n] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {8, 2, 5}, {256, 8, 3}}) {
    Host logits({n_exp, n}), wf({k, n}), wr({k, n});
    logits.random(rng, -4, 4);
    std::vector<int32_t> idf(static_cast<size_t>(k * n), -1), idr(static_cast<size_t>(k * n), -1);
    TensorView idf_t = TensorView::contiguous(idf.data(), DType::I32, {k, n});
    TensorView idr_t = TensorView::contiguous(idr.data(), DType::I32, {k, n});
    ASSERT_TRUE(moe_route(test::fast_ctx(), logits.t, k, idf_t, wf.t).is_ok());
    ASSERT_TRUE(moe_route(test::ref_ctx(), logits.t, k, idr_t, wr.t).is_ok());
    EXPECT_EQ(idf, idr);
    EXPECT_LT(test::rel_err(wf.v, wr.v), 1e-5);
    // Renormalized weights sum to 1 and come largest first.
    for (int64_t t = 0; t < n; ++t) {
      double sum = 0;
      for (int64_t j = 0; j < k; ++j) sum += wf.v[t * k + j];
      EXPECT_NEAR(sum, 1.0, 1e-5);
      for (int64_t j = 1; j < k; ++j) EXPECT_GE(wf.v[t * k + j - 1], wf.v[t * k + j]);
    }
  }
}

TEST(OpsCpu, RegistryListsCpuOps) {
  EXPECT_TRUE(op_supported("matmul", DeviceKind::kCpu, DType::Q4_K));
  EXPECT_TRUE(op_supported("attention", DeviceKind::kCpu, DType::F32));
  EXPECT_TRUE(op_supported("attention", DeviceKind::kCpu, DType::F16));
  for (DType kv : {DType::Q8_0, DType::Q4_0}) {
    EXPECT_TRUE(op_supported("attention", DeviceKind::kCpu, kv)) << dtype_name(kv);
    EXPECT_TRUE(op_supported("copy", DeviceKind::kCpu, kv)) << dtype_name(kv);
  }
  EXPECT_FALSE(op_supported("matmul", DeviceKind::kCpu, DType::Q2_K));
  EXPECT_FALSE(op_supported("matmul", DeviceKind::kCuda, DType::Q4_K));
}

#ifndef DS_HAVE_CUDA
// Only meaningful without the CUDA backend: with it, host memory labelled as device memory would
// reach a kernel.
TEST(OpsCpu, CudaDeviceWithoutBackendIsAStatus) {
  OpContext ctx;
  ctx.device = Device{DeviceKind::kCuda, 0};
  Host x({8, 1}), y({8, 1});
  x.t.device = ctx.device;
  y.t.device = ctx.device;
  Status s = silu(ctx, x.t, y.t);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.message();
}
#endif

}  // namespace
}  // namespace ds
