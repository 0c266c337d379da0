// Internal: shape / dtype / device checks shared by the op dispatchers. Each returns a
// kInvalidArgument Status naming the op, the operand and its shape, so a bad call is reported at the
// op boundary instead of corrupting memory inside a kernel.
#pragma once

#include "core/status.h"
#include "core/tensor.h"
#include "ops/op_context.h"

namespace ds::ops {

// t is on ctx's device, has a non-null data pointer (unless it has 0 elements) and dtype `dtype`.
Status check_tensor(const char* op, const char* name, const OpContext& ctx, const TensorView& t, DType dtype);
// check_tensor + contiguous.
Status check_contig(const char* op, const char* name, const OpContext& ctx, const TensorView& t, DType dtype);
// a and b have equal ne in all dims.
Status check_same_shape(const char* op, const char* a_name, const TensorView& a, const char* b_name,
                        const TensorView& b);
// t.ne == {ne0, ne1, ne2, ne3} (missing trailing dims are 1).
Status check_shape(const char* op, const char* name, const TensorView& t, int64_t ne0, int64_t ne1 = 1,
                   int64_t ne2 = 1, int64_t ne3 = 1);

}  // namespace ds::ops

// The CUDA dispatch point of every op: forwards to ds::cuda::<op> (ops/cuda/cuda_ops.h) when the
// context is a CUDA device, or reports that this build has no CUDA backend.
#ifdef DS_HAVE_CUDA
#include "ops/cuda/cuda_ops.h"
#define DS_CUDA_DISPATCH(op, ...) \
  if (ctx.device.kind == ::ds::DeviceKind::kCuda) return ::ds::cuda::op(__VA_ARGS__)
#else
#define DS_CUDA_DISPATCH(op, ...) \
  if (ctx.device.kind == ::ds::DeviceKind::kCuda) return ::ds::op_no_backend(#op, ctx.device)
#endif
