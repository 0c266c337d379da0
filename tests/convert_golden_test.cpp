// Converts every golden fixture (checkpoints saved by Hugging Face transformers, under
// tests/fixtures/golden/<name>/) and checks that the GGUF has exactly the spec's tensor set and
// that every tensor holds the transformed fixture weights. These checkpoints come from the real
// library, so they catch naming or layout assumptions that the hand-built checkpoints share with
// the converter.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "convert/convert.h"
#include "convert_test_util.h"
#include "gguf/gguf.h"
#include "quant/quant.h"

namespace ds::convert {
namespace {

namespace fs = std::filesystem;
using convert_test::TinyCheckpoint;

std::vector<fs::path> fixture_dirs() {
  std::vector<fs::path> out;
  const fs::path root = fs::path(DS_SOURCE_DIR) / "tests" / "fixtures" / "golden";
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    if (fs::exists(e.path() / "config.json") && fs::exists(e.path() / "model.safetensors")) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The fixture as a TinyCheckpoint (values, shapes, sizes) read straight from its files.
bool load_fixture(const fs::path& dir, TinyCheckpoint* ck) {
  std::ifstream in(dir / "config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  if (j.contains("text_config")) j.update(j["text_config"]);
  auto& s = ck->spec;
  s.moe = j["architectures"][0].get<std::string>().find("Moe") != std::string::npos;
  s.n_layer = j["num_hidden_layers"];
  s.n_embd = j["hidden_size"];
  s.n_vocab = j["vocab_size"];
  s.n_head = j["num_attention_heads"];
  s.n_head_kv = j["num_key_value_heads"];
  s.head_dim = j["head_dim"];
  s.nk = j["linear_num_key_heads"];
  s.nv = j["linear_num_value_heads"];
  s.d_state = j["linear_key_head_dim"];
  s.conv_k = j["linear_conv_kernel_dim"];
  if (s.moe) {
    s.n_expert = j["num_experts"];
    s.n_ff_exp = j["moe_intermediate_size"];
    s.n_ff_shexp = j["shared_expert_intermediate_size"];
  } else {
    s.n_ff = j["intermediate_size"];
  }
  for (const auto& t : j["layer_types"]) ck->recurrent.push_back(t == "linear_attention");
  auto file = SafetensorsFile::open((dir / "model.safetensors").string());
  EXPECT_TRUE(file.is_ok()) << file.status().to_string();
  if (!file.is_ok()) return false;
  ck->prefix = "model.";
  bool has_lm_head = false;
  for (const auto& t : (*file)->tensors()) {
    std::vector<float> v(t.n_elements());
    SafetensorsFile::to_f32(t, v.data());
    ck->values[t.name] = std::move(v);
    ck->shapes[t.name] = t.shape;
    ck->order.push_back(t.name);
    if (t.name.rfind("model.language_model.", 0) == 0) ck->prefix = "model.language_model.";
    if (t.name == "lm_head.weight") has_lm_head = true;
    if (t.name.find("experts.gate_up_proj") != std::string::npos) s.fused_experts = true;
  }
  s.tied = !has_lm_head || j.value("tie_word_embeddings", false);
  return true;
}

TEST(ConvertGolden, EveryFixtureConvertsToTheSpecTensorSet) {
  const auto dirs = fixture_dirs();
  if (dirs.empty()) GTEST_SKIP() << "no fixtures under tests/fixtures/golden";
  for (const auto& dir : dirs) {
    SCOPED_TRACE(dir.filename().string());
    TinyCheckpoint ck;
    ASSERT_TRUE(load_fixture(dir, &ck));
    const std::string out = std::string(DS_BINARY_DIR) + "/convert_golden_" + dir.filename().string() + ".gguf";
    ConvertOptions opts;
    opts.hf_dir = dir.string();
    opts.out_path = out;
    opts.type = OutType::kF32;
    opts.progress = false;
    auto r = convert_hf_to_gguf(opts);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    auto f = GgufFile::open(out);
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    const GgufFile& g = **f;
    const std::string arch = ck.spec.moe ? "qwen35moe" : "qwen35";
    EXPECT_EQ(*g.get_string("general.architecture"), arch);
    EXPECT_EQ(*g.get_u32(arch + ".block_count"), static_cast<uint32_t>(ck.spec.n_layer));
    EXPECT_EQ(g.get_bool_array(arch + ".attention.recurrent_layers").value(), ck.recurrent);
    std::vector<std::string> names;
    for (const auto& t : g.tensors()) names.push_back(t.name);
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, convert_test::expected_gguf_names(ck.spec.n_layer, ck.recurrent, ck.spec.moe, ck.spec.tied));
    convert_test::check_all_transforms(ck, [&g](const std::string& name, std::vector<float>* v, std::vector<int64_t>* ne) {
      const GgufTensorInfo* t = g.find_tensor(name);
      if (t == nullptr) return false;
      ne->assign(t->ne, t->ne + t->n_dims);
      v->resize(t->n_elements());
      quant::dequantize_rows(t->dtype, t->data, v->data(), t->n_elements() / t->ne[0], t->ne[0]);
      return true;
    });
    std::filesystem::remove(out);
  }
}

TEST(ConvertGolden, FixturesWithKQuantShapesConvertToQ4KM) {
  int converted = 0;
  for (const auto& dir : fixture_dirs()) {
    if (dir.filename().string().find("_256") == std::string::npos) continue;
    SCOPED_TRACE(dir.filename().string());
    const std::string out = std::string(DS_BINARY_DIR) + "/convert_golden_q4km_" + dir.filename().string() + ".gguf";
    ConvertOptions opts;
    opts.hf_dir = dir.string();
    opts.out_path = out;
    opts.type = OutType::kQ4_K_M;
    opts.progress = false;
    auto r = convert_hf_to_gguf(opts);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    auto f = GgufFile::open(out);
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    // Tied fixtures: the embedding doubles as the output head and gets Q6_K; row length 256 keeps
    // every matrix in a K-quant.
    EXPECT_EQ((*f)->find_tensor("token_embd.weight")->dtype, DType::Q6_K);
    for (const auto& t : (*f)->tensors()) {
      if (t.n_dims >= 2 && t.name.find("ssm_conv1d") == std::string::npos &&
          t.name.find("ffn_gate_inp") == std::string::npos) {
        EXPECT_TRUE(t.dtype == DType::Q4_K || t.dtype == DType::Q6_K) << t.name << " " << dtype_name(t.dtype);
      }
    }
    ++converted;
    std::filesystem::remove(out);
  }
  if (converted == 0) GTEST_SKIP() << "no *_256 fixtures";
}

}  // namespace
}  // namespace ds::convert
