// config.json parsing for the converter. Every required key that is missing or of the wrong type
// yields a Status naming the file and the key; nlohmann::json exceptions never leave this file.
// The one non-obvious choice: rope settings are looked up in three places (top level,
// `rope_parameters`, `rope_scaling`) because transformers moved them between versions.
#include "convert/hf_config.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace ds::convert {
namespace {

using nlohmann::json;

constexpr int64_t kMaxConfigInt = 0x7fffffff;
constexpr int64_t kMaxLayers = 4096;

struct Ctx {
  const json& j;
  const std::string& source;
};

Result<int64_t> get_int(const Ctx& c, const char* key) {
  auto it = c.j.find(key);
  if (it == c.j.end() || it->is_null()) return not_found("{}: missing key '{}'", c.source, key);
  if (!it->is_number_integer()) return invalid_argument("{}: key '{}' is {}, expected an integer", c.source, key, it->dump());
  // GGUF stores these as u32; the bound also keeps every product of two of them inside int64_t.
  const int64_t v = it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(kMaxConfigInt) ? kMaxConfigInt + 1
                                                                                                : it->get<int64_t>();
  if (v <= 0 || v > kMaxConfigInt) {
    return invalid_argument("{}: key '{}' is {}, expected an integer in [1, {}]", c.source, key, it->dump(),
                            kMaxConfigInt);
  }
  return v;
}

Result<int64_t> get_int_or(const Ctx& c, const char* key, int64_t fallback) {
  auto it = c.j.find(key);
  if (it == c.j.end() || it->is_null()) return fallback;
  return get_int(c, key);
}

Result<double> get_number_in(const json& obj, const char* key, const std::string& where, double fallback,
                             bool* found) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_number()) return invalid_argument("{}: key '{}' is {}, expected a number", where, key, it->dump());
  if (found != nullptr) *found = true;
  return it->get<double>();
}

// The rope sub-objects, in lookup order after the top level.
std::vector<const json*> rope_objects(const json& j) {
  std::vector<const json*> out;
  for (const char* k : {"rope_parameters", "rope_scaling"}) {
    auto it = j.find(k);
    if (it != j.end() && it->is_object()) out.push_back(&*it);
  }
  return out;
}

Result<double> get_rope_number(const Ctx& c, const char* key, double fallback) {
  bool found = false;
  DS_ASSIGN_OR_RETURN(double v, get_number_in(c.j, key, c.source, fallback, &found));
  if (found) return v;
  for (const json* o : rope_objects(c.j)) {
    DS_ASSIGN_OR_RETURN(v, get_number_in(*o, key, c.source, fallback, &found));
    if (found) return v;
  }
  return fallback;
}

Result<std::vector<int32_t>> get_rope_sections(const Ctx& c) {
  std::vector<const json*> where = {&c.j};
  for (const json* o : rope_objects(c.j)) where.push_back(o);
  for (const json* o : where) {
    auto it = o->find("mrope_section");
    if (it == o->end() || it->is_null()) continue;
    if (!it->is_array() || it->size() > 4) {
      return invalid_argument("{}: key 'mrope_section' is {}, expected an array of at most 4 integers", c.source,
                              it->dump());
    }
    std::vector<int32_t> s;
    for (const auto& e : *it) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() > 1 << 20) {
        return invalid_argument("{}: key 'mrope_section' entry {} is not a small non-negative integer", c.source,
                                e.dump());
      }
      s.push_back(static_cast<int32_t>(e.get<int64_t>()));
    }
    s.resize(4, 0);
    return s;
  }
  return std::vector<int32_t>{11, 11, 10, 0};
}

// First integer of a scalar-or-array token id, -1 when absent or unusable.
int64_t token_id_of(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) return -1;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_array() && !it->empty() && (*it)[0].is_number_integer()) return (*it)[0].get<int64_t>();
  return -1;
}

Status parse_architecture(const json& root, const std::string& source, HfConfig* cfg) {
  auto it = root.find("architectures");
  if (it == root.end() || !it->is_array() || it->empty() || !(*it)[0].is_string()) {
    return not_found("{}: missing key 'architectures' (a list naming the model class)", source);
  }
  cfg->hf_architecture = (*it)[0].get<std::string>();
  const std::string& a = cfg->hf_architecture;
  if (a == "Qwen3_5ForCausalLM" || a == "Qwen3_5ForConditionalGeneration") {
    cfg->gguf_architecture = "qwen35";
  } else if (a == "Qwen3_5MoeForCausalLM" || a == "Qwen3_5MoeForConditionalGeneration") {
    cfg->gguf_architecture = "qwen35moe";
    cfg->is_moe = true;
  } else {
    return unsupported(
        "{}: architecture '{}' is not supported (Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration, "
        "Qwen3_5MoeForCausalLM, Qwen3_5MoeForConditionalGeneration are)",
        source, a);
  }
  return Status::ok();
}

Status parse_layer_types(const Ctx& c, HfConfig* cfg) {
  DS_ASSIGN_OR_RETURN(cfg->full_attention_interval, get_int_or(c, "full_attention_interval", 4));
  auto it = c.j.find("layer_types");
  cfg->recurrent_layers.assign(static_cast<size_t>(cfg->n_layer), false);
  if (it == c.j.end() || it->is_null()) {
    for (int64_t i = 0; i < cfg->n_layer; ++i) {
      cfg->recurrent_layers[i] = (i + 1) % cfg->full_attention_interval != 0;
    }
    return Status::ok();
  }
  if (!it->is_array() || static_cast<int64_t>(it->size()) != cfg->n_layer) {
    return invalid_argument("{}: key 'layer_types' must be an array of num_hidden_layers = {} entries, got {}",
                            c.source, cfg->n_layer, it->is_array() ? std::to_string(it->size()) : it->dump());
  }
  cfg->has_layer_types = true;
  for (int64_t i = 0; i < cfg->n_layer; ++i) {
    const json& e = (*it)[i];
    const std::string t = e.is_string() ? e.get<std::string>() : e.dump();
    if (t == "linear_attention") {
      cfg->recurrent_layers[i] = true;
    } else if (t != "full_attention") {
      return invalid_argument("{}: key 'layer_types'[{}] is '{}', expected linear_attention or full_attention",
                              c.source, i, t);
    }
  }
  return Status::ok();
}

Status check_constraints(const HfConfig& cfg, const std::string& source) {
  if (cfg.ssm_n_v_heads % cfg.ssm_n_k_heads != 0) {
    return unsupported("{}: linear_num_value_heads {} is not a multiple of linear_num_key_heads {}", source,
                       cfg.ssm_n_v_heads, cfg.ssm_n_k_heads);
  }
  if (cfg.n_head % cfg.n_head_kv != 0) {
    return unsupported("{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", source, cfg.n_head,
                       cfg.n_head_kv);
  }
  const int64_t n_rot = cfg.n_rot();
  if (n_rot <= 0 || n_rot > cfg.head_dim || n_rot % 2 != 0) {
    return unsupported("{}: rotary dimension head_dim {} x partial_rotary_factor {} = {} is not an even value in "
                       "[2, head_dim]",
                       source, cfg.head_dim, cfg.partial_rotary_factor, n_rot);
  }
  if (cfg.is_moe && cfg.n_expert_used > cfg.n_expert) {
    return invalid_argument("{}: num_experts_per_tok {} exceeds num_experts {}", source, cfg.n_expert_used,
                            cfg.n_expert);
  }
  return Status::ok();
}

}  // namespace

Result<HfConfig> hf_config_parse(const std::string& json_text, const std::string& source) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {
    return corrupt("{}: not valid JSON: {}", source, e.what());
  }
  if (!root.is_object()) return corrupt("{}: top level is not a JSON object", source);
  HfConfig cfg;
  DS_TRY(parse_architecture(root, source, &cfg));

  json flat = root;
  auto tc = root.find("text_config");
  if (tc != root.end() && tc->is_object()) {
    for (auto it = tc->begin(); it != tc->end(); ++it) flat[it.key()] = it.value();
  }
  const Ctx c{flat, source};
  DS_ASSIGN_OR_RETURN(cfg.n_layer, get_int(c, "num_hidden_layers"));
  if (cfg.n_layer > kMaxLayers) {
    return invalid_argument("{}: key 'num_hidden_layers' is {}, more than {}", source, cfg.n_layer, kMaxLayers);
  }
  DS_ASSIGN_OR_RETURN(cfg.n_embd, get_int(c, "hidden_size"));
  DS_ASSIGN_OR_RETURN(cfg.n_vocab, get_int(c, "vocab_size"));
  DS_ASSIGN_OR_RETURN(cfg.n_ctx_train, get_int(c, "max_position_embeddings"));
  DS_ASSIGN_OR_RETURN(cfg.n_head, get_int(c, "num_attention_heads"));
  DS_ASSIGN_OR_RETURN(cfg.n_head_kv, get_int_or(c, "num_key_value_heads", cfg.n_head));
  DS_ASSIGN_OR_RETURN(cfg.head_dim, get_int_or(c, "head_dim", cfg.n_embd / cfg.n_head));
  DS_ASSIGN_OR_RETURN(cfg.n_ff, get_int_or(c, "intermediate_size", 0));
  if (!cfg.is_moe && cfg.n_ff == 0) DS_TRY(get_int(c, "intermediate_size").status());
  DS_ASSIGN_OR_RETURN(cfg.ssm_conv_kernel, get_int(c, "linear_conv_kernel_dim"));
  DS_ASSIGN_OR_RETURN(cfg.ssm_d_state, get_int(c, "linear_key_head_dim"));
  DS_ASSIGN_OR_RETURN(int64_t v_head_dim, get_int(c, "linear_value_head_dim"));
  if (v_head_dim != cfg.ssm_d_state) {
    return unsupported("{}: linear_value_head_dim {} differs from linear_key_head_dim {} (GGUF needs them equal)",
                       source, v_head_dim, cfg.ssm_d_state);
  }
  DS_ASSIGN_OR_RETURN(cfg.ssm_n_k_heads, get_int(c, "linear_num_key_heads"));
  DS_ASSIGN_OR_RETURN(cfg.ssm_n_v_heads, get_int(c, "linear_num_value_heads"));

  DS_ASSIGN_OR_RETURN(double eps, get_number_in(flat, "rms_norm_eps", source, -1.0, nullptr));
  if (eps <= 0) return not_found("{}: missing key 'rms_norm_eps' (a positive number)", source);
  cfg.rms_eps = static_cast<float>(eps);
  DS_ASSIGN_OR_RETURN(double theta, get_rope_number(c, "rope_theta", 10000.0));
  if (!(theta > 0 && theta < 1e30)) {
    return invalid_argument("{}: key 'rope_theta' is {}, expected a positive number", source, theta);
  }
  cfg.rope_theta = static_cast<float>(theta);
  DS_ASSIGN_OR_RETURN(double prf, get_rope_number(c, "partial_rotary_factor", 0.25));
  if (!(prf > 0 && prf <= 1)) {
    return invalid_argument("{}: key 'partial_rotary_factor' is {}, expected a number in (0, 1]", source, prf);
  }
  cfg.partial_rotary_factor = static_cast<float>(prf);
  DS_ASSIGN_OR_RETURN(cfg.rope_sections, get_rope_sections(c));
  DS_TRY(parse_layer_types(c, &cfg));

  auto tie = flat.find("tie_word_embeddings");
  cfg.tie_word_embeddings = tie != flat.end() && tie->is_boolean() && tie->get<bool>();
  cfg.bos_token_id = token_id_of(flat, "bos_token_id");
  cfg.eos_token_id = token_id_of(flat, "eos_token_id");

  if (cfg.is_moe) {
    DS_ASSIGN_OR_RETURN(cfg.n_expert, get_int(c, "num_experts"));
    DS_ASSIGN_OR_RETURN(cfg.n_expert_used, get_int(c, "num_experts_per_tok"));
    DS_ASSIGN_OR_RETURN(cfg.n_ff_exp, get_int(c, "moe_intermediate_size"));
    DS_ASSIGN_OR_RETURN(cfg.n_ff_shexp, get_int(c, "shared_expert_intermediate_size"));
  }
  DS_TRY(check_constraints(cfg, source));
  return cfg;
}

Result<HfConfig> hf_config_load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("{}: cannot open (a Hugging Face model directory needs config.json)", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return hf_config_parse(ss.str(), path);
}

}  // namespace ds::convert
