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
  // Device scratch for the int8 activations of the q8 kernel (matvec_q8_act_bytes(k, n_tokens) bytes,
  // 16-byte aligned). Without it the q8 kernel does not apply. Written before the product, so it must
  // not be in use by other work on the stream.
  void* act = nullptr;
  int64_t act_bytes = 0;
};

constexpr int kMatvecMaxTokens = 16;
constexpr int kMatvecQ8MaxTokens = 8;

// The matrix-vector kernels, fastest first; a launch takes the first one whose conditions hold,
// starting from the one asked for (the three q8 entries share their conditions and fall back to kStaged).
enum class MatvecKernel : uint8_t {
  kQ8,       // int8 activations + dp4a, the version matvec_q8_pick_version chooses for the shape:
             // quantized weights, k % block == 0, w 16-byte aligned, w_stride % 16 (Q4_K, Q5_K) or
             // % 2, 1..8 tokens, act scratch given
  kQ8v4,     // kQ8 forced to v4 (matvec_q8.cuh: per-warp shared-memory ring)
  kQ8v5,     // kQ8 forced to v5 (matvec_q8v5.cuh: register ring; split-K where the pick would take it)
  kStaged,   // F32 activations, 16-byte loads staged in shared memory (v3): matvec_fast_ok
  kGeneric,  // F32 activations, byte loads, any alignment (v1)
};

// Versions of the q8 product (same activations, arguments and conditions).
enum class MatvecQ8Version : uint8_t {
  kV4,            // shared-memory ring per warp (cp.async), 4 rows per warp, 16 rows per CTA
  kV5,            // 16-byte loads into a register ring, 2 rows per warp (Q6_K: 1), one CTA per 4 warps' rows
  kV5Persistent,  // kV5 on a grid of the CTAs resident at once, striding over the rows
  kV5SplitK,      // kV5 with 2 or 4 warps per row group (split over k), for matrices with few rows
  kV4Whole,       // kV4 with a ring as deep as a row of kMatvecQ8WholeMaxK elements, 2 warps per CTA (1
                  // where that ring is over 48 KB: Q6_K, Q8_0): a warp issues every weight copy of its
                  // rows before the dependency wait; one token only (more tokens run kV4)
  kMma,           // Q6_K_G4 on int8 tensor cores (matvec_mma.cuh matvec_mma_q6k), 16 rows per CTA; the
                  // other types run kV4
};
// The longest row kV4Whole holds in flight whole.
constexpr int64_t kMatvecQ8WholeMaxK = 6144;
const char* matvec_q8_version_name(MatvecQ8Version v);
// The version MatvecKernel::kQ8 runs for a weight of n_rows x k elements of type t at n_tokens tokens:
// the one table to set from the workbench (kernels/matvec_q.cu, section v5).
MatvecQ8Version matvec_q8_pick_version(DType t, int64_t n_rows, int64_t k, int n_tokens);

// Types the matrix kernels decode.
bool matvec_supports(DType t);
// Types the q8 kernel decodes: Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K, Q6_K_G4.
bool matvec_q8_supports(DType t);
// True when the staged 16-byte-load kernel applies (alignment and divisibility); else the generic one.
bool matvec_fast_ok(DType t, const MatvecLaunch& a);
// True when the q8 kernel applies (see MatvecKernel::kQ8).
bool matvec_q8_ok(DType t, const MatvecLaunch& a);
// The kernel matvec_launch runs for `a` when asked for `fastest`.
MatvecKernel matvec_pick(DType t, const MatvecLaunch& a, MatvecKernel fastest);
// Bytes of q8 activation scratch for n_rows rows of k elements (k % 32 == 0): int8 codes
// [n_rows, k] at offset 0, then float2 (d, d * sum of the block's codes) per 32-element block
// [n_rows, k / 32] at matvec_q8_ds_offset(k, n_rows).
int64_t matvec_q8_act_bytes(int64_t k, int64_t n_rows);
int64_t matvec_q8_ds_offset(int64_t k, int64_t n_rows);

cudaError_t matvec_launch(DType t, const MatvecLaunch& a, MatvecKernel fastest, cudaStream_t stream);
// The F32-activation kernels only (v3, or v1 with force_generic), as before the q8 kernel existed.
inline cudaError_t matvec_launch(DType t, const MatvecLaunch& a, bool force_generic, cudaStream_t stream) {
  return matvec_launch(t, a, force_generic ? MatvecKernel::kGeneric : MatvecKernel::kStaged, stream);
}

// The q8 product alone: `a.act` already holds x quantized by quantize_q8_launch (same k, n_tokens), so
// several weights that share an input quantize it once. cudaErrorInvalidValue unless matvec_q8_ok.
// `which` is kQ8 (the picked version), kQ8v4 or kQ8v5; the last form runs one version (tests, benches).
cudaError_t matvec_q8_product_launch(DType t, const MatvecLaunch& a, cudaStream_t stream);
cudaError_t matvec_q8_product_launch(DType t, const MatvecLaunch& a, MatvecKernel which, cudaStream_t stream);
cudaError_t matvec_q8_product_launch_version(DType t, const MatvecLaunch& a, MatvecQ8Version v,
                                             cudaStream_t stream);

// Two independent one-token q8 products of one input (the same k and a.act) in one launch, so the
// second does not wait for the first to drain: where each would run v4 and the pair of types has a
// kernel (matvec.cu DS_Q8_PAIRS). The outputs equal two matvec_q8_product_launch calls bit for bit.
// The launch returns cudaErrorInvalidValue where matvec_q8_pair_applies is false.
bool matvec_q8_pair_applies(DType t1, const MatvecLaunch& a1, DType t2, const MatvecLaunch& a2);
cudaError_t matvec_q8_pair_launch(DType t1, const MatvecLaunch& a1, DType t2, const MatvecLaunch& a2,
                                  cudaStream_t stream);

// ---- the tensor-core products (matvec_mma.cuh): Q4_K weights, 1..8 tokens, FP16 activations (the
// Q6_K_G4 one runs as a q8 version, MatvecQ8Version::kMma) ----
// Bytes of the packed activations of k elements (mma_pack_launch), for any 1..8 tokens.
int64_t matvec_mma_act_bytes(int64_t k);
// True when the tensor-core product applies to `a` with a.act holding packed activations: Q4_K, k % 256,
// w and w_stride 16-byte aligned, 1..8 tokens, act 16-byte aligned of matvec_mma_act_bytes(k).
bool matvec_mma_ok(DType t, const MatvecLaunch& a);
// The fewest tokens at which the products take it instead of the int8 kernels: kMatvecMmaMinTokens,
// or DELTASERVE_MATVEC_MMA ("all": 1, a digit 1..8: that many, "0" / "off": never; for measurements).
// Set from kernels/matvec_mma_bench.cu and `bench --verify` (H100, 2026-11-27, docs/perf-gpu.md): the
// int8 kernels run 5..8 tokens as 8, where this one is ahead on every 27B / 35B-A3B product shape
// (17408 x 5120: 27.7 against 43.6 us; 5120 x 17408: 32.8 against 66.1; 8192 x 2048: 7.4 against
// 15.0); at 4 tokens it is ahead or level (a 27B verify of 4 tokens 13.10 against 13.86 ms a round,
// 35B-A3B 4.96 against 5.17); at 3 the int8 kernels were ahead on the 27B (12.47 against 12.60).
constexpr int kMatvecMmaMinTokens = 4;
// Q6_K_G4 (matvec_mma_q6k, on quantize_q8's activations: MatvecQ8Version::kMma) from one token more:
// at 4 tokens the workbench had it behind the int8 kernels on the 27B's Q6_K shapes (5120 x 17408
// 47.1 against 43.9 us; the output, 248320 x 5120, 414 against 374) and a 27B verify of 4 tokens was
// level (13.10 against 13.05 ms a round); at 5 it is ahead (13.40 against 13.87; at 8 14.45 against
// 15.63).
constexpr int kMatvecMmaQ6MinTokens = 5;
// The fewest tokens at which type t's products take the tensor cores: the constants above, or
// DELTASERVE_MATVEC_MMA's count for both types.
int matvec_mma_min_tokens(DType t = DType::Q4_K);
bool matvec_mma_wanted(DType t, int64_t k, int n_tokens);
// x [n_tokens, k] (silu(x) * up with `up`), row stride x_stride elements, packed into `act`.
cudaError_t mma_pack_launch(const float* x, int64_t x_stride, const float* up, int n_tokens, int64_t k, void* act,
                            cudaStream_t stream);
// The product on activations packed by mma_pack_launch (same k and n_tokens); cudaErrorInvalidValue
// unless matvec_mma_ok. With n_more parts `more`, a's rows are several products' whose weights follow
// each other in memory, each with its own output: rows from more[i].first_row on go to more[i].y (row
// stride y_stride) up to the next part's first row, a's y taking those before more[0]. Parts start at
// multiples of kMatvecMmaPartRows, in increasing order, at most kMatvecMmaMaxParts in all, and are all
// under or all at least kMatvecMmaWideRows rows (the CTA shape of a product alone: so each output is
// what its own launch gives, bit for bit); otherwise cudaErrorInvalidValue.
struct MatvecMmaPart {
  int64_t first_row;
  float* y;
  int64_t y_stride;
};
constexpr int kMatvecMmaMaxParts = 4;
constexpr int64_t kMatvecMmaPartRows = 16;  // a part's first row is a multiple of this (a CTA's rows)
constexpr int64_t kMatvecMmaWideRows = 8192;  // from here 4 warps of 3 stages a CTA, below 8 of 2
cudaError_t matvec_mma_product_launch(DType t, const MatvecLaunch& a, cudaStream_t stream,
                                      const MatvecMmaPart* more = nullptr, int n_more = 0);

// q8 activation blocks of rows [0, n_rows) of x (k % 32 == 0, row stride x_stride elements) into `act`
// (layout of matvec_q8_act_bytes). SwiGLU mode when `up` is set: the values are silu(x) * up (up rows at
// the same stride). With `ids`, row r is zeros when ids[r] is outside [0, n_expert).
cudaError_t quantize_q8_launch(const float* x, int64_t x_stride, const float* up, int64_t n_rows, int64_t k,
                               void* act, const int32_t* ids, int n_expert, cudaStream_t stream);

// out[r, k] BF16 (contiguous rows of k) = weight rows [0, n_rows) at w (row stride w_stride bytes).
cudaError_t dequant_bf16_launch(DType t, const void* w, int64_t w_stride, int64_t n_rows, int64_t k,
                                void* out, cudaStream_t stream);
// out[t, k] BF16 contiguous = x[t, k] F32 with row stride x_stride elements.
cudaError_t f32_to_bf16_launch(const float* x, int64_t x_stride, int64_t n_rows, int64_t k, void* out,
                               cudaStream_t stream);

}  // namespace ds::cuda
