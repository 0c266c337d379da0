// Tests for the converter's pieces below the GGUF writer: config.json parsing (flattening, rope
// lookups, defaults, errors), the V-head permutation, the tensor plan's transforms on tiny
// checkpoints of every storage form, the Q4_K_M policy and the tokenizer conversion.
#include <gtest/gtest.h>

#include <filesystem>
#include <cstring>
#include <fstream>
#include <set>

#include "convert/hf_config.h"
#include "convert/hf_weights.h"
#include "convert/quant_policy.h"
#include "convert/tensor_plan.h"
#include "convert/tokenizer_convert.h"
#include "quant/q4_k_m.h"
#include "convert_test_util.h"

namespace ds::convert {
namespace {

using convert_test::make_tiny_checkpoint;
using convert_test::TinyCheckpoint;
using convert_test::TinySpec;

std::string test_dir(const std::string& leaf) {
  const std::string dir = std::string(DS_BINARY_DIR) + "/convert_plan_test/" + leaf;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

TEST(ConvertConfig, FlattensTextConfigAndReadsRopeParameters) {
  TinySpec spec;
  spec.nested = true;
  spec.moe = true;
  TinyCheckpoint ck = make_tiny_checkpoint(spec);
  auto r = hf_config_parse(ck.config.dump(), "config.json");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const HfConfig& c = *r;
  EXPECT_EQ(c.gguf_architecture, "qwen35moe");
  EXPECT_TRUE(c.is_moe);
  EXPECT_EQ(c.n_layer, 4);
  EXPECT_EQ(c.n_embd, 256);
  EXPECT_FLOAT_EQ(c.rope_theta, 1e7f);
  EXPECT_EQ(c.n_rot(), 16);  // head_dim 64 x 0.25
  EXPECT_EQ(c.rope_sections, (std::vector<int32_t>{4, 2, 2, 0}));
  EXPECT_TRUE(c.has_layer_types);
  EXPECT_EQ(c.recurrent_layers, (std::vector<bool>{true, true, true, false}));
  EXPECT_EQ(c.n_expert, 4);
  EXPECT_EQ(c.n_ff_shexp, 256);
  EXPECT_EQ(c.ssm_conv_dim(), 2 * 64 + 128);
}

TEST(ConvertConfig, DefaultsWhenOptionalKeysAreAbsent) {
  TinyCheckpoint ck = make_tiny_checkpoint(TinySpec{});
  nlohmann::json j = ck.config;
  j.erase("rope_parameters");
  j.erase("layer_types");
  j.erase("num_key_value_heads");
  j.erase("head_dim");
  j["full_attention_interval"] = 2;
  j["rope_scaling"] = {{"mrope_section", {8}}};
  j["rope_theta"] = 5e5;
  auto r = hf_config_parse(j.dump(), "config.json");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->n_head_kv, 2);
  EXPECT_EQ(r->head_dim, 128);  // hidden_size / num_attention_heads
  EXPECT_FLOAT_EQ(r->rope_theta, 5e5f);
  EXPECT_EQ(r->rope_sections, (std::vector<int32_t>{8, 0, 0, 0}));
  EXPECT_FLOAT_EQ(r->partial_rotary_factor, 0.25f);
  EXPECT_FALSE(r->has_layer_types);
  EXPECT_EQ(r->recurrent_layers, (std::vector<bool>{true, false, true, false}));  // (i + 1) % 2 != 0
  j.erase("rope_scaling");
  r = hf_config_parse(j.dump(), "config.json");
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->rope_sections, (std::vector<int32_t>{11, 11, 10, 0}));
}

TEST(ConvertConfig, ErrorsNameTheKey) {
  TinyCheckpoint ck = make_tiny_checkpoint(TinySpec{});
  auto with = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = ck.config;
    edit(j);
    return hf_config_parse(j.dump(), "dir/config.json").status();
  };
  Status s = with([](nlohmann::json& j) { j.erase("hidden_size"); });
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("dir/config.json: missing key 'hidden_size'"), std::string::npos) << s.message();
  s = with([](nlohmann::json& j) { j.erase("intermediate_size"); });
  EXPECT_NE(s.message().find("'intermediate_size'"), std::string::npos) << s.message();
  s = with([](nlohmann::json& j) { j["architectures"] = {"LlamaForCausalLM"}; });
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("'LlamaForCausalLM' is not supported"), std::string::npos) << s.message();
  s = with([](nlohmann::json& j) { j["num_hidden_layers"] = "four"; });
  EXPECT_NE(s.message().find("'num_hidden_layers' is \"four\""), std::string::npos) << s.message();
  s = with([](nlohmann::json& j) { j["layer_types"].push_back("full_attention"); });
  EXPECT_NE(s.message().find("'layer_types'"), std::string::npos) << s.message();
  s = with([](nlohmann::json& j) { j["linear_num_value_heads"] = 3; });
  EXPECT_NE(s.message().find("not a multiple of linear_num_key_heads"), std::string::npos) << s.message();
  s = with([](nlohmann::json& j) { j["hidden_size"] = 1ll << 40; });
  EXPECT_NE(s.message().find("'hidden_size' is 1099511627776, expected an integer in [1, 2147483647]"),
            std::string::npos)
      << s.message();
  s = with([](nlohmann::json& j) { j["num_hidden_layers"] = 1000000; });
  EXPECT_NE(s.message().find("'num_hidden_layers' is 1000000, more than 4096"), std::string::npos) << s.message();
  s = with([](nlohmann::json& j) { j["rope_parameters"]["partial_rotary_factor"] = 3.0; });
  EXPECT_NE(s.message().find("'partial_rotary_factor' is 3"), std::string::npos) << s.message();
  EXPECT_EQ(hf_config_parse("{not json", "c.json").status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(hf_config_parse("[1]", "c.json").status().code(), StatusCode::kCorrupt);
}

TEST(ConvertVReorder, GroupedToTiledPermutation) {
  // nk = 2, nv = 4: HF grouped heads [k0: 0 1 | k1: 2 3]; ggml tiled wants key heads 0 1 0 1.
  std::vector<int64_t> perm;
  for (int64_t j = 0; j < 4; ++j) perm.push_back(v_head_source(j, 2, 4));
  EXPECT_EQ(perm, (std::vector<int64_t>{0, 2, 1, 3}));
  for (auto [nk, nv] : {std::pair<int64_t, int64_t>{1, 1}, {2, 2}, {1, 4}, {2, 6}, {4, 8}, {16, 32}, {16, 64}}) {
    std::vector<bool> seen(nv, false);
    for (int64_t j = 0; j < nv; ++j) {
      const int64_t s = v_head_source(j, nk, nv);
      ASSERT_TRUE(s >= 0 && s < nv && !seen[s]) << nk << "/" << nv;
      seen[s] = true;
      EXPECT_EQ(s / (nv / nk), j % nk) << "head " << j << " must keep its key head, nk " << nk << " nv " << nv;
      EXPECT_EQ(s, convert_test::expected_v_source(j, nk, nv));
      if (nk == nv) {
        EXPECT_EQ(s, j);
      }
    }
  }
}

// Plans a checkpoint and reads every planned tensor back through read_rows.
void check_plan(const TinyCheckpoint& ck, const std::string& dir) {
  ck.save(dir);
  auto cfg = hf_config_load(dir + "/config.json");
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  auto w = HfWeights::open(dir);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  auto plan = plan_tensors(*cfg, **w);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  std::vector<std::string> names;
  for (const auto& p : *plan) names.push_back(p.name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, convert_test::expected_gguf_names(ck.spec.n_layer, cfg->recurrent_layers, ck.spec.moe,
                                                     ck.spec.tied));
  convert_test::check_all_transforms(ck, [&](const std::string& name, std::vector<float>* v, std::vector<int64_t>* ne) {
    for (const auto& p : *plan) {
      if (p.name != name) continue;
      *ne = p.ne;
      v->resize(p.n_elements());
      p.read_rows(0, p.n_rows(), v->data());
      return true;
    }
    return false;
  });
}

TEST(ConvertPlan, DenseUntiedTransforms) { check_plan(make_tiny_checkpoint(TinySpec{}), test_dir("dense")); }

TEST(ConvertPlan, MoePerExpertTiedNested) {
  TinySpec s;
  s.moe = true;
  s.tied = true;
  s.nested = true;
  s.dtype = DType::BF16;
  check_plan(make_tiny_checkpoint(s), test_dir("moe_per_expert"));
}

TEST(ConvertPlan, MoeFusedExperts) {
  TinySpec s;
  s.moe = true;
  s.fused_experts = true;
  s.dtype = DType::F16;
  check_plan(make_tiny_checkpoint(s), test_dir("moe_fused"));
}

TEST(ConvertPlan, MissingAndMisshapenTensorsAreNamed) {
  TinyCheckpoint ck = make_tiny_checkpoint(TinySpec{});
  const std::string alog = "model.layers.1.linear_attn.A_log";
  auto plan_status = [](const TinyCheckpoint& c, const std::string& dir) {
    c.save(dir);
    auto cfg = hf_config_load(dir + "/config.json");
    auto w = HfWeights::open(dir);
    if (!w.is_ok()) return w.status();
    return plan_tensors(*cfg, **w).status();
  };
  TinyCheckpoint missing = ck;
  missing.remove(alog);
  Status s = plan_status(missing, test_dir("missing"));
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("tensor '" + alog + "' is missing"), std::string::npos) << s.message();

  TinyCheckpoint wrong = ck;
  wrong.shapes["model.layers.3.self_attn.k_proj.weight"] = {32, 256};
  wrong.values["model.layers.3.self_attn.k_proj.weight"].resize(32 * 256);
  s = plan_status(wrong, test_dir("wrong_shape"));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'model.layers.3.self_attn.k_proj.weight' has shape [32, 256], expected [64, 256]"),
            std::string::npos)
      << s.message();

  TinyCheckpoint extra = ck;
  extra.add("model.layers.0.mlp.gate_proj.bias", {256});
  s = plan_status(extra, test_dir("extra"));
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("'model.layers.0.mlp.gate_proj.bias' is not part of a qwen35 model"), std::string::npos)
      << s.message();
}

TEST(ConvertPlan, DropsVisionAndMtpTensors) {
  TinySpec spec;
  spec.nested = true;
  TinyCheckpoint ck = make_tiny_checkpoint(spec);
  ck.add("model.visual.blocks.0.attn.qkv.weight", {8, 8});
  ck.add("mtp.layers.0.input_layernorm.weight", {256});
  const std::string dir = test_dir("visual_mtp");
  ck.save(dir);
  auto w = HfWeights::open(dir);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  EXPECT_EQ((*w)->n_dropped_visual(), 1);
  EXPECT_EQ((*w)->n_dropped_mtp(), 1);
  EXPECT_FALSE((*w)->has("visual.blocks.0.attn.qkv.weight"));
  EXPECT_TRUE((*w)->has("layers.0.input_layernorm.weight"));

  // A missing tensor is named with the checkpoint's own prefix, not the vision tower's.
  ck.remove("model.language_model.layers.1.linear_attn.A_log");
  const std::string dir2 = test_dir("visual_mtp_missing");
  ck.save(dir2);
  auto w2 = HfWeights::open(dir2);
  ASSERT_TRUE(w2.is_ok());
  auto cfg = hf_config_load(dir2 + "/config.json");
  ASSERT_TRUE(cfg.is_ok());
  Status s = plan_tensors(*cfg, **w2).status();
  EXPECT_NE(s.message().find("'model.language_model.layers.1.linear_attn.A_log' is missing"), std::string::npos)
      << s.message();
}

TEST(ConvertPlan, ShardedCheckpointThroughIndex) {
  TinyCheckpoint ck = make_tiny_checkpoint(TinySpec{});
  const std::string dir = test_dir("sharded");
  // Split into two shards with an index, as large checkpoints are stored.
  std::vector<SafetensorsWriteTensor> a, b;
  nlohmann::json map = nlohmann::json::object();
  for (size_t i = 0; i < ck.order.size(); ++i) {
    const std::string& name = ck.order[i];
    SafetensorsWriteTensor t{name, DType::F32, ck.shapes.at(name), {}};
    const auto& v = ck.values.at(name);
    t.bytes.resize(v.size() * 4);
    std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
    const bool first = i % 2 == 0;
    map[name] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
    (first ? a : b).push_back(std::move(t));
  }
  ASSERT_TRUE(safetensors_write(dir + "/model-00001-of-00002.safetensors", a).is_ok());
  ASSERT_TRUE(safetensors_write(dir + "/model-00002-of-00002.safetensors", b).is_ok());
  std::ofstream(dir + "/model.safetensors.index.json") << nlohmann::json{{"weight_map", map}}.dump();
  std::ofstream(dir + "/config.json") << ck.config.dump();
  auto w = HfWeights::open(dir);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  auto cfg = hf_config_load(dir + "/config.json");
  auto plan = plan_tensors(*cfg, **w);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();

  // An index naming a tensor its shard lacks is refused.
  map["model.extra.weight"] = "model-00001-of-00002.safetensors";
  std::ofstream(dir + "/model.safetensors.index.json") << nlohmann::json{{"weight_map", map}}.dump();
  Status s = HfWeights::open(dir).status();
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_NE(s.message().find("'model.extra.weight'"), std::string::npos) << s.message();
}

TEST(ConvertPolicy, UseMoreBits) {
  // n = 8: first eighth (0), last eighth (7), and (i - 1) % 3 == 2 (3, 6).
  std::vector<int64_t> more;
  for (int64_t i = 0; i < 8; ++i) {
    if (q4_k_m_use_more_bits(i, 8)) more.push_back(i);
  }
  EXPECT_EQ(more, (std::vector<int64_t>{0, 3, 6, 7}));
}

TEST(ConvertPolicy, PlainTypesKeepSmallTensorsF32) {
  std::vector<TypeQuery> q = {
      {"token_embd.weight", {256, 320}, false}, {"blk.0.attn_norm.weight", {256}, true},
      {"blk.0.ssm_conv1d.weight", {4, 256}, true}, {"blk.0.ffn_gate_inp.weight", {256, 8}, true},
      {"blk.0.ssm_a", {4}, true},               {"blk.0.ssm_out.weight", {100, 256}, false},
  };
  auto t = assign_types(q, OutType::kQ8_0, 1, 0);
  EXPECT_EQ(t, (std::vector<DType>{DType::Q8_0, DType::F32, DType::F32, DType::F32, DType::F32, DType::F16}));
  t = assign_types(q, OutType::kBF16, 1, 0);
  EXPECT_EQ(t, (std::vector<DType>{DType::BF16, DType::F32, DType::F32, DType::F32, DType::F32, DType::BF16}));
}

TEST(ConvertPolicy, Q4KMEightExpertsAndShapeFallbacks) {
  // With exactly 8 experts llama-quantize gives attn_v-like tensors Q8_0 and attn_output Q5_K.
  std::vector<TypeQuery> q = {
      {"token_embd.weight", {256, 320}, false},     {"blk.0.attn_qkv.weight", {256, 512}, false},
      {"blk.1.attn_v.weight", {256, 64}, false},     {"blk.1.attn_output.weight", {256, 256}, false},
      {"blk.1.attn_output.weight", {128, 256}, false}, {"blk.1.ffn_down_exps.weight", {96, 256, 8}, false},
      {"blk.1.ffn_up_exps.weight", {48, 256, 8}, false},
  };
  auto t = assign_types(q, OutType::kQ4_K_M, 2, 8);
  // Tied (no output.weight): token_embd Q6_K. ffn_down in layer 1 of 2: use_more_bits(1, 2) is true
  // (1 >= 7 * 2 / 8), Q6_K falls back to Q8_0 for ne0 96. ne0 48 is not a multiple of 32: F16.
  EXPECT_EQ(t, (std::vector<DType>{DType::Q6_K, DType::Q8_0, DType::Q8_0, DType::Q5_K, DType::Q5_1, DType::Q8_0,
                                   DType::F16}));
  t = assign_types(q, OutType::kQ4_K_M, 2, 256);
  EXPECT_EQ(t[1], DType::Q4_K);  // attn_v-like index 0 of 2: 0 < 2 / 8 is false, so no extra bits
  EXPECT_EQ(t[2], DType::Q6_K);  // index 1 of 2: 1 >= 7 * 2 / 8, the last eighth
  EXPECT_EQ(t[3], DType::Q4_K);
}

TEST(ConvertTokenizer, ByteAlphabet) {
  EXPECT_EQ(byte_to_unicode('A'), "A");
  EXPECT_EQ(byte_to_unicode(' '), "\xC4\xA0");   // U+0120 'Ġ'
  EXPECT_EQ(byte_to_unicode('\n'), "\xC4\x8A");  // U+010A 'Ċ'
  EXPECT_EQ(byte_to_unicode(0), "\xC4\x80");     // U+0100
  EXPECT_EQ(byte_to_unicode(0xAD), "\xC5\x83");  // soft hyphen is the 68th remapped byte: U+0143
  std::set<std::string> all;
  for (int b = 0; b < 256; ++b) all.insert(byte_to_unicode(static_cast<uint8_t>(b)));
  EXPECT_EQ(all.size(), 256u);
}

TEST(ConvertTokenizer, ReadsVocabMergesAddedTokensAndConfig) {
  const std::string dir = test_dir("tokenizer");
  nlohmann::json tj = {
      {"model",
       {{"type", "BPE"},
        {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}, {"\xC4\xA0" "a", 3}}},
        {"merges", nlohmann::json::array({"a b", nlohmann::json::array({"\xC4\xA0", "a"})})}}},
      {"added_tokens",
       {{{"id", 5}, {"content", "<|endoftext|>"}, {"special", true}},
        {{"id", 6}, {"content", "<|im_end|>"}, {"special", true}},
        {{"id", 7}, {"content", "<think>"}, {"special", false}}}},
  };
  std::ofstream(dir + "/tokenizer.json") << tj.dump();
  std::ofstream(dir + "/tokenizer_config.json")
      << nlohmann::json{{"eos_token", "<|im_end|>"}, {"pad_token", "<|endoftext|>"}, {"bos_token", nullptr},
                        {"chat_template", "{{ messages }}"}}
             .dump();
  HfConfig cfg;
  cfg.n_vocab = 10;
  auto r = tokenizer_load(dir, cfg);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const TokenizerData& t = *r;
  ASSERT_EQ(t.tokens.size(), 10u);
  EXPECT_EQ(t.tokens[3], "\xC4\xA0" "a");
  EXPECT_EQ(t.tokens[4], "[PAD4]");
  EXPECT_EQ(t.tokens[9], "[PAD9]");
  EXPECT_EQ(t.token_types, (std::vector<int32_t>{1, 1, 1, 1, 5, 3, 3, 4, 5, 5}));
  EXPECT_EQ(t.merges, (std::vector<std::string>{"a b", "\xC4\xA0 a"}));
  EXPECT_EQ(t.eos_id, 6);
  EXPECT_EQ(t.pad_id, 5);
  EXPECT_EQ(t.bos_id, 5);  // no bos in either config: <|endoftext|>
  EXPECT_FALSE(t.add_bos);
  EXPECT_EQ(t.chat_template, "{{ messages }}");

  cfg.n_vocab = 7;  // id 7 no longer fits
  Status s = tokenizer_load(dir, cfg).status();
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_NE(s.message().find("'<think>' has id 7, outside vocab_size 7"), std::string::npos) << s.message();
}

TEST(ConvertTokenizer, FallbackWithoutTokenizerJson) {
  HfConfig cfg;
  cfg.n_vocab = 300;
  cfg.eos_token_id = 299;
  auto r = tokenizer_load(test_dir("no_tokenizer"), cfg);
  ASSERT_TRUE(r.is_ok());
  EXPECT_TRUE(r->is_fallback);
  ASSERT_EQ(r->tokens.size(), 300u);
  EXPECT_EQ(r->tokens[32], "\xC4\xA0");
  EXPECT_EQ(r->tokens[256], "[PAD256]");
  EXPECT_EQ(r->token_types[255], kTokenNormal);
  EXPECT_EQ(r->token_types[256], kTokenUnused);
  EXPECT_TRUE(r->merges.empty());
  EXPECT_EQ(r->eos_id, 299);
}

}  // namespace
}  // namespace ds::convert
