// Reads generated test models back with the GGUF reader and checks them against the model spec:
// the exact metadata key set and value types (section 2), the exact tensor set and shapes (section
// 3), dtypes, value ranges of the initialisation, and byte-for-byte determinism (same seed, any
// thread count). The expected tables are written here from the spec, not taken from the generator.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "gguf/gguf.h"
#include "quant/quant.h"
#include "testmodel/chat_template_data.h"
#include "testmodel/test_model_writer.h"

namespace ds::testmodel {
namespace {

struct Generated {
  std::vector<uint8_t> bytes;
  std::unique_ptr<GgufFile> file;
};

Generated generate(const std::string& preset, TestModelOverrides o, int n_threads = 2,
                   QuantMode mode = QuantMode::kAuto) {
  Generated g;
  auto c = test_model_config_make(preset, o);
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  ThreadPool pool(n_threads);
  TestModelWriteOptions opt;
  opt.pool = &pool;
  opt.quant_mode = mode;
  auto bytes = test_model_write_to_memory(*c, opt);
  EXPECT_TRUE(bytes.is_ok()) << bytes.status().to_string();
  if (!bytes.is_ok()) return g;
  g.bytes = std::move(bytes).value();
  auto f = GgufFile::from_memory(g.bytes, preset);
  EXPECT_TRUE(f.is_ok()) << f.status().to_string();
  if (f.is_ok()) g.file = std::move(f).value();
  return g;
}

// Key -> (type, array element type) per the spec's section 2 tables.
using KeyTypes = std::map<std::string, std::pair<GgufType, GgufType>>;

KeyTypes expected_keys(const std::string& a, bool moe) {
  const auto U32 = std::make_pair(GgufType::U32, GgufType::U8);
  const auto F32 = std::make_pair(GgufType::F32, GgufType::U8);
  const auto STR = std::make_pair(GgufType::STRING, GgufType::U8);
  KeyTypes k = {
      {"general.architecture", STR},
      {"general.name", STR},
      {"general.file_type", U32},
      {"general.quantization_version", U32},
      {a + ".block_count", U32},
      {a + ".context_length", U32},
      {a + ".embedding_length", U32},
      {a + ".attention.head_count", U32},
      {a + ".attention.head_count_kv", U32},
      {a + ".attention.key_length", U32},
      {a + ".attention.value_length", U32},
      {a + ".attention.layer_norm_rms_epsilon", F32},
      {a + ".rope.freq_base", F32},
      {a + ".rope.dimension_count", U32},
      {a + ".rope.dimension_sections", {GgufType::ARRAY, GgufType::I32}},
      {a + ".ssm.conv_kernel", U32},
      {a + ".ssm.state_size", U32},
      {a + ".ssm.group_count", U32},
      {a + ".ssm.time_step_rank", U32},
      {a + ".ssm.inner_size", U32},
      {a + ".full_attention_interval", U32},
      {"tokenizer.ggml.model", STR},
      {"tokenizer.ggml.pre", STR},
      {"tokenizer.ggml.tokens", {GgufType::ARRAY, GgufType::STRING}},
      {"tokenizer.ggml.token_type", {GgufType::ARRAY, GgufType::I32}},
      {"tokenizer.ggml.merges", {GgufType::ARRAY, GgufType::STRING}},
      {"tokenizer.ggml.bos_token_id", U32},
      {"tokenizer.ggml.eos_token_id", U32},
      {"tokenizer.ggml.padding_token_id", U32},
      {"tokenizer.ggml.add_bos_token", {GgufType::BOOL, GgufType::U8}},
      {"tokenizer.chat_template", STR},
  };
  if (moe) {
    for (const char* s : {".expert_count", ".expert_used_count", ".expert_feed_forward_length",
                          ".expert_shared_feed_forward_length"})
      k[a + s] = U32;
  } else {
    k[a + ".feed_forward_length"] = U32;
  }
  return k;
}

// The spec's section 3 tensor tables for tiny (E 256, V 1024, H 4, Hkv 2, D 64, dk 32, nk 2,
// nv 4, K 4; dense n_ff 512; MoE 8 experts of 256, shared expert 256), layers 3 and 7 full attention.
std::map<std::string, std::vector<int64_t>> expected_tensors(bool moe) {
  const int64_t E = 256, V = 1024, H = 4, Hkv = 2, D = 64, dk = 32, nk = 2, nv = 4, K = 4;
  const int64_t key_dim = dk * nk, value_dim = dk * nv, conv_dim = 2 * key_dim + value_dim;
  std::map<std::string, std::vector<int64_t>> t = {
      {"token_embd.weight", {E, V}}, {"output_norm.weight", {E}}, {"output.weight", {E, V}}};
  for (int il = 0; il < 8; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    t[p + "attn_norm.weight"] = {E};
    t[p + "post_attention_norm.weight"] = {E};
    if (il == 3 || il == 7) {
      t[p + "attn_q.weight"] = {E, 2 * H * D};
      t[p + "attn_k.weight"] = {E, Hkv * D};
      t[p + "attn_v.weight"] = {E, Hkv * D};
      t[p + "attn_output.weight"] = {H * D, E};
      t[p + "attn_q_norm.weight"] = {D};
      t[p + "attn_k_norm.weight"] = {D};
    } else {
      t[p + "attn_qkv.weight"] = {E, conv_dim};
      t[p + "attn_gate.weight"] = {E, value_dim};
      t[p + "ssm_conv1d.weight"] = {K, conv_dim};
      t[p + "ssm_dt.bias"] = {nv};
      t[p + "ssm_a"] = {nv};
      t[p + "ssm_beta.weight"] = {E, nv};
      t[p + "ssm_alpha.weight"] = {E, nv};
      t[p + "ssm_norm.weight"] = {dk};
      t[p + "ssm_out.weight"] = {value_dim, E};
    }
    if (moe) {
      t[p + "ffn_gate_inp.weight"] = {E, 8};
      t[p + "ffn_gate_exps.weight"] = {E, 256, 8};
      t[p + "ffn_up_exps.weight"] = {E, 256, 8};
      t[p + "ffn_down_exps.weight"] = {256, E, 8};
      t[p + "ffn_gate_inp_shexp.weight"] = {E};
      t[p + "ffn_gate_shexp.weight"] = {E, 256};
      t[p + "ffn_up_shexp.weight"] = {E, 256};
      t[p + "ffn_down_shexp.weight"] = {256, E};
    } else {
      t[p + "ffn_gate.weight"] = {E, 512};
      t[p + "ffn_up.weight"] = {E, 512};
      t[p + "ffn_down.weight"] = {512, E};
    }
  }
  return t;
}

// Tensors the spec keeps in F32 whatever the file type.
bool stays_f32(const std::string& name) {
  return name.find("norm.weight") != std::string::npos || name.find("ssm_conv1d") != std::string::npos ||
         name.find("ffn_gate_inp") != std::string::npos ||
         (name.size() >= 5 && name.compare(name.size() - 5, 5, "ssm_a") == 0) ||
         name.find("ssm_dt.bias") != std::string::npos;
}

void check_file(const GgufFile& f, const std::string& a, bool moe, DType matrix_type) {
  // Metadata: exactly the expected keys with the expected types.
  const KeyTypes want = expected_keys(a, moe);
  std::set<std::string> seen;
  for (const auto& kv : f.kvs()) {
    seen.insert(kv.key);
    auto it = want.find(kv.key);
    if (it == want.end()) {
      ADD_FAILURE() << "unexpected key " << kv.key;
      continue;
    }
    EXPECT_EQ(kv.value.type, it->second.first) << kv.key;
    if (kv.value.type == GgufType::ARRAY) {
      EXPECT_EQ(kv.value.elem_type, it->second.second) << kv.key;
    }
  }
  for (const auto& [key, type] : want) EXPECT_TRUE(seen.count(key)) << "missing key " << key;

  // Tensors: exactly the spec's set and shapes.
  const auto tensors = expected_tensors(moe);
  EXPECT_EQ(f.tensors().size(), tensors.size());
  for (const auto& t : f.tensors()) {
    auto it = tensors.find(t.name);
    if (it == tensors.end()) {
      ADD_FAILURE() << "unexpected tensor " << t.name;
      continue;
    }
    ASSERT_EQ(t.n_dims, static_cast<int>(it->second.size())) << t.name;
    for (int d = 0; d < t.n_dims; ++d) EXPECT_EQ(t.ne[d], it->second[d]) << t.name << " dim " << d;
    EXPECT_EQ(t.dtype, stays_f32(t.name) ? DType::F32 : matrix_type) << t.name;
    EXPECT_EQ(t.offset % f.alignment(), 0u) << t.name;
  }
}

TEST(TestModelGguf, DenseKeysAndTensorsMatchSpec) {
  Generated g = generate("tiny", {});
  ASSERT_TRUE(g.file);
  check_file(*g.file, "qwen35", false, DType::F32);
  const GgufFile& f = *g.file;
  EXPECT_EQ(*f.get_string("general.architecture"), "qwen35");
  EXPECT_EQ(*f.get_u32("general.file_type"), 0u);
  EXPECT_EQ(*f.get_u32("qwen35.block_count"), 8u);
  EXPECT_EQ(*f.get_u32("qwen35.embedding_length"), 256u);
  EXPECT_EQ(*f.get_u32("qwen35.feed_forward_length"), 512u);
  EXPECT_EQ(*f.get_u32("qwen35.attention.key_length"), 64u);
  EXPECT_EQ(*f.get_u32("qwen35.rope.dimension_count"), 16u);
  const auto sections = *f.get_i32_array("qwen35.rope.dimension_sections");
  ASSERT_EQ(sections.size(), 4u);
  EXPECT_EQ(sections[0] + sections[1] + sections[2] + sections[3], 8);
  EXPECT_EQ(*f.get_u32("qwen35.ssm.inner_size"), 128u);  // dk * nv
  EXPECT_EQ(*f.get_u32("qwen35.ssm.time_step_rank"), 4u);
  EXPECT_EQ(*f.get_u32("qwen35.ssm.group_count"), 2u);
  EXPECT_EQ(*f.get_u32("qwen35.full_attention_interval"), 4u);
  EXPECT_FLOAT_EQ(*f.get_f32("qwen35.rope.freq_base"), 1e7f);
  EXPECT_FLOAT_EQ(*f.get_f32("qwen35.attention.layer_norm_rms_epsilon"), 1e-6f);
  EXPECT_EQ(*f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(*f.get_string("tokenizer.ggml.pre"), "qwen35");
  EXPECT_FALSE(*f.get_bool("tokenizer.ggml.add_bos_token"));
  EXPECT_EQ(*f.get_string("tokenizer.chat_template"), std::string(qwen35_chat_template()));
  const auto tokens = *f.get_string_array("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), 1024u);
  EXPECT_EQ(tokens[*f.get_u32("tokenizer.ggml.eos_token_id")], "<|im_end|>");
  EXPECT_EQ(tokens[*f.get_u32("tokenizer.ggml.bos_token_id")], "<|endoftext|>");
  EXPECT_EQ(tokens[*f.get_u32("tokenizer.ggml.padding_token_id")], "<|endoftext|>");
  EXPECT_EQ(f.get_i32_array("tokenizer.ggml.token_type")->size(), 1024u);
  EXPECT_FALSE(f.get_string_array("tokenizer.ggml.merges")->empty());
}

TEST(TestModelGguf, MoeKeysAndTensorsMatchSpec) {
  TestModelOverrides o;
  o.arch = TestArch::kQwen35Moe;
  o.type = OutType::kQ8_0;
  Generated g = generate("tiny", o);
  ASSERT_TRUE(g.file);
  check_file(*g.file, "qwen35moe", true, DType::Q8_0);
  EXPECT_EQ(*g.file->get_u32("general.file_type"), 7u);
  EXPECT_EQ(*g.file->get_u32("qwen35moe.expert_count"), 8u);
  EXPECT_EQ(*g.file->get_u32("qwen35moe.expert_used_count"), 2u);
  EXPECT_EQ(*g.file->get_u32("qwen35moe.expert_feed_forward_length"), 256u);
  EXPECT_EQ(*g.file->get_u32("qwen35moe.expert_shared_feed_forward_length"), 256u);
}

TEST(TestModelGguf, TiedOutputOmitsOutputWeight) {
  TestModelOverrides o;
  o.tied_output = true;
  Generated g = generate("tiny", o);
  ASSERT_TRUE(g.file);
  EXPECT_EQ(g.file->find_tensor("output.weight"), nullptr);
  EXPECT_NE(g.file->find_tensor("token_embd.weight"), nullptr);
}

// A smaller model for the tests that generate several files with the (slow) exact K-quantizer.
TestModelOverrides mini(OutType type, uint64_t seed) {
  TestModelOverrides o;
  o.type = type;
  o.seed = seed;
  o.n_layer = 4;
  o.n_vocab = 300;
  o.n_ff = 256;
  return o;
}

TEST(TestModelGguf, DeterministicAcrossRunsAndThreadCounts) {
  Generated a = generate("tiny", mini(OutType::kQ4_K_M, 42), 1);
  Generated b = generate("tiny", mini(OutType::kQ4_K_M, 42), 3);
  ASSERT_FALSE(a.bytes.empty());
  EXPECT_TRUE(a.bytes == b.bytes) << "1 thread vs 3 threads";
  Generated c = generate("tiny", mini(OutType::kQ8_0, 42), 1);
  Generated d = generate("tiny", mini(OutType::kQ8_0, 42), 2);
  Generated e = generate("tiny", mini(OutType::kQ8_0, 43), 2);
  ASSERT_FALSE(c.bytes.empty());
  EXPECT_TRUE(c.bytes == d.bytes) << "1 thread vs 2 threads";
  ASSERT_EQ(c.bytes.size(), e.bytes.size());
  EXPECT_FALSE(c.bytes == e.bytes) << "a different seed must change the weights";
}

TEST(TestModelGguf, BlockPoolModeIsDeterministicAndKeepsTheDistribution) {
  const TestModelOverrides o = mini(OutType::kQ4_K_M, 5);
  Generated a = generate("tiny", o, 1, QuantMode::kBlockPool);
  Generated b = generate("tiny", o, 2, QuantMode::kBlockPool);
  Generated exact = generate("tiny", o, 2, QuantMode::kExact);
  ASSERT_TRUE(a.file && b.file && exact.file);
  EXPECT_TRUE(a.bytes == b.bytes) << "1 thread vs 2 threads";
  ASSERT_EQ(a.bytes.size(), exact.bytes.size());
  for (const auto& t : a.file->tensors()) {
    const GgufTensorInfo* e = exact.file->find_tensor(t.name);
    ASSERT_NE(e, nullptr);
    ASSERT_EQ(t.dtype, e->dtype) << t.name;
    const bool same = std::equal(t.data, t.data + t.n_bytes, e->data);
    const bool k_quant = t.dtype == DType::Q4_K || t.dtype == DType::Q5_K || t.dtype == DType::Q6_K;
    EXPECT_EQ(same, !k_quant) << t.name << ": only K-quant tensors come from the pool";
  }
}

std::vector<float> read_tensor(const GgufFile& f, const std::string& name) {
  const GgufTensorInfo* t = f.find_tensor(name);
  EXPECT_NE(t, nullptr) << name;
  if (!t) return {};
  std::vector<float> out(static_cast<size_t>(t->n_elements()));
  quant::dequantize_rows(t->dtype, t->data, out.data(), t->n_elements() / t->ne[0], t->ne[0]);
  return out;
}

double rms(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s / static_cast<double>(v.size()));
}

TEST(TestModelGguf, InitialisationRanges) {
  Generated g = generate("tiny", {});
  ASSERT_TRUE(g.file);
  const GgufFile& f = *g.file;
  for (float x : read_tensor(f, "blk.0.attn_norm.weight")) EXPECT_TRUE(x >= 0.9f && x <= 1.1f) << x;
  for (float x : read_tensor(f, "blk.0.ssm_norm.weight")) EXPECT_TRUE(x >= 0.9f && x <= 1.1f) << x;
  for (float x : read_tensor(f, "blk.3.attn_k_norm.weight")) EXPECT_TRUE(x >= 0.9f && x <= 1.1f) << x;
  for (float x : read_tensor(f, "blk.0.ssm_a")) EXPECT_TRUE(x <= -1.0f && x >= -16.0f) << x;
  for (float x : read_tensor(f, "blk.0.ssm_dt.bias")) EXPECT_LE(std::fabs(x), 0.5f);
  // Input projections ~ N(0, 1/fan_in); output projections further / sqrt(2 n_layer) = / 4.
  EXPECT_NEAR(rms(read_tensor(f, "blk.3.attn_q.weight")), 1.0 / 16.0, 0.1 / 16.0);
  EXPECT_NEAR(rms(read_tensor(f, "blk.0.attn_qkv.weight")), 1.0 / 16.0, 0.1 / 16.0);
  EXPECT_NEAR(rms(read_tensor(f, "blk.0.ffn_down.weight")), 1.0 / std::sqrt(512.0) / 4.0, 0.01);
  EXPECT_NEAR(rms(read_tensor(f, "blk.0.ssm_conv1d.weight")), 0.5, 0.05);  // N(0, 1/K), K = 4
  // Rows differ from each other (seeded per row, not one stream restarted).
  const auto q = read_tensor(f, "blk.3.attn_q.weight");
  EXPECT_NE(q[0], q[256]);
}

TEST(TestModelGguf, BlockPoolWeightsHaveTheRightScale) {
  TestModelOverrides o;
  o.type = OutType::kQ4_K_M;
  Generated g = generate("tiny", o, 2, QuantMode::kBlockPool);
  ASSERT_TRUE(g.file);
  const GgufFile& f = *g.file;
  EXPECT_EQ(f.find_tensor("blk.3.attn_q.weight")->dtype, DType::Q4_K);
  EXPECT_NEAR(rms(read_tensor(f, "blk.3.attn_q.weight")), 1.0 / 16.0, 0.1 / 16.0);
  EXPECT_EQ(f.find_tensor("output.weight")->dtype, DType::Q6_K);
  EXPECT_NEAR(rms(read_tensor(f, "output.weight")), 1.0 / 16.0, 0.1 / 16.0);
  const auto q = read_tensor(f, "blk.3.attn_q.weight");
  EXPECT_NE(std::vector<float>(q.begin(), q.begin() + 256), std::vector<float>(q.begin() + 256, q.begin() + 512));
}

}  // namespace
}  // namespace ds::testmodel
