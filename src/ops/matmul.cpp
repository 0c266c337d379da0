// matmul dispatcher: checks the weight type and the shapes, then runs the CUDA, reference or fast CPU
// path. Weight rows may be strided (expert slices); everything else must be contiguous.
#include "ops/matmul.h"

#include <algorithm>

#include "ops/op_check.h"
#include "ops/op_impl.h"
#include "ops/op_registry.h"

namespace ds {

Status matmul(const OpContext& ctx, const TensorView& w, const TensorView& x, const TensorView& y) {
  const auto& types = matmul_weight_dtypes();
  if (std::find(types.begin(), types.end(), w.dtype) == types.end()) {
    return unsupported("matmul: weight {}: dtype {} is not supported", w.shape_string(), dtype_name(w.dtype));
  }
  DS_TRY(ops::check_tensor("matmul", "w", ctx, w, w.dtype));
  const int64_t n_in = w.ne[0], n_out = w.ne[1];
  if (w.ne[2] != 1 || w.ne[3] != 1) {
    return invalid_argument("matmul: weight {} must be 2-D (slice experts first)", w.shape_string());
  }
  if (n_in % dtype_block_size(w.dtype) != 0) {
    return invalid_argument("matmul: weight {}: ne0 {} is not a multiple of the {} block size {}",
                            w.shape_string(), n_in, dtype_name(w.dtype), dtype_block_size(w.dtype));
  }
  if (w.nb[0] != dtype_block_bytes(w.dtype) || (n_out > 1 && w.nb[1] < w.row_bytes())) {
    return invalid_argument("matmul: weight {}: rows must be contiguous", w.shape_string());
  }
  DS_TRY(ops::check_contig("matmul", "x", ctx, x, DType::F32));
  DS_TRY(ops::check_contig("matmul", "y", ctx, y, DType::F32));
  const int64_t n_tokens = x.ne[1];
  if (x.ne[0] != n_in || x.ne[2] * x.ne[3] != 1) {
    return invalid_argument("matmul: x {} does not match weight {}", x.shape_string(), w.shape_string());
  }
  DS_TRY(ops::check_shape("matmul", "y", y, n_out, n_tokens));
  if (y.data == x.data && n_tokens > 0) return invalid_argument("matmul: y must not alias x");
  if (n_tokens == 0 || n_out == 0) return Status::ok();
  DS_CUDA_DISPATCH(matmul, ctx, w, x, y);
  if (ctx.reference) {
    ops::ref::matmul(ctx, w, x, y);
  } else {
    ops::cpu::matmul(ctx, w, x, y);
  }
  return Status::ok();
}

}  // namespace ds
