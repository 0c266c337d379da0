// get_rows: embedding lookup with dequantization.
//   table [n_rows, n] (ne {n, n_rows}), any matmul weight dtype
//   ids   [n_tokens] I32, each in [0, n_rows) (kInvalidArgument naming the id otherwise)
//   y     [n_tokens, n] (ne {n, n_tokens}) F32 contiguous, overwritten.
#pragma once

#include "core/status.h"
#include "core/tensor.h"
#include "ops/op_context.h"

namespace ds {

Status get_rows(const OpContext& ctx, const TensorView& table, const TensorView& ids, const TensorView& y);

}  // namespace ds
