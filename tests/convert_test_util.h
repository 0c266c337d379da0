// Builds tiny Hugging Face Qwen3.5 checkpoints (config.json + safetensors) for the converter tests.
// Every tensor's values are a deterministic pattern of exact binary fractions, kept alongside in
// PyTorch order, so a test can compute the expected GGUF value of every element independently.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/half.h"
#include "safetensors/safetensors.h"

namespace ds::convert_test {

struct TinySpec {
  bool moe = false;
  bool fused_experts = false;    // experts.gate_up_proj / experts.down_proj instead of experts.{i}.*
  bool tied = false;             // no lm_head, tie_word_embeddings true
  bool nested = false;           // ...ForConditionalGeneration: text_config + model.language_model. prefix
  DType dtype = DType::F32;      // storage dtype of the safetensors
  int64_t n_layer = 4, n_embd = 256, n_vocab = 320, n_head = 2, n_head_kv = 1, head_dim = 64, n_ff = 256;
  int64_t nk = 2, nv = 4, d_state = 32, conv_k = 4;
  int64_t n_expert = 4, n_expert_used = 2, n_ff_exp = 64, n_ff_shexp = 256;
};

struct TinyCheckpoint {
  TinySpec spec;
  nlohmann::json config;
  std::vector<std::string> order;                       // stored names in file order
  std::map<std::string, std::vector<int64_t>> shapes;   // stored name -> PyTorch shape
  std::map<std::string, std::vector<float>> values;     // stored name -> values (PyTorch order)
  std::string prefix;                                   // "model." or "model.language_model."

  std::vector<bool> recurrent;                          // [n_layer], true = linear attention

  bool is_recurrent(int64_t il) const { return recurrent.at(il); }

  void add(const std::string& name, std::vector<int64_t> shape, float scale = 1.0f / 64) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    const int64_t salt = static_cast<int64_t>(order.size()) * 37;
    // Small exact binary fractions: representable in f32, f16 and bf16 alike (|q| < 256).
    for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(((i * 7 + salt) % 251) - 125) * scale;
    order.push_back(name);
    shapes[name] = std::move(shape);
    values[name] = std::move(v);
  }
  void remove(const std::string& name) {
    order.erase(std::find(order.begin(), order.end(), name));
    shapes.erase(name);
    values.erase(name);
  }
  std::string hf(const std::string& canonical) const { return prefix + canonical; }

  void save(const std::string& dir) const {
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/config.json") << config.dump(2);
    std::vector<SafetensorsWriteTensor> ts;
    for (const auto& name : order) {
      SafetensorsWriteTensor t{name, spec.dtype, shapes.at(name), {}};
      const auto& v = values.at(name);
      for (float x : v) {
        if (spec.dtype == DType::F32) {
          uint32_t u = f32_to_bits(x);
          for (int b = 0; b < 4; ++b) t.bytes.push_back(static_cast<uint8_t>(u >> (8 * b)));
        } else {
          uint16_t h = spec.dtype == DType::F16 ? f32_to_fp16(x) : f32_to_bf16(x);
          t.bytes.push_back(static_cast<uint8_t>(h));
          t.bytes.push_back(static_cast<uint8_t>(h >> 8));
        }
      }
      ts.push_back(std::move(t));
    }
    Status s = safetensors_write(dir + "/model.safetensors", ts, {{"format", "pt"}});
    if (!s.is_ok()) throw std::runtime_error(s.to_string());
  }
};

inline TinyCheckpoint make_tiny_checkpoint(const TinySpec& s) {
  TinyCheckpoint ck;
  ck.spec = s;
  ck.prefix = s.nested ? "model.language_model." : "model.";
  nlohmann::json text = {
      {"num_hidden_layers", s.n_layer},
      {"hidden_size", s.n_embd},
      {"vocab_size", s.n_vocab},
      {"max_position_embeddings", 4096},
      {"num_attention_heads", s.n_head},
      {"num_key_value_heads", s.n_head_kv},
      {"head_dim", s.head_dim},
      {"rms_norm_eps", 1e-6},
      {"linear_conv_kernel_dim", s.conv_k},
      {"linear_key_head_dim", s.d_state},
      {"linear_value_head_dim", s.d_state},
      {"linear_num_key_heads", s.nk},
      {"linear_num_value_heads", s.nv},
      {"full_attention_interval", 4},
      {"rope_parameters", {{"rope_theta", 1e7}, {"partial_rotary_factor", 0.25}, {"mrope_section", {4, 2, 2}}}},
      {"tie_word_embeddings", s.tied},
      {"eos_token_id", 7},
  };
  nlohmann::json layer_types = nlohmann::json::array();
  for (int64_t il = 0; il < s.n_layer; ++il) ck.recurrent.push_back((il + 1) % 4 != 0);
  for (int64_t il = 0; il < s.n_layer; ++il) {
    layer_types.push_back(ck.is_recurrent(il) ? "linear_attention" : "full_attention");
  }
  text["layer_types"] = layer_types;
  if (s.moe) {
    text["num_experts"] = s.n_expert;
    text["num_experts_per_tok"] = s.n_expert_used;
    text["moe_intermediate_size"] = s.n_ff_exp;
    text["shared_expert_intermediate_size"] = s.n_ff_shexp;
  } else {
    text["intermediate_size"] = s.n_ff;
  }
  const std::string arch = std::string(s.moe ? "Qwen3_5Moe" : "Qwen3_5") +
                           (s.nested ? "ForConditionalGeneration" : "ForCausalLM");
  if (s.nested) {
    ck.config = {{"architectures", {arch}}, {"text_config", text}, {"tie_word_embeddings", s.tied}};
  } else {
    ck.config = text;
    ck.config["architectures"] = {arch};
  }

  const int64_t E = s.n_embd, V = s.n_vocab, H = s.n_head, Hkv = s.n_head_kv, D = s.head_dim;
  const int64_t key_dim = s.nk * s.d_state, value_dim = s.nv * s.d_state, conv_dim = 2 * key_dim + value_dim;
  const std::string p = ck.prefix;
  ck.add(p + "embed_tokens.weight", {V, E});
  for (int64_t il = 0; il < s.n_layer; ++il) {
    const std::string l = p + "layers." + std::to_string(il) + ".";
    ck.add(l + "input_layernorm.weight", {E});
    ck.add(l + "post_attention_layernorm.weight", {E});
    if (ck.is_recurrent(il)) {
      const std::string a = l + "linear_attn.";
      ck.add(a + "in_proj_qkv.weight", {conv_dim, E});
      ck.add(a + "in_proj_z.weight", {value_dim, E});
      ck.add(a + "in_proj_b.weight", {s.nv, E});
      ck.add(a + "in_proj_a.weight", {s.nv, E});
      ck.add(a + "conv1d.weight", {conv_dim, 1, s.conv_k});
      ck.add(a + "dt_bias", {s.nv});
      ck.add(a + "A_log", {s.nv});
      ck.add(a + "norm.weight", {s.d_state});
      ck.add(a + "out_proj.weight", {E, value_dim});
    } else {
      const std::string a = l + "self_attn.";
      ck.add(a + "q_proj.weight", {2 * H * D, E});
      ck.add(a + "k_proj.weight", {Hkv * D, E});
      ck.add(a + "v_proj.weight", {Hkv * D, E});
      ck.add(a + "o_proj.weight", {E, H * D});
      ck.add(a + "q_norm.weight", {D});
      ck.add(a + "k_norm.weight", {D});
    }
    const std::string m = l + "mlp.";
    if (!s.moe) {
      ck.add(m + "gate_proj.weight", {s.n_ff, E});
      ck.add(m + "up_proj.weight", {s.n_ff, E});
      ck.add(m + "down_proj.weight", {E, s.n_ff});
      continue;
    }
    ck.add(m + "gate.weight", {s.n_expert, E});
    if (s.fused_experts) {
      ck.add(m + "experts.gate_up_proj", {s.n_expert, 2 * s.n_ff_exp, E});
      ck.add(m + "experts.down_proj", {s.n_expert, E, s.n_ff_exp});
    } else {
      for (int64_t e = 0; e < s.n_expert; ++e) {
        const std::string x = m + "experts." + std::to_string(e) + ".";
        ck.add(x + "gate_proj.weight", {s.n_ff_exp, E});
        ck.add(x + "up_proj.weight", {s.n_ff_exp, E});
        ck.add(x + "down_proj.weight", {E, s.n_ff_exp});
      }
    }
    ck.add(m + "shared_expert.gate_proj.weight", {s.n_ff_shexp, E});
    ck.add(m + "shared_expert.up_proj.weight", {s.n_ff_shexp, E});
    ck.add(m + "shared_expert.down_proj.weight", {E, s.n_ff_shexp});
    ck.add(m + "shared_expert_gate.weight", {1, E});
  }
  ck.add(p + "norm.weight", {E});
  if (!s.tied) ck.add("lm_head.weight", {V, E});
  return ck;
}

// The GGUF tensor names a converted qwen35 / qwen35moe model must contain, from the spec's tables.
inline std::vector<std::string> expected_gguf_names(int64_t n_layer, const std::vector<bool>& recurrent, bool moe,
                                                    bool tied) {
  std::vector<std::string> names = {"token_embd.weight", "output_norm.weight"};
  if (!tied) names.push_back("output.weight");
  for (int64_t il = 0; il < n_layer; ++il) {
    const std::string b = "blk." + std::to_string(il) + ".";
    std::vector<std::string> layer = {"attn_norm.weight", "post_attention_norm.weight"};
    if (recurrent[il]) {
      for (const char* n : {"attn_qkv.weight", "attn_gate.weight", "ssm_conv1d.weight", "ssm_dt.bias", "ssm_a",
                            "ssm_beta.weight", "ssm_alpha.weight", "ssm_norm.weight", "ssm_out.weight"}) {
        layer.push_back(n);
      }
    } else {
      for (const char* n : {"attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
                            "attn_q_norm.weight", "attn_k_norm.weight"}) {
        layer.push_back(n);
      }
    }
    if (moe) {
      for (const char* n : {"ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight",
                            "ffn_down_exps.weight", "ffn_gate_inp_shexp.weight", "ffn_gate_shexp.weight",
                            "ffn_up_shexp.weight", "ffn_down_shexp.weight"}) {
        layer.push_back(n);
      }
    } else {
      for (const char* n : {"ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"}) layer.push_back(n);
    }
    for (const auto& n : layer) names.push_back(b + n);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Output V head j of the tiled (ggml) order takes the source head in HF's grouped order that has the
// same key head (HF: source head s uses key head s / (nv/nk); ggml: head j uses key head j % nk) and
// the same rank within that group. Found by search, independently of the converter's formula.
inline int64_t expected_v_source(int64_t j, int64_t nk, int64_t nv) {
  const int64_t per_group = nv / nk;
  for (int64_t s = 0; s < nv; ++s) {
    if (s / per_group == j % nk && s % per_group == j / nk) return s;
  }
  return -1;
}

// Fetches a converted tensor as floats in ggml order and its ggml shape; returns false if absent.
using TensorGetter = std::function<bool(const std::string& name, std::vector<float>* values, std::vector<int64_t>* ne)>;

// Checks every converted tensor of `ck` element by element against the spec's transforms.
inline void check_all_transforms(const TinyCheckpoint& ck, const TensorGetter& get) {
  const TinySpec& s = ck.spec;
  const int64_t E = s.n_embd, dv = s.d_state, nk = s.nk, nv = s.nv;
  const int64_t key_dim = nk * dv, value_dim = nv * dv, conv_dim = 2 * key_dim + value_dim;
  auto src = [&](const std::string& name) -> const std::vector<float>& { return ck.values.at(name); };
  // expect(gguf, ne, f): element (c, r) of the output (r = flattened outer index) equals f(c, r).
  auto expect = [&](const std::string& gguf, std::vector<int64_t> want_ne, const std::function<float(int64_t, int64_t)>& f) {
    std::vector<float> v;
    std::vector<int64_t> ne;
    ASSERT_TRUE(get(gguf, &v, &ne)) << gguf << " missing";
    ASSERT_EQ(ne, want_ne) << gguf;
    const int64_t row = ne[0];
    int mismatches = 0;
    for (int64_t i = 0; i < static_cast<int64_t>(v.size()) && mismatches < 3; ++i) {
      const float want = f(i % row, i / row);
      if (std::fabs(v[i] - want) > 1e-6f * std::max(1.0f, std::fabs(want))) {
        ADD_FAILURE() << gguf << " element (" << i % row << ", " << i / row << "): got " << v[i] << ", want " << want;
        ++mismatches;
      }
    }
  };
  auto copy_of = [&](const std::string& name) {
    const auto& x = src(name);
    const int64_t row = ck.shapes.at(name).back();
    return [&x, row](int64_t c, int64_t r) { return x[r * row + c]; };
  };
  auto plus_one = [&](const std::string& name) {
    const auto& x = src(name);
    return [&x](int64_t c, int64_t) { return x[c] + 1.0f; };
  };
  const std::string p = ck.prefix;
  expect("token_embd.weight", {E, s.n_vocab}, copy_of(p + "embed_tokens.weight"));
  expect("output_norm.weight", {E}, plus_one(p + "norm.weight"));
  if (!s.tied) expect("output.weight", {E, s.n_vocab}, copy_of("lm_head.weight"));
  // A row index in a tensor whose rows [offset, offset + nv * head) are V heads, after reordering.
  auto v_row = [&](int64_t r, int64_t offset, int64_t head) {
    if (r < offset || r >= offset + nv * head) return r;
    return offset + expected_v_source((r - offset) / head, nk, nv) * head + (r - offset) % head;
  };
  for (int64_t il = 0; il < s.n_layer; ++il) {
    const std::string l = p + "layers." + std::to_string(il) + ".";
    const std::string b = "blk." + std::to_string(il) + ".";
    expect(b + "attn_norm.weight", {E}, plus_one(l + "input_layernorm.weight"));
    expect(b + "post_attention_norm.weight", {E}, plus_one(l + "post_attention_layernorm.weight"));
    if (ck.is_recurrent(il)) {
      const std::string a = l + "linear_attn.";
      const auto& qkv = src(a + "in_proj_qkv.weight");
      expect(b + "attn_qkv.weight", {E, conv_dim}, [&](int64_t c, int64_t r) { return qkv[v_row(r, 2 * key_dim, dv) * E + c]; });
      const auto& z = src(a + "in_proj_z.weight");
      expect(b + "attn_gate.weight", {E, value_dim}, [&](int64_t c, int64_t r) { return z[v_row(r, 0, dv) * E + c]; });
      const auto& beta = src(a + "in_proj_b.weight");
      expect(b + "ssm_beta.weight", {E, nv}, [&](int64_t c, int64_t r) { return beta[v_row(r, 0, 1) * E + c]; });
      const auto& alpha = src(a + "in_proj_a.weight");
      expect(b + "ssm_alpha.weight", {E, nv}, [&](int64_t c, int64_t r) { return alpha[v_row(r, 0, 1) * E + c]; });
      // conv1d [conv_dim, 1, K] squeezed to {K, conv_dim}; channel i filters in_proj_qkv output row i,
      // so its V channels move with their heads, dv channels at a time.
      const auto& conv = src(a + "conv1d.weight");
      expect(b + "ssm_conv1d.weight", {s.conv_k, conv_dim},
             [&](int64_t c, int64_t r) { return conv[v_row(r, 2 * key_dim, dv) * s.conv_k + c]; });
      const auto& dt = src(a + "dt_bias");
      expect(b + "ssm_dt.bias", {nv}, [&](int64_t c, int64_t) { return dt[v_row(c, 0, 1)]; });
      const auto& alog = src(a + "A_log");
      expect(b + "ssm_a", {nv}, [&](int64_t c, int64_t) { return -std::exp(alog[v_row(c, 0, 1)]); });
      expect(b + "ssm_norm.weight", {dv}, copy_of(a + "norm.weight"));  // no +1
      const auto& out = src(a + "out_proj.weight");  // [E, value_dim]: columns reordered
      expect(b + "ssm_out.weight", {value_dim, E}, [&](int64_t c, int64_t r) { return out[r * value_dim + v_row(c, 0, dv)]; });
    } else {
      const std::string a = l + "self_attn.";
      const int64_t HD = s.n_head * s.head_dim, KD = s.n_head_kv * s.head_dim;
      expect(b + "attn_q.weight", {E, 2 * HD}, copy_of(a + "q_proj.weight"));
      expect(b + "attn_k.weight", {E, KD}, copy_of(a + "k_proj.weight"));
      expect(b + "attn_v.weight", {E, KD}, copy_of(a + "v_proj.weight"));
      expect(b + "attn_output.weight", {HD, E}, copy_of(a + "o_proj.weight"));
      expect(b + "attn_q_norm.weight", {s.head_dim}, plus_one(a + "q_norm.weight"));
      expect(b + "attn_k_norm.weight", {s.head_dim}, plus_one(a + "k_norm.weight"));
    }
    const std::string m = l + "mlp.";
    if (!s.moe) {
      expect(b + "ffn_gate.weight", {E, s.n_ff}, copy_of(m + "gate_proj.weight"));
      expect(b + "ffn_up.weight", {E, s.n_ff}, copy_of(m + "up_proj.weight"));
      expect(b + "ffn_down.weight", {s.n_ff, E}, copy_of(m + "down_proj.weight"));
      continue;
    }
    const int64_t Fe = s.n_ff_exp;
    expect(b + "ffn_gate_inp.weight", {E, s.n_expert}, copy_of(m + "gate.weight"));
    // Stacked experts: element (c, f, e) with r = e * rows + f.
    auto expert_value = [&](const char* which, int64_t c, int64_t r) -> float {
      const std::string w = which;
      const int64_t rows = w == "down" ? E : Fe, cols = w == "down" ? Fe : E;
      const int64_t e = r / rows, f = r % rows;
      if (s.fused_experts) {
        if (w == "down") return src(m + "experts.down_proj")[(e * E + f) * Fe + c];
        const int64_t row = e * 2 * Fe + (w == "up" ? Fe : 0) + f;  // gate rows first, then up
        return src(m + "experts.gate_up_proj")[row * E + c];
      }
      return src(m + "experts." + std::to_string(e) + "." + w + "_proj.weight")[f * cols + c];
    };
    expect(b + "ffn_gate_exps.weight", {E, Fe, s.n_expert}, [&](int64_t c, int64_t r) { return expert_value("gate", c, r); });
    expect(b + "ffn_up_exps.weight", {E, Fe, s.n_expert}, [&](int64_t c, int64_t r) { return expert_value("up", c, r); });
    expect(b + "ffn_down_exps.weight", {Fe, E, s.n_expert}, [&](int64_t c, int64_t r) { return expert_value("down", c, r); });
    expect(b + "ffn_gate_inp_shexp.weight", {E}, copy_of(m + "shared_expert_gate.weight"));
    expect(b + "ffn_gate_shexp.weight", {E, s.n_ff_shexp}, copy_of(m + "shared_expert.gate_proj.weight"));
    expect(b + "ffn_up_shexp.weight", {E, s.n_ff_shexp}, copy_of(m + "shared_expert.up_proj.weight"));
    expect(b + "ffn_down_shexp.weight", {s.n_ff_shexp, E}, copy_of(m + "shared_expert.down_proj.weight"));
  }
}

}  // namespace ds::convert_test
