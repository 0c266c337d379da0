// The RMS scale of a row of at most 256 elements held by one warp, with norm_kernel's arithmetic for such
// a row (ops_kernels.cu: one warp, lane l holds elements l + 32 j, zeros past n; the same fmaf chain and
// butterfly), shared by the fused kernels that must give the norm's bits (attention_prep in attention.cu,
// the DeltaNet output norm in delta_net.cu).
#pragma once

#include <cuda_runtime.h>

namespace ds::cuda::kern {

constexpr int kWarpRowPer = 8;  // elements a lane holds: rows of up to 32 * 8

// 1 / sqrt(mean(v^2) + eps) over the warp's row of n elements; every lane gets it.
__device__ __forceinline__ float warp_row_rms_inv(const float (&v)[kWarpRowPer], int n, float eps) {
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kWarpRowPer; ++j) ss = fmaf(v[j], v[j], ss);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, o);
  return rsqrtf(ss / static_cast<float>(n) + eps);
}

}  // namespace ds::cuda::kern
