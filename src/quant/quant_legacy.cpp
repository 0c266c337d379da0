// Reference conversion of the 32-element formats: Q4_0, Q5_0, Q5_1, Q8_0.
// Quantizers follow the standard reference rules (sign-keeping max for the symmetric 4/5-bit types,
// so the largest-magnitude element lands exactly on the -8 / -16 code), which keeps files made here
// interchangeable with files made by other GGUF tools.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/half.h"
#include "quant/quant_internal.h"

namespace ds::quant {
namespace {

uint32_t load_qh(const uint8_t* qh) {
  uint32_t v;
  std::memcpy(&v, qh, 4);  // little-endian host
  return v;
}

// Largest |x| of a block and the signed value that has it.
void signed_amax(const float* x, int n, float* amax, float* max) {
  *amax = 0.0f;
  *max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (std::fabs(x[j]) > *amax) {
      *amax = std::fabs(x[j]);
      *max = x[j];
    }
  }
}

}  // namespace

void dequantize_row_q4_0(const BlockQ4_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK4_0) {
    const float d = fp16_to_f32(x[i].d);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      y[j] = static_cast<float>((x[i].qs[j] & 0xF) - 8) * d;
      y[j + kQK4_0 / 2] = static_cast<float>((x[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void dequantize_row_q5_0(const BlockQ5_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK5_0) {
    const float d = fp16_to_f32(x[i].d);
    const uint32_t qh = load_qh(x[i].qh);
    for (int j = 0; j < kQK5_0 / 2; ++j) {
      const int h0 = static_cast<int>((qh >> j) & 1) << 4;
      const int h1 = static_cast<int>((qh >> (j + 16)) & 1) << 4;
      y[j] = static_cast<float>(((x[i].qs[j] & 0xF) | h0) - 16) * d;
      y[j + kQK5_0 / 2] = static_cast<float>(((x[i].qs[j] >> 4) | h1) - 16) * d;
    }
  }
}

void dequantize_row_q5_1(const BlockQ5_1* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK5_1) {
    const float d = fp16_to_f32(x[i].d);
    const float m = fp16_to_f32(x[i].m);
    const uint32_t qh = load_qh(x[i].qh);
    for (int j = 0; j < kQK5_1 / 2; ++j) {
      const int h0 = static_cast<int>((qh >> j) & 1) << 4;
      const int h1 = static_cast<int>((qh >> (j + 16)) & 1) << 4;
      y[j] = static_cast<float>((x[i].qs[j] & 0xF) | h0) * d + m;
      y[j + kQK5_1 / 2] = static_cast<float>((x[i].qs[j] >> 4) | h1) * d + m;
    }
  }
}

void dequantize_row_q8_0(const BlockQ8_0* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK8_0) {
    const float d = fp16_to_f32(x[i].d);
    for (int j = 0; j < kQK8_0; ++j) y[j] = static_cast<float>(x[i].qs[j]) * d;
  }
}

void quantize_row_q4_0(const float* x, BlockQ4_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK4_0) {
    float amax, max;
    signed_amax(x, kQK4_0, &amax, &max);
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_fp16(d);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      // The truncating cast after +8.5 rounds to nearest for the in-range codes 0..16.
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j + kQK4_0 / 2] * id + 8.5f)));
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void quantize_row_q5_0(const float* x, BlockQ5_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK5_0) {
    float amax, max;
    signed_amax(x, kQK5_0, &amax, &max);
    const float d = max / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_fp16(d);
    uint32_t qh = 0;
    for (int j = 0; j < kQK5_0 / 2; ++j) {
      const int q0 = std::min(31, static_cast<int>(static_cast<int8_t>(x[j] * id + 16.5f)));
      const int q1 = std::min(31, static_cast<int>(static_cast<int8_t>(x[j + kQK5_0 / 2] * id + 16.5f)));
      y[i].qs[j] = static_cast<uint8_t>((q0 & 0xF) | ((q1 & 0xF) << 4));
      qh |= static_cast<uint32_t>((q0 >> 4) & 1) << j;
      qh |= static_cast<uint32_t>((q1 >> 4) & 1) << (j + kQK5_0 / 2);
    }
    std::memcpy(y[i].qh, &qh, 4);
  }
}

void quantize_row_q5_1(const float* x, BlockQ5_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK5_1) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < kQK5_1; ++j) {
      lo = std::min(lo, x[j]);
      hi = std::max(hi, x[j]);
    }
    const float d = (hi - lo) / 31.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_fp16(d);
    y[i].m = f32_to_fp16(lo);
    uint32_t qh = 0;
    for (int j = 0; j < kQK5_1 / 2; ++j) {
      const int q0 = std::clamp(static_cast<int>((x[j] - lo) * id + 0.5f), 0, 31);
      const int q1 = std::clamp(static_cast<int>((x[j + kQK5_1 / 2] - lo) * id + 0.5f), 0, 31);
      y[i].qs[j] = static_cast<uint8_t>((q0 & 0xF) | ((q1 & 0xF) << 4));
      qh |= static_cast<uint32_t>((q0 >> 4) & 1) << j;
      qh |= static_cast<uint32_t>((q1 >> 4) & 1) << (j + kQK5_1 / 2);
    }
    std::memcpy(y[i].qh, &qh, 4);
  }
}

void quantize_row_q8_0(const float* x, BlockQ8_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK8_0) {
    float amax = 0.0f;
    for (int j = 0; j < kQK8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_fp16(d);
    for (int j = 0; j < kQK8_0; ++j) y[i].qs[j] = static_cast<int8_t>(std::lrintf(x[j] * id));
  }
}

}  // namespace ds::quant
