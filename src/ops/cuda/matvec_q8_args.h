// Arguments of the int8-activation matrix-vector kernels (v4 in matvec_q8.cuh, v5 in matvec_q8v5.cuh).
// Non-obvious choice: no CUDA type appears here (xds is a void pointer to float2 pairs), so the host
// emulation of v5 in the tests compiles without the CUDA headers.
#pragma once

#include <cstdint>

namespace ds::cuda::kern {

struct MatvecQ8Args {
  const uint8_t* w;       // [n_rows] rows of k elements of the weight type (gathered: expert 0)
  int64_t w_stride;       // bytes between rows
  const int8_t* xq;       // [activation rows, k] codes (quantize_q8)
  const void* xds;        // float2 [activation rows, k / 32] (d, d * sum q)
  float* y;               // [n_tokens or slots, y_stride]
  int64_t y_stride;       // elements between output rows
  int64_t n_rows;
  int64_t k;              // multiple of the type's block (256 for K-quants, else 32)
  int n_tokens;           // activation rows 1 .. kNT (gathered: 1)
  const int32_t* ids = nullptr;  // gathered: expert id of slot blockIdx.y; ids outside [0, n_expert) skip it
  int64_t w_expert_stride = 0;   // bytes between experts
  int n_expert = 0;
  int x_div = 1;                 // gathered: slot s multiplies activation row s / x_div, writes y row s
};

}  // namespace ds::cuda::kern
