// conv1d_causal dispatcher.
#include "ops/conv1d.h"

#include "ops/op_check.h"
#include "ops/op_impl.h"

namespace ds {

Status conv1d_causal(const OpContext& ctx, const TensorView& x, const TensorView& w, const TensorView& state,
                     const TensorView& y) {
  const char* op = "conv1d_causal";
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
  if (n_tokens == 0) return Status::ok();
  DS_CUDA_DISPATCH(conv1d_causal, ctx, x, w, state, y);
  if (ctx.reference) {
    ops::ref::conv1d_causal(ctx, x, w, state, y);
  } else {
    ops::cpu::conv1d_causal(ctx, x, w, state, y);
  }
  return Status::ok();
}

}  // namespace ds
