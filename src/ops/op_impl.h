// Internal: the validated entry points of each op's implementations, called by the dispatchers in
// ops/<op>.cpp after shape/dtype checks. ref:: is the scalar reference (ops/<op>_ref.cpp), cpu:: the
// fast CPU path (ops/cpu/<family>.cpp). Arguments satisfy the public contracts; no checks repeated.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "ops/delta_net.h"
#include "ops/moe.h"
#include "ops/op_context.h"

namespace ds::ops {

enum class Eltwise { kAdd, kMul, kSilu, kSigmoid, kSwiglu, kMulSigmoid };

#define DS_OPS_DECLARE_IMPL                                                                             \
  void matmul(const OpContext& ctx, const TensorView& w, const TensorView& x, const TensorView& y);    \
  void get_rows(const OpContext& ctx, const TensorView& table, const TensorView& ids,                  \
                const TensorView& y);                                                                  \
  void rms_norm(const OpContext& ctx, const TensorView& x, const float* w, float eps, bool l2,         \
                const TensorView& y);                                                                  \
  void rope_neox(const OpContext& ctx, const TensorView& x, int64_t n_rot, float base, int64_t pos0);  \
  void attention(const OpContext& ctx, const TensorView& q, std::span<const TensorView> k_chunks,     \
                 std::span<const TensorView> v_chunks, int64_t n_kv, int64_t pos0, float scale,       \
                 const TensorView& o);                                                                 \
  void delta_net_gates(const OpContext& ctx, const TensorView& alpha, const TensorView& b,            \
                       const float* dt_bias, const float* ssm_a, const TensorView& g,                  \
                       const TensorView& beta);                                                        \
  void delta_net_recurrent(const OpContext& ctx, const TensorView& q, const TensorView& k,            \
                           const TensorView& v, const TensorView& g, const TensorView& beta,          \
                           const TensorView& state, const TensorView& out);                           \
  void conv1d_causal(const OpContext& ctx, const TensorView& x, const TensorView& w,                  \
                     const TensorView& state, const TensorView& y);                                   \
  void eltwise(const OpContext& ctx, Eltwise kind, const TensorView& a, const TensorView& b,          \
               const TensorView& y);                                                                   \
  void moe_route(const OpContext& ctx, const TensorView& logits, int64_t k, const TensorView& ids,    \
                 const TensorView& weights);

namespace ref {
DS_OPS_DECLARE_IMPL
}  // namespace ref

namespace cpu {
DS_OPS_DECLARE_IMPL
// The chunked form of the delta rule (prefill); delta_net_recurrent above is the decode form.
void delta_net_chunked(const OpContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& g, const TensorView& beta, const TensorView& state,
                       const TensorView& out);
// Expert FFNs with every active expert's row tiles in one parallel loop per projection.
// routed[e] lists the (token * k + slot) entries sent to expert e.
void moe_ffn(const OpContext& ctx, const TensorView& x, const MoeExperts& experts,
             const std::vector<std::vector<int64_t>>& routed, int64_t k, const float* weights, const TensorView& y);
}  // namespace cpu

#undef DS_OPS_DECLARE_IMPL

}  // namespace ds::ops
