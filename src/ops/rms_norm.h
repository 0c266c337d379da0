// Row normalizations over ne[0], for every row of a contiguous F32 tensor (so a [n_tokens, H, D]
// tensor with a [D] weight is the per-head norm).
//   rms_norm: y = x / sqrt(mean(x^2) + eps) * w,   w [ne0] F32
//   l2_norm:  y = x / sqrt(sum(x^2) + eps)
// x and y have the same shape; in place (y == x) is allowed.
#pragma once

#include "core/status.h"
#include "core/tensor.h"
#include "ops/op_context.h"

namespace ds {

Status rms_norm(const OpContext& ctx, const TensorView& x, const TensorView& w, float eps, const TensorView& y);
Status l2_norm(const OpContext& ctx, const TensorView& x, float eps, const TensorView& y);

}  // namespace ds
