// rope_neox: partial NeoX rotary embedding, in place.
//   x [n_tokens, n_head, head_dim] (ne {head_dim, n_head, n_tokens}) F32 contiguous
//   token t is at absolute position pos0 + t. Only the first n_rot dims of each head rotate:
//   for i < n_rot/2, theta = pos * base^(-2i/n_rot), (x[i], x[i + n_rot/2]) is rotated by theta.
// n_rot must be even and <= head_dim. (Qwen3.5's IMROPE equals this for text: spec section 4.)
#pragma once

#include <cstdint>

#include "core/status.h"
#include "core/tensor.h"
#include "ops/op_context.h"

namespace ds {

Status rope_neox(const OpContext& ctx, const TensorView& x, int64_t n_rot, float base, int64_t pos0);

}  // namespace ds
