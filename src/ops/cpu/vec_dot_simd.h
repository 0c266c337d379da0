// SIMD dot-product kernels written once against a few vector primitives and compiled twice: by
// vec_dot_avx512.cpp (512-bit registers, VNNI vpdpbusd / vpdpwssd) and vec_dot_avx2.cpp (pairs of
// 256-bit registers, vpmaddubsw + vpmaddwd). Include only from those files, after defining
// DS_SIMD_NS; everything here has internal linkage, so the two builds never meet at link time.
//
// The one non-obvious choice: for prefill, each weight row is first unpacked into a small
// L1-resident buffer (u8 codes in element order, integer scales expanded to one per element
// pair), then a register tile of rows x tokens runs over that buffer, so a row's unpack is paid
// once per tile, not once per token. For a few tokens (decode) there is nothing to amortise the
// buffer over, and the AVX-512 build decodes blocks straight into registers instead
// (vec_dot_simd_fused.h).
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own undefined-vector idiom.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/check.h"
#include "core/half.h"
#include "quant/blocks.h"

namespace ds::cpu::DS_SIMD_NS {
namespace {

using namespace ds::quant;

inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline void store256(void* p, __m256i v) { _mm256_storeu_si256(static_cast<__m256i*>(p), v); }

// ---- 64-byte vectors: 16 x int32 (VI) and 16 x float (VF) ----
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define DS_SIMD_512 1
// Register tiles (weight rows x tokens) per family; 32 zmm registers. Chosen by measurement at
// 17408x5120 with 64 tokens, alternating A/B runs: floats 6x4 beat 4x4 by 1.13x; K 4x3 and 2x4 tie.
constexpr int kKRows = 2, kKTokens = 4;
constexpr int kLRows = 1, kLTokens = 8;
constexpr int kFRows = 6, kFTokens = 4;
using VI = __m512i;
using VF = __m512;
inline VI vi_load(const void* p) { return _mm512_loadu_si512(p); }
inline void vi_store(void* p, VI v) { _mm512_storeu_si512(p, v); }
inline VI vi_zero() { return _mm512_setzero_si512(); }
// acc + sum over each 4-byte group of u (unsigned) * s (signed)
inline VI vi_dot_u8s8(VI acc, VI u, VI s) { return _mm512_dpbusd_epi32(acc, u, s); }
// acc + sum over each 4-byte group of u * s * k, k = 16-bit multiplier per byte pair (|u*s| pair
// sums must fit int16: codes up to 63 against int8 activations).
inline VI vi_dot_scaled(VI acc, VI u, VI s, VI k) { return _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(u, s), k); }
inline VI vi_add(VI a, VI b) { return _mm512_add_epi32(a, b); }
inline VI vi_from_s16x16(__m256i v) { return _mm512_cvtepi16_epi32(v); }
inline VI vi_from_u8x16(__m128i b) { return _mm512_cvtepu8_epi32(b); }
inline VI vi_from_s8x16(__m128i b) { return _mm512_cvtepi8_epi32(b); }
inline VF vf_zero() { return _mm512_setzero_ps(); }
inline VF vf_from_i(VI v) { return _mm512_cvtepi32_ps(v); }
inline VF vf_set1(float x) { return _mm512_set1_ps(x); }
inline VF vf_fma(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
inline VF vf_mul(VF a, VF b) { return _mm512_mul_ps(a, b); }
inline VF vf_load(const float* p) { return _mm512_loadu_ps(p); }
inline void vf_store(float* p, VF v) { _mm512_storeu_ps(p, v); }
inline VF vf_load_f16(const uint16_t* p) { return _mm512_cvtph_ps(load256(p)); }
inline VF vf_load_bf16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(load256(p)), 16));
}
inline float vf_sum(VF v) { return _mm512_reduce_add_ps(v); }
// 8 x int32: sum over 4-byte groups of |w| * (a with the sign of w), i.e. of w * a.
inline __m256i dot32_signed(__m256i absw, __m256i sw, __m256i a) {
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), absw, _mm256_sign_epi8(a, sw));
}
inline __m256i dot32_unsigned(__m256i u, __m256i a) {
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, a);
}
#else
// Register tiles (weight rows x tokens) per family; 16 ymm registers, two per 64-byte vector.
constexpr int kKRows = 1, kKTokens = 2;
constexpr int kLRows = 1, kLTokens = 2;
constexpr int kFRows = 2, kFTokens = 2;
struct VI {
  __m256i lo, hi;
};
struct VF {
  __m256 lo, hi;
};
inline __m256i madd_u8s8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
inline VI vi_load(const void* p) {
  const auto* b = static_cast<const uint8_t*>(p);
  return {load256(b), load256(b + 32)};
}
inline void vi_store(void* p, VI v) {
  auto* b = static_cast<uint8_t*>(p);
  store256(b, v.lo);
  store256(b + 32, v.hi);
}
inline VI vi_zero() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
// Products of codes up to 63 (or |w| up to 128 with signed a) never saturate vpmaddubsw's int16 pairs.
inline VI vi_dot_u8s8(VI acc, VI u, VI s) {
  return {_mm256_add_epi32(acc.lo, madd_u8s8(u.lo, s.lo)), _mm256_add_epi32(acc.hi, madd_u8s8(u.hi, s.hi))};
}
inline VI vi_dot_scaled(VI acc, VI u, VI s, VI k) {
  return {_mm256_add_epi32(acc.lo, _mm256_madd_epi16(_mm256_maddubs_epi16(u.lo, s.lo), k.lo)),
          _mm256_add_epi32(acc.hi, _mm256_madd_epi16(_mm256_maddubs_epi16(u.hi, s.hi), k.hi))};
}
inline VI vi_add(VI a, VI b) { return {_mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi)}; }
inline VI vi_from_s16x16(__m256i v) {
  return {_mm256_cvtepi16_epi32(_mm256_castsi256_si128(v)), _mm256_cvtepi16_epi32(_mm256_extracti128_si256(v, 1))};
}
inline VI vi_from_u8x16(__m128i b) { return {_mm256_cvtepu8_epi32(b), _mm256_cvtepu8_epi32(_mm_srli_si128(b, 8))}; }
inline VI vi_from_s8x16(__m128i b) { return {_mm256_cvtepi8_epi32(b), _mm256_cvtepi8_epi32(_mm_srli_si128(b, 8))}; }
inline VF vf_zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline VF vf_from_i(VI v) { return {_mm256_cvtepi32_ps(v.lo), _mm256_cvtepi32_ps(v.hi)}; }
inline VF vf_set1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline VF vf_fma(VF a, VF b, VF c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline VF vf_mul(VF a, VF b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline VF vf_load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline void vf_store(float* p, VF v) {
  _mm256_storeu_ps(p, v.lo);
  _mm256_storeu_ps(p + 8, v.hi);
}
inline VF vf_load_f16(const uint16_t* p) {
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
}
inline __m256 bf16x8(const uint16_t* p) {
  const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
inline VF vf_load_bf16(const uint16_t* p) { return {bf16x8(p), bf16x8(p + 8)}; }
inline float vf_sum(VF v) { return hsum256(_mm256_add_ps(v.lo, v.hi)); }
inline __m256i dot32_signed(__m256i absw, __m256i sw, __m256i a) { return madd_u8s8(absw, _mm256_sign_epi8(a, sw)); }
inline __m256i dot32_unsigned(__m256i u, __m256i a) { return madd_u8s8(u, a); }
#endif

// Calls fn.template operator()<T>() with T = nt, for nt in [1, N].
template <int N, typename Fn>
inline void with_tokens(int nt, Fn&& fn) {
  if (nt == N) {
    fn.template operator()<N>();
    return;
  }
  if constexpr (N > 1) {
    with_tokens<N - 1>(nt, fn);
  } else {
    DS_CHECK(false, "with_tokens: {}", nt);
  }
}

// Tile loop, blocked kRows weight rows x kTok tokens (the register tile of the kernels). For each
// group of kRows rows and each chunk [b0, b0 + nbc) of at most chunk_blocks blocks:
// unpack(slot, r, b0, nbc) for each row of the group (the last group may have nr < kRows rows),
// then body(nr, t0, nt, b0, nbc, out) for each group of at most kTok tokens, which writes partial
// dots over the chunk to out[slot * kTok + t]; they are summed into y. Chunking keeps unpacked weights
// in L1 however long the row is.
// With few tokens the product is bound by weight bandwidth, and interleaving several weight rows
// measurably hurts the hardware prefetchers (2.5x slower at 17408 columns), so row groups are
// used only from kRowGroupMinTokens tokens on.
constexpr int64_t kRowGroupMinTokens = 8;

template <int kRows, int kTok, typename Unpack, typename Body>
inline void for_row_tokens(int64_t r0, int64_t r1, int64_t n_tokens, float* y, int64_t y_stride, int64_t nb,
                           int64_t chunk_blocks, Unpack&& unpack, Body&& body) {
  const int64_t group = n_tokens >= kRowGroupMinTokens ? kRows : 1;
  for (int64_t rg = r0; rg < r1; rg += group) {
    const int nr = static_cast<int>(std::min<int64_t>(group, r1 - rg));
    for (int64_t b0 = 0; b0 < nb || b0 == 0; b0 += chunk_blocks) {
      const int64_t nbc = std::min(chunk_blocks, nb - b0);
      for (int slot = 0; slot < nr; ++slot) unpack(slot, rg + slot, b0, nbc);
      for (int64_t t0 = 0; t0 < n_tokens; t0 += kTok) {
        const int nt = static_cast<int>(std::min<int64_t>(kTok, n_tokens - t0));
        float out[kRows * kTok];
        body(nr, t0, nt, b0, nbc, out);
        for (int slot = 0; slot < nr; ++slot) {
          for (int j = 0; j < nt; ++j) {
            float& dst = y[(t0 + j) * y_stride + rg + slot];
            dst = b0 == 0 ? out[slot * kTok + j] : dst + out[slot * kTok + j];
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace ds::cpu::DS_SIMD_NS
