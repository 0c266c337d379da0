// FFN forwards: dense SwiGLU (qwen35) and the MoE block with its sigmoid-gated shared expert
// (qwen35moe). Dense and MoE models differ only here. Non-obvious choice: on CUDA, steps with few
// (token, expert) pairs run the whole MoE block, with the residual add and norm before it, in
// moe_block_decode_add_norm (moe_ffn_forward_add_norm; its router kernel computes the norm) or, for
// types it does not take, moe_ffn_gathered; both read the routing from device memory (no host round
// trip, so a decode step stays capturable as a graph). Larger batches run moe_ffn, which on CUDA groups
// the tokens per expert on the device (moe_ffn_grouped), so each expert's weights are read once per tile.
#include "model/model_internal.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/moe.h"
#if DS_HAVE_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

namespace ds {

Status dense_ffn_forward(const LayerCall& call, const DenseFfnWeights& w, const TensorView& x_norm,
                         const TensorView& out) {
  const int64_t n = call.n_tokens, n_ff = call.config.n_ff;
  DS_ASSIGN_OR_RETURN(auto gu, call.scratch.f32_outputs({n_ff, n_ff}, n));
  const TensorView g = gu[0], u = gu[1];
  const TensorView ws[] = {w.gate, w.up};
  const TensorView ys[] = {g, u};
  DS_TRY(layer_matmul_many(call, ws, x_norm, ys));
  DS_TRY(matmul_swiglu(call.ctx, w.down, g, u, out));  // down (silu(gate x) * (up x)); g is scratch
  return Status::ok();
}

#if DS_HAVE_CUDA
namespace {

cuda::MoeBlockWeights block_weights(const MoeFfnWeights& w) {
  return cuda::MoeBlockWeights{w.router,     MoeExperts{w.gate_exps, w.up_exps, w.gate_up_exps, w.down_exps},
                               w.shexp_gate, w.gate_shexp,
                               w.up_shexp,   w.down_shexp};
}

}  // namespace
#endif

bool moe_ffn_fuses_norm(const LayerCall& call, const MoeFfnWeights& w) {
#if DS_HAVE_CUDA
  // CUDA, few (token, expert) pairs, types moe_block_decode takes.
  const int64_t n = call.n_tokens, k = call.config.n_expert_used;
  return call.ctx.device.kind == DeviceKind::kCuda && n * k <= cuda::kMoeGatheredMaxSlots &&
         cuda::moe_block_decode_check(block_weights(w), n, k).is_ok();
#else
  (void)call, (void)w;
  return false;
#endif
}

Status moe_ffn_forward_add_norm(const LayerCall& call, const MoeFfnWeights& w, const TensorView& x,
                                const TensorView& delta, const TensorView& norm, const TensorView& out) {
#if DS_HAVE_CUDA
  // moe_ffn_fuses_norm held; the op checks everything again and refuses what it does not take.
  const int64_t n = call.n_tokens, k = call.config.n_expert_used;
  DS_ASSIGN_OR_RETURN(TensorView ids, call.scratch.i32({k, n}));
  DS_ASSIGN_OR_RETURN(TensorView weights, call.scratch.f32({k, n}));
  DS_TRY(cuda::moe_block_decode_add_norm(call.ctx, cuda::MoeBlockAddNorm{x, delta, norm, call.config.rms_eps},
                                         block_weights(w), k, ids, weights, out));
  call.dump("moe.weights", weights);
  return Status::ok();
#else
  (void)w, (void)x, (void)delta, (void)norm, (void)out;
  return internal_error("moe_ffn_forward_add_norm: layer {}: no CUDA backend", call.il);
#endif
}

Status moe_ffn_forward(const LayerCall& call, const MoeFfnWeights& w, const TensorView& x_norm,
                       const TensorView& out) {
  const ModelConfig& c = call.config;
  const OpContext& ctx = call.ctx;
  const int64_t n = call.n_tokens, k = c.n_expert_used;
  ModelScratch& S = call.scratch;

  // (Where moe_block_decode takes the block, the model calls moe_ffn_forward_add_norm instead.)
  // Routing: p = softmax(router x); top-k; w = p[sel] / max(sum p[sel], 6.1e-5).
  DS_ASSIGN_OR_RETURN(TensorView logits, S.f32({c.n_expert, n}));
  DS_ASSIGN_OR_RETURN(TensorView ids, S.i32({k, n}));
  DS_ASSIGN_OR_RETURN(TensorView weights, S.f32({k, n}));
  DS_TRY(matmul(ctx, w.router, x_norm, logits));
  DS_TRY(moe_route(ctx, logits, k, ids, weights));
  call.dump("moe.weights", weights);

  // moe = sum_j w_j down_j(silu(gate_j x) * up_j x)
  MoeExperts experts{w.gate_exps, w.up_exps, w.gate_up_exps, w.down_exps};
#if DS_HAVE_CUDA
  if (ctx.device.kind == DeviceKind::kCuda && n * k <= cuda::kMoeGatheredMaxSlots) {
    DS_TRY(cuda::moe_ffn_gathered(ctx, x_norm, experts, ids, weights, out));
  } else {
    DS_TRY(moe_ffn(ctx, x_norm, experts, ids, weights, out));
  }
#else
  DS_TRY(moe_ffn(ctx, x_norm, experts, ids, weights, out));
#endif
  call.dump("moe.routed", out);

  // Shared expert, scaled by sigmoid(shexp_gate . x) per token.
  const int64_t S_ff = c.n_ff_shexp;
  DS_ASSIGN_OR_RETURN(TensorView g, S.f32({S_ff, n}));
  DS_ASSIGN_OR_RETURN(TensorView u, S.f32({S_ff, n}));
  DS_ASSIGN_OR_RETURN(TensorView sh, S.f32({c.n_embd, n}));
  DS_ASSIGN_OR_RETURN(TensorView sg, S.f32({1, n}));
  DS_TRY(matmul(ctx, w.gate_shexp, x_norm, g));
  DS_TRY(matmul(ctx, w.up_shexp, x_norm, u));
  DS_TRY(swiglu(ctx, g, u, g));
  DS_TRY(matmul(ctx, w.down_shexp, g, sh));
  TensorView gate_w = reshape(w.shexp_gate, {c.n_embd, 1});
  DS_TRY(matmul(ctx, gate_w, x_norm, sg));
  DS_TRY(mul_sigmoid(ctx, sh, sg, sh));
  DS_TRY(add(ctx, out, sh, out));
  return Status::ok();
}

}  // namespace ds
