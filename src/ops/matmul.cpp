// matmul dispatchers (matmul, matmul_many, matmul_swiglu): check the weight type and the shapes, then
// run the CUDA, reference or fast CPU path. Weight rows may be strided (expert slices); everything
// else must be contiguous. The CPU forms of the fused ops run the unfused chain, so their results are
// bit-identical to it.
#include "ops/matmul.h"

#include <algorithm>

#include "ops/elementwise.h"
#include "ops/op_check.h"
#include "ops/op_impl.h"
#include "ops/op_registry.h"

namespace ds {
namespace {

// Everything matmul requires of (w, x, y), reported under the name `op`.
Status check_matmul(const char* op, const OpContext& ctx, const TensorView& w, const TensorView& x,
                    const TensorView& y) {
  const auto& types = matmul_weight_dtypes();
  // A device layout (core/dtype.h) is taken where its backend registered it (the registry is consulted
  // only for types outside the list).
  if (std::find(types.begin(), types.end(), w.dtype) == types.end() &&
      !(ctx.device.kind != DeviceKind::kCpu && op_supported(op, ctx.device.kind, w.dtype))) {
    return unsupported("{}: weight {}: dtype {} is not supported", op, w.shape_string(), dtype_name(w.dtype));
  }
  DS_TRY(ops::check_tensor(op, "w", ctx, w, w.dtype));
  const int64_t n_in = w.ne[0], n_out = w.ne[1];
  if (w.ne[2] != 1 || w.ne[3] != 1) {
    return invalid_argument("{}: weight {} must be 2-D (slice experts first)", op, w.shape_string());
  }
  if (n_in % dtype_block_size(w.dtype) != 0) {
    return invalid_argument("{}: weight {}: ne0 {} is not a multiple of the {} block size {}", op,
                            w.shape_string(), n_in, dtype_name(w.dtype), dtype_block_size(w.dtype));
  }
  if (w.nb[0] != dtype_block_bytes(w.dtype) || (n_out > 1 && w.nb[1] < w.row_bytes())) {
    return invalid_argument("{}: weight {}: rows must be contiguous", op, w.shape_string());
  }
  DS_TRY(ops::check_contig(op, "x", ctx, x, DType::F32));
  DS_TRY(ops::check_contig(op, "y", ctx, y, DType::F32));
  const int64_t n_tokens = x.ne[1];
  if (x.ne[0] != n_in || x.ne[2] * x.ne[3] != 1) {
    return invalid_argument("{}: x {} does not match weight {}", op, x.shape_string(), w.shape_string());
  }
  DS_TRY(ops::check_shape(op, "y", y, n_out, n_tokens));
  if (y.data == x.data && n_tokens > 0) return invalid_argument("{}: y must not alias x", op);
  return Status::ok();
}

void matmul_cpu(const OpContext& ctx, const TensorView& w, const TensorView& x, const TensorView& y) {
  if (x.ne[1] == 0 || w.ne[1] == 0) return;
  if (ctx.reference) {
    ops::ref::matmul(ctx, w, x, y);
  } else {
    ops::cpu::matmul(ctx, w, x, y);
  }
}

}  // namespace

Status matmul(const OpContext& ctx, const TensorView& w, const TensorView& x, const TensorView& y) {
  DS_TRY(check_matmul("matmul", ctx, w, x, y));
  if (x.ne[1] == 0 || w.ne[1] == 0) return Status::ok();
  DS_CUDA_DISPATCH(matmul, ctx, w, x, y);
  matmul_cpu(ctx, w, x, y);
  return Status::ok();
}

Status matmul_many(const OpContext& ctx, std::span<const TensorView> ws, const TensorView& x,
                   std::span<const TensorView> ys) {
  if (ws.size() != ys.size()) {
    return invalid_argument("matmul_many: {} weights but {} outputs (x {})", ws.size(), ys.size(), x.shape_string());
  }
  for (size_t i = 0; i < ws.size(); ++i) {
    DS_TRY(check_matmul("matmul_many", ctx, ws[i], x, ys[i]).with_context(fmt::format("product {}", i)));
    for (size_t j = 0; j < i; ++j) {
      if (ys[j].data == ys[i].data && ys[i].n_elements() > 0) {
        return invalid_argument("matmul_many: outputs {} and {} alias ({})", j, i, ys[i].shape_string());
      }
    }
  }
  if (ws.empty() || x.ne[1] == 0) return Status::ok();
  DS_CUDA_DISPATCH(matmul_many, ctx, ws, x, ys);
  for (size_t i = 0; i < ws.size(); ++i) matmul_cpu(ctx, ws[i], x, ys[i]);
  return Status::ok();
}

Status matmul_swiglu(const OpContext& ctx, const TensorView& w, const TensorView& gate, const TensorView& up,
                     const TensorView& y) {
  const char* op = "matmul_swiglu";
  DS_TRY(check_matmul(op, ctx, w, gate, y));
  DS_TRY(ops::check_contig(op, "up", ctx, up, DType::F32));
  DS_TRY(ops::check_same_shape(op, "gate", gate, "up", up));
  if (y.data == up.data && y.n_elements() > 0) return invalid_argument("{}: y must not alias up", op);
  if (gate.ne[1] == 0 || w.ne[1] == 0) return Status::ok();
  DS_CUDA_DISPATCH(matmul_swiglu, ctx, w, gate, up, y);
  DS_TRY(swiglu(ctx, gate, up, gate));  // gate = silu(gate) * up
  matmul_cpu(ctx, w, gate, y);
  return Status::ok();
}

}  // namespace ds
