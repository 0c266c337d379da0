// Attention (chunked-KV tiled online softmax vs a naive full softmax) and the gated DeltaNet
// (chunked vs recurrent, fast vs reference, outputs and final state).
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "core/half.h"
#include "ops/attention.h"
#include "ops/delta_net.h"
#include "ops/rms_norm.h"
#include "ops_test_util.h"
#include "quant/quant.h"

namespace ds {
namespace {

using test::Host;

struct AttnCase {
  int64_t head_dim, n_head, n_head_kv, chunk, n_tokens, pos0;
};

TEST(OpsAttention, TiledMatchesFullSoftmax) {
  std::mt19937 rng(11);
  for (AttnCase c : {AttnCase{8, 1, 1, 4, 1, 0}, AttnCase{16, 4, 2, 4, 7, 5}, AttnCase{32, 6, 2, 8, 3, 29},
                     AttnCase{256, 4, 1, 64, 5, 130}, AttnCase{24, 6, 3, 8, 20, 100},
                     AttnCase{64, 8, 2, 16, 1, 700}}) {
    const int64_t n_kv = c.pos0 + c.n_tokens;
    const int64_t n_chunks = (n_kv + c.chunk - 1) / c.chunk;
    std::vector<Host> ks, vs;
    std::vector<TensorView> kt, vt;
    for (int64_t i = 0; i < n_chunks; ++i) {
      ks.emplace_back(std::initializer_list<int64_t>{c.head_dim, c.n_head_kv, c.chunk});
      vs.emplace_back(std::initializer_list<int64_t>{c.head_dim, c.n_head_kv, c.chunk});
      ks.back().random(rng, -2, 2);
      vs.back().random(rng);
    }
    for (int64_t i = 0; i < n_chunks; ++i) {
      kt.push_back(ks[i].t);
      vt.push_back(vs[i].t);
    }
    // The tail past n_kv stays NaN: neither path may read it.
    const int64_t tail = n_chunks * c.chunk - n_kv;
    for (int64_t j = 0; j < tail * c.n_head_kv * c.head_dim; ++j) {
      ks.back().v[ks.back().v.size() - 1 - j] = NAN;
      vs.back().v[vs.back().v.size() - 1 - j] = NAN;
    }
    Host q({c.head_dim, c.n_head, c.n_tokens}), of({c.head_dim, c.n_head, c.n_tokens}),
        orf({c.head_dim, c.n_head, c.n_tokens});
    q.random(rng, -2, 2);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    ASSERT_TRUE(attention(test::fast_ctx(), q.t, kt, vt, n_kv, c.pos0, scale, of.t).is_ok());
    ASSERT_TRUE(attention(test::ref_ctx(), q.t, kt, vt, n_kv, c.pos0, scale, orf.t).is_ok());
    EXPECT_LT(test::rel_err(of.v, orf.v), test::kTolF32) << c.head_dim << " " << c.n_tokens;
  }
}

TEST(OpsAttention, F16CacheMatchesReference) {
  std::mt19937 rng(15);
  const int64_t D = 40, H = 6, Hkv = 2, C = 8, n_tok = 9, pos0 = 30, n_kv = pos0 + n_tok, n_chunks = 5;
  std::vector<std::vector<uint16_t>> kh, vh;
  std::vector<TensorView> kt, vt;
  std::uniform_real_distribution<float> d(-2, 2);
  for (int64_t c = 0; c < n_chunks; ++c) {
    kh.emplace_back(static_cast<size_t>(D * Hkv * C));
    vh.emplace_back(static_cast<size_t>(D * Hkv * C));
    for (auto& x : kh.back()) x = f32_to_fp16(d(rng));
    for (auto& x : vh.back()) x = f32_to_fp16(d(rng));
  }
  for (int64_t c = 0; c < n_chunks; ++c) {
    kt.push_back(TensorView::contiguous(kh[c].data(), DType::F16, {D, Hkv, C}));
    vt.push_back(TensorView::contiguous(vh[c].data(), DType::F16, {D, Hkv, C}));
  }
  Host q({D, H, n_tok}), of({D, H, n_tok}), orf({D, H, n_tok});
  q.random(rng);
  ASSERT_TRUE(attention(test::fast_ctx(), q.t, kt, vt, n_kv, pos0, 0.2f, of.t).is_ok());
  ASSERT_TRUE(attention(test::ref_ctx(), q.t, kt, vt, n_kv, pos0, 0.2f, orf.t).is_ok());
  EXPECT_LT(test::rel_err(of.v, orf.v), test::kTolF32);
  // Mixed dtypes are refused.
  std::vector<float> kf(static_cast<size_t>(D * Hkv * C));
  kt[1] = TensorView::contiguous(kf.data(), DType::F32, {D, Hkv, C});
  EXPECT_EQ(attention(test::fast_ctx(), q.t, kt, vt, n_kv, pos0, 0.2f, of.t).code(), StatusCode::kInvalidArgument);
}

// Block-quantized chunks (Q8_0, Q4_0): the fast path against the reference, and both against F32
// attention over the dequantized cache (the same values, so the F32 tolerance holds for either dtype).
class OpsAttentionQuantKv : public ::testing::TestWithParam<DType> {};

TEST_P(OpsAttentionQuantKv, CacheMatchesReferenceAndDequantizedF32) {
  const DType dt = GetParam();
  std::mt19937 rng(16);
  // GQA, several chunks with a partial tail, prefill (many queries) and decode (one, split KV range).
  for (AttnCase c : {AttnCase{32, 1, 1, 4, 1, 0}, AttnCase{64, 6, 2, 8, 9, 30}, AttnCase{32, 4, 4, 16, 20, 0},
                     AttnCase{128, 8, 2, 64, 1, 200}, AttnCase{256, 4, 1, 64, 5, 130}, AttnCase{96, 6, 3, 8, 17, 3}}) {
    const int64_t n_kv = c.pos0 + c.n_tokens, n_chunks = (n_kv + c.chunk - 1) / c.chunk;
    const int64_t chunk_elems = c.chunk * c.n_head_kv * c.head_dim;
    const int64_t chunk_bytes = dtype_row_bytes(dt, chunk_elems);
    std::vector<std::vector<uint8_t>> kq, vq;
    std::vector<Host> kf, vf;  // the dequantized values
    std::vector<TensorView> kqt, vqt, kft, vft;
    for (int64_t i = 0; i < n_chunks; ++i) {
      for (auto* q : {&kq, &vq}) {
        Host x({c.head_dim, c.n_head_kv, c.chunk});
        x.random(rng, -2, 2);
        q->emplace_back(static_cast<size_t>(chunk_bytes));
        quant::quantize_row(dt, x.v.data(), q->back().data(), chunk_elems);
      }
    }
    // The tail past n_kv holds NaN scales (both block types start with their fp16 scale): neither path
    // may read it.
    const int64_t n_blocks = chunk_elems / dtype_block_size(dt), bb = dtype_block_bytes(dt);
    const int64_t tail_blocks = (n_chunks * c.chunk - n_kv) * c.n_head_kv * c.head_dim / dtype_block_size(dt);
    const uint16_t nan_scale = 0x7e00;
    for (auto* q : {&kq, &vq}) {
      for (int64_t b = n_blocks - tail_blocks; b < n_blocks; ++b) std::memcpy(q->back().data() + b * bb, &nan_scale, 2);
    }
    for (int64_t i = 0; i < n_chunks; ++i) {
      kf.emplace_back(std::initializer_list<int64_t>{c.head_dim, c.n_head_kv, c.chunk});
      vf.emplace_back(std::initializer_list<int64_t>{c.head_dim, c.n_head_kv, c.chunk});
      quant::dequantize_row(dt, kq[i].data(), kf.back().v.data(), chunk_elems);
      quant::dequantize_row(dt, vq[i].data(), vf.back().v.data(), chunk_elems);
    }
    for (int64_t i = 0; i < n_chunks; ++i) {
      kqt.push_back(TensorView::contiguous(kq[i].data(), dt, {c.head_dim, c.n_head_kv, c.chunk}));
      vqt.push_back(TensorView::contiguous(vq[i].data(), dt, {c.head_dim, c.n_head_kv, c.chunk}));
      kft.push_back(kf[i].t);
      vft.push_back(vf[i].t);
    }
    Host q({c.head_dim, c.n_head, c.n_tokens}), of({c.head_dim, c.n_head, c.n_tokens}),
        orf({c.head_dim, c.n_head, c.n_tokens}), of32({c.head_dim, c.n_head, c.n_tokens}),
        orf32({c.head_dim, c.n_head, c.n_tokens});
    q.random(rng, -2, 2);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    ASSERT_TRUE(attention(test::fast_ctx(), q.t, kqt, vqt, n_kv, c.pos0, scale, of.t).is_ok());
    ASSERT_TRUE(attention(test::ref_ctx(), q.t, kqt, vqt, n_kv, c.pos0, scale, orf.t).is_ok());
    ASSERT_TRUE(attention(test::fast_ctx(), q.t, kft, vft, n_kv, c.pos0, scale, of32.t).is_ok());
    ASSERT_TRUE(attention(test::ref_ctx(), q.t, kft, vft, n_kv, c.pos0, scale, orf32.t).is_ok());
    EXPECT_LT(test::rel_err(of.v, orf.v), test::kTolF32) << c.head_dim << " " << c.n_tokens;
    EXPECT_LT(test::rel_err(of.v, orf32.v), test::kTolF32) << c.head_dim << " " << c.n_tokens;
    EXPECT_LT(test::rel_err(orf.v, orf32.v), 1e-6) << c.head_dim << " " << c.n_tokens;
    EXPECT_LT(test::rel_err(of.v, of32.v), 1e-6) << c.head_dim << " " << c.n_tokens;
  }
}

TEST_P(OpsAttentionQuantKv, CacheRefusesBadHeadDimAndMixedDtypes) {
  const DType dt = GetParam();
  const int64_t D = 40, H = 2, Hkv = 1, C = 4;
  std::vector<uint8_t> kb(static_cast<size_t>(C * Hkv * dtype_row_bytes(dt, 64))), vb(kb.size());
  // A view whose rows are not whole blocks (built by hand: TensorView::contiguous checks them).
  auto view = [&](std::vector<uint8_t>& b) {
    TensorView t = TensorView::contiguous(b.data(), dt, {64, Hkv, C});
    t.ne[0] = D;
    return t;
  };
  std::vector<TensorView> kt{view(kb)}, vt{view(vb)};
  std::mt19937 rng(17);
  Host q({D, H, 1}), o({D, H, 1});
  q.random(rng);
  const Status s = attention(test::fast_ctx(), q.t, kt, vt, 1, 0, 1.0f, o.t);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find(dtype_name(dt)), std::string::npos) << s.message();
  // A quantized K beside F32 V.
  Host q64({64, H, 1}), o64({64, H, 1}), vf({64, Hkv, C});
  q64.random(rng);
  std::vector<TensorView> kq{TensorView::contiguous(kb.data(), dt, {64, Hkv, C})}, vm{vf.t};
  EXPECT_EQ(attention(test::fast_ctx(), q64.t, kq, vm, 1, 0, 1.0f, o64.t).code(), StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(KvTypes, OpsAttentionQuantKv, ::testing::Values(DType::Q8_0, DType::Q4_0),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

TEST(OpsAttention, RejectsTooFewKvPositions) {
  Host k({8, 1, 4}), v({8, 1, 4}), q({8, 2, 3}), o({8, 2, 3});
  std::vector<TensorView> kt{k.t}, vt{v.t};
  Status s = attention(test::fast_ctx(), q.t, kt, vt, 4, 2, 1.0f, o.t);  // needs 5 positions
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

struct GdnInputs {
  Host q, k, v, g, beta;
  GdnInputs(int64_t dk, int64_t nk, int64_t dv, int64_t nv, int64_t n, std::mt19937& rng)
      : q({dk, nk, n}), k({dk, nk, n}), v({dv, nv, n}), g({nv, n}), beta({nv, n}) {
    q.random(rng);
    k.random(rng);
    v.random(rng);
    g.random(rng, -2.0f, -0.01f);
    beta.random(rng, 0.05f, 0.95f);
    EXPECT_TRUE(l2_norm(test::fast_ctx(), q.t, 1e-6f, q.t).is_ok());
    EXPECT_TRUE(l2_norm(test::fast_ctx(), k.t, 1e-6f, k.t).is_ok());
  }
};

struct GdnCase {
  int64_t dk, nk, nv, n_tokens;
};

TEST(OpsDeltaNet, ChunkedAndRecurrentMatchReference) {
  std::mt19937 rng(12);
  for (GdnCase c : {GdnCase{4, 1, 1, 1}, GdnCase{8, 2, 4, 19}, GdnCase{16, 1, 3, 70}, GdnCase{128, 2, 4, 130}}) {
    GdnInputs in(c.dk, c.nk, c.dk, c.nv, c.n_tokens, rng);
    Host s0({c.dk, c.dk, c.nv});
    s0.random(rng, -0.5f, 0.5f);
    auto run = [&](const OpContext& ctx, DeltaNetMode mode, Host& out, Host& state) {
      state = s0;
      state.t.data = state.v.data();
      ASSERT_TRUE(delta_net(ctx, in.q.t, in.k.t, in.v.t, in.g.t, in.beta.t, state.t, out.t, mode).is_ok());
    };
    Host o_ref({c.dk, c.nv, c.n_tokens}), o_rec({c.dk, c.nv, c.n_tokens}), o_chk({c.dk, c.nv, c.n_tokens});
    Host s_ref({1}), s_rec({1}), s_chk({1});
    run(test::ref_ctx(), DeltaNetMode::kRecurrent, o_ref, s_ref);
    run(test::fast_ctx(), DeltaNetMode::kRecurrent, o_rec, s_rec);
    run(test::fast_ctx(), DeltaNetMode::kChunked, o_chk, s_chk);
    EXPECT_LT(test::rel_err(o_rec.v, o_ref.v), 1e-4) << c.n_tokens;
    EXPECT_LT(test::rel_err(s_rec.v, s_ref.v), 1e-4) << c.n_tokens;
    EXPECT_LT(test::rel_err(o_chk.v, o_ref.v), 1e-4) << c.n_tokens;
    EXPECT_LT(test::rel_err(s_chk.v, s_ref.v), 1e-4) << c.n_tokens;
  }
}

TEST(OpsDeltaNet, SplitRunsCarryState) {
  // 40 tokens in one chunked call == 25 chunked + 15 recurrent calls on the carried state.
  std::mt19937 rng(13);
  const int64_t dk = 16, nk = 2, nv = 4, n = 40;
  GdnInputs in(dk, nk, dk, nv, n, rng);
  Host s_one({dk, dk, nv}, 0.0f), o_one({dk, nv, n});
  ASSERT_TRUE(delta_net(test::fast_ctx(), in.q.t, in.k.t, in.v.t, in.g.t, in.beta.t, s_one.t, o_one.t,
                        DeltaNetMode::kChunked).is_ok());
  Host s_two({dk, dk, nv}, 0.0f), o_two({dk, nv, n});
  int64_t t0 = 0;
  for (auto [len, mode] : {std::pair<int64_t, DeltaNetMode>{25, DeltaNetMode::kChunked}, {15, DeltaNetMode::kRecurrent}}) {
    auto slice = [&](Host& h, int64_t row) {
      TensorView t = h.t;
      t.data = h.v.data() + t0 * row;
      t.ne[t.n_dims - 1] = len;
      return TensorView::contiguous(t.data, DType::F32, {t.ne[0], t.ne[1], t.ne[2]});
    };
    TensorView g = TensorView::contiguous(in.g.v.data() + t0 * nv, DType::F32, {nv, len});
    TensorView b = TensorView::contiguous(in.beta.v.data() + t0 * nv, DType::F32, {nv, len});
    ASSERT_TRUE(delta_net(test::fast_ctx(), slice(in.q, dk * nk), slice(in.k, dk * nk), slice(in.v, dk * nv), g, b,
                          s_two.t, slice(o_two, dk * nv), mode).is_ok());
    t0 += len;
  }
  EXPECT_LT(test::rel_err(o_two.v, o_one.v), 1e-4);
  EXPECT_LT(test::rel_err(s_two.v, s_one.v), 1e-4);
}

TEST(OpsDeltaNet, GatesMatchReference) {
  std::mt19937 rng(14);
  Host a({5, 3}), b({5, 3}), dt({5}), ssm_a({5}), gf({5, 3}), bf({5, 3}), gr({5, 3}), br({5, 3});
  a.random(rng, -30, 30);
  b.random(rng, -5, 5);
  dt.random(rng);
  ssm_a.random(rng, -3, -0.1f);
  ASSERT_TRUE(delta_net_gates(test::fast_ctx(), a.t, b.t, dt.t, ssm_a.t, gf.t, bf.t).is_ok());
  ASSERT_TRUE(delta_net_gates(test::ref_ctx(), a.t, b.t, dt.t, ssm_a.t, gr.t, br.t).is_ok());
  EXPECT_LT(test::rel_err(gf.v, gr.v), 1e-5);
  EXPECT_LT(test::rel_err(bf.v, br.v), 1e-5);
  for (float g : gf.v) EXPECT_LE(g, 0.0f);
}

}  // namespace
}  // namespace ds
