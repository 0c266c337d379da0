// Launchers of the CUDA matrix kernels (defined in ops/cuda/matvec.cu), for the host code of the
// backend and its tests. Needs the CUDA runtime headers: include only under DS_HAVE_CUDA.
// Non-obvious choice: launchers return cudaError_t rather than Status, which keeps fmt and the Status
// machinery out of nvcc's compile units (the host caller converts, naming op and shapes).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace ds::cuda {

struct MatvecLaunch {
  const void* w;     // weight rows of k elements of dtype
  int64_t w_stride;  // bytes between weight rows
  const float* x;    // [n_tokens, k]
  int64_t x_stride;  // elements between activation rows
  float* y;          // [n_tokens, n_rows]
  int64_t y_stride;  // elements between output rows
  int64_t n_rows;
  int64_t k;
  int n_tokens;      // 1 .. kMatvecMaxTokens
};

constexpr int kMatvecMaxTokens = 16;

// Types the matrix kernels decode.
bool matvec_supports(DType t);
// True when the staged 16-byte-load kernel applies (alignment and divisibility); else the generic one.
bool matvec_fast_ok(DType t, const MatvecLaunch& a);
// force_generic: the byte-load kernel even when the fast one applies (tests compare both).
cudaError_t matvec_launch(DType t, const MatvecLaunch& a, bool force_generic, cudaStream_t stream);
// out[r, k] BF16 (contiguous rows of k) = weight rows [0, n_rows) at w (row stride w_stride bytes).
cudaError_t dequant_bf16_launch(DType t, const void* w, int64_t w_stride, int64_t n_rows, int64_t k,
                                void* out, cudaStream_t stream);
// out[t, k] BF16 contiguous = x[t, k] F32 with row stride x_stride elements.
cudaError_t f32_to_bf16_launch(const float* x, int64_t x_stride, int64_t n_rows, int64_t k, void* out,
                               cudaStream_t stream);

}  // namespace ds::cuda
