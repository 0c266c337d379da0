// Launchers of the gathered MoE kernels (defined in ops/cuda/moe_gathered.cu), for the host entry
// moe_ffn_gathered (ops/cuda/cuda_moe.cpp). Needs the CUDA runtime headers: include only under
// DS_HAVE_CUDA. Launchers return cudaError_t; the host entry names the op and shapes.
// Non-obvious choice: a projection runs as one launch over all (token, slot) pairs, grid.y = slot, and
// each slot reads its expert id from device memory, so nothing depends on the routing on the host.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"
#include "ops/cuda/matvec_launch.h"

namespace ds::cuda {

// One projection of every slot: y[s, 0 .. n_rows) = rows of expert ids[s] times activation row s / x_div.
// Slots whose id is outside [0, n_expert) are skipped (their y row is not written, no weight is read).
struct MoeMatvecLaunch {
  const void* w;            // expert 0, first row of this projection
  int64_t w_stride;         // bytes between rows
  int64_t w_expert_stride;  // bytes between experts
  int64_t n_rows = 0;
  int64_t k = 0;
  const int32_t* ids = nullptr;  // [n_slots] expert ids (device)
  int n_expert = 0;
  int n_slots = 0;
  int x_div = 1;                 // slot s reads activation row s / x_div
  const float* x = nullptr;      // F32 activation rows (staged and generic kernels)
  int64_t x_stride = 0;          // elements between rows of x
  const void* act = nullptr;     // q8 activations of the same rows (q8 kernel; quantize_q8_launch layout)
  int64_t act_rows = 0;          // rows in act
  float* y = nullptr;            // slot s writes y + s * y_stride
  int64_t y_stride = 0;          // elements
};

// Whether the q8 kernel fits (given q8 activations), and the staged F32 kernel (x set); the generic
// kernel always fits a supported type.
bool moe_matvec_q8_fits(DType t, const MoeMatvecLaunch& m);
bool moe_matvec_staged_fits(DType t, const MoeMatvecLaunch& m);
// Runs `kernel` for the projection; cudaErrorInvalidValue when it does not fit.
cudaError_t moe_matvec_launch(DType t, const MoeMatvecLaunch& m, MatvecKernel kernel, cudaStream_t stream);

// y[t, :] = sum over the slots j < k of token t whose id is in [0, n_expert) of
// weights[t, j] * d[t * k + j, :] (rows of n_embd), in slot order; tokens without a valid slot get 0.
cudaError_t moe_combine_launch(const float* d, const int32_t* ids, const float* weights, int64_t n_tokens,
                               int64_t k, int64_t n_embd, int n_expert, float* y, cudaStream_t stream);

}  // namespace ds::cuda
