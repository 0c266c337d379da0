// Quantized block layouts, byte-exact with ggml-common.h (see the model spec, section 6).
// Every size is checked at compile time: a layout mistake here corrupts every weight silently.
#pragma once

#include <cstddef>
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
// Q6_K_G4 (a device layout, core/dtype.h): four consecutive Q6_K blocks of a row, 1024 elements, with
// their parts gathered so that every part of every block starts 16-byte aligned when the group does
// (a Q6_K block is 210 bytes, so in a file only every eighth block starts 16-byte aligned). Block b of
// the group is {ql[b], qh[b], scales[b], d[b]}; 8 bytes of padding make the group 53 x 16 bytes.
struct GroupQ6_K4 {
  uint8_t ql[4][kQK_K / 2];
  uint8_t qh[4][kQK_K / 4];
  int8_t scales[4][kQK_K / 16];
  uint16_t d[4];
  uint8_t pad[8];  // zero
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
static_assert(sizeof(GroupQ6_K4) == 848 && sizeof(GroupQ6_K4) % 16 == 0, "Q6_K_G4 group must be 53 x 16 bytes");
static_assert(offsetof(GroupQ6_K4, qh) == 512 && offsetof(GroupQ6_K4, scales) == 768 && offsetof(GroupQ6_K4, d) == 832,
              "Q6_K_G4 parts at 16-byte multiples");
// The byte offsets of a GroupQ6_K4's parts, for the device decoders (block b's part at offset + b times
// the part's size).
constexpr int kGroupQ6K4Bytes = sizeof(GroupQ6_K4);
constexpr int kGroupQ6K4Qh = offsetof(GroupQ6_K4, qh);
constexpr int kGroupQ6K4Scales = offsetof(GroupQ6_K4, scales);
constexpr int kGroupQ6K4D = offsetof(GroupQ6_K4, d);
static_assert(sizeof(BlockQ8_K) == 292, "Q8_K block must be 292 bytes");

}  // namespace ds::quant
