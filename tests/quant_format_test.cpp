// Hand-built blocks: raw bytes laid out from the model spec's section 6 (offsets written out here,
// not taken from blocks.h) that must dequantize to values computed by hand from the same text.
// These pin nibble order, qh bit positions, 6-bit scale packing, and Q6_K's trailing d.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/half.h"
#include "quant/blocks.h"
#include "quant/quant.h"

namespace ds::quant {
namespace {

void put_u16(std::vector<uint8_t>& b, size_t off, uint16_t v) {
  b[off] = static_cast<uint8_t>(v & 0xFF);
  b[off + 1] = static_cast<uint8_t>(v >> 8);
}

std::vector<float> dequant(DType t, const std::vector<uint8_t>& bytes, int64_t n) {
  EXPECT_EQ(static_cast<int64_t>(bytes.size()), dtype_row_bytes(t, n));
  std::vector<float> out(static_cast<size_t>(n));
  dequantize_row(t, bytes.data(), out.data(), n);
  return out;
}

constexpr uint16_t kHalfOne = 0x3C00, kHalfHalf = 0x3800, kHalfQuarter = 0x3400, kHalfMinusOne = 0xBC00;

TEST(QuantFormat, Q4_0LowNibbleFirstHalf) {
  std::vector<uint8_t> b(18);
  put_u16(b, 0, kHalfHalf);  // d = 0.5
  for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const auto y = dequant(DType::Q4_0, b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * (j - 8)) << j;
    EXPECT_EQ(y[j + 16], 0.5f * (15 - j - 8)) << j;
  }
}

TEST(QuantFormat, Q8_0) {
  std::vector<uint8_t> b(34);
  put_u16(b, 0, kHalfQuarter);
  for (int j = 0; j < 32; ++j) b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(4 * j - 128));
  const auto y = dequant(DType::Q8_0, b, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], 0.25f * (4 * j - 128)) << j;
}

TEST(QuantFormat, Q5_0HighBitsFromQh) {
  std::vector<uint8_t> b(22);
  put_u16(b, 0, kHalfOne);
  const uint32_t qh = 0x80000001u | (1u << 17);  // elements 0, 17, 31 get the 5th bit
  for (int k = 0; k < 4; ++k) b[2 + k] = static_cast<uint8_t>(qh >> (8 * k));
  for (int j = 0; j < 16; ++j) b[6 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const auto y = dequant(DType::Q5_0, b, 32);
  for (int j = 0; j < 16; ++j) {
    const int h0 = (qh >> j) & 1, h1 = (qh >> (j + 16)) & 1;
    EXPECT_EQ(y[j], static_cast<float>(j + 16 * h0 - 16)) << j;
    EXPECT_EQ(y[j + 16], static_cast<float>(15 - j + 16 * h1 - 16)) << j;
  }
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[31], 0.0f);   // high nibble of qs[15] is 0, bit 31 set: 0 + 16 - 16
  EXPECT_EQ(y[17], 14.0f);  // high nibble of qs[1] is 14, bit 17 set: 14 + 16 - 16
}

TEST(QuantFormat, Q5_1OffsetByMin) {
  std::vector<uint8_t> b(24);
  put_u16(b, 0, kHalfHalf);      // d = 0.5
  put_u16(b, 2, kHalfMinusOne);  // m = -1
  const uint32_t qh = 0x0000FFFFu;  // first 16 elements get the 5th bit
  for (int k = 0; k < 4; ++k) b[4 + k] = static_cast<uint8_t>(qh >> (8 * k));
  for (int j = 0; j < 16; ++j) b[8 + j] = static_cast<uint8_t>(j | (j << 4));
  const auto y = dequant(DType::Q5_1, b, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * (j + 16) - 1.0f) << j;
    EXPECT_EQ(y[j + 16], 0.5f * j - 1.0f) << j;
  }
}

// Sub-block scales and mins exercising the high two bits of the 6-bit fields.
constexpr int kSc[8] = {1, 2, 3, 4, 17, 33, 50, 63};
constexpr int kM[8] = {0, 5, 10, 63, 16, 32, 48, 7};
// Their packing, worked out by hand from the spec's bullet list.
constexpr uint8_t kPacked[12] = {0x41, 0x82, 0xC3, 0xC4, 0x40, 0x85, 0xCA, 0x3F, 0x01, 0x01, 0x02, 0x7F};

TEST(QuantFormat, Q4_KScalePackingAndNibbleOrder) {
  std::vector<uint8_t> b(144);
  put_u16(b, 0, kHalfOne);   // d
  put_u16(b, 2, kHalfHalf);  // dmin
  std::memcpy(&b[4], kPacked, 12);
  for (int i = 0; i < 128; ++i) b[16 + i] = static_cast<uint8_t>((i & 0xF) | ((15 - (i & 0xF)) << 4));
  const auto y = dequant(DType::Q4_K, b, 256);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      const int lo = l & 0xF, hi = 15 - lo;  // qs[32c + l]
      EXPECT_EQ(y[64 * c + l], 1.0f * kSc[2 * c] * lo - 0.5f * kM[2 * c]) << c << " " << l;
      EXPECT_EQ(y[64 * c + 32 + l], 1.0f * kSc[2 * c + 1] * hi - 0.5f * kM[2 * c + 1]) << c << " " << l;
    }
  }
}

TEST(QuantFormat, Q5_KHighBitPositions) {
  std::vector<uint8_t> b(176);
  put_u16(b, 0, kHalfHalf);  // d
  put_u16(b, 2, kHalfOne);   // dmin
  std::memcpy(&b[4], kPacked, 12);
  for (int l = 0; l < 32; ++l) b[16 + l] = static_cast<uint8_t>(l * 37 + 11);         // qh
  for (int i = 0; i < 128; ++i) b[48 + i] = static_cast<uint8_t>((i * 5 + 3) & 0xFF);  // qs
  const auto y = dequant(DType::Q5_K, b, 256);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      const int qs = b[48 + 32 * c + l], qh = b[16 + l];
      const int q0 = (qs & 0xF) + 16 * ((qh >> (2 * c)) & 1);
      const int q1 = (qs >> 4) + 16 * ((qh >> (2 * c + 1)) & 1);
      EXPECT_EQ(y[64 * c + l], 0.5f * kSc[2 * c] * q0 - 1.0f * kM[2 * c]) << c << " " << l;
      EXPECT_EQ(y[64 * c + 32 + l], 0.5f * kSc[2 * c + 1] * q1 - 1.0f * kM[2 * c + 1]) << c << " " << l;
    }
  }
}

TEST(QuantFormat, Q6_KScaleLastAndBitSplit) {
  std::vector<uint8_t> b(210);
  for (int i = 0; i < 128; ++i) b[i] = static_cast<uint8_t>(i * 7 + 3);          // ql
  for (int i = 0; i < 64; ++i) b[128 + i] = static_cast<uint8_t>(i * 13 + 5);    // qh
  for (int s = 0; s < 16; ++s) b[192 + s] = static_cast<uint8_t>(static_cast<int8_t>(3 * s - 20));
  put_u16(b, 208, kHalfHalf);  // d is the last field
  const auto y = dequant(DType::Q6_K, b, 256);
  // Element e: half h = e / 128, r = e % 128, quarter k = r / 32, l = r % 32.
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, r = e % 128, k = r / 32, l = r % 32;
    const int ql = b[64 * h + l + (k % 2) * 32];
    const int low = k < 2 ? (ql & 0xF) : (ql >> 4);
    const int high = (b[128 + 32 * h + l] >> (2 * k)) & 3;
    const int q = (low | (high << 4)) - 32;
    const int sc = static_cast<int8_t>(b[192 + 8 * h + l / 16 + 2 * k]);
    EXPECT_EQ(y[e], 0.5f * sc * q) << e;
  }
  // The scale of element 16 is scales[1], of element 32 scales[2] (16-element sub-blocks in order).
  EXPECT_EQ(y[16], 0.5f * static_cast<int8_t>(b[193]) *
                       (((b[16] & 0xF) | (((b[128 + 16]) & 3) << 4)) - 32));
}

// The device layout Q6_K_G4: four Q6_K blocks regrouped part by part (quant/blocks.h GroupQ6_K4), the
// same values, and back to the same bytes; not a type any file may carry.
TEST(QuantFormat, Q6_KG4GroupsTheBlocksParts) {
  constexpr int64_t n = 2048;  // two groups
  std::vector<uint8_t> q6(static_cast<size_t>(dtype_row_bytes(DType::Q6_K, n)));
  for (size_t i = 0; i < q6.size(); ++i) q6[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  for (int64_t blk = 0; blk < n / 256; ++blk) put_u16(q6, static_cast<size_t>(210 * blk + 208), 0x2000 + 37 * blk);
  ASSERT_EQ(dtype_row_bytes(DType::Q6_K_G4, n), 2 * 848);
  std::vector<uint8_t> g4(static_cast<size_t>(dtype_row_bytes(DType::Q6_K_G4, n)), 0xAB);
  q6_k_to_g4(q6.data(), g4.data(), n);
  for (int64_t blk = 0; blk < n / 256; ++blk) {
    const uint8_t* x = q6.data() + 210 * blk;
    const uint8_t* g = g4.data() + 848 * (blk / 4);
    const int b = static_cast<int>(blk % 4);
    EXPECT_EQ(std::memcmp(g + 128 * b, x, 128), 0) << "ql of block " << blk;
    EXPECT_EQ(std::memcmp(g + 512 + 64 * b, x + 128, 64), 0) << "qh of block " << blk;
    EXPECT_EQ(std::memcmp(g + 768 + 16 * b, x + 192, 16), 0) << "scales of block " << blk;
    EXPECT_EQ(std::memcmp(g + 832 + 2 * b, x + 208, 2), 0) << "d of block " << blk;
  }
  for (int grp = 0; grp < 2; ++grp) {
    for (int i = 840; i < 848; ++i) EXPECT_EQ(g4[static_cast<size_t>(848 * grp + i)], 0) << "padding " << i;
  }
  const auto a = dequant(DType::Q6_K, q6, n), b = dequant(DType::Q6_K_G4, g4, n);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), sizeof(float) * n), 0);
  std::vector<uint8_t> back(q6.size());
  g4_to_q6_k(g4.data(), back.data(), n);
  EXPECT_EQ(back, q6);
  // quantize_row into the layout is Q6_K's quantization regrouped.
  std::vector<float> src(n);
  for (int64_t i = 0; i < n; ++i) src[static_cast<size_t>(i)] = static_cast<float>((i * 37) % 101) / 50.0f - 1.0f;
  std::vector<uint8_t> qa(q6.size()), qb(g4.size()), qc(g4.size());
  quantize_row(DType::Q6_K, src.data(), qa.data(), n);
  quantize_row(DType::Q6_K_G4, src.data(), qb.data(), n);
  q6_k_to_g4(qa.data(), qc.data(), n);
  EXPECT_EQ(qb, qc);
  // A device layout: known by its DType, unknown as a file's type id, not parsed from a type name.
  EXPECT_EQ(dtype_block_size(DType::Q6_K_G4), 1024);
  EXPECT_EQ(dtype_block_bytes(DType::Q6_K_G4), 848);
  EXPECT_EQ(dtype_info(static_cast<uint32_t>(DType::Q6_K_G4)), nullptr);
  DType parsed = DType::F32;
  EXPECT_FALSE(dtype_from_name("q6_K_g4", &parsed));
}

TEST(QuantFormat, Q8_KFloatScaleAndBsumsIgnored) {
  std::vector<uint8_t> b(292);
  const float d = 0.125f;
  std::memcpy(&b[0], &d, 4);
  for (int j = 0; j < 256; ++j) b[4 + j] = static_cast<uint8_t>(static_cast<int8_t>(j - 128));
  const auto y = dequant(DType::Q8_K, b, 256);
  for (int j = 0; j < 256; ++j) EXPECT_EQ(y[j], 0.125f * (j - 128)) << j;
}

TEST(QuantFormat, FloatTypes) {
  std::vector<uint8_t> h(4);
  put_u16(h, 0, kHalfOne);
  put_u16(h, 2, 0xC000);  // -2
  auto y = dequant(DType::F16, h, 2);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -2.0f);
  put_u16(h, 0, 0x3F80);  // bf16 1.0
  put_u16(h, 2, 0x4049);  // bf16 3.140625
  y = dequant(DType::BF16, h, 2);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], 3.140625f);
  const float src[3] = {1.5f, -0.25f, 1e-3f};
  std::vector<uint8_t> f(12);
  quantize_row(DType::F32, src, f.data(), 3);
  y = dequant(DType::F32, f, 3);
  EXPECT_EQ(y[2], 1e-3f);
}

TEST(QuantFormat, ConvertibleTypes) {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q4_0, DType::Q5_0, DType::Q5_1, DType::Q8_0,
                  DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q8_K, DType::Q6_K_G4}) {
    EXPECT_TRUE(is_convertible(t)) << dtype_name(t);
  }
  EXPECT_FALSE(is_convertible(DType::Q4_1));
  EXPECT_FALSE(is_convertible(DType::Q2_K));
}

}  // namespace
}  // namespace ds::quant
