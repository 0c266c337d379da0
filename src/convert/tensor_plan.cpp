// Building the qwen35 / qwen35moe tensor plan from a checkpoint (spec sections 3 and 5). The one
// non-obvious choice: every transform is expressed as a row mapping (plus an optional column
// permutation and an elementwise op), which covers the V-head reorder, the conv1d squeeze, expert
// stacking and the fused gate_up split without ever holding a whole source tensor in memory.
#include "convert/tensor_plan.h"

#include <cmath>

#include "core/check.h"

namespace ds::convert {
namespace {

std::vector<int64_t> reversed(std::vector<int64_t> v) { return {v.rbegin(), v.rend()}; }

// Row permutation of `n_rows` rows in which rows [offset, offset + nv * head_size) hold V heads
// in HF's grouped order; all other rows map to themselves.
std::function<RowRef(int64_t)> v_reordered_rows(const SafetensorsTensor* t, int64_t offset, int64_t head_size,
                                                int64_t nk, int64_t nv) {
  return [=](int64_t r) {
    if (r < offset || r >= offset + nv * head_size) return RowRef{t, r};
    const int64_t h = (r - offset) / head_size, d = (r - offset) % head_size;
    return RowRef{t, offset + v_head_source(h, nk, nv) * head_size + d};
  };
}

std::vector<int64_t> v_reordered_cols(int64_t offset, int64_t head_size, int64_t nk, int64_t nv, int64_t n) {
  std::vector<int64_t> perm(static_cast<size_t>(n));
  for (int64_t c = 0; c < n; ++c) {
    perm[c] = c;
    if (c >= offset && c < offset + nv * head_size) {
      const int64_t h = (c - offset) / head_size, d = (c - offset) % head_size;
      perm[c] = offset + v_head_source(h, nk, nv) * head_size + d;
    }
  }
  return perm;
}

class Planner {
 public:
  Planner(const HfConfig& cfg, const HfWeights& w) : c_(cfg), w_(w) {}

  Result<std::vector<PlannedTensor>> run();

 private:
  // Adds a tensor copied row for row; ne is the reversed PyTorch shape.
  Result<PlannedTensor*> add(const std::string& gguf, const std::string& hf, const std::vector<int64_t>& shape,
                             ValueOp op = ValueOp::kCopy, bool keep_f32 = false) {
    DS_ASSIGN_OR_RETURN(const SafetensorsTensor* t, w_.get(hf, shape));
    PlannedTensor p;
    p.name = gguf;
    p.ne = reversed(shape);
    p.op = op;
    p.keep_f32 = keep_f32 || shape.size() == 1;
    p.source_row = [t](int64_t r) { return RowRef{t, r}; };
    out_.push_back(std::move(p));
    return &out_.back();
  }
  // Like add() but accepts either of two PyTorch shapes and writes ggml shape `ne`.
  Result<PlannedTensor*> add_squeezed(const std::string& gguf, const std::string& hf,
                                      const std::vector<int64_t>& shape_a, const std::vector<int64_t>& shape_b,
                                      const std::vector<int64_t>& ne, bool keep_f32) {
    const SafetensorsTensor* t = w_.find(hf);
    const std::vector<int64_t>& shape = (t != nullptr && t->shape == shape_b) ? shape_b : shape_a;
    DS_ASSIGN_OR_RETURN(PlannedTensor * p, add(gguf, hf, shape, ValueOp::kCopy, keep_f32));
    p->ne = ne;
    return p;
  }
  Status add_attention(int64_t il);
  Status add_delta_net(int64_t il);
  Status add_dense_ffn(int64_t il);
  Status add_moe_ffn(int64_t il);
  Status add_experts(int64_t il, const std::string& pre);

  const HfConfig& c_;
  const HfWeights& w_;
  std::vector<PlannedTensor> out_;
};

Status Planner::add_attention(int64_t il) {
  const std::string hf = "layers." + std::to_string(il) + ".self_attn.";
  const std::string gg = "blk." + std::to_string(il) + ".";
  const int64_t E = c_.n_embd, H = c_.n_head, Hkv = c_.n_head_kv, D = c_.head_dim;
  DS_TRY(add(gg + "attn_q.weight", hf + "q_proj.weight", {2 * H * D, E}).status());
  DS_TRY(add(gg + "attn_k.weight", hf + "k_proj.weight", {Hkv * D, E}).status());
  DS_TRY(add(gg + "attn_v.weight", hf + "v_proj.weight", {Hkv * D, E}).status());
  DS_TRY(add(gg + "attn_output.weight", hf + "o_proj.weight", {E, H * D}).status());
  DS_TRY(add(gg + "attn_q_norm.weight", hf + "q_norm.weight", {D}, ValueOp::kAddOne).status());
  DS_TRY(add(gg + "attn_k_norm.weight", hf + "k_norm.weight", {D}, ValueOp::kAddOne).status());
  return Status::ok();
}

Status Planner::add_delta_net(int64_t il) {
  const std::string hf = "layers." + std::to_string(il) + ".linear_attn.";
  const std::string gg = "blk." + std::to_string(il) + ".";
  const int64_t E = c_.n_embd, nk = c_.ssm_n_k_heads, nv = c_.ssm_n_v_heads, dv = c_.ssm_d_state;
  const int64_t key_dim = c_.ssm_key_dim(), value_dim = c_.ssm_value_dim(), conv_dim = c_.ssm_conv_dim();
  const int64_t K = c_.ssm_conv_kernel;
  // Rows of the V part of the fused projection, and the V channels of the conv, are reordered.
  DS_ASSIGN_OR_RETURN(PlannedTensor * qkv, add(gg + "attn_qkv.weight", hf + "in_proj_qkv.weight", {conv_dim, E}));
  qkv->source_row = v_reordered_rows(qkv->source_row(0).tensor, 2 * key_dim, dv, nk, nv);
  DS_ASSIGN_OR_RETURN(PlannedTensor * z, add(gg + "attn_gate.weight", hf + "in_proj_z.weight", {value_dim, E}));
  z->source_row = v_reordered_rows(z->source_row(0).tensor, 0, dv, nk, nv);
  DS_ASSIGN_OR_RETURN(PlannedTensor * conv, add_squeezed(gg + "ssm_conv1d.weight", hf + "conv1d.weight",
                                                         {conv_dim, 1, K}, {conv_dim, K}, {K, conv_dim}, true));
  conv->source_row = v_reordered_rows(conv->source_row(0).tensor, 2 * key_dim, dv, nk, nv);  // a head: dv channels
  DS_ASSIGN_OR_RETURN(PlannedTensor * dt, add(gg + "ssm_dt.bias", hf + "dt_bias", {nv}));
  dt->col_perm = v_reordered_cols(0, 1, nk, nv, nv);
  DS_ASSIGN_OR_RETURN(PlannedTensor * a, add(gg + "ssm_a", hf + "A_log", {nv}, ValueOp::kNegExp));
  a->col_perm = v_reordered_cols(0, 1, nk, nv, nv);
  DS_ASSIGN_OR_RETURN(PlannedTensor * beta, add(gg + "ssm_beta.weight", hf + "in_proj_b.weight", {nv, E}));
  beta->source_row = v_reordered_rows(beta->source_row(0).tensor, 0, 1, nk, nv);
  DS_ASSIGN_OR_RETURN(PlannedTensor * alpha, add(gg + "ssm_alpha.weight", hf + "in_proj_a.weight", {nv, E}));
  alpha->source_row = v_reordered_rows(alpha->source_row(0).tensor, 0, 1, nk, nv);
  // The gated norm is plain (initialised to ones): stored as is, no +1.
  DS_TRY(add(gg + "ssm_norm.weight", hf + "norm.weight", {dv}).status());
  DS_ASSIGN_OR_RETURN(PlannedTensor * o, add(gg + "ssm_out.weight", hf + "out_proj.weight", {E, value_dim}));
  o->col_perm = v_reordered_cols(0, dv, nk, nv, value_dim);
  return Status::ok();
}

Status Planner::add_dense_ffn(int64_t il) {
  const std::string hf = "layers." + std::to_string(il) + ".mlp.";
  const std::string gg = "blk." + std::to_string(il) + ".";
  const int64_t E = c_.n_embd, F = c_.n_ff;
  DS_TRY(add(gg + "ffn_gate.weight", hf + "gate_proj.weight", {F, E}).status());
  DS_TRY(add(gg + "ffn_up.weight", hf + "up_proj.weight", {F, E}).status());
  DS_TRY(add(gg + "ffn_down.weight", hf + "down_proj.weight", {E, F}).status());
  return Status::ok();
}

Status Planner::add_experts(int64_t il, const std::string& pre) {
  const std::string gg = "blk." + std::to_string(il) + ".";
  const int64_t E = c_.n_embd, Fe = c_.n_ff_exp, n_exp = c_.n_expert;
  std::string fused_gate_up = pre + "experts.gate_up_proj";
  std::string fused_down = pre + "experts.down_proj";
  if (!w_.has(fused_gate_up) && w_.has(fused_gate_up + ".weight")) fused_gate_up += ".weight";
  if (!w_.has(fused_down) && w_.has(fused_down + ".weight")) fused_down += ".weight";
  if (w_.has(fused_gate_up)) {
    // transformers v5 fused form [n_exp, 2 Fe, E]: per expert the first Fe rows are gate, the next up.
    DS_ASSIGN_OR_RETURN(const SafetensorsTensor* gu, w_.get(fused_gate_up, {n_exp, 2 * Fe, E}));
    for (int half = 0; half < 2; ++half) {
      PlannedTensor p;
      p.name = gg + (half == 0 ? "ffn_gate_exps.weight" : "ffn_up_exps.weight");
      p.ne = {E, Fe, n_exp};
      p.source_row = [gu, Fe, half](int64_t r) { return RowRef{gu, (r / Fe) * 2 * Fe + half * Fe + r % Fe}; };
      out_.push_back(std::move(p));
    }
    DS_ASSIGN_OR_RETURN(PlannedTensor * down, add(gg + "ffn_down_exps.weight", fused_down, {n_exp, E, Fe}));
    (void)down;
    return Status::ok();
  }
  // Per-expert form: stack experts.{i}.{gate,up,down}_proj.weight along a new outermost axis.
  struct Part {
    const char* gguf;
    const char* hf;
    int64_t rows, cols;
  };
  for (const Part& part : {Part{"ffn_gate_exps.weight", "gate_proj", Fe, E}, Part{"ffn_up_exps.weight", "up_proj", Fe, E},
                           Part{"ffn_down_exps.weight", "down_proj", E, Fe}}) {
    std::vector<const SafetensorsTensor*> experts;
    for (int64_t i = 0; i < n_exp; ++i) {
      const std::string name = pre + "experts." + std::to_string(i) + "." + part.hf + ".weight";
      DS_ASSIGN_OR_RETURN(const SafetensorsTensor* t, w_.get(name, {part.rows, part.cols}));
      experts.push_back(t);
    }
    PlannedTensor p;
    p.name = gg + part.gguf;
    p.ne = {part.cols, part.rows, n_exp};
    const int64_t rows = part.rows;
    p.source_row = [experts = std::move(experts), rows](int64_t r) { return RowRef{experts[r / rows], r % rows}; };
    out_.push_back(std::move(p));
  }
  return Status::ok();
}

Status Planner::add_moe_ffn(int64_t il) {
  const std::string hf = "layers." + std::to_string(il) + ".mlp.";
  const std::string gg = "blk." + std::to_string(il) + ".";
  const int64_t E = c_.n_embd, Fs = c_.n_ff_shexp;
  DS_TRY(add(gg + "ffn_gate_inp.weight", hf + "gate.weight", {c_.n_expert, E}, ValueOp::kCopy, true).status());
  DS_TRY(add_experts(il, hf));
  DS_TRY(add_squeezed(gg + "ffn_gate_inp_shexp.weight", hf + "shared_expert_gate.weight", {1, E}, {E}, {E}, true)
             .status());
  DS_TRY(add(gg + "ffn_gate_shexp.weight", hf + "shared_expert.gate_proj.weight", {Fs, E}).status());
  DS_TRY(add(gg + "ffn_up_shexp.weight", hf + "shared_expert.up_proj.weight", {Fs, E}).status());
  DS_TRY(add(gg + "ffn_down_shexp.weight", hf + "shared_expert.down_proj.weight", {E, Fs}).status());
  return Status::ok();
}

Result<std::vector<PlannedTensor>> Planner::run() {
  const int64_t E = c_.n_embd, V = c_.n_vocab;
  DS_TRY(add("token_embd.weight", "embed_tokens.weight", {V, E}).status());
  for (int64_t il = 0; il < c_.n_layer; ++il) {
    const std::string hf = "layers." + std::to_string(il) + ".";
    const std::string gg = "blk." + std::to_string(il) + ".";
    DS_TRY(add(gg + "attn_norm.weight", hf + "input_layernorm.weight", {E}, ValueOp::kAddOne).status());
    DS_TRY(c_.recurrent_layers[il] ? add_delta_net(il) : add_attention(il));
    DS_TRY(add(gg + "post_attention_norm.weight", hf + "post_attention_layernorm.weight", {E}, ValueOp::kAddOne)
               .status());
    DS_TRY(c_.is_moe ? add_moe_ffn(il) : add_dense_ffn(il));
  }
  DS_TRY(add("output_norm.weight", "norm.weight", {E}, ValueOp::kAddOne).status());
  const bool tied = c_.tie_word_embeddings || !w_.has("lm_head.weight");
  if (tied) {
    (void)w_.find("lm_head.weight");  // a stored copy of the tied embedding is not written
  } else {
    DS_TRY(add("output.weight", "lm_head.weight", {V, E}).status());
  }
  const std::vector<std::string> unused = w_.unused();
  if (!unused.empty()) {
    return unsupported("{}: tensor '{}' is not part of a {} model ({} unused tensors in all)", w_.dir(), unused[0],
                       c_.gguf_architecture, unused.size());
  }
  return std::move(out_);
}

}  // namespace

int64_t v_head_source(int64_t j, int64_t n_k_heads, int64_t n_v_heads) {
  const int64_t per_group = n_v_heads / n_k_heads;  // HF: v head j uses k head j / per_group
  return (j % n_k_heads) * per_group + j / n_k_heads;
}

int64_t PlannedTensor::n_rows() const {
  int64_t n = 1;
  for (size_t i = 1; i < ne.size(); ++i) n *= ne[i];
  return n;
}

void PlannedTensor::read_rows(int64_t r0, int64_t r1, float* dst) const {
  const int64_t n = row_len();
  std::vector<float> tmp(col_perm.empty() ? 0 : static_cast<size_t>(n));
  for (int64_t r = r0; r < r1; ++r) {
    const RowRef ref = source_row(r);
    float* out = dst + (r - r0) * n;
    DS_CHECK(ref.tensor != nullptr && (ref.row + 1) * n <= ref.tensor->n_elements(),
             "{}: output row {} maps outside its source tensor", name, r);
    if (col_perm.empty()) {
      SafetensorsFile::to_f32(*ref.tensor, ref.row * n, n, out);
    } else {
      SafetensorsFile::to_f32(*ref.tensor, ref.row * n, n, tmp.data());
      for (int64_t c = 0; c < n; ++c) out[c] = tmp[col_perm[c]];
    }
    if (op == ValueOp::kAddOne) {
      for (int64_t c = 0; c < n; ++c) out[c] += 1.0f;
    } else if (op == ValueOp::kNegExp) {
      for (int64_t c = 0; c < n; ++c) out[c] = -std::exp(out[c]);
    }
  }
}

Result<std::vector<PlannedTensor>> plan_tensors(const HfConfig& cfg, const HfWeights& weights) {
  Planner planner(cfg, weights);
  return planner.run();
}

}  // namespace ds::convert
