// Element-wise ops on contiguous F32 tensors of equal shape (in place allowed: y may be a or x;
// mul_sigmoid's gate may be row-strided).
//   add:         y = a + b
//   mul:         y = a * b
//   silu:        y = x * sigmoid(x)
//   sigmoid:     y = 1 / (1 + exp(-x))
//   swiglu:      y = silu(gate) * up
//   mul_sigmoid: y = x * sigmoid(gate); gate has x's shape, or ne {1, rows...} (one gate per row).
//     A gate of x's shape may be row-strided: rows of ne[0] contiguous at one stride nb[1] (a multiple of
//     4 bytes, nb[2] = ne[1] nb[1], nb[3] = ne[2] nb[2]), e.g. the gate halves of interleaved
//     [q_h; gate_h] attention heads. It must not overlap y.
// copy: dst = src for tensors of one shape; src F32, dst F32, F16 (converted, round to nearest even),
//   Q8_0 or Q4_0 (rows of a multiple of 32 elements, each block quantized as quant::quantize_row does).
//   Both may be strided in dims 1..3 (ne[0] contiguous), e.g. a KV chunk row range.
#pragma once

#include "core/status.h"
#include "core/tensor.h"
#include "ops/op_context.h"

namespace ds {

Status add(const OpContext& ctx, const TensorView& a, const TensorView& b, const TensorView& y);
Status mul(const OpContext& ctx, const TensorView& a, const TensorView& b, const TensorView& y);
Status silu(const OpContext& ctx, const TensorView& x, const TensorView& y);
Status sigmoid(const OpContext& ctx, const TensorView& x, const TensorView& y);
Status swiglu(const OpContext& ctx, const TensorView& gate, const TensorView& up, const TensorView& y);
Status mul_sigmoid(const OpContext& ctx, const TensorView& x, const TensorView& gate, const TensorView& y);
Status copy(const OpContext& ctx, const TensorView& src, const TensorView& dst);

}  // namespace ds
