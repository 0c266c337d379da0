// Full-attention layer forward (model spec section 4): projections, per-head q/k RMSNorm, partial
// NeoX RoPE, KV written into the sequence's chunks, causal GQA attention, sigmoid output gate,
// output projection. Non-obvious choice: on CUDA the position, KV append and attention go through
// the device-side block table and the position in device memory (attention_prep, which also does the
// q/k norms and RoPE in one kernel, or rope_neox_at and kv_append; then attention_paged), so the step
// holds no host value that changes from token to token and can be replayed as a captured graph; the
// CPU path walks the chunks on the host. The q and gate halves of each head's projection are read as
// strided views of it (no split copies). For one token on CUDA one kernel does the prep, the attention,
// the output gate and the output product's int8 activations (attention_decode_q8; where it does not fit,
// attention_prep then attention_paged_gated_q8).
#include <algorithm>
#include <cmath>

#include "core/check.h"
#if DS_HAVE_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

#include "model/model_internal.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/rms_norm.h"
#include "ops/rope.h"

namespace ds {
namespace {

// o *= sigmoid(gate); out = wo o.   o [n, H, D]; gate [n, H, D] (a strided view of QG); out [n, E]
Status attention_output(const LayerCall& call, const AttentionWeights& w, const TensorView& gate, const TensorView& o,
                        const TensorView& out) {
  DS_TRY(mul_sigmoid(call.ctx, o, gate, o));
  call.dump("attn.gated", o);
  DS_TRY(matmul(call.ctx, w.wo, reshape(o, {call.config.n_head * call.config.head_dim, call.n_tokens}), out));
  return Status::ok();
}

}  // namespace

Status attention_forward(const LayerCall& call, const AttentionWeights& w, int64_t attn_index,
                         const TensorView& x_norm, const TensorView& out) {
  const ModelConfig& c = call.config;
  const OpContext& ctx = call.ctx;
  const int64_t n = call.n_tokens, D = c.head_dim, H = c.n_head, Hkv = c.n_head_kv;
  ModelScratch& S = call.scratch;

  DS_ASSIGN_OR_RETURN(auto proj, S.f32_outputs({2 * H * D, Hkv * D, Hkv * D}, n));
  const TensorView qg = proj[0];  // [n, H, (q_h; gate_h)]
  const TensorView k = reshape(proj[1], {D, Hkv, n}), v = reshape(proj[2], {D, Hkv, n});
  {
    const TensorView ws[] = {w.wq, w.wk, w.wv};
    const TensorView ys[] = {qg, reshape(k, {Hkv * D, n}), reshape(v, {Hkv * D, n})};
    DS_TRY(layer_matmul_many(call, ws, x_norm, ys));
  }

  // QG per head: q_h = QG[h, 0:D], gate_h = QG[h, D:2D], read as strided views (no split copies):
  // q_h is RMS-normalized into q, gate_h is read in place by the output gate.
  const TensorView q_heads = row_heads(qg, 0, D, H, 2 * D);
  const TensorView gate = row_heads(qg, D, D, H, 2 * D);

  DS_ASSIGN_OR_RETURN(TensorView q, S.f32({D, H, n}));
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  DS_ASSIGN_OR_RETURN(TensorView o, S.f32({D, H, n}));
  SequenceState& st = call.state;
#if DS_HAVE_CUDA
  if (ctx.device.kind == DeviceKind::kCuda) {
    DS_CHECK(call.d_pos != nullptr && call.max_kv >= call.pos0 + n, "attention on CUDA: no device position");
    const KvPool& pool = *st.pool();
    cuda::KvTable kv;
    kv.slot_base = st.device_slot_table();
    kv.k_offset = pool.k_offset(attn_index);
    kv.v_offset = pool.v_offset(attn_index);
    kv.chunk_tokens = st.layout().kv_chunk_tokens;
    kv.n_head_kv = Hkv;
    kv.head_dim = D;
    kv.dtype = st.layout().kv_dtype;
    DS_CHECK(kv.slot_base != nullptr, "attention on CUDA: the state has no device block table");
    // One token: the output gate and the o product's int8 activations come out of the kernel that writes
    // o (same bits as attention_paged, mul_sigmoid and the product's own quantizer); where it fits, that
    // kernel also does the prep (the bits of attention_prep then attention_paged_gated_q8).
    const int64_t HD = H * D;
    const bool q8_out = call.x_q8.data != nullptr && cuda::attention_gated_q8_applies(D);
    TensorView o_q8{};
    if (q8_out) {
      DS_ASSIGN_OR_RETURN(o_q8, S.f32({(cuda::norm_q8_act_bytes(HD, n) + 3) / 4}));
    }
    TensorView k_out = k;  // the normalized, rotated k: in place, or from the fused kernel
    if (q8_out && cuda::attention_decode_q8_applies(kv.dtype, D, H, Hkv, n)) {
      DS_ASSIGN_OR_RETURN(k_out, S.f32({D, Hkv, n}));
      DS_TRY(cuda::attention_decode_q8(ctx, q_heads, w.q_norm, k, w.k_norm, v, c.rms_eps, c.n_rot, c.rope_base, kv,
                                       call.d_pos, call.max_kv, scale, gate, q, k_out, o, o_q8));
    } else {
      if (cuda::attention_prep_applies(D)) {
        // q/k norms, RoPE at the device position and the KV append in one kernel (same bits as below).
        DS_TRY(cuda::attention_prep(ctx, q_heads, w.q_norm, k, w.k_norm, v, c.rms_eps, c.n_rot, c.rope_base, kv,
                                    call.d_pos, q));
      } else {
        DS_TRY(rms_norm(ctx, q_heads, w.q_norm, c.rms_eps, q));  // per head over D
        DS_TRY(rms_norm(ctx, k, w.k_norm, c.rms_eps, k));
        DS_TRY(cuda::rope_neox_at(ctx, q, c.n_rot, c.rope_base, call.d_pos));
        DS_TRY(cuda::rope_neox_at(ctx, k, c.n_rot, c.rope_base, call.d_pos));
        DS_TRY(cuda::kv_append(ctx, k, v, kv, call.d_pos));
      }
      if (q8_out) {
        DS_TRY(cuda::attention_paged_gated_q8(ctx, q, kv, call.d_pos, call.max_kv, scale, gate, o, o_q8));
      } else {
        DS_TRY(cuda::attention_paged(ctx, q, kv, call.d_pos, call.max_kv, scale, o));
      }
    }
    call.dump("attn.q", q);
    call.dump("attn.k", k_out);
    call.dump("attn.v", v);
    if (q8_out) {
      call.dump("attn.gated", o);
      return cuda::matmul_q8(ctx, w.wo, reshape(o, {HD, n}), o_q8, out);
    }
    return attention_output(call, w, gate, o, out);
  }
#endif
  DS_TRY(rms_norm(ctx, q_heads, w.q_norm, c.rms_eps, q));  // per head over D
  DS_TRY(rms_norm(ctx, k, w.k_norm, c.rms_eps, k));
  DS_TRY(rope_neox(ctx, q, c.n_rot, c.rope_base, call.pos0));
  DS_TRY(rope_neox(ctx, k, c.n_rot, c.rope_base, call.pos0));
  call.dump("attn.q", q);
  call.dump("attn.k", k);
  call.dump("attn.v", v);

  // Append K and V for positions [pos0, pos0 + n) to the chunked cache (converted to its dtype by copy;
  // the attention below reads every position back from the cache, these included).
  const int64_t chunk = st.layout().kv_chunk_tokens;
  for (int64_t t0 = 0; t0 < n;) {
    const int64_t p = call.pos0 + t0;
    const int64_t ci = p / chunk, off = p % chunk, len = std::min(n - t0, chunk - off);
    TensorView kc = st.k_chunk(attn_index, ci), vc = st.v_chunk(attn_index, ci);
    const int64_t row = Hkv * D;
    // A position's Hkv head rows in bytes (Q8_0, Q4_0: D / 32 blocks a head row).
    const int64_t row_bytes = st.layout().kv_row_bytes();
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

  // o = softmax(q k^T / sqrt(D) + causal) v
  DS_TRY(attention(ctx, q, kcs, vcs, n_kv, call.pos0, scale, o));
  return attention_output(call, w, gate, o, out);
}

}  // namespace ds
