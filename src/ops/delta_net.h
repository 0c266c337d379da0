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

}  // namespace ds
