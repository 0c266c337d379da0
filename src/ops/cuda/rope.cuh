// NeoX RoPE of one (d, d + n_rot / 2) pair, shared by rope_kernel (ops_kernels.cu) and the fused
// attention prep (attention.cu), so both rotate with the same bits. Angles in double: positions reach
// 2^18 and a float angle would be off by up to 1e-2 rad there.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ds::cuda::kern {

// The rotation angle of pair d at position pos: cos and sin in double (log2_base = log2(rope base)).
__device__ __forceinline__ double2 rope_neox_cos_sin(int64_t pos, int64_t d, int64_t n_rot, double log2_base) {
  const double theta = static_cast<double>(pos) * exp2(-2.0 * static_cast<double>(d) / n_rot * log2_base);
  double sn, cs;
  sincos(theta, &sn, &cs);
  return make_double2(cs, sn);
}

// x0 = x[d], x1 = x[d + n_rot / 2] rotated by the angle cs_sn (rope_neox_cos_sin).
__device__ __forceinline__ void rope_neox_rotate(float& x0, float& x1, double2 cs_sn) {
  const double a = x0, b = x1;
  x0 = static_cast<float>(a * cs_sn.x - b * cs_sn.y);
  x1 = static_cast<float>(a * cs_sn.y + b * cs_sn.x);
}

// x0 = x[d], x1 = x[d + n_rot / 2] at position pos.
__device__ __forceinline__ void rope_neox_pair(float& x0, float& x1, int64_t pos, int64_t d, int64_t n_rot,
                                               double log2_base) {
  rope_neox_rotate(x0, x1, rope_neox_cos_sin(pos, d, n_rot, log2_base));
}

}  // namespace ds::cuda::kern
