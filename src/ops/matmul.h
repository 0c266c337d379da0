// matmul: y = W x for a batch of activation rows, the product behind every projection.
//   w [n_out, n_in] (ne {n_in, n_out}); dtype F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K.
//     Rows may be strided (nb[1] >= row bytes), e.g. one expert's slice of a 3-D tensor.
//   x [n_tokens, n_in] (ne {n_in, n_tokens}) F32 contiguous
//   y [n_tokens, n_out] (ne {n_out, n_tokens}) F32 contiguous, overwritten; must not alias x.
// The CPU fast path quantizes each activation row once to the type paired with W's type
// (ds::cpu::vec_dot_quantize_act) and runs integer dot products in tiles (ds::cpu::gemm_tile),
// parallel over weight rows; the reference dequantizes each weight row and dots in float.
//
// matmul_many: ys[i] = ws[i] x for every i, one shared input (the q/k/v or gate/up projections of
//   one normalized hidden state). Each (ws[i], x, ys[i]) follows matmul's contract; no ys[i] may
//   alias x or another ys[j]. Same results as the matmul calls one by one; on CUDA the activations are
//   converted once for all weights (int8 blocks for the matrix-vector kernel, BF16 for the GEMM).
//
// matmul_swiglu: y = W (silu(gate) * up), the down projection of a SwiGLU FFN.
//   gate, up [n_tokens, n_in] F32 contiguous, same shape; y [n_tokens, n_out] as in matmul.
//   `gate` is scratch: it may be overwritten with silu(gate) * up (the CPU does; CUDA's int8 path
//   does not). y must not alias gate or up.
#pragma once

#include <span>

#include "core/status.h"
#include "core/tensor.h"
#include "ops/op_context.h"

namespace ds {

Status matmul(const OpContext& ctx, const TensorView& w, const TensorView& x, const TensorView& y);
Status matmul_many(const OpContext& ctx, std::span<const TensorView> ws, const TensorView& x,
                   std::span<const TensorView> ys);
Status matmul_swiglu(const OpContext& ctx, const TensorView& w, const TensorView& gate, const TensorView& up,
                     const TensorView& y);

}  // namespace ds
