// Scalar dot products straight from the block layouts: the definition the SIMD paths are tested
// against. Integer sums per block (as the SIMD paths do), so the two agree to float rounding.
#include <cstring>

#include "core/check.h"
#include "core/half.h"
#include "ops/cpu/vec_dot_internal.h"
#include "quant/blocks.h"
#include "quant/quant_internal.h"

namespace ds::cpu {
namespace {

using namespace ds::quant;

// Weight codes of one 32-element legacy block, signed (Q4_0, Q5_0, Q8_0) or unsigned (Q5_1).
void legacy_codes(DType t, const uint8_t* blk, int* q, float* d, float* m) {
  *m = 0.0f;
  switch (t) {
    case DType::Q4_0: {
      const auto* b = reinterpret_cast<const BlockQ4_0*>(blk);
      *d = fp16_to_f32(b->d);
      for (int j = 0; j < 16; ++j) {
        q[j] = (b->qs[j] & 0xF) - 8;
        q[j + 16] = (b->qs[j] >> 4) - 8;
      }
      return;
    }
    case DType::Q5_0:
    case DType::Q5_1: {
      const bool is_q5_1 = t == DType::Q5_1;
      const auto* b0 = reinterpret_cast<const BlockQ5_0*>(blk);
      const auto* b1 = reinterpret_cast<const BlockQ5_1*>(blk);
      const uint8_t* qs = is_q5_1 ? b1->qs : b0->qs;
      uint32_t qh;
      std::memcpy(&qh, is_q5_1 ? b1->qh : b0->qh, 4);
      *d = fp16_to_f32(is_q5_1 ? b1->d : b0->d);
      if (is_q5_1) *m = fp16_to_f32(b1->m);
      const int off = is_q5_1 ? 0 : 16;
      for (int j = 0; j < 16; ++j) {
        q[j] = ((qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - off;
        q[j + 16] = ((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - off;
      }
      return;
    }
    case DType::Q8_0: {
      const auto* b = reinterpret_cast<const BlockQ8_0*>(blk);
      *d = fp16_to_f32(b->d);
      for (int j = 0; j < 32; ++j) q[j] = b->qs[j];
      return;
    }
    default:
      DS_CHECK(false, "legacy_codes: {}", dtype_name(t));
  }
}

float dot_legacy(DType t, int64_t n, const uint8_t* w, const BlockQ8_0* a) {
  const int64_t nb = n / 32, bb = dtype_block_bytes(t);
  float sum = 0.0f;
  int q[32];
  for (int64_t i = 0; i < nb; ++i) {
    float d, m;
    legacy_codes(t, w + i * bb, q, &d, &m);
    int isum = 0, asum = 0;
    for (int j = 0; j < 32; ++j) {
      isum += q[j] * a[i].qs[j];
      asum += a[i].qs[j];
    }
    const float da = fp16_to_f32(a[i].d);
    sum += d * da * static_cast<float>(isum) + m * da * static_cast<float>(asum);
  }
  return sum;
}

// Q4_K / Q5_K: sum_j d sc_j sum(q a) - dmin m_j sum(a), with sum(a) from the activation bsums.
template <bool kFive>
float dot_q45_k(int64_t n, const void* w, const BlockQ8_K* a) {
  const int64_t nb = n / kQK_K;
  float sum = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* scales;
    const uint8_t* qs;
    const uint8_t* qh = nullptr;
    float d, dmin;
    if constexpr (kFive) {
      const auto& b = static_cast<const BlockQ5_K*>(w)[i];
      scales = b.scales, qs = b.qs, qh = b.qh, d = fp16_to_f32(b.d), dmin = fp16_to_f32(b.dmin);
    } else {
      const auto& b = static_cast<const BlockQ4_K*>(w)[i];
      scales = b.scales, qs = b.qs, d = fp16_to_f32(b.d), dmin = fp16_to_f32(b.dmin);
    }
    int isum = 0, msum = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      k_scale_min(j, scales, &sc, &m);
      const int c = j / 2, shift = (j % 2) * 4;
      int s = 0;
      for (int l = 0; l < 32; ++l) {
        int q = (qs[32 * c + l] >> shift) & 0xF;
        if (kFive) q |= ((qh[l] >> j) & 1) << 4;
        s += q * a[i].qs[32 * j + l];
      }
      isum += sc * s;
      msum += m * (a[i].bsums[2 * j] + a[i].bsums[2 * j + 1]);
    }
    sum += a[i].d * (d * static_cast<float>(isum) - dmin * static_cast<float>(msum));
  }
  return sum;
}

float dot_q6_k(int64_t n, const BlockQ6_K* w, const BlockQ8_K* a) {
  const int64_t nb = n / kQK_K;
  float sum = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int isum = 0;
    for (int e = 0; e < kQK_K; e += 16) {
      int s = 0;
      for (int k = e; k < e + 16; ++k) {
        const int h = k / 128, r = k % 128, quarter = r / 32, l = r % 32;
        const uint8_t ql = w[i].ql[64 * h + l + (quarter % 2) * 32];
        const int lo = quarter < 2 ? (ql & 0xF) : (ql >> 4);
        const int hi = (w[i].qh[32 * h + l] >> (2 * quarter)) & 3;
        s += ((lo | (hi << 4)) - 32) * a[i].qs[k];
      }
      isum += w[i].scales[e / 16] * s;
    }
    sum += a[i].d * fp16_to_f32(w[i].d) * static_cast<float>(isum);
  }
  return sum;
}

}  // namespace

float vec_dot_scalar(DType t, int64_t n, const void* w, const void* act) {
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16: {
      // Rows need not be aligned to their element size: elements are copied out, not dereferenced.
      const auto* x = static_cast<const uint8_t*>(act);
      const auto* wb = static_cast<const uint8_t*>(w);
      const int64_t es = t == DType::F32 ? 4 : 2;
      float sum = 0.0f;
      for (int64_t k = 0; k < n; ++k) {
        float xk, wk;
        std::memcpy(&xk, x + 4 * k, 4);
        if (t == DType::F32) {
          std::memcpy(&wk, wb + es * k, 4);
        } else {
          uint16_t h;
          std::memcpy(&h, wb + es * k, 2);
          wk = t == DType::F16 ? fp16_to_f32(h) : bf16_to_f32(h);
        }
        sum += wk * xk;
      }
      return sum;
    }
    case DType::Q4_0:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q8_0:
      return dot_legacy(t, n, static_cast<const uint8_t*>(w), static_cast<const BlockQ8_0*>(act));
    case DType::Q4_K: return dot_q45_k<false>(n, w, static_cast<const BlockQ8_K*>(act));
    case DType::Q5_K: return dot_q45_k<true>(n, w, static_cast<const BlockQ8_K*>(act));
    case DType::Q6_K: return dot_q6_k(n, static_cast<const BlockQ6_K*>(w), static_cast<const BlockQ8_K*>(act));
    default:
      DS_CHECK(false, "vec_dot: unsupported weight type {}", dtype_name(t));
  }
  return 0.0f;
}

void gemm_tile_scalar(DType t, int64_t n, const void* w, size_t w_row_bytes, int64_t r0, int64_t r1,
                      const void* act, size_t act_row_bytes, int64_t n_tokens, float* y, int64_t y_stride) {
  for (int64_t r = r0; r < r1; ++r) {
    const void* wr = static_cast<const uint8_t*>(w) + r * w_row_bytes;
    for (int64_t tk = 0; tk < n_tokens; ++tk) {
      y[tk * y_stride + r] = vec_dot_scalar(t, n, wr, static_cast<const uint8_t*>(act) + tk * act_row_bytes);
    }
  }
}

}  // namespace ds::cpu
