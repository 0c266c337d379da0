// Hugging Face config.json of a Qwen3.5 / Qwen3.6 checkpoint, reduced to the hyperparameters the GGUF
// needs. A nested `text_config` (the multimodal ...ForConditionalGeneration form) is flattened onto
// the top level first, its keys winning, exactly as the reference converter does.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace ds::convert {

struct HfConfig {
  std::string hf_architecture;   // "Qwen3_5ForCausalLM", ...
  std::string gguf_architecture; // "qwen35" or "qwen35moe"
  bool is_moe = false;

  int64_t n_layer = 0;        // num_hidden_layers (trunk only; MTP layers are not converted)
  int64_t n_embd = 0;         // hidden_size
  int64_t n_vocab = 0;        // vocab_size
  int64_t n_ctx_train = 0;    // max_position_embeddings
  int64_t n_ff = 0;           // intermediate_size (0 when absent, allowed for MoE)
  int64_t n_head = 0;         // num_attention_heads
  int64_t n_head_kv = 0;      // num_key_value_heads (default n_head)
  int64_t head_dim = 0;       // head_dim (default n_embd / n_head)
  float rms_eps = 1e-6f;      // rms_norm_eps
  float rope_theta = 10000.f; // rope_theta, top level or under rope_parameters / rope_scaling
  float partial_rotary_factor = 0.25f;
  std::vector<int32_t> rope_sections;  // mrope_section padded to 4 entries

  int64_t ssm_conv_kernel = 0;  // linear_conv_kernel_dim
  int64_t ssm_d_state = 0;      // linear_key_head_dim (= head_k_dim = head_v_dim)
  int64_t ssm_n_k_heads = 0;    // linear_num_key_heads (nk)
  int64_t ssm_n_v_heads = 0;    // linear_num_value_heads (nv)
  int64_t full_attention_interval = 4;
  bool has_layer_types = false;
  std::vector<bool> recurrent_layers;  // [n_layer], true = gated delta net layer (always filled)

  bool tie_word_embeddings = false;
  int64_t bos_token_id = -1;  // from config.json, -1 when absent
  int64_t eos_token_id = -1;

  // MoE (is_moe only)
  int64_t n_expert = 0;        // num_experts
  int64_t n_expert_used = 0;   // num_experts_per_tok
  int64_t n_ff_exp = 0;        // moe_intermediate_size
  int64_t n_ff_shexp = 0;      // shared_expert_intermediate_size

  int64_t ssm_key_dim() const { return ssm_d_state * ssm_n_k_heads; }
  int64_t ssm_value_dim() const { return ssm_d_state * ssm_n_v_heads; }
  int64_t ssm_conv_dim() const { return 2 * ssm_key_dim() + ssm_value_dim(); }
  int64_t n_rot() const { return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor); }
};

// Parses config.json text; `source` names the file in errors.
Result<HfConfig> hf_config_parse(const std::string& json_text, const std::string& source);
Result<HfConfig> hf_config_load(const std::string& path);

}  // namespace ds::convert
