// Shapes and options of a generated test model: the presets (tiny, small, and the real Qwen3.6
// shapes), per-dimension overrides, and validation. Validation runs after overrides are applied, so
// a bad combination (nv % nk != 0, rope dims > head_dim, ...) is refused with a message naming the
// flag, before any byte is written.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace ds::testmodel {

enum class TestArch { kQwen35, kQwen35Moe };
const char* test_arch_name(TestArch arch);  // "qwen35" / "qwen35moe"
bool test_arch_from_name(const std::string& name, TestArch* out);

// The --type choices. Plain types apply to every matrix; kQ4KM applies the Q4_K_M mix (q4_k_m.h).
enum class OutType { kF32, kF16, kBF16, kQ8_0, kQ4_0, kQ4_K_M };
const char* out_type_name(OutType t);  // "f32", ..., "q4_k_m"
bool out_type_from_name(const std::string& name, OutType* out);
uint32_t out_type_file_type(OutType t);  // general.file_type (llama_ftype): 0, 1, 32, 7, 2, 15
// The dtype of a matrix under a plain type (kQ4KM has no single dtype: DS_CHECKed).
DType out_type_plain_dtype(OutType t);

struct TestModelConfig {
  std::string preset;  // the preset it started from, for general.name
  TestArch arch = TestArch::kQwen35;
  int64_t n_embd = 0;
  int64_t n_layer = 0;  // trunk layers = block_count (no MTP layers)
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;  // key_length = value_length
  int64_t n_rot = 0;     // rope.dimension_count (rotated dims per head)
  int64_t n_ff = 0;      // dense FFN width (qwen35)
  int64_t n_vocab = 0;
  int64_t ssm_n_k_heads = 0;  // ssm.group_count
  int64_t ssm_n_v_heads = 0;  // ssm.time_step_rank
  int64_t ssm_head_dim = 0;   // ssm.state_size = head_k_dim = head_v_dim
  int64_t ssm_conv_kernel = 4;
  int64_t n_expert = 0;       // qwen35moe only
  int64_t n_expert_used = 0;
  int64_t n_ff_exp = 0;
  int64_t n_ff_shexp = 0;
  int64_t full_attention_interval = 4;
  int64_t n_ctx = 0;  // context_length
  float rope_freq_base = 1e7f;
  float rms_eps = 1e-6f;
  bool tied_output = false;  // true: no output.weight, token_embd is reused
  OutType type = OutType::kF32;  // preset default: f32 for tiny/small, q4_k_m for the real shapes
  uint64_t seed = 0;

  bool is_moe() const { return arch == TestArch::kQwen35Moe; }
  // Layer il is a gated delta net (recurrent) layer iff (il + 1) % full_attention_interval != 0.
  bool is_recurrent(int64_t il) const { return (il + 1) % full_attention_interval != 0; }
  int64_t ssm_key_dim() const { return ssm_head_dim * ssm_n_k_heads; }
  int64_t ssm_value_dim() const { return ssm_head_dim * ssm_n_v_heads; }  // ssm.inner_size
  int64_t ssm_conv_dim() const { return 2 * ssm_key_dim() + ssm_value_dim(); }
  // rope.dimension_sections [t, h, w, e]: n_rot/2 split like Qwen's [11, 11, 10, 0] for n_rot 64.
  std::vector<int32_t> rope_sections() const;
};

// Names accepted by test_model_preset, for help text.
const std::vector<std::string>& test_model_preset_names();
// A preset's shapes; kNotFound naming the preset and the valid names if unknown.
Result<TestModelConfig> test_model_preset(const std::string& name);

// Optional per-dimension overrides, applied over a preset (unset fields keep the preset's value).
struct TestModelOverrides {
  std::optional<TestArch> arch;
  std::optional<OutType> type;
  std::optional<uint64_t> seed;
  std::optional<int64_t> n_embd, n_layer, n_head, n_head_kv, head_dim, n_rot, n_ff, n_vocab;
  std::optional<int64_t> ssm_n_k_heads, ssm_n_v_heads, ssm_head_dim, ssm_conv_kernel;
  std::optional<int64_t> n_expert, n_expert_used, n_ff_exp, n_ff_shexp;
  std::optional<int64_t> full_attention_interval, n_ctx;
  std::optional<bool> tied_output;
};

// Applies overrides and validates the result. `--arch` is only accepted on tiny/small (the real
// shapes fix their architecture).
Result<TestModelConfig> test_model_config_make(const std::string& preset, const TestModelOverrides& overrides);

// Checks every constraint of the spec (section 10) plus limits that keep the file sane; the message
// names the flag and both values, e.g. "--ssm-n-v-heads 6 is not a multiple of --ssm-n-k-heads 4".
Status test_model_config_validate(const TestModelConfig& config);

// Fixed special-token count and the smallest vocabulary that holds the 256 byte tokens and them.
constexpr int64_t kTestModelSpecialTokens = 9;
constexpr int64_t kTestModelMinVocab = 256 + kTestModelSpecialTokens;

}  // namespace ds::testmodel
