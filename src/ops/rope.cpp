// rope_neox dispatcher.
#include "ops/rope.h"

#include "ops/op_check.h"
#include "ops/op_impl.h"

namespace ds {

Status rope_neox(const OpContext& ctx, const TensorView& x, int64_t n_rot, float base, int64_t pos0) {
  DS_TRY(ops::check_contig("rope_neox", "x", ctx, x, DType::F32));
  if (n_rot <= 0 || n_rot % 2 != 0 || n_rot > x.ne[0]) {
    return invalid_argument("rope_neox: n_rot {} must be even and in (0, head_dim {}]", n_rot, x.ne[0]);
  }
  if (pos0 < 0 || !(base > 0.0f)) return invalid_argument("rope_neox: pos0 {} / base {} invalid", pos0, base);
  if (x.ne[3] != 1) return invalid_argument("rope_neox: x {} must be 3-D", x.shape_string());
  if (x.n_elements() == 0) return Status::ok();
  DS_CUDA_DISPATCH(rope_neox, ctx, x, n_rot, base, pos0);
  if (ctx.reference) {
    ops::ref::rope_neox(ctx, x, n_rot, base, pos0);
  } else {
    ops::cpu::rope_neox(ctx, x, n_rot, base, pos0);
  }
  return Status::ok();
}

}  // namespace ds
