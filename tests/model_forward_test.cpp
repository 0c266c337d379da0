// The model on tiny random F32 weights, both architectures: finite logits, prefill in one chunk ==
// many chunks == token-by-token decode (float tolerance: the chunked and recurrent DeltaNet forms
// round differently), bit-exact where chunk alignment makes it so, layer ranges, fast vs reference.
#include <gtest/gtest.h>

#include <cmath>

#include "model/model_internal.h"
#include "model_test_util.h"

namespace ds {
namespace {

// Logits of different but equivalent schedules: max |a - b| / max(1, max |b|).
constexpr double kScheduleTol = 1e-4;

std::vector<float> run_prefill(Model& m, const std::vector<int32_t>& toks, std::vector<size_t> splits = {}) {
  auto st = std::move(m.new_state()).value();
  size_t i = 0;
  splits.push_back(toks.size());
  for (size_t end : splits) {
    Status s = m.prefill(*st, std::span<const int32_t>(toks.data() + i, end - i));
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    i = end;
  }
  auto l = m.logits(*st);
  return {l.begin(), l.end()};
}

double rel(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double mx = 1.0, err = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
    mx = std::max(mx, static_cast<double>(std::fabs(b[i])));
    err = std::max(err, static_cast<double>(std::fabs(a[i] - b[i])));
  }
  return err / mx;
}

class ModelForward : public ::testing::TestWithParam<bool> {};

TEST_P(ModelForward, LogitsFiniteAndDependOnInput) {
  auto m = test::load_tiny(GetParam(), {});
  ASSERT_NE(m, nullptr);
  auto a = run_prefill(*m, test::tokens(9, 1));
  auto b = run_prefill(*m, test::tokens(9, 2));
  ASSERT_EQ(a.size(), 100u);
  for (float x : a) ASSERT_TRUE(std::isfinite(x));
  EXPECT_GT(rel(a, b), 1e-3);  // different prompts, different logits
}

TEST_P(ModelForward, OneChunkEqualsManyChunksEqualsDecode) {
  const auto toks = test::tokens(70);
  ModelOptions big;  // one 256-token segment (chunked DeltaNet)
  ModelOptions small;
  small.prefill_chunk = 16;
  small.kv_chunk_tokens = 8;  // KV chunks smaller than prefill chunks
  auto m1 = test::load_tiny(GetParam(), big);
  auto m2 = test::load_tiny(GetParam(), small);
  auto one = run_prefill(*m1, toks);
  auto many = run_prefill(*m2, toks);
  EXPECT_LT(rel(many, one), kScheduleTol);
  // Token by token: every segment is one recurrent step.
  auto st = std::move(m1->new_state()).value();
  for (int32_t t : toks) ASSERT_TRUE(m1->decode(*st, t).is_ok());
  auto l = m1->logits(*st);
  EXPECT_LT(rel({l.begin(), l.end()}, one), kScheduleTol);
  EXPECT_EQ(st->pos(), 70);
}

TEST_P(ModelForward, SplitAtChunkMultiplesIsBitExact) {
  ModelOptions opt;
  opt.prefill_chunk = 16;
  auto m = test::load_tiny(GetParam(), opt);
  const auto toks = test::tokens(50);
  auto whole = run_prefill(*m, toks);
  EXPECT_EQ(run_prefill(*m, toks, {16, 32}), whole);
  EXPECT_EQ(run_prefill(*m, toks, {48}), whole);
  // A prefill starting mid-chunk first runs to the next multiple of C: [0,20) then [20,50)
  // is segmented as [0,16) [16,20) | [20,32) [32,48) [48,50) -- still a valid run.
  EXPECT_LT(rel(run_prefill(*m, toks, {20}), whole), kScheduleTol);
}

TEST_P(ModelForward, LayerRangesComposeBitExact) {
  auto m = test::load_tiny(GetParam(), {});
  const auto toks = test::tokens(12);
  const int64_t E = m->config().n_embd, n = 12;
  auto run = [&](std::vector<LayerRange> ranges) {
    auto st = std::move(m->new_state()).value();
    std::vector<float> h(static_cast<size_t>(E * n));
    TensorView hv = TensorView::contiguous(h.data(), DType::F32, {E, n});
    EXPECT_TRUE(m->embed(toks, hv).is_ok());
    for (LayerRange r : ranges) EXPECT_TRUE(m->forward(r, *st, hv, hv).is_ok());
    return h;
  };
  EXPECT_EQ(run({{0, 3}, {3, 6}}), run({{0, 6}}));
  EXPECT_EQ(run({{0, 1}, {1, 2}, {2, 6}}), run({{0, 6}}));
  auto st = std::move(m->new_state()).value();
  std::vector<float> h(static_cast<size_t>(E));
  TensorView hv = TensorView::contiguous(h.data(), DType::F32, {E, 1});
  EXPECT_EQ(m->forward({2, 7}, *st, hv, hv).code(), StatusCode::kInvalidArgument);
}

TEST_P(ModelForward, FastOpsMatchReferenceOps) {
  ModelOptions ref;
  ref.reference_ops = true;
  auto mf = test::load_tiny(GetParam(), {});
  auto mr = test::load_tiny(GetParam(), ref);
  const auto toks = test::tokens(33);
  EXPECT_LT(rel(run_prefill(*mf, toks), run_prefill(*mr, toks)), kScheduleTol);
}

TEST_P(ModelForward, RejectsBadTokensAndContextOverflow) {
  ModelOptions opt;
  opt.n_ctx = 20;
  auto m = test::load_tiny(GetParam(), opt);
  auto st = std::move(m->new_state()).value();
  std::vector<int32_t> bad = {1, 100};
  EXPECT_EQ(m->prefill(*st, bad).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m->prefill(*st, {}).code(), StatusCode::kInvalidArgument);
  auto toks = test::tokens(21);
  EXPECT_EQ(m->prefill(*st, toks).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st->pos(), 0);
  EXPECT_TRUE(m->prefill(*st, std::span<const int32_t>(toks.data(), 20)).is_ok());
}

TEST_P(ModelForward, DebugHookSeesNamedIntermediates) {
  auto m = test::load_tiny(GetParam(), {});
  std::vector<std::string> names;
  m->set_debug_hook([&](std::string_view name, const TensorView&) { names.emplace_back(name); });
  auto st = std::move(m->new_state()).value();
  ASSERT_TRUE(m->prefill(*st, test::tokens(3)).is_ok());
  auto has = [&](const char* n) { return std::find(names.begin(), names.end(), n) != names.end(); };
  EXPECT_TRUE(has("blk.0.deltanet.beta"));
  EXPECT_TRUE(has("blk.2.attn.q"));
  EXPECT_TRUE(has("blk.5.out"));
  EXPECT_TRUE(has("result_output"));
}

INSTANTIATE_TEST_SUITE_P(Arch, ModelForward, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "qwen35moe" : "qwen35"; });

TEST(ModelOptionsTest, PrefillChunkAutoAndExplicit) {
  auto m = test::load_tiny(false, {});
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->options().prefill_chunk, kPrefillChunkCpu);  // 0 = auto
  EXPECT_EQ(m->device(), Device{});
  EXPECT_EQ(m->weight_device_bytes(), 0);  // CPU weights are used in place
  EXPECT_EQ(m->cuda_graph_stats().captures, 0);
  ModelOptions o;
  o.prefill_chunk = 48;
  EXPECT_EQ(test::load_tiny(false, o)->options().prefill_chunk, 48);
  o.prefill_chunk = -1;
  test::TinyModel t = test::tiny_model(false);
  auto bad = Model::from_weights(t.config, t.weights, std::move(t.storage), o);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  // An auto chunk behaves exactly like the explicit CPU default.
  ModelOptions explicit_256;
  explicit_256.prefill_chunk = 256;
  const auto toks = test::tokens(40);
  EXPECT_EQ(run_prefill(*m, toks), run_prefill(*test::load_tiny(false, explicit_256), toks));
}

// A block-quantized KV cache (Q8_0, Q4_0; head_dim 32): the attention reads back every position from
// the cache, those of the same call included, so one prefill, many chunks and token-by-token decode
// agree as with F32, and the fast ops match the reference ops; the logits stay near the F32 cache's.
class ModelKvQuant : public ::testing::TestWithParam<DType> {};

TEST_P(ModelKvQuant, DecodesLikePrefillAndMatchesReferenceAndF32) {
  constexpr int64_t kHeadDim = 32;
  const DType dt = GetParam();
  // Against the F32 cache the error grows with a block's rounding step, amax / 8 for Q4_0 against
  // amax / 127 for Q8_0 (measured about 7e-4 for Q8_0, 1.5e-2 for Q4_0).
  const double tol_f32 = dt == DType::Q4_0 ? 5e-2 : 5e-3;
  for (bool moe : {false, true}) {
    ModelOptions kq, kq_small, kq_ref;
    kq.kv_dtype = kq_small.kv_dtype = kq_ref.kv_dtype = dt;
    kq_small.prefill_chunk = 16;
    kq_small.kv_chunk_tokens = 8;
    kq_ref.reference_ops = true;
    auto m = test::load_tiny(moe, kq, 7, kHeadDim);
    auto m_small = test::load_tiny(moe, kq_small, 7, kHeadDim);
    auto m_ref = test::load_tiny(moe, kq_ref, 7, kHeadDim);
    auto m32 = test::load_tiny(moe, {}, 7, kHeadDim);
    ASSERT_TRUE(m && m_small && m_ref && m32);
    const auto toks = test::tokens(70);
    const auto one = run_prefill(*m, toks);
    EXPECT_LT(rel(run_prefill(*m_small, toks), one), kScheduleTol) << moe;
    EXPECT_LT(rel(run_prefill(*m_ref, toks), one), kScheduleTol) << moe;
    auto st = std::move(m->new_state()).value();
    for (int32_t t : toks) ASSERT_TRUE(m->decode(*st, t).is_ok());
    auto l = m->logits(*st);
    EXPECT_LT(rel({l.begin(), l.end()}, one), kScheduleTol) << moe;
    const double err = rel(one, run_prefill(*m32, toks));
    EXPECT_LT(err, tol_f32) << moe;
    EXPECT_GT(err, 1e-6) << moe;  // the cache really is quantized
  }
}

TEST_P(ModelKvQuant, RefusesHeadDimNotAMultipleOf32) {
  const DType dt = GetParam();
  ModelOptions o;
  o.kv_dtype = dt;
  test::TinyModel t = test::tiny_model(false);  // head_dim 16
  auto bad = Model::from_weights(t.config, t.weights, std::move(t.storage), o);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(bad.status().message().find(dtype_name(dt)), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("head_dim is 16"), std::string::npos) << bad.status().message();
}

INSTANTIATE_TEST_SUITE_P(KvTypes, ModelKvQuant, ::testing::Values(DType::Q8_0, DType::Q4_0),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

TEST(ModelKvType, RefusesTypesThatAreNoKvCacheType) {
  ModelOptions o;
  o.kv_dtype = DType::Q5_0;
  test::TinyModel t = test::tiny_model(false, 7, 32);
  auto bad = Model::from_weights(t.config, t.weights, std::move(t.storage), o);
  EXPECT_EQ(bad.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(bad.status().message().find("q5_0"), std::string::npos) << bad.status().message();
}

TEST(ModelConfig, ValidateNamesTheKey) {
  auto expect_key = [](ModelConfig c, const char* key) {
    Status s = c.validate();
    EXPECT_FALSE(s.is_ok()) << key;
    EXPECT_NE(s.message().find(key), std::string::npos) << s.message();
  };
  ModelConfig c = test::tiny_config(false);
  EXPECT_TRUE(c.validate().is_ok());
  c.ssm_inner = 31;
  expect_key(c, "ssm.inner_size");
  c = test::tiny_config(false);
  c.ssm_n_v_head = 3;
  c.ssm_inner = 24;
  expect_key(c, "ssm.time_step_rank");
  c = test::tiny_config(true);
  c.n_expert_used = 7;
  expect_key(c, "expert_used_count");
  c = test::tiny_config(false);
  c.rope_sections = {1, 2};
  expect_key(c, "rope.dimension_sections");
  c = test::tiny_config(false);
  c.n_rot = 17;
  expect_key(c, "rope.dimension_count");
}

TEST(ModelWeights, ValidateNamesTheTensor) {
  test::TinyModel t = test::tiny_model(false);
  t.weights.layers[2].attn.wk.ne[1] = 31;
  Status s = model_weights_validate(t.weights, t.config);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("blk.2.attn_k.weight"), std::string::npos) << s.message();
  t = test::tiny_model(false);
  t.weights.layers[0].deltanet.conv1d.dtype = DType::F16;
  s = model_weights_validate(t.weights, t.config);
  EXPECT_NE(s.message().find("blk.0.ssm_conv1d.weight"), std::string::npos) << s.message();
  // Tied output: no output.weight is fine.
  t = test::tiny_model(false);
  t.weights.output = TensorView{};
  EXPECT_TRUE(model_weights_validate(t.weights, t.config).is_ok());
}

}  // namespace
}  // namespace ds

namespace ds {
namespace {

// A segment that spills into new scratch blocks inside a layer must release them at the layer's
// rollback: otherwise every layer keeps its own blocks and the merged arena grows to the sum.
TEST(ModelScratchTest, RollbackReleasesSpilledBlocks) {
  ModelScratch s(Device{});
  auto a = s.f32({1024});  // first block (4 MiB minimum)
  ASSERT_TRUE(a.is_ok());
  const ModelScratch::Mark m = s.mark();
  for (int layer = 0; layer < 8; ++layer) {
    auto big = s.f32({int64_t{3} << 20});  // 12 MiB: a new block every layer
    ASSERT_TRUE(big.is_ok());
    s.rollback(m);
    EXPECT_EQ(s.blocks.size(), 1u) << "layer " << layer;
  }
  EXPECT_LE(s.peak, (int64_t{3} << 22) + 4096 + 64) << "peak is the live high-water, not the sum";
  s.reset();
  ASSERT_EQ(s.blocks.size(), 1u);
  auto again = s.f32({int64_t{3} << 20});
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(s.blocks.size(), 1u) << "after the merge a layer's intermediates fit the one block";
}

}  // namespace
}  // namespace ds
