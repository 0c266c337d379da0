// Row normalizations over ne[0], for every row of an F32 tensor (so a [n_tokens, H, D] tensor with a
// [D] weight is the per-head norm).
//   rms_norm: y = x / sqrt(mean(x^2) + eps) * w,   w [ne0] F32 contiguous
//   l2_norm:  y = x / sqrt(sum(x^2) + eps)
//   rms_norm_gated: y = rms_norm(x; w) * silu(z), z with x's shape, contiguous (the DeltaNet output
//     norm; the same values as rms_norm followed by swiglu(z, y, y))
//   add_rms_norm: x += r, then y = rms_norm(x; w): the residual add of one block fused with the norm
//     that starts the next (x, r contiguous with one shape; y contiguous, aliasing neither)
// x may be a strided view: rows of ne[0] contiguous (nb[0] = 4), dims 1..3 at any stride that is a
// multiple of 4 bytes, e.g. the q columns of each token's fused qkv row, or every other head of
// interleaved [q_h; gate_h] heads. y has x's shape and is contiguous. In place (y == x) is allowed
// when x is contiguous; y must not otherwise overlap x.
#pragma once

#include "core/status.h"
#include "core/tensor.h"
#include "ops/op_context.h"

namespace ds {

Status rms_norm(const OpContext& ctx, const TensorView& x, const TensorView& w, float eps, const TensorView& y);
Status l2_norm(const OpContext& ctx, const TensorView& x, float eps, const TensorView& y);
Status rms_norm_gated(const OpContext& ctx, const TensorView& x, const TensorView& w, const TensorView& z, float eps,
                      const TensorView& y);
Status add_rms_norm(const OpContext& ctx, const TensorView& x, const TensorView& r, const TensorView& w, float eps,
                    const TensorView& y);

// The argument checks of rms_norm / rms_norm_gated / add_rms_norm, for entry points that compute the
// same norm with an extra output (the CUDA norms that also write int8 activations, cuda_ops.h).
Status rms_norm_check(const OpContext& ctx, const TensorView& x, const TensorView& w, const TensorView& y);
Status rms_norm_gated_check(const OpContext& ctx, const TensorView& x, const TensorView& w, const TensorView& z,
                            const TensorView& y);
Status add_rms_norm_check(const OpContext& ctx, const TensorView& x, const TensorView& r, const TensorView& w,
                          const TensorView& y);

}  // namespace ds
