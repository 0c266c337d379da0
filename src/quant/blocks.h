// Quantized block layouts, byte-exact with ggml-common.h (see the model spec, section 6).
// Every size is checked at compile time: a layout mistake here corrupts every weight silently.
#pragma once

#include <cstdint>

namespace ds::quant {

constexpr int kQK4_0 = 32;
constexpr int kQK5_0 = 32;
constexpr int kQK5_1 = 32;
constexpr int kQK8_0 = 32;
constexpr int kQK_K = 256;
constexpr int kKScaleBytes = 12;  // packed 6-bit scales and mins of Q4_K / Q5_K

#pragma pack(push, 1)
struct BlockQ4_0 {
  uint16_t d;              // fp16 scale
  uint8_t qs[kQK4_0 / 2];  // element j in the low nibble of qs[j], element j+16 in the high nibble
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];           // 5th bit of each of the 32 elements
  uint8_t qs[kQK5_0 / 2];
};
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kQK5_1 / 2];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK8_0];
};
struct BlockQ4_K {
  uint16_t d;     // super-block scale for the quantized scales
  uint16_t dmin;  // super-block scale for the quantized mins
  uint8_t scales[kKScaleBytes];
  uint8_t qs[kQK_K / 2];
};
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];      // low 4 bits
  uint8_t qh[kQK_K / 4];      // high 2 bits
  int8_t scales[kQK_K / 16];  // 8-bit sub-block scales
  uint16_t d;                 // fp16 super-block scale, stored last
};
// Activation format for K-quant dot products: float scale, int8 values, sums of groups of 16.
struct BlockQ8_K {
  float d;
  int8_t qs[kQK_K];
  int16_t bsums[kQK_K / 16];
};
#pragma pack(pop)

static_assert(sizeof(BlockQ4_0) == 18, "Q4_0 block must be 18 bytes");
static_assert(sizeof(BlockQ5_0) == 22, "Q5_0 block must be 22 bytes");
static_assert(sizeof(BlockQ5_1) == 24, "Q5_1 block must be 24 bytes");
static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 block must be 34 bytes");
static_assert(sizeof(BlockQ4_K) == 144, "Q4_K block must be 144 bytes");
static_assert(sizeof(BlockQ5_K) == 176, "Q5_K block must be 176 bytes");
static_assert(sizeof(BlockQ6_K) == 210, "Q6_K block must be 210 bytes");
static_assert(sizeof(BlockQ8_K) == 292, "Q8_K block must be 292 bytes");

}  // namespace ds::quant
