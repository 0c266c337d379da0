// ModelConfig invariants. Each message names the GGUF key a bad value comes from.
#include "model/config.h"

namespace ds {

const char* model_arch_name(ModelArch arch) { return arch == ModelArch::kQwen35Moe ? "qwen35moe" : "qwen35"; }

int64_t ModelConfig::n_attention_layers() const {
  int64_t n = 0;
  for (LayerKind k : layer_kinds) n += k == LayerKind::kAttention ? 1 : 0;
  return n;
}

Status ModelConfig::validate() const {
  const char* a = model_arch_name(arch);
  auto positive = [&](int64_t v, const char* key) -> Status {
    if (v <= 0) return invalid_argument("{}.{} = {}: must be positive", a, key, v);
    return Status::ok();
  };
  DS_TRY(positive(n_layer, "block_count (minus nextn_predict_layers)"));
  DS_TRY(positive(n_embd, "embedding_length"));
  DS_TRY(positive(n_head, "attention.head_count"));
  DS_TRY(positive(n_head_kv, "attention.head_count_kv"));
  DS_TRY(positive(head_dim, "attention.key_length"));
  DS_TRY(positive(ssm_conv_kernel, "ssm.conv_kernel"));
  DS_TRY(positive(ssm_d_state, "ssm.state_size"));
  DS_TRY(positive(ssm_n_group, "ssm.group_count"));
  DS_TRY(positive(ssm_n_v_head, "ssm.time_step_rank"));
  if (n_head % n_head_kv != 0) {
    return invalid_argument("{}.attention.head_count {} is not a multiple of head_count_kv {}", a, n_head, n_head_kv);
  }
  if (n_rot <= 0 || n_rot % 2 != 0 || n_rot > head_dim) {
    return invalid_argument("{}.rope.dimension_count {} must be even and in (0, key_length {}]", a, n_rot, head_dim);
  }
  if (rope_sections.size() != 4) {
    return invalid_argument("{}.rope.dimension_sections has {} entries, expected 4", a, rope_sections.size());
  }
  for (int32_t s : rope_sections) {
    if (s < 0) return invalid_argument("{}.rope.dimension_sections has a negative entry {}", a, s);
  }
  if (!(rope_base > 0.0f)) return invalid_argument("{}.rope.freq_base {} must be positive", a, rope_base);
  if (!(rms_eps >= 0.0f) || rms_eps > 1e-1f) {
    return invalid_argument("{}.attention.layer_norm_rms_epsilon {} is out of range", a, rms_eps);
  }
  if (ssm_inner != ssm_d_state * ssm_n_v_head) {
    return invalid_argument("{}.ssm.inner_size {} != ssm.state_size {} * ssm.time_step_rank {}", a, ssm_inner,
                            ssm_d_state, ssm_n_v_head);
  }
  if (ssm_n_v_head % ssm_n_group != 0) {
    return invalid_argument("{}.ssm.time_step_rank {} is not a multiple of ssm.group_count {}", a, ssm_n_v_head,
                            ssm_n_group);
  }
  if (static_cast<int64_t>(layer_kinds.size()) != n_layer) {
    return invalid_argument("{}: {} layer kinds for {} layers", a, layer_kinds.size(), n_layer);
  }
  if (is_moe()) {
    DS_TRY(positive(n_expert, "expert_count"));
    DS_TRY(positive(n_expert_used, "expert_used_count"));
    DS_TRY(positive(n_ff_exp, "expert_feed_forward_length"));
    DS_TRY(positive(n_ff_shexp, "expert_shared_feed_forward_length"));
    if (n_expert_used > n_expert) {
      return invalid_argument("{}.expert_used_count {} > expert_count {}", a, n_expert_used, n_expert);
    }
  } else {
    DS_TRY(positive(n_ff, "feed_forward_length"));
  }
  return Status::ok();
}

}  // namespace ds
