// Gated DeltaNet layer forward (model spec section 4): projections, gates, causal conv with carried
// state, SiLU, q/k L2 norm (those four as one op, delta_net_prep), the delta rule on the SSM state,
// gated RMSNorm, output projection (on CUDA for one token the delta rule and the gated norm are one
// kernel, delta_net_gated_q8, where the shapes allow, and with the prologue as well on GPUs with
// thread-block clusters, delta_net_step_q8).
// Non-obvious choice: q, k and v are never copied out of the conv output: the L2 norms read q and k
// as strided views of its rows (writing contiguous q, k) and the delta rule reads v in place.
#include "core/check.h"
#include "model/model_internal.h"
#include "ops/delta_net.h"
#include "ops/matmul.h"
#include "ops/rms_norm.h"
#if DS_HAVE_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

namespace ds {
namespace {

// The prep op's arguments for n tokens' projections, its outputs (beta, g, conv, q, k) in scratch.
Result<DeltaNetPrep> prep_args(const LayerCall& call, const DeltaNetWeights& w, const TensorView& mixed,
                               const TensorView& a, const TensorView& b) {
  const ModelConfig& c = call.config;
  const int64_t n = call.n_tokens, dk = c.ssm_d_state, nk = c.ssm_n_group, nv = c.ssm_n_v_head;
  ModelScratch& S = call.scratch;
  DeltaNetPrep p;
  DS_ASSIGN_OR_RETURN(p.beta, S.f32({nv, n}));
  DS_ASSIGN_OR_RETURN(p.g, S.f32({nv, n}));
  DS_ASSIGN_OR_RETURN(p.conv, S.f32({c.conv_dim(), n}));
  DS_ASSIGN_OR_RETURN(p.q, S.f32({dk, nk, n}));
  DS_ASSIGN_OR_RETURN(p.k, S.f32({dk, nk, n}));
  p.mixed = mixed;
  p.conv_w = w.conv1d;
  p.alpha = a;
  p.b = b;
  p.dt_bias = w.dt_bias;
  p.ssm_a = w.ssm_a;
  p.conv_state = call.state.conv_state(call.il);
  p.eps = c.rms_eps;
  return p;
}

struct DeltaNetStash {
  TensorView mixed, b, a;  // the first call.n_tokens rows of each
};

DeltaNetStash stash_views(const LayerCall& call) {
  const ModelConfig& c = call.config;
  const int64_t n = call.n_tokens, nv = c.ssm_n_v_head, M = kMaxVerifyTokens;  // rows per part
  const Device d = call.scratch.device;
  float* base = call.stash;
  return {TensorView::contiguous(base, DType::F32, {c.conv_dim(), n}, d),
          TensorView::contiguous(base + c.conv_dim() * M, DType::F32, {nv, n}, d),
          TensorView::contiguous(base + (c.conv_dim() + nv) * M, DType::F32, {nv, n}, d)};
}

}  // namespace

int64_t deltanet_stash_floats(const ModelConfig& c) {
  return (c.conv_dim() + 2 * c.ssm_n_v_head) * kMaxVerifyTokens;
}

Status deltanet_replay_state(const LayerCall& call, const DeltaNetWeights& w) {
  const ModelConfig& c = call.config;
  const int64_t n = call.n_tokens, dv = c.ssm_d_state, nv = c.ssm_n_v_head;
  DS_CHECK(call.stash != nullptr && n >= 1 && n <= kMaxVerifyTokens, "DeltaNet replay of {} tokens at layer {}", n,
           call.il);
  const DeltaNetStash st = stash_views(call);
  DS_ASSIGN_OR_RETURN(const DeltaNetPrep p, prep_args(call, w, st.mixed, st.a, st.b));
  DS_TRY(delta_net_prep(call.ctx, p));
  DS_ASSIGN_OR_RETURN(TensorView o, call.scratch.f32({dv, nv, n}));
  return delta_net(call.ctx, p.q, p.k, delta_net_conv_heads(p.conv, 2 * c.key_dim(), dv, nv), p.g, p.beta,
                   call.state.ssm_state(call.il), o);
}

Status deltanet_forward(const LayerCall& call, const DeltaNetWeights& w, const TensorView& x_norm,
                        const TensorView& out) {
  const ModelConfig& c = call.config;
  const OpContext& ctx = call.ctx;
  const int64_t n = call.n_tokens, dv = c.ssm_d_state;
  const int64_t nv = c.ssm_n_v_head, conv_dim = c.conv_dim(), key_dim = c.key_dim();
  ModelScratch& S = call.scratch;

  // mixed = attn_qkv x [n, conv_dim];  z = attn_gate x [n, value_dim]
  // b = ssm_beta x, a = ssm_alpha x [n, nv]: all four projections of x_norm in one call.
  // A speculative verify writes mixed, b and a straight into the layer's stash (the inputs that
  // rebuild its recurrent state, deltanet_replay_state).
  DS_ASSIGN_OR_RETURN(auto proj, S.f32_outputs({conv_dim, c.value_dim(), nv, nv}, n));
  const DeltaNetStash st = call.stash != nullptr ? stash_views(call) : DeltaNetStash{proj[0], proj[2], proj[3]};
  const TensorView mixed = st.mixed, z = proj[1], b = st.b, a = st.a;
  {
    const TensorView ws[] = {w.wqkv, w.wgate, w.wbeta, w.walpha};
    const TensorView ys[] = {mixed, z, b, a};
    DS_TRY(layer_matmul_many(call, ws, x_norm, ys));
  }

  // One op (on CUDA for a decode step one kernel, or the front of the step kernel below), [n, nv] /
  // [n, conv_dim] / [n, nk, dk]:
  //   beta = sigmoid(b);  g = ssm_a * softplus(a + dt_bias)
  //   conv = silu(causal_conv(mixed)) with the layer's conv state
  //   conv = [q (nk*dk) ; k (nk*dk) ; v (nv*dv)] per token; q, k L2-normalized per head.
  DS_ASSIGN_OR_RETURN(const DeltaNetPrep p, prep_args(call, w, mixed, a, b));
  const TensorView &q = p.q, &k = p.k, &conv = p.conv, &g = p.g, &beta = p.beta;
  const TensorView v = delta_net_conv_heads(conv, 2 * key_dim, dv, nv);

  // Delta rule on the SSM state; o [n, nv, dv].
  DS_ASSIGN_OR_RETURN(TensorView o, S.f32({dv, nv, n}));
  TensorView ssm_state = call.state.ssm_state(call.il);

  // y = RMSNorm(o; ssm_norm) * silu(z), per v-head over dv; then ssm_out.
  // With the block's input in int8 form (CUDA, one token) the output norm writes y's int8 activations
  // for ssm_out as well, inside the delta-rule kernel where the shapes allow, and on GPUs with
  // thread-block clusters the prologue runs in that kernel too (delta_net_step_q8).
  [[maybe_unused]] bool q8_out = false;
  bool fused_step = false;
#if DS_HAVE_CUDA
  q8_out = call.x_q8.data != nullptr && cuda::norm_q8_applies(dv);
  fused_step = q8_out && cuda::delta_net_step_q8_applies(p, ssm_state, o);
#endif
  const auto dump_prep = [&] {
    call.dump("deltanet.beta", beta);
    call.dump("deltanet.g", g);
    call.dump("deltanet.conv", conv);
  };
  if (!fused_step) {
    DS_TRY(delta_net_prep(ctx, p));
    dump_prep();
  }
#if DS_HAVE_CUDA
  if (q8_out) {
    DS_ASSIGN_OR_RETURN(TensorView o_q8, S.f32({(cuda::norm_q8_act_bytes(dv, nv * n) + 3) / 4}));
    DS_ASSIGN_OR_RETURN(TensorView y, S.f32({dv, nv, n}));
    const TensorView z3 = reshape(z, {dv, nv, n});
    if (fused_step) {
      DS_TRY(cuda::delta_net_step_q8(ctx, p, ssm_state, o, w.norm, z3, c.rms_eps, y, o_q8));
      dump_prep();
      call.dump("deltanet.o", o);
    } else if (cuda::delta_net_gated_q8_applies(q, v, ssm_state, o)) {
      DS_TRY(cuda::delta_net_gated_q8(ctx, q, k, v, g, beta, ssm_state, o, w.norm, z3, c.rms_eps, y, o_q8));
      call.dump("deltanet.o", o);
    } else {
      DS_TRY(delta_net(ctx, q, k, v, g, beta, ssm_state, o));
      call.dump("deltanet.o", o);
      DS_TRY(cuda::rms_norm_gated_q8(ctx, o, w.norm, z3, c.rms_eps, y, o_q8));
    }
    call.dump("deltanet.y", y);
    return cuda::matmul_q8(ctx, w.wout, reshape(y, {c.value_dim(), n}), o_q8, out);
  }
#endif
  DS_TRY(delta_net(ctx, q, k, v, g, beta, ssm_state, o));
  call.dump("deltanet.o", o);
  DS_TRY(rms_norm_gated(ctx, o, w.norm, reshape(z, {dv, nv, n}), c.rms_eps, o));
  call.dump("deltanet.y", o);
  DS_TRY(matmul(ctx, w.wout, reshape(o, {c.value_dim(), n}), out));
  return Status::ok();
}

}  // namespace ds
