// Tests for test-model presets, overrides and validation, and for the planned tensor sizes of the
// real shapes (the published Q4_K_M file sizes of Qwen3.6-27B and -35B-A3B are the reference).
#include <gtest/gtest.h>

#include <string>

#include "testmodel/tensor_plan.h"
#include "testmodel/test_model_config.h"

namespace ds::testmodel {
namespace {

TEST(TestModelConfig, RealPresetsHaveTheIssueShapes) {
  auto d = test_model_preset("qwen3.6-27b");
  ASSERT_TRUE(d.is_ok());
  EXPECT_EQ(d->arch, TestArch::kQwen35);
  EXPECT_EQ(d->n_embd, 5120);
  EXPECT_EQ(d->n_layer, 64);
  EXPECT_EQ(d->n_head, 24);
  EXPECT_EQ(d->n_head_kv, 4);
  EXPECT_EQ(d->head_dim, 256);
  EXPECT_EQ(d->n_rot, 64);
  EXPECT_EQ(d->ssm_n_k_heads, 16);
  EXPECT_EQ(d->ssm_n_v_heads, 48);
  EXPECT_EQ(d->ssm_head_dim, 128);
  EXPECT_EQ(d->ssm_conv_kernel, 4);
  EXPECT_EQ(d->n_ff, 17408);
  EXPECT_EQ(d->n_vocab, 248320);
  EXPECT_EQ(d->n_ctx, 262144);
  EXPECT_EQ(d->rope_sections(), (std::vector<int32_t>{11, 11, 10, 0}));
  EXPECT_FLOAT_EQ(d->rope_freq_base, 1e7f);
  EXPECT_FLOAT_EQ(d->rms_eps, 1e-6f);

  auto m = test_model_preset("qwen3.6-35b-a3b");
  ASSERT_TRUE(m.is_ok());
  EXPECT_EQ(m->arch, TestArch::kQwen35Moe);
  EXPECT_EQ(m->n_embd, 2048);
  EXPECT_EQ(m->n_layer, 40);
  EXPECT_EQ(m->n_head, 16);
  EXPECT_EQ(m->n_head_kv, 2);
  EXPECT_EQ(m->ssm_n_v_heads, 32);
  EXPECT_EQ(m->n_expert, 256);
  EXPECT_EQ(m->n_expert_used, 8);
  EXPECT_EQ(m->n_ff_exp, 512);
  EXPECT_EQ(m->n_ff_shexp, 512);
  EXPECT_TRUE(test_model_config_validate(*d).is_ok());
  EXPECT_TRUE(test_model_config_validate(*m).is_ok());
}

TEST(TestModelConfig, TinyPresetShapes) {
  auto t = test_model_preset("tiny");
  ASSERT_TRUE(t.is_ok());
  EXPECT_EQ(t->n_embd, 256);
  EXPECT_EQ(t->head_dim, 64);
  EXPECT_EQ(t->n_rot, 16);
  const auto s = t->rope_sections();
  EXPECT_EQ(s[0] + s[1] + s[2] + s[3], 8);  // sections sum to n_rot / 2
  int n_full = 0;
  for (int64_t il = 0; il < t->n_layer; ++il) n_full += t->is_recurrent(il) ? 0 : 1;
  EXPECT_EQ(n_full, 2);
  EXPECT_FALSE(t->is_recurrent(3));
  EXPECT_FALSE(t->is_recurrent(7));
  EXPECT_FALSE(test_model_preset("huge").is_ok());
}

TEST(TestModelConfig, OverridesApply) {
  TestModelOverrides o;
  o.arch = TestArch::kQwen35Moe;
  o.n_embd = 512;
  o.n_layer = 5;
  o.n_expert = 4;
  o.n_expert_used = 1;
  o.ssm_n_v_heads = 8;
  o.full_attention_interval = 2;
  o.n_ctx = 1000;
  o.type = OutType::kQ8_0;
  o.seed = 7;
  auto c = test_model_config_make("tiny", o);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->arch, TestArch::kQwen35Moe);
  EXPECT_EQ(c->n_embd, 512);
  EXPECT_EQ(c->n_layer, 5);
  EXPECT_EQ(c->n_expert, 4);
  EXPECT_EQ(c->n_expert_used, 1);
  EXPECT_EQ(c->ssm_n_v_heads, 8);
  EXPECT_EQ(c->ssm_value_dim(), 8 * 32);
  EXPECT_EQ(c->full_attention_interval, 2);
  EXPECT_EQ(c->n_ctx, 1000);
  EXPECT_EQ(c->type, OutType::kQ8_0);
  EXPECT_EQ(c->seed, 7u);
  EXPECT_EQ(c->n_head, 4);  // untouched fields keep the preset's value
}

// Expects test_model_config_make to fail with a message containing every part of `needles`.
void expect_rejected(const TestModelOverrides& o, const std::vector<std::string>& needles,
                     const std::string& preset = "tiny") {
  auto c = test_model_config_make(preset, o);
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  for (const auto& n : needles) {
    EXPECT_NE(c.status().message().find(n), std::string::npos) << c.status().message() << " lacks " << n;
  }
}

TEST(TestModelConfig, BadOverridesAreRejected) {
  TestModelOverrides o;
  o.ssm_n_v_heads = 6;
  o.ssm_n_k_heads = 4;
  expect_rejected(o, {"--ssm-n-v-heads 6", "--ssm-n-k-heads 4"});
  o = {};
  o.head_dim = 8;
  expect_rejected(o, {"--head-dim 8", "--n-rot 16"});
  o = {};
  o.n_rot = 15;
  expect_rejected(o, {"--n-rot 15", "even"});
  o = {};
  o.n_head = 6;
  o.n_head_kv = 4;
  expect_rejected(o, {"--n-head 6", "--n-head-kv 4"});
  o = {};
  o.arch = TestArch::kQwen35Moe;
  o.n_expert_used = 9;
  expect_rejected(o, {"--n-expert-used 9", "--n-expert 8"});
  o = {};
  o.n_vocab = 100;
  expect_rejected(o, {"--n-vocab 100"});
  o = {};
  o.n_layer = 0;
  expect_rejected(o, {"--n-layer 0"});
  o = {};
  o.n_embd = -5;
  expect_rejected(o, {"--n-embd -5"});
  o = {};
  o.arch = TestArch::kQwen35;
  expect_rejected(o, {"--arch qwen35", "qwen3.6-35b-a3b"}, "qwen3.6-35b-a3b");
}

TEST(TestModelConfig, QuantBlockMismatchNamesTheTensor) {
  TestModelOverrides o;
  o.type = OutType::kQ8_0;
  o.n_ff = 500;  // ffn_down rows are n_ff long: not a multiple of 32
  auto c = test_model_config_make("tiny", o);
  ASSERT_TRUE(c.is_ok());
  auto t = test_model_tensors(*c);
  ASSERT_FALSE(t.is_ok());
  EXPECT_NE(t.status().message().find("blk.0.ffn_down.weight"), std::string::npos) << t.status().message();
  EXPECT_NE(t.status().message().find("500"), std::string::npos);
  // The same shapes are fine in f16, and q4_k_m falls back to f16 for that tensor.
  o.type = OutType::kF16;
  EXPECT_TRUE(test_model_tensors(*test_model_config_make("tiny", o)).is_ok());
  o.type = OutType::kQ4_K_M;
  auto q = test_model_tensors(*test_model_config_make("tiny", o));
  ASSERT_TRUE(q.is_ok());
  for (const auto& ts : *q) {
    if (ts.name == "blk.0.ffn_down.weight") {
      EXPECT_EQ(ts.dtype, DType::F16);
    }
  }
}

TEST(TestModelConfig, RealShapeSizesMatchPublishedQ4KM) {
  auto d = test_model_tensors(*test_model_preset("qwen3.6-27b"));
  ASSERT_TRUE(d.is_ok());
  const double gb_d = static_cast<double>(test_model_tensor_bytes(*d)) / 1e9;
  EXPECT_GT(gb_d, 15.5);
  EXPECT_LT(gb_d, 17.5);
  auto m = test_model_tensors(*test_model_preset("qwen3.6-35b-a3b"));
  ASSERT_TRUE(m.is_ok());
  const double gb_m = static_cast<double>(test_model_tensor_bytes(*m)) / 1e9;
  EXPECT_GT(gb_m, 19.5);
  EXPECT_LT(gb_m, 22.5);
}

TEST(TestModelConfig, OutTypeNames) {
  OutType t;
  ASSERT_TRUE(out_type_from_name("Q4_K_M", &t));
  EXPECT_EQ(t, OutType::kQ4_K_M);
  EXPECT_EQ(out_type_file_type(t), 15u);
  ASSERT_TRUE(out_type_from_name("bf16", &t));
  EXPECT_EQ(out_type_file_type(t), 32u);
  ASSERT_TRUE(out_type_from_name("q8_0", &t));
  EXPECT_EQ(out_type_file_type(t), 7u);
  EXPECT_FALSE(out_type_from_name("q3_k", &t));
}

}  // namespace
}  // namespace ds::testmodel
