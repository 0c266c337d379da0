// Loading qwen35 / qwen35moe GGUF files: a tiny model written with GgufWriter loads and computes the
// same logits as the same weights given in memory; quantized weights load and stay close; bad
// metadata and bad tensors are refused with messages naming the key or tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <fmt/format.h>
#include <unistd.h>

#include "gguf/gguf_writer.h"
#include "model/weight_specs.h"
#include "model_test_util.h"
#include "quant/quant.h"

namespace ds {
namespace {

struct GgufEdits {
  std::function<void(GgufWriter&)> meta;          // applied after the standard keys
  std::string drop_tensor;                         // left out of the file
  std::map<std::string, std::vector<int64_t>> reshape;  // written with this ne instead
  DType matrix_type = DType::F32;                  // 2-D/3-D weights other than F32-only ones
};

std::string write_tiny_gguf(const test::TinyModel& t, const std::string& file, const GgufEdits& e = {}) {
  const ModelConfig& c = t.config;
  const std::string a = model_arch_name(c.arch);
  GgufWriter w;
  w.set_string("general.architecture", a);
  w.set_string("general.name", "tiny");
  w.set_u32(a + ".block_count", static_cast<uint32_t>(c.n_layer));
  w.set_u32(a + ".context_length", static_cast<uint32_t>(c.n_ctx_train));
  w.set_u32(a + ".embedding_length", static_cast<uint32_t>(c.n_embd));
  if (!c.is_moe()) w.set_u32(a + ".feed_forward_length", static_cast<uint32_t>(c.n_ff));
  w.set_u32(a + ".attention.head_count", static_cast<uint32_t>(c.n_head));
  w.set_u32(a + ".attention.head_count_kv", static_cast<uint32_t>(c.n_head_kv));
  w.set_u32(a + ".attention.key_length", static_cast<uint32_t>(c.head_dim));
  w.set_u32(a + ".attention.value_length", static_cast<uint32_t>(c.head_dim));
  w.set_f32(a + ".attention.layer_norm_rms_epsilon", c.rms_eps);
  w.set_f32(a + ".rope.freq_base", c.rope_base);
  w.set_u32(a + ".rope.dimension_count", static_cast<uint32_t>(c.n_rot));
  w.set_array_i32(a + ".rope.dimension_sections", c.rope_sections);
  w.set_u32(a + ".ssm.conv_kernel", static_cast<uint32_t>(c.ssm_conv_kernel));
  w.set_u32(a + ".ssm.state_size", static_cast<uint32_t>(c.ssm_d_state));
  w.set_u32(a + ".ssm.group_count", static_cast<uint32_t>(c.ssm_n_group));
  w.set_u32(a + ".ssm.time_step_rank", static_cast<uint32_t>(c.ssm_n_v_head));
  w.set_u32(a + ".ssm.inner_size", static_cast<uint32_t>(c.ssm_inner));
  w.set_u32(a + ".full_attention_interval", 3);
  if (c.is_moe()) {
    w.set_u32(a + ".expert_count", static_cast<uint32_t>(c.n_expert));
    w.set_u32(a + ".expert_used_count", static_cast<uint32_t>(c.n_expert_used));
    w.set_u32(a + ".expert_feed_forward_length", static_cast<uint32_t>(c.n_ff_exp));
    w.set_u32(a + ".expert_shared_feed_forward_length", static_cast<uint32_t>(c.n_ff_shexp));
  }
  if (e.meta) e.meta(w);
  ModelWeights probe = t.weights;
  for (const WeightSpec& s : weight_specs(c, &probe)) {
    const TensorView src = *s.slot;
    if (src.data == nullptr || s.name == e.drop_tensor) continue;
    std::vector<int64_t> ne;
    for (int d = 0; d < 4; ++d) {
      if (s.ne[d] != 1 || d == 0) ne.push_back(s.ne[d]);
    }
    if (s.ne[2] != 1 && ne.size() == 2) ne.insert(ne.begin() + 1, 1);
    if (e.reshape.count(s.name)) ne = e.reshape.at(s.name);
    const DType dt = (s.f32_only || ne.size() < 2) ? DType::F32 : e.matrix_type;
    const int64_t n_in = ne[0];
    w.add_tensor(s.name, dt, ne, [src, dt, n_in](uint8_t* dst, uint64_t n_bytes) {
      const int64_t rows = static_cast<int64_t>(n_bytes) / dtype_row_bytes(dt, n_in);
      quant::quantize_rows(dt, src.as<float>(), dst, rows, n_in);
      return Status::ok();
    });
  }
  // The pid keeps parallel ctest processes (one per parameterized test) apart.
  const std::string path =
      (std::filesystem::temp_directory_path() / fmt::format("{}-{}", ::getpid(), file)).string();
  Status s = w.write(path);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return path;
}

std::vector<float> logits_after(Model& m, const std::vector<int32_t>& toks) {
  auto st = std::move(m.new_state()).value();
  EXPECT_TRUE(m.prefill(*st, toks).is_ok());
  auto l = m.logits(*st);
  return {l.begin(), l.end()};
}

class ModelGguf : public ::testing::TestWithParam<bool> {};

TEST_P(ModelGguf, LoadedFileMatchesInMemoryWeights) {
  test::TinyModel t = test::tiny_model(GetParam());
  const std::string path = write_tiny_gguf(t, GetParam() ? "ds_tiny_moe.gguf" : "ds_tiny.gguf");
  auto loaded = Model::load(path, {});
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().to_string();
  auto mem = test::load_tiny(GetParam(), {});
  EXPECT_EQ((*loaded)->config().n_vocab, 100);
  EXPECT_EQ((*loaded)->config().layer_kinds, mem->config().layer_kinds);
  const auto toks = test::tokens(20);
  EXPECT_EQ(logits_after(**loaded, toks), logits_after(*mem, toks));
  EXPECT_EQ((*loaded)->fingerprint(), mem->fingerprint());
  std::filesystem::remove(path);
}

TEST_P(ModelGguf, QuantizedWeightsStayCloseToF32) {
  test::TinyModel t = test::tiny_model(GetParam());
  auto mem = test::load_tiny(GetParam(), {});
  const auto toks = test::tokens(20);
  const auto ref = logits_after(*mem, toks);
  for (DType dt : {DType::F16, DType::BF16, DType::Q8_0}) {
    GgufEdits e;
    e.matrix_type = dt;
    const std::string path = write_tiny_gguf(t, "ds_tiny_q.gguf", e);
    auto m = Model::load(path, {});
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    const auto got = logits_after(**m, toks);
    double err = 0, mx = 1;
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[i]));
      err = std::max(err, static_cast<double>(std::fabs(got[i] - ref[i])));
      mx = std::max(mx, static_cast<double>(std::fabs(ref[i])));
    }
    EXPECT_LT(err / mx, dt == DType::F16 ? 5e-3 : 5e-2) << dtype_name(dt);
    std::filesystem::remove(path);
  }
}

TEST_P(ModelGguf, TiedOutputLoads) {
  test::TinyModel t = test::tiny_model(GetParam());
  GgufEdits e;
  e.drop_tensor = "output.weight";
  const std::string path = write_tiny_gguf(t, "ds_tiny_tied.gguf", e);
  auto m = Model::load(path, {});
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(logits_after(**m, test::tokens(5)).size(), 100u);
  std::filesystem::remove(path);
}

INSTANTIATE_TEST_SUITE_P(Arch, ModelGguf, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "qwen35moe" : "qwen35"; });

void expect_load_error(const test::TinyModel& t, const GgufEdits& e, const std::string& needle) {
  const std::string path = write_tiny_gguf(t, "ds_tiny_bad.gguf", e);
  auto m = Model::load(path, {});
  ASSERT_FALSE(m.is_ok()) << needle;
  EXPECT_NE(m.status().message().find(needle), std::string::npos) << m.status().to_string();
  std::filesystem::remove(path);
}

TEST(ModelGgufErrors, MetadataProblemsNameTheKey) {
  const test::TinyModel t = test::tiny_model(false);
  GgufEdits e;
  e.meta = [](GgufWriter& w) { w.set_string("general.architecture", "llama"); };
  expect_load_error(t, e, "llama");
  e.meta = [](GgufWriter& w) { w.set_i32("qwen35.block_count", 6); };
  expect_load_error(t, e, "qwen35.block_count");
  e.meta = [](GgufWriter& w) { w.set_u32("qwen35.attention.value_length", 8); };
  expect_load_error(t, e, "value_length");
  e.meta = [](GgufWriter& w) { w.set_u32("qwen35.ssm.inner_size", 30); };
  expect_load_error(t, e, "ssm.inner_size");
  e.meta = [](GgufWriter& w) { w.set_array_bool("qwen35.attention.recurrent_layers", {true, false}); };
  expect_load_error(t, e, "recurrent_layers");
}

TEST(ModelGgufErrors, MissingKeyIsNamed) {
  // A file without the required conv kernel key: written by hand without it.
  test::TinyModel t = test::tiny_model(false);
  GgufWriter w;
  w.set_string("general.architecture", "qwen35");
  w.set_u32("qwen35.block_count", 6);
  const std::string path = 
      (std::filesystem::temp_directory_path() / fmt::format("{}-ds_tiny_nokey.gguf", ::getpid())).string();
  ASSERT_TRUE(w.write(path).is_ok());
  auto m = Model::load(path, {});
  ASSERT_FALSE(m.is_ok());
  EXPECT_NE(m.status().message().find("qwen35.context_length"), std::string::npos) << m.status().to_string();
  std::filesystem::remove(path);
}

TEST(ModelGgufErrors, TensorProblemsNameTheTensor) {
  const test::TinyModel t = test::tiny_model(true);
  GgufEdits e;
  e.drop_tensor = "blk.3.ssm_a";
  expect_load_error(t, e, "blk.3.ssm_a");
  e = {};
  e.reshape["blk.2.attn_k.weight"] = {64, 16};
  expect_load_error(t, e, "blk.2.attn_k.weight");
  e = {};
  e.drop_tensor = "blk.1.ffn_up_exps.weight";
  expect_load_error(t, e, "ffn_gate_up_exps");
}

}  // namespace
}  // namespace ds
