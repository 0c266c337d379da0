// Element-wise dispatchers (add, mul, silu, sigmoid, swiglu, mul_sigmoid) and copy (F32 to F32, F16,
// Q8_0 or Q4_0: the KV cache append).
#include "ops/elementwise.h"

#include <cstring>

#include "ops/op_check.h"
#include "ops/op_impl.h"
#include "quant/quant.h"

namespace ds {
namespace {

Status check_binary(const char* op, const OpContext& ctx, const TensorView& a, const TensorView& b,
                    const TensorView& y) {
  DS_TRY(ops::check_contig(op, "a", ctx, a, DType::F32));
  DS_TRY(ops::check_contig(op, "b", ctx, b, DType::F32));
  DS_TRY(ops::check_contig(op, "y", ctx, y, DType::F32));
  DS_TRY(ops::check_same_shape(op, "a", a, "b", b));
  return ops::check_same_shape(op, "a", a, "y", y);
}

Status check_unary(const char* op, const OpContext& ctx, const TensorView& x, const TensorView& y) {
  DS_TRY(ops::check_contig(op, "x", ctx, x, DType::F32));
  DS_TRY(ops::check_contig(op, "y", ctx, y, DType::F32));
  return ops::check_same_shape(op, "x", x, "y", y);
}

void run(const OpContext& ctx, ops::Eltwise kind, const TensorView& a, const TensorView& b, const TensorView& y) {
  if (y.n_elements() == 0) return;
  if (ctx.reference) {
    ops::ref::eltwise(ctx, kind, a, b, y);
  } else {
    ops::cpu::eltwise(ctx, kind, a, b, y);
  }
}

}  // namespace

Status add(const OpContext& ctx, const TensorView& a, const TensorView& b, const TensorView& y) {
  DS_TRY(check_binary("add", ctx, a, b, y));
  DS_CUDA_DISPATCH(add, ctx, a, b, y);
  run(ctx, ops::Eltwise::kAdd, a, b, y);
  return Status::ok();
}

Status mul(const OpContext& ctx, const TensorView& a, const TensorView& b, const TensorView& y) {
  DS_TRY(check_binary("mul", ctx, a, b, y));
  DS_CUDA_DISPATCH(mul, ctx, a, b, y);
  run(ctx, ops::Eltwise::kMul, a, b, y);
  return Status::ok();
}

Status silu(const OpContext& ctx, const TensorView& x, const TensorView& y) {
  DS_TRY(check_unary("silu", ctx, x, y));
  DS_CUDA_DISPATCH(silu, ctx, x, y);
  run(ctx, ops::Eltwise::kSilu, x, x, y);
  return Status::ok();
}

Status sigmoid(const OpContext& ctx, const TensorView& x, const TensorView& y) {
  DS_TRY(check_unary("sigmoid", ctx, x, y));
  DS_CUDA_DISPATCH(sigmoid, ctx, x, y);
  run(ctx, ops::Eltwise::kSigmoid, x, x, y);
  return Status::ok();
}

Status swiglu(const OpContext& ctx, const TensorView& gate, const TensorView& up, const TensorView& y) {
  DS_TRY(check_binary("swiglu", ctx, gate, up, y));
  DS_CUDA_DISPATCH(swiglu, ctx, gate, up, y);
  run(ctx, ops::Eltwise::kSwiglu, gate, up, y);
  return Status::ok();
}

Status mul_sigmoid(const OpContext& ctx, const TensorView& x, const TensorView& gate, const TensorView& y) {
  const char* op = "mul_sigmoid";
  DS_TRY(check_unary(op, ctx, x, y));
  DS_TRY(ops::check_tensor(op, "gate", ctx, gate, DType::F32));
  const bool per_row = gate.ne[0] == 1 && x.ne[0] != 1 && gate.ne[1] == x.ne[1] && gate.ne[2] == x.ne[2] &&
                       gate.ne[3] == x.ne[3];
  if (gate.ne != x.ne && !per_row) {
    return invalid_argument("{}: gate {} must match x {} or hold one value per row", op, gate.shape_string(),
                            x.shape_string());
  }
  if (!gate.is_contiguous()) {
    // One row stride for all rows (the kernels index rows of the flattened dims 1..3).
    const bool uniform = gate.nb[0] == 4 && gate.nb[1] >= 4 * gate.ne[0] && gate.nb[1] % 4 == 0 &&
                         (gate.ne[2] <= 1 || gate.nb[2] == gate.ne[1] * gate.nb[1]) &&
                         (gate.ne[3] <= 1 || gate.nb[3] == gate.ne[2] * gate.nb[2]);
    if (per_row || !uniform) {
      return invalid_argument("{}: gate {} (strides {}, {}, {}) must be contiguous or rows at one stride", op,
                              gate.shape_string(), gate.nb[1], gate.nb[2], gate.nb[3]);
    }
    if (gate.data == y.data && y.n_elements() > 0) return invalid_argument("{}: a strided gate must not alias y", op);
  }
  DS_CUDA_DISPATCH(mul_sigmoid, ctx, x, gate, y);
  run(ctx, ops::Eltwise::kMulSigmoid, x, gate, y);
  return Status::ok();
}

Status copy(const OpContext& ctx, const TensorView& src, const TensorView& dst) {
  DS_TRY(ops::check_tensor("copy", "src", ctx, src, DType::F32));
  if (dst.dtype != DType::F16 && dst.dtype != DType::Q8_0 && dst.dtype != DType::Q4_0) {
    DS_TRY(ops::check_tensor("copy", "dst", ctx, dst, DType::F32));
  }
  DS_TRY(ops::check_tensor("copy", "dst", ctx, dst, dst.dtype));
  DS_TRY(ops::check_same_shape("copy", "src", src, "dst", dst));
  if (src.ne[0] % dtype_block_size(dst.dtype) != 0) {
    return invalid_argument("copy: dst {}: rows of {} elements are not a multiple of its block of {}",
                            dst.shape_string(), dst.ne[0], dtype_block_size(dst.dtype));
  }
  if (src.nb[0] != 4 || dst.nb[0] != dtype_block_bytes(dst.dtype)) {
    return invalid_argument("copy: rows of src {} / dst {} must be contiguous", src.shape_string(), dst.shape_string());
  }
  if (src.n_elements() == 0) return Status::ok();
  DS_CUDA_DISPATCH(copy, ctx, src, dst);
  const size_t row = static_cast<size_t>(src.ne[0]) * 4;
  for (int64_t i3 = 0; i3 < src.ne[3]; ++i3) {
    for (int64_t i2 = 0; i2 < src.ne[2]; ++i2) {
      for (int64_t i1 = 0; i1 < src.ne[1]; ++i1) {
        const auto* s = static_cast<const uint8_t*>(src.data) + i1 * src.nb[1] + i2 * src.nb[2] + i3 * src.nb[3];
        auto* d = static_cast<uint8_t*>(dst.data) + i1 * dst.nb[1] + i2 * dst.nb[2] + i3 * dst.nb[3];
        if (dst.dtype == DType::F32) {
          std::memmove(d, s, row);  // src and dst may overlap
        } else {
          // F16 rounded to nearest even; Q8_0 / Q4_0 blocks: the bits every backend writes.
          quant::quantize_row(dst.dtype, reinterpret_cast<const float*>(s), d, src.ne[0]);
        }
      }
    }
  }
  return Status::ok();
}

}  // namespace ds
