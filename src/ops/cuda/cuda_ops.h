// Declarations of the CUDA backend's op entry points. Compiles without CUDA: op dispatchers call
// these only when DS_HAVE_CUDA is defined and the context's device is CUDA. Each has the same
// contract as the public op of the same name (see the op headers).
#pragma once

#include <cstdint>
#include <span>

#include "core/status.h"
#include "core/tensor.h"
#include "ops/delta_net.h"
#include "ops/moe.h"
#include "ops/op_context.h"

namespace ds::cuda {

Status matmul(const OpContext& ctx, const TensorView& w, const TensorView& x, const TensorView& y);
Status get_rows(const OpContext& ctx, const TensorView& table, const TensorView& ids, const TensorView& y);
Status rms_norm(const OpContext& ctx, const TensorView& x, const TensorView& w, float eps, const TensorView& y);
Status l2_norm(const OpContext& ctx, const TensorView& x, float eps, const TensorView& y);
Status rope_neox(const OpContext& ctx, const TensorView& x, int64_t n_rot, float base, int64_t pos0);
Status attention(const OpContext& ctx, const TensorView& q, std::span<const TensorView> k_chunks,
                 std::span<const TensorView> v_chunks, int64_t n_kv, int64_t pos0, float scale,
                 const TensorView& o);
Status delta_net_gates(const OpContext& ctx, const TensorView& alpha, const TensorView& b,
                       const TensorView& dt_bias, const TensorView& ssm_a, const TensorView& g,
                       const TensorView& beta);
Status delta_net(const OpContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                 const TensorView& g, const TensorView& beta, const TensorView& state,
                 const TensorView& out, DeltaNetMode mode);
Status conv1d_causal(const OpContext& ctx, const TensorView& x, const TensorView& w,
                     const TensorView& state, const TensorView& y);
Status add(const OpContext& ctx, const TensorView& a, const TensorView& b, const TensorView& y);
Status mul(const OpContext& ctx, const TensorView& a, const TensorView& b, const TensorView& y);
Status silu(const OpContext& ctx, const TensorView& x, const TensorView& y);
Status sigmoid(const OpContext& ctx, const TensorView& x, const TensorView& y);
Status swiglu(const OpContext& ctx, const TensorView& gate, const TensorView& up, const TensorView& y);
Status mul_sigmoid(const OpContext& ctx, const TensorView& x, const TensorView& gate, const TensorView& y);
Status copy(const OpContext& ctx, const TensorView& src, const TensorView& dst);
Status moe_ffn(const OpContext& ctx, const TensorView& x, const MoeExperts& experts, const TensorView& ids,
               const TensorView& weights, const TensorView& y);
Status moe_route(const OpContext& ctx, const TensorView& logits, int64_t k, const TensorView& ids,
                 const TensorView& weights);

}  // namespace ds::cuda
