// Builds tiny qwen35 / qwen35moe models with deterministic random F32 weights in memory, for the
// model and state tests. 6 layers with full attention at layers 2 and 5, nv > nk; head_dim 16 unless
// asked (a q8_0 or q4_0 KV cache needs a multiple of 32).
#pragma once

#include <random>
#include <vector>

#include "model/model.h"

namespace ds::test {

inline ModelConfig tiny_config(bool moe, int64_t head_dim = 16) {
  ModelConfig c;
  c.arch = moe ? ModelArch::kQwen35Moe : ModelArch::kQwen35;
  c.n_layer = c.n_layer_all = 6;
  c.n_ctx_train = 512;
  c.n_embd = 64;
  c.n_vocab = 100;
  c.rms_eps = 1e-6f;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.head_dim = head_dim;
  c.n_rot = 8;
  c.rope_base = 10000.0f;
  c.rope_sections = {2, 1, 1, 0};
  c.ssm_conv_kernel = 4;
  c.ssm_d_state = 8;
  c.ssm_n_group = 2;
  c.ssm_n_v_head = 4;
  c.ssm_inner = 32;
  c.n_ff = 96;
  if (moe) {
    c.n_expert = 6;
    c.n_expert_used = 2;
    c.n_ff_exp = 32;
    c.n_ff_shexp = 64;
  }
  for (int64_t i = 0; i < c.n_layer; ++i) {
    c.layer_kinds.push_back((i + 1) % 3 == 0 ? LayerKind::kAttention : LayerKind::kDeltaNet);
  }
  return c;
}

struct TinyModel {
  ModelConfig config;
  ModelWeights weights;
  std::vector<DeviceBuffer> storage;
};

inline TinyModel tiny_model(bool moe, uint32_t seed = 7, int64_t head_dim = 16) {
  TinyModel m;
  m.config = tiny_config(moe, head_dim);
  const ModelConfig& c = m.config;
  std::mt19937 rng(seed);
  auto tensor = [&](std::initializer_list<int64_t> ne, float lo, float hi) {
    int64_t n = 1;
    for (int64_t x : ne) n *= x;
    DeviceBuffer b = std::move(DeviceBuffer::alloc(Device{}, n * 4)).value();
    std::uniform_real_distribution<float> d(lo, hi);
    for (int64_t i = 0; i < n; ++i) static_cast<float*>(b.data())[i] = d(rng);
    TensorView t = b.view(DType::F32, ne);
    m.storage.push_back(std::move(b));
    return t;
  };
  auto matrix = [&](int64_t n_in, int64_t n_out) {
    const float s = 1.0f / std::sqrt(static_cast<float>(n_in));
    return tensor({n_in, n_out}, -s, s);
  };
  auto norm = [&](int64_t n) { return tensor({n}, 0.8f, 1.2f); };
  const int64_t E = c.n_embd;
  m.weights.token_embd = tensor({E, c.n_vocab}, -1.0f, 1.0f);
  m.weights.output_norm = norm(E);
  m.weights.output = matrix(E, c.n_vocab);
  for (int64_t il = 0; il < c.n_layer; ++il) {
    LayerWeights L;
    L.kind = c.layer_kinds[static_cast<size_t>(il)];
    L.attn_norm = norm(E);
    L.post_attention_norm = norm(E);
    if (L.kind == LayerKind::kAttention) {
      L.attn.wq = matrix(E, 2 * c.n_head * c.head_dim);
      L.attn.wk = matrix(E, c.n_head_kv * c.head_dim);
      L.attn.wv = matrix(E, c.n_head_kv * c.head_dim);
      L.attn.wo = matrix(c.n_head * c.head_dim, E);
      L.attn.q_norm = norm(c.head_dim);
      L.attn.k_norm = norm(c.head_dim);
    } else {
      const int64_t nv = c.ssm_n_v_head;
      L.deltanet.wqkv = matrix(E, c.conv_dim());
      L.deltanet.wgate = matrix(E, c.value_dim());
      L.deltanet.conv1d = tensor({c.ssm_conv_kernel, c.conv_dim()}, -0.5f, 0.5f);
      L.deltanet.dt_bias = tensor({nv}, -1.0f, 1.0f);
      L.deltanet.ssm_a = tensor({nv}, -2.0f, -0.2f);
      L.deltanet.wbeta = matrix(E, nv);
      L.deltanet.walpha = matrix(E, nv);
      L.deltanet.norm = norm(c.ssm_d_state);
      L.deltanet.wout = matrix(c.value_dim(), E);
    }
    if (c.is_moe()) {
      const float se = 1.0f / std::sqrt(static_cast<float>(E)), sf = 1.0f / std::sqrt(static_cast<float>(c.n_ff_exp));
      L.moe.router = matrix(E, c.n_expert);
      L.moe.gate_exps = tensor({E, c.n_ff_exp, c.n_expert}, -se, se);
      L.moe.up_exps = tensor({E, c.n_ff_exp, c.n_expert}, -se, se);
      L.moe.down_exps = tensor({c.n_ff_exp, E, c.n_expert}, -sf, sf);
      L.moe.shexp_gate = tensor({E}, -se, se);
      L.moe.gate_shexp = matrix(E, c.n_ff_shexp);
      L.moe.up_shexp = matrix(E, c.n_ff_shexp);
      L.moe.down_shexp = matrix(c.n_ff_shexp, E);
    } else {
      L.ffn.gate = matrix(E, c.n_ff);
      L.ffn.up = matrix(E, c.n_ff);
      L.ffn.down = matrix(c.n_ff, E);
    }
    m.weights.layers.push_back(L);
  }
  return m;
}

inline std::unique_ptr<Model> load_tiny(bool moe, const ModelOptions& opt, uint32_t seed = 7, int64_t head_dim = 16) {
  TinyModel t = tiny_model(moe, seed, head_dim);
  auto r = Model::from_weights(t.config, t.weights, std::move(t.storage), opt);
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? std::move(r).value() : nullptr;
}

inline std::vector<int32_t> tokens(int64_t n, uint32_t seed = 3) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % 100);
  return t;
}

}  // namespace ds::test
