// Tests for the Q4_K_M type assignment. Expected types are written out from the model spec
// (section 6): with 16 layers, use_more_bits(i, 16) holds for i in {0, 1, 4, 7, 10, 13, 14, 15}
// (i < 2, i >= 14, or (i - 2) % 3 == 2).
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "quant/q4_k_m.h"
#include "testmodel/tensor_plan.h"
#include "testmodel/test_model_config.h"

namespace ds {
namespace {

const std::set<int64_t> kMoreBits16 = {0, 1, 4, 7, 10, 13, 14, 15};

std::map<std::string, DType> plan_types(const std::string& preset, testmodel::TestModelOverrides o) {
  o.type = testmodel::OutType::kQ4_K_M;
  auto c = testmodel::test_model_config_make(preset, o);
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  auto t = testmodel::test_model_tensors(*c);
  EXPECT_TRUE(t.is_ok()) << t.status().to_string();
  std::map<std::string, DType> types;
  for (const auto& ts : *t) types[ts.name] = ts.dtype;
  return types;
}

std::string blk(int64_t il, const char* name) { return "blk." + std::to_string(il) + "." + name; }

TEST(TestModelQ4KM, UseMoreBits) {
  std::set<int64_t> got;
  for (int64_t i = 0; i < 16; ++i)
    if (q4_k_m_use_more_bits(i, 16)) got.insert(i);
  EXPECT_EQ(got, kMoreBits16);
}

TEST(TestModelQ4KM, Dense16Layers) {
  testmodel::TestModelOverrides o;
  o.n_layer = 16;
  o.ssm_head_dim = 64;  // value_dim 256, so ssm_out gets real K-quants
  auto types = plan_types("tiny", o);
  EXPECT_EQ(types["token_embd.weight"], DType::Q4_K);
  EXPECT_EQ(types["output.weight"], DType::Q6_K);
  EXPECT_EQ(types["output_norm.weight"], DType::F32);
  for (int64_t il = 0; il < 16; ++il) {
    const bool more = kMoreBits16.count(il) > 0;
    const DType bumped = more ? DType::Q6_K : DType::Q4_K;
    const bool full = (il + 1) % 4 == 0;
    SCOPED_TRACE("layer " + std::to_string(il));
    // One attn_v-like tensor per layer (attn_v or the delta net's attn_qkv): counter == layer.
    EXPECT_EQ(types[blk(il, full ? "attn_v.weight" : "attn_qkv.weight")], bumped);
    EXPECT_EQ(types[blk(il, "ffn_down.weight")], bumped);
    EXPECT_EQ(types[blk(il, "ffn_gate.weight")], DType::Q4_K);
    EXPECT_EQ(types[blk(il, "ffn_up.weight")], DType::Q4_K);
    EXPECT_EQ(types[blk(il, "attn_norm.weight")], DType::F32);
    EXPECT_EQ(types[blk(il, "post_attention_norm.weight")], DType::F32);
    if (full) {
      EXPECT_EQ(types[blk(il, "attn_q.weight")], DType::Q4_K);
      EXPECT_EQ(types[blk(il, "attn_k.weight")], DType::Q4_K);
      EXPECT_EQ(types[blk(il, "attn_output.weight")], DType::Q4_K);
      EXPECT_EQ(types[blk(il, "attn_q_norm.weight")], DType::F32);
    } else {
      EXPECT_EQ(types[blk(il, "attn_gate.weight")], DType::Q4_K);
      EXPECT_EQ(types[blk(il, "ssm_alpha.weight")], DType::Q4_K);
      EXPECT_EQ(types[blk(il, "ssm_beta.weight")], DType::Q4_K);
      EXPECT_EQ(types[blk(il, "ssm_out.weight")], DType::Q4_K);
      EXPECT_EQ(types[blk(il, "ssm_conv1d.weight")], DType::F32);
      EXPECT_EQ(types[blk(il, "ssm_a")], DType::F32);
      EXPECT_EQ(types[blk(il, "ssm_dt.bias")], DType::F32);
      EXPECT_EQ(types[blk(il, "ssm_norm.weight")], DType::F32);
    }
  }
}

TEST(TestModelQ4KM, RowLengthFallbacks) {
  testmodel::TestModelOverrides o;
  o.n_layer = 16;  // tiny's ssm_head_dim 32: ssm_out rows are 128 long
  auto types = plan_types("tiny", o);
  EXPECT_EQ(types["blk.0.ssm_out.weight"], DType::Q5_0);  // Q4_K -> Q5_0
  o.n_embd = 288;  // 288 % 256 != 0, % 32 == 0
  types = plan_types("tiny", o);
  EXPECT_EQ(types["output.weight"], DType::Q8_0);       // output: Q8_0 when ne0 % 256 != 0
  EXPECT_EQ(types["token_embd.weight"], DType::Q5_0);
  EXPECT_EQ(types["blk.0.attn_qkv.weight"], DType::Q8_0);  // Q6_K -> Q8_0
  EXPECT_EQ(types["blk.2.attn_qkv.weight"], DType::Q5_0);  // layer 2 is not bumped: Q4_K -> Q5_0
  Q4KMState st = q4_k_m_state_for({"blk.0.ffn_gate.weight"}, 1, 0);
  EXPECT_EQ(q4_k_m_type_for("blk.0.ffn_gate.weight", {100, 64}, DType::F32, st), DType::F16);
}

TEST(TestModelQ4KM, TiedEmbeddingIsTheOutput) {
  testmodel::TestModelOverrides o;
  o.tied_output = true;
  auto types = plan_types("tiny", o);
  EXPECT_EQ(types.count("output.weight"), 0u);
  EXPECT_EQ(types["token_embd.weight"], DType::Q6_K);
}

TEST(TestModelQ4KM, MoeWithEightExpertsAndWithMany) {
  testmodel::TestModelOverrides o;
  o.arch = testmodel::TestArch::kQwen35Moe;
  o.n_layer = 16;
  auto types = plan_types("tiny", o);  // 8 experts: the n_expert == 8 bumps apply
  EXPECT_EQ(types["blk.0.attn_qkv.weight"], DType::Q8_0);
  EXPECT_EQ(types["blk.3.attn_v.weight"], DType::Q8_0);
  EXPECT_EQ(types["blk.3.attn_k.weight"], DType::Q8_0);
  EXPECT_EQ(types["blk.3.attn_output.weight"], DType::Q5_K);
  EXPECT_EQ(types["blk.0.ffn_gate_inp.weight"], DType::F32);
  EXPECT_EQ(types["blk.0.ffn_gate_inp_shexp.weight"], DType::F32);
  o.n_expert = 16;
  types = plan_types("tiny", o);
  for (int64_t il = 0; il < 16; ++il) {
    SCOPED_TRACE("layer " + std::to_string(il));
    const DType bumped = kMoreBits16.count(il) ? DType::Q6_K : DType::Q4_K;
    // Both down projections of a layer take the layer index from the name.
    EXPECT_EQ(types[blk(il, "ffn_down_exps.weight")], bumped);
    EXPECT_EQ(types[blk(il, "ffn_down_shexp.weight")], bumped);
    EXPECT_EQ(types[blk(il, "ffn_gate_exps.weight")], DType::Q4_K);
    EXPECT_EQ(types[blk(il, "ffn_up_shexp.weight")], DType::Q4_K);
    if ((il + 1) % 4 == 0) {
      EXPECT_EQ(types[blk(il, "attn_v.weight")], bumped);
      EXPECT_EQ(types[blk(il, "attn_k.weight")], DType::Q4_K);
      EXPECT_EQ(types[blk(il, "attn_output.weight")], DType::Q4_K);
    } else {
      EXPECT_EQ(types[blk(il, "attn_qkv.weight")], bumped);
    }
  }
}

TEST(TestModelQ4KM, NotQuantized) {
  EXPECT_FALSE(q4_k_m_quantizes("blk.0.attn_norm.weight", {256}));
  EXPECT_FALSE(q4_k_m_quantizes("blk.0.ffn_gate_inp_shexp.weight", {256, 1}));  // trailing 1 ignored
  EXPECT_FALSE(q4_k_m_quantizes("blk.0.ffn_gate_inp.weight", {256, 8}));
  EXPECT_FALSE(q4_k_m_quantizes("blk.0.ssm_conv1d.weight", {4, 512}));
  EXPECT_FALSE(q4_k_m_quantizes("blk.0.attn_q.bias", {256, 2}));
  EXPECT_TRUE(q4_k_m_quantizes("blk.0.attn_q.weight", {256, 512}));
}

}  // namespace
}  // namespace ds
