// Mixture-of-experts routing and expert FFNs (model spec section 4, FFN).
//
// moe_route: per token, p = softmax(logits) over all experts; the k largest (ties: lower index
//   first) are selected and their weights renormalized: w = p[sel] / max(sum p[sel], 6.1e-5).
//   logits [n_tokens, n_expert] F32 -> ids [n_tokens, k] I32, weights [n_tokens, k] F32.
//
// moe_ffn: y_t = sum_j w_tj * down_e(silu(gate_e x_t) * up_e x_t), e = ids[t, j].
//   x [n_tokens, E] F32; y [n_tokens, E] F32 (overwritten, must not alias x)
//   experts: gate/up {E, F, n_expert} and down {F, E, n_expert}; or gate_up {E, 2F, n_expert} (first F
//   rows gate) with gate/up empty (null data). Tokens are gathered per expert so each expert's
//   weights are read once per call, whatever the number of tokens routed to it (on CUDA, once per 32
//   of its tokens). The CPU refuses ids outside [0, n_expert); on CUDA, where ids stay on the device,
//   such slots are unused (they add nothing), except with F32 experts, which refuse ids >= n_expert.
#pragma once

#include "core/status.h"
#include "core/tensor.h"
#include "ops/op_context.h"

namespace ds {

constexpr float kMoeWeightSumFloor = 6.1e-5f;

struct MoeExperts {
  TensorView gate;     // {E, F, n_expert}
  TensorView up;       // {E, F, n_expert}
  TensorView gate_up;  // {E, 2F, n_expert} (alternative to gate + up)
  TensorView down;     // {F, E, n_expert}
};

Status moe_route(const OpContext& ctx, const TensorView& logits, int64_t k, const TensorView& ids,
                 const TensorView& weights);
Status moe_ffn(const OpContext& ctx, const TensorView& x, const MoeExperts& experts, const TensorView& ids,
               const TensorView& weights, const TensorView& y);

// The checks of moe_ffn's contract, shared with its CUDA forms (each error names `op`):
//  - check_moe_io: x, y F32 contiguous of one shape [n_embd, n_tokens], y not aliasing x; ids I32 and
//    weights F32 contiguous [k, n_tokens];
//  - check_moe_experts: down {F, n_embd, n_expert} and gate_up {n_embd, 2F, n_expert} or gate and up
//    {n_embd, F, n_expert}, rows not overlapping (F and n_expert taken from down).
Status check_moe_io(const char* op, const OpContext& ctx, const TensorView& x, const TensorView& ids,
                    const TensorView& weights, const TensorView& y, int64_t k);
Status check_moe_experts(const char* op, const OpContext& ctx, const MoeExperts& experts, int64_t n_embd);

}  // namespace ds
