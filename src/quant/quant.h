// Reference (scalar) dequantization and quantization of rows, for every supported type.
// These define what correct means: the fast CPU and CUDA paths are tested against them.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace ds::quant {

// Types this module converts: F32, F16, BF16, Q4_0, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, Q8_K, and the
// device layout Q6_K_G4 (as Q6_K, regrouped).
bool is_convertible(DType t);

// dst[0..n) = values of the n elements at src. n must be a multiple of the type's block size.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

// Quantizes n floats into `dst` (dtype_row_bytes(t, n) bytes). Quality matches the standard
// reference quantizers: K-quants search per-sub-block scales and mins.
void quantize_row(DType t, const float* src, void* dst, int64_t n);

// The device layout Q6_K_G4 (quant/blocks.h GroupQ6_K4) of a row of n elements given as Q6_K bytes, and
// back: the same blocks regrouped, bit for bit. n must be a multiple of 1024.
void q6_k_to_g4(const void* src, void* dst, int64_t n);
void g4_to_q6_k(const void* src, void* dst, int64_t n);

// Multi-row helpers (rows of n_per_row elements, contiguous), parallel over rows with n_threads.
void quantize_rows(DType t, const float* src, void* dst, int64_t n_rows, int64_t n_per_row,
                   int n_threads = 1);
void dequantize_rows(DType t, const void* src, float* dst, int64_t n_rows, int64_t n_per_row,
                     int n_threads = 1);

}  // namespace ds::quant
