// Fused ops on the CPU against the unfused chains they replace: matmul_many (one input, several
// weights), matmul_swiglu (SwiGLU + down projection), conv1d_causal_silu, rms_norm_gated,
// delta_net_prep (gates + conv + SiLU + q/k L2 norms); and the
// strided views that replace split copies (row norms, mul_sigmoid's gate, delta_net's v) against a
// copy followed by the contiguous op. The CPU forms run the same arithmetic, so results must be
// bit-identical (fast and reference paths); bad arguments come back as a Status naming the op.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <random>
#include <vector>

#include "ops/conv1d.h"
#include "ops/delta_net.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/rms_norm.h"
#include "ops_test_util.h"
#include "quant/quant.h"

namespace ds {
namespace {

using test::Host;
using test::PrepCase;
using test::PrepIO;

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


TEST(OpsFused, NormsReadStridedRows) {
  std::mt19937 rng(35);
  // DeltaNet: q heads of a fused [q; k; v] row (head stride = head_dim); attention: the q halves of
  // interleaved [q_h; gate_h] heads (head stride = 2 head_dim).
  struct Case { int64_t head_dim, n_head, row, c0, head_stride, n; };
  for (Case c : {Case{16, 2, 80, 32, 16, 3}, Case{128, 4, 1536, 512, 128, 2}, Case{8, 3, 48, 0, 16, 5},
                 Case{256, 2, 1024, 0, 512, 1}, Case{1, 1, 3, 2, 1, 4}}) {
    Host src({c.row, c.n}), w({c.head_dim});
    src.random(rng, -3, 3);
    w.random(rng, 0.5, 1.5);
    const TensorView view = row_heads(src.t, c.c0, c.head_dim, c.n_head, c.head_stride);
    for (const OpContext& ctx : {test::fast_ctx(), test::ref_ctx()}) {
      Host packed({c.head_dim, c.n_head, c.n});
      ASSERT_TRUE(copy(ctx, view, packed.t).is_ok());
      for (int l2 = 0; l2 < 2; ++l2) {
        Host y({c.head_dim, c.n_head, c.n}), y_ref({c.head_dim, c.n_head, c.n});
        if (l2) {
          ASSERT_TRUE(l2_norm(ctx, view, 1e-6f, y.t).is_ok());
          ASSERT_TRUE(l2_norm(ctx, packed.t, 1e-6f, y_ref.t).is_ok());
        } else {
          ASSERT_TRUE(rms_norm(ctx, view, w.t, 1e-6f, y.t).is_ok());
          ASSERT_TRUE(rms_norm(ctx, packed.t, w.t, 1e-6f, y_ref.t).is_ok());
        }
        const int64_t bad = first_bit_difference(y.v, y_ref.v);
        EXPECT_EQ(bad, -1) << (l2 ? "l2_norm" : "rms_norm") << " head_dim " << c.head_dim << " stride "
                           << c.head_stride << " reference " << ctx.reference << ": first difference at " << bad;
      }
    }
  }
  // In place needs a contiguous x; a strided y is refused.
  Host src({48, 2}), w({8}), y({8, 3, 2});
  const TensorView view = row_heads(src.t, 0, 8, 3, 16);
  Status s = rms_norm(test::fast_ctx(), view, w.t, 1e-6f, view);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  s = l2_norm(test::fast_ctx(), y.t, 1e-6f, view);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("l2_norm"), std::string::npos) << s.message();
}

TEST(OpsFused, MulSigmoidReadsStridedGate) {
  std::mt19937 rng(36);
  for (auto [D, H, n] : {std::tuple<int64_t, int64_t, int64_t>{4, 2, 3}, {256, 3, 2}, {1, 5, 1}}) {
    Host qg({2 * H * D, n}), x({D, H, n});
    qg.random(rng, -4, 4);
    x.random(rng, -2, 2);
    const TensorView gate = row_heads(qg.t, D, D, H, 2 * D);
    for (const OpContext& ctx : {test::fast_ctx(), test::ref_ctx()}) {
      Host packed({D, H, n}), y({D, H, n}), y_ref({D, H, n});
      ASSERT_TRUE(copy(ctx, gate, packed.t).is_ok());
      Status st = mul_sigmoid(ctx, x.t, gate, y.t);
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      ASSERT_TRUE(mul_sigmoid(ctx, x.t, packed.t, y_ref.t).is_ok());
      const int64_t bad = first_bit_difference(y.v, y_ref.v);
      EXPECT_EQ(bad, -1) << "D " << D << " H " << H << " reference " << ctx.reference << ": first difference at "
                         << bad;
      // In place on x, as the attention output gate runs it.
      Host xi = x;
      xi.t.data = xi.v.data();
      ASSERT_TRUE(mul_sigmoid(ctx, xi.t, gate, xi.t).is_ok());
      EXPECT_EQ(first_bit_difference(xi.v, y_ref.v), -1) << "in place, D " << D;
    }
  }
  // Rows that do not share one stride are refused.
  Host qg({64, 2}), x({4, 2, 2});
  TensorView gate = row_heads(qg.t, 4, 4, 2, 8);
  gate.nb[2] = 4 * 60;  // token stride != n_head * head stride
  const Status s = mul_sigmoid(test::fast_ctx(), x.t, gate, x.t);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("mul_sigmoid"), std::string::npos) << s.message();
}

TEST(OpsFused, DeltaNetReadsStridedV) {
  std::mt19937 rng(37);
  struct Case { int64_t dk, nk, nv, n; };
  for (Case c : {Case{8, 1, 2, 1}, Case{16, 2, 4, 19}, Case{32, 1, 3, 70}}) {
    const int64_t dv = c.dk, key_dim = c.dk * c.nk, row = 2 * key_dim + dv * c.nv;
    Host conv({row, c.n}), g({c.nv, c.n}), beta({c.nv, c.n}), s0({dv, c.dk, c.nv});
    conv.random(rng);
    g.random(rng, -1.0f, -0.05f);
    beta.random(rng, 0.1f, 0.9f);
    s0.random(rng, -0.5f, 0.5f);
    Host q({c.dk, c.nk, c.n}), k({c.dk, c.nk, c.n});
    ASSERT_TRUE(l2_norm(test::fast_ctx(), row_heads(conv.t, 0, c.dk, c.nk, c.dk), 1e-6f, q.t).is_ok());
    ASSERT_TRUE(l2_norm(test::fast_ctx(), row_heads(conv.t, key_dim, c.dk, c.nk, c.dk), 1e-6f, k.t).is_ok());
    const TensorView v = row_heads(conv.t, 2 * key_dim, dv, c.nv, dv);
    Host v_packed({dv, c.nv, c.n});
    ASSERT_TRUE(copy(test::fast_ctx(), v, v_packed.t).is_ok());
    for (auto [ref, mode] : {std::pair<bool, DeltaNetMode>{true, DeltaNetMode::kRecurrent},
                             {false, DeltaNetMode::kRecurrent}, {false, DeltaNetMode::kChunked}}) {
      const OpContext ctx = ref ? test::ref_ctx() : test::fast_ctx();
      Host o({dv, c.nv, c.n}), o_ref({dv, c.nv, c.n}), st = s0, st_ref = s0;
      st.t.data = st.v.data();
      st_ref.t.data = st_ref.v.data();
      ASSERT_TRUE(delta_net(ctx, q.t, k.t, v, g.t, beta.t, st.t, o.t, mode).is_ok());
      ASSERT_TRUE(delta_net(ctx, q.t, k.t, v_packed.t, g.t, beta.t, st_ref.t, o_ref.t, mode).is_ok());
      EXPECT_EQ(first_bit_difference(o.v, o_ref.v), -1) << "out, tokens " << c.n << " mode " << static_cast<int>(mode)
                                                        << " reference " << ref;
      EXPECT_EQ(first_bit_difference(st.v, st_ref.v), -1) << "state, tokens " << c.n;
    }
  }
}

TEST(OpsFused, Conv1dSiluEqualsConvThenSilu) {
  std::mt19937 rng(38);
  for (int64_t n_tokens : {1, 2, 33}) {
    for (const OpContext& ctx : {test::fast_ctx(), test::ref_ctx()}) {
      Host x({300, n_tokens}), w({4, 300}), st({300, 3});
      x.random(rng, -3, 3);
      w.random(rng);
      st.random(rng);
      Host st2 = st, y({300, n_tokens}), y_ref({300, n_tokens});
      st2.t.data = st2.v.data();
      ASSERT_TRUE(conv1d_causal_silu(ctx, x.t, w.t, st.t, y.t).is_ok());
      ASSERT_TRUE(conv1d_causal(ctx, x.t, w.t, st2.t, y_ref.t).is_ok());
      ASSERT_TRUE(silu(ctx, y_ref.t, y_ref.t).is_ok());
      EXPECT_EQ(first_bit_difference(y.v, y_ref.v), -1) << "tokens " << n_tokens;
      EXPECT_EQ(first_bit_difference(st.v, st2.v), -1) << "state, tokens " << n_tokens;
    }
  }
  Host x({8, 2}), w({4, 8}), st({8, 3});
  const Status s = conv1d_causal_silu(test::fast_ctx(), x.t, w.t, st.t, x.t);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("conv1d_causal_silu"), std::string::npos) << s.message();
}

TEST(OpsFused, RmsNormGatedEqualsNormThenSwiglu) {
  std::mt19937 rng(39);
  for (auto [dv, nv, n] : {std::tuple<int64_t, int64_t, int64_t>{128, 4, 3}, {7, 1, 1}, {64, 3, 5}}) {
    for (const OpContext& ctx : {test::fast_ctx(), test::ref_ctx()}) {
      Host o({dv, nv, n}), w({dv}), z({dv, nv, n}), y({dv, nv, n}), y_ref({dv, nv, n});
      o.random(rng, -3, 3);
      w.random(rng, 0.5, 1.5);
      z.random(rng, -4, 4);
      ASSERT_TRUE(rms_norm_gated(ctx, o.t, w.t, z.t, 1e-6f, y.t).is_ok());
      ASSERT_TRUE(rms_norm(ctx, o.t, w.t, 1e-6f, y_ref.t).is_ok());
      ASSERT_TRUE(swiglu(ctx, z.t, y_ref.t, y_ref.t).is_ok());
      EXPECT_EQ(first_bit_difference(y.v, y_ref.v), -1) << dv << "x" << nv << "x" << n;
      // In place on o, as the DeltaNet layer runs it.
      ASSERT_TRUE(rms_norm_gated(ctx, o.t, w.t, z.t, 1e-6f, o.t).is_ok());
      EXPECT_EQ(first_bit_difference(o.v, y_ref.v), -1) << "in place " << dv << "x" << nv << "x" << n;
    }
  }
  Host o({8, 2}), w({8}), z({8, 3});
  const Status s = rms_norm_gated(test::fast_ctx(), o.t, w.t, z.t, 1e-6f, o.t);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("rms_norm_gated"), std::string::npos) << s.message();
}

TEST(OpsFused, AddRmsNormEqualsAddThenNorm) {
  std::mt19937 rng(41);
  for (auto [e, n] : {std::pair<int64_t, int64_t>{64, 3}, {7, 1}, {5120, 2}}) {
    for (const OpContext& ctx : {test::fast_ctx(), test::ref_ctx()}) {
      Host x({e, n}), r({e, n}), w({e}), y({e, n}), sum({e, n}), y_ref({e, n});
      x.random(rng, -3, 3);
      r.random(rng, -3, 3);
      w.random(rng, 0.5, 1.5);
      sum.v = x.v;
      ASSERT_TRUE(add(ctx, sum.t, r.t, sum.t).is_ok());
      ASSERT_TRUE(rms_norm(ctx, sum.t, w.t, 1e-6f, y_ref.t).is_ok());
      ASSERT_TRUE(add_rms_norm(ctx, x.t, r.t, w.t, 1e-6f, y.t).is_ok());
      EXPECT_EQ(first_bit_difference(x.v, sum.v), -1) << "x += r, " << e << "x" << n;
      EXPECT_EQ(first_bit_difference(y.v, y_ref.v), -1) << "y, " << e << "x" << n;
    }
  }
  Host x({8, 2}), r({8, 2}), w({8}), r_bad({8, 3});
  Status s = add_rms_norm(test::fast_ctx(), x.t, r.t, w.t, 1e-6f, x.t);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << "y aliasing x";
  s = add_rms_norm(test::fast_ctx(), x.t, r_bad.t, w.t, 1e-6f, r.t);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << "shape mismatch";
  EXPECT_NE(s.message().find("add_rms_norm"), std::string::npos) << s.message();
}

// The 27B (nk 16, nv 48) and 35B-A3B (nk 16, nv 32) DeltaNet shapes, and small odd ones (kernel 1: no
// state; dk 5; one head each).
TEST(OpsFused, DeltaNetPrepEqualsTheFourOps) {
  std::mt19937 rng(42);
  for (PrepCase c0 : {PrepCase{16, 48, 128, 4, 0}, PrepCase{16, 32, 128, 4, 0}, PrepCase{2, 4, 16, 4, 0},
                      PrepCase{1, 1, 8, 2, 0}, PrepCase{3, 3, 5, 1, 0}}) {
    for (int64_t n : {1, 5}) {
      PrepCase c = c0;
      c.n = n;
      for (const OpContext& ctx : {test::fast_ctx(), test::ref_ctx()}) {
        SCOPED_TRACE(::testing::Message() << "nk " << c.nk << " nv " << c.nv << " dk " << c.dk << " kernel "
                                          << c.kernel << " tokens " << c.n << " reference " << ctx.reference);
        PrepIO fused(c), chain(c);
        fused.randomize(rng, 4);
        for (auto [from, to] : {std::pair{&fused.mixed, &chain.mixed}, {&fused.w, &chain.w}, {&fused.st, &chain.st},
                                {&fused.alpha, &chain.alpha}, {&fused.b, &chain.b}, {&fused.dt_bias, &chain.dt_bias},
                                {&fused.ssm_a, &chain.ssm_a}}) {
          to->v = from->v;
          to->t.data = to->v.data();
        }
        const Status s = delta_net_prep(ctx, fused.args(1e-6f));
        ASSERT_TRUE(s.is_ok()) << s.to_string();
        const PrepIO& r = chain;
        ASSERT_TRUE(delta_net_gates(ctx, r.alpha.t, r.b.t, r.dt_bias.t, r.ssm_a.t, r.g.t, r.beta.t).is_ok());
        ASSERT_TRUE(conv1d_causal_silu(ctx, r.mixed.t, r.w.t, r.st.t, r.conv.t).is_ok());
        ASSERT_TRUE(l2_norm(ctx, row_heads(r.conv.t, 0, c.dk, c.nk, c.dk), 1e-6f, r.q.t).is_ok());
        ASSERT_TRUE(l2_norm(ctx, row_heads(r.conv.t, c.nk * c.dk, c.dk, c.nk, c.dk), 1e-6f, r.k.t).is_ok());
        for (auto [name, got, want] : {std::tuple{"conv", &fused.conv, &chain.conv}, {"q", &fused.q, &chain.q},
                                       {"k", &fused.k, &chain.k}, {"g", &fused.g, &chain.g},
                                       {"beta", &fused.beta, &chain.beta}, {"conv_state", &fused.st, &chain.st}}) {
          const int64_t bad = first_bit_difference(got->v, want->v);
          EXPECT_EQ(bad, -1) << name << ": first difference at " << bad;
        }
        for (const float x : fused.q.v) ASSERT_FALSE(std::isnan(x)) << "q left unwritten";
      }
    }
  }
}

TEST(OpsFused, DeltaNetPrepRejectsBadArguments) {
  const PrepCase c{2, 4, 8, 4, 2};
  PrepIO io(c);
  auto expect_invalid = [](const DeltaNetPrep& p, const char* what) {
    const Status s = delta_net_prep(test::fast_ctx(), p);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << what << ": " << s.to_string();
    EXPECT_NE(s.message().find("delta_net_prep"), std::string::npos) << s.message();
  };
  DeltaNetPrep p = io.args(1e-6f);
  Host wide({16, 3, c.n});  // 2 * 3 * 16 > 64 conv channels
  p.q = p.k = wide.t;
  expect_invalid(p, "q heads wider than the conv row");
  p = io.args(1e-6f);
  p.k = p.q;
  expect_invalid(p, "k aliasing q");
  p = io.args(1e-6f);
  p.conv = p.mixed;
  expect_invalid(p, "conv aliasing mixed");
  p = io.args(1e-6f);
  Host few({c.nv, c.n + 1});
  p.g = few.t;
  expect_invalid(p, "g with another token count");
  p = io.args(1e-6f);
  Host state({c.n_ch(), c.kernel});
  p.conv_state = state.t;
  expect_invalid(p, "conv_state with kernel rows");
}

}  // namespace
}  // namespace ds
