// Full-attention layer forward (model spec section 4): projections, per-head q/k RMSNorm, partial
// NeoX RoPE, KV written into the sequence's chunks, causal GQA attention, sigmoid output gate,
// output projection.
#include <algorithm>
#include <cmath>

#include "model/model_internal.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/rms_norm.h"
#include "ops/rope.h"

namespace ds {

Status attention_forward(const LayerCall& call, const AttentionWeights& w, int64_t attn_index,
                         const TensorView& x_norm, const TensorView& out) {
  const ModelConfig& c = call.config;
  const OpContext& ctx = call.ctx;
  const int64_t n = call.n_tokens, D = c.head_dim, H = c.n_head, Hkv = c.n_head_kv;
  ModelScratch& S = call.scratch;

  DS_ASSIGN_OR_RETURN(TensorView qg, S.f32({2 * H * D, n}));  // [n, H, (q_h; gate_h)]
  DS_ASSIGN_OR_RETURN(TensorView k, S.f32({D, Hkv, n}));
  DS_ASSIGN_OR_RETURN(TensorView v, S.f32({D, Hkv, n}));
  DS_TRY(matmul(ctx, w.wq, x_norm, qg));
  DS_TRY(matmul(ctx, w.wk, x_norm, reshape(k, {Hkv * D, n})));
  DS_TRY(matmul(ctx, w.wv, x_norm, reshape(v, {Hkv * D, n})));

  // Split QG per head: q_h = QG[h, 0:D], gate_h = QG[h, D:2D].
  DS_ASSIGN_OR_RETURN(TensorView q, S.f32({D, H, n}));
  DS_ASSIGN_OR_RETURN(TensorView gate, S.f32({D, H, n}));
  TensorView qg_heads = qg;
  qg_heads.n_dims = 3;
  qg_heads.ne = {D, H, n, 1};
  qg_heads.nb = {4, 2 * D * 4, 2 * H * D * 4, 2 * H * D * 4 * n};
  TensorView gate_heads = qg_heads;
  gate_heads.data = qg.as<float>() + D;
  DS_TRY(copy(ctx, qg_heads, q));
  DS_TRY(copy(ctx, gate_heads, gate));

  DS_TRY(rms_norm(ctx, q, w.q_norm, c.rms_eps, q));  // per head over D
  DS_TRY(rms_norm(ctx, k, w.k_norm, c.rms_eps, k));
  DS_TRY(rope_neox(ctx, q, c.n_rot, c.rope_base, call.pos0));
  DS_TRY(rope_neox(ctx, k, c.n_rot, c.rope_base, call.pos0));
  call.dump("attn.q", q);
  call.dump("attn.k", k);
  call.dump("attn.v", v);

  // Append K and V for positions [pos0, pos0 + n) to the chunked cache.
  SequenceState& st = call.state;
  const int64_t chunk = st.layout().kv_chunk_tokens;
  for (int64_t t0 = 0; t0 < n;) {
    const int64_t p = call.pos0 + t0;
    const int64_t ci = p / chunk, off = p % chunk, len = std::min(n - t0, chunk - off);
    TensorView kc = st.k_chunk(attn_index, ci), vc = st.v_chunk(attn_index, ci);
    const int64_t row = Hkv * D;
    const int64_t row_bytes = row * dtype_block_bytes(kc.dtype);  // F32 or F16 cache
    TensorView kdst = TensorView::contiguous(kc.as<uint8_t>() + off * row_bytes, kc.dtype, {row, len}, kc.device);
    TensorView vdst = TensorView::contiguous(vc.as<uint8_t>() + off * row_bytes, vc.dtype, {row, len}, vc.device);
    DS_TRY(copy(ctx, TensorView::contiguous(k.as<float>() + t0 * row, DType::F32, {row, len}, k.device), kdst));
    DS_TRY(copy(ctx, TensorView::contiguous(v.as<float>() + t0 * row, DType::F32, {row, len}, v.device), vdst));
    t0 += len;
  }
  const int64_t n_kv = call.pos0 + n;
  const int64_t n_chunks = (n_kv + chunk - 1) / chunk;
  std::vector<TensorView> kcs, vcs;
  kcs.reserve(static_cast<size_t>(n_chunks));
  vcs.reserve(static_cast<size_t>(n_chunks));
  for (int64_t ci = 0; ci < n_chunks; ++ci) {
    kcs.push_back(st.k_chunk(attn_index, ci));
    vcs.push_back(st.v_chunk(attn_index, ci));
  }

  // o = softmax(q k^T / sqrt(D) + causal) v, then o *= sigmoid(gate).
  DS_ASSIGN_OR_RETURN(TensorView o, S.f32({D, H, n}));
  DS_TRY(attention(ctx, q, kcs, vcs, n_kv, call.pos0, 1.0f / std::sqrt(static_cast<float>(D)), o));
  DS_TRY(mul_sigmoid(ctx, o, gate, o));
  call.dump("attn.gated", o);
  DS_TRY(matmul(ctx, w.wo, reshape(o, {H * D, n}), out));
  return Status::ok();
}

}  // namespace ds
