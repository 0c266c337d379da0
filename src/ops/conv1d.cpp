// conv1d_causal / conv1d_causal_silu dispatchers.
#include "ops/conv1d.h"

#include "ops/elementwise.h"
#include "ops/op_check.h"
#include "ops/op_impl.h"

namespace ds {
namespace {

Status check_conv(const char* op, const OpContext& ctx, const TensorView& x, const TensorView& w,
                  const TensorView& state, const TensorView& y) {
  DS_TRY(ops::check_contig(op, "x", ctx, x, DType::F32));
  DS_TRY(ops::check_contig(op, "w", ctx, w, DType::F32));
  DS_TRY(ops::check_contig(op, "state", ctx, state, DType::F32));
  DS_TRY(ops::check_contig(op, "y", ctx, y, DType::F32));
  DS_TRY(ops::check_same_shape(op, "x", x, "y", y));
  const int64_t n_ch = x.ne[0], n_tokens = x.ne[1], kernel = w.ne[0];
  if (x.ne[2] * x.ne[3] != 1) return invalid_argument("{}: x {} must be 2-D", op, x.shape_string());
  if (kernel < 1) return invalid_argument("{}: w {}: kernel must be >= 1", op, w.shape_string());
  DS_TRY(ops::check_shape(op, "w", w, kernel, n_ch));
  DS_TRY(ops::check_shape(op, "state", state, n_ch, kernel - 1));
  if (x.data == y.data && n_tokens > 0) return invalid_argument("{}: y must not alias x", op);
  return Status::ok();
}

void run_cpu(const OpContext& ctx, const TensorView& x, const TensorView& w, const TensorView& state,
             const TensorView& y) {
  if (ctx.reference) {
    ops::ref::conv1d_causal(ctx, x, w, state, y);
  } else {
    ops::cpu::conv1d_causal(ctx, x, w, state, y);
  }
}

}  // namespace

Status conv1d_causal(const OpContext& ctx, const TensorView& x, const TensorView& w, const TensorView& state,
                     const TensorView& y) {
  DS_TRY(check_conv("conv1d_causal", ctx, x, w, state, y));
  if (x.ne[1] == 0) return Status::ok();
  DS_CUDA_DISPATCH(conv1d_causal, ctx, x, w, state, y);
  run_cpu(ctx, x, w, state, y);
  return Status::ok();
}

Status conv1d_causal_silu(const OpContext& ctx, const TensorView& x, const TensorView& w, const TensorView& state,
                          const TensorView& y) {
  DS_TRY(check_conv("conv1d_causal_silu", ctx, x, w, state, y));
  if (x.ne[1] == 0) return Status::ok();
  DS_CUDA_DISPATCH(conv1d_causal_silu, ctx, x, w, state, y);
  run_cpu(ctx, x, w, state, y);
  return silu(ctx, y, y);
}

}  // namespace ds
