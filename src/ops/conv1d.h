// conv1d_causal: causal depthwise convolution over time with carried state (DeltaNet step 4).
//   x     [n_tokens, C] (ne {C, n_tokens}) F32
//   w     [C, K] (ne {K, C}) F32: channel c's taps w[c*K + i], i = 0 is the oldest
//   state [K-1, C] (ne {C, K-1}) F32: the previous K-1 inputs, oldest first; read and updated
//   y     [n_tokens, C] F32, overwritten; must not alias x
// y[t, c] = sum_i w[c, i] * in[t - (K-1) + i, c], where inputs before t = 0 come from the state.
// No activation. conv1d_causal_silu: y = silu(conv1d_causal(x)), the model's step; the CPU runs the
// two ops, CUDA applies the SiLU in the conv kernel.
#pragma once

#include "core/status.h"
#include "core/tensor.h"
#include "ops/op_context.h"

namespace ds {

Status conv1d_causal(const OpContext& ctx, const TensorView& x, const TensorView& w,
                     const TensorView& state, const TensorView& y);
Status conv1d_causal_silu(const OpContext& ctx, const TensorView& x, const TensorView& w,
                          const TensorView& state, const TensorView& y);

}  // namespace ds
