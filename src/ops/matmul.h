// matmul: y = W x for a batch of activation rows, the product behind every projection.
//   w [n_out, n_in] (ne {n_in, n_out}); dtype F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K.
//     Rows may be strided (nb[1] >= row bytes), e.g. one expert's slice of a 3-D tensor.
//   x [n_tokens, n_in] (ne {n_in, n_tokens}) F32 contiguous
//   y [n_tokens, n_out] (ne {n_out, n_tokens}) F32 contiguous, overwritten; must not alias x.
// The CPU fast path quantizes each activation row once to the type paired with W's type
// (ds::cpu::vec_dot_quantize_act) and runs integer dot products in tiles (ds::cpu::gemm_tile),
// parallel over weight rows; the reference dequantizes each weight row and dots in float.
#pragma once

#include "core/status.h"
#include "core/tensor.h"
#include "ops/op_context.h"

namespace ds {

Status matmul(const OpContext& ctx, const TensorView& w, const TensorView& x, const TensorView& y);

}  // namespace ds
