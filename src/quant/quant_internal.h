// Per-type row converters of the quant module and small helpers shared with the CPU dot products.
// Private to src/quant and src/ops/cpu; everything else goes through quant.h.
#pragma once

#include <cmath>
#include <cstdint>

#include "quant/blocks.h"

namespace ds::quant {

// Round to nearest, ties to even (the current FP rounding mode, which is never changed here).
inline int nearest_int(float x) { return static_cast<int>(std::lrintf(x)); }

// Unpacks the 6-bit scale and min of sub-block j (0..7) from a Q4_K / Q5_K scales[12] array.
inline void k_scale_min(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// nb = number of blocks in the row.
void dequantize_row_q4_0(const BlockQ4_0* x, float* y, int64_t nb);
void dequantize_row_q5_0(const BlockQ5_0* x, float* y, int64_t nb);
void dequantize_row_q5_1(const BlockQ5_1* x, float* y, int64_t nb);
void dequantize_row_q8_0(const BlockQ8_0* x, float* y, int64_t nb);
void dequantize_row_q4_k(const BlockQ4_K* x, float* y, int64_t nb);
void dequantize_row_q5_k(const BlockQ5_K* x, float* y, int64_t nb);
void dequantize_row_q6_k(const BlockQ6_K* x, float* y, int64_t nb);
void dequantize_row_q8_k(const BlockQ8_K* x, float* y, int64_t nb);

void quantize_row_q4_0(const float* x, BlockQ4_0* y, int64_t nb);
void quantize_row_q5_0(const float* x, BlockQ5_0* y, int64_t nb);
void quantize_row_q5_1(const float* x, BlockQ5_1* y, int64_t nb);
void quantize_row_q8_0(const float* x, BlockQ8_0* y, int64_t nb);
void quantize_row_q4_k(const float* x, BlockQ4_K* y, int64_t nb);
void quantize_row_q5_k(const float* x, BlockQ5_K* y, int64_t nb);
void quantize_row_q6_k(const float* x, BlockQ6_K* y, int64_t nb);
void quantize_row_q8_k(const float* x, BlockQ8_K* y, int64_t nb);

}  // namespace ds::quant
