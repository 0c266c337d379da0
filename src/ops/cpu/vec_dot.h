// Quantized dot products on the CPU: the inner loop of every matrix-vector and matrix-matrix
// product. Activations are quantized on the fly to a type that pairs with the weight type, so that
// the dot product runs on integers (AVX-512 VNNI / AVX2 maddubs where present, scalar otherwise;
// chosen once at run time).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace ds::cpu {

// Activation type paired with a weight type:
//   Q4_0, Q5_0, Q5_1, Q8_0 -> Q8_0;  Q4_K, Q5_K, Q6_K -> Q8_K;  F32, F16, BF16 -> F32.
DType vec_dot_act_type(DType weight_type);
// Bytes of one activation row of n elements in the paired type.
int64_t vec_dot_act_row_bytes(DType weight_type, int64_t n);
// Quantizes one activation row x[0..n) into the paired type (dst: vec_dot_act_row_bytes bytes).
void vec_dot_quantize_act(DType weight_type, const float* x, void* dst, int64_t n);

// Returns sum_k w[k] * a[k] for one weight row (n elements of weight_type) and one activation row
// prepared by vec_dot_quantize_act.
float vec_dot(DType weight_type, int64_t n, const void* w_row, const void* act_row);

// A tile of a matrix product: for weight rows r in [r0, r1) and tokens t in [0, n_tokens):
//   y[t * y_stride + r] = dot(W row r, act row t)
// W rows are w_row_bytes apart, activation rows act_row_bytes apart. Loops are blocked so each
// weight row is read from memory once per tile, not once per token.
void gemm_tile(DType weight_type, int64_t n, const void* w, size_t w_row_bytes, int64_t r0, int64_t r1,
               const void* act, size_t act_row_bytes, int64_t n_tokens, float* y, int64_t y_stride);

// Which implementation vec_dot dispatches to on this machine: "avx512vnni", "avx2", "scalar".
const char* vec_dot_isa();
// Forces the scalar path (tests compare every ISA path against it).
void vec_dot_force_scalar(bool on);

}  // namespace ds::cpu
