// ModelConfig: the hyper-parameters of a qwen35 / qwen35moe model, parsed from GGUF metadata
// (model spec section 2) and validated once, so the forward can trust every dimension.
// Non-obvious choice: dimensions are stored already derived (key_dim, value_dim, conv_dim, layer
// kinds), so no other module re-derives them from raw keys.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace ds {

class GgufFile;

enum class ModelArch : uint8_t { kQwen35 = 0, kQwen35Moe = 1 };
const char* model_arch_name(ModelArch arch);

enum class LayerKind : uint8_t { kAttention = 0, kDeltaNet = 1 };

struct ModelConfig {
  ModelArch arch = ModelArch::kQwen35;
  std::string name;            // general.name (may be empty)

  int64_t n_layer = 0;         // trunk layers (block_count - nextn_predict_layers)
  int64_t n_layer_all = 0;     // block_count, including MTP layers (never executed here)
  int64_t n_ctx_train = 0;
  int64_t n_embd = 0;
  int64_t n_vocab = 0;         // rows of token_embd (filled by the weight loader)
  float rms_eps = 1e-6f;       // also the L2-norm eps of the delta net

  // full attention
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;        // key_length == value_length
  int64_t n_rot = 0;           // rotated dims per head (partial NeoX RoPE)
  float rope_base = 10000.0f;
  std::vector<int32_t> rope_sections;  // [t, h, w, e]; no effect for text (spec 4)

  // gated delta net
  int64_t ssm_conv_kernel = 0; // K
  int64_t ssm_d_state = 0;     // dk == dv
  int64_t ssm_n_group = 0;     // nk
  int64_t ssm_n_v_head = 0;    // nv
  int64_t ssm_inner = 0;       // value_dim = dv * nv
  int64_t key_dim() const { return ssm_d_state * ssm_n_group; }
  int64_t value_dim() const { return ssm_inner; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }

  // FFN
  int64_t n_ff = 0;            // dense FFN width (qwen35)
  int64_t n_expert = 0;        // qwen35moe
  int64_t n_expert_used = 0;
  int64_t n_ff_exp = 0;
  int64_t n_ff_shexp = 0;

  std::vector<LayerKind> layer_kinds;  // [n_layer]
  bool is_moe() const { return arch == ModelArch::kQwen35Moe; }
  int64_t n_attention_layers() const;

  // Checks every invariant the forward relies on; the message names the offending key.
  Status validate() const;
};

// Reads and validates the config from GGUF metadata. Errors name the key, expected and actual.
Result<ModelConfig> model_config_from_gguf(const GgufFile& file);

}  // namespace ds
