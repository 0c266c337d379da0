// get_rows dispatcher: checks the table type, the shapes and every id against the table size.
#include "ops/get_rows.h"

#include <algorithm>

#include "ops/op_check.h"
#include "ops/op_impl.h"
#include "ops/op_registry.h"

namespace ds {

Status get_rows(const OpContext& ctx, const TensorView& table, const TensorView& ids, const TensorView& y) {
  const auto& types = matmul_weight_dtypes();
  if (std::find(types.begin(), types.end(), table.dtype) == types.end()) {
    return unsupported("get_rows: table {}: dtype {} is not supported", table.shape_string(),
                       dtype_name(table.dtype));
  }
  DS_TRY(ops::check_tensor("get_rows", "table", ctx, table, table.dtype));
  if (table.ne[2] != 1 || table.ne[3] != 1 || table.nb[0] != dtype_block_bytes(table.dtype)) {
    return invalid_argument("get_rows: table {} must be 2-D with contiguous rows", table.shape_string());
  }
  DS_TRY(ops::check_contig("get_rows", "ids", ctx, ids, DType::I32));
  DS_TRY(ops::check_contig("get_rows", "y", ctx, y, DType::F32));
  const int64_t n_tokens = ids.n_elements();
  DS_TRY(ops::check_shape("get_rows", "y", y, table.ne[0], n_tokens));
  DS_CUDA_DISPATCH(get_rows, ctx, table, ids, y);
  const int32_t* id = ids.as<int32_t>();
  for (int64_t t = 0; t < n_tokens; ++t) {
    if (id[t] < 0 || id[t] >= table.ne[1]) {
      return invalid_argument("get_rows: id {} at index {} is outside the table's {} rows", id[t], t,
                              table.ne[1]);
    }
  }
  if (ctx.reference) {
    ops::ref::get_rows(ctx, table, ids, y);
  } else {
    ops::cpu::get_rows(ctx, table, ids, y);
  }
  return Status::ok();
}

}  // namespace ds
