// Reference conversion of the 256-element K-quant formats: Q4_K, Q5_K, Q6_K and the Q8_K activation
// format. The quantizers search each sub-block's scale (and min) instead of taking min/max: a scan
// over candidate inverse scales, each followed by a weighted least-squares refit of scale and min
// to the codes it produced, keeping the fit with the smallest weighted squared error.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/half.h"
#include "quant/quant_internal.h"

namespace ds::quant {
namespace {

// Asymmetric fit x ~ scale * L - neg_min, L in [0, nmax], for one sub-block of n elements with
// per-element weights w. Returns scale; writes the codes to L and the (non-negative) min.
float fit_scale_min(int n, int nmax, const float* x, const float* w, uint8_t* L, float* neg_min, float rmin,
                    float rdelta, int nstep) {
  float lo = x[0], hi = x[0], sum_w = w[0], sum_x = w[0] * x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  lo = std::min(lo, 0.0f);  // the min is stored as a non-negative offset
  if (hi <= lo) {
    std::fill(L, L + n, 0);
    *neg_min = -lo;
    return 0.0f;
  }
  float iscale = static_cast<float>(nmax) / (hi - lo);
  float scale = 1.0f / iscale;
  float best_err = 0.0f;
  for (int i = 0; i < n; ++i) {
    const int l = std::clamp(nearest_int(iscale * (x[i] - lo)), 0, nmax);
    L[i] = static_cast<uint8_t>(l);
    const float diff = scale * static_cast<float>(l) + lo - x[i];
    best_err += w[i] * diff * diff;
  }
  uint8_t cand[32];
  for (int step = 0; step <= nstep; ++step) {
    iscale = (rmin + rdelta * static_cast<float>(step) + static_cast<float>(nmax)) / (hi - lo);
    float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(iscale * (x[i] - lo)), 0, nmax);
      cand[i] = static_cast<uint8_t>(l);
      const float fl = static_cast<float>(l);
      sum_l += w[i] * fl;
      sum_l2 += w[i] * fl * fl;
      sum_xl += w[i] * fl * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (det <= 0.0f) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
    float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    if (this_min > 0.0f) {  // a positive min cannot be stored: refit the scale alone
      this_min = 0.0f;
      this_scale = sum_xl / sum_l2;
    }
    float err = 0.0f;
    for (int i = 0; i < n; ++i) {
      const float diff = this_scale * static_cast<float>(cand[i]) + this_min - x[i];
      err += w[i] * diff * diff;
    }
    if (err < best_err) {
      std::memcpy(L, cand, static_cast<size_t>(n));
      best_err = err;
      scale = this_scale;
      lo = this_min;
    }
  }
  *neg_min = -lo;
  return scale;
}

// Symmetric fit x ~ scale * (L - nmax), L - nmax in [-nmax, nmax - 1], weighted by x^2 so large
// elements are fitted best. Scans inverse scales around the sign-keeping max. Returns scale.
float fit_scale_symmetric(int n, int nmax, const float* x, uint8_t* L) {
  float amax = 0.0f, max = 0.0f;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (amax == 0.0f) {
    std::fill(L, L + n, static_cast<uint8_t>(nmax));
    return 0.0f;
  }
  auto sums = [&](float iscale, float* sum_lx, float* sum_l2, bool store) {
    *sum_lx = 0.0f;
    *sum_l2 = 0.0f;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
      const float w = x[i] * x[i];
      *sum_lx += w * x[i] * static_cast<float>(l);
      *sum_l2 += w * static_cast<float>(l * l);
      if (store) L[i] = static_cast<uint8_t>(l + nmax);
    }
  };
  float sum_lx, sum_l2;
  sums(-static_cast<float>(nmax) / max, &sum_lx, &sum_l2, true);
  float scale = sum_l2 > 0.0f ? sum_lx / sum_l2 : 0.0f;
  float best = scale * sum_lx;
  for (int step = -9; step <= 9; ++step) {
    if (step == 0) continue;
    const float iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(step)) / max;
    sums(iscale, &sum_lx, &sum_l2, false);
    if (sum_l2 > 0.0f && sum_lx * sum_lx > best * sum_l2) {
      sums(iscale, &sum_lx, &sum_l2, true);
      scale = sum_lx / sum_l2;
      best = scale * sum_lx;
    }
  }
  return scale;
}

// Shared by Q4_K and Q5_K: finds 8 sub-block scales/mins, packs them into 6 bits, and requantizes
// every element against the stored (rounded) scales. L receives codes in [0, nmax].
void quantize_k_superblock(const float* x, int nmax, float rmin, float rdelta, int nstep, uint16_t* d_out,
                           uint16_t* dmin_out, uint8_t* packed, uint8_t* L) {
  float sum_x2 = 0.0f;
  for (int i = 0; i < kQK_K; ++i) sum_x2 += x[i] * x[i];
  const float av_x = std::sqrt(sum_x2 / kQK_K);
  float scales[8], mins[8], w[32];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int j = 0; j < 8; ++j) {
    for (int l = 0; l < 32; ++l) w[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = fit_scale_min(32, nmax, x + 32 * j, w, L + 32 * j, &mins[j], rmin, rdelta, nstep);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
  std::memset(packed, 0, kKScaleBytes);
  for (int j = 0; j < 8; ++j) {
    const int ls = std::min(63, nearest_int(inv_scale * scales[j]));
    const int lm = std::min(63, nearest_int(inv_min * mins[j]));
    if (j < 4) {
      packed[j] = static_cast<uint8_t>(ls);
      packed[j + 4] = static_cast<uint8_t>(lm);
    } else {
      packed[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
      packed[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      packed[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  *d_out = f32_to_fp16(max_scale / 63.0f);
  *dmin_out = f32_to_fp16(max_min / 63.0f);
  const float d = fp16_to_f32(*d_out), dmin = fp16_to_f32(*dmin_out);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    k_scale_min(j, packed, &sc, &m);
    const float d1 = d * sc;
    if (d1 == 0.0f) continue;  // codes from the fit stay; they multiply a zero scale
    const float dm = dmin * m;
    for (int l = 0; l < 32; ++l) {
      L[32 * j + l] = static_cast<uint8_t>(std::clamp(nearest_int((x[32 * j + l] + dm) / d1), 0, nmax));
    }
  }
}

}  // namespace

void dequantize_row_q4_k(const BlockQ4_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_f32(x[i].d), dmin = fp16_to_f32(x[i].dmin);
    const uint8_t* q = x[i].qs;
    for (int c = 0; c < 4; ++c, q += 32) {
      uint8_t sc0, m0, sc1, m1;
      k_scale_min(2 * c, x[i].scales, &sc0, &m0);
      k_scale_min(2 * c + 1, x[i].scales, &sc1, &m1);
      const float d0 = d * sc0, dm0 = dmin * m0, d1 = d * sc1, dm1 = dmin * m1;
      for (int l = 0; l < 32; ++l) *y++ = d0 * static_cast<float>(q[l] & 0xF) - dm0;
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] >> 4) - dm1;
    }
  }
}

void dequantize_row_q5_k(const BlockQ5_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_f32(x[i].d), dmin = fp16_to_f32(x[i].dmin);
    const uint8_t* q = x[i].qs;
    for (int c = 0; c < 4; ++c, q += 32) {
      uint8_t sc0, m0, sc1, m1;
      k_scale_min(2 * c, x[i].scales, &sc0, &m0);
      k_scale_min(2 * c + 1, x[i].scales, &sc1, &m1);
      const float d0 = d * sc0, dm0 = dmin * m0, d1 = d * sc1, dm1 = dmin * m1;
      const int u0 = 1 << (2 * c), u1 = 2 << (2 * c);
      for (int l = 0; l < 32; ++l) {
        *y++ = d0 * static_cast<float>((q[l] & 0xF) + ((x[i].qh[l] & u0) ? 16 : 0)) - dm0;
      }
      for (int l = 0; l < 32; ++l) {
        *y++ = d1 * static_cast<float>((q[l] >> 4) + ((x[i].qh[l] & u1) ? 16 : 0)) - dm1;
      }
    }
  }
}

void dequantize_row_q6_k(const BlockQ6_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_f32(x[i].d);
    for (int h = 0; h < 2; ++h, y += 128) {
      const uint8_t* ql = x[i].ql + 64 * h;
      const uint8_t* qh = x[i].qh + 32 * h;
      const int8_t* sc = x[i].scales + 8 * h;
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * sc[is + 0] * static_cast<float>(q1);
        y[l + 32] = d * sc[is + 2] * static_cast<float>(q2);
        y[l + 64] = d * sc[is + 4] * static_cast<float>(q3);
        y[l + 96] = d * sc[is + 6] * static_cast<float>(q4);
      }
    }
  }
}

void dequantize_row_q8_k(const BlockQ8_K* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK_K) {
    for (int j = 0; j < kQK_K; ++j) y[j] = x[i].d * static_cast<float>(x[i].qs[j]);
  }
}

void quantize_row_q4_k(const float* x, BlockQ4_K* y, int64_t nb) {
  uint8_t L[kQK_K];
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    uint16_t d, dmin;  // locals: the packed block's fields may be unaligned
    quantize_k_superblock(x, 15, -1.0f, 0.1f, 20, &d, &dmin, y[i].scales, L);
    y[i].d = d;
    y[i].dmin = dmin;
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        y[i].qs[32 * c + l] = static_cast<uint8_t>(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
      }
    }
  }
}

void quantize_row_q5_k(const float* x, BlockQ5_K* y, int64_t nb) {
  uint8_t L[kQK_K];
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    uint16_t d, dmin;  // locals: the packed block's fields may be unaligned
    quantize_k_superblock(x, 31, -0.5f, 0.1f, 15, &d, &dmin, y[i].scales, L);
    y[i].d = d;
    y[i].dmin = dmin;
    std::memset(y[i].qh, 0, sizeof(y[i].qh));
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        const int a = L[64 * c + l], b = L[64 * c + 32 + l];
        y[i].qs[32 * c + l] = static_cast<uint8_t>((a & 0xF) | ((b & 0xF) << 4));
        y[i].qh[l] |= static_cast<uint8_t>(((a >> 4) << (2 * c)) | ((b >> 4) << (2 * c + 1)));
      }
    }
  }
}

void quantize_row_q6_k(const float* x, BlockQ6_K* y, int64_t nb) {
  uint8_t L[kQK_K];
  float scales[kQK_K / 16];
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float max_scale = 0.0f, max_abs_scale = 0.0f;
    for (int s = 0; s < kQK_K / 16; ++s) {
      scales[s] = fit_scale_symmetric(16, 32, x + 16 * s, L + 16 * s);
      if (std::fabs(scales[s]) > max_abs_scale) {
        max_abs_scale = std::fabs(scales[s]);
        max_scale = scales[s];
      }
    }
    if (max_abs_scale == 0.0f) {
      std::memset(&y[i], 0, sizeof(BlockQ6_K));
      continue;
    }
    // 8-bit signed sub-block scales; the sign-keeping max maps to -128.
    const float iscale = -128.0f / max_scale;
    y[i].d = f32_to_fp16(1.0f / iscale);
    for (int s = 0; s < kQK_K / 16; ++s) {
      y[i].scales[s] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[s])));
    }
    const float d = fp16_to_f32(y[i].d);
    for (int s = 0; s < kQK_K / 16; ++s) {
      const float ds = d * y[i].scales[s];
      if (ds == 0.0f) continue;
      for (int l = 0; l < 16; ++l) {
        L[16 * s + l] = static_cast<uint8_t>(std::clamp(nearest_int(x[16 * s + l] / ds), -32, 31) + 32);
      }
    }
    for (int h = 0; h < 2; ++h) {
      const uint8_t* Lh = L + 128 * h;
      uint8_t* ql = y[i].ql + 64 * h;
      uint8_t* qh = y[i].qh + 32 * h;
      for (int l = 0; l < 32; ++l) {
        const int q1 = Lh[l], q2 = Lh[l + 32], q3 = Lh[l + 64], q4 = Lh[l + 96];
        ql[l] = static_cast<uint8_t>((q1 & 0xF) | ((q3 & 0xF) << 4));
        ql[l + 32] = static_cast<uint8_t>((q2 & 0xF) | ((q4 & 0xF) << 4));
        qh[l] = static_cast<uint8_t>((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
      }
    }
  }
}

void quantize_row_q8_k(const float* x, BlockQ8_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += kQK_K) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < kQK_K; ++j) {
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    if (amax == 0.0f) {
      std::memset(&y[i], 0, sizeof(BlockQ8_K));
      continue;
    }
    // The sign-keeping max maps to -128, so codes span [-128, 127].
    const float iscale = -128.0f / max;
    for (int j = 0; j < kQK_K; ++j) {
      y[i].qs[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * x[j])));
    }
    for (int g = 0; g < kQK_K / 16; ++g) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += y[i].qs[16 * g + l];
      y[i].bsums[g] = static_cast<int16_t>(sum);
    }
    y[i].d = 1.0f / iscale;
  }
}

}  // namespace ds::quant
