// Gated DeltaNet (model spec section 4, steps 3 and 8).
//
// delta_net_gates: g = ssm_a * softplus(alpha + dt_bias), beta = sigmoid(b)
//   alpha, b [n_tokens, nv] F32; dt_bias, ssm_a [nv] F32; g, beta [n_tokens, nv] F32 (overwritten)
//
// delta_net: the gated delta rule over n_tokens tokens, updating the state in place.
//   q, k  [n_tokens, nk, dk] F32 contiguous (already L2-normalized)
//   v     [n_tokens, nv, dv] F32: rows of dv contiguous, heads (nb[1]) and tokens (nb[2]) at any stride
//         that is a multiple of 4 bytes, e.g. the v columns of each token's conv output row
//   g, beta [n_tokens, nv] F32; v-head j reads q/k head j % nk (nv % nk == 0)
//   state [nv, dk, dv] (ne {dv, dk, nv}) F32, read and written
//   out   [n_tokens, nv, dv] F32 contiguous, overwritten; must not overlap v
// per token and v-head:  S = exp(g) S;  d = beta (v - S^T k);  S = S + k d^T;  o = S^T q / sqrt(dk)
// kRecurrent runs that loop; kChunked runs the equivalent chunked form (64-token chunks, matrix
// products inside a chunk) for prefill; kAuto picks chunked for n_tokens >= 16. Both give the same
// outputs and final state up to float rounding, and each is deterministic for a given n_tokens.
//
// delta_net_prep: the layer's prologue between its input projections and the delta rule, as one op:
//   delta_net_gates(alpha, b, dt_bias, ssm_a -> g, beta);
//   conv1d_causal_silu(mixed, conv_w, conv_state -> conv)            (conv_state updated);
//   l2_norm(delta_net_conv_heads(conv, 0, dk, nk), eps -> q);
//   l2_norm(delta_net_conv_heads(conv, nk dk, dk, nk), eps -> k).
//   mixed, conv [n_tokens, C] F32 contiguous, C >= 2 nk dk (the rest are the v channels, left in conv
//   for delta_net to read in place); conv_w [C, K], conv_state [K-1, C] (see ops/conv1d.h);
//   q, k [n_tokens, nk, dk] F32 contiguous (nk, dk are taken from q); alpha, b, g, beta [n_tokens, nv];
//   dt_bias, ssm_a [nv]. Outputs are overwritten and must not overlap each other or the inputs.
// The CPU runs exactly those four ops (bit-equal to them). CUDA runs one kernel for one token (decode:
// four launches fewer per layer) and the four ops' kernels otherwise; the values agree with the chain
// up to float rounding (the q/k sums of squares are added in another order).
#pragma once

#include "core/status.h"
#include "core/tensor.h"
#include "ops/op_context.h"

namespace ds {

enum class DeltaNetMode { kAuto, kRecurrent, kChunked };

Status delta_net_gates(const OpContext& ctx, const TensorView& alpha, const TensorView& b,
                       const TensorView& dt_bias, const TensorView& ssm_a, const TensorView& g,
                       const TensorView& beta);

Status delta_net(const OpContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                 const TensorView& g, const TensorView& beta, const TensorView& state,
                 const TensorView& out, DeltaNetMode mode = DeltaNetMode::kAuto);
// delta_net's argument checks alone (for fused forms that run it inside another kernel).
Status delta_net_check(const OpContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& g, const TensorView& beta, const TensorView& state, const TensorView& out);

struct DeltaNetPrep {
  // inputs
  TensorView mixed, conv_w, alpha, b, dt_bias, ssm_a;
  TensorView conv_state;  // read and updated
  float eps = 0.0f;       // of the q / k L2 norms
  // outputs
  TensorView conv, q, k, g, beta;
};
Status delta_net_prep(const OpContext& ctx, const DeltaNetPrep& p);
// delta_net_prep's argument checks alone (for fused forms that run it inside another kernel).
Status delta_net_prep_check(const OpContext& ctx, const DeltaNetPrep& p);

// Heads [n, n_head, head_dim] starting at column c0 of every row of the contiguous [n, row] F32 tensor
// t: a strided view (rows of head_dim contiguous, heads back to back, tokens at t's row stride), e.g.
// the q, k or v heads of the conv output. c0 + n_head head_dim must not exceed t's row.
TensorView delta_net_conv_heads(const TensorView& t, int64_t c0, int64_t head_dim, int64_t n_head);

}  // namespace ds
