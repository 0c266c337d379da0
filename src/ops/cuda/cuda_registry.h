// Registration of the CUDA backend's (op, dtype) support in the op registry (ops/op_registry.h), so the
// placement planner can place work on a CUDA device or refuse it before running a graph. Compiles
// without CUDA; the definition exists only with DS_HAVE_CUDA.
// Non-obvious choice: registration is an explicit call (made when a CUDA device is opened), not a
// static initializer, so a CUDA build on a machine without a GPU keeps reporting CPU-only support.
#pragma once

namespace ds::cuda {

// Adds every op of ops/cuda/cuda_ops.h with the dtypes its CUDA kernels accept. Idempotent.
void register_ops();

}  // namespace ds::cuda
