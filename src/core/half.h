// IEEE fp16 and bfloat16 conversions (scalar, exact: round to nearest even, NaN kept quiet).
#pragma once

#include <cstdint>
#include <cstring>

namespace ds {

inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t f32_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bf16_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_to_bits(f);
  if ((u & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

inline float fp16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  if (exp == 0) {
    if (mant == 0) return f32_from_bits(sign);
    // subnormal: value = mant * 2^-24
    float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  if (exp == 31) return f32_from_bits(sign | 0x7f800000 | (mant << 13));
  return f32_from_bits(sign | ((exp + 112) << 23) | (mant << 13));
}

inline uint16_t f32_to_fp16(float f) {
  const uint32_t u = f32_to_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000;
  const uint32_t abs = u & 0x7fffffff;
  if (abs > 0x7f800000) return static_cast<uint16_t>(sign | 0x7e00);  // NaN
  if (abs >= 0x477ff000) return static_cast<uint16_t>(sign | 0x7c00); // overflow to inf
  if (abs < 0x38800000) {                                              // subnormal or zero
    if (abs < 0x33000000) return static_cast<uint16_t>(sign);          // below half of min subnormal
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7fffff) | 0x800000;
    const uint32_t shift = 126 - e;  // 14 + (112 - e) ... bring to 2^-24 units
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) r++;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = abs - 0x38000000;  // rebias exponent 127 -> 15
  r += 0xfff + ((r >> 13) & 1);   // round to nearest even on the dropped 13 bits
  return static_cast<uint16_t>(sign | (r >> 13));
}

}  // namespace ds
