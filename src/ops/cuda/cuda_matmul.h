// CUDA matrix product for the ops layer: y[t, r] = dot(W row r, x row t) with quantized or float
// weights. Compiles without CUDA; the definitions exist only with DS_HAVE_CUDA.
// Non-obvious choices: small token counts (decode) run a matrix-vector kernel that reads each weight
// byte once; for quantized weights and up to 8 tokens that kernel first quantizes the activations to
// int8 blocks of 32 (one float scale each, as the CPU path does) and takes integer dot products, which
// adds a relative error of about 1/256 per block (tolerances in tests/cuda_matmul_test.cpp). Larger
// token counts dequantize weight tiles to BF16 and call cuBLAS with F32 accumulation. The crossover
// kMatmulGemmMinTokens was measured (docs/perf-gpu.md).
#pragma once

#include <cstdint>
#include <span>

#include "core/status.h"
#include "core/tensor.h"
#include "ops/cuda/cuda_device.h"

namespace ds::cuda {

enum class MatmulPath : uint8_t {
  kAuto,        // matvec below kMatmulGemmMinTokens tokens, GEMM from there
  kMatvec,      // fastest matrix-vector kernel that applies: q8, staged, generic (n_tokens <= 16)
  kMatvecF32,   // matrix-vector with F32 activations: staged, else generic (n_tokens <= 16)
  kGeneric,     // byte-load matrix-vector kernel, any alignment (n_tokens <= 16; for tests)
  kGemm,        // BF16 dequantize + cuBLAS (F32 weights: cuBLAS in F32)
};

// The kernel a matmul call runs (matmul_kernel): for tests, benchmarks and logs.
enum class MatmulKernel : uint8_t {
  kMatvecQ8,       // int8 activations, dp4a: quantized weights, 1..8 tokens, aligned rows
  kMatvecMma,      // int8 codes as FP16, tensor cores: Q4_K weights, 4..8 tokens (matvec_mma_wanted)
  kMatvecStaged,   // F32 activations, 16-byte staged loads
  kMatvecGeneric,  // F32 activations, byte loads
  kGemm,           // BF16 tiles + cuBLAS
};
const char* matmul_kernel_name(MatmulKernel k);

constexpr int64_t kMatmulGemmMinTokens = 9;
constexpr int64_t kMatmulMaxMatvecTokens = 16;

// Weight types the CUDA matrix product accepts: F32, F16, BF16, Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K and
// the device layout Q6_K_G4.
bool matmul_supported(DType t);

// w: [k, n_rows] (ne[0] = k, rows at nb[1]), on a CUDA device.
// x: [k, n_tokens] F32, rows at nb[1], same device.  y: [n_rows, n_tokens] F32, same device.
// Asynchronous on `stream`; y must not alias w or x. Errors name the op and all three shapes.
Status matmul(const TensorView& w, const TensorView& x, const TensorView& y, const Stream& stream,
              MatmulPath path = MatmulPath::kAuto);
// The same on a raw cudaStream_t (`stream`, null = the default stream) of `device`.
Status matmul_on(const TensorView& w, const TensorView& x, const TensorView& y, int device, void* stream,
                 MatmulPath path = MatmulPath::kAuto);
// The same with caller-owned device scratch for the int8 activations of the q8 kernel
// (matmul_scratch_bytes, 16-byte aligned); without it (null or too small) the scratch comes from the
// device's caching allocator. Pass a buffer that outlives the work when the call is captured into a
// CUDA graph: the graph keeps using the address after the call returns.
Status matmul_on(const TensorView& w, const TensorView& x, const TensorView& y, int device, void* stream,
                 MatmulPath path, void* scratch, int64_t scratch_bytes);

// ys[i] = ws[i] x for every i (ops/matmul.h matmul_many), each product checked as matmul_on checks it.
// Matrix-vector path: x is quantized to int8 blocks once (activation scratch from the caching
// allocator) and every weight the q8 kernel takes reads that copy; the others run matmul_on. At one token
// weights that follow each other in memory run as one product, and two such runs of different types
// side by side in one launch where matvec_q8_pair_applies (matvec_launch.h). GEMM path:
// x is converted to BF16 once and every GEMM reads it. Other explicit paths run matmul_on per weight.
// With `act` (the q8 activations of x, matmul_scratch_bytes(.., k, n_tokens) bytes, 16-byte aligned, as
// the norms of cuda_ops.h write them) the q8 products read it instead of quantizing x. Weights the
// tensor-core kernel takes (kMatvecMma) share one packed copy of x instead.
Status matmul_many_on(std::span<const TensorView> ws, const TensorView& x, std::span<const TensorView> ys,
                      int device, void* stream, MatmulPath path = MatmulPath::kAuto, const TensorView* act = nullptr);

// y = w (silu(gate) * up) (ops/matmul.h matmul_swiglu); gate, up [k, n_tokens] F32 contiguous. Where the q8 kernel applies, the SwiGLU happens inside the activation quantizer
// (gate is left as it was); otherwise gate is overwritten with silu(gate) * up and matmul_on runs.
Status matmul_swiglu_on(const TensorView& w, const TensorView& gate, const TensorView& up, const TensorView& y,
                        int device, void* stream, MatmulPath path = MatmulPath::kAuto);

// Scratch bytes the q8 kernel needs for k x n_tokens activations with weight type t; 0 when it does not
// run for that type and token count. Layout: int8 codes [n_tokens, k] at offset 0, then float2
// (d, d * sum of the block's codes) per 32-element block [n_tokens, k / 32] at
// matmul_scratch_ds_offset(k, n_tokens). Where the tensor-core kernel runs instead (kMatvecMma), the
// bytes of its packed activations (matvec_mma_act_bytes).
int64_t matmul_scratch_bytes(DType t, int64_t k, int64_t n_tokens);
int64_t matmul_scratch_ds_offset(int64_t k, int64_t n_tokens);
// That act can hold the q8 activations of n_rows rows of k (matvec_q8_act_bytes(k, n_rows) bytes, 16-byte
// aligned), as every op writing or reading them needs; invalid_argument naming op otherwise.
Status check_q8_act(const char* op, const TensorView& act, int64_t k, int64_t n_rows);

// The kernel matmul / matmul_on would run for these operands and path (the operands must be valid).
MatmulKernel matmul_kernel(const TensorView& w, const TensorView& x, const TensorView& y,
                           MatmulPath path = MatmulPath::kAuto);

}  // namespace ds::cuda
