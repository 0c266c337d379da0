// CUDA matrix product for the ops layer: y[t, r] = dot(W row r, x row t) with quantized or float
// weights. Compiles without CUDA; the definitions exist only with DS_HAVE_CUDA.
// Non-obvious choice: small token counts (decode) run the matrix-vector kernel that reads each weight
// byte once; larger ones dequantize weight tiles to BF16 and call cuBLAS with F32 accumulation. The
// crossover kMatmulGemmMinTokens was measured (docs/perf-gpu.md).
#pragma once

#include <cstdint>

#include "core/status.h"
#include "core/tensor.h"
#include "ops/cuda/cuda_device.h"

namespace ds::cuda {

enum class MatmulPath : uint8_t {
  kAuto,     // matvec below kMatmulGemmMinTokens tokens, GEMM from there
  kMatvec,   // staged matrix-vector kernel (n_tokens <= 16)
  kGeneric,  // byte-load matrix-vector kernel, any alignment (n_tokens <= 16; for tests)
  kGemm,     // BF16 dequantize + cuBLAS (F32 weights: cuBLAS in F32)
};

constexpr int64_t kMatmulGemmMinTokens = 9;
constexpr int64_t kMatmulMaxMatvecTokens = 16;

// Weight types the CUDA matrix product accepts: F32, F16, BF16, Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K.
bool matmul_supported(DType t);

// w: [k, n_rows] (ne[0] = k, rows at nb[1]), on a CUDA device.
// x: [k, n_tokens] F32, rows at nb[1], same device.  y: [n_rows, n_tokens] F32, same device.
// Asynchronous on `stream`; y must not alias w or x. Errors name the op and all three shapes.
Status matmul(const TensorView& w, const TensorView& x, const TensorView& y, const Stream& stream,
              MatmulPath path = MatmulPath::kAuto);
// The same on a raw cudaStream_t (`stream`, null = the default stream) of `device`.
Status matmul_on(const TensorView& w, const TensorView& x, const TensorView& y, int device, void* stream,
                 MatmulPath path = MatmulPath::kAuto);

}  // namespace ds::cuda
