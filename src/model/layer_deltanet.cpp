// Gated DeltaNet layer forward (model spec section 4): projections, gates, causal conv with carried
// state, SiLU, q/k L2 norm, the delta rule on the SSM state, gated RMSNorm, output projection.
// Non-obvious choice: q, k and v are never copied out of the conv output: the L2 norms read q and k
// as strided views of its rows (writing contiguous q, k) and the delta rule reads v in place.
#include "model/model_internal.h"
#include "ops/conv1d.h"
#include "ops/delta_net.h"
#include "ops/matmul.h"
#include "ops/rms_norm.h"

namespace ds {
namespace {

// Heads [n, n_head, head_dim] starting at column c0 of every row of the contiguous [n, row] tensor t:
// a strided view (rows of head_dim contiguous, heads back to back, tokens at t's row stride).
TensorView head_columns(const TensorView& t, int64_t c0, int64_t head_dim, int64_t n_head) {
  TensorView r = columns(t, c0, head_dim * n_head);
  r.n_dims = 3;
  r.ne = {head_dim, n_head, t.ne[1], 1};
  r.nb = {4, 4 * head_dim, t.nb[1], t.nb[1] * t.ne[1]};
  return r;
}

}  // namespace

Status deltanet_forward(const LayerCall& call, const DeltaNetWeights& w, const TensorView& x_norm,
                        const TensorView& out) {
  const ModelConfig& c = call.config;
  const OpContext& ctx = call.ctx;
  const int64_t n = call.n_tokens, dk = c.ssm_d_state, dv = c.ssm_d_state;
  const int64_t nk = c.ssm_n_group, nv = c.ssm_n_v_head, conv_dim = c.conv_dim(), key_dim = c.key_dim();
  ModelScratch& S = call.scratch;

  // mixed = attn_qkv x [n, conv_dim];  z = attn_gate x [n, value_dim]
  // b = ssm_beta x, a = ssm_alpha x [n, nv]: all four projections of x_norm in one call.
  DS_ASSIGN_OR_RETURN(auto proj, S.f32_outputs({conv_dim, c.value_dim(), nv, nv}, n));
  const TensorView mixed = proj[0], z = proj[1], b = proj[2], a = proj[3];
  {
    const TensorView ws[] = {w.wqkv, w.wgate, w.wbeta, w.walpha};
    const TensorView ys[] = {mixed, z, b, a};
    DS_TRY(matmul_many(ctx, ws, x_norm, ys));
  }

  // beta = sigmoid(b);  g = ssm_a * softplus(a + dt_bias)   [n, nv]
  DS_ASSIGN_OR_RETURN(TensorView beta, S.f32({nv, n}));
  DS_ASSIGN_OR_RETURN(TensorView g, S.f32({nv, n}));
  DS_TRY(delta_net_gates(ctx, a, b, w.dt_bias, w.ssm_a, g, beta));
  call.dump("deltanet.beta", beta);
  call.dump("deltanet.g", g);

  // c = silu(causal_conv(mixed)) with the layer's conv state
  DS_ASSIGN_OR_RETURN(TensorView conv, S.f32({conv_dim, n}));
  DS_TRY(conv1d_causal_silu(ctx, mixed, w.conv1d, call.state.conv_state(call.il), conv));
  call.dump("deltanet.conv", conv);

  // c = [q (nk*dk) ; k (nk*dk) ; v (nv*dv)] per token; q, k L2-normalized per head.
  DS_ASSIGN_OR_RETURN(TensorView q, S.f32({dk, nk, n}));
  DS_ASSIGN_OR_RETURN(TensorView k, S.f32({dk, nk, n}));
  DS_TRY(l2_norm(ctx, head_columns(conv, 0, dk, nk), c.rms_eps, q));
  DS_TRY(l2_norm(ctx, head_columns(conv, key_dim, dk, nk), c.rms_eps, k));
  const TensorView v = head_columns(conv, 2 * key_dim, dv, nv);

  // Delta rule on the SSM state; o [n, nv, dv].
  DS_ASSIGN_OR_RETURN(TensorView o, S.f32({dv, nv, n}));
  DS_TRY(delta_net(ctx, q, k, v, g, beta, call.state.ssm_state(call.il), o));
  call.dump("deltanet.o", o);

  // y = RMSNorm(o; ssm_norm) * silu(z), per v-head over dv; then ssm_out.
  DS_TRY(rms_norm_gated(ctx, o, w.norm, reshape(z, {dv, nv, n}), c.rms_eps, o));
  call.dump("deltanet.y", o);
  DS_TRY(matmul(ctx, w.wout, reshape(o, {c.value_dim(), n}), out));
  return Status::ok();
}

}  // namespace ds
