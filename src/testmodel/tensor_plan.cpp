// Builds the tensor list and picks each tensor's dtype and initialisation. Scales keep activations
// finite through every layer: input projections ~ N(0, 1/fan_in), output projections (attn_output,
// ssm_out, ffn_down*) further divided by sqrt(2 n_layer) so the residual stream grows slowly, norm
// weights near 1 (GGUF stores the effective multiplier), and a small router.
#include "testmodel/tensor_plan.h"

#include <cmath>

#include "quant/q4_k_m.h"

namespace ds::testmodel {

int64_t TensorSpec::n_rows() const {
  int64_t n = 1;
  for (size_t i = 1; i < ne.size(); ++i) n *= ne[i];
  return n;
}

namespace {

class PlanBuilder {
 public:
  explicit PlanBuilder(const TestModelConfig& c)
      : c_(c), out_scale_(1.0f / std::sqrt(2.0f * static_cast<float>(c.n_layer))) {}

  // A projection matrix with fan_in = ne[0]; `output` marks a residual output projection.
  void matrix(const std::string& name, std::vector<int64_t> ne, bool output = false) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(ne[0])) * (output ? out_scale_ : 1.0f);
    add(name, std::move(ne), {InitKind::kNormal, scale, 0.0f}, false);
  }
  // A matrix with an explicit N(0, scale^2) initialisation.
  void matrix_scaled(const std::string& name, std::vector<int64_t> ne, float scale) {
    add(name, std::move(ne), {InitKind::kNormal, scale, 0.0f}, false);
  }
  // An RMSNorm weight stored as its effective multiplier, uniform in [0.9, 1.1].
  void norm(const std::string& name, int64_t n) { add(name, {n}, {InitKind::kUniform, 0.1f, 1.0f}, true); }
  void f32(const std::string& name, std::vector<int64_t> ne, WeightInit init) { add(name, std::move(ne), init, true); }

  std::vector<TensorSpec> take() { return std::move(tensors_); }

 private:
  void add(const std::string& name, std::vector<int64_t> ne, WeightInit init, bool force_f32) {
    TensorSpec t;
    t.name = name;
    t.ne = std::move(ne);
    t.init = init;
    t.dtype = force_f32 || c_.type == OutType::kQ4_K_M ? DType::F32 : out_type_plain_dtype(c_.type);
    tensors_.push_back(std::move(t));
  }

  const TestModelConfig& c_;
  float out_scale_;
  std::vector<TensorSpec> tensors_;
};

void add_attention(PlanBuilder& b, const TestModelConfig& c, const std::string& p) {
  const int64_t E = c.n_embd, D = c.head_dim;
  b.matrix(p + "attn_q.weight", {E, 2 * c.n_head * D});  // per head [q ; gate]
  b.matrix(p + "attn_k.weight", {E, c.n_head_kv * D});
  b.matrix(p + "attn_v.weight", {E, c.n_head_kv * D});
  b.matrix(p + "attn_output.weight", {c.n_head * D, E}, true);
  b.norm(p + "attn_q_norm.weight", D);
  b.norm(p + "attn_k_norm.weight", D);
}

void add_delta_net(PlanBuilder& b, const TestModelConfig& c, const std::string& p) {
  const int64_t E = c.n_embd, nv = c.ssm_n_v_heads, K = c.ssm_conv_kernel;
  b.matrix(p + "attn_qkv.weight", {E, c.ssm_conv_dim()});
  b.matrix(p + "attn_gate.weight", {E, c.ssm_value_dim()});
  b.f32(p + "ssm_conv1d.weight", {K, c.ssm_conv_dim()},
        {InitKind::kNormal, 1.0f / std::sqrt(static_cast<float>(K)), 0.0f});
  b.f32(p + "ssm_dt.bias", {nv}, {InitKind::kUniform, 0.1f, 0.0f});
  b.f32(p + "ssm_a", {nv}, {InitKind::kSsmA, 1.0f, 0.0f});
  b.matrix(p + "ssm_beta.weight", {E, nv});
  b.matrix(p + "ssm_alpha.weight", {E, nv});
  b.norm(p + "ssm_norm.weight", c.ssm_head_dim);
  b.matrix(p + "ssm_out.weight", {c.ssm_value_dim(), E}, true);
}

void add_ffn(PlanBuilder& b, const TestModelConfig& c, const std::string& p) {
  const int64_t E = c.n_embd;
  if (!c.is_moe()) {
    b.matrix(p + "ffn_gate.weight", {E, c.n_ff});
    b.matrix(p + "ffn_up.weight", {E, c.n_ff});
    b.matrix(p + "ffn_down.weight", {c.n_ff, E}, true);
    return;
  }
  const float router = 0.5f / std::sqrt(static_cast<float>(E));
  b.f32(p + "ffn_gate_inp.weight", {E, c.n_expert}, {InitKind::kNormal, router, 0.0f});
  b.matrix(p + "ffn_gate_exps.weight", {E, c.n_ff_exp, c.n_expert});
  b.matrix(p + "ffn_up_exps.weight", {E, c.n_ff_exp, c.n_expert});
  b.matrix(p + "ffn_down_exps.weight", {c.n_ff_exp, E, c.n_expert}, true);
  b.f32(p + "ffn_gate_inp_shexp.weight", {E}, {InitKind::kNormal, 1.0f / std::sqrt(static_cast<float>(E)), 0.0f});
  b.matrix(p + "ffn_gate_shexp.weight", {E, c.n_ff_shexp});
  b.matrix(p + "ffn_up_shexp.weight", {E, c.n_ff_shexp});
  b.matrix(p + "ffn_down_shexp.weight", {c.n_ff_shexp, E}, true);
}

}  // namespace

Result<std::vector<TensorSpec>> test_model_tensors(const TestModelConfig& c) {
  DS_TRY(test_model_config_validate(c));
  PlanBuilder b(c);
  const int64_t E = c.n_embd;
  // Embedding rows of unit RMS start the residual stream at a healthy size; a tied embedding is
  // also the output matrix, so it gets the 1/sqrt(n_embd) scale that keeps logits O(1).
  b.matrix_scaled("token_embd.weight", {E, c.n_vocab},
                  c.tied_output ? 1.0f / std::sqrt(static_cast<float>(E)) : 1.0f);
  for (int64_t il = 0; il < c.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    b.norm(p + "attn_norm.weight", E);
    if (c.is_recurrent(il)) add_delta_net(b, c, p);
    else add_attention(b, c, p);
    b.norm(p + "post_attention_norm.weight", E);
    add_ffn(b, c, p);
  }
  b.norm("output_norm.weight", E);
  if (!c.tied_output) b.matrix("output.weight", {E, c.n_vocab});
  std::vector<TensorSpec> tensors = b.take();

  if (c.type == OutType::kQ4_K_M) {
    std::vector<std::string> names;
    for (const auto& t : tensors) names.push_back(t.name);
    Q4KMState state = q4_k_m_state_for(names, c.n_layer, c.is_moe() ? c.n_expert : 0);
    for (auto& t : tensors) t.dtype = q4_k_m_type_for(t.name, t.ne, t.dtype, state);
  }
  for (const auto& t : tensors) {
    const int64_t block = dtype_block_size(t.dtype);
    if (t.ne[0] % block != 0) {
      return invalid_argument(
          "tensor {}: row length {} is not a multiple of {}, the block size of {}; choose dimensions that are "
          "multiples of {} or another --type",
          t.name, t.ne[0], block, out_type_name(c.type), block);
    }
  }
  return tensors;
}

uint64_t test_model_tensor_bytes(const std::vector<TensorSpec>& tensors) {
  uint64_t total = 0;
  for (const auto& t : tensors) total += static_cast<uint64_t>(dtype_row_bytes(t.dtype, t.ne[0]) * t.n_rows());
  return total;
}

}  // namespace ds::testmodel
