// Device activation functions shared by the kernels that must agree bit for bit (the elementwise ops
// in ops_kernels.cu, the norms there, and the fused DeltaNet output norm in delta_net.cu).
#pragma once

#include <cuda_runtime.h>

namespace ds::cuda::kern {

__device__ __forceinline__ float sigmoidf(float v) { return 1.0f / (1.0f + __expf(-v)); }

}  // namespace ds::cuda::kern
