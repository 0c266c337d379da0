// Shared argument checks of the op dispatchers, and the no-backend Status.
#include "ops/op_check.h"

namespace ds {

Status op_no_backend(const char* op, Device device) {
  return unsupported("{}: no backend for device {} in this build", op, device.to_string());
}

namespace ops {

Status check_tensor(const char* op, const char* name, const OpContext& ctx, const TensorView& t, DType dtype) {
  if (t.device != ctx.device) {
    return invalid_argument("{}: {} {} is on {}, the op runs on {}", op, name, t.shape_string(),
                            t.device.to_string(), ctx.device.to_string());
  }
  if (t.dtype != dtype) {
    return invalid_argument("{}: {} {}: expected dtype {}", op, name, t.shape_string(), dtype_name(dtype));
  }
  for (int d = 0; d < kMaxDims; ++d) {
    if (t.ne[d] < 0) return invalid_argument("{}: {} {}: negative dimension", op, name, t.shape_string());
  }
  if (t.data == nullptr && t.n_elements() > 0) {
    return invalid_argument("{}: {} {}: null data", op, name, t.shape_string());
  }
  return Status::ok();
}

Status check_contig(const char* op, const char* name, const OpContext& ctx, const TensorView& t, DType dtype) {
  DS_TRY(check_tensor(op, name, ctx, t, dtype));
  if (!t.is_contiguous()) return invalid_argument("{}: {} {} is not contiguous", op, name, t.shape_string());
  return Status::ok();
}

Status check_same_shape(const char* op, const char* a_name, const TensorView& a, const char* b_name,
                        const TensorView& b) {
  if (a.ne != b.ne) {
    return invalid_argument("{}: {} {} and {} {} differ in shape", op, a_name, a.shape_string(), b_name,
                            b.shape_string());
  }
  return Status::ok();
}

Status check_shape(const char* op, const char* name, const TensorView& t, int64_t ne0, int64_t ne1, int64_t ne2,
                   int64_t ne3) {
  if (t.ne[0] != ne0 || t.ne[1] != ne1 || t.ne[2] != ne2 || t.ne[3] != ne3) {
    return invalid_argument("{}: {} {}: expected [{}, {}, {}, {}]", op, name, t.shape_string(), ne0, ne1, ne2,
                            ne3);
  }
  return Status::ok();
}

}  // namespace ops
}  // namespace ds
