// rms_norm / l2_norm / rms_norm_gated / add_rms_norm dispatchers: F32 rows over ne[0] (x row-strided, y
// contiguous), weight [ne0]. The CPU forms of the fused ones are the unfused chains (rms_norm, then
// swiglu; add, then rms_norm).
#include "ops/rms_norm.h"

#include "ops/elementwise.h"
#include "ops/op_check.h"
#include "ops/op_impl.h"

namespace ds {
namespace {

// x: F32 with contiguous rows, dims 1..3 at 4-byte multiples; y: contiguous, x's shape; in place only
// when x is contiguous.
Status check_rows(const char* op, const OpContext& ctx, const TensorView& x, const TensorView& y) {
  DS_TRY(ops::check_tensor(op, "x", ctx, x, DType::F32));
  if (x.nb[0] != 4) return invalid_argument("{}: x {}: rows must be contiguous (nb0 {})", op, x.shape_string(), x.nb[0]);
  for (int d = 1; d < kMaxDims; ++d) {
    if (x.ne[d] > 1 && (x.nb[d] % 4 != 0 || x.nb[d] < 0)) {
      return invalid_argument("{}: x {}: stride nb{} = {} is not a multiple of 4 bytes", op, x.shape_string(), d,
                              x.nb[d]);
    }
  }
  DS_TRY(ops::check_contig(op, "y", ctx, y, DType::F32));
  DS_TRY(ops::check_same_shape(op, "x", x, "y", y));
  if (x.data == y.data && x.n_elements() > 0 && !x.is_contiguous()) {
    return invalid_argument("{}: in place needs a contiguous x (x {} is strided)", op, x.shape_string());
  }
  return Status::ok();
}

void run_cpu(const OpContext& ctx, const TensorView& x, const float* w, float eps, bool l2, const TensorView& y) {
  if (ctx.reference) {
    ops::ref::rms_norm(ctx, x, w, eps, l2, y);
  } else {
    ops::cpu::rms_norm(ctx, x, w, eps, l2, y);
  }
}

}  // namespace

Status rms_norm_check(const OpContext& ctx, const TensorView& x, const TensorView& w, const TensorView& y) {
  DS_TRY(check_rows("rms_norm", ctx, x, y));
  DS_TRY(ops::check_contig("rms_norm", "w", ctx, w, DType::F32));
  if (w.n_elements() != x.ne[0]) {
    return invalid_argument("rms_norm: w {} does not match x {}", w.shape_string(), x.shape_string());
  }
  return Status::ok();
}

Status rms_norm(const OpContext& ctx, const TensorView& x, const TensorView& w, float eps, const TensorView& y) {
  DS_TRY(rms_norm_check(ctx, x, w, y));
  if (x.n_elements() == 0) return Status::ok();
  DS_CUDA_DISPATCH(rms_norm, ctx, x, w, eps, y);
  run_cpu(ctx, x, w.as<float>(), eps, false, y);
  return Status::ok();
}

Status l2_norm(const OpContext& ctx, const TensorView& x, float eps, const TensorView& y) {
  DS_TRY(check_rows("l2_norm", ctx, x, y));
  if (x.n_elements() == 0) return Status::ok();
  DS_CUDA_DISPATCH(l2_norm, ctx, x, eps, y);
  run_cpu(ctx, x, nullptr, eps, true, y);
  return Status::ok();
}

Status rms_norm_gated_check(const OpContext& ctx, const TensorView& x, const TensorView& w, const TensorView& z,
                            const TensorView& y) {
  const char* op = "rms_norm_gated";
  DS_TRY(check_rows(op, ctx, x, y));
  DS_TRY(ops::check_contig(op, "w", ctx, w, DType::F32));
  if (w.n_elements() != x.ne[0]) {
    return invalid_argument("{}: w {} does not match x {}", op, w.shape_string(), x.shape_string());
  }
  DS_TRY(ops::check_contig(op, "z", ctx, z, DType::F32));
  DS_TRY(ops::check_same_shape(op, "x", x, "z", z));
  if (z.data == y.data && z.n_elements() > 0) return invalid_argument("{}: y must not alias z", op);
  return Status::ok();
}

Status rms_norm_gated(const OpContext& ctx, const TensorView& x, const TensorView& w, const TensorView& z, float eps,
                      const TensorView& y) {
  DS_TRY(rms_norm_gated_check(ctx, x, w, z, y));
  if (x.n_elements() == 0) return Status::ok();
  DS_CUDA_DISPATCH(rms_norm_gated, ctx, x, w, z, eps, y);
  run_cpu(ctx, x, w.as<float>(), eps, false, y);
  return swiglu(ctx, z, y, y);  // y = silu(z) * y
}

Status add_rms_norm_check(const OpContext& ctx, const TensorView& x, const TensorView& r, const TensorView& w,
                          const TensorView& y) {
  const char* op = "add_rms_norm";
  DS_TRY(ops::check_contig(op, "x", ctx, x, DType::F32));
  DS_TRY(ops::check_contig(op, "r", ctx, r, DType::F32));
  DS_TRY(ops::check_same_shape(op, "x", x, "r", r));
  DS_TRY(check_rows(op, ctx, x, y));
  DS_TRY(ops::check_contig(op, "w", ctx, w, DType::F32));
  if (w.n_elements() != x.ne[0]) {
    return invalid_argument("{}: w {} does not match x {}", op, w.shape_string(), x.shape_string());
  }
  if (x.n_elements() > 0 && (y.data == x.data || y.data == r.data)) {
    return invalid_argument("{}: y must alias neither x nor r", op);
  }
  return Status::ok();
}

Status add_rms_norm(const OpContext& ctx, const TensorView& x, const TensorView& r, const TensorView& w, float eps,
                    const TensorView& y) {
  DS_TRY(add_rms_norm_check(ctx, x, r, w, y));
  if (x.n_elements() == 0) return Status::ok();
  DS_CUDA_DISPATCH(add_rms_norm, ctx, x, r, w, eps, y);
  DS_TRY(add(ctx, x, r, x));
  run_cpu(ctx, x, w.as<float>(), eps, false, y);
  return Status::ok();
}

}  // namespace ds
