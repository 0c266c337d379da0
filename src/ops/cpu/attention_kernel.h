// The CPU attention inner kernel, compiled once per ISA: attention.cpp (baseline), attention_avx2.cpp
// and attention_avx512.cpp include it with DS_ATTN_NS set to a distinct namespace, so each build is
// its own symbol. Non-obvious choice: 8-lane GCC vector types instead of intrinsics, so the same
// source lowers to SSE pairs, AVX2 or AVX-512 (VL) code with the flags of the including file. F16 chunks
// (widened here) and Q8_0 / Q4_0 chunks (quant::dequantize_row) are converted to F32 rows of the task's
// KV head once per chunk, then read by the F32 code.
#ifndef DS_ATTN_NS
#error "define DS_ATTN_NS before including attention_kernel.h"
#endif

#include <algorithm>
#include <cmath>
#include <cstring>

#include <vector>

#include "core/half.h"
#include "ops/cpu/attention_cpu.h"
#include "quant/quant.h"

// The vector helpers are internal to each file, so the baseline build's note that an 8-lane vector
// is passed differently without AVX does not matter.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace ds::ops::cpu::DS_ATTN_NS {
namespace {

typedef float vf8 __attribute__((vector_size(32)));

inline vf8 load8(const float* p) {
  vf8 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void store8(float* p, vf8 v) { std::memcpy(p, &v, sizeof(v)); }

inline float hsum(vf8 v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

inline float dot(const float* a, const float* b, int64_t n) {
  vf8 s0 = {}, s1 = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 += load8(a + i) * load8(b + i);
    s1 += load8(a + i + 8) * load8(b + i + 8);
  }
  for (; i + 8 <= n; i += 8) s0 += load8(a + i) * load8(b + i);
  float s = hsum(s0 + s1);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline void axpy(float* y, float a, const float* x, int64_t n) {  // y += a * x
  int64_t i = 0;
  const vf8 av = {a, a, a, a, a, a, a, a};
  for (; i + 8 <= n; i += 8) store8(y + i, load8(y + i) + av * load8(x + i));
  for (; i < n; ++i) y[i] += a * x[i];
}

// Rows [j0, j1) of head g of a chunk of dtype t (F16 widened; Q8_0 / Q4_0: each head row D / 32
// blocks, dequantized), as floats: dst[(j - j0) * D + d]. F16 is widened here: with F16C (the AVX2 and
// AVX-512 builds) as _Float16, one conversion instruction an element instead of fp16_to_f32's
// branches (the same values; the baseline build keeps fp16_to_f32).
inline void dequant_rows(DType t, const TensorView& chunk, int64_t j0, int64_t j1, int64_t Hkv, int64_t g, int64_t D,
                         float* dst) {
  if (t == DType::F16) {
    for (int64_t j = j0; j < j1; ++j) {
      float* out = dst + (j - j0) * D;
#if defined(__F16C__)
      const _Float16* src = reinterpret_cast<const _Float16*>(chunk.as<uint16_t>()) + (j * Hkv + g) * D;
      for (int64_t d = 0; d < D; ++d) out[d] = static_cast<float>(src[d]);
#else
      const uint16_t* src = chunk.as<uint16_t>() + (j * Hkv + g) * D;
      for (int64_t d = 0; d < D; ++d) out[d] = fp16_to_f32(src[d]);
#endif
    }
    return;
  }
  const int64_t row_bytes = dtype_row_bytes(t, D);
  for (int64_t j = j0; j < j1; ++j) {
    quant::dequantize_row(t, chunk.as<uint8_t>() + (j * Hkv + g) * row_bytes, dst + (j - j0) * D, D);
  }
}

inline void scale(float* y, float a, int64_t n) {
  int64_t i = 0;
  const vf8 av = {a, a, a, a, a, a, a, a};
  for (; i + 8 <= n; i += 8) store8(y + i, load8(y + i) * av);
  for (; i < n; ++i) y[i] *= a;
}

}  // namespace

// Rows: tokens [t0, t1) x the query heads of KV head g; keys [j0, j1). Online softmax per row into
// m / l / acc (row r = (t - t0) * group + head-in-group); scores has room for one KV chunk.
inline void attend_block(const AttnArgs& a, int64_t t0, int64_t t1, int64_t g, int64_t j0, int64_t j1, float* m,
                         float* l, float* acc, float* scores) {
  const int64_t D = a.head_dim, H = a.n_head, Hkv = a.n_head_kv, C = a.chunk, group = H / Hkv;
  const int64_t rows = (t1 - t0) * group;
  std::fill(m, m + rows, -INFINITY);
  std::fill(l, l + rows, 0.0f);
  std::fill(acc, acc + rows * D, 0.0f);
  thread_local std::vector<float> kbuf, vbuf;  // an F16, Q8_0 or Q4_0 chunk's rows of head g, as floats
  const DType dtype = a.k_chunks[0].dtype;
  for (int64_t c = j0 / C; c * C < j1; ++c) {
    const int64_t cj0 = std::max(j0, c * C), cj1 = std::min(j1, (c + 1) * C);
    // Key / value j lives at k_row + (j - cj0) * stride.
    const float* k_row;
    const float* v_row;
    int64_t stride;
    if (dtype != DType::F32) {
      // Converted once per chunk for the whole GQA group and query block, then read as F32 rows.
      kbuf.resize(static_cast<size_t>(C * D));
      vbuf.resize(static_cast<size_t>(C * D));
      dequant_rows(dtype, a.k_chunks[static_cast<size_t>(c)], cj0 - c * C, cj1 - c * C, Hkv, g, D, kbuf.data());
      dequant_rows(dtype, a.v_chunks[static_cast<size_t>(c)], cj0 - c * C, cj1 - c * C, Hkv, g, D, vbuf.data());
      k_row = kbuf.data();
      v_row = vbuf.data();
      stride = D;
    } else {
      k_row = a.k_chunks[static_cast<size_t>(c)].as<float>() + ((cj0 - c * C) * Hkv + g) * D;
      v_row = a.v_chunks[static_cast<size_t>(c)].as<float>() + ((cj0 - c * C) * Hkv + g) * D;
      stride = Hkv * D;
    }
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t limit = std::min(cj1, a.pos0 + t + 1);  // causal: keys <= pos0 + t
      if (limit <= cj0) continue;
      for (int64_t hh = 0; hh < group; ++hh) {
        const int64_t r = (t - t0) * group + hh;
        const float* qr = a.q + (t * H + g * group + hh) * D;
        float mc = -INFINITY;
        for (int64_t j = cj0; j < limit; ++j) {
          const float s = dot(qr, k_row + (j - cj0) * stride, D) * a.scale;
          scores[j - cj0] = s;
          mc = std::max(mc, s);
        }
        const float m_new = std::max(m[r], mc);
        if (m_new != m[r]) {
          const float corr = std::exp(m[r] - m_new);  // 0 when m[r] = -inf
          l[r] *= corr;
          scale(acc + r * D, corr, D);
          m[r] = m_new;
        }
        for (int64_t j = cj0; j < limit; ++j) {
          const float p = std::exp(scores[j - cj0] - m_new);
          l[r] += p;
          axpy(acc + r * D, p, v_row + (j - cj0) * stride, D);
        }
      }
    }
  }
}

}  // namespace ds::ops::cpu::DS_ATTN_NS
