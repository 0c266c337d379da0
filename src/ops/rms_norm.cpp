// rms_norm / l2_norm dispatchers: contiguous F32 rows over ne[0], weight [ne0].
#include "ops/rms_norm.h"

#include "ops/op_check.h"
#include "ops/op_impl.h"

namespace ds {

Status rms_norm(const OpContext& ctx, const TensorView& x, const TensorView& w, float eps, const TensorView& y) {
  DS_TRY(ops::check_contig("rms_norm", "x", ctx, x, DType::F32));
  DS_TRY(ops::check_contig("rms_norm", "w", ctx, w, DType::F32));
  DS_TRY(ops::check_contig("rms_norm", "y", ctx, y, DType::F32));
  DS_TRY(ops::check_same_shape("rms_norm", "x", x, "y", y));
  if (w.n_elements() != x.ne[0]) {
    return invalid_argument("rms_norm: w {} does not match x {}", w.shape_string(), x.shape_string());
  }
  if (x.n_elements() == 0) return Status::ok();
  DS_CUDA_DISPATCH(rms_norm, ctx, x, w, eps, y);
  if (ctx.reference) {
    ops::ref::rms_norm(ctx, x, w.as<float>(), eps, false, y);
  } else {
    ops::cpu::rms_norm(ctx, x, w.as<float>(), eps, false, y);
  }
  return Status::ok();
}

Status l2_norm(const OpContext& ctx, const TensorView& x, float eps, const TensorView& y) {
  DS_TRY(ops::check_contig("l2_norm", "x", ctx, x, DType::F32));
  DS_TRY(ops::check_contig("l2_norm", "y", ctx, y, DType::F32));
  DS_TRY(ops::check_same_shape("l2_norm", "x", x, "y", y));
  if (x.n_elements() == 0) return Status::ok();
  DS_CUDA_DISPATCH(l2_norm, ctx, x, eps, y);
  if (ctx.reference) {
    ops::ref::rms_norm(ctx, x, nullptr, eps, true, y);
  } else {
    ops::cpu::rms_norm(ctx, x, nullptr, eps, true, y);
  }
  return Status::ok();
}

}  // namespace ds
