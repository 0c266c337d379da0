// The expected tensor table of a config (model spec section 3) and the checks against it.
#include <algorithm>

#include "model/weight_specs.h"
#include "ops/op_registry.h"

namespace ds {

std::vector<WeightSpec> weight_specs(const ModelConfig& c, ModelWeights* w) {
  std::vector<WeightSpec> s;
  const int64_t E = c.n_embd, V = c.n_vocab;
  s.push_back({"token_embd.weight", &w->token_embd, {E, V, 1, 1}, false, false});
  s.push_back({"output_norm.weight", &w->output_norm, {E, 1, 1, 1}, true, false});
  s.push_back({"output.weight", &w->output, {E, V, 1, 1}, false, true});
  w->layers.resize(static_cast<size_t>(c.n_layer));
  for (int64_t il = 0; il < c.n_layer; ++il) {
    LayerWeights& L = w->layers[static_cast<size_t>(il)];
    L.kind = c.layer_kinds[static_cast<size_t>(il)];
    const std::string p = "blk." + std::to_string(il) + ".";
    auto add = [&](const char* n, TensorView* v, int64_t ne0, int64_t ne1, int64_t ne2, bool f32, bool opt = false) {
      s.push_back({p + n, v, {ne0, ne1, ne2, 1}, f32, opt});
    };
    add("attn_norm.weight", &L.attn_norm, E, 1, 1, true);
    add("post_attention_norm.weight", &L.post_attention_norm, E, 1, 1, true);
    if (L.kind == LayerKind::kAttention) {
      const int64_t HD = c.n_head * c.head_dim, KD = c.n_head_kv * c.head_dim;
      add("attn_q.weight", &L.attn.wq, E, 2 * HD, 1, false);
      add("attn_k.weight", &L.attn.wk, E, KD, 1, false);
      add("attn_v.weight", &L.attn.wv, E, KD, 1, false);
      add("attn_output.weight", &L.attn.wo, HD, E, 1, false);
      add("attn_q_norm.weight", &L.attn.q_norm, c.head_dim, 1, 1, true);
      add("attn_k_norm.weight", &L.attn.k_norm, c.head_dim, 1, 1, true);
    } else {
      const int64_t nv = c.ssm_n_v_head;
      add("attn_qkv.weight", &L.deltanet.wqkv, E, c.conv_dim(), 1, false);
      add("attn_gate.weight", &L.deltanet.wgate, E, c.value_dim(), 1, false);
      add("ssm_conv1d.weight", &L.deltanet.conv1d, c.ssm_conv_kernel, c.conv_dim(), 1, true);
      add("ssm_dt.bias", &L.deltanet.dt_bias, nv, 1, 1, true);
      add("ssm_a", &L.deltanet.ssm_a, nv, 1, 1, true);
      add("ssm_beta.weight", &L.deltanet.wbeta, E, nv, 1, false);
      add("ssm_alpha.weight", &L.deltanet.walpha, E, nv, 1, false);
      add("ssm_norm.weight", &L.deltanet.norm, c.ssm_d_state, 1, 1, true);
      add("ssm_out.weight", &L.deltanet.wout, c.value_dim(), E, 1, false);
    }
    if (c.is_moe()) {
      const int64_t F = c.n_ff_exp, X = c.n_expert, S = c.n_ff_shexp;
      add("ffn_gate_inp.weight", &L.moe.router, E, X, 1, true);
      add("ffn_gate_exps.weight", &L.moe.gate_exps, E, F, X, false, true);
      add("ffn_up_exps.weight", &L.moe.up_exps, E, F, X, false, true);
      add("ffn_gate_up_exps.weight", &L.moe.gate_up_exps, E, 2 * F, X, false, true);
      add("ffn_down_exps.weight", &L.moe.down_exps, F, E, X, false);
      add("ffn_gate_inp_shexp.weight", &L.moe.shexp_gate, E, 1, 1, true);
      add("ffn_gate_shexp.weight", &L.moe.gate_shexp, E, S, 1, false);
      add("ffn_up_shexp.weight", &L.moe.up_shexp, E, S, 1, false);
      add("ffn_down_shexp.weight", &L.moe.down_shexp, S, E, 1, false);
    } else {
      add("ffn_gate.weight", &L.ffn.gate, E, c.n_ff, 1, false);
      add("ffn_up.weight", &L.ffn.up, E, c.n_ff, 1, false);
      add("ffn_down.weight", &L.ffn.down, c.n_ff, E, 1, false);
    }
  }
  return s;
}

Status weight_check(const WeightSpec& spec, const TensorView& t) {
  if (t.ne[0] != spec.ne[0] || t.ne[1] != spec.ne[1] || t.ne[2] != spec.ne[2] || t.ne[3] != spec.ne[3]) {
    return invalid_argument("tensor '{}': shape {}, expected [{}, {}, {}]", spec.name, t.shape_string(), spec.ne[0],
                            spec.ne[1], spec.ne[2]);
  }
  if (spec.f32_only && t.dtype != DType::F32) {
    return unsupported("tensor '{}': type {}, expected f32", spec.name, dtype_name(t.dtype));
  }
  const auto& ok = matmul_weight_dtypes();
  if (std::find(ok.begin(), ok.end(), t.dtype) == ok.end()) {
    return unsupported("tensor '{}': type {} is not supported (supported: f32 f16 bf16 q8_0 q4_0 q5_0 q4_K q5_K q6_K)",
                       spec.name, dtype_name(t.dtype));
  }
  if (t.data == nullptr) return invalid_argument("tensor '{}': no data", spec.name);
  return Status::ok();
}

Status weights_finish(const ModelConfig& c, ModelWeights* w) {
  if (w->output.data == nullptr) {
    w->output = w->token_embd;
    w->tied_output = true;
  }
  if (!c.is_moe()) return Status::ok();
  for (int64_t il = 0; il < c.n_layer; ++il) {
    const MoeFfnWeights& m = w->layers[static_cast<size_t>(il)].moe;
    const bool split = m.gate_exps.data != nullptr && m.up_exps.data != nullptr;
    const bool fused = m.gate_up_exps.data != nullptr;
    if (split == fused) {
      return not_found("blk.{}: expected either ffn_gate_exps.weight + ffn_up_exps.weight or ffn_gate_up_exps.weight",
                       il);
    }
  }
  return Status::ok();
}

Status model_weights_validate(const ModelWeights& weights, const ModelConfig& config) {
  DS_TRY(config.validate());
  if (static_cast<int64_t>(weights.layers.size()) != config.n_layer) {
    return invalid_argument("weights have {} layers, the config {}", weights.layers.size(), config.n_layer);
  }
  ModelWeights probe = weights;  // weight_specs binds slots; walk a copy and compare views
  for (const WeightSpec& spec : weight_specs(config, &probe)) {
    if (spec.slot->data == nullptr && spec.optional) continue;
    DS_TRY(weight_check(spec, *spec.slot));
  }
  for (int64_t il = 0; il < config.n_layer; ++il) {
    if (weights.layers[static_cast<size_t>(il)].kind != config.layer_kinds[static_cast<size_t>(il)]) {
      return invalid_argument("blk.{}: layer kind differs from the config", il);
    }
  }
  return weights_finish(config, &probe);
}

}  // namespace ds
