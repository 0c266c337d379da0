// The DeltaNet prologue's per-element arithmetic (causal conv + SiLU of one channel, the gates of one
// head), shared by the kernels that must agree bit for bit: conv1d_kernel, gates_kernel and
// delta_net_prep_kernel (ops_kernels.cu), and the one-token DeltaNet step (delta_net.cu).
#pragma once

#include <cuda_runtime.h>

#include "ops/cuda/activation.cuh"
#include "ops/cuda/ops_launch.h"

namespace ds::cuda::kern {

// One conv output from the taps, the kernel-1 previous inputs `win` (oldest first) and the current input.
__device__ __forceinline__ float conv_out(const float (&taps)[kConvMaxKernel], const float (&win)[kConvMaxKernel],
                                          float cur, int kernel, bool silu) {
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < kConvMaxKernel; ++i) {
    if (i < kernel - 1) acc = fmaf(taps[i], win[i], acc);
  }
  float last = 0.0f;
#pragma unroll
  for (int i = 0; i < kConvMaxKernel; ++i) {
    if (i == kernel - 1) last = taps[i];
  }
  acc = fmaf(last, cur, acc);
  return silu ? acc * sigmoidf(acc) : acc;  // silu as EltKind::kSilu
}

// The gates of one (token, v-head): g = ssm_a * softplus(alpha + dt_bias), beta = sigmoid(b).
struct DeltaNetGate {
  float g, beta;
};
__device__ __forceinline__ DeltaNetGate gate_of(float alpha, float b, float dt_bias, float ssm_a) {
  const float a = alpha + dt_bias;
  const float softplus = a > 20.0f ? a : log1pf(expf(a));
  return {ssm_a * softplus, 1.0f / (1.0f + expf(-b))};
}

}  // namespace ds::cuda::kern
