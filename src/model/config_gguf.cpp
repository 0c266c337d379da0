// Reads ModelConfig from GGUF metadata (model spec section 2): exact key types as the ecosystem's
// loader demands, defaults where the spec gives them, and the layer-type derivation.
// Non-obvious choice: per-layer array values (head_count, feed_forward_length, ...) are accepted
// only when every layer has the same value; varying widths are rejected as unsupported.
#include <string>

#include "core/log.h"
#include "gguf/gguf.h"
#include "model/config.h"

namespace ds {
namespace {

struct Reader {
  const GgufFile& f;
  std::string a;  // arch prefix

  std::string key(const char* k) const { return a + "." + k; }

  Result<int64_t> req_u32(const char* k) const {
    auto r = f.get_u32(key(k));
    if (!r.is_ok()) return r.status().with_context(f.name());
    return static_cast<int64_t>(*r);
  }
  Result<int64_t> opt_u32(const char* k, int64_t def) const {
    if (!f.has(key(k))) return def;
    return req_u32(k);
  }
  // A u32, or an array of integers that must be uniform.
  Result<int64_t> req_u32_or_arr(const char* k) const {
    const GgufKv* kv = f.find(key(k));
    if (kv == nullptr) return not_found("{}: required key '{}' is missing", f.name(), key(k));
    if (kv->value.type != GgufType::ARRAY) return req_u32(k);
    auto arr = f.get_int_array(key(k));
    if (!arr.is_ok()) return arr.status().with_context(f.name());
    if (arr->empty()) return invalid_argument("{}: key '{}' is an empty array", f.name(), key(k));
    for (int64_t v : *arr) {
      if (v != arr->front()) {
        return unsupported("{}: key '{}' varies per layer ({} vs {}); per-layer widths are not supported", f.name(),
                           key(k), arr->front(), v);
      }
    }
    return arr->front();
  }
  Result<int64_t> opt_u32_or_arr(const char* k, int64_t def) const {
    if (!f.has(key(k))) return def;
    return req_u32_or_arr(k);
  }
  Result<float> opt_f32(const char* k, float def, bool required) const {
    if (!f.has(key(k))) {
      if (required) return not_found("{}: required key '{}' is missing", f.name(), key(k));
      return def;
    }
    auto r = f.get_f32(key(k));
    if (!r.is_ok()) return r.status().with_context(f.name());
    return *r;
  }
};

}  // namespace

Result<ModelConfig> model_config_from_gguf(const GgufFile& file) {
  auto arch_r = file.get_string("general.architecture");
  if (!arch_r.is_ok()) return arch_r.status().with_context(file.name());
  ModelConfig c;
  if (*arch_r == "qwen35") {
    c.arch = ModelArch::kQwen35;
  } else if (*arch_r == "qwen35moe") {
    c.arch = ModelArch::kQwen35Moe;
  } else {
    return unsupported("{}: general.architecture '{}' is not supported (expected qwen35 or qwen35moe)", file.name(),
                       *arch_r);
  }
  if (file.has("general.name")) {
    auto n = file.get_string("general.name");
    if (n.is_ok()) c.name = *n;
  }
  Reader r{file, *arch_r};
  DS_ASSIGN_OR_RETURN(c.n_layer_all, r.req_u32("block_count"));
  DS_ASSIGN_OR_RETURN(int64_t n_nextn, r.opt_u32("nextn_predict_layers", 0));
  if (n_nextn >= c.n_layer_all) {
    return invalid_argument("{}: {}.nextn_predict_layers {} leaves no trunk layers of block_count {}", file.name(),
                            r.a, n_nextn, c.n_layer_all);
  }
  c.n_layer = c.n_layer_all - n_nextn;
  DS_ASSIGN_OR_RETURN(c.n_ctx_train, r.req_u32("context_length"));
  DS_ASSIGN_OR_RETURN(c.n_embd, r.req_u32("embedding_length"));
  DS_ASSIGN_OR_RETURN(c.n_head, r.req_u32_or_arr("attention.head_count"));
  DS_ASSIGN_OR_RETURN(c.n_head_kv, r.opt_u32_or_arr("attention.head_count_kv", c.n_head));
  DS_ASSIGN_OR_RETURN(c.head_dim, r.opt_u32("attention.key_length", c.n_head > 0 ? c.n_embd / c.n_head : 0));
  DS_ASSIGN_OR_RETURN(int64_t value_length, r.opt_u32("attention.value_length", c.head_dim));
  if (value_length != c.head_dim) {
    return invalid_argument("{}: {} {} != {} {}", file.name(), r.key("attention.value_length"), value_length,
                            r.key("attention.key_length"), c.head_dim);
  }
  DS_ASSIGN_OR_RETURN(c.rms_eps, r.opt_f32("attention.layer_norm_rms_epsilon", 0.0f, true));
  DS_ASSIGN_OR_RETURN(c.rope_base, r.opt_f32("rope.freq_base", 10000.0f, false));
  DS_ASSIGN_OR_RETURN(c.n_rot, r.opt_u32("rope.dimension_count", c.head_dim));
  {
    const std::string k = r.key("rope.dimension_sections");
    const GgufKv* kv = file.find(k);
    if (kv == nullptr) return not_found("{}: required key '{}' is missing", file.name(), k);
    if (kv->value.type == GgufType::ARRAY) {
      auto arr = file.get_int_array(k);
      if (!arr.is_ok()) return arr.status().with_context(file.name());
      for (int64_t v : *arr) c.rope_sections.push_back(static_cast<int32_t>(v));
    } else {
      auto v = file.get_int(k);
      if (!v.is_ok()) return v.status().with_context(file.name());
      c.rope_sections.assign(4, static_cast<int32_t>(*v));
    }
  }
  DS_ASSIGN_OR_RETURN(c.ssm_conv_kernel, r.req_u32("ssm.conv_kernel"));
  DS_ASSIGN_OR_RETURN(c.ssm_d_state, r.req_u32("ssm.state_size"));
  DS_ASSIGN_OR_RETURN(c.ssm_n_group, r.req_u32("ssm.group_count"));
  DS_ASSIGN_OR_RETURN(c.ssm_n_v_head, r.req_u32("ssm.time_step_rank"));
  DS_ASSIGN_OR_RETURN(c.ssm_inner, r.req_u32("ssm.inner_size"));

  // Layer kinds: the explicit array, else every interval-th layer is full attention.
  if (file.has(r.key("attention.recurrent_layers"))) {
    auto arr = file.get_int_array(r.key("attention.recurrent_layers"));
    if (!arr.is_ok()) return arr.status().with_context(file.name());
    if (static_cast<int64_t>(arr->size()) != c.n_layer_all) {
      return invalid_argument("{}: {} has {} entries, expected block_count {}", file.name(),
                              r.key("attention.recurrent_layers"), arr->size(), c.n_layer_all);
    }
    for (int64_t i = 0; i < c.n_layer; ++i) {
      c.layer_kinds.push_back((*arr)[static_cast<size_t>(i)] ? LayerKind::kDeltaNet : LayerKind::kAttention);
    }
  } else {
    DS_ASSIGN_OR_RETURN(int64_t interval, r.opt_u32("full_attention_interval", 4));
    if (interval <= 0) {
      return invalid_argument("{}: {} must be positive", file.name(), r.key("full_attention_interval"));
    }
    for (int64_t i = 0; i < c.n_layer; ++i) {
      c.layer_kinds.push_back((i + 1) % interval != 0 ? LayerKind::kDeltaNet : LayerKind::kAttention);
    }
  }

  if (c.is_moe()) {
    DS_ASSIGN_OR_RETURN(c.n_ff, r.opt_u32_or_arr("feed_forward_length", 0));
    DS_ASSIGN_OR_RETURN(c.n_expert, r.req_u32("expert_count"));
    DS_ASSIGN_OR_RETURN(c.n_expert_used, r.req_u32_or_arr("expert_used_count"));
    const int64_t fallback = c.n_expert_used > 0 ? c.n_ff / c.n_expert_used : 0;
    DS_ASSIGN_OR_RETURN(c.n_ff_exp, r.opt_u32_or_arr("expert_feed_forward_length", fallback));
    DS_ASSIGN_OR_RETURN(c.n_ff_shexp, r.opt_u32("expert_shared_feed_forward_length", c.n_ff));
  } else {
    DS_ASSIGN_OR_RETURN(c.n_ff, r.req_u32_or_arr("feed_forward_length"));
  }
  Status s = c.validate();
  if (!s.is_ok()) return s.with_context(file.name());
  int64_t sec_sum = 0;
  for (int32_t v : c.rope_sections) sec_sum += v;
  if (sec_sum != c.n_rot / 2) {
    DS_LOG_WARN("{}: rope.dimension_sections sum {} != n_rot/2 = {} (no effect on text)", file.name(), sec_sum,
                c.n_rot / 2);
  }
  return c;
}

}  // namespace ds
