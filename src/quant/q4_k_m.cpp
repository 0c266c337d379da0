// Q4_K_M assignment rules. Branch order follows llama-quantize: output first, then token_embd,
// attn_v-like, attn_k, ffn_down*, attn_output, default Q4_K; the row-length fallback runs last.
// The n_expert == 8 bumps (attn_v-like and attn_k to Q8_0, attn_output to Q5_K) are kept because
// small 8-expert test models hit them; Qwen3.5 MoE itself has 256 experts.
#include "quant/q4_k_m.h"

namespace ds {
namespace {

bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

bool is_attn_v_like(std::string_view name) {
  return contains(name, "attn_v.weight") || contains(name, "attn_qkv.weight") || contains(name, "attn_kv_b.weight");
}

int n_dims_of(const std::vector<int64_t>& ne) {
  int n = static_cast<int>(ne.size());
  while (n > 1 && ne[n - 1] == 1) --n;
  return n;
}

// "blk.N." -> N, or -1.
int64_t layer_of(std::string_view name) {
  if (name.substr(0, 4) != "blk.") return -1;
  int64_t v = 0;
  size_t i = 4;
  if (i >= name.size() || name[i] < '0' || name[i] > '9') return -1;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') v = v * 10 + (name[i++] - '0');
  return (i < name.size() && name[i] == '.') ? v : -1;
}

}  // namespace

Q4KMState q4_k_m_state_for(const std::vector<std::string>& names, int64_t n_layer_all, int64_t n_expert) {
  Q4KMState s;
  s.n_layer_all = n_layer_all;
  s.n_expert = n_expert;
  for (const auto& name : names) {
    if (is_attn_v_like(name)) ++s.n_attn_v;
    if (name == "output.weight") s.has_output = true;
  }
  return s;
}

bool q4_k_m_use_more_bits(int64_t i, int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

bool q4_k_m_quantizes(std::string_view name, const std::vector<int64_t>& ne) {
  constexpr std::string_view kSuffix = "weight";
  if (name.size() < kSuffix.size() || name.substr(name.size() - kSuffix.size()) != kSuffix) return false;
  if (n_dims_of(ne) < 2) return false;
  return !contains(name, "_norm.weight") && !contains(name, "ffn_gate_inp.weight") && !contains(name, "ssm_conv1d");
}

DType q4_k_m_type_for(std::string_view name, const std::vector<int64_t>& ne, DType keep_type, Q4KMState& state) {
  if (!q4_k_m_quantizes(name, ne)) return keep_type;
  const int64_t ne0 = ne.empty() ? 1 : ne[0];
  const int64_t qk_k = dtype_block_size(DType::Q4_K);
  DType t = DType::Q4_K;
  if (name == "output.weight" || (!state.has_output && name == "token_embd.weight")) {
    t = ne0 % qk_k != 0 ? DType::Q8_0 : DType::Q6_K;
  } else if (name == "token_embd.weight") {
    t = DType::Q4_K;
  } else if (is_attn_v_like(name)) {
    t = q4_k_m_use_more_bits(state.i_attn_v, state.n_attn_v) ? DType::Q6_K : DType::Q4_K;
    if (state.n_expert == 8) t = DType::Q8_0;
    ++state.i_attn_v;
  } else if (contains(name, "attn_k.weight")) {
    if (state.n_expert == 8) t = DType::Q8_0;
  } else if (contains(name, "ffn_down")) {
    // Dense models count ffn_down tensors; MoE models take the layer from the name (experts of one
    // layer are not necessarily adjacent in a file). A name without a layer keeps the counter.
    int64_t i_layer = state.i_ffn_down;
    if (state.n_expert > 1) {
      const int64_t parsed = layer_of(name);
      if (parsed >= 0) i_layer = parsed;
    }
    if (q4_k_m_use_more_bits(i_layer, state.n_layer_all)) t = DType::Q6_K;
    ++state.i_ffn_down;
  } else if (contains(name, "attn_output.weight")) {
    if (state.n_expert == 8) t = DType::Q5_K;
  }
  if (ne0 % dtype_block_size(t) != 0) {
    switch (t) {
      case DType::Q4_K: t = DType::Q5_0; break;
      case DType::Q5_K: t = DType::Q5_1; break;
      case DType::Q6_K: t = DType::Q8_0; break;
      default: break;  // Q8_0 with ne0 % 32 != 0: falls through to F16 below
    }
    if (ne0 % dtype_block_size(t) != 0) t = DType::F16;
  }
  return t;
}

}  // namespace ds
