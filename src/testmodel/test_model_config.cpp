// Presets, overrides and validation of test model shapes. The real-shape presets copy the published
// Qwen3.6 configurations; tiny and small are sized for unit tests and CPU benchmarks, with every
// matrix row length a multiple of 256 where possible so that K-quants apply without fallbacks.
#include "testmodel/test_model_config.h"

#include <algorithm>
#include <cctype>

#include "core/check.h"

namespace ds::testmodel {

const char* test_arch_name(TestArch arch) { return arch == TestArch::kQwen35Moe ? "qwen35moe" : "qwen35"; }

bool test_arch_from_name(const std::string& name, TestArch* out) {
  if (name == "qwen35") *out = TestArch::kQwen35;
  else if (name == "qwen35moe") *out = TestArch::kQwen35Moe;
  else return false;
  return true;
}

namespace {

struct OutTypeEntry {
  OutType type;
  const char* name;
  uint32_t file_type;
  DType dtype;  // plain dtype; Q4_K for the mix (its default type)
};
constexpr OutTypeEntry kOutTypes[] = {
    {OutType::kF32, "f32", 0, DType::F32},     {OutType::kF16, "f16", 1, DType::F16},
    {OutType::kBF16, "bf16", 32, DType::BF16}, {OutType::kQ8_0, "q8_0", 7, DType::Q8_0},
    {OutType::kQ4_0, "q4_0", 2, DType::Q4_0},  {OutType::kQ4_K_M, "q4_k_m", 15, DType::Q4_K},
};

const OutTypeEntry& out_type_entry(OutType t) {
  for (const auto& e : kOutTypes)
    if (e.type == t) return e;
  DS_CHECK(false, "unknown OutType {}", static_cast<int>(t));
  return kOutTypes[0];
}

}  // namespace

const char* out_type_name(OutType t) { return out_type_entry(t).name; }
uint32_t out_type_file_type(OutType t) { return out_type_entry(t).file_type; }

DType out_type_plain_dtype(OutType t) {
  DS_CHECK(t != OutType::kQ4_K_M, "q4_k_m is a mix, not one dtype");
  return out_type_entry(t).dtype;
}

bool out_type_from_name(const std::string& name, OutType* out) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const auto& e : kOutTypes) {
    if (lower == e.name) {
      *out = e.type;
      return true;
    }
  }
  return false;
}

std::vector<int32_t> TestModelConfig::rope_sections() const {
  const int32_t half = static_cast<int32_t>(n_rot / 2);
  const int32_t t = (half + 2) / 3;
  const int32_t h = std::min(t, half - t);
  return {t, h, half - t - h, 0};
}

const std::vector<std::string>& test_model_preset_names() {
  static const std::vector<std::string> kNames = {"tiny", "small", "qwen3.6-27b", "qwen3.6-35b-a3b"};
  return kNames;
}

Result<TestModelConfig> test_model_preset(const std::string& name) {
  TestModelConfig c;
  c.preset = name;
  if (name == "tiny" || name == "small") {
    const bool tiny = name == "tiny";
    c.arch = TestArch::kQwen35;
    c.n_embd = tiny ? 256 : 1024;
    c.n_layer = tiny ? 8 : 16;
    c.full_attention_interval = 4;
    c.n_head = tiny ? 4 : 8;
    c.n_head_kv = 2;
    c.head_dim = tiny ? 64 : 128;
    c.n_rot = c.head_dim / 4;  // partial_rotary_factor 0.25, as the real models
    c.ssm_n_k_heads = 2;
    c.ssm_n_v_heads = 4;
    c.ssm_head_dim = tiny ? 32 : 128;
    c.n_ff = tiny ? 512 : 1280;
    c.n_vocab = tiny ? 1024 : 32768;
    c.n_expert = 8;
    c.n_expert_used = 2;
    c.n_ff_exp = 256;
    c.n_ff_shexp = 256;
    c.n_ctx = tiny ? 4096 : 32768;
    c.type = OutType::kF32;
  } else if (name == "qwen3.6-27b") {
    c.arch = TestArch::kQwen35;
    c.n_embd = 5120;
    c.n_layer = 64;
    c.n_head = 24;
    c.n_head_kv = 4;
    c.head_dim = 256;
    c.n_rot = 64;
    c.ssm_n_k_heads = 16;
    c.ssm_n_v_heads = 48;
    c.ssm_head_dim = 128;
    c.n_ff = 17408;
    c.n_vocab = 248320;
    c.n_ctx = 262144;
    c.type = OutType::kQ4_K_M;
  } else if (name == "qwen3.6-35b-a3b") {
    c.arch = TestArch::kQwen35Moe;
    c.n_embd = 2048;
    c.n_layer = 40;
    c.n_head = 16;
    c.n_head_kv = 2;
    c.head_dim = 256;
    c.n_rot = 64;
    c.ssm_n_k_heads = 16;
    c.ssm_n_v_heads = 32;
    c.ssm_head_dim = 128;
    c.n_expert = 256;
    c.n_expert_used = 8;
    c.n_ff_exp = 512;
    c.n_ff_shexp = 512;
    c.n_vocab = 248320;
    c.n_ctx = 262144;
    c.type = OutType::kQ4_K_M;
  } else {
    std::string names;
    for (const auto& n : test_model_preset_names()) names += (names.empty() ? "" : ", ") + n;
    return not_found("unknown preset '{}' (expected one of: {})", name, names);
  }
  return c;
}

Result<TestModelConfig> test_model_config_make(const std::string& preset, const TestModelOverrides& o) {
  DS_ASSIGN_OR_RETURN(TestModelConfig c, test_model_preset(preset));
  if (o.arch && *o.arch != c.arch) {
    if (preset != "tiny" && preset != "small") {
      return invalid_argument("--arch {} conflicts with preset '{}', which is {}; --arch applies to tiny and small only",
                              test_arch_name(*o.arch), preset, test_arch_name(c.arch));
    }
    c.arch = *o.arch;
  }
  auto set = [](int64_t& field, const std::optional<int64_t>& v) {
    if (v) field = *v;
  };
  if (o.type) c.type = *o.type;
  if (o.seed) c.seed = *o.seed;
  if (o.tied_output) c.tied_output = *o.tied_output;
  set(c.n_embd, o.n_embd);
  set(c.n_layer, o.n_layer);
  set(c.n_head, o.n_head);
  set(c.n_head_kv, o.n_head_kv);
  set(c.head_dim, o.head_dim);
  set(c.n_rot, o.n_rot);
  set(c.n_ff, o.n_ff);
  set(c.n_vocab, o.n_vocab);
  set(c.ssm_n_k_heads, o.ssm_n_k_heads);
  set(c.ssm_n_v_heads, o.ssm_n_v_heads);
  set(c.ssm_head_dim, o.ssm_head_dim);
  set(c.ssm_conv_kernel, o.ssm_conv_kernel);
  set(c.n_expert, o.n_expert);
  set(c.n_expert_used, o.n_expert_used);
  set(c.n_ff_exp, o.n_ff_exp);
  set(c.n_ff_shexp, o.n_ff_shexp);
  set(c.full_attention_interval, o.full_attention_interval);
  set(c.n_ctx, o.n_ctx);
  DS_TRY(test_model_config_validate(c));
  return c;
}

namespace {

// Every dimension must be in [lo, hi]; hi keeps products far from int64 overflow and fits u32 keys.
Status check_range(const char* flag, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) return invalid_argument("{} {} is out of range [{}, {}]", flag, v, lo, hi);
  return Status::ok();
}

}  // namespace

Status test_model_config_validate(const TestModelConfig& c) {
  constexpr int64_t kMaxDim = int64_t{1} << 20;
  DS_TRY(check_range("--n-embd", c.n_embd, 1, kMaxDim));
  DS_TRY(check_range("--n-layer", c.n_layer, 1, 4096));
  DS_TRY(check_range("--n-head", c.n_head, 1, 4096));
  DS_TRY(check_range("--n-head-kv", c.n_head_kv, 1, 4096));
  DS_TRY(check_range("--head-dim", c.head_dim, 1, 65536));
  DS_TRY(check_range("--n-rot", c.n_rot, 2, 65536));
  DS_TRY(check_range("--n-vocab", c.n_vocab, kTestModelMinVocab, int64_t{1} << 24));
  DS_TRY(check_range("--ssm-n-k-heads", c.ssm_n_k_heads, 1, 4096));
  DS_TRY(check_range("--ssm-n-v-heads", c.ssm_n_v_heads, 1, 4096));
  DS_TRY(check_range("--ssm-head-dim", c.ssm_head_dim, 1, 65536));
  DS_TRY(check_range("--ssm-conv-kernel", c.ssm_conv_kernel, 1, 64));
  DS_TRY(check_range("--full-attention-interval", c.full_attention_interval, 1, 4096));
  DS_TRY(check_range("--ctx", c.n_ctx, 1, int64_t{0xffffffff}));
  if (c.n_head % c.n_head_kv != 0) {
    return invalid_argument("--n-head {} is not a multiple of --n-head-kv {}", c.n_head, c.n_head_kv);
  }
  if (c.n_rot % 2 != 0) return invalid_argument("--n-rot {} must be even (rotated dims come in pairs)", c.n_rot);
  if (c.head_dim < c.n_rot) {
    return invalid_argument("--head-dim {} is smaller than the rope dimension count --n-rot {}", c.head_dim, c.n_rot);
  }
  if (c.ssm_n_v_heads % c.ssm_n_k_heads != 0) {
    return invalid_argument("--ssm-n-v-heads {} is not a multiple of --ssm-n-k-heads {}", c.ssm_n_v_heads,
                            c.ssm_n_k_heads);
  }
  if (c.is_moe()) {
    DS_TRY(check_range("--n-expert", c.n_expert, 1, 4096));
    DS_TRY(check_range("--n-ff-exp", c.n_ff_exp, 1, kMaxDim));
    DS_TRY(check_range("--n-ff-shexp", c.n_ff_shexp, 1, kMaxDim));
    if (c.n_expert_used < 1 || c.n_expert_used > c.n_expert) {
      return invalid_argument("--n-expert-used {} must be in [1, --n-expert {}]", c.n_expert_used, c.n_expert);
    }
  } else {
    DS_TRY(check_range("--n-ff", c.n_ff, 1, kMaxDim));
  }
  return Status::ok();
}

}  // namespace ds::testmodel
